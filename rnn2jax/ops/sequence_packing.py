"""Sequence packing: ops that move between a flat "values + lengths" layout and padded or per-segment
layouts (PackRNNSequence, AddPadding...), plus the small index ops nets use around them (OneHot, ArgMax,
Where). The segment reductions (LengthsSum...) and the lengths conversions are in segment.py.

Several of these have output shapes that depend on the *values* of a lengths input (PackRNNSequence's
`max(lengths)`). Shapes must be static under `jax.jit`, so those
ops need the lengths to be concrete when the net is traced: a NumPy constant, or a blob the net computes
from constants only (rnn2jax folds such ops at trace time). A traced lengths blob raises a `ShapeError`
that says so. Ops whose output shape follows from the input shapes alone (AddPadding, RemovePadding,
GatherPadding, ReversePackedSegs, BatchOneHot) accept traced lengths.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import literal, runtime_check, runtime_checked
from .common import TRACED_SHAPE_HINT, canonical_axis
from .facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import (
    GradientContext,
    GradientError,
    GradientOps,
    gradient_op,
    no_gradient,
    should_not_do_gradient,
)
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

# --------------------------------------------------------------------------------------------------
# Helpers


def _check_lengths(op: Op, lengths: Any, index: int = 1) -> None:
    """Lengths inputs are 1-D integer tensors (Caffe2 reads them as int32)."""
    name = op.inputs[index]
    if lengths.ndim != 1 or not jnp.issubdtype(lengths.dtype, jnp.integer):
        shape = ",".join(map(str, lengths.shape))
        raise ShapeError(f"{op.where}: input '{name}' must be a 1-D integer tensor, got {lengths.dtype}[{shape}]")


def _concrete_lengths(op: Op, lengths: Any, index: int = 1) -> np.ndarray:
    """The values of a lengths input that decides an output shape (see the module docstring)."""
    name = op.inputs[index]
    if isinstance(lengths, jax.core.Tracer):
        raise ShapeError(
            f"{op.where}: {op.type}'s output shape depends on the values of input '{name}', but it is a "
            f"traced array here; {TRACED_SHAPE_HINT}"
        )
    values = np.asarray(lengths)
    _check_lengths(op, values, index)
    if (values < 0).any():
        raise ShapeError(f"{op.where}: input '{name}' has negative lengths {values.tolist()}")
    return values.astype(np.int64)


def _is_concrete(value: Any) -> bool:
    return not isinstance(value, jax.core.Tracer)


def _take_clip(values: Any, index: Any) -> jax.Array:
    """values[index] with out-of-range indices clamped; zeros when `values` is empty."""
    values = jnp.asarray(values)
    if values.shape[0] == 0:
        return jnp.zeros((*jnp.shape(index), *values.shape[1:]), values.dtype)
    return jnp.take(values, index, axis=0, mode="clip")


def _starts(lengths: Any) -> jax.Array:
    lengths = jnp.asarray(lengths).astype(jnp.int32)
    return jnp.cumsum(lengths) - lengths


def _segments(lengths: Any, n: int) -> tuple[jax.Array, jax.Array]:
    """For positions 0..n-1 of a flat layout split by `lengths`: (segment index, position within the
    segment). Positions past sum(lengths) get segment index len(lengths). Works on traced lengths."""
    lengths = jnp.asarray(lengths).astype(jnp.int32)
    positions = jnp.arange(n, dtype=jnp.int32)
    segment = jnp.searchsorted(jnp.cumsum(lengths), positions, side="right").astype(jnp.int32)
    return segment, positions - _take_clip(_starts(lengths), segment)


def _take_rows_or_zero(data: jax.Array, rows: Any, valid: Any) -> jax.Array:
    """data[rows] where `valid`, zero rows elsewhere (also when data has no rows at all)."""
    padded = jnp.concatenate([data, jnp.zeros((1, *data.shape[1:]), data.dtype)])
    rows = jnp.where(valid, jnp.clip(rows, 0, data.shape[0] - 1), data.shape[0])
    return jnp.take(padded, rows, axis=0)


def _check_total(op: Op, lengths: Any, rows: int, what: str = "rows") -> None:
    """The lengths must cover the data exactly (Caffe2 enforces it): known lengths are checked now,
    traced ones when the compiled net runs (see ops/checks.py)."""
    lengths_name = op.inputs[1] if len(op.inputs) > 1 else "lengths"
    message = (
        f"{literal(op.where)}: the lengths in '{literal(lengths_name)}' sum to {{total}}, but input "
        f"'{literal(op.inputs[0])}' has {rows} {what}"
    )
    if _is_concrete(lengths):
        total = int(np.asarray(lengths).sum())
        if total != rows:
            raise ShapeError(message.format(total=total))
        return
    total = jnp.sum(lengths)
    runtime_check(total == rows, message, total=total)


runtime_checked("AddPadding", "RemovePadding", "GatherPadding")


def _padding_widths(op: Op) -> tuple[int, int]:
    """`padding_width` (default 1) and `end_padding_width` (default: padding_width)."""
    start = op.int("padding_width", 1)
    end = op.int("end_padding_width", -1)
    if start < 0:
        raise BadArgumentError(f"{op.where}: argument 'padding_width' = {start} must be >= 0")
    return start, start if end < 0 else end


# --------------------------------------------------------------------------------------------------
# PackRNNSequence / UnpackRNNSequence (each is the other's gradient)


@register("PackRNNSequence", inputs=2, static_inputs=(1,), roles=Roles(lengths=(1,)))
def pack_rnn_sequence(op: Op) -> Kernel:
    """(values [Σlen, …], lengths [C]) -> [max(len), C, …], zero padded: column c is segment c."""

    def kernel(values, lengths):
        lens = _concrete_lengths(op, lengths)
        if values.ndim < 2:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have at least 2 dims, got {values.ndim}")
        if lens.sum() > values.shape[0]:
            raise ShapeError(
                f"{op.where}: the lengths in '{op.inputs[1]}' sum to {lens.sum()}, more than the "
                f"{values.shape[0]} rows of '{op.inputs[0]}'"
            )
        rows = int(lens.max()) if lens.size else 0
        offsets = np.cumsum(lens) - lens
        r = np.arange(rows)[:, None]
        index = np.where(r < lens[None, :], offsets[None, :] + r, -1)  # [rows, C]
        return _take_rows_or_zero(values, index, index >= 0)

    return kernel


@facet("gradient", "PackRNNSequence")
def _pack_unpack_gradient_maker(g: GradientContext) -> GradientOps:
    """The inverse op (ReversePackedSegs is its own), on dY and the lengths."""
    back = {"PackRNNSequence": "UnpackRNNSequence", "UnpackRNNSequence": "PackRNNSequence"}
    return [gradient_op(back.get(g.op.type, g.op.type), [g.GO(0), g.I(1)], [g.GI(0)])]


@register(
    "UnpackRNNSequence",
    inputs=2,
    static_inputs=(1,),
    roles=Roles(lengths=(1,)),
    gradient=_pack_unpack_gradient_maker,
)
def unpack_rnn_sequence(op: Op) -> Kernel:
    """(packed [T, C, …], lengths [C]) -> [Σlen, …]: the segments, concatenated."""

    def kernel(packed, lengths):
        lens = _concrete_lengths(op, lengths)
        if packed.ndim < 3:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have at least 3 dims, got {packed.ndim}")
        cols = lens.size
        rows = int(lens.max()) if cols else 0
        if packed.shape[1] != cols or packed.shape[0] < rows:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[0]}' of shape {tuple(packed.shape)} does not hold "
                f"{cols} sequences of up to {rows} steps (lengths '{op.inputs[1]}')"
            )
        column = np.repeat(np.arange(cols), lens)
        step = np.arange(column.size) - np.repeat(np.cumsum(lens) - lens, lens)
        flat = packed.reshape(packed.shape[0] * cols, *packed.shape[2:])
        return jnp.take(flat, jnp.asarray(step * cols + column, jnp.int32), axis=0)

    return kernel


# --------------------------------------------------------------------------------------------------
# AddPadding / RemovePadding / GatherPadding


def _optional_lengths(op: Op, data: Any, lengths: Any) -> Any:
    """Without a lengths input the whole tensor is one range."""
    if lengths is None:
        return np.asarray([data.shape[0]], np.int32)
    _check_lengths(op, lengths)
    return lengths


@register("AddPadding", inputs=(1, 4), outputs=(1, 2), roles=Roles(lengths=(1,)))
def add_padding(op: Op) -> Kernel:
    """(data [N, …], lengths?, start_padding?, end_padding?) -> (data with `padding_width` rows before
    and `end_padding_width` rows after each range, lengths + both widths)."""
    start, end = _padding_widths(op)

    def kernel(data, lengths=None, start_pad=None, end_pad=None):
        if data.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have at least 1 dim")
        lengths = _optional_lengths(op, data, lengths)
        _check_total(op, lengths, data.shape[0])
        block = data.shape[1:]
        pads = []
        for pad, index in ((start_pad, 2), (end_pad if end_pad is not None else start_pad, 3)):
            if pad is None:
                pads.append(jnp.zeros(block, data.dtype))
                continue
            if pad.size != math.prod(block):
                raise ShapeError(
                    f"{op.where}: padding input '{op.inputs[min(index, len(op.inputs) - 1)]}' has "
                    f"{pad.size} elements, but a row of '{op.inputs[0]}' has {math.prod(block)}"
                )
            pads.append(jnp.reshape(pad, block).astype(data.dtype))
        out_lengths = jnp.asarray(lengths).astype(jnp.int32) + (start + end)
        n_out = data.shape[0] + (start + end) * lengths.shape[0]
        segment, pos = _segments(out_lengths, n_out)
        seg_len = _take_clip(jnp.asarray(lengths).astype(jnp.int32), segment)
        in_row = _take_clip(_starts(lengths), segment) + pos - start
        payload = (pos >= start) & (pos < start + seg_len)
        rows = _take_rows_or_zero(data, in_row, payload)
        bcast = (-1,) + (1,) * len(block)
        out = jnp.where(jnp.reshape(pos < start, bcast), pads[0], rows)
        out = jnp.where(jnp.reshape(pos >= start + seg_len, bcast), pads[1], out)
        return out, out_lengths

    return kernel


@facet("gradient", "AddPadding")
def _add_padding_gradient_maker(g: GradientContext) -> GradientOps:
    """RemovePadding of dY; the paddings' gradients by GatherPadding."""
    inputs = [g.GO(0)]
    if len(g.op.input) > 1:
        if len(g.op.output) < 2:
            raise GradientError("AddPadding with a lengths input needs its lengths output for the gradient")
        inputs.append(g.O(1))
    ops = [gradient_op("RemovePadding", inputs, [g.GI(0)])]
    if len(g.op.input) >= 3:
        pads = [g.GI(i) for i in range(2, len(g.op.input))]
        ops.append(gradient_op("GatherPadding", inputs, pads))
    return ops


