"""The database host ops (Load, Save, Checkpoint, DBExists, CreateDB + TensorProtosDBInput) against real
Caffe2 (torch 1.10.2, minidb only): the same blobs after Load for every argument, files real Caffe2 reads
after our Save, the same checkpoint files, the same batches; and their one-line errors."""

from __future__ import annotations

import json
import os
import struct

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import BadArgumentError, MissingBlobError, Rnn2JaxError, StorageError
from rnn2jax.ops.storage import checkpoint_name
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.storage import db as db_module

op = create_operator

BLOBS = {  # what the DBs below hold: prefixed names, two dtypes, a chunked tensor, a string tensor
    "pre/a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "pre/b": np.array([7, -8, 9], np.int32),
    "c": np.linspace(-1, 1, 10).astype(np.float32),
    "words": np.array([b"x", b"yz"], dtype=object),
}
OTHER = {"d": np.full((2, 2), 0.5, np.float32), "pre/e": np.array([1, 2], np.int64)}


def ours(steps, *, db_root=None, feeds=None):
    """Run nets in a fresh rnn2jax Workspace; its array blobs (raw values: host ops keep the DB's dtype)."""
    workspace = rnn2jax.Workspace(db_root=db_root)
    for name, value in (feeds or {}).items():
        workspace.put(name, value)
    for step in steps:
        workspace.run(step)
    return {name: np.asarray(workspace.fetch(name)) for name in workspace.blobs()}, workspace


def theirs(caffe2, ops, feeds=None, fetch=None):
    return caffe2.run([("net", create_net("n", list(ops)))], feeds or {}, fetch)


def assert_same_blobs(got, want, names):
    assert sorted(n for n in names if n in got) == sorted(n for n in names if n in want)
    for name in names:
        if name in want:
            a, b = got[name], want[name]
            if b.dtype.kind in "SO":
                assert [bytes(v) for v in a.ravel()] == [bytes(v) for v in b.ravel()], name
            else:
                assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
                np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.fixture(scope="module")
def dbs(caffe2, tmp_path_factory):
    """Two minidbs written by real Caffe2's Save (one with 4-element chunks)."""
    root = tmp_path_factory.mktemp("dbs")
    first, second = root / "first.minidb", root / "second.minidb"
    theirs(
        caffe2, [op("Save", list(BLOBS), [], db=str(first), db_type="minidb", absolute_path=1, chunk_size=4)], BLOBS, []
    )
    theirs(caffe2, [op("Save", list(OTHER), [], db=str(second), db_type="minidb", absolute_path=1)], OTHER, [])
    return root, first, second


# -- Load ------------------------------------------------------------------------------------------------------


@st.composite
def load_args(draw):
    """A Load of some of the DBs' blobs with any mix of its arguments, valid or not."""
    args = {"db_type": "minidb", "absolute_path": 1}
    two = draw(st.booleans())
    mode = draw(st.sampled_from(["outputs", "sources", "load_all"]))
    prefix_arg = draw(st.sampled_from([{}, {"strip_prefix": "pre/"}, {"add_prefix": "x/"}, {"strip_prefix": "re"}]))
    args.update(prefix_arg)
    if draw(st.booleans()):
        args["allow_incomplete"] = 1
    if draw(st.booleans()):
        args["keep_device"] = 1
    renamed = {  # what each DB name is called after the prefix arguments
        n: (
            "x/" + n
            if "add_prefix" in args
            else n.split(args["strip_prefix"], 1)[1]
            if "strip_prefix" in args and args["strip_prefix"] in n
            else n
        )
        for n in [*BLOBS, *OTHER]
    }
    held = list(renamed.values()) if two else [renamed[n] for n in BLOBS]
    pool = [*held, "missing"]
    names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
    outputs = names
    if mode == "sources":
        args["source_blob_names"] = names
        outputs = [f"out{i}" for i in range(len(names))]
    elif mode == "load_all":
        args["load_all"] = 1
        outputs = draw(st.sampled_from([[], names[:1]]))
    return two, args, outputs


