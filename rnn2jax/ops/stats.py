"""Caffe2's statistics and timers as host ops (`caffe2/core/stats.h`, `caffe2/operators/stats_ops.cc`,
`stats_put_ops.h`): StatRegistryCreate, StatRegistryUpdate, StatRegistryExport, AveragePut, IncrementPut,
StdDevPut, TimerBegin, TimerEnd, TimerGet, TimerGetAndEnd and WallClockTime.

A stat registry maps names to int64 counters that updates add to and an export reads (and, by default, resets
to 0). Without a registry input the ops use the process's one registry (Caffe2's `StatRegistry::get()`,
which outlives workspaces, as here). As in Caffe2 the Put ops and TimerBegin add their counters to it when
their net is created, so an export sees them (at 0) before they first run. Caffe2 exports in the order of
its hash map; rnn2jax exports sorted by name.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, Absent
from .registry import HostWorkspace, declare_family, host_op

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=Absent("a host op: Caffe2 registers no gradient for it (WallClockTime: SHOULD_NOT_DO_GRADIENT)"),
    emitter=HOST_OP_NO_EMITTER,
)

INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)


@dataclass
class StatRegistry:
    """Caffe2's StatRegistry: int64 counters by name."""

    values: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str) -> None:
        with self.lock:
            self.values.setdefault(name, 0)

    def increment(self, name: str, value: int) -> None:
        with self.lock:
            total = self.values.get(name, 0) + int(value)
            self.values[name] = (total - INT64_MIN) % 2**64 + INT64_MIN  # int64 wraps, as Caffe2's atomics do

    def publish(self, reset: bool) -> list[tuple[str, int, int]]:
        with self.lock:
            exported = [(name, value, time.time_ns()) for name, value in sorted(self.values.items())]
            if reset:
                self.values = dict.fromkeys(self.values, 0)
        return exported


GLOBAL_REGISTRY = StatRegistry()  # Caffe2's StatRegistry::get(): one per process

# Lowered (pure) ops whose Caffe2 kernel also counts a stat of the global registry (CAFFE_EVENT): op type ->
# the keys one run of the op adds 1 to. The executor adds the keys when it builds the op, as Caffe2 exports
# them when it creates the op, and counts them after each run.
_OP_EVENTS: dict[str, Callable[[Op], tuple[str, ...]]] = {}


def counts_events(op_type: str, keys: Callable[[Op], tuple[str, ...]]) -> None:
    _OP_EVENTS[op_type] = keys


def op_events(op: Op) -> tuple[str, ...]:
    """The global-registry stats one run of `op` adds 1 to."""
    keys = _OP_EVENTS.get(op.type)
    return keys(op) if keys is not None else ()


def _registry(workspace: HostWorkspace, op: Op, position: int) -> StatRegistry:
    if len(op.inputs) <= position:
        return GLOBAL_REGISTRY
    registry = workspace.get(op.inputs[position], op)
    if not isinstance(registry, StatRegistry):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[position]}' holds a {type(registry).__name__}, not a stat registry (make "
            "one with StatRegistryCreate)"
        )
    return registry


def _counts(op: Op, inputs: tuple[int, int], outputs: tuple[int, int]) -> None:
    if not (inputs[0] <= len(op.inputs) <= inputs[1] and outputs[0] <= len(op.outputs) <= outputs[1]):
        raise BadArgumentError(
            f"{op.where}: {op.type} takes {inputs[0]}-{inputs[1]} inputs and {outputs[0]}-{outputs[1]} outputs, got "
            f"{len(op.inputs)} and {len(op.outputs)}"
        )


def _array(workspace: HostWorkspace, op: Op, name: str) -> np.ndarray:
    value = workspace.get(name, op)
    if not isinstance(value, jax.Array | np.ndarray):
        raise InputTypeError(f"{op.where}: blob '{name}' holds a {type(value).__name__}, not a tensor")
    return np.asarray(value)


# --------------------------------------------------------------------------------------------------
# Registries


