"""Sparse, gather and packing ops: ranges and lengths that select rows, id lists turned dense, masks.

Many of these ops have output shapes decided by input VALUES (PackSegments' longest segment, the
total of GatherRanges' ranges, BooleanMask's true count...). Those inputs are declared
`static_inputs`: the compiler hands them to the kernel as concrete arrays, which are read with NumPy
(`_static_ints`). The other ops keep static shapes and run under `jax.jit`; what Caffe2 enforces on
their traced index values is checked when the compiled net runs (ops/checks.py).

Caffe2 trusts many of these inputs (a range past the data, a length past a packed row) and reads or
writes out of bounds; rnn2jax refuses them instead.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, first_bad, literal, runtime_checked
from .common import size_from_dim
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import (
    GradientContext,
    GradientOps,
    argument,
    concat_of_output_gradients,
    gradient_not_implemented_yet,
    gradient_op,
    no_gradient,
    should_not_do_gradient,
    single_gradient,
)
from .registry import Kernel, declare_family, facet, register, register_host_op
from .strings import moves_strings

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))

# --------------------------------------------------------------------------------------------------
# Helpers


def _shape_text(x: Any) -> str:
    return f"{np.dtype(x.dtype)}[{','.join(map(str, x.shape))}]"


def _static_ints(op: Op, value: Any, position: int, what: str, dtypes=_INDEX_DTYPES, ndim: int | None = 1):
    """The concrete values of input `position` (declared static), checked to be integers of `dtypes`."""
    name = op.inputs[position]
    if isinstance(value, jax.core.Tracer):
        raise ShapeError(
            f"{op.where}: input {what} '{name}' decides the output shape, so its values must be known when "
            "the net is traced; feed it as a constant or a static input, not a traced value"
        )
    values = np.asarray(value)
    if values.dtype not in dtypes:
        allowed = " or ".join(str(np.dtype(d)) for d in dtypes)
        raise ShapeError(f"{op.where}: {what} '{name}' must be {allowed}, got {_shape_text(values)}")
    if ndim is not None and values.ndim != ndim:
        raise ShapeError(f"{op.where}: {what} '{name}' must be {ndim}-D, got {_shape_text(values)}")
    return values


def _check_dtype(op: Op, x: Any, position: int, what: str, dtypes) -> None:
    if np.dtype(x.dtype) not in [np.dtype(d) for d in dtypes]:
        allowed = ", ".join(str(np.dtype(d)) for d in dtypes)
        raise ShapeError(f"{op.where}: {what} '{op.inputs[position]}' must be one of {allowed}, got {x.dtype}")


def _check_ndim(op: Op, x: Any, position: int, what: str, ndim: int, at_least: bool = False) -> None:
    if x.ndim < ndim if at_least else x.ndim != ndim:
        need = f"at least {ndim}-D" if at_least else f"{ndim}-D"
        raise ShapeError(f"{op.where}: {what} '{op.inputs[position]}' must be {need}, got shape {list(x.shape)}")


def _non_negative(op: Op, values: np.ndarray, position: int, what: str) -> None:
    if values.size and values.min() < 0:
        raise ShapeError(f"{op.where}: {what} '{op.inputs[position]}' has a negative value {int(values.min())}")


def _segment_ids(lengths: Any, size: int) -> tuple[Any, Any]:
    """(segment of each of `size` rows, offset of each segment) for traced non-negative lengths; rows
    past the lengths' total get segment len(lengths)."""
    ends = jnp.cumsum(lengths)
    ids = jnp.searchsorted(ends, jnp.arange(size), side="right")
    return ids, ends - lengths


def _check_lengths_cover(op: Op, lengths: Any, position: int, rows: int, exact: bool = True) -> None:
    """Traced lengths must be non-negative and sum to (at most, unless `exact`) `rows`."""
    name = literal(op.inputs[position])
    negative = lengths < 0
    enforce(
        ~jnp.any(negative),
        f"{literal(op.where)}: lengths '{name}' has a negative value {{bad}}",
        bad=first_bad(lengths, negative),
    )
    total = jnp.sum(lengths.astype(jnp.int64))
    relation = "equal" if exact else "be at most"
    enforce(
        total == rows if exact else total <= rows,
        f"{literal(op.where)}: lengths '{name}' sum to {{total}}, which must {relation} {rows}",
        total=total,
    )


def _check_index_range(
    op: Op, indices: Any, position: int, low: int, high: int, what: str = "INDICES", where: Any = True
) -> None:
    """Indices in [low, high) (those `where` holds): refused now if known, when the compiled net runs if traced."""
    if not np.size(indices):
        return
    message = (
        f"{literal(op.where)}: {what} '{literal(op.inputs[position])}' has {{bad}}, out of the range [{low}, {high})"
    )
    if isinstance(indices, jax.core.Tracer):
        bad = ((indices < low) | (indices >= high)) & where
        enforce(~jnp.any(bad), message, bad=first_bad(indices, bad))
        return
    values = np.asarray(indices)
    bad = values[((values < low) | (values >= high)) & np.asarray(where)]
    if bad.size:
        raise ShapeError(message.format(bad=int(bad[0])))


def _last_writer(rows: Any, cols: Any, valid: Any, shape: tuple[int, int]) -> Any:
    """For a [rows, cols] table written in order by entries k (where `valid`), the last k writing each
    cell, or -1: Caffe2's sequential loops let the last duplicate win."""
    k = jnp.where(valid, jnp.arange(rows.shape[0]), -1)
    table = jnp.full(shape, -1, k.dtype)
    return table.at[jnp.where(valid, rows, shape[0]), cols].max(k, mode="drop")


# --------------------------------------------------------------------------------------------------
# GatherRanges, LengthsGather


def _gather_rows(data: Any, index: np.ndarray) -> Any:
    return jnp.take(data, jnp.asarray(index, np.int32), axis=0) if index.size else data[:0]


def _ranges_index(op: Op, ranges: np.ndarray, size: int, position: int = 1) -> np.ndarray:
    """The rows the (start, length) pairs of `ranges` select, in order."""
    pairs = ranges.reshape(-1, 2).astype(np.int64)
    _non_negative(op, pairs[:, 1], position, "RANGES (lengths)")
    used = pairs[pairs[:, 1] > 0]
    bad = used[(used[:, 0] < 0) | (used[:, 0] + used[:, 1] > size)]
    if bad.size:
        raise ShapeError(
            f"{op.where}: RANGES '{op.inputs[position]}' has the range (start {bad[0, 0]}, length {bad[0, 1]}), "
            f"outside DATA's {size} elements"
        )
    parts = [np.arange(s, s + n) for s, n in used]
    return np.concatenate(parts) if parts else np.zeros((0,), np.int64)


@register("GatherRanges", inputs=2, outputs=2, static_inputs=(1,), gradient=NO_GRADIENT)
def gather_ranges(op: Op) -> Kernel:
    """(DATA [N], RANGES [B, R, 2] of (start, length)) -> (OUTPUT: the ranges' elements concatenated,
    LENGTHS [B] int32: the elements gathered per example) (caffe2/operators/utility_ops.h)."""

    def kernel(data, ranges):
        ranges = _static_ints(op, ranges, 1, "RANGES", ndim=3)
        _check_ndim(op, data, 0, "DATA", 1)
        if ranges.shape[1] == 0 or ranges.shape[2] != 2:
            raise ShapeError(f"{op.where}: RANGES '{op.inputs[1]}' must be [B, R > 0, 2], got {list(ranges.shape)}")
        index = _ranges_index(op, ranges, data.shape[0])
        lengths = ranges[..., 1].astype(np.int64).sum(axis=1).astype(np.int32)
        return _gather_rows(data, index), lengths

    return kernel


@register("LengthsGather", inputs=3, static_inputs=(1, 2), gradient=should_not_do_gradient)
def lengths_gather(op: Op) -> Kernel:
    """(ITEMS [sum(LENGTHS), ...], LENGTHS [S] int32, INDICES [K]) -> the segments INDICES names,
    concatenated (caffe2/operators/utility_ops.h)."""

    def kernel(items, lengths, indices):
        lengths = _static_ints(op, lengths, 1, "LENGTHS", (np.int32,))
        indices = _static_ints(op, indices, 2, "INDICES")
        _check_ndim(op, items, 0, "ITEMS", 1, at_least=True)
        _non_negative(op, lengths, 1, "LENGTHS")
        if int(lengths.sum()) != items.shape[0]:
            raise ShapeError(
                f"{op.where}: LENGTHS '{op.inputs[1]}' sum to {int(lengths.sum())}, but ITEMS has {items.shape[0]} rows"
            )
        _check_index_range(op, indices, 2, 0, lengths.size)
        offsets = np.cumsum(lengths) - lengths
        parts = [np.arange(offsets[i], offsets[i] + lengths[i]) for i in indices]
        index = np.concatenate(parts) if parts else np.zeros((0,), np.int64)
        return _gather_rows(items, index)

    return kernel


# --------------------------------------------------------------------------------------------------
# PackSegments / UnpackSegments

_PACK_TYPES = (np.float32, np.int32, np.int64)


