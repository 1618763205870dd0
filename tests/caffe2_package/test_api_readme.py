"""The README's Caffe2 script runs as printed: installed as `caffe2`, it trains and prints a plausible loss."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_script() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Caffe2 scripts, unchanged") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


def test_the_readme_caffe2_script_runs():
    script = readme_script()
    assert "rnn2jax.caffe2.install()" in script and "optimizer.build_sgd" in script
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    loss = float(done.stdout.split()[-1])
    # 62 classes, random init, 10 SGD steps on random targets: the cross-entropy stays near ln(62)
    assert abs(loss - math.log(62)) < 0.3, loss
