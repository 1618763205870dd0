"""Caffe2's `helpers.nonlinearity`: Relu, Tanh, and PRelu with its `<out>_slope` parameter."""

from __future__ import annotations

from typing import Any

from ..core import BlobReference, ScopedBlobReference


def prelu(
    model: Any,
    blob_in: Any,
    blob_out: str,
    num_channels: int = 1,
    slope_init: tuple[str, dict] | None = None,
    **kwargs: Any,
) -> BlobReference:
    """PRelu; the slope `<out>_slope` `[num_channels]` is filled with 0.25 unless `slope_init` says otherwise.
    Like Caffe2, `kwargs` do not reach the op."""
    op_type, args = slope_init or ("ConstantFill", {"value": 0.25})
    if model.init_params:
        slope = getattr(model.param_init_net, op_type)([], blob_out + "_slope", shape=[num_channels], **args)
    else:
        slope = ScopedBlobReference(blob_out + "_slope", model.param_init_net)
    model.AddParameter(slope)
    return model.net.PRelu([blob_in, slope], [blob_out])


def relu(
    model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False, order: str = "NCHW", **kwargs: Any
) -> BlobReference:
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.Relu(blob_in, blob_out, order=order, **kwargs)


def tanh(
    model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False, order: str = "NCHW", **kwargs: Any
) -> BlobReference:
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.Tanh(blob_in, blob_out, order=order, **kwargs)


__all__ = ["prelu", "relu", "tanh"]
