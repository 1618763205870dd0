"""The row-wise quantized embedding family beyond embedding.py: lookups into pruned fused tables
(SparseLengths{Sum,WeightedSum,Mean}{2,4,8}BitRowwiseSparse) and their index remapping
(SparseLengthsSumSparseLookup), the "fake" 2/4-bit quantizers (FloatToFused{2,4}BitFakeRowwiseQuantized,
Half..., with the GREEDY engine's range search), the stochastic quantizer FloatToFusedRandRowwiseQuantized
and its inverse, ByteWeightDequant, and the codebook ops QuantDecode / QuantDecodeGradient.

A module of its own because embedding.py is already long; it reuses embedding.py's checks and its fused-row
helpers (the same layouts: 8/bits values per byte, low bits first, scale and bias as raw bytes at the end of
each row). Sources: caffe2/operators/lengths_reducer_fused_nbit_rowwise_ops.h,
fused_rowwise_nbitfake_conversion_ops.{h,cc}, fused_rowwise_random_quantization_ops.cc,
caffe2/perfkernels/math_cpu_{base,avx2}.cc, byte_weight_dequant_op.h, quant_decode_op.{h,cc}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .common import rounded
from .embedding import (
    _F16,
    _F32,
    _INDEX_DTYPES,
    _U8,
    _check_lengths,
    _check_range,
    _dequantize_fused,
    _describe,
    _divide,
    _greedy_range,
    _half,
    _mean_scale,
    _name,
    _need_dtype,
    _need_rank,
    _per_row,
    _segment_ids,
    _to_bytes,
    _xp,
)
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import GradientContext, GradientError, GradientOps, gradient_op, no_gradient
from .registry import Kernel, declare_family, facet, register

# Caffe2 registers NO_GRADIENT for all of them but ByteWeightDequant, QuantDecode and QuantDecodeGradient.
declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=no_gradient, emitter=NO_EMITTER)

_I32 = np.dtype(np.int32)


def _is_traced(*values: Any) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in values)


# --------------------------------------------------------------------------------------------------
# SparseLengths*{2,4,8}BitRowwiseSparse: lookups into pruned fused tables


@dataclass(frozen=True)
class _Sparse:
    bits: int
    weighted: bool = False
    mean: bool = False

    @property
    def sb_dtype(self) -> np.dtype:
        return _F32 if self.bits == 8 else _F16

    @property
    def indices(self) -> int:
        return 1 + self.weighted

    @property
    def lengths(self) -> int:
        return 2 + self.weighted

    @property
    def mapping(self) -> int:
        return 3 + self.weighted


_SPARSE: dict[str, _Sparse] = {}
for _bits in (2, 4, 8):
    _SPARSE[f"SparseLengthsSum{_bits}BitRowwiseSparse"] = _Sparse(_bits)
    _SPARSE[f"SparseLengthsWeightedSum{_bits}BitRowwiseSparse"] = _Sparse(_bits, weighted=True)
    _SPARSE[f"SparseLengthsMean{_bits}BitRowwiseSparse"] = _Sparse(_bits, mean=True)

runtime_checked(*_SPARSE)


def _check_mapped(op: Op, spec: _Sparse, mapped: Any, indices: Any, rows: int) -> None:
    """Each looked-up entry of COMPRESSED_INDICES_MAPPING is -1 (a pruned row) or a row of DATA; fbgemm
    reads any other value as a row, past DATA's end."""
    if not mapped.size:
        return
    xp = _xp(mapped)
    bad = (mapped < -1) | (mapped >= rows)
    position = xp.argmax(bad)
    message = (
        f"{literal(op.where)}: COMPRESSED_INDICES_MAPPING '{literal(_name(op, spec.mapping))}' maps index "
        f"{{index}} to {{row}}, which is neither -1 (pruned) nor one of the {rows} rows of DATA "
        f"'{literal(op.inputs[0])}'"
    )
    enforce(~xp.any(bad), message, index=indices.ravel()[position], row=mapped.ravel()[position])


