"""The sequence_packing family (rnn2jax/ops/sequence_packing.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: Sequence packing ops against NumPy references written from Caffe2's semantics
(SEMANTICS.md section 4; caffe2/operators/pack_rnn_sequence_op.h, sequence_ops.{h,cc}, reverse_packed_segs_op.h,
utility_ops.h, segment_reduction_op.cc, one_hot_ops.cc, arg_ops.cc, elementwise_logical_ops.h).

Ops whose output shape depends on lengths values run eagerly and under jit with the lengths closed over as a NumPy
constant; a traced lengths blob must raise a ShapeError.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import forward, run_op
from rnn2jax.errors import BadArgumentError, ShapeError

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_sequence_packing.py)

SEEDS = st.integers(0, 2**32 - 1)
LENGTHS = st.lists(st.integers(0, 3), min_size=0, max_size=4)
NONEMPTY_LENGTHS = st.lists(st.integers(0, 3), min_size=1, max_size=4)
FEATURES = st.sampled_from([(), (2,), (2, 1)])


def rand(seed: int, shape, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def run_const_lengths(op_type, data, lengths, num_outputs=1, *, jit, **args):
    """Run with `lengths` (input 1) closed over as a NumPy constant under jit, so it stays concrete."""
    if not jit:
        return run_op(op_type, [data, lengths], num_outputs, jit=False, **args)
    fn = forward(op_type, 2, num_outputs, **args)
    outs = jax.jit(lambda x: fn(x, lengths))(data)
    return tuple(np.asarray(o) for o in outs)


def check_traced_lengths(op_type, inputs, pattern, *, jit, **args):
    """Lengths fed as a jit argument are traced: a ShapeError naming the op and blob under jit; eagerly
    they are concrete and the op runs."""
    if jit:
        with pytest.raises(ShapeError, match=pattern):
            run_op(op_type, inputs, jit=True, **args)
    else:
        run_op(op_type, inputs, jit=False, **args)


def offsets(lengths) -> np.ndarray:
    lengths = np.asarray(lengths, np.int64)
    return np.cumsum(lengths) - lengths


# --------------------------------------------------------------------------------------------------
# PackRNNSequence / UnpackRNNSequence


def pack_ref(values, lengths):
    rows = max(lengths, default=0)
    out = np.zeros((rows, len(lengths), *values.shape[1:]), values.dtype)
    for c, (start, n) in enumerate(zip(offsets(lengths), lengths, strict=True)):
        out[:n, c] = values[start : start + n]
    return out


def unpack_ref(packed, lengths):
    return np.concatenate(
        [packed[:n, c] for c, n in enumerate(lengths)] or [np.zeros((0, *packed.shape[2:]), packed.dtype)]
    )


@given(lengths=LENGTHS, feat=FEATURES, seed=SEEDS)
def test_pack_unpack(jit, lengths, feat, seed):
    lengths = np.asarray(lengths, np.int32)
    values = rand(seed, (int(lengths.sum()), 3, *feat))
    (packed,) = run_const_lengths("PackRNNSequence", values, lengths, jit=jit)
    np.testing.assert_array_equal(packed, pack_ref(values, lengths))
    (back,) = run_const_lengths("UnpackRNNSequence", packed, lengths, jit=jit)
    np.testing.assert_array_equal(back, unpack_ref(packed, lengths))
    np.testing.assert_array_equal(back, values)


def test_pack_traced_lengths(jit):
    values, lengths = np.ones((3, 2), np.float32), np.array([1, 2], np.int32)
    check_traced_lengths("PackRNNSequence", [values, lengths], r"PackRNNSequence.*'x1'.*traced", jit=jit)
    packed = np.ones((2, 2, 1), np.float32)
    check_traced_lengths("UnpackRNNSequence", [packed, lengths], r"UnpackRNNSequence.*'x1'.*traced", jit=jit)


def test_pack_bad_shapes(jit):
    with pytest.raises(ShapeError, match="at least 2 dims"):
        run_const_lengths("PackRNNSequence", np.ones(3, np.float32), np.array([3], np.int32), jit=jit)
    with pytest.raises(ShapeError, match="sum to 4"):
        run_const_lengths("PackRNNSequence", np.ones((3, 1), np.float32), np.array([4], np.int32), jit=jit)
    with pytest.raises(ShapeError, match="does not hold"):
        run_const_lengths("UnpackRNNSequence", np.ones((2, 3, 1), np.float32), np.array([1, 2]), jit=jit)


# --------------------------------------------------------------------------------------------------
# AddPadding / RemovePadding / GatherPadding


def add_padding_ref(data, lengths, start, end, start_pad=None, end_pad=None):
    block = data.shape[1:]
    start_pad = np.zeros(block, data.dtype) if start_pad is None else start_pad
    end_pad = start_pad if end_pad is None else end_pad
    parts = []
    for off, n in zip(offsets(lengths), lengths, strict=True):
        parts += [np.broadcast_to(start_pad, (start, *block)), data[off : off + n]]
        parts.append(np.broadcast_to(end_pad, (end, *block)))
    out = np.concatenate(parts) if parts else data[:0]
    return out, np.asarray(lengths, np.int32) + start + end


def remove_padding_ref(data, lengths, start, end):
    parts = [data[off + start : off + n - end] for off, n in zip(offsets(lengths), lengths, strict=True)]
    return (np.concatenate(parts) if parts else data[:0]), np.asarray(lengths, np.int32) - start - end


def gather_padding_ref(data, lengths, start, end):
    s = np.zeros(data.shape[1:], data.dtype)
    e = np.zeros(data.shape[1:], data.dtype)
    for off, n in zip(offsets(lengths), lengths, strict=True):
        s += data[off : off + start].sum(0)
        e += data[off + n - end : off + n].sum(0)
    return s, e


WIDTHS = st.integers(0, 2)


@given(lengths=LENGTHS, start=WIDTHS, end=WIDTHS, feat=FEATURES, pads=st.integers(0, 2), seed=SEEDS)
def test_add_padding(jit, lengths, start, end, feat, pads, seed):
    data = rand(seed, (sum(lengths), *feat))
    padding = [rand(seed + 1, feat), rand(seed + 2, feat)][:pads]
    inputs = [data, np.asarray(lengths, np.int32), *padding]
    out, out_lengths = run_op("AddPadding", inputs, 2, jit=jit, padding_width=start, end_padding_width=end)
    ref, ref_lengths = add_padding_ref(data, lengths, start, end, *padding)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(out_lengths, ref_lengths)


@given(n=st.integers(0, 4), feat=FEATURES, seed=SEEDS)
def test_add_remove_padding_defaults_without_lengths(jit, n, feat, seed):
    """padding_width defaults to 1, end_padding_width to padding_width; no lengths: one range."""
    data = rand(seed, (n, *feat))
    out, out_lengths = run_op("AddPadding", [data], 2, jit=jit)
    ref, ref_lengths = add_padding_ref(data, [n], 1, 1)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(out_lengths, ref_lengths)
    back, back_lengths = run_op("RemovePadding", [out], 2, jit=jit)
    np.testing.assert_array_equal(back, data)
    np.testing.assert_array_equal(back_lengths, [n])


@given(lengths=LENGTHS, start=WIDTHS, end=WIDTHS, feat=FEATURES, seed=SEEDS)
def test_remove_padding(jit, lengths, start, end, feat, seed):
    padded = [n + start + end for n in lengths]
    data = rand(seed, (sum(padded), *feat))
    out, out_lengths = run_op(
        "RemovePadding",
        [data, np.asarray(padded, np.int32)],
        2,
        jit=jit,
        padding_width=start,
        end_padding_width=end,
    )
    ref, ref_lengths = remove_padding_ref(data, padded, start, end)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(out_lengths, ref_lengths)


@given(lengths=LENGTHS, start=WIDTHS, end=WIDTHS, feat=FEATURES, seed=SEEDS)
def test_gather_padding(jit, lengths, start, end, feat, seed):
    if start == end == 0:
        start = 1
    padded = np.asarray([n + start + end for n in lengths], np.int32)
    data = rand(seed, (int(padded.sum()), *feat))
    args = dict(padding_width=start, end_padding_width=end)
    s, e = run_op("GatherPadding", [data, padded], 2, jit=jit, **args)
    ref_s, ref_e = gather_padding_ref(data, padded, start, end)
    np.testing.assert_allclose(s, ref_s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e, ref_e, rtol=1e-5, atol=1e-6)
    (both,) = run_op("GatherPadding", [data, padded], 1, jit=jit, **args)
    np.testing.assert_allclose(both, ref_s + ref_e, rtol=1e-5, atol=1e-6)


def test_gather_padding_zero_widths_gives_int64_zeros(jit):
    """No padding rows: as real Caffe2, each output is a 0-d int64 zero, whatever the data's shape and type
    (see test_sequence.py's test_zero_padding_widths)."""
    data, lengths = np.ones((2, 3), np.float32), np.array([2], np.int32)
    s, e = run_op("GatherPadding", [data, lengths], 2, jit=jit, padding_width=0)
    assert s.shape == e.shape == () and s.dtype == e.dtype == np.int64
    assert not s.any() and not e.any()


def test_padding_errors(jit):
    data = np.ones((3, 2), np.float32)
    with pytest.raises(BadArgumentError, match="padding_width"):
        run_op("AddPadding", [data], jit=jit, padding_width=-1)
    with pytest.raises(ShapeError, match="padding input"):
        run_op("AddPadding", [data, np.array([3], np.int32), np.ones(3, np.float32)], jit=jit)
    with pytest.raises(ShapeError, match="fewer than"):
        run_op("RemovePadding", [data, np.array([1, 1, 1], np.int32)], jit=jit)
    with pytest.raises(ShapeError, match="must be a 1-D integer"):
        run_op("AddPadding", [data, np.array([3.0], np.float32)], jit=jit)
    if not jit:  # concrete lengths are checked against the data
        with pytest.raises(ShapeError, match="sum to 2"):
            run_op("AddPadding", [data, np.array([2], np.int32)], jit=jit)


# --------------------------------------------------------------------------------------------------
# ReversePackedSegs, LengthsToRanges, LengthsToSegmentIds


@given(t=st.integers(1, 4), data=st.data(), d=st.integers(1, 3), seed=SEEDS)
def test_reverse_packed_segs(jit, t, data, d, seed):
    lengths = np.asarray(data.draw(st.lists(st.integers(0, t), min_size=0, max_size=3)), np.int32)
    x = rand(seed, (t, lengths.size, d))
    ref = x.copy()
    for b, n in enumerate(lengths):
        ref[:n, b] = x[:n, b][::-1]
    (out,) = run_op("ReversePackedSegs", [x, lengths], jit=jit)
    np.testing.assert_array_equal(out, ref)


def test_reverse_packed_segs_errors(jit):
    with pytest.raises(ShapeError, match="3-D"):
        run_op("ReversePackedSegs", [np.ones((2, 2), np.float32), np.array([1, 1], np.int32)], jit=jit)
    with pytest.raises(ShapeError, match="batch of 2"):
        run_op("ReversePackedSegs", [np.ones((2, 2, 1), np.float32), np.array([1], np.int32)], jit=jit)


@given(lengths=LENGTHS)
def test_lengths_to_ranges(jit, lengths):
    lengths = np.asarray(lengths, np.int32)
    (out,) = run_op("LengthsToRanges", [lengths], jit=jit)
    ref = np.stack([offsets(lengths), lengths], axis=1).reshape(-1, 2)
    np.testing.assert_array_equal(out, ref)
    assert out.dtype == np.int32


@given(lengths=LENGTHS)
def test_lengths_to_segment_ids(jit, lengths):
    lengths = np.asarray(lengths, np.int32)
    ref = np.asarray([i for i, n in enumerate(lengths) for _ in range(n)], np.int32)
    if jit:  # closed over: the net folds it to a constant
        fn = forward("LengthsToSegmentIds", 1)
        (out,) = jax.jit(lambda: fn(lengths))()
    else:
        (out,) = run_op("LengthsToSegmentIds", [lengths], jit=False)
    np.testing.assert_array_equal(out, ref)


def test_lengths_to_segment_ids_traced_lengths(jit):
    lengths = [np.array([1, 2], np.int32)]
    check_traced_lengths("LengthsToSegmentIds", lengths, r"LengthsToSegmentIds.*'x0'.*traced", jit=jit)


# --------------------------------------------------------------------------------------------------
# LengthsSum / LengthsMean and their gradients


def lengths_reduce_ref(data, lengths, mean):
    out = np.zeros((len(lengths), *data.shape[1:]), data.dtype)
    for i, (off, n) in enumerate(zip(offsets(lengths), lengths, strict=True)):
        out[i] = data[off : off + n].sum(0)
        if mean and n:
            out[i] /= n
    return out


@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
@given(lengths=LENGTHS, feat=FEATURES, seed=SEEDS)
def test_lengths_sum_mean(jit, mean, lengths, feat, seed):
    data = rand(seed, (sum(lengths), *feat))
    op_type = "LengthsMean" if mean else "LengthsSum"
    (out,) = run_op(op_type, [data, np.asarray(lengths, np.int32)], jit=jit)
    np.testing.assert_allclose(out, lengths_reduce_ref(data, lengths, mean), rtol=1e-5, atol=1e-6)
    assert out.dtype == np.float32


@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
@given(lengths=LENGTHS, feat=FEATURES, seed=SEEDS)
def test_lengths_sum_mean_gradient(jit, mean, lengths, feat, seed):
    lengths = np.asarray(lengths, np.int32)
    grad = rand(seed, (lengths.size, *feat))
    ref = np.zeros((int(lengths.sum()), *feat), np.float32)
    for i, (off, n) in enumerate(zip(offsets(lengths), lengths, strict=True)):
        ref[off : off + n] = grad[i] / max(n, 1) if mean else grad[i]
    op_type = "LengthsMeanGradient" if mean else "LengthsSumGradient"
    (out,) = run_const_lengths(op_type, grad, lengths, jit=jit)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_lengths_sum_errors(jit):
    inputs = [np.ones((1, 2), np.float32), np.array([2], np.int32)]
    check_traced_lengths("LengthsSumGradient", inputs, r"LengthsSumGradient.*'x1'.*traced", jit=jit)
    with pytest.raises(ShapeError, match="one row per"):
        run_const_lengths("LengthsSumGradient", np.ones((2, 2), np.float32), np.array([2]), jit=jit)
    with pytest.raises(ShapeError, match="1-D integer"):
        run_op("LengthsSum", [np.ones((2, 2), np.float32), np.ones((1, 1), np.int32)], jit=jit)
    if not jit:
        with pytest.raises(ShapeError, match="sum to 3"):
            run_op("LengthsSum", [np.ones((2, 2), np.float32), np.array([3], np.int32)], jit=jit)


# --------------------------------------------------------------------------------------------------
# OneHot, BatchOneHot, ArgMax/ArgMin, Where


@given(n=st.integers(0, 5), size=st.integers(1, 5), seed=SEEDS)
def test_one_hot(jit, n, size, seed):
    indices = np.random.default_rng(seed).integers(0, size, n).astype(np.int64)
    ref = np.zeros((n, size), np.float32)
    ref[np.arange(n), indices] = 1.0
    index_size = np.array(size, np.int64)
    if jit:
        fn = forward("OneHot", 2)
        (out,) = jax.jit(lambda i: fn(i, index_size))(indices)
    else:
        (out,) = run_op("OneHot", [indices, index_size], jit=False)
    np.testing.assert_array_equal(out, ref)
    assert out.dtype == np.float32


def test_one_hot_errors(jit):
    check_traced_lengths("OneHot", [np.array([0, 1]), np.array(3)], r"OneHot.*'x1'.*traced", jit=jit)
    with pytest.raises(ShapeError, match="1-D"):
        run_op("OneHot", [np.zeros((2, 2), np.int64), np.array(3)], jit=False)


@given(n=st.integers(0, 3), data=st.data(), seed=SEEDS)
def test_batch_one_hot(jit, n, data, seed):
    lens = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=0, max_size=3)), np.int32)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, (n, lens.size)).astype(np.float32)
    vals = rng.integers(0, 3, int(lens.sum())).astype(np.float32)
    feature = np.repeat(np.arange(lens.size), lens)
    ref = (x[:, feature] == vals[None, :]).astype(np.float32)
    (out,) = run_op("BatchOneHot", [x, lens, vals], jit=jit)
    np.testing.assert_array_equal(out, ref)