@register("RemovePadding", inputs=(1, 2), outputs=(1, 2), roles=Roles(lengths=(1,)))
def remove_padding(op: Op) -> Kernel:
    """(data [N, …], lengths?) -> (data without the padding rows of each range, lengths − both widths).
    AddPadding's gradient (on the data)."""
    start, end = _padding_widths(op)

    def kernel(data, lengths=None):
        if data.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have at least 1 dim")
        lengths = _optional_lengths(op, data, lengths)
        _check_total(op, lengths, data.shape[0])
        n_out = data.shape[0] - (start + end) * lengths.shape[0]
        if n_out < 0:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[0]}' has {data.shape[0]} rows, fewer than the "
                f"{start + end} padding rows of each of its {lengths.shape[0]} ranges"
            )
        out_lengths = jnp.asarray(lengths).astype(jnp.int32) - (start + end)
        segment, _ = _segments(out_lengths, n_out)
        rows = jnp.arange(n_out, dtype=jnp.int32) + (start + end) * segment + start
        return jnp.take(data, rows, axis=0), out_lengths

    return kernel


@facet("gradient", "RemovePadding")
def _remove_padding_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.GO(0)] + ([g.O(1)] if len(g.op.input) > 1 else [])
    return [gradient_op("AddPadding", inputs, [g.GI(0)])]