def _build_sparse(op: Op) -> Kernel:
    """(DATA [N, C] uint8, [WEIGHTS [K],] INDICES [K], LENGTHS [M], COMPRESSED_INDICES_MAPPING) -> float32
    [M, (C - 2 * sizeof(scale)) * 8/bits]. INDICES index the mapping, whose values are rows of DATA or -1 for
    a pruned row, which adds nothing (a mean still divides by the whole length). A mapping of one 0 is
    Caffe2's marker for an unpruned table: INDICES are then rows of DATA."""
    spec = _SPARSE[op.type]
    tail = 2 * spec.sb_dtype.itemsize
    per_byte = 8 // spec.bits

    def kernel(data, *rest):
        weights = rest[0] if spec.weighted else None
        indices, lengths, mapping = rest[spec.indices - 1], rest[spec.lengths - 1], rest[spec.mapping - 1]
        _need_dtype(op, data, 0, (_U8,), "DATA")
        _need_rank(op, data, 0, 2, "DATA")
        if data.shape[1] <= tail:  # Caffe2: "DATA must have more than 4 columns", then a negative or empty block
            raise ShapeError(
                f"{op.where}: DATA '{op.inputs[0]}' must have more than {tail} columns (the scale and bias), got "
                f"{_describe(data)}"
            )
        block = (data.shape[1] - tail) * per_byte
        _need_dtype(op, indices, spec.indices, _INDEX_DTYPES, "INDICES")
        _need_rank(op, indices, spec.indices, 1, "INDICES")
        _need_dtype(op, lengths, spec.lengths, (_I32,), "LENGTHS")
        _need_rank(op, lengths, spec.lengths, 1, "LENGTHS")
        _need_dtype(op, mapping, spec.mapping, (_I32,), "COMPRESSED_INDICES_MAPPING")
        count, segments, rows = indices.shape[0], lengths.shape[0], data.shape[0]
        if weights is not None:
            _need_dtype(op, weights, 1, (_F32,), "WEIGHTS")
            _need_rank(op, weights, 1, 1, "WEIGHTS")
            if weights.shape[0] != count:
                raise ShapeError(
                    f"{op.where}: WEIGHTS '{op.inputs[1]}' has {weights.shape[0]} weights for {count} indices"
                )
        _check_lengths(op, lengths, spec.lengths, count)
        if count == 0:
            return jnp.zeros((segments, block), jnp.float32)
        table = mapping.reshape(-1)
        looked_up = _lookup_rows(op, spec, indices, table, rows)
        if rows == 0:  # every entry is pruned (checked)
            return jnp.zeros((segments, block), jnp.float32)
        values = _dequantize_fused(jnp.take(data, jnp.clip(looked_up, 0, rows - 1), axis=0), spec.bits, spec.sb_dtype)
        if weights is not None:
            values = values * weights[:, None]
        values = jnp.where((looked_up != -1)[:, None], values, 0.0)  # a pruned entry adds nothing, not 0 * row
        out = jax.ops.segment_sum(values, _segment_ids(lengths, count), num_segments=segments, indices_are_sorted=True)
        if spec.mean:
            out = out * _per_row(_mean_scale(lengths), out.ndim)
        return out

    return kernel


