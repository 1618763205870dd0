"""Predictor exports: what `caffe2.python.predictor.predictor_exporter.save_to_db` wrote, as a CompiledNet.

An export is one Caffe2 DB holding a serialized `MetaNetDef` under the key `!!META_NET_DEF` and every
parameter beside it. The MetaNetDef names the nets (a global init net whose `Load` reads the parameters
from the DB itself through the `!!PREDICTOR_DBREADER` blob, a predict-init net that zero-fills the inputs
and outputs, and the predict net) and the blob lists (inputs, outputs, parameters), each keyed by its
type, with `_<name>` appended when the export was given a name (predictor_py_utils.get_comp_name).

`load_model` runs the init nets in a `Workspace` holding the export's DB reader, as Caffe2's predictor
does (their `Load`s are the storage host ops), and compiles the predict net with the export's inputs and
outputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import MissingBlobError, StorageError
from ..ir.netdef import Net, decode_net
from ..ops.storage import DBReader, loaded_values
from ..proto import caffe2_pb2 as pb
from ..proto import metanet_pb2
from ..runtime.workspace import Workspace
from ..storage import read_blobs
from ..storage.db import describe

if TYPE_CHECKING:
    from ..compiler.compiled_net import CompiledNet

META_NET_DEF = "!!META_NET_DEF"
PREDICTOR_DBREADER = "!!PREDICTOR_DBREADER"
GLOBAL_INIT_NET_TYPE = "GLOBAL_INIT_NET_TYPE"
PREDICT_INIT_NET_TYPE = "PREDICT_INIT_NET_TYPE"
PREDICT_NET_TYPE = "PREDICT_NET_TYPE"
INPUTS_BLOB_TYPE = "INPUTS_BLOB_TYPE"
OUTPUTS_BLOB_TYPE = "OUTPUTS_BLOB_TYPE"
PARAMETERS_BLOB_TYPE = "PARAMETERS_BLOB_TYPE"


@dataclass(frozen=True)
class PredictorExport:
    """The MetaNetDef of a predictor export, decoded: its nets and blob lists for one predictor `name`."""

    path: str
    db_type: str
    name: str
    global_init_net: Net
    predict_init_net: Net | None
    predict_net: Net
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    parameters: tuple[str, ...]
    model_info: Mapping[str, str]
    predict_net_def: pb.NetDef = field(compare=False, repr=False, default_factory=pb.NetDef)

    @property
    def where(self) -> str:
        return f"predictor export {describe(self.path, self.db_type)}" + (
            f", predictor '{self.name}'" if self.name else ""
        )


def _comp_name(kind: str, name: str) -> str:
    return f"{kind}_{name}" if name else kind


def parse_meta_net_def(data: Any, where: str) -> metanet_pb2.MetaNetDef:
    """The `!!META_NET_DEF` blob's bytes as a MetaNetDef (Caffe2 saved it as a string blob)."""
    if isinstance(data, np.ndarray) and data.dtype == object and data.size == 1:
        data = data.item()  # a one-element string tensor, as some writers stored it
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, bytes):
        raise StorageError(f"{where}: blob '{META_NET_DEF}' is not a string blob, so this is no predictor export")
    meta = metanet_pb2.MetaNetDef()
    try:
        meta.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError, or a missing required field
        raise StorageError(f"{where}: blob '{META_NET_DEF}' is not a readable MetaNetDef: {error}") from None
    return meta


def predictor_names(meta: metanet_pb2.MetaNetDef) -> list[str]:
    """The names of the predictors an export holds ("" for the unnamed one), one per predict net."""
    prefix = PREDICT_NET_TYPE
    return [
        entry.key[len(prefix) + 1 :] if entry.key != prefix else ""
        for entry in meta.nets
        if entry.key.startswith(prefix)
    ]


def decode_export(
    meta: metanet_pb2.MetaNetDef, path: str | os.PathLike, db_type: str, name: str | None = None
) -> PredictorExport:
    """The nets and blob lists of predictor `name` (None: the only one the export holds)."""
    where = f"predictor export {describe(path, db_type)}"
    names = predictor_names(meta)
    if name is None:
        if len(names) != 1:
            found = ", ".join(repr(n) for n in names) if names else "none"
            raise StorageError(
                f"{where}: expected one predict net ({PREDICT_NET_TYPE}), found {found}; pick one with name="
            )
        name = names[0]
    nets = {entry.key: entry.value for entry in meta.nets}
    blobs = {entry.key: tuple(entry.value) for entry in reversed(meta.blobs)}  # the first entry wins

    def net(kind: str, required: bool = True) -> Net | None:
        key = _comp_name(kind, name)
        if key not in nets:
            if not required:
                return None
            raise StorageError(
                f"{where}: the MetaNetDef has no net '{key}'; it holds nets {', '.join(nets) or '(none)'}"
            )
        return decode_net(nets[key], f"{where}, {key}")

    def blob_list(kind: str) -> tuple[str, ...]:
        return blobs.get(_comp_name(kind, name), ())

    info = meta.modelInfo
    model_info = {f.name: getattr(info, f.name) for f in info.DESCRIPTOR.fields if info.HasField(f.name)}
    return PredictorExport(
        path=os.fspath(path),
        db_type=db_type,
        name=name,
        global_init_net=net(GLOBAL_INIT_NET_TYPE),
        predict_init_net=net(PREDICT_INIT_NET_TYPE, required=False),
        predict_net=net(PREDICT_NET_TYPE),
        inputs=blob_list(INPUTS_BLOB_TYPE),
        outputs=blob_list(OUTPUTS_BLOB_TYPE),
        parameters=blob_list(PARAMETERS_BLOB_TYPE),
        model_info=model_info,
        predict_net_def=nets[_comp_name(PREDICT_NET_TYPE, name)],
    )


