"""Reduction gradient ops against NumPy references written from Caffe2's kernels
(caffe2/operators/reduce_front_back_{sum,mean}_ops.cc, reduce_ops.h, reduction_ops.cc) and against
`jax.vjp` of the forward op."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import forward, run_op
from rnn2jax.errors import BadArgumentError, ShapeError

RTOL, ATOL = 1e-5, 1e-6


def floats(shape, bound: float = 10.0):
    return hnp.arrays(np.float32, shape, elements=st.floats(-bound, bound, width=32, allow_subnormal=False))


def shapes(min_dims: int = 0, min_side: int = 0):
    return hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=min_side, max_side=3)


def c_div(a: np.ndarray, b) -> np.ndarray:
    """C++ division in the data type: truncating for integers."""
    if np.issubdtype(a.dtype, np.integer):
        return (np.trunc(a.astype(np.float64) / b)).astype(a.dtype)
    return (a.astype(np.float64) / b).astype(a.dtype)


def close(actual, expected):
    assert actual.shape == np.shape(expected), (actual.shape, np.shape(expected))
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------------------------------
# Reduce{Front,Back}{Sum,Mean}Gradient

FRONT_BACK = {
    "ReduceFrontSum": (True, False),
    "ReduceBackSum": (False, False),
    "ReduceFrontMean": (True, True),
    "ReduceBackMean": (False, True),
}


def _front_back_grad(dy, x_shape, num, front, mean, lengths=None):
    """The C++ loop: X viewed as rows x cols (split after the first / before the last `num` dims);
    element (row, col) gets dY[col] (front) or dY[row] (back), divided by the count for a mean, and
    with lengths only where row < lengths[col] (front) / col < lengths[row] (back), else 0."""
    split = num if front else len(x_shape) - num
    rows, cols = math.prod(x_shape[:split]), math.prod(x_shape[split:])
    flat = dy.reshape(-1)
    dx = np.zeros((rows, cols), dy.dtype)
    for r in range(rows):
        for c in range(cols):
            group, position = (c, r) if front else (r, c)
            count = (rows if front else cols) if lengths is None else int(lengths[group])
            if lengths is not None and position >= count:
                continue
            dx[r, c] = c_div(flat[group : group + 1], count)[0] if mean else flat[group]
    return dx.reshape(x_shape)


@st.composite
def front_back_case(draw, dtype=np.float32, with_lengths=None):
    op_type = draw(st.sampled_from(sorted(FRONT_BACK)), label="op")
    front, _ = FRONT_BACK[op_type]
    if with_lengths is None:
        with_lengths = draw(st.booleans(), label="with_lengths")
    x_shape = draw(shapes(min_dims=1 if with_lengths else 0), label="x_shape")
    num = 1 if with_lengths else draw(st.integers(0, len(x_shape)), label="num_reduce_dim")
    split = num if front else len(x_shape) - num
    out_shape = x_shape[split:] if front else x_shape[:split]
    reduced = math.prod(x_shape[:split] if front else x_shape[split:])
    if dtype == np.float32:
        dy = draw(floats(out_shape), label="dy")
    else:
        dy = draw(hnp.arrays(dtype, out_shape, elements=st.integers(-50, 50)), label="dy")
    lengths = None
    if with_lengths:
        lengths = draw(
            hnp.arrays(np.int32, math.prod(out_shape), elements=st.integers(0, reduced + 1)), label="lengths"
        )
    return op_type, x_shape, num, dy, lengths


@given(case=front_back_case())
def test_reduce_front_back_gradient(jit, case):
    op_type, x_shape, num, dy, lengths = case
    front, mean = FRONT_BACK[op_type]
    x = np.linspace(-1, 1, math.prod(x_shape), dtype=np.float32).reshape(x_shape)
    extra = [] if lengths is None else [lengths]
    (dx,) = run_op(f"{op_type}Gradient", [dy, x, *extra], jit=jit, num_reduce_dim=num)
    assert dx.dtype == np.float32
    close(dx, _front_back_grad(dy, x_shape, num, front, mean, lengths))
    if lengths is not None and np.any(lengths == 0):
        return  # the forward counts entry 0 even for a length of 0; the gradient op gives it nothing
    fn = forward(op_type, 1 + len(extra), num_reduce_dim=num)
    _, pullback = jax.vjp(lambda a: fn(a, *extra)[0], x)
    close(dx, np.asarray(pullback(dy)[0]))


@given(case=front_back_case(with_lengths=True))
def test_reduce_front_back_gradient_zero_lengths(jit, case):
    """A length of 0 gives the group no gradient at all (its forward still counted entry 0)."""
    op_type, x_shape, _, dy, lengths = case
    lengths = np.zeros_like(lengths)
    x = np.ones(x_shape, np.float32)
    (dx,) = run_op(f"{op_type}Gradient", [dy, x, lengths], jit=jit)
    np.testing.assert_array_equal(dx, np.zeros(x_shape, np.float32))


@given(case=front_back_case(dtype=np.int32))
def test_reduce_front_back_gradient_int(jit, case):
    """Integer gradients divide in the integer type (C++ truncation)."""
    op_type, x_shape, num, dy, lengths = case
    front, mean = FRONT_BACK[op_type]
    x = np.zeros(x_shape, np.int32)
    extra = [] if lengths is None else [lengths]
    (dx,) = run_op(f"{op_type}Gradient", [dy, x, *extra], jit=jit, num_reduce_dim=num)
    assert dx.dtype == np.int32
    np.testing.assert_array_equal(dx, _front_back_grad(dy, x_shape, num, front, mean, lengths))


def test_reduce_front_back_gradient_defaults(jit):
    """num_reduce_dim defaults to 1; X (here int data) only gives dX its shape, dX takes dY's type."""
    dy = np.array([1.0, 2.0, 3.0], np.float32)
    x = np.zeros((2, 3), np.int32)
    (dx,) = run_op("ReduceFrontMeanGradient", [dy, x], jit=jit)
    np.testing.assert_array_equal(dx, np.array([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]], np.float32))
    (dx,) = run_op("ReduceBackSumGradient", [dy[:2], x], jit=jit)
    np.testing.assert_array_equal(dx, np.array([[1.0] * 3, [2.0] * 3], np.float32))


