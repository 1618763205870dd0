"""The embedding family (rnn2jax/ops/embedding.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: The row-wise quantizers and the quantized lookups against NumPy references
written from Caffe2's loops (caffe2/perfkernels/fused_nbit_rowwise_conversion.cc,
fused_rowwise_nbit_conversion_ops.h, lengths_reducer_rowwise_8bit_ops.h). The quantized bytes must match exactly,
including rounding ties.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the embedding-lookup
family (SparseLengths* over float, half and row-wise quantized tables, their gradient ops, GatherFused8BitRowwise,
and the row-wise quantizers) against real Caffe2 (see tests/differential.py). NumPy references of the quantizers are
in tests/ops/test_embedding.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, cases, check_op, invalid, make_op, run_case, run_rnn2jax
from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ops.embedding import _FROM_FUSED, _LOOKUPS, _TO_FUSED
from rnn2jax.ops.gradient_makers import get_gradient_for_op

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_embedding.py)

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


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_embedding.py)

def floats(data, shape, dtype=np.float32, low=-1.0, high=1.0):
    x = data.draw(arrays(shape, dtype, low, high))
    x[np.abs(x) < 1e-3] = 0  # keep clear of subnormals (XLA's CPU flushes them)
    return x


def _segments(data, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(INDICES, LENGTHS): up to 4 segments of up to 3 indices into `rows` rows."""
    count = data.draw(st.integers(0, 4))
    lengths = data.draw(arrays((count,), np.int32, 0, 3 if rows else 0))
    index = data.draw(st.sampled_from([np.int32, np.int64]))
    indices = data.draw(arrays((int(lengths.sum()),), index, 0, max(rows - 1, 0)))
    return indices, lengths


def _spoil(data, inputs: dict, names: dict, rows: int, lenient: bool = False) -> None:
    """Make one thing invalid: an index out of range, lengths not summing to the indices, a negative
    length, int64 lengths, or a rank-2 INDICES. `lenient`: an empty INDICES passes anything but int64
    lengths (see test_lookup_with_no_indices_checks_nothing) and the gradient ops would then read lengths
    that do not match INDICES, which rnn2jax refuses, so only int64 lengths are drawn."""
    indices, lengths = names["indices"], names["lengths"]
    kinds = ["sum", "int64", "negative"] + (["range"] if inputs[indices].size else []) + ["rank"]
    if lenient and not inputs[indices].size:
        kinds = ["int64"]
    kind = data.draw(st.sampled_from(kinds))
    if kind == "range":
        values = inputs[indices].copy()
        values[data.draw(st.integers(0, values.size - 1))] = data.draw(st.sampled_from([rows, rows + 2, -1]))
        inputs[indices] = values
    elif kind == "sum":
        inputs[lengths] = np.append(inputs[lengths], np.int32(data.draw(st.integers(1, 2))))
    elif kind == "negative":  # the sum still matches
        inputs[lengths] = np.append(inputs[lengths], np.int32(-1)).astype(np.int32)
        if inputs[lengths].size > 1:
            inputs[lengths][0] += 1
        else:
            inputs[lengths] = np.array([1, -1], np.int32)
    elif kind == "int64":
        inputs[lengths] = inputs[lengths].astype(np.int64)
    else:
        inputs[indices] = inputs[indices].reshape(1, -1)


# --------------------------------------------------------------------------------------------------
# Tables


