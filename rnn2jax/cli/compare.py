"""`rnn2jax compare NET`: run a net in rnn2jax and in real Caffe2 on the same parameters and inputs and
compare every blob it writes; exit status 1 when one differs."""

from __future__ import annotations

import argparse

from . import arguments
from .arguments import CAFFE2, INPUTS, SHAPES

NAME = "compare"
HELP = "run a net in rnn2jax and in real Caffe2 on the same arrays; compare every blob (exit 1 on mismatch)"
DESCRIPTION = """Run NET in rnn2jax and in real Caffe2 on the same parameters and inputs, and compare every blob it
writes (a training net's gradients and updated parameters too). Ops that read files or databases are left out of both
runs and what they write must be given, except the init net's, which rnn2jax runs with --db-root and gives Caffe2
what they load. For a plan, one of its nets runs once (--net); `rnn2jax run-plan` runs whole plans."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(parser)
    arguments.group(
        parser, SHAPES, description="Inputs not given are drawn at random with these shapes (sequence lengths in "
        "[0, T])."
    )  # fmt: skip
    arguments.group(parser, INPUTS)
    arguments.group(
        parser, CAFFE2, description="compare needs real Caffe2: without --caffe2 it looks where --caffe2 alone does."
    )
    arguments.add(parser, "--seed", "--json")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from ..checking.comparison import compare
    from ..checking.oracle.session import caffe2_python
    from ..runtime.params import load_params
    from .model import gather_inputs
    from .predictor import model_sources
    from .progress import stage

    arguments.sizes_only(args, "compare")
    python = caffe2_python(args.caffe2 or None)  # before any work: say at once when there is no Caffe2
    net, init, exported = model_sources(args.net, args.init, args.db_type)  # a predictor export's, if one
    params = {**(exported or {}), **(load_params(args.params) if args.params else {})}
    with stage("comparing with real Caffe2"):
        report = compare(
            net,
            init_net=init,
            params=params or None,
            inputs=gather_inputs(args.input or [], args.inputs),
            shapes=dict(args.shape or []),
            seed=args.seed,
            net_name=args.net_name,
            caffe2=python,
            batch=args.batch,
            steps=args.steps,
            db_root=args.db_root,
        )
    print(report.to_json() if args.json else report)
    return 0 if report.ok else 1
