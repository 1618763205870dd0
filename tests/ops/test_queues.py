"""Caffe2's blobs queue and rebatching queue as host ops, against real Caffe2: random sequences of
enqueues, dequeues and closes that never wait in Caffe2 (a waiting op would hang its worker), and in
rnn2jax alone the ops that would wait forever, which raise instead."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rnn2jax.errors import BadArgumentError, InputTypeError, WorkspaceError
from tests.differential import make_op
from tests.host_differential import check_net, run_rnn2jax_net

DTYPES = (np.float32, np.int64, np.int32)


@st.composite
def blobs_queue_program(draw: st.DrawFn):
    """CreateBlobsQueue, then up to 8 queue ops that Caffe2 can run without waiting (a failing op ends the net)."""
    capacity, width = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    ops = [make_op("CreateBlobsQueue", [], ["q"], capacity=capacity, num_blobs=width)]
    feeds, count, closed = {}, 0, False
    columns = [(f"x{j}", draw(st.sampled_from(DTYPES)), draw(st.integers(0, 2))) for j in range(width)]
    for step in range(draw(st.integers(1, 8))):
        names = [f"x{j}" for j in range(width)]
        choices = ["close"]
        if count < capacity:
            choices += ["enqueue", "safe_enqueue"]
        elif closed:
            choices += ["enqueue", "safe_enqueue"]  # closed and full: Enqueue fails, SafeEnqueue says so
        if count > 0 or closed:
            choices += ["dequeue", "safe_dequeue"]
        if count >= 2 or closed:
            choices.append("safe_dequeue_many")
        kind = draw(st.sampled_from(choices))
        if kind in ("enqueue", "safe_enqueue"):
            for j, (name, dtype, ndim) in enumerate(columns):
                rows = draw(st.integers(1, 3))
                shape = (rows,) + (2,) * ndim if ndim else ()
                feed = f"v{step}_{j}"
                feeds[feed] = np.arange(np.prod(shape, dtype=int), dtype=dtype).reshape(shape) + step
                ops.append(make_op("Copy", [feed], [name]))
            if kind == "enqueue":
                ops.append(make_op("EnqueueBlobs", ["q", *names], names))
            else:
                ops.append(make_op("SafeEnqueueBlobs", ["q", *names], [*names, f"status{step}"]))
            count = min(count + 1, capacity)
        elif kind == "dequeue":
            ops.append(make_op("DequeueBlobs", ["q"], [f"d{step}_{j}" for j in range(width)]))
            count = max(count - 1, 0)
        elif kind == "safe_dequeue":
            ops.append(make_op("SafeDequeueBlobs", ["q"], [*(f"d{step}_{j}" for j in range(width)), f"status{step}"]))
            count = max(count - 1, 0)
        elif kind == "safe_dequeue_many":
            records = draw(st.integers(2, max(2, count))) if not closed else draw(st.integers(2, 4))
            records = min(records, count) if not closed else records
            outputs = [*(f"d{step}_{j}" for j in range(width)), f"status{step}"]
            ops.append(make_op("SafeDequeueBlobs", ["q"], outputs, num_records=records))
            count = max(count - records, 0)
        else:
            ops.append(make_op("CloseBlobsQueue", ["q"], []))
            closed = True
    return ops, feeds


@given(program=blobs_queue_program())
def test_blobs_queue_matches_caffe2(caffe2, program):
    check_net(caffe2, *program)


def test_enqueue_leaves_the_blob_empty_and_dequeue_swaps_back(caffe2):
    feeds = {"x": np.array([1.0, 2.0], np.float32), "y": np.array([7], np.int64)}
    ops = [
        make_op("CreateBlobsQueue", [], ["q"], capacity=1, num_blobs=2),
        make_op("EnqueueBlobs", ["q", "x", "y"], ["x", "y"]),
        make_op("DequeueBlobs", ["q"], ["a", "b"]),
        make_op("Copy", ["a"], ["x"]),
        make_op("EnqueueBlobs", ["q", "x", "b"], ["x", "b"]),
    ]
    _, want = check_net(caffe2, ops, feeds)
    assert set(want) == {"a", "q_0_0", "q_0_1"}  # x and b went into the slots; x and b were left empty


def test_weighted_sample_dequeue_matches_caffe2(caffe2):
    feeds = {"x": np.array([1.0, 2.0], np.float32)}
    ops = [
        make_op("CreateBlobsQueue", [], ["q0"], capacity=2, num_blobs=1),
        make_op("CreateBlobsQueue", [], ["q1"], capacity=2, num_blobs=1),
        make_op("EnqueueBlobs", ["q1", "x"], ["x"]),
        make_op(
            "WeightedSampleDequeueBlobs", ["q0", "q1"], ["y", "idx", "status"], weights=[0.0, 1.0], table_idx_blob=1
        ),
        make_op("CloseBlobsQueue", ["q1"], []),
        make_op("WeightedSampleDequeueBlobs", ["q0", "q1"], ["z", "status2"], weights=[0.0, 2.0]),
    ]
    check_net(caffe2, ops, feeds)


@pytest.mark.parametrize(
    "op",
    [
        make_op("CreateBlobsQueue", [], ["q"], num_blobs=1, field_names=["a", "b"]),
        make_op("DequeueBlobs", ["q"], ["a", "b"]),
        make_op("DequeueBlobs", ["x"], ["a"]),
        make_op("WeightedSampleDequeueBlobs", ["q"], ["a", "s"], weights=[0.0]),
        make_op("WeightedSampleDequeueBlobs", ["q"], ["a", "s"], weights=[1.0, 1.0]),
        make_op("SafeDequeueBlobs", ["q"], ["a", "s"], num_records=0),
    ],
    ids=lambda op: op.type,
)
def test_bad_queue_ops_fail_as_in_caffe2(caffe2, op):
    """Each of these fails in Caffe2 before it could wait."""
    ops = [make_op("CreateBlobsQueue", [], ["q"], capacity=2, num_blobs=1), make_op("EnqueueBlobs", ["q", "x"], ["x"])]
    check_net(caffe2, [*ops, op], {"x": np.ones(2, np.float32)}, fails=True)


def test_enforce_unique_name_matches_caffe2(caffe2):
    create = make_op("CreateBlobsQueue", [], ["q"], capacity=1, num_blobs=1, enforce_unique_name=True)
    check_net(caffe2, [create], {}, fails=False)
    check_net(caffe2, [create], {"q_0_0": np.zeros(1, np.float32)}, fails=True)


@pytest.mark.parametrize(
    "ops",
    [
        [make_op("DequeueBlobs", ["q"], ["a"])],
        [make_op("SafeDequeueBlobs", ["q"], ["a", "s"])],
        [make_op("EnqueueBlobs", ["q", "x"], ["x"]), make_op("SafeDequeueBlobs", ["q"], ["a", "s"], num_records=2)],
        [
            make_op("EnqueueBlobs", ["q", "x"], ["x"]),
            make_op("Copy", ["y"], ["x"]),
            make_op("EnqueueBlobs", ["q", "x"], ["x"]),
        ],
        [make_op("DequeueBlobs", ["q"], ["a"], timeout_secs=0.5)],
    ],
)
def test_an_op_that_would_wait_forever_raises(ops):
    """Caffe2 would wait for another thread here; rnn2jax says so and never hangs."""
    create = make_op("CreateBlobsQueue", [], ["q"], capacity=1, num_blobs=1)
    error = run_rnn2jax_net([create, *ops], {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)})
    assert isinstance(error, WorkspaceError), error
    assert "queue 'q'" in str(error) and ("forever" in str(error) or "time out" in str(error))


def test_enqueue_must_work_in_place():
    """Caffe2's schema refuses it too (its worker crashes on it, so it is not asked)."""
    error = run_rnn2jax_net(
        [make_op("EnqueueBlobs", ["q", "x"], ["y"])], {"x": np.ones(2, np.float32), "q": np.ones(1)}
    )
    assert isinstance(error, BadArgumentError) and "in place" in str(error)


