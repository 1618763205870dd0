"""Caffe2's counters and atomics (`caffe2/operators/counter_ops.h`, `atomic_ops.cc`): CreateCounter, CountUp,
CountDown, ResetCounter, RetrieveCount, CheckCounterDone, CreateAtomicBool, ConditionalSetAtomicBool and
CheckAtomicBool are host ops, since their blob is a mutable object that several nets share; AtomicFetchAdd and
AtomicFetchAdd64 are pure (the mutex only serialised Caffe2's threads, and CreateMutex makes a placeholder),
so they lower like any op.

The counter is Caffe2's `Counter<int64_t>`: CountUp answers the count before it adds one, CountDown whether the
count was already at most 0 before it takes one off, and every answer is a 0-d tensor (int64 or bool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from ..proto import caffe2_pb2 as pb
from .facets import (
    HOST_OP_NO_EMITTER,
    HOST_OP_NO_SHAPE_RULE,
    NO_EMITTER,
    NO_GRADIENT,
    NO_ROLES,
    NO_SHAPE_RULE,
    Absent,
)
from .gradient_makers import should_not_do_gradient
from .registry import HostWorkspace, Kernel, declare_family, host_op, register

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=Absent("a host op: Caffe2 says SHOULD_NOT_DO_GRADIENT (or registers none); the builder has no maker"),
    emitter=HOST_OP_NO_EMITTER,
)


# --------------------------------------------------------------------------------------------------
# Counters


@dataclass
class Counter:
    """Caffe2's Counter<int64_t>."""

    count: int

    def __repr__(self) -> str:
        return f"Counter({self.count})"


def _counts(op: Op, inputs: int, outputs: tuple[int, int]) -> None:
    if len(op.inputs) != inputs or not outputs[0] <= len(op.outputs) <= outputs[1]:
        many = str(outputs[0]) if outputs[0] == outputs[1] else f"{outputs[0]} or {outputs[1]}"
        raise BadArgumentError(f"{op.where}: {op.type} takes {inputs} input(s) and {many} output(s)")


def _init_count(op: Op) -> int:
    init = op.int("init_count", 0)
    if init < 0:
        raise BadArgumentError(f"{op.where}: init_count {init}: negative init_count is not permitted")
    return init


def _check_create_counter(op: Op) -> None:
    _counts(op, 0, (1, 1))
    _init_count(op)


