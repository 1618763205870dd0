"""Differential tests of the reductions against real Caffe2 (see tests/differential.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, run_case, shapes
from rnn2jax.caffe2 import create_operator


def make_op(op_type, inputs, outputs, **args):
    op = create_operator(op_type, inputs, outputs, **args)
    op.ClearField("engine")
    return op


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


CASES = cases(
    *(
        Case(name, draw_front_back(name), gradient_ops=(f"{name}Gradient",))
        for name in ("ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean")
    ),
    Case("ReduceSum", draw_reduce_axes("ReduceSum"), gradient_ops=("ReduceSumGradient",)),
    Case("ReduceMean", draw_reduce_axes("ReduceMean"), gradient_ops=("ReduceMeanGradient",)),
    Case("SumElements", draw_sum_elements, gradient_ops=("SumElementsGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)
