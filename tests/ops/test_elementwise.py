"""The elementwise family (rnn2jax/ops/elementwise.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: Add/Sub/Mul/Div (numpy and legacy broadcasting), Sum, Scale, Clip and the
unary math ops against NumPy references written from Caffe2's semantics (SEMANTICS.md section 4,
elementwise_ops*.{h,cc}).

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the elementwise
arithmetic ops (Add/Sub/Mul/Div in both broadcast modes, Sum, SumReduceLike, Scale, Clip and the unary math ops) and
their gradients against real Caffe2.

Gradient ops against references and jax.vjp: Gradient ops of the elementwise family:
AddGradient/SubGradient/MulGradient/DivGradient in both broadcast modes, the pre-2018 forms (SumReduceLike,
Negative, Mul and the 3-input DivGradient) and Scale as its own gradient. Checked against `jax.vjp` of the forward
maths written here and NumPy references of the reductions (SEMANTICS.md section 4; elementwise_ops.h/.cc,
elementwise_ops_utils.cc, elementwise_{add,mul,div}_op.*).
"""

from __future__ import annotations

import math
import operator

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_gradient, check_op, dims, invalid, run_case, shapes
from helpers import run_op
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.errors import BadArgumentError, ShapeError

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_elementwise.py)

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


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_elementwise.py)

NUMERIC = (np.int32, np.int64, np.float32, np.float64)
FLOATS = (np.float32, np.float64)
INTS = (np.int32, np.int64)
# Abs/Exp/Log/Clip: Caffe2 refuses doubles, rnn2jax accepts them on purpose (its float64 verification
# mode, rnn2jax/checking/verification.py), so they are drawn in float32 and refused dtypes are integers.
FLOAT32 = (np.float32,)


def _values(data: st.DataObject, shape, dtype, low=-1.0, high=1.0, nonzero=False):
    """Floats in [low, high]; integers in [-5, 5]. `nonzero`: divisors (|x| >= 0.5, integers != 0)."""
    if np.dtype(dtype).kind in "iu":
        x = data.draw(arrays(shape, dtype, -5, 5))
        return np.where(x == 0, 1, x).astype(dtype) if nonzero else x
    if nonzero:
        magnitude = data.draw(arrays(shape, dtype, 0.5, 2.0))
        return magnitude * np.where(data.draw(arrays(shape, np.bool_)), 1, -1).astype(dtype)
    x = data.draw(arrays(shape, dtype, low, high))
    x[np.abs(x) < np.finfo(dtype).tiny] = 0  # XLA's CPU flushes subnormals: see test_caffe2_ops_activation
    return x


# --------------------------------------------------------------------------------------------------
# Broadcasting (shared with the comparison tests)


def legacy_shapes(data: st.DataObject) -> tuple[tuple[int, ...], tuple[int, ...], dict]:
    """(A shape, B shape, args) for broadcast=1: B a scalar, a suffix of A (with size-1 dims around
    it), or a block of A at `axis` or at `axis_str` of `order`."""
    mode = data.draw(st.sampled_from(["scalar", "suffix", "axis", "axis_str"]))
    if mode == "axis_str":
        order = data.draw(st.sampled_from(["NCHW", "NHWC"]))
        a_shape = tuple(data.draw(st.lists(dims(1, 3), min_size=4, max_size=4)))
        letter = data.draw(st.sampled_from(list(order)))
        axis = order.index(letter)
        length = data.draw(st.integers(1, 4 - axis))
        args = {"axis_str": letter}
        if order != "NCHW" or data.draw(st.booleans()):
            args["order"] = order
        return a_shape, a_shape[axis : axis + length], args
    a_shape = tuple(data.draw(st.lists(dims(0, 4), min_size=1, max_size=4)))
    if mode == "scalar":
        return a_shape, data.draw(st.sampled_from([(), (1,), (1, 1)]))[: len(a_shape)], {}
    if mode == "suffix":
        k = data.draw(st.integers(0, len(a_shape) - 1))
        b_shape = a_shape[k:]
        if k > 0 and data.draw(st.booleans()):
            b_shape = (1, *b_shape)
        return a_shape, b_shape, ({"axis": -1} if data.draw(st.booleans()) else {})
    axis = data.draw(st.integers(0, len(a_shape) - 1))
    length = data.draw(st.integers(1, len(a_shape) - axis))
    b_shape = a_shape[axis : axis + length]
    if axis + length < len(a_shape) and data.draw(st.booleans()):
        b_shape = (*b_shape, 1)  # trailing size-1 dims are stripped
    return a_shape, b_shape, {"axis": axis}


