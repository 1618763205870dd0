"""The `rnn2jax` command line: `inspect` a net, run the bundled `demo`.

Exit status: 0 on success, 1 when a check fails, 2 on bad input (an `Rnn2JaxError`, one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import Rnn2JaxError


def _inspect(args: argparse.Namespace) -> int:
    from .load import load
    from .summary import describe

    for path in args.nets:
        print(describe(load(path), title=path))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rnn2jax", description="Compile Caffe2 (recurrent) nets to JAX.")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="list a net's ops, recurrent ops and unsupported ops")
    inspect.add_argument("nets", nargs="+", metavar="NET", help="a NetDef or PlanDef file (.pb or .pbtxt)")
    inspect.set_defaults(handler=_inspect)
    demo = commands.add_parser("demo", help="compile and run the bundled example")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except Rnn2JaxError as error:
        print(f"rnn2jax: error: {error}", file=sys.stderr)
        return 2
