"""`rnn2jax run` and `rnn2jax export`: compile a net with its parameters, then run it on arrays from
files or export it as StableHLO (`jax.export`) for `rnn2jax.serving`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from .compile import CompiledNet, as_net, compile, run_init_net
from .errors import MissingBlobError, ParseError, Rnn2JaxError, ShapeError
from .params import load_array, load_arrays, load_params, save_params
from .progress import stage


def compile_with_params(
    net_path: str,
    init: str | None,
    params: str | None,
    seed: int = 0,
    db_root: str | None = None,
    db_type: str | None = None,
) -> CompiledNet:
    """The net, with parameters from the init net and/or an `.npz` file (the file wins on a clash); an
    init net that Loads from databases reads them under `db_root`. A predictor export (a Caffe2 DB,
    recognised by content unless `db_type` is given) brings its own init nets and parameters."""
    from .predictor_commands import export_db_type, load_export

    kind = export_db_type(net_path, db_type)
    if kind is not None:
        return load_export(net_path, kind, init, params, seed)
    with stage(f"loading {net_path}"):
        net = as_net(net_path)
    values: dict[str, Any] = {}
    if init is not None:
        with stage("running the init net"):
            values.update(run_init_net(init, seed, db_root))
    if params is not None:
        values.update(load_params(params))
    return compile(net, params=values, seed=seed)


def gather_inputs(named: Sequence[tuple[str, str]], bundle: str | None) -> dict[str, np.ndarray]:
    """Inputs from `--inputs file.npz` and `--input name=file.npy` (the latter win)."""
    inputs = dict(load_arrays(bundle, what="inputs file")) if bundle is not None else {}
    for name, path in named:
        inputs[name] = load_array(path, what=f"input file for '{name}'")
    return inputs


def run(
    net: str,
    init: str | None,
    params: str | None,
    named: Sequence[tuple[str, str]],
    bundle: str | None,
    output: str | None,
    db_root: str | None = None,
    db_type: str | None = None,
) -> int:
    fn = compile_with_params(net, init, params, db_root=db_root, db_type=db_type)
    inputs = gather_inputs(named, bundle)
    check_missing(fn, inputs)
    with stage(f"compiling and running {len(fn.net.ops)} ops"):
        result = fn(inputs)
    outputs = {name: np.asarray(result[name]) for name in fn.output_names}  # in the net's order
    if output is not None:
        save_params(outputs, output)
        print(f"wrote {len(outputs)} output(s) to {output}: {', '.join(outputs)}")
    else:
        print(summarize(outputs))
    return 0


def check_missing(fn: CompiledNet, given: Mapping[str, Any]) -> None:
    """Name each missing input with the op that reads it and, where the op tells, what it expects."""
    if any(n not in fn.input_names for n in given):
        return  # unknown names: CompiledNet's own check reports them
    missing = [n for n in fn.input_names if n not in given]
    if missing:
        raise MissingBlobError(
            f"{fn.net.where}: missing input(s) {', '.join(missing)} ("
            + "; ".join(_expected(fn, n) for n in missing)
            + f"); the net's inputs are: {', '.join(fn.input_names)}"
        )


def _expected(fn: CompiledNet, name: str) -> str:
    reader = fn._first_reader[name]
    hint = ""
    if reader.type in ("FC", "FCTransposed") and len(reader.inputs) > 1 and reader.inputs[0] == name:
        weight = fn.params.get(reader.inputs[1])
        if weight is not None and weight.ndim == 2:
            try:
                axis = reader.int("axis", 1)
            except Rnn2JaxError:
                axis = 1
            size = weight.shape[1] if reader.type == "FC" else weight.shape[0]
            hint = f", expected {weight.dtype} with the dims from axis {axis} multiplying to {size}"
    return f"'{name}' is read by {reader.where}{hint}"


def summarize(outputs: Mapping[str, np.ndarray]) -> str:
    """One line per output: name, dtype, shape and a few statistics."""
    lines = []
    for name, value in outputs.items():
        line = f"{name}: {value.dtype}{list(value.shape)}"
        if value.size and np.issubdtype(value.dtype, np.number):
            line += f" min {value.min():.6g} max {value.max():.6g} mean {value.mean(dtype=np.float64):.6g}"
        lines.append(line)
    return "\n".join(lines) or "(no outputs)"


def export(
    net: str,
    init: str | None,
    params: str | None,
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, str],
    path: str,
    db_type: str | None = None,
    db_root: str | None = None,
) -> int:
    """Export the net for the given input shapes. The parameters become constants of the StableHLO, so
    the file is self-contained and its function takes only the net's inputs."""
    from .serving import write_exported

    fn = compile_with_params(net, init, params, db_root=db_root, db_type=db_type)
    unknown_dtypes = [n for n in dtypes if n not in shapes]
    if unknown_dtypes:
        raise MissingBlobError(f"--input-dtype for {', '.join(unknown_dtypes)}, which have no --input-shape")
    check_missing(fn, shapes)
    fn._check_inputs(shapes)  # unknown or missing inputs, with the op that reads each missing one
    names, output_names = list(fn.input_names), list(fn.output_names)
    specs = [jax.ShapeDtypeStruct(shapes[n], _dtype(dtypes.get(n, "float32"), n)) for n in names]
    constants = fn.params

    def serve(*args: jax.Array) -> tuple[jax.Array, ...]:
        outputs = fn.apply(constants, dict(zip(names, args, strict=True)))
        return tuple(outputs[n] for n in output_names)

    with stage(f"tracing and lowering {len(fn.net.ops)} ops"):
        exported = jax.export.export(jax.jit(serve))(*specs)
    header = {
        "inputs": [
            {"name": n, "shape": list(s.shape), "dtype": str(s.dtype)} for n, s in zip(names, specs, strict=True)
        ],
        "outputs": output_names,
        "params": "constants",
        "platforms": list(exported.platforms),
        "net": fn.net.name,
    }
    try:
        serialized = bytes(exported.serialize())
    except ImportError as error:  # jax serializes with the optional flatbuffers package
        raise Rnn2JaxError(f"cannot serialize the export: {error}") from None
    try:
        write_exported(path, header, serialized)
    except OSError as error:
        raise ParseError(f"cannot write '{os.fspath(path)}': {error.strerror or error}") from None
    print(f"wrote {path}: inputs {', '.join(names) or '(none)'} -> outputs {', '.join(output_names)}")
    return 0


