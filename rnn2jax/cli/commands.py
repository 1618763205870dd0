"""`rnn2jax run` and `rnn2jax export`: compile a net with its parameters, then run it on arrays from
files or export it as a standard `jax.export` artifact (StableHLO) that `rnn2jax.serving` or plain JAX runs."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..compiler.compiled_net import CompiledNet, as_net, compile, run_init_net
from ..errors import MissingBlobError, ParseError, Rnn2JaxError, ShapeError
from ..ir.files import atomic_write
from ..runtime.params import load_array, load_arrays, load_params, save_params
from .progress import stage


def compile_with_params(
    net_path: str,
    init: str | None,
    params: str | None,
    seed: int = 0,
    db_root: str | None = None,
    db_type: str | None = None,
    *,
    inputs: Sequence[str] = (),
    shapes: Mapping[str, Sequence[int | str]] | None = None,
    batch: int | str | None = None,
    steps: int | str | None = None,
) -> CompiledNet:
    """The net, with parameters from the init net and/or an `.npz` file (the file wins on a clash); an
    init net that Loads from databases reads them under `db_root`. A predictor export (a Caffe2 DB,
    recognised by content unless `db_type` is given) brings its own init nets, parameters and inputs.

    What the init net or the file fills is a parameter unless the user makes it an input (checking/input_rule.py):
    `inputs` names it (a value given for it, or a dtype), `shapes` gives its shape, or `batch`/`steps` decide
    its shape. Its filled value is then the input's default (`CompiledNet.defaults`)."""
    from ..checking.input_rule import filled_inputs
    from .predictor import export_db_type, load_export

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
    chosen = filled_inputs(net, values, named=inputs, shapes=shapes, batch=batch, steps=steps) if values else ()
    return compile(net, params=values, seed=seed, inputs=chosen)


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
    inputs = gather_inputs(named, bundle)
    fn = compile_with_params(net, init, params, db_root=db_root, db_type=db_type, inputs=list(inputs))
    check_missing(fn, {**fn.defaults, **inputs})
    with stage(f"compiling and running {len(fn.net.ops)} ops"), filled_hint(fn, "--input BLOB=FILE.npy"):
        result = fn(inputs)
    outputs = {name: np.asarray(result[name]) for name in fn.output_names}  # in the net's order
    if output is not None:
        save_params(outputs, output)
        print(f"wrote {len(outputs)} output(s) to {output}: {', '.join(outputs)}")
    else:
        print(summarize(outputs))
    return 0


@contextmanager
def filled_hint(fn: CompiledNet, flags: str) -> Iterator[None]:
    """A ShapeError while inputs meet what the init net or --params filled (breadbread's one-sample
    `hidden_init` against a batch of 4) says which filled blobs the net reads, and how to make them inputs."""
    try:
        yield
    except ShapeError as error:
        filled = [n for n in fn.first_reader if n in fn.params and f"'{n}'" in str(error)]  # those it names
        if not filled or not fn.input_names:
            raise
        raise ShapeError(
            f"{error}; note: {', '.join(filled)} {'is' if len(filled) == 1 else 'are'} filled by the init net or "
            f"--params and keep{'s' if len(filled) == 1 else ''} that value unless named as an input ({flags})"
        ) from None


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
    reader = fn.first_reader[name]
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
    shapes: Mapping[str, Sequence[int | str]],
    dtypes: Mapping[str, str],
    path: str,
    db_type: str | None = None,
    db_root: str | None = None,
    *,
    platforms: str | Sequence[str] = "cpu,cuda",
    params_as_input: bool = False,
    batch: int | str | None = None,
    steps: int | str | None = None,
) -> int:
    """Export the net as a standard `jax.export` artifact (see rnn2jax/serving/exporter.py): a function of a dict
    of named inputs (and, with `params_as_input`, of the parameters first) returning a dict of named
    outputs. Dims may be symbols; shapes not given are inferred from the others, the parameters and
    `batch`/`steps`."""
    from ..serving.exporter import export_net, input_specs, parse_platforms

    targets = parse_platforms(platforms)  # before the work: an unknown platform is a typo
    fn = compile_with_params(
        net, init, params, db_root=db_root, db_type=db_type, inputs=list(dtypes), shapes=shapes,
        batch=batch, steps=steps,
    )  # fmt: skip
    _refuse_constant_export(fn, shapes, batch, steps, init, params)
    unknown_dtypes = [n for n in dtypes if n not in fn.input_names]
    if unknown_dtypes:
        raise MissingBlobError(
            f"--input-dtype for {', '.join(unknown_dtypes)}, which are not inputs of {fn.net.where}; "
            f"its inputs are: {', '.join(fn.input_names) or '(none)'}"
        )
    with filled_hint(fn, "--input-shape BLOB=D0,D1,... or --batch/--steps"):
        shapes, dtypes = _complete_shapes(fn, shapes, dtypes, batch, steps)
    specs = input_specs({n: shapes[n] for n in fn.input_names}, dtypes)
    with stage(f"tracing and lowering {len(fn.net.ops)} ops for {', '.join(targets)}"):
        exported = export_net(fn, specs, platforms=targets, params_as_input=params_as_input)
    try:
        serialized = exported.serialize()
    except ImportError as error:  # jax serializes with the optional flatbuffers package
        raise Rnn2JaxError(f"cannot serialize the export: {error}") from None
    try:
        with atomic_write(path) as file:
            file.write(serialized)
    except OSError as error:
        raise ParseError(f"cannot write '{os.fspath(path)}': {error.strerror or error}") from None
    described = ", ".join(f"{n}[{', '.join(map(str, s.shape))}]" for n, s in specs.items()) or "(none)"
    taking = f"params ({len(exported.in_avals) - len(specs)} arrays) and " if params_as_input else ""
    print(
        f"wrote {path} for {', '.join(exported.platforms)}: {taking}inputs {described} -> "
        f"outputs {', '.join(fn.output_names)}"
    )
    return 0