@register(
    "PackSegments",
    inputs=2,
    outputs=(1, 2),
    static_inputs=(0,),
    gradient=single_gradient("UnpackSegments", "I(0) GO(0)", "GI(1)"),
)
def pack_segments(op: Op) -> Kernel:
    """(LENGTHS [B], DATA [sum(LENGTHS), ...]) -> (PACKED [B, max_length, ...], PRESENCE_MASK [B,
    max_length] bool): each segment a row, padded with 0 (-inf for float with `pad_minf`) and cut to
    argument `max_length` when given (caffe2/operators/pack_segments.cc)."""
    max_length = op.int("max_length", -1)
    pad_minf = op.bool("pad_minf", False)
    presence = op.bool("return_presence_mask", False)
    if max_length < -1:
        raise BadArgumentError(f"{op.where}: argument 'max_length' = {max_length} must be >= 0 (or -1)")
    if presence != (len(op.outputs) == 2):
        raise BadArgumentError(
            f"{op.where}: the presence mask output is written only with return_presence_mask=1 "
            f"(given: return_presence_mask={int(presence)}, {len(op.outputs)} outputs)"
        )

    def kernel(lengths, data):
        lengths = _static_ints(op, lengths, 0, "LENGTHS")
        _check_ndim(op, data, 1, "DATA", 1, at_least=True)
        _check_dtype(op, data, 1, "DATA", _PACK_TYPES)
        _non_negative(op, lengths, 0, "LENGTHS")
        if int(lengths.sum()) != data.shape[0]:
            raise ShapeError(
                f"{op.where}: LENGTHS '{op.inputs[0]}' sum to {int(lengths.sum())}, but DATA has {data.shape[0]} rows"
            )
        width = max_length if max_length >= 0 else int(lengths.max(initial=0))
        starts = np.cumsum(lengths) - lengths
        steps = np.arange(width)
        present = steps[None, :] < np.minimum(lengths, width)[:, None]
        index = np.where(present, starts[:, None] + steps[None, :], 0)
        pad = -np.inf if pad_minf and data.dtype == np.float32 else 0
        if data.shape[0] == 0:
            out = jnp.full((lengths.size, width, *data.shape[1:]), pad, data.dtype)
        else:
            rows = jnp.take(data, jnp.asarray(index.reshape(-1), np.int32), axis=0)
            rows = rows.reshape(lengths.size, width, *data.shape[1:])
            mask = jnp.asarray(present).reshape(*present.shape, *(1,) * (data.ndim - 1))
            out = jnp.where(mask, rows, jnp.asarray(pad, data.dtype))
        return (out, present) if presence else out

    return kernel


@register(
    "UnpackSegments",
    inputs=2,
    static_inputs=(0,),
    gradient=single_gradient("PackSegments", "I(0) GO(0)", "GI(1)"),
)
def unpack_segments(op: Op) -> Kernel:
    """(LENGTHS [B], PACKED [B, T, ...]) -> DATA [sum(min(LENGTHS, T)), ...]: PackSegments undone.
    With argument `max_length` it must equal T and longer segments are cut to it; without it, Caffe2
    reads past a row for a length > T: refused here (caffe2/operators/pack_segments.cc)."""
    max_length = op.int("max_length", -1)

    def kernel(lengths, data):
        lengths = _static_ints(op, lengths, 0, "LENGTHS")
        _check_ndim(op, data, 1, "DATA", 2, at_least=True)
        _check_dtype(op, data, 1, "DATA", _PACK_TYPES)
        _non_negative(op, lengths, 0, "LENGTHS")
        if max_length != -1 and max_length != data.shape[1]:
            raise ShapeError(
                f"{op.where}: argument 'max_length' = {max_length} must equal DATA's dim 1 ({data.shape[1]})"
            )
        if data.shape[0] != lengths.size:
            raise ShapeError(f"{op.where}: DATA '{op.inputs[1]}' has {data.shape[0]} rows for {lengths.size} LENGTHS")
        width = data.shape[1]
        if max_length == -1 and lengths.size and lengths.max() > width:
            raise ShapeError(
                f"{op.where}: LENGTHS '{op.inputs[0]}' has a length {int(lengths.max())} longer than the "
                f"packed rows ({width})"
            )
        used = np.minimum(lengths, width)
        index = np.concatenate([i * width + np.arange(n) for i, n in enumerate(used)] or [np.zeros(0, np.int64)])
        flat = data.reshape(-1, *data.shape[2:])
        return _gather_rows(flat, index)

    return kernel


# Strings (Caffe2's CPU ops are templated on the data type, std::string among them): the kernels move elements
register_host_op("PackSegments", moves_strings(pack_segments, outputs=(0,), together=(1,)), string_inputs=(1,))
register_host_op("UnpackSegments", moves_strings(unpack_segments, outputs=(0,), together=(1,)), string_inputs=(1,))


# --------------------------------------------------------------------------------------------------
# BatchGather

runtime_checked("BatchGather", "LengthsGather", "LengthsTopKGradient", "RemoveDataBlocks", "LengthsPartition")


@register("BatchGather", inputs=2, gradient=single_gradient("BatchGatherGradient", "I(0) I(1) GO(0)"))
def batch_gather(op: Op) -> Kernel:
    """(DATA, INDICES) -> Gather along axis 1: DATA.shape[:1] + INDICES.shape + DATA.shape[2:]; with
    `match_outer`, INDICES' dim 0 is the batch shared with DATA (caffe2/operators/batch_gather_ops.h).
    Negative indices are refused, as by Caffe2 (no wrapping)."""
    match_outer = op.bool("match_outer", False)

    def kernel(data, indices):
        _check_dtype(op, indices, 1, "INDICES", _INDEX_DTYPES)
        _check_ndim(op, data, 0, "DATA", 2, at_least=True)
        inner = indices.shape[1:] if match_outer else indices.shape
        if match_outer and (indices.ndim < 1 or indices.shape[0] != data.shape[0]):
            raise ShapeError(
                f"{op.where}: with match_outer=1 INDICES {list(indices.shape)} must start with DATA's dim 0 "
                f"({data.shape[0]})"
            )
        shape = (data.shape[0], *inner, *data.shape[2:])
        if not np.prod(shape):
            return jnp.zeros(shape, data.dtype)  # Caffe2 checks no index then
        dim = data.shape[1]
        _check_index_range(op, indices, 1, 0, dim)
        if match_outer:
            flat = indices.reshape(data.shape[0], -1)
            out = jax.vmap(lambda d, i: jnp.take(d, i, axis=0, mode="clip"))(data, flat)
            return out.reshape(shape)
        return jnp.take(data, indices, axis=1, mode="clip")

    return kernel


# --------------------------------------------------------------------------------------------------
# SparseToDenseMask

runtime_checked("SparseToDenseMask", "SparseToDenseMaskGradient")


def _mask_arg(op: Op) -> np.ndarray:
    mask = np.asarray(op.ints("mask", ()), np.int64)
    if not mask.size:
        raise BadArgumentError(f"{op.where}: argument 'mask' must be given and non-empty")
    if mask.min() < 0:
        raise BadArgumentError(f"{op.where}: argument 'mask' has a negative id {int(mask.min())}")
    unique, counts = np.unique(mask, return_counts=True)
    if counts.max() > 1:
        raise BadArgumentError(f"{op.where}: argument 'mask' has the duplicated id {int(unique[counts > 1][0])}")
    return mask


def _mask_columns(mask: np.ndarray, indices: Any) -> Any:
    """The column of each sparse id in `mask`, or -1 for ids not in it."""
    order = np.argsort(mask)
    sorted_mask = jnp.asarray(mask[order].astype(np.dtype(indices.dtype)))
    pos = jnp.clip(jnp.searchsorted(sorted_mask, indices), 0, mask.size - 1)
    found = sorted_mask[pos] == indices
    return jnp.where(found, jnp.asarray(order.astype(np.int32))[pos], -1)


def _mask_rows(op: Op, indices: Any, lengths: Any, position: int) -> tuple[Any, Any, int]:
    """(row of each index, whether it is within the lengths, row count) for SparseToDenseMask[Gradient]."""
    k = indices.shape[0]
    if lengths is None:
        return jnp.zeros((k,), np.int32), jnp.ones((k,), bool), 1
    _check_dtype(op, lengths, position, "LENGTHS", (np.int32,))
    _check_ndim(op, lengths, position, "LENGTHS", 1)
    _check_lengths_cover(op, lengths, position, k, exact=False)
    lengths = jnp.maximum(lengths, 0)
    rows, _ = _segment_ids(lengths, k)
    return rows, rows < lengths.shape[0], lengths.shape[0]


