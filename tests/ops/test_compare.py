"""The compare family (rnn2jax/ops/compare.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: GT/LT/GE/LE/EQ/NE, And/Or/Xor and Not against NumPy references written from
Caffe2's semantics (SEMANTICS.md section 4; caffe2/operators/elementwise_ops.cc): bool outputs, numpy or legacy
broadcast.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the comparison (EQ NE
LT LE GT GE) and logical (And Or Xor Not) ops against real Caffe2, in both broadcast modes. None has a gradient
(Caffe2's makers refuse; so do the builder's).
"""

from __future__ import annotations

import math
import operator

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_elementwise import broadcast_shapes

from differential import Case, arrays, cases, invalid, run_case, shapes
from helpers import run_op
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_compare.py)

SEEDS = st.integers(0, 2**32 - 1)

COMPARISONS = {
    "GT": operator.gt,
    "LT": operator.lt,
    "GE": operator.ge,
    "LE": operator.le,
    "EQ": operator.eq,
    "NE": operator.ne,
}
LOGICAL = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}
REFERENCE = {**COMPARISONS, **LOGICAL}
DTYPES = ["int32", "float32", "bool"]


def values(seed: int, dtype: str, *shapes) -> list[np.ndarray]:
    """Few distinct values, so that equal pairs (where GE/LE/EQ differ from GT/LT/NE) are common."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return [rng.integers(0, 2, s).astype(bool) for s in shapes]
    return [rng.integers(-2, 3, s).astype(dtype) for s in shapes]


def legacy_reference(op_type: str, a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    """Legacy broadcast: a one-element B is a scalar; otherwise B without its outer 1s is the middle
    `n` of A viewed as pre x n x post, starting at `axis` (default: B's dims are A's trailing dims)."""
    if b.size == 1:
        return REFERENCE[op_type](a, b.reshape(()))
    if axis == -1:
        axis = a.ndim - b.ndim
    kept = [i for i, d in enumerate(b.shape) if d != 1]
    start, end = kept[0], kept[-1]
    pre = math.prod(a.shape[: axis + start])
    n = math.prod(b.shape[start : end + 1])
    post = math.prod(a.shape[axis + end + 1 :])
    return REFERENCE[op_type](a.reshape(pre, n, post), b.reshape(n)[None, :, None]).reshape(a.shape)


@st.composite
def legacy_case(draw):
    """A's shape, B = a block of A's dims (padded with 1s) and the axis where it starts."""
    a_shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    first = draw(st.integers(0, len(a_shape) - 1))
    last = draw(st.integers(first, len(a_shape) - 1))
    lead = draw(st.integers(0, first))
    trail = draw(st.integers(0, len(a_shape) - 1 - last))
    b_shape = [1] * lead + a_shape[first : last + 1] + [1] * trail
    axis = first - lead
    if axis == len(a_shape) - len(b_shape) and draw(st.booleans()):
        axis = -1
    return tuple(a_shape), tuple(b_shape), axis


# --------------------------------------------------------------------------------------------------
# Comparisons


@given(
    op_type=st.sampled_from(sorted(COMPARISONS)),
    dtype=st.sampled_from(DTYPES),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
    seed=SEEDS,
)
def test_comparison_numpy_broadcast(jit, op_type, dtype, shapes, seed):
    a, b = values(seed, dtype, *shapes.input_shapes)
    (y,) = run_op(op_type, [a, b], jit=jit)
    assert y.dtype == np.bool_ and y.shape == shapes.result_shape
    np.testing.assert_array_equal(y, COMPARISONS[op_type](a, b))


@given(
    op_type=st.sampled_from(sorted(COMPARISONS)),
    dtype=st.sampled_from(DTYPES),
    case=legacy_case(),
    seed=SEEDS,
)
def test_comparison_legacy_broadcast(jit, op_type, dtype, case, seed):
    a_shape, b_shape, axis = case
    a, b = values(seed, dtype, a_shape, b_shape)
    args = {} if axis == -1 else {"axis": axis}
    (y,) = run_op(op_type, [a, b], jit=jit, broadcast=1, **args)
    assert y.dtype == np.bool_ and y.shape == a.shape
    np.testing.assert_array_equal(y, legacy_reference(op_type, a, b, axis))


@pytest.mark.parametrize("n", [1, 4])
def test_basic_rnn_valid_and_invalid_masks(jit, n):
    """BasicRNN's step net: GT/LE(seq_lengths [N] int32, timestep_gpu [1] int32) {broadcast=1}."""
    seq_lengths = np.array([3, 0, 5, 1][:n], np.int32)
    names = ["seq_lengths", "basic_rnn/timestep_gpu"]
    for t in range(6):
        timestep = np.array([t], np.int32)
        (valid,) = run_op("GT", [seq_lengths, timestep], jit=jit, input_names=names, broadcast=1)
        (invalid,) = run_op("LE", [seq_lengths, timestep], jit=jit, input_names=names, broadcast=1)
        assert valid.shape == (n,) and valid.dtype == np.bool_
        np.testing.assert_array_equal(valid, seq_lengths > t)
        np.testing.assert_array_equal(invalid, seq_lengths <= t)


