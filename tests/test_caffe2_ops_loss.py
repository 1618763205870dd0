"""Differential tests of the loss ops (AveragedLoss, CrossEntropy, LabelCrossEntropy, the sigmoid cross
entropies, SoftmaxWithLoss, SpatialSoftmaxWithLoss, SquaredL2Distance, the ranking criteria, PairWiseLoss,
BernoulliJSD, MakeTwoClass), their gradients, and the metrics (Accuracy, MultiClassAccuracy, Perplexity)
against real Caffe2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, dims, invalid, run_case, run_rnn2jax, shapes
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.errors import ShapeError


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
