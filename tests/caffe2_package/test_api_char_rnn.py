"""Acceptance: Caffe2's own `python/examples/char_rnn.py` trains on rnn2jax through `rnn2jax exec`.

The script is read in place from the real-Caffe2 venv (never copied into the project). It trains an
LSTM (rnn_cell.LSTM, brew.fc, Softmax, LabelCrossEntropy, AveragedLoss, AddGradientOperators,
optimizer.build_sgd with a step policy) on a text bundled here, printing "Loss since last report"
every `--iters_to_report` iterations and sampling text with a forward-only copy of the net. It loops
forever; `--max-runs char_rnn=300` stops it after 300 training steps with exit status 0.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT = ROOT / "examples" / "caffe2_scripts" / "data" / "char_rnn.txt"
ITERATIONS, REPORT_EVERY = 300, 100


def _caffe2_package() -> Path | None:
    """`caffe2/` inside the real-Caffe2 venv ($RNN2JAX_CAFFE2_SOURCE names it directly)."""
    if os.environ.get("RNN2JAX_CAFFE2_SOURCE"):
        return Path(os.environ["RNN2JAX_CAFFE2_SOURCE"])
    venv = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python")).parents[1]
    found = sorted(venv.glob("lib/python3*/site-packages/caffe2"))
    return found[0] if found else None


def test_caffe2_char_rnn_example_trains_with_a_falling_loss():
    package = _caffe2_package()
    script = package / "python" / "examples" / "char_rnn.py" if package else None
    if script is None or not script.is_file():
        pytest.skip(f"real-Caffe2 venv not found: no caffe2/python/examples/char_rnn.py under {package}")
    command = [
        sys.executable, "-m", "rnn2jax", "exec", f"--max-runs=char_rnn={ITERATIONS}", str(script),
        "--train_data", str(TEXT), "--iters_to_report", str(REPORT_EVERY),
        "--seq_length", "10", "--batch_size", "8", "--hidden_size", "32",
    ]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    seconds = time.monotonic() - start
    print(f"char_rnn: {ITERATIONS} iterations in {seconds:.1f} s")
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"net 'char_rnn' ran {ITERATIONS} times" in done.stderr  # stopped by the limit, not by a crash
    # Caffe2 logs through `logging` (stderr), prints through stdout.
    losses = [float(x) for x in re.findall(r"Loss since last report: ([0-9.eE+-]+)", done.stderr)]
    assert len(losses) == ITERATIONS // REPORT_EVERY, done.stderr[-4000:]
    assert all(a > b for a, b in itertools.pairwise(losses)), losses
    # Starting loss per sequence is about seq_length * ln(vocab size); training must get well below it.
    vocab = len(set(TEXT.read_text()))
    assert losses[-1] < 0.9 * 10 * math.log(vocab), (losses, vocab)
    assert f"Iteration {ITERATIONS} " in done.stdout and "Input has" in done.stdout
