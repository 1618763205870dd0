"""The loss family (rnn2jax/ops/loss.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: Loss ops and their gradient ops against NumPy references written from
Caffe2's CPU kernels (cross_entropy_op.cc, softmax_with_loss_op.cc, distance_op.cc, loss_op.h), and each gradient op
against `jax.vjp` of its forward op where Caffe2's gradient is the exact derivative.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the loss ops
(AveragedLoss, CrossEntropy, LabelCrossEntropy, the sigmoid cross entropies, SoftmaxWithLoss,
SpatialSoftmaxWithLoss, SquaredL2Distance, the ranking criteria, PairWiseLoss, BernoulliJSD, MakeTwoClass), their
gradients, and the metrics (Accuracy, MultiClassAccuracy, Perplexity) against real Caffe2.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, cases, dims, invalid, run_case, run_rnn2jax, shapes
from helpers import run_op
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_loss.py)

THRESHOLD = 1e-20  # Caffe2's kLOG_THRESHOLD
F32 = {"rtol": 1e-5, "atol": 1e-6}
fewer_examples = settings(max_examples=max(1, settings().max_examples // 2))


def floats(shape, low=-5.0, high=5.0) -> st.SearchStrategy[np.ndarray]:
    elements = st.floats(low, high, width=32, allow_subnormal=False)
    return hnp.arrays(np.float32, shape, elements=elements)


def forward(op_type: str, n_inputs: int, n_outputs: int = 1, **args):
    """The forward op as a JAX function of its inputs (for `jax.vjp`), returning its outputs."""
    ins, outs = [f"x{i}" for i in range(n_inputs)], [f"y{i}" for i in range(n_outputs)]
    lowered = lower(load(create_net("f", [create_operator(op_type, ins, outs, **args)])))
    return lambda *arrays: tuple(lowered(dict(zip(ins, arrays, strict=True)))[n] for n in outs)


def check_vjp(jit: bool, got, fn, primals, cotangents) -> None:
    """`got` must equal `jax.vjp` of `fn` (a function of `primals` returning one array). The reference
    does not depend on how the gradient op ran, so it is computed once per example, in the jit run."""
    if not jit:
        return

    def grads(primals, cotangents):
        return jax.vjp(fn, *primals)[1](*cotangents)

    for g, r in zip(got, jax.jit(grads)(primals, cotangents), strict=True):
        np.testing.assert_allclose(g, np.asarray(r), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# AveragedLoss


loss_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


@given(x=floats(loss_shapes), dloss=st.floats(-3, 3, width=32))
def test_averaged_loss_and_gradient(jit, x, dloss):
    (loss,) = run_op("AveragedLoss", [x], jit=jit)
    assert loss.shape == ()
    np.testing.assert_allclose(loss, x.astype(np.float64).mean(), **F32)
    dl = np.float32(dloss)
    (dx,) = run_op("AveragedLossGradient", [x, dl], jit=jit)
    np.testing.assert_allclose(dx, np.full(x.shape, dloss / x.size), **F32)
    check_vjp(jit, [dx], lambda a: forward("AveragedLoss", 1)(a)[0], [x], [dl])


def test_averaged_loss_edge_cases(jit):
    (loss,) = run_op("AveragedLoss", [np.zeros((0, 3), np.float32)], jit=jit)
    assert loss == 0
    x = np.ones((2, 5), np.float32)
    (dx,) = run_op("AveragedLossGradient", [x], jit=jit)  # pre-2017 form: dLoss is 1
    np.testing.assert_allclose(dx, np.full((2, 5), 0.1), **F32)
    (dx,) = run_op("AveragedLossGradient", [x, np.array([2.0], np.float32)], jit=jit)
    np.testing.assert_allclose(dx, np.full((2, 5), 0.2), **F32)
    with pytest.raises(ShapeError, match="dLoss 'x1' must hold one element"):
        run_op("AveragedLossGradient", [x, np.ones(2, np.float32)], jit=jit)
    with pytest.raises(ShapeError, match="must be a float tensor"):
        run_op("AveragedLoss", [np.ones(3, np.int32)], jit=jit)


# --------------------------------------------------------------------------------------------------
# LabelCrossEntropy / CrossEntropy


@st.composite
def probability_batches(draw, zeros: bool = True):
    """X as N rows of D probabilities (1-D: one row; 3-D: rows of size_from_dim(1)); 0 tests the clamp."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    elements = st.floats(0.125, 1, width=32)
    x = draw(hnp.arrays(np.float32, shape, elements=st.just(0.0) | elements if zeros else elements))
    n, d = (1, shape[0]) if rank == 1 else (shape[0], math.prod(shape[1:]))
    return x, n, d


