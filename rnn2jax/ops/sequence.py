"""SequenceMask: the attention decoders' length / window / triangular masking of logits, and (with
`grad=1`) the gradient of that masking."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .common import canonical_axis
from .emit import Call, EmitWriter, Unsupported, call, codegen_helper
from .facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import GradientContext, GradientOps, argument, gradient_op
from .registry import Kernel, declare_family, facet, register
from .shape_facts import INT32, Context, Guesses, Solver, Spec, prod

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

# (row index, column index, per-row int input or None) -> True where the element is replaced.
MaskFn = Callable[[jax.Array, jax.Array, jax.Array | None], jax.Array]


def _window(radius: int) -> MaskFn:
    return lambda i, j, centers: (j > centers + radius) | (j < centers - radius)


# caffe2/operators/boolean_mask_ops.cc: the functors, by mode. The schema doc describes the triangular
# modes the other way round; the functors (and Caffe2's tests) are what runs: "upper" masks j > i.
_MODES: dict[str, MaskFn] = {
    "sequence": lambda i, j, lengths: j >= lengths,
    "upper": lambda i, j, _: j > i,
    "lower": lambda i, j, _: j < i,
    "upperdiag": lambda i, j, _: j >= i,
    "lowerdiag": lambda i, j, _: j <= i,
}
_NEEDS_INPUT = {"sequence": "lengths", "window": "centers"}

# The CPU kernel runs on float only; the CUDA one on half too. Lengths/centers are read as int32.
# Caffe2 registers float (and float16 on GPU); float64 is accepted too, for float64 verification runs.
_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _mask_fn(op: Op, mode: str) -> MaskFn:
    if mode == "window":
        return _window(op.int("radius", 10))
    if mode not in _MODES:
        known = ", ".join(repr(m) for m in (*_MODES, "window"))
        raise BadArgumentError(f"{op.where}: argument 'mode' = {mode!r} is not one of {known}")
    return _MODES[mode]


def _view(
    op: Op, shape: tuple[int, ...], axis: int, batch: int | None, repeat_from: int | None
) -> tuple[int, int, int, int]:
    """(batches, rows, cols, repeat): the 4-D view the mask applies to. Rows are the dims before
    `axis` (after `batch`, if given; the dims up to and including `batch` are independent batches,
    each masked alike); cols the dims from `axis` (up to `repeat_from_axis`, whose trailing block
    repeats each column's decision)."""
    ndim = len(shape)
    axis = canonical_axis(op, axis, ndim)
    if batch is not None:
        batch = canonical_axis(op, batch, ndim, "argument 'batch'")
        if batch >= axis:
            raise ShapeError(f"{op.where}: 'batch' ({batch}) must be before 'axis' ({axis})")
        return math.prod(shape[: batch + 1]), math.prod(shape[batch + 1 : axis]), math.prod(shape[axis:]), 1
    if repeat_from is not None:
        repeat_from = canonical_axis(op, repeat_from, ndim, "argument 'repeat_from_axis'")
        if repeat_from < axis:
            # Caffe2 would leave part of the output unwritten.
            raise ShapeError(
                f"{op.where}: 'repeat_from_axis' ({repeat_from}) must not be before 'axis' ({axis})"
            )
        return 1, math.prod(shape[:axis]), math.prod(shape[axis:repeat_from]), math.prod(shape[repeat_from:])
    return 1, math.prod(shape[:axis]), math.prod(shape[axis:]), 1


def _per_row(op: Op, what: str, values: jax.Array, rows: int, empty: bool) -> jax.Array | None:
    """The first `rows` entries of the lengths/centers input (read flat, as Caffe2 does), as a column;
    None for an empty input, whose mask Caffe2 never evaluates."""
    name = op.inputs[1]
    if np.dtype(values.dtype) != np.dtype(np.int32):
        raise ShapeError(f"{op.where}: {what} input '{name}' must be int32, got {values.dtype}")
    if empty:
        return None
    flat = jnp.reshape(values, (-1,))
    if flat.shape[0] < rows:
        raise ShapeError(
            f"{op.where}: {what} input '{name}' has {flat.shape[0]} values but the input has {rows} rows"
        )
    return jnp.reshape(flat[:rows], (rows, 1))


@register("SequenceMask", inputs=(1, 2), roles=Roles(lengths=(1,)))
def sequence_mask(op: Op) -> Kernel:
    """Replace the masked elements of a `rows x cols` view of the input by `fill_val` (0 with `grad`).
    Modes, args and the batch/repeat views follow SequenceMaskOp (boolean_mask_ops.{h,cc})."""
    mode = op.str("mode")
    fn = _mask_fn(op, mode)
    axis = op.int("axis", 1)
    fill = 0.0 if op.bool("grad", False) else op.float("fill_val", -math.inf)
    batch = op.int("batch") if op.has("batch") else None
    repeat_from = op.int("repeat_from_axis", -1) if op.has("repeat_from_axis") else None
    if repeat_from is not None and (mode != "sequence" or batch is not None):
        raise BadArgumentError(
            f"{op.where}: 'repeat_from_axis' is only supported in mode 'sequence' and without 'batch'"
        )
    if mode in _NEEDS_INPUT and len(op.inputs) < 2:
        raise BadArgumentError(f"{op.where}: mode {mode!r} needs a second input ({_NEEDS_INPUT[mode]})")

    def kernel(x, per_row=None):
        if np.dtype(x.dtype) not in _FLOATS:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[0]}' has dtype {x.dtype}; SequenceMask needs float"
            )
        batches, rows, cols, repeat = _view(op, x.shape, axis, batch, repeat_from)
        what = _NEEDS_INPUT.get(mode)
        column = _per_row(op, what, per_row, rows, x.size == 0) if what else None
        if x.size == 0:
            return jnp.asarray(x)
        i = jax.lax.broadcasted_iota(jnp.int32, (rows, cols), 0)
        j = jax.lax.broadcasted_iota(jnp.int32, (rows, cols), 1)
        masked = fn(i, j, column)[None, :, :, None]
        view = jnp.reshape(x, (batches, rows, cols, repeat))
        return jnp.reshape(jnp.where(masked, jnp.asarray(fill, x.dtype), view), x.shape)

    return kernel