def _lookup_rows(op: Op, spec: _Sparse, indices: Any, table: Any, rows: int) -> Any:
    """The row of DATA each index reads (-1: pruned), its range checked as Caffe2 does (and the mapped
    rows as fbgemm does not)."""
    size = table.shape[0]
    fallback: Any = False
    if size == 1:
        fallback = table[0] == 0 if _is_traced(table) else bool(np.asarray(table)[0] == 0)
    if fallback is True:
        _check_range(op, indices, spec.indices, rows)
        return indices
    xp = jnp if _is_traced(indices, table) else np
    mapped = xp.take(xp.asarray(table), xp.clip(indices, 0, size - 1)) if size else xp.full(indices.shape, -1)
    if fallback is False:
        _check_range(op, indices, spec.indices, size, "COMPRESSED_INDICES_MAPPING")
        _check_mapped(op, spec, mapped, indices, rows)
        return mapped
    # a traced one-entry mapping: whether it is the marker [0] is decided when the net runs
    bad = jnp.where(fallback, (indices < 0) | (indices >= rows), (indices < 0) | (indices >= 1))
    message = (
        f"{literal(op.where)}: INDICES '{literal(_name(op, spec.indices))}' has {{bad}}, out of the range [0, "
        f"{{bound}}) of COMPRESSED_INDICES_MAPPING '{literal(_name(op, spec.mapping))}' (or, where that is [0], "
        "of DATA's rows)"
    )
    enforce(~jnp.any(bad), message, bad=indices[jnp.argmax(bad)], bound=jnp.where(fallback, rows, 1))
    mapped_ok = (mapped >= -1) & (mapped < rows)
    enforce(
        fallback | jnp.all(mapped_ok),
        f"{literal(op.where)}: COMPRESSED_INDICES_MAPPING '{literal(_name(op, spec.mapping))}' maps to {{row}}, "
        f"which is neither -1 (pruned) nor one of the {rows} rows of DATA",
        row=mapped[jnp.argmin(mapped_ok)],
    )
    return jnp.where(fallback, indices, mapped.astype(indices.dtype))


for _type, _spec in _SPARSE.items():
    _ints = (_spec.indices, _spec.lengths, _spec.mapping)
    register(_type, inputs=4 + _spec.weighted, roles=Roles(integers=_ints))(_build_sparse)


# --------------------------------------------------------------------------------------------------
# SparseLengthsSumSparseLookup


@register(
    "SparseLengthsSumSparseLookup",
    inputs=(3, 4),
    outputs=(2, 3),
    static_inputs=(0, 1, 2),
    roles=Roles(integers=(0, 1, 2)),
)
def sparse_lengths_sum_sparse_lookup(op: Op) -> Kernel:
    """(INDICES [K] into the mapping, LENGTHS [M], COMPRESSED_INDICES_MAPPING [P][, WEIGHTS [K]]) ->
    (the mapped indices that are not pruned, in INDICES' dtype; LENGTHS less the pruned entries of each
    segment[, their WEIGHTS]). How many survive decides the output shapes, so the first three inputs are
    static. As Caffe2's loop: a negative length reads nothing and passes through, lengths summing to less
    than len(INDICES) leave the rest unread."""
    weighted = len(op.inputs) > 3
    if len(op.outputs) != 2 + weighted:
        # Caffe2 writes output 2 exactly when WEIGHTS is given: out of range, or left unset
        raise BadArgumentError(
            f"{op.where}: {op.type} with {len(op.inputs)} inputs has {2 + weighted} outputs, got {len(op.outputs)}"
        )

    def kernel(indices, lengths, mapping, *maybe_weights):
        _need_dtype(op, indices, 0, _INDEX_DTYPES, "INDICES")
        _need_rank(op, indices, 0, 1, "INDICES")
        _need_rank(op, lengths, 1, 1, "LENGTHS")
        _need_rank(op, mapping, 2, 1, "COMPRESSED_INDICES_MAPPING")
        _need_dtype(op, lengths, 1, (_I32,), "LENGTHS")
        _need_dtype(op, mapping, 2, (_I32,), "COMPRESSED_INDICES_MAPPING")
        count = indices.shape[0]
        if maybe_weights:
            (weights,) = maybe_weights
            _need_dtype(op, weights, 3, (_F32,), "WEIGHTS")
            _need_rank(op, weights, 3, 1, "WEIGHTS")
            if weights.shape[0] != count:
                raise ShapeError(
                    f"{op.where}: WEIGHTS '{op.inputs[3]}' has {weights.shape[0]} weights for {count} indices"
                )
        idx, lens, table = np.asarray(indices), np.asarray(lengths), np.asarray(mapping)
        kept: list[int] = []
        out_lengths = np.empty(lens.shape, np.int32)
        current = 0
        for m, length in enumerate(lens.tolist()):
            if current + length > count:
                raise ShapeError(
                    f"{op.where}: the lengths in '{op.inputs[1]}' reach past the {count} indices of '{op.inputs[0]}'"
                )
            skipped = 0
            for _ in range(length):
                compressed = int(idx[current])
                if not 0 <= compressed < table.shape[0]:
                    raise ShapeError(
                        f"{op.where}: INDICES '{op.inputs[0]}' has {compressed}, out of the range [0, "
                        f"{table.shape[0]}) of COMPRESSED_INDICES_MAPPING '{op.inputs[2]}'"
                    )
                if table[compressed] == -1:
                    skipped += 1
                else:
                    kept.append(current)
                current += 1
            out_lengths[m] = length - skipped
        positions = np.asarray(kept, np.int64)
        out_indices = table[idx[positions]].astype(idx.dtype) if kept else np.zeros(0, idx.dtype)
        result = (jnp.asarray(out_indices), jnp.asarray(out_lengths))
        if maybe_weights:
            result += (jnp.take(maybe_weights[0], jnp.asarray(positions, jnp.int32), axis=0),)
        return result

    return kernel


