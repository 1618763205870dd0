"""Nonlinearities: the elementwise activations RNN cells use, Caffe2's 2-D-coerced Softmax, and the
gradient ops that Caffe2's backward nets run for them."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ..errors import ShapeError
from ..netdef import Op
from .common import canonical_axis, size_from_dim, size_to_dim
from .elementwise import FLOATING, unary
from .registry import Kernel, register

# Caffe2's CPU build registers every op here, and its gradient, for float32 only ("Unsupported type of
# tensor" / "Tensor type mismatch" otherwise). Integers are refused here too; other float types are
# accepted on purpose (float64 for rnn2jax's verification mode, rnn2jax/verify.py).


@register("Sigmoid")
def sigmoid(op: Op) -> Kernel:
    return unary(op, jax.nn.sigmoid, FLOATING, "float")


@register("Tanh")
def tanh(op: Op) -> Kernel:
    return unary(op, jnp.tanh, FLOATING, "float")


@register("Relu")
def relu(op: Op) -> Kernel:
    return unary(op, lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)), FLOATING, "float")


@register("LeakyRelu")
def leaky_relu(op: Op) -> Kernel:
    """`alpha` (0.01, caffe2/operators/leaky_relu_op.h) is the slope for negative inputs; the formula
    is Caffe2's `max(x, 0) + min(x, 0) * alpha`."""
    alpha = op.float("alpha", 0.01)

    def fn(x):
        zero = jnp.zeros((), x.dtype)
        return jnp.maximum(x, zero) + jnp.minimum(x, zero) * jnp.asarray(alpha, x.dtype)

    return unary(op, fn, FLOATING, "float")


@register("Softsign")
def softsign(op: Op) -> Kernel:
    return unary(op, lambda x: x / (1 + jnp.abs(x)), FLOATING, "float")


@register("Softmax")
def softmax(op: Op) -> Kernel:
    """Caffe2 views X as `size_to_dim(axis) x size_from_dim(axis)` and normalises each row, so with
    axis=1 on a 3-D input the softmax runs over the last two dims together, not over one axis."""
    axis = op.int("axis", 1)

    def kernel(x):
        _require_float(op, x, 0)
        k = canonical_axis(op, axis, x.ndim)
        if x.size == 0:
            return x
        rows = x.reshape(size_to_dim(x.shape, k), size_from_dim(x.shape, k))
        shifted = rows - jnp.max(rows, axis=1, keepdims=True)
        e = jnp.exp(shifted)
        return (e / jnp.sum(e, axis=1, keepdims=True)).reshape(x.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# Gradients: each takes the forward output Y (Softsign: the input X) and dY, both float and of one
# shape (Caffe2 registers them for float only and indexes both by the first input's size).


def _require_float(op: Op, value: jax.Array, index: int) -> None:
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise ShapeError(f"{op.where}: {op.type} takes float inputs, '{op.inputs[index]}' is {value.dtype}")


def _grad_pair(op: Op, first: jax.Array, dy: jax.Array) -> None:
    for index, value in enumerate((first, dy)):
        _require_float(op, value, index)
    if first.shape != dy.shape:
        raise ShapeError(
            f"{op.where}: {op.type} needs '{op.inputs[0]}' and '{op.inputs[1]}' of one shape, got "
            f"{list(first.shape)} and {list(dy.shape)}"
        )


def _elementwise_gradient(op: Op, formula: Callable[[jax.Array, jax.Array], jax.Array]) -> Kernel:
    def kernel(first, dy):
        _grad_pair(op, first, dy)
        return formula(first, dy)

    return kernel


@register("SigmoidGradient", inputs=2)
def sigmoid_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY * Y * (1 - Y)`."""
    return _elementwise_gradient(op, lambda y, dy: dy * y * (1 - y))


@register("TanhGradient", inputs=2)
def tanh_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY * (1 - Y^2)`."""
    return _elementwise_gradient(op, lambda y, dy: dy * (1 - y * y))


@register("ReluGradient", inputs=2)
def relu_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY where Y > 0, else 0` (so 0 at Y == 0)."""
    return _elementwise_gradient(op, lambda y, dy: jnp.where(y > 0, dy, jnp.zeros((), dy.dtype)))


@register("LeakyReluGradient", inputs=2)
def leaky_relu_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY where Y >= 0, else alpha * dY` (caffe2/operators/leaky_relu_op.cc: the test is
    on Y and includes 0). Caffe2 only needs Y and dY to have one size; dX is shaped like Y."""
    alpha = op.float("alpha", 0.01)

    def kernel(y, dy):
        if dy.size != y.size:
            raise ShapeError(
                f"{op.where}: LeakyReluGradient needs '{op.inputs[0]}' and '{op.inputs[1]}' of one size, "
                f"got {list(y.shape)} and {list(dy.shape)}"
            )
        dy = dy.reshape(y.shape)
        _grad_pair(op, y, dy)
        return jnp.where(y >= 0, dy, dy * jnp.asarray(alpha, dy.dtype))

    return kernel


@register("SoftsignGradient", inputs=2)
def softsign_gradient(op: Op) -> Kernel:
    """`(X, dY) -> dY / (1 + |X|)^2`: Softsign's maker passes the forward INPUT, not its output."""
    return _elementwise_gradient(op, lambda x, dy: dy * (1 / jnp.square(1 + jnp.abs(x))))


@register("SoftmaxGradient", inputs=2)
def softmax_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> Y * (dY - sum(dY * Y))`, the sum over each row of the same 2-D view as Softmax
    (`size_to_dim(axis) x size_from_dim(axis)`)."""
    axis = op.int("axis", 1)

    def kernel(y, dy):
        _grad_pair(op, y, dy)
        k = canonical_axis(op, axis, y.ndim)
        if y.size == 0:
            return jnp.zeros_like(y)
        shape = (size_to_dim(y.shape, k), size_from_dim(y.shape, k))
        rows, drows = y.reshape(shape), dy.reshape(shape)
        dot = jnp.sum(rows * drows, axis=1, keepdims=True)
        return ((drows - dot) * rows).reshape(y.shape)

    return kernel
