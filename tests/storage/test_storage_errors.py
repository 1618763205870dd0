"""What cannot be read or written is a one-line `StorageError` (an `Rnn2JaxError`) naming the DB and the
blob, and a failed write leaves the old DB as it was and no partial file."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import rnn2jax
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.storage import db as db_module


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text
    assert isinstance(error.value, rnn2jax.Rnn2JaxError)
    return text


def record(key: bytes, value: bytes) -> bytes:
    return struct.pack("<ii", len(key), len(value)) + key + value


def chunk(name, begin, end, values, dims=(4,)):
    blob = pb.BlobProto(name=name, type="Tensor")
    blob.tensor.dims.extend(dims)
    blob.tensor.data_type = pb.TensorProto.FLOAT
    blob.tensor.segment.begin, blob.tensor.segment.end = begin, end
    blob.tensor.float_data.extend(values)
    return blob.SerializeToString()


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "params.minidb"
    rnn2jax.write_blobs(path, {"fc/w": np.arange(12, dtype=np.float32).reshape(3, 4), "fc/b": np.ones(3)})
    return path


def test_truncated_minidb_names_db_and_blob(saved):
    data = saved.read_bytes()
    for cut in (len(data) - 5, len(data) - 30, 3):
        saved.write_bytes(data[:cut])
        with pytest.raises(rnn2jax.StorageError) as error:
            rnn2jax.read_blobs(saved)
        text = one_line(error)
        assert f"DB '{saved}' (minidb)" in text and "truncated" in text
        if cut > 100:
            assert "blob 'fc/b' (key 'fc/b#%0')" in text


def test_corrupt_minidb(saved, tmp_path):
    data = bytearray(saved.read_bytes())
    data[0:4] = struct.pack("<i", -7)
    saved.write_bytes(bytes(data))
    with pytest.raises(rnn2jax.StorageError, match=r"params\.minidb' \(minidb\): corrupt: record #0 .*-7") as error:
        rnn2jax.read_blobs(saved)
    one_line(error)
    garbage = tmp_path / "garbage.minidb"
    garbage.write_bytes(record(b"w#%0", b"\xff\xff\xff\xff not a protobuf"))
    with pytest.raises(rnn2jax.StorageError, match=r"blob 'w' \(key 'w#%0'\) is not a serialized BlobProto"):
        rnn2jax.read_blobs(garbage)


def test_missing_blob_lists_what_the_db_holds(saved):
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.read_blobs(saved, names=["fc/w", "lstm/w"])
    assert one_line(error) == f"DB '{saved}' (minidb): blob 'lstm/w' is not in the DB; it holds fc/b, fc/w"


def test_missing_and_overlapping_chunks(tmp_path):
    path = tmp_path / "chunks.minidb"
    path.write_bytes(record(b"w#%0", chunk("w", 0, 2, [1, 2])) + record(b"w#%2", chunk("w", 3, 4, [4])))
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.read_blobs(path)
    assert one_line(error) == (
        f"DB '{path}' (minidb): blob 'w' is incomplete: elements [2, 3) of 4 are in no chunk (missing chunks)"
    )
    path.write_bytes(record(b"w#%0", chunk("w", 0, 3, [1, 2, 3])) + record(b"w#%1", chunk("w", 2, 4, [3, 4])))
    with pytest.raises(rnn2jax.StorageError, match=r"blob 'w' is incomplete: chunk 'w#%1' \[2, 4\) overlaps"):
        rnn2jax.read_blobs(path)
    path.write_bytes(record(b"w#%0", chunk("w", 0, 2, [1, 2])) + record(b"w#%1", chunk("w", 2, 4, [3, 4], dims=(2, 2))))
    with pytest.raises(rnn2jax.StorageError, match=r"key 'w#%1'\) is a chunk of dims \[2, 2\] float32, but an"):
        rnn2jax.read_blobs(path)
    path.write_bytes(record(b"w#%0", chunk("w", 0, 2, [1, 2, 3])))
    with pytest.raises(rnn2jax.StorageError, match=r"key 'w#%0'\) holds 3 values for its segment \[0, 2\)"):
        rnn2jax.read_blobs(path)


def test_blobs_rnn2jax_cannot_read_are_named(tmp_path):
    qtensor = pb.BlobProto(name="q", type="QTensor")
    qtensor.qtensor.precision, qtensor.qtensor.scale, qtensor.qtensor.bias, qtensor.qtensor.is_signed = 8, 1.0, 0, True
    counter = pb.BlobProto(name="it", type="std::unique_ptr<Counter<int64_t>>", content=b"\x05")
    hashed = pb.BlobProto(name="h", type="Tensor")
    hashed.tensor.data_type = pb.TensorProto.ZERO_COLLISION_HASH
    cases = {
        "q": (qtensor, "is a QTensor blob; rnn2jax reads Tensor and std::string blobs only"),
        "it": (counter, "is a counter blob without its one int64 count"),  # its content is no counter
        "h": (hashed, "has a tensor of data_type ZERO_COLLISION_HASH, which rnn2jax cannot read"),
    }
    for name, (blob, message) in cases.items():
        path = tmp_path / f"{name}.minidb"
        path.write_bytes(record(name.encode(), blob.SerializeToString()))
        with pytest.raises(rnn2jax.StorageError) as error:
            rnn2jax.read_blobs(path)
        assert one_line(error).startswith(f"DB '{path}' (minidb): blob '{name}' {message}")
        # inspect lists them without failing
        assert rnn2jax.describe_blobs(path)[0].kind == blob.type


def test_unknown_db_type_and_missing_db(tmp_path):
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.read_blobs(tmp_path / "x", db_type="bdb")
    assert one_line(error) == (
        f"DB '{tmp_path / 'x'}' (bdb): unknown db_type 'bdb'; rnn2jax reads minidb, lmdb, leveldb, rocksdb"
    )
    with pytest.raises(rnn2jax.StorageError, match="unknown db_type"):
        rnn2jax.write_blobs(tmp_path / "x", {"a": np.zeros(1)}, db_type="bdb")
    assert not (tmp_path / "x").exists()
    for db_type in ("minidb", "lmdb", "leveldb", "rocksdb"):
        with pytest.raises(rnn2jax.StorageError) as error:
            rnn2jax.read_blobs(tmp_path / "nope", db_type=db_type)
        assert one_line(error) == f"DB '{tmp_path / 'nope'}' ({db_type}) does not exist"


@pytest.mark.parametrize("db_type", ["lmdb", "leveldb", "rocksdb"])
def test_corrupt_directory_dbs(db_type, tmp_path):
    path = tmp_path / "bad"
    rnn2jax.write_blobs(path, {"w": np.ones(3, np.float32)}, db_type=db_type)
    victim = path / "data.mdb" if db_type == "lmdb" else path / "CURRENT"
    victim.write_bytes(b"\x00garbage, not a database")
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.read_blobs(path, db_type=db_type)
    assert one_line(error).startswith(f"DB '{path}' ({db_type}): not a readable {db_type}")


@pytest.mark.parametrize("db_type", ["minidb", "lmdb", "leveldb", "rocksdb"])
def test_write_into_read_only_directory(db_type, tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root ignores permissions (as CI runs): creating anything there fails as it would
        backend = db_module.backend(db_type, folder / "ckpt")
        create = backend.create

        def refuse(path, *args, **kwargs):
            if Path(path).parent == folder:
                raise PermissionError(13, "Permission denied", str(path))
            return create(path, *args, **kwargs)

        monkeypatch.setattr(backend, "create", refuse)
    try:
        with pytest.raises(rnn2jax.StorageError) as error:
            rnn2jax.write_blobs(folder / "ckpt", {"w": np.ones(2)}, db_type=db_type)
        text = one_line(error)
        assert text.startswith(f"DB '{folder / 'ckpt'}' ({db_type}): blob 'w' ") and "nothing was written" in text
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("db_type", ["minidb", "lmdb", "leveldb", "rocksdb"])
def test_failed_write_keeps_the_old_db_and_leaves_no_partial_file(db_type, tmp_path, monkeypatch):
    """A write that fails part way (a value Caffe2 cannot hold after good ones; the disk failing) leaves the
    old checkpoint readable and no temporary file beside it."""
    path = tmp_path / "ckpt"
    rnn2jax.write_blobs(path, {"w": np.arange(4.0)}, db_type=db_type)
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.write_blobs(path, {"w": np.zeros(4), "z": np.zeros(2, np.complex64)}, db_type=db_type)
    assert one_line(error).startswith(f"DB '{path}' ({db_type}): blob 'z' has dtype complex64")
    assert rnn2jax.read_blobs(path, db_type=db_type)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    backend = db_module.backend(db_type, path)
    monkeypatch.setattr(backend, "create", disk_full)
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.write_blobs(path, {"w": np.zeros(4)}, db_type=db_type)
    assert one_line(error) == (
        f"DB '{path}' ({db_type}): blob 'w' cannot be written: No space left on device; nothing was written"
    )
    assert rnn2jax.read_blobs(path, db_type=db_type)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.parametrize(
    ("db_type", "package", "extra"),
    [("lmdb", "lmdb", "lmdb"), ("leveldb", "plyvel", "leveldb"), ("rocksdb", "rocksdict", "rocksdb")],
)
def test_missing_extra_names_it(db_type, package, extra, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` fail
    for call in (
        lambda: rnn2jax.read_blobs(tmp_path / "db", db_type=db_type),
        lambda: rnn2jax.write_blobs(tmp_path / "db", {"w": np.ones(1)}, db_type=db_type),
    ):
        with pytest.raises(rnn2jax.StorageError) as error:
            call()
        assert one_line(error) == (
            f"DB '{tmp_path / 'db'}' ({db_type}): {db_type} needs the Python package '{package}', which is not "
            f"installed: pip install 'rnn2jax[{extra}]'"
        )
    assert not (tmp_path / "db").exists()


def test_absurd_dims_are_refused_by_the_memory_budget(tmp_path):
    path = tmp_path / "huge.minidb"
    path.write_bytes(record(b"w#%0", chunk("w", 0, 1, [1.0], dims=(1 << 20, 1 << 20))))
    with pytest.raises(rnn2jax.ResourceError, match=r"blob 'w' of shape \[1048576, 1048576\] float32"):
        rnn2jax.read_blobs(path)


@pytest.mark.parametrize("call", [rnn2jax.read_blobs, rnn2jax.describe_blobs, lambda p: rnn2jax.write_blobs(p, {})])
def test_a_db_path_of_the_wrong_type_is_an_input_type_error(call):
    with pytest.raises(rnn2jax.InputTypeError, match=r"a DB path must be a str or os\.PathLike, got a int"):
        call(123)
