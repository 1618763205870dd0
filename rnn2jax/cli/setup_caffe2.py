"""`rnn2jax setup-caffe2`: make the venv with real Caffe2 (torch 1.10.2, Python 3.9) that `compare`,
`verify --caffe2` and `exec` use, or, with `--source-only`, just Caffe2's Python sources, which `exec`, the
pytest plugin and `rnn2jax.caffe2.install()` load the modules rnn2jax lacks from. At their default places the
commands find them without being told."""

from __future__ import annotations

import argparse
import sys

NAME = "setup-caffe2"
HELP = "create a Python 3.9 venv with real Caffe2 (torch 1.10.2) and print its Python, or fetch its Python sources"
DESCRIPTION = """Create (or check) a Python 3.9 venv with real Caffe2, the reference of `rnn2jax compare` and
`rnn2jax verify --caffe2`, and print its Python. At the default place ($XDG_DATA_HOME/rnn2jax/caffe2-venv, else
~/.local/share/rnn2jax/caffe2-venv) those commands and `rnn2jax exec` find it themselves.

With --source-only, fetch only Caffe2's Python sources (no Python 3.9 needed): the caffe2/**/*.py files of the
torch 1.10.2 wheel, nothing else of it, put in place whole, and print the caffe2 package directory. At the default
place ($XDG_DATA_HOME/rnn2jax/caffe2-source, else ~/.local/share/rnn2jax/caffe2-source) `rnn2jax exec`, the
pytest plugin and rnn2jax.caffe2.install() load the caffe2.python modules rnn2jax does not implement (Caffe2's
test utilities) from it without being told. An existing tree there is kept, unless --wheel is given."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--python", metavar="PYTHON", help="the Python 3.9 to build it from (default: found)")
    parser.add_argument("--venv", metavar="DIR", help="where (default: the default place, see above)")
    parser.add_argument(
        "--source-only",
        action="store_true",
        help="fetch only Caffe2's Python sources (about 45 MB downloaded), not a venv",
    )
    parser.add_argument(
        "--dest",
        metavar="DIR",
        help="with --source-only: where the sources go (DIR/caffe2; default: the default place, see above)",
    )
    parser.add_argument(
        "--wheel",
        metavar="FILE",
        help="with --source-only: a torch 1.10.2 wheel already downloaded (any platform) to take them from",
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from ..errors import BadArgumentError

    if args.source_only:
        if args.python or args.venv:
            raise BadArgumentError("setup-caffe2 --source-only makes no venv: --python and --venv do not apply")
        return _source_only(args)
    if args.dest or args.wheel:
        raise BadArgumentError("setup-caffe2: --dest and --wheel go with --source-only")
    return _venv(args)


def _source_only(args: argparse.Namespace) -> int:
    from ..caffe2.source_tree import SOURCE_ENV, default_source_place, setup_source

    package = setup_source(args.dest, args.wheel)
    print(package)
    if package.parent != default_source_place():
        print(f"pass it as --caffe2-source {package}, or export {SOURCE_ENV}={package}", file=sys.stderr)
    else:
        print("exec, the pytest plugin and rnn2jax.caffe2.install() find it here without being told", file=sys.stderr)
    return 0


def _venv(args: argparse.Namespace) -> int:
    import subprocess

    from ..checking.oracle import create_environment
    from ..checking.oracle.environment import default_venv
    from ..errors import Rnn2JaxError

    venv = args.venv or str(default_venv())
    try:
        python = create_environment(venv, args.python)
    except (OSError, subprocess.CalledProcessError) as error:
        raise Rnn2JaxError(f"cannot create the Caffe2 environment in {venv}: {error}") from None
    print(python)
    if venv != str(default_venv()):
        print(f"pass it as --caffe2 {python}, or export RNN2JAX_CAFFE2_PYTHON={python}", file=sys.stderr)
    else:
        print("compare, verify --caffe2 and exec find it here without being told", file=sys.stderr)
    return 0
