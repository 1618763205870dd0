"""`dyndep.InitOpsLibrary` as real Caffe2 has it where Caffe2 loaded nothing, and an rnn2jax error where it would
have loaded a C++ library. Caffe2's scripts (seq2seq's train.py) call it with Buck targets, which are no files."""

from __future__ import annotations

import os
import subprocess
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
