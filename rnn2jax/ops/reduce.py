"""Reductions: Reduce{Front,Back}{Sum,Mean} (with Caffe2's `lengths` quirk), ReduceSum/Mean, SumElements.

RNN nets use them to pool over time and to turn a loss into a scalar; the front/back ops view the
input as a matrix and reduce its leading or trailing dims, optionally only over a prefix per column/row.
"""

from __future__ import annotations

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
    num = op.int("num_reduce_dim", 1)
    if num < 0:
        raise BadArgumentError(f"{op.where}: argument 'num_reduce_dim' = {num} must not be negative")
    with_lengths = len(op.inputs) == 2
    if with_lengths and num != 1:
        raise BadArgumentError(
            f"{op.where}: with a lengths input, argument 'num_reduce_dim' must be 1, got {num}"
        )

    def kernel(x, lengths=None):
        if num > x.ndim:
            raise ShapeError(
                f"{op.where}: argument 'num_reduce_dim' = {num} is out of range for an input of rank {x.ndim}"
            )
        split = num if front else x.ndim - num
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


def _lengths(op: Op, lengths: jax.Array, groups: int) -> jax.Array:
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ShapeError(
            f"{op.where}: lengths '{op.inputs[1]}' must be integers (int32), got {lengths.dtype}"
        )
    if lengths.size != groups:
        raise ShapeError(
            f"{op.where}: lengths '{op.inputs[1]}' has {lengths.size} elements, expected {groups} "
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
    """Caffe2's float `numerator / denominator`; NaN for an empty input (Caffe2 gets 0 * inf there)."""
    if not denominator:
        return jnp.asarray(np.nan, dtype)
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
