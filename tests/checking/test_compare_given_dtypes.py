"""`compare` with `batch`/`steps`: an input given as an array keeps its dtype through shape inference (int32
labels were inferred as float32 and refused by LabelCrossEntropy), and the run agrees with real Caffe2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnn2jax.caffe2.python import brew
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.checking.comparison import compare
from rnn2jax.errors import ShapeError


def _classifier(classes: int) -> tuple[bytes, dict[str, np.ndarray]]:
    """FC -> Softmax -> LabelCrossEntropy(label) -> AveragedLoss, with Caffe2's gradient ops."""
    model = ModelHelper(name="classifier")
    prob = model.net.Softmax(brew.fc(model, "data", "logits", dim_in=3, dim_out=classes), "prob")
    loss = model.net.AveragedLoss(model.net.LabelCrossEntropy([prob, "label"]), "loss")
    model.AddGradientOperators([loss])
    rng = np.random.default_rng(0)
    params = {
        "logits_w": rng.standard_normal((classes, 3)).astype(np.float32),
        "logits_b": rng.standard_normal(classes).astype(np.float32),
    }
    return model.net.Proto().SerializeToString(), params


@settings(max_examples=3)
@given(batch=st.integers(1, 5), classes=st.integers(2, 4), labels=st.sampled_from([np.int32, np.int64]))
def test_a_given_integer_input_keeps_its_dtype_when_shapes_are_inferred(caffe2, batch, classes, labels):
    net, params = _classifier(classes)
    label = (np.arange(batch) % classes).astype(labels)
    if labels is np.int64:  # Caffe2's LabelCrossEntropy reads int32 labels only: refused, naming the dtype given
        with pytest.raises(ShapeError, match=r"labels 'label' must be an integer tensor \(int32\), got int64"):
            compare(net, params=params, inputs={"label": label}, batch=batch, caffe2=caffe2)
        return
    report = compare(net, params=params, inputs={"label": label}, batch=batch, caffe2=caffe2)
    assert report.ok, str(report)
    compared = {b.blob: b for b in report.blobs}
    assert compared["loss"].shape == () and compared["prob"].shape == (batch, classes)