def broadcast_shapes(data: st.DataObject) -> tuple[tuple[int, ...], tuple[int, ...], dict]:
    """Shapes and args of a binary op in one of Caffe2's two broadcast modes; sometimes invalid."""
    if data.draw(st.booleans()):
        a_shape, b_shape, args = legacy_shapes(data)
        args = {"broadcast": 1, **args}
    else:
        a_shape, b_shape = data.draw(
            hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4)
        ).input_shapes
        args = {"broadcast": 0} if data.draw(st.booleans()) else {}
    if invalid(data) and b_shape:
        i = data.draw(st.integers(0, len(b_shape) - 1))
        b_shape = (*b_shape[:i], b_shape[i] + 2, *b_shape[i + 1 :])
    return a_shape, b_shape, args


def _binary(op_type: str):
    def draw(data: st.DataObject):
        dtype = data.draw(st.sampled_from(NUMERIC))
        a_shape, b_shape, args = broadcast_shapes(data)
        b_dtype = data.draw(st.sampled_from(NUMERIC)) if invalid(data) else dtype
        op = create_operator(op_type, ["A", "B"], ["C"], **args)
        return op, {
            "A": _values(data, a_shape, dtype),
            "B": _values(data, b_shape, b_dtype, nonzero=op_type == "Div"),
        }

    return draw


# --------------------------------------------------------------------------------------------------
# Sum, SumReduceLike


def draw_sum(data: st.DataObject):
    dtype = data.draw(st.sampled_from(NUMERIC))
    shape = data.draw(shapes(0, 4, min_side=0))
    n = data.draw(st.integers(1, 4))
    shapes_ = [shape] * n
    if n > 1 and invalid(data):
        shapes_[-1] = (*shape, 2)
    names = [f"X{i}" for i in range(n)]
    op = create_operator("Sum", names, ["Y"])
    return op, {name: _values(data, s, dtype) for name, s in zip(names, shapes_, strict=True)}


@given(data=st.data())
def test_sum_gradient_is_pass_through(caffe2, data):
    """Sum's gradient is no op: every input's gradient is the output's (builder compared too)."""
    op, inputs = draw_sum(data)
    if check_op(caffe2, op, inputs) is not None:
        assert check_gradient(caffe2, op, inputs) == []


def draw_sum_reduce_like(data: st.DataObject):
    dtype = data.draw(st.sampled_from(NUMERIC if invalid(data) else FLOATS))
    a_shape, b_shape, args = legacy_shapes(data)
    if invalid(data) and b_shape:
        b_shape = (*b_shape[:-1], b_shape[-1] + 2)
    op = create_operator("SumReduceLike", ["A", "B"], ["C"], **args)
    return op, {"A": _values(data, a_shape, dtype), "B": _values(data, b_shape, dtype)}


# --------------------------------------------------------------------------------------------------
# Scale, Clip, unary math


def draw_scale(data: st.DataObject):
    dtype = data.draw(st.sampled_from(INTS if invalid(data) else FLOATS))
    args = {}
    if data.draw(st.booleans()):
        args["scale"] = data.draw(st.floats(-3, 3, width=32, allow_subnormal=False))
    op = create_operator("Scale", ["X"], ["Y"], **args)
    return op, {"X": _values(data, data.draw(shapes(0, 4, min_side=0)), dtype)}


def draw_clip(data: st.DataObject):
    dtype = data.draw(st.sampled_from(INTS if invalid(data) else FLOAT32))
    args = {}
    for name in ("min", "max"):
        if data.draw(st.booleans()):
            args[name] = data.draw(st.floats(-1, 1, width=32, allow_subnormal=False))
    op = create_operator("Clip", ["X"], ["Y"], **args)
    return op, {"X": _values(data, data.draw(shapes(0, 4, min_side=0)), dtype)}