@register("SparseToDenseMask", inputs=(3, 4), outputs=(1, 2))
def sparse_to_dense_mask(op: Op) -> Kernel:
    """(INDICES [K], VALUES [K, ...], DEFAULT [...][, LENGTHS [R] int32]) -> (OUTPUT [R, len(mask), ...],
    PRESENCE_MASK [R, len(mask)]): row r's ids (LENGTHS split INDICES into rows; one row, and no row
    dim, without LENGTHS) placed at their position in argument `mask`, DEFAULT elsewhere; ids not in
    the mask are dropped, a repeated id keeps its last value. Negative ids are skipped, and more than
    `max_skipped_indices` (default 50) rows holding one is an error (caffe2/operators/sparse_to_dense_mask_op.h)."""
    mask = _mask_arg(op)
    presence = op.bool("return_presence_mask", False)
    max_skipped = op.int("max_skipped_indices", 50)
    if presence != (len(op.outputs) == 2):
        raise BadArgumentError(
            f"{op.where}: the presence mask output is written only with return_presence_mask=1 "
            f"(given: return_presence_mask={int(presence)}, {len(op.outputs)} outputs)"
        )

    def kernel(indices, values, default, lengths=None):
        _check_dtype(op, indices, 0, "INDICES", _INDEX_DTYPES)
        _check_ndim(op, indices, 0, "INDICES", 1)
        _check_ndim(op, values, 1, "VALUES", 1, at_least=True)
        if values.shape[0] != indices.shape[0] or tuple(values.shape[1:]) != tuple(default.shape):
            raise ShapeError(
                f"{op.where}: VALUES '{op.inputs[1]}' {list(values.shape)} must be [K, *DEFAULT.shape] with K = "
                f"{indices.shape[0]} (INDICES) and DEFAULT {list(default.shape)}"
            )
        if values.dtype != default.dtype:
            raise ShapeError(f"{op.where}: VALUES is {values.dtype} but DEFAULT is {default.dtype}")
        rows, within, count = _mask_rows(op, indices, lengths, 3)
        cols = _mask_columns(mask, indices)
        invalid = (indices < 0) | (indices == np.iinfo(indices.dtype).max)
        bad_rows = jnp.zeros((count,), bool).at[rows].max(within & invalid, mode="drop")
        enforce(
            jnp.sum(bad_rows) < max_skipped,
            f"{literal(op.where)}: {{n}} rows have invalid (negative) sparse indices, which must be fewer than "
            f"{max_skipped} (argument 'max_skipped_indices'): Too many rows with invalid sparse indices skipped",
            n=jnp.sum(bad_rows),
        )
        writer = _last_writer(rows, cols, within & (cols >= 0), (count, mask.size))
        block = jnp.broadcast_to(default, (count, mask.size, *default.shape))
        gathered = jnp.take(values, jnp.maximum(writer, 0), axis=0) if values.shape[0] else block
        written = (writer >= 0).reshape(count, mask.size, *(1,) * default.ndim)
        out = jnp.where(written, gathered, block)
        present = writer >= 0
        if lengths is None:
            out, present = out[0], present[0]
        return (out, present) if presence else out

    return kernel


register_host_op(
    "SparseToDenseMask", moves_strings(sparse_to_dense_mask, outputs=(0,), together=(1, 2)), string_inputs=(1, 2)
)


@facet("gradient", "SparseToDenseMask")
def _sparse_to_dense_mask_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.I(0), g.GO(0)] + ([g.I(3)] if len(g.op.input) == 4 else [])
    return [gradient_op("SparseToDenseMaskGradient", inputs, [g.GI(1)])]


@register("SparseToDenseMaskGradient", inputs=(2, 3))
def sparse_to_dense_mask_gradient(op: Op) -> Kernel:
    """(INDICES [K], dOUTPUT[, LENGTHS]) -> dVALUES [K, ...]: each index that SparseToDenseMask kept
    (the last of a repeated id in its row) gets its cell's gradient, the others zero."""
    mask = _mask_arg(op)

    def kernel(indices, grad, lengths=None):
        _check_dtype(op, indices, 0, "INDICES", _INDEX_DTYPES)
        _check_ndim(op, indices, 0, "INDICES", 1)
        rows, within, count = _mask_rows(op, indices, lengths, 2)
        lead = (count, mask.size) if lengths is not None else (mask.size,)
        if tuple(grad.shape[: len(lead)]) != lead:
            raise ShapeError(
                f"{op.where}: dOUTPUT '{op.inputs[1]}' {list(grad.shape)} must start with {list(lead)} (rows, mask ids)"
            )
        block = grad.shape[len(lead) :]
        cells = grad.reshape(count, mask.size, *block)
        cols = _mask_columns(mask, indices)
        kept = within & (cols >= 0)
        writer = _last_writer(rows, cols, kept, (count, mask.size))
        k = indices.shape[0]
        if not k or not count:
            return jnp.zeros((k, *block), grad.dtype)
        r, c = jnp.clip(rows, 0, count - 1), jnp.maximum(cols, 0)
        wins = kept & (writer[r, c] == jnp.arange(k))
        picked = cells[r, c]
        return jnp.where(wins.reshape(k, *(1,) * len(block)), picked, jnp.zeros((), grad.dtype))

    return kernel


# --------------------------------------------------------------------------------------------------
# GatherRangesToDense

runtime_checked("GatherRangesToDense")


@register("GatherRangesToDense", inputs=(2, 3), outputs=(1, None), gradient=no_gradient)
def gather_ranges_to_dense(op: Op) -> Kernel:
    """(DATA [N], RANGES [B, F, 2][, KEY [N] int64]) -> F outputs [B, lengths[f]]: feature f's range of
    each example when its length is `lengths[f]` (sorted by KEY when given), zeros when empty or of
    another length. More mismatched ranges than `max_mismatched_ratio` * max(B, `min_observation`) (or
    empty ones than `max_empty_ratio` * ...) is an error (caffe2/operators/gather_ranges_to_dense_op.h)."""
    lengths = op.ints("lengths", ())
    min_observation = op.int("min_observation", 10000)
    max_mismatched = op.float("max_mismatched_ratio", 0.01)
    max_empty = op.float("max_empty_ratio", 1.0)
    if not lengths or min(lengths) <= 0:
        raise BadArgumentError(f"{op.where}: argument 'lengths' = {list(lengths)} must be non-empty and positive")
    if min_observation <= 0:
        raise BadArgumentError(f"{op.where}: argument 'min_observation' = {min_observation} must be > 0")
    if len(lengths) != len(op.outputs):
        raise BadArgumentError(
            f"{op.where}: argument 'lengths' has {len(lengths)} entries for {len(op.outputs)} outputs"
        )

    def check_ratio(count, ratio, batch, what, feature):
        if ratio < 1.0:
            limit = np.float32(max(batch, min_observation)) * np.float32(ratio)
            enforce(
                count.astype(np.float32) <= limit,
                f"{literal(op.where)}: {{count}} {what} ranges for feature {feature} of {batch} exceed the "
                f"allowed ratio {ratio}",
                count=count,
            )

    def kernel(data, ranges, key=None):
        _check_ndim(op, data, 0, "DATA", 1)
        _check_dtype(op, ranges, 1, "RANGES", _INDEX_DTYPES)
        _check_ndim(op, ranges, 1, "RANGES", 3)
        if key is not None:
            _check_ndim(op, key, 2, "KEY", 1)
            _check_dtype(op, key, 2, "KEY", (np.int64,))
            if key.shape[0] < data.shape[0]:
                raise ShapeError(f"{op.where}: KEY '{op.inputs[2]}' must have one key per DATA element")
        if ranges.shape[1:] != (len(lengths), 2):
            raise ShapeError(f"{op.where}: RANGES '{op.inputs[1]}' {list(ranges.shape)} must be [B, {len(lengths)}, 2]")
        batch = ranges.shape[0]
        outputs = []
        for f, width in enumerate(lengths):
            start, length = ranges[:, f, 0], ranges[:, f, 1]
            used = length == width
            _check_index_range(op, start, 1, 0, max(data.shape[0] - width + 1, 0), "RANGES start", used)
            check_ratio(jnp.sum(~used & (length != 0)), max_mismatched, batch, "mismatched", f)
            check_ratio(jnp.sum(length == 0), max_empty, batch, "empty", f)
            if not data.shape[0] or not batch:
                outputs.append(jnp.zeros((batch, width), data.dtype))
                continue
            index = jnp.clip(start[:, None] + jnp.arange(width), 0, data.shape[0] - 1)
            rows = data[index]
            if key is not None:  # Caffe2 std::sorts by key: ties have no defined order
                order = jnp.argsort(key[index], axis=1, stable=True)
                rows = jnp.take_along_axis(rows, order, axis=1)
            outputs.append(jnp.where(used[:, None], rows, jnp.zeros((), data.dtype)))
        return tuple(outputs)

    return kernel


# --------------------------------------------------------------------------------------------------
# Lengths ops


@register("LengthsTile", inputs=2, static_inputs=(1,), gradient=single_gradient("LengthsSum", "GO(0) I(1)"))
def lengths_tile(op: Op) -> Kernel:
    """(DATA [N, ...], LENGTHS [N] int32) -> row i repeated LENGTHS[i] times (caffe2/operators/lengths_tile_op.cc)."""

    def kernel(data, lengths):
        lengths = _static_ints(op, lengths, 1, "LENGTHS", (np.int32,))
        _check_ndim(op, data, 0, "DATA", 1, at_least=True)
        _non_negative(op, lengths, 1, "LENGTHS")
        if lengths.size != data.shape[0]:
            raise ShapeError(f"{op.where}: LENGTHS has {lengths.size} entries for DATA's {data.shape[0]} rows")
        return _gather_rows(data, np.repeat(np.arange(lengths.size), lengths))

    return kernel


runtime_checked("LengthsPad")


@register("LengthsPad", inputs=2, gradient=no_gradient)
def lengths_pad(op: Op) -> Kernel:
    """(DATA [sum(LENGTHS), ...], LENGTHS [B] int32) -> [B * target_length, ...]: each segment padded
    to argument `target_length` with `padding_value` (caffe2/operators/lengths_pad_op.h)."""
    target = op.int("target_length", -1)
    padding = op.float("padding_value", -1.0)
    if target < 1:
        raise BadArgumentError(f"{op.where}: argument 'target_length' = {target} must be >= 1")

    def kernel(data, lengths):
        _check_dtype(op, data, 0, "DATA", (np.float32, np.float64, np.int32, np.int64))
        _check_dtype(op, lengths, 1, "LENGTHS", (np.int32,))
        _check_ndim(op, lengths, 1, "LENGTHS", 1)
        _check_ndim(op, data, 0, "DATA", 1, at_least=True)
        _check_lengths_cover(op, lengths, 1, data.shape[0])
        longest = jnp.max(lengths, initial=0)
        enforce(
            longest <= target,
            f"{literal(op.where)}: a length {{n}} is larger than target_length {target}",
            n=longest,
        )
        b = lengths.shape[0]
        pad = jnp.asarray(padding).astype(data.dtype)
        if not b or not data.shape[0]:
            return jnp.full((b * target, *data.shape[1:]), pad, data.dtype)
        starts = jnp.cumsum(lengths) - lengths
        steps = jnp.arange(target)
        present = steps[None, :] < lengths[:, None]
        index = jnp.clip(starts[:, None] + steps[None, :], 0, data.shape[0] - 1).reshape(-1)
        rows = data[index]
        mask = present.reshape(-1, *(1,) * (data.ndim - 1))
        return jnp.where(mask, rows, pad)

    return kernel


