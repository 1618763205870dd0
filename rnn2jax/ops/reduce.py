"""Reductions: Reduce{Front,Back}{Sum,Mean} (with Caffe2's `lengths` quirk), ReduceSum/Mean, SumElements,
and their gradient ops.

RNN nets use them to pool over time and to turn a loss into a scalar; the front/back ops view the
input as a matrix and reduce its leading or trailing dims, optionally only over a prefix per column/row.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .common import canonical_axis, size_from_dim, size_to_dim
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import (
    GradientContext,
    GradientOps,
    gradient_from_input,
    gradient_op,
    should_not_do_gradient,
    single_gradient,
)
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_FRONT_BACK = {
    "ReduceFrontSum": (True, False),
    "ReduceBackSum": (False, False),
    "ReduceFrontMean": (True, True),
    "ReduceBackMean": (False, True),
}


@register(*_FRONT_BACK, inputs=(1, 2))
def reduce_front_back(op: Op) -> Kernel:
    """Front ops reduce the first `num_reduce_dim` dims, Back ops the last ones (the argument name is
    singular in the C++; the schema doc's `num_reduce_dims` is never read). With `lengths`, only the
    first `lengths[j]` reduced entries of column/row j count, but entry 0 always counts, even for a
    length of 0, and a mean divides by the length as given (caffe2/operators/
    reduce_front_back_{sum,mean}_ops.cc). Lengths beyond the reduced size read past the data in Caffe2;
    here the missing entries count as absent."""
    front, mean = _FRONT_BACK[op.type]
    num = _num_reduce_dim(op, with_lengths=len(op.inputs) == 2)

    def kernel(x, lengths=None):
        split = _split(op, num, front, x.ndim)
        out_shape = x.shape[split:] if front else x.shape[:split]
        matrix = x.reshape(size_to_dim(x.shape, split), size_from_dim(x.shape, split))
        groups = matrix.T if front else matrix  # one row per output element, reduced along axis 1
        kept, reduced = groups.shape
        if groups.size == 0:
            return jnp.zeros(out_shape, x.dtype)
        if lengths is None:
            return _finish(jnp.sum(groups, axis=1, dtype=x.dtype), reduced, mean).reshape(out_shape)
        counts = _lengths(op, lengths, kept)
        position = jnp.arange(reduced, dtype=jnp.int32)
        keep = (position < counts[:, None]) | (position == 0)
        total = jnp.sum(jnp.where(keep, groups, jnp.zeros((), x.dtype)), axis=1, dtype=x.dtype)
        return _finish(total, counts, mean).reshape(out_shape)

    return kernel


@facet("gradient", "ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean")
def _reduce_front_back_gradient_maker(g: GradientContext) -> GradientOps:
    """(dY, X[, lengths])."""
    inputs = [g.GO(0), g.I(0)] + ([g.I(1)] if len(g.op.input) == 2 else [])
    return [gradient_op(g.op.type + "Gradient", inputs, [g.GI(0)])]


def _num_reduce_dim(op: Op, with_lengths: bool) -> int:
    num = op.int("num_reduce_dim", 1)
    if num < 0:
        raise BadArgumentError(f"{op.where}: argument 'num_reduce_dim' = {num} must not be negative")
    if with_lengths and num != 1:
        raise BadArgumentError(f"{op.where}: with a lengths input, argument 'num_reduce_dim' must be 1, got {num}")
    return num


def _split(op: Op, num: int, front: bool, ndim: int) -> int:
    """Where the matrix view splits the dims: after the first `num` (front) or before the last."""
    if num > ndim:
        raise ShapeError(f"{op.where}: argument 'num_reduce_dim' = {num} is out of range for an input of rank {ndim}")
    return num if front else ndim - num


def _is_shape_form(value: Any) -> bool:
    """Caffe2 reads the gradient's second input as X's shape when it is a 1-D int64 tensor (pre-2018 nets)."""
    return getattr(value, "ndim", None) == 1 and np.dtype(getattr(value, "dtype", None)) == np.int64


def _dx_shape(op: Op, x: Any) -> tuple[int, ...]:
    """dX's shape: X's, or the values of X's shape in the pre-2018 form (a 1-D int64 tensor, as Caffe2 takes
    any such input, whatever it holds)."""
    if not _is_shape_form(x):
        return tuple(x.shape)
    if isinstance(x, jax.core.Tracer):
        raise ShapeError(
            f"{op.where}: input '{op.inputs[1]}' is a 1-D int64 tensor, which Caffe2 reads as X's shape (the "
            "pre-2018 form of this gradient), but its values are traced here; give X itself, or run the op in a "
            "workspace"
        )
    shape = tuple(int(v) for v in np.asarray(x))
    if any(d < 0 for d in shape):
        raise ShapeError(f"{op.where}: input '{op.inputs[1]}' read as X's shape holds negative sizes {list(shape)}")
    return shape


@register(*(f"{name}Gradient" for name in _FRONT_BACK), inputs=(2, 3), static_if=((1, _is_shape_form),))
def reduce_front_back_gradient(op: Op) -> Kernel:
    """`(dY, X[, lengths]) -> dX`: X only gives dX its shape. Each output element's gradient goes
    back to the entries it reduced (divided by the count for a mean); with `lengths` only entries
    `0 .. lengths[j]-1` get it, so unlike the forward's quirk a length of 0 gives entry 0 nothing,
    and a mean divides by the length as given (caffe2/operators/reduce_front_back_{sum,mean}_ops.cc).
    Pre-2018 nets passed X's shape as an int64 vector instead of X, and Caffe2 still reads any 1-D int64 X so
    (registry `static_if`: a workspace then reads its values on the host)."""
    front, mean = _FRONT_BACK[op.type.removesuffix("Gradient")]
    num = _num_reduce_dim(op, with_lengths=len(op.inputs) == 3)

    def kernel(dy, x, lengths=None):
        shape = _dx_shape(op, x)
        split = _split(op, num, front, len(shape))
        rows, cols = size_to_dim(shape, split), size_from_dim(shape, split)
        kept, reduced = (cols, rows) if front else (rows, cols)
        if dy.size != kept:
            raise ShapeError(
                f"{op.where}: dY '{op.inputs[0]}' has {dy.size} elements, expected {kept} (one per "
                f"output element for X '{op.inputs[1]}' of shape {list(shape)})"
            )
        counts = None if lengths is None else _lengths(op, lengths, kept, index=2)[:, None]
        if math.prod(shape) == 0:
            return jnp.zeros(shape, dy.dtype)
        column = dy.reshape(kept, 1)
        if counts is None:
            groups = jnp.broadcast_to(_finish(column, reduced, mean), (kept, reduced))
        else:
            inside = jnp.arange(reduced, dtype=jnp.int32) < counts
            safe = jnp.maximum(counts, 1)  # a count below 1 leaves nothing inside to divide
            groups = jnp.where(inside, _finish(column, safe, mean), jnp.zeros((), dy.dtype))
        return (groups.T if front else groups).reshape(shape)

    return kernel


def _lengths(op: Op, lengths: jax.Array, groups: int, index: int = 1) -> jax.Array:
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ShapeError(f"{op.where}: lengths '{op.inputs[index]}' must be integers (int32), got {lengths.dtype}")
    if lengths.size != groups:
        raise ShapeError(
            f"{op.where}: lengths '{op.inputs[index]}' has {lengths.size} elements, expected {groups} "
            "(one per element of the output)"
        )
    return lengths.reshape(groups).astype(jnp.int32)


def _finish(total: jax.Array, count: jax.Array | int, mean: bool) -> jax.Array:
    """The sum, or Caffe2's `sum / count` in the data type (truncating for integers)."""
    if not mean:
        return total
    if jnp.issubdtype(total.dtype, jnp.integer):
        return jax.lax.div(total, jnp.broadcast_to(jnp.asarray(count, total.dtype), total.shape))
    return total / jnp.asarray(count, total.dtype)