# --------------------------------------------------------------------------------------------------
# Fake 2/4-bit quantization: the 8-bit fused layout (one byte per value, float32 scale and bias) holding
# values of 2/4 bits with a float16-rounded scale and bias


_FAKE = {
    "FloatToFused2BitFakeRowwiseQuantized": (2, _F32),
    "FloatToFused4BitFakeRowwiseQuantized": (4, _F32),
    "HalfToFused2BitFakeRowwiseQuantized": (2, _F16),
    "HalfToFused4BitFakeRowwiseQuantized": (4, _F16),
}


def _fake_quantize(x: Any, bits: int, greedy: bool) -> jax.Array:
    """[R, C] float32 -> [R, C + 8] uint8: the values' levels, then float32 scale and bias."""
    top = (1 << bits) - 1
    if greedy:
        low, high = jax.vmap(lambda row: _greedy_range(row, bits))(x)
        low, high = low[:, None], high[:, None]
    else:
        low, high = jnp.min(x, axis=1, keepdims=True), jnp.max(x, axis=1, keepdims=True)
    low = _half(low)
    span = high - low
    scale = jnp.where(span == 0, jnp.float32(1.0), _half(_divide(span, float(top))))
    inverse = jnp.float32(1.0) / scale
    v = (x - low) * inverse
    # lrintf of an infinity or NaN (a scale rounded to 0 in float16) is LONG_MIN, which std::min<int> reads as 0
    q = jnp.where(jnp.isfinite(v), jnp.clip(jnp.round(v), 0, top), 0).astype(jnp.uint8)
    return jnp.concatenate([q, _to_bytes(jnp.concatenate([scale, low], axis=1))], axis=1)


@register(*_FAKE)
def to_fused_fake_rowwise(op: Op) -> Kernel:
    """[R, C] float/half -> [R, C + 8] uint8. The default engine takes each row's min and max; engine GREEDY
    first searches a narrower range (param_search_greedy). The L2 errors it compares are summed in XLA's
    order, not Caffe2's, which can only matter when two candidate ranges lose equally to the last bit."""
    bits, source = _FAKE[op.type]
    greedy = "GREEDY" in op.engine.split(",")

    def kernel(x):
        _need_dtype(op, x, 0, (source,), "input")
        if x.ndim != 2:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be a matrix, got {_describe(x)}")
        rows, cols = x.shape
        if rows and not cols:  # std::min_element of an empty row: Caffe2 reads past it
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' has rows of no columns to quantize")
        if not rows:
            return jnp.zeros((0, cols + 8), jnp.uint8)
        return _fake_quantize(x.astype(jnp.float32), bits, greedy)

    return kernel


