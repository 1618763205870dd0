"""Parameters as `.npz` files, and init nets that read their weights from databases.

Trained Caffe2 weights usually lived in a database that the init net's `Load` op read: such an init net
runs in a `Workspace` whose `db_root` is where its databases are. Weights can also come in as arrays:
`params=` in Python, an `.npz` file (blob name -> array) on the command line. Blob names such as
`LSTM/i2h_w` contain '/', so the archive is written entry by entry rather than through
`np.savez(**names)`, whose keyword names could clash with its own arguments (`file`, `allow_pickle`).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ParseError, StorageError
from ..ir.files import atomic_write
from ..ir.netdef import Net

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
                array = _storable(name, value, path)
                with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, array, allow_pickle=False)
    except OSError as error:
        raise ParseError(f"cannot write '{os.fspath(path)}': {error.strerror or error}") from None


def _storable(name: str, value: Any, path: PathLike) -> np.ndarray:
    """`value` as an array `.npz` holds without pickles: numbers as they are, Caffe2 strings (an object
    array of bytes) as fixed-width bytes ('S'). NumPy's 'S' drops trailing NUL bytes, so a string ending
    in one is refused rather than shortened."""
    array = np.asarray(value)
    if array.dtype != object:
        return array
    where = f"cannot save blob '{name}' to '{os.fspath(path)}'"
    items = []
    for index, item in np.ndenumerate(array):
        if isinstance(item, str):
            item = item.encode()
        if not isinstance(item, bytes | np.bytes_):
            raise StorageError(f"{where}: element {list(index)} is a {type(item).__name__}, not a string")
        if item.endswith(b"\0"):
            raise StorageError(
                f"{where}: string element {list(index)} ({bytes(item)[:32]!r}) ends in a NUL byte, which .npz "
                "fixed-width bytes cannot keep (NumPy strips trailing NULs on reading)"
            )
        items.append(bytes(item))
    width = max((len(b) for b in items), default=0) or 1
    return np.array(items, dtype=f"S{width}").reshape(array.shape)


def load_params(path: PathLike) -> dict[str, np.ndarray]:
    """Read an `.npz` file (as `save_params` or `np.savez` wrote it): blob name -> array. Fixed-width
    bytes ('S') come back as Caffe2 strings: object arrays of `bytes`, as the workspace holds them."""
    return {name: as_caffe2_strings(v) for name, v in load_arrays(path, what="parameter file").items()}


def as_caffe2_strings(array: np.ndarray) -> np.ndarray:
    """An 'S' array as an object array of bytes (Caffe2's strings); any other array as it is."""
    if array.dtype.kind != "S":
        return array
    strings = np.empty(array.shape, dtype=object)
    for index, item in np.ndenumerate(array):
        strings[index] = bytes(item)
    return strings


def _unreadable(what: str, path: PathLike, error: OSError) -> StorageError:
    """A file that cannot be opened (missing, a directory, no permission): a storage problem, not a parse one."""
    if isinstance(error, FileNotFoundError):
        return StorageError(f"cannot read {what} '{os.fspath(path)}': file not found")
    return StorageError(f"cannot read {what} '{os.fspath(path)}': {error.strerror or error}")


def load_arrays(path: PathLike, what: str = "array file") -> dict[str, np.ndarray]:
    """Read an `.npz` file into a dict: a file that cannot be opened (missing, say) is a one-line
    `StorageError`, one that is not an `.npz` archive a `ParseError`."""
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ParseError(f"{what} '{os.fspath(path)}' is a single .npy array, not an .npz archive")
        with archive:
            return {name: archive[name] for name in archive.files}
    except OSError as error:
        raise _unreadable(what, path, error) from None
    except (ValueError, zipfile.BadZipFile, EOFError) as error:
        raise ParseError(f"{what} '{os.fspath(path)}' is not a readable .npz file: {error}") from None


def load_array(path: PathLike, what: str = "array file") -> np.ndarray:
    """Read one `.npy` file: a file that cannot be opened is a one-line `StorageError`, one that is not
    an `.npy` array a `ParseError`."""
    try:
        value = np.load(path, allow_pickle=False)
    except OSError as error:
        raise _unreadable(what, path, error) from None
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


def uses_storage(net: Net) -> bool:
    """Whether the init net reads files or databases, so must run in a workspace with its host ops."""
    return any(op.type in EXTERNAL_STORAGE_OPS for op in net.ops)


def run_storage_init_net(net: Net, seed: int, db_root: PathLike | None) -> dict[str, Any]:
    """Run an init net that reads databases in a `Workspace(db_root=db_root)`; its array blobs, by name.

    A DB that is not where the net says is a `StorageError` naming the op, the DB and (when `db_root` is
    not given) the hint to pass it; an op rnn2jax cannot run (ImageInput, ...) is an UnsupportedOpError."""
    from ..ops.storage import loaded_values
    from .workspace import Workspace

    workspace = Workspace(db_root=db_root, seed=seed)
    workspace.run(net)
    return loaded_values(workspace)
