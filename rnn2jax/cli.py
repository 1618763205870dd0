"""The `rnn2jax` command line: `inspect` a net, `verify` its backward step nets, `run` or `export` it, run
the bundled `demo`.

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


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected blob=D0,D1,..., got {text!r}") from None


def _verify(args: argparse.Namespace) -> int:
    from .verify import verify

    report = verify(
        args.net,
        shapes=dict(args.shape or []),
        seed=args.seed,
        dtype=args.dtype,
        init_net=args.init,
        finite_differences=args.fd,
    )
    print(report.to_json() if args.json else report)
    return 0 if report.ok else 1


def _name_value_arg(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected blob=VALUE, got {text!r}")
    return name, value


def _run(args: argparse.Namespace) -> int:
    from .commands import run

    return run(args.net, args.init, args.params, args.input or [], args.inputs, args.output)


def _export(args: argparse.Namespace) -> int:
    from .commands import export

    shapes, dtypes = dict(args.input_shape or []), dict(args.input_dtype or [])
    return export(args.net, args.init, args.params, shapes, dtypes, args.output)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rnn2jax", description="Compile Caffe2 (recurrent) nets to JAX.")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="list a net's ops, recurrent ops and unsupported ops")
    inspect.add_argument("nets", nargs="+", metavar="NET", help="a NetDef or PlanDef file (.pb or .pbtxt)")
    inspect.set_defaults(handler=_inspect)
    check = commands.add_parser(
        "verify", help="check hand-built backward step nets against jax.grad (exit 1 on mismatch)"
    )
    check.add_argument("net", metavar="NET", help="a NetDef or PlanDef file")
    check.add_argument("--init", metavar="INIT", help="an init net that creates the parameters")
    check.add_argument(
        "--shape", action="append", type=_shape_arg, metavar="BLOB=D0,D1,...", help="shape of an input blob"
    )
    check.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--fd", action="store_true", help="also compare with central finite differences")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(handler=_verify)
    run = commands.add_parser("run", help="run a net on arrays from .npy/.npz files")
    export = commands.add_parser("export", help="export a net as serialized StableHLO (jax.export)")
    for sub in (run, export):
        sub.add_argument("net", metavar="NET", help="a NetDef file (.pb or .pbtxt)")
        sub.add_argument("--init", metavar="INIT", help="an init net that creates the parameters")
        sub.add_argument("--params", metavar="P.npz", help="parameters by blob name (override the init net)")
    run.add_argument("--input", action="append", type=_name_value_arg, metavar="BLOB=FILE.npy", help="one input array")
    run.add_argument("--inputs", metavar="FILE.npz", help="input arrays by blob name")
    run.add_argument("--output", metavar="OUT.npz", help="save the outputs here (default: print a summary)")
    run.set_defaults(handler=_run)
    export.add_argument(
        "--input-shape", action="append", type=_shape_arg, metavar="BLOB=D0,D1,...", help="an input's shape"
    )
    export.add_argument(
        "--input-dtype", action="append", type=_name_value_arg, metavar="BLOB=DTYPE", help="default float32"
    )
    export.add_argument("-o", "--output", required=True, metavar="MODEL.bin", help="the file to write")
    export.set_defaults(handler=_export)
    demo = commands.add_parser("demo", help="compile and run the bundled example")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "verify":
            from .progress import stage

            with stage("verifying"):
                return args.handler(args)
        return args.handler(args)
    except Rnn2JaxError as error:
        print(f"rnn2jax: error: {error}", file=sys.stderr)
        return 2