@register("ReduceSum", "ReduceMean")
def reduce_axes(op: Op) -> Kernel:
    """Sum/mean over `axes` (default: all), keeping them as size-1 dims unless `keepdims=0`
    (caffe2/operators/reduce_ops.h). ReduceMean is float-only in Caffe2 and scales the sum by
    `numel(Y) / numel(X)`, computed in the data type."""
    axes = op.ints("axes", ())
    keepdims = op.bool("keepdims", True)
    mean = op.type == "ReduceMean"

    def kernel(x):
        dims = _reduce_dims(op, axes, x.ndim)
        if mean and not jnp.issubdtype(x.dtype, jnp.floating):
            raise ShapeError(f"{op.where}: ReduceMean takes a float input, got {x.dtype}")
        total = jnp.sum(x, axis=dims, keepdims=keepdims, dtype=x.dtype)
        if not mean:
            return total
        return total * _ratio(total.size, x.size, x.dtype)

    return kernel


@facet("gradient", "ReduceSum", "ReduceMean")
def _reduce_axes_gradient_maker(g: GradientContext) -> GradientOps:
    """(dY, X, Y)."""
    return [gradient_op(g.op.type + "Gradient", [g.GO(0), g.I(0), g.O(0)], [g.GI(0)])]


def _reduce_dims(op: Op, axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    if not axes:
        return tuple(range(ndim))
    dims = sorted(canonical_axis(op, a, ndim, "axes entry") for a in axes)
    if len(set(dims)) != len(dims):
        raise BadArgumentError(f"{op.where}: argument 'axes' = {list(axes)} names an axis twice")
    return tuple(dims)


def _ratio(numerator: int, denominator: int, dtype: np.dtype) -> jax.Array:
    """Caffe2's float `numerator / denominator`; an empty input reduces to 0, as in Caffe2 (ReduceMean
    and SumElements(average=1) of an empty tensor give 0, not NaN)."""
    if not denominator:
        return jnp.asarray(0, dtype)
    return jnp.asarray(np.asarray(numerator, dtype) / np.asarray(denominator, dtype), dtype)


@register("SumElements", gradient=gradient_from_input)
def sum_elements(op: Op) -> Kernel:
    """The sum of all elements as a 0-d scalar; `average` multiplies it by `1/numel` in float
    (caffe2/operators/reduction_ops.h). Float inputs only (SumElementsInt is the int32 op)."""
    average = op.bool("average", False)

    def kernel(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ShapeError(f"{op.where}: SumElements takes a float input, got {x.dtype}")
        total = jnp.sum(x, dtype=x.dtype)
        return total * _ratio(1, x.size, x.dtype) if average else total

    return kernel


@register("ReduceSumGradient", "ReduceMeanGradient", inputs=3)
def reduce_axes_gradient(op: Op) -> Kernel:
    """`(dY, X, Y) -> dX`: dY broadcast back over the reduced `axes` to X's shape (X and Y give shapes
    only; `keepdims` does not matter). ReduceMeanGradient scales by `numel(dY) / numel(X)` in the
    data type and is float-only, like the forward (caffe2/operators/reduce_ops.h)."""
    axes = op.ints("axes", ())
    op.bool("keepdims", True)
    mean = op.type == "ReduceMeanGradient"

    def kernel(dy, x, y):
        dims = _reduce_dims(op, axes, x.ndim)
        if mean and not jnp.issubdtype(dy.dtype, jnp.floating):
            raise ShapeError(f"{op.where}: ReduceMeanGradient takes a float dY, got {dy.dtype}")
        kept = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
        if dy.size != math.prod(kept):
            raise ShapeError(
                f"{op.where}: dY '{op.inputs[0]}' has shape {list(dy.shape)}, which does not match X "
                f"'{op.inputs[1]}' of shape {list(x.shape)} reduced over axes {list(dims)}"
            )
        dx = jnp.broadcast_to(dy.reshape(kept), x.shape)
        return dx * _ratio(dy.size, x.size, dy.dtype) if mean else dx

    return kernel


@register("SumElementsGradient", inputs=2)
def sum_elements_gradient(op: Op) -> Kernel:
    """`(X, dY) -> dX`: the scalar dY (divided by `numel(X)` with `average`) everywhere X has an
    element (caffe2/operators/reduction_ops.cc; float only)."""
    average = op.bool("average", False)

    def kernel(x, dy):
        if not jnp.issubdtype(dy.dtype, jnp.floating):
            raise ShapeError(f"{op.where}: SumElementsGradient takes a float dY, got {dy.dtype}")
        if dy.size != 1:
            raise ShapeError(f"{op.where}: dY '{op.inputs[1]}' must hold one element, got shape {list(dy.shape)}")
        value = dy.reshape(())
        if average and x.size:
            value = value / jnp.asarray(x.size, dy.dtype)
        return jnp.broadcast_to(value, x.shape)

    return kernel


# ---------------------------------------------------------------------------------------------------
# ReduceMax/Min/L1/L2 (caffe2/operators/reduce_ops.{h,cc})

_AXES_TYPES = {
    "ReduceMax": ("int32", "int64", "float32", "float64"),
    "ReduceMin": ("int32", "int64", "float32", "float64"),
    "ReduceL1": ("float32",),
    "ReduceL2": ("float32",),
}


def require_dtype(op: Op, x: jax.Array, allowed: tuple[str, ...], index: int = 0) -> None:
    """Caffe2 registers these kernels for `allowed` types only (a double is refused where only float is)."""
    if x.dtype.name not in allowed:
        raise ShapeError(f"{op.where}: {op.type} takes {' or '.join(allowed)} '{op.inputs[index]}', got {x.dtype}")


@register(*_AXES_TYPES)
def reduce_axes_extreme(op: Op) -> Kernel:
    """Max/min/L1/L2 over `axes` (default all, negative ones count from the end), `keepdims` default 1.
    An empty reduction gives the type's lowest (max) or highest (min) value, and 0 for the norms."""
    axes = op.ints("axes", ())
    keepdims = op.bool("keepdims", True)
    allowed = _AXES_TYPES[op.type]

    def kernel(x):
        require_dtype(op, x, allowed)
        dims = _reduce_dims(op, axes, x.ndim)
        if op.type in ("ReduceMax", "ReduceMin"):
            info = jnp.finfo(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype)
            if op.type == "ReduceMax":
                return jnp.max(x, axis=dims, keepdims=keepdims, initial=info.min)
            return jnp.min(x, axis=dims, keepdims=keepdims, initial=info.max)
        if op.type == "ReduceL1":
            return jnp.sum(jnp.abs(x), axis=dims, keepdims=keepdims)
        return jnp.sqrt(jnp.sum(jnp.square(x), axis=dims, keepdims=keepdims))

    return kernel


facet("gradient", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2")(_reduce_axes_gradient_maker)


@register(*(f"{name}Gradient" for name in _AXES_TYPES), inputs=3)
def reduce_axes_extreme_gradient(op: Op) -> Kernel:
    """`(dY, X, Y) -> dX`. Max/Min: dY wherever X equals its Y (every tie gets it). L1: `sign(X)·dY`
    with |X| <= 1e-12 counting as 0. L2: `dY·X/Y`, or dY itself where Y < 1e-12 (reduce_ops.cc)."""
    axes = op.ints("axes", ())
    op.bool("keepdims", True)
    forward = op.type.removesuffix("Gradient")
    allowed = _AXES_TYPES[forward]

    def kernel(dy, x, y):
        require_dtype(op, dy, allowed)
        for index, value in ((1, x), (2, y)):
            if value.dtype != dy.dtype:
                raise ShapeError(f"{op.where}: '{op.inputs[index]}' is {value.dtype}, dY is {dy.dtype}")
        dims = _reduce_dims(op, axes, x.ndim)
        kept = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
        for index, value in ((0, dy), (2, y)):
            if value.size != math.prod(kept):
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' has shape {list(value.shape)}, which does not match X "
                    f"'{op.inputs[1]}' of shape {list(x.shape)} reduced over axes {list(dims)}"
                )
        g = jnp.broadcast_to(dy.reshape(kept), x.shape)
        y_full = jnp.broadcast_to(y.reshape(kept), x.shape)
        zero = jnp.zeros((), dy.dtype)
        if forward in ("ReduceMax", "ReduceMin"):
            return jnp.where(x == y_full, g, zero)
        eps = jnp.asarray(1e-12, jnp.float32)
        if forward == "ReduceL1":
            xf = x.astype(jnp.float32)
            return jnp.where(xf < -eps, -g, jnp.where(xf > eps, g, zero))
        small = y_full < eps.astype(dy.dtype)
        return jnp.where(small, g, g * x / jnp.where(small, jnp.ones((), dy.dtype), y_full))

    return kernel


# ---------------------------------------------------------------------------------------------------
# ReduceFrontMax / ReduceBackMax (caffe2/operators/reduce_front_back_max_ops.{h,cc})

_FRONT_BACK_MAX = {"ReduceFrontMax": True, "ReduceBackMax": False}


@register(*_FRONT_BACK_MAX, inputs=(1, 2))
def reduce_front_back_max(op: Op) -> Kernel:
    """The max over the first (Front) or last (Back) `num_reduce_dim` dims, float only. An empty
    input gives zeros (before lengths are even looked at). With `lengths`, entry 0 always counts and
    entries `1 .. lengths[j]-1` too; lengths beyond the reduced size read past the data in Caffe2,
    here the missing entries count as absent."""
    front = _FRONT_BACK_MAX[op.type]
    num = _num_reduce_dim(op, with_lengths=False)

    def kernel(x, lengths=None):
        split = _split(op, num, front, x.ndim)
        out_shape = x.shape[split:] if front else x.shape[:split]
        if x.size == 0:  # Caffe2 returns float zeros before it reads (or checks) the data and lengths
            return jnp.zeros(out_shape, jnp.float32)
        _num_reduce_dim(op, with_lengths=lengths is not None)
        require_dtype(op, x, ("float32",))
        matrix = x.reshape(size_to_dim(x.shape, split), size_from_dim(x.shape, split))
        groups = matrix.T if front else matrix
        kept, reduced = groups.shape
        if lengths is None:
            return jnp.max(groups, axis=1).reshape(out_shape)
        counts = _lengths(op, lengths, kept)
        position = jnp.arange(reduced, dtype=jnp.int32)
        keep = (position < counts[:, None]) | (position == 0)
        lowest = jnp.asarray(jnp.finfo(x.dtype).min, x.dtype)
        return jnp.max(jnp.where(keep, groups, lowest), axis=1).reshape(out_shape)

    return kernel


@facet("gradient", "ReduceFrontMax", "ReduceBackMax")
def _reduce_front_back_max_gradient_maker(g: GradientContext) -> GradientOps:
    """(dY, X, Y[, lengths])."""
    inputs = [g.GO(0), g.I(0), g.O(0)] + ([g.I(1)] if len(g.op.input) == 2 else [])
    return [gradient_op(g.op.type + "Gradient", inputs, [g.GI(0)])]


@register(*(f"{name}Gradient" for name in _FRONT_BACK_MAX), inputs=(3, 4))
def reduce_front_back_max_gradient(op: Op) -> Kernel:
    """`(dY, X, Y[, lengths]) -> dX`: dY where X equals its group's max, and, with lengths, only at
    positions below the length (so a length of 0 gives nothing, unlike the forward's entry 0)."""
    front = _FRONT_BACK_MAX[op.type.removesuffix("Gradient")]
    num = _num_reduce_dim(op, with_lengths=len(op.inputs) == 4)

    def kernel(dy, x, y, lengths=None):
        for index, value in enumerate((dy, x, y)):
            require_dtype(op, value, ("float32",), index)
        split = _split(op, num, front, x.ndim)
        rows, cols = size_to_dim(x.shape, split), size_from_dim(x.shape, split)
        kept, reduced = (cols, rows) if front else (rows, cols)
        for index, value in ((0, dy), (2, y)):
            if value.size != kept:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' has {value.size} elements, expected {kept} (one per "
                    f"output element for X '{op.inputs[1]}' of shape {list(x.shape)})"
                )
        counts = None if lengths is None else _lengths(op, lengths, kept, index=3)[:, None]
        if x.size == 0:
            return jnp.zeros(x.shape, dy.dtype)
        matrix = x.reshape(rows, cols).astype(dy.dtype)
        groups = matrix.T if front else matrix
        hit = groups == y.reshape(kept, 1).astype(dy.dtype)
        if counts is not None:
            hit = hit & (jnp.arange(reduced, dtype=jnp.int32) < counts)
        grad = jnp.where(hit, dy.reshape(kept, 1), jnp.zeros((), dy.dtype))
        return (grad.T if front else grad).reshape(x.shape)

    return kernel


# ---------------------------------------------------------------------------------------------------
# RowwiseMax / ColwiseMax, SumSqrElements, SumElementsInt (caffe2/operators/reduction_ops.{h,cc})

_ROW_COL = {"RowwiseMax": 2, "ColwiseMax": 1}


def _batch_matrices(op: Op, x: jax.Array) -> None:
    if x.ndim != 3:
        raise ShapeError(f"{op.where}: {op.type} takes a 3-D input (batch, M, N), got shape {list(x.shape)}")


@register(*_ROW_COL)
def row_col_max(op: Op) -> Kernel:
    """`X[B, M, N] -> Y[B, M]` (RowwiseMax, the max of each row) or `Y[B, N]` (ColwiseMax), float only.
    Caffe2 crashes (reads nothing, writes garbage or segfaults) when the reduced side is 0: refused."""
    axis = _ROW_COL[op.type]

    def kernel(x):
        _batch_matrices(op, x)
        out_shape = tuple(d for i, d in enumerate(x.shape) if i != axis)
        if op.type == "ColwiseMax" and x.shape[0] == 0:  # Caffe2 reads (and type-checks) X per batch item
            return jnp.zeros(out_shape, jnp.float32)
        require_dtype(op, x, ("float32",))
        if math.prod(out_shape) == 0:
            return jnp.zeros(out_shape, x.dtype)
        if x.shape[axis] == 0:
            raise ShapeError(f"{op.where}: {op.type} of '{op.inputs[0]}' reduces an empty side ({list(x.shape)})")
        return jnp.max(x, axis=axis)

    return kernel


@facet("gradient", "RowwiseMax", "ColwiseMax")
def _row_col_max_gradient_maker(g: GradientContext) -> GradientOps:
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])]


