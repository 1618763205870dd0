"""Caffe2's `utils`: argument encoding and the small helpers scripts use."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..opdef import make_argument, make_tensor
from ..proto import caffe2_pb2

MakeArgument = make_argument


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