@given(case=probability_batches(), column=st.booleans(), data=st.data())
def test_label_cross_entropy_and_gradient(jit, case, column, data):
    x, n, d = case
    labels = data.draw(hnp.arrays(np.int32, (n,), elements=st.integers(0, d - 1)))
    label_blob = labels.reshape(n, 1) if column else labels
    rows = x.reshape(n, d).astype(np.float64)
    picked = np.maximum(rows[np.arange(n), labels], THRESHOLD)
    (y,) = run_op("LabelCrossEntropy", [x, label_blob], jit=jit)
    np.testing.assert_allclose(y, -np.log(picked), **F32)
    dy = data.draw(floats((n,)))
    (dx,) = run_op("LabelCrossEntropyGradient", [x, label_blob, dy], jit=jit)
    expected = np.zeros((n, d))
    expected[np.arange(n), labels] = -dy / picked
    np.testing.assert_allclose(dx, expected.reshape(x.shape), rtol=1e-5, atol=1e-6)


@given(case=probability_batches(zeros=False), data=st.data())
def test_label_cross_entropy_gradient_is_the_vjp_above_the_clamp(jit, case, data):
    x, n, d = case
    labels = data.draw(hnp.arrays(np.int32, (n,), elements=st.integers(0, d - 1)))
    dy = data.draw(floats((n,)))
    (dx,) = run_op("LabelCrossEntropyGradient", [x, labels, dy], jit=jit)
    check_vjp(jit, [dx], lambda a: forward("LabelCrossEntropy", 2)(a, labels)[0], [x], [dy])


@pytest.mark.parametrize(
    ("op_type", "inputs", "match"),
    [
        ("LabelCrossEntropy", [np.ones((2, 3)), np.zeros(3, np.int32)], r"shape \[2\] or \[2, 1\]"),
        ("LabelCrossEntropy", [np.ones((2, 3)), np.zeros((2, 2), np.int32)], r"shape \[2\] or \[2, 1\]"),
        ("LabelCrossEntropy", [np.ones((2, 3)), np.zeros(2, np.float32)], "integer tensor"),
        ("LabelCrossEntropy", [np.float32(1), np.zeros(1, np.int32)], "rank >= 1"),
        (
            "LabelCrossEntropyGradient",
            [np.ones((2, 3)), np.zeros(2, np.int32), np.ones(3)],
            r"dY 'x2'.*\[2\]",
        ),
        ("CrossEntropy", [np.ones((2, 3)), np.ones((2, 2))], r"label 'x1' must have shape \[2, 3\]"),
        ("CrossEntropy", [np.ones((2, 3)), np.ones(2)], r"label 'x1' must have shape \[2, 3\]"),
        ("CrossEntropyGradient", [np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 1))], r"dY 'x2'.*\[2\]"),
    ],
)
def test_cross_entropy_errors(jit, op_type, inputs, match):
    inputs = [a.astype(np.float32) if a.dtype == np.float64 else a for a in map(np.asarray, inputs)]
    with pytest.raises(ShapeError, match=match):
        run_op(op_type, inputs, jit=jit)


def test_label_cross_entropy_clamps_out_of_range_labels(jit):
    """Caffe2 rejects such labels; unknown while tracing, they are clamped to the nearest class."""
    x = np.array([[0.2, 0.8], [0.6, 0.4]], np.float32)
    (y,) = run_op("LabelCrossEntropy", [x, np.array([5, -1], np.int32)], jit=jit)
    np.testing.assert_allclose(y, -np.log([0.8, 0.6]), **F32)


@given(case=probability_batches(), data=st.data())
def test_cross_entropy_and_gradient(jit, case, data):
    x, n, d = case
    labels = data.draw(hnp.arrays(np.float32, (n, d), elements=st.floats(0, 1, width=32)))
    label_blob = labels.reshape(n) if d == 1 and data.draw(st.booleans()) else labels
    clamped = np.maximum(x.reshape(n, d).astype(np.float64), THRESHOLD)
    (y,) = run_op("CrossEntropy", [x, label_blob], jit=jit)
    np.testing.assert_allclose(y, -(labels * np.log(clamped)).sum(axis=1), rtol=1e-5, atol=1e-5)
    dy = data.draw(floats((n,)))
    (dx,) = run_op("CrossEntropyGradient", [x, label_blob, dy], jit=jit)
    expected = -dy[:, None] * labels / clamped
    np.testing.assert_allclose(dx, expected.reshape(x.shape), rtol=1e-5, atol=1e-5)


@given(case=probability_batches(zeros=False), data=st.data())
def test_cross_entropy_gradient_is_the_vjp_above_the_clamp(jit, case, data):
    x, n, d = case
    labels = data.draw(hnp.arrays(np.float32, (n, d), elements=st.floats(0, 1, width=32)))
    dy = data.draw(floats((n,)))
    (dx,) = run_op("CrossEntropyGradient", [x, labels, dy], jit=jit)
    check_vjp(jit, [dx], lambda a: forward("CrossEntropy", 2)(a, labels)[0], [x], [dy])