@register("LengthsRangeFill", static_inputs=(0,), gradient=no_gradient)
def lengths_range_fill(op: Op) -> Kernel:
    """LENGTHS [B] int32 -> [sum(LENGTHS)] int32: 0..LENGTHS[i]-1 for each i in turn."""

    def kernel(lengths):
        lengths = _static_ints(op, lengths, 0, "LENGTHS", (np.int32,))
        _non_negative(op, lengths, 0, "LENGTHS")
        parts = [np.arange(n, dtype=np.int32) for n in lengths]
        return np.concatenate(parts) if parts else np.zeros((0,), np.int32)

    return kernel


runtime_checked("LengthsTopK")


@register("LengthsTopK", inputs=2, outputs=2, gradient=single_gradient("LengthsTopKGradient", "I(1) O(1) GO(0)"))
def lengths_top_k(op: Op) -> Kernel:
    """(X [sum(LENGTHS)] float, LENGTHS [B] int32) -> (VALUES [B, k], INDICES [B, k] int32): each
    segment's k largest values (ties: the earlier first) and their positions in the segment, padded
    with 0 and -1 (caffe2/operators/lengths_top_k_op.cc)."""
    k = op.int("k", -1)
    if k < 1:
        raise BadArgumentError(f"{op.where}: argument 'k' = {k} must be >= 1")

    def kernel(x, lengths):
        _check_dtype(op, x, 0, "X", (np.float32,))
        _check_dtype(op, lengths, 1, "LENGTHS", (np.int32,))
        _check_ndim(op, lengths, 1, "LENGTHS", 1)
        flat = x.reshape(-1)
        n, b = flat.shape[0], lengths.shape[0]
        _check_lengths_cover(op, lengths, 1, n, exact=False)  # Caffe2 ignores the rest of X
        if not n or not b:
            return jnp.zeros((b, k), x.dtype), jnp.full((b, k), -1, np.int32)
        return _segment_top_k(flat, lengths, k)

    return kernel


@functools.partial(jax.jit, static_argnums=2)
def _segment_top_k(flat: Any, lengths: Any, k: int) -> tuple[Any, Any]:
    """LengthsTopK's sort, jitted as one computation (it is many small ops when run eagerly)."""
    n, b = flat.shape[0], lengths.shape[0]
    segment, starts = _segment_ids(jnp.maximum(lengths, 0), n)
    order = jnp.lexsort((jnp.arange(n), -flat, segment))  # by segment, value descending, position
    seg_sorted = segment[order]
    start = jnp.take(starts, jnp.clip(seg_sorted, 0, b - 1))
    rank = jnp.arange(n) - start
    row, col = jnp.where((rank < k) & (seg_sorted < b), seg_sorted, b), jnp.clip(rank, 0, k - 1)
    values = jnp.zeros((b, k), flat.dtype).at[row, col].set(flat[order], mode="drop")
    indices = jnp.full((b, k), -1, np.int32).at[row, col].set((order - start).astype(np.int32), mode="drop")
    return values, indices


@register("LengthsTopKGradient", inputs=3, static_inputs=(0,))
def lengths_top_k_gradient(op: Op) -> Kernel:
    """(LENGTHS [B], INDICES [B, k], dVALUES [B, k]) -> dX [sum(LENGTHS)]: each top value's gradient
    back at its position."""
    k = op.int("k", -1)
    if k < 1:
        raise BadArgumentError(f"{op.where}: argument 'k' = {k} must be >= 1")

    def kernel(lengths, indices, grad):
        lengths = _static_ints(op, lengths, 0, "LENGTHS", (np.int32,), ndim=None)
        _check_dtype(op, indices, 1, "INDICES", (np.int32,))
        _check_dtype(op, grad, 2, "dVALUES", (np.float32,))
        lengths = lengths.reshape(-1)
        b = lengths.size
        if indices.ndim < 2 or indices.size != b * k or grad.size != b * k:
            raise ShapeError(
                f"{op.where}: INDICES {list(indices.shape)} and dVALUES {list(grad.shape)} must have "
                f"{b} x {k} elements (INDICES at least 2-D)"
            )
        _non_negative(op, lengths, 0, "LENGTHS")
        total = int(lengths.sum())
        used = np.minimum(lengths, k)
        row, col = np.nonzero(np.arange(k)[None, :] < used[:, None])
        offsets = (np.cumsum(lengths) - lengths)[row]
        flat_index, flat_grad = indices.reshape(b, k)[row, col], grad.reshape(b, k)[row, col]
        _check_index_range(op, flat_index, 1, 0, total)
        target = jnp.asarray(offsets) + flat_index
        return jnp.zeros((total,), grad.dtype).at[target].set(flat_grad, mode="drop")

    return kernel


# --------------------------------------------------------------------------------------------------
# BatchSparseToDense / BatchDenseToSparse

runtime_checked("BatchSparseToDense", "BatchDenseToSparse")


def _batch_sparse_rows(op: Op, lengths: Any, indices: Any, width: int) -> Any:
    """The row of each index (lengths split the indices into rows), checking the indices fit `width`."""
    _check_dtype(op, lengths, 0, "LENGTHS", _INDEX_DTYPES)
    _check_dtype(op, indices, 1, "INDICES", _INDEX_DTYPES)
    _check_ndim(op, lengths, 0, "LENGTHS", 1)
    _check_ndim(op, indices, 1, "INDICES", 1)
    _check_lengths_cover(op, lengths, 0, indices.shape[0])
    _check_index_range(op, indices, 1, 0, width)
    rows, _ = _segment_ids(jnp.maximum(lengths, 0), indices.shape[0])
    return rows


@register(
    "BatchSparseToDense",
    inputs=(3, 4),
    gradient=single_gradient("BatchDenseToSparse", "I(0) I(1) GO(0)", "GI(2)"),
)
def batch_sparse_to_dense(op: Op) -> Kernel:
    """(LENGTHS [B], INDICES [K], VALUES [K] float[, SHAPER [B', D]]) -> [B, D]: row i holds its
    segment's values at their indices, `default_value` elsewhere; D is argument `dense_last_dim` or
    SHAPER's dim 1. A repeated index keeps its last value (caffe2/operators/batch_sparse_to_dense_op.cc)."""
    last_dim = op.int("dense_last_dim", -1)
    default = op.float("default_value", 0.0)

    def kernel(lengths, indices, values, shaper=None):
        _check_dtype(op, values, 2, "VALUES", (np.float32,))
        if values.size != indices.size:
            raise ShapeError(f"{op.where}: VALUES has {values.size} elements for {indices.size} INDICES")
        width = last_dim
        if shaper is not None:
            _check_ndim(op, shaper, 3, "output_shape_inference", 2)
            if last_dim not in (-1, shaper.shape[1]):
                raise ShapeError(
                    f"{op.where}: argument 'dense_last_dim' = {last_dim} differs from the shape input's last dim "
                    f"{shaper.shape[1]}"
                )
            width = shaper.shape[1]
        elif width < 1:
            raise BadArgumentError(f"{op.where}: argument 'dense_last_dim' = {width} must be >= 1")
        rows = _batch_sparse_rows(op, lengths, indices, width)
        b = lengths.shape[0]
        writer = _last_writer(rows, jnp.clip(indices, 0, max(width - 1, 0)), rows < b, (b, width))
        out = jnp.full((b, width), default, np.float32)
        if not values.size:
            return out
        return jnp.where(writer >= 0, values.reshape(-1)[jnp.maximum(writer, 0)], out)

    return kernel


@register(
    "BatchDenseToSparse",
    inputs=3,
    gradient=single_gradient("BatchSparseToDense", "I(0) I(1) GO(0) I(2)", "GI(2)"),
)
def batch_dense_to_sparse(op: Op) -> Kernel:
    """(LENGTHS [B], INDICES [K], DENSE [B, D] float) -> VALUES [K]: DENSE[row of k, INDICES[k]]."""

    def kernel(lengths, indices, dense):
        _check_dtype(op, dense, 2, "DENSE", (np.float32,))
        _check_ndim(op, dense, 2, "DENSE", 2)
        if dense.shape[0] != lengths.shape[0]:
            raise ShapeError(f"{op.where}: DENSE has {dense.shape[0]} rows for {lengths.shape[0]} LENGTHS")
        rows = _batch_sparse_rows(op, lengths, indices, dense.shape[1])
        if not indices.size or not dense.size:
            return jnp.zeros(indices.shape, dense.dtype)
        return dense[jnp.clip(rows, 0, dense.shape[0] - 1), jnp.clip(indices, 0, dense.shape[1] - 1)]

    return kernel


# --------------------------------------------------------------------------------------------------
# BooleanMask and friends


