"""The real-Caffe2 oracle itself: answers, structured refusals, crashes and hangs.

The worker is test infrastructure, and `rnn2jax compare` relies on it too: a refusal must come back as a
`Caffe2Error` with Caffe2's message, and a dead or silent worker must be reported and replaced, never
leave a test waiting.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import arrays
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.checking.oracle import Caffe2Error, Caffe2Oracle, OracleCrashedError, OracleUnavailableError
from rnn2jax.proto import caffe2_pb2 as pb


def test_catalog_lists_caffe2s_operators(caffe2):
    catalog = caffe2.catalog()
    assert catalog.versions["torch"].startswith("1.10.2")
    assert catalog.versions["python"].startswith("3.9")
    assert {"RecurrentNetwork", "RecurrentNetworkGradient", "LSTMUnit", "FC"} <= set(catalog.ops)
    assert catalog.schema_files["FC"].endswith("fully_connected_op.cc")


def test_gradient_kinds_of_caffe2s_registry(caffe2):
    asked = ["FC", "RecurrentNetwork", "Shape", "StopGradient", "Iter", "AtomicIter", "FCGradient", "GivenTensorFill"]
    kinds = caffe2.gradient_kinds(asked)
    assert kinds["FC"] == kinds["RecurrentNetwork"] == "gradient"
    assert kinds["StopGradient"] == "no_gradient"
    assert kinds["Shape"] == "should_not"
    assert kinds["Iter"] == kinds["AtomicIter"] == "no_gradient"  # asked in place, as their schemas demand
    assert kinds["FCGradient"] == "none"
    assert kinds["GivenTensorFill"] == "no_gradient"  # asked with its required `values`


@given(x=arrays((3, 4)), w=arrays((5, 4)))
def test_arrays_round_trip_through_caffe2(caffe2, x, w):
    out = caffe2.run_op(create_operator("FC", ["x", "w", "b"], ["y"]), {"x": x, "w": w, "b": np.zeros(5, np.float32)})
    np.testing.assert_allclose(out["y"], x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-6)
    assert out["y"].dtype == np.float32


def test_strings_and_integer_blobs_travel(caffe2):
    words = np.array([b"ab", b"", b"xyz"], dtype=object)
    out = caffe2.run([], {"words": words, "ids": np.array([1, 2], np.int64)}, ["words", "ids"])
    assert out["words"].tolist() == [b"ab", b"", b"xyz"]
    assert out["ids"].dtype == np.int64 and out["ids"].tolist() == [1, 2]


def test_refusal_is_a_structured_error_and_the_worker_survives(caffe2):
    op = create_operator("FC", ["x", "w", "b"], ["y"])
    feeds = {"x": np.ones((2, 3), np.float32), "w": np.ones((4, 2), np.float32), "b": np.ones(4, np.float32)}
    with pytest.raises(Caffe2Error, match="Dimension mismatch") as refusal:
        caffe2.run_op(op, feeds)
    assert refusal.value.kind == "RuntimeError"
    assert caffe2.run_op(op, dict(feeds, w=np.ones((4, 3), np.float32)))["y"].shape == (2, 4)


def test_nets_plans_and_gradient_questions(caffe2):
    net = create_net("n", [create_operator("Scale", ["x"], ["y"], scale=2.0), create_operator("Relu", ["y"], ["z"])])
    out = caffe2.run_net(net, {"x": np.array([-1.0, 3.0], np.float32)}, ["z"])
    assert out["z"].tolist() == [0.0, 6.0]
    plan = pb.PlanDef(name="p")
    plan.network.add().CopyFrom(net)
    step = plan.execution_step.add(name="s", num_iter=3)
    step.network.append("n")
    out = caffe2.run([("plan", plan)], {"x": np.array([1.0], np.float32)}, ["z"])
    assert out["z"].tolist() == [2.0]
    ops, g_input = caffe2.gradient_for_op(create_operator("Relu", ["x"], ["y"]), ["y_grad"])
    assert [o.type for o in ops] == ["ReluGradient"] and list(ops[0].input) == ["y", "y_grad"]
    assert g_input == ["x_grad"]


def test_a_crash_of_caffe2_is_reported_and_the_worker_replaced(caffe2):  # the fixture: skip without Caffe2
    # AtomicIter written out of place (its schema wants output 0 to be input 1): in a fresh worker Caffe2's
    # gradient lookup segfaults (exit status -11) instead of refusing. A worker that has run other requests
    # may hit the schema check first (undefined behaviour), so this test has a worker of its own.
    from conftest import caffe2_python

    fresh = Caffe2Oracle(caffe2_python(), timeout=60)
    try:
        with pytest.raises(OracleCrashedError, match="died"):
            fresh.gradient_for_op(create_operator("AtomicIter", ["mutex", "iter"], ["out"]), ["out_grad"])
        assert fresh.run([], {"x": np.ones(2, np.float32)}, ["x"])["x"].tolist() == [1.0, 1.0]
    finally:
        fresh.close()


def test_a_worker_killed_between_requests_is_replaced(caffe2):
    caffe2.catalog()
    os.kill(caffe2._process.pid, signal.SIGKILL)
    caffe2._process.wait()
    assert caffe2.run([], {"x": np.ones(1, np.float32)}, ["x"])["x"].tolist() == [1.0]


def test_a_silent_worker_times_out_instead_of_hanging(tmp_path, caffe2):
    from conftest import caffe2_python

    slow = Caffe2Oracle(caffe2_python(), timeout=60)
    try:
        slow.catalog()
        slow.timeout = 0.5
        os.kill(slow._process.pid, signal.SIGSTOP)  # alive but silent, as a deadlocked Caffe2 would be
        with pytest.raises(OracleCrashedError, match="no answer within"):
            slow.run([], {}, [])
        slow.timeout = 60
        assert slow.run([], {"x": np.zeros(1, np.float32)}, ["x"])["x"].tolist() == [0.0]
    finally:
        slow.close()


def test_a_missing_interpreter_is_unavailable_not_a_crash(tmp_path):
    with pytest.raises(OracleUnavailableError, match="setup-caffe2"):
        Caffe2Oracle(tmp_path / "no-python").catalog()


def test_a_python_without_caffe2_is_unavailable(tmp_path):
    import sys

    with pytest.raises(OracleUnavailableError, match="cannot"):
        Caffe2Oracle(sys.executable, timeout=60).catalog()


@given(blob=st.text(min_size=1, max_size=12).filter(lambda s: "\x00" not in s))
def test_blob_names_of_any_text_travel(caffe2, blob):
    out = caffe2.run([], {blob: np.arange(3, dtype=np.int32)}, [blob])
    assert out[blob].tolist() == [0, 1, 2]
