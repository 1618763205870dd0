"""leveldb (`caffe2/db/leveldb.cc`): a LevelDB directory, keys sorted, written with Caffe2's options
(64 KiB blocks, a 256 MiB write buffer). Needs `plyvel` (extra `leveldb`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import plyvel

from .db import DBAccessError

_BATCH_BYTES = 64 << 20


def _records(db: plyvel.DB) -> Iterator[tuple[bytes, bytes]]:
    try:
        with db.iterator() as iterator:
            yield from iterator
    except plyvel.Error as error:
        raise DBAccessError(f"leveldb: {error}") from None


@contextlib.contextmanager
def records(path: Path) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    try:
        db = plyvel.DB(str(path), create_if_missing=False)
    except plyvel.Error as error:
        raise DBAccessError(f"not a readable leveldb: {error}") from None
    try:
        yield _records(db)
    finally:
        db.close()


class _Writer:
    def __init__(self, path: Path):
        try:
            self.db = plyvel.DB(
                str(path), create_if_missing=True, error_if_exists=True, block_size=65536, write_buffer_size=1 << 28
            )
        except plyvel.Error as error:
            raise DBAccessError(f"leveldb: {error}") from None
        self.batch = self.db.write_batch()
        self.pending = 0

    def put(self, key: bytes, value: bytes) -> None:
        try:
            self.batch.put(key, value)
            self.pending += len(value)
            if self.pending > _BATCH_BYTES:
                self.batch.write()
                self.batch = self.db.write_batch()
                self.pending = 0
        except plyvel.Error as error:
            raise DBAccessError(f"leveldb: {error}", key) from None

    def close(self) -> None:
        try:
            self.batch.write()
        except plyvel.Error as error:
            raise DBAccessError(f"leveldb: {error}") from None
        finally:
            self.db.close()

    def abort(self) -> None:
        self.db.close()


def create(path: Path) -> _Writer:
    return _Writer(path)
