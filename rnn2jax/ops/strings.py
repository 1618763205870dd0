"""The string ops (caffe2/operators/string_ops.cc): prefixes, suffixes, tests and joins of string tensors.

JAX has no strings: a workspace holds a string tensor as a NumPy object array of `bytes`, as Caffe2 holds
`std::string`s. These ops are host ops: they run in Python between the jitted segments around them, on
those arrays. Inside jitted code (a compiled net, a step net) they are refused (registry `lookup`). Strings
are bytes, as Caffe2's are: a prefix counts bytes, not characters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import BadArgumentError, InputTypeError
from ..ir.netdef import Op
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES
from .gradient_makers import should_not_do_gradient
from .registry import HostWorkspace, declare_family, host_op

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=should_not_do_gradient,  # SHOULD_NOT_DO_GRADIENT for each of them
    emitter=HOST_OP_NO_EMITTER,
)


def _arity(op: Op) -> None:
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        raise BadArgumentError(
            f"{op.where}: {op.type} takes 1 input and 1 output, got {len(op.inputs)} and {len(op.outputs)}"
        )


def _text(op: Op, name: str) -> bytes:
    value = op.args[name].value if op.has(name) else b""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _strings(workspace: HostWorkspace, op: Op) -> np.ndarray:
    """Input 0 as an object array of bytes; Caffe2 refuses any other tensor type."""
    value = workspace.get(op.inputs[0], op)
    if not isinstance(value, np.ndarray) or value.dtype != object:
        kind = getattr(value, "dtype", type(value).__name__)
        raise InputTypeError(f"{op.where}: input '{op.inputs[0]}' must be a tensor of strings, got {kind}")
    return value


def _map(fn: Callable[[bytes], Any], strings: np.ndarray, dtype: Any) -> np.ndarray:
    out = np.empty(strings.shape, dtype=dtype)
    for index, item in np.ndenumerate(strings):
        out[index] = fn(item)
    return out


def _length(op: Op) -> int:
    length = op.int("length", 3)
    if length < 0:
        raise BadArgumentError(f"{op.where}: argument 'length' must not be negative, got {length}")
    return length


def _check_length(op: Op) -> None:
    _arity(op)
    _length(op)


def _check_text(name: str) -> Callable[[Op], None]:
    def check(op: Op) -> None:
        _arity(op)
        _text(op, name)

    return check


@host_op("StringPrefix", check=_check_length)
def string_prefix(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The first `length` (3) bytes of each string; shorter strings unchanged."""
    length = _length(op)
    workspace.feed(op.outputs[0], _map(lambda s: s[:length], _strings(workspace, op), object))


