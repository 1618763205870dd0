"""`rnn2jax run` and `rnn2jax export`: outputs match `rnn2jax.compile`, an export (a plain serialized
`jax.export.Exported`) runs in a fresh process that imports only `rnn2jax.serving`, bad input is one line
on stderr with exit status 2, and the progress display stays silent when stderr is not a terminal. The
real LSTM's export, symbolic dims and platforms: tests/serving/test_export_artifact.py."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import rnn2jax
from helpers import BREADBREAD_WEIGHTS, REALNETS
from rnn2jax.cli import main, progress
from rnn2jax.errors import InputTypeError, ParseError
from rnn2jax.serving import load_exported

ROOT = Path(__file__).resolve().parents[2]
PREDICT = str(ROOT / "rnn2jax/examples/mlp_predict_net.pbtxt")
INIT = str(ROOT / "rnn2jax/examples/mlp_init_net.pbtxt")
BREAD = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
needs_bread = pytest.mark.skipif(not BREAD.is_file(), reason=f"real nets folder {REALNETS} is absent")
T, N = 5, 2


def _bread_params(tmp_path: Path) -> tuple[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    params = {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in BREADBREAD_WEIGHTS.items()}
    np.savez(tmp_path / "bread.npz", **params)
    return str(tmp_path / "bread.npz"), params


def _bread_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "input_blob": rng.standard_normal((T, N, 62)).astype(np.float32),
        "seq_lengths": np.array([T, 3], dtype=np.int32),
        "hidden_init": rng.standard_normal((1, N, 100)).astype(np.float32),
        "cell_init": rng.standard_normal((1, N, 100)).astype(np.float32),
    }


def _one_line_error(capsys, *parts: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("rnn2jax: error: ") and err.count("\n") == 1, err
    for part in parts:
        assert part in err, err
    return err


def _mlp_data(tmp_path: Path) -> tuple[str, np.ndarray]:
    data = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "data.npy", data)
    return str(tmp_path / "data.npy"), data


def test_run_saves_outputs_matching_compile(tmp_path, capsys):
    path, data = _mlp_data(tmp_path)
    out = tmp_path / "out.npz"
    assert main(["run", PREDICT, "--init", INIT, "--input", f"data={path}", "--output", str(out)]) == 0
    assert "wrote 1 output(s)" in capsys.readouterr().out
    expected = rnn2jax.compile(PREDICT, init_net=INIT)(data=data)["prob"]
    np.testing.assert_allclose(rnn2jax.load_params(out)["prob"], expected, rtol=1e-6, atol=1e-7)


def test_run_prints_a_summary_and_takes_params_and_inputs_files(tmp_path, capsys):
    rnn2jax.compile(PREDICT, init_net=INIT).save_params(tmp_path / "p.npz")
    np.savez(tmp_path / "in.npz", data=np.ones((3, 8), np.float32))
    assert main(["run", PREDICT, "--params", str(tmp_path / "p.npz"), "--inputs", str(tmp_path / "in.npz")]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("prob: float32[3, 3] min ") and captured.err == ""


@needs_bread
def test_run_real_lstm_net_with_random_params(tmp_path, capsys):
    params_path, params = _bread_params(tmp_path)
    inputs = _bread_inputs()
    np.savez(tmp_path / "in.npz", **inputs)
    out = tmp_path / "out.npz"
    argv = ["run", str(BREAD), "--params", params_path, "--inputs", str(tmp_path / "in.npz")]
    assert main([*argv, "--output", str(out)]) == 0
    got = rnn2jax.load_params(out)
    expected = rnn2jax.compile(BREAD, params=params)(inputs)
    assert list(got) == ["softmax", "LSTM/hidden_t_last", "LSTM/cell_t_last"]
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


@needs_bread
def test_run_real_net_errors(tmp_path, capsys):
    params_path, _ = _bread_params(tmp_path)
    inputs = _bread_inputs()
    files = {}
    for name, value in inputs.items():
        files[name] = tmp_path / f"{name}.npy"
        np.save(files[name], value)
    base = ["run", str(BREAD), "--params", params_path]
    given = [f"--input={n}={files[n]}" for n in ("input_blob", "seq_lengths", "hidden_init")]
    assert main([*base, *given]) == 2
    _one_line_error(capsys, "missing input(s) cell_init", "RecurrentNetwork")
    assert main([*base, f"--input=cell_init={files['cell_init']}", *given[1:]]) == 2
    _one_line_error(capsys, "missing input(s) input_blob", "FC", "float32 with the dims from axis 2 multiplying to 62")
    assert main([*base, *given, f"--input=cell_init={files['cell_init']}", "--input=nope=x.npy"]) == 2
    _one_line_error(capsys, "cannot read input file for 'nope'")
    assert main([*base, *given, f"--input=cell_init={files['cell_init']}", f"--input=nope={files['cell_init']}"]) == 2
    _one_line_error(capsys, "unknown input(s) nope")
    np.save(files["input_blob"], inputs["input_blob"][..., :10])
    assert main([*base, *given, f"--input=cell_init={files['cell_init']}"]) == 2
    _one_line_error(capsys, "FC")
    assert main(["run", str(BREAD), "--init", str(REALNETS / "breadbread_lstmdemo_lstm_init_net.pbtxt")]) == 2
    _one_line_error(capsys, "(Load)", "LSTM_params", "does not exist", "--db-root")


def test_run_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["run", PREDICT, "--params", str(tmp_path / "missing.npz")]) == 2
    _one_line_error(capsys, "cannot read parameter file")
    (tmp_path / "bad.npy").write_bytes(b"junk")
    assert main(["run", PREDICT, "--init", INIT, "--input", f"data={tmp_path / 'bad.npy'}"]) == 2
    _one_line_error(capsys, "not a readable .npy file")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", PREDICT, "--input", "data"])
    assert exit_info.value.code == 2


def _serve_in_fresh_process(model: Path, inputs: dict[str, np.ndarray], tmp_path: Path) -> dict[str, np.ndarray]:
    np.savez(tmp_path / "serve_in.npz", **inputs)
    script = f"""
