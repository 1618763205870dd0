"""Caffe2's `helpers.fc`: `fc(model, blob_in, blob_out, dim_in, dim_out, ...)` (brew.fc's op and params).

`weight_init`/`bias_init` are `(op type, kwargs)` fills; `WeightInitializer`/`BiasInitializer` are
`modeling.initializers` classes built from them; with `model.init_params` False the parameters are
external (no fill op), as in Caffe2.
"""

from __future__ import annotations

from typing import Any

from .. import brew
from ..core import BlobReference
from ..modeling import initializers
from ._direct import direct


def fc(
    model: Any,
    blob_in: str,
    blob_out: str,
    dim_in: int,
    dim_out: int,
    weight_init: tuple[str, dict] | None = None,
    bias_init: tuple[str, dict] | None = None,
    WeightInitializer: type | None = None,
    BiasInitializer: type | None = None,
    **kwargs: Any,
) -> BlobReference:
    """FC with weight `<out>_w` `[dim_out, dim_in]` (XavierFill) and bias `<out>_b` `[dim_out]` (ConstantFill)."""
    if model.init_params:
        weight = initializers.update_initializer(WeightInitializer, weight_init, ("XavierFill", {}))
        bias = initializers.update_initializer(BiasInitializer, bias_init, ("ConstantFill", {}))
    else:
        weight = bias = initializers.ExternalInitializer()
    blob_out = blob_out or model.net.NextName()
    return direct(brew.fc)(model, blob_in, blob_out, dim_in, dim_out, weight_init=weight, bias_init=bias, **kwargs)


__all__ = ["fc"]
