"""Shape and data-movement ops against NumPy references written from Caffe2's semantics."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rnn2jax
from helpers import run_op
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower

INT64 = np.dtype(np.int64)  # Caffe2's int64, kept by rnn2jax

small_shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)


def floats(shape) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, shape, elements=st.floats(-10, 10, width=32))


def run_net(ops, inputs: dict, outputs: list[str], jit: bool) -> list[np.ndarray]:
    """Run several ops as one net (to check blobs that one op writes and another reads)."""
    lowered = lower(load(create_net("t", ops)))

    def fn(env):
        out = lowered(env)
        return [out[n] for n in outputs]

    return [np.asarray(o) for o in (jax.jit(fn) if jit else fn)(inputs)]


# --------------------------------------------------------------------------------------------------
# Identities


IDENTITIES = [
    "Copy",
    "Alias",
    "StopGradient",
    "EnsureCPUOutput",
    "CopyGPUToCPU",
    "CopyCPUToGPU",
    "CopyFromCPUInput",
]


@given(op_type=st.sampled_from(IDENTITIES), data=st.data())
def test_identity_ops(jit, op_type, data):
    x = data.draw(st.one_of(floats(small_shapes), hnp.arrays(np.int32, small_shapes)))
    (y,) = run_op(op_type, [x], jit=jit)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)


@given(x=floats(small_shapes), like=floats(small_shapes))
def test_copy_on_device_like_copies_input_0(jit, x, like):
    (y,) = run_op("CopyOnDeviceLike", [x, like], jit=jit)
    np.testing.assert_array_equal(y, x)


def test_stop_gradient_blocks_the_gradient(jit):
    ops = [
        create_operator("StopGradient", ["x"], ["s"]),
        create_operator("Concat", ["x", "s"], ["y", "_"], axis=0),
    ]
    lowered = lower(load(create_net("t", ops)))

    def f(x):
        return lowered({"x": x})["y"].sum()

    grad = jax.grad(f)
    x = np.array([1.0, -2.0, 3.0], np.float32)
    np.testing.assert_array_equal((jax.jit(grad) if jit else grad)(x), np.ones(3))  # only the x half counts


# --------------------------------------------------------------------------------------------------
# Reshape


@st.composite
def reshapes(draw):
    """(x, target shape, the `shape` argument spelling it with Caffe2's 0s and at most one -1)."""
    old = draw(small_shapes)
    dims = list(old)
    draw(st.randoms()).shuffle(dims)
    new: list[int] = []
    for d in dims:  # regroup the dims into a new shape of the same size
        if new and draw(st.booleans()):
            new[-1] *= d
        else:
            new.append(d)
    if draw(st.booleans()):
        new.insert(draw(st.integers(0, len(new))), 1)
    spelled = [0 if i < len(old) and d == old[i] and draw(st.booleans()) else d for i, d in enumerate(new)]
    if draw(st.booleans()):
        spelled[draw(st.integers(0, len(new) - 1))] = -1
    return draw(floats(old)), tuple(new), spelled


@given(case=reshapes())
def test_reshape_argument(jit, case):
    x, target, spelled = case
    y, old_shape = run_op("Reshape", [x], 2, jit=jit, shape=spelled)
    np.testing.assert_array_equal(y, x.reshape(target))
    assert old_shape.dtype == INT64
    np.testing.assert_array_equal(old_shape, x.shape)


@given(case=reshapes(), index_dtype=st.sampled_from([np.int32, np.int64]))
def test_reshape_shape_input_must_be_concrete(jit, case, index_dtype):
    x, target, spelled = case
    new_shape = np.array(spelled, index_dtype)
    if jit:  # a jit argument is traced: its values cannot decide a shape
        with pytest.raises(ShapeError, match=r"traced.*argument 'shape'"):
            run_op("Reshape", [x, new_shape], 2, jit=jit)
        return
    y, old_shape = run_op("Reshape", [x, new_shape], 2, jit=jit)
    np.testing.assert_array_equal(y, x.reshape(target))
    assert old_shape.dtype == index_dtype  # Caffe2: the shape input's type
    np.testing.assert_array_equal(old_shape, x.shape)


def test_reshape_to_scalar_and_empty(jit):
    (y,) = run_op("Reshape", [np.array([[5.0]], np.float32)], jit=jit, shape=[])
    assert y.shape == ()
    (y,) = run_op("Reshape", [np.zeros((0, 3), np.float32)], jit=jit, shape=[-1, 6])
    assert y.shape == (0, 6)


def test_reshape_back_with_old_shape_under_jit(jit):
    """The gradient pattern Reshape(GO, old_shape): the shape blob stays concrete inside a jitted net."""
    ops = [
        create_operator("Reshape", ["x"], ["y", "old"], shape=[-1]),
        create_operator("Reshape", ["y", "old"], ["z", "_"]),
    ]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    z, old = run_net(ops, {"x": x}, ["z", "old"], jit)
    np.testing.assert_array_equal(z, x)
    np.testing.assert_array_equal(old, [2, 3, 4])


@pytest.mark.parametrize(
    ("args", "inputs", "error", "match"),
    [
        ({}, 1, BadArgumentError, "missing argument 'shape'"),
        ({"shape": [2, 3]}, 2, BadArgumentError, "do not also pass argument 'shape'"),
        ({"shape": [-1, -1]}, 1, BadArgumentError, "more than one -1"),
        ({"shape": [-2, 3]}, 1, BadArgumentError, r"invalid dims \[-2\]"),
        ({"shape": [4, 2]}, 1, ShapeError, "does not fit"),
        ({"shape": [-1, 4]}, 1, ShapeError, "does not fit"),
        ({"shape": [1, 6, 0]}, 1, ShapeError, "copies input dim 2"),
    ],
)
def test_reshape_errors(jit, args, inputs, error, match):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(error, match=match):
        run_op("Reshape", [x, np.array([6], np.int64)][:inputs], 2, jit=jit, **args)


# --------------------------------------------------------------------------------------------------
# Transpose


@given(data=st.data())
def test_transpose(jit, data):
    x = data.draw(floats(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3)))
    axes = data.draw(st.none() | st.permutations(range(x.ndim)))
    if axes is None:  # the default: reverse the dims
        (y,) = run_op("Transpose", [x], jit=jit)
        np.testing.assert_array_equal(y, np.transpose(x, tuple(reversed(range(x.ndim)))))
    else:
        (y,) = run_op("Transpose", [x], jit=jit, axes=axes)
        np.testing.assert_array_equal(y, np.transpose(x, axes))


