"""Caffe2's database bindings (`C.create_db`, `DB`, `Cursor`, `Transaction`: caffe2/core/db.h and pybind_state.cc)
over rnn2jax's database backends (rnn2jax/storage/db.py): minidb, and lmdb, leveldb, rocksdb where their
packages are installed.

As in Caffe2, `create_db(type, path, Mode.write or Mode.new)` starts a new database (replacing one there) and
`Mode.read` opens one; a transaction's puts are written at once and its `commit` (or its end) keeps them; a
cursor walks the records in the database's order. rnn2jax writes a database beside its path and moves it in
place when the DB is closed (`close()`, or when it is deleted), so a reader sees it whole, from then on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ...errors import BadArgumentError, Rnn2JaxError, StorageError
from ...storage import db as storage_db

READ, WRITE, NEW = 0, 1, 2  # Caffe2's db::Mode


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else os.fspath(value)


def _bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise BadArgumentError(f"Transaction.put: the {what} must be bytes or str, got a {type(value).__name__}")


def _runtime(error: Exception) -> Exception:
    from .workspace import _as_runtime_error

    if isinstance(error, Rnn2JaxError):
        return _as_runtime_error(error)
    return RuntimeError(str(error))


class Transaction:
    """Caffe2's db::Transaction: `put(key, value)` writes a record, `commit()` keeps what was put."""

    def __init__(self, db: DB):
        self._db = db

    def put(self, key: bytes | str, value: bytes | str) -> None:
        writer = self._db._writer_or_fail("put")
        try:
            writer.put(_bytes(key, "key"), _bytes(value, "value"))
        except (storage_db.DBAccessError, OSError) as error:
            raise _runtime(StorageError(f"{self._db._where}: cannot put a record: {error}")) from error

    def commit(self) -> None:
        """The records are in the database once it is closed; nothing else to do."""
        self._db._writer_or_fail("commit")


class Cursor:
    """Caffe2's db::Cursor over the records of a database opened for reading, first to last."""

    def __init__(self, db: DB):
        self._db = db
        self._stack = contextlib.ExitStack()
        self._records: Iterator[tuple[bytes, bytes]] = iter(())
        self._current: tuple[bytes, bytes] | None = None
        self.seek_to_first()

    def supports_seek(self) -> bool:
        """Caffe2's minidb cannot seek; lmdb, leveldb and rocksdb, sorted by key, can."""
        return self._db._type != "minidb"

    def seek_to_first(self) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        try:
            self._records = self._stack.enter_context(storage_db.open_cursor(self._db._path, self._db._type))
        except (Rnn2JaxError, storage_db.DBAccessError, OSError) as error:
            raise _runtime(error) from error
        self._advance()

    def seek(self, key: bytes | str) -> None:
        """The first record whose key is not below `key` (a sorted database's order)."""
        if not self.supports_seek():
            raise _runtime(StorageError(f"{self._db._where}: MiniDB does not support seeking"))
        wanted = _bytes(key, "key")
        self.seek_to_first()
        while self._current is not None and self._current[0] < wanted:
            self._advance()

    def _advance(self) -> None:
        try:
            self._current = next(self._records, None)
        except storage_db.DBAccessError as error:
            raise _runtime(StorageError(f"{self._db._where}: {error.detail}")) from error

    def next(self) -> None:
        if self._current is None:
            raise _runtime(StorageError(f"{self._db._where}: the cursor is past the last record"))
        self._advance()

    def valid(self) -> bool:
        return self._current is not None

    def key(self) -> bytes:
        return self._record()[0]

    def value(self) -> bytes:
        return self._record()[1]

    def _record(self) -> tuple[bytes, bytes]:
        if self._current is None:
            raise _runtime(StorageError(f"{self._db._where}: the cursor is past the last record"))
        return self._current

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stack.close()


class DB:
    """Caffe2's db::DB: a database opened for reading (`new_cursor`) or writing (`new_transaction`)."""

    def __init__(self, db_type: str, path: str, mode: int):
        self._type = storage_db.db_type_info(db_type, path).name
        self._path, self._mode = path, mode
        self._where = storage_db.describe(path, db_type)
        self._stack = contextlib.ExitStack()
        self._writer: Any = None
        if mode in (WRITE, NEW):
            self._writer = self._stack.enter_context(storage_db.transaction(path, db_type))
        elif not os.path.exists(path):
            raise StorageError(f"{self._where} does not exist")

    def _writer_or_fail(self, what: str) -> Any:
        if self._writer is None:
            state = "closed" if self._mode != READ else "opened for reading"
            raise _runtime(StorageError(f"{self._where} is {state}: it takes no {what}"))
        return self._writer

    def new_transaction(self) -> Transaction:
        self._writer_or_fail("transaction")
        return Transaction(self)

    def new_cursor(self) -> Cursor:
        if self._mode != READ:
            raise _runtime(StorageError(f"{self._where} is opened for writing: it has no cursor"))
        return Cursor(self)

    def close(self) -> None:
        """Write the database in place (when writing)."""
        self._writer = None
        try:
            self._stack.close()
        except (storage_db.DBAccessError, OSError) as error:
            raise _runtime(StorageError(f"{self._where}: cannot write the database: {error}")) from error

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def create_db(db_type: str | bytes, source: str | bytes | os.PathLike, mode: int) -> DB:
    """Caffe2's `C.create_db(db_type, source, mode)`."""
    if int(mode) not in (READ, WRITE, NEW):
        raise _runtime(BadArgumentError(f"create_db: mode {mode!r} is none of Mode.read, Mode.write, Mode.new"))
    try:
        return DB(_text(db_type), _text(source), int(mode))
    except (Rnn2JaxError, storage_db.DBAccessError, OSError) as error:
        raise _runtime(error) from error