# --------------------------------------------------------------------------------------------------
# SigmoidCrossEntropyWithLogits


def sigmoid_xent_reference(logits, targets, mode):
    """Caffe2's formulas in float64: minus the row mean (over the last dim) of the per-element terms."""
    x, t = logits.astype(np.float64), targets.astype(np.float64)
    pos = (x >= 0).astype(np.float64)
    softplus_neg_abs = np.log(1 + np.exp(x - 2 * x * pos))
    if mode == "log_D_trick":
        terms = (2 * t - 1) * (x - (x * pos + softplus_neg_abs))
    elif mode == "unjoined_lr_loss":
        terms = x * t + (t - 1) * x * pos - (1 - t) * softplus_neg_abs
    else:
        terms = x * (t - pos) - softplus_neg_abs
    return -terms.mean(axis=-1) if x.ndim else -terms


def sigmoid_xent_gradient_reference(g, logits, targets, mode):
    x, t = logits.astype(np.float64), targets.astype(np.float64)
    if mode == "log_D_trick":
        slope = (2 * t - 1) / (1 + np.exp(x))
    elif mode == "unjoined_lr_loss":
        slope = t - (1 - t) / (1 + np.exp(-x))
    else:
        slope = t - 1 / (1 + np.exp(-x))
    inner = x.shape[-1] if x.ndim else 1
    factor = -np.asarray(g, np.float64).reshape(*x.shape[:-1], 1) / inner if x.ndim else -g
    return factor * slope


MODES = ["default", "log_D_trick", "unjoined_lr_loss"]


@fewer_examples
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3),
    mode=st.sampled_from(MODES),
    data=st.data(),
)
def test_sigmoid_cross_entropy_with_logits_and_gradient(jit, shape, mode, data):
    logits = data.draw(floats(shape, -20, 20))
    targets = data.draw(hnp.arrays(np.float32, shape, elements=st.sampled_from([0.0, 1.0, 0.25])))
    args = {} if mode == "default" else {mode: 1}
    (y,) = run_op("SigmoidCrossEntropyWithLogits", [logits, targets], jit=jit, **args)
    assert y.shape == shape[:-1]
    np.testing.assert_allclose(y, sigmoid_xent_reference(logits, targets, mode), rtol=1e-5, atol=1e-5)
    g = data.draw(floats(shape[:-1]))
    (dx,) = run_op("SigmoidCrossEntropyWithLogitsGradient", [g, logits, targets], jit=jit, **args)
    expected = sigmoid_xent_gradient_reference(g, logits, targets, mode)
    np.testing.assert_allclose(dx, expected, rtol=1e-5, atol=1e-6)
    if mode != "log_D_trick":  # the trick's gradient is deliberately not the derivative
        fwd = forward("SigmoidCrossEntropyWithLogits", 2, **args)
        check_vjp(jit, [dx], lambda a: fwd(a, targets)[0], [logits], [g])


def test_sigmoid_cross_entropy_errors(jit):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(BadArgumentError, match="cannot both be set"):
        run_op("SigmoidCrossEntropyWithLogits", [x, x], jit=jit, log_D_trick=1, unjoined_lr_loss=1)
    with pytest.raises(ShapeError, match="must have the same shape"):
        run_op("SigmoidCrossEntropyWithLogits", [x, np.zeros((3, 2), np.float32)], jit=jit)
    with pytest.raises(ShapeError, match=r"dY 'x0' has 3 values for 2 rows"):
        run_op("SigmoidCrossEntropyWithLogitsGradient", [np.zeros(3, np.float32), x, x], jit=jit)


# --------------------------------------------------------------------------------------------------
# SoftmaxWithLoss


