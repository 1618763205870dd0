"""`make test-explore` pins what it finds and `make test` replays it (tests/pinned_examples.py), checked on a
small hypothesis test run in pytest subprocesses with this suite's conftest and their own pinned database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TOY = '''
from hypothesis import given, strategies as st

@given(st.integers(0, 1000))
def test_toy(x):
    with open("seen.txt", "a") as seen:
        seen.write(f"{x} ")
    assert not 600 < x < 700  # a bug the fixed draws of `make test` do not reach
'''


def run(tmp_path: Path, profile: str, examples: int = 5) -> tuple[subprocess.CompletedProcess, list[int]]:
    (tmp_path / "seen.txt").unlink(missing_ok=True)
    env = {
        **os.environ,
        "RNN2JAX_HYPOTHESIS_PROFILE": profile,
        "RNN2JAX_EXAMPLES": str(examples),
        "RNN2JAX_PINNED_EXAMPLES": str(tmp_path / "pinned"),
        "RNN2JAX_EXPLORED_EXAMPLES": str(tmp_path / "explored"),
        "PYTHONPATH": str(ROOT / "tests"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "--rootdir", str(tmp_path),
         "-c", os.devnull, "test_toy.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    seen = (tmp_path / "seen.txt").read_text().split() if (tmp_path / "seen.txt").exists() else []
    return done, [int(x) for x in seen]


def test_explore_pins_a_failing_example_and_make_test_replays_it(tmp_path):
    (tmp_path / "test_toy.py").write_text(TOY)
    fixed, drawn = run(tmp_path, "ci")
    assert fixed.returncode == 0, fixed.stdout[-2000:]
    again, drawn_again = run(tmp_path, "ci")
    assert again.returncode == 0 and drawn_again == drawn  # the same examples on every run
    assert not any(600 < x < 700 for x in drawn)

    explored, _ = run(tmp_path, "explore", examples=400)
    assert explored.returncode == 1 and "x=601" in explored.stdout, explored.stdout[-2000:]
    index = (tmp_path / "pinned" / "pinned.txt").read_text().split()
    assert index[1] == "test_toy.py::test_toy" and len(index) == 2
    assert [p.name for p in (tmp_path / "pinned" / index[0]).iterdir()]  # hypothesis' database format

    replayed, drawn = run(tmp_path, "ci")
    assert replayed.returncode == 1 and "x=601" in replayed.stdout, replayed.stdout[-2000:]
    assert drawn[0] == 601  # the pinned example first, before the fixed draws

    # An edited test has a new database key: its pin would be skipped silently, so the run says so.
    (tmp_path / "test_toy.py").write_text(TOY.replace("    assert not 600", "    x = int(x)\n    assert not 600"))
    stale, _ = run(tmp_path, "ci")
    assert stale.returncode == 1 and "did not replay them" in stale.stdout, stale.stdout[-2000:]