# --------------------------------------------------------------------------------------------------
# Stochastic row-wise quantization: rows of [bitwidth][tail][min float32][max float32][data]


_QEPSILON = 1e-8


def _levels(x: Any, bitwidth: int, uniform: Any | None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(each value's level, each row's min, max). The level of t = (x - min) / gap is the nearest
    (nearbyint) or, given uniform draws u in [0, 1), floor(t + u): t's upper neighbour with probability
    frac(t), so unbiased."""
    top = (1 << bitwidth) - 1
    low = jnp.min(x, axis=1, keepdims=True, initial=jnp.inf)
    high = jnp.max(x, axis=1, keepdims=True, initial=-jnp.inf)
    gap = _divide(high - low, float(top))
    # float gap_inverse = 1. / (gap + QEPSILON): in double, then rounded to float
    inverse = (1.0 / (gap.astype(jnp.float64) + _QEPSILON)).astype(jnp.float32)
    t = (x - low) * inverse
    nearest = uniform is None
    q = jnp.round(jnp.clip(t, 0, top)) if nearest else jnp.clip(jnp.floor(t + uniform), 0, top)
    return jnp.where(jnp.isnan(q), 0, q).astype(jnp.uint8), low, high


@register("FloatToFusedRandRowwiseQuantized", random=True)
def float_to_fused_rand_rowwise_quantized(op: Op) -> Kernel:
    """[R, C] float32 -> [R, 10 + ceil(C / (8/bitwidth))] uint8. Value j of a row is bucket j // S of byte
    j % S of its data (S the data's bytes). With `random` (Caffe2's default) each value rounds to one of
    its two neighbouring levels at random, unbiased; the draws are JAX's (from the net's key), not Caffe2's
    clock-seeded generator. With random=0 the levels are the nearest and match Caffe2 exactly."""
    bitwidth = op.int("bitwidth", 8)
    if bitwidth not in (1, 2, 4, 8):
        raise BadArgumentError(f"{op.where}: Unsupported bitwidth {bitwidth} (1, 2, 4 or 8)")
    stochastic = op.bool("random", True)
    per_byte = 8 // bitwidth

    def kernel(x, *, key=None):
        _need_dtype(op, x, 0, (_F32,), "input")
        if x.ndim != 2:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be a matrix, got {_describe(x)}")
        rows, cols = x.shape
        segment = -(-cols // per_byte)
        if not rows:
            return jnp.zeros((0, 10 + segment), jnp.uint8)
        uniform = None
        if stochastic:
            uniform = jax.random.uniform(key if key is not None else jax.random.key(0), x.shape, jnp.float32)
        q, low, high = _levels(x, bitwidth, uniform)
        padded = jnp.pad(q, ((0, 0), (0, segment * per_byte - cols)))
        buckets = padded.reshape(rows, per_byte, segment).astype(jnp.uint32)
        shifts = (jnp.arange(per_byte, dtype=jnp.uint32) * bitwidth)[None, :, None]
        data = jnp.sum(buckets << shifts, axis=1).astype(jnp.uint8)
        tail = (per_byte - cols % per_byte) % per_byte
        header = jnp.broadcast_to(jnp.array([bitwidth, tail], jnp.uint8), (rows, 2))
        return jnp.concatenate([header, _to_bytes(jnp.concatenate([low, high], axis=1)), data], axis=1)

    return kernel


@register("FusedRandRowwiseQuantizedToFloat", static_inputs=(0,))
def fused_rand_rowwise_quantized_to_float(op: Op) -> Kernel:
    """[R, 10 + S] uint8 -> [R, S * 8/bitwidth - tail] float32: level * gap + min, gap = (max - min) /
    (2^bitwidth - 1) + 1e-8. The first row's bitwidth and tail bytes decide the output's width, so the input
    is static; rows of another bitwidth or tail (which Caffe2 decodes into a garbled output) are refused."""

    def kernel(x):
        _need_dtype(op, x, 0, (_U8,), "input")
        if x.ndim != 2:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be a matrix, got {_describe(x)}")
        if x.size < 4:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have at least 4 elements, got {_describe(x)}")
        header = np.asarray(x[:, :2])
        bitwidth, tail = int(header[0, 0]), int(header[0, 1])
        if bitwidth not in (1, 2, 4, 8):
            raise ShapeError(f"{op.where}: Unsupported bitwidth {bitwidth} in input '{op.inputs[0]}'")
        if (header != header[0]).any():
            raise ShapeError(
                f"{op.where}: the rows of input '{op.inputs[0]}' differ in bitwidth or tail (bytes 0 and 1); Caffe2 "
                "sizes the output by the first row's"
            )
        rows, cols = x.shape
        per_byte = 8 // bitwidth
        width = (cols - 10) * per_byte - tail
        if cols < 10 or width < 0:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[0]}' ({_describe(x)}) leaves no room for tail {tail} of its data"
            )
        data = jnp.asarray(x[:, 10:])
        shifts = (jnp.arange(per_byte, dtype=jnp.uint8) * bitwidth)[None, :, None]
        levels = (data[:, None, :] >> shifts) & jnp.uint8((1 << bitwidth) - 1)
        levels = levels.reshape(rows, per_byte * (cols - 10))[:, :width].astype(jnp.float32)
        bounds = jnp.asarray(x[:, 2:10]).reshape(rows, 2, 4)
        low_high = lax.bitcast_convert_type(bounds, jnp.float32)
        low, high = low_high[:, :1], low_high[:, 1:]
        gap = _divide(high - low, float((1 << bitwidth) - 1))
        gap = (gap.astype(jnp.float64) + _QEPSILON).astype(jnp.float32)
        return levels * gap + low

    return kernel


# --------------------------------------------------------------------------------------------------
# ByteWeightDequant


@register("ByteWeightDequant", gradient=NO_GRADIENT)
def byte_weight_dequant(op: Op) -> Kernel:
    """uint8 bytes -> float32 of the `shape` argument: the first prod(shape) bytes b as min + b * (max -
    min) / 255 (`min` -3, `max` 3). Caffe2 also reads the bytes of a string tensor's first string; rnn2jax
    lowers only the uint8 form (jitted code holds no strings)."""
    low, high = np.float32(op.float("min", -3.0)), np.float32(op.float("max", 3.0))
    shape = tuple(op.ints("shape", ()))
    if any(d < 0 for d in shape):
        raise BadArgumentError(f"{op.where}: argument 'shape' has a negative dim: {list(shape)}")
    total = math.prod(shape)
    if total == 0:  # CAFFE_ENFORCE(total)
        raise BadArgumentError(f"{op.where}: argument 'shape' {list(shape)} holds no elements")
    # float bin_interval = (max_ - min_) / 255.0: a float difference, divided in double, stored as float
    interval = np.float32(np.float64(np.float32(high - low)) / 255.0)

    def kernel(x):
        if np.dtype(x.dtype) != _U8:
            raise InputTypeError(
                f"{op.where}: input '{op.inputs[0]}' must be uint8 (or, in Caffe2 only, strings), got {_describe(x)}"
            )
        if x.size < total:  # Caffe2 reads past the input
            raise ShapeError(
                f"{op.where}: input '{op.inputs[0]}' has {x.size} bytes, fewer than the {total} of shape {list(shape)}"
            )
        values = x.reshape(-1)[:total].astype(jnp.float32)
        return (rounded(values * interval) + low).reshape(shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# QuantDecode: a codebook lookup

_CODE_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), _I32)

runtime_checked("QuantDecode", "QuantDecodeGradient")


def _check_codes(op: Op, codes: Any, position: int, size: int) -> None:
    _need_dtype(op, codes, position, _CODE_DTYPES, "codes")
    if not codes.size:
        return
    xp = _xp(codes)
    codes = xp.asarray(codes)
    bad = (codes.astype(xp.int64) < 0) | (codes.astype(xp.int64) >= size)
    message = (
        f"{literal(op.where)}: codes '{literal(_name(op, position))}' has {{bad}}, out of the range [0, {size}) "
        f"of codebook '{literal(op.inputs[0])}'"
    )
    enforce(~xp.any(bad), message, bad=codes.ravel()[xp.argmax(bad.ravel())])


@register("QuantDecode", inputs=(2, None), outputs=(1, None), roles=Roles(integers=slice(1, None)))
def quant_decode(op: Op) -> Kernel:
    """(codebook float32, codes_0..codes_n uint8/uint16/int32) -> decoded_i = codebook.flat[codes_i], shaped
    as codes_i. Caffe2 reads out of bounds for a code past the codebook; rnn2jax refuses it."""
    if len(op.inputs) != len(op.outputs) + 1:
        raise BadArgumentError(f"{op.where}: QuantDecode takes one output per codes input (a codebook, then codes)")

    def kernel(codebook, *codes):
        _need_dtype(op, codebook, 0, (_F32,), "codebook")
        table = codebook.reshape(-1)
        outputs = []
        for i, code in enumerate(codes):
            _check_codes(op, code, i + 1, table.shape[0])
            if not code.size or not table.shape[0]:
                outputs.append(jnp.zeros(code.shape, jnp.float32))
                continue
            outputs.append(jnp.take(table, jnp.clip(code.astype(jnp.int32), 0, table.shape[0] - 1)))
        return tuple(outputs)

    return kernel


def _code_positions(op: Op) -> range:
    return range(1, 1 + (len(op.inputs) - 1) // 2)


@register("QuantDecodeGradient", inputs=(3, None), gradient=GRADIENT_OP, roles=Roles(integers=_code_positions))
def quant_decode_gradient(op: Op) -> Kernel:
    """(codebook, codes_0..codes_n, gradient_0..gradient_n) -> the codebook's gradient: each gradient
    element added to the codebook entry its code names."""
    if len(op.inputs) % 2 != 1:
        raise BadArgumentError(f"{op.where}: QuantDecodeGradient takes a codebook, then codes and gradients in pairs")
    n = (len(op.inputs) - 1) // 2

    def kernel(codebook, *rest):
        _need_dtype(op, codebook, 0, (_F32,), "codebook")
        size = math.prod(codebook.shape)
        grad = jnp.zeros(size, jnp.float32)
        for i in range(n):
            codes, g = rest[i], rest[n + i]
            _check_codes(op, codes, i + 1, size)
            _need_dtype(op, g, n + i + 1, (_F32,), "gradient")
            if g.size != codes.size:
                raise ShapeError(
                    f"{op.where}: gradient '{op.inputs[n + i + 1]}' ({_describe(g)}) must have as many elements as "
                    f"codes '{op.inputs[i + 1]}' ({_describe(codes)})"
                )
            if codes.size and size:
                where = jnp.clip(codes.reshape(-1).astype(jnp.int32), 0, size - 1)
                grad = grad.at[where].add(g.reshape(-1))
        return grad.reshape(codebook.shape)

    return kernel


@facet("gradient", "QuantDecode")
def _quant_decode_gradient_maker(g: GradientContext) -> GradientOps:
    """GetQuantDecodeGradient: QuantDecodeGradient(codebook, codes..., each output's gradient) -> the
    codebook's gradient; the codes have none."""
    if len(g.op.input) != len(g.op.output) + 1:
        raise GradientError(f"QuantDecode has {len(g.op.input)} inputs for {len(g.op.output)} outputs")
    inputs = [g.I(i) for i in range(len(g.op.input))] + [g.GO(i) for i in range(len(g.op.output))]
    return [gradient_op("QuantDecodeGradient", inputs, [g.GI(0)])]
