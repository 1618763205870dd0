"""One command-line vocabulary: the flags several commands share mean the same in each (read from the argparse
parsers themselves), `--help` shows them under the same group titles, `--ops` goes before or after the
command, an unknown flag names the nearest, `--caffe2` alone finds `setup-caffe2`'s venv, errors give advice
in flags on the command line and in keywords in Python; and the small things a user meets (a Net's repr, a
missing parameter file, run-plan's progress line)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from runtime_helpers import net, op, plan, step

import rnn2jax
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.cli import main
from rnn2jax.cli.app import build_parser
from rnn2jax.cli.progress import IterationMeter
from rnn2jax.errors import ParseError, StorageError, UnsupportedOpError
from rnn2jax.ir.netdef import Plan
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.runtime.plan import StepProgress

ROOT = Path(__file__).resolve().parents[2]
PREDICT = str(ROOT / "rnn2jax/examples/mlp_predict_net.pbtxt")
INIT = str(ROOT / "rnn2jax/examples/mlp_init_net.pbtxt")

MODEL, SHAPES, INPUTS, CAFFE2 = "model", "input shapes", "input values", "real Caffe2"
# the shared groups each command shows in --help
GROUPS = {
    "inspect": {MODEL},
    "verify": {MODEL, SHAPES, INPUTS, CAFFE2},
    "run": {MODEL, INPUTS},
    "export": {MODEL, SHAPES},
    "codegen": {MODEL},
    "compare": {MODEL, SHAPES, INPUTS, CAFFE2},
    "setup-caffe2": set(),
    "convert-params": {MODEL},
    "draw": {MODEL},
    "run-plan": {MODEL},
    "exec": set(),
    "demo": set(),
}
# each shared flag: its group, dest, a sample value and what it parses to
SHARED = {
    "--net": (MODEL, "net_name", "train", "train"),
    "--init": (MODEL, "init", "init.pb", "init.pb"),
    "--params": (MODEL, "params", "p.npz", "p.npz"),
    "--db-root": (MODEL, "db_root", "models", "models"),
    "--db-type": (MODEL, "db_type", "lmdb", "lmdb"),
    "--shape": (SHAPES, "shape", "x=4,T,8", ("x", (4, "T", 8))),
    "--batch": (SHAPES, "batch", "4", 4),
    "--steps": (SHAPES, "steps", "T", "T"),
    "--input": (INPUTS, "input", "x=x.npy", ("x", "x.npy")),
    "--inputs": (INPUTS, "inputs", "in.npz", "in.npz"),
    "--caffe2": (CAFFE2, "caffe2", "/venv/bin/python", "/venv/bin/python"),
    "--seed": (None, "seed", "3", 3),
    "--json": (None, "json", None, None),
    "--ops": (None, "ops_after", "my_ops.py", "my_ops.py"),
}


def _commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _group_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    return next(g.title for g in parser._action_groups if action in g._group_actions)


def test_every_command_is_listed_here():
    assert set(_commands()) == set(GROUPS)


@pytest.mark.parametrize("command", sorted(GROUPS))
def test_help_shows_the_shared_groups_under_their_titles(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for title in (MODEL, SHAPES, INPUTS, CAFFE2):
        assert (f"\n{title}:\n" in out) == (title in GROUPS[command]), (command, title)


@pytest.mark.parametrize("flag", sorted(SHARED))
def test_a_shared_flag_means_the_same_in_every_command(flag):
    """Same dest, type (and parse of a sample value), metavar, help, nargs, default and group wherever
    the flag appears; the commands that must have it (their groups say so) do."""
    title, dest, sample, parsed = SHARED[flag]
    found = {}
    for name, parser in _commands().items():
        actions = [a for a in parser._actions if flag in a.option_strings and a.help != argparse.SUPPRESS]
        if actions:
            (found[name],) = actions
            assert _group_of(parser, actions[0]) == (title or "options"), (name, flag)
    assert found, flag
    if title is not None:
        assert {n for n, groups in GROUPS.items() if title in groups} >= set(found)
    for name, action in found.items():
        assert action.dest == dest, (name, flag)
        if sample is not None:
            assert (action.type(sample) if action.type else sample) == parsed, (name, flag)
    described = {
        (type(a).__name__, a.type, a.metavar, a.help, a.nargs, a.const, a.default, tuple(a.option_strings))
        for a in found.values()
    }
    assert len(described) == 1, (flag, sorted(found), described)


def test_old_spellings_still_parse():
    commands = _commands()
    assert "--input-shape" in next(a for a in commands["export"]._actions if a.dest == "shape").option_strings
    args = build_parser().parse_args(["export", "n.pb", "--input-shape", "x=2,3", "-o", "m.bin"])
    assert args.shape == [("x", (2, 3))]
    args = build_parser().parse_args(["codegen", "n.pb", "--input", "h0", "--as-input", "c0", "-o", "m.py"])
    assert args.old_as_input == ["h0"] and args.as_input == ["c0"]  # codegen's --input is now --as-input
    args = build_parser().parse_args(["compare", "n.pb", "--caffe2"])
    assert args.caffe2 == ""  # alone: look for it, as verify --caffe2 does


def test_ops_is_taken_before_and_after_the_command(tmp_path, capsys):
    marks = tmp_path / "imported.txt"
    plugins = []
    for name in ("first", "second"):
        plugin = tmp_path / f"{name}.py"
        plugin.write_text(f"open({str(marks)!r}, 'a').write('{name}\\n')\n")
        plugins.append(str(plugin))
    assert main(["--ops", plugins[0], "inspect", PREDICT, "--ops", plugins[1]]) == 0
    assert marks.read_text() == "first\nsecond\n"
    assert main(["inspect", "--ops", plugins[0], PREDICT]) == 0
    assert marks.read_text().endswith("first\n")


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["export", "n.pb", "--input-shapes", "x=1", "-o", "m"],
            "unknown flag --input-shapes; did you mean --input-shape",
        ),
        (["verify", "n.pb", "--sahpe", "x=1"], "unknown flag --sahpe; did you mean --shape?"),
        (["run", "n.pb", "--db_root=models"], "unknown flag --db_root; did you mean --db-root?"),
        (["inspect", "n.pb", "--zzzz"], "unknown flag --zzzz"),
    ],
)
def test_an_unknown_flag_names_the_nearest(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"rnn2jax {argv[0]}: error: {said}" in err and err.startswith(f"usage: rnn2jax {argv[0]}")


def test_an_unknown_command_names_the_nearest(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["verfy", "n.pb"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr()
        .err.rstrip()
        .endswith(
            "invalid choice: 'verfy' (choose from 'inspect', 'verify', "
            "'run', 'export', 'codegen', 'compare', 'setup-caffe2', 'convert-params', 'draw', 'run-plan', 'exec', "
            "'demo'); did you mean verify?"
        )
    )


def test_symbolic_dims_are_for_export_only(capsys):
    assert main(["compare", PREDICT, "--shape", "data=N,8", "--caffe2", "/nowhere/python"]) == 2
    assert "compare makes arrays, so every dim is a size; symbols (T, N) are for `rnn2jax export`" in (
        capsys.readouterr().err
    )
    assert main(["verify", PREDICT, "--batch", "N"]) == 2
    assert "--batch N: verify makes arrays" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# real Caffe2 where setup-caffe2 puts it


@pytest.fixture
def default_venv(caffe2, tmp_path, monkeypatch):
    """A venv at setup-caffe2's default place (under $XDG_DATA_HOME) that is the real Caffe2 venv under
    another name: its pyvenv.cfg, a bin/python linking to its interpreter, its site-packages (with the
    caffe2 package); $RNN2JAX_CAFFE2_PYTHON unset."""
    real = Path(caffe2.python).parent.parent
    venv = tmp_path / "data" / "rnn2jax" / "caffe2-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(Path(caffe2.python).resolve())
    (venv / "pyvenv.cfg").write_bytes((real / "pyvenv.cfg").read_bytes())
    (venv / "lib" / "python3.9").mkdir(parents=True)
    (venv / "lib" / "python3.9" / "site-packages").symlink_to(next(real.glob("lib/python3*/site-packages")))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("RNN2JAX_CAFFE2_PYTHON", raising=False)
    return venv


def test_caffe2_alone_and_exec_find_the_default_venv(default_venv, monkeypatch):
    from rnn2jax.caffe2.source_tree import FROM_VENV, find_source
    from rnn2jax.checking.oracle.session import caffe2_python

    monkeypatch.delenv("RNN2JAX_CAFFE2_SOURCE", raising=False)
    assert caffe2_python(None) == str(default_venv / "bin" / "python")
    found = find_source()
    assert (found.path, found.origin) == (default_venv / "lib" / "python3.9" / "site-packages" / "caffe2", FROM_VENV)


def test_compare_without_caffe2_finds_the_default_venv(default_venv, tmp_path, capsys):
    path = tmp_path / "relu.pbtxt"
    path.write_text(text_format.MessageToString(net("relu", op("Relu", ["x"], ["y"]))))
    assert main(["compare", str(path), "--shape", "x=2,3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and [b["blob"] for b in report["blobs"]] == ["y"]


def _weights_db_net(root: Path) -> tuple[str, str]:
    """An FC net whose init net Loads its weights from weights.minidb under `root`."""
    rng = np.random.default_rng(0)
    rnn2jax.write_blobs(
        root / "weights.minidb",
        {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)},
    )
    load = op("Load", [], ["w", "b"], db="weights.minidb", db_type="minidb")
    (root / "init.pbtxt").write_text(text_format.MessageToString(net("init", load)))
    (root / "net.pbtxt").write_text(text_format.MessageToString(net("fc", op("FC", ["x", "w", "b"], ["y"]))))
    return str(root / "net.pbtxt"), str(root / "init.pbtxt")


def test_compare_reads_the_init_nets_databases_under_db_root(caffe2, tmp_path, capsys):
    path, init = _weights_db_net(tmp_path)
    argv = ["compare", path, "--init", init, "--shape", "x=2,3", "--caffe2", str(caffe2.python), "--json"]
    assert main([*argv, "--db-root", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and [b["blob"] for b in report["blobs"]] == ["y"]
    assert main(argv) == 2  # without it the Load is left out, and nothing gives w and b
    assert "no value for input(s) w, b" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# verify takes the whole model group


def _training_plan(tmp_path: Path) -> tuple[str, np.ndarray]:
    """A plan of an LSTM training net (built as Caffe2 users built one) and its init net."""
    model = ModelHelper(name="train")
    hidden_all, *_ = LSTM(model, "x", "seq_lengths", ("h0", "c0"), 5, 8, scope="lstm")
    model.net.AveragedLoss(hidden_all, "loss")
    train = pb.NetDef()
    train.CopyFrom(model.net.Proto())
    backward, _ = get_backward_pass(list(train.op), {"loss": None})
    train.op.extend(backward)
    init = pb.NetDef()
    init.CopyFrom(model.param_init_net.Proto())
    init.name = "init"
    message = plan([init, train], step("init", network="init"), step("train", network=train.name), name="p")
    (tmp_path / "plan.pb").write_bytes(message.SerializeToString())
    x = np.random.default_rng(0).standard_normal((4, 3, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return str(tmp_path / "plan.pb"), train.name


def test_verify_takes_net_init_by_name_and_input_values(tmp_path, capsys):
    path, train = _training_plan(tmp_path)
    shapes = ["--shape", "seq_lengths=3", "--shape", "h0=1,3,8", "--shape", "c0=1,3,8"]
    argv = ["verify", path, "--net", train, "--init", "init", "--input", f"x={tmp_path / 'x.npy'}", *shapes]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and [c["blob"] for c in report["checks"]][:2] == ["lstm/i2h_grad", "lstm/gates_t_w_grad"]
    assert report["notes"] == ["net 'train': shapes inferred: lstm/i2h [4, 3, 32]"]  # T = 4 from x's value
    assert main(["verify", path, "--net", train, "--init", "init", *shapes]) == 2  # without x, nothing says T
    assert "give the shapes of lstm/i2h: --shape lstm/i2h=D0,D1,..., or an init net" in capsys.readouterr().err
    assert main(["verify", path, "--net", "nope", *shapes]) == 2
    assert "has no net 'nope'" in capsys.readouterr().err


def test_convert_params_recognises_the_db_type_by_content(tmp_path, capsys):
    pytest.importorskip("lmdb", reason="the lmdb extra is not installed")
    rnn2jax.write_blobs(tmp_path / "w.lmdb", {"w": np.arange(3, dtype=np.float32)}, db_type="lmdb")
    assert main(["convert-params", str(tmp_path / "w.lmdb"), "-o", str(tmp_path / "w.npz")]) == 0
    assert rnn2jax.load_params(tmp_path / "w.npz")["w"].tolist() == [0.0, 1.0, 2.0]


# ------------------------------------------------------------------------------------------------
# advice in the words of whoever reads it


def test_advice_is_in_flags_on_the_command_line_and_in_keywords_in_python(tmp_path, capsys):
    path, init = _weights_db_net(tmp_path)
    with pytest.raises(StorageError) as caught:
        rnn2jax.compile(path, init_net=init)
    assert str(caught.value).endswith("; pass db_root=DIR") and "--db-root" not in str(caught.value)
    assert main(["run", path, "--init", init]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith("; pass --db-root DIR") and "db_root=" not in err

    odd = tmp_path / "odd.pbtxt"
    odd.write_text(text_format.MessageToString(net("odd", op("NoSuchOp", ["x"], ["y"]))))
    with pytest.raises(UnsupportedOpError) as caught:
        rnn2jax.compile(str(odd))
    assert "rnn2jax.register_op" in str(caught.value) and "--ops" not in str(caught.value)
    assert main(["run", str(odd)]) == 2
    assert "loaded with --ops FILE" in capsys.readouterr().err

    plan_path = tmp_path / "two.pbtxt"
    plan_path.write_text(text_format.MessageToString(plan([net("a"), net("b")], name="two")))
    with pytest.raises(ParseError) as caught:
        rnn2jax.compile(str(plan_path))
    assert "rnn2jax.load(...)['a']" in str(caught.value) and "--net" not in str(caught.value)
    assert main(["run", str(plan_path)]) == 2
    assert "pick one with --net NAME" in capsys.readouterr().err


def test_run_takes_a_plans_net(tmp_path, capsys):
    plan_path = tmp_path / "two.pbtxt"
    nets = [net("a", op("Relu", ["x"], ["y"])), net("b", op("Abs", ["x"], ["y"]))]
    plan_path.write_text(text_format.MessageToString(plan(nets, name="two")))
    np.save(tmp_path / "x.npy", np.array([-2.0, 3.0], np.float32))
    argv = ["run", str(plan_path), "--net", "b", "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz")]
    assert main(argv) == 0
    assert rnn2jax.load_params(tmp_path / "o.npz")["y"].tolist() == [2.0, 3.0]


def test_a_missing_params_file_is_a_storage_error_that_says_not_found(tmp_path, capsys):
    missing = tmp_path / "missing.npz"
    with pytest.raises(StorageError, match="file not found") as caught:
        rnn2jax.load_params(missing)
    assert not isinstance(caught.value, ParseError)
    assert main(["run", PREDICT, "--params", str(missing)]) == 2
    assert capsys.readouterr().err == f"rnn2jax: error: cannot read parameter file '{missing}': file not found\n"


# ------------------------------------------------------------------------------------------------
# the small things


def test_repr_of_a_net_a_plan_and_an_op_is_one_short_line():
    message = net("big", *(op("Relu", [f"x{i}"], [f"x{i + 1}"]) for i in range(2000)))
    message.external_input.append("x0")
    message.external_output.append("x2000")
    big = rnn2jax.load(message)
    assert repr(big) == "Net('big': 2000 ops, 1 external inputs, 1 external outputs)"
    assert repr(big.ops[7]) == "Op(net 'big', op #7 (Relu): x7 -> x8)"
    loaded = rnn2jax.load(plan([net("a"), net("b"), net("c"), net("d")], step("s", network="a"), name="p"))
    assert isinstance(loaded, Plan)
    assert repr(loaded) == "Plan('p': 4 nets (a, b, c, ... (1 more)), 1 execution steps)"


def _loop_plan(outer_name: str) -> pb.PlanDef:
    """An outer step of 3 iterations holding two one-iteration substeps (the shape of a training plan)."""
    nets = [
        net("init", op("ConstantFill", [], ["c"], shape=[1], value=0.0), op("ConstantFill", [], ["one"], shape=[1])),
        net("feed", op("Add", ["c", "one"], ["c"])),
        net("train", op("Add", ["c", "one"], ["c"])),
    ]
    inner = [step("feed", network="feed", num_iter=1), step("train", network="train", num_iter=1)]
    return plan(nets, step("init", network="init"), step(outer_name, substep=inner, num_iter=3), name="p")


@pytest.mark.parametrize("outer, label", [("loop", "step 'loop'"), ("", "step (feed, train)")])
def test_the_progress_line_names_the_outer_step_and_its_iteration(outer, label):
    stream = io.StringIO()  # not a terminal: plain lines, here every time (every=0)
    meter = IterationMeter(lambda: "c 1", stream=stream, every=0.0)
    rnn2jax.Workspace().run_plan(_loop_plan(outer), progress=meter)
    lines = stream.getvalue().splitlines()
    shown = [line.split("  ")[0] for line in lines]  # after each iteration of any step: the outer one's count
    assert shown == ["rnn2jax: step 'init' 1"] + [f"rnn2jax: {label} {i}/3" for i in (0, 0, 1, 1, 1, 2, 2, 2, 3)]
    assert all(line.endswith("it/s  c 1") for line in lines) and "\r" not in stream.getvalue()
    assert not any("'feed'" in line or "'train'" in line for line in lines)  # never the inner one-iteration steps


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_on_a_terminal_redraws_at_most_ten_times_a_second():
    stream = _Terminal()
    meter = IterationMeter(stream=stream, rate=1000.0)
    loaded = rnn2jax.load(_loop_plan("loop"))
    top, loop = loaded.steps[0], dataclasses.replace(loaded.steps[1], num_iter=10**6)
    start = time.monotonic()
    for done in range(2000):
        meter((StepProgress(top, 0), StepProgress(loop, done)))
    elapsed = time.monotonic() - start
    assert stream.getvalue().count("\r\033[K") <= 1 + int(elapsed * 10) + 1
    assert stream.getvalue().startswith("\r\033[Krnn2jax: step 'loop' 0/1000000")
    meter.close()
    assert stream.getvalue().endswith("\r\033[K")