def read_meta_net_def(path: str | os.PathLike, db_type: str = "minidb") -> metanet_pb2.MetaNetDef:
    """The export's MetaNetDef; the parameters' records are skipped, not decoded."""
    return _read_meta(path, db_type, names=[META_NET_DEF])[0]


def read_export(path: str | os.PathLike, db_type: str = "minidb", name: str | None = None) -> PredictorExport:
    """The export's MetaNetDef, decoded for predictor `name` (see `decode_export`)."""
    return decode_export(read_meta_net_def(path, db_type), path, db_type, name)


def is_predictor_export(path: str | os.PathLike, db_type: str) -> bool:
    """Whether the DB holds a `!!META_NET_DEF` blob (without decoding any other)."""
    try:
        return META_NET_DEF in read_blobs(path, db_type, names=[META_NET_DEF])
    except StorageError:
        return False


def _read_meta(
    path: str | os.PathLike, db_type: str, names: list[str] | None
) -> tuple[metanet_pb2.MetaNetDef, dict[str, Any]]:
    where = describe(path, db_type)
    try:
        blobs = read_blobs(path, db_type, names=names)
    except StorageError as error:
        if f"blob '{META_NET_DEF}' is not in the DB" in str(error):
            raise StorageError(
                f"{where}: not a predictor export (it has no '{META_NET_DEF}' blob); "
                "compile its nets with rnn2jax.compile, or read its blobs with rnn2jax.read_blobs"
            ) from None
        raise
    if META_NET_DEF not in blobs:
        raise StorageError(
            f"{where}: not a predictor export (it has no '{META_NET_DEF}' blob); "
            "compile its nets with rnn2jax.compile, or read its blobs with rnn2jax.read_blobs"
        )
    return parse_meta_net_def(blobs[META_NET_DEF], where), blobs


def load_model(
    path: str | os.PathLike,
    db_type: str = "minidb",
    *,
    name: str | None = None,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
    jit: bool = True,
) -> CompiledNet:
    """Load a predictor export (`predictor_exporter.save_to_db`'s DB) as a CompiledNet.

    Its inputs and outputs are the export's, in the export's order; its parameters are what the
    export's init nets load and compute (random fills seeded by `seed`), with `params` adding or
    replacing arrays by blob name. `name` picks a predictor when the export holds several.
    """
    from ..compiler.compiled_net import CompiledNet

    if not isinstance(path, str | os.PathLike):
        raise StorageError(f"load_model: path must be a str or os.PathLike, got {type(path).__name__}")
    meta, _ = _read_meta(path, db_type, names=[META_NET_DEF])
    export = decode_export(meta, path, db_type, name)
    # The init nets run as Caffe2's predictor runs them: in a workspace where the export's own DB reader
    # is the blob '!!PREDICTOR_DBREADER' that their Load reads (the storage host ops do the loading).
    workspace = Workspace(seed=seed)
    workspace.put(PREDICTOR_DBREADER, DBReader(os.fspath(path), db_type))
    workspace.run(export.global_init_net)
    if export.predict_init_net is not None:
        # Its ConstantFills of the inputs and outputs only gave Caffe2's workspace blobs to bind; they are
        # no parameters (an input left among them would stop being an input).
        workspace.run(export.predict_init_net)
    env = loaded_values(workspace)
    for blob in (*export.inputs, *export.outputs, META_NET_DEF):
        env.pop(blob, None)
    values = {n: v for n, v in env.items() if getattr(v, "dtype", None) not in (None, np.dtype(object))}  # no strings
    values.update(params or {})
    _check_parameters(export, values)
    fn = CompiledNet(export.predict_net, values, export.outputs or None, jit=jit)
    unknown = [n for n in fn.input_names if n not in export.inputs]
    if unknown:
        reader = fn.first_reader[unknown[0]]
        raise MissingBlobError(
            f"{reader.where}: reads blob '{unknown[0]}', which is neither an input of the predictor export "
            f"({', '.join(export.inputs) or 'none'}) nor a parameter its init nets load"
        )
    fn.input_names = tuple(n for n in export.inputs if n in fn.input_names)
    return fn


def _check_parameters(export: PredictorExport, params: Mapping[str, Any]) -> None:
    missing = [p for p in export.parameters if p not in params]
    if missing:
        raise StorageError(
            f"{export.where}: parameter '{missing[0]}'"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + " is listed in the MetaNetDef but its init nets do not load it"
        )
