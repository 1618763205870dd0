"""Caffe2 DBs on the command line: what `inspect DB` shows (blobs with shapes and dtypes), the DB type a
path's content says (`--db-type` unless given), and what `convert-params DB -o params.npz` (or `-o DIR`, an
Orbax checkpoint) writes. Nothing here imports JAX, so `inspect` of a DB starts quickly."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import numpy as np

from ..checking.table import text_table
from ..errors import StorageError
from ..proto import caffe2_pb2 as pb
from ..runtime.params import save_params
from ..storage import BlobInfo, describe_blobs, read_blobs


def _looks_like_minidb(path: Path) -> bool:
    """A first record whose lengths fit the file and whose value is a typed BlobProto."""
    try:
        with open(path, "rb") as file:
            head = file.read(8)
            if len(head) < 8:
                return False
            key_length, value_length = struct.unpack("<ii", head)
            size = path.stat().st_size
            if key_length <= 0 or value_length <= 0 or 8 + key_length + value_length > size:
                return False
            file.seek(key_length, os.SEEK_CUR)
            proto = pb.BlobProto()
            proto.ParseFromString(file.read(value_length))
    except Exception:  # anything unreadable is simply not a minidb
        return False
    return bool(proto.type)


def guess_db_type(path: str | os.PathLike) -> str | None:
    """The db_type of the DB at `path` judged by its content, or None when it does not look like a DB:
    an LMDB directory has data.mdb, RocksDB and LevelDB directories a CURRENT file (RocksDB also OPTIONS-*
    files), a minidb file starts with a record holding a BlobProto."""
    path = Path(path)
    if path.is_dir():
        if (path / "data.mdb").is_file():
            return "lmdb"
        if (path / "CURRENT").is_file():
            return "rocksdb" if any(path.glob("OPTIONS-*")) else "leveldb"
        return None
    if path.is_file() and _looks_like_minidb(path):
        return "minidb"
    return None


def _shape(info: BlobInfo) -> str:
    if info.shape is None:
        return "-"
    return "[" + ", ".join(str(d) for d in info.shape) + "]"


def inspect_db(path: str | os.PathLike, db_type: str) -> str:
    """A table of the DB's blobs: name, kind, shape, dtype, chunks, bytes."""
    infos = describe_blobs(path, db_type)
    rows = [["blob", "type", "shape", "dtype", "chunks", "bytes"]]
    rows += [[i.name, i.kind, _shape(i), i.dtype or "-", str(i.chunks), str(i.nbytes)] for i in infos]
    total = sum(i.nbytes for i in infos)
    lines = [f"{os.fspath(path)}: {db_type}, {len(infos)} blobs, {total} bytes", *text_table(rows)]
    return "\n".join(lines)


def convert_params(path: str | os.PathLike, db_type: str, output: str | os.PathLike) -> list[str]:
    """Write the DB's tensors to an .npz file (an `output` ending in .npz) or an Orbax checkpoint directory
    (any other `output`), one entry per blob; returns the names of the string blobs left out. An .npz keeps
    string tensors as fixed-width bytes (`rnn2jax.load_params` gives them back as Caffe2 strings; a string
    ending in a NUL byte is refused, naming it); an Orbax checkpoint holds numbers only, and neither holds a
    std::string blob (not a tensor), so those are left out."""
    blobs = read_blobs(path, db_type)
    to_npz = os.fspath(output).endswith(".npz")
    params = {n: v for n, v in blobs.items() if isinstance(v, np.ndarray) and (v.dtype.kind != "O" or to_npz)}
    skipped = [n for n in blobs if n not in params]
    if not params:
        raise StorageError(f"DB '{os.fspath(path)}' ({db_type}) holds no tensors to convert")
    if to_npz:
        save_params(params, output)
    else:
        save_orbax(params, output)
    return skipped


def save_orbax(params: dict[str, np.ndarray], directory: str | os.PathLike) -> None:
    """An Orbax checkpoint (the JAX ecosystem's format) of `params`, a flat dict keyed by blob name:
    `orbax.checkpoint.StandardCheckpointer().restore(directory)` gives it back. Orbax writes into a
    temporary directory and renames it when complete, so a failed write leaves nothing behind."""
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise StorageError("writing an Orbax checkpoint needs the orbax extra: pip install 'rnn2jax[orbax]'") from None
    target = Path(directory).absolute()
    if target.exists():
        raise StorageError(f"'{os.fspath(directory)}' exists; an Orbax checkpoint is written to a new directory")
    checkpointer = ocp.StandardCheckpointer()
    try:
        checkpointer.save(target, params)
        checkpointer.wait_until_finished()
    except (OSError, ValueError) as error:
        raise StorageError(f"cannot write the Orbax checkpoint '{os.fspath(directory)}': {error}") from None


def report_skipped(skipped: list[str]) -> None:
    if skipped:
        print(f"rnn2jax: left out {len(skipped)} string blob(s): {', '.join(skipped)}", file=sys.stderr)
