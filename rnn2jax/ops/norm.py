"""Normalisation and regularisation: LayerNorm (used by the LayerNorm LSTM cells) and Dropout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..netdef import Op
from .common import canonical_axis, size_from_dim, size_to_dim
from .registry import Kernel, register


@register("LayerNorm", inputs=(1, 3), outputs=3)
def layer_norm(op: Op) -> Kernel:
    """`(X[, gamma, beta]) -> (Y, mean, std)`: each row of X viewed as `size_to_dim(axis) x
    size_from_dim(axis)` is normalised with its mean and biased variance; mean and std keep the
    leading dims plus a trailing 1 (caffe2/operators/layer_norm_op.h)."""
    axis = op.int("axis", 1)
    epsilon = op.float("epsilon", 1e-5)
    affine = op.bool("elementwise_affine", False)
    if affine and len(op.inputs) != 3:
        raise BadArgumentError(
            f"{op.where}: elementwise_affine=1 needs inputs (X, gamma, beta), got {len(op.inputs)} input(s)"
        )

    def kernel(x, gamma=None, beta=None):
        if x.ndim < 2:
            raise ShapeError(f"{op.where}: LayerNorm needs an input of rank >= 2, got shape {x.shape}")
        _require_float(op, x)
        k = canonical_axis(op, axis, x.ndim)
        n = size_from_dim(x.shape, k)
        rows = x.reshape(size_to_dim(x.shape, k), n)
        mean = jnp.mean(rows, axis=1, keepdims=True)
        centred = rows - mean
        var_eps = jnp.mean(centred * centred, axis=1, keepdims=True) + jnp.asarray(epsilon, x.dtype)
        y = centred * jax.lax.rsqrt(var_eps)
        if affine:
            y = y * _affine_param(op, 1, gamma, n) + _affine_param(op, 2, beta, n)
        stat_shape = (*x.shape[:k], 1)
        return y.reshape(x.shape), mean.reshape(stat_shape), jnp.sqrt(var_eps).reshape(stat_shape)

    return kernel


def _affine_param(op: Op, index: int, value: jax.Array, n: int) -> jax.Array:
    """gamma (input 1) or beta (input 2): any shape with one value per element of a normalised row."""
    if value.size != n:
        what = ("gamma", "beta")[index - 1]
        raise ShapeError(
            f"{op.where}: {what} '{op.inputs[index]}' has {value.size} elements but each normalised row "
            f"has {n}"
        )
    return value.reshape(n)


def _require_float(op: Op, x: jax.Array) -> None:
    """Caffe2 runs these ops on float data only; on integers the arithmetic here would truncate."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ShapeError(f"{op.where}: {op.type} takes a float input '{op.inputs[0]}', got {x.dtype}")


@register("Dropout", outputs=(1, 2), random=True)
def dropout(op: Op) -> Kernel:
    """`X -> (Y, mask)`. Training keeps each element with probability `1 - ratio` and scales kept ones
    by `1/(1 - ratio)`; test mode is the identity (mask all true, which Caffe2 leaves unwritten).
    Caffe2's constructor enforces `0 <= ratio < 1` (caffe2/operators/dropout_op.h)."""
    ratio = op.float("ratio", 0.5)
    is_test = op.int("is_test", 0) != 0
    if not 0.0 <= ratio < 1.0:
        raise BadArgumentError(f"{op.where}: argument 'ratio' = {ratio} must be in [0, 1)")
    scale = np.float32(1.0 / (1.0 - ratio))  # computed in double, stored as float, as in Caffe2

    def kernel(x, *, key: jax.Array | None = None):
        _require_float(op, x)
        if is_test:
            return x, jnp.ones(x.shape, jnp.bool_)
        if key is None:
            raise BadArgumentError(f"{op.where}: Dropout in training mode needs a PRNG key")
        mask = jax.random.bernoulli(key, 1.0 - ratio, x.shape)
        return x * jnp.asarray(scale, x.dtype) * mask.astype(x.dtype), mask

    return kernel
