"""Predictor exports: what `caffe2.python.predictor.predictor_exporter.save_to_db` wrote, as a CompiledNet.

An export is one Caffe2 DB holding a serialized `MetaNetDef` under the key `!!META_NET_DEF` and every
parameter beside it. The MetaNetDef names the nets (a global init net whose `Load` reads the parameters
from the DB itself through the `!!PREDICTOR_DBREADER` blob, a predict-init net that zero-fills the inputs
and outputs, and the predict net) and the blob lists (inputs, outputs, parameters), each keyed by its
type, with `_<name>` appended when the export was given a name (predictor_py_utils.get_comp_name).

`load_model` reads the DB once, replays the init nets' `Load`s on what it read (source_blob_names,
strip_prefix, add_prefix, load_all, allow_incomplete, as caffe2/operators/load_save_op.h does), runs their
other ops with the compiler's lowerings, and compiles the predict net with the export's inputs and outputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import MissingBlobError, StorageError
from ..netdef import Net, Op, decode_net
from ..proto import caffe2_pb2 as pb
from ..proto import metanet_pb2
from .storage import read_blobs
from .storage.db import describe

if TYPE_CHECKING:
    from ..compile import CompiledNet

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


# ------------------------------------------------------------------------------------------------
# Load, replayed on blobs already read


def _key_to_name(stem: str, strip_prefix: str, add_prefix: str) -> str:
    """load_save_op_util::buildBlobNameFromDbKey: strip_prefix is cut at its first occurrence anywhere."""
    if strip_prefix:
        at = stem.find(strip_prefix)
        if at >= 0:
            stem = stem[at + len(strip_prefix) :]
    return add_prefix + stem


class _Sources:
    """The DBs a Load may read: the export itself (through the reader blob), or `db`/`dbs` by path."""

    def __init__(self, export_path: str, db_type: str, export_blobs: dict[str, Any]):
        self.export_path = export_path
        self.db_type = db_type
        self.cache: dict[tuple[str, str], dict[str, Any]] = {(export_path, db_type): export_blobs}

    def for_op(self, op: Op, readers: Mapping[str, tuple[str, str]]) -> list[tuple[str, str, dict[str, Any]]]:
        if op.inputs:
            found = []
            for blob in op.inputs:
                if blob not in readers:
                    raise StorageError(
                        f"{op.where}: Load reads DB reader blob '{blob}', which nothing in the export creates "
                        f"(the export's reader is '{PREDICTOR_DBREADER}')"
                    )
                found.append(readers[blob])
        else:
            db_type = op.str("db_type", "")
            paths = op.strings("dbs", ()) or ((op.str("db", ""),) if op.str("db", "") else ())
            if not db_type or not paths:
                raise StorageError(f"{op.where}: Load has no DB reader input and no db/dbs and db_type arguments")
            found = [(p if op.bool("absolute_path", False) else os.path.join(os.getcwd(), p), db_type) for p in paths]
        return [(path, kind, self.read(path, kind)) for path, kind in found]

    def read(self, path: str, db_type: str) -> dict[str, Any]:
        if (path, db_type) not in self.cache:
            self.cache[(path, db_type)] = read_blobs(path, db_type)
        return self.cache[(path, db_type)]


def replay_load(op: Op, dbs: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """The blobs a Caffe2 `Load` op writes, given every blob of the DBs it reads (by key stem)."""
    strip, add = op.str("strip_prefix", ""), op.str("add_prefix", "")
    sources = op.strings("source_blob_names", ())
    load_all = op.bool("load_all", False)
    renamed: dict[str, Any] = {}
    for _, _, blobs in dbs:
        for stem, value in blobs.items():
            renamed[_key_to_name(stem, strip, add)] = value
    if load_all:
        missing = [n for n in op.outputs if n not in renamed]
        wanted = dict(renamed)
    else:
        names = sources or op.outputs
        if len(names) != len(op.outputs):
            raise StorageError(f"{op.where}: {len(names)} source_blob_names for {len(op.outputs)} outputs")
        wanted = {out: renamed[src] for out, src in zip(op.outputs, names, strict=True) if src in renamed}
        missing = [src for out, src in zip(op.outputs, names, strict=True) if out not in wanted]
        if op.bool("allow_incomplete", False):
            missing = []
    if missing:
        where = ", ".join(describe(path, kind) for path, kind, _ in dbs)
        raise StorageError(
            f"{op.where}: Load wants blob '{missing[0]}'"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + f", which is not in {where}"
        )
    return wanted


def run_export_init_net(net: Net, env: dict[str, Any], sources: _Sources, seed: int) -> None:
    """Run an export's init net on `env` in place: Loads replayed on the DB, the other ops lowered."""
    import jax

    from ..compile import xla_out_of_memory
    from ..lower import lower

    readers = {PREDICTOR_DBREADER: (sources.export_path, sources.db_type)}
    segment: list[Op] = []

    def flush() -> None:
        if not segment:
            return
        lowered = lower(replace(net, ops=tuple(segment)))
        needed = [n for n in lowered.reads_before_writes() if n not in env]
        if needed:
            reader = lowered.reads_before_writes()[needed[0]]
            raise MissingBlobError(f"{reader.where}: reads blob '{needed[0]}', which nothing in the export creates")
        arrays = {n: v for n, v in env.items() if isinstance(v, np.ndarray | jax.Array) and v.dtype != object}
        with xla_out_of_memory(net.where):
            env.update(lowered(arrays, key=jax.random.key(seed)))
        segment.clear()

    for op in net.ops:
        if op.type == "Load":
            flush()
            env.update(replay_load(op, sources.for_op(op, readers)))
        elif op.type == "CreateDB" and op.outputs:
            flush()
            path = op.str("db", "")
            readers[op.outputs[0]] = (path, op.str("db_type", "minidb"))
        else:
            segment.append(op)
    flush()


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
    from ..compile import CompiledNet

    if not isinstance(path, str | os.PathLike):
        raise StorageError(f"load_model: path must be a str or os.PathLike, got {type(path).__name__}")
    meta, blobs = _read_meta(path, db_type, names=None)
    export = decode_export(meta, path, db_type, name)
    sources = _Sources(os.fspath(path), db_type, blobs)
    env: dict[str, Any] = {}
    run_export_init_net(export.global_init_net, env, sources, seed)
    if export.predict_init_net is not None:
        # Its ConstantFills of the inputs and outputs only gave Caffe2's workspace blobs to bind; they are
        # no parameters (an input left among them would stop being an input).
        run_export_init_net(export.predict_init_net, env, sources, seed)
    for blob in (*export.inputs, *export.outputs, PREDICTOR_DBREADER, META_NET_DEF):
        env.pop(blob, None)
    values = {n: v for n, v in env.items() if getattr(v, "dtype", None) not in (None, np.dtype(object))}  # no strings
    values.update(params or {})
    _check_parameters(export, values)
    fn = CompiledNet(export.predict_net, values, export.outputs or None, jit=jit)
    unknown = [n for n in fn.input_names if n not in export.inputs]
    if unknown:
        reader = fn._first_reader[unknown[0]]
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
