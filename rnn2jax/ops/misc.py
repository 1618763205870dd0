"""Caffe2's workspace and control host ops (`caffe2/operators/utility_ops.h`, `last_n_window_collector.cc`):
GetAllBlobNames, Free, Fail, ThrowException, ThrowChildThreadException, LogFatal, Crash, LastNWindowCollector
and ReservoirSampling (`reservoir_sampling.cc`).

LogFatal, Crash and ThrowChildThreadException end Caffe2's process (LOG(FATAL), abort, an exception escaping a
thread: std::terminate). rnn2jax never ends the process for an op: each raises a `WorkspaceError` saying
what Caffe2 would have done, as Fail and ThrowException raise theirs, so a caller (a test, a server) keeps
running.
"""

from __future__ import annotations

import random
from typing import Any

import jax
import numpy as np

from ..errors import BadArgumentError, InputTypeError, OpFailedError, ShapeError, WorkspaceError
from ..ir.netdef import Op
from .containers import Map
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, Absent
from .registry import HostWorkspace, declare_family, host_op

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=Absent("a host op: Caffe2 says SHOULD_NOT_DO_GRADIENT or registers none"),
    emitter=HOST_OP_NO_EMITTER,
)


def _counts(op: Op, inputs: tuple[int, int], outputs: tuple[int, int]) -> None:
    if not (inputs[0] <= len(op.inputs) <= inputs[1] and outputs[0] <= len(op.outputs) <= outputs[1]):
        raise BadArgumentError(
            f"{op.where}: {op.type} takes {inputs[0]}-{inputs[1]} inputs and {outputs[0]}-{outputs[1]} outputs, got "
            f"{len(op.inputs)} and {len(op.outputs)}"
        )


def _strings(names: list[str]) -> np.ndarray:
    out = np.empty(len(names), dtype=object)
    out[:] = [name.encode("utf-8", "surrogateescape") for name in names]
    return out


