"""`rnn2jax verify NET`: check a training net's hand-built backward step nets against jax.grad (and, with
`--caffe2`, against real Caffe2's RecurrentNetworkGradient); exit status 1 when a gradient disagrees."""

from __future__ import annotations

import argparse

from . import arguments
from .arguments import CAFFE2, INPUTS, SHAPES

NAME = "verify"
HELP = "check hand-built backward step nets against jax.grad (exit 1 on mismatch)"
DESCRIPTION = """Check every RecurrentNetwork op's backward step net in NET against jax.grad of its forward scan, on
parameters and inputs from the init net, --params and --input/--inputs, the rest drawn at random with the shapes
given or inferred."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(parser)
    arguments.group(
        parser,
        SHAPES,
        description="Data inputs an init net fills are drawn at random with the shapes --batch/--steps give; "
        "parameters keep theirs.",
    )
    arguments.group(parser, INPUTS)
    arguments.group(
        parser,
        CAFFE2,
        description="With --caffe2, real Caffe2's RecurrentNetworkGradient is a third opinion, judged against "
        "jax.grad.",
    )
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="of the checks")
    parser.add_argument(
        "--fd", action="store_true", help="also compare with central finite differences, computed in float64"
    )
    arguments.add(parser, "--seed", "--json")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from ..checking.oracle.session import caffe2_python
    from ..checking.verification import verify
    from ..runtime.params import load_params
    from .model import gather_inputs, pick_nets
    from .predictor import model_sources
    from .progress import stage

    arguments.sizes_only(args, "verify")
    python = caffe2_python(args.caffe2 or None) if args.caffe2 is not None else None  # at once, before any work
    net, init, params = model_sources(args.net, args.init, args.db_type)  # a predictor export's, if it is one
    if params is None:
        net, init = pick_nets(net, args.net_name, init)
    values = {**(params or {}), **(load_params(args.params) if args.params else {})}
    values.update(gather_inputs(args.input or [], args.inputs))
    with stage("verifying"):
        report = verify(
            net,
            shapes=dict(args.shape or []),
            seed=args.seed,
            dtype=args.dtype,
            init_net=init,
            params=values or None,
            finite_differences=args.fd,
            caffe2=python,
            db_root=args.db_root,
            batch=args.batch,
            steps=args.steps,
        )
    print(report.to_json() if args.json else report)
    return 0 if report.ok else 1
