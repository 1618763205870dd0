"""The `rnn2jax` command line: the top-level parser, which each command's module adds its parser to, and
`main`. The commands: `inspect` a net or a Caffe2 DB, `verify` backward step nets, `run`, `export` or
`codegen` a net, `compare` it with real Caffe2 (made by `setup-caffe2`), `convert-params` from a Caffe2 DB,
`draw` it, `run-plan` a PlanDef, `exec` a Caffe2 script, run the bundled `demo`. Each command's module
states its `NAME`, its `HELP` line in `rnn2jax --help` and the `DESCRIPTION` atop its own --help (None: the
help line says it all), and adds its flags in `add_arguments`; the flags several commands share are
defined once, in arguments.py.

Every command keeps what it compiles in JAX's persistent compilation cache (`--no-cache` not to;
rnn2jax/compiler/cache.py), so its next run of the same net compiles nothing.

Exit status: 0 on success, 1 when a check fails, 2 on bad input (an `Rnn2JaxError`, printed on stderr with
its advice in flags: `--db-root DIR` where Python is told `db_root=DIR`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import Rnn2JaxError
from . import (
    arguments,
    codegen,
    compare,
    convert_params,
    demo,
    draw,
    exec,
    export,
    inspect,
    run,
    run_plan,
    setup_caffe2,
    verify,
)
from .arguments import NO_CACHE_HELP, OPS_HELP, CommandParser

# in `rnn2jax --help`'s order: look, check, run, convert, then the helpers
COMMANDS = (inspect, verify, run, export, codegen, compare, setup_caffe2, convert_params, draw, run_plan, exec, demo)


class VersionAction(argparse.Action):
    """`--version`: what a bug report needs, the native kernels' state included (loading them to say so)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values, option_string=None):
        import importlib.metadata

        import jax
        import jaxlib

        from ..native import status

        version = importlib.metadata.version("rnn2jax")
        print(f"rnn2jax {version} (jax {jax.__version__}, jaxlib {jaxlib.__version__})")
        print(status().describe())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="rnn2jax", description="Compile Caffe2 (recurrent) nets to JAX.")
    parser.add_argument("--ops", action="append", metavar="MODULE", help=OPS_HELP)
    parser.add_argument("--no-cache", action="store_true", help=NO_CACHE_HELP)
    parser.add_argument(
        "--version", action=VersionAction, help="print rnn2jax's, JAX's and jaxlib's versions and whether the native "
        "CPU kernels are in use (and why not), then exit"
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        parser_of_command = arguments.command(commands, module.NAME, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(parser_of_command)
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
        if not (args.no_cache or getattr(args, "no_cache_after", False)):
            from ..compiler.cache import enable_compilation_cache

            enable_compilation_cache()
        for module in [*(args.ops or ()), *(getattr(args, "ops_after", None) or ())]:
            _import_user_ops(module)
        return args.handler(args)
    except Rnn2JaxError as error:
        # the advice in flags, except for `exec`, whose script called the Python API
        said = str(error) if getattr(args, "audience", None) == "python" else error.for_command_line()
        print(f"rnn2jax: error: {said}", file=sys.stderr)
        return 2