@register("GatherPadding", inputs=2, outputs=(1, 2))
def gather_padding(op: Op) -> Kernel:
    """(data [N, …], lengths) -> (Σ start padding rows, Σ end padding rows); with one output, the sum of
    both; with no padding widths, 0-d int64 zeros, as Caffe2. AddPadding's gradient on its padding inputs."""
    start, end = _padding_widths(op)

    def kernel(data, lengths):
        if start == 0 and end == 0:
            # No padding rows: as Caffe2, each output is a 0-d int64 zero, whatever the data (read neither).
            zero = np.zeros((), np.int64)
            return zero if len(op.outputs) == 1 else (zero, zero)
        if data.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have at least 1 dim")
        if data.dtype == jnp.bool_:
            raise ShapeError(f"{op.where}: GatherPadding cannot sum input '{op.inputs[0]}' of type bool")
        _check_lengths(op, lengths)
        _check_total(op, lengths, data.shape[0])
        segment, pos = _segments(lengths, data.shape[0])
        seg_len = _take_clip(jnp.asarray(lengths).astype(jnp.int32), segment)
        inside = segment < lengths.shape[0]
        bcast = (-1,) + (1,) * (data.ndim - 1)

        def masked_sum(mask):
            return jnp.sum(jnp.where(jnp.reshape(mask & inside, bcast), data, 0), axis=0).astype(data.dtype)

        start_sum = masked_sum(pos < start)
        end_sum = masked_sum((pos >= seg_len - end) & (pos < seg_len))
        if len(op.outputs) == 1:
            return start_sum + end_sum
        return start_sum, end_sum

    return kernel


