import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from rnn2jax.checking.oracle import Caffe2Oracle, find_python39
from rnn2jax.errors import Rnn2JaxError

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
# CI (.ci/run) draws the same examples on every run, so a commit that passed stays passing there;
# local runs keep exploring new ones.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True, database=None)
settings.load_profile(os.environ.get("RNN2JAX_HYPOTHESIS_PROFILE", "default"))


def pytest_ignore_collect(collection_path, config):
    """tests/caffe2_style holds Caffe2-style tests: they import `caffe2` (rnn2jax.caffe2.install) and Caffe2's
    hypothesis_test_util, which loads its own hypothesis profile, so they run in their own pytest process
    under rnn2jax.caffe2.pytest_plugin (`make test` does both)."""
    if collection_path.name == "caffe2_style" and not config.pluginmanager.has_plugin("rnn2jax.caffe2.pytest_plugin"):
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


@pytest.fixture(scope="session")
def caffe2():
    """Real Caffe2 (torch 1.10.2 in its own Python 3.9 venv), one long-lived worker per pytest worker,
    started on first use. Skips only where no Python 3.9 exists to build it from."""
    python = caffe2_python()
    if not python.exists():
        try:
            find_python39()
        except Rnn2JaxError as error:
            pytest.skip(f"real Caffe2 unavailable: {error}")
        pytest.fail(f"Python 3.9 is here but {python} is missing: `make test` creates it")
    oracle = Caffe2Oracle(python)
    oracle.catalog()  # fails loudly when the venv is broken
    yield oracle
    oracle.close()
