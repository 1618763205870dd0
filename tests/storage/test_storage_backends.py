"""lmdb, leveldb, rocksdb and minidb round trips, and DBs written in the test by an independent writer: the
lmdb/plyvel/rocksdict packages (or struct, for minidb) putting `BlobProto` messages built by hand from
the documented format, read back by rnn2jax; and rnn2jax's DBs read back by those packages."""

from __future__ import annotations

import struct

import lmdb
import numpy as np
import plyvel
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from rocksdict import AccessType, Options, Rdict

import rnn2jax
from rnn2jax.proto import caffe2_pb2 as pb

DB_TYPES = ["minidb", "lmdb", "leveldb", "rocksdb"]


# -- an independent writer and reader per DB type, straight from each package -----------------------


def put_records(path, db_type, records):
    if db_type == "minidb":  # caffe2/core/db.cc: int key length, int value length, key, value
        with open(path, "wb") as file:
            for key, value in records:
                file.write(struct.pack("<ii", len(key), len(value)) + key + value)
    elif db_type == "lmdb":
        with lmdb.open(str(path), map_size=1 << 30) as env, env.begin(write=True) as txn:
            for key, value in records:
                txn.put(key, value)
    elif db_type == "leveldb":
        db = plyvel.DB(str(path), create_if_missing=True)
        for key, value in records:
            db.put(key, value)
        db.close()
    else:
        db = Rdict(str(path), Options(raw_mode=True))
        for key, value in records:
            db[key] = value
        db.close()


def get_records(path, db_type):
    if db_type == "minidb":
        data, records, position = path.read_bytes(), [], 0
        while position < len(data):
            key_length, value_length = struct.unpack_from("<ii", data, position)
            key = data[position + 8 : position + 8 + key_length]
            records.append((key, data[position + 8 + key_length : position + 8 + key_length + value_length]))
            position += 8 + key_length + value_length
        return records
    if db_type == "lmdb":
        with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
            return list(txn.cursor())
    if db_type == "leveldb":
        db = plyvel.DB(str(path))
        records = list(db.iterator())
        db.close()
        return records
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    records = list(db.items())
    db.close()
    return records


def tensor_blob(name, dims, data_type, begin=None, end=None, **data):
    blob = pb.BlobProto(name=name, type="Tensor")
    blob.tensor.name = name
    blob.tensor.dims.extend(dims)
    blob.tensor.data_type = data_type
    if begin is not None:
        blob.tensor.segment.begin, blob.tensor.segment.end = begin, end
    for field, values in data.items():
        if isinstance(values, bytes):
            setattr(blob.tensor, field, values)
        else:
            getattr(blob.tensor, field).extend(values)
    return blob.SerializeToString()


# -- round trips -------------------------------------------------------------------------------------

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int8, np.int16, np.uint8, np.uint16, np.bool_, np.float16]


