"""What the model group names, made runnable: NET (a net file, a plan's net with `--net`, or a predictor
export), its parameters (`--init`, `--params`, `--db-root`) and its input values (`--input`, `--inputs`).
`run`, `export`, `codegen`, `verify` and `compare` load the model through here, so each flag means the same
in all of them."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..compiler.compiled_net import CompiledNet, as_net, compile, run_init_net
from ..errors import BadArgumentError, MissingBlobError, Rnn2JaxError, ShapeError
from ..runtime.params import load_array, load_arrays, load_params
from .progress import stage


def pick_nets(path: str, net_name: str | None, init: str | None) -> tuple[Any, Any]:
    """(net, init net) as `--net` and `--init` name them: NET itself, or with `--net` the net of that name in
    NET's plan (a NetDef message); `--init` a file, or the name of another net of that plan."""
    plan_init = init is not None and not os.path.exists(init)
    if net_name is None and not plan_init:
        return path, init
    from ..checking.comparison import pick_net
    from ..ir.wire import read_message
    from ..proto import caffe2_pb2 as pb

    message = read_message(path)
    if plan_init and isinstance(message, pb.PlanDef) and init in {n.name for n in message.network}:
        init = pick_net(message, init, "plan")
    if net_name is None:
        return path, init
    if isinstance(message, pb.NetDef) and net_name != message.name:
        raise BadArgumentError(f"--net {net_name}: {path} holds one net, '{message.name}', not a plan")
    return pick_net(message, net_name), init


def compile_with_params(
    net_path: str,
    init: str | None,
    params: str | None,
    seed: int = 0,
    db_root: str | None = None,
    db_type: str | None = None,
    *,
    net_name: str | None = None,
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
        source, init = pick_nets(net_path, net_name, init)
        net = as_net(source)
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
            f"{error.for_command_line()}; note: {', '.join(filled)} {'is' if len(filled) == 1 else 'are'} filled "
            f"by the init net or --params and keep{'s' if len(filled) == 1 else ''} that value unless named as an "
            f"input ({flags})"
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
