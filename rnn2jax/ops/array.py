"""Array ops: tiling and broadcasting, top-k selection, ranges, layout switches and small shape or control
ops (Size, Conditional, Find, HasElements...), with the gradient ops their makers emit.

Ops whose output shape depends on an input's values (Tile's `tiles` input, Expand's shape, Range's
bounds, NumpyTile's repeats, TopK's `k` input, FlexibleTopK's per-row k) declare those inputs static: the
kernels read them with NumPy. Everything else is static-shape `jax.numpy` code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from ..proto import caffe2_pb2 as pb
from .common import canonical_axis, size_from_dim, size_to_dim
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .fill import _convert, _filler
from .gradient_makers import (
    GradientContext,
    GradientOps,
    gradient_op,
    no_gradient,
    should_not_do_gradient,
    single_gradient,
)
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_F32 = frozenset({np.dtype(np.float32)})
_NUMERIC = frozenset(np.dtype(t) for t in (np.int32, np.int64, np.float32, np.float64))
_INDEX = frozenset(np.dtype(t) for t in (np.int32, np.int64))

# --------------------------------------------------------------------------------------------------
# Helpers


def _check_dtype(op: Op, index: int, x: Any, allowed: frozenset[np.dtype], kind: str) -> None:
    """Caffe2's typed dispatch (`DispatchHelper<TensorTypes<...>>`, `data<T>()`) refuses other dtypes."""
    if np.dtype(x.dtype) not in {np.dtype(d) for d in allowed}:
        raise ShapeError(f"{op.where}: input '{op.inputs[index]}' has dtype {x.dtype}; {op.type} needs {kind}")


def _is_int64(x: Any) -> bool:
    """Whether `x` holds what Caffe2 reads as int64."""
    return np.dtype(x.dtype) == np.dtype(np.int64)


def _check_int64(op: Op, index: int, x: Any) -> None:
    if not _is_int64(x):
        raise ShapeError(f"{op.where}: input '{op.inputs[index]}' must be an int64 tensor, got {x.dtype}")


def _static(op: Op, index: int, x: Any) -> np.ndarray:
    """A static input's values (the compiler hands them over concrete; a traced one cannot decide a shape)."""
    if isinstance(x, jax.core.Tracer):
        raise ShapeError(
            f"{op.where}: input '{op.inputs[index]}' decides the output shape, so its values must be known "
            "when the net is traced; feed it as a constant"
        )
    return np.asarray(x)


def _one_value(op: Op, index: int, x: Any) -> int:
    """Tile's `tiles`/`axis` inputs: a 1-D tensor of one int32 or int64 value (tile_op.h)."""
    values = _static(op, index, x)
    if values.ndim != 1 or values.size != 1:
        raise ShapeError(f"{op.where}: input '{op.inputs[index]}' must be a vector of size 1, got {list(values.shape)}")
    _check_dtype(op, index, values, _INDEX, "int32 or int64")
    return int(np.int64(values[0]).astype(np.int32))  # Caffe2 keeps an int32


def _move_to_last(x: Any, axis: int) -> Any:
    return jnp.moveaxis(x, axis, -1)


# --------------------------------------------------------------------------------------------------
# Tile, NumpyTile, Expand


def _tile_params(op: Op) -> tuple[int, int]:
    """The `tiles` and `axis` arguments; inputs 1 and 2 (when given) override them at run time."""
    if len(op.inputs) == 1 and not op.has("tiles"):
        raise BadArgumentError(f"{op.where}: argument 'tiles' is missing and was not given as input")
    if len(op.inputs) < 3 and not op.has("axis"):
        raise BadArgumentError(f"{op.where}: argument 'axis' is missing and was not given as input")
    return op.int("tiles", 1), op.int("axis", 0)


def _tile_inputs(op: Op, tiles: int, axis: int, extra: Sequence[Any], forward: bool) -> tuple[int, int]:
    if extra:
        tiles = _one_value(op, 1, extra[0])
        if forward and _is_int64(extra[0]):
            axis = 0  # Caffe2's TileOp resets axis to 0 when `tiles` is int64 (tile_op.h), argument or not
    if len(extra) > 1:
        axis = _one_value(op, 2, extra[1])
    return tiles, axis


