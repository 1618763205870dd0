"""Losses and metrics: the ops that end Caffe2 training nets (cross entropies, SoftmaxWithLoss and its
spatial form, SquaredL2Distance, AveragedLoss, ranking criteria, PairWiseLoss, BernoulliJSD), the
gradient ops their backward nets start with, and Accuracy, MultiClassAccuracy, Perplexity.

Each follows Caffe2's CPU kernel, clamps and quirks included (caffe2/operators/cross_entropy_op.cc,
softmax_with_loss_op.cc, spatial_softmax_with_loss_op.cc, distance_op.cc, loss_op.h, rank_loss_op.cc,
jsd_op.cc, margin_ranking_criterion_op.cc, cosine_embedding_criterion_op.cc, accuracy_op.cc). Caffe2 also
checks label *values* (class indices in range, probabilities in [0, 1]); values are unknown while tracing,
so here an out-of-range class index is clamped to the nearest class instead (SpatialSoftmaxWithLoss and
PairWiseLoss's lengths are run-time checked), and probability labels are used as given.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import first_bad, literal, runtime_check, runtime_checked
from .common import canonical_axis, size_from_dim, size_to_dim
from .facets import GRADIENT_OP, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import (
    GradientContext,
    GradientOps,
    gradient_from_input,
    gradient_op,
    should_not_do_gradient,
    single_gradient,
)
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

# Caffe2's kLOG_THRESHOLD: probabilities are clamped to at least this before log or division.
LOG_THRESHOLD = 1e-20

# --------------------------------------------------------------------------------------------------
# Helpers


def _shape(x: Any) -> list[int]:
    return list(x.shape)


def _check_float(op: Op, x: Any, position: int) -> None:
    """Caffe2's CPU loss kernels are registered for float32 only (a double is "Tensor type mismatch");
    doubles are accepted here on purpose, for rnn2jax's float64 verification mode (rnn2jax/checking/verification.py)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ShapeError(f"{op.where}: input '{op.inputs[position]}' must be a float tensor, got {x.dtype}")


def _check_int(op: Op, x: Any, position: int) -> None:
    """Class labels are read as int32 (an int64 label is "Tensor type mismatch")."""
    if x.dtype != jnp.int32:
        raise ShapeError(f"{op.where}: labels '{op.inputs[position]}' must be an integer tensor (int32), got {x.dtype}")


def _reciprocal(n: int, dtype: Any) -> Any:
    """`static_cast<T>(1) / n` in the data type, as Caffe2's averaging scales."""
    return np.asarray(1.0, dtype) / np.asarray(n, dtype)


def _batch_rows(op: Op, x: Any) -> tuple[int, int]:
    """(N, D) of the cross-entropy ops: X [N, ...] is N rows of size_from_dim(1); a 1-D X is one row."""
    if x.ndim == 0:
        raise ShapeError(f"{op.where}: X '{op.inputs[0]}' must have rank >= 1, got a scalar")
    if x.ndim == 1:
        return 1, x.shape[0]
    return x.shape[0], size_from_dim(x.shape, 1)


def _check_row_grad(op: Op, dy: Any, n: int) -> None:
    """dY of a per-row loss: 1-D with one value per row."""
    if dy.ndim != 1 or dy.shape[0] != n:
        raise ShapeError(f"{op.where}: dY '{op.inputs[-1]}' must have shape [{n}], got {_shape(dy)}")


def _class_labels(op: Op, label: Any, n: int, d: int) -> Any:
    """LabelCrossEntropy's labels: [N] or [N, 1] integers, as a clamped [N] vector."""
    _check_int(op, label, 1)
    if not (label.ndim == 1 or (label.ndim == 2 and label.shape[1] == 1)) or label.shape[0] != n:
        raise ShapeError(f"{op.where}: label '{op.inputs[1]}' must have shape [{n}] or [{n}, 1], got {_shape(label)}")
    if d == 0 and n > 0:
        raise ShapeError(f"{op.where}: X '{op.inputs[0]}' has no classes to pick a label from")
    return jnp.clip(label.reshape(n), 0, max(d - 1, 0))


def _pick(rows: Any, labels: Any) -> Any:
    """rows[n, labels[n]] for each row n (rows [N, D], D > 0 unless N is 0)."""
    if rows.shape[1] == 0:
        return jnp.zeros((rows.shape[0],), rows.dtype)
    return jnp.take_along_axis(rows, labels[:, None], axis=1)[:, 0]


def _one_hot(labels: Any, d: int, dtype: Any) -> Any:
    return (jnp.arange(d)[None, :] == labels[:, None]).astype(dtype)


# --------------------------------------------------------------------------------------------------
# AveragedLoss


@register("AveragedLoss", gradient=gradient_from_input)
def averaged_loss(op: Op) -> Kernel:
    """The mean of all elements as a 0-d scalar: the sum times `1/numel` in the data type (SumElements
    with average; an empty input gives 0)."""

    def kernel(x):
        _check_float(op, x, 0)
        total = jnp.sum(x, dtype=x.dtype)
        return total * _reciprocal(x.size, x.dtype) if x.size else total

    return kernel


