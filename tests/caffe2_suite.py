"""The quick run of Caffe2's whole test suite on rnn2jax (a pytest plugin: `-p tests.caffe2_suite`).

`scripts/caffe2_suite.py ci` collects every file of the suite that `docs/caffe2-suite.json` scores (so a file that
stops importing fails the run) and runs the tests it records as passing on both real Caffe2 and rnn2jax (all, or
with `--caffe2-suite-per-file N` at most N of each file's, the same ones on every run, but every one of the files
named by `--caffe2-suite-whole`): each of them must pass.
The tests recorded as failing are deselected, and
the files recorded as not importing on rnn2jax are not collected; they are what the page lists by cause, and
`make test-caffe2-suite` runs them all. Files the results do not score yet are not collected either: the page says
how many of the suite's files it scores.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--caffe2-suite-results", metavar="JSON", help="the scoreboard's results (docs/caffe2-suite.json)")
    parser.addoption(
        "--caffe2-suite-per-file", type=int, default=0, metavar="N", help="run at most N recorded passing tests a file"
    )
    parser.addoption(
        "--caffe2-suite-whole",
        action="append",
        default=[],
        metavar="FILE",
        help="run every recorded passing test of FILE",
    )


def suite_key(rel: str, cls: str, name: str) -> str:
    """A test's key in the results: `file::Class::test[params]`, the file relative to the wheel's `caffe2/`."""
    return "::".join(p for p in (rel, cls, name) if p)


def capped(keys: set[str], per_file: int, whole: frozenset[str] = frozenset()) -> set[str]:
    """At most `per_file` of each file's keys (all when 0, and for the files in `whole`): the first by a hash of the
    key, so the choice is spread over a file's classes and tests, and is the same on every run."""
    if not per_file:
        return keys
    by_file: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        by_file[key.split("::", 1)[0]].append(key)
    rank = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    return {
        key for rel, group in by_file.items() for key in (group if rel in whole else sorted(group, key=rank)[:per_file])
    }


def recorded_passing(results: dict) -> set[str]:
    """The tests both real Caffe2 and rnn2jax passed in the recorded run."""
    keys = set()
    for sides in results["files"].values():
        real = sides["caffe2"]["tests"]
        for key, test in sides["rnn2jax"]["tests"].items():
            if test["outcome"] == "passed" and real.get(key, {}).get("outcome") == "passed":
                keys.add(key)
    return keys


_RESULTS = pytest.StashKey[dict]()


def _results(config: pytest.Config) -> dict | None:
    path = config.getoption("--caffe2-suite-results")
    if not path:
        return None
    if _RESULTS not in config.stash:
        config.stash[_RESULTS] = json.loads(Path(path).read_text())
    return config.stash[_RESULTS]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out the test files the results do not score, or record as not importing on rnn2jax."""
    results = _results(config)
    if results is None or not collection_path.name.endswith("_test.py"):
        return None
    rel = collection_path.relative_to(config.rootpath).as_posix()
    scored = results["files"].get(rel)
    return True if scored is None or scored["rnn2jax"].get("collection_error") else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    results = _results(config)
    if results is None:
        return
    root = Path(config.rootpath)

    def key_of(item: pytest.Item) -> str:
        return suite_key(item.path.relative_to(root).as_posix(), item.cls.__name__ if item.cls else "", item.name)

    collected = {item.path.relative_to(root).as_posix() for item in items}
    passing = capped(
        {key for key in recorded_passing(results) if key.split("::", 1)[0] in collected},
        config.getoption("--caffe2-suite-per-file"),
        frozenset(config.getoption("--caffe2-suite-whole")),
    )
    keep, drop = [], []
    for item in items:
        (keep if key_of(item) in passing else drop).append(item)
    missing = passing - {key_of(item) for item in keep}
    if missing:
        raise pytest.UsageError(f"{len(missing)} recorded passing tests were not collected: {sorted(missing)[:5]}")
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