def test_a_blob_that_is_no_queue_is_named():
    error = run_rnn2jax_net([make_op("CloseBlobsQueue", ["x"], [])], {"x": np.ones(2, np.float32)})
    assert isinstance(error, InputTypeError) and "blob 'x'" in str(error) and "CloseBlobsQueue" in str(error)


@st.composite
def rebatching_program(draw: st.DrawFn):
    capacity, width = draw(st.integers(1, 6)), draw(st.integers(1, 2))
    ops = [make_op("CreateRebatchingQueue", [], ["q"], capacity=capacity, num_blobs=width)]
    feeds, count, closed = {}, 0, False
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(width)]
    inner = [(2,) * draw(st.integers(0, 2)) for _ in range(width)]
    for step in range(draw(st.integers(1, 7))):
        choices = ["close"]
        if not closed:
            choices.append("enqueue")
        if count > 0:
            choices.append("dequeue")
        if count >= 2 or (closed and count > 0):
            choices.append("dequeue_many")
        kind = draw(st.sampled_from(choices))
        if kind == "enqueue":
            batch = draw(st.booleans()) and capacity - count >= 1
            rows = draw(st.integers(0, capacity - count)) if batch else 1
            if not batch and count >= capacity:
                continue
            names = []
            for j in range(width):
                shape = ((rows,) if batch else ()) + inner[j]
                names.append(f"v{step}_{j}")
                feeds[names[-1]] = (np.arange(np.prod(shape, dtype=int)) + 10 * step).astype(dtypes[j]).reshape(shape)
            ops.append(make_op("EnqueueRebatchingQueue", ["q", *names], [], enqueue_batch=batch))
            count += rows
        elif kind == "dequeue":
            ops.append(make_op("DequeueRebatchingQueue", ["q"], [f"d{step}_{j}" for j in range(width)]))
            count -= 1
        elif kind == "dequeue_many":
            wanted = draw(st.integers(2, count + (2 if closed else 0)))
            ops.append(
                make_op("DequeueRebatchingQueue", ["q"], [f"d{step}_{j}" for j in range(width)], num_elements=wanted)
            )
            count = max(count - wanted, 0)
        else:
            ops.append(make_op("CloseRebatchingQueue", ["q"], []))
            closed = True
    return ops, feeds


