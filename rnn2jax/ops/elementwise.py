"""Elementwise arithmetic: Add/Sub/Mul/Div with Caffe2's two broadcasting modes, Sum, Scale, Clip and
the unary math ops that RNN cells and their gradient nets are built from."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..netdef import Op
from .common import canonical_dtype
from .registry import Kernel, register

# Caffe2's `NumericTypes` (elementwise_ops.h); the float-only ops also run on CUDA half.
NUMERIC = frozenset(np.dtype(t) for t in (np.int32, np.int64, np.float32, np.float64))
_FLOATING = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _check_dtypes(op: Op, arrays: Sequence[jax.Array], allowed: frozenset[np.dtype], kind: str) -> None:
    """Caffe2 dispatches on the first input's type among `allowed`; the others must match it."""
    dtypes = [canonical_dtype(a.dtype) for a in arrays]
    for name, dtype in zip(op.inputs, dtypes, strict=False):
        if dtype not in allowed:
            raise ShapeError(
                f"{op.where}: input '{name}' has dtype {dtype}; {op.type} supports {kind} tensors"
            )
    if len(set(dtypes)) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in zip(op.inputs, dtypes, strict=False))
        raise ShapeError(f"{op.where}: {op.type} inputs must share one dtype, got {listed}")


# --------------------------------------------------------------------------------------------------
# Binary arithmetic


def _legacy_axis(op: Op) -> int:
    """The broadcast axis of legacy mode: `axis`, or the position of `axis_str` in `order`, or -1
    (match B against A's trailing dims). Mirrors BinaryElementwiseWithArgsOp's constructor."""
    axis = op.int("axis", -1)
    axis_str = op.str("axis_str", "")
    order = op.str("order", "NCHW")
    if axis != -1:
        if axis_str:
            raise BadArgumentError(f"{op.where}: arguments 'axis' and 'axis_str' cannot be used together")
        return axis
    if not axis_str:
        return -1
    if len(axis_str) != 1 or axis_str not in order:
        raise BadArgumentError(
            f"{op.where}: argument 'axis_str' = {axis_str!r} is not a single letter of order {order!r}"
        )
    return order.index(axis_str)


