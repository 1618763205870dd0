"""`rnn2jax codegen NET [--init INIT | --params P.npz] -o model.py`: the net and its parameters, loaded
as `rnn2jax run` loads them, written as a standalone JAX module and the .npz beside it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import arguments

NAME = "codegen"
HELP = "write a net as a standalone JAX module (jax and numpy only) plus its parameters (.npz)"
DESCRIPTION = """Write NET as a standalone JAX module, MODEL.py, with its parameters in MODEL.npz beside it. The
module has no fixed shapes: what the init net fills for one sample (shapes that follow the batch size or sequence
length) is an input of apply, like the blobs named with --as-input."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(parser)
    parser.add_argument(
        "--as-input",
        action="append",
        dest="as_input",
        metavar="BLOB",
        help="make BLOB an input of apply even though the init net or --params fill it (repeatable)",
    )
    parser.add_argument(  # its old spelling, kept for scripts: --input means a value from a file elsewhere
        "--input", action="append", dest="old_as_input", metavar="BLOB", help=argparse.SUPPRESS
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="MODEL.py", help="the module to write; MODEL.npz goes beside it"
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    if args.old_as_input:
        print("rnn2jax: codegen --input BLOB is now --as-input BLOB", file=sys.stderr)
    inputs = [*(args.as_input or ()), *(args.old_as_input or ())]
    return codegen(
        args.net, args.init, args.params, args.output, args.db_root, args.db_type, inputs, net_name=args.net_name
    )


def codegen(
    net: str,
    init: str | None,
    params: str | None,
    output: str,
    db_root: str | None = None,
    db_type: str | None = None,
    inputs: Sequence[str] = (),
    *,
    net_name: str | None = None,
) -> int:
    """The module has no fixed shapes, as an export with symbolic `--batch N --steps T` has none: what the
    init net fills and those decide the shape of (its one-sample data) is an input of `apply`, like the
    blobs named in `inputs` (rnn2jax/checking/input_rule.py)."""
    from ..compiler.compiled_net import as_net
    from ..serving.codegen import check_ops, generate, module_path, write_module
    from .model import compile_with_params, pick_nets
    from .predictor import export_db_type
    from .progress import stage

    module_path(output)
    if export_db_type(net, db_type) is None:  # a net file: name every op codegen lacks before compiling
        check_ops(as_net(pick_nets(net, net_name, None)[0]))
    fn = compile_with_params(
        net, init, params, db_root=db_root, db_type=db_type, net_name=net_name, inputs=inputs, batch="N", steps="T"
    )
    with stage(f"generating code for {len(fn.net.ops)} ops"):
        source, saved = generate(fn.net, fn.params)
    path = write_module(output, source, saved)
    print(f"wrote {path} and {path.with_suffix('.npz')} ({len(saved)} parameters)")
    return 0