@register("AveragedLossGradient", inputs=(1, 2))
def averaged_loss_gradient(op: Op) -> Kernel:
    """(X, dLoss) -> dX = dLoss / numel(X) everywhere. Caffe2 before 2017 emitted it with X only,
    meaning dLoss = 1."""

    def kernel(x, dloss=None):
        if dloss is None:
            dloss = jnp.ones((), x.dtype)
        _check_float(op, dloss, 1 if len(op.inputs) == 2 else 0)
        if dloss.size != 1:
            raise ShapeError(f"{op.where}: dLoss '{op.inputs[-1]}' must hold one element, got shape {_shape(dloss)}")
        value = dloss.reshape(())
        if x.size:
            value = value / jnp.asarray(x.size, value.dtype)
        return jnp.broadcast_to(value, x.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# LabelCrossEntropy / CrossEntropy


@register("LabelCrossEntropy", inputs=2, gradient=single_gradient("LabelCrossEntropyGradient", "I(0) I(1) GO(0)"))
def label_cross_entropy(op: Op) -> Kernel:
    """(X [N, D...], label [N] int) -> Y [N] = -log(max(X[n, label[n]], 1e-20)); X holds probabilities."""

    def kernel(x, label):
        _check_float(op, x, 0)
        n, d = _batch_rows(op, x)
        labels = _class_labels(op, label, n, d)
        picked = _pick(x.reshape(n, d), labels)
        return -jnp.log(jnp.maximum(picked, jnp.asarray(LOG_THRESHOLD, x.dtype)))

    return kernel


@register("LabelCrossEntropyGradient", inputs=3)
def label_cross_entropy_gradient(op: Op) -> Kernel:
    """(X, label, dY) -> dX: zero except dX[n, label[n]] = -dY[n] / max(X[n, label[n]], 1e-20)."""

    def kernel(x, label, dy):
        _check_float(op, x, 0)
        n, d = _batch_rows(op, x)
        labels = _class_labels(op, label, n, d)
        _check_row_grad(op, dy, n)
        rows = x.reshape(n, d)
        grad = -dy[:, None].astype(x.dtype) / jnp.maximum(rows, jnp.asarray(LOG_THRESHOLD, x.dtype))
        return (grad * _one_hot(labels, d, x.dtype)).reshape(x.shape)

    return kernel


def _soft_labels(op: Op, label: Any, n: int, d: int) -> Any:
    """CrossEntropy's labels: [N, D] probabilities (a 1-D label only fits when D is 1)."""
    _check_float(op, label, 1)
    fits = label.ndim == 1 or (label.ndim == 2 and label.shape[1] == d)
    if not fits or label.shape[0] != n or label.size != n * d:
        raise ShapeError(
            f"{op.where}: label '{op.inputs[1]}' must have shape [{n}, {d}] to match X "
            f"'{op.inputs[0]}', got {_shape(label)}"
        )
    return label.reshape(n, d)


@register("CrossEntropy", inputs=2, gradient=single_gradient("CrossEntropyGradient", "I(0) I(1) GO(0)"))
def cross_entropy(op: Op) -> Kernel:
    """(X [N, D], label [N, D] soft labels) -> Y [N] = -Σ_j label[n, j] · log(max(X[n, j], 1e-20))."""

    def kernel(x, label):
        _check_float(op, x, 0)
        n, d = _batch_rows(op, x)
        labels = _soft_labels(op, label, n, d).astype(x.dtype)
        logs = jnp.log(jnp.maximum(x.reshape(n, d), jnp.asarray(LOG_THRESHOLD, x.dtype)))
        return -jnp.sum(labels * logs, axis=1)

    return kernel


@register("CrossEntropyGradient", inputs=3)
def cross_entropy_gradient(op: Op) -> Kernel:
    """(X, label, dY) -> dX = -dY[n] · label[n, j] / max(X[n, j], 1e-20)."""

    def kernel(x, label, dy):
        _check_float(op, x, 0)
        n, d = _batch_rows(op, x)
        labels = _soft_labels(op, label, n, d).astype(x.dtype)
        _check_row_grad(op, dy, n)
        clamped = jnp.maximum(x.reshape(n, d), jnp.asarray(LOG_THRESHOLD, x.dtype))
        return (labels / clamped * -dy[:, None].astype(x.dtype)).reshape(x.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# SigmoidCrossEntropyWithLogits


def _sigmoid_xent_mode(op: Op) -> str:
    log_d_trick = op.bool("log_D_trick", False)
    unjoined = op.bool("unjoined_lr_loss", False)
    if log_d_trick and unjoined:
        raise BadArgumentError(f"{op.where}: arguments 'log_D_trick' and 'unjoined_lr_loss' cannot both be set")
    return "log_D_trick" if log_d_trick else "unjoined" if unjoined else "default"


def _check_logits_targets(op: Op, logits: Any, targets: Any, first: int) -> None:
    _check_float(op, logits, first)
    if logits.shape != targets.shape:
        raise ShapeError(
            f"{op.where}: logits '{op.inputs[first]}' {_shape(logits)} and targets "
            f"'{op.inputs[first + 1]}' {_shape(targets)} must have the same shape"
        )


def _log1p_exp_neg_abs(x: Any) -> Any:
    """log(1 + exp(-|x|)): Caffe2 writes it as log(1 + exp(x - 2·x·[x >= 0]))."""
    return jnp.log1p(jnp.exp(-jnp.abs(x)))


def _sigmoid_xent_terms(mode: str, lgt: Any, tgt: Any) -> Any:
    """Per-element log-likelihood terms (the loss is minus their row mean)."""
    pos = (lgt >= 0).astype(lgt.dtype)
    if mode == "log_D_trick":
        partition = lgt * pos + _log1p_exp_neg_abs(lgt)  # log(1 + exp(lgt))
        return (2 * tgt - 1) * (lgt - partition)
    if mode == "unjoined":
        return lgt * tgt + (tgt - 1) * lgt * pos - (1 - tgt) * _log1p_exp_neg_abs(lgt)
    return lgt * (tgt - pos) - _log1p_exp_neg_abs(lgt)


def _sigmoid_xent_slopes(mode: str, lgt: Any, tgt: Any) -> Any:
    """Caffe2's per-element backward factors (log_D_trick's is the trick's, not the exact derivative)."""
    if mode == "log_D_trick":
        return (2 * tgt - 1) / (1 + jnp.exp(lgt))
    if mode == "unjoined":
        return tgt - (1 - tgt) / (1 + jnp.exp(-lgt))
    return tgt - 1 / (1 + jnp.exp(-lgt))


def _inner_size(op: Op, x: Any, position: int) -> int:
    """The size of the last dim, which each row's loss averages over. Caffe2 divides the number of
    elements by it as an integer: an empty last dim kills the process (SIGFPE); refused here."""
    inner = x.shape[-1] if x.ndim else 1
    if inner == 0:
        raise ShapeError(
            f"{op.where}: logits '{op.inputs[position]}' {_shape(x)} have an empty last dim: the mean over it "
            "is undefined (Caffe2 crashes dividing by it)"
        )
    return inner


@register(
    "SigmoidCrossEntropyWithLogits",
    inputs=2,
    gradient=single_gradient("SigmoidCrossEntropyWithLogitsGradient", "GO(0) I(0) I(1)"),
)
def sigmoid_cross_entropy_with_logits(op: Op) -> Kernel:
    """(logits, targets) -> loss shaped like logits without its last dim: minus the mean over the
    last dim of the sigmoid log-likelihood, computed stably from the logits. Args `log_D_trick`
    (Goodfellow et al.'s variant) and `unjoined_lr_loss` (false; not both)."""
    mode = _sigmoid_xent_mode(op)

    def kernel(logits, targets):
        _check_logits_targets(op, logits, targets, 0)
        terms = _sigmoid_xent_terms(mode, logits, targets.astype(logits.dtype))
        if logits.ndim == 0:
            return -terms
        return -jnp.sum(terms, axis=-1) / jnp.asarray(_inner_size(op, logits, 0), logits.dtype)

    return kernel


def _xent_gradient_factor(op: Op, g: Any, logits: Any) -> Any:
    """-dY[row] / inner, shaped to broadcast over logits' last dim: the sigmoid cross entropies average
    over it, so each row's gradient is shared by its elements."""
    inner = _inner_size(op, logits, 1)
    outer = size_to_dim(logits.shape, logits.ndim - 1) if logits.ndim else 1
    if g.size != outer:
        raise ShapeError(
            f"{op.where}: dY '{op.inputs[0]}' has {g.size} values for {outer} rows of logits "
            f"'{op.inputs[1]}' {_shape(logits)}"
        )
    rows = (*logits.shape[:-1], 1) if logits.ndim else ()
    return -g.astype(logits.dtype).reshape(rows) / jnp.asarray(inner, logits.dtype)


@register("SigmoidCrossEntropyWithLogitsGradient", inputs=3)
def sigmoid_cross_entropy_with_logits_gradient(op: Op) -> Kernel:
    """(dY, logits, targets) -> dlogits = -dY[row] / inner · slope(logit, target)."""
    mode = _sigmoid_xent_mode(op)

    def kernel(g, logits, targets):
        _check_logits_targets(op, logits, targets, 1)
        factor = _xent_gradient_factor(op, g, logits)
        return factor * _sigmoid_xent_slopes(mode, logits, targets.astype(logits.dtype))

    return kernel


# --------------------------------------------------------------------------------------------------
# SoftmaxWithLoss


def _softmax_with_loss_args(op: Op) -> tuple[float, bool, int]:
    """(scale, label_prob, axis); Caffe2 requires scale >= 0 and order NCHW."""
    scale = op.float("scale", 1.0)
    if scale < 0:
        raise BadArgumentError(f"{op.where}: argument 'scale' = {scale} must be >= 0")
    order = op.str("order", "NCHW")
    if order != "NCHW":
        raise BadArgumentError(f"{op.where}: argument 'order' = {order!r}: only NCHW is supported")
    return scale, op.bool("label_prob", False), op.int("axis", 1)


def _softmax_loss_labels(op: Op, t: Any, axis: int, n: int, d: int, label_prob: bool) -> Any:
    """The labels as [N] class indices, or [N, D] probabilities with label_prob."""
    what = f"labels '{op.inputs[1]}' {_shape(t)}"
    if label_prob:
        _check_float(op, t, 1)
        if t.ndim < max(2, axis) or size_to_dim(t.shape, axis) != n or size_from_dim(t.shape, axis) != d:
            raise ShapeError(f"{op.where}: with label_prob=1, {what} must have the logits' shape [{n} x {d}]")
        return t.reshape(n, d)
    _check_int(op, t, 1)
    if t.ndim == axis:
        fits = t.size == n
    else:
        fits = t.ndim > axis and size_to_dim(t.shape, axis) == n and size_from_dim(t.shape, axis) == 1
    if not fits:
        raise ShapeError(f"{op.where}: {what} must hold one class index per row of the logits ({n} rows)")
    if d == 0 and n > 0:
        raise ShapeError(f"{op.where}: logits '{op.inputs[0]}' have no classes to pick a label from")
    return jnp.clip(t.reshape(n), 0, max(d - 1, 0))


def _sample_weights(op: Op, w: Any, n: int, dtype: Any) -> Any:
    if w is None:
        return jnp.ones((n,), dtype)
    if w.size != n:
        raise ShapeError(f"{op.where}: weights '{op.inputs[2]}' must hold {n} values, got shape {_shape(w)}")
    return w.reshape(n).astype(dtype)


@register("SoftmaxWithLoss", inputs=(2, 3), outputs=2)
def softmax_with_loss(op: Op) -> Kernel:
    """(logits, labels[, weights]) -> (softmax, loss). Logits are coerced to N x D at `axis`; loss is
    the weighted mean over rows of -log softmax[label] (or -Σ label · log max(softmax, 1e-20) with
    `label_prob`), times `scale`; 0 if the weights sum to 0."""
    scale, label_prob, axis = _softmax_with_loss_args(op)

    def kernel(x, t, w=None):
        _check_float(op, x, 0)
        k = canonical_axis(op, axis, x.ndim)
        n, d = size_to_dim(x.shape, k), size_from_dim(x.shape, k)
        labels = _softmax_loss_labels(op, t, k, n, d, label_prob)
        weights = _sample_weights(op, w, n, x.dtype)
        rows = x.reshape(n, d)
        shifted = rows - jnp.max(rows, axis=1, keepdims=True) if rows.size else rows
        total = jnp.sum(jnp.exp(shifted), axis=1, keepdims=True)
        if label_prob:
            p = jnp.exp(shifted) / total
            logp = jnp.log(jnp.maximum(p, jnp.asarray(LOG_THRESHOLD, x.dtype)))
            losses = -jnp.sum(logp * labels.astype(x.dtype), axis=1)
        else:  # Caffe2 computes log-softmax, picks the label's entry, then exponentiates
            logp = shifted - jnp.log(jnp.maximum(total, jnp.asarray(LOG_THRESHOLD, x.dtype)))
            p = jnp.exp(logp)
            losses = -_pick(logp, labels)
        weight_sum = jnp.sum(weights)
        loss_sum = jnp.sum(losses.astype(x.dtype) * weights)
        safe = jnp.where(weight_sum != 0, weight_sum, jnp.ones((), x.dtype))
        loss = jnp.where(weight_sum != 0, loss_sum * jnp.asarray(scale, x.dtype) / safe, 0)
        return p.reshape(x.shape), loss.astype(x.dtype)

    return kernel


@facet("gradient", "SoftmaxWithLoss")
def _softmax_with_loss_gradient_maker(g: GradientContext) -> GradientOps:
    """(X, labels[, weights], softmax, dLoss); the softmax output's gradient is not read."""
    inputs = [g.I(i) for i in range(len(g.op.input))] + [g.O(0), g.GO(1)]
    return [gradient_op("SoftmaxWithLossGradient", inputs, [g.GI(0)])]


@register("SoftmaxWithLossGradient", inputs=(4, 5))
def softmax_with_loss_gradient(op: Op) -> Kernel:
    """(logits, labels[, weights], softmax, dLoss) -> dlogits = weight[n] · (softmax - target) ·
    scale · dLoss / Σ weights, where target is the one-hot label (or the label probabilities). When
    the weights sum to <= 0 Caffe2 skips the final scaling, and so does this."""
    scale, label_prob, axis = _softmax_with_loss_args(op)

    def kernel(x, t, *rest):
        w, p, dloss = rest if len(rest) == 3 else (None, *rest)
        k = canonical_axis(op, axis, x.ndim)
        n, d = size_to_dim(x.shape, k), size_from_dim(x.shape, k)
        labels = _softmax_loss_labels(op, t, k, n, d, label_prob)
        _check_float(op, p, len(op.inputs) - 2)
        if p.shape != x.shape:
            raise ShapeError(
                f"{op.where}: softmax '{op.inputs[-2]}' {_shape(p)} must have the logits' shape {_shape(x)}"
            )
        if dloss.size < 1:
            raise ShapeError(f"{op.where}: dLoss '{op.inputs[-1]}' is empty")
        weights = _sample_weights(op, w, n, p.dtype)
        target = labels.astype(p.dtype) if label_prob else _one_hot(labels, d, p.dtype)
        grad = (p.reshape(n, d) - target) * weights[:, None]
        total = jnp.sum(weights) if w is not None else jnp.asarray(n, p.dtype)
        safe = jnp.where(total > 0, total, jnp.ones((), p.dtype))
        factor = jnp.asarray(scale, p.dtype) / safe * dloss.reshape(-1)[0].astype(p.dtype)
        return (grad * jnp.where(total > 0, factor, jnp.ones((), p.dtype))).reshape(x.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# SquaredL2Distance


def _distance_rows(op: Op, x: Any, y: Any, first: int) -> int:
    """N of the distance ops: X [N, ...] and Y of the same shape; a scalar is one row."""
    _check_float(op, x, first)
    if x.shape != y.shape:
        raise ShapeError(
            f"{op.where}: X '{op.inputs[first]}' {_shape(x)} and Y '{op.inputs[first + 1]}' "
            f"{_shape(y)} must have the same shape"
        )
    return x.shape[0] if x.ndim else 1


@register(
    "SquaredL2Distance",
    inputs=2,
    gradient=single_gradient("SquaredL2DistanceGradient", "I(0) I(1) GO(0)", "GI(0) GI(1)"),
)
def squared_l2_distance(op: Op) -> Kernel:
    """(X, Y) -> [N]: 0.5 · Σ (X - Y)² over each row. (Caffe2 computes (X·X + Y·Y)/2 - X·Y, the same
    value up to rounding; the difference form avoids its cancellation.)"""

    def kernel(x, y):
        n = _distance_rows(op, x, y, 0)
        diff = (x - y.astype(x.dtype)).reshape(n, -1) if n else jnp.zeros((0, 0), x.dtype)
        return jnp.asarray(0.5, x.dtype) * jnp.sum(diff * diff, axis=1)

    return kernel


@register("SquaredL2DistanceGradient", inputs=3, outputs=2)
def squared_l2_distance_gradient(op: Op) -> Kernel:
    """(X, Y, dDistance [N]) -> (dX, dY): dX = (X - Y) · dDistance[row], dY = -dX."""

    def kernel(x, y, dd):
        n = _distance_rows(op, x, y, 0)
        if dd.ndim != 1 or dd.shape[0] != n:
            raise ShapeError(f"{op.where}: dDistance '{op.inputs[2]}' must have shape [{n}], got {_shape(dd)}")
        rows = (n,) + (1,) * (x.ndim - 1) if x.ndim else ()
        dx = (x - y.astype(x.dtype)) * dd.astype(x.dtype).reshape(rows)
        return dx, -dx

    return kernel


# --------------------------------------------------------------------------------------------------
# WeightedSigmoidCrossEntropyWithLogits


def _check_weights(op: Op, weights: Any, logits: Any, position: int) -> None:
    if weights.shape != logits.shape:
        raise ShapeError(
            f"{op.where}: weights '{op.inputs[position]}' {_shape(weights)} must have the logits' shape "
            f"{_shape(logits)}"
        )


@register("WeightedSigmoidCrossEntropyWithLogits", inputs=3)
def weighted_sigmoid_cross_entropy_with_logits(op: Op) -> Kernel:
    """(logits, targets, weights) -> loss without the last dim: minus the row mean of weight · the
    sigmoid log-likelihood (SigmoidCrossEntropyWithLogits' default mode, weighted per element)."""

    def kernel(logits, targets, weights):
        _check_logits_targets(op, logits, targets, 0)
        _check_weights(op, weights, logits, 2)
        terms = _sigmoid_xent_terms("default", logits, targets.astype(logits.dtype)) * weights.astype(logits.dtype)
        if logits.ndim == 0:
            return -terms
        return -jnp.sum(terms, axis=-1) / jnp.asarray(_inner_size(op, logits, 0), logits.dtype)

    return kernel


@facet("gradient", "WeightedSigmoidCrossEntropyWithLogits")
def _weighted_sigmoid_xent_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.GO(0), g.I(0), g.I(1), g.I(2)]
    return [gradient_op("WeightedSigmoidCrossEntropyWithLogitsGradient", inputs, [g.GI(0)])]


@register("WeightedSigmoidCrossEntropyWithLogitsGradient", inputs=4)
def weighted_sigmoid_cross_entropy_with_logits_gradient(op: Op) -> Kernel:
    """(dY, logits, targets, weights) -> dlogits = -dY[row] / inner · (target - sigmoid(logit)) · weight."""

    def kernel(g, logits, targets, weights):
        _check_logits_targets(op, logits, targets, 1)
        _check_weights(op, weights, logits, 3)
        factor = _xent_gradient_factor(op, g, logits)
        slopes = _sigmoid_xent_slopes("default", logits, targets.astype(logits.dtype))
        return factor * slopes * weights.astype(logits.dtype)

    return kernel


# --------------------------------------------------------------------------------------------------
# MakeTwoClass


@register("MakeTwoClass", gradient=single_gradient("MakeTwoClassGradient", "GO(0)"))
def make_two_class(op: Op) -> Kernel:
    """X (probabilities) -> Y = X.shape + [2] holding (1 - x, x)."""

    def kernel(x):
        _check_float(op, x, 0)
        return jnp.stack([1 - x, x], axis=-1)

    return kernel


@register("MakeTwoClassGradient")
def make_two_class_gradient(op: Op) -> Kernel:
    """dY [..., 2] -> dX [...] = dY[..., 1] - dY[..., 0]."""

    def kernel(dy):
        _check_float(op, dy, 0)
        if dy.ndim < 1 or dy.shape[-1] != 2:
            raise ShapeError(f"{op.where}: dY '{op.inputs[0]}' must end with a dim of 2, got {_shape(dy)}")
        return dy[..., 1] - dy[..., 0]

    return kernel


# --------------------------------------------------------------------------------------------------
# MarginRankingCriterion / CosineEmbeddingCriterion (caffe2/operators/margin_ranking_criterion_op.cc,
# cosine_embedding_criterion_op.cc): elementwise, labels are int32 +1 / -1.


def _same_size(op: Op, x: Any, first: int, *others: tuple[Any, int]) -> None:
    for y, position in others:
        if y.size != x.size:
            raise ShapeError(
                f"{op.where}: '{op.inputs[position]}' {_shape(y)} must have as many elements as "
                f"'{op.inputs[first]}' {_shape(x)}"
            )


@register("MarginRankingCriterion", inputs=3)
def margin_ranking_criterion(op: Op) -> Kernel:
    """(X1, X2, Y) -> loss shaped like X1 = max(-Y · (X1 - X2) + margin, 0); `margin` defaults to 1."""
    margin = np.float32(op.float("margin", 1.0))

    def kernel(x1, x2, y):
        _check_float(op, x1, 0)
        _check_int(op, y, 2)
        _same_size(op, x1, 0, (x2, 1), (y, 2))
        dist = -y.reshape(x1.shape).astype(x1.dtype) * (x1 - x2.reshape(x1.shape).astype(x1.dtype)) + margin
        return jnp.maximum(dist, jnp.zeros((), x1.dtype))

    return kernel


@facet("gradient", "MarginRankingCriterion")
def _margin_ranking_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.I(0), g.I(1), g.I(2), g.GO(0)]
    return [gradient_op("MarginRankingCriterionGradient", inputs, [g.GI(0), g.GI(1)])]


@register("MarginRankingCriterionGradient", inputs=4, outputs=2)
def margin_ranking_criterion_gradient(op: Op) -> Kernel:
    """(X1, X2, Y, dLoss) -> (dX1, dX2) = (-Y · dLoss, Y · dLoss) where the margin is not met (dist >= 0),
    else 0."""
    margin = np.float32(op.float("margin", 1.0))

    def kernel(x1, x2, y, dloss):
        _check_float(op, x1, 0)
        _check_int(op, y, 2)
        _same_size(op, x1, 0, (x2, 1), (y, 2), (dloss, 3))
        yf = y.reshape(x1.shape).astype(x1.dtype)
        dist = -yf * (x1 - x2.reshape(x1.shape).astype(x1.dtype)) + margin
        live = dist >= 0
        g = dloss.reshape(x1.shape).astype(x1.dtype)
        dx1 = jnp.where(live, -yf * g, jnp.zeros((), x1.dtype))
        dx2 = jnp.where(live, yf * g, jnp.zeros((), x1.dtype))
        return dx1, dx2.reshape(x2.shape)

    return kernel


@register(
    "CosineEmbeddingCriterion",
    inputs=2,
    gradient=single_gradient("CosineEmbeddingCriterionGradient", "I(0) I(1) GO(0)"),
)
def cosine_embedding_criterion(op: Op) -> Kernel:
    """(S, Y) -> loss shaped like S: 1 - s where y == 1, else max(0, s - margin); `margin` defaults to 0."""
    margin = np.float32(op.float("margin", 0.0))

    def kernel(s, y):
        _check_float(op, s, 0)
        _check_int(op, y, 1)
        _same_size(op, s, 0, (y, 1))
        positive = y.reshape(s.shape) == 1
        return jnp.where(positive, 1 - s, jnp.maximum(jnp.zeros((), s.dtype), s - margin))

    return kernel


@register("CosineEmbeddingCriterionGradient", inputs=3)
def cosine_embedding_criterion_gradient(op: Op) -> Kernel:
    """(S, Y, dLoss) -> dS = dLoss · (-1 where y == 1, else [s >= margin])."""
    margin = np.float32(op.float("margin", 0.0))

    def kernel(s, y, dloss):
        _check_float(op, s, 0)
        _check_int(op, y, 1)
        _same_size(op, s, 0, (y, 1), (dloss, 2))
        positive = y.reshape(s.shape) == 1
        slope = jnp.where(positive, -jnp.ones((), s.dtype), (s >= margin).astype(s.dtype))
        return dloss.reshape(s.shape).astype(s.dtype) * slope

    return kernel


# --------------------------------------------------------------------------------------------------
# PairWiseLoss (caffe2/operators/rank_loss_op.cc): within each session (lengths), the mean over pairs
# with different labels of log(1 + exp(sign · (X[j] - X[i]))), sign = +1 where label[i] > label[j].


runtime_checked("PairWiseLoss", "PairWiseLossGradient")
_EPSILON32 = float(np.finfo(np.float32).eps)
_MIN_LOG_DIFF = float(np.log(np.float32(np.finfo(np.float32).eps)))


def _log_logit(x: Any) -> Any:
    """Caffe2's logLogit: log(1 + exp(x)), 0 below log(eps) and x above -log(eps)."""
    middle = jnp.log(jnp.exp(jnp.clip(x, _MIN_LOG_DIFF, -_MIN_LOG_DIFF)) + 1)
    return jnp.where(x < _MIN_LOG_DIFF, jnp.zeros((), x.dtype), jnp.where(x > -_MIN_LOG_DIFF, x, middle))


def _pairwise_setup(op: Op, x: Any, label: Any, lengths: Any) -> tuple[Any, Any, Any, Any, int]:
    """(scores [N], label [N], pair mask [N, N] (i, j), sign [N, N], sessions) for the N > 0 case."""
    n = x.shape[0]
    _check_float(op, x, 0)
    if x.size != n:
        raise ShapeError(f"{op.where}: X '{op.inputs[0]}' {_shape(x)} must hold one score per row (N x 1)")
    if not (label.ndim == 1 or (label.ndim == 2 and label.shape[1] == 1)) or label.shape[0] != n:
        raise ShapeError(f"{op.where}: label '{op.inputs[1]}' must have shape [{n}] or [{n}, 1], got {_shape(label)}")
    _check_float(op, label, 1)
    t = label.reshape(n).astype(x.dtype)
    if lengths is None:
        session = jnp.zeros((n,), jnp.int32)
        sessions = 1
    else:
        if lengths.ndim != 1 or lengths.dtype != jnp.int32:
            raise ShapeError(
                f"{op.where}: lengths '{op.inputs[2]}' must be a 1-D int32 tensor, got {lengths.dtype}{_shape(lengths)}"
            )
        sessions = lengths.shape[0]
        ends = jnp.cumsum(lengths)
        runtime_check(
            (ends[-1] if sessions else jnp.zeros((), jnp.int32)) == n,
            f"{literal(op.where)}: lengths '{literal(op.inputs[2])}' sum to {{total}}, not the {n} rows of X",
            total=ends[-1] if sessions else jnp.zeros((), jnp.int32),
        )
        session = jnp.searchsorted(ends, jnp.arange(n), side="right").astype(jnp.int32)
    rows = jnp.arange(n)
    diff = t[:, None] - t[None, :]
    mask = (rows[None, :] < rows[:, None]) & (session[:, None] == session[None, :]) & (jnp.abs(diff) >= _EPSILON32)
    sign = jnp.where(t[:, None] > t[None, :], jnp.ones((), x.dtype), -jnp.ones((), x.dtype))
    return x.reshape(n), session, mask, sign, sessions


@register("PairWiseLoss", inputs=(2, 3))
def pair_wise_loss(op: Op) -> Kernel:
    """(X [N] or [N, 1], label [N] float[, lengths]) -> Y [sessions] (one session without lengths; [0]
    when N is 0)."""

    def kernel(x, label, lengths=None):
        n = x.shape[0] if x.ndim else 0
        if n == 0:
            return jnp.zeros((0,), x.dtype)
        scores, session, mask, sign, sessions = _pairwise_setup(op, x, label, lengths)
        terms = jnp.where(mask, _log_logit(sign * (scores[None, :] - scores[:, None])), jnp.zeros((), x.dtype))
        per_row = jnp.sum(terms, axis=1)
        pairs_row = jnp.sum(mask, axis=1)
        one_hot = session[None, :] == jnp.arange(sessions)[:, None]
        total = jnp.sum(jnp.where(one_hot, per_row[None, :], 0), axis=1)
        pairs = jnp.sum(jnp.where(one_hot, pairs_row[None, :], 0), axis=1)
        return jnp.where(pairs > 0, total / jnp.maximum(pairs, 1).astype(x.dtype), total)

    return kernel


@facet("gradient", "PairWiseLoss")
def _pair_wise_loss_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.I(0), g.I(1), g.GO(0)]
    if len(g.op.input) == 3:
        inputs.append(g.I(2))
    return [gradient_op("PairWiseLossGradient", inputs, [g.GI(0)])]


