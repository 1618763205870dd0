"""The command line's side of predictor exports: `run`, `export`, `codegen`, `verify` and `compare` take an
export where they take a net file, and `inspect DB` lists an export's nets, inputs and outputs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import BadArgumentError
from ..serving.predictor import (
    GLOBAL_INIT_NET_TYPE,
    PREDICT_INIT_NET_TYPE,
    PREDICT_NET_TYPE,
    decode_export,
    is_predictor_export,
    predictor_names,
    read_export,
    read_meta_net_def,
)

if TYPE_CHECKING:
    from ..compiler.compiled_net import CompiledNet


def export_db_type(path: str, db_type: str | None) -> str | None:
    """The db_type to read `path` as a predictor export with: `--db-type`, else what its content says.
    None means `path` is no DB, so it is a net file."""
    from .db import guess_db_type

    return db_type or guess_db_type(path)


def _refuse_init(path: str, init: str | None) -> None:
    if init is not None:
        raise BadArgumentError(f"--init {init}: predictor export '{path}' brings its own init nets")


def load_export(path: str, db_type: str, init: str | None, params: str | None, seed: int = 0) -> CompiledNet:
    """`rnn2jax run/export` on a predictor export: its CompiledNet, `--params P.npz` replacing arrays."""
    from ..runtime.params import load_params
    from ..serving.predictor import load_model
    from .progress import stage

    _refuse_init(path, init)
    extra = load_params(params) if params is not None else None
    with stage(f"loading predictor export {path}"):
        return load_model(path, db_type, params=extra, seed=seed)


def model_sources(path: str, init: str | None, db_type: str | None) -> tuple[Any, str | None, dict | None]:
    """What `rnn2jax verify` and `compare` check: (net, init net, params). For a predictor export, its predict
    net as a NetDef message (so real Caffe2 can be sent it) and the parameters its init nets load; else NET
    and `--init` as given, and no parameters."""
    kind = export_db_type(path, db_type)
    if kind is None:
        return path, init, None
    import numpy as np

    _refuse_init(path, init)
    fn = load_export(path, kind, None, None)
    return read_export(path, kind).predict_net_def, None, {n: np.asarray(v) for n, v in fn.params.items()}


def inspect_export(path: str | os.PathLike, db_type: str) -> str:
    """For a predictor export, its predictors: nets (with op counts), inputs, outputs, parameters and model
    info; "" for any other DB."""
    if not is_predictor_export(path, db_type):
        return ""
    meta = read_meta_net_def(path, db_type)
    lines = [f"{os.fspath(path)}: predictor export"]
    info = meta.modelInfo
    fields = [f"{f.name} {getattr(info, f.name)!r}" for f in info.DESCRIPTOR.fields if info.HasField(f.name)]
    if fields:
        lines.append(f"  model info: {', '.join(fields)}")
    for name in predictor_names(meta):
        export = decode_export(meta, path, db_type, name)
        lines.append(f"  predictor {name!r}:" if name else "  predictor:")
        for kind, net in (
            (GLOBAL_INIT_NET_TYPE, export.global_init_net),
            (PREDICT_INIT_NET_TYPE, export.predict_init_net),
            (PREDICT_NET_TYPE, export.predict_net),
        ):
            if net is not None:
                lines.append(f"    {kind}: net '{net.name}', {len(net.ops)} ops")
        lines.append(f"    inputs: {', '.join(export.inputs) or '(none)'}")
        lines.append(f"    outputs: {', '.join(export.outputs) or '(none)'}")
        lines.append(f"    parameters: {len(export.parameters)}")
    return "\n".join(lines)