@register(*(f"{name}Gradient" for name in _ROW_COL), inputs=3)
def row_col_max_gradient(op: Op) -> Kernel:
    """`(X, Y, dY) -> dX`: dY where X equals its row's (column's) max, 0 elsewhere."""
    axis = _ROW_COL[op.type.removesuffix("Gradient")]

    def kernel(x, y, dy):
        for index, value in enumerate((x, y, dy)):
            require_dtype(op, value, ("float32",), index)
        _batch_matrices(op, x)
        kept = list(x.shape)
        kept[axis] = 1
        for index, value in ((1, y), (2, dy)):
            if value.size != math.prod(kept):
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' has {value.size} elements, expected {math.prod(kept)} for "
                    f"X '{op.inputs[0]}' of shape {list(x.shape)}"
                )
        hit = x.astype(dy.dtype) == y.reshape(kept).astype(dy.dtype)
        return jnp.where(hit, dy.reshape(kept), jnp.zeros((), dy.dtype))

    return kernel


@register("SumSqrElements", gradient=NO_GRADIENT)
def sum_sqr_elements(op: Op) -> Kernel:
    """The sum of squares as a 0-d scalar (float or double); `average` multiplies it by the FLOAT
    `1/numel`, also for doubles (reduction_ops.h: math::Scale<float, T>), and not when X is empty."""
    average = op.bool("average", False)

    def kernel(x):
        require_dtype(op, x, ("float32", "float64"))
        total = jnp.sum(jnp.square(x), dtype=x.dtype)
        if average and x.size:
            total = total * jnp.asarray(np.float32(1.0) / np.float32(x.size), x.dtype)
        return total

    return kernel


