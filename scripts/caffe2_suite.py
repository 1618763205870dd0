"""Caffe2's whole Python test suite as a scoreboard: each test file of the torch 1.10.2 wheel, run unmodified on
real Caffe2 (the baseline, cached) and on rnn2jax's `caffe2`, and the page that compares them.

    .venv/bin/python scripts/caffe2_suite.py run [--examples N] [--jobs J] [--only GLOB ...]
    .venv/bin/python scripts/caffe2_suite.py report          # docs/caffe2-suite.md from the last results
    .venv/bin/python scripts/caffe2_suite.py ci              # every file, the recorded passing tests, 1 example
    .venv/bin/python scripts/caffe2_suite.py prepare DIR     # the sources and files, for benchmarks/gpu_caffe2_suite.sh

`run` runs every `*_test.py` under the wheel's `caffe2/` package directory, one pytest process per file and side:
real Caffe2 in the oracle venv (`.venv-caffe2`, where it installs pytest and hypothesis when missing), and rnn2jax
through `rnn2jax.caffe2.pytest_plugin` from a temporary copy of the file (in place, pytest would import the real
`caffe2` package beside it). The baseline of a file is kept in
`.cache/caffe2-suite/` under the hash of the file and the number of examples, so only rnn2jax's side reruns.
The results (`caffe2-suite.json`) record every test's outcome on both sides and, for each failure on rnn2jax, the
exception's last line; the page groups failures by that cause.

`ci` (`make test-caffe2-suite-ci`, part of `make test`) checks the page against the results it is rendered from and
runs the tests the results record as passing on both sides (`tests/caffe2_suite.py`), from a temporary copy of the
tree, in one pytest run (`-n 2`) at one derandomized example per hypothesis test: the RNN, seq2seq, control-flow and
optimizer files (PRIORITY) whole, and every other file the page scores, collected (so a file that stops importing
fails), with at most CI_TESTS_PER_FILE of its passing tests, which keeps CI's time bounded as the scored suite grows
without dropping a file.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.caffe2_suite import suite_key  # noqa: E402  (the key CI's plugin selects tests by)

PAGE = ROOT / "docs" / "caffe2-suite.md"
RESULTS = ROOT / "docs" / "caffe2-suite.json"
CACHE = ROOT / ".cache" / "caffe2-suite"
PROJECT_PYTHON = ROOT / ".venv" / "bin" / "python"
CAFFE2_PYTHON = ROOT / ".venv-caffe2" / "bin" / "python"
# The tools the baseline needs in the oracle venv (real Caffe2 ships its tests, not their runner).
BASELINE_TOOLS = ("pytest>=8,<9", "hypothesis>=6.100,<7", "pytest-timeout>=2.3", "scipy<1.12")
# A baseline cached by an older runner is run again where the change touches the file: version 2 counts
# serial.given tests in their own file (version 1, whose cache names carry no version, dropped them), so only
# files that use Caffe2's serialized_test_util need version 2.
CACHE_VERSION = 2
# The files whose every test real Caffe2 passes must pass on rnn2jax (issue: RNN, seq2seq, control flow,
# optimizers): the page lists them apart, and CI runs them whole.
PRIORITY = (
    "python/models/seq2seq/seq2seq_beam_search_test.py",
    "python/models/seq2seq/seq2seq_model_helper_test.py",
    "python/operator_test/basic_rnn_test.py",
    "python/operator_test/cudnn_recurrent_test.py",
    "python/operator_test/gru_test.py",
    "python/operator_test/pack_rnn_sequence_op_test.py",
    "python/operator_test/recurrent_net_executor_test.py",
    "python/operator_test/recurrent_network_test.py",
    "python/operator_test/rnn_cell_test.py",
    "python/test/inference_lstm_op_test.py",
    "quantization/server/lstm_unit_dnnlowp_op_test.py",
    "python/control_ops_grad_test.py",
    "python/control_test.py",
    "python/net_builder_test.py",
    "python/operator_test/onnx_while_test.py",
    "python/test/do_op_test.py",
    "python/optimizer_test.py",
    "python/ideep/adam_op_test.py",
    "python/ideep/moment_sgd_op_test.py",
    "python/operator_test/adadelta_test.py",
    "python/operator_test/adagrad_test.py",
    "python/operator_test/adam_test.py",
    "python/operator_test/decay_adagrad_test.py",
    "python/operator_test/lars_test.py",
    "python/operator_test/learning_rate_adaption_op_test.py",
    "python/operator_test/learning_rate_op_test.py",
    "python/operator_test/momentum_sgd_test.py",
    "python/operator_test/storm_test.py",
    "python/operator_test/wngrad_test.py",
)
CI_TESTS_PER_FILE = 3
TEST_TIMEOUT_S = 300  # one test; a process of n files gets max(FILE_TIMEOUT_S, 300 n s) in all
FILE_TIMEOUT_S = 1800
# Caffe2's test utilities load the hypothesis profile $CAFFE2_HYPOTHESIS_PROFILE names when imported: real Caffe2's
# side gets this one, registered first by a plugin, with as many examples as rnn2jax's side.
BASELINE_PROFILE_PLUGIN = """\
import os
from hypothesis import HealthCheck, settings
settings.register_profile(
    "caffe2-suite", max_examples=int(os.environ["CAFFE2_SUITE_EXAMPLES"]), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
os.environ["CAFFE2_HYPOTHESIS_PROFILE"] = "caffe2-suite"
"""

# Tests real Caffe2 does not pass on this CPU build, by what they need (their skip or failure message).
APART_MESSAGES: tuple[tuple[str, str], ...] = (
    (r"torch\.ops\._caffe2|_caffe2", "calls torch.ops._caffe2 (Caffe2 kernels exported to PyTorch)"),
    (r"(?i)\bcuda\b|\bgpu\b|cudnn", "needs CUDA"),
    (r"(?i)mkldnn|ideep", "needs MKL-DNN/IDEEP"),
)


# ------------------------------------------------------------------------------------------------
# The suite's files


def find_source() -> Path:
    """The wheel's `caffe2` package directory in the oracle venv."""
    found = sorted((ROOT / ".venv-caffe2" / "lib").glob("python3*/site-packages/caffe2"))
    if not found:
        sys.exit("caffe2_suite: no real Caffe2 in .venv-caffe2 (make test creates it)")
    return found[0]


def suite_files(source: Path, only: Iterable[str] = ()) -> list[str]:
    """Every test file of the wheel, as paths relative to its `caffe2/` directory."""
    files = sorted(str(p.relative_to(source)) for p in source.rglob("*_test.py"))
    patterns = list(only)
    return [f for f in files if not patterns or any(_matches(f, p) for p in patterns)]


# What a test calls that rnn2jax's side cannot have, read from the test's own source: such a test is listed apart
# even where real Caffe2 passes it (the torch 1.10.2 wheel exports Caffe2's kernels to PyTorch; rnn2jax's venv
# has a PyTorch without them, and rnn2jax registers no PyTorch ops).
APART_SOURCES: tuple[tuple[str, str], ...] = (("torch.ops._caffe2", APART_MESSAGES[0][1]),)


def mark_apart(results: dict[str, Any], source: Path) -> None:
    """Set `needs` on each real-Caffe2 test whose method's source calls what APART_SOURCES names."""
    for rel, sides in results["files"].items():
        path = source / rel
        text = path.read_text() if path.exists() else ""
        if not any(pattern in text for pattern, _ in APART_SOURCES):
            continue
        methods = {}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        methods[(node.name, item.name)] = ast.get_source_segment(text, item) or ""
            elif isinstance(node, ast.FunctionDef):
                methods.setdefault(("", node.name), ast.get_source_segment(text, node) or "")
        for key, test in sides["caffe2"]["tests"].items():
            parts = key.split("::")
            cls, name = (parts[1], parts[2]) if len(parts) == 3 else ("", parts[-1])
            body = methods.get((cls, name.split("[")[0]), "")
            why = next((why for pattern, why in APART_SOURCES if pattern in body), None)
            if why:
                test["needs"] = why


def _matches(rel: str, pattern: str) -> bool:
    """Shell-style, one path segment per `*` (`python/*_test.py` is not `python/operator_test/x_test.py`)."""
    parts, wanted = rel.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatch(a, b) for a, b in zip(parts, wanted, strict=True))