@st.composite
def softmax_loss_cases(draw):
    """(logits, axis, N, D, labels blob, label indices or probabilities, weights or None, args)."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1)) if rank > 1 else 0
    k = axis % rank
    n, d = math.prod(shape[:k]), math.prod(shape[k:])
    x = draw(floats(shape, -10, 10))
    label_prob = draw(st.booleans()) and k >= 1 and rank >= 2
    args = {"axis": axis}
    if draw(st.booleans()):
        args["scale"] = draw(st.floats(0, 4, width=32))
    if label_prob:
        args["label_prob"] = 1
        raw = draw(hnp.arrays(np.float32, (n, d), elements=st.floats(0.125, 1, width=32)))
        labels = (raw / raw.sum(axis=1, keepdims=True)).astype(np.float32)
        blob = labels.reshape(shape)
    else:
        labels = draw(hnp.arrays(np.int32, (n,), elements=st.integers(0, d - 1)))
        blob = labels.reshape(shape[:k] + (1,) * draw(st.integers(0, 1)))
    weights = draw(st.none() | floats((n,), 0.125, 2))
    return x, n, d, blob, labels, weights, label_prob, args


def softmax_loss_reference(x, n, d, labels, weights, label_prob, scale):
    rows = x.reshape(n, d).astype(np.float64)
    logp = rows - rows.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    p = np.exp(logp)
    w = np.ones(n) if weights is None else weights.astype(np.float64)
    if label_prob:
        losses = -(np.log(np.maximum(p, THRESHOLD)) * labels).sum(axis=1)
        target = labels
    else:
        losses = -logp[np.arange(n), labels]
        target = np.eye(d)[labels]
    loss = (losses * w).sum() * scale / w.sum()
    grad = (p - target) * w[:, None] * scale / w.sum()
    return p.reshape(x.shape), loss, grad.reshape(x.shape)


@fewer_examples
@given(case=softmax_loss_cases(), dloss=st.floats(-2, 2, width=32))
def test_softmax_with_loss_and_gradient(jit, case, dloss):
    x, n, d, blob, labels, weights, label_prob, args = case
    scale = args.get("scale", 1.0)
    p_ref, loss_ref, grad_ref = softmax_loss_reference(x, n, d, labels, weights, label_prob, scale)
    extra = [] if weights is None else [weights]
    p, loss = run_op("SoftmaxWithLoss", [x, blob, *extra], 2, jit=jit, **args)
    np.testing.assert_allclose(p, p_ref, rtol=1e-5, atol=1e-6)
    assert loss.shape == ()
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-4, atol=1e-5)
    dl = np.array(dloss, np.float32)
    (dx,) = run_op("SoftmaxWithLossGradient", [x, blob, *extra, p, dl], jit=jit, **args)
    np.testing.assert_allclose(dx, grad_ref * dloss, rtol=1e-4, atol=1e-5)
    fwd = forward("SoftmaxWithLoss", 2 + len(extra), 2, **args)
    check_vjp(jit, [dx], lambda a: fwd(a, blob, *extra)[1], [x], [dl])


def test_softmax_with_loss_zero_weights(jit):
    """Weights summing to 0: the loss is 0 and the gradient is left unscaled."""
    x = np.array([[1.0, 2.0, 0.5]], np.float32)
    labels, weights = np.array([1], np.int32), np.zeros(1, np.float32)
    p, loss = run_op("SoftmaxWithLoss", [x, labels, weights], 2, jit=jit, scale=3.0)
    assert loss == 0
    (dx,) = run_op("SoftmaxWithLossGradient", [x, labels, weights, p, np.float32(5)], jit=jit, scale=3.0)
    np.testing.assert_array_equal(dx, np.zeros_like(x))


@pytest.mark.parametrize(
    ("args", "labels", "error", "match"),
    [
        ({"scale": -1.0}, np.zeros(2, np.int32), BadArgumentError, "'scale' = -1.0 must be >= 0"),
        ({"order": "NHWC"}, np.zeros(2, np.int32), BadArgumentError, "only NCHW"),
        ({}, np.zeros(3, np.int32), ShapeError, "one class index per row"),
        ({}, np.zeros((2, 2), np.int32), ShapeError, "one class index per row"),
        ({}, np.zeros(2, np.float32), ShapeError, "integer tensor"),
        ({"label_prob": 1}, np.zeros((2, 2), np.float32), ShapeError, "logits' shape"),
        ({"axis": 2}, np.zeros(2, np.int32), ShapeError, "out of range"),
    ],
)
def test_softmax_with_loss_errors(jit, args, labels, error, match):
    with pytest.raises(error, match=match):
        run_op("SoftmaxWithLoss", [np.zeros((2, 3), np.float32), labels], 2, jit=jit, **args)


def test_softmax_with_loss_gradient_errors(jit):
    x, labels = np.zeros((2, 3), np.float32), np.zeros(2, np.int32)
    with pytest.raises(ShapeError, match="softmax 'x2'"):
        run_op("SoftmaxWithLossGradient", [x, labels, np.zeros((3, 2), np.float32), np.float32(1)], jit=jit)
    with pytest.raises(ShapeError, match="weights 'x2' must hold 2 values"):
        run_op("SoftmaxWithLoss", [x, labels, np.ones(3, np.float32)], 2, jit=jit)


# --------------------------------------------------------------------------------------------------
# SquaredL2Distance


@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4), data=st.data())
def test_squared_l2_distance_and_gradient(jit, shape, data):
    x, y = data.draw(floats(shape)), data.draw(floats(shape))
    n = shape[0] if shape else 1
    diff = (x.astype(np.float64) - y).reshape(n, -1)
    (dist,) = run_op("SquaredL2Distance", [x, y], jit=jit)
    assert dist.shape == (n,)
    np.testing.assert_allclose(dist, 0.5 * (diff**2).sum(axis=1), rtol=1e-5, atol=1e-5)
    dd = data.draw(floats((n,)))
    dx, dy = run_op("SquaredL2DistanceGradient", [x, y, dd], 2, jit=jit)
    expected = (diff * dd[:, None]).reshape(shape)
    np.testing.assert_allclose(dx, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dy, -expected, rtol=1e-5, atol=1e-5)
    fwd = forward("SquaredL2Distance", 2)
    check_vjp(jit, [dx, dy], lambda a, b: fwd(a, b)[0], [x, y], [dd])


def test_squared_l2_distance_errors(jit):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match="must have the same shape"):
        run_op("SquaredL2Distance", [x, np.zeros((2, 2), np.float32)], jit=jit)
    with pytest.raises(ShapeError, match=r"dDistance 'x2' must have shape \[2\]"):
        run_op("SquaredL2DistanceGradient", [x, x, np.zeros(3, np.float32)], 2, jit=jit)


# --------------------------------------------------------------------------------------------------
# Ranking losses and metrics: loops written from rank_loss_op.cc and accuracy_op.cc


def pair_wise_reference(x, label, lengths):
    """PairWiseLossOp: per session, the mean over pairs j < i with different labels of logLogit."""
    eps = np.finfo(np.float32).eps
    min_log = np.log(eps)

    def log_logit(v):
        return 0.0 if v < min_log else v if v > -min_log else np.log(np.exp(v) + 1)

    out, offset = [], 0
    for length in lengths:
        total, pairs = 0.0, 0
        for i in range(offset, offset + length):
            for j in range(offset, i):
                if abs(label[i] - label[j]) < eps:
                    continue
                pairs += 1
                sign = 1 if label[i] > label[j] else -1
                total += log_logit(sign * (x[j] - x[i]))
        out.append(total / pairs if pairs else total)
        offset += length
    return np.array(out, np.float32)


@st.composite
def pair_wise_cases(draw):
    lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    n = sum(lengths)
    x = draw(floats((n,), -20, 20))
    label = draw(hnp.arrays(np.float32, (n,), elements=st.sampled_from([0.0, 1.0, 2.0])))
    return x, label, np.array(lengths, np.int32)


@given(case=pair_wise_cases())
def test_pair_wise_loss(jit, case):
    x, label, lengths = case
    if x.size == 0:
        return
    (y,) = run_op("PairWiseLoss", [x, label, lengths], jit=jit)
    np.testing.assert_allclose(y, pair_wise_reference(x, label, lengths), rtol=1e-5, atol=1e-6)


def accuracy_reference(x, label, top_k):
    """AccuracyOp: a row is correct when fewer than top_k classes beat its label (ties: lower index)."""
    correct = 0
    for i, row in enumerate(x):
        ahead = sum(1 for j, p in enumerate(row) if p > row[label[i]] or (p == row[label[i]] and j < label[i]))
        correct += 1 + ahead <= top_k
    return np.float32(correct) / np.float32(len(x))


@given(
    x=st.integers(1, 5).flatmap(lambda n: floats((n, 4), -2, 2).map(np.round)),
    top_k=st.integers(1, 4),
    data=st.data(),
)
def test_accuracy_top_k_with_ties(jit, x, top_k, data):
    label = data.draw(hnp.arrays(np.int32, (len(x),), elements=st.integers(0, 3)))
    (acc,) = run_op("Accuracy", [x, label], jit=jit, top_k=top_k)
    assert acc.dtype == np.float32 and acc.shape == ()
    assert acc == accuracy_reference(x, label, top_k)


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_loss.py)

def _float_dtype(data: st.DataObject):
    """float32, or (invalid) int32. Caffe2 refuses doubles too, but rnn2jax accepts them on purpose (its
    float64 verification mode, rnn2jax/checking/verification.py), so they are not drawn."""
    return np.int32 if invalid(data) else np.float32


def _grow(data: st.DataObject, shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` with one dim made larger (an invalid partner shape)."""
    if not shape:
        return (2,)
    i = data.draw(st.integers(0, len(shape) - 1))
    return (*shape[:i], shape[i] + 1, *shape[i + 1 :])


