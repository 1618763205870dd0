"""`rnn2jax exec SCRIPT [ARGS]`: run a Caffe2 Python script unchanged, with `import caffe2` resolving to
rnn2jax. Modules rnn2jax does not provide (Caffe2's test utilities) come from a Caffe2 source tree, which
`rnn2jax.caffe2.install` finds (`--caffe2-source` first; `rnn2jax.caffe2.source_tree` says the order)."""

from __future__ import annotations

import argparse

from . import arguments


def _run_limit(text: str) -> tuple[str, int]:
    net, _, count = text.rpartition("=")
    if not net:
        raise argparse.ArgumentTypeError(f"expected NET=N, got {text!r}")
    return net, arguments.positive(count)


NAME = "exec"
HELP = "run a Caffe2 Python script unchanged, with `import caffe2` resolving to rnn2jax"
DESCRIPTION = """Run SCRIPT as `python SCRIPT ARGS` would, with `import caffe2` on rnn2jax. Its errors are Python's:
they say what to pass to the API. The caffe2.python modules rnn2jax does not implement (Caffe2's test utilities)
are loaded from Caffe2's own Python sources, found in this order when the script imports one: --caffe2-source,
$RNN2JAX_CAFFE2_SOURCE, the tree `rnn2jax setup-caffe2 --source-only` extracted, the caffe2 package of the
real-Caffe2 venv `rnn2jax setup-caffe2` made."""


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
        "(Caffe2's test utilities) are loaded from it (default: found, see above)",
    )
    parser.set_defaults(handler=_handle, audience="python")


def _handle(args: argparse.Namespace) -> int:
    from ..caffe2.run_script import run_script

    return run_script(args.script, args.script_args, max_runs=dict(args.max_runs or ()), source=args.caffe2_source)
