"""Failing hypothesis examples found once stay tested: `make test-explore` pins them, `make test` replays them.

`make test` draws the same examples on every run (the `ci` profile: each test's seed is the one hypothesis'
`derandomize` would use, a hash of the test) and first replays the examples pinned for it in
tests/regressions/hypothesis/ (hypothesis' directory database format, read only). `make test-explore`
draws fresh examples (the `explore` profile) into a local database, .hypothesis/explore/, and after each
test copies the minimal failing example hypothesis kept for it into the pinned database, with a line in
tests/regressions/hypothesis/pinned.txt naming the test. A pinned example is replayed by the test's
database key, a digest of its source: a test edited since its example was pinned fails, saying to pin it
again (`make test-explore` on that test), so no pin is lost silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.internal.reflection import function_digest

ROOT = Path(__file__).resolve().parents[1]
# (the variables move both, for the test of this module)
PINNED = Path(os.environ.get("RNN2JAX_PINNED_EXAMPLES", ROOT / "tests" / "regressions" / "hypothesis"))
INDEX = PINNED / "pinned.txt"
EXPLORED = Path(os.environ.get("RNN2JAX_EXPLORED_EXAMPLES", ROOT / ".hypothesis" / "explore"))
DIGEST_BYTES = 48  # a test's database key is a sha384 digest; ".secondary" and ".pareto" keys are longer


def key_directory(key: bytes) -> str:
    """The directory hypothesis' DirectoryBasedExampleDatabase keeps `key`'s examples in."""
    from hypothesis.database import _hash

    return _hash(key)


def read_index() -> dict[str, set[str]]:
    """nodeid -> the key directories pinned for it."""
    pinned: dict[str, set[str]] = {}
    if INDEX.exists():
        for line in INDEX.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                directory, nodeid = line.split(" ", 1)
                pinned.setdefault(nodeid, set()).add(directory)
    return pinned


class PinnedExamples(ExampleDatabase):
    """The pinned examples, read only; it remembers which keys were asked for, so a stale pin shows."""

    def __init__(self) -> None:
        super().__init__()
        self._directory = DirectoryBasedExampleDatabase(PINNED)
        self.fetched: set[str] = set()

    def fetch(self, key: bytes) -> Iterable[bytes]:
        self.fetched.add(key_directory(key))
        return self._directory.fetch(key)

    def save(self, key: bytes, value: bytes) -> None:
        pass

    def delete(self, key: bytes, value: bytes) -> None:
        pass

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        pass


class ExploredExamples(DirectoryBasedExampleDatabase):
    """Hypothesis' own database in .hypothesis/explore/, remembering which tests' keys it saved under."""

    def __init__(self) -> None:
        super().__init__(EXPLORED)
        self.saved: set[bytes] = set()

    def save(self, key: bytes, value: bytes) -> None:
        if len(key) == DIGEST_BYTES:
            self.saved.add(key)
        super().save(key, value)


def pin(explored: ExploredExamples, nodeid: str) -> int:
    """Copy the failing examples hypothesis keeps for the keys saved during test `nodeid` into the pinned
    database (never deleting one), and name the test in the index. Returns how many were new."""
    pinned = DirectoryBasedExampleDatabase(PINNED)
    new = 0
    index = read_index()
    for key in sorted(explored.saved):
        for value in explored.fetch(key):
            if value not in set(pinned.fetch(key)):
                pinned.save(key, value)
                new += 1
        directory = key_directory(key)
        if directory not in index.get(nodeid, set()):
            PINNED.mkdir(parents=True, exist_ok=True)
            with INDEX.open("a") as lines:
                lines.write(f"{directory} {nodeid}\n")
            index.setdefault(nodeid, set()).add(directory)
    explored.saved.clear()
    return new


def seed_of(item) -> int | None:
    """The seed hypothesis' `derandomize` would draw `item`'s examples from (a hash of the test, with the
    parametrization's node id for parametrized tests, as hypothesis' pytest plugin keys them)."""
    function = getattr(item.obj, "__func__", item.obj)
    wrapper = getattr(function, "hypothesis", None)
    if wrapper is None:
        return None
    inner = wrapper.inner_test
    had = getattr(inner, "_hypothesis_internal_add_digest", None)
    if hasattr(item, "callspec"):
        inner._hypothesis_internal_add_digest = item.nodeid.encode()
    try:
        return int.from_bytes(function_digest(inner), "big")
    finally:
        if had is None:
            inner.__dict__.pop("_hypothesis_internal_add_digest", None)
        else:
            inner._hypothesis_internal_add_digest = had
