"""Normalisation and regularisation: LayerNorm (used by the LayerNorm LSTM cells) and Dropout, with
the gradient ops Caffe2's backward nets run for them."""

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
    epsilon = op.float("epsilon", float(np.float32(1e-5)))  # Caffe2's default is the float 1e-5f
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
        if n == 0:  # Caffe2: empty rows have mean 0 and variance 0 (so std = sqrt(epsilon))
            mean = jnp.zeros((rows.shape[0], 1), x.dtype)
            var_eps = jnp.full((rows.shape[0], 1), epsilon, x.dtype)
        else:
            mean = jnp.mean(rows, axis=1, keepdims=True)
            var_eps = jnp.mean(jnp.square(rows - mean), axis=1, keepdims=True) + jnp.asarray(epsilon, x.dtype)
        centred = rows - mean
        y = centred * jax.lax.rsqrt(var_eps)
        if affine:
            y = y * _affine_param(op, 1, gamma, n) + _affine_param(op, 2, beta, n)
        stat_shape = (*x.shape[:k], 1)
        return y.reshape(x.shape), mean.reshape(stat_shape), jnp.sqrt(var_eps).reshape(stat_shape)

    return kernel


def _affine_param(op: Op, index: int, value: jax.Array, n: int, what: str = "") -> jax.Array:
    """gamma (input 1) or beta (input 2): any shape with one value per element of a normalised row."""
    if value.size != n:
        what = what or ("gamma", "beta")[index - 1]
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
    """`X -> (Y, mask)`, X a float tensor. Training keeps each element with probability `1 - ratio` and
    scales kept ones by `1/(1 - ratio)`; test mode is the identity (mask all true, which Caffe2 leaves
    unwritten). Caffe2's constructor enforces `0 <= ratio < 1` (caffe2/operators/dropout_op.h), its
    schema requires the `is_test` argument (ArgIsTest), and training writes the mask output, so
    Caffe2 fails (std::out_of_range) without one: refused here with a clear error."""
    if not op.has("is_test"):
        raise BadArgumentError(f"{op.where}: Dropout requires the argument 'is_test' (0 to train, 1 for inference)")
    ratio, is_test, scale = _dropout_args(op)
    if not is_test and len(op.outputs) != 2:
        raise BadArgumentError(f"{op.where}: Dropout with is_test=0 writes (Y, mask): it needs the mask output")

    def kernel(x, *, key: jax.Array | None = None):
        _require_float(op, x)  # Caffe2: float32 only; doubles kept for rnn2jax's float64 mode
        if is_test:
            return x, jnp.ones(x.shape, jnp.bool_)
        if key is None:
            raise BadArgumentError(f"{op.where}: Dropout in training mode needs a PRNG key")
        mask = jax.random.bernoulli(key, 1.0 - ratio, x.shape)
        return x * jnp.asarray(scale, x.dtype) * mask.astype(x.dtype), mask

    return kernel


def _dropout_args(op: Op) -> tuple[float, bool, np.float32]:
    """(ratio, is_test, 1/(1 - ratio)); Dropout and DropoutGrad both enforce `0 <= ratio < 1`."""
    ratio = op.float("ratio", 0.5)
    is_test = op.int("is_test", 0) != 0
    if not 0.0 <= ratio < 1.0:
        raise BadArgumentError(f"{op.where}: argument 'ratio' = {ratio} must be in [0, 1)")
    return ratio, is_test, np.float32(1.0 / (1.0 - ratio))  # computed in double, stored as float


@register("DropoutGrad", inputs=(1, 2))
def dropout_grad(op: Op) -> Kernel:
    """`(dY[, mask]) -> dX`: `dY * mask / (1 - ratio)` in training; with `is_test` a copy of dY (the
    maker then passes no mask, and a given one is not read), caffe2/operators/dropout_op.cc."""
    _, is_test, scale = _dropout_args(op)
    if not is_test and len(op.inputs) != 2:
        raise BadArgumentError(f"{op.where}: DropoutGrad with is_test=0 takes (dY, mask), got only dY")

    def kernel(dy, mask=None):
        _require_float(op, dy)
        if is_test:
            return dy
        if mask.dtype != jnp.bool_ or mask.size != dy.size:
            raise ShapeError(
                f"{op.where}: mask '{op.inputs[1]}' must be a bool tensor of {dy.size} elements (like dY), "
                f"got {mask.dtype}{list(mask.shape)}"
            )
        return dy * mask.reshape(dy.shape).astype(dy.dtype) * jnp.asarray(scale, dy.dtype)

    return kernel


