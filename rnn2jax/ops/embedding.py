"""Embedding lookups: SparseLengths{Sum,Mean,WeightedSum,PositionalWeightedSum} over float/half tables
and over row-wise quantized tables (8BitsRowwise, Fused8BitRowwise, Fused{2,4}BitRowwise), the
SparseLengths*Gradient ops, GatherFused8BitRowwise, and the row-wise quantizers that build the tables.

Every lookup is one `_lookup`: gather the rows INDICES names, dequantize them to float32, weight them,
and sum each LENGTHS segment (the means scale by 1/length, 0 for an empty segment). The output has
len(LENGTHS) rows whatever the values, so all of these run under `jax.jit` on traced indices; what
Caffe2 enforces on their values (indices in range, lengths >= 0 summing to len(INDICES)) is checked
when the compiled net runs (ops/checks.py), at once when the values are known.

The fused layouts keep each row's scale and bias as raw bytes at the end of its uint8 row: float32
for Fused8BitRowwise, float16 for the "HalfScaleBias" and 2/4-bit forms (whose rows pack 8/bits
values per byte, low bits first). The quantizers are byte-exact with Caffe2's
(caffe2/perfkernels/fused_nbit_rowwise_conversion.cc, lengths_reducer_rowwise_8bit_ops.h).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .common import rounded
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import GradientContext, GradientOps, gradient_op, no_gradient
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_F32, _F16, _U8 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8)

# --------------------------------------------------------------------------------------------------
# Checks


def _name(op: Op, position: int) -> str:
    return op.inputs[position] if position < len(op.inputs) else f"input {position}"


def _describe(x: Any) -> str:
    return f"{x.dtype}[{','.join(map(str, x.shape))}]"


def _need_dtype(op: Op, x: Any, position: int, dtypes: tuple[np.dtype, ...], what: str) -> None:
    if np.dtype(x.dtype) not in dtypes:
        names = " or ".join(str(d) for d in dtypes)
        raise ShapeError(f"{op.where}: {what} '{_name(op, position)}' must be {names}, got {_describe(x)}")


def _need_rank(op: Op, x: Any, position: int, rank: int, what: str) -> None:
    if x.ndim != rank:
        raise ShapeError(f"{op.where}: {what} '{_name(op, position)}' must have rank {rank}, got {_describe(x)}")


def _xp(x: Any) -> Any:
    """NumPy for known values (checked at once, also inside jit), jax.numpy for traced ones."""
    return jnp if isinstance(x, jax.core.Tracer) else np


def _check_lengths(op: Op, lengths: Any, position: int, total: int) -> None:
    """LENGTHS >= 0, summing to `total` (the number of indices)."""
    where, name = literal(op.where), literal(_name(op, position))
    if not lengths.size:
        if total:
            raise ShapeError(f"{op.where}: LENGTHS '{_name(op, position)}' is empty but there are {total} indices")
        return
    xp = _xp(lengths)
    lengths = xp.asarray(lengths)
    negative = lengths < 0
    bad = lengths.ravel()[xp.argmax(negative)]
    enforce(~xp.any(negative), f"{where}: LENGTHS '{name}' has negative length {{bad}}", bad=bad)
    summed = xp.sum(lengths)
    message = f"{where}: the lengths in '{name}' sum to {{total}}, but there are {total} indices"
    enforce(summed == total, message, total=summed)


def _check_range(op: Op, indices: Any, position: int, rows: int, what: str = "DATA") -> None:
    if not indices.size:
        return
    xp = _xp(indices)
    indices = xp.asarray(indices)
    bad = (indices < 0) | (indices >= rows)
    message = (
        f"{literal(op.where)}: INDICES '{literal(_name(op, position))}' has {{bad}}, out of the range "
        f"[0, {rows}) of {what}'s rows"
    )
    enforce(~xp.any(bad), message, bad=indices.ravel()[xp.argmax(bad)])


def _segment_ids(lengths: Any, count: int) -> jax.Array:
    """The segment of each of `count` flat positions split by `lengths` (len(lengths) past the end)."""
    positions = jnp.arange(count, dtype=jnp.int32)
    return jnp.searchsorted(jnp.cumsum(lengths.astype(jnp.int32)), positions, side="right").astype(jnp.int32)


def _positions(lengths: Any, segment: jax.Array) -> jax.Array:
    """The position of each flat entry within its segment."""
    lengths = lengths.astype(jnp.int32)
    starts = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(lengths)])
    return jnp.arange(segment.shape[0], dtype=jnp.int32) - jnp.take(starts, segment, mode="clip")


def _per_row(values: Any, ndim: int) -> Any:
    return jnp.reshape(values, (-1,) + (1,) * (ndim - 1))


def _mean_scale(lengths: Any) -> jax.Array:
    """1/length per segment, 0 for an empty one (which sums to 0 anyway): fbgemm's `out *= 1.f / len`."""
    lengths = lengths.astype(jnp.int32)
    return jnp.where(lengths > 0, 1.0 / jnp.maximum(lengths, 1).astype(jnp.float32), 0.0)


# --------------------------------------------------------------------------------------------------
# Dequantizing rows of the quantized layouts