@register("SumElementsInt", gradient=should_not_do_gradient)
def sum_elements_int(op: Op) -> Kernel:
    """The int32 sum of an int32 tensor as a 0-d scalar (wrapping on overflow, as C++ does)."""

    def kernel(x):
        require_dtype(op, x, ("int32",))
        return jnp.sum(x, dtype=jnp.int32)

    return kernel


# ---------------------------------------------------------------------------------------------------
# Moments, BatchMoments (caffe2/operators/moments_op.{h,cc}, batch_moments_op.{h,cc})


def _moments_dims(op: Op, axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """Moments does not canonicalise `axes`: a negative axis is refused (moments_op.h); an axis named
    twice counts once."""
    if not axes:
        return tuple(range(ndim))
    dims = sorted(set(axes))
    if dims[0] < 0 or dims[-1] >= ndim:
        raise ShapeError(f"{op.where}: argument 'axes' = {list(axes)} must lie in [0, {ndim}) (no negative axes)")
    return tuple(dims)


@register("Moments", outputs=2, gradient=single_gradient("MomentsGradient", "GO(0) GO(1) I(0) O(0)"))
def moments(op: Op) -> Kernel:
    """`X -> (mean, variance)` over `axes` (the biased variance), float only; an empty reduction gives
    0 and 0 (math::Moments)."""
    axes = op.ints("axes", ())
    keepdims = op.bool("keepdims", True)

    def kernel(x):
        require_dtype(op, x, ("float32",))
        dims = _moments_dims(op, axes, x.ndim)
        shape = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
        out = shape if keepdims else tuple(d for i, d in enumerate(x.shape) if i not in dims)
        count = math.prod(x.shape[i] for i in dims)
        if count == 0:
            return jnp.zeros(out, x.dtype), jnp.zeros(out, x.dtype)
        mean = jnp.mean(x, axis=dims, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=dims, keepdims=True)
        return mean.reshape(out), var.reshape(out)

    return kernel


@register("MomentsGradient", inputs=4)
def moments_gradient(op: Op) -> Kernel:
    """`(dmean, dvariance, X, mean) -> dX = (dmean + 2·(X - mean)·dvariance)·numel(dmean)/numel(X)`."""
    axes = op.ints("axes", ())
    op.bool("keepdims", True)

    def kernel(dmean, dvar, x, mean):
        require_dtype(op, dmean, ("float32",))
        dims = _moments_dims(op, axes, x.ndim)
        kept = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
        for index, value in ((0, dmean), (1, dvar), (3, mean)):
            if value.size != math.prod(kept):
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' has shape {list(value.shape)}, which does not match X "
                    f"'{op.inputs[2]}' of shape {list(x.shape)} reduced over axes {list(dims)}"
                )
        dm, dv, m = (v.reshape(kept).astype(dmean.dtype) for v in (dmean, dvar, mean))
        grad = dm + 2 * (x.astype(dmean.dtype) - m) * dv
        return grad * _ratio(math.prod(kept), x.size, dmean.dtype)

    return kernel