# ------------------------------------------------------------------------------------------------
# Running files on one side


def _last_error_line(text: str) -> str:
    """The exception line of a pytest report: its last `E   ` line, else its last non-empty line."""
    lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    if not lines:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt|Failure|Warning)\b|^[\w.]+: ", line):
            return line[:300]
    return (lines[-1] if lines else "")[:300]


def _empty(status: str = "ok") -> dict[str, Any]:
    return {"status": status, "seconds": 0.0, "tests": {}, "collection_error": None}


def parse_junit(path: Path, prefix: str) -> dict[str, dict[str, Any]]:
    """Each file's tests (outcome, message, seconds) from one junit report; `file` attributes are relative to the
    run's rootdir, `prefix` + the path relative to the wheel's `caffe2/`."""
    files: dict[str, dict[str, Any]] = defaultdict(_empty)
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        rel = _test_file(case, prefix)
        if rel is None:
            continue
        result = files[rel]
        result["seconds"] = round(result["seconds"] + float(case.get("time") or 0.0), 3)
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                message = _last_error_line((child.text or "") + "\n" + (child.get("message") or ""))
                if child.tag == "error" and "collection failure" in (child.get("message") or ""):
                    result["collection_error"] = message
            elif child.tag == "skipped":
                outcome, message = "skipped", (child.get("message") or "")[:300]
        if not case.get("classname"):
            continue  # the file's collection error
        parts = case.get("classname", "").split(".")
        cls = parts[-1] if parts[-1] != Path(rel).stem else ""
        key = suite_key(rel, cls, case.get("name", ""))
        if result["tests"].get(key, {}).get("outcome") == "failed":
            continue  # a test that failed and then errored in teardown stays failed
        result["tests"][key] = {"outcome": outcome, "message": message}
    return files


