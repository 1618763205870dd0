"""Caffe2's `predictor.predictor_py_utils`: building the nets of a predictor export, and the
key -> value lists of a MetaNetDef (protobuf had no maps when it was designed) read and written."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...proto import caffe2_pb2, metanet_pb2
from .. import core


def create_predict_net(predictor_export_meta: Any) -> caffe2_pb2.NetDef:
    """The predict net, rebuilt: its ops, with external inputs = inputs + parameters and external
    outputs = outputs (whatever the given net declared), and the meta's net type / worker count."""
    source = predictor_export_meta.predict_net
    net = core.Net(source.name or "predict")
    proto = net.Proto()
    proto.op.extend(source.op)
    proto.partition_info.extend(source.partition_info)
    proto.external_input.extend(predictor_export_meta.inputs + predictor_export_meta.parameters)
    proto.external_output.extend(predictor_export_meta.outputs)
    proto.arg.extend(source.arg)
    if predictor_export_meta.net_type is not None:
        proto.type = predictor_export_meta.net_type
    if predictor_export_meta.num_workers is not None:
        proto.num_workers = predictor_export_meta.num_workers
    return proto


def create_predict_init_net(ws: Any, predictor_export_meta: Any) -> caffe2_pb2.NetDef:
    """A net zero-filling every input and output with its shape (from `shapes`, else from the blob in
    workspace `ws`): Caffe2 had no shape inference to bind a predictor's blobs before the first run."""
    net = core.Net("predict-init")

    def zero_fill(blob: str) -> None:
        shape = predictor_export_meta.shapes.get(blob)
        if shape is None:
            if blob not in ws.blobs:
                raise Exception(f"{blob} not in workspace but needed for shape: {list(ws.blobs)}")
            shape = ws.blobs[blob].fetch().shape
        op = core.CreateOperator("ConstantFill", [], [blob], shape=shape, value=0.0)
        op.ClearField("device_option")  # no device scope: the loading side chooses the device
        net.Proto().op.append(op)

    external_blobs = predictor_export_meta.inputs + predictor_export_meta.outputs
    for blob in external_blobs:
        zero_fill(blob)
    net.Proto().external_input.extend(external_blobs)
    if predictor_export_meta.extra_init_net:
        net.AppendNet(predictor_export_meta.extra_init_net)
    AddModelIdArg(predictor_export_meta, net.Proto())
    return net.Proto()


def get_comp_name(string: str, name: str) -> str:
    """`<kind>_<name>`, or `<kind>` for the unnamed predictor."""
    return string + "_" + name if name else string


def to_first_match_dict(kv_list: Iterable[Any]) -> dict:
    d: dict = {}
    for item in kv_list:
        d.setdefault(item.key, item.value)
    return d


def _ProtoMapGet(field: Iterable[Any], key: str) -> Any:
    """The value of the first entry with `key` (None if there is none)."""
    return next((entry.value for entry in field if entry.key == key), None)


def GetPlan(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    return _ProtoMapGet(meta_net_def.plans, key)


def GetBlobs(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    blobs = _ProtoMapGet(meta_net_def.blobs, key)
    return [] if blobs is None else blobs


def GetBlobsByTypePrefix(meta_net_def: metanet_pb2.MetaNetDef, blob_type_prefix: str) -> list[str]:
    """Every blob listed under a key starting with the prefix, once, in first-seen order."""
    seen: dict[str, None] = {}
    for entry in meta_net_def.blobs:
        if entry.key.startswith(blob_type_prefix):
            seen.update(dict.fromkeys(entry.value))
    return list(seen)


def GetNet(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    return _ProtoMapGet(meta_net_def.nets, key)


def GetApplicationSpecificInfo(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    return _ProtoMapGet(meta_net_def.applicationSpecificInfo, key)


def AddBlobs(meta_net_def: metanet_pb2.MetaNetDef, blob_name: str, blob_def: Iterable[str]) -> None:
    blobs = _ProtoMapGet(meta_net_def.blobs, blob_name)
    if blobs is None:
        entry = meta_net_def.blobs.add()
        entry.key = blob_name
        blobs = entry.value
    blobs.extend(blob_def)


def ReplaceBlobs(meta_net_def: metanet_pb2.MetaNetDef, blob_name: str, blob_def: Iterable[str]) -> None:
    blobs = _ProtoMapGet(meta_net_def.blobs, blob_name)
    if blobs is None:
        raise KeyError(f"The blob_name:{blob_name} does not exist")
    del blobs[:]
    blobs.extend(blob_def)


def AddPlan(meta_net_def: metanet_pb2.MetaNetDef, plan_name: str, plan_def: caffe2_pb2.PlanDef) -> None:
    meta_net_def.plans.add(key=plan_name, value=plan_def)


def AddNet(meta_net_def: metanet_pb2.MetaNetDef, net_name: str, net_def: caffe2_pb2.NetDef) -> None:
    meta_net_def.nets.add(key=net_name, value=net_def)


def GetArgumentByName(net_def: caffe2_pb2.NetDef, arg_name: str) -> caffe2_pb2.Argument | None:
    return next((arg for arg in net_def.arg if arg.name == arg_name), None)


def AddModelIdArg(meta_net_def: Any, net_def: caffe2_pb2.NetDef) -> None:
    """Copy the integer `model_id` argument of the predict net (of `meta_net_def`, a PredictorExportMeta)
    onto `net_def`, so the init nets carry the same id."""
    model_id = GetArgumentByName(meta_net_def.predict_net, "model_id")
    if model_id is None:
        return
    old = GetArgumentByName(net_def, "model_id")
    if old is not None:
        old.i = model_id.i
        return
    net_def.arg.add(name="model_id", i=model_id.i)