@given(case=load_args())
def test_load_arguments_match_caffe2(caffe2, dbs, case):
    _, first, second = dbs
    two, args, outputs = case
    where = {"dbs": [str(first), str(second)]} if two else {"db": str(first)}
    load = op("Load", [], outputs, **where, **args)
    try:
        want = theirs(caffe2, [load])
    except Caffe2Error as error:
        with pytest.raises(Rnn2JaxError) as info:
            ours([create_net("n", [load])])
        assert "\n" not in str(info.value) and "(Load)" in str(info.value), (str(error)[:200], info.value)
        return
    got, _ = ours([create_net("n", [load])])
    assert_same_blobs(got, want, set(got) | set(want))


def test_load_relative_paths_go_under_db_root(dbs):
    root, first, _ = dbs
    load = op("Load", [], ["c", "pre/a"], db=first.name, db_type="minidb")
    got, _ = ours([create_net("n", [load])], db_root=root)
    want, _ = ours(
        [create_net("n", [op("Load", [], ["c", "pre/a"], db=str(first), db_type="minidb", absolute_path=1)])]
    )
    assert_same_blobs(got, want, ["c", "pre/a"])
    np.testing.assert_array_equal(got["pre/a"], BLOBS["pre/a"])


def test_load_from_a_reader_reads_the_rest_of_the_db(caffe2, dbs):
    _, first, _ = dbs
    ops = [
        op("CreateDB", [], ["reader"], db=str(first), db_type="minidb"),
        op("Load", ["reader"], ["c", "pre/b"]),
    ]
    want = theirs(caffe2, ops, fetch=["c", "pre/b"])
    got, _ = ours([create_net("n", ops)])
    assert_same_blobs(got, want, ["c", "pre/b"])


# -- Save --------------------------------------------------------------------------------------------------------


@given(
    naming=st.sampled_from([{}, {"strip_prefix": "pre/"}, {"blob_name_overrides": ["A", "B", "C", "W"]}]),
    chunk_size=st.sampled_from([None, -1, 0, 1, 4, 100]),
)
def test_save_writes_what_caffe2_writes_and_reads(caffe2, tmp_path_factory, naming, chunk_size):
    folder = tmp_path_factory.mktemp("save")
    args = dict(naming, db_type="minidb", **({} if chunk_size is None else {"chunk_size": chunk_size}))
    mine, caffe2s = folder / "ours.minidb", folder / "caffe2.minidb"
    ours([create_net("n", [op("Save", list(BLOBS), [], db=mine.name, **args)])], db_root=folder, feeds=BLOBS)
    theirs(caffe2, [op("Save", list(BLOBS), [], db=str(caffe2s), absolute_path=1, **args)], BLOBS, [])
    assert sorted(_minidb_keys(mine)) == sorted(_minidb_keys(caffe2s))
    loaded = {}
    for path in (mine, caffe2s):  # real Caffe2 reads both back
        loaded[path] = theirs(caffe2, [op("Load", [], [], db=str(path), db_type="minidb", absolute_path=1, load_all=1)])
    assert_same_blobs(loaded[mine], loaded[caffe2s], set(loaded[mine]) | set(loaded[caffe2s]))
    expected = {"strip_prefix": ["a", "b", "c", "words"]}.get(next(iter(naming), ""), list(BLOBS))
    saved_as = dict(zip(BLOBS, naming.get("blob_name_overrides", expected), strict=True))
    for name, key in saved_as.items():
        assert_same_blobs({name: loaded[mine][key]}, {name: BLOBS[name]}, [name])


FLOAT_FORMATS = [pb.BlobSerializationOptions.FLOAT_DEFAULT, pb.BlobSerializationOptions.FLOAT_PROTOBUF]
BFLOAT16 = pb.BlobSerializationOptions.FLOAT_BFLOAT16


@st.composite
def serialization_options(draw):
    options = pb.SerializationOptions()
    for _ in range(draw(st.integers(0, 3))):
        options.options.add(
            blob_name_regex=draw(st.sampled_from(["", "f32", "f", "f.*", ".*16", "i16|f64", "pre/.*"])),
            chunk_size=draw(st.sampled_from([0, -1, 1, 3, 7])),
            float_format=draw(st.sampled_from([*FLOAT_FORMATS, BFLOAT16])),
        )
    return options