def _test_file(case: ElementTree.Element, prefix: str) -> str | None:
    """The test file a junit testcase belongs to, relative to the wheel's `caffe2/`. Its `file` attribute names
    where the test function was defined, which for `serial.given` tests is serialized_test_util.py: the module
    path in `classname` decides then."""
    where = case.get("file") or ""
    if where.startswith(prefix) and (where.endswith("_test.py") or not case.get("classname")):
        return where[len(prefix) :]
    dotted = prefix.replace("/", ".")
    classname = case.get("classname") or ""
    if not classname.startswith(dotted):
        return None
    parts = classname[len(dotted) :].split(".")
    ends = [i for i, part in enumerate(parts, 1) if part.endswith("_test")]
    return "/".join(parts[: ends[-1]]) + ".py" if ends else None


def run_files(side: str, source: Path, rels: list[str], examples: int, derandomize: bool) -> dict[str, Any]:
    """Run some test files in one pytest process on `side` ("caffe2" or "rnn2jax"); each file's tests. A process
    that dies (a crash in native code) leaves no report: then each file runs alone, so one crash costs one file."""
    with tempfile.TemporaryDirectory(prefix="caffe2-suite-") as tmp:
        work = Path(tmp)
        (work / "pytest.ini").write_text("[pytest]\n")
        junit = work / "junit.xml"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        common = ["-q", "-p", "no:cacheprovider", "-c", str(work / "pytest.ini"), "--continue-on-collection-errors",
                  f"--junitxml={junit}", "-o", "junit_family=xunit1", f"--timeout={TEST_TIMEOUT_S}"]  # fmt: skip
        if side == "caffe2":
            # in place, so that the files import as caffe2.python...; nodeids relative to site-packages
            (work / "caffe2_suite_profile.py").write_text(BASELINE_PROFILE_PLUGIN)
            env.update(PYTHONPATH=str(work), CAFFE2_SUITE_EXAMPLES=str(examples))
            command = [str(CAFFE2_PYTHON), "-m", "pytest", *common, f"--rootdir={source.parent}",
                       "-p", "caffe2_suite_profile", *(str(source / rel) for rel in rels)]  # fmt: skip
            prefix = "caffe2/"
        else:
            # from a copy (in place pytest would import the real caffe2 package beside them), by path
            tree = work / "tree"
            for rel in rels:
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source / rel, tree / rel)
            env["RNN2JAX_CAFFE2_EXAMPLES"] = str(examples)
            if derandomize:
                env["RNN2JAX_HYPOTHESIS_PROFILE"] = "ci"
            command = [str(PROJECT_PYTHON), "-m", "pytest", *common, f"--rootdir={tree}", "--import-mode=importlib",
                       "-p", "rnn2jax.caffe2.pytest_plugin", f"--caffe2-source={source}", f"--caffe2-own-tests={tree}",
                       str(tree)]  # fmt: skip
            prefix = ""
        try:
            limit = max(FILE_TIMEOUT_S, 300 * len(rels))
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=limit)
            status, tail = ("ok" if done.returncode in (0, 1, 5) else f"exit {done.returncode}"), done.stdout[-4000:]
        except subprocess.TimeoutExpired:
            status, tail = "timeout", ""
        if status != "ok" and len(rels) > 1:
            results: dict[str, Any] = {}
            for rel in rels:
                results.update(run_files(side, source, [rel], examples, derandomize))
            return results
        found = parse_junit(junit, prefix) if junit.exists() else {}
        unreported = [rel for rel in rels if rel not in found]
        if status == "ok" and len(rels) > 1:  # a file the report lacks runs alone, to tell why
            for rel in unreported:
                found.update(run_files(side, source, [rel], examples, derandomize))
        results = {}
        for rel in rels:
            result = found.get(rel) or _empty("no report" if status == "ok" else status)
            if status != "ok":
                result["status"] = status
                result["collection_error"] = f"the pytest process ended with {status}: {_last_error_line(tail)}"
            results[rel] = result
        return results


