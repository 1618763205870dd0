"""The row-wise quantizers and the quantized lookups against NumPy references written from Caffe2's loops
(caffe2/perfkernels/fused_nbit_rowwise_conversion.cc, fused_rowwise_nbit_conversion_ops.h,
lengths_reducer_rowwise_8bit_ops.h). The quantized bytes must match exactly, including rounding ties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import run_op
from rnn2jax.errors import ShapeError

F32 = np.float32


def rows(min_cols: int = 1, multiple: int = 1, dtype=np.float32):
    """Matrices with rows of varied spread, including constant rows and exact quantization ties."""

    def build(draw):
        n = draw(st.integers(1, 4))
        cols = draw(st.integers(max(1, min_cols // multiple), 5)) * multiple
        kind = draw(st.sampled_from(["uniform", "ties", "constant", "wide"]))
        if kind == "ties":  # values on the grid min + k * range / 255 and half-way between
            grid = draw(hnp.arrays(np.int32, (n, cols), elements=st.integers(0, 510)))
            x = (grid.astype(F32) * F32(0.5 / 255)).astype(dtype)
        elif kind == "constant":
            x = np.full((n, cols), draw(st.floats(-2, 2, width=32)), dtype)
        else:
            scale = 100.0 if kind == "wide" else 1.0
            x = draw(
                hnp.arrays(dtype, (n, cols), elements=st.floats(-scale, scale, width=8 * np.dtype(dtype).itemsize))
            )
        x[np.abs(x) < np.finfo(F32).tiny] = 0  # XLA's CPU flushes subnormals
        return x + dtype(0)  # no -0.0: which zero is the minimum depends on Caffe2's min loop

    return st.composite(lambda draw: build(draw))()


# --------------------------------------------------------------------------------------------------
# References


def ref_fused8(x: np.ndarray) -> np.ndarray:
    x = x.astype(F32)
    low, high = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    span = (high - low).astype(F32)
    inverse = F32(255.0) / (span + F32(1e-8))
    q = np.rint((x - low) * inverse).astype(np.int64).astype(np.uint8)
    scale_bias = np.concatenate([span / F32(255.0), low], axis=1).astype(F32)
    return np.concatenate([q, scale_bias.view(np.uint8)], axis=1)


def ref_nbit_half(x: np.ndarray, bits: int) -> np.ndarray:
    x = x.astype(F32)
    per_byte, top = 8 // bits, (1 << bits) - 1
    out = []
    for row in x:
        low = F32(np.float16(row.min()))
        span = F32(row.max() - low)
        scale = F32(np.float16(F32(1.0) if span == 0 else span / F32(top)))
        if scale == 0:
            scale = F32(1.0)
        with np.errstate(divide="ignore", over="ignore"):
            inverse = F32(1.0) / scale
        if np.isinf(inverse):
            scale, inverse = F32(1.0), F32(1.0)
        q = np.clip(np.rint((row - low) * inverse), 0, top).astype(np.uint8)
        packed = np.zeros(len(row) // per_byte, np.uint8)
        for col, value in enumerate(q):
            packed[col // per_byte] |= value << ((col % per_byte) * bits)
        tail = np.array([scale, low], np.float16).view(np.uint8)
        out.append(np.concatenate([packed, tail]))
    return np.stack(out)


def ref_dequantize(fused: np.ndarray, bits: int, sb_dtype) -> np.ndarray:
    tail = 2 * np.dtype(sb_dtype).itemsize
    per_byte = 8 // bits
    sb = fused[:, -tail:].copy().view(sb_dtype).astype(F32)
    packed = fused[:, :-tail]
    q = np.stack([(packed >> (k * bits)) & ((1 << bits) - 1) for k in range(per_byte)], axis=-1)
    q = q.reshape(len(fused), -1).astype(F32)
    return q * sb[:, :1] + sb[:, 1:]


def ref_rowwise8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(F32)
    q = np.zeros(x.shape, np.uint8)
    scale_bias = np.zeros((len(x), 2), F32)
    for i, row in enumerate(x):
        low, high = row.min(), row.max()
        if high - low < F32(1e-10):
            scale_bias[i] = (1.0, low)
            continue
        scale = F32(high - low) / F32(255.0)
        scale_bias[i] = (scale, low)
        shifted = (row - low) * (F32(1.0) / scale)
        q[i] = np.floor(shifted + 0.5).astype(np.uint8)  # std::round: halves away from zero (all >= 0 here)
        exact_half = shifted - np.floor(shifted) == 0.5
        q[i][exact_half] = (np.floor(shifted[exact_half]) + 1).astype(np.uint8)
    return q, scale_bias


def ref_lookup(values, weights, indices, lengths, mean):
    out = np.zeros((len(lengths), *values.shape[1:]), F32)
    start = 0
    for m, length in enumerate(lengths):
        for k in range(start, start + length):
            out[m] += (1.0 if weights is None else weights[k]) * values[indices[k]]
        if mean and length:
            out[m] /= length
        start += length
    return out


# --------------------------------------------------------------------------------------------------
# Tests


@given(x=rows())
def test_float_to_fused_8bit(x):
    (got,) = run_op("FloatToFused8BitRowwiseQuantized", [x], jit=False)
    np.testing.assert_array_equal(got, ref_fused8(x))
    (back,) = run_op("Fused8BitRowwiseQuantizedToFloat", [got], jit=False)
    want = ref_dequantize(got, 8, F32)
    np.testing.assert_allclose(back, want, rtol=1e-6, atol=1e-6 * np.abs(want).max(initial=1))  # XLA may fuse an FMA


@pytest.mark.parametrize("bits", [8, 4, 2])
@given(data=st.data())
def test_float_to_fused_nbit_half_scale_bias(bits, data):
    x = data.draw(rows(multiple=8 // bits))
    op_type = "FloatToFused8BitRowwiseQuantizedHalfScaleBias" if bits == 8 else f"FloatToFused{bits}BitRowwiseQuantized"
    (got,) = run_op(op_type, [x], jit=False)
    np.testing.assert_array_equal(got, ref_nbit_half(x, bits))
    back_type = (
        "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat" if bits == 8 else f"Fused{bits}BitRowwiseQuantizedToFloat"
    )
    (back,) = run_op(back_type, [got], jit=False)
    want = ref_dequantize(got, bits, np.float16)
    np.testing.assert_allclose(back, want, rtol=1e-6, atol=1e-6 * np.abs(want).max(initial=1))


@given(x=rows())
def test_float_to_rowwise_quantized_8bits(x):
    q, scale_bias = run_op("FloatToRowwiseQuantized8Bits", [x], 2, jit=False)
    want_q, want_sb = ref_rowwise8(x)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(scale_bias, want_sb)


def test_rowwise_8bits_rounds_halves_away_from_zero():
    """Eigen's round() (std::round), unlike the fused quantizers' lrintf (halves to even)."""
    x = np.array([[0.0, 2.5, 255.0]], F32)  # scale 1: 2.5 -> 3 (lrintf would give 2)
    q, _ = run_op("FloatToRowwiseQuantized8Bits", [x], 2, jit=False)
    np.testing.assert_array_equal(q, [[0, 3, 255]])
    (fused,) = run_op("FloatToFused8BitRowwiseQuantized", [np.array([[0.0, 2.5, 255.0 + 2.55e-8]], F32)], jit=False)
    assert fused[0, 1] == 2


@pytest.mark.parametrize(
    "op_type, bits, sb",
    [
        ("SparseLengthsSumFused8BitRowwise", 8, F32),
        ("SparseLengthsMeanFused4BitRowwise", 4, np.float16),
        ("SparseLengthsWeightedSumFused2BitRowwise", 2, np.float16),
    ],
)
@given(data=st.data())
def test_fused_lookups(op_type, bits, sb, data):
    x = data.draw(rows(multiple=8 // bits))
    table = ref_fused8(x) if bits == 8 else ref_nbit_half(x, bits)
    lengths = data.draw(hnp.arrays(np.int32, data.draw(st.integers(0, 3)), elements=st.integers(0, 3)))
    indices = data.draw(hnp.arrays(np.int64, int(lengths.sum()), elements=st.integers(0, len(x) - 1)))
    weights = None
    inputs = [table, indices, lengths]
    if "Weighted" in op_type:
        weights = data.draw(hnp.arrays(F32, indices.size, elements=st.floats(-2, 2, width=32)))
        inputs.insert(1, weights)
    (got,) = run_op(op_type, inputs, jit=False)
    want = ref_lookup(ref_dequantize(table, bits, sb), weights, indices, lengths, "Mean" in op_type)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(initial=1))


def test_columns_not_a_multiple_of_the_values_per_byte_are_refused():
    with pytest.raises(ShapeError, match="multiple of 4"):
        run_op("FloatToFused2BitRowwiseQuantized", [np.ones((2, 3), F32)], jit=False)