import sys, numpy as np
import rnn2jax.serving
assert 'rnn2jax.ir.netdef' not in sys.modules and 'rnn2jax.ir.loader' not in sys.modules, sorted(sys.modules)
assert not any(m.startswith(('rnn2jax.ops', 'rnn2jax.proto', 'google.protobuf')) for m in sys.modules)
model = rnn2jax.serving.load_exported({str(model)!r})
inputs = dict(np.load({str(tmp_path / "serve_in.npz")!r}))
outputs = model(inputs)
np.savez({str(tmp_path / "serve_out.npz")!r}, **{{k: np.asarray(v) for k, v in outputs.items()}})
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, timeout=120)
    return dict(np.load(tmp_path / "serve_out.npz"))


def test_export_mlp_and_serve_it_without_the_importer(tmp_path, capsys):
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")
    model = tmp_path / "mlp.bin"
    assert main(["export", PREDICT, "--init", INIT, "--input-shape", "data=4,8", "-o", str(model)]) == 0
    assert "for cpu, cuda: inputs data[4, 8] -> outputs prob" in capsys.readouterr().out
    exported = jax.export.deserialize(bytearray(model.read_bytes()))  # the file is exactly an Exported
    assert exported.platforms == ("cpu", "cuda")  # the default
    args = jax.tree_util.tree_unflatten(exported.in_tree, exported.in_avals)
    assert args == (({"data": jax.core.ShapedArray((4, 8), np.float32)},), {})
    data = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    got = _serve_in_fresh_process(model, {"data": data}, tmp_path)
    expected = rnn2jax.compile(PREDICT, init_net=INIT)(data=data)["prob"]
    np.testing.assert_allclose(got["prob"], expected, rtol=1e-6, atol=1e-7)
    # another platform first: on this CPU machine the call still runs the cpu lowering
    assert (
        main(
            ["export", PREDICT, "--init", INIT, "--input-shape", "data=B,8", "--platforms", "tpu,cpu", "-o", str(model)]
        )
        == 0
    )
    served = load_exported(model)
    assert served.platforms == ("tpu", "cpu") and [str(d) for d in served.inputs["data"].shape] == ["B", "8"]
    np.testing.assert_allclose(np.asarray(served(data=data)["prob"]), expected, rtol=1e-6, atol=1e-7)


