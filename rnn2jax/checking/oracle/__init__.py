"""Real Caffe2 as a reference: a worker process in a Python 3.9 + torch 1.10.2 venv, and its client.

Caffe2 never enters rnn2jax's own process or dependencies: `rnn2jax compare`, `rnn2jax verify --caffe2`
and the test suite reach it through `Caffe2Oracle`, which runs `worker.py` under the Caffe2 interpreter.
"""

from .client import Caffe2Error, Caffe2Oracle, Catalog, OracleCrashedError, OracleError, OracleUnavailableError
from .environment import CAFFE2_PINS, create_environment, find_python39

__all__ = [
    "CAFFE2_PINS",
    "Caffe2Error",
    "Caffe2Oracle",
    "Catalog",
    "OracleCrashedError",
    "OracleError",
    "OracleUnavailableError",
    "create_environment",
    "find_python39",
]
