"""minidb files cross-checked with real Caffe2 (torch 1.10.2): what its `Save` writes (every dtype, chunked
tensors, strings) loads in rnn2jax bit for bit, and what rnn2jax writes loads in its `Load` bit for bit."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rnn2jax
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.proto import caffe2_pb2 as pb

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int8, np.int16, np.uint8, np.uint16, np.bool_, np.float16]


def tensors(dtype) -> st.SearchStrategy[np.ndarray]:
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
    if np.dtype(dtype).kind == "f":  # every bit pattern, NaN payloads and signalling NaNs included
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
        return hnp.arrays(bits, shapes).map(lambda a: a.view(dtype))
    return hnp.arrays(dtype, shapes)


def string_tensors() -> st.SearchStrategy[np.ndarray]:
    def build(values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    # no trailing NULs: strings travel to and from the Caffe2 worker as fixed-width bytes, which drop them
    return st.lists(st.binary(max_size=6).map(lambda b: b.rstrip(b"\x00")), max_size=7).map(build)


def assert_bit_equal(got, want, name=""):
    if want.dtype == object:
        assert got.dtype == object and got.shape == want.shape, name
        assert [bytes(v) for v in got.ravel()] == [bytes(v) for v in want.ravel()], name
        return
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), name


def caffe2_save(caffe2, path, blobs, **args):
    """Real Caffe2 feeds `blobs` and Saves them to a minidb at `path`."""
    save = create_operator("Save", list(blobs), [], db=str(path), db_type="minidb", absolute_path=1, **args)
    caffe2.run([("op", save)], blobs, [])


def caffe2_load(caffe2, path, names, **args):
    """Real Caffe2 Loads `names` from the minidb at `path` and fetches them."""
    load = create_operator("Load", [], list(names), db=str(path), db_type="minidb", absolute_path=1, **args)
    return caffe2.run([("op", load)], {}, list(names))


def raw_minidb_keys(path):
    data = path.read_bytes()
    keys, position = [], 0
    while position < len(data):
        key_length, value_length = np.frombuffer(data, "<i4", 2, position)
        position += 8
        keys.append(data[position : position + key_length].decode())
        position += int(key_length) + int(value_length)
    return keys


@given(
    arrays=st.lists(st.sampled_from(DTYPES).flatmap(tensors), min_size=1, max_size=4),
    strings=string_tensors(),
    chunk_size=st.sampled_from([None, 0, 1, 2, 3, 7]),
)
def test_caffe2_saved_minidb_loads_bit_for_bit(caffe2, tmp_path_factory, arrays, strings, chunk_size):
    blobs = {f"blob_{i}": a for i, a in enumerate(arrays)}
    blobs["words"] = strings
    path = tmp_path_factory.mktemp("save") / "caffe2.minidb"
    caffe2_save(caffe2, path, blobs, **({} if chunk_size is None else {"chunk_size": chunk_size}))
    got = rnn2jax.read_blobs(path)
    assert set(got) == set(blobs)
    for name, want in blobs.items():
        assert_bit_equal(got[name], want, name)


def test_caffe2_chunk_keys_and_segments_are_what_we_read(caffe2, tmp_path):
    """Caffe2 writes one record per chunk under "name#%<id>", from several threads (so in any order)."""
    w = np.arange(23, dtype=np.float32).reshape(23, 1) * 0.5
    path = tmp_path / "chunked.minidb"
    caffe2_save(caffe2, path, {"w": w}, chunk_size=5)
    assert sorted(raw_minidb_keys(path)) == [f"w#%{i}" for i in range(5)]
    infos = rnn2jax.describe_blobs(path)
    assert [(i.name, i.shape, i.dtype, i.chunks) for i in infos] == [("w", (23, 1), "float32", 5)]
    assert_bit_equal(rnn2jax.read_blobs(path, names=["w"])["w"], w)


def test_caffe2_default_chunk_size_is_a_million_elements(caffe2, tmp_path):
    big = np.random.default_rng(0).standard_normal(1_000_001).astype(np.float32)
    path = tmp_path / "big.minidb"
    caffe2_save(caffe2, path, {"big": big})
    assert sorted(raw_minidb_keys(path)) == ["big#%0", "big#%1"]
    assert_bit_equal(rnn2jax.read_blobs(path)["big"], big)


def test_caffe2_string_blob_loads_as_bytes(caffe2, tmp_path):
    """A std::string blob: our writer puts one in a DB, Caffe2 Loads it and Saves it again with its own
    StringSerializer, and rnn2jax reads Caffe2's file (the key has no chunk suffix)."""
    ours, theirs = tmp_path / "ours.minidb", tmp_path / "theirs.minidb"
    rnn2jax.write_blobs(ours, {"note": b"caffe2 \x00\xff bytes", "x": np.ones(2, np.float32)})
    load = create_operator("Load", [], ["note", "x"], db=str(ours), db_type="minidb", absolute_path=1)
    save = create_operator("Save", ["note", "x"], [], db=str(theirs), db_type="minidb", absolute_path=1)
    fetched = caffe2.run([("op", load), ("op", save)], {}, ["note"])
    assert fetched["note"].tobytes() == b"caffe2 \x00\xff bytes"
    assert sorted(raw_minidb_keys(theirs)) == ["note", "x#%0"]
    got = rnn2jax.read_blobs(theirs)
    assert got["note"] == b"caffe2 \x00\xff bytes"
    assert_bit_equal(got["x"], np.ones(2, np.float32))