def _static_mask(op: Op, mask: Any, position: int) -> np.ndarray:
    return _static_ints(op, mask, position, "MASK", (np.dtype(np.bool_),))


@register(
    "BooleanMask",
    inputs=2,
    outputs=(1, 2),
    static_inputs=(1,),
    gradient=single_gradient("BooleanMaskGradient", "I(1) GO(0)"),
)
def boolean_mask(op: Op) -> Kernel:
    """(DATA [N, ...], MASK [N] bool) -> (the rows where MASK holds, their indices int64)
    (caffe2/operators/boolean_mask_ops.cc)."""

    def kernel(data, mask):
        mask = _static_mask(op, mask, 1)
        _check_ndim(op, data, 0, "DATA", 1, at_least=True)
        if data.shape[0] != mask.size:
            raise ShapeError(f"{op.where}: MASK has {mask.size} entries for DATA's {data.shape[0]} rows")
        index = np.flatnonzero(mask)
        return _gather_rows(data, index), index.astype(np.dtype(np.int64))

    return kernel


@register("BooleanMaskGradient", inputs=2, static_inputs=(0,))
def boolean_mask_gradient(op: Op) -> Kernel:
    """(MASK [N], dY [count(MASK), ...]) -> dX [N, ...]: dY's rows back where MASK holds, zeros
    elsewhere. Caffe2's kernel is only right for 1-D data: it returns [N] from dY's first elements."""

    def kernel(mask, grad):
        mask = _static_mask(op, mask, 0)
        _check_dtype(op, grad, 1, "dY", (np.bool_, np.int32, np.int64, np.float32, np.float64))
        index = np.flatnonzero(mask)
        if grad.ndim < 1 or grad.shape[0] != index.size:
            raise ShapeError(f"{op.where}: dY '{op.inputs[1]}' {list(grad.shape)} must have {index.size} rows")
        out = jnp.zeros((mask.size, *grad.shape[1:]), grad.dtype)
        return out.at[jnp.asarray(index, np.int32)].set(grad) if index.size else out

    return kernel


runtime_checked("BooleanMaskLengths")


@register("BooleanMaskLengths", inputs=2, gradient=no_gradient)
def boolean_mask_lengths(op: Op) -> Kernel:
    """(LENGTHS [B], MASK [sum(LENGTHS)] bool) -> the true count of each segment, in LENGTHS' type."""

    def kernel(lengths, mask):
        _check_dtype(op, lengths, 0, "LENGTHS", _INDEX_DTYPES)
        _check_dtype(op, mask, 1, "MASK", (np.bool_,))
        _check_ndim(op, lengths, 0, "LENGTHS", 1)
        _check_ndim(op, mask, 1, "MASK", 1)
        _check_lengths_cover(op, lengths, 0, mask.shape[0])
        segment, _ = _segment_ids(jnp.maximum(lengths, 0), mask.shape[0])
        counts = jnp.zeros(lengths.shape, lengths.dtype)
        return counts.at[segment].add(mask.astype(lengths.dtype), mode="drop")

    return kernel


# --------------------------------------------------------------------------------------------------
# Unique, RemoveDataBlocks, FindDuplicateElements


@register("Unique", outputs=(1, 2), static_inputs=(0,), gradient=should_not_do_gradient)
def unique(op: Op) -> Kernel:
    """X (int32/int64) -> (its distinct values sorted, REMAPPING int32: the position of each element of
    X in them) (caffe2/operators/unique_ops.cc)."""

    def kernel(x):
        x = _static_ints(op, x, 0, "X", ndim=None)
        values, inverse = np.unique(x.reshape(-1), return_inverse=True)
        return values.astype(np.dtype(x.dtype)), inverse.reshape(x.shape).astype(np.int32)

    return kernel


@register("RemoveDataBlocks", inputs=2, static_inputs=(1,), gradient=should_not_do_gradient)
def remove_data_blocks(op: Op) -> Kernel:
    """(DATA [N, ...], INDICES [K]) -> DATA without the rows INDICES names (repeats count once)
    (caffe2/operators/remove_data_blocks_op.h)."""

    def kernel(data, indices):
        if np.shape(indices)[:1] == (0,):
            return data  # Caffe2 copies DATA, whatever its rank and INDICES' type
        indices = _static_ints(op, indices, 1, "INDICES", ndim=None)
        _check_ndim(op, data, 0, "DATA", 1, at_least=True)
        _check_ndim(op, indices, 1, "INDICES", 1)
        _check_index_range(op, indices, 1, 0, data.shape[0])
        return _gather_rows(data, np.setdiff1d(np.arange(data.shape[0]), indices))

    return kernel


@register("FindDuplicateElements", static_inputs=(0,), gradient=should_not_do_gradient)
def find_duplicate_elements(op: Op) -> Kernel:
    """DATA [N] (numbers or strings) -> the positions (int64) of the elements equal to an earlier one
    (caffe2/operators/find_duplicate_elements_op.h)."""

    def kernel(data):
        data = _static_ints(op, data, 0, "DATA", (np.float32, np.float64, np.int32, np.int64, np.object_))
        seen: set = set()
        duplicates = []
        for i, value in enumerate(data.tolist()):  # floats: -0.0 == 0.0, NaN equals nothing, as in C++
            if value in seen and value == value:
                duplicates.append(i)
            seen.add(value)
        return np.asarray(duplicates, np.dtype(np.int64))

    return kernel


# --------------------------------------------------------------------------------------------------
# IndexHash


@register("IndexHash", gradient=should_not_do_gradient)
def index_hash(op: Op) -> Kernel:
    """INDICES (int32/int64) -> each index hashed (its bytes, little-endian, folded as h * 65537 + b
    from h = seed * 0xDEADBEEF, wrapping in the index type) modulo `modulo`, made non-negative
    (caffe2/operators/index_hash_ops.h)."""
    seed = op.int("seed", 0)
    modulo = op.int("modulo", 0)
    if modulo <= 0:
        raise BadArgumentError(f"{op.where}: argument 'modulo' = {modulo} must be > 0")

    def kernel(indices):
        _check_dtype(op, indices, 0, "INDICES", _INDEX_DTYPES)
        dtype = np.dtype(indices.dtype)
        bits = dtype.itemsize * 8
        if modulo > np.iinfo(dtype).max:
            raise BadArgumentError(f"{op.where}: argument 'modulo' = {modulo} is larger than the {dtype} limit")
        start = (seed * 0xDEADBEEF) & ((1 << 64) - 1)  # int64 product, then truncated to the index type
        start = (start & ((1 << bits) - 1)) - ((1 << bits) if start >> (bits - 1) & 1 else 0)
        unsigned = np.dtype(f"uint{bits}")
        hashed = jnp.full(indices.shape, start, dtype)
        raw = jax.lax.bitcast_convert_type(indices, unsigned)
        for i in range(dtype.itemsize):
            byte = ((raw >> (8 * i)) & 0xFF).astype(np.int8).astype(dtype)  # C++ int8_t bytes
            hashed = hashed * 65537 + byte
        wide = hashed.astype(np.int64)
        result = jax.lax.rem(wide, jnp.asarray(modulo, wide.dtype))
        return jnp.where(result >= 0, result, result + modulo).astype(dtype)

    return kernel


# --------------------------------------------------------------------------------------------------
# Scatter ops: in-place row updates

runtime_checked("ScatterAssign", "ScatterWeightedSum", "Scatter")


def _in_place(op: Op) -> None:
    if op.outputs[0] != op.inputs[0]:
        raise BadArgumentError(
            f"{op.where}: {op.type} works in place: its output must be its input '{op.inputs[0]}', "
            f"got '{op.outputs[0]}'"
        )


@register("ScatterAssign", inputs=3, gradient=should_not_do_gradient)
def scatter_assign(op: Op) -> Kernel:
    """(DATA [N, ...], INDICES [K], SLICES [K, ...]) -> DATA with row INDICES[k] replaced by slice k
    (the last of repeated indices wins), in place (caffe2/operators/utility_ops.h)."""
    _in_place(op)
    types = (np.float32, np.float16, np.uint8, np.int32, np.int64, np.float64)

    def kernel(data, indices, slices):
        _check_dtype(op, data, 0, "DATA", types)
        _check_dtype(op, indices, 1, "INDICES", _INDEX_DTYPES)
        if slices.dtype != data.dtype:
            raise ShapeError(f"{op.where}: SLICES is {slices.dtype} but DATA is {data.dtype}")
        _check_ndim(op, data, 0, "DATA", 1, at_least=True)
        n, k = data.shape[0], indices.size
        block = size_from_dim(data.shape, 1)
        if slices.size != block * k:
            raise ShapeError(f"{op.where}: SLICES has {slices.size} elements, need {k} x {block}")
        _check_index_range(op, indices, 1, 0, n)
        if not k or not data.size:
            return data
        flat = indices.reshape(-1)
        writer = _last_writer(flat, jnp.zeros_like(flat), (flat >= 0) & (flat < n), (n, 1))[:, 0]
        rows = slices.reshape(k, *data.shape[1:])[jnp.maximum(writer, 0)]
        return jnp.where((writer >= 0).reshape(n, *(1,) * (data.ndim - 1)), rows, data)

    return kernel


