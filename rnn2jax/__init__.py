"""rnn2jax: Caffe2 nets, recurrent ones above all, compiled to JAX.

net = rnn2jax.load("predict_net.pb")
fn = rnn2jax.compile(net, init_net="init_net.pb")
out = fn(data=x)
"""

import importlib

from .errors import (
    BadArgumentError,
    DistributedError,
    InputTypeError,
    MissingBlobError,
    OpFailedError,
    ParseError,
    PlanError,
    RegistrationError,
    ResourceError,
    Rnn2JaxError,
    ShapeError,
    StorageError,
    UnsupportedOpError,
    UnwrittenStateError,
    WorkspaceError,
)
from .ir.budget import memory_budget, set_memory_budget

# The API is imported on first use, so that `import rnn2jax.serving` (which runs an exported model with
# jax alone) does not pull in the protobuf importer and the op lowerings.
_API = {
    "CompiledNet": "compiler.compiled_net",
    "compile": "compiler.compiled_net",
    "load": "ir.loader",
    "lower": "lowering.interpreter",
    "Net": "ir.netdef",
    "Op": "ir.netdef",
    "Plan": "ir.netdef",
    "load_params": "runtime.params",
    "load_model": "serving.predictor",
    "VerificationReport": "checking.verification",
    "verify": "checking.verification",
    "Workspace": "runtime.workspace",
    "describe_blobs": "storage",
    "read_blobs": "storage",
    "write_blobs": "storage",
    "custom_op": "lowering.user_ops",
    "register_op": "lowering.user_ops",
}


def __getattr__(name: str):
    """The API names, imported on first use (PEP 562); all at once, as an eager `from .x import y` would."""
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for attr, module in _API.items():
        globals()[attr] = getattr(importlib.import_module(f".{module}", __name__), attr)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})

__all__ = [
    "BadArgumentError",
    "CompiledNet",
    "DistributedError",
    "InputTypeError",
    "MissingBlobError",
    "Net",
    "Op",
    "OpFailedError",
    "ParseError",
    "Plan",
    "PlanError",
    "RegistrationError",
    "ResourceError",
    "Rnn2JaxError",
    "ShapeError",
    "StorageError",
    "UnsupportedOpError",
    "UnwrittenStateError",
    "VerificationReport",
    "Workspace",
    "WorkspaceError",
    "compile",
    "custom_op",
    "describe_blobs",
    "load",
    "load_model",
    "load_params",
    "lower",
    "memory_budget",
    "read_blobs",
    "register_op",
    "set_memory_budget",
    "verify",
    "write_blobs",
]

__version__ = "0.1.0"
