"""Gradient ops of the nonlinearities against NumPy references written from Caffe2's kernels
(caffe2/operators/{sigmoid,tanh,relu,leaky_relu,softsign,softmax}_op.cc) and against `jax.vjp` of
the forward op."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import forward, run_op
from rnn2jax.errors import ShapeError

RTOL, ATOL = 1e-5, 1e-6


def vjp_of(op_type: str, x: np.ndarray, dy: np.ndarray, **args) -> tuple[np.ndarray, np.ndarray]:
    """(Y, dX) of the forward op at x for the output gradient dy."""
    fn = forward(op_type, 1, **args)
    y, pullback = jax.vjp(lambda a: fn(a)[0], x)
    return np.asarray(y), np.asarray(pullback(dy)[0])


def pair(min_dims: int = 0, max_dims: int = 3, bound: float = 6.0):
    """(x, dy) of one small shape."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=3).flatmap(
        lambda shape: st.tuples(
            hnp.arrays(np.float32, shape, elements=st.floats(-bound, bound, width=32, allow_subnormal=False)),
            hnp.arrays(np.float32, shape, elements=st.floats(-5, 5, width=32, allow_subnormal=False)),
        )
    )


def close(actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> None:
    assert actual.shape == np.shape(expected) and actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------------
# Sigmoid, Tanh, Relu, LeakyRelu, Softsign


@given(xs=pair())
def test_sigmoid_gradient(jit, xs):
    x, dy = xs
    y, vjp = vjp_of("Sigmoid", x, dy)
    (dx,) = run_op("SigmoidGradient", [y, dy], jit=jit)
    y64 = y.astype(np.float64)
    close(dx, dy * y64 * (1 - y64))
    close(dx, vjp)


@given(xs=pair())
def test_tanh_gradient(jit, xs):
    x, dy = xs
    y, vjp = vjp_of("Tanh", x, dy)
    (dx,) = run_op("TanhGradient", [y, dy], jit=jit)
    close(dx, dy * (1 - y.astype(np.float64) ** 2))
    close(dx, vjp)


@given(xs=pair())
def test_relu_gradient(jit, xs):
    x, dy = xs
    y, vjp = vjp_of("Relu", x, dy)
    (dx,) = run_op("ReluGradient", [y, dy], jit=jit)
    np.testing.assert_array_equal(dx, np.where(y > 0, dy, 0))
    # jnp.maximum splits the gradient at a tie (x == 0); Caffe2's kernel gives 0 there.
    np.testing.assert_array_equal(dx[x != 0], vjp[x != 0])


def test_relu_gradient_at_zero(jit):
    """The test is Y > 0: where Y is 0 (the input was <= 0) the gradient is 0."""
    y = np.array([0.0, -0.0, 1e-30, 2.0], np.float32)
    dy = np.array([3.0, 3.0, 3.0, 3.0], np.float32)
    (dx,) = run_op("ReluGradient", [y, dy], jit=jit)
    np.testing.assert_array_equal(dx, [0.0, 0.0, 3.0, 3.0])


def _leaky_relu_grad(y: np.ndarray, dy: np.ndarray, alpha: float) -> np.ndarray:
    """leaky_relu_op.cc: gtZero = (Y >= 0); dX = dY*gtZero - dY*(gtZero - 1)*alpha."""
    gt = (y >= 0).astype(np.float32)
    return dy * gt - dy * (gt - 1) * np.float32(alpha)


@given(xs=pair(), alpha=st.sampled_from([0.01, 0.2, 1.5]))
def test_leaky_relu_gradient(jit, xs, alpha):
    x, dy = xs
    y, vjp = vjp_of("LeakyRelu", x, dy, alpha=alpha)
    (dx,) = run_op("LeakyReluGradient", [y, dy], jit=jit, alpha=alpha)
    close(dx, _leaky_relu_grad(y, dy, alpha))
    # Away from Y == 0 (where the forward's max/min split the gradient) this is the vjp.
    close(dx[y != 0], vjp[y != 0])


@given(xs=pair(), alpha=st.sampled_from([0.0, -0.5]))
def test_leaky_relu_gradient_tests_y(jit, xs, alpha):
    """The branch is chosen on Y, not X: with alpha <= 0 a negative input gives Y >= 0 and so the
    gradient dY, unlike the true derivative alpha (Caffe2's behaviour, kept)."""
    x, dy = xs
    (y,) = run_op("LeakyRelu", [x], jit=jit, alpha=alpha)
    (dx,) = run_op("LeakyReluGradient", [y, dy], jit=jit, alpha=alpha)
    close(dx, _leaky_relu_grad(y, dy, alpha))


def test_leaky_relu_gradient_default_alpha_and_size(jit):
    """alpha defaults to 0.01; Caffe2 only needs Y and dY to have one size, dX takes Y's shape."""
    y = np.array([[-1.0, 0.0], [2.0, -3.0]], np.float32)
    dy = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    (dx,) = run_op("LeakyReluGradient", [y, dy], jit=jit)
    np.testing.assert_allclose(dx, np.array([[0.01, 2.0], [3.0, 0.04]], np.float32), rtol=1e-7)
    with pytest.raises(ShapeError, match=r"LeakyReluGradient.*one size"):
        run_op("LeakyReluGradient", [y, dy[:3]], jit=jit)


@given(xs=pair())
def test_softsign_gradient(jit, xs):
    """The maker passes the forward INPUT X: dX = dY / (1 + |X|)^2."""
    x, dy = xs
    _, vjp = vjp_of("Softsign", x, dy)
    (dx,) = run_op("SoftsignGradient", [x, dy], jit=jit)
    close(dx, dy / (1 + np.abs(x.astype(np.float64))) ** 2)
    close(dx, vjp)


@pytest.mark.parametrize("op_type", ["SigmoidGradient", "TanhGradient", "ReluGradient", "SoftsignGradient"])
def test_elementwise_gradient_bad_inputs(jit, op_type):
    y = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match=rf"{op_type}.*'Y' and 'dY' of one shape"):
        run_op(op_type, [y, np.zeros((3, 2), np.float32)], jit=jit, input_names=["Y", "dY"])
    with pytest.raises(ShapeError, match=rf"{op_type} takes float inputs, 'Y' is int32"):
        run_op(op_type, [y.astype(np.int32), y], jit=jit, input_names=["Y", "dY"])