@register("ScatterWeightedSum", inputs=(5, None), gradient=should_not_do_gradient)
def scatter_weighted_sum(op: Op) -> Kernel:
    """(X0 [N, ...], W0, INDICES [K], X1 [K, ...], W1, ...) -> X0 with rows INDICES[k] scaled by W0
    (once per occurrence) plus sum_i Wi * Xi[k], in place. Weights are float scalars
    (caffe2/operators/utility_ops.h)."""
    _in_place(op)
    if len(op.inputs) % 2 == 0:
        raise BadArgumentError(f"{op.where}: ScatterWeightedSum takes an odd number of inputs, got {len(op.inputs)}")

    def kernel(x0, w0, indices, *pairs):
        _check_dtype(op, x0, 0, "X_0", (np.float32, np.float64))
        _check_dtype(op, indices, 2, "INDICES", _INDEX_DTYPES)
        if x0.size == 0:
            return x0
        weights = [w0, *pairs[1::2]]
        for i, w in zip([1, *range(4, len(op.inputs), 2)], weights, strict=True):
            _check_dtype(op, w, i, "weight", (np.float32,))
            if w.size != 1:
                raise ShapeError(f"{op.where}: weight '{op.inputs[i]}' must have 1 element, got {w.size}")
        n, k = x0.shape[0], indices.size
        block = size_from_dim(x0.shape, 1)
        _check_index_range(op, indices, 2, 0, n)
        flat = jnp.clip(indices.reshape(-1), 0, n - 1)
        counts = jnp.zeros((n,), np.int32).at[flat].add(1)
        scale = jnp.power(w0.reshape(()).astype(x0.dtype), counts.astype(x0.dtype))
        out = x0.reshape(n, block) * scale[:, None]
        for i, (x, w) in enumerate(zip(pairs[0::2], pairs[1::2], strict=True)):
            if x.dtype != x0.dtype or x.size != block * k:
                raise ShapeError(
                    f"{op.where}: X_{i + 1} '{op.inputs[3 + 2 * i]}' must be {x0.dtype} with {k} x {block} "
                    f"elements, got {x.dtype}[{','.join(map(str, x.shape))}]"
                )
            out = out.at[flat].add(w.reshape(()).astype(x0.dtype) * x.reshape(k, block))
        return out.reshape(x0.shape)

    return kernel


@register("Scatter", inputs=3, gradient=should_not_do_gradient)
def scatter(op: Op) -> Kernel:
    """(DATA, INDICES, UPDATES) -> DATA with UPDATES written along argument `axis` (default 1) at
    INDICES, ONNX ScatterElements as Caffe2 flattens it (caffe2/operators/utility_ops.h): element
    (o, i, r) of INDICES (o over the dims before axis, r over those after, each flattened) writes
    UPDATES' element to DATA's (o, INDICES[o, i, r], r). Repeated targets keep the last update.
    UPDATES must be shaped like INDICES."""
    axis_arg = op.int("axis", 1)

    def kernel(data, indices, updates):
        _check_dtype(op, indices, 1, "INDICES", _INDEX_DTYPES)
        if not -data.ndim <= axis_arg < data.ndim:
            raise ShapeError(f"{op.where}: axis {axis_arg} is out of range for DATA of rank {data.ndim}")
        axis = axis_arg % data.ndim
        if indices.ndim <= axis or indices.shape != updates.shape:
            raise ShapeError(
                f"{op.where}: INDICES {list(indices.shape)} must have more than {axis} dims and UPDATES "
                f"{list(updates.shape)} the same shape"
            )
        if updates.dtype != data.dtype:
            raise ShapeError(f"{op.where}: UPDATES is {updates.dtype} but DATA is {data.dtype}")
        outer, inner = size_from_dim(indices.shape[:axis], 0), size_from_dim(indices.shape, axis + 1)
        data_outer, data_inner = size_from_dim(data.shape[:axis], 0), size_from_dim(data.shape, axis + 1)
        if outer > data_outer or inner > data_inner:
            raise ShapeError(
                f"{op.where}: INDICES {list(indices.shape)} address more than DATA {list(data.shape)} "
                f"around axis {axis}"
            )
        if not data.size or not indices.size:
            return data
        dim = data.shape[axis]
        _check_index_range(op, indices, 1, 0, dim)
        idx = jnp.clip(indices.reshape(outer, -1, inner), 0, dim - 1)
        o = jnp.arange(outer)[:, None, None]
        r = jnp.arange(inner)[None, None, :]
        target = ((o * dim + idx) * data_inner + r).reshape(-1)
        writer = _last_writer(target, jnp.zeros_like(target), target >= 0, (data.size, 1))[:, 0]
        flat = jnp.where(writer >= 0, updates.reshape(-1)[jnp.maximum(writer, 0)], data.reshape(-1))
        return flat.reshape(data.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# SegmentOneHot

runtime_checked("SegmentOneHot")


@register("SegmentOneHot", inputs=3, static_inputs=(2,), gradient=no_gradient)
def segment_one_hot(op: Op) -> Kernel:
    """(LENGTHS [B] int32, INDICES [sum(LENGTHS)] int64, INDEX_SIZE int64) -> [B, INDEX_SIZE] float:
    row i has ones at its segment's indices (caffe2/operators/one_hot_ops.cc)."""

    def kernel(lengths, indices, size):
        size = _static_ints(op, size, 2, "INDEX_SIZE", (np.int64,), ndim=None)
        if size.size != 1:
            raise ShapeError(f"{op.where}: INDEX_SIZE '{op.inputs[2]}' must be a scalar")
        size = int(size.reshape(()))
        if size <= 0:
            raise ShapeError(f"{op.where}: INDEX_SIZE '{op.inputs[2]}' = {size} must be > 0")
        _check_dtype(op, lengths, 0, "LENGTHS", (np.int32,))
        _check_dtype(op, indices, 1, "INDICES", (np.int64,))
        _check_ndim(op, lengths, 0, "LENGTHS", 1)
        _check_ndim(op, indices, 1, "INDICES", 1)
        _check_lengths_cover(op, lengths, 0, indices.shape[0], exact=False)  # Caffe2 ignores extra indices
        segment, _ = _segment_ids(jnp.maximum(lengths, 0), indices.shape[0])
        _check_index_range(op, indices, 1, 0, size, where=segment < lengths.shape[0])
        out = jnp.zeros((lengths.shape[0], size), np.float32)
        return out.at[segment, indices].set(1.0, mode="drop")

    return kernel


# --------------------------------------------------------------------------------------------------
# Bucketize, LengthsSplit, SplitByLengths


@register("Bucketize", gradient=NO_GRADIENT)
def bucketize(op: Op) -> Kernel:
    """X float -> int32 bucket of each element: the first i with X <= boundaries[i] (len(boundaries)
    past the last), numpy.digitize / std::lower_bound (caffe2/operators/bucketize_op.cc)."""
    boundaries = np.asarray(op.floats("boundaries", ()), np.float32)
    if np.any(np.diff(boundaries) < 0):
        raise BadArgumentError(f"{op.where}: argument 'boundaries' must be monotonically increasing")

    def kernel(x):
        _check_dtype(op, x, 0, "X", (np.float32,))
        _check_ndim(op, x, 0, "X", 1, at_least=True)
        return jnp.searchsorted(jnp.asarray(boundaries), x, side="left").astype(np.int32)

    return kernel


def _n_split_position(op: Op) -> tuple[int, ...]:
    return (1,) if len(op.inputs) == 2 else ()


@register("LengthsSplit", inputs=(1, 2), static_inputs=_n_split_position, gradient=gradient_not_implemented_yet)
def lengths_split(op: Op) -> Kernel:
    """(LENGTHS [M] int32[, N_SPLIT [1] int32]) -> [M * n_split] int32: each length split into n_split
    near-equal parts, the larger ones first (caffe2/operators/length_split_op.h; C++ integer division)."""
    if len(op.inputs) == 1 and op.int("n_split", 0) <= 0:
        raise BadArgumentError(f"{op.where}: argument 'n_split' must be given and positive")
    arg = op.int("n_split", 0)

    def kernel(lengths, n_split=None):
        n = arg
        if n_split is not None:
            values = _static_ints(op, n_split, 1, "n_split", (np.int32,))  # Caffe2 copies its raw bytes into an int
            if values.size != 1:
                raise ShapeError(f"{op.where}: input n_split '{op.inputs[1]}' must be a vector of size 1")
            n = int(values[0])
        if n <= 0:
            raise ShapeError(f"{op.where}: n_split = {n} must be positive")
        _check_dtype(op, lengths, 0, "LENGTHS", (np.int32,))
        _check_ndim(op, lengths, 0, "LENGTHS", 1)
        n32 = jnp.asarray(n, np.int32)
        mod = jax.lax.rem(lengths, n32)
        up = jax.lax.div(lengths + n32 - 1, n32)
        res = jnp.where(mod != 0, up, jax.lax.div(lengths, n32) + 1)
        larger = jnp.arange(n, dtype=np.int32)[None, :] < mod[:, None]
        return jnp.where(larger, res[:, None], res[:, None] - 1).reshape(-1)

    return kernel


@register("SplitByLengths", inputs=2, outputs=(1, None), static_inputs=(1,), gradient=concat_of_output_gradients)
def split_by_lengths(op: Op) -> Kernel:
    """(INPUT, LENGTHS [L] int32) -> K outputs along `axis` (or `order`'s channel axis, default NCHW: 1):
    output i takes the sum of the i-th L/K lengths (times INPUT's dim / sum(LENGTHS) with
    `use_scaling_lengths`) (caffe2/operators/concat_split_op.h)."""
    if op.has("axis") and op.has("order"):
        raise BadArgumentError(f"{op.where}: give either argument 'axis' or 'order', not both")
    if op.has("axis"):
        axis_arg = op.int("axis")
    else:
        order = op.str("order", "NCHW")
        if order not in ("NCHW", "NHWC"):
            raise BadArgumentError(f"{op.where}: argument 'order' = {order!r} is not NCHW or NHWC")
        axis_arg = 1 if order == "NCHW" else 3
    scaling = op.bool("use_scaling_lengths", False)
    k = len(op.outputs)

    def kernel(x, lengths):
        lengths = _static_ints(op, lengths, 1, "LENGTHS", (np.int32,))
        if lengths.size % k:
            raise ShapeError(f"{op.where}: {lengths.size} LENGTHS do not divide into {k} outputs")
        _non_negative(op, lengths, 1, "LENGTHS")
        if not -x.ndim <= axis_arg < x.ndim:
            raise ShapeError(f"{op.where}: axis {axis_arg} is out of range for an input of rank {x.ndim}")
        axis = axis_arg % x.ndim
        dim, total = x.shape[axis], int(lengths.sum())
        if scaling and dim % (total or 1):
            raise ShapeError(f"{op.where}: INPUT's dim {dim} is not divisible by the lengths' sum {total}")
        if not scaling and total != dim:
            raise ShapeError(f"{op.where}: LENGTHS sum to {total}, but INPUT's dim {axis} is {dim}")
        multiplier = (dim // total if total else 1) if scaling else 1
        sizes = [multiplier * int(part.sum()) for part in lengths.reshape(k, -1)]
        bounds = np.cumsum([0, *sizes])
        return tuple(jax.lax.slice_in_dim(x, int(a), int(b), axis=axis) for a, b in itertools.pairwise(bounds))

    return kernel


# --------------------------------------------------------------------------------------------------
# MergeIdLists


def _all_inputs(op: Op) -> tuple[int, ...]:
    return tuple(range(len(op.inputs)))


@register("MergeIdLists", inputs=(2, None), outputs=2, static_inputs=_all_inputs, gradient=no_gradient)
def merge_id_lists(op: Op) -> Kernel:
    """(LENGTHS_0, VALUES_0, LENGTHS_1, VALUES_1, ...) -> (LENGTHS [B] int32, VALUES): each example's
    ids from every list, deduplicated and sorted (caffe2/operators/merge_id_lists_op.h)."""
    if len(op.inputs) % 2:
        raise BadArgumentError(f"{op.where}: MergeIdLists takes (lengths, values) pairs, got {len(op.inputs)} inputs")

    def kernel(*blobs):
        value_type = np.asarray(blobs[1]).dtype
        lists = []
        for i in range(0, len(blobs), 2):
            lengths = _static_ints(op, blobs[i], i, "LENGTHS", (np.int32,))
            values = _static_ints(op, blobs[i + 1], i + 1, "VALUES", (value_type,))
            if lengths.size != blobs[0].shape[0]:
                raise ShapeError(f"{op.where}: LENGTHS '{op.inputs[i]}' differs in size from '{op.inputs[0]}'")
            _non_negative(op, lengths, i, "LENGTHS")
            if int(lengths.sum()) > values.size:
                raise ShapeError(f"{op.where}: LENGTHS '{op.inputs[i]}' sum past VALUES' {values.size} ids")
            lists.append(np.split(values, np.cumsum(lengths)[:-1]) if lengths.size else [])
        merged = [np.unique(np.concatenate(parts)) for parts in zip(*lists, strict=True)]
        out_lengths = np.asarray([m.size for m in merged], np.int32)
        out_type = np.dtype(value_type)
        out = np.concatenate(merged).astype(out_type) if merged else np.zeros((0,), out_type)
        return out_lengths, out

    return kernel


# --------------------------------------------------------------------------------------------------
# Partition / GatherByKey: rows routed to shards by key modulo the shard count

runtime_checked("GatherByKey")


def _partition_args(op: Op) -> tuple[bool, int]:
    n_in = len(op.inputs)
    if len(op.outputs) % n_in:
        raise BadArgumentError(f"{op.where}: {len(op.outputs)} outputs are not a multiple of the {n_in} inputs")
    return op.bool("pack_first_input", False), len(op.outputs) // n_in


def _partition(op: Op, keys: np.ndarray, xs: tuple, first: int, parts: int, pack: bool) -> list[list[Any]]:
    """Per shard, [its keys, the rows of each X] (inputs `first`, `first` + 1, ... of the op)."""
    flat = keys.reshape(-1)
    shard = np.mod(flat, parts)
    for i, x in enumerate(xs, start=first + 1):
        if tuple(x.shape[: keys.ndim]) != keys.shape:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[i]}' {list(x.shape)} must start with KEYS' shape {list(keys.shape)}"
            )
    shards = []
    for j in range(parts):
        picked = np.flatnonzero(shard == j)
        own = (flat[picked] - j) // parts if pack else flat[picked]
        rows = [_gather_rows(x.reshape(flat.size, *x.shape[keys.ndim :]), picked) for x in xs]
        shards.append([own.astype(np.dtype(keys.dtype)), *rows])
    return shards


