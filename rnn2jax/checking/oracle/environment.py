"""Creating the real-Caffe2 environment: a venv of Python 3.9 with torch 1.10.2, the last wheel with Caffe2.

torch 1.10.2's wheels exist for Python 3.6 to 3.9 only, so the interpreter is looked for as given, then as
`python3.9` on PATH, then under pyenv. NumPy must stay below 1.24 and protobuf below 4 for that build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ...errors import Rnn2JaxError

# networkx: Caffe2's memonger imports it, and data_parallel_model imports memonger (seq2seq's train.py)
CAFFE2_PINS = ("torch==1.10.2", "numpy<1.24", "protobuf<4", "future", "six", "networkx<3")
_CHECK = (
    "import networkx; from caffe2.python import core, workspace; print(len(workspace.RegisteredOperators()))"
)


def _is_python39(python: str) -> bool:
    try:
        result = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[:2] == (3, 9))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.stdout.strip() == "True"


def _pyenv_pythons() -> list[str]:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if not root.is_dir():
        return []
    return [str(p / "bin" / "python") for p in sorted(root.glob("3.9*"), reverse=True)]


def find_python39(python: str | None = None) -> str:
    """The Python 3.9 interpreter to build the Caffe2 venv from, or an error saying where we looked."""
    candidates = [python] if python else [shutil.which("python3.9") or "", *_pyenv_pythons()]
    for candidate in candidates:
        if candidate and _is_python39(candidate):
            return candidate
    looked = python or "python3.9 on PATH and pyenv's versions/3.9*"
    raise Rnn2JaxError(f"no Python 3.9 interpreter found ({looked}); real Caffe2 (torch 1.10.2) needs Python 3.9")


def caffe2_python(venv: str | os.PathLike) -> Path:
    return Path(venv) / "bin" / "python"


def default_venv() -> Path:
    """Where `rnn2jax setup-caffe2` makes the venv unless told otherwise, and where `compare`, `verify --caffe2`
    and `exec` look for it: $XDG_DATA_HOME/rnn2jax/caffe2-venv (~/.local/share/rnn2jax/caffe2-venv)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "rnn2jax" / "caffe2-venv"


def create_environment(venv: str | os.PathLike, python: str | None = None, quiet: bool = False) -> Path:
    """Create (or complete) `venv` with real Caffe2 and return its interpreter. Idempotent: an existing
    venv whose Caffe2 imports is left as it is."""
    target = caffe2_python(venv)
    if target.exists() and subprocess.run([str(target), "-c", _CHECK], capture_output=True).returncode == 0:
        return target
    base = find_python39(python)
    say = (lambda *_: None) if quiet else (lambda text: print(text, file=sys.stderr))
    say(f"creating {venv} from {base} (torch 1.10.2 is about 900 MB)")
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(target), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    result = subprocess.run([*pip, *CAFFE2_PINS])
    if result.returncode != 0:
        raise Rnn2JaxError(f"pip could not install {' '.join(CAFFE2_PINS)} into {venv}")
    check = subprocess.run([str(target), "-c", _CHECK], capture_output=True, text=True)
    if check.returncode != 0:
        raise Rnn2JaxError(f"Caffe2 does not import in {venv}: {check.stderr.strip()[-500:]}")
    say(f"{venv}: real Caffe2 with {check.stdout.strip()} registered operators")
    return target