@register("PairWiseLossGradient", inputs=(3, 4))
def pair_wise_loss_gradient(op: Op) -> Kernel:
    """(X, label, dY[, lengths]) -> dX: for each pair, g = sign · dY / (1 + exp(-sign · (X[j] - X[i])))
    is taken from dX[i] and added to dX[j]; each session's dX is divided by its number of pairs."""

    def kernel(x, label, dy, lengths=None):
        n = x.shape[0] if x.ndim else 0
        if x.size != n:
            raise ShapeError(f"{op.where}: X '{op.inputs[0]}' {_shape(x)} must hold one score per row")
        if n == 0:
            return jnp.zeros(x.shape, x.dtype)
        scores, session, mask, sign, sessions = _pairwise_setup(op, x, label, lengths)
        if dy.ndim != 1 or dy.shape[0] != sessions:
            raise ShapeError(f"{op.where}: dY '{op.inputs[2]}' must have shape [{sessions}], got {_shape(dy)}")
        g_session = dy.astype(x.dtype)[session]
        grad = sign * g_session[:, None] / (1 + jnp.exp(-sign * (scores[None, :] - scores[:, None])))
        grad = jnp.where(mask, grad, jnp.zeros((), x.dtype))
        dx = jnp.sum(grad, axis=0) - jnp.sum(grad, axis=1)
        one_hot = session[None, :] == jnp.arange(sessions)[:, None]
        pairs = jnp.sum(jnp.where(one_hot, jnp.sum(mask, axis=1)[None, :], 0), axis=1)[session]
        dx = jnp.where(pairs > 0, dx / jnp.maximum(pairs, 1).astype(x.dtype), dx)
        return dx.reshape(x.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# BernoulliJSD (caffe2/operators/jsd_op.cc)


def _entropy(p: Any) -> Any:
    q = 1 - p
    safe = jnp.clip(p, LOG_THRESHOLD, 1 - LOG_THRESHOLD)
    value = -safe * jnp.log(safe) - (1 - safe) * jnp.log(1 - safe)
    return jnp.where((p < LOG_THRESHOLD) | (q < LOG_THRESHOLD), jnp.zeros((), p.dtype), value)


def _logit(p: Any) -> Any:
    x = jnp.minimum(jnp.maximum(p, jnp.asarray(LOG_THRESHOLD, p.dtype)), 1 - jnp.asarray(LOG_THRESHOLD, p.dtype))
    return -jnp.log(1 / x - 1)


@register("BernoulliJSD", inputs=2, gradient=single_gradient("BernoulliJSDGradient", "GO(0) I(0) I(1)"))
def bernoulli_jsd(op: Op) -> Kernel:
    """(X, T) probabilities -> L shaped like X: H((x + t) / 2) - (H(x) + H(t)) / 2, H the Bernoulli entropy."""

    def kernel(x, t):
        _check_float(op, x, 0)
        _same_size(op, x, 0, (t, 1))
        t = t.reshape(x.shape).astype(x.dtype)
        avg = (x + t) / 2
        return _entropy(avg) - (_entropy(x) + _entropy(t)) / 2

    return kernel


@register("BernoulliJSDGradient", inputs=3)
def bernoulli_jsd_gradient(op: Op) -> Kernel:
    """(dL, X, T) -> dX = dL · (logit(x) - logit((x + t) / 2)) / 2."""

    def kernel(g, x, t):
        _check_float(op, x, 1)
        _same_size(op, x, 1, (t, 2), (g, 0))
        t = t.reshape(x.shape).astype(x.dtype)
        avg = (x + t) / 2
        return g.reshape(x.shape).astype(x.dtype) * ((_logit(x) - _logit(avg)) / 2)

    return kernel


# --------------------------------------------------------------------------------------------------
# SpatialSoftmaxWithLoss (caffe2/operators/spatial_softmax_with_loss_op.cc): softmax over the channels
# of X [N, D, H, W]; labels [N, H, W] with -1 meaning "don't care"; optional weights per pixel.

_DONT_CARE = -1
runtime_checked("SpatialSoftmaxWithLoss")


def _spatial_setup(op: Op, x: Any, t: Any, w: Any) -> tuple[Any, Any, Any]:
    """(labels clamped to [0, D), care mask, weights), all [N, H, W]."""
    _check_float(op, x, 0)
    if x.ndim != 4:
        raise ShapeError(f"{op.where}: logits '{op.inputs[0]}' must be 4-D (N, D, H, W), got {_shape(x)}")
    _check_int(op, t, 1)
    n, d, h, wd = x.shape
    if t.ndim != 3 or t.shape[0] != n or t.size != n * h * wd:
        raise ShapeError(f"{op.where}: labels '{op.inputs[1]}' must have shape [{n}, {h}, {wd}], got {_shape(t)}")
    t = t.reshape(n, h, wd)
    care = t != _DONT_CARE
    weights = jnp.ones((n, h, wd), x.dtype)
    if w is not None:
        if w.size != n * h * wd:
            raise ShapeError(f"{op.where}: weights '{op.inputs[2]}' must hold {n * h * wd} values, got {_shape(w)}")
        weights = w.reshape(n, h, wd).astype(x.dtype)
    return jnp.clip(t, 0, max(d - 1, 0)), care, weights


@register("SpatialSoftmaxWithLoss", inputs=(2, 3), outputs=2)
def spatial_softmax_with_loss(op: Op) -> Kernel:
    """(X, labels[, weights]) -> (P softmax over D, loss = Σ w · -log max(P[label], 1e-20) / Σ w over
    the cared-for pixels; 0 when the weights sum to 0)."""

    def kernel(x, t, w=None):
        labels, care, weights = _spatial_setup(op, x, t, w)
        d = x.shape[1]
        bad = care & ((t.reshape(labels.shape) < 0) | (t.reshape(labels.shape) >= d))
        runtime_check(
            ~jnp.any(bad),
            f"{literal(op.where)}: labels '{literal(op.inputs[1])}' hold {{bad}}, outside [0, {d}) and not -1",
            bad=first_bad(t.reshape(labels.shape), bad),
        )
        shifted = x - jnp.max(x, axis=1, keepdims=True) if x.size else x
        e = jnp.exp(shifted)
        p = e / jnp.sum(e, axis=1, keepdims=True)
        picked = jnp.take_along_axis(p, labels[:, None], axis=1)[:, 0] if d else jnp.ones(labels.shape, x.dtype)
        losses = -jnp.log(jnp.maximum(picked, jnp.asarray(LOG_THRESHOLD, x.dtype))) * weights
        zero = jnp.zeros((), x.dtype)
        total_weight = jnp.sum(jnp.where(care, weights, zero))
        loss_sum = jnp.sum(jnp.where(care, losses, zero))
        safe = jnp.where(total_weight != 0, total_weight, jnp.ones((), x.dtype))
        return p, jnp.where(total_weight != 0, loss_sum / safe, zero)

    return kernel


@facet("gradient", "SpatialSoftmaxWithLoss")
def _spatial_softmax_with_loss_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.I(0), g.I(1), g.O(0), g.GO(1)]
    if len(g.op.input) == 3:
        inputs.insert(2, g.I(2))
    return [gradient_op("SpatialSoftmaxWithLossGradient", inputs, [g.GI(0)])]


