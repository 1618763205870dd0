"""Ranking and classification metrics: LambdaRankNdcg (the LambdaRank loss of listwise learning to rank, with
its gradient) and APMeter (average precision per class over a buffer of recent predictions).

Sources: caffe2/operators/listwise_l2r_op.cc, apmeter_op.cc. APMeter keeps its buffer in the op across runs,
so it is a host op whose buffer lives with its net, as Caffe2's lives with the op.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .facets import GRADIENT_OP, HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import should_not_do_gradient, single_gradient
from .registry import HostWorkspace, Kernel, declare_family, host_op, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)


def _expect(op: Op, index: int, x: Any, dtype: np.dtype) -> None:
    if np.dtype(x.dtype) != dtype:
        raise InputTypeError(f"{op.where}: input '{op.inputs[index]}' must be {dtype}, got {x.dtype}")


def _sessions(op: Op, lengths: Any, total: int, position: int) -> list[int]:
    """The session lengths (a static input): Caffe2 refuses a session starting at or past the end."""
    _expect(op, position, lengths, _I32)
    sizes = [int(n) for n in np.asarray(lengths).ravel()]
    start = 0
    for n in sizes:
        if n < 0 or start >= total or start + n > total:
            raise ShapeError(
                f"{op.where}: session lengths '{op.inputs[position]}' {sizes} do not fit the {total} predictions"
            )
        start += n
    return sizes


def _pairwise(v: jax.Array) -> jax.Array:
    return v[:, None] - v[None, :]


def _sign(v: jax.Array) -> jax.Array:
    """Caffe2's CWISE_SIGN: 1 where v > 0, else -1 (0 included)."""
    return jnp.where(v > 0, jnp.float32(1), jnp.float32(-1))


def _sigmoid(v: jax.Array) -> jax.Array:
    return 1 / (1 + jnp.exp(-v))


def _session(
    y: jax.Array, r: jax.Array, ndcg_loss: bool, normalize: bool, exp_gain: bool
) -> tuple[jax.Array, jax.Array]:
    """One session's (loss, dY), Caffe2's LambdaRankNdcgSession. Sorting is stable (descending): std::sort
    sorts sessions of up to 16 by insertion, which keeps ties in order."""
    n = y.shape[0]
    inv_log = (np.float32(np.log(np.float32(2))) / np.log(np.arange(2, n + 2, dtype=np.float32))).astype(np.float32)

    def discounts(order: jax.Array) -> jax.Array:
        return jnp.zeros(n, jnp.float32).at[order].set(jnp.asarray(inv_log))

    rank = jnp.argsort(-y, stable=True)
    ideal = jnp.argsort(-r, stable=True)
    gain = r if ndcg_loss and not exp_gain else jnp.exp(r * np.float32(np.log(np.float32(2))))
    idcg = jnp.sum(gain * discounts(ideal))
    discount = discounts(rank)
    dcg = jnp.sum(gain * discount)
    weights = jnp.abs(_pairwise(discount) * _pairwise(gain))
    sign = _sign(_pairwise(r))
    dy = -jnp.sum(weights * sign * _sigmoid(-sign * _pairwise(y)), axis=1)
    if ndcg_loss:
        loss = idcg - dcg
    else:
        v = sign * _pairwise(y)
        log_sigmoid = jnp.where(v > 100, jnp.float32(0), jnp.where(v < -100, v, jnp.log(_sigmoid(v))))
        loss = -jnp.sum(weights * log_sigmoid)
    if normalize:
        scale = jnp.maximum(idcg, jnp.float32(1e-5))
        dy, loss = dy / scale, loss / scale
    rated = jnp.sum(jnp.abs(r)) >= 1e-6  # a session with no ratings: no loss, no gradient
    return jnp.where(rated, loss, 0).astype(jnp.float32), jnp.where(rated, dy, 0).astype(jnp.float32)


@register(
    "LambdaRankNdcg",
    inputs=3,
    outputs=2,
    static_inputs=(2,),
    roles=Roles(integers=(2,)),
    gradient=single_gradient("LambdaRankNdcgGradient", "I(0) I(2) O(1) GO(0)"),
)
def lambda_rank_ndcg(op: Op) -> Kernel:
    """(predictions [N], relevance [N], session lengths int32) -> (loss per session, dY cached for the
    gradient). `use_ndcg_as_loss` (false: the LambdaRank loss; true: iDCG - DCG), `use_idcg_normalization`
    (true: divide by iDCG), `use_exp_gain` (true: gain 2^r; false applies with use_ndcg_as_loss only)."""
    ndcg_loss = op.bool("use_ndcg_as_loss", False)
    normalize = op.bool("use_idcg_normalization", True)
    exp_gain = op.bool("use_exp_gain", True)

    def kernel(y: jax.Array, r: jax.Array, lengths: Any) -> tuple[jax.Array, jax.Array]:
        _expect(op, 0, y, _F32)
        _expect(op, 1, r, _F32)
        if y.ndim != 1 or r.size != y.size:
            raise ShapeError(
                f"{op.where}: predictions '{op.inputs[0]}' must be 1-D and relevance '{op.inputs[1]}' as large, "
                f"got shapes {list(y.shape)} and {list(r.shape)}"
            )
        r = jnp.ravel(r)
        losses, grads, start = [], [], 0
        for n in _sessions(op, lengths, y.size, 2):
            if n == 0:
                losses.append(jnp.zeros((), jnp.float32))
                continue
            loss, dy = _session(y[start : start + n], r[start : start + n], ndcg_loss, normalize, exp_gain)
            losses.append(loss)
            grads.append(dy)
            start += n
        loss = jnp.stack(losses) if losses else jnp.zeros((0,), jnp.float32)
        return loss, jnp.concatenate(grads) if grads else jnp.zeros((0,), jnp.float32)

    return kernel


