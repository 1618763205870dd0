"""Caffe2's `predictor.predictor_exporter`: write a model as a predictor export, read one back.

An export is one DB: the serialized `MetaNetDef` under `!!META_NET_DEF`, then every parameter. The
MetaNetDef holds a global init net (`Load` of the parameters from the DB reader blob
`!!PREDICTOR_DBREADER`), a predict-init net (zero-fills of inputs and outputs), the predict net and
the blob lists, keyed by kind (`_<name>` appended for a named predictor). `save_to_db` writes it with
the Save op of the current workspace and `load_from_db` reads it with CreateDB + Load, so the DB
formats and blob encodings are rnn2jax's storage layer's (`rnn2jax.storage`); the exports are
the ones `rnn2jax predictor ...` and `rnn2jax.load_model` read.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from ....errors import StorageError
from ....serving.predictor import parse_meta_net_def
from ...proto import caffe2_pb2, metanet_pb2
from .. import core, scope, workspace
from ..predictor_constants import predictor_constants
from . import predictor_py_utils as utils
from . import serde


def get_predictor_exporter_helper(submodelNetName: str) -> PredictorExportMeta:
    """An empty PredictorExportMeta named `submodelNetName`, to compute its key names."""
    return PredictorExportMeta(
        predict_net=core.Net(submodelNetName), parameters=[], inputs=[], outputs=[], name=submodelNetName
    )


_Fields = namedtuple(
    "PredictorExportMeta",
    "predict_net, parameters, inputs, outputs, shapes, name, "
    "extra_init_net, global_init_net, net_type, num_workers, trainer_prefix",
)


class PredictorExportMeta(_Fields):
    """What to export: the predict net (a core.Net, Plan, NetDef or PlanDef), its parameters, inputs and
    outputs (blob names or references), optional input/output `shapes`, and a `name` for exports holding
    several predictors. `extra_init_net` is appended to the predict-init net, `global_init_net` to the
    global init net; `net_type`/`num_workers` set the predict net's type and worker count."""

    __slots__ = ()

    def __new__(
        cls,
        predict_net: Any,
        parameters: Any,
        inputs: Any,
        outputs: Any,
        shapes: dict | None = None,
        name: str = "",
        extra_init_net: Any = None,
        global_init_net: Any = None,
        net_type: str | None = None,
        num_workers: int | None = None,
        trainer_prefix: str | None = None,
    ) -> PredictorExportMeta:
        inputs = [str(i) for i in inputs]
        outputs = [str(o) for o in outputs]
        parameters = [str(p) for p in parameters]
        if len(set(inputs)) != len(inputs):
            raise AssertionError("All inputs to the predictor should be unique")
        if not set(parameters).isdisjoint(inputs):
            raise AssertionError(
                f"Parameters and inputs are required to be disjoint. Intersection: {set(parameters) & set(inputs)}"
            )
        if not set(parameters).isdisjoint(outputs):
            raise AssertionError(
                f"Parameters and outputs are required to be disjoint. Intersection: {set(parameters) & set(outputs)}"
            )
        if isinstance(predict_net, core.Net | core.Plan):
            predict_net = predict_net.Proto()
        if not isinstance(predict_net, caffe2_pb2.NetDef | caffe2_pb2.PlanDef):
            raise AssertionError(
                f"predict_net must be a Net, Plan, NetDef or PlanDef, got {type(predict_net).__name__}"
            )
        return super().__new__(
            cls,
            predict_net,
            parameters,
            inputs,
            outputs,
            shapes or {},
            name,
            extra_init_net,
            global_init_net,
            net_type,
            num_workers,
            trainer_prefix,
        )

    def inputs_name(self) -> str:
        return utils.get_comp_name(predictor_constants.INPUTS_BLOB_TYPE, self.name)

    def outputs_name(self) -> str:
        return utils.get_comp_name(predictor_constants.OUTPUTS_BLOB_TYPE, self.name)

    def parameters_name(self) -> str:
        return utils.get_comp_name(predictor_constants.PARAMETERS_BLOB_TYPE, self.name)

    def global_init_name(self) -> str:
        return utils.get_comp_name(predictor_constants.GLOBAL_INIT_NET_TYPE, self.name)

    def predict_init_name(self) -> str:
        return utils.get_comp_name(predictor_constants.PREDICT_INIT_NET_TYPE, self.name)

    def predict_net_name(self) -> str:
        return utils.get_comp_name(predictor_constants.PREDICT_NET_TYPE, self.name)

    def train_init_plan_name(self) -> str:
        name = utils.get_comp_name(predictor_constants.TRAIN_INIT_PLAN_TYPE, self.name)
        return f"{self.trainer_prefix}_{name}" if self.trainer_prefix else name

    def train_plan_name(self) -> str:
        name = utils.get_comp_name(predictor_constants.TRAIN_PLAN_TYPE, self.name)
        return f"{self.trainer_prefix}_{name}" if self.trainer_prefix else name


def prepare_prediction_net(
    filename: str, db_type: str, device_option: caffe2_pb2.DeviceOption | None = None
) -> core.Net:
    """Load an (unnamed) predictor export into the current workspace: run its global init net (the
    parameters) and predict-init net (inputs and outputs), create the predict net and return it."""
    meta_net_def = load_from_db(filename, db_type, device_option)
    workspace.RunNetOnce(_net(meta_net_def, predictor_constants.GLOBAL_INIT_NET_TYPE, filename))
    workspace.RunNetOnce(_net(meta_net_def, predictor_constants.PREDICT_INIT_NET_TYPE, filename))
    predict_net = core.Net(_net(meta_net_def, predictor_constants.PREDICT_NET_TYPE, filename))
    workspace.CreateNet(predict_net)
    return predict_net


