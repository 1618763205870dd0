"""`rnn2jax run NET`: compile a net with its parameters and run it on arrays from .npy/.npz files."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import arguments
from .arguments import INPUTS

NAME = "run"
HELP = "run a net on arrays from .npy/.npz files"
DESCRIPTION = """Run NET (a net file, a plan's net, or a predictor export) on the input values given, and print a
summary of its outputs or save them. Inputs the init net or --params fill keep those values unless given."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(parser)
    arguments.group(parser, INPUTS)
    parser.add_argument("-o", "--output", metavar="OUT.npz", help="save the outputs here (default: print a summary)")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return run(
        args.net, args.init, args.params, args.input or [], args.inputs, args.output, args.db_root, args.db_type,
        net_name=args.net_name,
    )  # fmt: skip


def run(
    net: str,
    init: str | None,
    params: str | None,
    named: Sequence[tuple[str, str]],
    bundle: str | None,
    output: str | None,
    db_root: str | None = None,
    db_type: str | None = None,
    *,
    net_name: str | None = None,
) -> int:
    import numpy as np

    from ..runtime.params import save_params
    from .model import check_missing, compile_with_params, filled_hint, gather_inputs, summarize
    from .progress import stage

    inputs = gather_inputs(named, bundle)
    fn = compile_with_params(
        net, init, params, db_root=db_root, db_type=db_type, net_name=net_name, inputs=list(inputs)
    )
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