def test_transpose_errors(jit):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(BadArgumentError, match="not a permutation"):
        run_op("Transpose", [x], jit=jit, axes=[0, 2])
    with pytest.raises(ShapeError, match="does not fit"):
        run_op("Transpose", [x], jit=jit, axes=[2, 0, 1])


# --------------------------------------------------------------------------------------------------
# Concat


@st.composite
def concat_cases(draw):
    """(inputs, axis): inputs that agree on every dim but `axis` (where sizes vary, 0 included)."""
    shape = list(draw(small_shapes))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    xs = []
    for _ in range(draw(st.integers(1, 3))):
        shape[axis] = draw(st.integers(0, 3))
        xs.append(draw(floats(tuple(shape))))
    return xs, axis


@given(case=concat_cases())
def test_concat(jit, case):
    xs, axis = case
    y, split_info = run_op("Concat", xs, 2, jit=jit, axis=axis)
    np.testing.assert_array_equal(y, np.concatenate(xs, axis=axis))
    assert split_info.dtype == np.int32
    np.testing.assert_array_equal(split_info, [x.shape[axis] for x in xs])


@given(data=st.data())
def test_concat_add_axis_stacks(jit, data):
    shape = data.draw(small_shapes)
    xs = [data.draw(floats(shape)) for _ in range(data.draw(st.integers(1, 3)))]
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    y, split_info = run_op("Concat", xs, 2, jit=jit, axis=axis, add_axis=1)
    np.testing.assert_array_equal(y, np.stack(xs, axis=axis))
    np.testing.assert_array_equal(split_info, [1] * len(xs))


