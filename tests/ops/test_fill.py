"""The fill family (rnn2jax/ops/fill.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: Fillers (ConstantFill, GivenTensor*Fill, RangeFill, random fills) against
NumPy references from Caffe2's filler_op.h / given_tensor_fill_op.h semantics.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the fillers against
real Caffe2 (see tests/differential.py).

Deterministic fillers must match exactly. Random fillers (Uniform, UniformInt, Gaussian, Xavier, MSRA) draw from
their own generators here and in Caffe2, so their values cannot be compared: for those the shape and dtype are
compared exactly and the values of both are checked against the distribution's bounds (`check_random`).
"""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from differential import Case, cases, make_op, run_case, run_rnn2jax, shapes
from helpers import run_op
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.proto import caffe2_pb2 as pb
from tests.host_differential import check_net

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_fill.py)

# TensorProto.DataType codes
FLOAT, INT32, STRING, BOOL, UINT8, INT16, INT64, DOUBLE = 1, 2, 4, 5, 6, 9, 10, 13
NP_TYPES = {FLOAT: np.float32, INT32: np.int32, BOOL: np.bool_, UINT8: np.uint8, INT16: np.int16}
NP_TYPES.update({INT64: np.int64, DOUBLE: np.float64})

fill_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
nonempty_shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)
f32 = st.floats(-1e6, 1e6, width=32)