# ---------------------------------------------------------------------------------------------------
# Softmax


@given(data=st.data())
def test_softmax_gradient(jit, data):
    x, dy = data.draw(pair(min_dims=1, max_dims=4), label="x, dy")
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    y, vjp = vjp_of("Softmax", x, dy, axis=axis)
    (dx,) = run_op("SoftmaxGradient", [y, dy], jit=jit, axis=axis)
    # Rows are the 2-D view size_to_dim(axis) x size_from_dim(axis), as in the forward.
    k = axis % x.ndim
    shape = (int(np.prod(x.shape[:k])), int(np.prod(x.shape[k:])))
    rows, drows = y.astype(np.float64).reshape(shape), dy.astype(np.float64).reshape(shape)
    expected = rows * (drows - (rows * drows).sum(axis=1, keepdims=True))
    # dY - sum(dY*Y) cancels when dY is nearly constant along a row: absolute error ~ ulp(max|dY|).
    atol = ATOL * max(1.0, float(np.abs(dy).max(initial=0)))
    close(dx, expected.reshape(x.shape), atol=atol)
    close(dx, vjp, atol=atol)


def test_softmax_gradient_default_axis(jit):
    """axis defaults to 1: on a 3-D input the sum runs over the last two dims together."""
    y = np.full((2, 2, 3), 1 / 6, np.float32)
    dy = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    (dx,) = run_op("SoftmaxGradient", [y, dy], jit=jit)
    block = dy.reshape(2, 6)
    expected = (block - block.mean(axis=1, keepdims=True)) / 6
    np.testing.assert_allclose(dx, expected.reshape(2, 2, 3), rtol=RTOL, atol=ATOL)


def test_softmax_gradient_bad_inputs(jit):
    y = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"SoftmaxGradient.*axis 2 is out of range"):
        run_op("SoftmaxGradient", [y, y], jit=jit, axis=2)
    with pytest.raises(ShapeError, match=r"SoftmaxGradient.*'Y' and 'dY' of one shape"):
        run_op("SoftmaxGradient", [y, y.T], jit=jit, input_names=["Y", "dY"])