def test_reduce_front_back_gradient_bad(jit):
    x = np.zeros((2, 3), np.float32)
    dy = np.zeros(3, np.float32)
    with pytest.raises(ShapeError, match=r"ReduceFrontSumGradient.*dY 'dy' has 2 elements, expected 3"):
        run_op("ReduceFrontSumGradient", [dy[:2], x], jit=jit, input_names=["dy", "x"])
    with pytest.raises(ShapeError, match="'num_reduce_dim' = 3 is out of range"):
        run_op("ReduceBackMeanGradient", [dy, x], jit=jit, num_reduce_dim=3)
    with pytest.raises(BadArgumentError, match="'num_reduce_dim' = -1 must not be negative"):
        run_op("ReduceBackMeanGradient", [dy, x], jit=jit, num_reduce_dim=-1)
    with pytest.raises(BadArgumentError, match="with a lengths input, argument 'num_reduce_dim' must be 1"):
        run_op("ReduceFrontSumGradient", [dy, x, np.ones(3, np.int32)], jit=jit, num_reduce_dim=2)
    with pytest.raises(ShapeError, match="lengths 'len' has 2 elements, expected 3"):
        run_op(
            "ReduceFrontSumGradient",
            [dy, x, np.ones(2, np.int32)],
            jit=jit,
            input_names=["dy", "x", "len"],
        )


# ---------------------------------------------------------------------------------------------------
# ReduceSumGradient / ReduceMeanGradient


@given(data=st.data())
def test_reduce_axes_gradient(jit, data):
    op_type = data.draw(st.sampled_from(["ReduceSum", "ReduceMean"]), label="op")
    x = data.draw(floats(data.draw(shapes(), label="shape")), label="x")
    axes = data.draw(st.sets(st.integers(0, max(x.ndim - 1, 0)), max_size=x.ndim), label="axes")
    axes = [a - x.ndim if data.draw(st.booleans(), label="negative") else a for a in sorted(axes)]
    keepdims = data.draw(st.booleans(), label="keepdims")
    args = {"keepdims": int(keepdims), **({"axes": axes} if axes else {})}
    fn = forward(op_type, 1, **args)
    y, pullback = jax.vjp(lambda a: fn(a)[0], x)
    dy = data.draw(floats(y.shape), label="dy")
    (dx,) = run_op(f"{op_type}Gradient", [dy, x, np.asarray(y)], jit=jit, **args)
    dims = sorted(a % x.ndim for a in axes) if axes else list(range(x.ndim))
    kept = [1 if i in dims else d for i, d in enumerate(x.shape)]
    expected = np.broadcast_to(dy.reshape(kept), x.shape).astype(np.float64)
    if op_type == "ReduceMean" and x.size:
        expected = expected * (np.float32(dy.size) / np.float32(x.size))
    close(dx, expected)
    close(dx, np.asarray(pullback(dy)[0]))