def assert_exact(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


# ---------------------------------------------------------------------------------------------------
# ConstantFill


@given(shape=fill_shapes, value=f32)
def test_constant_fill_float(jit, shape, value):
    (y,) = run_op("ConstantFill", [], jit=jit, shape=list(shape), value=value)
    assert_exact(y, np.full(shape, value, np.float32))


@given(shape=fill_shapes, value=st.integers(-(2**31), 2**31 - 1))
def test_constant_fill_int_value_means_int64(jit, shape, value):
    (y,) = run_op("ConstantFill", [], jit=jit, shape=list(shape), value=value)
    assert_exact(y, np.full(shape, value, np.int64))


@given(
    shape=fill_shapes,
    dtype=st.sampled_from([FLOAT, DOUBLE, INT32, INT64, INT16, UINT8, BOOL]),
    value=st.integers(0, 200),
    as_float=st.booleans(),
)
def test_constant_fill_dtype_casts_value(jit, shape, dtype, value, as_float):
    given_value = float(value) if as_float else value
    (y,) = run_op("ConstantFill", [], jit=jit, shape=list(shape), value=given_value, dtype=dtype)
    assert_exact(y, np.full(shape, value, NP_TYPES[dtype]))


def test_constant_fill_defaults(jit):
    (y,) = run_op("ConstantFill", [], jit=jit, shape=[2, 3])
    assert_exact(y, np.zeros((2, 3), np.float32))
    (y,) = run_op("ConstantFill", [], jit=jit)  # no shape: a scalar
    assert_exact(y, np.zeros((), np.float32))
    (y,) = run_op("ConstantFill", [], jit=jit, shape=[3], dtype="bool", value=7)
    assert_exact(y, np.ones(3, np.bool_))


@given(x=hnp.arrays(np.float32, fill_shapes), extra=st.lists(st.integers(0, 3), max_size=2), value=f32)
def test_constant_fill_shape_of_input(jit, x, extra, value):
    (y,) = run_op("ConstantFill", [x], jit=jit, extra_shape=extra, value=value)
    assert_exact(y, np.full(x.shape + tuple(extra), value, np.float32))


@given(dims=st.lists(st.integers(0, 4), min_size=1, max_size=3), extra=st.lists(st.integers(1, 3), max_size=2))
def test_constant_fill_input_as_shape(jit, dims, extra):
    shape_blob = np.array(dims, np.int32)
    if jit:  # the blob's values become shapes: under jit they are traced
        with pytest.raises(ShapeError, match=r"input_as_shape.*'x0'"):
            run_op("ConstantFill", [shape_blob], jit=jit, input_as_shape=1, extra_shape=extra, value=2.0)
        return
    (y,) = run_op("ConstantFill", [shape_blob], jit=jit, input_as_shape=1, extra_shape=extra, value=2.0)
    assert_exact(y, np.full(tuple(dims) + tuple(extra), 2.0, np.float32))


@given(x=hnp.arrays(np.float32, nonempty_shapes), v=f32)
def test_constant_fill_value_input(jit, x, v):
    (y,) = run_op("ConstantFill", [x, np.array([v], np.float32)], jit=jit)
    assert_exact(y, np.full(x.shape, v, np.float32))
    (y,) = run_op("ConstantFill", [x, np.array(3.0, np.float32)], jit=jit, dtype=INT32)
    assert_exact(y, np.full(x.shape, 3, np.int32))


def test_constant_fill_errors(jit):
    x = np.zeros((2, 2), np.float32)
    cases = [
        ({"shape": [2]}, [x], BadArgumentError, "'shape'.*input"),
        ({"extra_shape": [2]}, [], BadArgumentError, "extra_shape"),
        ({"input_as_shape": 1}, [], BadArgumentError, "input_as_shape"),
        ({"shape": [2], "value": "a"}, [], BadArgumentError, "'value'"),
        ({"shape": [2], "dtype": STRING}, [], BadArgumentError, "STRING"),
        ({"shape": [2], "dtype": 99}, [], BadArgumentError, "'dtype'"),
        ({"shape": [2], "value": 2**40, "dtype": INT32}, [], BadArgumentError, "'value'.*int32"),
        ({"shape": [2], "value": 300, "dtype": UINT8}, [], BadArgumentError, "'value'.*uint8"),
        ({"shape": [2], "value": 1.5, "dtype": INT32}, [], BadArgumentError, "'value'.*integers"),
        ({"shape": [-1]}, [], BadArgumentError, "'shape'"),
        ({"shape": 3}, [], BadArgumentError, "'shape'"),
        ({}, [x, np.zeros(2, np.float32)], ShapeError, "'x1'.*one value"),
    ]
    for args, inputs, error, match in cases:
        with pytest.raises(error, match=match):
            run_op("ConstantFill", inputs, jit=jit, **args)
    # an integer value makes an int64 fill, as in Caffe2, and keeps all its bits
    (y,) = run_op("ConstantFill", [], jit=jit, shape=[1], value=2**40)
    assert_exact(y, np.array([2**40], np.int64))


def test_input_as_shape_errors():
    for blob, match in [
        (np.array([[2]], np.int64), "1-D"),
        (np.array([], np.int64), "1-D"),
        (np.array([2.0]), "integer"),
        (np.array([2, -1]), "negative"),
    ]:
        with pytest.raises(ShapeError, match=match):
            run_op("ConstantFill", [blob], jit=False, input_as_shape=1)


# ---------------------------------------------------------------------------------------------------
# GivenTensor*Fill


@given(data=st.data(), shape=fill_shapes)
def test_given_tensor_fill(jit, data, shape):
    n = math.prod(shape)
    values = data.draw(st.lists(f32, min_size=n, max_size=n))
    (y,) = run_op("GivenTensorFill", [], jit=jit, shape=list(shape), values=[float(v) for v in values])
    assert_exact(y, np.array(values, np.float32).reshape(shape))


INT_FILLS = {
    "GivenTensorIntFill": (np.int32, st.integers(-(2**31), 2**31 - 1)),
    "GivenTensorInt64Fill": (np.int64, st.integers(-(2**31), 2**31 - 1)),
    "GivenTensorInt16Fill": (np.int16, st.integers(-(2**15), 2**15 - 1)),
    "GivenTensorBoolFill": (np.bool_, st.booleans()),
}


@given(data=st.data(), shape=fill_shapes, op_type=st.sampled_from(sorted(INT_FILLS)))
def test_given_tensor_typed_fills(jit, data, shape, op_type):
    dtype, elements = INT_FILLS[op_type]
    n = math.prod(shape)
    values = data.draw(st.lists(elements, min_size=n, max_size=n))
    (y,) = run_op(op_type, [], jit=jit, shape=list(shape), values=values)
    assert_exact(y, np.array(values, dtype).reshape(shape))


@given(x=hnp.arrays(np.float32, fill_shapes), extra=st.lists(st.integers(0, 2), max_size=2))
def test_given_tensor_double_fill_shape_of_input(jit, x, extra):
    shape = x.shape + tuple(extra)
    values = np.arange(math.prod(shape), dtype=np.float32) / 4
    (y,) = run_op("GivenTensorDoubleFill", [x], jit=jit, extra_shape=extra, values=values)
    assert_exact(y, values.astype(np.float64).reshape(shape))


@pytest.mark.parametrize(
    ("dtype", "values", "expected"),
    [
        (INT32, [1, -2, 3], np.array([1, -2, 3], np.int32)),
        (BOOL, [1, 0, 1], np.array([True, False, True])),
        (DOUBLE, [0.5, 1.5, 2.5], np.array([0.5, 1.5, 2.5], np.float64)),
        ("int64", [4, 5, 6], np.array([4, 5, 6], np.int64)),
    ],
)
def test_given_tensor_fill_dtype(jit, dtype, values, expected):
    (y,) = run_op("GivenTensorFill", [], jit=jit, shape=[3], values=values, dtype=dtype)
    assert_exact(y, expected)


def test_given_tensor_byte_string_fill(jit):
    data = b"\x00\xff\x10abc"
    (y,) = run_op("GivenTensorByteStringToUInt8Fill", [], jit=jit, shape=[2, 3], values=[data])
    assert_exact(y, np.frombuffer(data, np.uint8).reshape(2, 3))
    (y,) = run_op("GivenTensorByteStringToUInt8Fill", [], jit=jit, shape=[3], values=["hé"], dtype=STRING)
    assert_exact(y, np.frombuffer("hé".encode(), np.uint8))


def test_given_tensor_fill_errors(jit):
    cases = [
        ("GivenTensorFill", {"shape": [2, 2], "values": [1.0, 2.0, 3.0]}, [], "3 values.*\\[2, 2\\].*4"),
        ("GivenTensorIntFill", {"shape": [1], "values": [2**31]}, [], "int32"),
        ("GivenTensorInt16Fill", {"shape": [1], "values": [40000]}, [], "int16"),
        ("GivenTensorIntFill", {"shape": [1], "values": [1.5]}, [], "'values'"),
        ("GivenTensorFill", {"shape": [1]}, [], "missing.*'values'"),
        ("GivenTensorFill", {"shape": [1], "values": [1.0], "dtype": INT16}, [], "dtype"),
        ("GivenTensorFill", {"shape": [1], "values": [1.0], "dtype": STRING}, [], "STRING"),
        ("GivenTensorStringFill", {"shape": [1], "values": ["a"]}, [], "string"),
        ("GivenTensorByteStringToUInt8Fill", {"shape": [1], "values": ["a", "b"]}, [], "one string"),
        ("GivenTensorByteStringToUInt8Fill", {"shape": [1], "values": ["a"], "dtype": FLOAT}, [], "dtype"),
        ("GivenTensorFill", {"values": [1.0, 2.0]}, [np.zeros(3, np.float32)], "2 values.*\\[3\\]"),
    ]
    for op_type, args, inputs, match in cases:
        with pytest.raises(BadArgumentError, match=rf"op #0 \({op_type}\).*{match}"):
            run_op(op_type, inputs, jit=jit, **args)


@given(shape=fill_shapes)
def test_range_fill(jit, shape):
    (y,) = run_op("RangeFill", [], jit=jit, shape=list(shape))
    assert_exact(y, np.arange(math.prod(shape), dtype=np.float32).reshape(shape))


# ---------------------------------------------------------------------------------------------------
# Random fillers: shape, dtype, bounds, determinism per key, statistics


# Every example of a random fill compiles a fresh threefry kernel: fewer examples keep the file fast.
RANDOM_EXAMPLES = settings(max_examples=6)


def run_random(op_type, jit, seed, inputs=(), **args):
    (y,) = run_op(op_type, list(inputs), jit=jit, key=jax.random.key(seed), **args)
    return y


def check_keys(op_type, jit, **args):
    """Same key -> same values; another key -> other values."""
    a = run_random(op_type, jit, 1, **args)
    np.testing.assert_array_equal(a, run_random(op_type, jit, 1, **args))
    assert not np.array_equal(a, run_random(op_type, jit, 2, **args))
    return a


@RANDOM_EXAMPLES
@given(shape=fill_shapes, low=st.floats(-10, 10), width=st.floats(0.01, 10), seed=st.integers(0, 2**16))
def test_uniform_fill(jit, shape, low, width, seed):
    y = run_random("UniformFill", jit, seed, shape=list(shape), min=low, max=low + width)
    assert y.shape == shape and y.dtype == np.float32
    assert np.all((y >= np.float32(low)) & (y <= np.float32(low + width)))


def test_uniform_fill_defaults_and_statistics(jit):
    y = check_keys("UniformFill", jit, shape=[100, 100])
    assert y.min() >= 0 and y.max() < 1
    assert abs(y.mean() - 0.5) < 0.01 and abs(y.std() - math.sqrt(1 / 12)) < 0.01


def test_uniform_fill_range_from_inputs():
    # The shape blob's values decide the shape: this form runs eagerly (test_constant_fill_input_as_shape).
    inputs = [np.array([50, 40]), np.float32(-3.0), np.array([-2.0], np.float32)]
    y = run_random("UniformFill", False, 0, inputs, input_as_shape=1)
    assert y.shape == (50, 40) and y.dtype == np.float32
    assert y.min() >= -3 and y.max() <= -2 and abs(y.mean() + 2.5) < 0.05
    y = run_random("UniformIntFill", False, 0, [np.array([2000]), np.int32(3), np.int32(5)], input_as_shape=1)
    assert y.dtype == np.int32 and set(np.unique(y)) == {3, 4, 5}


@RANDOM_EXAMPLES
@given(x=hnp.arrays(np.float32, fill_shapes), seed=st.integers(0, 100))
def test_uniform_fill_range_inputs_with_shape_of_input(jit, x, seed):
    y = run_random("UniformFill", jit, seed, [x, np.float32(2), np.float32(4)])
    assert y.shape == x.shape and np.all((y >= 2) & (y <= 4))


@RANDOM_EXAMPLES
@given(shape=fill_shapes, low=st.integers(-(2**31), 2**31 - 2), width=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_uniform_int_fill(jit, shape, low, width, seed):
    high = min(low + width, 2**31 - 1)
    y = run_random("UniformIntFill", jit, seed, shape=list(shape), min=low, max=high)
    assert y.shape == shape and y.dtype == np.int32
    assert np.all((y >= low) & (y <= high))


def test_uniform_int_fill_inclusive(jit):
    y = check_keys("UniformIntFill", jit, shape=[3000], min=-1, max=1)
    assert set(np.unique(y)) == {-1, 0, 1}
    y = run_random("UniformIntFill", jit, 0, shape=[3000])  # defaults min 0, max 1, both inclusive
    assert set(np.unique(y)) == {0, 1} and abs(y.mean() - 0.5) < 0.05
    y = run_random("UniformIntFill", jit, 0, shape=[3000], min=2**31 - 2, max=2**31 - 1)
    assert set(np.unique(y)) == {2**31 - 2, 2**31 - 1}


def test_uniform_fill_errors(jit):
    cases = [
        ("UniformFill", {"shape": [2], "min": 1.0, "max": 1.0}, [], "'max'.*bigger"),
        ("UniformIntFill", {"shape": [2], "min": 3, "max": 2}, [], "'max'.*bigger"),
        ("UniformIntFill", {"shape": [2], "min": 0, "max": 2**32}, [], "int32"),
        ("UniformIntFill", {"shape": [2], "min": 0.5}, [], "'min'"),
        ("UniformFill", {"min": 0.0}, [np.zeros(2), np.float32(0), np.float32(1)], "'min'.*input"),
        ("UniformFill", {}, [np.zeros(2), np.float32(0)], "0, 1 or 3 inputs"),
        ("GaussianFill", {"shape": [2], "std": -1.0}, [], "'std'"),
    ]
    for op_type, args, inputs, match in cases:
        with pytest.raises(BadArgumentError, match=rf"op #0 \({op_type}\).*{match}"):
            run_op(op_type, inputs, jit=jit, **args)
    with pytest.raises(ShapeError, match=r"'x1'.*one value"):
        run_op("UniformFill", [np.zeros(2), np.zeros(2, np.float32), np.float32(1)], jit=jit)


@RANDOM_EXAMPLES
@given(shape=fill_shapes, mean=st.floats(-5, 5), std=st.floats(0.1, 3), seed=st.integers(0, 2**16))
def test_gaussian_fill(jit, shape, mean, std, seed):
    y = run_random("GaussianFill", jit, seed, shape=list(shape), mean=mean, std=std)
    assert y.shape == shape and y.dtype == np.float32 and np.all(np.isfinite(y))


def test_gaussian_fill_statistics(jit):
    y = check_keys("GaussianFill", jit, shape=[100, 100])  # defaults: mean 0, std 1
    assert abs(y.mean()) < 0.03 and abs(y.std() - 1) < 0.03
    y = run_random("GaussianFill", jit, 3, shape=[100, 100], mean=2.0, std=0.5)
    assert abs(y.mean() - 2) < 0.02 and abs(y.std() - 0.5) < 0.02


@RANDOM_EXAMPLES
@given(shape=nonempty_shapes, seed=st.integers(0, 2**16))
def test_xavier_fill(jit, shape, seed):
    y = run_random("XavierFill", jit, seed, shape=list(shape))
    bound = math.sqrt(3 / (math.prod(shape) / shape[0]))
    assert y.shape == shape and y.dtype == np.float32
    assert np.all(np.abs(y) <= np.float32(bound))


def test_xavier_fill_statistics(jit):
    y = check_keys("XavierFill", jit, shape=[50, 20, 10])  # fan_in = 200
    bound = math.sqrt(3 / 200)
    assert np.abs(y).max() <= np.float32(bound) and np.abs(y).max() > 0.99 * bound
    assert abs(y.mean()) < 0.02 * bound and abs(y.std() - bound / math.sqrt(3)) < 0.03 * bound


@RANDOM_EXAMPLES
@given(shape=hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=4), seed=st.integers(0, 2**16))
def test_msra_fill(jit, shape, seed):
    y = run_random("MSRAFill", jit, seed, shape=list(shape))
    assert y.shape == shape and y.dtype == np.float32 and np.all(np.isfinite(y))


def test_msra_fill_statistics(jit):
    y = check_keys("MSRAFill", jit, shape=[20, 50, 10])  # fan_out = numel / dim 1 = 200 (fan_in would be 500)
    std = math.sqrt(2 / 200)
    assert abs(y.mean()) < 0.03 * std and abs(y.std() - std) < 0.03 * std


def test_random_fill_shape_from_input_and_empty(jit):
    x = np.zeros((3, 0), np.float32)
    for op_type in ("XavierFill", "MSRAFill", "UniformFill", "GaussianFill", "UniformIntFill"):
        y = run_random(op_type, jit, 0, [x], extra_shape=[2])
        assert y.shape == (3, 0, 2)


def test_random_fill_rank_errors(jit):
    with pytest.raises(ShapeError, match=r"op #0 \(XavierFill\).*rank >= 1"):
        run_op("XavierFill", [], jit=jit, shape=[])
    with pytest.raises(ShapeError, match=r"op #0 \(MSRAFill\).*rank >= 2"):
        run_op("MSRAFill", [np.zeros(5, np.float32)], jit=jit)


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_fill.py)

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
    """Strings in a shape from `shape`, an input's shape or (input_as_shape) its values; sometimes as many values
    as the shape needs plus or minus one, which Caffe2 refuses."""
    shape = data.draw(shapes(0, 3, min_side=0, max_side=3))
    count = max(0, math.prod(shape) + data.draw(st.sampled_from([0, 0, 0, 1, -1])))
    values = data.draw(st.lists(st.binary(min_size=0, max_size=4), min_size=count, max_size=count))
    source = data.draw(st.sampled_from(["shape", "input", "input_as_shape"]))
    if source == "shape":
        return make_op("GivenTensorStringFill", [], ["y"], shape=list(shape), values=values), {}
    if source == "input":
        return make_op("GivenTensorStringFill", ["x"], ["y"], values=values), {"x": np.zeros(shape, np.float32)}
    dims = np.asarray(shape, np.int64)
    return make_op("GivenTensorStringFill", ["x"], ["y"], values=values, input_as_shape=1), {"x": dims}


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