# --------------------------------------------------------------------------------------------------
# ReversePackedSegs


@register("ReversePackedSegs", inputs=2, gradient=_pack_unpack_gradient_maker)
def reverse_packed_segs(op: Op) -> Kernel:
    """(data [T, B, D], lengths [B]) -> the first lengths[b] steps of each column b reversed, the rest
    kept. Its own gradient."""

    def kernel(data, lengths):
        if data.ndim != 3:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be 3-D [T, B, D], got {data.ndim}-D")
        _check_lengths(op, lengths)
        if lengths.shape[0] != data.shape[1]:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[1]}' has {lengths.shape[0]} lengths for a batch of {data.shape[1]}"
            )
        if _is_concrete(lengths) and (np.asarray(lengths) > data.shape[0]).any():
            raise ShapeError(f"{op.where}: input '{op.inputs[1]}' has lengths above T = {data.shape[0]}")
        t = jnp.arange(data.shape[0], dtype=jnp.int32)[:, None]
        lens = jnp.asarray(lengths).astype(jnp.int32)[None, :]
        source = jnp.where(t < lens, lens - 1 - t, t)  # [T, B]
        return jnp.take_along_axis(data, source[:, :, None], axis=0)

    return kernel


# --------------------------------------------------------------------------------------------------
# OneHot, BatchOneHot, ArgMax/ArgMin, Where


@register("OneHot", inputs=2, static_inputs=(1,), gradient=no_gradient)
def one_hot(op: Op) -> Kernel:
    """(indices [N], index_size scalar) -> float32 [N, index_size]. The size decides the output shape, so
    it must be concrete."""

    def kernel(indices, index_size):
        if isinstance(index_size, jax.core.Tracer):
            raise ShapeError(
                f"{op.where}: OneHot's output shape depends on the value of input '{op.inputs[1]}', but "
                f"it is a traced array here; {TRACED_SHAPE_HINT}"
            )
        size = np.asarray(index_size)
        if size.size != 1 or not np.issubdtype(size.dtype, np.integer) or int(size.reshape(())) < 0:
            raise ShapeError(f"{op.where}: input '{op.inputs[1]}' must be one non-negative integer, got {size}")
        if indices.ndim != 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be 1-D, got {indices.ndim}-D")
        columns = jnp.arange(int(size.reshape(())), dtype=jnp.asarray(indices).dtype)
        return (jnp.asarray(indices)[:, None] == columns[None, :]).astype(jnp.float32)

    return kernel


