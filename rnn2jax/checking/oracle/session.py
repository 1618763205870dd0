"""How the commands reach real Caffe2: which interpreter, a started oracle, and Caffe2's refusals on one line.

`rnn2jax compare` and `rnn2jax verify --caffe2` share these; the interpreter comes from `--caffe2`, else
`$RNN2JAX_CAFFE2_PYTHON`, else the venv `rnn2jax setup-caffe2` made at its default place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import Advice, BadArgumentError, Rnn2JaxError
from .client import Caffe2Oracle
from .environment import caffe2_python as venv_python
from .environment import default_venv

CAFFE2_PYTHON_ENV = "RNN2JAX_CAFFE2_PYTHON"


def find_caffe2_python(python: str | os.PathLike | None = None) -> str | None:
    """The interpreter of the Caffe2 venv, where there is one: as given, else $RNN2JAX_CAFFE2_PYTHON, else
    that of the venv `rnn2jax setup-caffe2` made at its default place (`default_venv()`), else None."""
    if python or os.environ.get(CAFFE2_PYTHON_ENV):
        return str(python or os.environ[CAFFE2_PYTHON_ENV])
    default = venv_python(default_venv())
    return str(default) if default.exists() else None


def caffe2_python(python: str | os.PathLike | None) -> str:
    """The interpreter of the Caffe2 venv (`find_caffe2_python`), else an error that says how to get one."""
    found = find_caffe2_python(python)
    if found is None:
        raise BadArgumentError(
            f"no real Caffe2 to compare with: none given, ${CAFFE2_PYTHON_ENV} is not set and there is no "
            f"{venv_python(default_venv())}",
            advice=Advice(
                "run `rnn2jax setup-caffe2` (it makes that venv), or pass caffe2=PYTHON, the interpreter of a "
                "Caffe2 venv",
                "run `rnn2jax setup-caffe2` (it makes that venv, which --caffe2 then finds), or pass --caffe2 "
                "PYTHON, the interpreter of a Caffe2 venv",
            ),
        )
    if not Path(found).exists():
        raise BadArgumentError(
            f"no Caffe2 interpreter at {found}: run `rnn2jax setup-caffe2` and pass the Python it prints"
        )
    return found


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
    if "expects elements to be int" in text:
        return Rnn2JaxError(
            f"real Caffe2 refused {what}: {text} (inputs drawn at random are float32 except sequence lengths)",
            advice=Advice("give integer inputs with inputs=", "give integer inputs with --input BLOB=FILE.npy"),
        )
    return Rnn2JaxError(f"real Caffe2 refused {what}: {text}")
