"""The reduce family (rnn2jax/ops/reduce.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: Reductions against NumPy references written from Caffe2's documented
semantics (and its loops).

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the reductions against
real Caffe2 (see tests/differential.py).

Gradient ops against references and jax.vjp: Reduction gradient ops against NumPy references written from Caffe2's
kernels (caffe2/operators/reduce_front_back_{sum,mean}_ops.cc, reduce_ops.h, reduction_ops.cc) and against `jax.vjp`
of the forward op.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, cases, dims, invalid, make_op, run_case, run_rnn2jax, shapes
from helpers import forward, run_op
from rnn2jax.errors import BadArgumentError, ShapeError

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_reduce.py)

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


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_reduce.py)

def draw_front_back(op_type):
    front = "Front" in op_type

    def draw(data):
        shape = data.draw(shapes(1, 4, min_side=0, max_side=4))
        with_lengths = data.draw(st.booleans())
        args = {}
        if with_lengths:
            num = 1
            if data.draw(st.booleans()):
                args["num_reduce_dim"] = 1
        else:
            num = data.draw(st.integers(0, len(shape)))
            if num != 1 or data.draw(st.booleans()):
                args["num_reduce_dim"] = num
        dtype = np.float32 if "Mean" in op_type else data.draw(st.sampled_from([np.float32, np.float32, np.int32]))
        inputs = {
            "x": data.draw(arrays(shape, dtype, -10 if dtype == np.int32 else -1, 10 if dtype == np.int32 else 1))
        }
        if with_lengths:
            reduced = math.prod(shape[:num] if front else shape[len(shape) - num :])
            kept = math.prod(shape[num:] if front else shape[: len(shape) - num])
            inputs["lengths"] = data.draw(arrays((kept,), np.int32, 0, reduced))
        return make_op(op_type, list(inputs), ["y"], **args), inputs

    return draw


def draw_reduce_axes(op_type):
    def draw(data):
        shape = data.draw(shapes(1, 4, min_side=0, max_side=4))
        args = {}
        if data.draw(st.booleans()):
            axes = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
            args["axes"] = [a - len(shape) if data.draw(st.booleans()) else a for a in axes]
        if data.draw(st.booleans()):
            args["keepdims"] = int(data.draw(st.booleans()))
        x = data.draw(arrays(shape, np.float32))
        return make_op(op_type, ["x"], ["y"], **args), {"x": x}

    return draw


def draw_sum_elements(data):
    shape = data.draw(shapes(0, 4, min_side=0, max_side=4))
    args = {"average": int(data.draw(st.booleans()))} if data.draw(st.booleans()) else {}
    return make_op("SumElements", ["x"], ["y"], **args), {"x": data.draw(arrays(shape, np.float32))}


def _values(data, shape, dtype, low=-1, high=1):
    """Arrays of `dtype`; integers in [-10, 10], floats whose squares are not subnormal."""
    if np.dtype(dtype).kind in "iu":
        return data.draw(arrays(shape, dtype, -10, 10))
    x = data.draw(arrays(shape, dtype, low, high))
    x[np.abs(x) < np.sqrt(np.finfo(x.dtype).tiny)] = 0  # XLA flushes subnormal results (x², x·y) to 0
    return x


_AXES_DTYPES = {
    "ReduceMax": [np.float32, np.float64, np.int32, np.int64],
    "ReduceMin": [np.float32, np.float64, np.int32, np.int64],
    "ReduceL1": [np.float32],
    "ReduceL2": [np.float32],
}


def draw_reduce_extreme(op_type):
    """Any unique axes (negative ones too); invalid draws: an axis out of range, or a type Caffe2 does
    not register (integers or doubles for the norms)."""

    def draw(data):
        shape = data.draw(shapes(1, 4, min_side=0, max_side=4))
        args = {}
        if data.draw(st.booleans()):
            axes = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
            args["axes"] = [a - len(shape) if data.draw(st.booleans()) else a for a in axes]
            if invalid(data):
                args["axes"][0] = len(shape)
        if data.draw(st.booleans()):
            args["keepdims"] = int(data.draw(st.booleans()))
        dtypes = _AXES_DTYPES[op_type]
        dtype = data.draw(st.sampled_from([np.float64, np.int32] if invalid(data) else dtypes))
        x = _values(data, shape, dtype)
        return make_op(op_type, ["x"], ["y"], **args), {"x": x}

    return draw


def draw_front_back_max(op_type):
    """Lengths in [0, reduced size] (beyond it Caffe2 reads past the data); invalid draws: int data, a
    lengths vector of the wrong size, num_reduce_dim != 1 with lengths or beyond the rank."""
    front = "Front" in op_type

    def draw(data):
        shape = data.draw(shapes(1, 4, min_side=0, max_side=4))
        with_lengths = data.draw(st.booleans())
        args = {}
        if with_lengths:
            num = 1
            if data.draw(st.booleans()):
                args["num_reduce_dim"] = 1
        else:
            num = data.draw(st.integers(0, len(shape)))
            if num != 1 or data.draw(st.booleans()):
                args["num_reduce_dim"] = num
        dtype = np.int32 if invalid(data) else np.float32
        inputs = {"x": _values(data, shape, dtype)}
        if with_lengths:
            reduced = math.prod(shape[:num] if front else shape[len(shape) - num :])
            kept = math.prod(shape[num:]) if front else math.prod(shape[: len(shape) - num])
            if invalid(data):
                kept += 1
            inputs["lengths"] = data.draw(arrays((kept,), np.int32, 0, reduced))
        if invalid(data):
            args["num_reduce_dim"] = data.draw(
                st.sampled_from([len(shape) + 1, 2] if with_lengths else [len(shape) + 1])
            )
        return make_op(op_type, list(inputs), ["y"], **args), inputs

    return draw


def draw_row_col_max(op_type):
    """X[B, M, N] float; the reduced side is never 0 while the output has elements (Caffe2 segfaults).
    Invalid draws: a 2-D input, int data."""
    reduced_axis = 2 if op_type == "RowwiseMax" else 1

    def draw(data):
        shape = [data.draw(st.integers(0, 3)), data.draw(st.integers(0, 4)), data.draw(st.integers(0, 4))]
        if shape[reduced_axis] == 0 and math.prod(s for i, s in enumerate(shape) if i != reduced_axis):
            shape[reduced_axis] = 1
        if invalid(data):
            shape = shape[:2]
        dtype = np.int32 if invalid(data) else np.float32
        return make_op(op_type, ["x"], ["y"]), {"x": _values(data, tuple(shape), dtype)}

    return draw


def draw_sum_sqr_elements(data):
    shape = data.draw(shapes(0, 4, min_side=0, max_side=4))
    args = {"average": int(data.draw(st.booleans()))} if data.draw(st.booleans()) else {}
    dtype = np.int32 if invalid(data) else data.draw(st.sampled_from([np.float32, np.float64]))
    return make_op("SumSqrElements", ["x"], ["y"], **args), {"x": _values(data, shape, dtype)}


def draw_sum_elements_int(data):
    shape = data.draw(shapes(0, 4, min_side=0, max_side=4))
    dtype = data.draw(st.sampled_from([np.int64, np.float32])) if invalid(data) else np.int32
    return make_op("SumElementsInt", ["x"], ["y"]), {"x": _values(data, shape, dtype)}


def draw_moments(data):
    """Unique non-negative axes (Caffe2 refuses negative ones: an invalid draw); invalid: doubles."""
    shape = data.draw(shapes(1, 4, min_side=0, max_side=4))
    args = {}
    if data.draw(st.booleans()):
        args["axes"] = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
        if invalid(data):
            args["axes"][0] = data.draw(st.sampled_from([-1, len(shape)]))
    if data.draw(st.booleans()):
        args["keepdims"] = int(data.draw(st.booleans()))
    dtype = np.float64 if invalid(data) else np.float32
    return make_op("Moments", ["x"], ["mean", "var"], **args), {"x": _values(data, shape, dtype)}


def draw_batch_moments(data):
    """N and C of at least 1 (Caffe2 divides by N·C); invalid: doubles, an unknown order."""
    shape = (dims(1, 3), dims(1, 4), *[dims(0, 3)] * data.draw(st.integers(0, 2)))
    shape = tuple(data.draw(s) for s in shape)
    args = {}
    if data.draw(st.booleans()):
        args["order"] = data.draw(st.sampled_from(["NCHW", "NHWC"]))
    if args.get("order") == "NHWC":
        shape = (shape[0], *shape[2:], shape[1])
    if invalid(data):
        args["order"] = "CHWN"
    dtype = np.float64 if invalid(data) else np.float32
    return make_op("BatchMoments", ["x"], ["mu", "var"], **args), {"x": _values(data, shape, dtype)}


def draw_summarize(data):
    """Y or no output at all; invalid draws: an empty X, a double X. Never to_file=1: Caffe2 writes the
    figures to `<input>.summary` in the worker's folder, a side effect rnn2jax refuses
    (test_summarize_to_file_is_refused)."""
    shape = data.draw(shapes(0, 3, min_side=0 if invalid(data) else 1, max_side=4))
    outputs = [] if data.draw(st.integers(0, 5)) == 0 else ["y"]
    dtype = np.float64 if invalid(data) else np.float32
    return make_op("Summarize", ["x"], outputs), {"x": _values(data, shape, dtype)}


def test_summarize_to_file_is_refused():
    op = make_op("Summarize", ["x"], ["y"], to_file=1)
    with pytest.raises(BadArgumentError, match="to_file"):
        run_rnn2jax([op], {"x": np.ones(3, np.float32)}, ["y"])


CASES = cases(
    *(
        Case(name, draw_front_back(name), gradient_ops=(f"{name}Gradient",))
        for name in ("ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean")
    ),
    Case("ReduceSum", draw_reduce_axes("ReduceSum"), gradient_ops=("ReduceSumGradient",)),
    Case("ReduceMean", draw_reduce_axes("ReduceMean"), gradient_ops=("ReduceMeanGradient",), forward_cancels=True),
    Case("SumElements", draw_sum_elements, gradient_ops=("SumElementsGradient",)),
    *(
        Case(name, draw_reduce_extreme(name), gradient_ops=(f"{name}Gradient",))
        for name in ("ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2")
    ),
    *(
        Case(name, draw_front_back_max(name), gradient_ops=(f"{name}Gradient",))
        for name in ("ReduceFrontMax", "ReduceBackMax")
    ),
    *(Case(name, draw_row_col_max(name), gradient_ops=(f"{name}Gradient",)) for name in ("RowwiseMax", "ColwiseMax")),
    Case("SumSqrElements", draw_sum_sqr_elements),
    Case("SumElementsInt", draw_sum_elements_int),
    Case("Moments", draw_moments, gradient_ops=("MomentsGradient",)),
    Case("BatchMoments", draw_batch_moments, gradient_ops=("BatchMomentsGradient",)),
    Case("Summarize", draw_summarize),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


# ----------------------------------------------------------------------------------------------------
# Gradient ops against references and jax.vjp (was tests/ops/test_reduce.py)

RTOL_GRAD, ATOL_GRAD = 1e-5, 1e-6


def floats(shape, bound: float = 10.0):
    return hnp.arrays(np.float32, shape, elements=st.floats(-bound, bound, width=32, allow_subnormal=False))


def reduce_shapes(min_dims: int = 0, min_side: int = 0):
    return hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=min_side, max_side=3)


def c_div(a: np.ndarray, b) -> np.ndarray:
    """C++ division in the data type: truncating for integers."""
    if np.issubdtype(a.dtype, np.integer):
        return (np.trunc(a.astype(np.float64) / b)).astype(a.dtype)
    return (a.astype(np.float64) / b).astype(a.dtype)


def close(actual, expected):
    assert actual.shape == np.shape(expected), (actual.shape, np.shape(expected))
    np.testing.assert_allclose(actual, expected, rtol=RTOL_GRAD, atol=ATOL_GRAD)


# ---------------------------------------------------------------------------------------------------
# Reduce{Front,Back}{Sum,Mean}Gradient

FRONT_BACK_GRAD = {
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
    op_type = draw(st.sampled_from(sorted(FRONT_BACK_GRAD)), label="op")
    front, _ = FRONT_BACK_GRAD[op_type]
    if with_lengths is None:
        with_lengths = draw(st.booleans(), label="with_lengths")
    x_shape = draw(reduce_shapes(min_dims=1 if with_lengths else 0), label="x_shape")
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
    front, mean = FRONT_BACK_GRAD[op_type]
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
    front, mean = FRONT_BACK_GRAD[op_type]
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
    x = data.draw(floats(data.draw(reduce_shapes(), label="shape")), label="x")
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
    x=st.builds(np.zeros, reduce_shapes(), dtype=st.just(np.float32)),
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


@pytest.mark.parametrize("op_type", ["ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean"])
@given(data=st.data())
def test_front_back_gradient_of_the_shape_form_matches_caffe2(caffe2, op_type, data):
    """The pre-2018 form: X's shape as a 1-D int64 tensor in place of X. A workspace reads it on the host
    (registry `static_if`), as Caffe2 reads it; a compiled net, where it is traced, says why it cannot."""
    from host_differential import check_net as host_check_net

    shape = data.draw(shapes(1, 3, max_side=4))
    num = data.draw(st.integers(0, len(shape)))
    kept = shape[num:] if op_type.startswith("ReduceFront") else shape[: len(shape) - num]
    inputs = {"dY": data.draw(arrays(kept)), "shape": np.array(shape, np.int64)}
    op = make_op(f"{op_type}Gradient", ["dY", "shape"], ["dX"], num_reduce_dim=num)
    host_check_net(caffe2, [op], inputs)
    with pytest.raises(ShapeError, match="reads as X's shape"):
        run_rnn2jax([op], inputs, ["dX"])