@register("LayerNormGradient", inputs=(5, 6), outputs=(1, 3))
def layer_norm_gradient(op: Op) -> Kernel:
    """`(dY, Y, mean, std, X[, gamma]) -> dX[, dgamma, dbeta]`, the exact backward of LayerNorm given its
    saved statistics (Y and `epsilon` are not read: std already includes epsilon). Like Caffe2
    (caffe2/operators/layer_norm_op.{h,cc}), `elementwise_affine` decides whether gamma is read and
    dgamma/dbeta are written; both are shaped like gamma."""
    axis = op.int("axis", 1)
    op.float("epsilon", 1e-5)
    affine = op.bool("elementwise_affine", False)
    if affine and len(op.inputs) != 6:
        raise BadArgumentError(
            f"{op.where}: elementwise_affine=1 needs inputs (dY, Y, mean, std, X, gamma), "
            f"got {len(op.inputs)} input(s)"
        )
    if not affine and len(op.outputs) > 1:
        raise BadArgumentError(
            f"{op.where}: LayerNormGradient writes dgamma and dbeta only with elementwise_affine=1"
        )

    def kernel(dy, y, mean, std, x, gamma=None):
        _require_float(op, dy)  # Caffe2: float32 only (LayerNorm also double); doubles kept for float64 mode
        k = canonical_axis(op, axis, x.ndim)
        m, n = size_to_dim(x.shape, k), size_from_dim(x.shape, k)
        if dy.shape != x.shape:
            raise ShapeError(
                f"{op.where}: dY '{op.inputs[0]}' has shape {list(dy.shape)}, X '{op.inputs[4]}' has "
                f"{list(x.shape)}"
            )
        for index, stat in ((2, mean), (3, std)):
            if stat.size != m:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' has {stat.size} elements, expected {m} (one per row)"
                )
        g = _affine_param(op, 5, gamma, n, "gamma") if affine else None
        dx, dgamma, dbeta = _layer_norm_backward(
            dy.reshape(m, n), x.reshape(m, n), mean.reshape(m, 1), std.reshape(m, 1), g
        )
        if not affine:
            return dx.reshape(x.shape)
        return dx.reshape(x.shape), dgamma.reshape(gamma.shape), dbeta.reshape(gamma.shape)

    return kernel


def _layer_norm_backward(
    dy: jax.Array, x: jax.Array, mean: jax.Array, std: jax.Array, gamma: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """On `[M, N]` rows, with `r = 1/std`, `xhat = (X - mean)*r` and `g = gamma*dY` (or dY):
    `dX = r*(g - mean(g) - xhat*mean(g*xhat))`, `dgamma = sum_rows dY*xhat`, `dbeta = sum_rows dY`.
    This is Caffe2's fused `dX = g*r + X*a + b` (`a = (db*mean - ds)*r^3/N`, `b = -a*mean - db*r/N`,
    `ds = sum(g*X)`, `db = sum(g)`) rearranged, for any given mean and std, so that X - mean is formed
    first: Caffe2's form cancels large terms, which on nearly constant rows (r up to 1/sqrt(eps))
    leaves rounding noise where the gradient is 0."""
    m, n = x.shape
    if m == 0 or n == 0:
        return jnp.zeros_like(x), jnp.zeros((n,), x.dtype), jnp.zeros((n,), x.dtype)
    rstd = 1 / std
    xhat = (x - mean) * rstd
    g = dy if gamma is None else dy * gamma
    dx = rstd * (g - jnp.mean(g, axis=1, keepdims=True) - xhat * jnp.mean(g * xhat, axis=1, keepdims=True))
    return dx, jnp.sum(dy * xhat, axis=0), jnp.sum(dy, axis=0)