def _unary(op_type: str, low: float = -1.0, high: float = 1.0, dtypes=FLOAT32):
    def draw(data: st.DataObject):
        dtype = data.draw(st.sampled_from(INTS if invalid(data) and dtypes != NUMERIC else dtypes))
        op = create_operator(op_type, ["X"], ["Y"])
        return op, {"X": _values(data, data.draw(shapes(0, 4, min_side=0)), dtype, low, high)}

    return draw


CASES = cases(
    Case("Add", _binary("Add"), gradient_ops=("AddGradient",)),
    Case("Sub", _binary("Sub"), gradient_ops=("SubGradient",)),
    Case("Mul", _binary("Mul"), gradient_ops=("MulGradient",)),
    Case("Div", _binary("Div"), gradient_ops=("DivGradient",)),
    Case("Sum", draw_sum, note="gradient: pass-through, no op (test_sum_gradient_is_pass_through)"),
    Case("SumReduceLike", draw_sum_reduce_like, note="no gradient in Caffe2"),
    Case("Scale", draw_scale, gradient_ops=("Scale",)),
    Case("Clip", draw_clip, gradient_ops=("ClipGradient",)),
    Case("Abs", _unary("Abs"), gradient_ops=("AbsGradient",)),
    Case("Negative", _unary("Negative", dtypes=NUMERIC), gradient_ops=("Negative",)),
    Case("Exp", _unary("Exp", -3, 3), gradient_ops=("Mul",)),
    Case("Log", _unary("Log", 0.0625, 3), gradient_ops=("Div",)),
    Case("Sqrt", _unary("Sqrt", 0.0625, 3, dtypes=FLOATS), gradient_ops=("Scale", "Div")),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_elementwise(caffe2, case, data):
    run_case(caffe2, case, data)


# ----------------------------------------------------------------------------------------------------
# Gradient ops against references and jax.vjp (was tests/ops/test_elementwise.py)

TOL = {"rtol": 1e-5, "atol": 1e-5}
SEEDS_GRAD = st.integers(0, 2**32 - 1)
BINARY_GRAD = ["Add", "Sub", "Mul", "Div"]
FORWARD = {"Add": jnp.add, "Sub": jnp.subtract, "Mul": jnp.multiply, "Div": jnp.divide}


def normal_grad(seed: int, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def away_from_zero_grad(x: np.ndarray) -> np.ndarray:
    return (np.sign(x) + (x == 0) + x).astype(x.dtype)  # |x| >= 1: a tame divisor


def vjp(fn, primals, cotangent):
    """The input gradients `fn`'s reverse mode gives for output gradient `cotangent` (one compile)."""

    def pull(primals, cotangent):
        return jax.vjp(fn, *primals)[1](cotangent)

    return [np.asarray(g) for g in jax.jit(pull)(tuple(primals), cotangent)]


def gradient_inputs(op_type: str, dc, a, b, c):
    """The maker's input layout: (GO, I0, I1), and O0 last for Div."""
    return [dc, a, b, c] if op_type == "Div" else [dc, a, b]


def reduce_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """NumPy reference of the numpy-mode reduction: sum the extra leading dims, then every dim where
    `shape` has 1 and g has more."""
    g = g.astype(np.float64).sum(axis=tuple(range(g.ndim - len(shape))))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape)


def elementwise_grads(op_type: str, dc, a, b, c):
    """The elementwise derivatives, before any reduction (float64)."""
    dc, a, b = (x.astype(np.float64) for x in (dc, a, b))
    return {
        "Add": (dc, dc),
        "Sub": (dc, -dc),
        "Mul": (dc * b, dc * a),
        "Div": (dc / b, -dc * c / b),
    }[op_type]


# --------------------------------------------------------------------------------------------------
# broadcast=0: numpy broadcasting, reduced back over the broadcast dims


@st.composite
def numpy_shapes(draw):
    """Two shapes that broadcast: each dim of the shorter one is the other's dim or 1."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3))
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, base_shape=shape, max_side=3))
    return shapes.input_shapes


@given(op_type=st.sampled_from(BINARY_GRAD), shapes=numpy_shapes(), seed=SEEDS_GRAD)
def test_binary_gradient_numpy_broadcast(jit, op_type, shapes, seed):
    a_shape, b_shape = shapes
    c_shape = np.broadcast_shapes(a_shape, b_shape)
    a, b, dc = normal_grad(seed, a_shape, b_shape, c_shape)
    if op_type == "Div":
        b = away_from_zero_grad(b)
    c = np.asarray(FORWARD[op_type](a, b))
    da, db = run_op(op_type + "Gradient", gradient_inputs(op_type, dc, a, b, c), 2, jit=jit)
    assert (da.shape, db.shape) == (a.shape, b.shape)
    assert da.dtype == db.dtype == np.float32
    want = vjp(FORWARD[op_type], (a, b), dc)
    for got, expected in zip((da, db), want, strict=True):
        np.testing.assert_allclose(got, expected, **TOL)
    ga, gb = elementwise_grads(op_type, dc, a, b, c)
    np.testing.assert_allclose(da, reduce_to(np.broadcast_to(ga, c_shape), a.shape), **TOL)
    np.testing.assert_allclose(db, reduce_to(np.broadcast_to(gb, c_shape), b.shape), **TOL)


def test_binary_gradient_ignores_axis_without_broadcast(jit):
    a, b, dc = normal_grad(2, (2, 3), (3,), (2, 3))
    da, db = run_op("MulGradient", [dc, a, b], 2, jit=jit, axis=0, axis_str="", order="NCHW")
    np.testing.assert_allclose(da, dc * b, **TOL)
    np.testing.assert_allclose(db, (dc * a).sum(axis=0), **TOL)


# --------------------------------------------------------------------------------------------------
# broadcast=1: legacy pre x n x post, dB reduced over pre and post


@st.composite
def legacy_case_grad(draw):
    """A's shape, and B = a contiguous block of A's dims padded with size-1 dims, with its axis."""
    a_shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    first = draw(st.integers(0, len(a_shape) - 1))
    last = draw(st.integers(first, len(a_shape) - 1))
    lead = draw(st.integers(0, first))
    trail = draw(st.integers(0, len(a_shape) - 1 - last))
    b_shape = [1] * lead + a_shape[first : last + 1] + [1] * trail
    axis = first - lead
    if axis == len(a_shape) - len(b_shape) and draw(st.booleans()):
        axis = -1  # the default: B matches A's trailing dims
    return tuple(a_shape), tuple(b_shape), axis


def pre_n_post(a_shape, b_shape, axis) -> tuple[int, int, int]:
    """ComputeLegacyBroadcastSizes, written out: B's outer 1s stripped, the rest placed in A."""
    if math.prod(b_shape) == 1:
        return 1, 1, math.prod(a_shape)  # a scalar B: everything reduces to one value
    if axis == -1:
        axis = len(a_shape) - len(b_shape)
    start = next(i for i, d in enumerate(b_shape) if d != 1)
    end = len(b_shape) - next(i for i, d in enumerate(reversed(b_shape)) if d != 1)
    first = axis + start
    last = axis + end
    return math.prod(a_shape[:first]), math.prod(b_shape[start:end]), math.prod(a_shape[last:])


def legacy_forward(op_type: str, a_shape, b_shape, axis):
    """The forward op in legacy mode: B, seen as n, repeated over A's pre and post."""
    pre, n, post = pre_n_post(a_shape, b_shape, axis)

    def forward(a, b):
        c = FORWARD[op_type](a.reshape(pre, n, post), b.reshape(1, n, 1) if n > 1 else b.reshape(()))
        return c.reshape(a.shape)

    return forward


@given(op_type=st.sampled_from(BINARY_GRAD), case=legacy_case_grad(), seed=SEEDS_GRAD)
def test_binary_gradient_legacy_broadcast(jit, op_type, case, seed):
    a_shape, b_shape, axis = case
    a, b, dc = normal_grad(seed, a_shape, b_shape, a_shape)
    if op_type == "Div":
        b = away_from_zero_grad(b)
    forward = legacy_forward(op_type, a_shape, b_shape, axis)
    c = np.asarray(forward(a, b))
    args = {"broadcast": 1} | ({} if axis == -1 else {"axis": axis})
    da, db = run_op(op_type + "Gradient", gradient_inputs(op_type, dc, a, b, c), 2, jit=jit, **args)
    assert (da.shape, db.shape) == (a.shape, b.shape)
    want = vjp(forward, (a, b), dc)
    for got, expected in zip((da, db), want, strict=True):
        np.testing.assert_allclose(got, expected, **TOL)
    pre, n, post = pre_n_post(a_shape, b_shape, axis)
    b_block = b.reshape(1, n, 1) if n > 1 else b.reshape(())
    ga, gb = elementwise_grads(
        op_type, dc.reshape(pre, n, post), a.reshape(pre, n, post), b_block, c.reshape(pre, n, post)
    )
    np.testing.assert_allclose(
        db, np.broadcast_to(gb, (pre, n, post)).sum(axis=(0, 2)).reshape(b.shape), **TOL
    )
    np.testing.assert_allclose(da, np.broadcast_to(ga, (pre, n, post)).reshape(a.shape), **TOL)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "args", "reduce"),
    [
        ((3, 2, 4), (2, 4), {}, (0,)),  # (L,B,E)+(B,E)
        ((1, 2, 3), (2,), {"axis": 1}, (0, 2)),  # (1,B,H)·(B,)
        ((3, 2, 4), (3, 2), {"axis": 0}, (2,)),  # (L,B,E)·(L,B)
        ((1, 2, 8), (8,), {"axis": -1}, (0, 1)),  # (1,N,4H)·(4H,)
        ((2, 3, 4, 5), (3,), {"axis_str": "C"}, (0, 2, 3)),
        ((2, 4, 5, 3), (3,), {"axis_str": "C", "order": "NHWC"}, (0, 1, 2)),
        ((2, 3, 4), (1, 3, 1), {"axis": 0}, (0, 2)),
        ((2, 3), (1, 1), {}, (0, 1)),  # one element: a scalar
    ],
)
def test_mul_gradient_legacy_rnn_shapes(jit, a_shape, b_shape, args, reduce):
    a, b, dc = normal_grad(4, a_shape, b_shape, a_shape)
    da, db = run_op("MulGradient", [dc, a, b], 2, jit=jit, broadcast=1, **args)
    b_view = b.reshape([1 if i in reduce else a_shape[i] for i in range(len(a_shape))])
    np.testing.assert_allclose(da, dc * b_view, **TOL)
    np.testing.assert_allclose(db, (dc * a).astype(np.float64).sum(axis=reduce).reshape(b.shape), **TOL)