def _probabilities(data: st.DataObject, shape, dtype=np.float32):
    """Rows of positive values summing to 1 (a row of one element is 1)."""
    x = data.draw(arrays(shape, np.float64, 0.0625, 1.0))
    if x.ndim >= 1 and x.size:
        x = x / x.sum(axis=-1, keepdims=True)
    return x.astype(dtype)


# --------------------------------------------------------------------------------------------------


def draw_averaged_loss(data: st.DataObject):
    x = data.draw(arrays(shapes(0, 4, min_side=0), _float_dtype(data)))
    return create_operator("AveragedLoss", ["X"], ["loss"]), {"X": x}


def draw_squared_l2_distance(data: st.DataObject):
    dtype = _float_dtype(data)
    shape = data.draw(shapes(1, 4, min_side=0))
    y_shape = _grow(data, shape) if invalid(data) else shape
    op = create_operator("SquaredL2Distance", ["X", "Y"], ["D"])
    x, y = data.draw(arrays(shape, dtype)), data.draw(arrays(y_shape, dtype))
    if dtype == np.float32 and y_shape == shape:
        # Caffe2 computes (X·X + Y·Y)/2 - X·Y: for X close to Y it cancels and is off by about
        # eps · (X² + Y²), far more than rtol of the small result. Keep each |X - Y| in [0.5, 1].
        gap = data.draw(arrays(shape, np.float32, 0.5, 1.0)) * np.where(data.draw(arrays(shape, np.bool_)), 1, -1)
        y = (x + gap).astype(np.float32)
    return op, {"X": x, "Y": y}