@given(
    options=serialization_options(),
    chunk_size=st.sampled_from([None, -1, 0, 2, 5]),
    floats=st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=12).map(
        lambda bits: np.array(bits, np.uint32).view(np.float32)  # every bit pattern: NaNs, infinities, ties
    ),
)
def test_save_options_write_the_records_caffe2_writes(caffe2, tmp_path_factory, options, chunk_size, floats):
    """Save's SerializationOptions, as Caffe2's SaveOpImpl reads them: the first entry whose regex matches a
    blob's name whole sets its chunk size (0 the default, -1 none) and float format, the chunk_size argument
    (its -1 and 0 swapped) is the last default; FLOAT_BFLOAT16 writes fbgemm's bfloat16, rounded half up.
    Every record is Caffe2's, bit for bit."""
    blobs = {
        "f32": floats,
        "pre/f": np.linspace(-3, 3, 9, dtype=np.float32).reshape(3, 3),
        "f64": np.linspace(0, 1, 5),
        "i16": np.arange(-4, 7, dtype=np.int16),
    }
    args = {"db_type": "minidb", "options": options.SerializeToString()}
    args.update({} if chunk_size is None else {"chunk_size": chunk_size})
    folder = tmp_path_factory.mktemp("save_options")
    mine, caffe2s = folder / "ours.minidb", folder / "caffe2.minidb"
    ours([create_net("n", [op("Save", list(blobs), [], db=mine.name, **args)])], db_root=folder, feeds=blobs)
    theirs(caffe2, [op("Save", list(blobs), [], db=str(caffe2s), absolute_path=1, **args)], blobs, [])
    assert _minidb_records(mine) == _minidb_records(caffe2s)


def _canonical(record: bytes) -> bytes:
    """A BlobProto in field order (rnn2jax writes packed floats after the other fields, Caffe2 in place; the
    messages are the same): NaN payloads kept, which comparing messages would not."""
    proto = pb.BlobProto()
    proto.ParseFromString(record)
    return proto.SerializeToString(deterministic=True)


def test_save_options_that_do_not_parse_are_an_error_naming_the_op(tmp_path):
    save = op("Save", ["w"], [], db="x", db_type="minidb", options=b"\xff\xff")
    with pytest.raises(BadArgumentError, match=r"Save.*serialization options"):
        ours([create_net("n", [save])], db_root=tmp_path, feeds={"w": np.ones(3, np.float32)})


def _minidb_records(path) -> dict[str, bytes]:
    data, records, position = path.read_bytes(), {}, 0
    while position < len(data):
        key_length, value_length = struct.unpack_from("<ii", data, position)
        key = data[position + 8 : position + 8 + key_length].decode()
        records[key] = _canonical(data[position + 8 + key_length : position + 8 + key_length + value_length])
        position += 8 + key_length + value_length
    return records


def _minidb_keys(path) -> list[str]:
    data, keys, position = path.read_bytes(), [], 0
    while position < len(data):
        key_length, value_length = struct.unpack_from("<ii", data, position)
        keys.append(data[position + 8 : position + 8 + key_length].decode())
        position += 8 + key_length + value_length
    return keys


def test_save_replaces_an_old_db_and_a_failed_save_keeps_it(tmp_path, monkeypatch):
    save = op("Save", ["w"], [], db="ckpt", db_type="minidb")
    ours([create_net("n", [save])], db_root=tmp_path, feeds={"w": np.ones(3, np.float32)})
    before = (tmp_path / "ckpt").read_bytes()

    def refuse(path):
        raise PermissionError(13, "Permission denied")  # what a read-only folder gives (tests run as root)

    module = db_module.backend("minidb", tmp_path)
    monkeypatch.setattr(module, "create", refuse)
    with pytest.raises(StorageError) as info:
        ours([create_net("n", [save])], db_root=tmp_path, feeds={"w": np.zeros(3, np.float32)})
    message = str(info.value)
    assert "\n" not in message and "op #0 (Save)" in message and "ckpt" in message and "blob 'w'" in message
    assert "Permission denied" in message
    assert (tmp_path / "ckpt").read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt"]  # no partial file