def draw_unique_uniform(data):
    """Distinct values: as many as fit in [min, max] less those avoided (more: both refuse)."""
    low = data.draw(st.integers(-5, 5))
    high = low + data.draw(st.integers(1, 8))
    dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    args = {"min": low, "max": high}
    if dtype == np.int64 or data.draw(st.booleans()):
        args["dtype"] = DT.INT64 if dtype == np.int64 else DT.INT32
    avoid = np.asarray(data.draw(st.lists(st.integers(low, high), max_size=3, unique=True)), dtype)
    room = high - low + 1 - avoid.size
    shape = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).filter(lambda s: math.prod(s) <= room + 1))
    if data.draw(st.booleans()):
        inputs = {"like": np.zeros(shape, np.float32), "avoid": avoid}
        return make_op("UniqueUniformFill", ["like", "avoid"], ["y"], **args), inputs
    return make_op("UniqueUniformFill", [], ["y"], shape=shape, **args), {}


def check_unique_uniform(caffe2, case, data):
    """Values cannot match Caffe2's draws: shape and dtype must, and both draw distinct, in-range values
    that avoid the second input."""
    op, inputs = case.draw(data)
    try:
        want = caffe2.run_op(op, inputs)["y"]
    except Caffe2Error:
        with pytest.raises(ShapeError, match="unique requirement"):
            run_rnn2jax([op], inputs, ["y"])
        return
    got = run_rnn2jax([op], inputs, ["y"])["y"]
    assert (got.shape, got.dtype) == (want.shape, want.dtype), (got.shape, got.dtype, want.shape, want.dtype)
    low, high = arg(op, "min", 0), arg(op, "max", 0)
    avoid = set(inputs.get("avoid", np.zeros(0)).tolist())
    for y in (want, got):
        values = y.ravel().tolist()
        assert len(set(values)) == len(values) and all(low <= v <= high and v not in avoid for v in values), values


CASES = cases(
    Case("ConstantFill", draw_constant_fill),
    Case("UniqueUniformFill", draw_unique_uniform, note="random: shape, dtype, distinct values in range"),
    *(Case(name, draw_given(name)) for name in GIVEN),
    Case("GivenTensorByteStringToUInt8Fill", draw_byte_string),
    Case("GivenTensorStringFill", draw_string_fill, jit=False, note="host op: strings, which JAX has no arrays for"),
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
    elif case.op_type == "UniqueUniformFill":
        check_unique_uniform(caffe2, case, data)
    elif case.op_type == "GivenTensorStringFill":
        # a host op (JAX has no strings): a workspace runs it, as a net in both
        op, inputs = case.draw(data)
        check_net(caffe2, [op], inputs)
    else:
        run_case(caffe2, case, data)


def test_given_tensor_string_fill_needs_values(caffe2):
    """`values` is required (Caffe2's schema), though it may be empty."""
    check_net(caffe2, [make_op("GivenTensorStringFill", [], ["y"], shape=[0])], fails=True)
    check_net(caffe2, [make_op("GivenTensorStringFill", [], ["y"], shape=[0], values=[])], fails=False)


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
