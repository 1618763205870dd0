"""Differential tests of the loss ops (AveragedLoss, CrossEntropy, LabelCrossEntropy,
SigmoidCrossEntropyWithLogits, SoftmaxWithLoss, SquaredL2Distance) and their gradients against real
Caffe2."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, dims, run_case, run_rnn2jax, shapes
from rnn2jax.caffe2.core import create_operator
from rnn2jax.errors import ShapeError


def _invalid(data: st.DataObject) -> bool:
    return data.draw(st.integers(0, 7)) == 0


def _float_dtype(data: st.DataObject):
    """float32, or (invalid) int32. Caffe2 refuses doubles too, but rnn2jax accepts them on purpose (its
    float64 verification mode, rnn2jax/verify.py), so they are not drawn."""
    return np.int32 if _invalid(data) else np.float32


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
    y_shape = _grow(data, shape) if _invalid(data) else shape
    op = create_operator("SquaredL2Distance", ["X", "Y"], ["D"])
    return op, {"X": data.draw(arrays(shape, dtype)), "Y": data.draw(arrays(y_shape, dtype))}


def draw_cross_entropy(data: st.DataObject):
    n, d = data.draw(dims(0, 4)), data.draw(dims(1, 5))
    x = data.draw(arrays((n, d), _float_dtype(data), 0.0625, 1.0))
    label_shape = _grow(data, (n, d)) if _invalid(data) else (n, d)
    label = _probabilities(data, label_shape)
    return create_operator("CrossEntropy", ["X", "label"], ["Y"]), {"X": x, "label": label}


def draw_label_cross_entropy(data: st.DataObject):
    n, d = data.draw(dims(0, 4)), data.draw(dims(1, 5))
    x = _probabilities(data, (n, d), _float_dtype(data))
    label_dtype = data.draw(st.sampled_from([np.int64, np.float32])) if _invalid(data) else np.int32
    label_shape = data.draw(st.sampled_from([(n,), (n, 1)]))
    if _invalid(data):
        label_shape = (n + 1,)
    label = data.draw(arrays(label_shape, label_dtype, 0, d - 1))
    return create_operator("LabelCrossEntropy", ["X", "label"], ["Y"]), {"X": x, "label": label}


def draw_sigmoid_cross_entropy_with_logits(data: st.DataObject):
    dtype = _float_dtype(data)
    shape = data.draw(shapes(1, 4, min_side=0))
    shape = (*shape[:-1], max(shape[-1], 1))  # an empty last dim crashes Caffe2: test_sigmoid_xent_empty_rows
    logits = data.draw(arrays(shape, dtype, -8, 8))
    targets = data.draw(arrays(_grow(data, shape) if _invalid(data) else shape, dtype, 0, 1))
    args = {}
    mode = data.draw(st.sampled_from(["default", "log_D_trick", "unjoined_lr_loss"]))
    if mode != "default":
        args[mode] = 1
    if _invalid(data):
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
    if _invalid(data):
        label = label[:-1] if len(label) else np.zeros((1, *label.shape[1:]), label.dtype)
    inputs = {"X": x, "label": label}
    if data.draw(st.booleans()):
        weights = data.draw(arrays((n,), np.float32, 0, 2))
        if weights.size and data.draw(st.integers(0, 4)) == 0:
            weights[:] = 0  # weights summing to 0: the loss is 0
        inputs["weights"] = weights
    return create_operator("SoftmaxWithLoss", list(inputs), ["P", "loss"], **args), inputs


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
    with jax.enable_x64(True):  # float64/int64 inputs keep their types, as in Caffe2
        run_case(caffe2, case, data)