def test_save_failing_midway_leaves_no_partial_file(tmp_path, monkeypatch):
    from rnn2jax.storage import minidb

    original = minidb._Writer.put

    def put(self, key, value):
        if key.startswith(b"second"):
            raise OSError(28, "No space left on device")
        original(self, key, value)

    monkeypatch.setattr(minidb._Writer, "put", put)
    save = op("Save", ["first", "second"], [], db="ckpt", db_type="minidb")
    feeds = {"first": np.ones(3, np.float32), "second": np.ones(2, np.float32)}
    with pytest.raises(StorageError, match=r"op #0 \(Save\): DB '.*/ckpt' \(minidb\): blob 'second' .*No space"):
        ours([create_net("n", [save])], db_root=tmp_path, feeds=feeds)
    assert os.listdir(tmp_path) == []


# -- Checkpoint ----------------------------------------------------------------------------------------------------


@given(
    every=st.integers(1, 4),
    iterations=st.lists(st.integers(0, 12), min_size=1, max_size=4, unique=True),
    pattern=st.sampled_from(["ck_%d", "ck_%05d.minidb", "%d/../ck%i", "fixed"]),
    op_type=st.sampled_from(["Checkpoint", "Snapshot"]),
)
def test_checkpoint_writes_the_files_caffe2_writes(caffe2, tmp_path_factory, every, iterations, pattern, op_type):
    """Checkpoint and Snapshot (Caffe2's other name for it) write the files Caffe2 writes."""
    if "/" in pattern:
        pattern = "ck_%03i"
    mine, caffe2s = tmp_path_factory.mktemp("ours"), tmp_path_factory.mktemp("caffe2")
    w = np.arange(5, dtype=np.float32)
    for iteration in iterations:
        feeds = {"iter": np.array([iteration], np.int64), "w": w + iteration}
        args = dict(db_type="minidb", every=every)
        ours([create_net("n", [op(op_type, ["iter", "w"], [], db=pattern, **args)])], db_root=mine, feeds=feeds)
        theirs(caffe2, [op(op_type, ["iter", "w"], [], db=str(caffe2s / pattern), absolute_path=1, **args)], feeds, [])
    assert sorted(os.listdir(mine)) == sorted(os.listdir(caffe2s))
    assert sorted(os.listdir(mine)) == sorted({checkpoint_name(pattern, i) for i in iterations if i % every == 0})
    for name in os.listdir(mine):  # real Caffe2 reads ours: the iteration and the blob, as its own holds them
        load = [op("Load", [], ["iter", "w"], db=str(mine / name), db_type="minidb", absolute_path=1)]
        want = [op("Load", [], ["iter", "w"], db=str(caffe2s / name), db_type="minidb", absolute_path=1)]
        assert_same_blobs(theirs(caffe2, load), theirs(caffe2, want), ["iter", "w"])


def test_checkpoint_name_is_snprintf():
    assert checkpoint_name("a_%d", 7) == "a_7"
    assert checkpoint_name("a_%05d_%%", 42) == "a_00042_%"
    assert checkpoint_name("a_%ld", 2**33) == f"a_{2**33}"
    assert checkpoint_name("a_%d", 2**32 + 5) == "a_5"  # %d reads the low 32 bits of the int64
    assert checkpoint_name("plain", 3) == "plain"


def test_checkpoint_refuses_a_pattern_snprintf_would_crash_on():
    # real Caffe2 segfaults on db="ck_%s" (snprintf reads the int64 as a char*)
    with pytest.raises(BadArgumentError, match=r"op #0 \(Checkpoint\).*one integer conversion"):
        ours([create_net("n", [op("Checkpoint", ["i"], [], db="ck_%s", db_type="minidb")])], feeds={"i": np.zeros(1)})


# -- DBExists ------------------------------------------------------------------------------------------------------


@given(exists=st.booleans(), absolute=st.booleans())
def test_db_exists_matches_caffe2(caffe2, dbs, exists, absolute):
    root, first, _ = dbs
    name = first.name if exists else "absent.minidb"
    mine = op("DBExists", [], ["e"], db_name=name, db_type="minidb")
    got, _ = ours([create_net("n", [mine])], db_root=root)
    want = theirs(caffe2, [op("DBExists", [], ["e"], db_name=str(root / name), db_type="minidb", absolute_path=1)])
    assert got["e"].shape == want["e"].shape == () and bool(got["e"]) == bool(want["e"]) == exists
    if absolute:
        got, _ = ours(
            [create_net("n", [op("DBExists", [], ["e"], db_name=str(root / name), db_type="minidb", absolute_path=1)])]
        )
        assert bool(got["e"]) == exists


