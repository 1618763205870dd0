"""`rnn2jax exec SCRIPT [ARGS]`: run a Caffe2 Python script unchanged, with `import caffe2` resolving to
rnn2jax. Modules rnn2jax does not provide (Caffe2's test utilities) come from `--caffe2-source`, else from
the real Caffe2 that `rnn2jax setup-caffe2` installed, where there is one."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import arguments


def _run_limit(text: str) -> tuple[str, int]:
    net, _, count = text.rpartition("=")
    if not net:
        raise argparse.ArgumentTypeError(f"expected NET=N, got {text!r}")
    return net, arguments.positive(count)


NAME = "exec"
HELP = "run a Caffe2 Python script unchanged, with `import caffe2` resolving to rnn2jax"
DESCRIPTION = """Run SCRIPT as `python SCRIPT ARGS` would, with `import caffe2` on rnn2jax. Its errors are Python's:
they say what to pass to the API."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", metavar="SCRIPT", help="the Caffe2 Python script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    parser.add_argument(
        "--max-runs",
        action="append",
        metavar="NET=N",
        type=_run_limit,
        help="stop the script (exit status 0) when it would run net NET (workspace.RunNet) more than N times; "
        "for scripts that train until killed (repeatable)",
    )
    parser.add_argument(
        "--caffe2-source",
        metavar="DIR",
        help="a caffe2 package directory of Caffe2's Python sources: modules rnn2jax does not provide "
        "(Caffe2's test utilities) are loaded from it (default: the caffe2 package of the venv --caffe2 "
        "alone finds, if any)",
    )
    parser.set_defaults(handler=_handle, audience="python")


def _handle(args: argparse.Namespace) -> int:
    from ..caffe2.run_script import run_script

    source = args.caffe2_source or caffe2_package()
    return run_script(args.script, args.script_args, max_runs=dict(args.max_runs or ()), source=source)


def caffe2_package() -> str | None:
    """The caffe2 package of the real-Caffe2 venv that `--caffe2` alone would use ($RNN2JAX_CAFFE2_PYTHON,
    else `rnn2jax setup-caffe2`'s default place), or None when there is none."""
    from ..checking.oracle.session import find_caffe2_python

    python = find_caffe2_python()
    if python is None:
        return None
    venv = Path(python).parent.parent  # VENV/bin/python, not resolved: it links to the base interpreter
    found = sorted(venv.glob("lib/python3*/site-packages/caffe2/__init__.py"))
    return str(found[-1].parent) if found else None
