"""The `rnn2jax` command line: `inspect` a net or a Caffe2 DB (a predictor export's nets too), `verify` its
backward step nets, `run` or `export` it (a net file or a predictor export), `compare` it with real Caffe2
(made by `setup-caffe2`), `convert-params` from a Caffe2 DB to .npz, `draw` it, `run-plan` a PlanDef, run the
bundled `demo`.

Exit status: 0 on success, 1 when a check fails, 2 on bad input (an `Rnn2JaxError`, one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import Rnn2JaxError


def _inspect(args: argparse.Namespace) -> int:
    from .db import guess_db_type, inspect_db
    from .predictor import inspect_export

    for path in args.nets:
        db_type = args.db_type or guess_db_type(path)
        if db_type is not None:
            print(inspect_db(path, db_type))
            export = inspect_export(path, db_type)
            if export:
                print(export)
            continue
        from ..ir.loader import load
        from .summary import describe

        print(describe(load(path), title=path))
    return 0


def _convert_params(args: argparse.Namespace) -> int:
    from .db import convert_params, report_skipped

    report_skipped(convert_params(args.db, args.db_type, args.output))
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
    from ..checking.verification import verify
    from .predictor import verify_sources

    net, init, params = verify_sources(args.net, args.init, args.db_type)  # a predictor export's, if it is one
    report = verify(
        net,
        shapes=dict(args.shape or []),
        seed=args.seed,
        dtype=args.dtype,
        init_net=init,
        params=params,
        finite_differences=args.fd,
        caffe2=_caffe2_arg(args.caffe2),
        db_root=args.db_root,
        batch=args.batch,
        steps=args.steps,
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

    named = args.input or []
    return run(args.net, args.init, args.params, named, args.inputs, args.output, args.db_root, args.db_type)


def _export(args: argparse.Namespace) -> int:
    from .commands import export

    shapes, dtypes = dict(args.input_shape or []), dict(args.input_dtype or [])
    return export(
        args.net, args.init, args.params, shapes, dtypes, args.output, args.db_type, args.db_root,
        platforms=args.platforms, params_as_input=args.params_as_input, batch=args.batch, steps=args.steps,
    )  # fmt: skip


def _codegen(args: argparse.Namespace) -> int:
    from .codegen import codegen

    return codegen(args.net, args.init, args.params, args.output, args.db_root, args.db_type, args.input or [])


def _export_dim(text: str) -> int | str:
    """A dim for `export`: a size, or a symbol name (jax.export shape polymorphism: any size >= 1)."""
    from ..serving.exporter import parse_dim

    try:
        return parse_dim(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _export_shape_arg(text: str) -> tuple[str, tuple[int | str, ...]]:
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected blob=D0,D1,... (sizes or symbols like T, N), got {text!r}")
    return name, tuple(_export_dim(d) for d in dims.split(",") if d.strip())


def _caffe2_arg(value: str | None) -> str | None:
    """`--caffe2 PYTHON`, or `--caffe2` alone for $RNN2JAX_CAFFE2_PYTHON; None when not asked for."""
    if value is None:
        return None
    from ..checking.oracle.session import caffe2_python

    return caffe2_python(value or None)


def _compare(args: argparse.Namespace) -> int:
    from ..checking.comparison import compare
    from ..checking.oracle.session import caffe2_python
    from ..runtime.params import load_params
    from .commands import gather_inputs

    python = caffe2_python(args.caffe2)  # before any work: say at once when there is no Caffe2
    report = compare(
        args.net,
        init_net=args.init,
        params=load_params(args.params) if args.params else None,
        inputs=gather_inputs(args.input or [], args.inputs),
        shapes=dict(args.shape or []),
        seed=args.seed,
        net_name=args.net_name,
        caffe2=python,
        batch=args.batch,
        steps=args.steps,
    )
    print(report.to_json() if args.json else report)
    return 0 if report.ok else 1


def _setup_caffe2(args: argparse.Namespace) -> int:
    import subprocess

    from ..checking.oracle import create_environment

    venv = args.venv or _default_caffe2_venv()
    try:
        python = create_environment(venv, args.python)
    except (OSError, subprocess.CalledProcessError) as error:
        raise Rnn2JaxError(f"cannot create the Caffe2 environment in {venv}: {error}") from None
    print(python)
    print(f"pass it as --caffe2 {python}, or export RNN2JAX_CAFFE2_PYTHON={python}", file=sys.stderr)
    return 0


def _default_caffe2_venv() -> str:
    import os
    from pathlib import Path

    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(data) / "rnn2jax" / "caffe2-venv")


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo()


def _run_plan(args: argparse.Namespace) -> int:
    from .commands import run_plan

    return run_plan(args.plan, args.db_root, args.iters, args.log or [], args.tensorboard)


def _draw(args: argparse.Namespace) -> int:
    from .draw import draw

    return draw(args.net, args.output, args.net_name, args.rankdir)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _run_limit(text: str) -> tuple[str, int]:
    net, _, count = text.rpartition("=")
    if not net:
        raise argparse.ArgumentTypeError(f"expected NET=N, got {text!r}")
    return net, _positive(count)


def _exec(args: argparse.Namespace) -> int:
    from ..caffe2.run_script import run_script

    return run_script(args.script, args.script_args, max_runs=dict(args.max_runs or ()), source=args.caffe2_source)


_EXPORT_DB_TYPE_HELP = (
    "read NET as a predictor export (what Caffe2's predictor_exporter.save_to_db wrote) in a DB of this type "
    "(minidb, lmdb, leveldb, rocksdb); without it an export is recognised by its content"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rnn2jax", description="Compile Caffe2 (recurrent) nets to JAX.")
    parser.add_argument(
        "--ops",
        action="append",
        metavar="MODULE",
        help="import MODULE (a dotted module name or a .py file) first: it registers user ops with "
        "rnn2jax.register_op (repeatable)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect", help="list a net's ops, recurrent ops and unsupported ops, or a Caffe2 DB's blobs"
    )
    inspect.add_argument(
        "nets", nargs="+", metavar="NET", help="a NetDef or PlanDef file (.pb or .pbtxt), or a Caffe2 DB"
    )
    inspect.add_argument(
        "--db-type",
        metavar="TYPE",
        help="read the paths as Caffe2 DBs of this type (minidb, lmdb, leveldb, rocksdb); without it a DB is "
        "recognised by its content",
    )
    inspect.set_defaults(handler=_inspect)
    convert = commands.add_parser(
        "convert-params", help="write a Caffe2 DB's tensors to an .npz file or an Orbax checkpoint directory"
    )
    convert.add_argument("db", metavar="DB", help="a Caffe2 DB (what Save wrote)")
    convert.add_argument("--db-type", default="minidb", metavar="TYPE", help="minidb (default), lmdb, leveldb, rocksdb")
    convert.add_argument(
        "-o", "--output", required=True, metavar="OUT",
        help="PARAMS.npz, or a new directory for an Orbax checkpoint (needs the orbax extra)",
    )  # fmt: skip
    convert.set_defaults(handler=_convert_params)
    check = commands.add_parser(
        "verify", help="check hand-built backward step nets against jax.grad (exit 1 on mismatch)"
    )
    check.add_argument("net", metavar="NET", help="a NetDef or PlanDef file, or a predictor export (a Caffe2 DB)")
    check.add_argument("--init", metavar="INIT", help="an init net that creates the parameters")
    check.add_argument("--db-type", metavar="TYPE", help=_EXPORT_DB_TYPE_HELP)
    check.add_argument("--db-root", metavar="DIR", help="where the init net's databases (relative paths) are")
    check.add_argument(
        "--shape", action="append", type=_shape_arg, metavar="BLOB=D0,D1,...", help="shape of an input blob"
    )
    check.add_argument(
        "--batch", type=_positive, metavar="N", help="batch size: with --steps, infers the shapes not given "
        "(data inputs an init net fills are drawn at random with the shapes they give; parameters keep theirs)",
    )  # fmt: skip
    check.add_argument("--steps", type=_positive, metavar="T", help="sequence length (see --batch)")
    check.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument(
        "--fd", action="store_true", help="also compare with central finite differences, computed in float64"
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--caffe2",
        nargs="?",
        const="",
        metavar="PYTHON",
        help="also run real Caffe2's RecurrentNetworkGradient (the Python of `rnn2jax setup-caffe2`; "
        "alone: $RNN2JAX_CAFFE2_PYTHON) and report its error against jax.grad",
    )
    check.set_defaults(handler=_verify)
    run = commands.add_parser("run", help="run a net on arrays from .npy/.npz files")
    export = commands.add_parser(
        "export", help="export a net as a standard jax.export artifact (StableHLO), for any T and N and platform"
    )
    for sub in (run, export):
        sub.add_argument(
            "net", metavar="NET", help="a NetDef file (.pb or .pbtxt), or a predictor export (a Caffe2 DB)"
        )
        sub.add_argument("--init", metavar="INIT", help="an init net that creates the parameters")
        sub.add_argument("--params", metavar="P.npz", help="parameters by blob name (override the init net)")
        sub.add_argument("--db-type", metavar="TYPE", help=_EXPORT_DB_TYPE_HELP)
    for sub in (run, export):
        sub.add_argument("--db-root", metavar="DIR", help="where the init net's databases (relative paths) are")
    run.add_argument("--input", action="append", type=_name_value_arg, metavar="BLOB=FILE.npy", help="one input array")
    run.add_argument("--inputs", metavar="FILE.npz", help="input arrays by blob name")
    run.add_argument("--output", metavar="OUT.npz", help="save the outputs here (default: print a summary)")
    run.set_defaults(handler=_run)
    export.add_argument(
        "--input-shape",
        action="append",
        type=_export_shape_arg,
        metavar="BLOB=D0,D1,...",
        help="an input's shape; a dim may be a symbol (T, N): the export then runs at any size >= 1 for it, "
        "the same size wherever the symbol appears",
    )
    export.add_argument(
        "--batch", type=_export_dim, metavar="N", help="the batch size, or a symbol: shapes not given are inferred"
    )
    export.add_argument("--steps", type=_export_dim, metavar="T", help="the sequence length, or a symbol")
    export.add_argument(
        "--platforms",
        default="cpu,cuda",
        metavar="P1,P2",
        help="lower for these platforms into one artifact: cpu, cuda, rocm, tpu (default: cpu,cuda)",
    )
    export.add_argument(
        "--params-as-input",
        action="store_true",
        help="take the parameters as the exported function's first argument (a dict by blob name) instead "
        "of baking them in, so one file serves several weight sets",
    )
    export.add_argument(
        "--input-dtype",
        action="append",
        type=_name_value_arg,
        metavar="BLOB=DTYPE",
        help="default: int32 for lengths and indices, float32 otherwise",
    )
    export.add_argument("-o", "--output", required=True, metavar="MODEL.bin", help="the file to write")
    export.set_defaults(handler=_export)
    codegen = commands.add_parser(
        "codegen", help="write a net as a standalone JAX module (jax and numpy only) plus its parameters (.npz)"
    )
    codegen.add_argument(
        "net", metavar="NET", help="a NetDef file (.pb or .pbtxt), or a predictor export (a Caffe2 DB)"
    )
    codegen.add_argument("--init", metavar="INIT", help="an init net that creates the parameters")
    codegen.add_argument("--params", metavar="P.npz", help="parameters by blob name (override the init net)")
    codegen.add_argument("--db-type", metavar="TYPE", help=_EXPORT_DB_TYPE_HELP)
    codegen.add_argument("--db-root", metavar="DIR", help="where the init net's databases (relative paths) are")
    codegen.add_argument(
        "--input", action="append", metavar="BLOB",
        help="make BLOB an input of apply even though the init net or --params fill it (repeatable); what the "
        "init net fills for one sample (shapes that follow the batch size or sequence length) already is",
    )  # fmt: skip
    codegen.add_argument(
        "-o", "--output", required=True, metavar="MODEL.py", help="the module to write; MODEL.npz goes beside it"
    )
    codegen.set_defaults(handler=_codegen)
    versus = commands.add_parser(
        "compare",
        help="run a net in rnn2jax and in real Caffe2 on the same arrays; compare every blob (exit 1 on mismatch)",
        description="Run NET in rnn2jax and in real Caffe2 on the same parameters and inputs, and compare every "
        "blob it writes (a training net's gradients and updated parameters too). Inputs not given are drawn "
        "at random from --shape (sequence lengths in [0, T]). Ops that read files or databases are left out "
        "and what they write must be given. For a PlanDef, one of its nets runs once (--net); `rnn2jax "
        "run-plan` runs whole plans.",
    )
    versus.add_argument("net", metavar="NET", help="a NetDef or PlanDef file (.pb or .pbtxt)")
    versus.add_argument("--net", dest="net_name", metavar="NAME", help="the plan's net to compare")
    versus.add_argument("--init", metavar="INIT", help="an init net file (or, in a plan, the name of its init net)")
    versus.add_argument("--params", metavar="P.npz", help="parameters by blob name (override the init net)")
    versus.add_argument("--input", action="append", type=_name_value_arg, metavar="BLOB=FILE.npy", help="an input")
    versus.add_argument("--inputs", metavar="FILE.npz", help="input arrays by blob name")
    versus.add_argument(
        "--shape", action="append", type=_shape_arg, metavar="BLOB=D0,D1,...", help="draw this input at random"
    )
    versus.add_argument("--batch", type=_positive, metavar="N", help="batch size: infer the shapes not given")
    versus.add_argument("--steps", type=_positive, metavar="T", help="sequence length: infer the shapes not given")
    versus.add_argument("--seed", type=int, default=0, help="for random inputs and the init net's fills")
    versus.add_argument(
        "--caffe2", metavar="PYTHON", help="the Python of the Caffe2 venv (default: $RNN2JAX_CAFFE2_PYTHON)"
    )
    versus.add_argument("--json", action="store_true", help="print the report as JSON")
    versus.set_defaults(handler=_compare)
    setup = commands.add_parser(
        "setup-caffe2", help="create a Python 3.9 venv with real Caffe2 (torch 1.10.2) and print its Python"
    )
    setup.add_argument("--python", metavar="PYTHON", help="the Python 3.9 to build it from (default: found)")
    setup.add_argument("--venv", metavar="DIR", help="where (default: ~/.local/share/rnn2jax/caffe2-venv)")
    setup.set_defaults(handler=_setup_caffe2)
    plan = commands.add_parser(
        "run-plan",
        help="run a PlanDef (training plans) in a workspace, with a progress line; Ctrl-C stops it",
        description="Run PLAN's execution steps the way Caffe2's RunPlan did, in a fresh workspace. "
        "Ctrl-C stops between iterations and prints where (exit status 130).",
    )
    plan.add_argument("plan", metavar="PLAN", help="a PlanDef file (.pb or .pbtxt)")
    plan.add_argument("--db-root", metavar="DIR", help="where the plan's databases (relative paths) are")
    plan.add_argument("--iters", type=_positive, metavar="N", help="run every execution step at most N iterations")
    plan.add_argument("--log", action="append", metavar="BLOB", help="show this blob while running and at the end")
    plan.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write each --log blob (its mean when not one value) as a TensorBoard scalar at each new value; "
        "without --log, the blobs whose name holds 'loss' (needs the tensorboard extra)",
    )
    plan.set_defaults(handler=_run_plan)
    picture = commands.add_parser(
        "draw",
        help="draw a net as SVG/PNG/PDF/DOT: each RecurrentNetwork a box holding its step nets, links as edges",
        description="Draw NET as Caffe2's net_drawer did (ops as boxes, blobs as ellipses), each RecurrentNetwork "
        "as a box holding its step net and backward step net, with its links, aliases and recurrent states as "
        "labelled edges. .svg, .png and .pdf need the draw extra and Graphviz's dot; .dot needs nothing.",
    )
    picture.add_argument("net", metavar="NET", help="a NetDef or PlanDef file (.pb or .pbtxt)")
    picture.add_argument(
        "-o", "--output", metavar="OUT",
        help="OUT.svg, .png, .pdf or .dot; - prints the DOT (default: NET's file name as .svg, here)",
    )  # fmt: skip
    picture.add_argument(
        "--net", dest="net_name", metavar="NAME",
        help="the plan's net to draw (default: the one with a RecurrentNetwork, the training net first)",
    )  # fmt: skip
    picture.add_argument(
        "--rankdir", choices=("TB", "LR"), default="TB", help="top to bottom (default) or left to right (net_drawer's)"
    )
    picture.set_defaults(handler=_draw)
    script = commands.add_parser(
        "exec",
        help="run a Caffe2 Python script unchanged, with `import caffe2` resolving to rnn2jax",
        description="Run SCRIPT as `python SCRIPT ARGS` would, with `import caffe2` on rnn2jax.",
    )
    script.add_argument("script", metavar="SCRIPT", help="the Caffe2 Python script")
    script.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    script.add_argument(
        "--max-runs",
        action="append",
        metavar="NET=N",
        type=_run_limit,
        help="stop the script (exit status 0) when it would run net NET (workspace.RunNet) more than N times; "
        "for scripts that train until killed (repeatable)",
    )
    script.add_argument(
        "--caffe2-source",
        metavar="DIR",
        help="a caffe2 package directory of Caffe2's Python sources: modules rnn2jax does not provide "
        "(Caffe2's test utilities) are loaded from it",
    )
    script.set_defaults(handler=_exec)
    demo = commands.add_parser("demo", help="compile and run the bundled example")
    demo.set_defaults(handler=_demo)
    return parser


def _import_user_ops(module: str) -> None:
    """Run the user's op-registering module (their own code, named on the command line)."""
    import importlib
    import importlib.util
    from pathlib import Path

    from ..errors import RegistrationError

    try:
        if module.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(module).stem, module)
            if spec is None or spec.loader is None or not Path(module).is_file():
                raise FileNotFoundError(f"no such file: {module}")
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        else:
            importlib.import_module(module)
    except Rnn2JaxError:
        raise
    except Exception as error:  # the user's code: report whatever it raised, with where it came from
        raise RegistrationError(f"--ops {module}: {type(error).__name__}: {error}") from error


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for module in args.ops or ():
            _import_user_ops(module)
        if args.command in ("verify", "compare"):
            from .progress import stage

            with stage("verifying" if args.command == "verify" else "comparing with real Caffe2"):
                return args.handler(args)
        return args.handler(args)
    except Rnn2JaxError as error:
        print(f"rnn2jax: error: {error}", file=sys.stderr)
        return 2
