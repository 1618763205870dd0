"""The row-wise quantized embedding family of rnn2jax/ops/rowwise_quant.py against real Caffe2: lookups into
pruned fused tables, SparseLengthsSumSparseLookup, the fake 2/4-bit quantizers (default and GREEDY engines),
the stochastic quantizer and its inverse, ByteWeightDequant, QuantDecode and its gradient.

Quantized bytes must match Caffe2's exactly. FloatToFusedRandRowwiseQuantized with random=1 draws from
Caffe2's clock-seeded generator, so its levels cannot be compared: for it the header bytes are compared
exactly and the levels of both Caffe2 and rnn2jax are checked to be one of each value's two neighbouring
levels, and rnn2jax's to be unbiased on average (`test_random_quantization_*`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, invalid, make_op, run_case, run_rnn2jax
from rnn2jax.errors import Rnn2JaxError, ShapeError
from rnn2jax.ops.gradient_makers import get_gradient_for_op
from rnn2jax.ops.rowwise_quant import _FAKE, _SPARSE

F32 = np.float32


def floats(data, shape, dtype=np.float32, low=-1.0, high=1.0):
    x = data.draw(arrays(shape, dtype, low, high))
    x[np.abs(x) < 1e-3] = 0  # keep clear of subnormals (XLA's CPU flushes them)
    return x + np.zeros((), dtype)  # no -0.0


def fused_table(data, rows: int, bits: int) -> np.ndarray:
    """Fused rows of 1-4 packed bytes, then a valid scale and bias (float32 for 8 bits, else float16)."""
    sb_dtype = np.float32 if bits == 8 else np.float16
    packed = data.draw(arrays((rows, data.draw(st.integers(1, 4))), np.uint8, 0, 255))
    scale = data.draw(arrays((rows, 1), np.float32, 0.0, 0.125)).astype(sb_dtype)
    bias = floats(data, (rows, 1)).astype(sb_dtype)
    tail = np.concatenate([scale, bias], axis=1).view(np.uint8).reshape(rows, 2 * np.dtype(sb_dtype).itemsize)
    return np.concatenate([packed, tail], axis=1)


def segments(data, entries: int) -> tuple[np.ndarray, np.ndarray]:
    """(INDICES into `entries` entries, LENGTHS): up to 4 segments of up to 3 indices."""
    lengths = data.draw(arrays((data.draw(st.integers(0, 4)),), np.int32, 0, 3 if entries else 0))
    index = data.draw(st.sampled_from([np.int32, np.int64]))
    return data.draw(arrays((int(lengths.sum()),), index, 0, max(entries - 1, 0))), lengths


# --------------------------------------------------------------------------------------------------
# SparseLengths*BitRowwiseSparse


def draw_sparse(op_type: str):
    spec = _SPARSE[op_type]

    def draw(data):
        rows = data.draw(st.integers(0, 5))
        table = fused_table(data, rows, spec.bits)
        if rows and data.draw(st.integers(0, 4)) == 0:
            mapping = np.zeros(1, np.int32)  # Caffe2's marker of an unpruned table: INDICES are rows
            indices, lengths = segments(data, rows)
        else:
            mapping = data.draw(arrays((data.draw(st.integers(0, 6)),), np.int32, -1, rows - 1))
            indices, lengths = segments(data, mapping.size)
        inputs = {"data": table}
        if spec.weighted:
            inputs["weights"] = floats(data, (indices.size,))
        inputs.update(indices=indices, lengths=lengths, mapping=mapping)
        if invalid(data):
            kind = data.draw(st.sampled_from(["range", "sum", "negative", "int64", "mapping64", "weights"]))
            if kind == "range" and indices.size:
                values = indices.copy()
                values[data.draw(st.integers(0, values.size - 1))] = data.draw(st.sampled_from([-1, mapping.size, 9]))
                inputs["indices"] = values
            elif kind == "negative":  # the sum still matches
                inputs["lengths"] = np.concatenate([lengths, [1, -1]]).astype(np.int32)
            elif kind == "int64":
                inputs["lengths"] = lengths.astype(np.int64)
            elif kind == "mapping64":
                inputs["mapping"] = mapping.astype(np.int64)
            elif kind == "weights" and spec.weighted:
                inputs["weights"] = np.append(inputs["weights"], F32(1))
            else:
                inputs["lengths"] = np.append(lengths, np.int32(data.draw(st.integers(1, 2))))
        return make_op(op_type, list(inputs), ["y"]), inputs

    return draw


def draw_sparse_lookup(data):
    mapping = data.draw(arrays((data.draw(st.integers(0, 6)),), np.int32, -1, 9))
    indices, lengths = segments(data, mapping.size)
    if lengths.size and lengths[-1] and data.draw(st.booleans()):
        lengths = lengths.copy()
        lengths[-1] -= 1  # lengths that leave the last index unread
    inputs = {"indices": indices, "lengths": lengths, "mapping": mapping}
    weighted = data.draw(st.booleans())
    if weighted:
        inputs["weights"] = floats(data, (indices.size,))
    if invalid(data):
        kind = data.draw(st.sampled_from(["range", "past", "mapping64", "weights"]))
        if kind == "range" and indices.size:
            values = indices.copy()
            values[0] = data.draw(st.sampled_from([-1, mapping.size]))
            inputs["indices"] = values
        elif kind == "mapping64":
            inputs["mapping"] = mapping.astype(np.int64)
        elif kind == "weights" and weighted:
            inputs["weights"] = inputs["weights"][:-1] if indices.size else np.ones(1, F32)
        else:
            inputs["lengths"] = np.append(lengths, np.int32(indices.size + 1))
    outputs = ["out_indices", "out_lengths"] + (["out_weights"] if weighted else [])
    return make_op("SparseLengthsSumSparseLookup", list(inputs), outputs), inputs


# --------------------------------------------------------------------------------------------------
# Quantizers


def quantizer_input(data, dtype, rows_min: int = 0, cols_min: int = 1):
    rows, cols = data.draw(st.integers(rows_min, 4)), data.draw(st.integers(cols_min, 12))
    scale = data.draw(st.sampled_from([1.0, 8.0, 1 / 16]))
    x = floats(data, (rows, cols), dtype, -scale, scale)
    if x.size and data.draw(st.integers(0, 5)) == 0:  # constant rows (a zero range)
        x[...] = x.reshape(-1)[0]
    return x


def draw_fake(op_type: str):
    _, source = _FAKE[op_type]

    def draw(data):
        x = quantizer_input(data, source)
        if invalid(data):
            x = x.reshape(1, *x.shape) if data.draw(st.booleans()) else x.astype(np.float64)
        op = make_op(op_type, ["x"], ["y"])
        op.engine = data.draw(st.sampled_from(["", "GREEDY"]))
        return op, {"x": x}

    return draw


def draw_rand_quantize(data):
    x = quantizer_input(data, np.float32, cols_min=0)
    args = {"bitwidth": data.draw(st.sampled_from([1, 2, 4, 8])), "random": 0}
    if invalid(data):
        kind = data.draw(st.sampled_from(["bitwidth", "rank", "dtype"]))
        if kind == "bitwidth":
            args["bitwidth"] = 3
        elif kind == "rank":
            x = x.reshape(-1)
        else:
            x = x.astype(np.float16)
    return make_op("FloatToFusedRandRowwiseQuantized", ["x"], ["y"], **args), {"x": x}


def rand_quantized(data, rows: int, bitwidth: int) -> np.ndarray:
    """Rows of [bitwidth][tail][min][max][data] with random data bytes."""
    per_byte = 8 // bitwidth
    segment = data.draw(st.integers(0 if per_byte == 1 else 1, 4))
    tail = data.draw(st.integers(0, per_byte - 1)) if segment else 0
    low = floats(data, (rows, 1))
    high = low + data.draw(arrays((rows, 1), np.float32, 0.0, 2.0))
    header = np.tile(np.array([bitwidth, tail], np.uint8), (rows, 1))
    body = data.draw(arrays((rows, segment), np.uint8, 0, 255))
    return np.concatenate([header, np.concatenate([low, high], axis=1).view(np.uint8), body], axis=1)


def draw_rand_dequantize(data):
    x = rand_quantized(data, data.draw(st.integers(1, 4)), data.draw(st.sampled_from([1, 2, 4, 8])))
    if invalid(data):
        kind = data.draw(st.sampled_from(["bitwidth", "short", "rank", "dtype"]))
        if kind == "bitwidth":
            x[:, 0] = 3
        elif kind == "short":
            x = x[:, :3].copy()
        elif kind == "rank":
            x = x.reshape(-1)
        else:
            x = x.astype(np.int8)
    return make_op("FusedRandRowwiseQuantizedToFloat", ["x"], ["y"]), {"x": x}


def draw_byte_weight_dequant(data):
    x = data.draw(arrays(tuple(data.draw(st.lists(st.integers(1, 4), max_size=2))), np.uint8, 0, 255))
    total = data.draw(st.integers(1, x.size))
    shape = [total] if data.draw(st.booleans()) else [1, total]
    args = {"shape": shape} if total > 1 or data.draw(st.booleans()) else {}
    if data.draw(st.booleans()):
        args["min"] = float(data.draw(st.floats(-4, 0, width=32)))
        args["max"] = float(data.draw(st.floats(0.5, 4, width=32)))
    if invalid(data):
        if data.draw(st.booleans()):
            args["shape"] = [0, 2]
        else:
            x = x.astype(np.int8)
    return make_op("ByteWeightDequant", ["x"], ["y"], **args), {"x": x}


_CODES = [np.uint8, np.uint16, np.int32]


def draw_quant_decode(data):
    size = data.draw(st.integers(1, 6))
    codebook = floats(data, (size,) if data.draw(st.booleans()) else (1, size))
    n = data.draw(st.integers(1, 3))
    inputs = {"codebook": codebook}
    for i in range(n):
        shape = tuple(data.draw(st.lists(st.integers(0, 3), max_size=2)))
        inputs[f"codes{i}"] = data.draw(arrays(shape, data.draw(st.sampled_from(_CODES)), 0, size - 1))
    if invalid(data):
        if data.draw(st.booleans()):
            inputs["codebook"] = codebook.astype(np.float64)
        else:
            inputs["codes0"] = inputs["codes0"].astype(np.int64)
    return make_op("QuantDecode", list(inputs), [f"decoded{i}" for i in range(n)]), inputs


def draw_quant_decode_gradient(data):
    size = data.draw(st.integers(1, 6))
    inputs = {"codebook": floats(data, (size,))}
    n = data.draw(st.integers(1, 3))
    grads = {}
    for i in range(n):
        shape = tuple(data.draw(st.lists(st.integers(0, 3), max_size=2)))
        inputs[f"codes{i}"] = data.draw(arrays(shape, data.draw(st.sampled_from(_CODES)), 0, size - 1))
        grads[f"grad{i}"] = floats(data, shape, low=-2, high=2)
    inputs.update(grads)
    if invalid(data):
        if data.draw(st.booleans()):
            inputs["grad0"] = np.append(inputs["grad0"], F32(1))
        else:
            inputs["grad0"] = inputs["grad0"].astype(np.float64)
    return make_op("QuantDecodeGradient", list(inputs), ["codebook_grad"]), inputs


CASES = cases(
    # Under jit for the plain sums (traced indices and mapping, checked when the net runs); eagerly for the rest,
    # which share that code and would each pay for XLA compiling every drawn shape.
    *(Case(op_type, draw_sparse(op_type), jit=op_type.startswith("SparseLengthsSum")) for op_type in _SPARSE),
    Case("SparseLengthsSumSparseLookup", draw_sparse_lookup, jit=False),
    *(Case(op_type, draw_fake(op_type)) for op_type in _FAKE),
    Case(
        "FloatToFusedRandRowwiseQuantized",
        draw_rand_quantize,
        note="random=0 only: with random=1 Caffe2 draws from its own generator (test_random_quantization_*)",
    ),
    Case("FusedRandRowwiseQuantizedToFloat", draw_rand_dequantize, jit=False),
    Case("ByteWeightDequant", draw_byte_weight_dequant),
    Case("QuantDecode", draw_quant_decode, gradient_ops=("QuantDecodeGradient",)),
    Case("QuantDecodeGradient", draw_quant_decode_gradient),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_rowwise_quant(caffe2, case, data):
    run_case(caffe2, case, data)


# --------------------------------------------------------------------------------------------------
# The stochastic quantizer (random=1): properties, not Caffe2's draws


def _levels(fused: np.ndarray, cols: int) -> np.ndarray:
    """The level of each of `cols` values of each row of FloatToFusedRandRowwiseQuantized's output."""
    bitwidth = int(fused[0, 0])
    per_byte = 8 // bitwidth
    body = fused[:, 10:]
    buckets = [(body >> (b * bitwidth)) & ((1 << bitwidth) - 1) for b in range(per_byte)]
    return np.concatenate(buckets, axis=1)[:, :cols]