@register("Partition", inputs=(1, None), outputs=(1, None), static_inputs=(0,), gradient=no_gradient)
def partition(op: Op) -> Kernel:
    """(KEYS, X_1, ...) -> for each of P shards (outputs = P x inputs), the keys (divided as
    (key - shard) / P with `pack_first_input`) and rows of each X whose key % P is the shard, in
    order (caffe2/operators/partition_ops.h). The X must start with KEYS' shape (Caffe2 accepts
    longer dims and then mixes rows up)."""
    pack, parts = _partition_args(op)

    def kernel(keys, *xs):
        keys = _static_ints(op, keys, 0, "KEYS", ndim=None)
        return tuple(out for shard in _partition(op, keys, xs, 0, parts, pack) for out in shard)

    return kernel


@register("LengthsPartition", inputs=(2, None), outputs=(2, None), static_inputs=(1,), gradient=no_gradient)
def lengths_partition(op: Op) -> Kernel:
    """(LENGTHS [B] int32, KEYS [sum(LENGTHS)], X_1, ...) -> per shard (LENGTHS: each segment's keys
    in the shard, KEYS, X...), as Partition; with one shard the inputs are copied unchanged."""
    pack, parts = _partition_args(op)

    def kernel(lengths, keys, *xs):
        if parts == 1:  # Caffe2 copies the inputs, unchecked
            return (lengths, keys, *xs)
        keys = _static_ints(op, keys, 1, "KEYS")
        _check_dtype(op, lengths, 0, "LENGTHS", (np.int32,))
        _check_ndim(op, lengths, 0, "LENGTHS", 1)
        _check_lengths_cover(op, lengths, 0, keys.size)
        segment, _ = _segment_ids(jnp.maximum(lengths, 0), keys.size)
        shard = jnp.asarray(np.mod(keys, parts))
        outputs = []
        for j, rows in enumerate(_partition(op, keys, xs, 1, parts, pack)):
            counts = jnp.zeros(lengths.shape, np.int32).at[segment].add((shard == j).astype(np.int32), mode="drop")
            outputs += [counts, *rows]
        return tuple(outputs)

    return kernel


@register("GatherByKey", inputs=(2, None))
def gather_by_key(op: Op) -> Kernel:
    """(KEYS [N], SHARD_0, ..., SHARD_{P-1}) -> [N, ...]: Partition undone, row i the next unread row of
    shard KEYS[i] % P (caffe2/operators/partition_ops.h). Caffe2 checks only the shards' total size;
    a shard with fewer rows than its keys would be read past its end: refused here."""

    def kernel(keys, *shards):
        _check_dtype(op, keys, 0, "KEYS", _INDEX_DTYPES)
        _check_ndim(op, keys, 0, "KEYS", 1)
        first = shards[0]
        _check_ndim(op, first, 1, "input", 1, at_least=True)
        for i, s in enumerate(shards[1:], start=2):
            if s.dtype != first.dtype or s.ndim < 1 or s.shape[1:] != first.shape[1:]:
                raise ShapeError(
                    f"{op.where}: shard '{op.inputs[i]}' {_shape_text(s)} must match '{op.inputs[1]}' "
                    f"{_shape_text(first)} but in dim 0"
                )
        sizes = [s.shape[0] for s in shards]
        n, p = keys.shape[0], len(shards)
        if n != sum(sizes):
            raise ShapeError(f"{op.where}: {n} KEYS for {sum(sizes)} rows in the shards")
        if not n:
            return jnp.zeros((0, *first.shape[1:]), first.dtype)
        shard = jnp.mod(keys, p).astype(np.int32)
        one_hot = shard[:, None] == jnp.arange(p)[None, :]
        counts = jnp.sum(one_hot, axis=0)
        enforce(
            jnp.all(counts == jnp.asarray(sizes)),
            f"{literal(op.where)}: the KEYS route {{counts}} rows to the shards, which hold {sizes} rows",
            counts=counts[jnp.argmax(counts != jnp.asarray(sizes))],
        )
        rank = jnp.cumsum(one_hot, axis=0)[jnp.arange(n), shard] - 1
        offsets = jnp.asarray(np.cumsum([0, *sizes[:-1]]), np.int32)
        rows = jnp.concatenate(shards, axis=0)
        return rows[jnp.clip(offsets[shard] + rank, 0, n - 1)]

    return kernel


@facet("gradient", "GatherByKey")
def _gather_by_key_gradient_maker(g: GradientContext) -> GradientOps:
    """A Partition of dY by the keys, into each input's keys and gradient."""
    outputs = []
    for i in range(1, len(g.op.input)):
        outputs += ["_" + g.GI(i) + "_keys", g.GI(i)]
    return [gradient_op("Partition", [g.I(0), g.GO(0)], outputs, [argument("pack_first_input", 0)])]


