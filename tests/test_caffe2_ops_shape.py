"""Differential tests of the shape / data-movement ops against real Caffe2 (see tests/differential.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import (
    Case,
    arrays,
    assert_blobs_equal,
    assert_same_ops,
    cases,
    check_op,
    make_op,
    run_case,
    run_rnn2jax,
    shapes,
)
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import BadArgumentError, Rnn2JaxError
from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op
from rnn2jax.proto import caffe2_pb2 as pb

DT = pb.TensorProto


def values(data, shape, dtype=np.float32):
    """Values of `dtype`: floats in [-1, 1], integers in [-100, 100], or bools."""
    dtype = np.dtype(dtype)
    if dtype.kind == "u":
        return data.draw(arrays(shape, dtype, 0, 200))
    if dtype.kind in "iu":
        return data.draw(arrays(shape, dtype, -100, 100))
    return data.draw(arrays(shape, dtype))


def float_or_int(data):
    return data.draw(st.sampled_from([np.float32, np.float32, np.int32]))


# --------------------------------------------------------------------------------------------------
# Identities


def draw_identity(op_type):
    def draw(data):
        shape = data.draw(shapes(0, 4, min_side=0))
        x = values(data, shape, data.draw(st.sampled_from([np.float32, np.int32, np.bool_])))
        return make_op(op_type, ["x"], ["y"]), {"x": x}

    return draw


def draw_float_identity(op_type):
    def draw(data):
        return make_op(op_type, ["x"], ["y"]), {"x": values(data, data.draw(shapes(0, 4, min_side=0)))}

    return draw


def draw_copy_on_device_like(data):
    x = values(data, data.draw(shapes(0, 4, min_side=0)))
    like = values(data, data.draw(shapes(1, 2)))
    return make_op("CopyOnDeviceLike", ["x", "like"], ["y"]), {"x": x, "like": like}


# CopyCPUToGPU / CopyGPUToCPU have no CPU implementation in Caffe2 ("Cannot create operator of type
# 'CopyCPUToGPU' on the device 'CPU'"), so the oracle cannot run them: their forward (and the copy their
# gradient makes) is compared with Caffe2's Copy, which they equal on one device (see test_gpu_copies).
GPU_COPIES = {"CopyCPUToGPU": "CopyGPUToCPU", "CopyGPUToCPU": "CopyCPUToGPU"}


# --------------------------------------------------------------------------------------------------
# Cast

# Every numeric type Caffe2's CPU Cast handles. FLOAT16 is refused by the CPU kernel ("Casting to and
# from at::Half on CPU is not supported yet"), BYTE aborts the Caffe2 process and STRING makes strings,
# which JAX cannot hold: those three are tested on their own below.
CAST_TYPES = {
    DT.FLOAT: np.float32,
    DT.INT32: np.int32,
    DT.BOOL: np.bool_,
    DT.UINT8: np.uint8,
    DT.INT8: np.int8,
    DT.UINT16: np.uint16,
    DT.INT16: np.int16,
    DT.INT64: np.int64,
    DT.DOUBLE: np.float64,
}
CAST_NAMES = {DT.FLOAT: "float", DT.INT32: "int32", DT.BOOL: "bool", DT.INT64: "int64", DT.DOUBLE: "double"}
TYPE_OF = {np.dtype(v): k for k, v in CAST_TYPES.items()}


def draw_cast(data):
    source = data.draw(st.sampled_from(sorted(CAST_TYPES)))
    to = data.draw(st.sampled_from(sorted(CAST_TYPES)))
    dtype = np.dtype(CAST_TYPES[source])
    shape = data.draw(shapes(0, 3, min_side=0))
    if dtype.kind == "f":
        target = np.dtype(CAST_TYPES[to])
        low = 0 if target.kind == "u" else -100  # a negative float to an unsigned type is undefined in C++
        x = data.draw(arrays(shape, dtype, low, 100))
        x = np.where(data.draw(st.booleans()), np.round(x), x).astype(dtype)  # exact integers too
    else:
        x = values(data, shape, dtype)

    def name_or_code(code):
        return CAST_NAMES[code] if code in CAST_NAMES and data.draw(st.booleans()) else code

    # from_type lets Caffe2 (and the builder) make the gradient: Cast back to the input's type.
    return make_op("Cast", ["x"], ["y"], to=name_or_code(to), from_type=name_or_code(source)), {"x": x}


# --------------------------------------------------------------------------------------------------
# Concat / Split


def draw_axis_args(data, ndim, with_add_axis, depth=False):
    """Concat/Split's axis: argument `axis` (with `add_axis`), or `order` for a 4-D input, or the default."""
    choices = ["axis"] + (["default"] if ndim >= 2 else []) + (["order"] if ndim == 4 else [])
    kind = data.draw(st.sampled_from(choices))
    if kind == "order":
        order = data.draw(st.sampled_from(["NCHW", "NHWC"]))
        return {"order": order}, (1 if order == "NCHW" else 3), False
    if kind == "default":
        return {}, 1, False
    add_axis = with_add_axis and data.draw(st.booleans())
    rank = ndim + 1 if add_axis and with_add_axis == "concat" else ndim
    axis = data.draw(st.integers(-rank, rank - 1))
    args = {"axis": axis}
    if add_axis:
        args["add_axis"] = 1
    return args, axis % rank, add_axis


