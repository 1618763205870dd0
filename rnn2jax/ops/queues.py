"""Caffe2's queues as host ops: the blobs queue (`caffe2/queue/blobs_queue.cc`, `queue_ops.h`: CreateBlobsQueue,
EnqueueBlobs, DequeueBlobs, SafeEnqueueBlobs, SafeDequeueBlobs, WeightedSampleDequeueBlobs, CloseBlobsQueue)
and the rebatching queue (`caffe2/queue/rebatching_queue.cc`: CreateRebatchingQueue, EnqueueRebatchingQueue,
DequeueRebatchingQueue, CloseRebatchingQueue).

A blobs queue is, as in Caffe2, a ring of workspace blobs `<queue>_<slot>_<column>` that reads and writes
swap with the op's blobs (so an enqueued blob is left holding whatever its slot held, at first nothing).

As in Caffe2, an op waits on a full or empty open queue (on the queue's condition variable) for another
thread to make room, fill it or close it; a dequeue's `timeout_secs` bounds its wait. A wait that nothing
can end (no other thread that could act: `waits.py` says how that is told) raises a `WorkspaceError` saying
so instead of hanging. A closed queue keeps Caffe2's answers: the plain ops fail, the Safe ones set their
status output to true.
"""

from __future__ import annotations

import bisect
import random
import threading
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import jax
import numpy as np

from ..errors import BadArgumentError, InputTypeError, OpFailedError, ShapeError, WorkspaceError
from ..ir.netdef import Op
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_GRADIENT, NO_ROLES
from .registry import HostWorkspace, declare_family, host_op
from .waits import runs_unlocked, wait_until

declare_family(
    __name__, roles=NO_ROLES, shape_rule=HOST_OP_NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=HOST_OP_NO_EMITTER
)

_EMPTY = object()  # the content of an empty blob (Caffe2's Blob after Reset)

# they wait for other threads, holding only their queue's lock
runs_unlocked(
    "EnqueueBlobs",
    "SafeEnqueueBlobs",
    "DequeueBlobs",
    "SafeDequeueBlobs",
    "WeightedSampleDequeueBlobs",
    "CloseBlobsQueue",
    "EnqueueRebatchingQueue",
    "DequeueRebatchingQueue",
    "CloseRebatchingQueue",
)


def _take(workspace: HostWorkspace, name: str) -> Any:
    return workspace.get(name) if workspace.has_blob(name) else _EMPTY


def _give(workspace: HostWorkspace, name: str, value: Any) -> None:
    if value is _EMPTY:
        workspace.reset(name)
    else:
        workspace.put(name, value)


def _swap(workspace: HostWorkspace, first: str, second: str) -> None:
    """Caffe2's `swap(*blob, *slot)`: each blob takes the other's content (empty or not)."""
    a, b = _take(workspace, first), _take(workspace, second)
    _give(workspace, first, b)
    _give(workspace, second, a)


def _would_block(op: Op, queue: str, what: str) -> WorkspaceError:
    return WorkspaceError(
        f"{op.where}: {what} queue '{queue}', which is open, and no other thread can act (none is left, or "
        "each waits on a queue too): Caffe2 would wait here forever (close the queue, or balance the enqueues "
        "and dequeues)"
    )


def _wait(op: Op, queue: Any, ready: Any, what: str, timeout: float = 0.0) -> None:
    """With the queue's lock held, wait until `ready()` or the queue is closed (Caffe2's cv_.wait)."""

    def timed_out() -> WorkspaceError:
        return WorkspaceError(f"{op.where}: {op.type} timed out in {timeout:g} secs (queue '{queue.name}')")

    wait_until(
        queue.cond,
        lambda: queue.closed or ready(),
        timeout,
        lambda: _would_block(op, queue.name, what),
        timed_out,
    )


def _array(value: Any) -> np.ndarray:
    return np.asarray(value) if isinstance(value, jax.Array | np.ndarray) else value


# --------------------------------------------------------------------------------------------------
# The blobs queue


