"""Tensor-train layers (caffe2/operators/tt_linear_op.h): TT, a fully connected layer whose weight matrix is
a train of small cores, and TTLinearGradient, which Caffe2 registers but never implemented; and
TTSparseLengthsSum (lengths_reducer_ops.h), SparseLengthsSum over an embedding table held as three cores,
with its gradient.

TT multiplies the input by the cores from the last to the first, each product's columns regrouped as
Caffe2's column-major Eigen maps regroup them; the emulation below does the same reshapes in row-major
terms. Where the values do not fill whole rows, Caffe2's resizes keep the first values and drop the rest
(it checks only the final width), and so does the emulation.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, first_bad, literal, runtime_checked
from .common import matmul_precision
from .facets import GRADIENT_OP, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import gradient_not_implemented_yet, single_gradient
from .registry import Kernel, declare_family, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)


def _shape_text(x: Any) -> str:
    return f"{np.dtype(x.dtype)}{list(np.shape(x))}"


@register("TT", inputs=3, gradient=gradient_not_implemented_yet)
def tt(op: Op) -> Kernel:
    """(X [batch, ...], b [prod(out_sizes)], cores (1-D, the cores one after another)) -> Y [batch,
    prod(out_sizes)] = X W + b, W the tensor train of cores i of shape [inp_sizes[i] * tt_ranks[i + 1],
    tt_ranks[i] * out_sizes[i]], taken from the last."""
    inp, out, ranks = (list(op.ints(name, ())) for name in ("inp_sizes", "out_sizes", "tt_ranks"))
    if len(inp) != len(out):
        raise BadArgumentError(f"{op.where}: inp_sizes has size: {len(inp)}, out_sizes has size: {len(out)}")
    if len(ranks) != len(inp) + 1:  # Caffe2 reads tt_ranks[d] past a shorter list
        raise BadArgumentError(f"{op.where}: tt_ranks must hold {len(inp) + 1} ranks, got {len(ranks)}")
    if any(v < 1 for v in inp + out + ranks):
        raise BadArgumentError(f"{op.where}: inp_sizes, out_sizes and tt_ranks must be positive")

    def kernel(x, b, cores):
        for i, value in enumerate((x, b, cores)):
            if np.dtype(value.dtype) != _F32:
                raise ShapeError(f"{op.where}: input '{op.inputs[i]}' must be float32, got {_shape_text(value)}")
        if x.ndim <= 1:
            raise ShapeError(f"{op.where}: Number of dimensions in X: {x.ndim}")
        if b.ndim != 1:
            raise ShapeError(f"{op.where}: Number of dimensions in b: {b.ndim}")
        if cores.ndim != 1:
            raise ShapeError(f"{op.where}: Number of dimensions in cores: {cores.ndim}")
        batch = x.shape[0]
        y = jnp.reshape(x, (-1,))
        offset = 0
        for i in reversed(range(len(inp))):
            rows, cols = inp[i] * ranks[i + 1], ranks[i] * out[i]
            y = y[: y.size // rows * rows]  # Caffe2 resizes to whole rows, keeping the buffer's first values
            if offset + rows * cols > cores.size:
                raise ShapeError(
                    f"{op.where}: cores '{op.inputs[2]}' has {cores.size} values, core {i} reads up to "
                    f"{offset + rows * cols}"
                )
            core = jnp.reshape(cores[offset : offset + rows * cols], (rows, cols))
            product = jnp.matmul(jnp.reshape(y, (-1, rows)), core, precision=matmul_precision())
            y = jnp.reshape(jnp.reshape(product, (-1, out[i])).T, (-1,))
            offset += rows * cols
        if batch == 0:
            raise ShapeError(f"{op.where}: X '{op.inputs[0]}' has no rows")
        width = y.size // batch
        y = y[: batch * width]  # likewise
        if width != math.prod(out):
            raise ShapeError(f"{op.where}: Output dimension of Y: {width}, product of out_sizes: {math.prod(out)}")
        if b.shape[0] < width:  # Caffe2 reads past the end of b
            raise ShapeError(f"{op.where}: b '{op.inputs[1]}' has {b.shape[0]} values for {width} outputs")
        return jnp.reshape(jnp.reshape(y, (batch, width)).T, (batch, width)) + b[:width]

    return kernel


@register("TTLinearGradient", inputs=(0, None), outputs=(0, None))
def tt_linear_gradient(op: Op) -> Kernel:
    """Caffe2's TTLinearGradientOp returns false whatever its inputs (a TODO): every run fails."""
    raise BadArgumentError(f"{op.where}: TTLinearGradient is not implemented in Caffe2 (its run always fails)")


