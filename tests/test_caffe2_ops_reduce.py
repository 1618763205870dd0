"""Differential tests of the reductions against real Caffe2 (see tests/differential.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, dims, invalid, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.errors import BadArgumentError


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
