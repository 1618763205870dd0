"""Helpers shared by op families: Caffe2's shape arithmetic and dtype handling."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import DATA_TYPES, Op
from ..proto import caffe2_pb2 as pb


def size_to_dim(shape: Sequence[int], k: int) -> int:
    """Product of dims [0, k): Caffe2's `size_to_dim`."""
    return math.prod(shape[:k])


def size_from_dim(shape: Sequence[int], k: int) -> int:
    """Product of dims [k, ndim): Caffe2's `size_from_dim`."""
    return math.prod(shape[k:])


def is_symbolic(shape: Sequence[object]) -> bool:
    """Whether a shape has a jax.export symbolic dim (shape polymorphism), whose size is known only per call."""
    return not all(isinstance(d, int | np.integer) for d in shape)


def broadcast_shapes(*shapes: Sequence[object]) -> tuple:
    """NumPy's broadcast of `shapes`, also for symbolic dims (a symbol broadcasts against 1 and itself).
    ValueError when they do not broadcast, or, with symbolic dims, when that depends on their sizes."""
    if any(is_symbolic(s) for s in shapes):
        return tuple(jnp.broadcast_shapes(*(tuple(s) for s in shapes)))
    return tuple(np.broadcast_shapes(*shapes))


class Dims:
    """A 1-D integer blob whose values are dims, some of them symbolic (jax.export shape polymorphism): what
    Shape writes for an input of symbolic shape. Kept as dims, not as a traced array, so the ops that read
    shape values (Slice on it, then a fill's `input_as_shape`) still know them; any other op, and the net's
    outputs, get `array()` (lower.py)."""

    __slots__ = ("dtype", "values")

    def __init__(self, values: Sequence[object], dtype: np.dtype | type):
        self.values, self.dtype = tuple(values), np.dtype(dtype)

    @property
    def shape(self) -> tuple[int]:
        return (len(self.values),)

    @property
    def ndim(self) -> int:
        return 1

    def array(self) -> jax.Array:
        """The dims as a traced array (a symbolic dim is only known inside the exported function)."""
        return jnp.asarray(jnp.stack([jnp.asarray(v) for v in self.values]), dtype=self.dtype)

    @staticmethod
    def of(values: Sequence[object], dtype: np.dtype | type) -> Dims | np.ndarray:
        """`values` as a constant array when every one is a size, else as `Dims`."""
        return Dims(values, dtype) if is_symbolic(values) else np.asarray(values, dtype=np.dtype(dtype))


def as_array(value: object) -> object:
    """`value`, a `Dims` made an array."""
    return value.array() if isinstance(value, Dims) else value


def canonical_axis(op: Op, axis: int, ndim: int, what: str = "axis") -> int:
    """Caffe2's `canonical_axis_index_`: a negative axis counts from the end; out of range is an error."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op.where}: {what} {axis} is out of range for an input of rank {ndim}")
    return axis + ndim if axis < 0 else axis


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
        raise BadArgumentError(f"{op.where}: argument '{name}' = {code} is not a numeric TensorProto.DataType")
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


def rounded(product: jax.Array) -> jax.Array:
    """`product` as its own float rounding, so that XLA's CPU backend does not fuse it with the sum it feeds
    into one multiply-add (rounded once), where Caffe2's C++ rounds the product and then the sum.
    `lax.optimization_barrier` does not stop that (XLA removes it before LLVM contracts the two); a select
    on the product's own value (the identity: NaN stays NaN) does."""
    return jnp.where(jnp.isnan(product), jnp.float32(jnp.nan).astype(product.dtype), product)