# --------------------------------------------------------------------------------------------------
# BatchBucketOneHot, BooleanUnmask


@register("BatchBucketOneHot", inputs=3, static_inputs=(1,), gradient=NO_GRADIENT)
def batch_bucket_one_hot(op: Op) -> Kernel:
    """(DATA [N, D] float, LENS [D] int32 > 0, BOUNDARIES [sum(LENS)] float) -> [N, sum(LENS + 1)]:
    column j bucketized by its LENS[j] sorted boundaries, one-hot. A value equal to boundaries
    takes the middle of its equal run, (lower_bound + upper_bound) / 2 (caffe2/operators/one_hot_ops.cc)."""

    def kernel(data, lens, boundaries):
        lens = _static_ints(op, lens, 1, "LENS", (np.int32,), ndim=None).reshape(-1)
        _check_dtype(op, data, 0, "DATA", (np.float32,))
        _check_dtype(op, boundaries, 2, "BOUNDARIES", (np.float32,))
        _check_ndim(op, data, 0, "DATA", 1, at_least=True)
        n, d = data.shape[0], size_from_dim(data.shape, 1)
        if lens.size != d:
            raise ShapeError(f"{op.where}: LENS has {lens.size} entries for DATA's {d} columns")
        if int(lens.sum()) != boundaries.size:
            raise ShapeError(f"{op.where}: LENS sum to {int(lens.sum())}, but there are {boundaries.size} BOUNDARIES")
        if lens.size and lens.min() <= 0:
            raise ShapeError(f"{op.where}: LENS '{op.inputs[1]}' must be positive, got {int(lens.min())}")
        columns = data.reshape(n, d)
        flat = boundaries.reshape(-1)
        starts = np.cumsum(lens) - lens
        parts = []
        for j, (start, count) in enumerate(zip(starts, lens, strict=True)):
            edges = flat[start : start + count]
            lower = jnp.searchsorted(edges, columns[:, j], side="left")
            upper = jnp.searchsorted(edges, columns[:, j], side="right")
            parts.append(jax.nn.one_hot((lower + upper) // 2, count + 1, dtype=np.float32))
        return jnp.concatenate(parts, axis=1) if parts else jnp.zeros((n, 0), np.float32)

    return kernel


runtime_checked("BooleanUnmask")


@register("BooleanUnmask", inputs=(2, None), gradient=no_gradient)
def boolean_unmask(op: Op) -> Kernel:
    """(MASK_0, VALUES_0, MASK_1, VALUES_1, ...) -> [len(MASK_0)]: position p takes the next value of
    the first mask true at p; every position needs a true mask, and each VALUES must be used up
    (caffe2/operators/boolean_unmask_ops.cc)."""
    if len(op.inputs) % 2:
        raise BadArgumentError(f"{op.where}: BooleanUnmask takes (mask, values) pairs, got {len(op.inputs)} inputs")

    def kernel(*blobs):
        masks, values = blobs[0::2], blobs[1::2]
        size = masks[0].size
        for i, (mask, value) in enumerate(zip(masks, values, strict=True)):
            _check_dtype(op, mask, 2 * i, "MASK", (np.bool_,))
            if size and (mask.ndim != 1 or mask.size != size):
                raise ShapeError(f"{op.where}: MASK '{op.inputs[2 * i]}' must be 1-D of size {size}")
            if size and value.ndim != 1:
                raise ShapeError(f"{op.where}: VALUES '{op.inputs[2 * i + 1]}' must be 1-D")
            if value.dtype != values[0].dtype:
                raise ShapeError(f"{op.where}: VALUES '{op.inputs[2 * i + 1]}' is {value.dtype}, not {values[0].dtype}")
        if not size:
            for i, value in enumerate(values):
                if value.size:
                    raise ShapeError(f"{op.where}: VALUES '{op.inputs[2 * i + 1]}' has values for no true mask")
            return jnp.zeros((0,), values[0].dtype)
        stacked = jnp.stack([m.reshape(-1) for m in masks])
        first = jnp.argmax(stacked, axis=0)
        chosen = first[None, :] == jnp.arange(len(masks))[:, None]
        missing = ~jnp.any(stacked, axis=0)
        enforce(
            ~jnp.any(missing),
            f"{literal(op.where)}: All masks have False at position {{p}}.",
            p=jnp.argmax(missing),
        )
        counts = jnp.sum(chosen, axis=1)
        sizes = jnp.asarray([v.size for v in values])
        enforce(
            jnp.all(counts == sizes),
            f"{literal(op.where)}: the masks pick {{n}} values from VALUES {{i}}, which holds a different number",
            n=counts[jnp.argmax(counts != sizes)],
            i=jnp.argmax(counts != sizes),
        )
        rank = jnp.cumsum(chosen, axis=1)[first, jnp.arange(size)] - 1
        offsets = jnp.asarray(np.cumsum([0, *[v.size for v in values[:-1]]]))
        pool = jnp.concatenate([v.reshape(-1) for v in values])
        if not pool.size:
            return jnp.zeros((size,), values[0].dtype)
        return pool[jnp.clip(offsets[first] + rank, 0, pool.size - 1)]

    return kernel


# --------------------------------------------------------------------------------------------------
# BatchBucketize, PadEmptySamples

runtime_checked("BatchBucketize")


@register("BatchBucketize", inputs=4, gradient=no_gradient)
def batch_bucketize(op: Op) -> Kernel:
    """(FEATURE [N, D] float, INDICES [M] int32, BOUNDARIES [sum(LENGTHS)] float, LENGTHS [M] int32) ->
    [N, M] int32: column INDICES[j] of FEATURE bucketized by the j-th run of BOUNDARIES, the first k
    with x <= boundary k (a scan: the boundaries need not be sorted), LENGTHS[j] past them all
    (caffe2/operators/batch_bucketize_op.cc)."""

    def kernel(feature, indices, boundaries, lengths):
        _check_dtype(op, feature, 0, "FEATURE", (np.float32,))
        _check_dtype(op, indices, 1, "INDICES", (np.int32,))
        _check_dtype(op, boundaries, 2, "BOUNDARIES", (np.float32,))
        _check_dtype(op, lengths, 3, "LENGTHS", (np.int32,))
        for x, position, name, ndim in ((lengths, 3, "LENGTHS", 1), (indices, 1, "INDICES", 1)):
            _check_ndim(op, x, position, name, ndim)
        _check_ndim(op, boundaries, 2, "BOUNDARIES", 1)
        _check_ndim(op, feature, 0, "FEATURE", 2)
        if lengths.shape != indices.shape:
            raise ShapeError(f"{op.where}: LENGTHS has {lengths.size} entries for {indices.size} INDICES")
        n, d = feature.shape
        m, e = indices.shape[0], boundaries.shape[0]
        # Caffe2 accepts an index equal to D (and any negative one) and reads past the row: refused here
        _check_index_range(op, indices, 1, 0, d)
        _check_lengths_cover(op, lengths, 3, e)
        out = jnp.broadcast_to(lengths, (n, m)).astype(np.int32)
        if not e or not n or not d:
            return out
        segment, starts = _segment_ids(jnp.maximum(lengths, 0), e)
        seg = jnp.clip(segment, 0, m - 1)
        k = jnp.arange(e) - starts[seg]
        column = feature[:, jnp.clip(indices, 0, d - 1)[seg]]  # [N, E]
        hit = column <= boundaries[None, :]
        ranks = jnp.where(hit, k[None, :], np.iinfo(np.int32).max).astype(np.int32)
        return out.at[:, seg].min(ranks)

    return kernel


@register("PadEmptySamples", inputs=(1, None), outputs=(1, None), static_inputs=(0,), gradient=NO_GRADIENT)
def pad_empty_samples(op: Op) -> Kernel:
    """(LENGTHS [B] int32, FEATURE_1 [sum(LENGTHS), ...], ...) -> (LENGTHS with 0 made 1, each FEATURE
    with one zero row for each empty sample) (caffe2/operators/sequence_ops.cc)."""

    def kernel(lengths, *features):
        lengths = _static_ints(op, lengths, 0, "LENGTHS", (np.int32,))
        _non_negative(op, lengths, 0, "LENGTHS")
        if len(op.outputs) > len(features) + 1:
            raise BadArgumentError(f"{op.where}: {len(op.outputs)} outputs for {len(features)} features")
        total = int(lengths.sum())
        # Row r of the output: a feature row, or -1 for an empty sample's padding row.
        starts = np.cumsum(lengths) - lengths
        parts = [np.arange(s, s + n) if n else np.array([-1]) for s, n in zip(starts, lengths, strict=True)]
        index = np.concatenate(parts) if parts else np.zeros((0,), np.int64)
        outputs = [np.maximum(lengths, 1).astype(np.int32)]
        for k, feature in enumerate(features, start=1):
            _check_ndim(op, feature, k, "FEATURE", 1, at_least=True)
            if feature.shape[0] != total:
                raise ShapeError(
                    f"{op.where}: FEATURE '{op.inputs[k]}' has {feature.shape[0]} rows, LENGTHS sum to {total}"
                )
            rows = _gather_rows(feature, np.maximum(index, 0)) if total else None
            pad = (index < 0).reshape(-1, *(1,) * (feature.ndim - 1))
            zeros = jnp.zeros((index.size, *feature.shape[1:]), feature.dtype)
            outputs.append(zeros if rows is None else jnp.where(pad, zeros, rows))
        return tuple(outputs)

    return kernel