@register("BatchOneHot", inputs=3, gradient=no_gradient)
def batch_one_hot(op: Op) -> Kernel:
    """(data [N, D…], lens [D], vals [Σlens]) -> [N, Σlens] of data's type: column j is
    data[:, d] == vals[j] for the feature d that column j belongs to."""

    def kernel(data, lens, vals):
        if data.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have at least 1 dim")
        _check_lengths(op, lens)
        flat = jnp.reshape(data, (data.shape[0], math.prod(data.shape[1:])))
        if lens.shape[0] != flat.shape[1]:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[1]}' has {lens.shape[0]} lengths for {flat.shape[1]} "
                f"columns of '{op.inputs[0]}'"
            )
        if vals.ndim != 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[2]}' must be 1-D, got {vals.ndim}-D")
        if _is_concrete(lens) and int(np.asarray(lens).sum()) != vals.shape[0]:
            raise ShapeError(
                f"{op.where}: the lengths in '{op.inputs[1]}' sum to {int(np.asarray(lens).sum())}, but "
                f"'{op.inputs[2]}' has {vals.shape[0]} values"
            )
        feature, _ = _segments(lens, vals.shape[0])
        picked = _take_clip(flat.T, feature).T  # [N, Σlens]
        return (picked == jnp.asarray(vals).astype(flat.dtype)[None, :]).astype(data.dtype)

    return kernel


def _arg_reduce(op: Op, reduce: Any) -> Kernel:
    axis = op.int("axis", -1)
    keepdims = op.bool("keepdims", True)
    if axis < -1:  # Caffe2 (arg_ops.h) maps -1 to the last axis and refuses other negative axes
        raise BadArgumentError(f"{op.where}: argument 'axis' = {axis} must be >= 0 or -1")

    def kernel(x):
        ax = canonical_axis(op, axis, x.ndim)
        if x.shape[ax] == 0:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' is empty along axis {axis}")
        return reduce(x, axis=ax, keepdims=keepdims).astype(np.dtype(np.int64))

    return kernel


@register("ArgMax", gradient=should_not_do_gradient)
def arg_max(op: Op) -> Kernel:
    """Index (int64) of the first maximum along `axis` (default -1); `keepdims` (default 1)."""
    return _arg_reduce(op, jnp.argmax)


@register("ArgMin", gradient=should_not_do_gradient)
def arg_min(op: Op) -> Kernel:
    """Index (int64) of the first minimum along `axis` (default -1); `keepdims` (default 1)."""
    return _arg_reduce(op, jnp.argmin)


@register("Where", inputs=3, gradient=should_not_do_gradient)
def where(op: Op) -> Kernel:
    """(C bool, X, Y) -> X where C else Y. C has X's shape, or with `broadcast_on_rows` is 1-D and picks
    whole rows."""
    on_rows = op.bool("broadcast_on_rows", False)

    def kernel(c, x, y):
        if x.shape != y.shape:
            raise ShapeError(f"{op.where}: inputs '{op.inputs[1]}' {x.shape} and '{op.inputs[2]}' {y.shape} differ")
        if on_rows:
            if c.ndim != 1 or x.ndim < 1 or c.shape[0] != x.shape[0]:
                raise ShapeError(
                    f"{op.where}: with broadcast_on_rows, input '{op.inputs[0]}' {c.shape} must be 1-D with "
                    f"one entry per row of '{op.inputs[1]}' {x.shape}"
                )
            c = jnp.reshape(c, (-1,) + (1,) * (x.ndim - 1))
        elif c.shape != x.shape:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' {c.shape} must have the shape of {x.shape}")
        return jnp.where(jnp.asarray(c).astype(bool), x, y)

    return kernel