def _exact_levels(x: np.ndarray, bitwidth: int) -> np.ndarray:
    low, high = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    gap = (high - low) / F32((1 << bitwidth) - 1)
    return (x - low).astype(np.float64) * (1.0 / (gap.astype(np.float64) + 1e-8))


@pytest.mark.parametrize("bitwidth", [1, 2, 4, 8])
def test_random_quantization_rounds_to_a_neighbouring_level(caffe2, bitwidth):
    """Both Caffe2's draws and rnn2jax's: every value's level is floor(t) or ceil(t) of its exact position
    t, and the header (bitwidth, tail, min, max) is Caffe2's byte for byte."""
    rng = np.random.default_rng(bitwidth)
    x = rng.uniform(-2, 2, (6, 13)).astype(F32)
    op = make_op("FloatToFusedRandRowwiseQuantized", ["x"], ["y"], bitwidth=bitwidth, random=1)
    want = caffe2.run_op(op, {"x": x})["y"]
    got = run_rnn2jax([op], {"x": x}, ["y"])["y"]
    assert got.dtype == want.dtype == np.uint8 and got.shape == want.shape
    np.testing.assert_array_equal(got[:, :10], want[:, :10])
    t = _exact_levels(x, bitwidth)
    for fused in (got, want):
        levels = _levels(fused, x.shape[1])
        assert ((levels >= np.floor(t - 1e-6)) & (levels <= np.ceil(t + 1e-6))).all()