@dataclass
class BlobsQueue:
    """Caffe2's BlobsQueue: `capacity` slots of `num_blobs` workspace blobs each, a reader and a writer that
    only go up, and `closed`."""

    name: str
    slots: list[list[str]]
    num_blobs: int
    reader: int = 0
    writer: int = 0
    closed: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition, repr=False, compare=False)

    def can_read(self) -> bool:
        return self.reader != self.writer

    def can_write(self) -> bool:
        return self.writer != self.reader + len(self.slots)

    def write(self, workspace: HostWorkspace, names: list[str]) -> None:
        for name, slot in zip(names, self.slots[self.writer % len(self.slots)], strict=False):
            _swap(workspace, name, slot)
        self.writer += 1

    def read(self, workspace: HostWorkspace, names: list[str]) -> None:
        for name, slot in zip(names, self.slots[self.reader % len(self.slots)], strict=False):
            _swap(workspace, name, slot)
        self.reader += 1

    def __repr__(self) -> str:
        return f"BlobsQueue({self.name!r}, {self.writer - self.reader}/{len(self.slots)} records)"


def _check_create_queue(op: Op) -> None:
    if op.inputs or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: CreateBlobsQueue takes no inputs and 1 output (the queue)")
    capacity, num_blobs = op.int("capacity", 1), op.int("num_blobs", 1)
    if capacity < 0 or num_blobs < 0:
        raise BadArgumentError(f"{op.where}: capacity {capacity} and num_blobs {num_blobs} must not be negative")
    fields = op.strings("field_names", ())
    if fields and len(fields) != num_blobs:
        raise BadArgumentError(
            f"{op.where}: {len(fields)} field_names for num_blobs {num_blobs} (Caffe2: 'Wrong number of "
            "fieldNames provided.')"
        )
    op.bool("enforce_unique_name", False)


