"""Nonlinearities: the elementwise activations RNN cells use, and Caffe2's 2-D-coerced Softmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..netdef import Op
from .common import canonical_axis, size_from_dim, size_to_dim
from .registry import Kernel, register


@register("Sigmoid")
def sigmoid(op: Op) -> Kernel:
    return jax.nn.sigmoid


@register("Tanh")
def tanh(op: Op) -> Kernel:
    return jnp.tanh


@register("Relu")
def relu(op: Op) -> Kernel:
    return lambda x: jnp.maximum(x, jnp.zeros((), x.dtype))


@register("LeakyRelu")
def leaky_relu(op: Op) -> Kernel:
    """`alpha` (0.01, caffe2/operators/leaky_relu_op.h) is the slope for negative inputs; the formula
    is Caffe2's `max(x, 0) + min(x, 0) * alpha`."""
    alpha = op.float("alpha", 0.01)

    def kernel(x):
        zero = jnp.zeros((), x.dtype)
        return jnp.maximum(x, zero) + jnp.minimum(x, zero) * jnp.asarray(alpha, x.dtype)

    return kernel


@register("Softsign")
def softsign(op: Op) -> Kernel:
    return lambda x: x / (1 + jnp.abs(x))


@register("Softmax")
def softmax(op: Op) -> Kernel:
    """Caffe2 views X as `size_to_dim(axis) x size_from_dim(axis)` and normalises each row, so with
    axis=1 on a 3-D input the softmax runs over the last two dims together, not over one axis."""
    axis = op.int("axis", 1)

    def kernel(x):
        k = canonical_axis(op, axis, x.ndim)
        if x.size == 0:
            return x
        rows = x.reshape(size_to_dim(x.shape, k), size_from_dim(x.shape, k))
        shifted = rows - jnp.max(rows, axis=1, keepdims=True)
        e = jnp.exp(shifted)
        return (e / jnp.sum(e, axis=1, keepdims=True)).reshape(x.shape)

    return kernel