# --------------------------------------------------------------------------------------------------
# int types, the old DivGradient layout, errors


def test_int_gradients(jit):
    """Integers stay integers; Div's gradient truncates toward zero at each element, as in C++."""
    a = np.array([[7, -7, 5], [3, 0, -9]], np.int32)
    b = np.array([2, -3, 4], np.int32)
    dc = np.array([[5, 1, -3], [2, -6, 7]], np.int32)
    da, db = run_op("MulGradient", [dc, a, b], 2, jit=jit)
    assert da.dtype == db.dtype == np.int32
    np.testing.assert_array_equal(da, dc * b)
    np.testing.assert_array_equal(db, (dc * a).sum(axis=0))
    c = np.trunc(a / b).astype(np.int32)
    da, db = run_op("DivGradient", [dc, a, b, c], 2, jit=jit)
    np.testing.assert_array_equal(da, np.trunc(dc / b).astype(np.int32))
    np.testing.assert_array_equal(db, np.trunc(-dc * c / b).astype(np.int32).sum(axis=0))
    da, db = run_op("SubGradient", [dc, a, b], 2, jit=jit, broadcast=1)
    np.testing.assert_array_equal(db, -dc.sum(axis=0))


@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), seed=SEEDS_GRAD)
def test_old_div_gradient_layout(jit, shape, seed):
    """Pre-2018 maker: DivGradient(B, C, dC) -> (dA, dB), same shapes (no broadcast)."""
    a, b, dc = normal_grad(seed, shape, shape, shape)
    b = away_from_zero_grad(b)
    c = a / b
    da, db = run_op("DivGradient", [b, c, dc], 2, jit=jit)
    want_da, want_db = vjp(jnp.divide, (a, b), dc)
    np.testing.assert_allclose(da, want_da, **TOL)
    np.testing.assert_allclose(db, want_db, **TOL)


