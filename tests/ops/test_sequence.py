"""The sequence family (rnn2jax/ops/sequence.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: SequenceMask against a NumPy reference written from Caffe2's semantics
(SEMANTICS.md section 4; caffe2/operators/boolean_mask_ops.{h,cc} and operator_test/boolean_mask_test.py): every
mode, `batch`, `repeat_from_axis`, `grad`.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of SequenceMask and the
sequence-packing ops against real Caffe2 (see tests/differential.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, make_op, run_case, shapes
from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_sequence.py)

SEEDS = st.integers(0, 2**32 - 1)
TRIANGLES = ["upper", "lower", "upperdiag", "lowerdiag"]
MODES = ["sequence", "window", *TRIANGLES]
FILLS = [-math.inf, -1e9, 0.5, 7.0]


def masked(mode: str, i: int, j: int, per_row: np.ndarray | None, radius: int) -> bool:
    """Whether element (row i, column j) of the 2-D view is replaced (Caffe2's functors)."""
    if mode == "sequence":
        return j >= per_row[i]
    if mode == "window":
        return j > per_row[i] + radius or j < per_row[i] - radius
    return {"upper": j > i, "lower": j < i, "upperdiag": j >= i, "lowerdiag": j <= i}[mode]


def reference(x, mode, per_row=None, axis=1, batch=None, repeat_from=None, radius=10, fill=-math.inf):
    """View x as [batches, rows, cols, repeat]: batches = dims up to and including `batch`, rows = the
    dims after it (or from 0) before `axis`, cols = dims from `axis` (up to `repeat_from`), repeat =
    dims from `repeat_from`; each [b, i, j, :] with (i, j) masked becomes `fill`."""
    shape = x.shape
    axis %= x.ndim
    if batch is not None:
        batch %= x.ndim
        dims = [shape[: batch + 1], shape[batch + 1 : axis], shape[axis:], ()]
    elif repeat_from is not None:
        repeat_from %= x.ndim
        dims = [(), shape[:axis], shape[axis:repeat_from], shape[repeat_from:]]
    else:
        dims = [(), shape[:axis], shape[axis:], ()]
    out = x.reshape([math.prod(d) for d in dims]).copy()
    flat = None if per_row is None else per_row.reshape(-1)
    for b in range(out.shape[0]):
        for i in range(out.shape[1]):
            for j in range(out.shape[2]):
                if masked(mode, i, j, flat, radius):
                    out[b, i, j, :] = fill
    return out.reshape(shape)


def normal(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@st.composite
def case(draw, with_batch=False, with_repeat=False):
    """(shape, axis, batch, repeat_from) with batch < axis <= repeat_from, each maybe negative."""
    ndim = draw(st.integers(2 if with_batch else 1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(1 if with_batch else 0, ndim - 1))
    batch = draw(st.integers(0, axis - 1)) if with_batch else None
    repeat_from = draw(st.integers(axis, ndim - 1)) if with_repeat else None

    def maybe_negative(a):
        return a - ndim if a is not None and draw(st.booleans()) else a

    return shape, maybe_negative(axis), maybe_negative(batch), maybe_negative(repeat_from)


def rows_of(shape, axis, batch):
    axis %= len(shape)
    return math.prod(shape[(batch % len(shape)) + 1 if batch is not None else 0 : axis])


def cols_of(shape, axis):
    return math.prod(shape[axis % len(shape) :])


def per_row_input(seed: int, mode: str, rows: int, cols: int, extra: int) -> np.ndarray:
    """Lengths in [0, cols] or centers in [-2, cols + 2), `extra` more than needed (Caffe2 reads the
    first rows)."""
    rng = np.random.default_rng(seed + 1)
    low, high = (0, cols + 1) if mode == "sequence" else (-2, cols + 2)
    return rng.integers(low, high, rows + extra).astype(np.int32)


def run_mask(jit, x, mode, per_row=None, **args):
    inputs = [x] if per_row is None else [x, per_row]
    (y,) = run_op("SequenceMask", inputs, jit=jit, mode=mode, **args)
    return y


# --------------------------------------------------------------------------------------------------
# Modes


@given(
    mode=st.sampled_from(MODES),
    shape_axis=case(),
    radius=st.integers(0, 2),
    fill=st.sampled_from(FILLS),
    extra=st.integers(0, 2),
    seed=SEEDS,
)
def test_modes(jit, mode, shape_axis, radius, fill, extra, seed):
    shape, axis, _, _ = shape_axis
    x = normal(seed, shape)
    per_row = None
    if mode in ("sequence", "window"):
        per_row = per_row_input(seed, mode, rows_of(shape, axis, None), cols_of(shape, axis), extra)
    y = run_mask(jit, x, mode, per_row, axis=axis, radius=radius, fill_val=fill)
    assert y.shape == x.shape and y.dtype == np.float32
    expected = reference(x, mode, per_row, axis=axis, radius=radius, fill=fill)
    np.testing.assert_array_equal(y, expected)


@given(mode=st.sampled_from(MODES), shape_axis=case(with_batch=True), seed=SEEDS)
def test_batch(jit, mode, shape_axis, seed):
    """Dims up to and including `batch` are independent batches masked alike; rows lie between."""
    shape, axis, batch, _ = shape_axis
    x = normal(seed, shape)
    per_row = None
    if mode in ("sequence", "window"):
        per_row = per_row_input(seed, mode, rows_of(shape, axis, batch), cols_of(shape, axis), 0)
    y = run_mask(jit, x, mode, per_row, axis=axis, batch=batch, radius=1, fill_val=-5.0)
    np.testing.assert_array_equal(y, reference(x, mode, per_row, axis, batch=batch, radius=1, fill=-5.0))


@given(shape_axis=case(with_repeat=True), seed=SEEDS)
def test_repeat_from_axis(jit, shape_axis, seed):
    """Columns are the dims [axis, repeat_from_axis); the dims from repeat_from_axis repeat them."""
    shape, axis, _, repeat_from = shape_axis
    x = normal(seed, shape)
    cols = math.prod(shape[axis % len(shape) : repeat_from % len(shape)])
    lengths = per_row_input(seed, "sequence", rows_of(shape, axis, None), cols, 0)
    y = run_mask(jit, x, "sequence", lengths, axis=axis, repeat_from_axis=repeat_from, fill_val=0.25)
    np.testing.assert_array_equal(
        y, reference(x, "sequence", lengths, axis, repeat_from=repeat_from, fill=0.25)
    )


@given(mode=st.sampled_from(MODES), fill=st.sampled_from(FILLS), seed=SEEDS)
def test_grad_fills_zero(jit, mode, fill, seed):
    x = normal(seed, (3, 4))
    per_row = np.array([0, 2, 4], np.int32) if mode in ("sequence", "window") else None
    y = run_mask(jit, x, mode, per_row, grad=1, fill_val=fill, radius=1)
    np.testing.assert_array_equal(y, reference(x, mode, per_row, radius=1, fill=0.0))


def test_attention_logits(jit):
    """The attention decoder: logits transposed to [B, L, 1], masked beyond encoder_lengths [B]."""
    x = normal(0, (3, 5, 1))
    lengths = np.array([5, 2, 0], np.int32)
    (y,) = run_op(
        "SequenceMask",
        [x, lengths],
        jit=jit,
        input_names=["att/attention_logits_transposed", "encoder_lengths"],
        mode="sequence",
    )
    expected = x.copy()
    expected[1, 2:] = -np.inf
    expected[2, :] = -np.inf
    np.testing.assert_array_equal(y, expected)


def test_defaults(jit):
    """axis 1, fill_val -inf, radius 10, grad off."""
    x = normal(1, (2, 3, 9))
    y = run_mask(jit, x, "lower")
    np.testing.assert_array_equal(y, reference(x, "lower", axis=1, fill=-math.inf))
    assert np.isneginf(y[1].reshape(-1)[0])
    x = normal(2, (2, 30))
    centers = np.array([0, 29], np.int32)
    y = run_mask(jit, x, "window", centers)
    expected = x.copy()
    expected[0, 11:] = -np.inf
    expected[1, :19] = -np.inf
    np.testing.assert_array_equal(y, expected)


def test_second_input_ignored_by_triangles(jit):
    x = normal(3, (3, 3))
    y = run_mask(jit, x, "upperdiag", np.zeros(1, np.int32))
    np.testing.assert_array_equal(y, np.where(np.triu(np.ones((3, 3), bool)), -np.inf, x))


def test_float16(jit):
    x = normal(4, (2, 3)).astype(np.float16)
    y = run_mask(jit, x, "sequence", np.array([1, 3], np.int32), fill_val=-2.0)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, reference(x, "sequence", np.array([1, 3]), fill=np.float16(-2.0)))


@pytest.mark.parametrize("mode", MODES)
def test_empty_input(jit, mode):
    x = np.zeros((0, 3), np.float32)
    per_row = np.zeros(0, np.int32) if mode in ("sequence", "window") else None
    assert run_mask(jit, x, mode, per_row).shape == (0, 3)


# --------------------------------------------------------------------------------------------------
# Errors


def x23():
    return normal(0, (2, 3))


LENGTHS = np.array([1, 2], np.int32)


@pytest.mark.parametrize(
    ("inputs", "args", "match"),
    [
        ([x23(), LENGTHS], {}, "missing required argument 'mode'"),
        ([x23(), LENGTHS], {"mode": "diag"}, "'mode' = 'diag' is not one of"),
        ([x23(), LENGTHS], {"mode": 1}, "'mode' must be a string"),
        ([x23()], {"mode": "sequence"}, "needs a second input"),
        ([x23()], {"mode": "window"}, "needs a second input"),
        ([x23(), LENGTHS], {"mode": "window", "repeat_from_axis": 1}, "only supported in mode 'sequence'"),
        ([x23(), LENGTHS], {"mode": "sequence", "batch": 0, "repeat_from_axis": 1}, "without 'batch'"),
        ([x23(), LENGTHS], {"mode": "sequence", "fill_val": "x"}, "'fill_val' must be a number"),
        ([x23(), LENGTHS], {"mode": "window", "radius": 1.5}, "'radius' must be an integer"),
    ],
)
def test_bad_arguments(jit, inputs, args, match):
    with pytest.raises(BadArgumentError, match=match):
        run_op("SequenceMask", inputs, jit=jit, **args)


@pytest.mark.parametrize(
    ("inputs", "args", "match"),
    [
        ([x23(), LENGTHS], {"axis": 2}, "axis 2 is out of range"),
        ([x23(), LENGTHS], {"axis": -3}, "axis -3 is out of range"),
        ([x23(), LENGTHS], {"axis": 1, "batch": 1}, "'batch' \\(1\\) must be before 'axis' \\(1\\)"),
        ([x23(), LENGTHS], {"axis": 1, "batch": 2}, "'batch' 2 is out of range"),
        ([normal(0, (2, 3, 2)), LENGTHS], {"axis": 2, "repeat_from_axis": 1}, "must not be before"),
        ([x23(), np.array([4], np.int32)], {}, "has 1 values but the input has 2 rows"),
        ([x23(), LENGTHS.astype(np.float32)], {}, "must be int32"),
        ([np.ones((2, 3), np.int32), LENGTHS], {}, "needs float"),
    ],
)
def test_bad_shapes(jit, inputs, args, match):
    with pytest.raises(ShapeError, match=match):
        run_op("SequenceMask", inputs, jit=jit, mode="sequence", **args)


def test_window_centers_too_short(jit):
    with pytest.raises(ShapeError, match="centers input"):
        run_mask(jit, x23(), "window", np.array([1], np.int32))


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_sequence.py)

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
    """padding_width = end_padding_width = 0: GatherPadding (AddPadding's gradient on its padding inputs)
    writes a 0-d int64 zero per output, not a gradient shaped like the padding, and rnn2jax does as Caffe2
    (serialized golden sequence_ops_test.test_gather_padding); AddPadding without a lengths input but with
    a lengths output reads a missing input in Caffe2 ("vector::_M_range_check"), where rnn2jax gives the
    documented lengths output [N]."""
    from differential import run_rnn2jax

    x, lengths = np.ones((4, 2), np.float32), np.array([2, 2], np.int32)
    gather = make_op("GatherPadding", ["x", "lengths"], ["a", "b"], padding_width=0)
    want = caffe2.run_op(gather, {"x": x, "lengths": lengths})
    assert want["a"].shape == () and want["a"].dtype == np.int64
    got = run_rnn2jax([gather], {"x": x, "lengths": lengths}, ["a", "b"])
    for name in ("a", "b"):
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        np.testing.assert_array_equal(got[name], want[name])

    add = make_op("AddPadding", ["x"], ["y", "lengths_out"], padding_width=0)
    with pytest.raises(Exception, match="range_check"):
        caffe2.run_op(add, {"x": x})
    got = run_rnn2jax([add], {"x": x}, ["y", "lengths_out"])
    np.testing.assert_array_equal(got["y"], x)
    np.testing.assert_array_equal(got["lengths_out"], [4])
