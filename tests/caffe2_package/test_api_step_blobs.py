"""`recurrent.retrieve_step_blobs` / RecurrentNetworkBlobFetcher give the blobs of every step that real
Caffe2's step workspaces held: same names (but the timestep blob, see below), same values.

`caffe2_step_blobs_script.py` builds a Mul RNN (recurrent_network_test's test_extract) and an
`rnn_cell.LSTM` with sequence lengths, runs each twice with RunNet and fetches the step blobs; it is run
by real Caffe2 (torch 1.10.2, subprocess) and by rnn2jax (`python -m rnn2jax exec`). Caffe2's RNN executor
named the timestep blob `timestep_rnnexec_t<t>`; rnn2jax names it after the op's `timestep` argument
(`timestep`), as Caffe2 did without the executor.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parent / "caffe2_step_blobs_script.py"
# the real-Caffe2 interpreter, as tests/conftest.py's caffe2_python() finds it (scripts/ops_scoreboard.py imports
# this module outside pytest, where `tests` is no package)
CAFFE2_PYTHON = os.environ.get("RNN2JAX_CAFFE2_PYTHON", str(SCRIPT.parents[2] / ".venv-caffe2" / "bin" / "python"))


def _run(command: list[str], out: Path) -> dict[str, np.ndarray]:
    done = subprocess.run(command, cwd=out.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(out) as saved:
        return dict(saved)


def _plain_timestep(name: str) -> str:
    """Caffe2's executor-named `<prefix>_timestep_rnnexec_t<t><t>` as `<prefix>_timestep<t>`."""
    match = re.fullmatch(r"(.*)_timestep_rnnexec_t(\d+)\2", name)
    return f"{match.group(1)}_timestep{match.group(2)}" if match else name


@settings(max_examples=1, deadline=None, database=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3)), min_size=3, max_size=3))
def test_step_blobs_match_real_caffe2(caffe2, tmp_path_factory, shapes: list[tuple[int, int, int]]) -> None:
    """One subprocess per backend runs all drawn shapes (a process start and compile costs seconds). The
    `caffe2` fixture builds (or skips without) the real-Caffe2 venv."""
    tmp = tmp_path_factory.mktemp("step_blobs")
    args = [",".join(map(str, shape)) for shape in shapes]
    theirs = _run([CAFFE2_PYTHON, str(SCRIPT), str(tmp / "c2.npz"), *args], tmp / "c2.npz")
    ours = _run([sys.executable, "-m", "rnn2jax", "exec", str(SCRIPT), str(tmp / "ours.npz"), *args], tmp / "ours.npz")
    for shape, arg in zip(shapes, args, strict=True):
        for label in (f"{arg}:mul", f"{arg}:lstm"):
            names = sorted(_plain_timestep(str(x)) for x in theirs[f"{label}:__names__"])
            assert sorted(str(x) for x in ours[f"{label}:__names__"]) == names
            assert len(names) == shape[0] * len({re.sub(r"\d+$", "", x) for x in names})  # every blob, every step
            for name in theirs[f"{label}:__names__"]:
                expected = theirs[f"{label}:{name}"]
                got = ours[f"{label}:{_plain_timestep(str(name))}"]
                assert got.shape == expected.shape and got.dtype == expected.dtype, name
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=str(name))
