"""`rnn2jax run-plan`: logged blobs, --iters, --db-root, and a clean stop on Ctrl-C (exit status 130)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from google.protobuf import text_format
from runtime_helpers import net, op, plan, step

import rnn2jax
from rnn2jax.cli import main
from rnn2jax.ops import registry
from rnn2jax.runtime.plan import PlanInterrupted

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _counting_plan(num_iter: int, *extra_ops) -> object:
    init = net(
        "init",
        op("ConstantFill", [], ["c"], shape=[1], value=0.0),
        op("ConstantFill", [], ["one"], shape=[1], value=1.0),
    )
    train = net("train", op("Add", ["c", "one"], ["c"]), *extra_ops)
    return plan(
        [init, train], step("init", network="init"), step("train", network="train", num_iter=num_iter), name="p"
    )


def _write(tmp_path, message) -> str:
    path = tmp_path / "plan.pbtxt"
    path.write_text(text_format.MessageToString(message))
    return str(path)


def test_run_plan_prints_the_logged_blobs(tmp_path, capsys):
    assert main(["run-plan", _write(tmp_path, _counting_plan(7)), "--log", "c", "--log", "nope"]) == 0
    out = capsys.readouterr().out
    assert "ran plan 'p'" in out and "c: 7\n" in out and "nope: (not in the workspace)" in out


def test_iters_caps_every_step_and_db_root_is_accepted(tmp_path, capsys):
    path = _write(tmp_path, _counting_plan(1000))
    assert main(["run-plan", path, "--iters", "25", "--db-root", str(tmp_path), "--log", "c"]) == 0
    assert "c: 25\n" in capsys.readouterr().out
    assert rnn2jax.Workspace(db_root=tmp_path).db_root == str(tmp_path)


def test_run_plan_refuses_a_net_and_a_bad_plan(tmp_path, capsys):
    path = tmp_path / "net.pbtxt"
    path.write_text(text_format.MessageToString(net("n", op("Add", ["a", "a"], ["b"]))))
    assert main(["run-plan", str(path)]) == 2
    assert "holds a net, not a plan" in capsys.readouterr().err
    bad = plan([net("n", op("Add", ["a", "a"], ["b"]))], step("s", network="missing"), name="bad")
    assert main(["run-plan", _write(tmp_path, bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "uses net 'missing'" in err


@pytest.fixture
def interrupting_host_op(monkeypatch):
    """A host op that raises KeyboardInterrupt on its 4th run, as Ctrl-C would inside it."""
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))  # the test's op goes with the copy

    def interrupt(workspace, op, state):
        state["runs"] = state.get("runs", 0) + 1
        if state["runs"] == 4:
            raise KeyboardInterrupt

    registry.register_host_op("InterruptOnFourth", interrupt)


def test_keyboard_interrupt_in_a_host_op_says_where_the_plan_stopped(interrupting_host_op, tmp_path, capsys):
    message = _counting_plan(100, op("InterruptOnFourth", [], []))
    workspace = rnn2jax.Workspace()
    with pytest.raises(PlanInterrupted) as info:
        workspace.run_plan(message)
    assert info.value.where.startswith("plan 'p': step 'train' at iteration 3, running net 'train'")
    assert workspace.fetch("c")[0] == 4  # the Add before the host op ran in the 4th iteration

    assert main(["run-plan", _write(tmp_path, message), "--log", "c"]) == 130
    captured = capsys.readouterr()
    assert "rnn2jax: interrupted: plan 'p': step 'train' at iteration 3" in captured.err
    assert "c: 4" in captured.out


def test_ctrl_c_stops_run_plan_between_iterations(tmp_path):
    # Print every 2000 iterations tells the test that the plan runs; then it sends SIGINT
    message = _counting_plan(10**9, op("Print", ["c"], [], every_n=2000))
    command = [sys.executable, "-m", "rnn2jax", "run-plan", _write(tmp_path, message), "--log", "c"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        lines = [process.stdout.readline(), process.stdout.readline()]
        assert all(line.startswith("Tensor c of type float") for line in lines), lines
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "rnn2jax: interrupted: plan 'p': step 'train' at iteration " in err
    stopped_at = int(err.split("at iteration ")[1].split()[0].rstrip(","))
    logged = [line for line in out.splitlines() if line.startswith("c: ")]
    assert logged == [f"c: {stopped_at}"]  # stopped between iterations: c counts the finished ones
    assert stopped_at >= 2001


def test_inspect_counts_host_ops_as_supported_at_the_top_level_only(tmp_path, capsys):
    """`run` and `run-plan` execute host ops between jitted segments, so `inspect` lists them as host ops;
    inside a nested net (traced: If's branches lower with it) a host op is unsupported, as running the net would
    say, while the If itself lowers. Print, which is also lowered (a callback from the compiled code), is not."""
    inner = net("inner", op("Print", ["x"], []), op("Save", ["x"], [], db="v.minidb", db_type="minidb"))
    top = net(
        "saveload",
        op("Save", ["x"], [], db="w.minidb", db_type="minidb"),
        op("Load", [], ["w"], db="w.minidb", db_type="minidb"),
        op("Print", ["w"], []),
        op("If", ["c"], [], then_net=inner),
    )
    path = tmp_path / "net.pbtxt"
    path.write_text(text_format.MessageToString(top))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  host ops: Load x1, Print x1, Save x1\n" in out
    unsupported = out.split("unsupported:")[1]
    assert "Save x1: net 'inner'" in unsupported and "If" not in unsupported.split("Save")[0]
    assert "Print" not in unsupported and unsupported.count("(Save)") == 1  # the nested one only
    assert registry.kind("Save") == "host" and registry.kind("Relu") == "lowered" and registry.kind("Nope") is None