# --------------------------------------------------------------------------------------------------
# TTSparseLengthsSum: SparseLengthsSum over an embedding table held as a tensor train of three cores


def _tt_sls_args(op: Op) -> tuple[list[int], list[int], list[int], int]:
    factor_i = list(op.ints("factor_i", (1, 1, 1)))
    factor_j = list(op.ints("factor_j", (1, 1, 1)))
    ranks = list(op.ints("ranks", (1, 1, 1, 1)))
    emb_size = op.int("emb_size", 64)
    if len(factor_i) != 3 or len(factor_j) != 3 or len(ranks) != 4:
        raise BadArgumentError(f"{op.where}: factor_i and factor_j must hold 3 factors and ranks 4 (three cores)")
    if any(v < 1 for v in factor_i + factor_j + ranks) or emb_size < 1:
        raise BadArgumentError(f"{op.where}: factor_i, factor_j, ranks and emb_size must be positive")
    rows = [factor_j[0], factor_j[0] * factor_j[1], factor_j[0] * factor_j[1] * factor_j[2]]
    buffer = emb_size * max(ranks)  # Caffe2's per-index scratch rows: every product must fit in them
    if ranks[0] * factor_j[0] * ranks[1] > buffer or rows[1] * ranks[2] > buffer or rows[2] * ranks[3] > buffer:
        raise BadArgumentError(f"{op.where}: the cores' products do not fit emb_size * max(ranks) = {buffer} values")
    if rows[2] * ranks[3] < emb_size:
        raise BadArgumentError(
            f"{op.where}: emb_size {emb_size} is more than the {rows[2] * ranks[3]} values the cores make"
        )
    return factor_i, factor_j, ranks, emb_size


def _tt_cores(op: Op, cores: tuple[Any, ...], factor_i: list[int], factor_j: list[int], ranks: list[int]) -> list[Any]:
    """The cores as [factor_i[k], ranks[k] * factor_j[k] * ranks[k + 1]] rows, one per index value."""
    out = []
    for k, core in enumerate(cores):
        if np.dtype(core.dtype) != _F32:
            raise ShapeError(f"{op.where}: core '{op.inputs[k]}' must be float32, got {_shape_text(core)}")
        width = ranks[k] * factor_j[k] * ranks[k + 1]
        if core.size != factor_i[k] * width:
            raise ShapeError(
                f"{op.where}: core '{op.inputs[k]}' {_shape_text(core)} must hold factor_i[{k}] * ranks[{k}] * "
                f"factor_j[{k}] * ranks[{k + 1}] = {factor_i[k] * width} values"
            )
        out.append(jnp.reshape(core, (factor_i[k], width)))
    return out


def _tt_rows(slices: list[Any], factor_j: list[int], ranks: list[int], emb_size: int) -> tuple[Any, Any, Any]:
    """Per index: (its embedding [bs, emb_size], the first product [bs, fj0, r1], the second [bs, fj0 fj1, r2])."""
    bs = slices[0].shape[0]
    first = jnp.reshape(slices[0][:, : factor_j[0] * ranks[1]], (bs, factor_j[0], ranks[1]))
    second = jnp.matmul(
        first, jnp.reshape(slices[1], (bs, ranks[1], factor_j[1] * ranks[2])), precision=matmul_precision()
    )
    second = jnp.reshape(second, (bs, factor_j[0] * factor_j[1], ranks[2]))
    third = jnp.matmul(
        second, jnp.reshape(slices[2], (bs, ranks[2], factor_j[2] * ranks[3])), precision=matmul_precision()
    )
    return jnp.reshape(third, (bs, math.prod(factor_j) * ranks[3]))[:, :emb_size], first, second