def draw_cross_entropy(data: st.DataObject):
    n, d = data.draw(dims(0, 4)), data.draw(dims(1, 5))
    x = data.draw(arrays((n, d), _float_dtype(data), 0.0625, 1.0))
    label_shape = _grow(data, (n, d)) if invalid(data) else (n, d)
    label = _probabilities(data, label_shape)
    return create_operator("CrossEntropy", ["X", "label"], ["Y"]), {"X": x, "label": label}


def draw_label_cross_entropy(data: st.DataObject):
    n, d = data.draw(dims(0, 4)), data.draw(dims(1, 5))
    x = _probabilities(data, (n, d), _float_dtype(data))
    label_dtype = data.draw(st.sampled_from([np.int64, np.float32])) if invalid(data) else np.int32
    label_shape = data.draw(st.sampled_from([(n,), (n, 1)]))
    if invalid(data):
        label_shape = (n + 1,)
    label = data.draw(arrays(label_shape, label_dtype, 0, d - 1))
    return create_operator("LabelCrossEntropy", ["X", "label"], ["Y"]), {"X": x, "label": label}


def draw_sigmoid_cross_entropy_with_logits(data: st.DataObject):
    dtype = _float_dtype(data)
    shape = data.draw(shapes(1, 4, min_side=0))
    shape = (*shape[:-1], max(shape[-1], 1))  # an empty last dim crashes Caffe2: test_sigmoid_xent_empty_rows
    logits = data.draw(arrays(shape, dtype, -8, 8))
    targets = data.draw(arrays(_grow(data, shape) if invalid(data) else shape, dtype, 0, 1))
    args = {}
    mode = data.draw(st.sampled_from(["default", "log_D_trick", "unjoined_lr_loss"]))
    if mode != "default":
        args[mode] = 1
    if invalid(data):
        args = {"log_D_trick": 1, "unjoined_lr_loss": 1}
    op = create_operator("SigmoidCrossEntropyWithLogits", ["logits", "targets"], ["loss"], **args)
    return op, {"logits": logits, "targets": targets}


def draw_softmax_with_loss(data: st.DataObject):
    """Logits [N, D] (or more dims split at `axis`), class labels [N] / [N, 1] or, with label_prob,
    probability rows; optional non-negative weights [N]; `scale`."""
    dtype = _float_dtype(data)
    n_dims = tuple(data.draw(st.lists(dims(0, 3), min_size=1, max_size=2)))
    d_dims = tuple(data.draw(st.lists(dims(1, 4), min_size=1, max_size=1)))
    shape = n_dims + d_dims
    axis = len(n_dims)
    n, d = int(np.prod(n_dims)), int(np.prod(d_dims))
    args = {}
    if axis != 1 or data.draw(st.booleans()):
        args["axis"] = axis
    label_prob = data.draw(st.booleans())
    if label_prob or data.draw(st.booleans()):
        args["label_prob"] = int(label_prob)
    if data.draw(st.booleans()):
        args["scale"] = data.draw(st.sampled_from([0.0, 0.5, 2.0]))
    x = data.draw(arrays(shape, dtype, -5, 5))
    if label_prob:
        label = _probabilities(data, (n, d))
        if len(n_dims) > 1 or data.draw(st.booleans()):
            label = label.reshape(shape)
    else:
        label = data.draw(arrays(data.draw(st.sampled_from([n_dims, (*n_dims, 1)])), np.int32, 0, d - 1))
    if invalid(data):
        label = label[:-1] if len(label) else np.zeros((1, *label.shape[1:]), label.dtype)
    inputs = {"X": x, "label": label}
    if data.draw(st.booleans()):
        weights = data.draw(arrays((n,), np.float32, 0, 2))
        if weights.size and data.draw(st.integers(0, 4)) == 0:
            weights[:] = 0  # weights summing to 0: the loss is 0
        inputs["weights"] = weights
    return create_operator("SoftmaxWithLoss", list(inputs), ["P", "loss"], **args), inputs


