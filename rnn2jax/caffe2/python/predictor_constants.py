"""Caffe2's `predictor_constants`: the key names of a predictor export (Caffe2's PredictorConsts proto
defaults), as one read-only object `predictor_constants`."""

from __future__ import annotations

from types import MappingProxyType

from ...serving import predictor as _predictor


class PredictorConsts:
    """The fields of Caffe2's `PredictorConsts` message, with their default values."""

    __slots__ = ()
    META_NET_DEF = _predictor.META_NET_DEF
    PREDICTOR_DBREADER = _predictor.PREDICTOR_DBREADER
    PARAMETERS_BLOB_TYPE = _predictor.PARAMETERS_BLOB_TYPE
    INPUTS_BLOB_TYPE = _predictor.INPUTS_BLOB_TYPE
    OUTPUTS_BLOB_TYPE = _predictor.OUTPUTS_BLOB_TYPE
    GLOBAL_INIT_NET_TYPE = _predictor.GLOBAL_INIT_NET_TYPE
    PREDICT_INIT_NET_TYPE = _predictor.PREDICT_INIT_NET_TYPE
    PREDICT_NET_TYPE = _predictor.PREDICT_NET_TYPE
    SINGLE_PREDICTOR = "SINGLE_PREDICTOR"
    MULTI_PREDICTOR = "MULTI_PREDICTOR"
    TRAIN_INIT_PLAN_TYPE = "TRAIN_INIT_PLAN_TYPE"
    TRAIN_PLAN_TYPE = "TRAIN_PLAN_TYPE"
    SHAPE_INFO_BLOB = "SHAPE_INFO_BLOB"
    DEFERRED_BLOB_READER = "__DEFERRED_BLOB_READER__"


predictor_constants = PredictorConsts()
CONSTANTS = MappingProxyType({k: getattr(PredictorConsts, k) for k in dir(PredictorConsts) if k.isupper()})