def storage_order(op: Op) -> bool:
    """The `order` argument ("NCHW", the default, or "NHWC"): True for NCHW."""
    order = op.str("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise BadArgumentError(f'{op.where}: argument \'order\' = {order!r} must be "NCHW" or "NHWC"')
    return order == "NCHW"


def channel_view(op: Op, x: jax.Array, nchw: bool, min_ndim: int = 2) -> tuple[jax.Array, int, int, int]:
    """X as `[N, C, HxW]` (NCHW) or `[N, HxW, C]` (NHWC), with (N, C, HxW). Caffe2 divides by N·C to
    find HxW, so an input without channels or samples crashes it: refused here."""
    if x.ndim < min_ndim:
        raise ShapeError(f"{op.where}: {op.type} needs an input of rank >= {min_ndim}, got shape {list(x.shape)}")
    n = x.shape[0]
    c = x.shape[1] if nchw else x.shape[-1]
    if n * c == 0:
        raise ShapeError(f"{op.where}: {op.type} needs samples and channels, got shape {list(x.shape)}")
    hxw = x.size // (n * c)
    return (x.reshape(n, c, hxw) if nchw else x.reshape(n, hxw, c)), n, c, hxw


@register("BatchMoments", outputs=2, gradient=single_gradient("BatchMomentsGradient", "GO(0) GO(1) I(0)"))
def batch_moments(op: Op) -> Kernel:
    """`X -> (mu, var)` per channel: the mean of X and the mean of X² (not the variance) over N and
    HxW, float only; no spatial positions give NaN, as Caffe2's 0/0 (batch_moments_op.cc)."""
    nchw = storage_order(op)

    def kernel(x):
        require_dtype(op, x, ("float32",))
        view, _, c, hxw = channel_view(op, x, nchw)
        axes = (0, 2) if nchw else (0, 1)
        if hxw == 0:
            nan = jnp.full((c,), jnp.nan, x.dtype)
            return nan, nan
        return jnp.mean(view, axis=axes), jnp.mean(jnp.square(view), axis=axes)

    return kernel


@register("BatchMomentsGradient", inputs=3)
def batch_moments_gradient(op: Op) -> Kernel:
    """`(dmu, dvar, X) -> dX = (dmu + 2·X·dvar) / (N·HxW)`, per channel."""
    nchw = storage_order(op)

    def kernel(dmu, dvar, x):
        require_dtype(op, dmu, ("float32",))
        view, n, c, hxw = channel_view(op, x, nchw)
        for index, value in ((0, dmu), (1, dvar)):
            if value.size != c:
                raise ShapeError(f"{op.where}: '{op.inputs[index]}' has {value.size} elements, expected {c}")
        shape = (1, c, 1) if nchw else (1, 1, c)
        grad = dmu.reshape(shape) + 2 * view.astype(dmu.dtype) * dvar.reshape(shape)
        return (grad * jnp.asarray(np.float32(1) / np.float32(max(n * hxw, 1)), dmu.dtype)).reshape(x.shape)

    return kernel


@register("Summarize", outputs=(0, 1), gradient=should_not_do_gradient)
def summarize(op: Op) -> Kernel:
    """`X -> [min, max, mean, std]` of a non-empty float tensor, the standard deviation unbiased (0 for
    one element), caffe2/operators/summarize_op.cc. `to_file=1` (writing the figures to a file in the
    workspace folder) is a side effect rnn2jax does not reproduce: refused."""
    if op.int("to_file", 0):
        raise BadArgumentError(f"{op.where}: Summarize with to_file=1 writes a file: not supported")

    def kernel(x):
        require_dtype(op, x, ("float32",))
        if x.size == 0:
            raise ShapeError(f"{op.where}: Summarize of an empty '{op.inputs[0]}'")
        flat = x.reshape(-1)
        mean = jnp.sum(flat) / np.float32(x.size)
        if x.size == 1:
            std = jnp.zeros((), x.dtype)
        else:
            std = jnp.sqrt(jnp.sum(jnp.square(flat - mean)) / np.float32(x.size - 1))
        return jnp.stack([jnp.min(flat), jnp.max(flat), mean, std])

    return kernel
