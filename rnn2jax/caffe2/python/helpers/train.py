"""Caffe2's `helpers.train`: the iteration counter, Accuracy and L2 weight decay."""

from __future__ import annotations

from typing import Any

from ...proto import caffe2_pb2
from .. import core, scope
from ..core import BlobReference


def _get_weights(model: Any, namescope: str | None = None) -> list[BlobReference]:
    if namescope is None:
        namescope = scope.CurrentNameScope()
    if namescope == "":
        return model.weights[:]
    return [w for w in model.weights if w.GetNameScope() == namescope]


def iter(model: Any, blob_out: str, **kwargs: Any) -> BlobReference:
    """An int64 counter `blob_out` on the CPU (0 in the init net), incremented by Iter each run."""
    kwargs.pop("device_option", None)
    model.param_init_net.ConstantFill(
        [],
        blob_out,
        shape=[1],
        value=0,
        dtype=core.DataType.INT64,
        device_option=core.DeviceOption(caffe2_pb2.CPU, 0),
        **kwargs,
    )
    return model.net.Iter(blob_out, blob_out, **kwargs)


def accuracy(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> None:
    """Accuracy of `[prediction, label]`. As in Caffe2 on the CPU, `kwargs` (top_k too) do not reach the op."""
    model.net.Accuracy(blob_in, blob_out)


def add_weight_decay(model: Any, weight_decay: float) -> None:
    """`grad += weight_decay * param` for every weight in the current name scope (WeightedSum, in place)."""
    if weight_decay <= 0.0:
        return
    wd = model.param_init_net.ConstantFill([], "wd", shape=[1], value=weight_decay)
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in _get_weights(model):
        grad = model.param_to_grad[param]
        model.net.WeightedSum([grad, one, param, wd], grad)


__all__ = ["accuracy", "add_weight_decay", "iter"]