def _labels_pm1(data: st.DataObject, shape):
    """int32 labels of +1 / -1 (an invalid draw: int64)."""
    dtype = np.int64 if invalid(data) else np.int32
    return (data.draw(arrays(shape, np.int32, 0, 1)) * 2 - 1).astype(dtype)


def draw_weighted_sigmoid_xent(data: st.DataObject):
    dtype = _float_dtype(data)
    shape = data.draw(shapes(1, 3, min_side=0))
    shape = (*shape[:-1], max(shape[-1], 1))  # an empty last dim crashes Caffe2 (as the unweighted op)
    logits = data.draw(arrays(shape, dtype, -8, 8))
    targets = data.draw(arrays(shape, dtype, 0, 1))
    weights = data.draw(arrays(_grow(data, shape) if invalid(data) else shape, dtype, 0, 2))
    op = create_operator("WeightedSigmoidCrossEntropyWithLogits", ["logits", "targets", "weights"], ["loss"])
    return op, {"logits": logits, "targets": targets, "weights": weights}


def draw_make_two_class(data: st.DataObject):
    x = data.draw(arrays(shapes(1, 3, min_side=0), _float_dtype(data), 0, 1))
    return create_operator("MakeTwoClass", ["X"], ["Y"]), {"X": x}


def draw_margin_ranking_criterion(data: st.DataObject):
    dtype = _float_dtype(data)
    shape = data.draw(shapes(1, 2, min_side=0))
    x2_shape = _grow(data, shape) if invalid(data) else shape
    args = {"margin": data.draw(st.sampled_from([0.0, 0.5, 1.0]))} if data.draw(st.booleans()) else {}
    inputs = {
        "X1": data.draw(arrays(shape, dtype, -2, 2)),
        "X2": data.draw(arrays(x2_shape, dtype, -2, 2)),
        "Y": _labels_pm1(data, shape),
    }
    return create_operator("MarginRankingCriterion", list(inputs), ["loss"], **args), inputs


def draw_cosine_embedding_criterion(data: st.DataObject):
    dtype = _float_dtype(data)
    shape = data.draw(shapes(1, 2, min_side=0))
    y_shape = _grow(data, shape) if invalid(data) else shape
    args = {"margin": data.draw(st.sampled_from([0.0, 0.25, -0.5]))} if data.draw(st.booleans()) else {}
    inputs = {"S": data.draw(arrays(shape, dtype, -1, 1)), "Y": _labels_pm1(data, y_shape)}
    return create_operator("CosineEmbeddingCriterion", list(inputs), ["loss"], **args), inputs


def draw_pair_wise_loss(data: st.DataObject):
    """Scores [N] or [N, 1] (N >= 1), float labels with ties, optional session lengths summing to N."""
    n = data.draw(dims(1, 6))
    shape = data.draw(st.sampled_from([(n,), (n, 1)]))
    x = data.draw(arrays(shape, _float_dtype(data), -20, 20))
    label = data.draw(arrays(shape, np.int32, 0, 2)).astype(np.float32)
    inputs = {"X": x, "label": label}
    if data.draw(st.booleans()):
        cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
        lengths = np.diff([0, *cuts, n]).astype(np.int32)
        if invalid(data):
            lengths[-1] += 1  # sums past N
        inputs["lengths"] = lengths
    return create_operator("PairWiseLoss", list(inputs), ["Y"]), inputs


def draw_bernoulli_jsd(data: st.DataObject):
    dtype = _float_dtype(data)
    shape = data.draw(shapes(1, 3, min_side=0))
    t_shape = _grow(data, shape) if invalid(data) else shape
    x = data.draw(arrays(shape, dtype, 0.0625, 0.9375))
    t = data.draw(arrays(t_shape, np.float32, 0.0, 1.0))
    return create_operator("BernoulliJSD", ["X", "T"], ["L"]), {"X": x, "T": t}


def draw_spatial_softmax_with_loss(data: st.DataObject):
    """Logits [N, D, H, W], labels [N, H, W] in [-1, D) (-1: don't care), optional weights per pixel."""
    n, d, h, w = (data.draw(dims(1, 3)) for _ in range(4))
    x = data.draw(arrays((n, d, h, w), _float_dtype(data), -5, 5))
    label = data.draw(arrays((n, h, w), np.int32, -1, d - 1))
    if invalid(data):
        # Caffe2 checks only the labels' rank and first dim: fewer pixels make it read out of bounds (SIGSEGV)
        label = data.draw(st.sampled_from([np.concatenate([label, label]), label.reshape(n, h * w), label + d]))
    inputs = {"X": x, "label": label}
    if data.draw(st.booleans()):
        inputs["weights"] = data.draw(arrays((n * h * w,), np.float32, 0, 2))
    args = {"scale": data.draw(st.sampled_from([0.5, 2.0]))} if data.draw(st.booleans()) else {}
    return create_operator("SpatialSoftmaxWithLoss", list(inputs), ["P", "loss"], **args), inputs