def test_batch_one_hot_errors(jit):
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(ShapeError, match="for 2 columns"):
        run_op("BatchOneHot", [x, np.array([1], np.int32), np.zeros(1, np.float32)], jit=jit)
    if not jit:
        with pytest.raises(ShapeError, match="sum to 2"):
            run_op("BatchOneHot", [x, np.array([1, 1], np.int32), np.zeros(3, np.float32)], jit=jit)


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data(), seed=SEEDS)
def test_arg_max_min(jit, op_type, shape, data, seed):
    x = np.random.default_rng(seed).integers(0, 3, shape).astype(np.float32)  # ties: first index wins
    axis = data.draw(st.integers(-1, len(shape) - 1))  # Caffe2 refuses negative axes other than -1
    keepdims = data.draw(st.booleans())
    ref = (np.argmax if op_type == "ArgMax" else np.argmin)(x, axis=axis, keepdims=keepdims)
    (out,) = run_op(op_type, [x], jit=jit, axis=axis, keepdims=keepdims)
    np.testing.assert_array_equal(out, ref)
    assert np.issubdtype(out.dtype, np.integer)


def test_arg_max_defaults_and_errors(jit):
    x = np.array([[1, 5, 5], [7, 0, 7]], np.float32)
    (out,) = run_op("ArgMax", [x], jit=jit)
    np.testing.assert_array_equal(out, [[1], [0]])
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        run_op("ArgMax", [x], jit=jit, axis=2)
    with pytest.raises(BadArgumentError, match="keepdims"):
        run_op("ArgMax", [x], jit=jit, keepdims=1.5)


@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3), on_rows=st.booleans(), seed=SEEDS)
def test_where(jit, shape, on_rows, seed):
    rng = np.random.default_rng(seed)
    c = rng.random(shape[:1] if on_rows else shape) < 0.5
    x, y = rand(seed, shape), rand(seed + 1, shape)
    cb = c.reshape(-1, *[1] * (len(shape) - 1)) if on_rows else c
    (out,) = run_op("Where", [c, x, y], jit=jit, broadcast_on_rows=on_rows)
    np.testing.assert_array_equal(out, np.where(cb, x, y))


def test_where_errors(jit):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="must have the shape"):
        run_op("Where", [np.ones(2, bool), x, x], jit=jit)
    with pytest.raises(ShapeError, match="broadcast_on_rows"):
        run_op("Where", [np.ones(3, bool), x, x], jit=jit, broadcast_on_rows=1)
    with pytest.raises(ShapeError, match="differ"):
        run_op("Where", [np.ones((2, 3), bool), x, np.ones((3, 2), np.float32)], jit=jit)