def test_float_comparisons_with_nan_and_inf(jit):
    a = np.array([np.nan, np.inf, -np.inf, 1.0, np.nan], np.float32)
    b = np.array([np.nan, np.inf, 0.0, np.nan, 1.0], np.float32)
    for op_type, fn in COMPARISONS.items():
        (y,) = run_op(op_type, [a, b], jit=jit)
        np.testing.assert_array_equal(y, fn(a, b), err_msg=op_type)


def test_broadcast_defaults_to_numpy_rules(jit):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([[1], [4]], np.int32)
    (y,) = run_op("GE", [a, b], jit=jit)
    np.testing.assert_array_equal(y, a >= b)
    with pytest.raises(ShapeError, match="do not broadcast"):
        run_op("GE", [a, np.array([1, 4], np.int32)], jit=jit)
    (y,) = run_op("GE", [a, np.array([1, 4], np.int32)], jit=jit, broadcast=1, axis=0)
    np.testing.assert_array_equal(y, a >= b)


def test_legacy_axis_str(jit):
    a, b = values(3, "float32", (2, 3, 2, 2), (3,))
    (y,) = run_op("LT", [a, b], jit=jit, broadcast=1, axis_str="C")
    np.testing.assert_array_equal(y, a < b[None, :, None, None])
    a = np.moveaxis(a, 1, 3)
    (y,) = run_op("LT", [a, b], jit=jit, broadcast=1, axis_str="C", order="NHWC")
    np.testing.assert_array_equal(y, a < b)


# --------------------------------------------------------------------------------------------------
# Logical ops


@given(
    op_type=st.sampled_from(sorted(LOGICAL)),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
    seed=SEEDS,
)
def test_logical_numpy_broadcast(jit, op_type, shapes, seed):
    a, b = values(seed, "bool", *shapes.input_shapes)
    (y,) = run_op(op_type, [a, b], jit=jit)
    assert y.dtype == np.bool_ and y.shape == shapes.result_shape
    np.testing.assert_array_equal(y, LOGICAL[op_type](a, b))


@given(op_type=st.sampled_from(sorted(LOGICAL)), case=legacy_case(), seed=SEEDS)
def test_logical_legacy_broadcast(jit, op_type, case, seed):
    a_shape, b_shape, axis = case
    a, b = values(seed, "bool", a_shape, b_shape)
    args = {} if axis == -1 else {"axis": axis}
    (y,) = run_op(op_type, [a, b], jit=jit, broadcast=1, **args)
    assert y.shape == a.shape
    np.testing.assert_array_equal(y, legacy_reference(op_type, a, b, axis))


@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), seed=SEEDS)
def test_not(jit, shape, seed):
    (x,) = values(seed, "bool", shape)
    (y,) = run_op("Not", [x], jit=jit)
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, ~x)


# --------------------------------------------------------------------------------------------------
# Errors


def test_dtype_mismatch(jit):
    with pytest.raises(ShapeError, match="share one dtype"):
        run_op("GT", [np.ones(2, np.int32), np.ones(2, np.float32)], jit=jit)


