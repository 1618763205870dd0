"""Caffe2's `modeling.parameter_sharing`: the scope overrides that `ModelHelper.create_param` reads, kept in
`model_helper` (one context: the tree's copy of this module would keep a second one that no parameter sees)."""

from ..model_helper import ParameterSharing, ParameterSharingContext, parameter_sharing_context

__all__ = ["ParameterSharing", "ParameterSharingContext", "parameter_sharing_context"]