@host_op("StringSuffix", check=_check_length)
def string_suffix(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The last `length` (3) bytes of each string; shorter strings unchanged."""
    length = _length(op)
    workspace.feed(op.outputs[0], _map(lambda s: s[len(s) - min(length, len(s)) :], _strings(workspace, op), object))


@host_op("StringStartsWith", check=_check_text("prefix"))
def string_starts_with(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Whether each string starts with `prefix` ("")."""
    prefix = _text(op, "prefix")
    workspace.feed(op.outputs[0], _map(lambda s: s.startswith(prefix), _strings(workspace, op), np.bool_))


@host_op("StringEndsWith", check=_check_text("suffix"))
def string_ends_with(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Whether each string ends with `suffix` ("")."""
    suffix = _text(op, "suffix")
    workspace.feed(op.outputs[0], _map(lambda s: s.endswith(suffix), _strings(workspace, op), np.bool_))


@host_op("StringEquals", check=_check_text("text"))
def string_equals(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Whether each string equals `text` ("")."""
    text = _text(op, "text")
    workspace.feed(op.outputs[0], _map(lambda s: s == text, _strings(workspace, op), np.bool_))


# The element types StringJoin prints, as C++ `ostream <<` writes them (6 significant digits for floats)
def _float_text(v: Any) -> bytes:
    return format(float(v), "g").encode()


_JOIN_TEXT: dict[str, Callable[[Any], bytes]] = {
    "float32": _float_text,
    "float64": _float_text,
    "int16": lambda v: str(int(v)).encode(),
    "int32": lambda v: str(int(v)).encode(),
    "int64": lambda v: str(int(v)).encode(),
    "bool": lambda v: b"1" if v else b"0",
    "object": bytes,
}


def _check_join(op: Op) -> None:
    _arity(op)
    if op.int("axis", 0) not in (0, 1):
        raise BadArgumentError(f"{op.where}: StringJoin's axis must be 0 or 1, got {op.int('axis', 0)}")
    _text(op, "delimiter")


@host_op("StringJoin", check=_check_join)
def string_join(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Each row (axis 0) or column (axis 1) of a 1-D or 2-D tensor printed and joined, each element followed
    by `delimiter` (","): Caffe2 writes the delimiter after the last element too."""
    name = op.inputs[0]
    value = workspace.get(name, op)
    array = value if isinstance(value, np.ndarray) and value.dtype == object else np.asarray(value)
    text = _JOIN_TEXT.get(str(array.dtype))
    if text is None:
        raise InputTypeError(f"{op.where}: StringJoin does not support input '{name}' of type {array.dtype}")
    if array.size == 0:
        raise BadArgumentError(f"{op.where}: StringJoin's input '{name}' is empty")
    if array.ndim not in (1, 2):
        raise BadArgumentError(f"{op.where}: StringJoin supports 1-D and 2-D tensors only, '{name}' is {array.ndim}-D")
    rows = array.reshape(array.shape[0], -1)
    if op.int("axis", 0) == 1:
        if array.ndim == 1:
            raise BadArgumentError(f"{op.where}: StringJoin with axis 1 needs a 2-D input, '{name}' is 1-D")
        rows = rows.T
    delimiter = _text(op, "delimiter") if op.has("delimiter") else b","
    out = np.empty(rows.shape[0], dtype=object)
    for i, row in enumerate(rows):
        out[i] = b"".join(text(v) + delimiter for v in row)
    workspace.feed(op.outputs[0], out)


# --------------------------------------------------------------------------------------------------
# Lowered ops that move the elements of a string tensor (PackSegments, Copy, SparseToDenseMask)


def moves_strings(
    build: Callable[[Op], Callable[..., Any]], outputs: tuple[int, ...] | None = None, together: tuple[int, ...] = ()
) -> Callable[..., None]:
    """The host op of a lowered type on string inputs, for an op that only moves its input elements: its own
    kernel (`build(op)`) runs on the element numbers standing for each string input (1, 2, ..., int64, distinct
    across inputs), and each output in `outputs` (None: every output) takes the strings its numbers name; 0, the
    kernel's zero fill (PackSegments' padding), is b"", as Caffe2's default `std::string`. Other outputs (masks)
    are as computed.
    The inputs at positions `together` (none: every input) hold strings all or none, as Caffe2 wants one type."""

    def together_of(op: Op) -> set[int]:
        count = len(op.inputs)
        return {i % count for i in together if -count <= i < count} if together else set(range(count))

    def run(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
        values = [workspace.get(name, op) for name in op.inputs]
        kinds = {isinstance(v, np.ndarray) and v.dtype == object for i, v in enumerate(values) if i in together_of(op)}
        if len(kinds) > 1:
            names = ", ".join(f"'{op.inputs[i]}'" for i in sorted(together_of(op)))
            raise InputTypeError(f"{op.where}: inputs {names} must all hold strings, or none (one type)")
        table: list[Any] = [b""]
        for i, value in enumerate(values):
            if isinstance(value, np.ndarray) and value.dtype == object:
                start = len(table)
                table.extend(value.reshape(-1))
                values[i] = np.arange(start, start + value.size, dtype=np.int64).reshape(value.shape)
        result = build(op)(*values)
        results = result if isinstance(result, tuple) else (result,)
        strings = np.empty(len(table), dtype=object)
        strings[:] = table
        for i, (name, out) in enumerate(zip(op.outputs, results, strict=False)):
            out = np.asarray(out)
            if outputs is None or i in outputs:
                moved = np.empty(out.shape, dtype=object)
                moved[...] = strings[out]  # (indexing with a 0-d array gives the element, not an array)
                out = moved
            workspace.feed(name, out)

    return run
