"""rocksdb (`caffe2/db/rocksdb.cc`): a RocksDB directory, keys sorted, values raw bytes. Needs `rocksdict`
(extra `rocksdb`), opened in raw mode so that it stores the bytes as they are (its default pickles)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from rocksdict import AccessType, Options, Rdict, WriteBatch

from .db import DBAccessError

_BATCH_BYTES = 64 << 20


def _records(db: Rdict) -> Iterator[tuple[bytes, bytes]]:
    iterator = db.iter()
    try:
        iterator.seek_to_first()
        while iterator.valid():
            yield iterator.key(), iterator.value()
            iterator.next()
        iterator.status()
    except Exception as error:  # rocksdict raises plain Exceptions
        raise DBAccessError(f"rocksdb: {error}") from None
    finally:
        del iterator


@contextlib.contextmanager
def records(path: Path) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    try:
        db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    except Exception as error:
        raise DBAccessError(f"not a readable rocksdb: {error}") from None
    try:
        yield _records(db)
    finally:
        db.close()


class _Writer:
    def __init__(self, path: Path):
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_error_if_exists(True)
        try:
            self.db = Rdict(str(path), options)
        except Exception as error:
            raise DBAccessError(f"rocksdb: {error}") from None
        self.batch = WriteBatch(raw_mode=True)
        self.pending = 0

    def put(self, key: bytes, value: bytes) -> None:
        try:
            self.batch.put(key, value)
            self.pending += len(value)
            if self.pending > _BATCH_BYTES:
                self.db.write(self.batch)
                self.batch = WriteBatch(raw_mode=True)
                self.pending = 0
        except Exception as error:
            raise DBAccessError(f"rocksdb: {error}", key) from None

    def close(self) -> None:
        try:
            self.db.write(self.batch)
            self.db.flush(True)
        except Exception as error:
            raise DBAccessError(f"rocksdb: {error}") from None
        finally:
            self.db.close()

    def abort(self) -> None:
        self.db.close()


def create(path: Path) -> _Writer:
    return _Writer(path)