def _scores_and_labels(data: st.DataObject):
    n, d = data.draw(dims(0, 5)), data.draw(dims(1, 5))
    x = data.draw(arrays((n, d), _float_dtype(data), -2, 2))
    if data.draw(st.booleans()):
        x = np.round(x)  # ties
    label = data.draw(arrays((n,), np.int32, 0, d - 1))
    if invalid(data):
        label = data.draw(st.sampled_from([label.astype(np.int64), label.reshape(n, 1), np.append(label, 0)]))
    return x, label


def draw_accuracy(data: st.DataObject):
    x, label = _scores_and_labels(data)
    args = {"top_k": data.draw(st.integers(1, 4))} if data.draw(st.booleans()) else {}
    return create_operator("Accuracy", ["X", "label"], ["accuracy"], **args), {"X": x, "label": label}


def draw_multi_class_accuracy(data: st.DataObject):
    x, label = _scores_and_labels(data)
    return create_operator("MultiClassAccuracy", ["X", "label"], ["accuracies", "amounts"]), {"X": x, "label": label}


def draw_perplexity(data: st.DataObject):
    x = data.draw(arrays((data.draw(dims(0, 6)),), _float_dtype(data), 0.0625, 1.0))
    return create_operator("Perplexity", ["X"], ["perplexity"]), {"X": x}


CASES = cases(
    Case("AveragedLoss", draw_averaged_loss, gradient_ops=("AveragedLossGradient",)),
    Case("SquaredL2Distance", draw_squared_l2_distance, gradient_ops=("SquaredL2DistanceGradient",)),
    Case("CrossEntropy", draw_cross_entropy, gradient_ops=("CrossEntropyGradient",)),
    Case("LabelCrossEntropy", draw_label_cross_entropy, gradient_ops=("LabelCrossEntropyGradient",)),
    Case(
        "SigmoidCrossEntropyWithLogits",
        draw_sigmoid_cross_entropy_with_logits,
        gradient_ops=("SigmoidCrossEntropyWithLogitsGradient",),
    ),
    Case("SoftmaxWithLoss", draw_softmax_with_loss, gradient_ops=("SoftmaxWithLossGradient",)),
    Case(
        "WeightedSigmoidCrossEntropyWithLogits",
        draw_weighted_sigmoid_xent,
        gradient_ops=("WeightedSigmoidCrossEntropyWithLogitsGradient",),
    ),
    Case("MakeTwoClass", draw_make_two_class, gradient_ops=("MakeTwoClassGradient",)),
    Case("MarginRankingCriterion", draw_margin_ranking_criterion, gradient_ops=("MarginRankingCriterionGradient",)),
    Case(
        "CosineEmbeddingCriterion",
        draw_cosine_embedding_criterion,
        gradient_ops=("CosineEmbeddingCriterionGradient",),
    ),
    Case("PairWiseLoss", draw_pair_wise_loss, gradient_ops=("PairWiseLossGradient",)),
    Case("BernoulliJSD", draw_bernoulli_jsd, gradient_ops=("BernoulliJSDGradient",)),
    Case("SpatialSoftmaxWithLoss", draw_spatial_softmax_with_loss, gradient_ops=("SpatialSoftmaxWithLossGradient",)),
    Case("Accuracy", draw_accuracy),
    Case("MultiClassAccuracy", draw_multi_class_accuracy),
    Case("Perplexity", draw_perplexity),
)


@pytest.mark.parametrize("op_type", ["SigmoidCrossEntropyWithLogits", "SigmoidCrossEntropyWithLogitsGradient"])
def test_sigmoid_xent_empty_rows(op_type):
    """Logits with an empty last dim (shape [4, 2, 0]) kill Caffe2's worker with SIGFPE (exit status -8:
    it divides the element count by the last dim as an integer), forward and gradient alike. rnn2jax
    refuses them: the mean over an empty dim is undefined."""
    x = np.zeros((4, 2, 0), np.float32)
    if op_type == "SigmoidCrossEntropyWithLogits":
        op, inputs = create_operator(op_type, ["X", "T"], ["Y"]), {"X": x, "T": x}
    else:
        op = create_operator(op_type, ["dY", "X", "T"], ["dX"])
        inputs = {"dY": np.zeros((4, 2), np.float32), "X": x, "T": x}
    with pytest.raises(ShapeError, match="empty last dim"):
        run_rnn2jax([op], inputs, list(op.output))


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_loss(caffe2, case, data):
    run_case(caffe2, case, data)