def test_random_quantization_is_unbiased():
    """The mean level over many draws is the exact position t (TernGrad's unbiased rounding)."""
    row = np.array([0.0, 0.3, 1.1, 1.7, 2.5, 3.0], F32)
    x = np.tile(row, (4000, 1))
    op = make_op("FloatToFusedRandRowwiseQuantized", ["x"], ["y"], bitwidth=2, random=1)
    levels = _levels(run_rnn2jax([op], {"x": x}, ["y"])["y"], row.size).astype(np.float64)
    t = _exact_levels(row[None], 2)[0]
    np.testing.assert_allclose(levels.mean(axis=0), t, atol=0.04)
    assert len(np.unique(levels[:, 1])) == 2  # 0.3 really is drawn to both of its neighbours


# --------------------------------------------------------------------------------------------------
# Refusals: each an rnn2jax error naming the op and the blob


def _refused(op, inputs, match: str, jit: bool = True) -> None:
    with pytest.raises(Rnn2JaxError, match=match) as raised:
        run_rnn2jax([op], inputs, list(op.output), jit=jit)
    assert op.type in str(raised.value)


@pytest.mark.parametrize("jit", [False, True])
def test_sparse_lookup_index_out_of_range_is_refused(caffe2, jit):
    table = np.zeros((3, 6), np.uint8)
    inputs = {
        "data": table,
        "indices": np.array([0, 4], np.int64),
        "lengths": np.array([2], np.int32),
        "mapping": np.array([0, -1, 2], np.int32),
    }
    op = make_op("SparseLengthsSum4BitRowwiseSparse", list(inputs), ["y"])
    assert check_op(caffe2, op, inputs, jit=jit) is None  # Caffe2 refuses it too
    _refused(op, inputs, "'indices' has 4", jit)


