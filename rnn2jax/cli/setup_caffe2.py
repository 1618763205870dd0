"""`rnn2jax setup-caffe2`: make the venv with real Caffe2 (torch 1.10.2, Python 3.9) that `compare`,
`verify --caffe2` and `exec` use; at its default place they find it without being told."""

from __future__ import annotations

import argparse
import sys

NAME = "setup-caffe2"
HELP = "create a Python 3.9 venv with real Caffe2 (torch 1.10.2) and print its Python"
DESCRIPTION = """Create (or check) a Python 3.9 venv with real Caffe2, the reference of `rnn2jax compare` and
`rnn2jax verify --caffe2`, and print its Python. At the default place ($XDG_DATA_HOME/rnn2jax/caffe2-venv, else
~/.local/share/rnn2jax/caffe2-venv) those commands and `rnn2jax exec` find it themselves."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--python", metavar="PYTHON", help="the Python 3.9 to build it from (default: found)")
    parser.add_argument("--venv", metavar="DIR", help="where (default: the default place, see above)")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
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