@register("Tile", inputs=(1, 3), static_inputs=(1, 2))
def tile(op: Op) -> Kernel:
    """(X[, tiles[, axis]]) -> X repeated `tiles` times along `axis` (whole blocks, as np.tile)."""
    tiles_arg, axis_arg = _tile_params(op)

    def kernel(x, *extra):
        _check_dtype(op, 0, x, _NUMERIC, "int32, int64, float or double")
        tiles, axis = _tile_inputs(op, tiles_arg, axis_arg, extra, forward=True)
        ax = canonical_axis(op, axis, x.ndim)
        if tiles < 0:
            raise BadArgumentError(f"{op.where}: tiles = {tiles} must be >= 0")
        reps = [1] * x.ndim
        reps[ax] = tiles
        return jnp.tile(x, reps)

    return kernel


@facet("gradient", "Tile")
def _tile_gradient_maker(g: GradientContext) -> GradientOps:
    """tiles and axis inputs (when given) go along."""
    return [gradient_op("TileGradient", [g.GO(0), *g.op.input[1:3]], [g.GI(0)])]


@register("TileGradient", inputs=(1, 3), static_inputs=(1, 2))
def tile_gradient(op: Op) -> Kernel:
    """(dY[, tiles[, axis]]) -> dX: the `tiles` blocks along `axis` summed."""
    tiles_arg, axis_arg = _tile_params(op)

    def kernel(grad, *extra):
        _check_dtype(op, 0, grad, _NUMERIC, "int32, int64, float or double")
        tiles, axis = _tile_inputs(op, tiles_arg, axis_arg, extra, forward=False)
        ax = canonical_axis(op, axis, grad.ndim)
        if tiles <= 0:  # Caffe2 divides by it (tiles = 0 kills the process)
            raise BadArgumentError(f"{op.where}: tiles = {tiles} must be > 0")
        dim = grad.shape[ax]
        if dim % tiles:
            raise ShapeError(f"{op.where}: dim {ax} of dY {list(grad.shape)} is not a multiple of tiles = {tiles}")
        shape = (*grad.shape[:ax], tiles, dim // tiles, *grad.shape[ax + 1 :])
        return jnp.sum(jnp.reshape(grad, shape), axis=ax, dtype=grad.dtype)

    return kernel


@register("NumpyTile", inputs=2, static_inputs=(1,), gradient=NO_GRADIENT)
def numpy_tile(op: Op) -> Kernel:
    """(X, repeats) -> np.tile(X, repeats); repeats is int64 with one entry per dim of X."""

    def kernel(x, repeats):
        _check_dtype(op, 0, x, _NUMERIC, "int32, int64, float or double")
        _check_int64(op, 1, repeats)
        values = _static(op, 1, repeats).reshape(-1)
        if values.size != x.ndim:
            raise ShapeError(
                f"{op.where}: repeats '{op.inputs[1]}' has {values.size} entries for an input of rank {x.ndim}"
            )
        if (values < 0).any():
            raise ShapeError(f"{op.where}: repeats {values.tolist()} must be >= 0")
        return jnp.tile(x, tuple(int(v) for v in values))

    return kernel


@register("Expand", inputs=2, static_inputs=(1,), gradient=single_gradient("ExpandGradient", "GO(0) I(0)"))
def expand(op: Op) -> Kernel:
    """(X, shape) -> X broadcast to `shape` (int64; numpy rules from the right; dims <= 0 count as 1)."""

    def kernel(x, shape):
        _check_dtype(op, 0, x, _NUMERIC, "int32, int64, float or double")
        _check_int64(op, 1, shape)
        dims = [int(d) for d in _static(op, 1, shape).reshape(-1)]
        rank = max(len(dims), x.ndim)
        x_dims = [1] * (rank - x.ndim) + list(x.shape)
        y_dims = [1] * (rank - len(dims)) + [d if d > 0 else 1 for d in dims]
        out = []
        for a, b in zip(x_dims, y_dims, strict=True):
            if not (a == 1 or b == 1 or a == b):
                raise ShapeError(f"{op.where}: X {list(x.shape)} cannot be expanded to shape {dims}")
            if a == 0:  # Caffe2 makes a dim of 1 out of nothing (reads past the empty input)
                raise ShapeError(f"{op.where}: X {list(x.shape)} is empty and cannot be expanded to shape {dims}")
            out.append(max(a, b))
        return jnp.broadcast_to(x, tuple(out))

    return kernel


@register("ExpandGradient", inputs=2)
def expand_gradient(op: Op) -> Kernel:
    """(dY, X) -> dX: dY summed over the dims that Expand broadcast X along."""

    def kernel(grad, x):
        _check_dtype(op, 0, grad, _NUMERIC, "int32, int64, float or double")
        offset = grad.ndim - x.ndim
        fits = offset >= 0 and all(a in (1, b) for a, b in zip(x.shape, grad.shape[offset:], strict=True))
        if not fits:  # Caffe2 does not check, and reads out of bounds
            raise ShapeError(f"{op.where}: dY {list(grad.shape)} is not an expansion of X {list(x.shape)}")
        axes = tuple(i for i in range(grad.ndim) if i < offset or x.shape[i - offset] == 1)
        return jnp.reshape(jnp.sum(grad, axis=axes, dtype=grad.dtype), x.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# Small shape and control ops


@register("Size", shape_only=True, gradient=no_gradient)
def size(op: Op) -> Kernel:
    """The input's element count, an int64 scalar (a constant: shapes are static)."""
    return lambda x: np.asarray(math.prod(x.shape), np.dtype(np.int64))


@register("FlattenToVec", gradient=single_gradient("ResizeLike", "GO(0) I(0)"))
def flatten_to_vec(op: Op) -> Kernel:
    def kernel(x):
        if x.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have rank >= 1, got a scalar")
        return jnp.reshape(x, (-1,))

    return kernel


@register("EnsureDense")
def ensure_dense(op: Op) -> Kernel:
    """A dense tensor (rank >= 1) stays what it is."""

    def kernel(x):
        if x.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have rank >= 1, got a scalar")
        return x

    return kernel


@facet("gradient", "EnsureDense")
def _ensure_dense_gradient_maker(g: GradientContext) -> GradientOps:
    g.set_dense(0, g.GO(0))
    return []


@register("HasElements", inputs=(1, None), shape_only=True, gradient=should_not_do_gradient)
def has_elements(op: Op) -> Kernel:
    """Whether any input has elements (a bool scalar, a constant)."""
    return lambda *xs: np.asarray(any(math.prod(x.shape) > 0 for x in xs))


@register("IsEmpty", shape_only=True, gradient=should_not_do_gradient)
def is_empty(op: Op) -> Kernel:
    return lambda x: np.asarray(math.prod(x.shape) == 0)


@register("Conditional", inputs=3, gradient=no_gradient)
def conditional(op: Op) -> Kernel:
    """(condition [N] bool, DataT, DataF) -> row i of DataT where condition[i], else of DataF."""

    def kernel(cond, data_t, data_f):
        if cond.dtype != np.bool_:
            raise ShapeError(f"{op.where}: condition '{op.inputs[0]}' must be bool, got {cond.dtype}")
        if cond.ndim != 1:
            raise ShapeError(f"{op.where}: condition '{op.inputs[0]}' must be 1-D, got {list(cond.shape)}")
        if data_t.ndim < 1 or data_t.shape[0] != cond.shape[0]:
            raise ShapeError(
                f"{op.where}: DataT {list(data_t.shape)} must have one row per condition ({cond.shape[0]})"
            )
        if data_t.shape != data_f.shape:
            raise ShapeError(f"{op.where}: DataT {list(data_t.shape)} and DataF {list(data_f.shape)} differ")
        if data_t.dtype != data_f.dtype:  # Caffe2 copies DataF's bytes as DataT's type
            raise ShapeError(f"{op.where}: DataT is {data_t.dtype} but DataF is {data_f.dtype}")
        mask = jnp.reshape(cond, (-1,) + (1,) * (data_t.ndim - 1))
        return jnp.where(mask, data_t, data_f)

    return kernel


@register("Find", inputs=2, gradient=NO_GRADIENT)
def find(op: Op) -> Kernel:
    """(index, query) -> for each query value, the LAST position in the (flattened) index holding it,
    else `missing_value` (default -1); int32 or int64, one dtype for both."""
    missing = op.int("missing_value", -1)

    def kernel(index, query):
        _check_dtype(op, 0, index, _INDEX, "int32 or int64")
        if query.dtype != index.dtype:
            raise ShapeError(f"{op.where}: query is {query.dtype} but index is {index.dtype}")
        flat = jnp.reshape(index, (-1,))
        hits = jnp.reshape(query, (-1, 1)) == flat[None, :]
        positions = jnp.arange(flat.shape[0], dtype=index.dtype)
        last = jnp.max(jnp.where(hits, positions, -1), axis=1, initial=-1)
        out = jnp.where(last >= 0, last, jnp.asarray(missing).astype(index.dtype))
        return jnp.reshape(out, query.shape)

    return kernel


@register("PrependDim")
def prepend_dim(op: Op) -> Kernel:
    """[d0, d1, ...] -> [dim_size, d0 / dim_size, d1, ...]."""
    dim_size = op.int("dim_size", 0)
    if dim_size <= 0:
        raise BadArgumentError(f"{op.where}: argument 'dim_size' = {dim_size} must be > 0")

    def kernel(x):
        if x.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have rank >= 1")
        if x.shape[0] % dim_size:
            raise ShapeError(f"{op.where}: first dim {x.shape[0]} is not a multiple of dim_size = {dim_size}")
        return jnp.reshape(x, (dim_size, x.shape[0] // dim_size, *x.shape[1:]))

    return kernel


@facet("gradient", "PrependDim")
def _prepend_dim_gradient_maker(g: GradientContext) -> GradientOps:
    g.copy_args = False  # MergeDim takes no dim_size
    return [gradient_op("MergeDim", [g.GO(0)], [g.GI(0)])]


@register("MergeDim", gradient=NO_GRADIENT)
def merge_dim(op: Op) -> Kernel:
    """[d0, d1, ...] -> [d0 * d1, ...]."""

    def kernel(x):
        if x.ndim < 2:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have rank >= 2, got {x.ndim}")
        return jnp.reshape(x, (x.shape[0] * x.shape[1], *x.shape[2:]))

    return kernel


_DT = pb.TensorProto
# The types DiagonalFillOp instantiates (filler_op.h).
_DIAGONAL_DTYPES = {
    _DT.FLOAT: np.float32,
    _DT.DOUBLE: np.float64,
    _DT.BOOL: np.bool_,
    _DT.INT8: np.int8,
    _DT.INT16: np.int16,
    _DT.INT32: np.int32,
    _DT.INT64: np.int64,
    _DT.UINT8: np.uint8,
    _DT.UINT16: np.uint16,
}


def _diagonal_dtype(op: Op) -> np.dtype:
    """`dtype` (a TensorProto code); by default FLOAT, or INT64 when `value` is an integer (filler_op.h)."""
    if op.has("dtype"):
        code = op.int("dtype")
        if code not in _DIAGONAL_DTYPES:
            raise BadArgumentError(f"{op.where}: argument 'dtype' = {code} is not a type DiagonalFill fills")
        return np.dtype(_DIAGONAL_DTYPES[code])
    if op.has("value") and op.args["value"].kind == "i":
        return np.dtype(np.int64)
    return np.dtype(np.float32)


def _input_as_shape(op: Op) -> tuple[int, ...]:
    return (0,) if op.bool("input_as_shape", False) else ()


@register("DiagonalFill", inputs=(0, 1), static_inputs=_input_as_shape, gradient=no_gradient)
def diagonal_fill(op: Op) -> Kernel:
    """Zeros with `value` on the diagonal (elements whose indices are all equal; for 2-D, non-square too).
    The shape comes as for every filler (filler_op.h): argument `shape`, the input's shape, or its values."""
    dtype = _diagonal_dtype(op)
    arg = op.args.get("value")
    value = np.zeros((), np.dtype(dtype)) if arg is None else _convert(op, "value", arg.value, dtype)

    def check(shape: tuple[int, ...]) -> None:
        if len(shape) < 2:
            raise ShapeError(f"{op.where}: DiagonalFill needs an output of rank >= 2, got {list(shape)}")
        if len(shape) > 2 and len(set(shape)) > 1:
            raise ShapeError(f"{op.where}: all dims of a DiagonalFill output of rank > 2 must be equal: {list(shape)}")

    def fill(shape: tuple[int, ...], _key: Any) -> Any:
        total = math.prod(shape)
        # Caffe2 writes every `step`-th element (from 0): one past a row for 2-D, else sum of the strides.
        step = shape[1] + 1 if len(shape) == 2 else 1 + sum(math.prod(shape[: i + 1]) for i in range(len(shape) - 1))
        flat = np.zeros(total, bool)
        flat[::step] = True
        return jnp.where(jnp.asarray(flat.reshape(shape)), value, jnp.zeros((), value.dtype))

    return _filler(op, fill, check, np.dtype(dtype))


# --------------------------------------------------------------------------------------------------
# Layout switches


def _order_switch(op: Op, source: int, target: int) -> Kernel:
    def kernel(x):
        if x.ndim < 3:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have rank >= 3, got {x.ndim}")
        if x.size == 0:  # Caffe2 returns before reading the data: an empty float tensor, whatever the dtype
            return jnp.zeros(jnp.moveaxis(x, source, target).shape, jnp.float32)
        _check_dtype(op, 0, x, _F32, "float")
        return jnp.moveaxis(x, source, target)

    return kernel


@register("NCHW2NHWC")
def nchw_to_nhwc(op: Op) -> Kernel:
    return _order_switch(op, 1, -1)


@facet("gradient", "NCHW2NHWC")
def _layout_switch_gradient_maker(g: GradientContext) -> GradientOps:
    """dY -> dX by the inverse layout switch."""
    inverse = "NHWC2NCHW" if g.op.type == "NCHW2NHWC" else "NCHW2NHWC"
    return [gradient_op(inverse, [g.GO(0)], [g.GI(0)])]


@register("NHWC2NCHW", gradient=_layout_switch_gradient_maker)
def nhwc_to_nchw(op: Op) -> Kernel:
    return _order_switch(op, -1, 1)


# --------------------------------------------------------------------------------------------------
# TopK and FlexibleTopK


def _order_key(x: Any) -> Any:
    """int32 keys ordered as the float32 values are, compared on their bits: XLA on CPU flushes
    subnormal floats to zero in comparisons, C++ does not. -0.0 and 0.0 get one key (they tie in C++)."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    bits = jnp.where(bits == jnp.iinfo(jnp.int32).min, 0, bits)  # -0.0
    return jnp.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def _sorted_desc(x: Any) -> tuple[Any, Any]:
    """Values and indices along the last axis, largest first, ties by lower index (Caffe2's heap order)."""
    order = jnp.argsort(~_order_key(x), axis=-1, stable=True)  # ~key: descending without overflow
    return jnp.take_along_axis(x, order, axis=-1), order


@register(
    "TopK",
    inputs=(1, 2),
    outputs=(2, 3),
    static_inputs=(1,),
    gradient=single_gradient("TopKGradient", "GO(0) O(1) I(0)"),
)
def top_k(op: Op) -> Kernel:
    """(X[, k]) -> (Values, Indices[, FlattenIndices]) of the k largest along `axis` (default the last).
    With k > dim the outputs are padded with 0 and -1 (top_k.cc). Argument `k` wins over input `k`."""
    axis = op.int("axis", -1)
    k_arg = op.int("k", -1) if op.has("k") else None
    if k_arg is not None and k_arg < 1:
        raise BadArgumentError(f"{op.where}: argument 'k' = {k_arg} must be >= 1")
    if k_arg is None and len(op.inputs) == 1:
        raise BadArgumentError(f"{op.where}: argument 'k' is missing (and not given as input)")

    def kernel(x, *k_input):
        _check_dtype(op, 0, x, _F32, "float")
        k = k_arg
        if k is None:
            _check_int64(op, 1, k_input[0])
            values = _static(op, 1, k_input[0]).reshape(-1)
            if values.size < 1:
                raise ShapeError(f"{op.where}: input k '{op.inputs[1]}' is empty")
            k = int(values[0])
            if k < 1:
                raise ShapeError(f"{op.where}: k = {k} must be >= 1")
        ax = x.ndim - 1 if axis == -1 else axis
        if not 0 <= ax < x.ndim:
            raise ShapeError(f"{op.where}: axis {axis} is out of range for an input of rank {x.ndim}")
        n = x.shape[ax]
        vals, idx = _sorted_desc(_move_to_last(x, ax))
        vals, idx = vals[..., :k], idx[..., :k].astype(np.dtype(np.int64))
        if k > n:
            pad = [(0, 0)] * (x.ndim - 1) + [(0, k - n)]
            vals, idx = jnp.pad(vals, pad), jnp.pad(idx, pad, constant_values=-1)
        vals, idx = jnp.moveaxis(vals, -1, ax), jnp.moveaxis(idx, -1, ax)
        prev, nxt = size_to_dim(x.shape, ax), size_from_dim(x.shape, ax + 1)
        out_shape = idx.shape
        pre = jnp.reshape(jnp.arange(prev), (prev, 1, 1)) * (n * nxt)
        post = jnp.reshape(jnp.arange(nxt), (1, 1, nxt))
        idx3 = jnp.reshape(idx, (prev, k, nxt))
        flat = jnp.where(idx3 >= 0, pre + idx3 * nxt + post, -1).astype(idx.dtype)
        return vals, idx, jnp.reshape(flat, (math.prod(out_shape),))

    return kernel


def _scatter_rows(rows: Any, index: Any, n: int, dtype: Any) -> Any:
    """Per row r: zeros(n) with out[index[r, j]] = rows[r, j] (later writes win; index -1 or >= n dropped)."""
    safe = jnp.where((index >= 0) & (index < n), index, n)

    def one(values, where):
        return jnp.zeros((n,), dtype).at[where].set(values, mode="drop")

    if rows.shape[0] == 0:
        return jnp.zeros((0, n), dtype)
    return jax.vmap(one)(rows, safe)


@register("TopKGradient", inputs=3)
def top_k_gradient(op: Op) -> Kernel:
    """(dValues, Indices, X) -> dX: each dValue written back at its index; a -1 index (TopK's padding)
    ends its row, as Caffe2's loop stops advancing there (top_k.cc)."""
    axis = op.int("axis", -1)
    if axis < -1:  # Caffe2 indexes the dims with it (out of bounds)
        raise BadArgumentError(f"{op.where}: argument 'axis' = {axis} must be >= -1")

    def kernel(grad, indices, x):
        _check_dtype(op, 0, grad, _F32, "float")
        _check_int64(op, 1, indices)
        if grad.ndim != x.ndim:
            raise ShapeError(f"{op.where}: dValues {list(grad.shape)} and X {list(x.shape)} differ in rank")
        ax = grad.ndim - 1 if axis == -1 else axis
        if not 0 <= ax < grad.ndim:
            raise ShapeError(f"{op.where}: axis {axis} is out of range for rank {grad.ndim}")
        others = [d for i, d in enumerate(grad.shape) if i != ax]
        if others != [d for i, d in enumerate(x.shape) if i != ax] or indices.shape != grad.shape:
            raise ShapeError(
                f"{op.where}: dValues {list(grad.shape)}, Indices {list(indices.shape)} and X {list(x.shape)} "
                f"must agree except along axis {ax}"
            )
        n, k = x.shape[ax], grad.shape[ax]
        rows = jnp.reshape(_move_to_last(grad, ax), (-1, k))
        index = jnp.reshape(_move_to_last(indices, ax), (-1, k))
        index = jnp.where(jnp.cumprod(index >= 0, axis=1).astype(bool), index, -1)
        out = _scatter_rows(rows, index, n, grad.dtype)
        moved = (*others[:ax], *others[ax:], n)
        return jnp.moveaxis(jnp.reshape(out, moved), -1, ax)

    return kernel


def _flexible_k(op: Op, x: Any, k: Any) -> np.ndarray:
    _check_dtype(op, 0, x, _F32, "float")
    _check_int64(op, 1, k)
    if x.ndim < 1:
        raise ShapeError(f"{op.where}: X '{op.inputs[0]}' must have rank >= 1")
    ks = _static(op, 1, k).reshape(-1).astype(np.int64)
    rows, n = size_to_dim(x.shape, x.ndim - 1), x.shape[-1]
    if ks.size != rows:
        raise ShapeError(f"{op.where}: K '{op.inputs[1]}' has {ks.size} entries for {rows} rows of X {list(x.shape)}")
    if ks.size and (ks.min() < 1 or ks.max() > n):
        raise ShapeError(f"{op.where}: every k must be in [1, {n}] (the last dim of X), got {ks.tolist()}")
    return ks


def _flexible_positions(ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.repeat(np.arange(ks.size), ks)
    cols = np.concatenate([np.arange(k) for k in ks]) if ks.size else np.zeros(0, np.int64)
    return rows, cols.astype(np.int64)


@register(
    "FlexibleTopK",
    inputs=2,
    outputs=2,
    static_inputs=(1,),
    gradient=single_gradient("FlexibleTopKGradient", "I(0) I(1) GO(0) O(1)"),
)
def flexible_top_k(op: Op) -> Kernel:
    """(X [..., D], K int64 [prod(...)]) -> (Values, Indices), 1-D: row r's K[r] largest, rows one after
    another (flexible_top_k.cc)."""

    def kernel(x, k):
        ks = _flexible_k(op, x, k)
        rows, cols = _flexible_positions(ks)
        flat = jnp.reshape(x, (ks.size, x.shape[-1]))
        vals, idx = _sorted_desc(flat)
        return vals[rows, cols], idx[rows, cols].astype(np.dtype(np.int64))

    return kernel


@register("FlexibleTopKGradient", inputs=4, static_inputs=(1,))
def flexible_top_k_gradient(op: Op) -> Kernel:
    """(X, K, dValues, Indices) -> dX: each of row r's K[r] gradients written at its index (later writes
    win); entries past sum(K) are ignored, as Caffe2 does."""

    def kernel(x, k, grad, indices):
        ks = _flexible_k(op, x, k)
        _check_dtype(op, 2, grad, _F32, "float")
        _check_int64(op, 3, indices)
        total = int(ks.sum())
        if grad.ndim != 1 or indices.ndim != 1 or grad.shape[0] < total or indices.shape[0] < total:
            raise ShapeError(
                f"{op.where}: dValues {list(grad.shape)} and Indices {list(indices.shape)} must be 1-D with "
                f"at least sum(K) = {total} entries"
            )
        n = x.shape[-1]
        rows, _ = _flexible_positions(ks)
        safe = jnp.where((indices[:total] >= 0) & (indices[:total] < n), indices[:total], n)
        flat = jnp.zeros((ks.size, n + 1), grad.dtype).at[rows, safe].set(grad[:total])
        return jnp.reshape(flat[:, :n], x.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# Range


@register("Range", inputs=(1, 3), static_inputs=(0, 1, 2), gradient=no_gradient)
def range_(op: Op) -> Kernel:
    """([start,] stop[, step]) -> [start, start + step, ...) below stop; one-element inputs of one dtype
    (int32, int64, float, double). Length: ceil((stop - start) / step), computed in that dtype."""

    def kernel(*bounds):
        first = bounds[0]
        _check_dtype(op, 0, first, _NUMERIC, "int32, int64, float or double")
        values = []
        for i, b in enumerate(bounds):
            if b.dtype != first.dtype:
                raise ShapeError(f"{op.where}: input '{op.inputs[i]}' is {b.dtype}, not {first.dtype}")
            v = _static(op, i, b)
            if v.size != 1:
                raise ShapeError(f"{op.where}: input '{op.inputs[i]}' must hold one value, got {list(v.shape)}")
            values.append(v.reshape(())[()])
        dtype = np.dtype(first.dtype)
        start, stop, step = dtype.type(0), values[0], dtype.type(1)
        if len(values) > 1:
            start, stop = values[0], values[1]
        if len(values) > 2:
            step = values[2]
        if step == 0:
            raise ShapeError(f"{op.where}: Step size cannot be 0")  # Caffe2's words, which callers match
        diff = dtype.type(stop - start)
        if dtype.kind == "i":
            length = _c_div(int(diff), int(step))
            if length * int(step) < int(diff):
                length += 1
        else:
            length = math.ceil(float(dtype.type(diff / step)))
        length = max(length, 0)
        return jnp.asarray(start + step * np.arange(length, dtype=dtype), dtype=dtype)

    return kernel


def _c_div(a: int, b: int) -> int:
    """C++ integer division (truncates towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# --------------------------------------------------------------------------------------------------
# ScaleBlobs, WeightScale


@register("ScaleBlobs", inputs=(1, None), outputs=(1, None), gradient=NO_GRADIENT)
def scale_blobs(op: Op) -> Kernel:
    """(X0, X1, ...) -> (scale * X0, scale * X1, ...), float tensors, one output per input."""
    scale = op.float("scale", 1.0)
    if len(op.outputs) != len(op.inputs):
        raise BadArgumentError(f"{op.where}: ScaleBlobs needs one output per input")

    def kernel(*xs):
        for i, x in enumerate(xs):
            _check_dtype(op, i, x, _F32, "float")
        return tuple(x * np.float32(scale) for x in xs)

    return kernel


@register("WeightScale", inputs=2, gradient=should_not_do_gradient)
def weight_scale(op: Op) -> Kernel:
    """(w, iter) -> w * scale when iter + 1 is a multiple of `stepsize` below `upper_bound_iter`, else w
    (caffe2/sgd/weight_scale_op.h)."""
    big = np.iinfo(np.int64).max
    stepsize = op.int("stepsize", big)
    upper = op.int("upper_bound_iter", big)
    scale = op.float("scale", 1.0)
    if stepsize == 0:
        raise BadArgumentError(f"{op.where}: argument 'stepsize' must not be 0")

    def kernel(w, it):
        _check_dtype(op, 0, w, _F32, "float")
        _check_int64(op, 1, it)
        if it.size < 1:
            raise ShapeError(f"{op.where}: iter '{op.inputs[1]}' is empty")
        step = jnp.reshape(it, (-1,))[0] + 1
        largest = np.iinfo(step.dtype).max
        hit = (step % min(stepsize, largest) == 0) & (step < min(upper, largest))
        return jnp.where(hit, w * np.float32(scale), w)

    return kernel


@register("Accumulate", scoped=True, gradient=should_not_do_gradient)
def accumulate(op: Op) -> Kernel:
    """X -> Y = X + gamma * Y, reading the output blob's value before the op. Caffe2 starts from
    uninitialised memory when Y does not exist yet or has another shape (accumulate_op.h): refused here."""
    gamma = np.float32(op.float("gamma", 1.0))
    if op.inputs[0] == op.outputs[0]:
        raise BadArgumentError(f"{op.where}: Accumulate cannot run in place (input and output '{op.inputs[0]}')")

    def kernel(x, scope):
        _check_dtype(op, 0, x, _F32, "float")
        previous = scope.get(op.outputs[0])
        if previous is None or previous.shape != x.shape or np.dtype(previous.dtype) != np.dtype(np.float32):
            raise ShapeError(
                f"{op.where}: output '{op.outputs[0]}' must already hold a float tensor of X's shape "
                f"{list(x.shape)} to accumulate into (Caffe2 would start from uninitialised memory)"
            )
        return x + gamma * previous

    kernel.scope_reads = (op.outputs[0],)  # Y's previous value: an input of the net, read by name
    return kernel