@pytest.mark.parametrize("jit", [False, True])
def test_mapping_past_data_is_refused(jit):
    """fbgemm reads a mapped row past DATA's end unchecked (Caffe2 answers garbage); rnn2jax refuses."""
    inputs = {
        "data": np.zeros((3, 6), np.uint8),
        "indices": np.array([1], np.int32),
        "lengths": np.array([1], np.int32),
        "mapping": np.array([0, 7], np.int32),
    }
    _refused(
        make_op("SparseLengthsMean2BitRowwiseSparse", list(inputs), ["y"]), inputs, "'mapping' maps index 1 to 7", jit
    )


@pytest.mark.parametrize("jit", [False, True])
def test_quant_decode_code_past_the_codebook_is_refused(jit):
    """Caffe2 only DCHECKs the codes (reading past the codebook in a release build); rnn2jax refuses them."""
    inputs = {"codebook": np.ones(3, F32), "codes": np.array([0, 3], np.uint8)}
    _refused(make_op("QuantDecode", list(inputs), ["y"]), inputs, "codes 'codes' has 3", jit)


def test_byte_weight_dequant_needs_the_bytes_of_its_shape():
    inputs = {"x": np.zeros(5, np.uint8)}
    _refused(make_op("ByteWeightDequant", ["x"], ["y"], shape=[2, 3]), inputs, "'x' has 5 bytes")


