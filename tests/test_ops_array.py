"""The ranking and normalisation ops against NumPy references written from Caffe2's documented semantics
(top_k.cc, flexible_top_k.cc, local_response_normalization_op.cc), independent of the Caffe2 oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import arrays, make_op, run_rnn2jax, shapes


def top_k_reference(x: np.ndarray, k: int, axis: int):
    """Largest first, ties by lower index; k beyond the dim padded with value 0 and index -1."""
    moved = np.moveaxis(x, axis, -1)
    n = moved.shape[-1]
    order = np.argsort(-moved, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(moved, order, axis=-1)
    pad = [(0, 0)] * (moved.ndim - 1) + [(0, max(k - n, 0))]
    values, order = np.pad(values, pad), np.pad(order, pad, constant_values=-1)
    values, order = np.moveaxis(values, -1, axis), np.moveaxis(order, -1, axis)
    flat = np.full(order.shape, -1, np.int64)
    for pos in np.ndindex(order.shape):
        if order[pos] >= 0:
            source = list(pos)
            source[axis] = order[pos]
            flat[pos] = np.ravel_multi_index(source, x.shape)
    return values, order, flat.reshape(-1)


@given(data=st.data())
def test_top_k_matches_reference(data, jit):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=4))
    x = data.draw(arrays(shape, np.float32, -2, 2))
    if data.draw(st.booleans()):
        x = x.round().astype(np.float32)  # ties
    axis = data.draw(st.integers(0, len(shape) - 1))
    k = data.draw(st.integers(1, 5))
    op = make_op("TopK", ["x"], ["v", "i", "f"], k=k, axis=axis)
    got = run_rnn2jax([op], {"x": x}, ["v", "i", "f"], jit=jit)
    values, indices, flat = top_k_reference(x, k, axis)
    np.testing.assert_array_equal(got["v"], values)
    np.testing.assert_array_equal(got["i"], indices)
    np.testing.assert_array_equal(got["f"], flat)


@given(data=st.data())
def test_top_k_gradient_scatters_back(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    x = data.draw(arrays(shape, np.float32, -2, 2))
    k = data.draw(st.integers(1, 5))
    _, indices, _ = top_k_reference(x, k, len(shape) - 1)
    grad = data.draw(arrays(indices.shape, np.float32))
    want = np.zeros_like(x)
    for pos in np.ndindex(indices.shape):
        if indices[pos] >= 0:
            want[(*pos[:-1], indices[pos])] = grad[pos]
    op = make_op("TopKGradient", ["g", "i", "x"], ["dx"], k=k)
    got = run_rnn2jax([op], {"g": grad, "i": indices.astype(np.int64), "x": x}, ["dx"])
    np.testing.assert_array_equal(got["dx"], want)


@given(data=st.data())
def test_flexible_top_k_matches_reference(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    x = data.draw(arrays(shape, np.float32, -2, 2)).round().astype(np.float32)
    rows = x.reshape(-1, shape[-1])
    ks = np.array([data.draw(st.integers(1, shape[-1])) for _ in rows], np.int64)
    values, indices = [], []
    for row, k in zip(rows, ks, strict=True):
        v, i, _ = top_k_reference(row, int(k), 0)
        values.append(v)
        indices.append(i)
    op = make_op("FlexibleTopK", ["x", "k"], ["v", "i"])
    got = run_rnn2jax([op], {"x": x, "k": ks}, ["v", "i"], jit=False)
    np.testing.assert_array_equal(got["v"], np.concatenate(values))
    np.testing.assert_array_equal(got["i"], np.concatenate(indices))


def lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float, axis: int):
    """scale_c = bias + alpha / size * sum of x^2 over channels [c - (size-1)/2, c + (size-1)/2]."""
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    half = (size - 1) // 2
    squares = np.pad(moved**2, [(0, 0)] * (moved.ndim - 1) + [(half, half)])
    channels = moved.shape[-1]
    window = sum(squares[..., i : i + channels] for i in range(size))
    scale = bias + alpha / size * window
    return np.moveaxis(moved * scale**-beta, -1, axis), np.moveaxis(scale, -1, axis)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@given(data=st.data())
def test_lrn_matches_reference(data, order):
    x = data.draw(arrays((2, 4, 3, 2), np.float32))
    size = data.draw(st.sampled_from([1, 3, 5]))
    alpha, beta, bias = 0.5, 0.75, 1.5
    op = make_op("LRN", ["x"], ["y", "s"], size=size, alpha=alpha, beta=beta, bias=bias, order=order)
    got = run_rnn2jax([op], {"x": x}, ["y", "s"])
    want_y, want_s = lrn_reference(x, size, alpha, beta, bias, 3 if order == "NHWC" else 1)
    np.testing.assert_allclose(got["y"], want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["s"], want_s, rtol=1e-5, atol=1e-6)