def test_reduce_axes_gradient_defaults(jit):
    """axes default to all dims; keepdims does not change the gradient; int ReduceSumGradient works."""
    x = np.zeros((2, 3), np.int32)
    (dx,) = run_op("ReduceSumGradient", [np.array(7, np.int32), x, np.array(0, np.int32)], jit=jit)
    np.testing.assert_array_equal(dx, np.full((2, 3), 7, np.int32))
    dy = np.array([[3.0, 6.0, 9.0]], np.float32)
    for keepdims in (0, 1):
        (dx,) = run_op(
            "ReduceMeanGradient", [dy, x.astype(np.float32), dy], jit=jit, axes=[0], keepdims=keepdims
        )
        np.testing.assert_allclose(dx, np.array([[1.5, 3.0, 4.5]] * 2, np.float32), rtol=1e-7)


def test_reduce_axes_gradient_bad(jit):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"ReduceSumGradient.*dY 'dy' has shape \[2\].*axes \[0\]"):
        run_op(
            "ReduceSumGradient",
            [np.zeros(2, np.float32), x, x],
            jit=jit,
            axes=[0],
            input_names=["dy", "x", "y"],
        )
    with pytest.raises(BadArgumentError, match="names an axis twice"):
        run_op("ReduceSumGradient", [np.zeros(3, np.float32), x, x], jit=jit, axes=[0, -2])
    with pytest.raises(ShapeError, match="axes entry 2 is out of range"):
        run_op("ReduceMeanGradient", [np.zeros(3, np.float32), x, x], jit=jit, axes=[2])
    with pytest.raises(ShapeError, match="ReduceMeanGradient takes a float dY"):
        run_op("ReduceMeanGradient", [np.zeros(3, np.int32), x, x], jit=jit, axes=[0])


# ---------------------------------------------------------------------------------------------------
# SumElementsGradient


@given(
    x=st.builds(np.zeros, shapes(), dtype=st.just(np.float32)),
    dy=st.floats(-100, 100, width=32),
    average=st.booleans(),
)
def test_sum_elements_gradient(jit, x, dy, average):
    dy = np.float32(dy)
    (dx,) = run_op("SumElementsGradient", [x, np.array(dy)], jit=jit, average=int(average))
    # Caffe2: float(dY * (average ? 1.0 / numel : 1)), the product in double. Here dY / numel in float32,
    # which XLA may turn into a product with the rounded reciprocal under jit: within an ulp or so.
    expected = np.full(x.shape, np.float32(np.float64(dy) * (1.0 / x.size if average and x.size else 1.0)))
    assert dx.dtype == np.float32
    np.testing.assert_allclose(dx, expected, rtol=3e-7, atol=0)
    fn = forward("SumElements", 1, average=int(average))
    _, pullback = jax.vjp(lambda a: fn(a)[0], x)
    close(dx, np.asarray(pullback(np.array(dy))[0]))


def test_sum_elements_gradient_defaults_and_bad(jit):
    """average defaults to false; dY may be any one-element tensor (Caffe2 passes a 0-d scalar)."""
    x = np.zeros((2, 2), np.float32)
    (dx,) = run_op("SumElementsGradient", [x, np.array([2.5], np.float32)], jit=jit)
    np.testing.assert_array_equal(dx, np.full((2, 2), 2.5, np.float32))
    with pytest.raises(
        ShapeError, match=r"SumElementsGradient.*dY 'g' must hold one element, got shape \[2\]"
    ):
        run_op("SumElementsGradient", [x, np.ones(2, np.float32)], jit=jit, input_names=["x", "g"])
    with pytest.raises(ShapeError, match="takes a float dY"):
        run_op("SumElementsGradient", [x, np.array(1, np.int32)], jit=jit)
