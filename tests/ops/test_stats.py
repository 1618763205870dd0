"""Caffe2's stat registries, Put ops and timers against real Caffe2. Caffe2 exports in hash-map order, so
exports compare sorted by key; the global registry outlives workspaces in both (the oracle's worker serves
every test), so each example names its stats afresh and compares only those; timers and clocks compare by
shape, dtype and order, not value."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rnn2jax.errors import Rnn2JaxError
from tests.differential import make_op
from tests.host_differential import check_net, run_rnn2jax_net

_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"rnn2jax_test_{prefix}_{next(_names)}_{np.random.randint(1 << 30)}"


def exported(blobs, keys: str, values: str, prefix: str = "") -> dict[bytes, int]:
    return {k: int(v) for k, v in zip(blobs[keys], blobs[values], strict=True) if k.decode().startswith(prefix)}


def run_both(caffe2, ops, feeds, outputs):
    from rnn2jax.caffe2.opdef import create_net

    want = caffe2.run([("net", create_net("stats", list(ops)))], feeds, outputs)
    got = run_rnn2jax_net(ops, feeds)
    assert not isinstance(got, Rnn2JaxError), got
    return {name: np.asarray(got.fetch(name)) for name in outputs}, want


@given(
    updates=st.lists(
        st.tuples(st.lists(st.sampled_from(["a", "b", "c"]), max_size=3), st.booleans()), min_size=1, max_size=4
    ),
    data=st.data(),
)
def test_stat_registry_matches_caffe2(caffe2, updates, data):
    ops, feeds, outputs = [make_op("StatRegistryCreate", [], ["reg"])], {}, []
    for i, (keys, reset) in enumerate(updates):
        feeds[f"k{i}"] = np.array([k.encode() for k in keys], dtype=object)
        feeds[f"v{i}"] = np.array(
            data.draw(st.lists(st.integers(-9, 9), min_size=len(keys), max_size=len(keys))), np.int64
        )
        ops.append(make_op("StatRegistryUpdate", [f"k{i}", f"v{i}", "reg"], []))
        ops.append(make_op("StatRegistryExport", ["reg"], [f"ek{i}", f"ev{i}", f"et{i}"], reset=reset))
        outputs += [f"ek{i}", f"ev{i}", f"et{i}"]
    got, want = run_both(caffe2, ops, feeds, outputs)
    for i in range(len(updates)):
        assert exported(got, f"ek{i}", f"ev{i}") == exported(want, f"ek{i}", f"ev{i}")
        assert sorted(got[f"ek{i}"]) == list(got[f"ek{i}"])
        for name in (f"ek{i}", f"ev{i}", f"et{i}"):
            strings = {got[name].dtype.kind, want[name].dtype.kind} <= {"O", "S"}
            assert got[name].shape == want[name].shape and (strings or got[name].dtype == want[name].dtype), name


PUT_DTYPES = (np.float32, np.float64, np.int32, np.int64, np.int16, np.uint8, np.float16)


@given(
    puts=st.lists(
        st.tuples(
            st.sampled_from(["AveragePut", "IncrementPut", "StdDevPut"]),
            st.sampled_from(PUT_DTYPES),
            st.floats(-100, 100, width=16),
            st.sampled_from([1, 10, 1000]),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_put_ops_match_caffe2(caffe2, puts):
    prefix = fresh("put")
    ops, feeds = [], {}
    for i, (op_type, dtype, value, expand, bound) in enumerate(puts):
        value = abs(value) if np.dtype(dtype).kind == "u" else value
        feeds[f"x{i}"] = np.array([value], dtype)
        ops.append(make_op(op_type, [f"x{i}"], [], stat_name=f"{prefix}/{i % 2}", magnitude_expand=expand, bound=bound))
    ops.append(make_op("StatRegistryExport", [], ["k", "v", "t"]))
    got, want = run_both(caffe2, ops, feeds, ["k", "v", "t"])
    assert exported(got, "k", "v", prefix) == exported(want, "k", "v", prefix)


def test_put_of_an_empty_tensor_needs_a_default(caffe2):
    prefix = fresh("default")
    feeds = {"x": np.zeros(0, np.float32)}
    ops = [make_op("AveragePut", ["x"], [], stat_name=prefix, default_value=2.5, magnitude_expand=10)]
    got, want = run_both(caffe2, [*ops, make_op("StatRegistryExport", [], ["k", "v", "t"])], feeds, ["k", "v", "t"])
    assert exported(got, "k", "v", prefix) == exported(want, "k", "v", prefix)
    check_net(caffe2, [make_op("IncrementPut", ["x"], [], stat_name=fresh("no_default"))], feeds, fails=True)


@pytest.mark.parametrize(
    "op, feeds",
    [
        (make_op("AveragePut", ["x"], [], magnitude_expand=10**18), {"x": np.array([100.0], np.float32)}),
        (make_op("IncrementPut", ["x"], []), {"x": np.array([np.nan], np.float32)}),
        (make_op("IncrementPut", ["x"], []), {"x": np.array([True])}),
        (
            make_op("StatRegistryUpdate", ["k", "x"], []),
            {"k": np.array([b"a", b"b"], object), "x": np.ones(1, np.int64)},
        ),
        (make_op("StatRegistryUpdate", ["k", "x"], []), {"k": np.array([b"a"], object), "x": np.ones(1, np.int32)}),
        (make_op("StatRegistryExport", ["x"], ["a", "b", "c"]), {"x": np.ones(1, np.int32)}),
        (make_op("TimerEnd", ["x"], []), {"x": np.ones(1, np.int32)}),
    ],
)
def test_refusals_match_caffe2(caffe2, op, feeds):
    check_net(caffe2, [op], feeds, fails=True)


def test_timers_match_caffe2_in_kind(caffe2):
    name = fresh("timer")
    ops = [
        make_op("WallClockTime", [], ["clock0"]),
        make_op("TimerBegin", [], ["timer"], counter_name=name),
        make_op("TimerGet", ["timer"], ["get0"]),
        make_op("TimerGet", ["timer"], ["get1"]),
        make_op("TimerEnd", ["timer"], []),
        make_op("TimerBegin", [], ["timer"], counter_name=name),
        make_op("TimerGetAndEnd", ["timer"], ["get2"]),
        make_op("WallClockTime", [], ["clock1"]),
        make_op("StatRegistryExport", [], ["k", "v", "t"]),
    ]
    outputs = ["clock0", "get0", "get1", "get2", "clock1"]
    got, want = run_both(caffe2, ops, {}, [*outputs, "k", "v"])
    for name_ in outputs:
        assert got[name_].shape == want[name_].shape and got[name_].dtype == want[name_].dtype, name_
    for blobs in (got, want):
        assert 0 <= blobs["get0"] <= blobs["get1"] and blobs["clock0"] <= blobs["clock1"]
        stats = exported(blobs, "k", "v", name)
        assert set(stats) == {f"{name}/time_ns/sum".encode(), f"{name}/time_ns/count".encode()}
        assert stats[f"{name}/time_ns/count".encode()] == 2
    # a stopped timer
    check_net(caffe2, [ops[1], ops[4], make_op("TimerGet", ["timer"], ["g"])], {}, fails=True)
    check_net(caffe2, [ops[1], ops[4], ops[4]], {}, fails=True)


def test_put_ops_register_their_counters_when_their_net_is_created(caffe2):
    name = fresh("created")
    ops = [make_op("StatRegistryExport", [], ["k", "v", "t"]), make_op("IncrementPut", ["x"], [], stat_name=name)]
    got, want = run_both(caffe2, ops, {"x": np.ones(1, np.float32)}, ["k", "v"])
    assert exported(got, "k", "v", name) == exported(want, "k", "v", name) == {f"{name}/stat_value".encode(): 0}


def test_atomic_iter_counts_its_runs_in_the_global_registry(caffe2):
    """Caffe2's AtomicIter counts "atomic_iter/stats/<iter blob>/num_iter" (exported at 0 once the op exists),
    though rnn2jax lowers the op itself into jitted code."""
    counter = fresh("iter")
    ops = [
        make_op("StatRegistryExport", [], ["k0", "v0", "t0"]),
        make_op("CreateMutex", [], ["mutex"]),
        make_op("AtomicIter", ["mutex", counter], [counter]),
        make_op("AtomicIter", ["mutex", counter], [counter]),
        make_op("StatRegistryExport", [], ["k", "v", "t"]),
    ]
    got, want = run_both(caffe2, ops, {counter: np.zeros(1, np.int64)}, ["k0", "v0", "k", "v", counter])
    key = f"atomic_iter/stats/{counter}/num_iter"
    assert exported(got, "k0", "v0", key) == exported(want, "k0", "v0", key) == {key.encode(): 0}
    assert exported(got, "k", "v", key) == exported(want, "k", "v", key) == {key.encode(): 2}
    assert got[counter].tolist() == want[counter].tolist() == [2]
