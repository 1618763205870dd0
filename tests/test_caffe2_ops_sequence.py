"""Differential tests of SequenceMask and the sequence-packing ops against real Caffe2
(see tests/differential.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, make_op, run_case, shapes


def floats(data, shape):
    return data.draw(arrays(shape, np.float32))


def lengths_of(data, count, high, dtype=np.int32, min_size=0):
    return data.draw(arrays((count,), dtype, 0, high))


# --------------------------------------------------------------------------------------------------
# SequenceMask


def draw_sequence_mask(data):
    ndim = data.draw(st.integers(2, 4))
    shape = data.draw(shapes(ndim, ndim, min_side=1, max_side=4))
    mode = data.draw(st.sampled_from(["sequence", "window", "upper", "lower", "upperdiag", "lowerdiag"]))
    axis = data.draw(st.integers(1, ndim - 1))
    args = {"mode": mode}
    if axis != 1 or data.draw(st.booleans()):
        args["axis"] = axis
    batch = None
    if axis > 1 and data.draw(st.booleans()):
        batch = data.draw(st.integers(0, axis - 1))
        args["batch"] = batch
    elif mode == "sequence" and axis < ndim - 1 and data.draw(st.booleans()):
        repeat = data.draw(st.integers(axis + 1, ndim - 1))
        args["repeat_from_axis"] = repeat if data.draw(st.booleans()) else repeat - ndim
        cols = math.prod(shape[axis:repeat])
    if "repeat_from_axis" not in args:
        cols = math.prod(shape[axis:])
    rows = math.prod(shape[batch + 1 : axis]) if batch is not None else math.prod(shape[:axis])
    if data.draw(st.booleans()):
        args["fill_val"] = data.draw(st.sampled_from([0.0, -1e9, 2.5, -math.inf]))
    inputs = {"x": floats(data, shape)}
    if mode == "sequence":
        inputs["lengths"] = lengths_of(data, rows, cols)
    elif mode == "window":
        inputs["centers"] = lengths_of(data, rows, cols - 1)
        if data.draw(st.booleans()):
            args["radius"] = data.draw(st.integers(0, 3))
    return make_op("SequenceMask", list(inputs), ["y"], **args), inputs


# --------------------------------------------------------------------------------------------------
# Padding


def padding_args(data):
    args = {}
    start = 1
    if data.draw(st.booleans()):
        start = data.draw(st.integers(0, 3))
        args["padding_width"] = start
    end = start
    if data.draw(st.booleans()):
        end = data.draw(st.integers(0, 3))
        args["end_padding_width"] = end
    return args, start, end


def draw_add_padding(data):
    args, start, end = padding_args(data)
    block = data.draw(shapes(0, 2, min_side=1, max_side=3))
    n = data.draw(st.integers(0, 4))
    lengths = lengths_of(data, n, 3)
    with_lengths = data.draw(st.booleans())
    rows = int(lengths.sum()) if with_lengths else data.draw(st.integers(0, 5))
    inputs = {"x": floats(data, (rows, *block))}
    outputs = ["y"]
    if with_lengths:
        inputs["lengths"] = lengths
        outputs.append("lengths_out")
        pads = data.draw(st.integers(0, 2)) if start or end else 0  # see test_zero_padding_widths
        for name in ("start_pad", "end_pad")[:pads]:
            inputs[name] = floats(data, block)
    elif data.draw(st.booleans()) and (start or end):
        outputs.append("lengths_out")  # with no widths Caffe2 copies a lengths input it lacks (see below)
    return make_op("AddPadding", list(inputs), outputs, **args), inputs


def draw_remove_padding(data):
    args, start, end = padding_args(data)
    block = data.draw(shapes(0, 2, min_side=1, max_side=3))
    n = data.draw(st.integers(0, 4))
    lengths = lengths_of(data, n, 3) + start + end
    if data.draw(st.booleans()):
        inputs = {"x": floats(data, (int(lengths.sum()), *block)), "lengths": lengths}
        outputs = ["y", "lengths_out"]
    else:
        inputs = {"x": floats(data, (start + end + data.draw(st.integers(0, 3)), *block))}
        # with no widths Caffe2 copies a lengths input it lacks (see test_zero_padding_widths)
        outputs = ["y"] + (["lengths_out"] if data.draw(st.booleans()) and (start or end) else [])
    return make_op("RemovePadding", list(inputs), outputs, **args), inputs


def draw_gather_padding(data):
    args, start, end = padding_args(data)
    if not start and not end:  # see test_zero_padding_widths
        args["padding_width"] = start = 1
    block = data.draw(shapes(0, 2, min_side=1, max_side=3))
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 3) + start + end
    inputs = {"x": floats(data, (int(lengths.sum()), *block)), "lengths": lengths}
    outputs = ["start_sum", "end_sum"][: data.draw(st.integers(1, 2))]
    return make_op("GatherPadding", list(inputs), outputs, **args), inputs


# --------------------------------------------------------------------------------------------------
# Pack / Unpack / ReversePackedSegs


def draw_pack(data):
    block = data.draw(shapes(1, 2, min_side=1, max_side=3))
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 4)
    inputs = {"values": floats(data, (int(lengths.sum()), *block)), "lengths": lengths}
    return make_op("PackRNNSequence", ["values", "lengths"], ["packed"]), inputs


def draw_unpack(data):
    block = data.draw(shapes(1, 2, min_side=1, max_side=3))
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 4)
    steps = int(lengths.max(initial=0))
    inputs = {"packed": floats(data, (steps, lengths.size, *block)), "lengths": lengths}
    return make_op("UnpackRNNSequence", ["packed", "lengths"], ["values"]), inputs


def draw_reverse_packed_segs(data):
    t, b, d = (data.draw(st.integers(0, 4)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3)))
    index = data.draw(st.sampled_from([np.int32, np.int64]))
    inputs = {"x": floats(data, (t, b, d)), "lengths": lengths_of(data, b, t, index)}
    return make_op("ReversePackedSegs", ["x", "lengths"], ["y"]), inputs


# --------------------------------------------------------------------------------------------------
# OneHot, BatchOneHot, ArgMax/ArgMin, Where


def draw_one_hot(data):
    # An empty output is never materialised by Caffe2's OneHot (the blob holds no tensor to fetch), so
    # sizes and counts start at 1. Caffe2 does not check the indices: one out of range writes into another
    # row (a negative one) or past the output (index == size aborted the process); rnn2jax gives a zero row.
    size = data.draw(st.integers(1, 5))
    n = data.draw(st.integers(1, 5))
    indices = data.draw(arrays((n,), np.int64, 0, size - 1))
    inputs = {"indices": indices, "size": np.asarray(size, np.int64)}
    return make_op("OneHot", ["indices", "size"], ["y"]), inputs


def draw_batch_one_hot(data):
    n, d = data.draw(st.integers(0, 4)), data.draw(st.integers(1, 3))
    dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    lens = lengths_of(data, d, 3)
    vals = data.draw(arrays((int(lens.sum()),), dtype, 0, 3))
    inputs = {"x": data.draw(arrays((n, d), dtype, 0, 3)), "lens": lens, "vals": vals}
    return make_op("BatchOneHot", ["x", "lens", "vals"], ["y"]), inputs


def draw_arg(op_type):
    def draw(data):
        shape = data.draw(shapes(1, 4, min_side=1, max_side=4))
        dtype = data.draw(st.sampled_from([np.float32, np.int32]))
        x = data.draw(arrays(shape, dtype, -3, 3))  # small integers: ties, resolved to the first index
        if dtype == np.float32 and data.draw(st.booleans()):
            x = np.round(x)
        args = {}
        if data.draw(st.booleans()):
            args["axis"] = data.draw(st.integers(-len(shape), len(shape) - 1))  # only -1 of the negatives is valid
        if data.draw(st.booleans()):
            args["keepdims"] = int(data.draw(st.booleans()))
        return make_op(op_type, ["x"], ["y"], **args), {"x": x}

    return draw


def draw_where(data):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=4))
    dtype = data.draw(st.sampled_from([np.float32, np.int32]))
    args = {}
    if data.draw(st.booleans()):
        args["broadcast_on_rows"] = 1
        c = data.draw(arrays(shape[:1], np.bool_))
    else:
        if data.draw(st.booleans()):
            args["broadcast_on_rows"] = 0
        c = data.draw(arrays(shape, np.bool_))
    inputs = {"c": c, "x": data.draw(arrays(shape, dtype, -5, 5)), "y": data.draw(arrays(shape, dtype, -5, 5))}
    return make_op("Where", ["c", "x", "y"], ["z"], **args), inputs


CASES = cases(
    Case("SequenceMask", draw_sequence_mask, gradient_ops=("SequenceMask",)),
    Case("AddPadding", draw_add_padding, gradient_ops=("RemovePadding", "GatherPadding")),
    Case("RemovePadding", draw_remove_padding, gradient_ops=("AddPadding",)),
    Case("GatherPadding", draw_gather_padding),
    Case("PackRNNSequence", draw_pack, gradient_ops=("UnpackRNNSequence",)),
    Case("UnpackRNNSequence", draw_unpack, gradient_ops=("PackRNNSequence",)),
    Case("ReversePackedSegs", draw_reverse_packed_segs, gradient_ops=("ReversePackedSegs",)),
    Case("OneHot", draw_one_hot),
    Case("BatchOneHot", draw_batch_one_hot),
    Case("ArgMax", draw_arg("ArgMax")),
    Case("ArgMin", draw_arg("ArgMin")),
    Case("Where", draw_where),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_zero_padding_widths(caffe2):
    """Caffe2 is broken with padding_width = end_padding_width = 0: GatherPadding (AddPadding's gradient
    on its padding inputs) returns a 0-d int64 tensor of uninitialised memory instead of a gradient
    shaped like the padding, and AddPadding without a lengths input but with a lengths output reads a
    missing input ("vector::_M_range_check"). rnn2jax gives zero gradients shaped like a row, and the
    documented lengths output [N]."""
    from differential import run_rnn2jax

    x, lengths = np.ones((4, 2), np.float32), np.array([2, 2], np.int32)
    gather = make_op("GatherPadding", ["x", "lengths"], ["a", "b"], padding_width=0)
    want = caffe2.run_op(gather, {"x": x, "lengths": lengths})
    assert want["a"].shape == () and want["a"].dtype == np.int64
    got = run_rnn2jax([gather], {"x": x, "lengths": lengths}, ["a", "b"])
    np.testing.assert_array_equal(got["a"], np.zeros(2, np.float32))
    np.testing.assert_array_equal(got["b"], np.zeros(2, np.float32))

    add = make_op("AddPadding", ["x"], ["y", "lengths_out"], padding_width=0)
    with pytest.raises(Exception, match="range_check"):
        caffe2.run_op(add, {"x": x})
    got = run_rnn2jax([add], {"x": x}, ["y", "lengths_out"])
    np.testing.assert_array_equal(got["y"], x)
    np.testing.assert_array_equal(got["lengths_out"], [4])