@host_op("CreateCounter", check=_check_create_counter)
def create_counter(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A counter at init_count (default 0)."""
    workspace.put(op.outputs[0], Counter(_init_count(op)))


def _counter(workspace: HostWorkspace, op: Op) -> Counter:
    counter = workspace.get(op.inputs[0], op)
    if not isinstance(counter, Counter):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[0]}' holds a {type(counter).__name__}, not a counter (make one with "
            "CreateCounter)"
        )
    return counter


def _check_reset_counter(op: Op) -> None:
    _counts(op, 1, (0, 1))
    _init_count(op)


@host_op("ResetCounter", check=_check_reset_counter)
def reset_counter(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Set the count to init_count; the optional output gets the previous count (int64)."""
    counter = _counter(workspace, op)
    previous, counter.count = counter.count, _init_count(op)
    if op.outputs:
        workspace.put(op.outputs[0], np.array(previous, np.int64))


def _check_one_to_one(op: Op) -> None:
    _counts(op, 1, (1, 1))


@host_op("CountDown", check=_check_one_to_one)
def count_down(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Take one off; answer (bool) whether the count was already at most 0."""
    counter = _counter(workspace, op)
    done = counter.count <= 0
    counter.count -= 1
    workspace.put(op.outputs[0], np.array(done))


@host_op("CheckCounterDone", check=_check_one_to_one)
def check_counter_done(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Whether the count is at most 0 (bool)."""
    workspace.put(op.outputs[0], np.array(_counter(workspace, op).count <= 0))


@host_op("CountUp", check=_check_one_to_one)
def count_up(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Add one; answer the count before (int64)."""
    counter = _counter(workspace, op)
    workspace.put(op.outputs[0], np.array(counter.count, np.int64))
    counter.count += 1


@host_op("RetrieveCount", check=_check_one_to_one)
def retrieve_count(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The count (int64)."""
    workspace.put(op.outputs[0], np.array(_counter(workspace, op).count, np.int64))


# --------------------------------------------------------------------------------------------------
# Atomic bool


@dataclass
class AtomicBool:
    """Caffe2's std::atomic<bool>, false when made."""

    value: bool = False

    def __repr__(self) -> str:
        return f"AtomicBool({self.value})"


def _atomic_bool(workspace: HostWorkspace, op: Op) -> AtomicBool:
    flag = workspace.get(op.inputs[0], op)
    if not isinstance(flag, AtomicBool):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[0]}' holds a {type(flag).__name__}, not an atomic bool (make one with "
            "CreateAtomicBool)"
        )
    return flag


@host_op("CreateAtomicBool", check=lambda op: _counts(op, 0, (1, 1)))
def create_atomic_bool(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    workspace.put(op.outputs[0], AtomicBool())


@host_op("ConditionalSetAtomicBool", check=lambda op: _counts(op, 2, (0, 0)))
def conditional_set_atomic_bool(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Set the atomic bool to true when the condition's first element (a bool tensor) is true."""
    flag = _atomic_bool(workspace, op)
    condition = workspace.get(op.inputs[1], op)
    array = np.asarray(condition) if hasattr(condition, "dtype") else None
    if array is None or array.dtype != np.bool_:
        kind = str(array.dtype) if array is not None else type(condition).__name__
        raise InputTypeError(f"{op.where}: the condition '{op.inputs[1]}' must be a bool tensor, got {kind}")
    if array.size == 0:
        raise ShapeError(f"{op.where}: the condition '{op.inputs[1]}' is empty; it needs one element")
    if array.reshape(-1)[0]:
        flag.value = True


@host_op("CheckAtomicBool", check=_check_one_to_one)
def check_atomic_bool(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The atomic bool's value as a bool [1]."""
    workspace.put(op.outputs[0], np.array([_atomic_bool(workspace, op).value]))


# --------------------------------------------------------------------------------------------------
# AtomicFetchAdd: pure


def _fetch_add(dtype: Any) -> Any:
    def build(op: Op) -> Kernel:
        """(mutex, a, b) -> (a + b, a), both 0-d, from the first element of each; usually in place on a."""

        def kernel(mutex: Any, a: Any, b: Any) -> tuple[Any, Any]:
            for name, value in zip(op.inputs[1:], (a, b), strict=True):
                if value.dtype != dtype:
                    raise InputTypeError(
                        f"{op.where}: blob '{name}' is {value.dtype}; {op.type} adds {np.dtype(dtype).name} tensors"
                    )
                if value.size == 0:
                    raise ShapeError(f"{op.where}: blob '{name}' is empty; {op.type} reads its first element")
            first, second = a.reshape(-1)[0], b.reshape(-1)[0]
            return first + second, first

        return kernel

    return build


_LOWERED = {"shape_rule": NO_SHAPE_RULE, "emitter": NO_EMITTER}
register("AtomicFetchAdd", inputs=3, outputs=2, gradient=should_not_do_gradient, **_LOWERED)(_fetch_add(jnp.int32))
register("AtomicFetchAdd64", inputs=3, outputs=2, gradient=NO_GRADIENT, **_LOWERED)(_fetch_add(jnp.int64))


# --------------------------------------------------------------------------------------------------
# Saving and loading a counter (Caffe2's CounterSerializer; ops/storage.py registers these)

COUNTER_TYPE = "std::unique_ptr<Counter<int64_t>>"


def serialize_counter(name: str, counter: Counter) -> pb.BlobProto:
    """The count as an int64 [1] tensor."""
    proto = pb.BlobProto(name=name, type=COUNTER_TYPE)
    proto.tensor.dims.append(1)
    proto.tensor.data_type = pb.TensorProto.INT64
    proto.tensor.name = name
    proto.tensor.int64_data.append(counter.count)
    return proto


def deserialize_counter(proto: pb.BlobProto) -> Counter:
    if len(proto.tensor.int64_data) != 1:
        raise ValueError("is a counter blob without its one int64 count")
    return Counter(int(proto.tensor.int64_data[0]))
