"""LayerNormGradient and DropoutGrad against NumPy references written from Caffe2's kernels
(caffe2/operators/layer_norm_op.{h,cc}, dropout_op.{h,cc}) and against `jax.vjp` of the forward op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import forward, run_op
from rnn2jax.errors import BadArgumentError, ShapeError

RTOL, ATOL = 1e-5, 1e-6


def floats(shape, bound: float):
    return hnp.arrays(np.float32, shape, elements=st.floats(-bound, bound, width=32, allow_subnormal=False))


# ---------------------------------------------------------------------------------------------------
# LayerNormGradient


@st.composite
def layer_norm_case(draw, affine: bool):
    """(x, axis, dy[, gamma, beta]). Each row gets a ramp 0, 3, 6, ... plus noise in [-1, 1], so no
    row is nearly constant: there 1/std reaches 1/sqrt(eps) and any float32 formula is noise-bound."""
    shape = draw(hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=3), label="shape")
    axis = draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    k = axis % len(shape)
    m, n = int(np.prod(shape[:k])), int(np.prod(shape[k:]))
    noise = draw(floats((m, n), 1.0), label="noise")
    x = (noise + 3 * np.arange(n, dtype=np.float32)).reshape(shape)
    dy = draw(floats(shape, 5.0), label="dy")
    if not affine:
        return x, axis, dy
    gamma = draw(floats(shape[k:], 3.0), label="gamma")
    beta = draw(floats(shape[k:], 3.0), label="beta")
    return x, axis, dy, gamma, beta


def _layer_norm_grad(x, dy, axis, mean, std, gamma=None):
    """The textbook LN backward in float64, from the saved mean/std: xhat = (x - mean)/std, g = dY*gamma,
    dX = (g - mean(g) - xhat*mean(g*xhat))/std, dgamma = sum_rows dY*xhat, dbeta = sum_rows dY."""
    k = axis % x.ndim
    m = int(np.prod(x.shape[:k]))
    x64, dy64 = x.astype(np.float64).reshape(m, -1), dy.astype(np.float64).reshape(m, -1)
    mean, std = mean.astype(np.float64).reshape(m, 1), std.astype(np.float64).reshape(m, 1)
    xhat = (x64 - mean) / std
    g = dy64 if gamma is None else dy64 * gamma.astype(np.float64).reshape(-1)
    dx = (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True)) / std
    return dx.reshape(x.shape), (dy64 * xhat).sum(axis=0), dy64.sum(axis=0)


def _ln_close(actual, expected, dy, gamma=None):
    """dX cancels terms of size |g|/std (std >= ~0.5 here): absolute error scales with max|g|."""
    scale = float(np.abs(dy).max()) * (1.0 if gamma is None else max(1.0, float(np.abs(gamma).max())))
    assert actual.shape == np.shape(expected) and actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL * max(1.0, scale) * 10)


@given(case=layer_norm_case(affine=False), eps=st.sampled_from([1e-5, 1e-3]))
def test_layer_norm_gradient(jit, case, eps):
    x, axis, dy = case
    fn = forward("LayerNorm", 1, 3, axis=axis, epsilon=eps)
    (y, mean, std), pullback = jax.vjp(lambda a: fn(a), x)
    (vjp_dx,) = pullback((dy, jnp.zeros_like(mean), jnp.zeros_like(std)))
    y, mean, std = np.asarray(y), np.asarray(mean), np.asarray(std)
    (dx,) = run_op("LayerNormGradient", [dy, y, mean, std, x], jit=jit, axis=axis, epsilon=eps)
    _ln_close(dx, _layer_norm_grad(x, dy, axis, mean, std)[0], dy)
    _ln_close(dx, vjp_dx, dy)


@given(case=layer_norm_case(affine=True))
def test_layer_norm_gradient_affine(jit, case):
    x, axis, dy, gamma, beta = case
    fn = forward("LayerNorm", 3, 3, axis=axis, elementwise_affine=1)
    (y, mean, std), pullback = jax.vjp(lambda *a: fn(*a), x, gamma, beta)
    vjp = pullback((dy, jnp.zeros_like(mean), jnp.zeros_like(std)))
    y, mean, std = np.asarray(y), np.asarray(mean), np.asarray(std)
    outs = run_op(
        "LayerNormGradient", [dy, y, mean, std, x, gamma], 3, jit=jit, axis=axis, elementwise_affine=1
    )
    expected = _layer_norm_grad(x, dy, axis, mean, std, gamma)
    for got, ref, want in zip(outs, expected, vjp, strict=True):
        _ln_close(got, ref.reshape(got.shape), dy, gamma)
        _ln_close(got, np.asarray(want), dy, gamma)
    assert outs[1].shape == outs[2].shape == gamma.shape


def test_layer_norm_gradient_defaults(jit):
    """axis defaults to 1 (here the last two dims form a row); without elementwise_affine one output."""
    x = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) ** 1.5).astype(np.float32)
    dy = np.cos(np.arange(24, dtype=np.float32)).reshape(2, 3, 4)
    y, mean, std = run_op("LayerNorm", [x], 3, jit=jit)
    assert mean.shape == (2, 1)
    (dx,) = run_op("LayerNormGradient", [dy, y, mean, std, x], jit=jit)
    _ln_close(dx, _layer_norm_grad(x, dy, 1, mean, std)[0], dy)


def test_layer_norm_gradient_ignores_y_and_epsilon(jit):
    """Only dY, mean, std and X are read: std already holds epsilon."""
    x = np.array([[1.0, 2.0, 4.0], [0.0, -1.0, 5.0]], np.float32)
    dy = np.array([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]], np.float32)
    y, mean, std = run_op("LayerNorm", [x], 3, jit=jit, epsilon=0.5)
    (a,) = run_op("LayerNormGradient", [dy, y, mean, std, x], jit=jit, epsilon=0.5)
    (b,) = run_op("LayerNormGradient", [dy, np.zeros_like(y), mean, std, x], jit=jit, epsilon=1e-5)
    np.testing.assert_array_equal(a, b)


def test_layer_norm_gradient_empty_rows(jit):
    """No rows: dX is empty and dgamma/dbeta are zeros (Caffe2 sets them to 0)."""
    x = np.zeros((0, 3), np.float32)
    gamma = np.ones((3,), np.float32)
    stats = np.zeros((0, 1), np.float32)
    dx, dgamma, dbeta = run_op(
        "LayerNormGradient", [x, x, stats, stats, x, gamma], 3, jit=jit, elementwise_affine=1
    )
    assert dx.shape == (0, 3)
    np.testing.assert_array_equal(dgamma, np.zeros(3, np.float32))
    np.testing.assert_array_equal(dbeta, np.zeros(3, np.float32))


def test_layer_norm_gradient_bad(jit):
    x = np.ones((2, 3), np.float32)
    stats = np.ones((2, 1), np.float32)
    names = ["dY", "Y", "mean", "std", "X", "gamma"]
    with pytest.raises(BadArgumentError, match="elementwise_affine=1 needs inputs"):
        run_op("LayerNormGradient", [x, x, stats, stats, x], 3, jit=jit, elementwise_affine=1)
    with pytest.raises(BadArgumentError, match="dgamma and dbeta only with elementwise_affine=1"):
        run_op("LayerNormGradient", [x, x, stats, stats, x], 3, jit=jit)
    with pytest.raises(ShapeError, match=r"LayerNormGradient.*dY 'dY' has shape \[3, 2\]"):
        run_op("LayerNormGradient", [x.T, x, stats, stats, x], jit=jit, input_names=names[:5])
    with pytest.raises(ShapeError, match=r"LayerNormGradient.*'std' has 3 elements, expected 2"):
        run_op("LayerNormGradient", [x, x, stats, np.ones(3, np.float32), x], jit=jit, input_names=names[:5])
    with pytest.raises(ShapeError, match=r"LayerNormGradient.*gamma 'gamma' has 2 elements"):
        run_op(
            "LayerNormGradient",
            [x, x, stats, stats, x, np.ones(2, np.float32)],
            3,
            jit=jit,
            input_names=names,
            elementwise_affine=1,
        )
    with pytest.raises(ShapeError, match=r"LayerNormGradient.*axis 2 is out of range"):
        run_op("LayerNormGradient", [x, x, stats, stats, x], jit=jit, axis=2)


# ---------------------------------------------------------------------------------------------------
# DropoutGrad


@given(
    x=hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=3), elements=st.floats(-5, 5, width=32)),
    ratio=st.sampled_from([0.0, 0.25, 0.5, 0.9]),
    seed=st.integers(0, 2**16),
)
def test_dropout_grad(jit, x, ratio, seed):
    """dX = dY * mask / (1 - ratio), with the scale computed in double and stored as float."""
    dy = np.cos(np.arange(x.size, dtype=np.float32)).reshape(x.shape) * 3
    fn = forward("Dropout", 1, 2, ratio=ratio, is_test=0)
    key = jax.random.key(seed)
    mask = np.asarray(fn(x, key=key)[1])
    _, pullback = jax.vjp(lambda a: fn(a, key=key)[0], x)
    (vjp_dx,) = pullback(dy)
    (dx,) = run_op("DropoutGrad", [dy, mask], jit=jit, ratio=ratio)
    expected = dy * mask * np.float32(1.0 / (1.0 - ratio))
    np.testing.assert_allclose(dx, expected, rtol=1e-6, atol=0)
    np.testing.assert_allclose(dx, np.asarray(vjp_dx), rtol=1e-6, atol=0)


def test_dropout_grad_defaults_and_test_mode(jit):
    """ratio defaults to 0.5; with is_test the gradient is a copy of dY (a given mask is not read)."""
    dy = np.array([1.0, -2.0, 3.0], np.float32)
    mask = np.array([True, False, True])
    (dx,) = run_op("DropoutGrad", [dy, mask], jit=jit)
    np.testing.assert_array_equal(dx, [2.0, 0.0, 6.0])
    (dx,) = run_op("DropoutGrad", [dy], jit=jit, is_test=1)
    np.testing.assert_array_equal(dx, dy)
    (dx,) = run_op("DropoutGrad", [dy, mask], jit=jit, is_test=1, ratio=0.3)
    np.testing.assert_array_equal(dx, dy)


def test_dropout_grad_bad(jit):
    dy = np.ones((2, 3), np.float32)
    mask = np.ones((2, 3), bool)
    with pytest.raises(BadArgumentError, match=r"'ratio' = 1\.0 must be in"):
        run_op("DropoutGrad", [dy, mask], jit=jit, ratio=1.0)
    with pytest.raises(BadArgumentError, match=r"is_test=0 takes \(dY, mask\)"):
        run_op("DropoutGrad", [dy], jit=jit)
    with pytest.raises(ShapeError, match=r"DropoutGrad.*mask 'm' must be a bool tensor of 6 elements"):
        run_op("DropoutGrad", [dy, mask[:1]], jit=jit, input_names=["dy", "m"])
    with pytest.raises(ShapeError, match=r"mask 'm' must be a bool tensor.*float32"):
        run_op("DropoutGrad", [dy, dy], jit=jit, input_names=["dy", "m"])