def ensure_baseline_tools() -> None:
    """pytest, hypothesis and pytest-timeout in the oracle venv, which real Caffe2's wheel does not bring."""
    probe = subprocess.run([str(CAFFE2_PYTHON), "-c", "import pytest, hypothesis, pytest_timeout, scipy"],
                           capture_output=True)  # fmt: skip
    if probe.returncode != 0:
        print("caffe2_suite: installing the test tools into .venv-caffe2", flush=True)
        subprocess.run(
            [str(CAFFE2_PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *BASELINE_TOOLS],
            check=True,
        )


def _cached(source: Path, rel: str, examples: int) -> Path:
    text = (source / rel).read_bytes()
    digest = hashlib.sha256(text).hexdigest()[:16]
    version = f".v{CACHE_VERSION}" if b"serialized_test_util" in text else ""
    return CACHE / f"{rel.replace('/', '__')}.{digest}.{examples}{version}.json"


def _batches(rels: list[str], size: int) -> list[list[str]]:
    return [rels[i : i + size] for i in range(0, len(rels), size)]


def run_suite(files: list[str], source: Path, examples: int, jobs: int, derandomize: bool,
              baseline_only: bool = False, batch: int = 20) -> dict[str, Any]:  # fmt: skip
    """Real Caffe2's outcome of every file (from the cache when the file and the example count are unchanged),
    then rnn2jax's; `jobs` pytest processes at a time, each running `batch` files."""
    ensure_baseline_tools()
    real: dict[str, Any] = {}
    todo = []
    for rel in files:
        cached = _cached(source, rel, examples)
        if cached.exists():
            real[rel] = json.loads(cached.read_text())
        else:
            todo.append(rel)

    def on_caffe2(rels: list[str]) -> dict[str, Any]:
        results = run_files("caffe2", source, rels, examples, derandomize=False)
        CACHE.mkdir(parents=True, exist_ok=True)
        for rel, result in results.items():
            _cached(source, rel, examples).write_text(json.dumps(result, indent=1, sort_keys=True))
            passed = sum(t["outcome"] == "passed" for t in result["tests"].values())
            print(f"real Caffe2: {rel}: {passed} passed", flush=True)
        return results

    def on_rnn2jax(rels: list[str]) -> dict[str, Any]:
        results = run_files("rnn2jax", source, rels, examples, derandomize)
        for rel, result in results.items():
            print(f"rnn2jax: {rel}: {_kept(real[rel], result)}/{_passing(real[rel])}", flush=True)
        return results

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for results in pool.map(on_caffe2, _batches(todo, batch)):
            real.update(results)
        ours: dict[str, Any] = {}
        if not baseline_only:
            for results in pool.map(on_rnn2jax, _batches(files, batch)):
                ours.update(results)
    return {
        "examples": examples,
        "derandomize": derandomize,
        "suite_files": len(suite_files(source)),
        "files": {rel: {"caffe2": real[rel], "rnn2jax": ours.get(rel, _empty("not run"))} for rel in sorted(files)},
    }


def _passing(result: Mapping[str, Any]) -> int:
    return sum(t["outcome"] == "passed" for t in result["tests"].values())


def _kept(real: Mapping[str, Any], ours: Mapping[str, Any]) -> int:
    return sum(
        ours["tests"].get(k, {}).get("outcome") == "passed"
        for k, t in real["tests"].items()
        if t["outcome"] == "passed"
    )


# ------------------------------------------------------------------------------------------------
# The page


def cause_of(message: str) -> str:
    """A failure's cause, with the details that differ between tests of one cause (numbers, blob names) kept."""
    message = message.strip() or "(no message)"
    missing = re.search(r"No module named '([\w.]+)'", message)
    if missing:
        return f"missing module `{missing.group(1)}`"
    attribute = re.search(r"module '([\w.]+)' has no attribute '(\w+)'", message)
    if attribute:
        return f"missing API `{attribute.group(1)}.{attribute.group(2)}`"
    op = re.search(
        r"[Nn]o lowering for op type '?(\w+)'?|op type '(\w+)' is not supported|"
        r"unsupported op(?: type)?:? '?(\w+)'?",
        message,
    )
    if op:
        return f"op type not lowered: `{next(g for g in op.groups() if g)}`"
    first = message.split(":", 1)[0]
    if first.endswith("AssertionError") or first == "AssertionError":
        return "a value differs from what the test expects (AssertionError)"
    return re.sub(r"\s+", " ", message)[:160]


def _needs(message: str) -> str | None:
    return next((why for pattern, why in APART_MESSAGES if re.search(pattern, message)), None)


def summarize(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per file: the tests real Caffe2 passes and how many of them rnn2jax passes; the failures by cause; the
    tests real Caffe2 does not pass here because they need CUDA, MKL-DNN or PyTorch's Caffe2 ops (apart)."""
    rows, causes, apart = [], defaultdict(list), defaultdict(Counter)
    total_real = total_ours = 0
    for rel, sides in results["files"].items():
        real, ours = sides["caffe2"], sides["rnn2jax"]
        if real["collection_error"] and not real["tests"]:
            apart[f"real Caffe2 cannot import it here ({real['collection_error'][:120]})"][rel] += 1
            continue
        for test in real["tests"].values():
            why = test.get("needs") or (_needs(test["message"]) if test["outcome"] != "passed" else None)
            if why:
                apart[why][rel] += 1
        passing = [k for k, t in real["tests"].items() if t["outcome"] == "passed" and not t.get("needs")]
        kept = 0
        for key in passing:
            got = ours["tests"].get(key)
            if got and got["outcome"] == "passed":
                kept += 1
                continue
            if got is None:
                message = ours["collection_error"] or "not collected on rnn2jax"
            else:
                message = got["message"] if got["outcome"] == "failed" else f"skipped: {got['message']}"
            causes[cause_of(message)].append(key)
        total_real += len(passing)
        total_ours += kept
        rows.append((rel, len(real["tests"]), len(passing), kept, ours["seconds"]))
    return {"rows": rows, "causes": causes, "apart": apart, "real": total_real, "ours": total_ours}


def render(results: Mapping[str, Any]) -> str:
    s = summarize(results)
    share = 100.0 * s["ours"] / max(s["real"], 1)
    files_full = sum(1 for r in s["rows"] if r[2] and r[3] == r[2])
    lines = [
        "# Caffe2's test suite on rnn2jax",
        "",
        "Generated by `scripts/caffe2_suite.py` (`make test-caffe2-suite`); do not edit by hand. Every test file of",
        "Caffe2's Python test suite as the torch 1.10.2 wheel ships it runs unmodified twice: on real Caffe2 (the",
        "baseline) and on rnn2jax's `caffe2`. A test counts when real Caffe2 passes it on this CPU build.",
        "",
        f"- **rnn2jax passes {s['ours']} of the {s['real']} tests real Caffe2 passes ({share:.1f} %)**, over "
        f"{len(s['rows'])} files; {files_full} of them pass in full.",
        f"- Files run: all {results['suite_files']} of the suite."
        if len(results["files"]) == results["suite_files"]
        else f"- Files run: {len(results['files'])} of the suite's {results['suite_files']}; the others are not in "
        "these figures yet.",
        f"- Hypothesis examples per test: {results['examples']} on rnn2jax"
        f"{' (derandomized)' if results['derandomize'] else ''}, as many on real Caffe2.",
    ]
    priority = [row for row in s["rows"] if row[0] in PRIORITY]
    p_real, p_ours = sum(r[2] for r in priority), sum(r[3] for r in priority)
    short = [f"`{r[0]}` ({r[3]}/{r[2]})" for r in priority if r[3] < r[2]]
    lines += [
        f"- **The RNN, seq2seq, control-flow and optimizer files** (every test must pass): rnn2jax passes {p_ours} of "
        f"the {p_real} tests real Caffe2 passes there, over {len(priority)} files"
        + (f"; not in full: {', '.join(short)}." if short else ", every file in full."),
        "",
        "## Per file",
        "",
        "| file | tests | real Caffe2 passes | rnn2jax passes of those | rnn2jax seconds |",
        "|---|---|---|---|---|",
    ]
    for rel, n, passing, kept, seconds in s["rows"]:
        mark = " (RNN, seq2seq, control flow, optimizers)" if rel in PRIORITY else ""
        lines.append(f"| `{rel}`{mark} | {n} | {passing} | {kept} | {seconds:.0f} |")
    lines += [
        "",
        "## What remains, by cause",
        "",
        "Each cause with the tests it fails (tests real Caffe2 passes and rnn2jax does not).",
        "",
    ]
    for cause, keys in sorted(s["causes"].items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(f"`{k}`" for k in sorted(keys)[:6])
        more = f", and {len(keys) - 6} more" if len(keys) > 6 else ""
        lines.append(f"- **{cause}** ({len(keys)}): {shown}{more}")
    lines += [
        "",
        "## Listed apart",
        "",
        "Tests not counted above, by what they need, with the number of such tests per file: those real Caffe2",
        "itself does not pass on this CPU build, and those whose source calls torch.ops._caffe2 (the wheel's PyTorch",
        "has Caffe2's kernels; the PyTorch rnn2jax runs beside has none, and rnn2jax registers no PyTorch ops):",
        "",
    ]
    for why, files in sorted(s["apart"].items()):
        listed = ", ".join(f"`{rel}` ({n})" for rel, n in sorted(files.items()))
        lines.append(f"- {why}: {listed}")
    return "\n".join(lines) + "\n"


def run_ci(source: Path, results: Path, jobs: int) -> int:
    """The page checked against its results; then, in one pytest run at one derandomized example per hypothesis
    test, the recorded passing tests: the PRIORITY files whole and every other scored file, collected, with at most
    CI_TESTS_PER_FILE of them."""
    if PAGE.read_text() != render(json.loads(results.read_text())):
        print(f"caffe2_suite: {PAGE.relative_to(ROOT)} is stale: `make test-caffe2-suite` rewrites it", flush=True)
        return 1
    scored = json.loads(results.read_text())["files"]
    with tempfile.TemporaryDirectory(prefix="caffe2-suite-ci-") as tmp:
        tree = Path(tmp)
        for rel in suite_files(source):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source / rel, tree / rel)
        (tree / "pytest.ini").write_text("[pytest]\n")
        whole = [f"--caffe2-suite-whole={rel}" for rel in PRIORITY if rel in scored]
        env = {**os.environ, "RNN2JAX_CAFFE2_EXAMPLES": "1", "RNN2JAX_HYPOTHESIS_PROFILE": "ci"}
        env["PYTHONPATH"] = str(ROOT)
        command = [str(PROJECT_PYTHON), "-m", "pytest", "-q", "-n", str(jobs), "-p", "no:cacheprovider",
                   "-c", str(tree / "pytest.ini"), f"--rootdir={tree}", "--import-mode=importlib",
                   f"--timeout={TEST_TIMEOUT_S}", "-p", "rnn2jax.caffe2.pytest_plugin", f"--caffe2-source={source}",
                   f"--caffe2-own-tests={tree}", "-p", "tests.caffe2_suite", f"--caffe2-suite-results={results}",
                   f"--caffe2-suite-per-file={CI_TESTS_PER_FILE}", *whole, str(tree)]  # fmt: skip
        print(
            f"caffe2_suite ci: every recorded passing test of the {len(whole)} RNN, seq2seq, control-flow and "
            f"optimizer files, at most {CI_TESTS_PER_FILE} of every other file's, 1 example each",
            flush=True,
        )
        return subprocess.run(command, cwd=tree, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the suite on both sides, write the results and the page")
    run.add_argument("--examples", type=int, default=10, help="hypothesis examples per test (10: Caffe2's dev profile)")
    run.add_argument("--derandomize", action="store_true", help="draw the same examples on every run (CI)")
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--baseline-only", action="store_true", help="fill the baseline cache, run nothing on rnn2jax")
    run.add_argument("--only", nargs="*", default=[], help="file patterns (python/operator_test/*); default all")
    run.add_argument("-o", "--output", default=str(RESULTS), help="the results (JSON)")
    run.add_argument(
        "--merge", action="store_true", help="keep the other files' results (same examples); replace those run now"
    )
    run.add_argument("--page", default=str(PAGE), help="the page to write ('' for none)")
    sub.add_parser("report", help="write the page from the results").add_argument("--results", default=str(RESULTS))
    ci = sub.add_parser("ci", help="every file; the recorded passing tests must pass (one example each)")
    ci.add_argument("--results", default=str(RESULTS))
    ci.add_argument("--jobs", type=int, default=2)
    prepare = sub.add_parser("prepare", help="copy Caffe2's sources and the suite's files to DIR, for another machine")
    prepare.add_argument("dir")
    args = parser.parse_args(argv)

    if args.command == "run":
        source = find_source()
        files = suite_files(source, args.only)
        results = run_suite(files, source, args.examples, args.jobs, args.derandomize, args.baseline_only)
        if args.baseline_only:
            return 0
        previous = json.loads(Path(args.output).read_text()) if args.merge and Path(args.output).exists() else None
        if previous and (previous["examples"], previous["derandomize"]) == (args.examples, args.derandomize):
            results["files"] = dict(sorted({**previous["files"], **results["files"]}.items()))
        mark_apart(results, source)
        Path(args.output).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        if args.page:
            Path(args.page).write_text(render(results))
        s = summarize(results)
        print(f"rnn2jax passes {s['ours']} of the {s['real']} tests real Caffe2 passes")
        return 0
    if args.command == "report":
        results = json.loads(Path(args.results).read_text())
        mark_apart(results, find_source())
        Path(args.results).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        PAGE.write_text(render(results))
        return 0
    if args.command == "prepare":
        prepare_copy(find_source(), Path(args.dir))
        return 0
    return run_ci(find_source(), Path(args.results), args.jobs)


def prepare_copy(source: Path, folder: Path) -> None:
    """What running the suite needs on a machine without the oracle venv (benchmarks/gpu_caffe2_suite.sh): Caffe2's
    Python sources and goldens in `folder/src/caffe2`, the suite's test files in `folder/tree`."""
    for path in source.rglob("*"):
        if path.suffix in (".py", ".zip") and path.is_file():
            target = folder / "src" / "caffe2" / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    tree = folder / "tree"
    for rel in suite_files(source):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / rel, tree / rel)
    (tree / "pytest.ini").write_text("[pytest]\n")


if __name__ == "__main__":
    sys.exit(main())
