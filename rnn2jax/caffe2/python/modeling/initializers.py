"""Caffe2's `modeling.initializers`: objects that create a parameter in an init net.

`ModelHelper.create_param(name, shape, initializer)` hands the initializer the parameter's blob, the
model's `param_init_net` and the shape, and records the `ParameterInfo` it returns. An `Initializer`
adds one fill op (`operator_name` with `operator_kwargs`); an `ExternalInitializer` adds nothing (the
blob is fed before the init net runs). `PseudoFP16Initializer` and `ReversePseudoFP16Initializer` build
Caffe2's nets (a float master copy and a FloatToHalf copy); rnn2jax does not lower FloatToHalf, so a net
with them is refused when it runs (Caffe2's own tests use them only on GPUs).
"""

from __future__ import annotations

from typing import Any

from ..core import BlobReference, DataType, ScopedBlobReference
from .parameter_info import ParameterInfo


class Initializer:
    """One fill op, `operator_name(shape=..., **operator_kwargs)`, writes the parameter."""

    def __init__(self, operator_name: str | None = None, **kwargs: Any):
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def update(self, operator_name: str, kwargs: dict[str, Any]) -> None:
        if self.operator_name is not None:
            raise Exception("Operator name overwrites are not allowed")
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def _fill(self, init_net: Any, name: Any, shape: Any) -> BlobReference:
        if self.operator_name is None:
            raise ValueError(f"{type(self).__name__} for parameter '{name}' has no operator_name")
        return getattr(init_net, self.operator_name)([], name, shape=shape, **self.operator_kwargs)

    def create_param(self, param_name: Any, init_net: Any, shape: Any) -> ParameterInfo:
        return ParameterInfo(param_id=None, param=self._fill(init_net, param_name, shape), shape=shape)


class ExternalInitializer:
    """No op: the parameter is provided in the workspace before the init net runs."""

    def create_param(self, param_name: Any, init_net: Any, shape: Any) -> ParameterInfo:
        if isinstance(param_name, BlobReference):
            param = BlobReference(str(param_name), init_net)
        elif isinstance(param_name, str):
            param = ScopedBlobReference(param_name, init_net)
        else:
            raise TypeError("Unsupported type for param_name")
        return ParameterInfo(param_id=None, param=param, shape=shape)


class PseudoFP16Initializer(Initializer):
    """Mixed precision: the fill op writes `<param>_fp32`, the parameter is its FloatToHalf copy, and the fp32
    master (stored and optimized at single precision) is the parameter info's `blob_copy[FLOAT]`."""

    def create_param(self, param_name: Any, init_net: Any, shape: Any) -> ParameterInfo:
        param_fp32 = self._fill(init_net, param_name + "_fp32", shape)
        param = init_net.FloatToHalf(param_fp32, param_name)
        return ParameterInfo(param_id=None, param=param, shape=shape, blob_copy={DataType.FLOAT: param_fp32})


class ReversePseudoFP16Initializer(Initializer):
    """As PseudoFP16Initializer, the other way round: the parameter is the fp32 fill, its FloatToHalf copy
    `<param>_fp16` the `blob_copy[FLOAT16]`."""

    def create_param(self, param_name: Any, init_net: Any, shape: Any) -> ParameterInfo:
        param_fp32 = self._fill(init_net, param_name, shape)
        param_fp16 = init_net.FloatToHalf(param_fp32, param_name + "_fp16")
        return ParameterInfo(param_id=None, param=param_fp32, shape=shape, blob_copy={DataType.FLOAT16: param_fp16})


def update_initializer(
    initializer_class: type | None,
    operator_name_and_kwargs: tuple[str, dict[str, Any]] | None,
    default_operator_name_and_kwargs: tuple[str, dict[str, Any]],
) -> Any:
    """An `initializer_class` (default `Initializer`) object for `operator_name_and_kwargs`, or for the
    default fill when that is None: how brew helpers combine `weight_init=` and `WeightInitializer=`."""
    name, kwargs = operator_name_and_kwargs or default_operator_name_and_kwargs
    return (initializer_class or Initializer)(name, **(kwargs or {}))