def _tt_lookup(op: Op, indices: Any, lengths: Any, factor_i: list[int]) -> tuple[Any, Any]:
    """(the index split into the three cores' rows [bs, 3] int64, each index's segment) with Caffe2's
    enforces, and the checks of what it reads out of bounds for."""
    if indices.ndim != 1 or np.dtype(indices.dtype) != np.dtype(np.int64):
        raise ShapeError(f"{op.where}: INDICES '{op.inputs[3]}' must be an int64 vector, got {_shape_text(indices)}")
    if lengths.ndim != 1 or np.dtype(lengths.dtype) != np.dtype(np.int32):
        raise ShapeError(f"{op.where}: LENGTHS '{op.inputs[4]}' must be an int32 vector, got {_shape_text(lengths)}")
    total = math.prod(factor_i)
    bad = (indices < 0) | (indices >= total)
    enforce(
        ~jnp.any(bad),
        f"{literal(op.where)}: INDICES '{literal(op.inputs[3])}' holds {{bad}}, outside [0, {total})",
        bad=first_bad(indices, bad),
    )
    enforce(
        (jnp.sum(lengths) == indices.shape[0]) & ~jnp.any(lengths < 0),
        f"{literal(op.where)}: LENGTHS '{literal(op.inputs[4])}' must be non-negative and sum to the "
        f"{indices.shape[0]} indices, got a sum of {{total}}",
        total=jnp.sum(lengths),
    )
    safe = jnp.clip(indices, 0, total - 1)
    sub = jnp.stack([safe % factor_i[0], safe // factor_i[0] % factor_i[1], safe // (factor_i[0] * factor_i[1])], 1)
    segment = jnp.searchsorted(jnp.cumsum(lengths), jnp.arange(indices.shape[0]), side="right")
    return sub.astype(jnp.int64), segment


runtime_checked("TTSparseLengthsSum", "TTSparseLengthsSumGradient")


@register(
    "TTSparseLengthsSum",
    inputs=5,
    outputs=4,
    roles=Roles(lengths=(4,), integers=(3,)),
    gradient=single_gradient(
        "TTSparseLengthsSumGradient", "I(0) I(1) I(2) I(4) O(1) O(2) O(3) GO(0)", "GI(0) GI(1) GI(2)"
    ),
)
def tt_sparse_lengths_sum(op: Op) -> Kernel:
    """(core0, core1, core2, INDICES int64, LENGTHS int32) -> (OUTPUT [segments, emb_size]: the sum of
    each segment's embeddings, core0_output, core1_output: each index's partial products, indices_out
    [n, 3] int64: each index split into the cores' rows, the first fastest). An index's embedding is the
    product of its rows of the three cores."""
    factor_i, factor_j, ranks, emb_size = _tt_sls_args(op)

    def kernel(c0, c1, c2, indices, lengths):
        cores = _tt_cores(op, (c0, c1, c2), factor_i, factor_j, ranks)
        sub, segment = _tt_lookup(op, indices, lengths, factor_i)
        embedding, first, second = _tt_rows([cores[k][sub[:, k]] for k in range(3)], factor_j, ranks, emb_size)
        out = jnp.zeros((lengths.shape[0], emb_size), jnp.float32).at[segment].add(embedding, mode="drop")
        return out, first, second, sub

    return kernel


@register("TTSparseLengthsSumGradient", inputs=8, outputs=3, roles=Roles(lengths=(3,), integers=(6,)))
def tt_sparse_lengths_sum_gradient(op: Op) -> Kernel:
    """(core0, core1, core2, LENGTHS, core0_output, core1_output, indices_out, dY) -> (dcore0, dcore1,
    dcore2): each index's share of its segment's gradient, through the product of its core rows, added
    to those rows."""

    def kernel(c0, c1, c2, lengths, _first, _second, sub, dy):
        for k, core in enumerate((c0, c1, c2)):
            if core.ndim != 4:
                raise ShapeError(f"{op.where}: core '{op.inputs[k]}' must be 4-D, got {_shape_text(core)}")
        factor_i = [c.shape[0] for c in (c0, c1, c2)]
        factor_j = [c.shape[2] for c in (c0, c1, c2)]
        ranks = [c0.shape[1], c0.shape[3], c1.shape[3], c2.shape[3]]
        if dy.ndim != 2 or dy.shape[0] != lengths.shape[0] or sub.ndim != 2 or sub.shape[1] != 3:
            raise ShapeError(
                f"{op.where}: dY {_shape_text(dy)} must have a row per length and indices_out {_shape_text(sub)} "
                "3 columns"
            )
        emb_size = dy.shape[1]
        cores = _tt_cores(op, (c0, c1, c2), factor_i, factor_j, ranks)
        bs = sub.shape[0]
        segment = jnp.searchsorted(jnp.cumsum(lengths), jnp.arange(bs), side="right")
        grads = jnp.concatenate([dy, jnp.zeros((1, emb_size), dy.dtype)])[jnp.minimum(segment, lengths.shape[0])]
        rows = [jnp.clip(sub[:, k], 0, factor_i[k] - 1) for k in range(3)]
        slices = [cores[k][rows[k]] for k in range(3)]
        _, vjp = jax.vjp(lambda *s: _tt_rows(list(s), factor_j, ranks, emb_size)[0], *slices)
        d_slices = vjp(grads)
        return tuple(
            jnp.reshape(jnp.zeros(cores[k].shape, jnp.float32).at[rows[k]].add(d_slices[k]), core.shape)
            for k, core in enumerate((c0, c1, c2))
        )

    return kernel