def _bytes_to(raw: Any, dtype: np.dtype) -> jax.Array:
    """(..., k * itemsize) uint8 -> (..., k) of `dtype` (little-endian, as Caffe2 stores them)."""
    size = np.dtype(dtype).itemsize
    grouped = raw.reshape(*raw.shape[:-1], raw.shape[-1] // size, size)
    return lax.bitcast_convert_type(grouped, dtype)


def _to_bytes(values: Any) -> jax.Array:
    """(..., k) float -> (..., k * itemsize) uint8."""
    raw = lax.bitcast_convert_type(values, jnp.uint8)
    return raw.reshape(*values.shape[:-1], values.shape[-1] * values.dtype.itemsize)


def _unpack(packed: Any, bits: int) -> jax.Array:
    """(..., n) uint8 holding 8/bits values per byte (low bits first) -> (..., n * 8/bits) uint8."""
    per_byte = 8 // bits
    if per_byte == 1:
        return packed
    shifts = jnp.arange(per_byte, dtype=jnp.uint8) * bits
    values = (packed[..., None] >> shifts) & jnp.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)


def _pack(values: Any, bits: int) -> jax.Array:
    per_byte = 8 // bits
    if per_byte == 1:
        return values
    grouped = values.reshape(*values.shape[:-1], values.shape[-1] // per_byte, per_byte).astype(jnp.uint32)
    shifts = jnp.arange(per_byte, dtype=jnp.uint32) * bits
    return jnp.sum(grouped << shifts, axis=-1).astype(jnp.uint8)


def _dequantize_fused(rows: Any, bits: int, sb_dtype: np.dtype) -> jax.Array:
    """Fused rows (..., C) uint8 -> float32 values: q * scale + bias."""
    tail = 2 * np.dtype(sb_dtype).itemsize
    q = _unpack(rows[..., : rows.shape[-1] - tail], bits).astype(jnp.float32)
    scale_bias = _bytes_to(rows[..., rows.shape[-1] - tail :], sb_dtype).astype(jnp.float32)
    return q * scale_bias[..., :1] + scale_bias[..., 1:]


# --------------------------------------------------------------------------------------------------
# The lookups


@dataclass(frozen=True)
class _Lookup:
    """One SparseLengths* forward op. `table`: "float" (float/half DATA), "rowwise8" (uint8 DATA with a
    SCALE_BIAS [N, 2] input last), or "fused" (uint8 rows with their scale and bias at the end)."""

    weighted: bool = False
    mean: bool = False
    positional: bool = False
    table: str = "float"
    bits: int = 8
    sb_dtype: np.dtype = _F32

    @property
    def indices(self) -> int:
        return 1 + self.weighted

    @property
    def lengths(self) -> int:
        return 2 + self.weighted

    @property
    def inputs(self) -> int:
        return 3 + self.weighted + (self.table == "rowwise8")


_LOOKUPS: dict[str, _Lookup] = {
    "SparseLengthsSum": _Lookup(),
    "SparseLengthsMean": _Lookup(mean=True),
    "SparseLengthsWeightedSum": _Lookup(weighted=True),
    "SparseLengthsPositionalWeightedSum": _Lookup(weighted=True, positional=True),
    "SparseLengthsSum8BitsRowwise": _Lookup(table="rowwise8"),
    "SparseLengthsMean8BitsRowwise": _Lookup(mean=True, table="rowwise8"),
    "SparseLengthsWeightedSum8BitsRowwise": _Lookup(weighted=True, table="rowwise8"),
    "SparseLengthsWeightedMean8BitsRowwise": _Lookup(weighted=True, mean=True, table="rowwise8"),
}
for _bits in (8, 4, 2):
    _sb = _F32 if _bits == 8 else _F16
    for _kind, _flags in (("Sum", {}), ("Mean", {"mean": True}), ("WeightedSum", {"weighted": True})):
        _LOOKUPS[f"SparseLengths{_kind}Fused{_bits}BitRowwise"] = _Lookup(
            table="fused", bits=_bits, sb_dtype=_sb, **_flags
        )

runtime_checked(*_LOOKUPS)


def _gather_float_rows(spec: _Lookup, data: Any, safe: Any, extra: tuple) -> jax.Array:
    """The looked-up rows as float32, (K, *block)."""
    if spec.table == "float":
        return jnp.take(data, safe, axis=0).astype(jnp.float32)
    if spec.table == "rowwise8":
        (scale_bias,) = extra
        q = jnp.take(data, safe, axis=0).astype(jnp.float32)
        sb = jnp.take(scale_bias, safe, axis=0)
        return q * _per_row(sb[:, 0], q.ndim) + _per_row(sb[:, 1], q.ndim)
    return _dequantize_fused(jnp.take(data, safe, axis=0), spec.bits, spec.sb_dtype)


def _check_table(op: Op, spec: _Lookup, data: Any, extra: tuple) -> tuple[int, ...]:
    """Check DATA (and SCALE_BIAS); return the shape of one output row."""
    if spec.table == "float":
        _need_dtype(op, data, 0, (_F32, _F16), "DATA")
        if data.ndim < 1:
            raise ShapeError(f"{op.where}: DATA '{op.inputs[0]}' must have at least 1 dim")
        return tuple(data.shape[1:])
    _need_dtype(op, data, 0, (_U8,), "DATA")
    if spec.table == "rowwise8":
        (scale_bias,) = extra
        position = len(op.inputs) - 1
        if data.ndim < 1:
            raise ShapeError(f"{op.where}: DATA '{op.inputs[0]}' must have at least 1 dim")
        _need_rank(op, scale_bias, position, 2, "SCALE_BIAS")
        _need_dtype(op, scale_bias, position, (_F32,), "SCALE_BIAS")
        if scale_bias.shape != (data.shape[0], 2):
            raise ShapeError(
                f"{op.where}: SCALE_BIAS '{op.inputs[position]}' must be [{data.shape[0]}, 2] (one scale and "
                f"bias per row of DATA), got {_describe(scale_bias)}"
            )
        if not scale_bias.size:  # caffe2/perfkernels/embedding_lookup.cc: "scale_bias must not be nullptr"
            raise ShapeError(f"{op.where}: SCALE_BIAS '{op.inputs[position]}' is empty (DATA has no rows)")
        return tuple(data.shape[1:])
    # Fused rows; Caffe2 reads data.size(1) as the row's bytes.
    tail = 2 * spec.sb_dtype.itemsize
    _need_rank(op, data, 0, 2, "DATA")
    if data.shape[1] <= tail:
        raise ShapeError(f"{op.where}: DATA '{op.inputs[0]}' must have more than {tail} columns, got {_describe(data)}")
    return ((data.shape[1] - tail) * (8 // spec.bits),)


def _lookup_kernel(op: Op, spec: _Lookup) -> Kernel:
    def kernel(data, *rest):
        weights = rest[0] if spec.weighted else None
        indices, lengths = rest[spec.weighted], rest[spec.weighted + 1]
        extra = rest[spec.weighted + 2 :]
        block = _check_table(op, spec, data, extra)
        _need_dtype(op, indices, spec.indices, _INDEX_DTYPES, "INDICES")
        if lengths.ndim < 1:
            raise ShapeError(f"{op.where}: LENGTHS '{op.inputs[spec.lengths]}' must be a vector")
        segments = lengths.shape[0]
        if spec.table == "float" and indices.size == 0:
            # CPUSparseLengthsReductionOp returns zeros before checking anything else (lengths_reducer_ops.h)
            return jnp.zeros((segments, *block), jnp.float32)
        _need_dtype(op, lengths, spec.lengths, (np.dtype(np.int32),), "LENGTHS")
        _need_rank(op, indices, spec.indices, 1, "INDICES")
        _need_rank(op, lengths, spec.lengths, 1, "LENGTHS")
        count = indices.shape[0]
        if weights is not None:
            _check_weights(op, spec, weights, count)
        if spec.table == "float" and count and math.prod(block) == 0:
            raise ShapeError(f"{op.where}: DATA '{op.inputs[0]}' has empty rows (fbgemm refuses a block size of 0)")
        _check_lengths(op, lengths, spec.lengths, count)
        _check_range(op, indices, spec.indices, data.shape[0])
        if data.shape[0] == 0 or count == 0:
            return jnp.zeros((segments, *block), jnp.float32)
        segment = _segment_ids(lengths, count)
        rows = _gather_float_rows(spec, data, jnp.clip(indices, 0, data.shape[0] - 1), extra)
        if weights is not None:
            if spec.positional:
                weights = jnp.take(weights, _positions(lengths, segment), mode="clip")
            rows = rows * _per_row(weights, rows.ndim)
        out = jax.ops.segment_sum(rows, segment, num_segments=segments, indices_are_sorted=True)
        if spec.mean:
            out = out * _per_row(_mean_scale(lengths), out.ndim)
        return out

    return kernel


def _check_weights(op: Op, spec: _Lookup, weights: Any, count: int) -> None:
    _need_dtype(op, weights, 1, (_F32,), "WEIGHTS")
    _need_rank(op, weights, 1, 1, "WEIGHTS")
    if spec.positional:  # weights are read at each index's position within its segment
        if count and weights.shape[0] == 0:
            raise ShapeError(f"{op.where}: WEIGHTS '{op.inputs[1]}' is empty but there are {count} indices")
        return
    # The 8BitsRowwise ops read the weights unchecked (past the end when too short); refused here.
    if weights.shape[0] != count:
        raise ShapeError(f"{op.where}: WEIGHTS '{op.inputs[1]}' has {weights.shape[0]} weights for {count} indices")


def _check_positions(op: Op, weights: Any, lengths: Any) -> None:
    longest = _xp(lengths).max(lengths) if lengths.size else 0
    enforce(
        longest <= weights.shape[0],
        f"{literal(op.where)}: a segment of {{longest}} indices needs that many positional WEIGHTS "
        f"'{literal(op.inputs[1])}', which has {weights.shape[0]}",
        longest=longest,
    )


def _build_lookup(op: Op) -> Kernel:
    """(DATA, [WEIGHTS,] INDICES, LENGTHS[, SCALE_BIAS]) -> float32 [len(LENGTHS), *row]."""
    spec = _LOOKUPS[op.type]
    kernel = _lookup_kernel(op, spec)
    if not spec.positional:
        return kernel

    def positional(data, weights, indices, lengths):
        result = kernel(data, weights, indices, lengths)
        if indices.size and lengths.ndim == 1:  # Caffe2 reads past WEIGHTS otherwise
            _check_positions(op, weights, lengths)
        return result

    return positional


for _type, _spec in _LOOKUPS.items():
    register(_type, inputs=_spec.inputs)(_build_lookup)


def _gradient_values(g: GradientContext) -> str:
    """Caffe2's GI_V(0): DATA's gradient slice values, indexed by INDICES."""
    return g.I(0) + "_grad_values"


@facet("gradient", "SparseLengthsSum", "SparseLengthsMean")
def _sparse_lengths_gradient_maker(g: GradientContext) -> GradientOps:
    """`LengthsOpGetGradient` (segment_reduction_op.h, SparseFused, GradientNeedIndices): one
    `SparseLengthsIndicesInGradient*Gradient` op whose output is the values of DATA's gradient slice,
    indexed by the forward op's INDICES."""
    reducer = g.op.type.removeprefix("SparseLengths")
    values = _gradient_values(g)
    op = gradient_op(f"SparseLengthsIndicesInGradient{reducer}Gradient", [g.GO(0), g.I(2), g.I(1)], [values])
    g.set_dense(0, (g.I(1), values))  # type: ignore[arg-type]  (a sparse gradient: indices, values)
    return [op]


@facet("gradient", "SparseLengthsWeightedSum")
def _sparse_lengths_weighted_sum_gradient_maker(g: GradientContext) -> GradientOps:
    """With `grad_on_weights`, the WithMainInput op also reads DATA and gives WEIGHTS' gradient."""
    values = _gradient_values(g)
    if g.flag("grad_on_weights", False):
        inputs, outputs = [g.I(1), g.GO(0), g.I(3), g.I(0), g.I(2)], [values, g.GI(1)]
        op_type = "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient"
    else:
        inputs, outputs = [g.I(1), g.GO(0), g.I(3), g.I(2)], [values]
        op_type = "SparseLengthsIndicesInGradientWeightedSumGradient"
    op = gradient_op(op_type, inputs, outputs)
    g.set_dense(0, (g.I(2), values))  # type: ignore[arg-type]
    return [op]


facet(
    "gradient",
    "SparseLengthsSum8BitsRowwise",
    "SparseLengthsSumFused8BitRowwise",
    "SparseLengthsSumFused4BitRowwise",
    "SparseLengthsSumFused2BitRowwise",
    "SparseLengthsMean8BitsRowwise",
    "SparseLengthsMeanFused8BitRowwise",
    "SparseLengthsMeanFused4BitRowwise",
    "SparseLengthsMeanFused2BitRowwise",
    "SparseLengthsWeightedSum8BitsRowwise",
    "SparseLengthsWeightedSumFused8BitRowwise",
    "SparseLengthsWeightedSumFused4BitRowwise",
    "SparseLengthsWeightedSumFused2BitRowwise",
    "SparseLengthsWeightedMean8BitsRowwise",
)(no_gradient)


facet("gradient", "SparseLengthsPositionalWeightedSum")(NO_GRADIENT)


facet("roles", "SparseLengthsSum", "SparseLengthsMean")(Roles(integers=slice(1, None)))  # INDICES, LENGTHS


# --------------------------------------------------------------------------------------------------
# GatherFused8BitRowwise

runtime_checked("GatherFused8BitRowwise")


@register("GatherFused8BitRowwise", inputs=2, gradient=NO_GRADIENT)
def gather_fused_8bit_rowwise(op: Op) -> Kernel:
    """(DATA [N, C] uint8 fused rows, INDICES [K]) -> float32 [K, C - 8]: the rows, dequantized."""

    def kernel(data, indices):
        _need_dtype(op, data, 0, (_U8,), "DATA")
        _need_rank(op, data, 0, 2, "DATA")
        _need_dtype(op, indices, 1, _INDEX_DTYPES, "INDICES")
        _need_rank(op, indices, 1, 1, "INDICES")
        if data.shape[1] <= 8:
            raise ShapeError(f"{op.where}: DATA '{op.inputs[0]}' must have more than 8 columns, got {_describe(data)}")
        _check_range(op, indices, 1, data.shape[0])
        if data.shape[0] == 0 or not indices.size:
            return jnp.zeros((indices.shape[0], data.shape[1] - 8), jnp.float32)
        return _dequantize_fused(jnp.take(data, indices, axis=0, mode="clip"), 8, _F32)

    return kernel


# --------------------------------------------------------------------------------------------------
# Gradient ops (caffe2/operators/segment_reduction_op.h, AbstractLengths*GradientOp)

_GRADIENTS = {
    # type: (reducer, inputs before SEGMENT_GRADS, has INDICES)
    "SparseLengthsSumGradient": ("Sum", 0, False),
    "SparseLengthsMeanGradient": ("Mean", 0, False),
    "SparseLengthsWeightedSumGradient": ("WeightedSum", 1, False),
    "SparseLengthsIndicesInGradientSumGradient": ("Sum", 0, True),
    "SparseLengthsIndicesInGradientMeanGradient": ("Mean", 0, True),
    "SparseLengthsIndicesInGradientWeightedSumGradient": ("WeightedSum", 1, True),
}

runtime_checked(*_GRADIENTS)


def _check_segment_grads(op: Op, grad: Any, position: int, lengths: Any, lengths_position: int) -> None:
    _need_dtype(op, grad, position, (_F32,), "SEGMENT_GRADS")
    _need_dtype(op, lengths, lengths_position, (np.dtype(np.int32),), "LENGTHS")
    _need_rank(op, lengths, lengths_position, 1, "LENGTHS")
    if grad.ndim < 1 or grad.shape[0] != lengths.shape[0]:
        raise ShapeError(
            f"{op.where}: SEGMENT_GRADS '{op.inputs[position]}' ({_describe(grad)}) needs one row per length in "
            f"'{op.inputs[lengths_position]}' ({lengths.shape[0]})"
        )


def _spread(grad: Any, lengths: Any, segment: Any, mean: bool) -> jax.Array:
    """Each flat entry gets its segment's gradient (divided by the length for a mean)."""
    out = jnp.take(grad, segment, axis=0, mode="clip")
    if mean:
        counts = jnp.take(lengths.astype(jnp.int32), segment, mode="clip")
        out = out * _per_row(1.0 / jnp.maximum(counts, 1).astype(jnp.float32), out.ndim)
    return out


def _build_gradient(op: Op) -> Kernel:
    """([WEIGHTS,] SEGMENT_GRADS, LENGTHS[, INDICES]) -> the gradient of each looked-up row, [sum(LENGTHS),
    *row] (the values of DATA's GradientSlice). Caffe2 sizes it by sum(LENGTHS) and never reads INDICES;
    here the size comes from the shape of INDICES (or WEIGHTS), so traced lengths work, and the lengths must
    sum to it (checked when the net runs). The two-input Sum/Mean forms have neither: their LENGTHS are a
    static input."""
    reducer, first, _ = _GRADIENTS[op.type]
    g_pos, l_pos = first, first + 1

    def kernel(*inputs):
        grad, lengths = inputs[g_pos], inputs[l_pos]
        _check_segment_grads(op, grad, g_pos, lengths, l_pos)
        if reducer == "WeightedSum":
            weights = inputs[0]
            _need_dtype(op, weights, 0, (_F32,), "WEIGHTS")
            _need_rank(op, weights, 0, 1, "WEIGHTS")
            count = weights.shape[0]
        elif len(inputs) > l_pos + 1:
            indices = inputs[l_pos + 1]
            if indices.ndim < 1:
                raise ShapeError(f"{op.where}: INDICES '{op.inputs[l_pos + 1]}' must be a vector")
            count = indices.shape[0]
        else:  # the output size is sum(LENGTHS): a static input
            count = int(np.asarray(lengths).sum())
        _check_lengths(op, lengths, l_pos, count)
        segment = _segment_ids(lengths, count)
        out = _spread(grad, lengths, segment, reducer == "Mean")
        if reducer == "WeightedSum":
            out = out * _per_row(inputs[0], out.ndim)
        return out

    return kernel


for _type, (_reducer, _first, _has_indices) in _GRADIENTS.items():
    _static = () if _has_indices or _reducer == "WeightedSum" else (_first + 1,)
    register(_type, inputs=_first + 2 + _has_indices, static_inputs=_static)(_build_gradient)

_WITH_MAIN_INPUT = (
    "SparseLengthsWeightedSumWithMainInputGradient",
    "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
)
runtime_checked(*_WITH_MAIN_INPUT)


@register(*_WITH_MAIN_INPUT, inputs=5, outputs=(1, 2))
def weighted_sum_with_main_input_gradient(op: Op) -> Kernel:
    """(WEIGHTS [K], SEGMENT_GRADS [M, *row], LENGTHS [M], DATA [N, *row], INDICES [K]) ->
    (DATA's gradient values [K, *row], WEIGHTS' gradient [K]: each weight's row of DATA . its segment's
    gradient). Caffe2 does not check INDICES or LENGTHS here (the forward op did); rnn2jax does."""
    if len(op.outputs) < 2:  # Caffe2 writes the weights' gradient through a null pointer
        raise BadArgumentError(f"{op.where}: {op.type} needs two outputs (DATA's and WEIGHTS' gradients)")

    def kernel(weights, grad, lengths, data, indices):
        _check_segment_grads(op, grad, 1, lengths, 2)
        _need_dtype(op, weights, 0, (_F32,), "WEIGHTS")
        _need_rank(op, weights, 0, 1, "WEIGHTS")
        _need_dtype(op, data, 3, (_F32,), "DATA")
        _need_dtype(op, indices, 4, _INDEX_DTYPES, "INDICES")
        _need_rank(op, indices, 4, 1, "INDICES")
        count = indices.shape[0]
        if weights.shape[0] != count:
            raise ShapeError(f"{op.where}: WEIGHTS '{op.inputs[0]}' has {weights.shape[0]} weights for {count} indices")
        if data.ndim < 1 or math.prod(data.shape[1:]) != math.prod(grad.shape[1:]):
            raise ShapeError(
                f"{op.where}: DATA '{op.inputs[3]}' ({_describe(data)}) must have rows the size of "
                f"SEGMENT_GRADS' ({_describe(grad)})"
            )
        _check_lengths(op, lengths, 2, count)
        _check_range(op, indices, 4, data.shape[0])
        segment = _segment_ids(lengths, count)
        spread = _spread(grad, lengths, segment, mean=False)
        data_grad = spread * _per_row(weights, spread.ndim)
        if data.shape[0] == 0 or count == 0:
            return data_grad, jnp.zeros_like(weights)
        rows = jnp.take(data, jnp.clip(indices, 0, data.shape[0] - 1), axis=0).reshape(count, -1)
        weights_grad = jnp.sum(spread.reshape(count, -1) * rows, axis=1)
        return data_grad, weights_grad

    return kernel


# --------------------------------------------------------------------------------------------------
# Quantizers


def _rows(op: Op, x: Any, what: str) -> tuple[Any, tuple[int, ...]]:
    """x as a matrix of its last dim's rows (Caffe2's size_to_dim(ndim - 1))."""
    if x.ndim < 1:
        raise ShapeError(f"{op.where}: {what} '{op.inputs[0]}' must have at least 1 dim")
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), x.shape


def _need_columns(op: Op, x: Any) -> None:
    if x.shape[-1] == 0 and x.size == 0 and math.prod(x.shape[:-1]):
        # min/max of an empty row: Caffe2 reads past the row
        raise ShapeError(f"{op.where}: input '{op.inputs[0]}' has rows of no columns to quantize ({_describe(x)})")


def _divide(x: Any, divisor: float) -> jax.Array:
    """x / divisor, correctly rounded: XLA's CPU backend turns a division by a broadcast scalar into a
    multiplication by its reciprocal, which is off by one ulp for about 70% of float32 values."""
    return x / lax.optimization_barrier(jnp.full(x.shape, divisor, x.dtype))


def _quantize_fused8(x: Any) -> jax.Array:
    """FloatToFused8BitRowwiseQuantized__base: float32 scale = range/255, bias = min, q = lrint((x-min) *
    255/(range+1e-8))."""
    low, high = jnp.min(x, axis=-1, keepdims=True), jnp.max(x, axis=-1, keepdims=True)
    span = high - low
    inverse = jnp.float32(255.0) / (span + jnp.float32(1e-8))
    q = jnp.round((x - low) * inverse).astype(jnp.int32).astype(jnp.uint8)
    scale_bias = jnp.concatenate([_divide(span, 255.0), low], axis=-1)
    return jnp.concatenate([q, _to_bytes(scale_bias)], axis=-1)


def _quantize_nbit_half(x: Any, bits: int) -> jax.Array:
    """FloatToFusedNBitRowwiseQuantizedSBHalf: float16 bias = min, float16 scale = range/(2^bits-1) (1
    when that is 0 or has no finite inverse), q = clamp(lrint((x-bias) / scale))."""
    top = (1 << bits) - 1
    low = jnp.min(x, axis=-1, keepdims=True).astype(jnp.float16).astype(jnp.float32)
    span = jnp.max(x, axis=-1, keepdims=True) - low
    scale = jnp.where(span == 0, jnp.float32(1.0), _divide(span, top)).astype(jnp.float16).astype(jnp.float32)
    scale = jnp.where(scale == 0, jnp.float32(1.0), scale)
    inverse = jnp.float32(1.0) / scale
    bad = jnp.isinf(inverse)
    scale, inverse = jnp.where(bad, 1.0, scale), jnp.where(bad, 1.0, inverse)
    q = jnp.clip(jnp.round((x - low) * inverse), 0, top).astype(jnp.uint8)
    scale_bias = jnp.concatenate([scale, low], axis=-1).astype(jnp.float16)
    return jnp.concatenate([_pack(q, bits), _to_bytes(scale_bias)], axis=-1)


def _half(x: Any) -> jax.Array:
    """float32 -> the nearest float16, back as float32 (Caffe2's static_cast<at::Half>)."""
    return x.astype(jnp.float16).astype(jnp.float32)


_GREEDY_BINS = 200
# int min_bins = n_bins * (1 - ratio), in float32 as Caffe2 computes it (ratio = 0.16f)
_GREEDY_MIN_BINS = int(np.float32(_GREEDY_BINS) * (np.float32(1) - np.float32(0.16)))
_GREEDY_MAX_STEPS = 4 * _GREEDY_BINS  # Caffe2 loops forever where a step no longer moves the range


def _greedy_loss(x: Any, xmin: Any, xmax: Any, bits: int) -> jax.Array:
    """compress_uniform_simplified_: the L2 error of quantizing row x to [xmin, xmax] (xmin rounded to
    float16), each value rounded to its level and clipped."""
    qmax = float((1 << bits) - 1)
    xmin = _half(xmin)
    span = xmax - xmin
    scale = jnp.where(span == 0, jnp.float32(1.0), _half(_divide(span, qmax)))
    inverse = jnp.float32(1.0) / scale
    v = jnp.round((x - xmin) * inverse)
    q = jnp.where(jnp.isnan(v), jnp.float32(0.0), jnp.clip(v, 0, qmax))
    restored = rounded(q * scale) + xmin  # no fused multiply-add: Caffe2 rounds the product
    error = x - restored
    return jnp.sqrt(jnp.sum(error * error))


def _greedy_range(x: Any, bits: int) -> tuple[jax.Array, jax.Array]:
    """param_search_greedy (n_bins 200, ratio 0.16) for one row: shrink [min, max] one bin at a time from
    the side whose move loses less, keeping the best local optimum of the L2 error."""
    xmin, xmax = jnp.min(x), jnp.max(x)
    step = _divide(xmax - xmin, float(_GREEDY_BINS))
    threshold = jnp.float32(_GREEDY_MIN_BINS) * step
    loss = _greedy_loss(x, xmin, xmax, bits)

    def cond(state):
        steps, cur_min, cur_max = state[0], state[1], state[2]
        return (cur_min + threshold < cur_max) & (steps < _GREEDY_MAX_STEPS)

    def body(state):
        steps, cur_min, cur_max, cur_loss, best, best_min, best_max = state
        left = _greedy_loss(x, cur_min + step, cur_max, bits)
        right = _greedy_loss(x, cur_min, cur_max - step, bits)
        better = (cur_loss < left) & (cur_loss < right) & (cur_loss < best)
        best = jnp.where(better, cur_loss, best)
        best_min = jnp.where(better, cur_min, best_min)
        best_max = jnp.where(better, cur_max, best_max)
        move_left = left < right
        cur_min = jnp.where(move_left, cur_min + step, cur_min)
        cur_max = jnp.where(move_left, cur_max, cur_max - step)
        cur_loss = jnp.where(move_left, left, right)
        return steps + 1, cur_min, cur_max, cur_loss, best, best_min, best_max

    state = (jnp.int32(0), xmin, xmax, loss, loss, xmin, xmax)
    state = lax.while_loop(cond, body, state)
    return state[5], state[6]


def _quantize_nbit_greedy(x: Any, bits: int) -> jax.Array:
    """FloatToFused4BitRowwiseQuantizedHelper with GREEDY: the range param_search_greedy finds, bias = its
    min in float16, float16 scale = range/(2^bits-1) (1 when that is 0), q = clamp(lrintf((x-bias) / scale))."""
    top = (1 << bits) - 1
    low, high = jax.vmap(lambda row: _greedy_range(row, bits))(x)
    low = _half(low[:, None])
    span = high[:, None] - low
    scale = _half(jnp.where(span == 0, jnp.float32(1.0), _divide(span, top)))
    scale = jnp.where(scale == 0, jnp.float32(1.0), scale)
    v = (x - low) / scale
    # lrintf of an infinity or NaN is LONG_MIN, which std::min<int> keeps and std::max(0, ...) makes 0
    q = jnp.where(jnp.isfinite(v), jnp.clip(jnp.round(v), 0, top), 0).astype(jnp.uint8)
    scale_bias = jnp.concatenate([scale, low], axis=-1).astype(jnp.float16)
    return jnp.concatenate([_pack(q, bits), _to_bytes(scale_bias)], axis=-1)


@dataclass(frozen=True)
class _Quantizer:
    bits: int
    sb_dtype: np.dtype
    source: np.dtype  # input dtype (to quantize) or output dtype (to dequantize)


_TO_FUSED = {
    "FloatToFused8BitRowwiseQuantized": _Quantizer(8, _F32, _F32),
    "HalfFloatToFused8BitRowwiseQuantized": _Quantizer(8, _F32, _F16),
    "FloatToFused8BitRowwiseQuantizedHalfScaleBias": _Quantizer(8, _F16, _F32),
    "HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias": _Quantizer(8, _F16, _F16),
    "FloatToFused4BitRowwiseQuantized": _Quantizer(4, _F16, _F32),
    "HalfToFused4BitRowwiseQuantized": _Quantizer(4, _F16, _F16),
    "FloatToFused2BitRowwiseQuantized": _Quantizer(2, _F16, _F32),
    "HalfToFused2BitRowwiseQuantized": _Quantizer(2, _F16, _F16),
}
_FROM_FUSED = {
    "Fused8BitRowwiseQuantizedToFloat": _Quantizer(8, _F32, _F32),
    "Fused8BitRowwiseQuantizedToHalfFloat": _Quantizer(8, _F32, _F16),
    "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat": _Quantizer(8, _F16, _F32),
    # float32 in Caffe2 despite its name (fused_rowwise_8bit_conversion_ops.cc registers it with float)
    "Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat": _Quantizer(8, _F16, _F32),
    "Fused4BitRowwiseQuantizedToFloat": _Quantizer(4, _F16, _F32),
    "Fused4BitRowwiseQuantizedToHalf": _Quantizer(4, _F16, _F16),
    "Fused2BitRowwiseQuantizedToFloat": _Quantizer(2, _F16, _F32),
    "Fused2BitRowwiseQuantizedToHalf": _Quantizer(2, _F16, _F16),
}


@register(*_TO_FUSED)
def to_fused_rowwise(op: Op) -> Kernel:
    """[..., C] float/half -> [..., ceil(C / (8/bits)) + 2 * sizeof(scale)] uint8: each row of the last
    dim quantized, its scale and bias appended as raw bytes."""
    spec = _TO_FUSED[op.type]
    per_byte = 8 // spec.bits
    # engine GREEDY (2 and 4 bits): param_search_greedy narrows each row's range first
    greedy = spec.bits < 8 and "GREEDY" in op.engine.split(",")

    def kernel(x):
        _need_dtype(op, x, 0, (spec.source,), "input")
        matrix, shape = _rows(op, x, "input")
        if shape[-1] % per_byte:
            raise ShapeError(
                f"{op.where}: {op.type} needs a number of columns that is a multiple of {per_byte}, got {_describe(x)}"
            )
        _need_columns(op, x)
        out_cols = shape[-1] // per_byte + 2 * spec.sb_dtype.itemsize
        if matrix.shape[0] == 0:
            return jnp.zeros((*shape[:-1], out_cols), jnp.uint8)
        values = matrix.astype(jnp.float32)
        if spec.sb_dtype == _F32:
            fused = _quantize_fused8(values)
        elif greedy:
            fused = _quantize_nbit_greedy(values, spec.bits)
        else:
            fused = _quantize_nbit_half(values, spec.bits)
        return fused.reshape(*shape[:-1], out_cols)

    return kernel


facet(
    "gradient",
    "FloatToFused8BitRowwiseQuantized",
    "HalfFloatToFused8BitRowwiseQuantized",
    "FloatToFused8BitRowwiseQuantizedHalfScaleBias",
    "HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias",
    "FloatToFused4BitRowwiseQuantized",
    "HalfToFused4BitRowwiseQuantized",
    "FloatToFused2BitRowwiseQuantized",
    "HalfToFused2BitRowwiseQuantized",
)(no_gradient)


@register(*_FROM_FUSED)
def from_fused_rowwise(op: Op) -> Kernel:
    """[..., C] uint8 fused rows -> [..., (C - 2 * sizeof(scale)) * 8/bits] float/half."""
    spec = _FROM_FUSED[op.type]
    tail = 2 * spec.sb_dtype.itemsize

    def kernel(x):
        _need_dtype(op, x, 0, (_U8,), "input")
        matrix, shape = _rows(op, x, "input")
        if shape[-1] < tail:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' needs at least {tail} columns, got {_describe(x)}")
        out_shape = (*shape[:-1], (shape[-1] - tail) * (8 // spec.bits))
        if matrix.shape[0] == 0:
            return jnp.zeros(out_shape, spec.source)
        return _dequantize_fused(matrix, spec.bits, spec.sb_dtype).astype(spec.source).reshape(out_shape)

    return kernel


facet(
    "gradient",
    "Fused8BitRowwiseQuantizedToFloat",
    "Fused8BitRowwiseQuantizedToHalfFloat",
    "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat",
    "Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat",
    "Fused4BitRowwiseQuantizedToFloat",
    "Fused4BitRowwiseQuantizedToHalf",
    "Fused2BitRowwiseQuantizedToFloat",
    "Fused2BitRowwiseQuantizedToHalf",
)(no_gradient)


@register("FloatToRowwiseQuantized8Bits", outputs=2, gradient=no_gradient)
def float_to_rowwise_quantized_8bits(op: Op) -> Kernel:
    """[N, ...] float32 -> (uint8 [N, ...], scale_bias float32 [N, 2]): each row x -> round((x - min) /
    scale) with scale = range/255 (1, and all zeros, for a range below 1e-10); Eigen's round() rounds
    halves away from zero."""

    def kernel(x):
        _need_dtype(op, x, 0, (_F32,), "input")
        if x.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have at least 1 dim")
        rows = x.shape[0]
        matrix = x.reshape(rows, math.prod(x.shape[1:]))
        if rows and matrix.shape[1] == 0:  # Eigen's minCoeff of an empty row
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' has empty rows ({_describe(x)})")
        if rows == 0:
            return jnp.zeros(x.shape, jnp.uint8), jnp.zeros((0, 2), jnp.float32)
        low, high = jnp.min(matrix, axis=1, keepdims=True), jnp.max(matrix, axis=1, keepdims=True)
        flat = (high - low) < jnp.float32(1e-10)
        scale = jnp.where(flat, jnp.float32(1.0), _divide(high - low, 255.0))
        inverse = jnp.float32(1.0) / scale
        q = lax.round((matrix - low) * inverse, lax.RoundingMethod.AWAY_FROM_ZERO)
        q = jnp.where(flat, 0, q.astype(jnp.int32)).astype(jnp.uint8)
        return q.reshape(x.shape), jnp.concatenate([scale, low], axis=1)

    return kernel


@register("Rowwise8BitQuantizedToFloat", inputs=2, gradient=no_gradient)
def rowwise_8bit_quantized_to_float(op: Op) -> Kernel:
    """(uint8 [N, ...], scale_bias [N, 2]) -> float32 [N, ...]: q * scale + bias per row, the product rounded
    before the sum (Eigen's `cast<float>() * scale + bias`; XLA would fuse a multiply-add)."""

    def kernel(q, scale_bias):
        _need_dtype(op, q, 0, (_U8,), "input")
        _need_dtype(op, scale_bias, 1, (_F32,), "SCALE_BIAS")
        if q.ndim < 1 or scale_bias.ndim != 2 or scale_bias.shape != (q.shape[0], 2):
            raise ShapeError(
                f"{op.where}: SCALE_BIAS '{op.inputs[1]}' must be [rows of '{op.inputs[0]}', 2], got "
                f"{_describe(scale_bias)} for {_describe(q)}"
            )
        values = q.astype(jnp.float32)
        return rounded(values * _per_row(scale_bias[:, 0], q.ndim)) + _per_row(scale_bias[:, 1], q.ndim)

    return kernel