@register("SpatialSoftmaxWithLossGradient", inputs=(4, 5))
def spatial_softmax_with_loss_gradient(op: Op) -> Kernel:
    """(X, labels[, weights], P, dLoss) -> dX = (P - onehot(label)) · w, zero at don't-care pixels,
    times scale / Σ w when that is positive, times dLoss."""
    scale = np.float32(op.float("scale", 1.0))

    def kernel(x, t, *rest):
        w, p, dloss = rest if len(rest) == 3 else (None, *rest)
        labels, care, weights = _spatial_setup(op, x, t, w)
        if p.shape != x.shape:
            raise ShapeError(f"{op.where}: P '{op.inputs[-2]}' {_shape(p)} must have the logits' shape {_shape(x)}")
        if dloss.size < 1:
            raise ShapeError(f"{op.where}: dLoss '{op.inputs[-1]}' is empty")
        d = x.shape[1]
        one_hot = (jnp.arange(d)[None, :, None, None] == labels[:, None]).astype(p.dtype)
        grad = (p - one_hot) * weights[:, None]
        zero = jnp.zeros((), p.dtype)
        grad = jnp.where(care[:, None], grad, zero)
        total = jnp.sum(jnp.where(care, weights, zero))
        safe = jnp.where(total > 0, total, jnp.ones((), p.dtype))
        grad = jnp.where(total > 0, grad * (scale / safe), grad)
        return grad * dloss.reshape(-1)[0].astype(p.dtype)

    return kernel


