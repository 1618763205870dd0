"""minidb, Caffe2's own DB (`caffe2/core/db.cc`): one file of records, each a key length and a value length
(C `int`: 4 bytes, little-endian on every platform Caffe2 shipped for), then the key bytes and the value
bytes, in the order they were written. Caffe2 requires both lengths to be positive.

Reading streams one record at a time through a buffered file, so a DB is never held in memory whole.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .db import DBAccessError

_HEADER = struct.Struct("<ii")
_MAX_LENGTH = 2**31 - 1  # the lengths are C ints


def _read_records(file: BinaryIO, size: int) -> Iterator[tuple[bytes, bytes]]:
    offset = 0
    index = 0
    while True:
        head = file.read(_HEADER.size)
        if not head:
            return
        if len(head) < _HEADER.size:
            raise DBAccessError(
                f"truncated: record #{index} at byte {offset} has {len(head)} of its 8 header bytes "
                "(the file ends there)"
            )
        key_length, value_length = _HEADER.unpack(head)
        if key_length <= 0 or value_length <= 0:
            raise DBAccessError(
                f"corrupt: record #{index} at byte {offset} has key length {key_length} and value length "
                f"{value_length} (both must be positive)"
            )
        left = size - offset - _HEADER.size
        if key_length > left:
            raise DBAccessError(
                f"truncated: record #{index} at byte {offset} needs a {key_length}-byte key, {left} bytes are left"
            )
        key = file.read(key_length)
        left -= key_length
        if value_length > left:
            raise DBAccessError(
                f"truncated: record #{index} at byte {offset} needs {value_length} value bytes, {left} are left",
                key,
            )
        value = file.read(value_length)
        if len(key) != key_length or len(value) != value_length:  # the file shrank while we read it
            raise DBAccessError(f"truncated: record #{index} at byte {offset} ends early", key)
        yield key, value
        offset += _HEADER.size + key_length + value_length
        index += 1


@contextlib.contextmanager
def records(path: Path) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    if path.is_dir():
        raise DBAccessError("is a directory, not a minidb file")
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed below, after the caller's loop)
    except OSError as error:
        raise DBAccessError(f"cannot open: {error.strerror}") from None
    with file:
        yield _read_records(file, path.stat().st_size)


class _Writer:
    def __init__(self, path: Path):
        self.file = open(path, "xb")  # noqa: SIM115 (closed by close/abort)

    def put(self, key: bytes, value: bytes) -> None:
        if not key or not value:
            raise DBAccessError("minidb cannot hold an empty key or value", key)
        if len(key) > _MAX_LENGTH or len(value) > _MAX_LENGTH:
            raise DBAccessError(f"a record of {len(value)} bytes is over minidb's 2 GiB limit; use chunks", key)
        self.file.write(_HEADER.pack(len(key), len(value)))
        self.file.write(key)
        self.file.write(value)

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def abort(self) -> None:
        self.file.close()


def create(path: Path) -> _Writer:
    return _Writer(path)
