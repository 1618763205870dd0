"""Differential tests of the training-step ops against real Caffe2 (see tests/differential.py).

Mutex blobs cannot be fetched from Caffe2 (they are not tensors): CreateMutex and AtomicIter are run as
the net `CreateMutex -> AtomicIter` in both, and the iteration counter is compared."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, assert_blobs_equal, cases, check_op, run_case, run_rnn2jax, shapes
from rnn2jax.caffe2 import create_operator


def make_op(op_type, inputs, outputs, **args):
    op = create_operator(op_type, inputs, outputs, **args)
    op.ClearField("engine")
    return op


def counter(data):
    return np.asarray([data.draw(st.integers(0, 10**6))], np.int64)


def draw_iter(data):
    return make_op("Iter", ["iter"], ["iter"]), {"iter": counter(data)}


def draw_atomic_iter(data):
    """The op under test is the last of the two (AtomicIter); CreateMutex runs before it."""
    return make_op("AtomicIter", ["mutex", "iter"], ["iter"]), {"iter": counter(data)}


def draw_create_mutex(data):
    return make_op("CreateMutex", [], ["mutex"]), {"iter": counter(data)}


POLICIES = {
    "fixed": {},
    "step": {"stepsize": st.integers(1, 1000), "gamma": st.floats(0.125, 1.0, width=32)},
    "exp": {"gamma": st.floats(0.5, 1.0, width=32)},
    "inv": {"gamma": st.floats(0.0, 0.5, width=32), "power": st.floats(0.0, 2.0, width=32)},
    "poly": {"power": st.floats(0.0, 2.0, width=32), "max_iter": st.integers(10**6 + 1, 10**7)},
}


def draw_learning_rate(data):
    policy = data.draw(st.sampled_from(sorted(POLICIES)))
    args = {"base_lr": data.draw(st.floats(-1.0, 1.0, width=32)), "policy": policy}
    for name, strategy in POLICIES[policy].items():
        args[name] = data.draw(strategy)
    if policy == "poly" and data.draw(st.booleans()):
        del args["max_iter"]  # the default -1: Caffe2 keeps it as uint64, a rate that never decays
    if data.draw(st.booleans()):
        args["lr_scale"] = data.draw(st.floats(0.0, 2.0, width=32))
    it = np.asarray([data.draw(st.integers(0, 10**4 if policy == "exp" else 10**6))], np.int64)
    return make_op("LearningRate", ["iter"], ["lr"], **args), {"iter": it}


def draw_weighted_sum(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    pairs = data.draw(st.integers(1, 3))
    inputs = {}
    for i in range(pairs):
        inputs[f"x{i}"] = data.draw(arrays(shape, np.float32))
        inputs[f"w{i}"] = data.draw(arrays((1,), np.float32, -2, 2))
    args = {"grad_on_w": 1} if data.draw(st.booleans()) else {}
    # Not in place: see test_weighted_sum_in_place.
    return make_op("WeightedSum", list(inputs), ["y"], **args), inputs


CASES = cases(
    Case("Iter", draw_iter),
    Case("AtomicIter", draw_atomic_iter, note="run after CreateMutex; the counter is compared"),
    Case("CreateMutex", draw_create_mutex, note="run before AtomicIter; the counter is compared"),
    Case("LearningRate", draw_learning_rate),
    Case("WeightedSum", draw_weighted_sum, gradient_ops=("WeightedSumGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type in ("AtomicIter", "CreateMutex"):
        _, inputs = case.draw(data)
        ops = [make_op("CreateMutex", [], ["mutex"]), make_op("AtomicIter", ["mutex", "iter"], ["iter"])]
        want = caffe2.run([("ops", ops)], inputs, fetch=["iter"])
        assert_blobs_equal(run_rnn2jax(ops, inputs, ["iter"]), want)
        return
    run_case(caffe2, case, data)


def test_iter_without_input_starts_at_one(caffe2):
    """The old form `Iter() -> iter` creates an int64 [1] counter on its first run."""
    op = make_op("Iter", [], ["iter"])
    want = caffe2.run_op(op, {})
    assert_blobs_equal(run_rnn2jax([op], {}, ["iter"]), want)


@given(data=st.data())
def test_weighted_sum_in_place(caffe2, data):
    """In place (`WeightedSum(x0, w0, ...) -> x0`, SGD's update) the forward matches. Caffe2's gradient of
    that form is broken: its maker names the gradient op's output x0_grad, also its input 0, and
    WeightedSumGradient's own schema refuses that ("Operator def did not pass schema checking"); the
    builder makes the same ops, and rnn2jax runs them."""
    op, inputs = draw_weighted_sum(data)
    op.output[0] = "x0"
    check_op(caffe2, op, inputs)