def test_export_bad_arguments_exit_2(tmp_path, capsys):
    out = str(tmp_path / "m.bin")
    assert main(["export", PREDICT, "--init", INIT, "-o", out]) == 2
    _one_line_error(capsys, "cannot infer the shape of 1 input(s): 'data' (read by op #0 (FC))", "--batch N")
    assert (
        main(["export", PREDICT, "--init", INIT, "--input-shape", "data=4,8", "--input-shape", "x=1", "-o", out]) == 2
    )
    _one_line_error(capsys, "unknown input(s) x")
    argv = ["export", PREDICT, "--init", INIT, "--input-shape", "data=4,8", "-o", out]
    assert main([*argv, "--input-dtype", "data=floaty"]) == 2
    _one_line_error(capsys, "dtype 'floaty' of 'data' is not a numeric NumPy dtype")
    assert main([*argv, "--input-dtype", "other=int32"]) == 2
    _one_line_error(capsys, "--input-dtype for other", "not inputs of net 'mlp_predict_net'")
    assert main([*argv, "--platforms", "cpu,gpu"]) == 2
    _one_line_error(capsys, "--platforms gpu: unknown platform", "cpu, cuda, rocm, tpu")
    assert main(["export", PREDICT, "--init", INIT, "--input-shape", "data=4,9", "-o", out]) == 2
    _one_line_error(capsys, "FC")
    assert not Path(out).exists()
    with pytest.raises(SystemExit) as exit_info:  # a dim is a size or a symbol name, not an expression
        main([*argv[:-4], "--input-shape", "data=T-1,8", "-o", out])
    assert exit_info.value.code == 2 and "neither a size" in capsys.readouterr().err


def test_serving_checks_input_names_and_shapes(tmp_path):
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")
    model = tmp_path / "mlp.bin"
    assert main(["export", PREDICT, "--init", INIT, "--input-shape", "data=2,8", "-o", str(model)]) == 0
    served = load_exported(model)
    assert served.input_names == ("data",) and served.output_names == ("prob",)
    with pytest.raises(KeyError, match="missing: data"):
        served()
    with pytest.raises(ValueError, match="expects \\[2, 8\\]"):
        served(data=np.ones((3, 8), np.float32))
    (tmp_path / "junk.bin").write_bytes(b"junk\n")
    with pytest.raises(ParseError, match=r"not a serialized jax\.export artifact"):
        load_exported(tmp_path / "junk.bin")
    good = model.read_bytes()
    for damaged in (good[: len(good) // 2], good[:8], b""):
        (tmp_path / "damaged.bin").write_bytes(damaged)
        with pytest.raises(ParseError, match=r"damaged\.bin"):
            load_exported(tmp_path / "damaged.bin")
    with pytest.raises(ParseError, match="cannot read"):
        load_exported(tmp_path / "absent.bin")
    with pytest.raises(InputTypeError, match="must be a mapping"):
        served("data")
    with pytest.raises(InputTypeError, match="input 'data' must be an array of float32"):
        served(data=[["a"] * 8] * 2)


class _FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_only_on_a_terminal(monkeypatch):
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    with progress.stage("tracing"):
        pass
    assert quiet.getvalue() == ""
    terminal = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress.stage("tracing"):
        pass
    assert "rnn2jax: tracing... 0.0s" in terminal.getvalue() and terminal.getvalue().endswith("\r\033[K")
