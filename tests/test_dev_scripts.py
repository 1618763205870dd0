"""The developer scripts under scripts/ that have no test of their own elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from suite_time_by_area import by_area  # noqa: E402

REPORT = """\
============================= slowest durations =============================
2.50s call     tests/ops/test_math.py::test_caffe2_math[Cos]
0.50s setup    tests/ops/test_math.py::test_caffe2_math[Cos]
1.25s call     tests/ops/test_array.py::test_top_k[jit]
4.00s call     tests/test_fuzz.py::test_short_run
0.75s teardown tests/recurrent/test_cells.py::test_cell[lstm]
0.25s call     tests/recurrent/test_cells.py::test_cell[lstm]
(3 durations < 0.005s hidden.  Use -vv to show these durations.)
12 passed in 5.00s
"""


def test_suite_time_by_area_sums_every_phase_by_folder(tmp_path):
    report = tmp_path / "durations.txt"
    report.write_text(REPORT)
    seconds, tests, files = by_area(report)
    assert seconds == {"ops": 4.25, "test_fuzz": 4.0, "recurrent": 1.0}
    assert tests == {"ops": 2, "test_fuzz": 1, "recurrent": 1}
    assert files["tests/ops/test_math.py"] == 3.0
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "suite_time_by_area.py"), str(report), str(report)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "| ops | 4 | 2 | 46% | 4 | 1.00 |" in done.stdout.splitlines()
    assert "| total | 9 | 4 | 100% | 9 | 1.00 |" in done.stdout.splitlines()
