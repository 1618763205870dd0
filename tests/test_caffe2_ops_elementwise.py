"""Differential tests of the elementwise arithmetic ops (Add/Sub/Mul/Div in both broadcast modes, Sum,
SumReduceLike, Scale, Clip and the unary math ops) and their gradients against real Caffe2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, cases, check_gradient, check_op, dims, invalid, run_case, shapes
from rnn2jax.caffe2.opdef import create_operator

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
