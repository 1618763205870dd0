"""benchmarks/compare.py end to end on one tiny LSTM (no real Caffe2, no memory probe), and its equality guard.

The run must write a row per mode, each with the equality errors of every form it timed (the check against
the hand-written JAX ran and passed: errors at most 1, i.e. within the tolerance), and PyTorch's column
filled. No timing is asserted. scripts/bench_table.py must render that JSON as one Markdown row per row.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "latest.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "compare.py"),
        "--quick",
        "--no-caffe2",
        "--no-memory",
        "--sizes",
        "4,2,8",
        "--models",
        "lstm",
        "--threads",
        "1",
        "--cpu-time",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_rows_are_checked_and_complete(quick_run):
    rows = quick_run["rows"]
    assert [(r["model"], r["size"], r["mode"]) for r in rows] == [
        ("lstm", [4, 2, 8], mode) for mode in ("forward", "train_bsn", "train_jaxgrad")
    ]
    for row in rows:
        assert set(row["check_error"]) == {row["mode"], "torch", "hand_jax"}
        assert all(0.0 <= err <= 1.0 for err in row["check_error"].values())
        assert row["ms"]["rnn2jax"] > 0 and row["ms"]["torch"] > 0 and row["ms"]["hand_jax"] > 0
        assert row["rounds"] >= 3
        assert row["ratios"]["vs_caffe2"] is None
    assert quick_run["caffe2"] == "skipped"
    assert quick_run["clock"] == "cpu" and quick_run["machine"]["threads"] == 1
    gemm = quick_run["peak_gemm"]
    assert gemm["peak_gflops"] == max(gemm["gflops"].values()) > 0
    for row in rows:  # 4,2,8 LSTM: 2 GEMMs of 2*N*H*4H per step, tripled for training
        flops = 4 * 2 * (2 * 2 * 8 * 4 * 8) * (1 if row["mode"] == "forward" else 3)
        expected = flops / (row["ms"]["rnn2jax"] / 1e3) / (gemm["peak_gflops"] * 1e9)
        assert row["gemm_fraction"] == pytest.approx(expected)
    assert quick_run["machine"]["cpu_count"] >= 1 and quick_run["machine"]["jax_devices"]
    assert quick_run["tolerance"] == {"rtol": 1e-4, "atol": 1e-5, "atol_scaled_by": "max(1, max|reference|)"}


def test_bench_table_renders_every_row(quick_run, tmp_path):
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(quick_run))
    alone = ["--single-thread", str(tmp_path / "none.json")]  # whatever a local make bench left
    text = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_table.py"), str(path), *alone],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    body = [line for line in text.splitlines() if line.startswith("| lstm |")]
    assert len(body) == 3
    forward = quick_run["rows"][0]
    assert f"{forward['ms']['rnn2jax']:.2f}" in body[0] and "training, jax.grad" in body[2]
    assert body[0].endswith(f"| {100 * forward['gemm_fraction']:.0f}% |")
    assert f"Peak GEMM (float32, n = 1024, threads: 1): {quick_run['peak_gemm']['peak_gflops']}" in text
    # with a single-thread run beside it, a second table gives its ratios next to the wall-clock ones
    single = tmp_path / "single.json"
    single.write_text(json.dumps(quick_run))
    both = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_table.py"), str(path), "--single-thread", str(single)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line for line in both.splitlines() if line.startswith("| lstm |")]
    assert len(rows) == 6 and "Single thread, CPU time" in both
    ratio = f"{forward['ratios']['vs_torch']:.2f}"
    assert rows[3].startswith("| lstm | 4, 2, 8 | forward |") and f"| {ratio} | {ratio} |" in rows[3]


def test_mismatch_is_an_error(monkeypatch):
    """The guard compare.py runs before timing: within tolerance passes, beyond it raises (never a row)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import compare

    want = np.linspace(-3.0, 3.0, 50, dtype=np.float32)
    assert compare.check_close("ok", want * (1 + 5e-5), want) <= 1.0
    with pytest.raises(compare.BenchmarkMismatch, match="gradient of w"):
        compare.check_result("bad", {"w": want + 1e-3}, {"w": want})


CAFFE2_PYTHON = ROOT / ".venv-caffe2" / "bin" / "python"


@pytest.mark.skipif(not CAFFE2_PYTHON.exists(), reason=f"real-Caffe2 venv missing: {CAFFE2_PYTHON}")
def test_nmt_decode_checks_both_sides_and_reports_throughput(tmp_path):
    """benchmarks/nmt_decode.py --quick: real Caffe2 trains a tiny checkpoint, both sides decode it with
    Caffe2's translate code, the translations are checked equal, and each side's throughput is reported."""
    out = tmp_path / "nmt.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "nmt_decode.py"), "--quick", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["sides"]) == {"caffe2", "rnn2jax"} and report["sentences"] == 4
    for side in report["sides"].values():
        assert side["warm_sentences_per_s"] > 0 and side["cold_sentences_per_s"] > 0 and len(side["warm_pass_s"]) == 1
    assert 0 <= report["score_max_rel_error"] <= 1e-4
    assert "| rnn2jax |" in proc.stdout and "translations equal" in proc.stdout


def test_nmt_decode_refuses_different_translations():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import nmt_decode
    finally:
        sys.path.pop(0)
    same = [[[4, 5, 2], -1.5], [[2], -0.25]]
    assert nmt_decode._check_equal(same, same) == 0.0
    with pytest.raises(SystemExit, match="sentence 1: rnn2jax decodes"):
        nmt_decode._check_equal(same, [same[0], [[3, 2], -0.25]])
    with pytest.raises(SystemExit, match="sentence 0: rnn2jax's score"):
        nmt_decode._check_equal(same, [[[4, 5, 2], -1.6], same[1]])