def test_concat_axis_from_order(jit):
    xs = [np.random.default_rng(i).standard_normal((2, 1 + i, 3, 1 + i)).astype(np.float32) for i in range(2)]
    xs_c = [x[..., :1] for x in xs]  # same last dim: concat along C (axis 1), the NCHW default
    (y, info) = run_op("Concat", xs_c, 2, jit=jit)
    np.testing.assert_array_equal(y, np.concatenate(xs_c, axis=1))
    np.testing.assert_array_equal(info, [1, 2])
    xs_h = [x[:, :1] for x in xs]  # NHWC: axis 3
    (y, info) = run_op("Concat", xs_h, 2, jit=jit, order="NHWC")
    np.testing.assert_array_equal(y, np.concatenate(xs_h, axis=3))
    # add_axis is only honoured together with `axis`
    (y,) = run_op("Concat", xs_c, jit=jit, order="NCHW", add_axis=1)
    assert y.shape == (2, 3, 3, 1)


@pytest.mark.parametrize(
    ("shapes", "dtypes", "args", "error", "match"),
    [
        ([(2, 3), (2, 3)], ["f", "f"], {"axis": 1, "order": "NCHW"}, BadArgumentError, "not both"),
        ([(2, 3), (2, 3)], ["f", "f"], {"order": "NCWH"}, BadArgumentError, "not NCHW or NHWC"),
        ([(2, 3), (3, 3)], ["f", "f"], {"axis": 1}, ShapeError, "except along axis 1"),
        (
            [(2, 3), (2, 4)],
            ["f", "f"],
            {"axis": 1, "add_axis": 1},
            ShapeError,
            r"equal shapes \(add_axis=1\)",
        ),
        ([(2, 3), (2, 3, 1)], ["f", "f"], {"axis": 0}, ShapeError, "different ranks"),
        ([(2, 3), (2, 3)], ["f", "i"], {"axis": 0}, ShapeError, "one dtype"),
        ([(2, 3), (2, 3)], ["f", "f"], {"axis": 2}, ShapeError, "out of range"),
    ],
)
def test_concat_errors(jit, shapes, dtypes, args, error, match):
    xs = [np.zeros(s, np.float32 if d == "f" else np.int32) for s, d in zip(shapes, dtypes, strict=True)]
    with pytest.raises(error, match=match):
        run_op("Concat", xs, 2, jit=jit, **args)


# --------------------------------------------------------------------------------------------------
# Split


@st.composite
def split_cases(draw):
    """(x, axis, sizes): sizes along `axis` (0s allowed) that add up to the dim."""
    shape = list(draw(small_shapes))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    sizes = draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    shape[axis] = sum(sizes)
    return draw(floats(tuple(shape))), axis, sizes


def split_reference(x, axis, sizes):
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


@given(case=split_cases())
def test_split_argument(jit, case):
    x, axis, sizes = case
    outs = run_op("Split", [x], len(sizes), jit=jit, axis=axis, split=sizes)
    for out, ref in zip(outs, split_reference(x, axis, sizes), strict=True):
        np.testing.assert_array_equal(out, ref)


@given(case=split_cases())
def test_split_input_must_be_concrete(jit, case):
    x, axis, sizes = case
    split = np.array(sizes, np.int32)
    if jit and len(sizes) > 1:
        with pytest.raises(ShapeError, match=r"traced.*argument 'split'"):
            run_op("Split", [x, split], len(sizes), jit=jit, axis=axis)
        return
    outs = run_op("Split", [x, split], len(sizes), jit=jit, axis=axis)
    for out, ref in zip(outs, split_reference(x, axis, sizes), strict=True):
        np.testing.assert_array_equal(out, ref)


@given(data=st.data())
def test_split_equal_parts_and_default_axis(jit, data):
    n = data.draw(st.integers(1, 3))
    x = data.draw(floats((2, n * data.draw(st.integers(1, 2)), 2)))
    outs = run_op("Split", [x], n, jit=jit)  # no axis: order NCHW -> axis 1
    for out, ref in zip(outs, np.split(x, n, axis=1), strict=True):
        np.testing.assert_array_equal(out, ref)