def test_db_exists_refuses_an_unknown_db_type(caffe2):
    # real Caffe2 answers True for a db_type it does not know (its CreateDB returns null without throwing)
    assert bool(theirs(caffe2, [op("DBExists", [], ["e"], db_name="nowhere", db_type="nosuch")])["e"])
    with pytest.raises(BadArgumentError, match=r"op #0 \(DBExists\): unknown db_type 'nosuch'"):
        ours([create_net("n", [op("DBExists", [], ["e"], db_name="nowhere", db_type="nosuch")])])


# -- CreateDB + TensorProtosDBInput --------------------------------------------------------------------------------


def _write_records(path, records: list[list[np.ndarray]]) -> None:
    """A minidb of TensorProtos, written by hand: per record, <i4 key length, <i4 value length, key, value."""
    with open(path, "wb") as file:
        for index, tensors in enumerate(records):
            protos = pb.TensorProtos()
            for array in tensors:
                proto = protos.protos.add(dims=array.shape)
                if array.dtype == np.float32:
                    proto.data_type = pb.TensorProto.FLOAT
                    proto.float_data.extend(array.ravel().tolist())
                else:
                    proto.data_type = pb.TensorProto.INT32
                    proto.int32_data.extend(array.ravel().tolist())
            key, value = f"r{index:04d}".encode(), protos.SerializeToString()
            file.write(struct.pack("<ii", len(key), len(value)) + key + value)


@given(
    records=st.integers(1, 5),
    batch_size=st.integers(0, 4),
    reads=st.integers(1, 4),
    shards=st.sampled_from([(1, 0), (2, 0), (2, 1)]),
)
def test_tensor_protos_db_input_batches_match_caffe2(caffe2, tmp_path_factory, records, batch_size, reads, shards):
    num_shards, shard_id = shards
    if shard_id >= records:
        shard_id = 0
    path = tmp_path_factory.mktemp("records") / "data.minidb"
    rng = np.random.default_rng(records * 10 + batch_size)
    _write_records(
        path, [[rng.normal(size=(2, 3)).astype(np.float32), np.array([i, -i], np.int32)] for i in range(records)]
    )
    create = op("CreateDB", [], ["reader"], db=str(path), db_type="minidb", num_shards=num_shards, shard_id=shard_id)
    read = op("TensorProtosDBInput", ["reader"], ["data", "label"], batch_size=batch_size)
    caffe2.run([("net", create_net("init", [create])), ("create_net", create_net("read", [read]))], {}, [])
    workspace = rnn2jax.Workspace()
    workspace.run(create_net("init", [create]))
    workspace.create_net(create_net("read", [read]))
    for _ in range(reads):
        want = caffe2.run([("run_net", "read")], {}, ["data", "label"], reset=False)
        workspace.run_net("read")
        got = {name: np.asarray(workspace.fetch(name)) for name in ("data", "label")}
        assert_same_blobs(got, want, ["data", "label"])


def test_tensor_protos_db_input_errors_name_the_db_and_the_record(tmp_path):
    path = tmp_path / "data.minidb"
    _write_records(path, [[np.zeros((2,), np.float32)], [np.zeros((3,), np.float32)]])
    create = op("CreateDB", [], ["reader"], db=str(path), db_type="minidb")
    with pytest.raises(
        StorageError, match=r"op #1 \(TensorProtosDBInput\): .*data.minidb.*record 'r0000' holds 1 tensors"
    ):
        ours([create_net("n", [create, op("TensorProtosDBInput", ["reader"], ["a", "b"])])])
    with pytest.raises(StorageError, match=r"op #1 \(TensorProtosDBInput\): .*blob 'a'.*\[2\].*\[3\]"):
        ours([create_net("n", [create, op("TensorProtosDBInput", ["reader"], ["a"], batch_size=2)])])


# -- errors --------------------------------------------------------------------------------------------------------


