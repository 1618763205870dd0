"""Add/Sub/Mul/Div (numpy and legacy broadcasting), Sum, Scale, Clip and the unary math ops against
NumPy references written from Caffe2's semantics (SEMANTICS.md section 4, elementwise_ops*.{h,cc})."""

from __future__ import annotations

import math
import operator

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError

FLOAT = {"rtol": 1e-5, "atol": 1e-6}
SEEDS = st.integers(0, 2**32 - 1)


def normal(seed: int, *shapes, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def away_from_zero(x: np.ndarray) -> np.ndarray:
    """Divisors: magnitudes in [0.5, ~3.5], signs kept."""
    return (np.sign(x) + (x == 0)) * (0.5 + np.abs(x)).astype(x.dtype)


def c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C++ integer division: truncates toward zero."""
    q = np.abs(a) // np.abs(b)
    return (q * np.sign(a) * np.sign(b)).astype(a.dtype)


REFERENCE = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Div": operator.truediv}
BINARY = sorted(REFERENCE)


def legacy_reference(op_type: str, a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    """Caffe2's legacy broadcast written out: strip B's outer 1s, view A as pre x n x post."""
    if b.size == 1:
        return REFERENCE[op_type](a, b.reshape(()))
    if axis == -1:
        axis = a.ndim - b.ndim
    dims = list(b.shape)
    start = next(i for i, d in enumerate(dims) if d != 1)
    end = max(i for i, d in enumerate(dims) if d != 1)
    pre = math.prod(a.shape[: axis + start])
    n = math.prod(dims[start : end + 1])
    post = math.prod(a.shape[axis + end + 1 :])
    out = REFERENCE[op_type](a.reshape(pre, n, post), b.reshape(n)[None, :, None])
    return out.reshape(a.shape)


# --------------------------------------------------------------------------------------------------
# broadcast=0: numpy broadcasting


@given(
    op_type=st.sampled_from(BINARY),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
    seed=SEEDS,
)
def test_binary_numpy_broadcast(jit, op_type, shapes, seed):
    a, b = normal(seed, *shapes.input_shapes)
    if op_type == "Div":
        b = away_from_zero(b)
    (y,) = run_op(op_type, [a, b], jit=jit)
    assert y.shape == shapes.result_shape and y.dtype == np.float32
    np.testing.assert_allclose(y, REFERENCE[op_type](a, b), rtol=1e-6, atol=0)


@given(
    op_type=st.sampled_from(BINARY),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
    seed=SEEDS,
)
def test_binary_int32_keeps_dtype_and_truncates(jit, op_type, shapes, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-20, 21, shapes.input_shapes[0]).astype(np.int32)
    b = rng.integers(-20, 21, shapes.input_shapes[1]).astype(np.int32)
    if op_type == "Div":
        b[b == 0] = 3
    (y,) = run_op(op_type, [a, b], jit=jit)
    expected = c_div(*np.broadcast_arrays(a, b)) if op_type == "Div" else REFERENCE[op_type](a, b)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expected)


def test_int_div_truncates_toward_zero(jit):
    a = np.array([-7, 7, -7, 7, -1, 1, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3, -3, 5], np.int32)
    (y,) = run_op("Div", [a, b], jit=jit)
    np.testing.assert_array_equal(y, [-3, 3, 3, -3, 0, 0, 0])


def test_axis_is_ignored_without_broadcast(jit):
    a, b = normal(0, (2, 3), (2, 1))
    (y,) = run_op("Add", [a, b], jit=jit, axis=0)
    np.testing.assert_array_equal(y, a + b)


@pytest.mark.parametrize("op_type", BINARY)
def test_numpy_broadcast_mismatch(jit, op_type):
    a, b = normal(0, (2, 3), (2,))
    with pytest.raises(ShapeError, match="do not broadcast"):
        run_op(op_type, [a, b], jit=jit)


def test_dtype_mismatch(jit):
    a = np.ones((2,), np.float32)
    b = np.ones((2,), np.int32)
    with pytest.raises(ShapeError, match="share one dtype"):
        run_op("Add", [a, b], jit=jit)


def test_bool_is_not_numeric(jit):
    a = np.ones((2,), bool)
    with pytest.raises(ShapeError, match="dtype bool"):
        run_op("Mul", [a, a], jit=jit)


# --------------------------------------------------------------------------------------------------
# broadcast=1: legacy pre x n x post


@st.composite
def legacy_case(draw):
    """A shape, an axis, and B = a contiguous block of A's dims starting at axis + (leading 1s),
    optionally padded with size-1 dims on either side."""
    a_shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    first = draw(st.integers(0, len(a_shape) - 1))
    last = draw(st.integers(first, len(a_shape) - 1))
    core = a_shape[first : last + 1]
    lead = draw(st.integers(0, first))
    trail = draw(st.integers(0, len(a_shape) - 1 - last))
    b_shape = [1] * lead + core + [1] * trail
    axis = first - lead
    if axis == len(a_shape) - len(b_shape) and draw(st.booleans()):
        axis = -1  # the default: match B against A's trailing dims
    return tuple(a_shape), tuple(b_shape), axis


@given(op_type=st.sampled_from(BINARY), case=legacy_case(), seed=SEEDS)
def test_binary_legacy_broadcast(jit, op_type, case, seed):
    a_shape, b_shape, axis = case
    a, b = normal(seed, a_shape, b_shape)
    if op_type == "Div":
        b = away_from_zero(b)
    args = {} if axis == -1 else {"axis": axis}
    (y,) = run_op(op_type, [a, b], jit=jit, broadcast=1, **args)
    assert y.shape == a.shape
    np.testing.assert_allclose(y, legacy_reference(op_type, a, b, axis), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "args"),
    [
        ((3, 2, 4), (2, 4), {}),  # (L,B,E)+(B,E)
        ((1, 2, 3), (2,), {"axis": 1}),  # (1,B,H)·(B,)
        ((3, 2, 4), (3, 2), {"axis": 0}),  # (L,B,E)·(L,B)
        ((1, 2, 8), (8,), {"axis": -1}),  # (1,N,4H)·(4H,)
        ((2, 3, 4, 5), (3,), {"axis_str": "C"}),  # NCHW: C is axis 1
        ((2, 4, 5, 3), (3,), {"axis_str": "C", "order": "NHWC"}),
        ((2, 3, 4), (1, 3, 1), {"axis": 0}),  # outer 1s stripped
        ((2, 3), (1, 1), {}),  # numel 1: a scalar
        ((2, 3), (1,), {"axis": 1}),  # numel 1: axis not even checked
        ((), (1,), {}),
    ],
)
def test_legacy_broadcast_examples(jit, a_shape, b_shape, args):
    a, b = normal(1, a_shape, b_shape)
    axis = args.get("axis", -1)
    if "axis_str" in args:
        axis = args.get("order", "NCHW").index(args["axis_str"])
    (y,) = run_op("Mul", [a, b], jit=jit, broadcast=1, **args)
    assert y.shape == a.shape
    np.testing.assert_allclose(y, legacy_reference("Mul", a, b, axis), rtol=1e-6, atol=0)


def test_legacy_broadcast_int(jit):
    a = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    b = np.array([4, -4, 3, 5], np.int32)
    (y,) = run_op("Div", [a, b], jit=jit, broadcast=1)
    np.testing.assert_array_equal(y, c_div(a, np.broadcast_to(b, a.shape)))


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "args", "match"),
    [
        ((2, 3), (3, 2), {}, "mismatch"),
        ((2, 3), (2,), {}, "mismatch"),  # suffix match by default
        ((2, 3), (2, 2, 3), {}, "more dims"),
        ((2, 3), (3,), {"axis": 2}, "outside"),
        ((2, 3), (3,), {"axis": -2}, "outside"),
    ],
)
def test_legacy_broadcast_bad_shapes(jit, a_shape, b_shape, args, match):
    a, b = normal(0, a_shape, b_shape)
    with pytest.raises(ShapeError, match=match):
        run_op("Add", [a, b], jit=jit, broadcast=1, **args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"axis": 0, "axis_str": "C"}, "cannot be used together"),
        ({"axis_str": "X"}, "axis_str"),
        ({"axis_str": "CH"}, "axis_str"),
        ({"axis": "1"}, "'axis' must be an integer"),
    ],
)
def test_legacy_broadcast_bad_arguments(jit, args, match):
    a, b = normal(0, (2, 3), (3,))
    with pytest.raises(BadArgumentError, match=match):
        run_op("Add", [a, b], jit=jit, broadcast=1, **args)


# --------------------------------------------------------------------------------------------------
# Sum, Scale, Clip


@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), count=st.integers(1, 4), seed=SEEDS)
def test_sum(jit, shape, count, seed):
    xs = normal(seed, *[shape] * count)
    (y,) = run_op("Sum", xs, jit=jit)
    np.testing.assert_allclose(y, np.sum(xs, axis=0), **FLOAT)


def test_sum_int32(jit):
    xs = [np.arange(6, dtype=np.int32).reshape(2, 3) * i for i in range(1, 4)]
    (y,) = run_op("Sum", xs, jit=jit)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, sum(xs))


def test_sum_does_not_broadcast(jit):
    a, b = normal(0, (2, 3), (3,))
    with pytest.raises(ShapeError, match="must have the shape"):
        run_op("Sum", [a, b], jit=jit)


@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3),
    factor=st.floats(-4, 4, width=32, allow_subnormal=False),
    seed=SEEDS,
)
def test_scale(jit, shape, factor, seed):
    (x,) = normal(seed, shape)
    (y,) = run_op("Scale", [x], jit=jit, scale=factor)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, np.float32(factor) * x, **FLOAT)


def test_scale_default_is_identity(jit):
    (x,) = normal(0, (2, 3))
    (y,) = run_op("Scale", [x], jit=jit)
    np.testing.assert_array_equal(y, x)


@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3),
    low=st.none() | st.floats(-2, 2, width=32, allow_subnormal=False),
    high=st.none() | st.floats(-2, 2, width=32, allow_subnormal=False),
    seed=SEEDS,
)
def test_clip(jit, shape, low, high, seed):
    (x,) = normal(seed, shape)
    args = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
    (y,) = run_op("Clip", [x], jit=jit, **args)
    lo = np.float32(-np.finfo(np.float32).max if low is None else low)
    hi = np.float32(np.finfo(np.float32).max if high is None else high)
    np.testing.assert_array_equal(y, np.minimum(np.maximum(x, lo), hi))


def test_clip_defaults_keep_huge_values(jit):
    x = np.array([-3e38, -1.0, 0.0, 2.5, 3e38, np.inf, -np.inf], np.float32)
    (y,) = run_op("Clip", [x], jit=jit)
    big = np.finfo(np.float32).max
    np.testing.assert_array_equal(y, np.clip(x, -big, big))


def test_clip_min_above_max_gives_max(jit):
    (x,) = normal(0, (4,))
    (y,) = run_op("Clip", [x], jit=jit, min=1.0, max=-1.0)
    np.testing.assert_array_equal(y, np.full(4, -1.0, np.float32))


def test_clip_rejects_ints(jit):
    with pytest.raises(ShapeError, match="supports float"):
        run_op("Clip", [np.arange(3, dtype=np.int32)], jit=jit, min=0.0)


def test_clip_bad_argument(jit):
    with pytest.raises(BadArgumentError, match="'min' must be a number"):
        run_op("Clip", [np.ones(3, np.float32)], jit=jit, min="low")


# --------------------------------------------------------------------------------------------------
# Unary math

UNARY = {
    "Negative": (np.negative, lambda x: x),
    "Abs": (np.abs, lambda x: x),
    "Exp": (np.exp, lambda x: x),
    "Log": (np.log, lambda x: np.abs(x) + 0.1),
    "Sqrt": (np.sqrt, np.abs),
}


@given(
    op_type=st.sampled_from(sorted(UNARY)),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    seed=SEEDS,
)
def test_unary(jit, op_type, shape, seed):
    fn, domain = UNARY[op_type]
    x = domain(normal(seed, shape)[0])
    (y,) = run_op(op_type, [x], jit=jit)
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, fn(x), **FLOAT)


def test_negative_int32(jit):
    x = np.array([-3, 0, 5], np.int32)
    (y,) = run_op("Negative", [x], jit=jit)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, -x)


@pytest.mark.parametrize("op_type", ["Abs", "Exp", "Log", "Sqrt"])
def test_float_only_unary_rejects_ints(jit, op_type):
    with pytest.raises(ShapeError, match="supports float"):
        run_op(op_type, [np.arange(3, dtype=np.int32)], jit=jit)