@facet("gradient", "SequenceMask")
def _sequence_mask_gradient_maker(g: GradientContext) -> GradientOps:
    """SequenceMask of dY with `grad` set, the forward's arguments first."""
    g.copy_args = False
    inputs = [g.GO(0)] if len(g.op.input) == 1 else [g.GO(0), g.I(1)]
    return [gradient_op("SequenceMask", inputs, [g.GI(0)], [*g.op.arg, argument("grad", True)])]


@codegen_helper
def mask_past_lengths(x: jax.Array, lengths: jax.Array, axis: int = 1, fill: float = -jnp.inf) -> jax.Array:
    """Caffe2's SequenceMask in mode 'sequence': x viewed as [rows, cols] at `axis`; element (i, j) becomes
    `fill` where j >= lengths[i]. (The kernel above serves every mode and view, with Caffe2's checks; for
    this mode its maths is this.)"""
    axis = axis % x.ndim
    if x.size == 0:
        return jnp.asarray(x)
    rows, cols = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    column = jnp.reshape(jnp.reshape(lengths, (-1,))[:rows], (rows, 1))
    masked = jax.lax.broadcasted_iota(jnp.int32, (rows, cols), 1) >= column
    return jnp.reshape(jnp.where(masked, jnp.asarray(fill, x.dtype), jnp.reshape(x, (rows, cols))), x.shape)


@facet("emitter", "SequenceMask")
def emit_sequence_mask(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    if op.str("mode") != "sequence" or op.has("batch") or op.has("repeat_from_axis") or len(xs) != 2:
        raise Unsupported("SequenceMask other than mode 'sequence' with lengths (no batch, repeat_from_axis)")
    fill = 0.0 if op.bool("grad", False) else op.float("fill_val", float("-inf"))
    keywords: dict = {"axis": op.int("axis", 1)} | ({"fill": fill} if fill != float("-inf") else {})
    return call(w.helper(mask_past_lengths), *xs, **keywords)


@facet("shape_rule", "SequenceMask")
def sequence_mask_shapes(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """SequenceMask(X, lengths): lengths hold one int32 per row of X's leading `axis` dims."""
    if len(ins) < 2 or ins[1] is not None or ins[0] is None or op.str("mode", "sequence") != "sequence":
        return {}, {}
    axis = op.int("axis", 1)
    return {1: Spec((prod(ins[0].shape[:axis]),), INT32)}, {}