@given(data=st.data())
def test_split_add_axis_removes_the_axis(jit, data):
    x = data.draw(floats(data.draw(small_shapes)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    n = x.shape[axis]
    outs = run_op("Split", [x], n, jit=jit, axis=axis, add_axis=1)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, np.take(x, i, axis=axis))


def test_concat_then_split_with_split_info_under_jit(jit):
    """Concat's gradient is Split(GO, split_info): split_info must stay concrete inside a jitted net."""
    ops = [
        create_operator("Concat", ["a", "b"], ["y", "info"], axis=1),
        create_operator("Split", ["y", "info"], ["a2", "b2"], axis=1),
    ]
    a, b = np.ones((2, 1), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    a2, b2 = run_net(ops, {"a": a, "b": b}, ["a2", "b2"], jit)
    np.testing.assert_array_equal(a2, a)
    np.testing.assert_array_equal(b2, b)


@pytest.mark.parametrize(
    ("args", "n_out", "with_input", "error", "match"),
    [
        ({"axis": 1, "split": [1, 2]}, 3, False, BadArgumentError, "2 sizes for 3 outputs"),
        ({"axis": 1, "split": [4, -1]}, 2, False, BadArgumentError, "negative sizes"),
        ({"axis": 1, "split": [1, 2]}, 2, True, BadArgumentError, "do not also pass argument 'split'"),
        ({"axis": 1, "order": "NCHW"}, 2, False, BadArgumentError, "not both"),
        ({"axis": 1, "split": [1, 1]}, 2, False, ShapeError, "do not add up"),
        ({"axis": 1}, 2, False, ShapeError, "2 equal parts"),
        (
            {"axis": 1, "add_axis": 1},
            2,
            False,
            ShapeError,
            r"one output per index of dim 1 \(size 3\), got 2",
        ),
        ({"axis": 3}, 1, False, ShapeError, "out of range"),
    ],
)
def test_split_errors(jit, args, n_out, with_input, error, match):
    x = np.zeros((2, 3, 4), np.float32)
    inputs = [x, np.array([1, 2], np.int32)] if with_input else [x]
    with pytest.raises(error, match=match):
        run_op("Split", inputs, n_out, jit=jit, **args)


def test_split_input_wrong_count(jit):
    with pytest.raises(ShapeError, match="traced" if jit else "3 sizes for 2 outputs"):
        run_op("Split", [np.zeros((2, 3), np.float32), np.array([1, 1, 1], np.int32)], 2, jit=jit, axis=1)


# --------------------------------------------------------------------------------------------------
# Slice


def slice_reference(x, starts, ends):
    """Caffe2's Slice: negative i means dim + 1 + i; past-the-end clamps; later dims kept whole.
    Returns None when Caffe2 would reject the bounds (also when more than one dim is sliced: real
    Caffe2 refuses that, "Currently only possible to slice in 1 dimension")."""
    index = []
    sliced = 0
    for i, dim in enumerate(x.shape):
        if i >= len(starts) or dim == 0:
            index.append(slice(None))
            continue
        start, end = (v + dim + 1 if v < 0 else v for v in (starts[i], ends[i]))
        start, end = min(start, dim), min(end, dim)
        if start < 0 or end < start:
            return None
        sliced += (start, end) != (0, dim)
        if sliced > 1:
            return None
        index.append(slice(start, end))
    return x[tuple(index)]


@st.composite
def slice_cases(draw):
    x = draw(floats(small_shapes))
    k = draw(st.integers(0, x.ndim))
    bound = st.integers(-6, 6)
    starts = [draw(bound) for _ in range(k)]
    ends = [draw(bound) for _ in range(k)]
    ref = slice_reference(x, starts, ends)
    assume(ref is not None)
    return x, starts, ends, ref


@given(case=slice_cases())
def test_slice_arguments(jit, case):
    x, starts, ends, ref = case
    (y,) = run_op("Slice", [x], jit=jit, starts=starts, ends=ends)
    np.testing.assert_array_equal(y, ref)


@given(case=slice_cases(), index_dtype=st.sampled_from([np.int32, np.int64]))
def test_slice_inputs_must_be_concrete(jit, case, index_dtype):
    x, starts, ends, ref = case
    inputs = [x, np.array(starts, index_dtype), np.array(ends, index_dtype)]
    if jit:
        with pytest.raises(ShapeError, match=r"traced.*arguments 'starts'/'ends'"):
            run_op("Slice", inputs, jit=jit)
        return
    (y,) = run_op("Slice", inputs, jit=jit)
    np.testing.assert_array_equal(y, ref)


def test_slice_negative_indices(jit):
    x = np.arange(5, dtype=np.float32)
    (y,) = run_op("Slice", [x], jit=jit, starts=[1], ends=[-1])  # end -1: through the last element
    np.testing.assert_array_equal(y, [1, 2, 3, 4])
    (y,) = run_op("Slice", [x], jit=jit, starts=[-3], ends=[-2])  # [5+1-3, 5+1-2) = [3, 4)
    np.testing.assert_array_equal(y, [3])
    (y,) = run_op("Slice", [x], jit=jit, starts=[-1], ends=[-1])  # start -1 is the end: empty
    assert y.shape == (0,)
    (y,) = run_op("Slice", [np.zeros((0, 3), np.float32)], jit=jit, starts=[1, 1], ends=[2, 2])
    assert y.shape == (0, 1)


@pytest.mark.parametrize(
    ("inputs", "args", "error", "match"),
    [
        (2, {}, BadArgumentError, "1 input .* or 3"),
        (1, {"starts": [0]}, BadArgumentError, "missing required argument 'ends'"),
        (1, {"starts": [0, 0], "ends": [1]}, BadArgumentError, "differ"),
        (1, {"starts": [0, 0, 0], "ends": [1, 1, 1]}, ShapeError, "rank 2"),
        (1, {"starts": [2], "ends": [1]}, ShapeError, "not a valid range"),
        (1, {"starts": [-5], "ends": [1]}, ShapeError, "not a valid range"),
    ],
)
def test_slice_errors(jit, inputs, args, error, match):
    all_inputs = [np.zeros((3, 4), np.float32), np.array([0], np.int32), np.array([1], np.int32)]
    with pytest.raises(error, match=match):
        run_op("Slice", all_inputs[:inputs], jit=jit, **args)


def test_slice_float_bounds_rejected(jit):
    x, bound = np.zeros((3,), np.float32), np.array([0.0], np.float32)
    with pytest.raises(ShapeError, match="traced" if jit else "int32 or int64"):
        run_op("Slice", [x, bound, bound], jit=jit)


# --------------------------------------------------------------------------------------------------
# Squeeze / ExpandDims / Flatten


@given(data=st.data())
def test_squeeze(jit, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    ones = [i for i, d in enumerate(shape) if d == 1]
    assume(ones)
    dims = data.draw(st.lists(st.sampled_from(ones), min_size=1, max_size=3))  # unsorted, repeats allowed
    x = data.draw(floats(shape))
    (y,) = run_op("Squeeze", [x], jit=jit, dims=dims)
    np.testing.assert_array_equal(y, np.squeeze(x, tuple(set(dims))))


def test_squeeze_errors(jit):
    x = np.zeros((1, 3), np.float32)
    with pytest.raises(BadArgumentError, match="'dims' must be given"):
        run_op("Squeeze", [x], jit=jit)
    with pytest.raises(BadArgumentError, match="negative"):
        run_op("Squeeze", [x], jit=jit, dims=[-1])
    with pytest.raises(ShapeError, match=r"dims \[1\] of the input \[1, 3\] are not 1"):
        run_op("Squeeze", [x], jit=jit, dims=[0, 1])
    with pytest.raises(ShapeError, match="rank > 2, got 2"):
        run_op("Squeeze", [x], jit=jit, dims=[2])


@given(data=st.data())
def test_expand_dims(jit, data):
    x = data.draw(floats(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)))
    k = data.draw(st.integers(1, 3))
    dims = data.draw(st.lists(st.integers(0, x.ndim + k - 1), min_size=k, max_size=k, unique=True))
    ref = x
    for d in sorted(dims):  # Caffe2 inserts the 1s in ascending order
        ref = np.expand_dims(ref, d)
    (y,) = run_op("ExpandDims", [x], jit=jit, dims=list(reversed(dims)))
    np.testing.assert_array_equal(y, ref)


def test_expand_dims_errors(jit):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(BadArgumentError, match="'dims' must be given"):
        run_op("ExpandDims", [x], jit=jit)
    with pytest.raises(BadArgumentError, match="negative"):
        run_op("ExpandDims", [x], jit=jit, dims=[-1])
    with pytest.raises(ShapeError, match="rank >= 4, got 2"):
        run_op("ExpandDims", [x], jit=jit, dims=[4])


@given(data=st.data())
def test_flatten(jit, data):
    x = data.draw(floats(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=3)))
    axis = data.draw(st.none() | st.integers(0, x.ndim))
    (y,) = run_op("Flatten", [x], jit=jit) if axis is None else run_op("Flatten", [x], jit=jit, axis=axis)
    axis = 1 if axis is None else axis  # the default
    np.testing.assert_array_equal(y, x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


def test_flatten_errors(jit):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(BadArgumentError, match="must be >= 0"):
        run_op("Flatten", [x], jit=jit, axis=-1)
    with pytest.raises(ShapeError, match="rank >= 3"):
        run_op("Flatten", [x], jit=jit, axis=3)


# --------------------------------------------------------------------------------------------------
# Cast


# (the `to` argument, the dtype it gives): TensorProto.INT32 = 2, INT64 = 10
INT_TARGETS = [(2, np.int32), ("int", np.int32), ("int32", np.int32), (10, INT64), ("int64", INT64)]


@given(x=floats(small_shapes), target=st.sampled_from(INT_TARGETS))
def test_cast_float_to_int_truncates(jit, x, target):
    to, dtype = target
    (y,) = run_op("Cast", [x], jit=jit, to=to)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, np.trunc(x).astype(dtype))


@given(x=hnp.arrays(np.float32, small_shapes, elements=st.sampled_from([0.0, -0.0, 0.5, -3.0])))
def test_cast_to_bool_is_nonzero(jit, x):
    (y,) = run_op("Cast", [x], jit=jit, to="bool")
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, x != 0)


