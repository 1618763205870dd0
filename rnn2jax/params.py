"""Parameters as `.npz` files, and the check that keeps init nets away from external storage.

Trained Caffe2 weights usually lived in a database that the init net's `Load` op read. rnn2jax cannot
open those databases, so the weights come in as arrays instead: `params=` in Python, an `.npz` file
(blob name -> array) on the command line. Blob names such as `LSTM/i2h_w` contain '/', so the archive
is written entry by entry rather than through `np.savez(**names)`, whose keyword names could clash
with its own arguments (`file`, `allow_pickle`).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import ParseError, Rnn2JaxError, UnsupportedOpError
from .files import atomic_write
from .netdef import Net, Op

PathLike = str | os.PathLike

# Caffe2 ops that fill blobs from files or databases (caffe2/operators/load_save_op.cc, db/create_db_op.cc,
# tensor_protos_db_input.cc, image_input_op.cc, video_input_op.cc, text_file_reader.cc, queue ops).
EXTERNAL_STORAGE_OPS = frozenset(
    {
        "Load",
        "LoadTensor",
        "DBExists",
        "CreateDB",
        "TensorProtosDBInput",
        "ImageInput",
        "VideoInput",
        "CreateBlobsQueueDB",
        "CreateTextFileReader",
        "TextFileReaderRead",
    }
)


def save_params(params: Mapping[str, Any], path: PathLike) -> None:
    """Write arrays to an `.npz` file, one entry per blob name (names may contain '/')."""
    try:
        with atomic_write(path) as file, zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, value in params.items():
                array = np.asarray(value)
                if array.dtype == object:
                    raise ParseError(f"cannot save blob '{name}' to '{os.fspath(path)}': it is not an array")
                with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, array, allow_pickle=False)
    except OSError as error:
        raise ParseError(f"cannot write '{os.fspath(path)}': {error.strerror or error}") from None


def load_params(path: PathLike) -> dict[str, np.ndarray]:
    """Read an `.npz` file (as `save_params` or `np.savez` wrote it): blob name -> array."""
    return load_arrays(path, what="parameter file")


def load_arrays(path: PathLike, what: str = "array file") -> dict[str, np.ndarray]:
    """Read an `.npz` file into a dict; a bad or missing file is a one-line `ParseError`."""
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ParseError(f"{what} '{os.fspath(path)}' is a single .npy array, not an .npz archive")
        with archive:
            return {name: archive[name] for name in archive.files}
    except OSError as error:
        raise ParseError(f"cannot read {what} '{os.fspath(path)}': {error.strerror or error}") from None
    except (ValueError, zipfile.BadZipFile, EOFError) as error:
        raise ParseError(f"{what} '{os.fspath(path)}' is not a readable .npz file: {error}") from None


def load_array(path: PathLike, what: str = "array file") -> np.ndarray:
    """Read one `.npy` file; a bad or missing file is a one-line `ParseError`."""
    try:
        value = np.load(path, allow_pickle=False)
    except OSError as error:
        raise ParseError(f"cannot read {what} '{os.fspath(path)}': {error.strerror or error}") from None
    except (ValueError, EOFError) as error:
        raise ParseError(f"{what} '{os.fspath(path)}' is not a readable .npy file: {error}") from None
    if not isinstance(value, np.ndarray):
        value.close()
        raise ParseError(f"{what} '{os.fspath(path)}' is an .npz archive, not a single .npy array")
    return value


def resolve_params(params: Mapping[str, Any] | PathLike | None) -> Mapping[str, Any]:
    """`params=` as given to `compile`: a mapping, a path to an `.npz` file, or None."""
    if params is None:
        return {}
    if isinstance(params, (str, os.PathLike)):
        return load_params(params)
    return params


def check_no_external_storage(net: Net) -> None:
    """Refuse an init net that reads files or databases, naming the blobs to pass as params instead."""
    found = [op for op in net.ops if op.type in EXTERNAL_STORAGE_OPS]
    if not found:
        return
    parts = []
    for op in found:
        db = _db_of(op)
        blobs = ", ".join(op.outputs) or "(no blobs)"
        parts.append(f"{op.where} reads {blobs}{db}")
    raise UnsupportedOpError(
        f"{net.where}: the init net reads external storage, which rnn2jax cannot open: {'; '.join(parts)}. "
        "Compile without this init net and pass those arrays with params= "
        "(a dict or an .npz file; on the command line: --params FILE.npz)",
        tuple((op.where, op.type) for op in found),
    )


def _db_of(op: Op) -> str:
    """' from lmdb 'name'' for an op with a `db` argument (only to make the message concrete)."""
    try:
        source, kind = op.str("db", ""), op.str("db_type", "db")
    except Rnn2JaxError:
        return ""
    return f" from {kind} '{source}'" if source else ""
