"""docs/caffe2-suite.md, the scoreboard of Caffe2's own test suite on rnn2jax, is the rendering of the results it is
made from (docs/caffe2-suite.json, written by `make test-caffe2-suite`), and the runner reads pytest's reports as
pytest wrote them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import caffe2_suite  # noqa: E402


def test_the_page_is_the_rendering_of_its_results():
    results = json.loads(caffe2_suite.RESULTS.read_text())
    assert caffe2_suite.PAGE.read_text() == caffe2_suite.render(results), "make test-caffe2-suite rewrites it"
    for rel, sides in results["files"].items():  # every count on the page is one of these tests
        assert set(sides) == {"caffe2", "rnn2jax"}, rel
        for side in sides.values():
            assert all(t["outcome"] in ("passed", "failed", "skipped") for t in side["tests"].values()), rel


def test_file_patterns_match_one_segment_per_star():
    assert caffe2_suite._matches("python/core_test.py", "python/*_test.py")
    assert not caffe2_suite._matches("python/operator_test/abs_test.py", "python/*_test.py")
    assert caffe2_suite._matches("python/operator_test/abs_test.py", "python/operator_test/*")


def test_junit_reports_are_read_as_pytest_wrote_them(tmp_path):
    """A real pytest run over a file that passes, fails, skips and cannot import: the runner's reading of its
    junit report gives each test's outcome under the key the quick run selects by (`suite_key`)."""
    tree = tmp_path / "python"
    tree.mkdir()
    (tree / "mixed_test.py").write_text(
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self): pass\n"
        "    def test_bad(self): raise KeyError('no blob x')\n"
        "    @unittest.skip('No GPU')\n"
        "    def test_gpu(self): pass\n"
        "def test_plain(): assert 1 + 1 == 3\n"
    )
    (tree / "broken_test.py").write_text("import no_such_module_here\n")
    junit = tmp_path / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={tmp_path}",
               "--continue-on-collection-errors", f"--junitxml={junit}", "-o", "junit_family=xunit1",
               str(tree)]  # fmt: skip
    subprocess.run(command, cwd=tmp_path, capture_output=True, check=False)
    files = caffe2_suite.parse_junit(junit, "")
    mixed = files["python/mixed_test.py"]["tests"]
    assert {k: t["outcome"] for k, t in mixed.items()} == {
        "python/mixed_test.py::T::test_ok": "passed",
        "python/mixed_test.py::T::test_bad": "failed",
        "python/mixed_test.py::T::test_gpu": "skipped",
        "python/mixed_test.py::test_plain": "failed",
    }
    assert mixed["python/mixed_test.py::T::test_bad"]["message"].startswith("KeyError")
    assert caffe2_suite.cause_of(files["python/broken_test.py"]["collection_error"]) == (
        "missing module `no_such_module_here`"
    )


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        ("ModuleNotFoundError: No module named 'caffe2.python.cnn'", "missing module `caffe2.python.cnn`"),
        ("AttributeError: module 'caffe2.python.brew' has no attribute 'x'", "missing API `caffe2.python.brew.x`"),
    ],
)
def test_causes_name_what_is_missing(message, cause):
    assert caffe2_suite.cause_of(message) == cause


def test_ci_caps_each_files_tests_the_same_way_every_run():
    from tests.caffe2_suite import capped

    keys = {f"python/a_test.py::T::test_{i}" for i in range(7)} | {"python/b_test.py::test_x"}
    chosen = capped(keys, 3)
    assert len([k for k in chosen if k.startswith("python/a_test.py")]) == 3
    assert "python/b_test.py::test_x" in chosen  # a file with fewer keeps them all
    assert capped(set(sorted(keys, reverse=True)), 3) == chosen  # not by the set's order
    assert capped(keys, 0) == keys
    assert capped(keys, 3, frozenset({"python/a_test.py"})) == keys  # a PRIORITY file runs whole


def test_every_priority_file_is_in_the_suite():
    if not sorted((ROOT / ".venv-caffe2" / "lib").glob("python3*/site-packages/caffe2")):
        pytest.skip("real Caffe2 (.venv-caffe2, made by make test) is absent")
    source = caffe2_suite.find_source()
    assert set(caffe2_suite.PRIORITY) <= set(caffe2_suite.suite_files(source))


def test_a_test_that_calls_pytorchs_caffe2_ops_is_listed_apart(tmp_path):
    (tmp_path / "python").mkdir()
    (tmp_path / "python" / "x_test.py").write_text(
        "class T:\n    def test_torch(self):\n        torch.ops._caffe2.LayerNorm(x)\n"
        "    def test_plain(self):\n        workspace.RunOperatorOnce(op)\n"
    )
    passed = {"outcome": "passed", "message": ""}
    tests = {f"python/x_test.py::T::{name}": dict(passed) for name in ("test_torch", "test_plain")}
    results = {
        "examples": 1, "derandomize": True, "suite_files": 1,
        "files": {"python/x_test.py": {
            "caffe2": {"status": "ok", "seconds": 0.0, "collection_error": None, "tests": tests},
            "rnn2jax": {"status": "ok", "seconds": 0.0, "collection_error": None, "tests": {}},
        }},
    }  # fmt: skip
    caffe2_suite.mark_apart(results, tmp_path)
    summary = caffe2_suite.summarize(results)
    assert summary["real"] == 1 and summary["ours"] == 0  # test_plain alone counts
    assert summary["apart"] == {caffe2_suite.APART_MESSAGES[0][1]: {"python/x_test.py": 1}}