def test_old_div_gradient_layout_broadcast(jit):
    """The 3-input form honours broadcast args too, with A's shape taken from C."""
    a, b, dc = normal_grad(6, (2, 3, 4), (3,), (2, 3, 4))
    b = away_from_zero_grad(b)
    c = a / b[:, None]
    da, db = run_op("DivGradient", [b, c, dc], 2, jit=jit, broadcast=1, axis=1)
    np.testing.assert_allclose(da, dc / b[:, None], **TOL)
    np.testing.assert_allclose(db, (-dc * c / b[:, None]).sum(axis=(0, 2)), **TOL)


@pytest.mark.parametrize(
    ("op_type", "shapes", "args", "match"),
    [
        ("AddGradient", [(2, 3), (2, 3), (2,)], {}, "'a' \\[2, 3\\] and 'b' \\[2\\] do not broadcast"),
        ("MulGradient", [(2, 3), (2, 3), (2,)], {"broadcast": 1}, "'b' \\[2\\] does not match 'a'"),
        ("SubGradient", [(2, 4), (2, 3), (3,)], {}, "output gradient 'dc'"),
        ("MulGradient", [(3,), (2, 3), (3,)], {"broadcast": 1}, "output gradient 'dc'"),
        ("DivGradient", [(2, 3), (2, 3), (3,), (3,)], {}, "output 'c'"),
    ],
)
def test_binary_gradient_bad_shapes(jit, op_type, shapes, args, match):
    arrays = normal_grad(0, *shapes)
    names = ["dc", "a", "b", "c"][: len(arrays)]
    with pytest.raises(ShapeError, match=match):
        run_op(op_type, arrays, 2, jit=jit, input_names=names, **args)


