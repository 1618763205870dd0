"""`rnn2jax exec SCRIPT [ARGS]`: run a Caffe2 Python script unchanged, with `import caffe2` on rnn2jax.

The script runs as `__main__` with `sys.argv = [SCRIPT, *ARGS]`, as `python SCRIPT ARGS` would run it.
`max_runs` stops a script that trains forever (Caffe2's char_rnn loops until killed) after a given
number of `workspace.RunNet` calls of a net: the script ends there with exit status 0.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import InputTypeError
from .import_hook import install


def run_script(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    max_runs: Mapping[str, int] | None = None,
    source: str | os.PathLike[str] | None = None,
) -> int:
    """Run `script` with `args` on rnn2jax's Caffe2 API; returns its exit status."""
    path = Path(script)
    if not path.is_file():
        raise InputTypeError(f"exec: no such script: {path}")
    install(source)
    from .python import workspace

    workspace.set_run_limits(dict(max_runs or {}))
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except workspace.RunLimitReached as stop:
        print(f"rnn2jax exec: {stop}", file=sys.stderr)
        return 0
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
        workspace.set_run_limits({})
    return 0