@host_op("CreateBlobsQueue", check=_check_create_queue)
def create_blobs_queue(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A queue of `capacity` records of `num_blobs` blobs, its slots created in the workspace."""
    name = op.outputs[0]
    capacity, num_blobs = op.int("capacity", 1), op.int("num_blobs", 1)
    slots = [[f"{name}_{i}_{j}" for j in range(num_blobs)] for i in range(capacity)]
    for row in slots:
        for slot in row:
            if op.bool("enforce_unique_name", False) and workspace.exists(slot):
                raise WorkspaceError(
                    f"{op.where}: the queue's slot blob '{slot}' already exists (Caffe2: 'Queue internal blob "
                    "already exists'); enforce_unique_name refuses to share it"
                )
            if not workspace.exists(slot):
                workspace.reset(slot)
    workspace.put(name, BlobsQueue(name, slots, num_blobs))


def _queue(workspace: HostWorkspace, op: Op, name: str) -> BlobsQueue:
    queue = workspace.get(name, op)
    if not isinstance(queue, BlobsQueue):
        raise InputTypeError(
            f"{op.where}: blob '{name}' holds a {type(queue).__name__}, not a blobs queue (make one with "
            "CreateBlobsQueue)"
        )
    return queue


def _check_width(op: Op, queue: BlobsQueue, given: int, what: str) -> None:
    if given != queue.num_blobs:
        raise BadArgumentError(
            f"{op.where}: queue '{queue.name}' holds records of {queue.num_blobs} blobs; the op {what} {given}"
        )


def _check_in_place(op: Op, count: int) -> None:
    for i in range(count):
        if op.inputs[i + 1] != op.outputs[i]:
            raise BadArgumentError(
                f"{op.where}: input {i + 1} ('{op.inputs[i + 1]}') and output {i} ('{op.outputs[i]}') must be the "
                f"same blob: {op.type} works in place"
            )


def _check_enqueue(op: Op) -> None:
    if len(op.inputs) < 2 or len(op.outputs) != len(op.inputs) - 1:
        raise BadArgumentError(f"{op.where}: EnqueueBlobs takes the queue and its blobs, and outputs those blobs")
    _check_in_place(op, len(op.outputs))


@host_op("EnqueueBlobs", check=_check_enqueue)
def enqueue_blobs(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Write one record; each blob is left holding what its slot held. A closed full queue fails."""
    queue = _queue(workspace, op, op.inputs[0])
    _check_width(op, queue, len(op.outputs), "enqueues")
    with queue.cond:
        _wait(op, queue, queue.can_write, "enqueues into the full")
        if not queue.can_write():
            raise OpFailedError(f"{op.where}: queue '{queue.name}' is closed and full: the enqueue fails")
        queue.write(workspace, list(op.outputs))
        queue.cond.notify_all()


def _check_safe_enqueue(op: Op) -> None:
    if len(op.inputs) < 2 or len(op.outputs) != len(op.inputs):
        raise BadArgumentError(
            f"{op.where}: SafeEnqueueBlobs takes the queue and its blobs, and outputs those blobs and a status"
        )
    _check_in_place(op, len(op.outputs) - 1)


@host_op("SafeEnqueueBlobs", check=_check_safe_enqueue)
def safe_enqueue_blobs(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """EnqueueBlobs that sets its last output (bool) to true, rather than failing, when the queue is closed
    and full."""
    queue = _queue(workspace, op, op.inputs[0])
    _check_width(op, queue, len(op.outputs) - 1, "enqueues")
    with queue.cond:
        _wait(op, queue, queue.can_write, "enqueues into the full")
        failed = not queue.can_write()
        if not failed:
            queue.write(workspace, list(op.outputs[:-1]))
            queue.cond.notify_all()
    workspace.put(op.outputs[-1], np.array(failed))


def _check_dequeue(op: Op) -> None:
    if len(op.inputs) != 1:
        raise BadArgumentError(f"{op.where}: DequeueBlobs takes 1 input (the queue)")
    if op.float("timeout_secs", 0.0) < 0:
        raise BadArgumentError(f"{op.where}: timeout_secs must not be negative")


@host_op("DequeueBlobs", check=_check_dequeue)
def dequeue_blobs(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Read one record into the outputs (swapped with its slots). A closed empty queue fails."""
    queue = _queue(workspace, op, op.inputs[0])
    _check_width(op, queue, len(op.outputs), "dequeues")
    with queue.cond:
        _wait(op, queue, queue.can_read, "dequeues from the empty", op.float("timeout_secs", 0.0))
        if not queue.can_read():
            raise OpFailedError(f"{op.where}: queue '{queue.name}' is closed and empty: the dequeue fails")
        queue.read(workspace, list(op.outputs))
        queue.cond.notify_all()


def _check_safe_dequeue(op: Op) -> None:
    if len(op.inputs) != 1 or not op.outputs:
        raise BadArgumentError(
            f"{op.where}: SafeDequeueBlobs takes 1 input (the queue), and outputs blobs and a status"
        )
    if op.int("num_records", 1) < 1:
        raise BadArgumentError(f"{op.where}: num_records must be positive, got {op.int('num_records', 1)}")


def _concatenate(op: Op, name: str, column: int, first: Any, rows: Any) -> np.ndarray:
    first, rows = _array(first), _array(rows)
    if not isinstance(rows, np.ndarray) or rows.ndim == 0:
        raise ShapeError(f"{op.where}: Empty tensor to dequeue at column {column} (blob '{name}')")
    if not isinstance(first, np.ndarray) or first.dtype != rows.dtype or first.shape[1:] != rows.shape[1:]:
        shown = f"{first.dtype} {list(first.shape)}" if isinstance(first, np.ndarray) else type(first).__name__
        raise ShapeError(
            f"{op.where}: records of column {column} (blob '{name}') cannot be stacked: {shown} and "
            f"{rows.dtype} {list(rows.shape)}"
        )
    return np.concatenate([first, rows])


def _read_one(workspace: HostWorkspace, op: Op, queue: BlobsQueue, outputs: list[str]) -> bool:
    """One record into `outputs`, waiting while the queue is open and empty (and something can still fill or
    close it); False when it is closed and empty."""
    with queue.cond:
        _wait(op, queue, queue.can_read, "dequeues from the empty")
        ok = queue.can_read()
        if ok:
            queue.read(workspace, outputs)
            queue.cond.notify_all()
    return ok


@host_op("SafeDequeueBlobs", check=_check_safe_dequeue)
def safe_dequeue_blobs(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """DequeueBlobs that sets its last output to true, rather than failing, when the queue is closed and
    empty; with num_records > 1 it reads that many records (fewer once the queue is closed), concatenated
    along their first dimension."""
    queue = _queue(workspace, op, op.inputs[0])
    outputs = list(op.outputs[:-1])
    _check_width(op, queue, len(outputs), "dequeues")
    records = op.int("num_records", 1)
    if records == 1:
        workspace.put(op.outputs[-1], np.array(not _read_one(workspace, op, queue, outputs)))
        return
    # Caffe2 reads each record into blobs the op keeps (its blobs_), then copies them into the outputs.
    kept: list[Any] = state.setdefault("values", [_EMPTY] * len(outputs))
    read = 0
    for i in range(records):
        with queue.cond:
            _wait(op, queue, queue.can_read, "dequeues from the empty")
            if not queue.can_read():
                break
            row = queue.slots[queue.reader % len(queue.slots)]
            for column, slot in enumerate(row):
                kept[column], slot_value = _take(workspace, slot), kept[column]
                _give(workspace, slot, slot_value)
            queue.reader += 1
            queue.cond.notify_all()
        for column, name in enumerate(outputs):
            value = kept[column]
            if i == 0:
                workspace.put(name, _array(value))
            else:
                workspace.put(name, _concatenate(op, name, column, workspace.get(name), value))
        read += 1
    workspace.put(op.outputs[-1], np.array(read == 0))


def _check_weighted_dequeue(op: Op) -> None:
    if not op.inputs or not op.outputs:
        raise BadArgumentError(f"{op.where}: WeightedSampleDequeueBlobs takes queues, and outputs blobs and a status")
    table = op.int("table_idx_blob", -1)
    if table >= len(op.outputs) - 1:
        raise BadArgumentError(f"{op.where}: table_idx_blob {table} must be less than {len(op.outputs) - 1}")
    weights = op.floats("weights", ()) or (1.0,) * len(op.inputs)
    if len(weights) != len(op.inputs):
        raise BadArgumentError(f"{op.where}: {len(weights)} weights for {len(op.inputs)} queues; give one per queue")
    if sum(weights) <= 0:
        raise BadArgumentError(f"{op.where}: Sum of weights must be positive")
    if any(w < 0 for w in weights):
        raise BadArgumentError(f"{op.where}: Each probability must be non-negative")


@host_op("WeightedSampleDequeueBlobs", check=_check_weighted_dequeue)
def weighted_sample_dequeue_blobs(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Dequeue one record from a queue drawn with probability proportional to its weight; the status (last
    output) is true when that queue is closed and empty; output `table_idx_blob` (when >= 0) gets the
    drawn queue's index as int32 [1]."""
    weights = op.floats("weights", ()) or (1.0,) * len(op.inputs)
    total = sum(np.float32(w) for w in weights)
    cumulative = [np.float32(c / total) for c in accumulate(np.float32(w) for w in weights)]
    cumulative[-1] = np.float32(1.0001)
    rng = state.setdefault("rng", random.Random(0))
    index = bisect.bisect_left(cumulative, np.float32(rng.random()))
    queue = _queue(workspace, op, op.inputs[index])
    outputs = list(op.outputs[:-1])
    _check_width(op, queue, len(outputs), "dequeues")
    ok = _read_one(workspace, op, queue, outputs)
    table = op.int("table_idx_blob", -1)
    if table >= 0:
        workspace.put(op.outputs[table], np.array([index], np.int32))
    workspace.put(op.outputs[-1], np.array(not ok))


def _check_close(op: Op) -> None:
    if len(op.inputs) != 1 or op.outputs:
        raise BadArgumentError(f"{op.where}: {op.type} takes 1 input (the queue) and no outputs")


@host_op("CloseBlobsQueue", check=_check_close)
def close_blobs_queue(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Close the queue, waking its waiters: what it holds can still be read, and written while it has room."""
    queue = _queue(workspace, op, op.inputs[0])
    with queue.cond:
        queue.closed = True
        queue.cond.notify_all()


# --------------------------------------------------------------------------------------------------
# The rebatching queue


@dataclass
class RebatchingQueue:
    """Caffe2's RebatchingQueue: at most `capacity` records (tuples of `num_blobs` arrays), and `closed`."""

    name: str
    capacity: int
    num_blobs: int
    records: deque[tuple[np.ndarray, ...]] = field(default_factory=deque)
    closed: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition, repr=False, compare=False)

    def __repr__(self) -> str:
        return f"RebatchingQueue({self.name!r}, {len(self.records)}/{self.capacity} records)"


def _check_create_rebatching(op: Op) -> None:
    if op.inputs or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: CreateRebatchingQueue takes no inputs and 1 output (the queue)")
    if op.int("capacity", 1) < 0 or op.int("num_blobs", 1) < 0:
        raise BadArgumentError(f"{op.where}: capacity and num_blobs must not be negative")


@host_op("CreateRebatchingQueue", check=_check_create_rebatching)
def create_rebatching_queue(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    workspace.put(op.outputs[0], RebatchingQueue(op.outputs[0], op.int("capacity", 1), op.int("num_blobs", 1)))


def _rebatching_queue(workspace: HostWorkspace, op: Op) -> RebatchingQueue:
    queue = workspace.get(op.inputs[0], op)
    if not isinstance(queue, RebatchingQueue):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[0]}' holds a {type(queue).__name__}, not a rebatching queue (make one "
            "with CreateRebatchingQueue)"
        )
    return queue


def _tensor(workspace: HostWorkspace, op: Op, name: str) -> np.ndarray:
    value = _array(workspace.get(name, op))
    if not isinstance(value, np.ndarray):
        raise InputTypeError(f"{op.where}: blob '{name}' holds a {type(value).__name__}, not a tensor")
    return value


def _check_enqueue_rebatching(op: Op) -> None:
    if len(op.inputs) < 1 or op.outputs:
        raise BadArgumentError(f"{op.where}: EnqueueRebatchingQueue takes the queue and its tensors, and no outputs")
    op.bool("enqueue_batch", False)


@host_op("EnqueueRebatchingQueue", check=_check_enqueue_rebatching)
def enqueue_rebatching_queue(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Enqueue the tensors as one record, or with enqueue_batch each row of them (split along the first
    dimension, which they share) as a record. A closed queue fails."""
    queue = _rebatching_queue(workspace, op)
    if len(op.inputs) != queue.num_blobs + 1:
        raise BadArgumentError(
            f"{op.where}: queue '{queue.name}' holds records of {queue.num_blobs} tensors; the op enqueues "
            f"{len(op.inputs) - 1}"
        )
    tensors = [_tensor(workspace, op, name).copy() for name in op.inputs[1:]]
    if op.bool("enqueue_batch", False):
        if not tensors:
            raise BadArgumentError(f"{op.where}: enqueue_batch needs at least one tensor")
        for name, tensor in zip(op.inputs[1:], tensors, strict=True):
            if tensor.ndim == 0 or tensor.shape[0] != tensors[0].shape[0]:
                raise ShapeError(
                    f"{op.where}: enqueue_batch splits every tensor along its first dimension, so they need one "
                    f"size there; blob '{name}' has shape {list(tensor.shape)}, blob '{op.inputs[1]}' "
                    f"{list(tensors[0].shape)}"
                )
        records = [tuple(t[i] for t in tensors) for i in range(tensors[0].shape[0])]
    else:
        records = [tuple(tensors)]
    with queue.cond:
        for record in records:
            _wait(op, queue, lambda: len(queue.records) < queue.capacity, "enqueues into the full rebatching")
            if queue.closed:
                raise WorkspaceError(f"{op.where}: rebatching queue '{queue.name}' is closed: the enqueue fails")
            queue.records.append(record)
            queue.cond.notify_all()


def _check_dequeue_rebatching(op: Op) -> None:
    if len(op.inputs) != 1:
        raise BadArgumentError(f"{op.where}: DequeueRebatchingQueue takes 1 input (the queue)")
    if op.int("num_elements", 1) < 1:
        raise BadArgumentError(f"{op.where}: num_elements must be positive")


@host_op("DequeueRebatchingQueue", check=_check_dequeue_rebatching)
def dequeue_rebatching_queue(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Dequeue num_elements records (fewer once the queue is closed), each output the stack of its tensors
    along a new first dimension. A closed empty queue fails."""
    queue = _rebatching_queue(workspace, op)
    wanted = op.int("num_elements", 1)
    if len(op.outputs) != queue.num_blobs:
        raise BadArgumentError(
            f"{op.where}: queue '{queue.name}' holds records of {queue.num_blobs} tensors; the op has "
            f"{len(op.outputs)} outputs"
        )
    records: list[tuple[np.ndarray, ...]] = []
    with queue.cond:  # Caffe2 takes the records one at a time, each as soon as there is one
        while len(records) < wanted:
            _wait(op, queue, lambda: bool(queue.records), f"dequeues {wanted} records from the")
            if not queue.records:
                break
            records.append(queue.records.popleft())
            queue.cond.notify_all()
    if not records:
        raise WorkspaceError(f"{op.where}: rebatching queue '{queue.name}' is closed and empty: the dequeue fails")
    for column, name in enumerate(op.outputs):
        first = records[0][column]
        for record in records[1:]:
            if record[column].dtype != first.dtype or record[column].shape != first.shape:
                raise ShapeError(
                    f"{op.where}: records of column {column} (blob '{name}') differ: {first.dtype} "
                    f"{list(first.shape)} and {record[column].dtype} {list(record[column].shape)}"
                )
        workspace.put(name, np.stack([record[column] for record in records]))


@host_op("CloseRebatchingQueue", check=_check_close)
def close_rebatching_queue(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    queue = _rebatching_queue(workspace, op)
    with queue.cond:
        queue.closed = True
        queue.cond.notify_all()