@register("LambdaRankNdcgGradient", inputs=4, static_inputs=(1,), roles=Roles(integers=(1,)))
def lambda_rank_ndcg_gradient(op: Op) -> Kernel:
    """(Y, session lengths, dY cache, dLoss) -> dY: each session's cached dY times its loss gradient."""

    def kernel(y: jax.Array, lengths: Any, cache: jax.Array, d_loss: jax.Array) -> jax.Array:
        if y.ndim != 1 or cache.ndim != 1 or cache.size == 0 or cache.size != y.size:
            raise ShapeError(
                f"{op.where}: Y '{op.inputs[0]}' and the dY cache '{op.inputs[2]}' must be 1-D of one non-zero "
                f"size, got {list(y.shape)} and {list(cache.shape)}"
            )
        _expect(op, 2, cache, _F32)
        _expect(op, 3, d_loss, _F32)
        sizes = _sessions(op, lengths, cache.size, 1)
        if d_loss.size != len(sizes):
            raise ShapeError(f"{op.where}: dLoss '{op.inputs[3]}' has {d_loss.size} values for {len(sizes)} sessions")
        scale = jnp.repeat(jnp.ravel(d_loss), np.asarray(sizes, np.int64), total_repeat_length=sum(sizes))
        return cache[: sum(sizes)] * scale

    return kernel


# --------------------------------------------------------------------------------------------------
# APMeter


def _check_apmeter(op: Op) -> None:
    if len(op.inputs) != 2 or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: APMeter takes 2 inputs and 1 output")
    if op.int("buffer_size", 1000) < 1:
        raise BadArgumentError(f"{op.where}: buffer_size must be positive, got {op.int('buffer_size', 1000)}")


@host_op(
    "APMeter",
    check=_check_apmeter,
    gradient=should_not_do_gradient,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    emitter=HOST_OP_NO_EMITTER,
)
def apmeter(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """(predictions float32 [N, D], labels int32 [N, D]) -> float32 [D]: each class's average precision over
    the last `buffer_size` (1000) predictions of every run, as Caffe2 buffers them: the buffer is sorted by
    score in place (stably) and older entries rotated out from its front."""
    scores = np.asarray(workspace.get(op.inputs[0], op))
    labels = np.asarray(workspace.get(op.inputs[1], op))
    if scores.dtype != _F32 or labels.dtype != _I32:
        raise InputTypeError(
            f"{op.where}: predictions '{op.inputs[0]}' must be float32 and labels '{op.inputs[1]}' int32, "
            f"got {scores.dtype} and {labels.dtype}"
        )
    if scores.ndim != 2 or labels.shape != scores.shape:
        raise ShapeError(
            f"{op.where}: predictions and labels must be [N, D] of one shape, got {list(scores.shape)} and "
            f"{list(labels.shape)}"
        )
    size = op.int("buffer_size", 1000)
    n, classes = scores.shape
    buffers = state.setdefault("buffers", [[(np.float32(0), 0)] * size for _ in range(classes)])
    if len(buffers) != classes:
        raise ShapeError(f"{op.where}: predictions have {classes} classes, earlier runs {len(buffers)}")
    used = state.get("used", 0)
    if n > size:
        scores, labels, n = scores[n - size :], labels[n - size :], size
    reclaim = used + n - size
    if reclaim > 0:
        for i, buffer in enumerate(buffers):
            buffers[i] = buffer[reclaim:] + buffer[:reclaim]
        used -= reclaim
    out = np.zeros(classes, np.float32)
    for i in range(classes):
        buffer = buffers[i]
        for j in range(n):
            buffer[used + j] = (np.float32(scores[j, i]), int(labels[j, i]))
        head = sorted(buffer[: used + n], key=lambda pair: -pair[0])  # stable, by score descending
        buffer[: used + n] = head
        tp, precision, truths = np.float32(0), np.float32(0), 0
        for j, (_, label) in enumerate(head):
            tp = np.float32(tp + np.float32(label))
            if label == 1:
                truths += 1
                precision = np.float32(precision + np.float32(tp / np.float32(j + 1)))
        out[i] = np.float32(precision / np.float32(max(1, truths)))
    state["used"] = used + n
    workspace.feed(op.outputs[0], out)