def _net(meta_net_def: metanet_pb2.MetaNetDef, key: str, filename: str) -> caffe2_pb2.NetDef:
    net = utils.GetNet(meta_net_def, key)
    if net is None:
        keys = ", ".join(entry.key for entry in meta_net_def.nets) or "none"
        raise workspace._as_runtime_error(
            StorageError(f"predictor export '{filename}': its MetaNetDef has no net '{key}' (it has: {keys})")
        )
    return net


def _global_init_net(predictor_export_meta: PredictorExportMeta, db_type: str | None) -> caffe2_pb2.NetDef:
    """`Load` of the parameters from the export's own DB reader, then the meta's `global_init_net`."""
    net = core.Net("global-init")
    if db_type != "manifold_db":  # Caffe2: manifold_db needs no DBReader
        net.Load([predictor_constants.PREDICTOR_DBREADER], predictor_export_meta.parameters)
        net.Proto().external_input.extend([predictor_constants.PREDICTOR_DBREADER])
        net.Proto().external_output.extend(predictor_export_meta.parameters)
    if predictor_export_meta.global_init_net:
        net.AppendNet(predictor_export_meta.global_init_net)
    utils.AddModelIdArg(predictor_export_meta, net.Proto())
    return net.Proto()


def get_meta_net_def(
    predictor_export_meta: PredictorExportMeta, ws: Any = None, db_type: str | None = None
) -> metanet_pb2.MetaNetDef:
    """The MetaNetDef of an export; input and output shapes not in `shapes` come from workspace `ws`
    (a `workspace.C.Workspace`; the current workspace by default)."""
    ws = ws or workspace.C.Workspace.current
    meta_net_def = metanet_pb2.MetaNetDef()
    meta = predictor_export_meta
    utils.AddNet(meta_net_def, meta.predict_init_name(), utils.create_predict_init_net(ws, meta))
    utils.AddNet(meta_net_def, meta.global_init_name(), _global_init_net(meta, db_type))
    utils.AddNet(meta_net_def, meta.predict_net_name(), utils.create_predict_net(meta))
    utils.AddBlobs(meta_net_def, meta.parameters_name(), meta.parameters)
    utils.AddBlobs(meta_net_def, meta.inputs_name(), meta.inputs)
    utils.AddBlobs(meta_net_def, meta.outputs_name(), meta.outputs)
    return meta_net_def


def set_model_info(meta_net_def: metanet_pb2.MetaNetDef, project_str: str, model_class_str: str, version: str) -> None:
    if not isinstance(meta_net_def, metanet_pb2.MetaNetDef):
        raise TypeError(f"set_model_info takes a MetaNetDef, got {type(meta_net_def).__name__}")
    meta_net_def.modelInfo.project = project_str
    meta_net_def.modelInfo.modelClass = model_class_str
    meta_net_def.modelInfo.version = version


def save_to_db(
    db_type: str,
    db_destination: str,
    predictor_export_meta: PredictorExportMeta,
    use_ideep: bool = False,
    *args: Any,
    **kwargs: Any,
) -> None:
    """Write the export to DB `db_destination` (replacing it): the MetaNetDef, then the parameters, from
    the current workspace. Extra keywords become arguments of the Save op (e.g. `chunk_size`)."""
    meta_net_def = get_meta_net_def(predictor_export_meta, db_type=db_type)
    device_type = caffe2_pb2.IDEEP if use_ideep else caffe2_pb2.CPU
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
        workspace.FeedBlob(predictor_constants.META_NET_DEF, serde.serialize_protobuf_struct(meta_net_def))
    blobs_to_save = [predictor_constants.META_NET_DEF, *predictor_export_meta.parameters]
    op = core.CreateOperator(
        "Save",
        blobs_to_save,
        [],
        device_option=core.DeviceOption(device_type),
        absolute_path=True,
        db=db_destination,
        db_type=db_type,
        **kwargs,
    )
    workspace.RunOperatorOnce(op)


def load_from_db(
    filename: str, db_type: str, device_option: caffe2_pb2.DeviceOption | None = None, *args: Any, **kwargs: Any
) -> metanet_pb2.MetaNetDef:
    """The export's MetaNetDef. Leaves the DB reader in blob `!!PREDICTOR_DBREADER` (its global init net
    loads the parameters through it) and the MetaNetDef's bytes in `!!META_NET_DEF`. With a device option
    (or a current device scope) every op of its nets gets that option."""
    create_db = core.CreateOperator(
        "CreateDB", [], [core.BlobReference(predictor_constants.PREDICTOR_DBREADER)], db=filename, db_type=db_type
    )
    workspace.RunOperatorOnce(create_db)
    load_meta_net_def = core.CreateOperator(
        "Load",
        [core.BlobReference(predictor_constants.PREDICTOR_DBREADER)],
        [core.BlobReference(predictor_constants.META_NET_DEF)],
    )
    workspace.RunOperatorOnce(load_meta_net_def)
    blob = workspace.FetchBlob(predictor_constants.META_NET_DEF)
    with workspace._caffe2_errors():  # a StorageError that is also a RuntimeError, as Caffe2's errors were
        meta_net_def = parse_meta_net_def(blob, f"predictor export '{filename}' ({db_type})")
    if device_option is None:
        device_option = scope.CurrentDeviceScope()
    if device_option is not None:
        for entry in meta_net_def.nets:
            for op in entry.value.op:
                op.device_option.CopyFrom(device_option)
    return meta_net_def