@given(
    x=hnp.arrays(np.int32, small_shapes, elements=st.integers(-1000, 1000))
    | hnp.arrays(np.bool_, small_shapes),
    to=st.sampled_from([1, "float"]),  # TensorProto.FLOAT = 1
)
def test_cast_int_and_bool_to_float(jit, x, to):
    (y,) = run_op("Cast", [x], jit=jit, to=to)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x.astype(np.float32))


def test_cast_errors(jit):
    x = np.zeros(2, np.float32)
    with pytest.raises(BadArgumentError, match="missing required argument 'to'"):
        run_op("Cast", [x], jit=jit)
    with pytest.raises(BadArgumentError, match="unknown data type"):
        run_op("Cast", [x], jit=jit, to="complex")
    with pytest.raises(BadArgumentError, match="not a numeric"):
        run_op("Cast", [x], jit=jit, to=4)  # TensorProto.STRING
    with pytest.raises(BadArgumentError, match="not a numeric"):
        run_op("Cast", [x], jit=jit, to=0)  # TensorProto.UNDEFINED


# --------------------------------------------------------------------------------------------------
# Gather


@st.composite
def gather_cases(draw, axis_zero: bool = False):
    """(data, axis, indices) with indices in [-size, size) of the gathered axis."""
    data = draw(floats(small_shapes))
    axis = 0 if axis_zero else draw(st.integers(0, data.ndim - 1))
    size = data.shape[axis]
    index_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    indices = draw(hnp.arrays(dtype, index_shape, elements=st.integers(-size, size - 1)))
    return data, axis, indices