def test_unpruned_marker_traced(caffe2):
    """A mapping of [0] is decided when the compiled net runs (the mapping is traced there)."""
    rng = np.random.default_rng(0)
    table = np.concatenate([rng.integers(0, 255, (4, 3)), np.ones((4, 8))], axis=1).astype(np.uint8)
    for mapping in ([0], [3]):
        inputs = {
            "data": table,
            "indices": np.array([0, 0, 0], np.int64),
            "lengths": np.array([1, 2], np.int32),
            "mapping": np.array(mapping, np.int32),
        }
        check_op(caffe2, make_op("SparseLengthsSum8BitRowwiseSparse", list(inputs), ["y"]), inputs)


def test_quant_decode_gradient_maker_matches_caffe2(caffe2):
    op = make_op("QuantDecode", ["cb", "c0", "c1"], ["y0", "y1"])
    want = caffe2.gradient_for_op(op, ["y0_grad", "y1_grad"])
    ours = get_gradient_for_op(op, ["y0_grad", "y1_grad"])
    assert [o.SerializeToString() for o in ours[0]] == [o.SerializeToString() for o in want[0]]
    assert list(ours[1]) == list(want[1]) == ["cb_grad", None, None]


def test_fake_quantizer_of_empty_rows_is_refused():
    """Caffe2 reads past an empty row for its min and max (it crashes)."""
    _refused(make_op("FloatToFused2BitFakeRowwiseQuantized", ["x"], ["y"]), {"x": np.zeros((2, 0), F32)}, "no columns")


def test_sparse_lookup_output_count():
    """Caffe2 writes the weights' output exactly when WEIGHTS is given (else out of range, or left unset)."""
    inputs = {"i": np.zeros(1, np.int32), "l": np.ones(1, np.int32), "m": np.zeros(1, np.int32)}
    with pytest.raises(Rnn2JaxError, match="outputs"):
        run_rnn2jax([make_op("SparseLengthsSumSparseLookup", list(inputs), ["a", "b", "c"])], inputs, ["a"], jit=False)


def test_shape_error_names_blob():
    inputs = {"x": np.zeros((2, 3), np.uint8)}
    with pytest.raises(ShapeError, match="'x'"):
        run_rnn2jax([make_op("FusedRandRowwiseQuantizedToFloat", ["x"], ["y"])], inputs, ["y"], jit=False)
