"""lmdb (`caffe2/db/lmdb.cc`): an LMDB environment in a directory (data.mdb, lock.mdb), keys in the unnamed
database, sorted. Caffe2 maps 1 TB of address space; so do we. Needs the `lmdb` package (extra `lmdb`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import lmdb

from .db import DBAccessError

MAP_SIZE = 1 << 40  # Caffe2's LMDB_MAP_SIZE
_COMMIT_BYTES = 64 << 20  # commit the (temporary) DB every so often, so no transaction grows without bound


def _records(env: lmdb.Environment) -> Iterator[tuple[bytes, bytes]]:
    try:
        with env.begin() as txn:
            yield from txn.cursor()
    except lmdb.Error as error:
        raise DBAccessError(f"lmdb: {error}") from None


# Environments open for reading, shared: LMDB refuses a second open of one environment in a process, and
# a DB reader (CreateDB) keeps its DB open while a Load or another reader opens it too. Keyed by the
# file's identity, so a DB replaced by a Save (a new inode) is opened afresh.
_OPEN: dict[tuple[int, int], list] = {}  # (st_dev, st_ino) -> [environment, users]


@contextlib.contextmanager
def records(path: Path) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    try:
        stat = path.stat()
    except OSError as error:
        raise DBAccessError(f"cannot open: {error.strerror}") from None
    identity = (stat.st_dev, stat.st_ino)
    entry = _OPEN.get(identity)
    if entry is None:
        try:
            env = lmdb.open(str(path), readonly=True, lock=False, subdir=path.is_dir(), map_size=MAP_SIZE)
        except lmdb.Error as error:
            raise DBAccessError(f"not a readable lmdb: {error}") from None
        entry = _OPEN[identity] = [env, 0]
    entry[1] += 1
    try:
        yield _records(entry[0])
    finally:
        entry[1] -= 1
        if not entry[1]:
            del _OPEN[identity]
            entry[0].close()


class _Writer:
    def __init__(self, path: Path):
        try:
            self.env = lmdb.open(str(path), map_size=MAP_SIZE, subdir=True, create=True)
        except lmdb.Error as error:
            raise DBAccessError(f"lmdb: {error}") from None
        self.txn = self.env.begin(write=True)
        self.pending = 0

    def put(self, key: bytes, value: bytes) -> None:
        try:
            self.txn.put(key, value)
            self.pending += len(value)
            if self.pending > _COMMIT_BYTES:
                self.txn.commit()
                self.txn = self.env.begin(write=True)
                self.pending = 0
        except lmdb.Error as error:
            raise DBAccessError(f"lmdb: {error}", key) from None

    def close(self) -> None:
        try:
            self.txn.commit()
            self.env.sync(True)
        except lmdb.Error as error:
            raise DBAccessError(f"lmdb: {error}") from None
        finally:
            self.env.close()

    def abort(self) -> None:
        self.txn.abort()
        self.env.close()


def create(path: Path) -> _Writer:
    return _Writer(path)
