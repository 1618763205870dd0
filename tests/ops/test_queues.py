"""Caffe2's blobs queue and rebatching queue as host ops, against real Caffe2: random sequences of
enqueues, dequeues and closes that never wait in Caffe2 (a waiting op would hang its worker); and with
threads, as Caffe2's `BlobsQueue` documents: an op waits for another thread to fill, empty or close the
queue, a dequeue's timeout_secs bounds its wait, and a wait nothing can end raises instead of hanging."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rnn2jax import Workspace
from rnn2jax.caffe2.opdef import create_net
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
        [
            make_op("CreateRebatchingQueue", [], ["r"], capacity=1, num_blobs=1),
            make_op("DequeueRebatchingQueue", ["r"], ["a"]),
        ],
    ],
)
def test_an_op_that_would_wait_forever_raises(ops):
    """Caffe2 would wait for another thread here, and no other thread exists: rnn2jax says so, never hangs."""
    create = make_op("CreateBlobsQueue", [], ["q"], capacity=1, num_blobs=1)
    start = time.monotonic()
    error = run_rnn2jax_net([create, *ops], {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)})
    assert isinstance(error, WorkspaceError), error
    assert "forever" in str(error) and "no other thread can act" in str(error)
    assert time.monotonic() - start < 5


def test_a_dequeue_waits_out_its_timeout(caffe2):
    """Caffe2's DequeueBlobs waits timeout_secs for a record, then fails ('DequeueBlobs timed out in 0.2 secs')."""
    ops = [
        make_op("CreateBlobsQueue", [], ["q"], capacity=5, num_blobs=1),
        make_op("DequeueBlobs", ["q"], ["a"], timeout_secs=0.2),
    ]
    check_net(caffe2, ops, {}, fails=True)
    start = time.monotonic()
    error = run_rnn2jax_net(ops, {})
    assert time.monotonic() - start >= 0.19
    assert isinstance(error, WorkspaceError) and "timed out in 0.2 secs" in str(error), error


def _workspace_with_queue(capacity: int = 1, num_blobs: int = 1) -> Workspace:
    workspace = Workspace()
    workspace.run(
        create_net("create", [make_op("CreateBlobsQueue", [], ["q"], capacity=capacity, num_blobs=num_blobs)])
    )
    return workspace


def _run_op(workspace: Workspace, *args, **kwargs) -> None:
    workspace.run(create_net("one", [make_op(*args, **kwargs)]))


def test_a_dequeue_waits_for_a_producer_thread():
    """The consumer finds the queue empty and waits; the producer's records reach it, in order."""
    workspace = _workspace_with_queue(capacity=2)
    got = []

    def produce():
        for i in range(5):
            time.sleep(0.02)
            workspace.feed(f"x{i}", np.full(3, i, np.float32))
            _run_op(workspace, "EnqueueBlobs", ["q", f"x{i}"], [f"x{i}"])

    producer = threading.Thread(target=produce)
    producer.start()
    for i in range(5):
        _run_op(workspace, "DequeueBlobs", ["q"], [f"y{i}"])
        got.append(np.asarray(workspace.fetch(f"y{i}")))
    producer.join()
    assert [int(y[0]) for y in got] == list(range(5))


def test_an_enqueue_waits_for_room_and_a_close_wakes_it():
    """SafeEnqueueBlobs into a full queue waits; CloseBlobsQueue from another thread ends the wait with the
    status true (Caffe2's blockingWrite answers false once the queue is closed and still full)."""
    workspace = _workspace_with_queue(capacity=1)
    workspace.feed("x", np.ones(2, np.float32))
    _run_op(workspace, "EnqueueBlobs", ["q", "x"], ["x"])
    workspace.feed("x", np.ones(2, np.float32))

    def close_later():
        time.sleep(0.2)
        _run_op(workspace, "CloseBlobsQueue", ["q"], [])

    closer = threading.Thread(target=close_later)
    closer.start()
    start = time.monotonic()
    _run_op(workspace, "SafeEnqueueBlobs", ["q", "x"], ["x", "status"])
    closer.join()
    assert time.monotonic() - start >= 0.15
    assert bool(np.asarray(workspace.fetch("status"))) is True


def test_threads_that_all_wait_on_queues_are_a_deadlock():
    """A thread dequeues from an empty queue only the main thread fills; the main thread dequeues from an empty
    queue only that thread could fill: neither can act, so the main thread's wait raises rather than hangs.
    The other thread's wait goes on while the main thread lives (it could still act), and ends when the main
    thread closes its queue, as in Caffe2."""
    workspace = _workspace_with_queue()
    _run_op(workspace, "CreateBlobsQueue", [], ["q2"], capacity=1, num_blobs=1)
    errors = []

    def consume():
        try:
            _run_op(workspace, "DequeueBlobs", ["q2"], ["out"])
        except WorkspaceError as error:
            errors.append(error)

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.1)  # the thread is waiting now
    with pytest.raises(WorkspaceError, match="no other thread can act"):
        _run_op(workspace, "DequeueBlobs", ["q"], ["mine"])
    assert thread.is_alive()
    _run_op(workspace, "CloseBlobsQueue", ["q2"], [])
    thread.join(10)
    assert not thread.is_alive() and len(errors) == 1 and "closed and empty" in str(errors[0])


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


def test_a_bystander_thread_does_not_keep_a_hopeless_wait_going():
    """rnn2jax's own threads that never touch a queue (the progress display's ticker) are not counted as
    threads that could end a wait; any other live thread is."""
    from rnn2jax.ops.waits import bystander

    stop = threading.Event()
    ticker = bystander(threading.Thread(target=stop.wait, daemon=True))
    ticker.start()
    try:
        workspace = _workspace_with_queue()
        with pytest.raises(WorkspaceError, match="no other thread can act"):
            _run_op(workspace, "DequeueBlobs", ["q"], ["out"])
    finally:
        stop.set()
        ticker.join()
