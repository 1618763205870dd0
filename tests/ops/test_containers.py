"""Caffe2's tensor vectors, indices and maps against real Caffe2. Maps list in hash order in Caffe2, so
their keys and values compare as pairs; CollectTensor's draws (once it has seen more than it keeps) compare
by size only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rnn2jax.caffe2.opdef import create_net
from rnn2jax.errors import Rnn2JaxError
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.runtime.workspace import Workspace
from tests.differential import assert_blob_equal, make_op
from tests.host_differential import check_net, check_save_load, run_rnn2jax_net


def run_repeatedly(caffe2, init, ops, feeds, runs, fetch):
    """`init` once, then a net of `ops` created once and run `runs` times (its ops keep their state)."""
    net = create_net("repeated", list(ops))
    want = caffe2.run(
        [("net", create_net("init", list(init))), ("create_net", net), ("run_net", ("repeated", runs))], feeds, fetch
    )
    workspace = Workspace()
    for name, value in feeds.items():
        workspace.feed(name, value)
    workspace.run(create_net("init", list(init)))
    workspace.create_net(net)
    workspace.run_net("repeated", runs)
    return {name: np.asarray(workspace.fetch(name)) for name in fetch}, want


@given(
    keep=st.integers(1, 4),
    runs=st.integers(1, 6),
    rows=st.integers(0, 3),
    dtype=st.sampled_from([np.float32, np.int64, np.int32]),
)
def test_collect_tensor_matches_caffe2(caffe2, keep, runs, rows, dtype):
    feeds = {"x": np.arange(rows * 2, dtype=dtype).reshape(rows, 2), "y": np.arange(3, dtype=np.float64)}
    init = [make_op("CreateTensorVector", [], ["vx"]), make_op("CreateTensorVector", [], ["vy"])]
    ops = [
        make_op("CollectTensor", ["vx", "vy", "x", "y"], ["vx", "vy"], num_to_collect=keep),
        make_op("TensorVectorSize", ["vx"], ["size"]),
        make_op("ConcatTensorVector", ["vx"], ["cx"]),
        make_op("ConcatTensorVector", ["vy"], ["cy"]),
    ]
    got, want = run_repeatedly(caffe2, init, ops, feeds, runs, ["size", "cx", "cy"])
    for name in ("size", "cx", "cy"):
        assert_blob_equal(name, got[name], want[name])  # every tensor collected is the same here


@pytest.mark.parametrize(
    "ops, feeds",
    [
        ([make_op("CreateTensorVector", [], ["v"]), make_op("ConcatTensorVector", ["v"], ["c"])], {}),
        ([make_op("TensorVectorSize", ["x"], ["n"])], {"x": np.ones(1, np.float32)}),
        (
            [
                make_op("CreateTensorVector", [], ["v"]),
                make_op("CollectTensor", ["v", "x"], ["v"], num_to_collect=1),
                make_op("ConcatTensorVector", ["v"], ["c"]),
            ],
            {"x": np.ones((), np.float32)},
        ),
    ],
)
def test_tensor_vector_refusals_match_caffe2(caffe2, ops, feeds):
    check_net(caffe2, ops, feeds, fails=True)


INDEX_TYPES = {"IntIndexCreate": np.int32, "LongIndexCreate": np.int64, "StringIndexCreate": object}


def keys_of(dtype, values):
    if dtype is object:
        out = np.empty(len(values), dtype=object)
        out[:] = [f"k{v}".encode() for v in values]
        return out
    return np.array(values, dtype)


@given(
    create=st.sampled_from(sorted(INDEX_TYPES)),
    max_elements=st.integers(1, 8),
    steps=st.lists(
        st.tuples(st.sampled_from(["get", "freeze", "load", "store", "size"]), st.lists(st.integers(0, 6), max_size=4)),
        min_size=1,
        max_size=6,
    ),
    skip=st.booleans(),
)
def test_index_matches_caffe2(caffe2, create, max_elements, steps, skip):
    dtype = INDEX_TYPES[create]
    ops, feeds = [make_op(create, [], ["index"], max_elements=max_elements)], {}
    for i, (kind, values) in enumerate(steps):
        if kind == "get":
            feeds[f"k{i}"] = keys_of(dtype, values)
            ops.append(make_op("IndexGet", ["index", f"k{i}"], [f"ids{i}"]))
        elif kind == "load":
            feeds[f"k{i}"] = keys_of(dtype, values)
            ops.append(make_op("IndexLoad", ["index", f"k{i}"], ["index"], skip_first_entry=skip))
        elif kind == "freeze":
            ops.append(make_op("IndexFreeze", ["index"], ["index"]))
        elif kind == "store":
            ops.append(make_op("IndexStore", ["index"], [f"items{i}"]))
        else:
            ops.append(make_op("IndexSize", ["index"], [f"size{i}"]))
    check_net(caffe2, ops, feeds)


def test_index_refusals_match_caffe2(caffe2):
    ints, longs = np.array([1, 2], np.int32), np.array([1, 2], np.int64)
    for ops in (
        [make_op("IntIndexCreate", [], ["i"]), make_op("IndexGet", ["i", "longs"], ["ids"])],  # wrong key type
        [make_op("IntIndexCreate", [], ["i"], max_elements=2), make_op("IndexGet", ["i", "ints"], ["ids"])],  # full
        [make_op("IntIndexCreate", [], ["i"]), make_op("IndexLoad", ["i", "twice"], ["i"])],  # repeated items
        [make_op("IndexSize", ["ints"], ["n"])],  # not an index
    ):
        check_net(caffe2, ops, {"ints": ints, "longs": longs, "twice": np.array([3, 3], np.int32)}, fails=True)


def test_map_matches_caffe2_as_pairs(caffe2):
    for key_type, value_type in ((np.int32, np.int64), (np.int64, np.int32), (np.int32, np.int32)):
        feeds = {"k": np.array([3, 1, 3, 7], key_type), "v": np.array([30, 10, 33, 70], value_type)}
        ops = [make_op("KeyValueToMap", ["k", "v"], ["map"]), make_op("MapToKeyValue", ["map"], ["keys", "values"])]
        got = run_rnn2jax_net(ops, feeds)
        assert not isinstance(got, Rnn2JaxError), got
        want = caffe2.run([("net", create_net("map", ops))], feeds, ["keys", "values"])
        ours = {name: np.asarray(got.fetch(name)) for name in ("keys", "values")}
        for name in ("keys", "values"):
            assert ours[name].dtype == want[name].dtype, name
        assert sorted(zip(ours["keys"].tolist(), ours["values"].tolist(), strict=True)) == sorted(
            zip(want["keys"].tolist(), want["values"].tolist(), strict=True)
        )
    for key_dtype in (pb.TensorProto.INT32, pb.TensorProto.INT64):
        ops = [
            make_op("CreateMap", [], ["map"], key_dtype=key_dtype, value_dtype=pb.TensorProto.INT64),
            make_op("MapToKeyValue", ["map"], ["keys", "values"]),
        ]
        check_net(caffe2, ops)


def test_map_refusals_match_caffe2(caffe2):
    floats, ints = np.ones(2, np.float32), np.ones(2, np.int32)
    for ops in (
        [make_op("KeyValueToMap", ["floats", "ints"], ["map"])],
        [make_op("KeyValueToMap", ["ints", "floats"], ["map"])],
        [make_op("MapToKeyValue", ["ints"], ["k", "v"])],
    ):
        check_net(caffe2, ops, {"floats": floats, "ints": ints}, fails=True)


@pytest.mark.parametrize("create", sorted(INDEX_TYPES))
@pytest.mark.parametrize("frozen", [False, True])
def test_a_saved_index_loads_in_caffe2_and_back(caffe2, tmp_path, create, frozen):
    dtype = INDEX_TYPES[create]
    feeds = {"k": keys_of(dtype, [4, 2, 4, 9]), "q": keys_of(dtype, [9, 7, 2])}
    make = [make_op(create, [], ["i"], max_elements=7), make_op("IndexGet", ["i", "k"], ["ids"])]
    if frozen:
        make.append(make_op("IndexFreeze", ["i"], ["i"]))
    read = [
        make_op("IndexGet", ["i", "q"], ["got"]),
        make_op("IndexStore", ["i"], ["items"]),
        make_op("IndexSize", ["i"], ["n"]),
    ]
    check_save_load(caffe2, tmp_path, make, read, "i", ["got", "items", "n"], feeds)


@pytest.mark.parametrize("key_type, value_type", [(np.int32, np.int64), (np.int64, np.int32)])
def test_a_saved_map_loads_in_caffe2_and_back(caffe2, tmp_path, key_type, value_type):
    feeds = {"k": np.array([3, 1, 7], key_type), "v": np.array([30, 10, 70], value_type)}
    make = [make_op("KeyValueToMap", ["k", "v"], ["m"])]
    # each side lists the map in its own order: compare what does not depend on it
    read = [
        make_op("MapToKeyValue", ["m"], ["keys", "values"]),
        make_op("ReduceSum", ["keys"], ["key_total"], keepdims=0),
        make_op("ReduceSum", ["values"], ["value_total"], keepdims=0),
    ]
    check_save_load(caffe2, tmp_path, make, read, "m", ["key_total", "value_total"], feeds)