@pytest.mark.parametrize("db_type", DB_TYPES)
@given(
    arrays=st.lists(
        st.sampled_from(DTYPES).flatmap(lambda d: hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0))),
        min_size=1,
        max_size=3,
    ),
    chunk_size=st.sampled_from([None, 0, 1, 3]),
)
def test_round_trip(db_type, tmp_path_factory, arrays, chunk_size):
    blobs = {f"layer{i}/w": a for i, a in enumerate(arrays)}
    blobs["vocab"] = np.array([b"a", b"bc", "d\u00e9".encode()], dtype=object)
    blobs["note"] = b"\x00 raw bytes"
    path = tmp_path_factory.mktemp(db_type) / f"params.{db_type}"
    rnn2jax.write_blobs(path, blobs, db_type=db_type, chunk_size=chunk_size)
    got = rnn2jax.read_blobs(path, db_type=db_type)
    assert set(got) == set(blobs)
    for name, want in blobs.items():
        if isinstance(want, bytes):
            assert got[name] == want
        elif want.dtype == object:
            assert got[name].tolist() == want.tolist()
        else:
            assert got[name].dtype == want.dtype and got[name].shape == want.shape
            assert got[name].tobytes() == want.tobytes(), name
    # and what the package itself reads is Caffe2's layout: one BlobProto per chunk under "name#%<id>"
    records = dict(get_records(path, db_type))
    w0 = pb.BlobProto.FromString(records[b"layer0/w#%0"])
    assert w0.type == "Tensor" and list(w0.tensor.dims) == list(arrays[0].shape)
    assert w0.tensor.segment.begin == 0
    assert pb.BlobProto.FromString(records[b"note"]).content == b"\x00 raw bytes"


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_independent_writer_every_field_and_chunks(db_type, tmp_path):
    """BlobProtos built by hand: chunks out of order, every data field Caffe2 reads (float16 as int32 bit
    patterns, uint16 in byte_data as --caffe2_serialize_using_bytes_as_holder writes it, legacy BYTE), an
    empty tensor of UNDEFINED type, and a string blob."""
    half = np.array([1.0, -0.5, 65504.0], np.float16)
    records = [
        (b"w#%1", tensor_blob("w", [2, 3], pb.TensorProto.FLOAT, 4, 6, float_data=[5.0, 6.0])),
        (b"w#%0", tensor_blob("w", [2, 3], pb.TensorProto.FLOAT, 0, 4, float_data=[1.0, 2.0, 3.0, 4.0])),
        (b"h#%0", tensor_blob("h", [3], pb.TensorProto.FLOAT16, int32_data=half.view(np.uint16).tolist())),
        (b"u", tensor_blob("u", [2], pb.TensorProto.UINT16, byte_data=np.array([7, 65535], "<u2").tobytes())),
        (b"legacy", tensor_blob("legacy", [3], pb.TensorProto.BYTE, byte_data=b"\x01\x02\xff")),
        (b"ids#%0", tensor_blob("ids", [2], pb.TensorProto.INT64, int64_data=[-(2**40), 3])),
        (b"mask#%0", tensor_blob("mask", [3], pb.TensorProto.BOOL, int32_data=[1, 0, 1])),
        (b"empty#%0", tensor_blob("empty", [0, 5], pb.TensorProto.UNDEFINED)),
        (b"words#%0", tensor_blob("words", [2], pb.TensorProto.STRING, string_data=[b"x", b""])),
        (b"text", pb.BlobProto(name="text", type="std::string", content=b"hello").SerializeToString()),
    ]
    path = tmp_path / f"hand.{db_type}"
    put_records(path, db_type, records)
    got = rnn2jax.read_blobs(path, db_type=db_type)
    np.testing.assert_array_equal(got["w"], np.array([[1, 2, 3], [4, 5, 6]], np.float32))
    assert got["w"].dtype == np.float32
    assert got["h"].dtype == np.float16 and got["h"].tobytes() == half.tobytes()
    assert got["u"].dtype == np.uint16 and got["u"].tolist() == [7, 65535]
    assert got["legacy"].dtype == np.uint8 and got["legacy"].tolist() == [1, 2, 255]
    assert got["ids"].dtype == np.int64 and got["ids"].tolist() == [-(2**40), 3]
    assert got["mask"].dtype == np.bool_ and got["mask"].tolist() == [True, False, True]
    assert got["empty"].dtype == np.float32 and got["empty"].shape == (0,)  # Caffe2's reading of it
    assert got["words"].tolist() == [b"x", b""]
    assert got["text"] == b"hello"
    subset = rnn2jax.read_blobs(path, db_type=db_type, names=["text", "ids"])
    assert list(subset) == ["text", "ids"] and subset["text"] == b"hello" and subset["ids"].tolist() == [-(2**40), 3]


@pytest.mark.parametrize("db_type", ["LMDB", "LevelDB", "RocksDB", "MiniDB"])
def test_caffe2s_capitalised_db_type_names(db_type, tmp_path):
    path = tmp_path / "x"
    rnn2jax.write_blobs(path, {"x": np.arange(3, dtype=np.int32)}, db_type=db_type)
    assert rnn2jax.read_blobs(path, db_type=db_type.lower())["x"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_rewrite_replaces_the_old_db(db_type, tmp_path):
    path = tmp_path / "ckpt"
    rnn2jax.write_blobs(path, {"old": np.zeros(2, np.float32)}, db_type=db_type)
    rnn2jax.write_blobs(path, {"new": np.ones(2, np.float32)}, db_type=db_type)
    assert list(rnn2jax.read_blobs(path, db_type=db_type)) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary or backup left behind
