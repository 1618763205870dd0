"""Plans (ExecutionStep semantics) against real Caffe2's RunPlan: the workspace holds the same blobs,
blob by blob, and each count is also checked against the count the step structure implies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtime_helpers import add, assert_same_as_caffe2, counters, net, op, plan, run_caffe2, run_ours, step

from rnn2jax.errors import Rnn2JaxError, WorkspaceError
from rnn2jax.proto import caffe2_pb2 as pb


def _nested(depth: int, num_iters: list[int | None]) -> tuple:
    """A chain of `depth` steps, each with one substep, the innermost running `inc_c`; the count is the
    product of the num_iters (1 when unset, 0 when not positive)."""
    inner = step("s0", network="inc_c", **({} if num_iters[0] is None else {"num_iter": num_iters[0]}))
    for level in range(1, depth):
        extra = {} if num_iters[level] is None else {"num_iter": num_iters[level]}
        inner = step(f"s{level}", substep=[inner], **extra)
    expected = 1
    for n in num_iters[:depth]:
        expected *= 1 if n is None else max(n, 0)
    return inner, expected


@given(
    depth=st.integers(1, 3),
    num_iters=st.lists(st.one_of(st.none(), st.integers(-1, 3)), min_size=3, max_size=3),
    siblings=st.integers(1, 3),
)
def test_nested_substeps_and_num_iter(caffe2, depth, num_iters, siblings):
    chain, expected = _nested(depth, num_iters)
    # the top step repeats twice and runs `siblings` copies of the chain plus a net touching another blob
    top = step("top", num_iter=2, substep=[chain] * siblings + [step("other", network="inc_d", num_iter=3)])
    message = plan([add("c"), add("d")], top)
    got = assert_same_as_caffe2(caffe2, message, counters(c=0, d=0))
    assert got["c"][0] == 2 * siblings * expected
    assert got["d"][0] == 6


def test_step_runs_its_networks_in_order_each_iteration(caffe2):
    double = net("double", op("Add", ["c", "c"], ["c"]))
    message = plan([add("c"), double], step("s", network=["inc_c", "double"], num_iter=3))
    got = assert_same_as_caffe2(caffe2, message, counters(c=0))
    assert got["c"][0] == (((0 + 1) * 2 + 1) * 2 + 1) * 2


def _stopper(limit_blob: str = "lim", scalar: bool = True):
    """A net setting `stop` to c >= lim, as a bool scalar (Squeeze) or a [1] vector."""
    if scalar:
        return net("stopper", op("GE", ["c", limit_blob], ["stopv"]), op("Squeeze", ["stopv"], ["stop"], dims=[0]))
    return net("stopper", op("GE", ["c", limit_blob], ["stop"]))


@given(limit=st.integers(0, 6), scalar=st.booleans())
def test_should_stop_blob_stops_the_step(caffe2, limit, scalar):
    message = plan(
        [add("c"), _stopper(scalar=scalar)], step("s", network=["inc_c", "stopper"], should_stop_blob="stop")
    )
    feeds = {**counters(c=0), "lim": np.array([limit], np.float32)}
    got = assert_same_as_caffe2(caffe2, message, feeds)
    assert got["c"][0] == max(limit, 1)  # the nets run before the first check


def test_should_stop_blob_is_read_after_every_net(caffe2):
    # stop is set by the first net; the second net of the same iteration must not run
    message = plan(
        [_stopper(), add("c"), add("d")], step("s", network=["inc_c", "stopper", "inc_d"], should_stop_blob="stop")
    )
    feeds = {**counters(c=0, d=0), "lim": np.array([3], np.float32)}
    got = assert_same_as_caffe2(caffe2, message, feeds)
    assert (got["c"][0], got["d"][0]) == (3, 2)


def test_should_stop_blob_of_a_parent_is_read_after_every_substep(caffe2):
    top = step(
        "s",
        should_stop_blob="stop",
        substep=[step("a", network="inc_c", num_iter=2), step("b", network="stopper"), step("z", network="inc_d")],
    )
    feeds = {**counters(c=0, d=0), "lim": np.array([5], np.float32)}
    got = assert_same_as_caffe2(caffe2, plan([add("c"), add("d"), _stopper()], top), feeds)
    assert (got["c"][0], got["d"][0]) == (6, 2)


@pytest.mark.parametrize("stop", [False, True])
def test_only_once_runs_one_iteration(caffe2, stop):
    message = plan([add("c")], step("s", network=["inc_c", "inc_c"], should_stop_blob="stop", only_once=True))
    got = assert_same_as_caffe2(caffe2, message, {**counters(c=0), "stop": np.array(stop)})
    assert got["c"][0] == (1 if stop else 2)


def test_criteria_network_is_ignored(caffe2):
    message = plan([add("c"), _stopper()], step("s", network="inc_c", num_iter=4, criteria_network="stopper"))
    got = assert_same_as_caffe2(caffe2, message, {**counters(c=0), "lim": np.array([2], np.float32)})
    assert got["c"][0] == 4
    missing = plan([add("c")], step("s", network="inc_c", num_iter=4, criteria_network="no_such_net"))
    assert assert_same_as_caffe2(caffe2, missing, counters(c=0))["c"][0] == 4


def test_report_net_runs_once_when_the_step_is_shorter_than_its_interval(caffe2):
    message = plan(
        [add("c"), add("r")], step("s", network="inc_c", num_iter=50, report_net="inc_r", report_interval=60)
    )
    got = assert_same_as_caffe2(caffe2, message, counters(c=0, r=0))
    assert (got["c"][0], got["r"][0]) == (50, 1)


def test_run_every_ms_substep_runs_once_per_run_of_its_parent(caffe2):
    top = step(
        "s",
        num_iter=3,
        substep=[step("a", network="inc_c", num_iter=5), step("report", network="inc_r", run_every_ms=60_000)],
    )
    got = assert_same_as_caffe2(caffe2, plan([add("c"), add("r")], top), counters(c=0, r=0))
    assert (got["c"][0], got["r"][0]) == (15, 1)


def test_report_net_runs_while_a_long_step_runs():
    # no Caffe2 here: when the report net runs depends on the clock (Caffe2 uses a thread)
    slow = net("slow", op("Add", ["c", "one"], ["c"]), op("Print", ["c"], [], every_n=1 << 30))
    message = plan([slow, add("r")], step("s", network="slow", num_iter=4000, report_net="inc_r", report_interval=0))
    got = run_ours(message, counters(c=0, r=0))
    assert got["c"][0] == 4000
    assert got["r"][0] == 4001  # an interval of 0: after every iteration, and once at the end


@pytest.mark.parametrize("concurrent, instances", [(True, None), (True, 3), (False, 3), (True, 1)])
def test_concurrent_substeps_and_instances(caffe2, concurrent, instances):
    extra = {} if instances is None else {"num_concurrent_instances": instances}
    top = step(
        "s",
        num_iter=2,
        concurrent_substeps=concurrent,
        substep=[step("a", network="inc_c", num_iter=5), step("b", network="inc_d", num_iter=2)],
        **extra,
    )
    got = assert_same_as_caffe2(caffe2, plan([add("c"), add("d")], top), counters(c=0, d=0))
    copies = instances or 1
    assert (got["c"][0], got["d"][0]) == (10 * copies, 4 * copies)


def test_create_workspace_writes_parent_blobs_and_drops_its_own(caffe2):
    local = net("local", op("Add", ["c", "one"], ["tmp"]), op("Add", ["tmp", "one"], ["c"]))
    top = step("s", num_iter=2, create_workspace=True, substep=[step("a", network="local"), step("b", network="inc_c")])
    got = assert_same_as_caffe2(caffe2, plan([local, add("c")], top), counters(c=0))
    assert got["c"][0] == 6
    assert "tmp" not in got


def test_nets_created_by_earlier_steps_and_nets_are_visible(caffe2):
    make = net("make", op("ConstantFill", [], ["x"], shape=[1], value=2.0))
    read = net("read", op("Add", ["x", "one"], ["y"]))
    for message in (
        plan([make, read], step("s", network=["make", "read"])),
        plan([make, read], step("s", substep=[step("a", network="make"), step("b", network="read")])),
        plan([make, read], step("a", network="make"), step("b", network="read")),
    ):
        got = assert_same_as_caffe2(caffe2, message, counters())
        assert got["y"][0] == 3


def test_a_stop_blob_created_by_a_net_of_the_step_exists_before_it_is_written(caffe2):
    message = plan([add("c"), _stopper(scalar=False)], step("s", network=["stopper", "inc_c"], should_stop_blob="stop"))
    got = assert_same_as_caffe2(caffe2, message, {**counters(c=0), "lim": np.array([3], np.float32)})
    assert got["c"][0] == 3


def test_plan_without_steps_and_steps_without_work_run_nothing(caffe2):
    for message in (plan([add("c")]), plan([add("c")], step("s")), plan([add("c")], step("s", num_iter=3))):
        assert assert_same_as_caffe2(caffe2, message, counters(c=0))["c"][0] == 0


def test_child_workspaces_get_a_global_workspace_id_when_there_is_a_node_id(caffe2):
    copy = net("copy", op("Copy", ["GLOBAL_WORKSPACE_ID"], ["gid"]))
    inner = step("inner", network="copy", create_workspace=True)
    message = plan([copy], step("s", num_iter=2, substep=[inner]))
    feeds = {"NODE_ID": np.array([3], np.int32), "gid": np.array(0, np.int32)}
    got = assert_same_as_caffe2(caffe2, message, feeds)
    assert int(got["gid"]) == (3 << 16) + 1  # the second child workspace of the run
    assert "GLOBAL_WORKSPACE_ID" not in got


def _queue_plan(records: int, consumers: int) -> pb.PlanDef:
    """Producers enqueue `records` records into a queue of capacity 1 (so each waits for a consumer), then
    close it; `consumers` concurrent steps dequeue until it is closed and empty, counting what they read."""
    init = net(
        "init",
        op("CreateBlobsQueue", [], ["q"], capacity=1, num_blobs=1),
        *(op("ConstantFill", [], [f"n{i}"], shape=[1], value=0.0) for i in range(consumers)),
    )
    record = op("ConstantFill", [], ["record"], shape=[1], value=1.0)  # the enqueue swaps it for an empty blob
    produce = net("produce", record, op("SafeEnqueueBlobs", ["q", "record"], ["record", "enqueued"]))
    close = net("close", op("CloseBlobsQueue", ["q"], []))
    producer = step("producer", substep=[step("p", network="produce", num_iter=records), step("c", network="close")])
    consumer_steps, consumer_nets = [], []
    for i in range(consumers):
        consumer_nets += [net(f"take{i}", op("SafeDequeueBlobs", ["q"], [f"x{i}", f"done{i}"])), add(f"n{i}")]
        consumer_steps.append(step(f"consumer{i}", network=[f"take{i}", f"inc_n{i}"], should_stop_blob=f"done{i}"))
    consumer = step("consumers", substep=consumer_steps, concurrent_substeps=True)
    worker = step("worker", substep=[consumer, producer], concurrent_substeps=True)
    return plan([init, produce, close, *consumer_nets], step("init", network="init"), worker)


@given(records=st.integers(0, 6), consumers=st.integers(1, 3))
def test_concurrent_substeps_pass_records_through_a_queue(caffe2, records, consumers):
    """Caffe2's concurrent substeps are threads: consumers wait on the queue that the producer fills, and the
    close ends their waits; each record is read once (the counters add up to the records)."""
    message, feeds = _queue_plan(records, consumers), counters()
    want = run_caffe2(caffe2, message, feeds)
    got = run_ours(message, feeds)
    total = sum(int(got[f"n{i}"][0]) for i in range(consumers))
    assert total == sum(int(want[f"n{i}"][0]) for i in range(consumers)) == records


def test_concurrent_substeps_that_all_wait_are_a_deadlock():
    """Two concurrent substeps each dequeue from an empty open queue that nothing fills: Caffe2 would wait
    forever; the step's own thread waits for them, so no thread can act and the plan fails saying so."""
    init = net("init", op("CreateBlobsQueue", [], ["q"], capacity=1, num_blobs=1))
    take = net("take", op("DequeueBlobs", ["q"], ["x"]))
    worker = step("worker", substep=[step("a", network="take"), step("b", network="take")], concurrent_substeps=True)
    with pytest.raises(WorkspaceError, match="no other thread can act"):
        run_ours(plan([init, take], step("init", network="init"), worker), counters())


def test_a_failing_concurrent_substep_stops_the_others():
    """Caffe2's gotFailure: once a substep fails, the others run no further iteration and the step raises the
    first failure (here a consumer waits on a queue the failed producer would have filled: it is woken as a
    deadlock, and the producer's own error is the one raised)."""
    init = net("init", op("CreateBlobsQueue", [], ["q"], capacity=1, num_blobs=1))
    take = net("take", op("DequeueBlobs", ["q"], ["x"]))
    fail = net("fail", op("CountDown", ["one"], ["y"]))  # 'one' holds a tensor, not a counter
    worker = step("worker", substep=[step("a", network="take"), step("b", network="fail")], concurrent_substeps=True)
    with pytest.raises(Rnn2JaxError) as caught:
        run_ours(plan([init, take, fail], step("init", network="init"), worker), counters())
    assert "not a counter" in str(caught.value)
