"""How the commands reach real Caffe2: which interpreter, a started oracle, and Caffe2's refusals on one line.

`rnn2jax compare` and `rnn2jax verify --caffe2` share these; the interpreter comes from `--caffe2`, else
`$RNN2JAX_CAFFE2_PYTHON` (what `rnn2jax setup-caffe2` prints).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import BadArgumentError, Rnn2JaxError
from .client import Caffe2Oracle

CAFFE2_PYTHON_ENV = "RNN2JAX_CAFFE2_PYTHON"


def caffe2_python(python: str | os.PathLike | None) -> str:
    """The interpreter of the Caffe2 venv: as given, else $RNN2JAX_CAFFE2_PYTHON, else an error."""
    python = python or os.environ.get(CAFFE2_PYTHON_ENV)
    if not python:
        raise BadArgumentError(
            "no real Caffe2 to compare with: run `rnn2jax setup-caffe2`, then pass the interpreter it prints "
            f"with --caffe2 PYTHON (or set ${CAFFE2_PYTHON_ENV})"
        )
    if not Path(python).exists():
        raise BadArgumentError(
            f"no Caffe2 interpreter at {python}: run `rnn2jax setup-caffe2` and pass the Python it prints"
        )
    return str(python)


def open_oracle(caffe2: Any):
    """A started `Caffe2Oracle` (and whether we own it) from an oracle, an interpreter path, or None."""
    if isinstance(caffe2, Caffe2Oracle):
        return caffe2, False
    oracle = Caffe2Oracle(caffe2_python(caffe2))
    try:
        oracle.catalog()  # an unusable interpreter fails here, with one line that says so
    except Rnn2JaxError:
        oracle.close()
        raise
    return oracle, True


def caffe2_refused(error: Exception, what: str) -> Rnn2JaxError:
    """Caffe2's refusal on one line: its message and the op it names, without the C++ stack."""
    lines = []
    for line in str(error).strip().splitlines():
        if line.startswith(("frame #", "Exception raised from", "<omitting")):
            break
        lines.append(line.strip())
    text = " ".join(" ".join(lines).split())[:400] or type(error).__name__
    hint = ""
    if "expects elements to be int" in text:
        hint = " (inputs drawn at random are float32 except sequence lengths: give integer inputs with --input)"
    return Rnn2JaxError(f"real Caffe2 refused {what}: {text}{hint}")