def test_old_div_gradient_bad_shapes(jit):
    b, c, dc = normal_grad(0, (3,), (2, 3), (2, 2))
    with pytest.raises(ShapeError, match="output gradient 'dc'"):
        run_op("DivGradient", [b, c, dc], 2, jit=jit, input_names=["b", "c", "dc"])


def test_binary_gradient_bad_dtypes_and_arguments(jit):
    a, b, dc = normal_grad(0, (2, 3), (3,), (2, 3))
    with pytest.raises(ShapeError, match="inputs must share one dtype"):
        run_op("AddGradient", [dc, a.astype(np.int32), b], 2, jit=jit)
    with pytest.raises(ShapeError, match="dtype bool"):
        run_op("MulGradient", [dc > 0, a > 0, b > 0], 2, jit=jit)
    with pytest.raises(BadArgumentError, match="cannot be used together"):
        run_op("AddGradient", [dc, a, b], 2, jit=jit, broadcast=1, axis=1, axis_str="C")
    with pytest.raises(BadArgumentError, match="takes 3 inputs"):
        run_op("MulGradient", [dc, a, b, dc], 2, jit=jit)


# --------------------------------------------------------------------------------------------------
# Pre-2018 forms: SumReduceLike, Negative + SumReduceLike, Mul with broadcast


@given(case=legacy_case_grad(), seed=SEEDS_GRAD, as_str=st.booleans())
def test_sum_reduce_like(jit, case, seed, as_str):
    a_shape, b_shape, axis = case
    a, b = normal_grad(seed, a_shape, b_shape)
    args = {} if axis == -1 else {"axis": axis}
    if as_str and 0 <= axis < 4:  # the same axis given semantically, as axis_str + order
        args = {"axis_str": "NCHW"[axis], "order": "NCHW"}
    (y,) = run_op("SumReduceLike", [a, b], jit=jit, **args)
    assert y.shape == b.shape and y.dtype == np.float32
    pre, n, post = pre_n_post(a_shape, b_shape, axis)
    want = a.astype(np.float64).reshape(pre, n, post).sum(axis=(0, 2)).reshape(b.shape)
    np.testing.assert_allclose(y, want, **TOL)