def _refuse_constant_export(
    fn: CompiledNet,
    shapes: Mapping[str, Sequence[int | str]],
    batch: int | str | None,
    steps: int | str | None,
    init: str | None,
    params: str | None,
) -> None:
    """An export asked for symbolic dims whose function would take no input at all (a constant function):
    name the blobs the init net or --params filled, which are the inputs the user likely meant."""
    symbols = [d for d in (batch, steps, *(d for s in shapes.values() for d in s)) if isinstance(d, str)]
    if fn.input_names or not symbols:
        return
    filled = [n for n in fn.first_reader if n in fn.params]
    sources = " and ".join(f for f, given in (("--init", init), ("--params", params)) if given) or "the parameters"
    raise ShapeError(
        f"{fn.net.where}: the export would take no inputs (a constant function), yet it was asked for symbolic "
        f"dims {', '.join(dict.fromkeys(map(str, symbols)))}: {sources} fill every blob the net reads "
        f"({', '.join(filled) or '(none)'}), and --batch/--steps change none of their shapes; name the inputs "
        f"with --input-shape BLOB=D0,D1,... (e.g. --input-shape {filled[0] if filled else 'BLOB'}=...)"
    )


def _complete_shapes(
    fn: CompiledNet,
    shapes: Mapping[str, Sequence[int | str]],
    dtypes: Mapping[str, str],
    batch: int | str | None,
    steps: int | str | None,
) -> tuple[dict[str, Sequence[int | str]], dict[str, str]]:
    """Every input's shape and dtype: as given, the rest inferred from them, the parameters and
    `batch`/`steps` (lengths and indices are int32 unless --input-dtype says otherwise, the rest float32).
    Unknown names are refused first."""
    from ..checking.shape_inference import infer_shapes

    fn._check_inputs({**{n: None for n in fn.input_names}, **shapes})  # unknown inputs, named

    # an input the init net filled keeps its value's shape unless given or batch/steps decide another
    found = infer_shapes(
        fn.net, fn.params, dict(shapes), batch=batch, steps=steps, dtypes=dict(dtypes), defaults=fn.defaults
    )
    found.require_all("--input-shape")
    inferred = found.inputs
    return {n: inferred[n].shape for n in fn.input_names}, {n: inferred[n].dtype for n in fn.input_names}


def run_plan(
    path: str, db_root: str | None, iters: int | None, log: Sequence[str], tensorboard: str | None = None
) -> int:
    """`rnn2jax run-plan`: run a PlanDef in a fresh workspace with a progress line, then print the
    logged blobs (and with `tensorboard`, write them per iteration as TensorBoard scalars there).
    Ctrl-C stops it between iterations: where it stopped goes to stderr, exit status 130."""
    import sys

    from ..ir.loader import load
    from ..ir.netdef import Plan
    from ..runtime.plan import PlanInterrupted
    from ..runtime.workspace import Workspace
    from .progress import IterationMeter

    with stage(f"loading {path}"):
        plan = load(path)
    if not isinstance(plan, Plan):
        raise ParseError(f"{path} holds a net, not a plan: run it with `rnn2jax run`")
    workspace = Workspace(db_root=db_root)
    meter = IterationMeter(lambda: _log_text(workspace, log, "  ") if log else "")
    scalars = _scalar_logger(plan, workspace, log, tensorboard)
    observer = meter if scalars is None else _observers(scalars, meter)
    should_continue = (lambda i: i < iters) if iters is not None else None
    try:
        workspace.run_plan(plan, should_continue=should_continue, observer=observer, defer_interrupt=True)
    except KeyboardInterrupt as error:
        meter.close()
        where = error.where if isinstance(error, PlanInterrupted) else f"plan '{plan.name}'"
        print(f"rnn2jax: interrupted: {where}", file=sys.stderr)
        if log:
            print(_log_text(workspace, log, "\n"))
        return 130
    finally:
        if scalars is not None:
            scalars.close()  # what was logged before an error or Ctrl-C is kept
    meter.close()
    print(f"ran plan '{plan.name}'" + (f"; logged blobs:\n{_log_text(workspace, log, chr(10))}" if log else ""))
    if scalars is not None:
        written = ", ".join(f"{name} ({count})" for name, count in scalars.steps.items())
        print(f"wrote TensorBoard scalars to {tensorboard}: {written}")
    return 0


def _observers(*observers: Any) -> Any:
    def observe(path: tuple[str, ...], done: int, total: int | None) -> None:
        for observer in observers:
            observer(path, done, total)

    return observe


def _scalar_logger(plan: Any, workspace: Any, log: Sequence[str], logdir: str | None) -> Any:
    """`--tensorboard`'s observer, for the --log blobs or else the blobs named like a loss (said on stderr)."""
    if logdir is None:
        return None
    import sys

    from .tensorboard_log import ScalarLogger, loss_blobs

    names = list(log) or loss_blobs(plan)
    if not names:
        raise MissingBlobError(
            f"--tensorboard: plan '{plan.name}' writes no blob named like a loss; name the blobs to log with --log"
        )
    if not log:
        print(f"rnn2jax: --tensorboard logs {', '.join(names)} (choose others with --log)", file=sys.stderr)
    return ScalarLogger(workspace, names, logdir)


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
