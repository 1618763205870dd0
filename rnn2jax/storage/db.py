"""Caffe2 databases under one small interface, chosen by `db_type` as Caffe2's DB registry does.

A backend reads a DB as a stream of (key, value) records (Caffe2's Cursor) and writes one through a
`Transaction` (put, then close). `open_cursor` and `transaction` add what every backend needs: the names
Caffe2 registers (`minidb`/`MiniDB`, `lmdb`/`LMDB`, `leveldb`/`LevelDB`, `rocksdb`/`RocksDB`), an error
naming the pip extra when a backend's package is missing, and atomic writes: a DB is written beside its
target under a temporary name and renamed into place, so a failed write leaves the old DB as it was and
no partial one.

Backend failures surface as `DBAccessError` (what went wrong, and the record's key when known); the blob
layer turns them into a one-line `StorageError` naming the DB and the blob.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import InputTypeError, StorageError


class DBAccessError(Exception):
    """A backend could not read or write: `detail` says why, `key` is the record's key when known."""

    def __init__(self, detail: str, key: bytes | None = None):
        super().__init__(detail)
        self.detail = detail
        self.key = key


class Transaction(Protocol):
    """Writes records into a new DB at a path that did not exist; `close` makes them durable."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class Backend(Protocol):
    """One DB implementation: a module with these three names."""

    def records(self, path: Path) -> contextlib.AbstractContextManager[Iterator[tuple[bytes, bytes]]]: ...

    def create(self, path: Path) -> Transaction: ...


@dataclass(frozen=True)
class DBType:
    name: str  # Caffe2's lower-case registry name
    module: str  # the backend module beside this one
    package: str | None  # the third-party package it imports, when not built in
    extra: str | None  # the rnn2jax extra that installs it


_TYPES = {
    "minidb": DBType("minidb", "minidb", None, None),
    "lmdb": DBType("lmdb", "lmdb_db", "lmdb", "lmdb"),
    "leveldb": DBType("leveldb", "leveldb_db", "plyvel", "leveldb"),
    "rocksdb": DBType("rocksdb", "rocksdb_db", "rocksdict", "rocksdb"),
}
# Caffe2 registers each DB under two names (REGISTER_CAFFE2_DB(MiniDB, ...) and (minidb, ...)).
_ALIASES = {"MiniDB": "minidb", "LMDB": "lmdb", "LevelDB": "leveldb", "RocksDB": "rocksdb"}

DB_TYPES = tuple(_TYPES)


def db_path(path: str | os.PathLike) -> str:
    """`path` as a str, or an InputTypeError: every public entry point names its DB through `describe`
    first, so a path of the wrong type is refused before anything is opened."""
    if not isinstance(path, str | os.PathLike):
        raise InputTypeError(f"a DB path must be a str or os.PathLike, got a {type(path).__name__}")
    return os.fspath(path)


def describe(path: str | os.PathLike, db_type: str) -> str:
    """How messages name a DB: "DB 'ckpt.minidb' (minidb)"."""
    return f"DB '{db_path(path)}' ({db_type})"


def db_type_info(db_type: str, path: str | os.PathLike) -> DBType:
    """The DB type `db_type` names, or a StorageError listing the known ones."""
    name = _ALIASES.get(db_type, db_type)
    if not isinstance(db_type, str) or name not in _TYPES:
        raise StorageError(
            f"{describe(path, db_type)}: unknown db_type {db_type!r}; rnn2jax reads {', '.join(DB_TYPES)}"
        )
    return _TYPES[name]


def backend(db_type: str, path: str | os.PathLike) -> Backend:
    """The backend module for `db_type`, or a StorageError naming the extra that installs its package."""
    info = db_type_info(db_type, path)
    if info.package is not None:
        try:
            importlib.import_module(info.package)
        except ImportError:
            raise StorageError(
                f"{describe(path, db_type)}: {info.name} needs the Python package '{info.package}', which is "
                f"not installed: pip install 'rnn2jax[{info.extra}]'"
            ) from None
    return importlib.import_module(f".{info.module}", __package__)


@contextlib.contextmanager
def open_cursor(path: str | os.PathLike, db_type: str) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    """The DB's records, streamed in its order (sorted by key for lmdb, leveldb, rocksdb; as written for
    minidb). A missing DB is a StorageError; failures while reading are `DBAccessError`s."""
    module = backend(db_type, path)
    target = Path(path)
    if not target.exists():
        raise StorageError(f"{describe(path, db_type)} does not exist")
    with module.records(target) as records:
        yield records


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _replace(new: Path, target: Path) -> None:
    """Move `new` to `target`. A file replaces a file atomically; a directory DB (or a change of kind) goes
    through a backup that is restored if the second rename fails."""
    if not target.exists() or (new.is_file() and target.is_file()):
        os.replace(new, target)
        return
    backup = target.with_name(f".{target.name}.rnn2jax-old-{uuid.uuid4().hex[:8]}")
    os.replace(target, backup)
    try:
        os.replace(new, target)
    except OSError:
        os.replace(backup, target)
        raise
    _remove(backup)


@contextlib.contextmanager
def transaction(path: str | os.PathLike, db_type: str) -> Iterator[Transaction]:
    """A new DB at `path`, replacing any there only when the block ends without an exception; otherwise the
    temporary DB is removed and the old one is untouched. OSErrors and `DBAccessError`s propagate."""
    module = backend(db_type, path)
    target = Path(path)
    temporary = target.with_name(f".{target.name}.rnn2jax-tmp-{uuid.uuid4().hex[:8]}")
    writer = None
    try:
        writer = module.create(temporary)
        yield writer
        writer.close()
        writer = None
        _replace(temporary, target)
    except BaseException:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.abort()
        _remove(temporary)
        raise
