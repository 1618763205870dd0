"""Reductions against NumPy references written from Caffe2's documented semantics (and its loops)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError

RTOL, ATOL = 1e-5, 1e-6


def int_valued(min_dims: int = 0, max_dims: int = 4, min_side: int = 0):
    """float32 arrays of small integers: every sum is exact in float32, so sums compare exactly."""
    return hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=4),
        elements=st.integers(-100, 100).map(float),
    )


# ---------------------------------------------------------------------------------------------------
# ReduceFront/Back Sum/Mean


def _front_back(x, num, front, mean, lengths=None):
    """Caffe2's loop: view X as rows x cols split after the first (front) or before the last (back)
    `num` dims; each output element starts from its first entry and adds entries 1..length-1."""
    split = num if front else x.ndim - num
    out_shape = x.shape[split:] if front else x.shape[:split]
    matrix = x.reshape(math.prod(x.shape[:split]), math.prod(x.shape[split:]))
    if matrix.size == 0:
        return np.zeros(out_shape, x.dtype)
    groups = matrix.T if front else matrix
    out = []
    for j, group in enumerate(groups.astype(np.float64)):
        length = len(group) if lengths is None else int(lengths[j])
        total = group[0]
        for i in range(1, length):
            total += group[i]
        with np.errstate(divide="ignore", invalid="ignore"):
            out.append(total / np.float64(length) if mean else total)
    return np.array(out).reshape(out_shape)


FRONT_BACK = {
    "ReduceFrontSum": (True, False),
    "ReduceBackSum": (False, False),
    "ReduceFrontMean": (True, True),
    "ReduceBackMean": (False, True),
}


def _check(y, expected, x_dtype, mean):
    assert y.shape == expected.shape and y.dtype == x_dtype
    if mean:
        np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)
    else:
        np.testing.assert_array_equal(y, expected)


@given(data=st.data())
def test_front_back(jit, data):
    op_type = data.draw(st.sampled_from(sorted(FRONT_BACK)), label="op_type")
    front, mean = FRONT_BACK[op_type]
    x = data.draw(int_valued(), label="x")
    num = data.draw(st.integers(0, x.ndim), label="num_reduce_dim")
    (y,) = run_op(op_type, [x], jit=jit, num_reduce_dim=num)
    _check(y, _front_back(x, num, front, mean), x.dtype, mean)


@given(data=st.data())
def test_front_back_lengths(jit, data):
    op_type = data.draw(st.sampled_from(sorted(FRONT_BACK)), label="op_type")
    front, mean = FRONT_BACK[op_type]
    x = data.draw(int_valued(min_dims=1, min_side=1), label="x")
    reduced = x.shape[0] if front else x.shape[-1]
    groups = x.size // reduced
    lengths = data.draw(hnp.arrays(np.int32, groups, elements=st.integers(0, reduced)), label="lengths")
    (y,) = run_op(op_type, [x, lengths], jit=jit)
    _check(y, _front_back(x, 1, front, mean, lengths), x.dtype, mean)


def test_front_back_default_and_documented_examples(jit):
    x = np.array([[1, 5, 2, 9], [4, 1, 8, 2], [2, 7, 0, 3]], np.float32)
    (y,) = run_op("ReduceFrontSum", [x], jit=jit)
    np.testing.assert_array_equal(y, [7, 13, 10, 14])
    (y,) = run_op("ReduceBackMean", [x], jit=jit)
    np.testing.assert_allclose(y, [17 / 4, 15 / 4, 3], rtol=RTOL)
    (y,) = run_op("ReduceFrontMean", [x, np.array([2, 3, 1, 2], np.int32)], jit=jit)
    np.testing.assert_allclose(y, [2.5, 13 / 3, 2, 5.5], rtol=RTOL)
    (y,) = run_op("ReduceBackSum", [x, np.array([2, 3, 1], np.int32)], jit=jit)
    np.testing.assert_array_equal(y, [6, 13, 2])
    # The argument is read as `num_reduce_dim`; the schema doc's `num_reduce_dims` is ignored.
    x3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (y,) = run_op("ReduceFrontSum", [x3], jit=jit, num_reduce_dims=2)
    np.testing.assert_array_equal(y, x3.sum(axis=0))


def test_lengths_zero_quirk(jit):
    """A length of 0 still takes the first entry; the mean then divides it by 0."""
    x = np.array([[3.0, 4.0], [5.0, 6.0]], np.float32)
    lengths = np.array([0, 2], np.int32)
    (y,) = run_op("ReduceBackSum", [x, lengths], jit=jit)
    np.testing.assert_array_equal(y, [3.0, 11.0])
    (y,) = run_op("ReduceFrontSum", [x, lengths], jit=jit)
    np.testing.assert_array_equal(y, [3.0, 10.0])
    (y,) = run_op("ReduceBackMean", [x, lengths], jit=jit)
    np.testing.assert_array_equal(y, [np.inf, 5.5])


def test_front_back_empty_gives_zeros(jit):
    for shape, op_type, out_shape in [
        ((0, 3), "ReduceFrontMean", (3,)),
        ((3, 0), "ReduceBackMean", (3,)),
        ((2, 0), "ReduceFrontSum", (0,)),
    ]:
        (y,) = run_op(op_type, [np.zeros(shape, np.float32)], jit=jit)
        assert y.shape == out_shape
        np.testing.assert_array_equal(y, np.zeros(out_shape))


def test_front_back_integers(jit):
    """int32 data stays int32 and the mean truncates towards zero, as C++ integer division does."""
    x = np.array([[-3, 1, 4], [0, 2, 4]], np.int32)
    (y,) = run_op("ReduceFrontMean", [x], jit=jit)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [-1, 1, 4])
    (y,) = run_op("ReduceBackSum", [x], jit=jit)
    np.testing.assert_array_equal(y, [2, 6])
    (y,) = run_op("ReduceBackMean", [x, np.array([2, 3], np.int32)], jit=jit)
    np.testing.assert_array_equal(y, [-1, 2])


def test_front_back_errors(jit):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="'num_reduce_dim' = 3 is out of range"):
        run_op("ReduceFrontSum", [x], jit=jit, num_reduce_dim=3)
    with pytest.raises(BadArgumentError, match="'num_reduce_dim' = -1"):
        run_op("ReduceBackSum", [x], jit=jit, num_reduce_dim=-1)
    with pytest.raises(BadArgumentError, match="must be 1"):
        run_op("ReduceBackMean", [x, np.ones(1, np.int32)], jit=jit, num_reduce_dim=2)
    with pytest.raises(ShapeError, match="lengths 'x1' has 2 elements, expected 3"):
        run_op("ReduceFrontSum", [x, np.ones(2, np.int32)], jit=jit)
    with pytest.raises(ShapeError, match="must be integers"):
        run_op("ReduceBackSum", [x, np.ones(2, np.float32)], jit=jit)
    with pytest.raises(BadArgumentError, match="takes 1 to 2 inputs"):
        run_op("ReduceFrontMean", [x, x, x], jit=jit)


# ---------------------------------------------------------------------------------------------------
# ReduceSum / ReduceMean


@given(data=st.data())
def test_reduce_axes(jit, data):
    op_type = data.draw(st.sampled_from(["ReduceSum", "ReduceMean"]), label="op_type")
    x = data.draw(int_valued(min_side=1), label="x")
    chosen = data.draw(st.lists(st.integers(0, max(x.ndim - 1, 0)), unique=True, max_size=x.ndim), label="axes")
    axes = [data.draw(st.sampled_from([a, a - x.ndim])) for a in chosen]  # negative axes count from the end
    keepdims = data.draw(st.sampled_from([None, 0, 1]), label="keepdims")
    (y,) = run_op(op_type, [x], jit=jit, axes=axes or None, keepdims=keepdims)
    reduce_over = tuple(chosen) if chosen else tuple(range(x.ndim))
    fn = np.mean if op_type == "ReduceMean" else np.sum
    expected = fn(x.astype(np.float64), axis=reduce_over, keepdims=keepdims in (None, 1))
    _check(y, np.asarray(expected), x.dtype, op_type == "ReduceMean")


def test_reduce_axes_defaults(jit):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run_op("ReduceSum", [x], jit=jit)
    assert y.shape == (1, 1) and y[0, 0] == 15
    (y,) = run_op("ReduceMean", [x], jit=jit, keepdims=0)
    assert y.shape == () and y == 2.5
    (y,) = run_op("ReduceSum", [x], jit=jit, axes=[], keepdims=0)  # empty list: all axes
    assert y.shape == () and y == 15


def test_reduce_sum_integers(jit):
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    (y,) = run_op("ReduceSum", [x], jit=jit, axes=[1], keepdims=0)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [6, 15])


def test_reduce_empty(jit):
    x = np.zeros((0, 3), np.float32)
    (y,) = run_op("ReduceSum", [x], jit=jit, axes=[0])
    np.testing.assert_array_equal(y, np.zeros((1, 3)))
    (y,) = run_op("ReduceMean", [x], jit=jit, axes=[0])
    np.testing.assert_array_equal(y, np.zeros((1, 3)))  # real Caffe2 gives 0 here, not NaN


def test_reduce_axes_errors(jit):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="axes entry 2 is out of range"):
        run_op("ReduceSum", [x], jit=jit, axes=[2])
    with pytest.raises(BadArgumentError, match="names an axis twice"):
        run_op("ReduceMean", [x], jit=jit, axes=[1, -1])
    with pytest.raises(ShapeError, match="float input"):
        run_op("ReduceMean", [np.ones((2, 3), np.int32)], jit=jit)
    with pytest.raises(BadArgumentError, match="'axes'"):
        run_op("ReduceSum", [x], jit=jit, axes=1)
    with pytest.raises(BadArgumentError, match="'keepdims'"):
        run_op("ReduceSum", [x], jit=jit, keepdims="no")


# ---------------------------------------------------------------------------------------------------
# SumElements


@given(x=int_valued(), average=st.sampled_from([None, False, True]))
def test_sum_elements(jit, x, average):
    (y,) = run_op("SumElements", [x], jit=jit, average=average)
    assert y.shape == () and y.dtype == np.float32
    total = x.astype(np.float64).sum()
    if average:  # an empty input averages to 0, as in real Caffe2
        np.testing.assert_allclose(y, total / x.size if x.size else 0.0, rtol=RTOL, atol=ATOL)
    else:
        assert y == total


def test_sum_elements_errors(jit):
    with pytest.raises(ShapeError, match="float input"):
        run_op("SumElements", [np.ones(3, np.int32)], jit=jit)
    with pytest.raises(BadArgumentError, match="'average'"):
        run_op("SumElements", [np.ones(3, np.float32)], jit=jit, average=0.5)


# ---------------------------------------------------------------------------------------------------
# ReduceMax/Min/L1/L2, Row/ColwiseMax, Moments, BatchMoments, Summarize


@given(data=st.data())
def test_reduce_axes_norms_and_extremes(jit, data):
    x = data.draw(int_valued(min_dims=1), label="x")
    axes = data.draw(st.lists(st.integers(0, x.ndim - 1), min_size=1, max_size=x.ndim, unique=True), label="axes")
    for op_type, reference in (
        ("ReduceMax", lambda v: np.max(v, axis=tuple(axes), keepdims=True, initial=np.finfo(np.float32).min)),
        ("ReduceMin", lambda v: np.min(v, axis=tuple(axes), keepdims=True, initial=np.finfo(np.float32).max)),
        ("ReduceL1", lambda v: np.abs(v).sum(axis=tuple(axes), keepdims=True)),
        ("ReduceL2", lambda v: np.sqrt(np.square(v.astype(np.float64)).sum(axis=tuple(axes), keepdims=True))),
    ):
        (y,) = run_op(op_type, [x], jit=jit, axes=axes)
        np.testing.assert_allclose(y, reference(x), rtol=RTOL, err_msg=op_type)


def test_row_col_max_and_gradients(jit):
    x = np.float32([[[1, 5, 5], [4, 2, 0]], [[-1, -2, -3], [7, 7, 1]]])
    (rows,) = run_op("RowwiseMax", [x], jit=jit)
    (cols,) = run_op("ColwiseMax", [x], jit=jit)
    np.testing.assert_array_equal(rows, [[5, 4], [-1, 7]])
    np.testing.assert_array_equal(cols, [[4, 5, 5], [7, 7, 1]])
    (dx,) = run_op("RowwiseMaxGradient", [x, rows, np.float32([[1, 2], [3, 4]])], jit=jit)
    np.testing.assert_array_equal(dx, [[[0, 1, 1], [2, 0, 0]], [[3, 0, 0], [4, 4, 0]]])  # ties all get it


def test_moments_and_batch_moments(jit):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    mean, var = run_op("Moments", [x], 2, jit=jit, axes=[0, 2], keepdims=0)
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2)), rtol=RTOL)
    np.testing.assert_allclose(var, x.astype(np.float64).var(axis=(0, 2)), rtol=RTOL)
    mu, second = run_op("BatchMoments", [x], 2, jit=jit)  # the raw second moment, not the variance
    np.testing.assert_allclose(mu, x.mean(axis=(0, 2)), rtol=RTOL)
    np.testing.assert_allclose(second, np.square(x.astype(np.float64)).mean(axis=(0, 2)), rtol=RTOL)
    with pytest.raises(ShapeError, match="no negative axes"):
        run_op("Moments", [x], 2, jit=jit, axes=[-1])


def test_summarize(jit):
    x = np.arange(5, dtype=np.float32)
    (y,) = run_op("Summarize", [x], jit=jit)
    np.testing.assert_allclose(y, [0, 4, 2, np.std(x, ddof=1)], rtol=RTOL)
    (y,) = run_op("Summarize", [x[:1] + 3], jit=jit)
    np.testing.assert_array_equal(y, [3, 3, 3, 0])
