"""`rnn2jax export NET -o MODEL.bin`: the net with its parameters as a standard `jax.export` artifact
(StableHLO) that `rnn2jax.serving` or plain JAX runs, for any T and N where they are symbols."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from . import arguments
from .arguments import SHAPES

if TYPE_CHECKING:
    from ..compiler.compiled_net import CompiledNet

NAME = "export"
HELP = "export a net as a standard jax.export artifact (StableHLO), for any T and N and platform"
DESCRIPTION = None
# what export's input shapes take that the other commands refuse
SYMBOLIC_DIMS = (
    "A dim may be a symbol (T, N): the export then runs at any size >= 1 for it, the same size wherever the symbol "
    "appears."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(parser)
    arguments.group(parser, SHAPES, description=SYMBOLIC_DIMS)
    parser.add_argument(
        "--input-dtype",
        action="append",
        type=arguments.name_value,
        metavar="BLOB=DTYPE",
        help="an input's dtype (repeatable); default: int32 for lengths and indices, float32 otherwise",
    )
    parser.add_argument(
        "--platforms",
        default="cpu,cuda",
        metavar="P1,P2",
        help="lower for these platforms into one artifact: cpu, cuda, rocm, tpu (default: cpu,cuda)",
    )
    parser.add_argument(
        "--params-as-input",
        action="store_true",
        help="take the parameters as the exported function's first argument (a dict by blob name) instead "
        "of baking them in, so one file serves several weight sets",
    )
    parser.add_argument("-o", "--output", required=True, metavar="MODEL.bin", help="the file to write")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    shapes, dtypes = dict(args.shape or []), dict(args.input_dtype or [])
    return export(
        args.net, args.init, args.params, shapes, dtypes, args.output, args.db_type, args.db_root,
        platforms=args.platforms, params_as_input=args.params_as_input, batch=args.batch, steps=args.steps,
        net_name=args.net_name,
    )  # fmt: skip


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
    net_name: str | None = None,
) -> int:
    """Export the net as a standard `jax.export` artifact (see rnn2jax/serving/exporter.py): a function of a dict
    of named inputs (and, with `params_as_input`, of the parameters first) returning a dict of named
    outputs. Dims may be symbols; shapes not given are inferred from the others, the parameters and
    `batch`/`steps`."""
    from ..errors import MissingBlobError, ParseError, Rnn2JaxError
    from ..ir.files import atomic_write
    from ..serving.exporter import export_net, input_specs, parse_platforms
    from .model import compile_with_params, filled_hint
    from .progress import stage

    targets = parse_platforms(platforms)  # before the work: an unknown platform is a typo
    fn = compile_with_params(
        net, init, params, db_root=db_root, db_type=db_type, net_name=net_name, inputs=list(dtypes), shapes=shapes,
        batch=batch, steps=steps,
    )  # fmt: skip
    _refuse_constant_export(fn, shapes, batch, steps, init, params)
    unknown_dtypes = [n for n in dtypes if n not in fn.input_names]
    if unknown_dtypes:
        raise MissingBlobError(
            f"--input-dtype for {', '.join(unknown_dtypes)}, which are not inputs of {fn.net.where}; "
            f"its inputs are: {', '.join(fn.input_names) or '(none)'}"
        )
    with filled_hint(fn, "--shape BLOB=D0,D1,... or --batch/--steps"):
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
    from ..errors import ShapeError

    symbols = [d for d in (batch, steps, *(d for s in shapes.values() for d in s)) if isinstance(d, str)]
    if fn.input_names or not symbols:
        return
    filled = [n for n in fn.first_reader if n in fn.params]
    sources = " and ".join(f for f, given in (("--init", init), ("--params", params)) if given) or "the parameters"
    raise ShapeError(
        f"{fn.net.where}: the export would take no inputs (a constant function), yet it was asked for symbolic "
        f"dims {', '.join(dict.fromkeys(map(str, symbols)))}: {sources} fill every blob the net reads "
        f"({', '.join(filled) or '(none)'}), and --batch/--steps change none of their shapes; name the inputs "
        f"with --shape BLOB=D0,D1,... (e.g. --shape {filled[0] if filled else 'BLOB'}=...)"
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
    found.require_all()
    inferred = found.inputs
    return {n: inferred[n].shape for n in fn.input_names}, {n: inferred[n].dtype for n in fn.input_names}