def test_sum_reduce_like_examples(jit):
    """The schema's examples; B's values and dtype are not read, only its shape; `broadcast` (copied
    from the forward op by old makers) is ignored."""
    (a,) = normal_grad(7, (2, 3, 4, 5))
    cases = [
        ((4, 5), {}, (0, 1)),
        ((1,), {}, (0, 1, 2, 3)),
        ((3, 4), {"axis": 1}, (0, 3)),
        ((2,), {"axis": 0}, (1, 2, 3)),
    ]
    for b_shape, args, axes in cases:
        b = np.zeros(b_shape, np.int32)
        (y,) = run_op("SumReduceLike", [a, b], jit=jit, broadcast=1, **args)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, a.sum(axis=axes).reshape(b_shape), **TOL)


@pytest.mark.parametrize(
    ("shapes", "args", "error", "match"),
    [
        ([(2, 3), (2,)], {}, ShapeError, "mismatch"),
        ([(2, 3), (3,)], {"axis": 2}, ShapeError, "outside"),
        ([(2, 3), (2, 2, 3)], {}, ShapeError, "more dims"),
        ([(2, 3), (3,)], {"axis": 1, "axis_str": "C"}, BadArgumentError, "cannot be used together"),
        ([(2, 3), (3,)], {"axis_str": "Q"}, BadArgumentError, "axis_str"),
    ],
)
def test_sum_reduce_like_bad(jit, shapes, args, error, match):
    a, b = normal_grad(0, *shapes)
    with pytest.raises(error, match=match):
        run_op("SumReduceLike", [a, b], jit=jit, **args)


def test_sum_reduce_like_rejects_ints(jit):
    a = np.ones((2, 3), np.int32)
    with pytest.raises(ShapeError, match="float and double"):
        run_op("SumReduceLike", [a, a[0]], jit=jit)


@given(case=legacy_case_grad(), seed=SEEDS_GRAD)
def test_old_broadcast_gradient_nets(jit, case, seed):
    """The pre-2018 Mul maker's ops give the forward op's gradients: Mul(GO, B) {broadcast=1, axis,
    axis_str="", order} -> dA, Mul(GO, A) -> pre_red, SumReduceLike(pre_red, B) {axis, axis_str,
    order} -> dB. (The maker spells out axis_str and order even when the forward op had none.)"""
    a_shape, b_shape, axis = case
    a, b, go = normal_grad(seed, a_shape, b_shape, a_shape)
    reduce_args = {"axis": axis, "axis_str": "", "order": "NCHW"}
    (da,) = run_op("Mul", [go, b], jit=jit, broadcast=1, **reduce_args)
    (pre_red,) = run_op("Mul", [go, a], jit=jit)
    (db,) = run_op("SumReduceLike", [pre_red, b], jit=jit, **reduce_args)
    want_da, want_db = vjp(legacy_forward("Mul", a_shape, b_shape, axis), (a, b), go)
    np.testing.assert_allclose(da, want_da, **TOL)
    np.testing.assert_allclose(db, want_db, **TOL)


def test_old_sub_gradient_net(jit):
    """Sub with broadcast: Negative(GO) -> pre_red, SumReduceLike(pre_red, B) {axis, ...} -> dB;
    Add is the same without the Negative."""
    a, b, go = normal_grad(8, (3, 2, 4), (3, 2), (3, 2, 4))
    (pre_red,) = run_op("Negative", [go], jit=jit)
    (db,) = run_op("SumReduceLike", [pre_red, b], jit=jit, axis=0, axis_str="", order="NCHW")
    (want,) = vjp(lambda b: jnp.subtract(a, b[:, :, None]), (b,), go)
    np.testing.assert_allclose(db, want, **TOL)


# --------------------------------------------------------------------------------------------------
# Scale is its own gradient


@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), factor=st.floats(-4, 4, width=32), seed=SEEDS_GRAD
)
def test_scale_as_its_own_gradient(jit, shape, factor, seed):
    """Scale(GO) -> GI with the forward `scale` (given once here: see the report on duplicates)."""
    x, go = normal_grad(seed, shape, shape)
    (gi,) = run_op("Scale", [go], jit=jit, scale=factor)
    (want,) = vjp(lambda x: x * np.float32(factor), (x,), go)
    np.testing.assert_allclose(gi, want, rtol=1e-6, atol=0)