@given(program=rebatching_program())
def test_rebatching_queue_matches_caffe2(caffe2, program):
    check_net(caffe2, *program)


def test_rebatching_queue_refusals_match_caffe2(caffe2):
    create = make_op("CreateRebatchingQueue", [], ["q"], capacity=4, num_blobs=1)
    x, y = np.ones((2, 3), np.float32), np.ones(3, np.float32)
    close = make_op("CloseRebatchingQueue", ["q"], [])
    for ops in (
        [close, make_op("EnqueueRebatchingQueue", ["q", "x"], [])],  # closed
        [close, make_op("DequeueRebatchingQueue", ["q"], ["a"])],  # closed and empty
        [make_op("EnqueueRebatchingQueue", ["q", "x", "y"], [])],  # two tensors for one
        [
            make_op("EnqueueRebatchingQueue", ["q", "x"], []),
            make_op("EnqueueRebatchingQueue", ["q", "y"], []),
            make_op("DequeueRebatchingQueue", ["q"], ["a"], num_elements=2),  # shapes differ
        ],
    ):
        check_net(caffe2, [create, *ops], {"x": x, "y": y}, fails=True)
    error = run_rnn2jax_net([create, make_op("DequeueRebatchingQueue", ["q"], ["a"])], {})
    assert isinstance(error, WorkspaceError) and "forever" in str(error)
    error = run_rnn2jax_net([make_op("DequeueRebatchingQueue", ["q"], ["a"], num_elements=0)], {"q": x})
    assert isinstance(error, BadArgumentError)
