"""Caffe2's counters and atomics against real Caffe2: random sequences of counter ops, the atomic bool, and
AtomicFetchAdd (pure, after CreateMutex)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rnn2jax.errors import BadArgumentError, InputTypeError
from tests.differential import Case, assert_blobs_equal, cases, make_op, run_rnn2jax
from tests.host_differential import check_net, check_save_load, run_rnn2jax_net

COUNTER_OPS = ("CountUp", "CountDown", "RetrieveCount", "CheckCounterDone", "ResetCounter")


@given(init=st.integers(0, 3), steps=st.lists(st.sampled_from(COUNTER_OPS), min_size=1, max_size=10), data=st.data())
def test_counter_matches_caffe2(caffe2, init, steps, data):
    ops = [make_op("CreateCounter", [], ["c"], init_count=init)]
    for i, kind in enumerate(steps):
        if kind == "ResetCounter":
            outputs = [f"out{i}"] if data.draw(st.booleans()) else []
            ops.append(make_op(kind, ["c"], outputs, init_count=data.draw(st.integers(0, 3))))
        else:
            ops.append(make_op(kind, ["c"], [f"out{i}"]))
    check_net(caffe2, ops)


@given(conditions=st.lists(st.lists(st.booleans(), min_size=1, max_size=3), max_size=3))
def test_atomic_bool_matches_caffe2(caffe2, conditions):
    ops = [make_op("CreateAtomicBool", [], ["flag"]), make_op("CheckAtomicBool", ["flag"], ["before"])]
    feeds = {}
    for i, condition in enumerate(conditions):
        feeds[f"cond{i}"] = np.array(condition)
        ops.append(make_op("ConditionalSetAtomicBool", ["flag", f"cond{i}"], []))
        ops.append(make_op("CheckAtomicBool", ["flag"], [f"after{i}"]))
    check_net(caffe2, ops, feeds)


def draw_fetch_add(op_type: str, dtype: type):
    def draw(data):
        """The op under test runs after CreateMutex (a mutex cannot be fed); in place on a, as Caffe2's users run it."""
        bound = 2**31 - 1 if dtype == np.int32 else 2**61
        a = data.draw(st.lists(st.integers(-bound - 1, bound), min_size=1, max_size=3))
        b = data.draw(st.integers(-bound - 1, bound))
        return make_op(op_type, ["mutex", "a", "b"], ["a", "fetched"]), {
            "a": np.array(a, dtype),
            "b": np.array([b], dtype),
        }

    return draw


CASES = cases(
    Case("AtomicFetchAdd", draw_fetch_add("AtomicFetchAdd", np.int32), note="run after CreateMutex"),
    Case("AtomicFetchAdd64", draw_fetch_add("AtomicFetchAdd64", np.int64), note="run after CreateMutex"),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    """Jitted (rnn2jax.compile) against Caffe2, int32 wrapping included; the mutex blob is CreateMutex's."""
    op, inputs = case.draw(data)
    ops = [make_op("CreateMutex", [], ["mutex"]), op]
    want = caffe2.run([("ops", ops)], inputs, fetch=["a", "fetched"])
    assert_blobs_equal(run_rnn2jax(ops, inputs, ["a", "fetched"]), want)
    check_net(caffe2, ops, inputs, placeholders=["mutex"])  # and in a workspace


@pytest.mark.parametrize(
    "ops, feeds",
    [
        ([make_op("CreateCounter", [], ["c"], init_count=-1)], {}),
        ([make_op("CreateCounter", [], ["c"]), make_op("ResetCounter", ["c"], [], init_count=-2)], {}),
        ([make_op("CountUp", ["x"], ["y"])], {"x": np.ones(1, np.float32)}),
        ([make_op("CheckAtomicBool", ["x"], ["y"])], {"x": np.ones(1, np.float32)}),
        (
            [make_op("CreateAtomicBool", [], ["f"]), make_op("ConditionalSetAtomicBool", ["f", "x"], [])],
            {"x": np.ones(1, np.int32)},
        ),
        (
            [make_op("CreateMutex", [], ["m"]), make_op("AtomicFetchAdd", ["m", "a", "a"], ["s", "f"])],
            {"a": np.ones(1, np.int64)},
        ),
    ],
)
def test_refusals_match_caffe2(caffe2, ops, feeds):
    check_net(caffe2, ops, feeds, fails=True)


def test_errors_name_the_op_and_blob():
    error = run_rnn2jax_net([make_op("RetrieveCount", ["x"], ["y"])], {"x": np.ones(1, np.float32)})
    assert isinstance(error, InputTypeError) and "RetrieveCount" in str(error) and "blob 'x'" in str(error)
    error = run_rnn2jax_net([make_op("CreateCounter", [], ["c"], init_count=-1)], {})
    assert isinstance(error, BadArgumentError) and "init_count" in str(error)
    # Caffe2 reads past the end of an empty tensor here (its worker may crash): rnn2jax refuses
    error = run_rnn2jax_net(
        [make_op("CreateMutex", [], ["m"]), make_op("AtomicFetchAdd", ["m", "a", "a"], ["s", "f"])],
        {"a": np.ones(0, np.int32)},
    )
    assert isinstance(error, Exception) and "empty" in str(error)


def test_a_saved_counter_loads_in_caffe2_and_back(caffe2, tmp_path):
    make = [make_op("CreateCounter", [], ["c"], init_count=5), make_op("CountUp", ["c"], ["u"])]
    check_save_load(caffe2, tmp_path, make, [make_op("RetrieveCount", ["c"], ["n"])], "c", ["n"])