def draw_concat(op_type):
    def draw(data):
        ndim = data.draw(st.integers(2, 4))
        args, axis, add_axis = draw_axis_args(data, ndim, "concat" if op_type == "Concat" else False)
        base = list(data.draw(shapes(ndim, ndim, min_side=1, max_side=3)))
        n = data.draw(st.integers(1, 4))
        dtype = float_or_int(data)
        inputs = {}
        for i in range(n):
            shape = list(base)
            if not add_axis:
                shape[axis] = data.draw(st.integers(0, 3))
            inputs[f"x{i}"] = values(data, tuple(shape), dtype)
        return make_op(op_type, list(inputs), ["y", "split_info"], **args), inputs

    return draw


def draw_split(op_type):
    def draw(data):
        ndim = data.draw(st.integers(1, 4))
        if ndim < 2 and op_type == "DepthSplit":
            ndim = 2
        args, axis, add_axis = draw_axis_args(data, ndim, "split" if op_type == "Split" else False)
        shape = list(data.draw(shapes(ndim, ndim, min_side=1, max_side=4)))
        inputs = {}
        if add_axis:
            n = shape[axis]
        else:
            n = data.draw(st.integers(1, 3))
            how = data.draw(st.sampled_from(["equal", "arg", "input"]))
            if how == "equal":
                shape[axis] = n * data.draw(st.integers(0, 2))
            else:
                sizes = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
                shape[axis] = sum(sizes)
                if how == "arg":
                    args["split"] = sizes
                else:
                    inputs["split"] = np.asarray(sizes, data.draw(st.sampled_from([np.int32, np.int64])))
        x = values(data, tuple(shape), float_or_int(data))
        inputs = {"x": x, **inputs}
        return make_op(op_type, list(inputs), [f"y{i}" for i in range(n)], **args), inputs

    return draw


# --------------------------------------------------------------------------------------------------
# Squeeze, ExpandDims, Flatten, Transpose, Reshape, Shape


def draw_squeeze(data):
    shape = list(data.draw(shapes(1, 4, min_side=1, max_side=3)))
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=3))
    for d in dims:
        if data.draw(st.integers(0, 5)):  # now and then a dim that is not 1: Caffe2 refuses
            shape[d] = 1
    return make_op("Squeeze", ["x"], ["y"], dims=dims), {"x": values(data, tuple(shape))}


def draw_expand_dims(data):
    shape = data.draw(shapes(0, 3, min_side=0, max_side=3))
    k = data.draw(st.integers(1, 3))
    dims = data.draw(st.lists(st.integers(0, len(shape) + k - 1), min_size=1, max_size=k))
    return make_op("ExpandDims", ["x"], ["y"], dims=dims), {"x": values(data, shape)}


def draw_flatten(data):
    shape = data.draw(shapes(1, 4, min_side=0, max_side=3))
    args = {"axis": data.draw(st.integers(0, len(shape)))} if data.draw(st.booleans()) else {}
    return make_op("Flatten", ["x"], ["y"], **args), {"x": values(data, shape)}


def draw_transpose(data):
    shape = data.draw(shapes(1, 4, min_side=0, max_side=3))
    args = {}
    if data.draw(st.booleans()):
        args["axes"] = data.draw(st.permutations(range(len(shape))))
    return make_op("Transpose", ["x"], ["y"], **args), {"x": values(data, shape, float_or_int(data))}


