"""docs/serving.md's example for several hosts runs as written: two processes on this machine (loopback only),
each feeding its own rows to one compiled net over a mesh of both processes' devices.

The page's code runs unchanged, followed by a few lines that check what the page says around it: `np.asarray`
of the sharded output raises; feeding every process the same global NumPy batch gives the same result, and
different ones are refused. Each process's rows of the output, and every row gathered, must be what one
process computes on all the rows (the reference: the same net compiled without a mesh, here).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from processes import free_port, run_together

import rnn2jax

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "serving.md"
PROCESSES = 2

# after the page's code; the output file is the script's fourth argument, after the page's three
CHECKS = """
try:
    np.asarray(prob)
    _asarray = "returned"
except RuntimeError:
    _asarray = "raised"
_whole = np.concatenate(
    [np.random.default_rng(p).standard_normal((4, 8)).astype(np.float32) for p in range(jax.process_count())]
)
_same = multihost_utils.process_allgather(fn(data=_whole)["prob"], tiled=True)
try:
    fn(data=_whole + jax.process_index())
    _different = "accepted"
except AssertionError:
    _different = "refused"
np.savez(sys.argv[4], rows=rows, mine=mine, everyone=everyone, same=_same,
         asarray=_asarray, different=_different)
"""


def documented_example() -> str:
    """The Python block of the page's "Several hosts" section."""
    text = PAGE.read_text()
    section = text[text.index("### Several hosts") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("```", start)]
    assert "jax.distributed.initialize(" in code and "make_array_from_process_local_data" in code, code
    return code


def test_the_several_hosts_example_runs_as_two_processes(tmp_path):
    script = tmp_path / "hosts.py"
    script.write_text(documented_example() + CHECKS)
    address = f"127.0.0.1:{free_port()}"
    outputs = [tmp_path / f"process{p}.npz" for p in range(PROCESSES)]
    done = run_together(
        [[sys.executable, str(script), address, str(PROCESSES), str(p), str(outputs[p])] for p in range(PROCESSES)],
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
    )
    for result in done:
        assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{result.stderr[-4000:]}"

    got = []
    for output in outputs:
        with np.load(output) as arrays:
            got.append(dict(arrays))
    rows = np.concatenate([g["rows"] for g in got])
    assert not np.allclose(got[0]["rows"], got[1]["rows"]), "the processes fed different rows"
    examples = ROOT / "rnn2jax" / "examples"
    one_process = rnn2jax.compile(examples / "mlp_predict_net.pbtxt", init_net=examples / "mlp_init_net.pbtxt")
    expected = np.asarray(one_process(data=rows)["prob"])
    for p, g in enumerate(got):
        assert str(g["asarray"]) == "raised" and str(g["different"]) == "refused", p
        np.testing.assert_allclose(g["mine"], expected[4 * p : 4 * (p + 1)], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g["everyone"], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(g["same"], g["everyone"])