@given(case=gather_cases(axis_zero=True))
def test_gather_axis_0_wraps_negative_indices_by_default(jit, case):
    data, _, indices = case
    (y,) = run_op("Gather", [data, indices], jit=jit)
    assert y.shape == indices.shape + data.shape[1:]
    wrapped = np.where(indices < 0, indices + len(data), indices)
    np.testing.assert_array_equal(y, np.take(data, wrapped, axis=0))


@given(case=gather_cases(), negative_axis=st.booleans())
def test_gather_any_axis(jit, case, negative_axis):
    data, axis, indices = case
    size = data.shape[axis]
    positions = np.where(indices < 0, indices + size, indices)
    spelled = axis - data.ndim if negative_axis else axis
    ref = np.take(data, positions, axis=axis)
    (y,) = run_op("Gather", [data, positions], jit=jit, axis=spelled)
    assert y.shape == data.shape[:axis] + indices.shape + data.shape[axis + 1 :]
    np.testing.assert_array_equal(y, ref)
    (y,) = run_op("Gather", [data, indices], jit=jit, axis=spelled, wrap_indices=1)
    np.testing.assert_array_equal(y, ref)


@given(data=st.data())
def test_gather_match_outer(jit, data):
    x = data.draw(floats(hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=3)))
    axis = data.draw(st.integers(1, x.ndim - 1))
    inner = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    indices = data.draw(
        hnp.arrays(np.int32, x.shape[:axis] + inner, elements=st.integers(0, x.shape[axis] - 1))
    )
    (y,) = run_op("Gather", [x, indices], jit=jit, axis=axis, match_outer=1)
    ref = np.empty(x.shape[:axis] + inner + x.shape[axis + 1 :], np.float32)
    for outer in np.ndindex(*x.shape[:axis]):  # each outer position uses its own indices
        ref[outer] = np.take(x[outer], indices[outer], axis=0)
    np.testing.assert_array_equal(y, ref)