# --------------------------------------------------------------------------------------------------
# Metrics: Accuracy, MultiClassAccuracy, Perplexity (no gradient)


def _predictions(op: Op, x: Any, label: Any) -> tuple[int, int, Any]:
    _check_float(op, x, 0)
    if x.ndim != 2:
        raise ShapeError(f"{op.where}: predictions '{op.inputs[0]}' must be 2-D (N, D), got {_shape(x)}")
    _check_int(op, label, 1)
    n, d = x.shape
    if label.ndim != 1 or label.shape[0] != n:
        raise ShapeError(f"{op.where}: labels '{op.inputs[1]}' must have shape [{n}], got {_shape(label)}")
    return n, d, label


@register("Accuracy", inputs=2, gradient=should_not_do_gradient)
def accuracy(op: Op) -> Kernel:
    """(X [N, D], label [N]) -> 0-d float: the share of rows whose label is among the `top_k` (1) best
    scores, ties going to the lower class index; NaN for N = 0 (Caffe2 divides 0 by 0)."""
    top_k = op.int("top_k", 1)

    def kernel(x, label):
        n, d, label = _predictions(op, x, label)
        if d == 0:
            correct = jnp.zeros((), jnp.int32)
        else:
            safe = jnp.clip(label, 0, d - 1)
            target = jnp.take_along_axis(x, safe[:, None], axis=1)
            cols = jnp.arange(d)[None, :]
            ahead = (x > target) | ((x == target) & (cols < safe[:, None]))
            hit = (1 + jnp.sum(ahead, axis=1) <= top_k) & (label >= 0) & (label < d)
            correct = jnp.sum(hit.astype(jnp.int32))
        return (correct.astype(jnp.float32) / jnp.float32(n)).astype(jnp.float32)

    return kernel


