"""Host ops: ops that run in Python between jitted segments, with the workspace in hand.

Some Caffe2 ops cannot be a pure function of arrays: they print, read or write files and databases, or
hold host objects (DB cursors). The workspace runs each as a call `run(workspace, op, state)` between
the jitted segments of pure ops around it. `run` reads and writes blobs through the workspace
(`workspace.get(name, op)`, `workspace.put(name, value)`, `workspace.db_root`); `state` is a dict that
lives as long as the created net, as a Caffe2 operator's members do (Print's `every_n` counter).

Registering one is one line: `register_host_op("Save", save)`, or `@host_op("Save")` on the function.
A host op wins over a pure lowering of the same type. Host ops run only at the top level of a net: one
inside a step net (RecurrentNetwork, If, While) is unsupported there.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import BadArgumentError, Rnn2JaxError
from ..ir.netdef import Op

if TYPE_CHECKING:
    from .workspace import Workspace

HostRun = Callable[["Workspace", Op, dict[str, Any]], None]
HostCheck = Callable[[Op], None]


@dataclass(frozen=True)
class HostOpDef:
    """A host op: `run(workspace, op, state)`, and `check(op)`, which validates the op's arguments
    when its net is created (so a bad argument is reported before anything runs)."""

    type: str
    run: HostRun
    check: HostCheck | None = None


HOST_OPS: dict[str, HostOpDef] = {}


def register_host_op(op_type: str, run: HostRun, check: HostCheck | None = None) -> HostRun:
    """Register `run` as the host op for `op_type` (a second registration of a type is a bug)."""
    if op_type in HOST_OPS:
        raise RuntimeError(f"host op {op_type} registered twice")
    HOST_OPS[op_type] = HostOpDef(op_type, run, check)
    return run


def host_op(*types: str, check: HostCheck | None = None) -> Callable[[HostRun], HostRun]:
    """Decorator form of `register_host_op`, for one or more op types."""

    def decorate(run: HostRun) -> HostRun:
        for op_type in types:
            register_host_op(op_type, run, check)
        return run

    return decorate


# Modules that register host ops when imported, loaded on the first lookup (as ops/families.py is for
# pure ops): a module of host ops (the database ops in storage/) adds its name here.
HOST_OP_MODULES: tuple[str, ...] = ("rnn2jax.runtime.storage_ops",)
_loaded = False


def lookup_host_op(op_type: str) -> HostOpDef | None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in HOST_OP_MODULES:
            importlib.import_module(module)
    return HOST_OPS.get(op_type)


# --------------------------------------------------------------------------------------------------
# Print (caffe2/operators/print_op.h, TensorPrinter in caffe2/core/tensor.h)

_TYPE_NAMES = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "int32": "int",
    "int64": "long int",
    "int16": "short",
    "int8": "signed char",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "bool": "bool",
}
_DEFAULT_LIMIT = 1000  # TensorPrinter's k_limit_default


def _value_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool | np.bool_):
        return "1" if value else "0"
    if isinstance(value, float | np.floating):
        return format(float(value), "g")  # C++ ostream's default: 6 significant digits
    return str(value)


def format_tensor(name: str, value: Any, limit: int = 0) -> str:
    """Caffe2's `Tensor <name> of type <type>. Dims: (<d0>,<d1>,): <v0>,<v1>,...`, at most `limit`
    values (0: Caffe2's default of 1000)."""
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        return f"Blob {name} of type {type(value).__name__}"
    array = np.asarray(value)
    kind = "std::basic_string<char>" if array.dtype == object else _TYPE_NAMES.get(str(array.dtype), str(array.dtype))
    dims = "".join(f"{d}," for d in array.shape)
    values = array.ravel()[: limit or _DEFAULT_LIMIT].tolist()
    return f"Tensor {name} of type {kind}. Dims: ({dims}): " + ",".join(_value_text(v) for v in values)


def _check_print(op: Op) -> None:
    if len(op.inputs) != 1 or op.outputs:
        raise BadArgumentError(f"{op.where}: Print takes 1 input and no outputs")
    if op.int("every_n", 1) < 1:
        raise BadArgumentError(f"{op.where}: Print's every_n must be at least 1")
    if op.int("limit", 0) < 0:
        raise BadArgumentError(f"{op.where}: Print's limit must not be negative")
    op.bool("to_file", False)


@host_op("Print", check=_check_print)
def print_blob(workspace: Workspace, op: Op, state: dict[str, Any]) -> None:
    """Print the input blob to stdout (or append it to `<blob>.log` with `to_file`); with `every_n`,
    only the 1st, (n+1)th, ... run of the op prints, as in Caffe2."""
    count = state.get("count", 0)
    state["count"] = count + 1
    every_n = op.int("every_n", 1)
    if every_n > 1 and count % every_n:
        return
    name = op.inputs[0]
    text = format_tensor(name, workspace.get(name, op), op.int("limit", 0))
    if not op.bool("to_file", False):
        print(text, file=sys.stdout, flush=True)
        return
    path = Path(f"{name}.log")
    try:
        with path.open("a", encoding="utf-8") as stream:
            stream.write(text + "\n")
    except OSError as error:
        raise Rnn2JaxError(f"{op.where}: cannot write '{path}': {error.strerror or error}") from None
