"""Caffe2's database bindings (`C.create_db`, DB, Cursor, Transaction) over rnn2jax's backends: a minidb that
rnn2jax writes, real Caffe2 reads record for record, and the other way round (db_test.py's testSimple)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rnn2jax.caffe2.python import workspace

ROOT = Path(__file__).resolve().parents[2]
C = workspace.C
RECORDS = [(f"key{i}".encode(), f"value{i}".encode() * i) for i in range(1, 8)]

READ = """
import json, sys
from caffe2.python import workspace
db = workspace.C.create_db("minidb", sys.argv[1], workspace.C.Mode.read)
cursor = db.new_cursor()
out = []
while cursor.valid():
    out.append([cursor.key().decode(), cursor.value().decode()])
    cursor.next()
print(json.dumps(out))
"""
WRITE = """
import sys
from caffe2.python import workspace
db = workspace.C.create_db("minidb", sys.argv[1], workspace.C.Mode.write)
for i in range(1, 8):
    t = db.new_transaction()
    t.put(("key%d" % i).encode(), ("value%d" % i).encode() * i)
    t.commit()
    del t
db.close()
"""


def real_caffe2(code: str, *args: str) -> subprocess.CompletedProcess:
    python = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python"))
    if not python.exists():
        pytest.skip(f"real Caffe2 unavailable: no interpreter at {python}")
    result = subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def _read_ours(path: Path) -> list[tuple[bytes, bytes]]:
    cursor = C.create_db("minidb", str(path), C.Mode.read).new_cursor()
    out = []
    while cursor.valid():
        out.append((cursor.key(), cursor.value()))
        cursor.next()
    return out


def test_a_db_rnn2jax_writes_is_the_one_caffe2_reads(tmp_path):
    path = tmp_path / "ours.minidb"
    db = C.create_db("minidb", str(path), C.Mode.write)
    for key, value in RECORDS:
        transaction = db.new_transaction()
        transaction.put(key, value)
        del transaction
    del db  # closing writes it, as in Caffe2
    read = json.loads(real_caffe2(READ, str(path)).stdout.splitlines()[-1])
    assert [(k.encode(), v.encode()) for k, v in read] == RECORDS == _read_ours(path)


def test_a_db_caffe2_writes_is_the_one_rnn2jax_reads(tmp_path):
    path = tmp_path / "theirs.minidb"
    real_caffe2(WRITE, str(path))
    assert _read_ours(path) == RECORDS


def test_what_caffe2_refuses(tmp_path):
    with pytest.raises(RuntimeError, match="does not exist"):
        C.create_db("minidb", str(tmp_path / "missing"), C.Mode.read)
    path = tmp_path / "db"
    writer = C.create_db("minidb", str(path), C.Mode.new)
    with pytest.raises(RuntimeError, match="opened for writing"):
        writer.new_cursor()
    writer.close()
    reader = C.create_db("minidb", str(path), C.Mode.read)
    with pytest.raises(RuntimeError, match="opened for reading"):
        reader.new_transaction()
    cursor = reader.new_cursor()
    assert not cursor.valid() and not cursor.supports_seek()
    with pytest.raises(RuntimeError, match="MiniDB does not support seeking"):
        cursor.seek(b"key1")
