"""Caffe2's `utils`: argument encoding and the small helpers scripts use."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable
from typing import Any

from ..opdef import make_argument, make_tensor
from ..proto import caffe2_pb2

MakeArgument = make_argument
OPTIMIZER_ITERATION_NAME = "optimizer_iteration"
ITERATION_MUTEX_NAME = "iteration_mutex"


def NumpyArrayToCaffe2Tensor(arr: Any, name: str | None = None) -> caffe2_pb2.TensorProto:
    return make_tensor(arr, name or "")


def Caffe2TensorToNumpyArray(tensor: caffe2_pb2.TensorProto) -> Any:
    from ...ir.netdef import decode_tensor

    return decode_tensor(tensor, f"tensor '{tensor.name}'").array.copy()


def debug(f: Callable) -> Callable:
    """Caffe2 opened pdb on an exception; here the exception propagates unchanged (a pass-through, so
    scripts wrapped in it behave under pytest and in batch jobs)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return f(*args, **kwargs)

    return wrapper


class DebugMode:
    """`with DebugMode(): ...` or `DebugMode.run(f)`: Caffe2's post-mortem debugging, a pass-through here."""

    @classmethod
    def run(cls, func: Callable) -> Any:
        return func()

    def __enter__(self) -> DebugMode:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def BuildUniqueMutexIter(init_net: Any, net: Any, iter: Any = None, iter_mutex: Any = None, iter_val: int = 0) -> Any:
    """The iteration counter optimizers share: a mutex and an int64 counter in `init_net` (created once),
    incremented by AtomicIter in `net`."""
    from . import core

    iter = iter if iter is not None else "optimizer_iteration"
    iter_mutex = iter_mutex if iter_mutex is not None else "iteration_mutex"
    if not init_net.BlobIsDefined(iter):
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, extra_info=["device_type_override:cpu"])):
            iteration = init_net.ConstantFill([], iter, shape=[1], value=iter_val, dtype=core.DataType.INT64)
            iter_mutex = init_net.CreateMutex([], [iter_mutex])
            net.AtomicIter([iter_mutex, iteration], [iteration])
    else:
        iteration = init_net.GetBlobRef(iter)
    return iteration


def iterator_ndarray_view(row: Any) -> Any:
    return row


def OpAlmostEqual(op_a: caffe2_pb2.OperatorDef, op_b: caffe2_pb2.OperatorDef, ignore_fields: Any = None) -> bool:
    """Whether two ops are the same but for the fields `ignore_fields` (a name or a list of names): layers use it
    to tell an init op they already added."""
    fields = ignore_fields or []
    fields = fields if isinstance(fields, list) else [fields]
    if not all(isinstance(f, str) for f in fields):
        raise AssertionError(f"Expect each field is text type, but got {fields}")

    def cleaned(op: caffe2_pb2.OperatorDef) -> caffe2_pb2.OperatorDef:
        op = copy.deepcopy(op)
        for field in fields:
            if op.HasField(field):
                op.ClearField(field)
        return op

    a, b = cleaned(op_a), cleaned(op_b)
    return a == b or str(a) == str(b)


def EnumClassKeyVals(cls: type) -> dict[str, str]:
    """The upper-case attributes of `cls` whose values are strings (a class used as an enum), by name."""
    if type(cls) is not type:
        raise AssertionError(f"{cls} is not a class")
    enum: dict[str, str] = {}
    for key in dir(cls):
        value = getattr(cls, key)
        if key == key.upper() and isinstance(value, str):
            if value in enum.values():
                raise AssertionError(f"Failed to resolve {cls} as Enum: duplicate entries {key}={value}")
            enum[key] = value
    return enum


def ArgsToDict(args: Iterable[caffe2_pb2.Argument]) -> dict[str, Any]:
    """Named arguments as {name: value} (the field that is set; None when none is); unnamed ones are skipped."""
    result: dict[str, Any] = {}
    for arg in args:
        if not arg.HasField("name"):
            continue
        result[arg.name] = None
        for field in arg.DESCRIPTOR.fields:
            if field.name == "name":
                continue
            # newer protobufs drop `label` (the GPU machine's had none); is_repeated replaces it
            repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
            if (not repeated and arg.HasField(field.name)) or (repeated and len(getattr(arg, field.name)) > 0):
                result[arg.name] = getattr(arg, field.name)
                break
    return result


def NHWC2NCHW(tensor: Any) -> Any:
    return tensor.transpose((0, tensor.ndim - 1, *range(1, tensor.ndim - 1)))


def NCHW2NHWC(tensor: Any) -> Any:
    return tensor.transpose((0, *range(2, tensor.ndim), 1))


def ResetBlobs(blobs: Iterable[Any]) -> None:
    """Free the blobs' contents (Caffe2's Free op on CPU): data_workers releases its scratch blobs so."""
    from . import core, workspace

    workspace.RunOperatorOnce(
        core.CreateOperator("Free", list(blobs), list(blobs), device_option=core.DeviceOption(caffe2_pb2.CPU))
    )
