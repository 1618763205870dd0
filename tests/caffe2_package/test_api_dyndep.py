"""`dyndep.InitOpsLibrary` as real Caffe2 has it where Caffe2 loaded nothing, and an rnn2jax error where it would
have loaded a C++ library. Caffe2's scripts (seq2seq's train.py) call it with Buck targets, which are no files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rnn2jax.caffe2.python import dyndep
from rnn2jax.errors import Rnn2JaxError

ROOT = Path(__file__).resolve().parents[2]
BUCK_TARGET = "@/caffe2/caffe2/distributed:file_store_handler_ops"


def real_caffe2(code: str) -> subprocess.CompletedProcess:
    """`code` run by real Caffe2's interpreter ($RNN2JAX_CAFFE2_PYTHON, else .venv-caffe2's), or a skip."""
    python = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python"))
    if not python.exists():
        pytest.skip(f"real Caffe2 unavailable: no interpreter at {python} (`make test` makes it)")
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)


def test_a_name_that_is_no_file_is_ignored_with_caffe2s_message(capsys):
    real = real_caffe2(f"from caffe2.python import dyndep; print(repr(dyndep.InitOpsLibrary({BUCK_TARGET!r})))")
    assert real.returncode == 0, real.stderr[-2000:]
    assert real.stdout == f"Ignoring {BUCK_TARGET} as it is not a valid file.\nNone\n"

    assert dyndep.InitOpsLibrary(BUCK_TARGET) is None
    print(repr(None))
    assert capsys.readouterr().out == real.stdout
    assert dyndep.GetImportedOpsLibraries() == set()


def test_an_existing_library_is_an_rnn2jax_error_where_caffe2_would_load_it(tmp_path):
    library = tmp_path / "libmy_ops.so"
    library.write_bytes(b"not really a shared library")
    # real Caffe2 tries to load it (and fails here: it is no ELF file), having recorded it as imported
    real = real_caffe2(
        "from caffe2.python import dyndep\n"
        f"try:\n    dyndep.InitOpsLibrary({str(library)!r})\n"
        "except OSError as error:\n    print('OSError', sorted(dyndep.GetImportedOpsLibraries()))\n"
    )
    assert real.returncode == 0, real.stderr[-2000:]
    assert real.stdout == f"OSError {[str(library)]}\n"

    with pytest.raises(Rnn2JaxError) as raised:
        dyndep.InitOpsLibrary(str(library))
    message = str(raised.value)
    assert str(library) in message and "cannot load C++ op libraries" in message and "rnn2jax.register_op" in message
    assert dyndep.GetImportedOpsLibraries() == set()  # nothing was loaded


LAZY_PROGRAM = """
import tempfile
from caffe2.python import core, lazy_dyndep, workspace
seen = []
with tempfile.NamedTemporaryFile() as f:
    for trigger in (core.RefreshRegisteredOperators, lambda: workspace.CreateNet("fake")):
        lazy_dyndep.RegisterOpsLibrary(f.name)
        lazy_dyndep.SetErrorHandler(lambda e: seen.append(type(e).__name__))
        try:
            trigger()
        except Exception:  # CreateNet("fake"): no such net, once the lazy import ran
            pass
    lazy_dyndep.RegisterOpsLibrary(f.name)
    lazy_dyndep.SetErrorHandler(lambda e: seen.append(type(e).__name__))
    core.RefreshRegisteredOperators(trigger_lazy=False)
print(seen, sorted(lazy_dyndep._LAZY_IMPORTED_DYNDEPS) == [f.name])
"""


def test_lazy_op_libraries_are_imported_when_ops_are_first_needed(tmp_path):
    """Caffe2's lazy_dyndep defers loading a library to RefreshRegisteredOperators or CreateNet (not with
    trigger_lazy=False); an error while loading goes to the error handler (in Caffe2 1.10 always an
    AttributeError: lazy_dyndep calls `dyndep.InitOpLibrary`, which does not exist). The same program on both."""
    real = real_caffe2(LAZY_PROGRAM)
    assert real.returncode == 0, real.stderr[-2000:]
    script = tmp_path / "lazy.py"
    script.write_text(LAZY_PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # lazy_dyndep is Caffe2's own module, run on rnn2jax from the real-Caffe2 venv's sources
    source = sorted(Path(real.args[0]).parents[1].glob("lib/python3*/site-packages/caffe2"))
    ours = subprocess.run(
        [sys.executable, "-m", "rnn2jax", "exec", f"--caffe2-source={source[0]}", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert ours.stdout.splitlines()[-1] == real.stdout.splitlines()[-1] == "['AttributeError', 'AttributeError'] True"
