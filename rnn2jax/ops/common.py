"""Helpers shared by op families: Caffe2's shape arithmetic and dtype handling."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..netdef import DATA_TYPES, Op
from ..proto import caffe2_pb2 as pb


def size_to_dim(shape: Sequence[int], k: int) -> int:
    """Product of dims [0, k): Caffe2's `size_to_dim`."""
    return math.prod(shape[:k])


def size_from_dim(shape: Sequence[int], k: int) -> int:
    """Product of dims [k, ndim): Caffe2's `size_from_dim`."""
    return math.prod(shape[k:])


def canonical_axis(op: Op, axis: int, ndim: int, what: str = "axis") -> int:
    """Caffe2's `canonical_axis_index_`: a negative axis counts from the end; out of range is an error."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op.where}: {what} {axis} is out of range for an input of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def canonical_dtype(dtype: np.dtype | type) -> np.dtype:
    """The dtype JAX will actually use (int64 -> int32 and float64 -> float32 unless x64 is on)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))


_DATA_TYPE_NAMES = {
    "float": pb.TensorProto.FLOAT,
    "float32": pb.TensorProto.FLOAT,
    "int": pb.TensorProto.INT32,
    "int32": pb.TensorProto.INT32,
    "byte": pb.TensorProto.BYTE,
    "bool": pb.TensorProto.BOOL,
    "uint8": pb.TensorProto.UINT8,
    "int8": pb.TensorProto.INT8,
    "uint16": pb.TensorProto.UINT16,
    "int16": pb.TensorProto.INT16,
    "int64": pb.TensorProto.INT64,
    "long": pb.TensorProto.INT64,
    "float16": pb.TensorProto.FLOAT16,
    "half": pb.TensorProto.FLOAT16,
    "double": pb.TensorProto.DOUBLE,
    "float64": pb.TensorProto.DOUBLE,
}


def data_type_arg(op: Op, name: str, default: int | None = None) -> np.dtype | None:
    """A `TensorProto.DataType` argument (an int, or a name such as "float") as a NumPy dtype."""
    if not op.has(name):
        return None if default is None else DATA_TYPES[default]
    arg = op.args[name]
    if arg.kind == "s":
        code = _DATA_TYPE_NAMES.get(str(arg.value).lower())
        if code is None:
            raise BadArgumentError(f"{op.where}: argument '{name}' names unknown data type {arg.value!r}")
    else:
        code = op.int(name)
    if code not in DATA_TYPES:
        raise BadArgumentError(
            f"{op.where}: argument '{name}' = {code} is not a numeric TensorProto.DataType"
        )
    return DATA_TYPES[code]


def shape_arg(op: Op, name: str = "shape") -> tuple[int, ...]:
    dims = op.ints(name)
    if any(d < 0 for d in dims):
        raise BadArgumentError(f"{op.where}: argument '{name}' has negative dims {list(dims)}")
    return tuple(dims)


# Why a value that decides a shape can still be traced: `rnn2jax.compile` makes such net inputs static
# (registry `static_inputs`), so only these cases remain.
TRACED_SHAPE_HINT = (
    "rnn2jax.compile makes net inputs that decide shapes static by itself; these values are traced because "
    "they are computed per step inside a step net, or because `apply` runs under your own jax.jit/grad "
    "with them as traced arguments (pass them as NumPy arrays)"
)


def matmul_precision() -> jax.lax.Precision | None:
    """Caffe2 multiplies in float32, so HIGHEST (no bf16/TF32 passes on accelerators; CPU ignores it),
    unless the user chose a precision with `jax_default_matmul_precision`: then None, which honours it.
    Read when a kernel is traced, so a `jax.default_matmul_precision(...)` context applies too."""
    return None if jax.config.jax_default_matmul_precision is not None else jax.lax.Precision.HIGHEST