def _one_line(error: Exception, *parts: str) -> None:
    message = str(error)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, (part, message)


def test_load_errors_name_op_db_and_blob(dbs, tmp_path):
    root, first, _ = dbs
    data = first.read_bytes()
    (tmp_path / "truncated").write_bytes(data[: len(data) - 7])
    key_length, value_length = struct.unpack_from("<ii", data)
    start = 8 + key_length  # the first record's value, garbled
    key = data[8:start].decode()
    (tmp_path / "corrupt").write_bytes(data[:start] + b"\xff" * value_length + data[start + value_length :])
    cases = [
        ("truncated", ["c", "words"], StorageError, ["op #0 (Load)", "truncated", "minidb", "truncated"]),
        ("corrupt", [key.split("#%")[0]], StorageError, ["op #0 (Load)", "corrupt", f"(key '{key}')"]),
        ("absent", ["c"], StorageError, ["op #0 (Load)", "absent", "does not exist"]),
    ]
    for name, outputs, kind, parts in cases:
        with pytest.raises(kind) as info:
            ours([create_net("n", [op("Load", [], outputs, db=name, db_type="minidb")])], db_root=tmp_path)
        _one_line(info.value, *parts)
    with pytest.raises(MissingBlobError) as info:
        ours([create_net("n", [op("Load", [], ["c", "nope"], db=first.name, db_type="minidb")])], db_root=root)
    _one_line(info.value, "op #0 (Load)", "blob 'nope' is not in", "first.minidb", "allow_incomplete")
    with pytest.raises(BadArgumentError) as info:
        ours([create_net("n", [op("Load", [], ["c"], db=first.name, db_type="nosuch")])], db_root=root)
    _one_line(info.value, "op #0 (Load)", "unknown db_type 'nosuch'")


def test_missing_chunks_name_the_blob(caffe2, tmp_path):
    path = tmp_path / "chunked.minidb"
    theirs(caffe2, [op("Save", ["c"], [], db=str(path), db_type="minidb", absolute_path=1, chunk_size=3)], BLOBS, [])
    records, data, position = [], path.read_bytes(), 0
    while position < len(data):
        k, v = struct.unpack_from("<ii", data, position)
        records.append(data[position : position + 8 + k + v])
        position += 8 + k + v
    path.write_bytes(b"".join(records[:1] + records[2:]))  # drop the second chunk
    with pytest.raises(StorageError) as info:
        ours([create_net("n", [op("Load", [], ["c"], db=path.name, db_type="minidb")])], db_root=tmp_path)
    _one_line(info.value, "op #0 (Load)", "chunked.minidb", "blob 'c' is incomplete", "missing chunks")
    with pytest.raises(Caffe2Error):  # Caffe2 refuses it too
        theirs(caffe2, [op("Load", [], ["c"], db=str(path), db_type="minidb", absolute_path=1)])


def test_bad_arguments_are_named_before_anything_runs(tmp_path):
    cases = [
        (op("Load", [], ["a"], db_type="minidb"), "needs a db or dbs"),
        (op("Load", [], ["a"], db="x", dbs=["y"], db_type="minidb"), "db or dbs, not both"),
        (op("Load", [], ["a"], db="x"), "needs a db_type"),
        (op("Load", [], ["a"], db="x", db_type="minidb", source_blob_names=["p", "q"]), "2 source_blob_names for 1"),
        (op("Load", [], ["a"], db="x", db_type="minidb", load_all=1, source_blob_names=["p"]), "load_all"),
        (op("Save", ["a"], [], db_type="minidb"), "needs a db argument"),
        (
            op("Save", ["a", "b"], [], db="x", db_type="minidb", blob_name_overrides=["p"]),
            "1 blob_name_overrides for 2",
        ),
        (op("Save", ["p/a", "a"], [], db="x", db_type="minidb", strip_prefix="p/"), "saved as 'a'"),
        (op("Save", ["a"], [], db="x", db_type="minidb", chunk_size=-5), "chunk_size -5"),
        (op("Checkpoint", ["i"], [], db="x", db_type="minidb", every=0), "every must be positive"),
        (op("DBExists", [], ["e"], db="x", db_type="minidb"), "db_name"),
        (op("CreateDB", [], ["r"], db="x", db_type="minidb", num_shards=2, shard_id=2), "shard_id 2"),
        (op("TensorProtosDBInput", ["r"], ["a"], batch_size=-1), "batch_size"),
    ]
    for bad, part in cases:
        net = create_net("bad", [op("Print", ["a"], []), bad])  # the Print never runs: the check comes first
        workspace = rnn2jax.Workspace(db_root=tmp_path)
        for name in set(bad.input) | {"a"}:
            workspace.put(name, np.zeros(1, np.float32))
        with pytest.raises(BadArgumentError) as info:
            workspace.run(net)
        _one_line(info.value, f"net 'bad', op #1 ({bad.type})", part)
    assert os.listdir(tmp_path) == []