@register("MultiClassAccuracy", inputs=2, outputs=2, gradient=should_not_do_gradient)
def multi_class_accuracy(op: Op) -> Kernel:
    """(X [N, D], label [N]) -> (accuracies [D] float, amounts [D] int32): per class, the share of its
    rows whose first highest score is the class (0 for a class with no rows), and its row count."""

    def kernel(x, label):
        # Caffe2 only DCHECKs the labels' shape: it reads the first N labels of any int32 tensor.
        if label.ndim != 1 and label.size >= x.shape[0] if x.ndim else False:
            label = label.reshape(-1)
        if label.ndim == 1 and x.ndim == 2 and label.shape[0] > x.shape[0]:
            label = label[: x.shape[0]]
        n, d, label = _predictions(op, x, label)
        if n == 0 or d == 0:
            return jnp.zeros((d,), jnp.float32), jnp.zeros((d,), jnp.int32)
        best = jnp.argmax(x, axis=1)
        classes = jnp.arange(d)[:, None] == label[None, :]
        amounts = jnp.sum(classes, axis=1).astype(jnp.int32)
        hits = jnp.sum(classes & (best == label)[None, :], axis=1).astype(jnp.float32)
        return jnp.where(amounts > 0, hits / jnp.maximum(amounts, 1).astype(jnp.float32), hits), amounts

    return kernel


@register("Perplexity", gradient=should_not_do_gradient)
def perplexity(op: Op) -> Kernel:
    """X [N] probabilities -> 0-d Π x^(-1/N) (1 for N = 0). Caffe2 takes N = dim(0) and reads the first N
    elements of a tensor of higher rank; so does this."""

    def kernel(x):
        _check_float(op, x, 0)
        if x.ndim == 0:
            raise ShapeError(f"{op.where}: probabilities '{op.inputs[0]}' must be 1-D, got a scalar")
        n = x.shape[0]
        if n == 0:
            return jnp.ones((), x.dtype)
        first = x.reshape(-1)[:n]
        return jnp.prod(jnp.power(first, jnp.asarray(-1.0 / n, x.dtype)))

    return kernel
