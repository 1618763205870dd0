import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("RNN2JAX_EXAMPLES", "8")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("default")


@pytest.fixture(params=[True, False], ids=["jit", "eager"])
def jit(request):
    """Every op test runs both under jax.jit and eagerly."""
    return request.param