def _fused_table(data, rows: int, bits: int, sb_dtype=None) -> np.ndarray:
    """Fused rows: random packed values, then a valid scale and bias as raw bytes."""
    sb_dtype = sb_dtype or (np.float32 if bits == 8 else np.float16)
    values = data.draw(st.integers(1, 4)) * (8 // bits if bits < 8 else 1)
    packed = data.draw(arrays((rows, values // (8 // bits)), np.uint8, 0, 255))
    scale = data.draw(arrays((rows, 1), np.float32, 0.0, 0.125)).astype(sb_dtype)
    bias = floats(data, (rows, 1)).astype(sb_dtype)
    tail = np.concatenate([scale, bias], axis=1).view(np.uint8).reshape(rows, 2 * np.dtype(sb_dtype).itemsize)
    return np.concatenate([packed, tail], axis=1)


def _table(data, op_type: str, rows: int) -> dict[str, np.ndarray]:
    spec = _LOOKUPS[op_type]
    if spec.table == "fused":
        return {"data": _fused_table(data, rows, spec.bits)}
    block = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    if spec.table == "rowwise8":
        q = data.draw(arrays((rows, *block), np.uint8, 0, 255))
        scale_bias = np.concatenate(
            [data.draw(arrays((rows, 1), np.float32, 0.0, 0.125)), floats(data, (rows, 1))], axis=1
        )
        return {"data": q, "scale_bias": scale_bias}
    dtype = data.draw(st.sampled_from([np.float32, np.float16]))
    if data.draw(st.integers(0, 15)) == 0:
        block = (0,)  # empty rows: Caffe2 (fbgemm) refuses them unless INDICES is empty
    return {"data": floats(data, (rows, *block), dtype)}


def draw_lookup(op_type: str):
    spec = _LOOKUPS[op_type]

    def draw(data):
        rows = data.draw(st.integers(0, 5))
        table = _table(data, op_type, rows)
        indices, lengths = _segments(data, rows)
        inputs = {"data": table["data"]}
        if spec.weighted:
            count = int(lengths.max(initial=0)) if spec.positional else indices.size
            if spec.positional:
                count += data.draw(st.integers(0, 2))
            inputs["weights"] = floats(data, (count,))
        inputs["indices"], inputs["lengths"] = indices, lengths
        if "scale_bias" in table:
            inputs["scale_bias"] = table["scale_bias"]
        if invalid(data):
            # (the 8BitsRowwise ops read WEIGHTS unchecked, past its end when short: rnn2jax refuses that)
            if (
                spec.weighted
                and spec.table != "rowwise8"
                and not spec.positional
                and indices.size
                and data.draw(st.booleans())
            ):
                inputs["weights"] = inputs["weights"][:-1]
            else:
                _spoil(data, inputs, {"indices": "indices", "lengths": "lengths"}, rows, spec.table == "float")
        args = {}
        if op_type == "SparseLengthsWeightedSum" and data.draw(st.booleans()):
            args["grad_on_weights"] = 1
        return make_op(op_type, list(inputs), ["y"], **args), inputs

    return draw


# --------------------------------------------------------------------------------------------------
# Gradient ops that no maker emits (older nets hold them)


def draw_lengths_gradient(op_type: str):
    weighted = "Weighted" in op_type
    main_input = "MainInput" in op_type

    def draw(data):
        block = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
        lengths = data.draw(arrays((data.draw(st.integers(0, 4)),), np.int32, 0, 3))
        count = int(lengths.sum())
        inputs = {}
        if weighted:
            inputs["weights"] = floats(data, (count,))
        inputs["grad"] = floats(data, (lengths.size, *block))
        inputs["lengths"] = lengths
        if main_input:
            rows = data.draw(st.integers(1, 4))
            inputs["data"] = floats(data, (rows, *block))
            inputs["indices"] = data.draw(arrays((count,), np.int32, 0, rows - 1))
        if invalid(data):
            if data.draw(st.booleans()):
                inputs["lengths"] = lengths.astype(np.int64)
            else:
                inputs["grad"] = inputs["grad"][:-1] if lengths.size else floats(data, (1, *block))
        outputs = ["data_grad", "weights_grad"] if main_input else ["data_grad"]
        return make_op(op_type, list(inputs), outputs), inputs

    return draw


# --------------------------------------------------------------------------------------------------
# Quantizers


def _quantizer_input(data, dtype, multiple: int, rows_min: int = 0):
    lead = tuple(data.draw(st.lists(st.integers(rows_min, 3), max_size=2)))
    cols = data.draw(st.integers(1, 4)) * multiple
    scale = data.draw(st.sampled_from([1.0, 8.0, 1 / 64]))
    x = floats(data, (*lead, cols), dtype, -scale, scale)
    if x.size and data.draw(st.integers(0, 5)) == 0:  # constant rows (a zero range)
        x[...] = x.reshape(-1)[0]
    return x


def draw_to_fused(op_type: str):
    spec = _TO_FUSED[op_type]
    per_byte = 8 // spec.bits

    def draw(data):
        x = _quantizer_input(data, spec.source, per_byte)
        if invalid(data):
            if per_byte > 1 and data.draw(st.booleans()):
                x = np.concatenate([x, x[..., :1]], axis=-1)  # columns not a multiple of 8/bits
            else:
                x = x.astype(np.float64 if spec.source == np.float32 else np.float32)
        op = make_op(op_type, ["x"], ["y"])
        if spec.bits < 8:  # Caffe2 registers engine GREEDY for the 2- and 4-bit quantizers
            op.engine = data.draw(st.sampled_from(["", "GREEDY"]))
        return op, {"x": x}

    return draw


def draw_from_fused(op_type: str):
    spec = _FROM_FUSED[op_type]

    def draw(data):
        lead = tuple(data.draw(st.lists(st.integers(0, 3), max_size=2)))
        table = _fused_table(data, int(np.prod(lead)), spec.bits, spec.sb_dtype)
        x = table.reshape(*lead, table.shape[-1])
        if invalid(data):
            # too few columns for the scale and bias (a segfault in Caffe2 when there are no rows)
            x = x[..., :3] if x.size and data.draw(st.booleans()) else x.astype(np.int8)
        return make_op(op_type, ["x"], ["y"]), {"x": x}

    return draw


def draw_float_to_rowwise_8bits(data):
    x = _quantizer_input(data, np.float32, 1, rows_min=1)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if invalid(data):
        x = x.astype(np.float64)
    return make_op("FloatToRowwiseQuantized8Bits", ["x"], ["q", "scale_bias"]), {"x": x}


def draw_rowwise_8bits_to_float(data):
    rows = data.draw(st.integers(0, 4))
    block = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    q = data.draw(arrays((rows, *block), np.uint8, 0, 255))
    scale_bias = np.concatenate([data.draw(arrays((rows, 1), np.float32, 0.0, 0.125)), floats(data, (rows, 1))], axis=1)
    if invalid(data):
        scale_bias = scale_bias[:, :1] if data.draw(st.booleans()) else np.concatenate([scale_bias] * 2)
    return make_op("Rowwise8BitQuantizedToFloat", ["q", "scale_bias"], ["y"]), {"q": q, "scale_bias": scale_bias}


def draw_gather_fused(data):
    rows = data.draw(st.integers(0, 5))
    table = _fused_table(data, rows, 8)
    index = data.draw(st.sampled_from([np.int32, np.int64]))
    indices = data.draw(arrays((data.draw(st.integers(0, 4 if rows else 0)),), index, 0, max(rows - 1, 0)))
    if invalid(data):
        indices = np.append(indices, rows).astype(index)
    return make_op("GatherFused8BitRowwise", ["data", "indices"], ["y"]), {"data": table, "indices": indices}


# --------------------------------------------------------------------------------------------------

_GRADIENT_OPS = {
    "SparseLengthsSum": ("SparseLengthsIndicesInGradientSumGradient",),
    "SparseLengthsMean": ("SparseLengthsIndicesInGradientMeanGradient",),
    "SparseLengthsWeightedSum": (
        "SparseLengthsIndicesInGradientWeightedSumGradient",
        "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
    ),
}

CASES = cases(
    *(Case(op_type, draw_lookup(op_type), gradient_ops=_GRADIENT_OPS.get(op_type, ())) for op_type in _LOOKUPS),
    *(
        Case(op_type, draw_lengths_gradient(op_type))
        for op_type in (
            "SparseLengthsSumGradient",
            "SparseLengthsMeanGradient",
            "SparseLengthsWeightedSumGradient",
            "SparseLengthsWeightedSumWithMainInputGradient",
        )
    ),
    Case("GatherFused8BitRowwise", draw_gather_fused),
    *(Case(op_type, draw_to_fused(op_type)) for op_type in _TO_FUSED),
    *(Case(op_type, draw_from_fused(op_type)) for op_type in _FROM_FUSED),
    Case("FloatToRowwiseQuantized8Bits", draw_float_to_rowwise_8bits),
    Case("Rowwise8BitQuantizedToFloat", draw_rowwise_8bits_to_float),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_embedding(caffe2, case, data):
    run_case(caffe2, case, data)


_NO_GRADIENT = [t for t in CASES if t not in _GRADIENT_OPS and "Gradient" not in t and t != "GatherFused8BitRowwise"]
_NO_GRADIENT = [t for t in _NO_GRADIENT if t != "SparseLengthsPositionalWeightedSum"]


@pytest.mark.parametrize("op_type", _NO_GRADIENT)
def test_no_gradient_makers_match_caffe2(caffe2, op_type):
    """The quantized lookups and the quantizers are NO_GRADIENT in Caffe2: no ops, no input gradients."""
    spec = _LOOKUPS.get(op_type)
    inputs = [f"x{i}" for i in range(spec.inputs if spec else 2 if op_type == "Rowwise8BitQuantizedToFloat" else 1)]
    outputs = ["q", "scale_bias"] if op_type == "FloatToRowwiseQuantized8Bits" else ["y"]
    op = make_op(op_type, inputs, outputs)
    g_output = [f"{name}_grad" for name in outputs]
    want_ops, want_g_input = caffe2.gradient_for_op(op, g_output)
    ours, g_input = get_gradient_for_op(op, g_output)
    assert (list(ours), list(g_input)) == (list(want_ops), list(want_g_input)) == ([], [None] * len(inputs))


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_lookup_with_no_indices_checks_nothing(caffe2, shape):
    """Caffe2's SparseLengthsSum returns zeros for an empty INDICES before checking anything, even lengths
    that do not sum to 0 or an INDICES of rank 2."""
    inputs = {
        "data": np.ones((4, 2), np.float32),
        "indices": np.zeros(shape, np.int64),
        "lengths": np.array([3, 1], np.int32),
    }
    want = check_op(caffe2, make_op("SparseLengthsSum", list(inputs), ["y"]), inputs)
    np.testing.assert_array_equal(want["y"], np.zeros((2, 2), np.float32))


def test_weighted_sum_with_main_input_gradient_needs_both_outputs():
    """With only DATA's gradient as output, Caffe2's SparseLengthsWeightedSumWithMainInputGradient (schema:
    1+ outputs) writes WEIGHTS' gradient through a null pointer and segfaults; rnn2jax refuses the op."""
    inputs = {
        "w": np.ones(2, np.float32),
        "g": np.ones((1, 3), np.float32),
        "lengths": np.array([2], np.int32),
        "data": np.ones((4, 3), np.float32),
        "indices": np.array([0, 1], np.int32),
    }
    op = make_op("SparseLengthsWeightedSumWithMainInputGradient", list(inputs), ["data_grad"])
    with pytest.raises(BadArgumentError, match="two outputs"):
        run_rnn2jax([op], inputs, ["data_grad"])


@pytest.mark.parametrize("bits", [2, 4])
def test_greedy_nbit_quantizer_searches_the_range_as_caffe2(caffe2, bits):
    """Engine GREEDY narrows each row's range (param_search_greedy) before quantizing: the bytes are Caffe2's
    (fused_nbit_rowwise_conversion_ops_test's TestNBitGreedyFused; the default engine's full range loses more)."""
    x = np.random.default_rng(0).random((6, 64), dtype=np.float32)
    op = make_op(f"FloatToFused{bits}BitRowwiseQuantized", ["x"], ["y"])
    op.engine = "GREEDY"
    got = run_rnn2jax([op], {"x": x}, ["y"])["y"]
    np.testing.assert_array_equal(got, caffe2.run_op(op, {"x": x})["y"])


def test_rowwise_8bit_dequantize_rounds_the_product_before_the_bias(caffe2):
    """q * scale + bias, the product rounded first as Eigen does (no fused multiply-add): 66 * 8.3064451 + 235.2
    is 783.4254 so, 783.42535 fused (lengths_reducer_rowwise_8bit_ops_test's test_quantize_op)."""
    x = np.array([[801.0, 786, 235.2, 2353.3434], [5.0, 11.0, 9.0, -2.0]], np.float32)
    quantize = make_op("FloatToRowwiseQuantized8Bits", ["x"], ["q", "scale_bias"])
    q, scale_bias = caffe2.run_op(quantize, {"x": x}).values()
    back = make_op("Rowwise8BitQuantizedToFloat", ["q", "scale_bias"], ["y"])
    got = run_rnn2jax([back], {"q": q, "scale_bias": scale_bias}, ["y"])["y"]
    np.testing.assert_array_equal(got, caffe2.run_op(back, {"q": q, "scale_bias": scale_bias})["y"])
