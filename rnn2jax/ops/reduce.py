"""Reductions: Reduce{Front,Back}{Sum,Mean} (with Caffe2's `lengths` quirk), ReduceSum/Mean, SumElements,
and their gradient ops.

RNN nets use them to pool over time and to turn a loss into a scalar; the front/back ops view the
input as a matrix and reduce its leading or trailing dims, optionally only over a prefix per column/row.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..netdef import Op
from .common import canonical_axis, size_from_dim, size_to_dim
from .registry import Kernel, register

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
            return _finish(jnp.sum(groups, axis=1), reduced, mean).reshape(out_shape)
        counts = _lengths(op, lengths, kept)
        position = jnp.arange(reduced, dtype=jnp.int32)
        keep = (position < counts[:, None]) | (position == 0)
        total = jnp.sum(jnp.where(keep, groups, jnp.zeros((), x.dtype)), axis=1)
        return _finish(total, counts, mean).reshape(out_shape)

    return kernel


def _num_reduce_dim(op: Op, with_lengths: bool) -> int:
    num = op.int("num_reduce_dim", 1)
    if num < 0:
        raise BadArgumentError(f"{op.where}: argument 'num_reduce_dim' = {num} must not be negative")
    if with_lengths and num != 1:
        raise BadArgumentError(
            f"{op.where}: with a lengths input, argument 'num_reduce_dim' must be 1, got {num}"
        )
    return num


def _split(op: Op, num: int, front: bool, ndim: int) -> int:
    """Where the matrix view splits the dims: after the first `num` (front) or before the last."""
    if num > ndim:
        raise ShapeError(
            f"{op.where}: argument 'num_reduce_dim' = {num} is out of range for an input of rank {ndim}"
        )
    return num if front else ndim - num


@register(*(f"{name}Gradient" for name in _FRONT_BACK), inputs=(2, 3))
def reduce_front_back_gradient(op: Op) -> Kernel:
    """`(dY, X[, lengths]) -> dX`: X only gives dX its shape. Each output element's gradient goes
    back to the entries it reduced (divided by the count for a mean); with `lengths` only entries
    `0 .. lengths[j]-1` get it, so unlike the forward's quirk a length of 0 gives entry 0 nothing,
    and a mean divides by the length as given (caffe2/operators/reduce_front_back_{sum,mean}_ops.cc).
    Pre-2018 nets passed X's shape as an int64 vector instead of X; that form is not supported."""
    front, mean = _FRONT_BACK[op.type.removesuffix("Gradient")]
    num = _num_reduce_dim(op, with_lengths=len(op.inputs) == 3)

    def kernel(dy, x, lengths=None):
        split = _split(op, num, front, x.ndim)
        rows, cols = size_to_dim(x.shape, split), size_from_dim(x.shape, split)
        kept, reduced = (cols, rows) if front else (rows, cols)
        if dy.size != kept:
            raise ShapeError(
                f"{op.where}: dY '{op.inputs[0]}' has {dy.size} elements, expected {kept} (one per "
                f"output element for X '{op.inputs[1]}' of shape {list(x.shape)})"
            )
        counts = None if lengths is None else _lengths(op, lengths, kept, index=2)[:, None]
        if x.size == 0:
            return jnp.zeros(x.shape, dy.dtype)
        column = dy.reshape(kept, 1)
        if counts is None:
            groups = jnp.broadcast_to(_finish(column, reduced, mean), (kept, reduced))
        else:
            inside = jnp.arange(reduced, dtype=jnp.int32) < counts
            safe = jnp.maximum(counts, 1)  # a count below 1 leaves nothing inside to divide
            groups = jnp.where(inside, _finish(column, safe, mean), jnp.zeros((), dy.dtype))
        return (groups.T if front else groups).reshape(x.shape)

    return kernel


def _lengths(op: Op, lengths: jax.Array, groups: int, index: int = 1) -> jax.Array:
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ShapeError(
            f"{op.where}: lengths '{op.inputs[index]}' must be integers (int32), got {lengths.dtype}"
        )
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


@register("SumElements")
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
            raise ShapeError(
                f"{op.where}: dY '{op.inputs[1]}' must hold one element, got shape {list(dy.shape)}"
            )
        value = dy.reshape(())
        if average and x.size:
            value = value / jnp.asarray(x.size, dy.dtype)
        return jnp.broadcast_to(value, x.shape)

    return kernel