def _legacy_b_shape(op: Op, a_shape: tuple[int, ...], b_shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """The shape to view B as so that NumPy broadcasting against A does Caffe2's legacy broadcast
    (elementwise_ops_utils.cc ComputeLegacyBroadcastSizes): B without its leading and trailing
    size-1 dims must equal A's dims starting at `axis` + (number of leading 1s stripped); A is then
    `pre x n x post` and B is `n`, repeated over pre and post. A B of one element is a scalar."""
    if math.prod(b_shape) == 1:
        return ()
    a_name, b_name = op.inputs[0], op.inputs[1]
    if len(b_shape) > len(a_shape):
        raise ShapeError(
            f"{op.where}: with broadcast=1, '{b_name}' {list(b_shape)} may not have more dims than "
            f"'{a_name}' {list(a_shape)}"
        )
    if axis == -1:
        axis = len(a_shape) - len(b_shape)
    if not 0 <= axis <= len(a_shape) - len(b_shape):
        raise ShapeError(
            f"{op.where}: broadcast axis {axis} is outside [0, {len(a_shape) - len(b_shape)}] for "
            f"'{a_name}' {list(a_shape)} and '{b_name}' {list(b_shape)}"
        )
    start = 0
    while start < len(b_shape) and b_shape[start] == 1:
        start += 1
    end = len(b_shape)
    while end > start and b_shape[end - 1] == 1:
        end -= 1
    core = b_shape[start:end]
    first = axis + start
    if tuple(a_shape[first : first + len(core)]) != core:
        raise ShapeError(
            f"{op.where}: broadcast dimension mismatch: '{b_name}' {list(b_shape)} does not match "
            f"'{a_name}' {list(a_shape)} at axis {axis}"
        )
    return (*core, *(1,) * (len(a_shape) - first - len(core)))


def _numpy_shape(op: Op, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(a_shape, b_shape))
    except ValueError:
        raise ShapeError(
            f"{op.where}: '{op.inputs[0]}' {list(a_shape)} and '{op.inputs[1]}' {list(b_shape)} do not "
            "broadcast (numpy rules, broadcast=0); old nets set broadcast=1 for Caffe2's legacy mode"
        ) from None


def binary(
    op: Op,
    fn: Callable[[jax.Array, jax.Array], jax.Array],
    allowed: frozenset[np.dtype] = NUMERIC,
    kind: str = "int32, int64, float and double",
) -> Kernel:
    """A two-input op with Caffe2's broadcasting (Add/Sub/Mul/Div, comparisons, logical ops):
    `broadcast`=0 is NumPy broadcasting, 1 the legacy suffix/axis broadcast whose output has A's shape.
    `axis`/`axis_str`/`order` matter only in legacy mode. Both inputs must have one dtype of `allowed`."""
    legacy = op.bool("broadcast", False)
    axis = _legacy_axis(op) if legacy else -1

    def kernel(a, b):
        _check_dtypes(op, (a, b), allowed, kind)
        if legacy:
            b_view = jnp.reshape(b, _legacy_b_shape(op, a.shape, b.shape, axis))
            a, b = jnp.asarray(a), jnp.broadcast_to(b_view, a.shape)
        else:
            shape = _numpy_shape(op, a.shape, b.shape)
            a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
        return fn(a, b)

    return kernel


def _divide(a: jax.Array, b: jax.Array) -> jax.Array:
    """Integer Div is C++ `/`: truncates toward zero (lax.div), unlike Python's floor division."""
    if jnp.issubdtype(a.dtype, jnp.integer):
        return jax.lax.div(a, b)
    return a / b


@register("Add", inputs=2)
def add(op: Op) -> Kernel:
    return binary(op, jnp.add)


@register("Sub", inputs=2)
def sub(op: Op) -> Kernel:
    return binary(op, jnp.subtract)


@register("Mul", inputs=2)
def mul(op: Op) -> Kernel:
    return binary(op, jnp.multiply)


@register("Div", inputs=2)
def div(op: Op) -> Kernel:
    return binary(op, _divide)


# --------------------------------------------------------------------------------------------------
# Sum, Scale, Clip


@register("Sum", inputs=(1, None))
def sum_(op: Op) -> Kernel:
    """`Sum(x0, x1, ...)`: all inputs must have x0's shape (no broadcasting); one input is a copy."""

    def kernel(*xs):
        if len(xs) == 1:
            return jnp.asarray(xs[0])
        _check_dtypes(op, xs, NUMERIC, "int32, int64, float and double")
        for name, x in zip(op.inputs[1:], xs[1:], strict=True):
            if x.shape != xs[0].shape:
                raise ShapeError(
                    f"{op.where}: input '{name}' {list(x.shape)} must have the shape of "
                    f"'{op.inputs[0]}' {list(xs[0].shape)}"
                )
        return functools.reduce(jnp.add, xs)

    return kernel


@register("Scale")
def scale(op: Op) -> Kernel:
    """`Y = scale·X`, `scale` (1.0) a float applied in X's float type."""
    factor = op.float("scale", 1.0)

    def kernel(x):
        _check_dtypes(op, (x,), _FLOATING, "float")
        return x * jnp.asarray(factor, x.dtype)

    return kernel


_FLOAT_LOWEST = float(np.finfo(np.float32).min)
_FLOAT_MAX = float(np.finfo(np.float32).max)


@register("Clip")
def clip(op: Op) -> Kernel:
    """`Y = min(max(X, min), max)`; `min`/`max` default to the lowest/largest float
    (caffe2/operators/clip_op.h). With min > max every element becomes max, as in Caffe2."""
    low = op.float("min", _FLOAT_LOWEST)
    high = op.float("max", _FLOAT_MAX)

    def kernel(x):
        _check_dtypes(op, (x,), _FLOATING, "float")
        return jnp.minimum(jnp.maximum(x, jnp.asarray(low, x.dtype)), jnp.asarray(high, x.dtype))

    return kernel


# --------------------------------------------------------------------------------------------------
# Unary math


def unary(op: Op, fn: Callable[[jax.Array], jax.Array], allowed: frozenset[np.dtype], kind: str) -> Kernel:
    def kernel(x):
        _check_dtypes(op, (x,), allowed, kind)
        return fn(x)

    return kernel


@register("Negative")
def negative(op: Op) -> Kernel:
    return unary(op, jnp.negative, NUMERIC, "int32, int64, float and double")


@register("Abs")
def abs_(op: Op) -> Kernel:
    return unary(op, jnp.abs, _FLOATING, "float")


@register("Exp")
def exp(op: Op) -> Kernel:
    return unary(op, jnp.exp, _FLOATING, "float")


@register("Log")
def log(op: Op) -> Kernel:
    return unary(op, jnp.log, _FLOATING, "float")


@register("Sqrt")
def sqrt(op: Op) -> Kernel:
    return unary(op, jnp.sqrt, _FLOATING, "float")