def draw_reshape(data):
    shape = data.draw(shapes(1, 4, min_side=0, max_side=3))
    total = int(np.prod(shape))
    # A new shape: a refactoring of the element count with some dims replaced by 0 (copy) or -1.
    new = list(data.draw(st.permutations(shape))) if data.draw(st.booleans()) else [total]
    if data.draw(st.booleans()):
        new = [*new, 1]
    for i in range(len(new)):
        if i < len(shape) and new[i] == shape[i] and data.draw(st.booleans()):
            new[i] = 0
    if data.draw(st.booleans()):
        new[data.draw(st.integers(0, len(new) - 1))] = -1
    if not data.draw(st.integers(0, 5)):  # now and then a shape that does not fit: Caffe2 refuses
        new[0] = new[0] + 1 if new[0] >= 0 else 2
    if total == 0 and np.prod([d for d in new if d > 0]) and 0 not in new and -1 not in new:
        new[-1] = 0  # Caffe2 reshapes an empty input to a non-empty shape with garbage (tested below)
    inputs = {"x": values(data, shape)}
    if data.draw(st.booleans()):
        inputs["shape"] = np.asarray(new, data.draw(st.sampled_from([np.int64, np.int32])))
        return make_op("Reshape", ["x", "shape"], ["y", "old_shape"]), inputs
    return make_op("Reshape", ["x"], ["y", "old_shape"], shape=new), inputs


def draw_shape(data):
    shape = data.draw(shapes(0, 4, min_side=0))
    args = {}
    if len(shape) and data.draw(st.booleans()):
        args["axes"] = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=3))
    return make_op("Shape", ["x"], ["y"], **args), {"x": values(data, shape)}


# --------------------------------------------------------------------------------------------------
# Slice


def draw_slice(data):
    """Caffe2 slices one dim at most (other dims [0, -1] or beyond the bounds given)."""
    shape = data.draw(shapes(1, 4, min_side=0, max_side=4))
    n = data.draw(st.integers(1, len(shape)))
    starts, ends = [0] * n, [-1] * n
    sliced = data.draw(st.integers(0, n - 1))
    dim = shape[sliced]
    starts[sliced] = data.draw(st.integers(-dim - 1, dim))
    ends[sliced] = data.draw(st.integers(-dim - 1, dim + 1))
    if not data.draw(st.integers(0, 5)) and n > 1:  # two sliced dims: Caffe2 refuses
        other = (sliced + 1) % n
        starts[other] = min(1, shape[other])
    inputs = {"x": values(data, shape, float_or_int(data))}
    if data.draw(st.booleans()):
        index = data.draw(st.sampled_from([np.int32, np.int64]))
        inputs["starts"], inputs["ends"] = np.asarray(starts, index), np.asarray(ends, index)
        return make_op("Slice", ["x", "starts", "ends"], ["y"]), inputs
    return make_op("Slice", ["x"], ["y"], starts=starts, ends=ends), inputs


# --------------------------------------------------------------------------------------------------
# Gather and its gradients


