"""The scripts in examples/ run end to end (with --small) and print what they promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--small", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_char_lstm_trains_and_samples():
    out = run_example("char_lstm.py")
    assert "RecurrentNetworkGradient" in out
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", out, re.MULTILINE)]
    assert len(losses) >= 5 and losses[-1] < losses[0]
    assert "the loss halved: ok" in out  # the script asserts the halving itself
    assert re.search(r"^greedy sample: 'the .{10,}'$", out, re.MULTILINE)


def test_attention_seq2seq_runs():
    out = run_example("attention_seq2seq.py")
    assert "3 RecurrentNetwork ops" in out
    assert "output 'decoder/softmax' (4, 2, 12), rows sum to 1: True" in out
    assert out.rstrip().endswith("ok")


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_verify_lstm_reports_agreement(cell):
    out = run_example("verify_lstm.py", "--cell", cell)
    assert "RecurrentNetworkGradient" in out and "h0_grad" in out
    assert "all gradients agree" in out