def _lstm_net_and_weights_db(folder):
    """The builder's LSTM as files: the net, and an init net that Loads its parameters from a minidb in
    `folder` (written from the builder's own init net's values)."""
    from rnn2jax.caffe2.python.core import reset_net_names
    from rnn2jax.caffe2.python.model_helper import ModelHelper
    from rnn2jax.caffe2.python.rnn_cell import LSTM
    from rnn2jax.compiler.compiled_net import run_init_net

    reset_net_names()
    model = ModelHelper(name="lstm_db")
    LSTM(model, "x", "seq_lengths", ("h0", "c0"), dim_in=2, dim_out=3, scope="lstm")
    params = {k: np.asarray(v) for k, v in run_init_net(model.param_init_net.Proto(), seed=3).items()}
    rnn2jax.write_blobs(folder / "weights.minidb", params)
    init = pb.NetDef(name="load_init")
    op = init.op.add(type="Load", output=list(params))
    op.arg.add(name="db", s=b"weights.minidb")
    op.arg.add(name="db_type", s=b"minidb")
    (folder / "net.pb").write_bytes(model.net.Proto().SerializeToString())
    (folder / "init.pb").write_bytes(init.SerializeToString())
    return model, params


def test_verify_and_export_read_the_init_nets_databases_under_db_root(tmp_path, capsys, monkeypatch):
    """`rnn2jax verify` and `rnn2jax export` take --db-root as `run` does: the same report and the same
    outputs as with the parameters given directly; without it, the error names the DB and --db-root."""
    from rnn2jax.cli import main
    from rnn2jax.native import disabled as native_disabled
    from rnn2jax.serving import load_exported

    root = tmp_path / "models"
    root.mkdir()
    model, params = _lstm_net_and_weights_db(root)
    monkeypatch.chdir(tmp_path)  # relative DB names must not resolve by accident
    shapes = {"lstm/i2h": (2, 2, 12), "h0": (2, 3), "c0": (2, 3), "seq_lengths": (2,)}
    shape_args = [a for n, s in shapes.items() for a in ("--shape", f"{n}={','.join(map(str, s))}")]
    net, init = str(root / "net.pb"), str(root / "init.pb")
    assert main(["verify", net, "--init", init, "--db-root", str(root), "--json", *shape_args]) == 0
    got = json.loads(capsys.readouterr().out)
    want = rnn2jax.verify(model.net.Proto(), shapes=shapes, params=params)
    assert [c["max_abs"] for c in got["checks"]] == [c.max_abs for c in want.checks] and want.ok

    out = tmp_path / "lstm.bin"
    export_args = [
        a for n, s in shapes.items() if n != "lstm/i2h" for a in ("--input-shape", f"{n}={','.join(map(str, s))}")
    ]
    export_args += ["--input-shape", "x=2,2,2", "--input-dtype", "seq_lengths=int32"]
    assert main(["export", net, "--init", init, "--db-root", str(root), *export_args, "-o", str(out)]) == 0
    rng = np.random.default_rng(0)
    inputs = {
        "x": rng.standard_normal((2, 2, 2)).astype(np.float32),
        "h0": rng.standard_normal((2, 3)).astype(np.float32),
        "c0": rng.standard_normal((2, 3)).astype(np.float32),
        "seq_lengths": np.array([2, 1], np.int32),
    }
    served = load_exported(out)(inputs)
    with native_disabled():  # the export holds the pure lowering: compare it with the same lowering
        direct = rnn2jax.compile(model.net.Proto(), params=params)(inputs)
    assert "lstm/hidden_state_all" in served and set(served) == set(direct)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6), served, direct)

    assert main(["verify", net, "--init", init, *shape_args]) == 2
    error = capsys.readouterr().err
    assert "weights.minidb" in error and "--db-root" in error and error.count("\n") == 1