@given(
    arrays=st.lists(st.sampled_from(DTYPES).flatmap(tensors), min_size=1, max_size=4),
    strings=string_tensors(),
    chunk_size=st.sampled_from([None, 0, 1, 2, 3, 7]),
)
def test_rnn2jax_minidb_loads_in_caffe2_bit_for_bit(caffe2, tmp_path_factory, arrays, strings, chunk_size):
    blobs = {f"blob_{i}": a for i, a in enumerate(arrays)}
    blobs["words"] = strings
    path = tmp_path_factory.mktemp("ours") / "rnn2jax.minidb"
    rnn2jax.write_blobs(path, blobs, chunk_size=chunk_size)
    fetched = caffe2_load(caffe2, path, blobs)
    for name, want in blobs.items():
        got = fetched[name]
        if want.dtype == object:  # strings come back from the worker as fixed-width bytes
            assert got.shape == want.shape and [bytes(v) for v in got.ravel()] == list(want.ravel()), name
        else:
            assert_bit_equal(got, want, name)


def test_caffe2_load_all_takes_every_blob_we_wrote(caffe2, tmp_path):
    blobs = {"a/w": np.arange(6, dtype=np.int64).reshape(2, 3), "a/b": np.array([0.25, -1.0], np.float64)}
    path = tmp_path / "all.minidb"
    rnn2jax.write_blobs(path, blobs, chunk_size=4)
    load = create_operator("Load", [], [], db=str(path), db_type="minidb", absolute_path=1, load_all=1)
    fetched = caffe2.run([("op", load)], {}, list(blobs))
    for name, want in blobs.items():
        assert_bit_equal(fetched[name], want, name)


def test_caffe2_bfloat16_saved_floats_load(caffe2, tmp_path):
    """Save's `options` can ask for FLOAT_BFLOAT16: the tensor's raw_data then holds the top 16 bits of
    each float (data_format FMT_BFLOAT16). rnn2jax reads them as Caffe2's own Load does."""
    x = np.array([1.0, -2.5, 3.1415927, 1e-3, 65504.0], np.float32)
    options = pb.SerializationOptions()
    options.options.add(float_format=pb.BlobSerializationOptions.FLOAT_BFLOAT16)
    path = tmp_path / "bf16.minidb"
    caffe2_save(caffe2, path, {"x": x}, options=options.SerializeToString())
    caffe2_view = caffe2_load(caffe2, path, ["x"])["x"]
    got = rnn2jax.read_blobs(path)["x"]
    assert_bit_equal(got, caffe2_view)
    bits = x.view(np.uint32).astype(np.uint64)  # bfloat16 rounded half up, as fbgemm's FloatToBfloat16 does
    rounded = ((bits + 0x8000) >> 16 << 16).astype(np.uint32)
    assert_bit_equal(got, rounded.view(np.float32))
    assert not np.array_equal(got, x)  # the test's values do lose bits


@given(
    values=st.lists(st.binary(max_size=6), max_size=6),
    shape=st.sampled_from(["flat", "2d"]),
)
def test_caffe2_string_tensor_round_trips_through_convert_params(caffe2, tmp_path_factory, values, shape):
    """Real Caffe2's GivenTensorStringFill + Save write a vocabulary beside a weight; `convert-params` puts
    it in the .npz as fixed-width bytes (no pickles) and `load_params` gives back Caffe2's strings, every
    byte (NULs inside included). A string ending in a NUL byte, which 'S' arrays cannot keep, is refused by
    name and no file is written."""
    from rnn2jax.cli import main

    folder = tmp_path_factory.mktemp("strings")
    db, out = folder / "vocab.minidb", folder / "params.npz"
    dims = [len(values)] if shape == "flat" or len(values) % 2 else [2, len(values) // 2]
    fill = create_operator("GivenTensorStringFill", [], ["vocab"], shape=dims, values=values)
    weight = create_operator("GivenTensorFill", [], ["w"], shape=[3], values=[0.5, -1.0, 2.0])
    save = create_operator("Save", ["vocab", "w"], [], db=str(db), db_type="minidb", absolute_path=1)
    caffe2.run([("ops", [fill, weight, save])], {}, [])
    code = main(["convert-params", str(db), "-o", str(out)])
    ending = [i for i, v in enumerate(values) if v.endswith(b"\x00")]
    if ending:
        assert code == 2 and not out.exists()
        return
    assert code == 0
    with np.load(out, allow_pickle=False) as archive:
        assert archive["vocab"].dtype.kind == "S"
    params = rnn2jax.load_params(out)
    want = np.empty(len(values), dtype=object)
    want[:] = values
    assert_bit_equal(params["vocab"], want.reshape(dims))
    assert_bit_equal(params["w"], np.array([0.5, -1.0, 2.0], np.float32))


def test_convert_params_names_a_string_ending_in_nul(caffe2, tmp_path, capsys):
    from rnn2jax.cli import main

    db = tmp_path / "vocab.minidb"
    fill = create_operator("GivenTensorStringFill", [], ["vocab"], shape=[3], values=[b"a", b"b\x00c", b"end\x00"])
    save = create_operator("Save", ["vocab"], [], db=str(db), db_type="minidb", absolute_path=1)
    caffe2.run([("ops", [fill, save])], {}, [])
    assert main(["convert-params", str(db), "-o", str(tmp_path / "p.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "blob 'vocab'" in err and "element [2]" in err and "NUL byte" in err