@host_op("StatRegistryCreate", check=lambda op: _counts(op, (0, 0), (1, 1)))
def stat_registry_create(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A new, empty stat registry."""
    workspace.put(op.outputs[0], StatRegistry())


@host_op("StatRegistryUpdate", check=lambda op: _counts(op, (2, 3), (0, 0)))
def stat_registry_update(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Add each value (int64) to the counter of its key (string), in the given registry or the global one."""
    keys, values = _array(workspace, op, op.inputs[0]), _array(workspace, op, op.inputs[1])
    registry = _registry(workspace, op, 2)
    if keys.dtype != object:
        raise InputTypeError(f"{op.where}: keys '{op.inputs[0]}' must be strings, got {keys.dtype}")
    if values.dtype != np.int64:
        raise InputTypeError(f"{op.where}: values '{op.inputs[1]}' must be int64, got {values.dtype}")
    if keys.size != values.size:
        raise ShapeError(f"{op.where}: {keys.size} keys and {values.size} values; give one value per key")
    for key, value in zip(keys.reshape(-1), values.reshape(-1), strict=True):
        registry.increment(key.decode("utf-8", "surrogateescape"), int(value))


@host_op("StatRegistryExport", check=lambda op: (_counts(op, (0, 1), (3, 3)), op.bool("reset", True)))
def stat_registry_export(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """keys (strings), values (int64) and timestamps (int64 ns since the epoch) of every counter, sorted by
    key; with reset (the default) the counters go back to 0."""
    exported = _registry(workspace, op, 0).publish(op.bool("reset", True))
    keys = np.empty(len(exported), dtype=object)
    keys[:] = [key.encode("utf-8", "surrogateescape") for key, _, _ in exported]
    workspace.put(op.outputs[0], keys)
    workspace.put(op.outputs[1], np.array([value for _, value, _ in exported], np.int64))
    workspace.put(op.outputs[2], np.array([stamp for _, _, stamp in exported], np.int64))


# --------------------------------------------------------------------------------------------------
# Put ops

_PUT_KEYS = {
    "AveragePut": ("/stat_value/sum", "/stat_value/count"),
    "IncrementPut": ("/stat_value",),
    "StdDevPut": ("/stat_value/sum", "/stat_value/count", "/stat_value/sumoffset", "/stat_value/sumsqoffset"),
}
_PUT_TYPES = ("int32", "float32", "uint8", "int8", "uint16", "int16", "int64", "float16", "float64")


def _stat_name(op: Op) -> str:
    return op.str("stat_name", op.inputs[0] if op.inputs else "")


def _check_put(op: Op) -> None:
    _counts(op, (1, 1), (0, 0))
    if op.int("magnitude_expand", 1) == 0:
        raise BadArgumentError(f"{op.where}: magnitude_expand must not be 0 (Caffe2 divides by it)")
    op.bool("bound", False)
    for suffix in _PUT_KEYS[op.type]:  # Caffe2 adds the op's counters when it creates the op
        GLOBAL_REGISTRY.add(_stat_name(op) + suffix)


def _put_value(op: Op, array: np.ndarray) -> int:
    """Caffe2's TemplatePutOp: the first element (or default_value for an empty tensor) times
    magnitude_expand, in the input's own arithmetic, as an int64 (clamped with `bound`)."""
    name, expand = _stat_name(op), op.int("magnitude_expand", 1)
    kind = str(array.dtype)
    if kind not in _PUT_TYPES:
        raise InputTypeError(f"{op.where}: {op.type} puts numbers; blob '{op.inputs[0]}' is {array.dtype}")
    dtype = array.dtype.type
    if array.size:
        value = array.reshape(-1)[0]
    elif op.has("default_value"):
        value = dtype(op.float("default_value")) if array.dtype.kind == "f" else dtype(int(op.float("default_value")))
    else:
        raise ShapeError(f"{op.where}: Default value must be provided when recieving empty tensors for {name}")
    bound_value = INT64_MAX // abs(expand) * (1 if expand > 0 else -1)
    floating = array.dtype.kind == "f"
    if floating:
        product_type = np.float64 if kind == "float64" else np.float32
        scaled = float(product_type(value) * product_type(expand))
        if kind == "float16":
            scaled = float(np.float16(np.float32(value) * np.float32(np.float16(expand))))
    else:
        scaled = int(value) * expand
    if op.bool("bound", False):
        if floating and math.isnan(float(value)):
            return 0
        if value <= -bound_value:
            return INT64_MIN
        if value >= bound_value:
            return INT64_MAX
    else:
        if floating and math.isnan(float(value)):
            raise BadArgumentError(f"{op.where}: Input value cannot be NaN! (stat {name})")
        if not abs(int(value) if not floating or math.isfinite(float(value)) else INT64_MAX) < bound_value:
            raise BadArgumentError(f"{op.where}: Input value is too large for the given magnitude expansion! ({name})")
    if floating and not math.isfinite(scaled):
        return INT64_MIN
    return max(INT64_MIN, min(INT64_MAX, int(scaled)))


def _put(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    value = _put_value(op, _array(workspace, op, op.inputs[0]))
    name = _stat_name(op) + "/stat_value"
    if op.type == "IncrementPut":
        GLOBAL_REGISTRY.increment(name, value)
        return
    GLOBAL_REGISTRY.increment(name + "/count", 1)
    if op.type == "StdDevPut":
        first = state.setdefault("first", value)  # the op's offset: the first value it put
        offset = value - first
        GLOBAL_REGISTRY.increment(name + "/sumsqoffset", offset * offset)
        GLOBAL_REGISTRY.increment(name + "/sumoffset", offset)
    GLOBAL_REGISTRY.increment(name + "/sum", value)


for _type in _PUT_KEYS:
    host_op(_type, check=_check_put)(_put)


# --------------------------------------------------------------------------------------------------
# Timers


@dataclass
class Timer:
    """Caffe2's TimerInstance: a running flag and the start, adding each interval to `<name>/time_ns`."""

    name: str
    running: bool = False
    start: int = 0

    def elapsed(self, op: Op, what: str) -> int:
        if not self.running:
            raise BadArgumentError(f"{op.where}: Called {what} on a stopped timer ('{self.name}')")
        return time.perf_counter_ns() - self.start

    def __repr__(self) -> str:
        return f"Timer({self.name!r}, {'running' if self.running else 'stopped'})"


def _timer_name(op: Op) -> str:
    return op.str("counter_name", op.outputs[0] if op.outputs else "")


def _check_timer_begin(op: Op) -> None:
    _counts(op, (0, 0), (1, 1))
    for suffix in ("/time_ns/sum", "/time_ns/count"):
        GLOBAL_REGISTRY.add(_timer_name(op) + suffix)


@host_op("TimerBegin", check=_check_timer_begin)
def timer_begin(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Start the op's timer (the same one each run, as Caffe2's op owns it) and put it in the output."""
    timer = state.setdefault("timer", Timer(_timer_name(op)))
    timer.running, timer.start = True, time.perf_counter_ns()
    workspace.put(op.outputs[0], timer)


def _timer(workspace: HostWorkspace, op: Op) -> Timer:
    timer = workspace.get(op.inputs[0], op)
    if not isinstance(timer, Timer):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[0]}' holds a {type(timer).__name__}, not a timer (make one with TimerBegin)"
        )
    return timer


def _end(op: Op, timer: Timer, what: str) -> int:
    elapsed = timer.elapsed(op, what)
    timer.running = False
    GLOBAL_REGISTRY.increment(timer.name + "/time_ns/count", 1)
    GLOBAL_REGISTRY.increment(timer.name + "/time_ns/sum", elapsed)
    return elapsed


@host_op("TimerEnd", check=lambda op: _counts(op, (1, 1), (0, 0)))
def timer_end(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Stop the timer, adding the interval to its counter."""
    _end(op, _timer(workspace, op), "TimerEnd")


@host_op("TimerGet", check=lambda op: _counts(op, (1, 1), (1, 1)))
def timer_get(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Nanoseconds since the running timer began (int64, 0-d)."""
    workspace.put(op.outputs[0], np.array(_timer(workspace, op).elapsed(op, "TimerGet"), np.int64))


@host_op("TimerGetAndEnd", check=lambda op: _counts(op, (1, 1), (1, 1)))
def timer_get_and_end(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """TimerGet, then TimerEnd; the nanoseconds as an int64 [1] (TimerGet's are 0-d)."""
    workspace.put(op.outputs[0], np.array([_end(op, _timer(workspace, op), "TimerGet")], np.int64))


@host_op("WallClockTime", check=lambda op: _counts(op, (0, 0), (1, 1)))
def wall_clock_time(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Nanoseconds since the epoch (int64, 0-d)."""
    workspace.put(op.outputs[0], np.array(time.time_ns(), np.int64))