@pytest.mark.parametrize("op_type", [*sorted(LOGICAL), "Not"])
def test_logical_ops_need_bool(jit, op_type):
    xs = [np.ones(2, np.int32)] * (1 if op_type == "Not" else 2)
    with pytest.raises(ShapeError, match="supports bool tensors"):
        run_op(op_type, xs, jit=jit)


def test_comparison_rejects_other_dtypes(jit):
    a = np.ones(2, np.uint8)
    with pytest.raises(ShapeError, match="dtype uint8"):
        run_op("EQ", [a, a], jit=jit)


@pytest.mark.parametrize(
    ("b_shape", "args", "match"),
    [((3, 2), {}, "mismatch"), ((2,), {}, "mismatch"), ((3,), {"axis": 2}, "outside")],
)
def test_legacy_bad_shapes(jit, b_shape, args, match):
    a, b = values(0, "int32", (2, 3), b_shape)
    with pytest.raises(ShapeError, match=match):
        run_op("NE", [a, b], jit=jit, broadcast=1, **args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"broadcast": 1, "axis": 0, "axis_str": "C"}, "cannot be used together"),
        ({"broadcast": 1, "axis_str": "Q"}, "axis_str"),
        ({"broadcast": "yes"}, "'broadcast' must be a boolean"),
    ],
)
def test_bad_arguments(jit, args, match):
    a, b = values(0, "int32", (2, 3), (3,))
    with pytest.raises(BadArgumentError, match=match):
        run_op("GT", [a, b], jit=jit, **args)


def test_arity(jit):
    with pytest.raises(BadArgumentError, match="takes 2 inputs"):
        run_op("GT", [np.ones(2, np.int32)], jit=jit)


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_compare.py)

COMPARABLE = (np.bool_, np.int32, np.int64, np.float32, np.float64)
OTHER = (np.int32, np.int64, np.float32, np.float64)


def _values(data: st.DataObject, shape, dtype):
    """Few distinct values, so that equal elements are common."""
    if np.dtype(dtype) == np.bool_:
        return data.draw(arrays(shape, np.bool_))
    return data.draw(arrays(shape, np.int8, -2, 2)).astype(dtype) / (2 if np.dtype(dtype).kind == "f" else 1)


def _binary(op_type: str, dtypes):
    def draw(data: st.DataObject):
        dtype = data.draw(st.sampled_from(dtypes))
        a_shape, b_shape, args = broadcast_shapes(data)
        b_dtype = data.draw(st.sampled_from(COMPARABLE)) if invalid(data) else dtype
        op = create_operator(op_type, ["A", "B"], ["C"], **args)
        return op, {"A": _values(data, a_shape, dtype), "B": _values(data, b_shape, b_dtype)}

    return draw


def draw_not(data: st.DataObject):
    dtype = data.draw(st.sampled_from(OTHER)) if invalid(data) else np.bool_
    return create_operator("Not", ["X"], ["Y"]), {"X": _values(data, data.draw(shapes(0, 4, min_side=0)), dtype)}


LOGICAL_DTYPES = (np.bool_,) * 6 + OTHER  # mostly bool; the others are refused

CASES = cases(
    *(Case(t, _binary(t, COMPARABLE)) for t in ("EQ", "NE", "LT", "LE", "GT", "GE")),
    *(Case(t, _binary(t, LOGICAL_DTYPES)) for t in ("And", "Or", "Xor")),
    Case("Not", draw_not),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_compare(caffe2, case, data):
    run_case(caffe2, case, data)


@pytest.mark.parametrize("op_type", list(CASES))
def test_no_gradient(caffe2, op_type):
    """SHOULD_NOT_DO_GRADIENT: Caffe2's maker throws, and so does the builder's."""
    inputs = ["X"] if op_type == "Not" else ["A", "B"]
    op = create_operator(op_type, inputs, ["Y"])
    with pytest.raises(Caffe2Error, match="should not call gradient"):
        caffe2.gradient_for_op(op, ["Y_grad"])
    with pytest.raises(GradientError, match="should not call gradient"):
        get_gradient_for_op(op, ["Y_grad"])
