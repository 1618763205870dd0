"""Nonlinearities against NumPy references written from Caffe2's documented semantics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError

RTOL, ATOL = 1e-5, 1e-6


def floats(min_dims: int = 0, max_dims: int = 3, bound: float = 20.0):
    return hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=4),
        elements=st.floats(-bound, bound, width=32),
    )


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


ELEMENTWISE = {
    "Sigmoid": _sigmoid,
    "Tanh": lambda x: np.tanh(x.astype(np.float64)),
    "Relu": lambda x: np.where(x > 0, x, 0),
    "Softsign": lambda x: x.astype(np.float64) / (1 + np.abs(x.astype(np.float64))),
}


@pytest.mark.parametrize("op_type", sorted(ELEMENTWISE))
@given(x=floats())
def test_elementwise(jit, op_type, x):
    (y,) = run_op(op_type, [x], jit=jit)
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ELEMENTWISE[op_type](x), rtol=RTOL, atol=ATOL)


@given(x=floats(), alpha=st.floats(-2, 2, width=32))
def test_leaky_relu(jit, x, alpha):
    (y,) = run_op("LeakyRelu", [x], jit=jit, alpha=alpha)
    expected = np.where(x > 0, x, np.float32(alpha) * x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)


def test_leaky_relu_default_alpha(jit):
    x = np.array([-100.0, -1.0, 0.0, 2.5], np.float32)
    (y,) = run_op("LeakyRelu", [x], jit=jit)
    np.testing.assert_allclose(y, [-1.0, -0.01, 0.0, 2.5], rtol=RTOL)


def _softmax_2d(x, axis):
    """Caffe2: X viewed as prod(dims[:axis]) x prod(dims[axis:]); softmax of each row."""
    k = axis % x.ndim
    rows = x.astype(np.float64).reshape(int(np.prod(x.shape[:k])), int(np.prod(x.shape[k:])))
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)


@given(data=st.data())
def test_softmax(jit, data):
    x = data.draw(
        hnp.arrays(
            np.float32,
            hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4),
            elements=st.floats(-50, 50, width=32),
        ),
        label="x",
    )
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    (y,) = run_op("Softmax", [x], jit=jit, axis=axis)
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, _softmax_2d(x, axis), rtol=RTOL, atol=ATOL)


def test_softmax_default_axis_flattens_trailing_dims(jit):
    x = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2) / 4
    (y,) = run_op("Softmax", [x], jit=jit)
    np.testing.assert_allclose(y, _softmax_2d(x, 1), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(y.reshape(2, -1).sum(axis=1), [1.0, 1.0], rtol=RTOL)


def test_softmax_is_stabilised(jit):
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], np.float32)
    (y,) = run_op("Softmax", [x], jit=jit)
    np.testing.assert_allclose(y, [[0.5, 0.5], [0.0, 1.0]], atol=ATOL)


def test_softmax_empty(jit):
    x = np.zeros((0, 3), np.float32)
    (y,) = run_op("Softmax", [x], jit=jit)
    assert y.shape == (0, 3)


def test_softmax_axis_out_of_range(jit):
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        run_op("Softmax", [np.zeros((2, 3), np.float32)], jit=jit, axis=2)
    with pytest.raises(ShapeError, match="axis 1 is out of range"):
        run_op("Softmax", [np.zeros((3,), np.float32)], jit=jit)


def test_bad_arguments(jit):
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(BadArgumentError, match="'alpha'"):
        run_op("LeakyRelu", [x], jit=jit, alpha="big")
    with pytest.raises(BadArgumentError, match="'axis'"):
        run_op("Softmax", [x], jit=jit, axis=1.5)
    with pytest.raises(BadArgumentError, match="Relu takes 1 inputs"):
        run_op("Relu", [x, x], jit=jit)