# -- StoreSet, StoreGet, StoreWait, StoreAdd -----------------------------------------------------------------------


@given(
    value=st.sampled_from(
        [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, -2], np.int64), np.zeros(0, np.int32), b"bytes"]
    ),
    renamed=st.booleans(),
)
def test_store_set_and_get_round_trip_as_in_caffe2(caffe2, tmp_path_factory, value, renamed):
    """A blob through a file store comes back as Caffe2's comes back (strings: Caffe2 fetches no std::string)."""
    key = {"blob_name": "key"} if renamed else {}
    ops = lambda path: [  # noqa: E731
        op("FileStoreHandlerCreate", [], ["store"], path=str(path)),
        op("StoreSet", ["store", "x"], [], **key),
        op("StoreWait", ["store"], [], blob_names=["key" if renamed else "x"]),
        op("StoreGet", ["store"], ["y"], blob_name="key" if renamed else "x"),
    ]
    got, workspace = ours([create_net("n", ops(tmp_path_factory.mktemp("ours")))], feeds={"x": value})
    if isinstance(value, bytes):
        assert workspace.fetch("y") == value
        return
    want = theirs(caffe2, ops(tmp_path_factory.mktemp("caffe2")), {"x": value}, ["y"])
    assert_same_blobs(got, want, ["y"])


def test_store_ops_refuse_what_they_cannot_do(tmp_path):
    store = op("FileStoreHandlerCreate", [], ["store"], path=str(tmp_path))
    with pytest.raises(Rnn2JaxError, match=r"StoreAdd.*no counters"):
        ours([create_net("n", [store, op("StoreAdd", ["store"], ["n"], blob_name="c")])])
    with pytest.raises(Rnn2JaxError, match=r"blob 'x'.*not a store handler"):
        ours([create_net("n", [op("StoreGet", ["x"], ["y"])])], feeds={"x": np.ones(1)})
    with pytest.raises(BadArgumentError, match="blob_names"):
        ours([create_net("n", [store, op("StoreWait", ["store"], [])])])


# -- CreateBlobsQueueDB --------------------------------------------------------------------------------------------


def _tensor_protos(i: int) -> bytes:
    protos = pb.TensorProtos()
    image = protos.protos.add()
    image.data_type, image.string_data[:] = pb.TensorProto.STRING, [f"foo{i}".encode()]
    label = protos.protos.add()
    label.data_type, label.int32_data[:] = pb.TensorProto.INT32, [i]
    return protos.SerializeToString()


@pytest.mark.parametrize("as_tensor", [False, True])
def test_blobs_queue_db_feeds_tensor_protos_db_input(as_tensor):
    """Records enqueued as strings (or string tensors) come out of TensorProtosDBInput in order. (Caffe2's own
    blobs_queue_db_test.py checks the same against rnn2jax's Caffe2 API; asking the oracle would hang its worker:
    Caffe2's cursor reads ahead, and waits on the emptied queue.)"""
    ops = [op("CreateBlobsQueue", [], ["queue"], capacity=8), op("CreateBlobsQueueDB", ["queue"], ["reader"])]
    feeds = {}
    for i in range(1, 5):
        record = _tensor_protos(i)
        feeds[f"r{i}"] = np.array([record], dtype=object) if as_tensor else record
        ops.append(op("SafeEnqueueBlobs", ["queue", f"r{i}"], [f"r{i}", f"status{i}"]))
    ops.append(op("TensorProtosDBInput", ["reader"], ["image", "label"], batch_size=3))
    got, _ = ours([create_net("n", ops)], feeds=feeds)
    assert got["image"].tolist() == [b"foo1", b"foo2", b"foo3"] and got["label"].tolist() == [1, 2, 3]
    with pytest.raises(StorageError, match="empty and open"):
        ours([create_net("n", [*ops, ops[-1]])], feeds=feeds)
