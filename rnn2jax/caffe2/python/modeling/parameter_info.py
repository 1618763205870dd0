"""Caffe2's `modeling.parameter_info`: the parameter record and tags (kept in `model_helper`)."""

from ..model_helper import ParameterInfo, ParameterTags

__all__ = ["ParameterInfo", "ParameterTags"]