def _dtype(name: str, blob: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        raise ShapeError(f"--input-dtype {blob}={name}: not a dtype (e.g. float32, int32)") from None


def run_plan(path: str, db_root: str | None, iters: int | None, log: Sequence[str]) -> int:
    """`rnn2jax run-plan`: run a PlanDef in a fresh workspace with a progress line, then print the
    logged blobs. Ctrl-C stops it between iterations: where it stopped goes to stderr, exit status 130."""
    import sys

    from .load import load
    from .netdef import Plan
    from .progress import IterationMeter
    from .runtime.plan import PlanInterrupted
    from .runtime.workspace import Workspace

    with stage(f"loading {path}"):
        plan = load(path)
    if not isinstance(plan, Plan):
        raise ParseError(f"{path} holds a net, not a plan: run it with `rnn2jax run`")
    workspace = Workspace(db_root=db_root)
    meter = IterationMeter(lambda: _log_text(workspace, log, "  ") if log else "")
    should_continue = (lambda i: i < iters) if iters is not None else None
    try:
        workspace.run_plan(plan, should_continue=should_continue, observer=meter, defer_interrupt=True)
    except KeyboardInterrupt as error:
        meter.close()
        where = error.where if isinstance(error, PlanInterrupted) else f"plan '{plan.name}'"
        print(f"rnn2jax: interrupted: {where}", file=sys.stderr)
        if log:
            print(_log_text(workspace, log, "\n"))
        return 130
    meter.close()
    print(f"ran plan '{plan.name}'" + (f"; logged blobs:\n{_log_text(workspace, log, chr(10))}" if log else ""))
    return 0


def _log_text(workspace: Any, names: Sequence[str], separator: str) -> str:
    """`name value` for each logged blob: its values when it holds a few, else a summary."""
    parts = []
    for name in names:
        if not workspace.has_blob(name):
            parts.append(f"{name}: (not in the workspace)")
            continue
        value = workspace.fetch(name)
        if isinstance(value, np.ndarray) and value.size <= 8 and value.dtype != object:
            shown = value.item() if value.size == 1 else value.tolist()
            parts.append(f"{name}: {shown:.6g}" if isinstance(shown, float) else f"{name}: {shown}")
        elif isinstance(value, np.ndarray) and value.dtype != object:
            parts.append(summarize({name: value}))
        else:
            parts.append(f"{name}: {type(value).__name__}")
    return separator.join(parts)
