"""rnn2jax: Caffe2 nets, recurrent ones above all, compiled to JAX.

net = rnn2jax.load("predict_net.pb")
fn = rnn2jax.compile(net, init_net="init_net.pb")
out = fn(data=x)
"""

import importlib
import sys
import types

from .budget import memory_budget, set_memory_budget
from .errors import (
    BadArgumentError,
    InputTypeError,
    MissingBlobError,
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

# The API is imported on first use, so that `import rnn2jax.serving` (which runs an exported model with
# jax alone) does not pull in the protobuf importer and the op lowerings.
_API = {
    "CompiledNet": "compile",
    "compile": "compile",
    "load": "load",
    "lower": "lower",
    "Net": "netdef",
    "Op": "netdef",
    "Plan": "netdef",
    "load_params": "params",
    "load_model": "runtime.predictor",
    "VerificationReport": "verify",
    "verify": "verify",
    "Workspace": "runtime.workspace",
    "describe_blobs": "runtime.storage",
    "read_blobs": "runtime.storage",
    "write_blobs": "runtime.storage",
    "custom_op": "user_ops",
    "register_op": "user_ops",
}


class _Package(types.ModuleType):
    def __getattr__(self, name: str):
        if name not in _API:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        for attr, module in _API.items():  # all at once, as an eager `from .x import y` would
            self.__dict__[attr] = getattr(importlib.import_module(f".{module}", self.__name__), attr)
        return self.__dict__[name]

    def __setattr__(self, name: str, value) -> None:
        # Importing submodule rnn2jax.compile (or .load, .lower, .verify) must not hide the function.
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __dir__(self):
        return sorted({*super().__dir__(), *_API})


sys.modules[__name__].__class__ = _Package

__all__ = [
    "BadArgumentError",
    "CompiledNet",
    "InputTypeError",
    "MissingBlobError",
    "Net",
    "Op",
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
