"""rnn2jax: Caffe2 nets, recurrent ones above all, compiled to JAX.

net = rnn2jax.load("predict_net.pb")
fn = rnn2jax.compile(net, init_net="init_net.pb")
out = fn(data=x)
"""

from .compile import CompiledNet, compile
from .errors import (
    BadArgumentError,
    MissingBlobError,
    ParseError,
    Rnn2JaxError,
    ShapeError,
    UnsupportedOpError,
)
from .load import load
from .lower import lower
from .netdef import Net, Op, Plan
from .verify import VerificationReport, verify

__all__ = [
    "BadArgumentError",
    "CompiledNet",
    "MissingBlobError",
    "Net",
    "Op",
    "ParseError",
    "Plan",
    "Rnn2JaxError",
    "ShapeError",
    "UnsupportedOpError",
    "VerificationReport",
    "compile",
    "load",
    "lower",
    "verify",
]

__version__ = "0.1.0"
