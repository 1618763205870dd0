"""Blobs in Caffe2 databases: read them as arrays, write arrays as Caffe2's Save would, list what a DB holds.

Every failure is a one-line `StorageError` naming the DB and, when known, the blob (and its key).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import StorageError
from .db import DBAccessError, describe, open_cursor, transaction
from .serialization import Blob, BlobAssembler, BlobInfo, blob_name, describe_record, serialize_blob

_LISTED = 8  # blob names a "not found" message lists


def _located(where: str, key: bytes | None, detail: str) -> StorageError:
    if key is None:
        return StorageError(f"{where}: {detail}")
    text = key.decode("utf-8", errors="replace")
    name = blob_name(key)
    label = f"blob '{name}'" if text == name else f"blob '{name}' (key '{text}')"
    return StorageError(f"{where}: {label} {detail}")


def _names_list(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _LISTED else "") if names else "no blobs"


def read_blobs(
    path: str | os.PathLike, db_type: str = "minidb", names: Iterable[str] | None = None
) -> dict[str, np.ndarray | bytes]:
    """Read blobs from a Caffe2 DB (what `Save` wrote, or any DB of serialized `BlobProto`s).

    Tensors come back as NumPy arrays of their Caffe2 dtype (strings as object arrays of bytes), string
    blobs as `bytes`. `names` restricts the read to those blobs, and each must be in the DB; records of
    other blobs are skipped without being decoded. The DB is streamed record by record, so the blobs
    are the only copy of the data in memory."""
    where = describe(path, db_type)
    wanted = None
    if names is not None:
        wanted = [names] if isinstance(names, str) else list(names)
        if not all(isinstance(n, str) for n in wanted):
            raise StorageError(f"{where}: blob names must be str, got {wanted!r}")
    assembler = BlobAssembler(where, None if wanted is None else frozenset(wanted))
    seen: set[str] = set()
    key = None
    try:
        with open_cursor(path, db_type) as records:
            for key, value in records:
                seen.add(blob_name(key))
                if assembler.wants(key):
                    assembler.add(key, value)
            key = None
    except DBAccessError as error:
        raise _located(where, error.key, error.detail) from None
    except ValueError as error:
        raise _located(where, key, str(error)) from None
    blobs, problems = assembler.finish()
    for name, problem in problems.items():
        raise StorageError(f"{where}: blob '{name}' is incomplete: {problem}")
    if wanted is None:
        return blobs
    missing = [n for n in wanted if n not in blobs]
    if missing:
        raise StorageError(
            f"{where}: blob '{missing[0]}' is not in the DB"
            + (f" (nor {', '.join(repr(m) for m in missing[1:])})" if len(missing) > 1 else "")
            + f"; it holds {_names_list(seen)}"
        )
    return {n: blobs[n] for n in wanted}


def write_blobs(
    path: str | os.PathLike,
    blobs: Mapping[str, Any],
    db_type: str = "minidb",
    chunk_size: int | None = None,
    per_blob: Mapping[str, tuple[int | None, bool]] | None = None,
) -> None:
    """Write `blobs` (name -> array, or bytes/str for a string blob) as a new Caffe2 DB, as `Save` would:
    keys "name#%<chunk>", chunks of `chunk_size` elements (None: Caffe2's 1,000,000; 0: one chunk).
    `per_blob` gives blobs their own (chunk_size, bfloat16), as Save's SerializationOptions do.

    The DB is written beside `path` under a temporary name and renamed into place only when complete:
    a failure leaves whatever was at `path` untouched and no partial DB."""
    where = describe(path, db_type)
    if not isinstance(blobs, Mapping):
        raise StorageError(f"{where}: blobs must be a mapping of name to array, got {type(blobs).__name__}")
    names = list(blobs)
    if not all(isinstance(n, str) and n for n in names):
        raise StorageError(f"{where}: blob names must be non-empty str, got {names!r}")
    current = names[0] if names else None
    try:
        with transaction(path, db_type) as txn:
            for current in names:
                chunks, bfloat16 = (per_blob or {}).get(current, (chunk_size, False))
                for key, data in serialize_blob(current, blobs[current], chunks, bfloat16):
                    txn.put(key, data)
    except (DBAccessError, OSError, ValueError) as error:
        detail = error.detail if isinstance(error, DBAccessError) else str(error)
        if isinstance(error, OSError):
            detail = f"cannot be written: {error.strerror or error}"
        blob = f"blob '{current}' " if current is not None else ""
        raise StorageError(f"{where}: {blob}{detail}; nothing was written") from None


def describe_blobs(path: str | os.PathLike, db_type: str = "minidb") -> list[BlobInfo]:
    """The blobs of a DB with their shapes and dtypes, in the DB's order, reading no values."""
    where = describe(path, db_type)
    infos: dict[str, BlobInfo] = {}
    key = None
    try:
        with open_cursor(path, db_type) as records:
            for key, value in records:
                info = describe_record(key, value)
                if info.name in infos:
                    first = infos[info.name]
                    info = BlobInfo(
                        first.name, first.kind, first.shape, first.dtype, first.chunks + 1, first.nbytes + info.nbytes
                    )
                infos[info.name] = info
            key = None
    except DBAccessError as error:
        raise _located(where, error.key, error.detail) from None
    except ValueError as error:
        raise _located(where, key, str(error)) from None
    return list(infos.values())


__all__ = ["Blob", "BlobInfo", "describe_blobs", "read_blobs", "write_blobs"]