@host_op("GetAllBlobNames", check=lambda op: (_counts(op, (0, 0), (1, 1)), op.bool("include_shared", True)))
def get_all_blob_names(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The names of every blob of the workspace (empty ones too; with include_shared, the parent's), sorted
    (Caffe2: hash order)."""
    workspace.put(op.outputs[0], _strings(workspace.all_blobs(op.bool("include_shared", True))))


def _check_free(op: Op) -> None:
    _counts(op, (1, 1 << 30), (1, 1 << 30))
    if len(op.inputs) != len(op.outputs):
        raise BadArgumentError(f"{op.where}: Free takes as many outputs as inputs (it frees them in place)")


@host_op("Free", check=_check_free)
def free(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Empty each output blob, which goes on existing (Caffe2's Blob::Reset)."""
    for name in op.outputs:
        workspace.reset(name)


@host_op("Fail", check=lambda op: None)
def fail(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Caffe2's Fail: the op fails (its Run returns false)."""
    raise OpFailedError(f"{op.where}: Fail: the op fails by design (Caffe2's Fail op)")


@host_op("ThrowException", check=lambda op: op.str("message", ""))
def throw_exception(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Caffe2's ThrowException: fail with the op's message."""
    raise WorkspaceError(f"{op.where}: {op.str('message', '')}")


_ENDS_PROCESS = {
    "ThrowChildThreadException": "throws its message in a child thread, and the uncaught exception ends the process",
    "LogFatal": "logs its message with LOG(FATAL), which aborts the process",
    "Crash": "crashes the process on purpose (abort)",
}


def ends_process(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Caffe2 ends its process here; rnn2jax fails the op instead (never the process)."""
    message = op.str("message", "")
    raise WorkspaceError(
        f"{op.where}: in Caffe2, {op.type} {_ENDS_PROCESS[op.type]}; rnn2jax fails the op instead"
        + (f": {message}" if message else "")
    )


for _type in _ENDS_PROCESS:
    host_op(_type, check=lambda op: op.str("message", ""))(ends_process)


# --------------------------------------------------------------------------------------------------
# LastNWindowCollector


def _check_last_n(op: Op) -> None:
    if len(op.inputs) not in (3, 4, 5) or len(op.outputs) not in (2, 3):
        raise BadArgumentError(
            f"{op.where}: LastNWindowCollector takes (last_n, next, data[, mutex[, num_visited]]) and outputs "
            "(last_n, next[, num_visited])"
        )
    if len(op.outputs) == 3 and len(op.inputs) != 5:
        raise BadArgumentError(f"{op.where}: the num_visited output needs the num_visited input (5th)")
    for i, o in ((0, 0), (1, 1), (4, 2)):
        if o < len(op.outputs) and op.inputs[i] != op.outputs[o]:
            raise BadArgumentError(
                f"{op.where}: input {i} ('{op.inputs[i]}') and output {o} ('{op.outputs[o]}') must be the same blob: "
                "LastNWindowCollector works in place"
            )
    if op.int("num_to_collect", -1) <= 0:
        raise BadArgumentError(f"{op.where}: num_to_collect must be positive, got {op.int('num_to_collect', -1)}")


def _initialized(buffer: np.ndarray) -> bool:
    """Caffe2 1.10's test of a collector's buffer: not empty, and its first 8 bytes (read as a pointer) not
    all zero, so a buffer starting with 8 zero bytes starts over, whatever its shape (a smaller one counts as
    initialized: Caffe2 reads past it, into its reserved rows)."""
    return buffer.size > 0 and (buffer.nbytes < 8 or any(buffer.reshape(-1).view(np.uint8)[:8]))


def _tensor(workspace: HostWorkspace, op: Op, position: int) -> np.ndarray:
    value = workspace.get(op.inputs[position], op)
    if not isinstance(value, jax.Array | np.ndarray):
        raise InputTypeError(f"{op.where}: blob '{op.inputs[position]}' holds a {type(value).__name__}, not a tensor")
    return np.asarray(value)


@host_op("LastNWindowCollector", check=_check_last_n)
def last_n_window_collector(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Keep the last num_to_collect rows of the data seen, in a ring buffer whose write position is `next`
    (a 0-d int32); an empty buffer (or, as in Caffe2, one whose first 8 bytes are zero) starts over, next and
    num_visited from 0. num_visited (int64) counts the rows seen."""
    keep = op.int("num_to_collect")
    if not workspace.has_blob(op.inputs[0]) and workspace.exists(op.inputs[0]):
        # an empty blob (CreateBlob): Caffe2 writes the buffer as its output, never reading it as a tensor
        buffer = np.zeros(0, np.float32)
    else:
        buffer = _tensor(workspace, op, 0)
    cursor, data = _tensor(workspace, op, 1), _tensor(workspace, op, 2)
    if data.ndim < 1:
        raise ShapeError(f"{op.where}: data '{op.inputs[2]}' must have rank >= 1")
    initialized = _initialized(buffer)
    if initialized and (buffer.ndim != data.ndim or buffer.shape[1:] != data.shape[1:]):
        raise ShapeError(
            f"{op.where}: the buffer '{op.inputs[0]}' is {list(buffer.shape)}, the data '{op.inputs[2]}' "
            f"{list(data.shape)}: they must agree but for the first dimension"
        )
    if buffer.size and buffer.dtype != data.dtype:
        raise InputTypeError(f"{op.where}: the buffer '{op.inputs[0]}' is {buffer.dtype}, the data {data.dtype}")
    rows = data.shape[0]
    if len(op.outputs) == 3:
        visited = _tensor(workspace, op, 4)
        if visited.size != 1 or visited.dtype != np.int64:
            raise InputTypeError(f"{op.where}: num_visited '{op.inputs[4]}' must be one int64, got {visited.dtype}")
        count = int(visited.reshape(-1)[0]) if initialized else 0
        if count < 0:
            raise BadArgumentError(f"{op.where}: num_visited '{op.inputs[4]}' is negative")
        workspace.put(op.outputs[2], np.full(visited.shape, count + rows, np.int64))
    if not initialized:
        buffer = np.zeros((0, *data.shape[1:]), data.dtype)
    if rows == 0:
        workspace.put(op.outputs[0], buffer if initialized else data.copy())
        return
    if cursor.dtype != np.int32 or cursor.ndim != 0:
        raise InputTypeError(
            f"{op.where}: next '{op.inputs[1]}' must be a 0-d int32, got {cursor.dtype} {list(cursor.shape)}"
        )
    copied = min(rows, keep)
    size = min(keep, buffer.shape[0] + copied)
    out = np.concatenate([buffer, np.zeros((size - buffer.shape[0], *data.shape[1:]), data.dtype)])
    start = int(cursor.reshape(-1)[0]) if initialized else 0
    if not 0 <= start < size:
        raise BadArgumentError(f"{op.where}: next '{op.inputs[1]}' is {start}, outside the buffer's {size} rows")
    if rows > keep:
        out[:copied] = data[rows - keep :]
        start_after = 0
    else:
        positions = (start + np.arange(copied)) % keep
        if positions.max() >= size:
            raise BadArgumentError(f"{op.where}: next '{op.inputs[1]}' is {start}: the rows would land past the buffer")
        out[positions] = data
        start_after = (start + copied) % keep
    workspace.put(op.outputs[0], out)
    workspace.put(op.outputs[1], np.full(cursor.shape, start_after, np.int32))


# --------------------------------------------------------------------------------------------------
# ReservoirSampling


def _check_reservoir(op: Op) -> None:
    if (len(op.inputs), len(op.outputs)) not in ((4, 2), (7, 4)):
        raise BadArgumentError(
            f"{op.where}: ReservoirSampling takes (reservoir, num_visited, data, mutex) and outputs (reservoir, "
            "num_visited), or with deduplication also (object_id, object_to_pos_map, pos_to_object) in and "
            "(object_to_pos_map, pos_to_object) out"
        )
    for i, o in ((0, 0), (1, 1), (5, 2), (6, 3)):
        if o < len(op.outputs) and op.inputs[i] != op.outputs[o]:
            raise BadArgumentError(
                f"{op.where}: input {i} ('{op.inputs[i]}') and output {o} ('{op.outputs[o]}') must be the same blob: "
                "ReservoirSampling works in place"
            )
    if op.int("num_to_collect", -1) <= 0:
        raise BadArgumentError(f"{op.where}: num_to_collect must be positive, got {op.int('num_to_collect', -1)}")


@host_op("ReservoirSampling", check=_check_reservoir)
def reservoir_sampling(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Keep a uniform sample of num_to_collect rows of all the data seen: the first rows fill the reservoir,
    each later one replaces a uniformly drawn row or is dropped (the op's own generator: Caffe2's draws
    differ). With object ids (int64), an object already in the reservoir is not taken again; the map
    (int64 -> int32, from CreateMap) and pos_to_object (int64) keep which object sits where."""
    keep = op.int("num_to_collect")
    reservoir, visited_in, data = (_tensor(workspace, op, i) for i in range(3))
    if data.ndim < 1:
        raise ShapeError(f"{op.where}: data '{op.inputs[2]}' must have rank >= 1")
    initialized = _initialized(reservoir)
    if initialized and (reservoir.ndim != data.ndim or reservoir.shape[1:] != data.shape[1:]):
        raise ShapeError(
            f"{op.where}: the reservoir '{op.inputs[0]}' is {list(reservoir.shape)}, the data '{op.inputs[2]}' "
            f"{list(data.shape)}: they must agree but for the first dimension"
        )
    if reservoir.size and reservoir.dtype != data.dtype:
        raise InputTypeError(f"{op.where}: the reservoir '{op.inputs[0]}' is {reservoir.dtype}, the data {data.dtype}")
    if visited_in.size != 1 or visited_in.dtype != np.int64:
        raise InputTypeError(f"{op.where}: num_visited '{op.inputs[1]}' must be one int64, got {visited_in.dtype}")
    dedupe = len(op.inputs) == 7
    mapping: Map | None = None
    positions = np.zeros(0, np.int64)
    if dedupe:
        mapping = workspace.get(op.inputs[5], op)
        if not isinstance(mapping, Map):
            raise InputTypeError(f"{op.where}: blob '{op.inputs[5]}' holds a {type(mapping).__name__}, not a map")
        positions = _tensor(workspace, op, 6).astype(np.int64) if initialized else positions
        if not initialized:
            mapping.items.clear()
    if not initialized:
        reservoir = np.zeros((0, *data.shape[1:]), data.dtype)
    count = int(visited_in.reshape(-1)[0]) if initialized else 0
    if count < 0:
        raise BadArgumentError(f"{op.where}: num_visited '{op.inputs[1]}' is negative")
    rows = data.shape[0]
    if rows == 0:
        workspace.put(op.outputs[0], reservoir if initialized else data.copy())
        workspace.put(op.outputs[1], np.full(visited_in.shape, count, np.int64))
        if dedupe:
            workspace.put(op.outputs[3], positions)
        return
    ids = None
    if dedupe:
        ids = _tensor(workspace, op, 4)
        if ids.ndim != 1 or ids.size != rows or ids.dtype != np.int64:
            raise ShapeError(
                f"{op.where}: object_id '{op.inputs[4]}' must be int64 [{rows}], got {ids.dtype} {list(ids.shape)}"
            )
    assert mapping is not None or ids is None
    eligible = {int(i) for i in ids if int(i) not in mapping.items} if ids is not None and mapping else set()
    new_entries = len(eligible) if ids is not None else rows
    size = min(keep, reservoir.shape[0] + min(new_entries, keep))
    out = np.concatenate([reservoir, np.zeros((size - reservoir.shape[0], *data.shape[1:]), data.dtype)])
    garbage: set[int] = set()  # new pos_to_object rows Caffe2 leaves uninitialized (see below)
    if dedupe:
        before = positions.shape[0]
        positions = np.concatenate([positions, np.zeros(size - before, np.int64)])
        # Caffe2 means to zero the new rows but offsets its memset by before * 8 elements (bytes counted as
        # elements): only rows [8 * before, 8 * before + size - before) are zeroed, the others hold garbage,
        # whose object (none, here) it then erases from the map
        garbage = {j for j in range(before, size) if not 8 * before <= j < 8 * before + size - before}
    rng = state.setdefault("rng", random.Random(0))
    for i in range(rows):
        if ids is not None:
            oid = int(ids[i])
            if oid not in eligible:
                continue
            eligible.discard(oid)
        if count < keep:
            pos = count
        else:
            pos = rng.randint(0, count)
            pos = -1 if pos >= keep else pos
        if pos >= 0:
            out[pos] = data[i]
            if ids is not None and mapping is not None:
                if pos not in garbage:
                    mapping.items.pop(int(positions[pos]), None)
                garbage.discard(pos)
                mapping.items.setdefault(oid, pos)
                positions[pos] = oid
        count += 1
    workspace.put(op.outputs[0], out)
    workspace.put(op.outputs[1], np.full(visited_in.shape, count, np.int64))
    if dedupe:
        workspace.put(op.outputs[3], positions)
