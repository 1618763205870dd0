"""The command line: `inspect` on every real net, `demo`, and one-line errors with exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REALNETS
from rnn2jax.cli import main

REAL_FILES = sorted(REALNETS.glob("*.pbtxt")) if REALNETS.is_dir() else []
needs_realnets = pytest.mark.skipif(not REAL_FILES, reason=f"real nets folder {REALNETS} is absent")


@needs_realnets
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_inspect_every_real_net(path, capsys):
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "op types:" in out and "unsupported:" in out


@needs_realnets
def test_inspect_dper_lists_proprietary_ops_and_recurrent_ops(capsys):
    assert main(["inspect", str(REALNETS / "dper_train_net_lstm_pooling.pbtxt")]) == 0
    out = capsys.readouterr().out
    assert "net 'train_net': 176 ops" in out
    assert "recurrent ops (2):" in out
    assert "unsupported: 4 ops of 3 types" in out  # only the proprietary ones (tests/programs/test_dper_net.py)
    for op_type in ("SigridTransforms", "PriorCorrectionCalibrationAccumulate", "PriorCorrectionCalibrationPrediction"):
        assert f"    {op_type} x" in out
    assert "    SortedSegmentRangeMax x" not in out.split("unsupported:")[1]
    assert "FC" not in out.split("unsupported:")[1].split("\n")[0]  # FC is supported, not listed
    assert "step_net 'lstm'" in out or "step_net '" in out


@needs_realnets
def test_inspect_plan_lists_its_nets(capsys):
    assert main(["inspect", str(REALNETS / "breadbread_lstmdemo_train_plan.pbtxt")]) == 0
    out = capsys.readouterr().out
    assert "plan 'lstm_train_plan': 4 nets (char_rnn_init, char_rnn_loop, char_rnn, char_rnn_save)" in out
    assert "RecurrentNetworkGradient" in out


def test_inspect_bad_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.pbtxt"
    bad.write_text("op { type: \n")
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rnn2jax: error: file '") and err.count("\n") == 1
    assert main(["inspect", str(tmp_path / "missing.pb")]) == 2


def test_demo_runs_and_checks_itself(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "output 'prob' (4, 3)" in out and ": ok" in out
    assert "RecurrentNetworkGradient" in out and "- jax.grad|" in out  # the LSTM language model part
    assert "at most half: ok" in out and "demo: all checks ok" in out


def test_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "rnn2jax", "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "inspect" in result.stdout and "demo" in result.stdout
