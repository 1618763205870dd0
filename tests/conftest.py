import os
from pathlib import Path

import jax
import pytest
from hypothesis import HealthCheck, settings
from pinned_examples import ExploredExamples, PinnedExamples, pin, read_index, seed_of

from rnn2jax.checking.oracle import Caffe2Oracle, find_python39
from rnn2jax.errors import Rnn2JaxError

CAFFE2_PLUGIN = "rnn2jax.caffe2.pytest_plugin"


def _compile_at_llvm_o0(config: pytest.Config) -> None:
    """The test processes compile with XLA's LLVM backend at -O0, as C++ projects run their tests on debug
    builds: most of the suite's time is XLA compiling thousands of small, distinct programs, and -O0 takes
    about 40% less time on each. The HLO is the same; a float result may differ from -O2's in its last bit
    (where -O2 contracts a multiply and an add), far inside every tolerance. XLA reads XLA_FLAGS once, when
    JAX starts its backend here, and the variable is put back at once, so the programs the tests start as
    subprocesses (the README's and docs' commands, the examples, `rnn2jax exec`) compile as users' do.
    RNN2JAX_TEST_XLA_O2=1 keeps -O2 in the test processes too.

    Not in the Caffe2-style process (CAFFE2_PLUGIN): Caffe2's own test files run there, and some compare two
    nets at 1e-7 (rnn_cell_test's test_unroll_lstm), which the last bit decides. This conftest is loaded
    there only when a path under tests/ is collected too, so -O0 would give Caffe2's files other numbers
    beside tests/caffe2_style than alone: they compile as users' programs do, whatever runs with them."""
    if (
        os.environ.get("RNN2JAX_TEST_XLA_O2")
        or config.pluginmanager.has_plugin(CAFFE2_PLUGIN)
        or jax._src.xla_bridge.backends_are_initialized()
    ):
        return
    before = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = f"{before or ''} --xla_backend_optimization_level=0".strip()
    try:
        jax.devices()
    finally:
        if before is None:
            del os.environ["XLA_FLAGS"]
        else:
            os.environ["XLA_FLAGS"] = before


def pytest_configure(config: pytest.Config) -> None:
    _compile_at_llvm_o0(config)


# The tests and the programs they start compile without JAX's persistent cache (rnn2jax/compiler/cache.py),
# which the command line turns on by default: nothing is written into the user's cache, and every run
# compiles what it tests. The cache's own tests give it a directory of their own.
os.environ["RNN2JAX_CACHE_DIR"] = ""

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("RNN2JAX_EXAMPLES", "8")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Longer runs: `pytest --hypothesis-profile=thorough` (or RNN2JAX_EXAMPLES=N for the default profile).
settings.register_profile(
    "thorough",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# `make test` (and CI through it) draws the same examples on every run, so a commit that passed stays passing,
# after replaying the examples `make test-explore` pinned (tests/pinned_examples.py); `explore` draws fresh
# ones and pins what fails; default and thorough draw fresh ones and pin nothing.
PROFILE = os.environ.get("RNN2JAX_HYPOTHESIS_PROFILE", "default")
PINNED = PinnedExamples()
EXPLORED = ExploredExamples() if PROFILE == "explore" else None
PINS = read_index()  # nodeid -> its pinned key directories, as this session starts
settings.register_profile("ci", parent=settings.get_profile("default"), database=PINNED)
if EXPLORED is not None:
    settings.register_profile("explore", parent=settings.get_profile("default"), database=EXPLORED)
settings.load_profile(PROFILE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """In the `ci` profile each hypothesis test draws from the seed `derandomize` would give it (derandomize
    itself turns the database off, and with it the pinned examples)."""
    if PROFILE == "ci":
        seed = seed_of(item)
        if seed is not None:
            getattr(item.obj, "__func__", item.obj)._hypothesis_internal_use_seed = seed
    yield


@pytest.fixture(autouse=True)
def pinned_examples(request):
    """`ci`: the examples pinned for this test were replayed (else its source changed since they were
    pinned, and they would be skipped silently); `explore`: what failed is pinned."""
    yield
    nodeid = request.node.nodeid
    if EXPLORED is not None and EXPLORED.saved:
        pin(EXPLORED, nodeid)
    expected = PINS.get(nodeid, set())
    if PROFILE == "ci" and expected - PINNED.fetched:
        pytest.fail(
            f"{nodeid} has examples pinned in tests/regressions/hypothesis ({', '.join(sorted(expected))}) but "
            "did not replay them: the test changed since they were pinned. Pin them again: "
            f"make test-explore EXPLORE='{nodeid}', then drop the stale lines of pinned.txt"
        )


def pytest_terminal_summary(terminalreporter, config):
    if PROFILE == "explore":
        new = pinned_keys(read_index()) - pinned_keys(PINS)
        terminalreporter.write_line(
            f"make test-explore: {new} test key(s) newly pinned in tests/regressions/hypothesis (pinned.txt)"
            + ("; commit them with the fix, and make test replays them on every run" if new else "")
        )


def pinned_keys(index: dict[str, set[str]]) -> int:
    return sum(len(directories) for directories in index.values())


def pytest_ignore_collect(collection_path, config):
    """tests/caffe2_style holds Caffe2-style tests: they import `caffe2` (rnn2jax.caffe2.install) and Caffe2's
    hypothesis_test_util, which loads its own hypothesis profile, so they run in their own pytest process
    under rnn2jax.caffe2.pytest_plugin (`make test` does both)."""
    if collection_path.name == "caffe2_style" and not config.pluginmanager.has_plugin(CAFFE2_PLUGIN):
        return True
    return None


@pytest.fixture(params=[True, False], ids=["jit", "eager"])
def jit(request):
    """Every op test runs both under jax.jit and eagerly."""
    return request.param


ROOT = Path(__file__).resolve().parents[1]


def caffe2_python() -> Path:
    """The interpreter of the real-Caffe2 venv: $RNN2JAX_CAFFE2_PYTHON, or .venv-caffe2 (made by make test)."""
    return Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python"))


def real_caffe2_python() -> Path:
    """`caffe2_python()` for a test that needs it: skips only where no Python 3.9 exists to build the venv
    from, and fails where one does but the venv is missing."""
    python = caffe2_python()
    if not python.exists():
        try:
            find_python39()
        except Rnn2JaxError as error:
            pytest.skip(f"real Caffe2 unavailable: {error}")
        pytest.fail(f"Python 3.9 is here but {python} is missing: `make test` creates it")
    return python


@pytest.fixture(scope="session")
def caffe2():
    """Real Caffe2 (torch 1.10.2 in its own Python 3.9 venv), one long-lived worker per pytest worker,
    started on first use. Skips only where no Python 3.9 exists to build it from."""
    oracle = Caffe2Oracle(real_caffe2_python())
    oracle.catalog()  # fails loudly when the venv is broken
    yield oracle
    oracle.close()