def test_gather_out_of_range_is_clamped_and_empty_axis(jit):
    data = np.arange(4, dtype=np.float32)
    if jit:
        (y,) = run_op("Gather", [data, np.array([5, -9], np.int32)], jit=jit)
        np.testing.assert_array_equal(y, [3, 0])  # Caffe2 raises; traced values cannot, so JAX clamps
    else:
        with pytest.raises(ShapeError, match="out of the range"):  # known values: refused, as in Caffe2
            run_op("Gather", [data, np.array([5, -9], np.int32)], jit=jit)
    (y,) = run_op("Gather", [np.zeros((2, 0), np.float32), np.array([0, 0, 0], np.int32)], jit=jit, axis=1)
    assert y.shape == (2, 0)  # Caffe2 keeps DATA's shape when the gathered dim is empty


def test_gather_errors(jit):
    data = np.zeros((2, 3), np.float32)
    with pytest.raises(BadArgumentError, match="match_outer=1 needs argument 'axis' >= 1"):
        run_op("Gather", [data, np.zeros((2,), np.int32)], jit=jit, match_outer=1)
    with pytest.raises(ShapeError, match="must be int32 or int64"):
        run_op("Gather", [data, np.zeros((2,), np.float32)], jit=jit)
    with pytest.raises(ShapeError, match="out of range"):
        run_op("Gather", [data, np.zeros((2,), np.int32)], jit=jit, axis=2)
    with pytest.raises(ShapeError, match="must start with DATA's outer dims"):
        run_op("Gather", [data, np.zeros((3, 1), np.int32)], jit=jit, axis=1, match_outer=1)


@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=4), data=st.data())
def test_shape(jit, shape, data):
    x = np.zeros(shape, np.float32)
    (out,) = run_op("Shape", [x], jit=jit)
    np.testing.assert_array_equal(out, np.array(shape, dtype=np.int64))
    if shape:
        axes = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=3))  # Caffe2: >= 0
        (out,) = run_op("Shape", [x], jit=jit, axes=axes)
        np.testing.assert_array_equal(out, [shape[a] for a in axes])


def test_shape_feeds_fill_under_jit():
    """Caffe2's SoftCoverage attention sizes its initial coverage with Shape -> Slice -> ConstantFill."""
    net = create_net(
        "n",
        [
            create_operator("Shape", "enc", "shape"),
            create_operator("Slice", "shape", "length", starts=[0], ends=[1]),
            create_operator("ConstantFill", "length", "coverage", value=0.0, input_as_shape=1),
        ],
        external_outputs=["coverage"],
    )
    fn = rnn2jax.compile(net)
    out = jax.jit(lambda e: fn.apply({}, {"enc": e}))(np.ones((5, 2, 3), np.float32))
    np.testing.assert_array_equal(np.asarray(out["coverage"]), np.zeros(5, np.float32))
