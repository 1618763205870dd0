"""Print, Caffe2's host op that writes a blob in the format of Caffe2's TensorPrinter (to stdout or a
`<blob>.log` file): it runs on the host between the jitted segments around it (`register_host_op`). Inside a
nested net (a loop's body, a branch: traced with the op that carries it, where no host op can run) its
lowering prints the same text from the compiled code, through an ordered `jax.debug.callback`.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..errors import BadArgumentError, Rnn2JaxError
from ..ir.netdef import Op
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, Absent
from .registry import HostWorkspace, Kernel, declare_family, host_op, register

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=Absent("Caffe2 says SHOULD_NOT_DO_GRADIENT; the builder has no maker for it"),
    emitter=HOST_OP_NO_EMITTER,
)


# caffe2/operators/print_op.h; the format is TensorPrinter's (caffe2/core/tensor.h)
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


def _print(op: Op, state: dict[str, Any], value: Any) -> None:
    """Print `value`, the input blob, to stdout (or append it to `<blob>.log` with `to_file`); with
    `every_n`, only the 1st, (n+1)th, ... run of the op prints, as in Caffe2."""
    count = state.get("count", 0)
    state["count"] = count + 1
    every_n = op.int("every_n", 1)
    if every_n > 1 and count % every_n:
        return
    name = op.inputs[0]
    text = format_tensor(name, value, op.int("limit", 0))
    if not op.bool("to_file", False):
        print(text, file=sys.stdout, flush=True)
        return
    path = Path(f"{name}.log")
    try:
        with path.open("a", encoding="utf-8") as stream:
            stream.write(text + "\n")
    except OSError as error:
        raise Rnn2JaxError(f"{op.where}: cannot write '{path}': {error.strerror or error}") from None


@host_op("Print", check=_check_print)
def print_blob(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """At the top level of a net: print the blob from the workspace (`state` lives as long as the net)."""
    _print(op, state, workspace.get(op.inputs[0], op))


@register("Print", outputs=0)
def print_traced(op: Op) -> Kernel:
    """In a nested net: the same text, printed by a callback when the compiled code runs (ordered, so a
    loop's iterations print in turn); `every_n` counts the runs of this lowered op."""
    _check_print(op)
    state: dict[str, Any] = {}

    def kernel(x):
        jax.debug.callback(functools.partial(_print, op, state), x, ordered=True)
        return ()

    return kernel
