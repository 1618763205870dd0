"""Differential tests of the fillers against real Caffe2 (see tests/differential.py).

Deterministic fillers must match exactly. Random fillers (Uniform, UniformInt, Gaussian, Xavier, MSRA)
draw from their own generators here and in Caffe2, so their values cannot be compared: for those the
shape and dtype are compared exactly and the values of both are checked against the distribution's
bounds (`check_random`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, cases, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import BadArgumentError
from rnn2jax.proto import caffe2_pb2 as pb

DT = pb.TensorProto


def shape_source(data, min_rank=0):
    """FillerOp's shape: argument `shape`; or the first input's shape (+ `extra_shape`); or, with
    `input_as_shape`, its values."""
    shape = data.draw(shapes(min_rank, 3, min_side=0, max_side=3)) if min_rank == 0 else None
    if shape is None:
        shape = data.draw(shapes(min_rank, 3, min_side=1, max_side=3))
    how = data.draw(st.sampled_from(["arg", "like", "as_shape"]))
    if how == "arg":
        return {"shape": list(shape)}, {}, tuple(shape)
    if how == "like":
        args = {}
        extra = ()
        if data.draw(st.booleans()):
            extra = tuple(data.draw(st.lists(st.integers(int(min_rank > 0), 3), min_size=0, max_size=2)))
            args["extra_shape"] = list(extra)
        return args, {"like": np.zeros(shape, np.float32)}, (*shape, *extra)
    if not len(shape):
        shape = (1,)
    return {"input_as_shape": 1}, {"dims": np.asarray(shape, np.int64)}, tuple(shape)


def draw_constant_fill(data):
    args, inputs, _ = shape_source(data)
    kind = data.draw(st.sampled_from(["none", "float", "int", "dtype"]))
    if kind == "float":
        args["value"] = data.draw(st.floats(-10, 10, width=32, allow_subnormal=False))
    elif kind == "int":
        args["value"] = data.draw(st.integers(-100, 100))
    elif kind == "dtype":
        dtype = data.draw(st.sampled_from([DT.FLOAT, DT.INT32, DT.BOOL, DT.INT64, DT.DOUBLE, DT.UINT8, DT.INT16]))
        args["dtype"] = dtype
        if dtype in (DT.FLOAT, DT.DOUBLE):
            args["value"] = data.draw(st.floats(-10, 10, width=32, allow_subnormal=False))
        elif dtype == DT.BOOL:
            args["value"] = data.draw(st.integers(0, 1))
        elif data.draw(st.booleans()):
            args["value"] = data.draw(st.integers(0, 100))
    return make_op("ConstantFill", list(inputs), ["y"], **args), inputs


GIVEN = {
    "GivenTensorFill": np.float32,
    "GivenTensorDoubleFill": np.float64,
    "GivenTensorBoolFill": np.bool_,
    "GivenTensorInt16Fill": np.int16,
    "GivenTensorIntFill": np.int32,
    "GivenTensorInt64Fill": np.int64,
}


def draw_given(op_type):
    def draw(data):
        shape = data.draw(shapes(0, 3, min_side=0, max_side=3))
        dtype = GIVEN[op_type]
        args = {}
        if op_type == "GivenTensorFill" and data.draw(st.booleans()):
            code = data.draw(st.sampled_from([DT.FLOAT, DT.DOUBLE, DT.BOOL, DT.INT32, DT.INT64]))
            args["dtype"] = code
            dtype = {DT.FLOAT: np.float32, DT.DOUBLE: np.float64}.get(code, dtype)
        n = math.prod(shape)
        if np.dtype(dtype).kind == "f":
            values = data.draw(st.lists(st.floats(-1e3, 1e3, width=32, allow_subnormal=False), min_size=n, max_size=n))
        elif np.dtype(dtype).kind == "b":
            values = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
        else:
            values = data.draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n))
        if "dtype" in args and args["dtype"] not in (DT.FLOAT, DT.DOUBLE):
            values = [float(v) for v in values]  # GivenTensorFill reads `floats` whatever its dtype
        return make_op(op_type, [], ["y"], shape=list(shape), values=values, **args), {}

    return draw


def draw_byte_string(data):
    raw = data.draw(st.binary(min_size=0, max_size=8))
    return make_op("GivenTensorByteStringToUInt8Fill", [], ["y"], shape=[len(raw)], values=[raw]), {}


def draw_string_fill(data):
    values = data.draw(st.lists(st.binary(min_size=0, max_size=4), min_size=1, max_size=3))
    return make_op("GivenTensorStringFill", [], ["y"], shape=[len(values)], values=values), {}


def draw_range_fill(data):
    args, inputs, _ = shape_source(data)
    return make_op("RangeFill", list(inputs), ["y"], **args), inputs


# --------------------------------------------------------------------------------------------------
# Random fillers: each draw returns the op, its inputs and a check of the values (shape, dtype compared)


def draw_uniform(data):
    args, inputs, _ = shape_source(data)
    low = data.draw(st.floats(-5, 5, width=32, allow_subnormal=False))
    high = low + data.draw(st.floats(0.5, 5, width=32, allow_subnormal=False))
    if data.draw(st.booleans()):
        args.update({"min": low, "max": high})
    else:
        low, high = 0.0, 1.0
    return make_op("UniformFill", list(inputs), ["y"], **args), inputs


def draw_uniform_int(data):
    args, inputs, _ = shape_source(data)
    if data.draw(st.booleans()):
        low = data.draw(st.integers(-100, 100))
        args.update({"min": low, "max": low + data.draw(st.integers(1, 10))})
    return make_op("UniformIntFill", list(inputs), ["y"], **args), inputs


def draw_gaussian(data):
    args, inputs, _ = shape_source(data)
    if data.draw(st.booleans()):
        args["mean"] = data.draw(st.floats(-5, 5, width=32, allow_subnormal=False))
    if data.draw(st.booleans()):
        args["std"] = data.draw(st.floats(0.125, 3, width=32, allow_subnormal=False))
    return make_op("GaussianFill", list(inputs), ["y"], **args), inputs


def draw_fan_fill(op_type, rank):
    """Non-empty shapes only: see test_empty_xavier_and_msra."""

    def draw(data):
        args, inputs, _ = shape_source(data, min_rank=rank)
        return make_op(op_type, list(inputs), ["y"], **args), inputs

    return draw


def arg(op, name, default):
    for a in op.arg:
        if a.name == name:
            return a.f if a.HasField("f") else a.i
    return default


def random_bounds(op, y):
    """Where every value of a random filler must lie (Caffe2's distributions; Gaussians within 7 std)."""
    if op.type == "UniformFill":
        return arg(op, "min", 0.0), arg(op, "max", 1.0)
    if op.type == "UniformIntFill":
        return arg(op, "min", 0), arg(op, "max", 1)
    if op.type == "GaussianFill":
        mean, std = arg(op, "mean", 0.0), arg(op, "std", 1.0)
        return mean - 7 * std, mean + 7 * std
    if y.size == 0:
        return 0, 0
    if op.type == "XavierFill":
        scale = math.sqrt(3.0 / (y.size // y.shape[0]))
        return -scale, scale
    std = math.sqrt(2.0 / (y.size // y.shape[1]))  # MSRAFill: Normal(0, sqrt(2 / fan_out))
    return -7 * std, 7 * std


RANDOM = {"UniformFill", "UniformIntFill", "GaussianFill", "XavierFill", "MSRAFill"}


def check_random(caffe2, case, data):
    """Random values cannot match Caffe2's draws: compare shape and dtype, check both stay in bounds."""
    op, inputs = case.draw(data)
    want = caffe2.run_op(op, inputs)["y"]
    got = run_rnn2jax([op], inputs, ["y"], jit=case.jit)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    low, high = random_bounds(op, want)
    tol = 1e-6 * max(abs(low), abs(high), 1.0)
    for name, y in (("Caffe2", want), ("rnn2jax", got)):
        assert np.all(np.isfinite(y)), name
        assert y.size == 0 or (y.min() >= low - tol and y.max() <= high + tol), (name, y.min(), y.max(), low, high)


CASES = cases(
    Case("ConstantFill", draw_constant_fill),
    *(Case(name, draw_given(name)) for name in GIVEN),
    Case("GivenTensorByteStringToUInt8Fill", draw_byte_string),
    Case("GivenTensorStringFill", draw_string_fill, note="strings: rnn2jax refuses clearly"),
    Case("RangeFill", draw_range_fill),
    Case("UniformFill", draw_uniform, note="random: shape, dtype and bounds"),
    Case("UniformIntFill", draw_uniform_int, note="random: shape, dtype and bounds"),
    Case("GaussianFill", draw_gaussian, note="random: shape, dtype and bounds"),
    Case("XavierFill", draw_fan_fill("XavierFill", 1), note="random: shape, dtype and bounds"),
    Case("MSRAFill", draw_fan_fill("MSRAFill", 2), note="random: shape, dtype and bounds"),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type in RANDOM:
        check_random(caffe2, case, data)
    elif case.op_type == "GivenTensorStringFill":
        # Caffe2 makes a string tensor; JAX has no strings, so rnn2jax refuses the op clearly.
        op, inputs = case.draw(data)
        want = caffe2.run_op(op, inputs)["y"]
        assert want.dtype.kind in "SO" and want.shape == (len(op.arg[1].strings),)
        with pytest.raises(BadArgumentError, match="string"):
            run_rnn2jax([op], inputs, ["y"])
    else:
        run_case(caffe2, case, data)


def test_fill_shape_errors_match_caffe2(caffe2):
    """Shape argument and an input together, and extra_shape without an input: both refused."""
    from differential import check_op

    like = {"like": np.zeros((2,), np.float32)}
    assert check_op(caffe2, make_op("ConstantFill", ["like"], ["y"], shape=[3]), like) is None
    assert check_op(caffe2, make_op("ConstantFill", [], ["y"], shape=[3], extra_shape=[2]), {}) is None
    assert check_op(caffe2, make_op("GivenTensorFill", [], ["y"], shape=[3], values=[1.0, 2.0]), {}) is None


def test_empty_xavier_and_msra(caffe2):
    """Caffe2 is broken for empty outputs of XavierFill/MSRAFill: it divides by a zero dim (the worker dies
    of SIGFPE for Xavier [0, 3] or MSRA [1, 0]) or refuses the infinite scale of a zero fan-in (Xavier
    [1, 0]: "Expected to - from <= std::numeric_limits<T>::max()"). There are no values to draw, so
    rnn2jax returns the empty array."""
    op = make_op("XavierFill", [], ["y"], shape=[1, 0])
    with pytest.raises(Caffe2Error, match="numeric_limits"):
        caffe2.run_op(op, {})
    for op_type, shape in (("XavierFill", [1, 0]), ("XavierFill", [0, 3]), ("MSRAFill", [1, 0]), ("MSRAFill", [0])):
        if op_type == "MSRAFill" and len(shape) < 2:
            continue
        y = run_rnn2jax([make_op(op_type, [], ["y"], shape=shape)], {}, ["y"])["y"]
        assert y.shape == tuple(shape) and y.dtype == np.float32