def draw_gather(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    axis = data.draw(st.integers(0, len(shape) - 1))
    args = {}
    if axis or data.draw(st.booleans()):
        args["axis"] = axis - len(shape) if axis and data.draw(st.booleans()) else axis  # see the note below
    wrap = axis == 0
    if data.draw(st.booleans()):
        wrap = data.draw(st.booleans())
        args["wrap_indices"] = int(wrap)
    dim = shape[axis]
    match_outer = axis > 0 and data.draw(st.booleans())
    if axis:
        wrap = False  # Caffe2's BatchGatherGradient refuses the negative indices its Gather wrapped
    if match_outer:
        args["match_outer"] = 1
        index_shape = (*shape[:axis], *data.draw(shapes(0, 1, min_side=0, max_side=3)))
    else:
        index_shape = data.draw(shapes(0, 2, min_side=0, max_side=3))
    indices = data.draw(
        arrays(index_shape, data.draw(st.sampled_from([np.int32, np.int64])), -dim if wrap else 0, dim - 1)
    )
    if axis == 0 and indices.ndim == 1 and indices.min(initial=0) >= 0 and data.draw(st.booleans()):
        args["dense_gradient"] = True  # SparseToDense takes 1-D, non-negative indices only
    return make_op("Gather", ["data", "indices"], ["y"], **args), {"data": values(data, shape), "indices": indices}


def draw_sparse_to_dense(data):
    block = data.draw(shapes(0, 2, min_side=0, max_side=3))
    k = data.draw(st.integers(0, 5))
    first = data.draw(st.integers(1, 4))
    indices = data.draw(arrays((k,), data.draw(st.sampled_from([np.int32, np.int64])), 0, first - 1))
    inputs = {"indices": indices, "values": values(data, (k, *block), float_or_int(data))}
    how = data.draw(st.sampled_from(["data", "arg", "none"]))
    args = {}
    if how == "data":
        inputs["like"] = values(data, (first, 2))
    elif how == "arg":
        args["output_first_dim"] = first
    return make_op("SparseToDense", list(inputs), ["y"], **args), inputs


def draw_batch_gather_gradient(data):
    shape = data.draw(shapes(2, 3, min_side=1, max_side=3))
    axis = data.draw(st.integers(1, len(shape) - 1))
    args = {"axis": axis}
    index_shape = data.draw(shapes(0, 2, min_side=0, max_side=3))
    grad_shape = (*shape[:axis], *index_shape, *shape[axis + 1 :])
    if data.draw(st.booleans()):
        args["match_outer"] = 1
        index_shape = (*shape[:axis], *index_shape)
    index_type = data.draw(st.sampled_from([np.int32, np.int64]))
    indices = data.draw(arrays(index_shape, index_type, 0, shape[axis] - (data.draw(st.integers(0, 8)) > 0)))
    inputs = {"data": values(data, shape), "indices": indices, "grad": values(data, grad_shape)}
    return make_op("BatchGatherGradient", list(inputs), ["dx"], **args), inputs


CASES = cases(
    Case("Alias", draw_identity("Alias")),
    Case("Copy", draw_float_identity("Copy"), gradient_ops=("CopyOnDeviceLike",)),
    Case("CopyCPUToGPU", draw_float_identity("CopyCPUToGPU"), note="compared with Caffe2's Copy"),
    Case("CopyGPUToCPU", draw_float_identity("CopyGPUToCPU"), note="compared with Caffe2's Copy"),
    Case("CopyFromCPUInput", draw_identity("CopyFromCPUInput")),
    Case("CopyOnDeviceLike", draw_copy_on_device_like),
    Case("EnsureCPUOutput", draw_identity("EnsureCPUOutput")),
    Case("StopGradient", draw_identity("StopGradient")),
    Case("Cast", draw_cast, gradient_ops=("Cast",)),
    Case("Concat", draw_concat("Concat"), gradient_ops=("Split",)),
    Case("DepthConcat", draw_concat("DepthConcat"), gradient_ops=("Split",)),
    Case("Split", draw_split("Split"), gradient_ops=("Concat",)),
    Case("DepthSplit", draw_split("DepthSplit"), gradient_ops=("Concat",)),
    Case("Squeeze", draw_squeeze, gradient_ops=("ExpandDims",)),
    Case("ExpandDims", draw_expand_dims, gradient_ops=("Squeeze",)),
    Case("Flatten", draw_flatten, gradient_ops=("ResizeLike",)),
    Case("Transpose", draw_transpose, gradient_ops=("Transpose",)),
    Case("Reshape", draw_reshape, gradient_ops=("Reshape",)),
    Case("Shape", draw_shape),
    Case("Slice", draw_slice, gradient_ops=("SliceGradient",)),
    Case("Gather", draw_gather, gradient_ops=("BatchGatherGradient", "SparseToDense")),
    Case("SparseToDense", draw_sparse_to_dense, gradient_ops=("Gather",)),
    Case("BatchGatherGradient", draw_batch_gather_gradient),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type in GPU_COPIES:
        check_gpu_copy(caffe2, case, data)
        return
    run_case(caffe2, case, data)


def check_gpu_copy(caffe2, case, data):
    """Caffe2's CPU build cannot create these ops; on one device they are Copy, so compare with that,
    and compare the builder's gradient maker (the reverse copy) with Caffe2's."""
    op, inputs = case.draw(data)
    as_copy = make_op("Copy", list(op.input), list(op.output))
    want = caffe2.run_op(as_copy, inputs)
    assert_blobs_equal(run_rnn2jax([op], inputs, op.output, jit=True), want)
    c2_ops, c2_g = caffe2.gradient_for_op(op, ["y_grad"])
    ours, our_g = get_gradient_for_op(op, ["y_grad"])
    assert_same_ops(ours, c2_ops)
    assert our_g == c2_g and [o.type for o in c2_ops] == [GPU_COPIES[op.type]]


# --------------------------------------------------------------------------------------------------
# Gradient makers that emit no ops (not run by run_case) or refuse


@pytest.mark.parametrize(
    "op",
    [
        make_op("Alias", ["x"], ["y"]),
        make_op("StopGradient", ["x"], ["y"]),
        make_op("EnsureCPUOutput", ["x"], ["y"]),
        make_op("Gather", ["d", "i"], ["y"]),
        make_op("Gather", ["d", "i"], ["y"], axis=0),
        make_op("Shape", ["x"], ["y"]),
        make_op("Cast", ["x"], ["y"], to=1),  # no from_type: Caffe2 refuses
    ],
    ids=lambda op: op.type,
)
def test_gradient_makers_without_ops(caffe2, op):
    g_output = ["y_grad"]
    try:
        c2_ops, c2_g = caffe2.gradient_for_op(op, g_output)
    except Caffe2Error:
        with pytest.raises(GradientError):
            get_gradient_for_op(op, g_output)
        return
    ours, our_g = get_gradient_for_op(op, g_output)
    assert_same_ops(ours, c2_ops)
    assert [tuple(g.values()) if isinstance(g, dict) else g for g in c2_g] == list(our_g)


# --------------------------------------------------------------------------------------------------
# Inputs Caffe2 refuses that only an eager run can see (values decide), and Cast's special types


@given(data=st.data())
def test_gather_out_of_range_indices_are_refused(caffe2, jit, data):
    """Caffe2: "INDICES element is out of DATA bounds". Eagerly rnn2jax refuses at the op; under jit the
    compiled net checks the traced indices when it runs (ops/checks.py) and refuses after the call."""
    shape = data.draw(shapes(1, 3, min_side=1, max_side=3))
    axis = data.draw(st.integers(0, len(shape) - 1))
    dim = shape[axis]
    bad = data.draw(st.sampled_from([dim, dim + 3, -dim - 1] if axis == 0 else [dim, -1, -dim]))
    indices = np.array([0, bad], data.draw(st.sampled_from([np.int32, np.int64])))
    op = make_op("Gather", ["data", "indices"], ["y"], axis=axis)
    assert check_op(caffe2, op, {"data": values(data, shape), "indices": indices}, jit=jit) is None


def test_cast_types_caffe2_cpu_cannot_run(caffe2):
    """FLOAT16: Caffe2's CPU Cast refuses it both ways ("Casting to and from at::Half on CPU is not supported
    yet"), its CUDA Cast supports it: rnn2jax keeps the documented meaning (an IEEE half conversion).
    BYTE: Caffe2 aborts the process (the oracle worker dies); rnn2jax refuses clearly. STRING: Caffe2
    formats numbers as strings, which JAX cannot hold; rnn2jax refuses clearly."""
    x = np.array([0.5, -2.25, 70000.0], np.float32)
    with pytest.raises(Caffe2Error, match="Half on CPU"):
        caffe2.run_op(make_op("Cast", ["x"], ["y"], to=DT.FLOAT16), {"x": x})
    (got,) = run_rnn2jax([make_op("Cast", ["x"], ["y"], to=DT.FLOAT16)], {"x": x}, ["y"]).values()
    np.testing.assert_array_equal(got, x.astype(np.float16))
    for to in (DT.BYTE, DT.STRING, "string"):
        with pytest.raises(BadArgumentError):
            run_rnn2jax([make_op("Cast", ["x"], ["y"], to=to)], {"x": x}, ["y"])


def test_slice_of_two_dims_is_refused_eagerly_and_under_jit():
    x = np.zeros((3, 4), np.float32)
    for jit in (True, False):
        with pytest.raises(Rnn2JaxError, match="one dimension"):
            run_rnn2jax([make_op("Slice", ["x"], ["y"], starts=[1, 1], ends=[-1, -1])], {"x": x}, ["y"], jit=jit)


def test_reshape_of_an_empty_input_to_a_non_empty_shape_is_refused(caffe2):
    """Caffe2 is broken here: Reshape([0] -> shape [3, 2]) succeeds with 6 uninitialised floats (seen:
    -7028350.0, 1.33e+37, ...). rnn2jax refuses."""
    op = make_op("Reshape", ["x"], ["y", "old_shape"], shape=[3, 2])
    x = np.zeros((0,), np.float32)
    assert caffe2.run_op(op, {"x": x})["y"].shape == (3, 2)
    with pytest.raises(Rnn2JaxError, match="empty"):
        run_rnn2jax([op], {"x": x}, ["y"])
