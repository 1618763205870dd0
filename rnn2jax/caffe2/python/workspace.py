"""Caffe2's `workspace` module: named workspaces, the current one, and functions that run in it.

Each workspace is an `rnn2jax.runtime.Workspace`; all of them share one compile cache, so an op or net
is compiled once per (definition, input shapes and dtypes) however many times it is run, in whichever
workspace: Caffe2's gradient checker runs the same op thousands of times.

As in Caffe2, `FeedBlob` copies what it is given and `FetchBlob` returns a writable NumPy copy; string
tensors are object arrays of `bytes`. Errors are rnn2jax errors that are also `RuntimeError`s, the
type Caffe2's C++ errors had in Python.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import secrets
import shutil
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ...errors import BadArgumentError, InputTypeError, OpFailedError, Rnn2JaxError, WorkspaceError
from ...ir.int8 import Int8Tensor as _Int8Value
from ...ir.netdef import DATA_TYPES
from ...ir.wire import parse_binary
from ...runtime.workspace import CompileCache
from ...runtime.workspace import Workspace as _RuntimeWorkspace
from ...storage.serialization import BlobAssembler
from ...storage.serialization import serialize_blob as _serialize_blob
from ..proto import caffe2_pb2

# imported for their host ops: the Python op, and RecurrentNetworkBlobFetcher
from . import _flags, _step_blobs, _torch_interop, _transforms, python_op, scope  # noqa: F401
from ._schema_inference import REPORTED_ONLY, SCHEMA_INFERENCE, schema_answers
from .lazy import TriggerLazyImport

_cache = CompileCache()


def _new_workspace(**options: Any) -> _RuntimeWorkspace:
    """A workspace of this API. Its random ops draw from a seed of their own, as Caffe2 seeds an op's
    generator without `random_seed` from the clock (RandomNumberSeed): fresh workspaces draw different
    values; an op's device_option.random_seed makes them repeat. The seed is an argument of the compiled
    code, so workspaces share it."""
    return _RuntimeWorkspace(cache=_cache, seed=secrets.randbits(31), **options)


_workspaces: dict[str, _RuntimeWorkspace] = {"default": _new_workspace()}
_current = "default"
# a `C.Workspace` object switched to (`SwitchWorkspace(ws)`): current until a switch by name; the name stays
_current_object: _RuntimeWorkspace | None = None
# net name -> op index -> the Python stack (file, line, function) that created the op, as Caffe2 records it
operator_tracebacks: collections.defaultdict[str, dict[int, list[tuple[str, int, str]]]] = collections.defaultdict(dict)
_run_limits: dict[str, int] = {}
_run_counts: dict[str, int] = {}


def _gpu_count() -> int:
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


def __getattr__(name: str) -> Any:
    """`has_cuda_support` and `has_gpu_support`, computed when first read rather than at import: asking JAX
    for its GPUs starts its backend, after which a script training across hosts could no longer start JAX's
    multi-process runtime (`data_parallel_model.Parallelize` with a rendezvous does, before anything runs)."""
    if name in ("has_cuda_support", "has_gpu_support"):
        value = _gpu_count() > 0
        globals().update(has_cuda_support=value, has_gpu_support=value)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "has_cuda_support", "has_gpu_support"})


has_hip_support = False
has_fbgemm = True  # what Caffe2's x86 wheel reports; rnn2jax writes bfloat16 as its fbgemm build does
is_asan = False
GpuDeviceType = caffe2_pb2.CUDA


def GetCUDAVersion() -> int:
    """0, as Caffe2's CPU build reports: rnn2jax runs GPUs through XLA, never through CUDA's runtime itself."""
    return 0


def GetCuDNNVersion() -> int:
    """0, as Caffe2's CPU build reports (rnn2jax never calls cuDNN)."""
    return 0


def NumCudaDevices() -> int:
    return _gpu_count()


NumGpuDevices = NumCudaDevices


def NumHipDevices() -> int:
    return 0


# Immediate mode (Caffe2's debugging aid): every op created runs at once in a workspace of its own, whose root
# folder is a temporary directory removed when the mode stops.
_immediate_mode = False
_immediate_workspace_name = "_CAFFE2_IMMEDIATE"
_immediate_root_folder = ""


def IsImmediate() -> bool:
    return _immediate_mode


def StartImmediate(i_know: bool = False) -> None:
    """Start immediate mode afresh (stopping a running one). Caffe2 printed a long warning unless `i_know`;
    rnn2jax warns in one line."""
    global _immediate_mode, _immediate_root_folder
    if IsImmediate():
        StopImmediate()
    _immediate_mode = True
    with WorkspaceGuard(_immediate_workspace_name):
        _immediate_root_folder = tempfile.mkdtemp()
        ResetWorkspace(_immediate_root_folder)
    if not i_know:
        warnings.warn("Caffe2's immediate mode is for debugging: every op created runs at once", stacklevel=2)


def StopImmediate() -> None:
    """Leave immediate mode: its workspace is emptied and its root folder removed."""
    global _immediate_mode, _immediate_root_folder
    if not IsImmediate():
        return
    with WorkspaceGuard(_immediate_workspace_name):
        ResetWorkspace()
    shutil.rmtree(_immediate_root_folder)
    _immediate_root_folder = ""
    _immediate_mode = False


def ImmediateBlobs() -> list[str]:
    with WorkspaceGuard(_immediate_workspace_name):
        return Blobs()


def RunOperatorImmediate(op: Any) -> None:
    with WorkspaceGuard(_immediate_workspace_name):
        RunOperatorOnce(op)


def FetchImmediate(*args: Any, **kwargs: Any) -> Any:
    with WorkspaceGuard(_immediate_workspace_name):
        return FetchBlob(*args, **kwargs)


def FeedImmediate(*args: Any, **kwargs: Any) -> bool:
    with WorkspaceGuard(_immediate_workspace_name):
        return FeedBlob(*args, **kwargs)


# ------------------------------------------------------------------------------------------------
# Errors


_RUNTIME_FLAVOURS: dict[type, type] = {}


ENFORCE_FAIL = "[enforce fail at rnn2jax] "


def _enforce_str(self: Rnn2JaxError) -> str:
    return ENFORCE_FAIL + super(type(self), self).__str__()


def _as_runtime_error(error: Rnn2JaxError) -> Rnn2JaxError:
    """The same error as a subclass that is also a RuntimeError (Caffe2 scripts catch that), its message
    opening as Caffe2's C++ refusals do (CAFFE_ENFORCE's "[enforce fail at FILE:LINE] ..."), which scripts
    and tests look for, whatever kind of net ran the op."""
    cls = type(error)
    if isinstance(error, RuntimeError):
        return error
    flavour = _RUNTIME_FLAVOURS.get(cls)
    if flavour is None:
        flavour = _RUNTIME_FLAVOURS[cls] = type(
            cls.__name__, (cls, RuntimeError), {"__module__": cls.__module__, "__str__": _enforce_str}
        )
    new = flavour.__new__(flavour)
    new.__dict__.update(error.__dict__)
    new.args = error.args
    return new


@contextlib.contextmanager
def _caffe2_errors() -> Iterator[None]:
    """Around a call into Caffe2's C++ side: its errors as Caffe2 raises them. Caffe2 runs ops with the GIL
    released, so other Python threads go on meanwhile; rnn2jax's ops run in Python, so a call first gives the
    other threads a turn (a worker enqueuing in a loop lets the thread that will stop it run, as in Caffe2)."""
    if threading.active_count() > 1:
        time.sleep(0)
    shared = _torch_interop.active()  # blobs sharing a torch.Tensor: view it as it is now, copy new values back
    try:
        if shared:
            _torch_interop.refresh()
        yield
        if shared:
            _torch_interop.write_back()
    except Rnn2JaxError as error:
        raise _as_runtime_error(error) from error.__cause__
    except FloatingPointError as error:  # JAX's NaN/inf checks, on with Caffe2's floating-point exception flags
        message = _flags.fp_exception_error(error)
        if message is None:
            raise
        raise _as_runtime_error(Rnn2JaxError(message)) from error


# ------------------------------------------------------------------------------------------------
# Names and protos


def StringifyBlobName(name: Any) -> str:
    if isinstance(name, bytes):
        return name.decode("utf-8")
    if isinstance(name, str):
        return str(name)
    raise InputTypeError(f"a blob name must be a str or bytes, got a {type(name).__name__}")


def StringifyNetName(name: Any) -> str:
    return GetNetName(name)


def GetNetName(net: Any) -> str:
    if isinstance(net, bytes):
        return net.decode("utf-8")
    if isinstance(net, str):
        return str(net)
    if isinstance(net, caffe2_pb2.NetDef):
        return net.name
    if hasattr(net, "Name"):
        return net.Name()
    raise InputTypeError(f"not a net or a net name: {type(net).__name__}")


def StringifyProto(obj: Any) -> bytes:
    """A proto (or anything with `.Proto()`) as bytes; bytes and text pass through."""
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if hasattr(obj, "Proto"):
        obj = obj.Proto()
    return obj.SerializeToString()


def _proto(obj: Any) -> Any:
    """A NetDef/PlanDef message from a core.Net, a message or bytes (what the runtime loads)."""
    if hasattr(obj, "Proto"):
        return obj.Proto()
    return obj


# ------------------------------------------------------------------------------------------------
# Workspaces


def _ws() -> _RuntimeWorkspace:
    return _current_object if _current_object is not None else _workspaces[_current]


def CurrentWorkspace() -> str:
    return _current


def Workspaces() -> list[str]:
    return list(_workspaces)


def SwitchWorkspace(name: str | bytes | _CWorkspace, create_if_missing: bool = False) -> None:
    """Make workspace `name` current (creating it with `create_if_missing`), or a `C.Workspace` object (which
    has no name: `CurrentWorkspace()` keeps the last one's, as in Caffe2)."""
    global _current, _current_object
    if isinstance(name, _CWorkspace):
        _current_object = name._ws
        return
    _current_object = None
    name = name.decode("utf-8") if isinstance(name, bytes) else str(name)
    if name not in _workspaces:
        if not create_if_missing:
            raise _as_runtime_error(WorkspaceError(f"Workspace {name} does not exist"))
        _workspaces[name] = _new_workspace()
    _current = name


@contextlib.contextmanager
def WorkspaceGuard(workspace_name: str | bytes) -> Iterator[None]:
    """Run the block in workspace `workspace_name` (created if missing), then return to the current one."""
    global _current_object
    current, current_object = CurrentWorkspace(), _current_object
    SwitchWorkspace(workspace_name, True)
    try:
        yield
    finally:
        SwitchWorkspace(current)
        _current_object = current_object


def ResetWorkspace(root_folder: str | None = None) -> bool:
    """Empty the current workspace: its blobs and nets go; compiled code stays cached."""
    global _current_object
    _current_object = None  # as Caffe2: the named workspace is reset and current again
    _workspaces[_current] = _new_workspace(db_root=root_folder)
    return True


def RootFolder() -> str:
    """Where the current workspace's ops resolve relative paths: the folder `ResetWorkspace` was given, else
    "." (Caffe2's default)."""
    return _ws().db_root or "."


def GlobalInit(args: Sequence[str]) -> None:
    """Caffe2's `C.global_init`: parse Caffe2's command-line flags (`args[0]` is the program). Flags that
    only tune what rnn2jax has no counterpart of are accepted; one rnn2jax cannot honour, or an unknown
    one, is an error naming it (`_flags` lists them)."""
    with _caffe2_errors():
        _flags.global_init(args)


# ------------------------------------------------------------------------------------------------
# Blobs


def FeedBlob(name: Any, arr: Any, device_option: caffe2_pb2.DeviceOption | None = None) -> bool:
    """Put a copy of `arr` in blob `name` (a TensorProto is decoded; strings become bytes)."""
    name = StringifyBlobName(name)
    if _torch_interop.is_torch_tensor(arr):  # the blob and the tensor become one, as in Caffe2
        with _caffe2_errors():
            _torch_interop.feed(_ws(), name, arr)
        return True
    if isinstance(arr, caffe2_pb2.TensorProto):
        from ...ir.netdef import decode_tensor

        with _caffe2_errors():
            arr = decode_tensor(arr, f"FeedBlob('{name}')").array
    elif isinstance(arr, str | bytes):
        _ws().put(name, arr.encode("utf-8") if isinstance(arr, str) else bytes(arr))
        return True
    elif not isinstance(arr, jax.Array):
        arr = np.array(arr, copy=True)
    with _caffe2_errors():
        _ws().feed(name, arr)
    return True


def FetchTorch(name: Any) -> Any:
    """Blob `name` as a CPU torch.Tensor sharing its memory: writes and resizes of either show in the other
    (needs rnn2jax's `torch` extra)."""
    return _CWorkspace.current.blobs[StringifyBlobName(name)].to_torch()


def FetchBlob(name: Any) -> Any:
    """A writable NumPy copy of blob `name` (bytes for a string blob)."""
    with _caffe2_errors():
        value = _ws().fetch(StringifyBlobName(name))
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True)
    if isinstance(value, _Int8Value):
        raise TypeError(f"Use FetchInt8Blob to fetch Int8 Blob {StringifyBlobName(name)}")
    return value


Int8Tensor = collections.namedtuple("Int8Tensor", ["data", "scale", "zero_point"])


def _fetch_int8(name: Any) -> Int8Tensor:
    with _caffe2_errors():
        value = _ws().fetch(StringifyBlobName(name))
    if not isinstance(value, _Int8Value):
        raise AssertionError(f"You are not fetching an Int8Blob {StringifyBlobName(name)}. Please use FetchBlob")
    return Int8Tensor(np.array(value.data, copy=True), value.scale, value.zero_point)


def FetchInt8Blob(name: Any) -> Int8Tensor:
    """An Int8 blob (Int8TensorCPU) as Caffe2's namedtuple `Int8Tensor(data, scale, zero_point)`."""
    return _fetch_int8(name)


def FetchInt8BlobRealVal(name: Any) -> np.ndarray:
    """An Int8 blob's real values, `(data - zero_point) * scale` as float32."""
    blob = _fetch_int8(name)
    return (blob.data.astype(np.int32) - int(blob.zero_point)).astype(np.float32) * blob.scale


def GetBlobSizeBytes(name: Any) -> int:
    """Caffe2's BlobStat size of blob `name`: a tensor's element bytes (a string tensor counts 8 bytes per
    element plus its strings' lengths), 0 for a blob that is not a tensor."""
    with _caffe2_errors():
        value = _ws().fetch(StringifyBlobName(name))
    if not isinstance(value, np.ndarray):
        return 0
    if value.dtype.kind in "OSU":
        return 8 * value.size + sum(len(item) for item in value.reshape(-1))
    return int(value.nbytes)


def SerializeBlob(name: Any) -> bytes:
    """Blob `name` as one BlobProto named after it (no chunks): Caffe2's C.serialize_blob."""
    blob_name = StringifyBlobName(name)
    return _Blob(_ws(), blob_name).serialize(blob_name)


def DeserializeBlob(name: Any, serialized: bytes) -> None:
    """Create blob `name` (or replace its value) from a serialized BlobProto: Caffe2's C.deserialize_blob."""
    _Blob(_ws(), StringifyBlobName(name)).deserialize(serialized)


def FetchBlobs(names: Iterable[Any]) -> list[Any]:
    return [FetchBlob(name) for name in names]


def FeedBlobs(blobs: Mapping[Any, Any]) -> bool:
    for name, value in blobs.items():
        FeedBlob(name, value)
    return True


def CreateBlob(name: Any) -> bool:
    """An empty blob: it exists (a net reading it can be created) but holds nothing yet."""
    _ws()._declare([StringifyBlobName(name)])
    return True


def _blob_names(ws: _RuntimeWorkspace) -> list[str]:
    """As in Caffe2, blobs made by CreateBlob or CreateNet count before anything writes them."""
    return sorted(set(ws.blobs()) | ws._created)


def _fresh_workspace() -> _RuntimeWorkspace:
    """A new workspace outside the named ones (Caffe2's ApplyTransformIfFaster times nets in such)."""
    return _new_workspace()


def ApplyTransform(transform_key: Any, net: caffe2_pb2.NetDef) -> caffe2_pb2.NetDef:
    """The NetDef transform `transform_key` of Caffe2's registry makes of `net` (ConvToNNPack,
    CommonSubexpressionElimination)."""
    with _caffe2_errors():
        return _transforms.apply_transform(str(transform_key), _proto(net))


def ApplyTransformIfFaster(
    transform_key: Any, net: caffe2_pb2.NetDef, init_net: caffe2_pb2.NetDef, **kwargs: Any
) -> caffe2_pb2.NetDef:
    """`ApplyTransform`'s net if it runs `improvement_threshold` (1.01) times faster than `net` over `main_runs`
    (10) runs after `warmup_runs` (5), each net in a fresh workspace that `init_net` sets up; else `net`."""
    with _caffe2_errors():
        return _transforms.apply_transform_if_faster(
            str(transform_key),
            _proto(net),
            _proto(init_net),
            int(kwargs.get("warmup_runs", 5)),
            int(kwargs.get("main_runs", 10)),
            float(kwargs.get("improvement_threshold", 1.01)),
            _fresh_workspace,
        )


def GetNameScope() -> str:
    """The current name scope (`core.NameScope`), with its trailing separator: a prefix for fetching blobs."""
    return scope.CurrentNameScope()


def Blobs() -> list[str]:
    return _blob_names(_ws())


def HasBlob(name: Any) -> bool:
    return _ws()._exists(StringifyBlobName(name))


def ResetBlob(name: Any) -> bool:
    ws = _ws()
    name = StringifyBlobName(name)
    ws._values.pop(name, None)
    ws._declare([name])
    return True


class _BlobDict:
    """`workspace.blobs`: the current workspace's blobs as a mapping."""

    def __getitem__(self, key: Any) -> Any:
        return FetchBlob(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        FeedBlob(key, value)

    def __len__(self) -> int:
        return len(Blobs())

    def __iter__(self) -> Iterator[str]:
        return iter(Blobs())

    def __contains__(self, item: Any) -> bool:
        return HasBlob(item)

    def keys(self) -> list[str]:
        return Blobs()


blobs = _BlobDict()


# ------------------------------------------------------------------------------------------------
# Running ops, nets and plans


def _op_net(operators: Sequence[caffe2_pb2.OperatorDef]) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef(name=operators[0].type if len(operators) == 1 else "operators")
    net.op.extend(operators)
    return net


def _operator(op: Any) -> caffe2_pb2.OperatorDef:
    if isinstance(op, bytes):
        with _caffe2_errors():
            return parse_binary(op, caffe2_pb2.OperatorDef, "RunOperatorOnce")
    if not isinstance(op, caffe2_pb2.OperatorDef):
        raise InputTypeError(f"not an OperatorDef: {type(op).__name__}")
    return op


def FillRandomNetworkInputs(
    net: Any, input_dims: Sequence[Sequence[Sequence[int]]], input_types: Sequence[Sequence[str]]
) -> None:
    """Feed random data to every blob `net` reads before writing it (Caffe2's TestDataRandomFiller): per op
    that reads such blobs, in order, their shapes and type names ("float", "int64_t", ...)."""
    from ._fillers import random_inputs

    with _caffe2_errors():
        values = random_inputs(_proto(net), input_dims, input_types, lambda t: _OpSchema.get(t) is not None)
        for name, value in values.items():
            _ws().feed(name, value)


def GetOperatorCost(operator: Any, blobs: Sequence[Any]) -> tuple[int, int, int]:
    """Caffe2's cost inference for one op, from the shapes and dtypes of `blobs` (its inputs, in the
    current workspace): (flops, bytes_written, bytes_read), as Caffe2's op schema computes them."""
    from ._cost import operator_cost

    op = _operator(operator)
    with _caffe2_errors():
        if _OpSchema.get(op.type) is None:
            raise BadArgumentError(f"GetOperatorCost: no schema for op type {op.type}")
        shapes = []
        for name in blobs:
            value = np.asarray(_ws().fetch(StringifyBlobName(name)))
            shapes.append((tuple(value.shape), value.dtype))
        return tuple(operator_cost(op, shapes))


def RunOperatorOnce(operator: Any) -> bool:
    """Run one op in the current workspace (compiled once per op and input signature)."""
    with _caffe2_errors():
        _ws().run(_op_net([_operator(operator)]))
    return True


def RunOperatorsOnce(operators: Iterable[Any]) -> bool:
    """Run ops one after the other (as one compiled net)."""
    ops = [_operator(op) for op in operators]
    if ops:
        with _caffe2_errors():
            _ws().run(_op_net(ops))
    return True


def RunOperatorMultiple(operator: Any, num_runs: int) -> bool:
    for _ in range(num_runs):
        RunOperatorOnce(operator)
    return True


def RunNetOnce(net: Any) -> bool:
    with _caffe2_errors():
        _ws().run(_proto(net))
    return True


def CreateNet(net: Any, overwrite: bool = False, input_blobs: Iterable[Any] | None = None) -> bool:
    """Create a net in the current workspace; the blobs it reads must exist (or be in `input_blobs`). Lazy
    op-library imports run first, as in Caffe2."""
    TriggerLazyImport()
    for name in input_blobs or ():
        CreateBlob(name)
    with _caffe2_errors():
        name = _ws().create_net(_proto(net), overwrite=overwrite)
    _observers.get(_ws(), {}).pop(name, None)  # a new net: its predecessor's observers go with it
    return True


def RunNet(name: Any, num_iter: int = 1, allow_fail: bool = False) -> bool:
    """Run a created net `num_iter` times; its inputs may change shape between runs."""
    name = GetNetName(name)
    if name in _run_limits:
        done = _run_counts.get(name, 0)
        if done + num_iter > _run_limits[name]:
            raise RunLimitReached(name, _run_limits[name])
        _run_counts[name] = done + num_iter
    try:
        with _caffe2_errors():
            _run_observed(_ws(), name, num_iter)
    except OpFailedError:  # an op returned false; an exception is raised whatever allow_fail says, as in Caffe2
        if allow_fail:
            return False
        raise
    return True


def RunPlan(plan_or_step: Any) -> bool:
    from .core import ExecutionStep, Plan

    if isinstance(plan_or_step, ExecutionStep):
        plan_or_step = Plan(plan_or_step)
    with _caffe2_errors():
        _ws().run_plan(_proto(plan_or_step))
    return True


class _BackgroundPlan:
    """C++ BackgroundPlan: a plan running on a thread of its own, in the workspace current when it started."""

    def __init__(self, ws: _RuntimeWorkspace, plan: Any):
        self._future = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="caffe2-plan")
        self._done = self._future.submit(self._run, ws, plan)
        self._future.shutdown(wait=False)

    @staticmethod
    def _run(ws: _RuntimeWorkspace, plan: Any) -> bool:
        with _caffe2_errors():
            ws.run_plan(plan)
        return True

    def is_done(self) -> bool:
        return self._done.done()

    def is_succeeded(self) -> bool:
        """Whether the plan ran to its end; the plan's error if it failed (Caffe2 rethrows it here)."""
        if not self._done.done():
            raise _as_runtime_error(WorkspaceError("BackgroundPlan.is_succeeded: the plan is still running"))
        return self._done.result()


def RunPlanInBackground(plan_or_step: Any) -> _BackgroundPlan:
    """Start running a plan (or an execution step) in the current workspace; poll the answer's
    `is_done()`, then `is_succeeded()`."""
    from .core import ExecutionStep, Plan

    if isinstance(plan_or_step, ExecutionStep):
        plan_or_step = Plan(plan_or_step)
    return _BackgroundPlan(_ws(), _proto(plan_or_step))


def Nets() -> list[str]:
    return _ws().nets()


def BenchmarkNet(name: Any, warmup_runs: int, main_runs: int, run_individual: bool) -> list[float]:
    """Milliseconds per run of a created net (the whole net: XLA fuses ops, so there is no per-op time)."""
    name = GetNetName(name)
    RunNet(name, warmup_runs) if warmup_runs else None
    start = time.perf_counter()
    for _ in range(main_runs):
        RunNet(name)
    jax.effects_barrier()
    return [(time.perf_counter() - start) * 1000.0 / max(main_runs, 1)]


# ------------------------------------------------------------------------------------------------
# Net observers: Caffe2's net-level TimeObserver and RunCountObserver (XLA fuses ops, so not per op)


class Observer:
    """Caffe2's `C.Observer` of a created net (`Net.AddObserver`): runs and milliseconds of the whole net."""

    def __init__(self, kind: str):
        self._kind = kind
        self._runs = 0
        self._total_ms = 0.0

    def average_time(self) -> float:
        """Milliseconds per run of the net (NaN before its first run, as in Caffe2)."""
        return self._total_ms / self._runs if self._runs else float("nan")

    def average_time_children(self) -> float:
        raise _as_runtime_error(
            Rnn2JaxError(
                "Observer.average_time_children: the time of each op is not available on rnn2jax (XLA compiles "
                "a net into one program); average_time() is the whole net's"
            )
        )

    def debug_info(self) -> str:
        if self._kind == "RunCountObserver":
            return f"This operator runs {self._runs} times."
        return "Not implemented."

    def _record(self, ms: float) -> None:
        self._runs += 1
        self._total_ms += ms


# runtime workspace -> net name -> its observers (a reset workspace, or a re-created net, drops them)
_observers: weakref.WeakKeyDictionary[_RuntimeWorkspace, dict[str, list[Observer]]] = weakref.WeakKeyDictionary()
_OBSERVER_TYPES = ("TimeObserver", "RunCountObserver")


def _run_observed(ws: _RuntimeWorkspace, name: str, num_iter: int) -> None:
    """Run a created net, timing each run for its observers (waiting for the run's results, as Caffe2's
    synchronous run did)."""
    observers = _observers.get(ws, {}).get(name)
    if not observers:
        ws.run_net(name, num_iter)
        return
    for _ in range(num_iter):
        start = time.perf_counter()
        ws.run_net(name)
        jax.effects_barrier()
        for name_ in ws.blobs():
            value = ws._values.get(name_)
            if isinstance(value, jax.Array):
                value.block_until_ready()
        elapsed = (time.perf_counter() - start) * 1000.0
        for observer in observers:
            observer._record(elapsed)


def _observed_net(net_name: Any) -> tuple[_RuntimeWorkspace, str]:
    ws, name = _ws(), GetNetName(net_name)
    if not ws.has_net(name):
        raise _as_runtime_error(WorkspaceError(f"Can't find net {name}"))
    return ws, name


def AddObserverToNet(net_name: Any, observer_type: str) -> Observer:
    """Attach an observer to a created net of the current workspace (Caffe2's `C.add_observer_to_net`)."""
    ws, name = _observed_net(net_name)
    if observer_type not in _OBSERVER_TYPES:
        why = (
            "it observes each op, and XLA compiles a net into one program"
            if observer_type == "ProfileObserver"
            else f"Caffe2 has no observer '{observer_type}' to attach from Python"
        )
        raise _as_runtime_error(
            BadArgumentError(
                f"add_observer_to_net: {observer_type} is not available on rnn2jax ({why}); "
                f"it has {', '.join(_OBSERVER_TYPES)}"
            )
        )
    observer = Observer(observer_type)
    _observers.setdefault(ws, {}).setdefault(name, []).append(observer)
    return observer


def RemoveObserverFromNet(net_name: Any, observer: Observer) -> None:
    ws, name = _observed_net(net_name)
    attached = _observers.get(ws, {}).get(name, [])
    if observer in attached:
        attached.remove(observer)


def NumObserversOnNet(net_name: Any) -> int:
    ws, name = _observed_net(net_name)
    return len(_observers.get(ws, {}).get(name, []))


class RunLimitReached(BaseException):
    """`rnn2jax exec --max-runs NET=N`: the script asked for run N+1 of net NET. A BaseException so a
    script's own `except Exception` does not swallow it."""

    def __init__(self, net: str, limit: int):
        super().__init__(f"net '{net}' ran {limit} times (--max-runs {net}={limit}); stopping the script")
        self.net = net
        self.limit = limit


def set_run_limits(limits: Mapping[str, int]) -> None:
    """Stop the process's script (RunLimitReached) when a net would run more often than its limit."""
    _run_limits.clear()
    _run_limits.update(limits)
    _run_counts.clear()


# ------------------------------------------------------------------------------------------------
# Shape inference


_ENUM_OF_DTYPE = {np.dtype(v): k for k, v in DATA_TYPES.items() if k != caffe2_pb2.TensorProto.BYTE}


class Predictor:
    """Caffe2's `workspace.Predictor(init_net, predict_net)` (C++ `caffe2::Predictor`): a workspace of its own,
    child of the current one, where the init net ran once and the predict net is created; `run` feeds the
    inputs (a list, in the order of the net's external inputs, or a dict by name), runs the net and returns
    its external outputs, in order, as a list of arrays."""

    def __init__(self, init_net: bytes | caffe2_pb2.NetDef, predict_net: bytes | caffe2_pb2.NetDef):
        with _caffe2_errors():
            init = init_net if isinstance(init_net, caffe2_pb2.NetDef) else _net_from_bytes(init_net, "init_net")
            net = (
                predict_net
                if isinstance(predict_net, caffe2_pb2.NetDef)
                else _net_from_bytes(predict_net, "predict_net")
            )
            self._ws = _ws().child()
            self._ws.run(init)
            self._net = net
            initialized = set(self._ws.blobs())
            self._ws._declare([name for name in net.external_input if name not in initialized])
            self._name = self._ws.create_net(net)

    def run(self, inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
        with _caffe2_errors():
            if isinstance(inputs, Mapping):
                for name, value in inputs.items():
                    self._ws.feed(StringifyBlobName(name), value)
            else:
                if len(inputs) > len(self._net.external_input):
                    raise InputTypeError(
                        f"Predictor.run: {len(inputs)} inputs given, the predict net has "
                        f"{len(self._net.external_input)} external inputs"
                    )
                for name, value in zip(self._net.external_input, inputs, strict=False):
                    self._ws.feed(name, value)
            self._ws.run_net(self._name)
            return [np.array(self._ws.fetch(name), copy=True) for name in self._net.external_output]


def _net_from_bytes(data: bytes, what: str) -> caffe2_pb2.NetDef:
    return parse_binary(data, caffe2_pb2.NetDef, f"Predictor {what}")


def InferShapesAndTypes(
    nets: Iterable[Any],
    blob_dimensions: Mapping[str, Sequence[int]] | None = None,
    nets_proto: bool = False,
    blob_types: Mapping[str, int] | None = None,
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Shapes and TensorProto types of every blob the nets read and write (and, without `blob_dimensions`,
    of every tensor in the workspace, as Caffe2 lists them), from the blobs in the
    current workspace (or `blob_dimensions`/`blob_types`), traced without running anything
    (`rnn2jax.checking.shape_inference.trace_shapes`; a blob without a type is FLOAT, as in Caffe2).
    Raises RuntimeError when a net cannot be traced (host ops, missing blobs), as Caffe2 did."""
    from ...checking.shape_inference import InputSpec, trace_shapes

    types_given = blob_types or {}
    given = {
        name: InputSpec(tuple(dims), DATA_TYPES.get(types_given.get(name, 1), np.dtype(np.float32)).name)
        for name, dims in (blob_dimensions or {}).items()
    }
    try:
        protos = [_proto(n) for n in nets]
        if any(schema_answers(op) for proto in protos for op in proto.op):
            specs = _infer_shapes(protos, given, _ws(), trace_shapes, InputSpec)
        else:
            specs = trace_shapes(protos, given, _ws())
    except Rnn2JaxError as error:
        raise _as_runtime_error(error) from None
    found = [(name, spec.shape, spec.dtype) for name, spec in specs.items()]
    if blob_dimensions is None:  # Caffe2 starts from every tensor in the workspace, read by the nets or not
        found = [*_workspace_tensors(_ws()), *found]
    shapes = {name: list(shape) for name, shape, _ in sorted(found, key=lambda item: item[0])}
    enum_of = {**_ENUM_OF_DTYPE, np.dtype(object): caffe2_pb2.TensorProto.STRING}  # string tensors too
    enums = {name: enum_of.get(np.dtype(dtype)) for name, _, dtype in found}
    return shapes, {name: enums[name] for name in shapes if enums[name] is not None}


def _workspace_tensors(ws: _RuntimeWorkspace) -> list[tuple[str, tuple[int, ...], Any]]:
    """The name, shape and dtype of each tensor blob (Caffe2's GetTensorShapeOfBlob knows no other blob's)."""
    values = ((name, ws.get(name)) for name in ws.blobs())
    return [(name, tuple(v.shape), v.dtype) for name, v in values if isinstance(v, np.ndarray | jax.Array)]


def _infer_shapes(protos: list[Any], given: dict[str, Any], ws: _RuntimeWorkspace, trace: Any, spec: Any) -> dict:
    """The nets traced, but for the ops whose schema Caffe2 answers with instead (`_schema_inference`): each of
    those, in turn, gets its inputs' shapes from a trace of the ops before it and is replaced by fills of the
    shapes its schema answers; then everything is traced at once (so values that decide shapes, such as a
    Concat's split_info read by its gradient's Split, stay known). The replaced ops' inputs are answered too.
    An op in `REPORTED_ONLY` stays in the trace, its readers getting what it writes; only its outputs are
    answered as its schema says."""
    nets = [_copy_net(proto) for proto in protos]
    read: dict[str, Any] = {}
    reported: dict[str, Any] = {}
    for index, net in enumerate(nets):
        position = 0
        while position < len(net.op):
            op = net.op[position]
            if not schema_answers(op):
                position += 1
                continue
            before = _copy_net(net)
            del before.op[position:]
            known = {**given, **trace([*nets[:index], before], given, ws)}

            def shape_of(name: str, known: dict = known) -> tuple[tuple[int, ...], np.dtype] | None:
                if name in known:
                    return tuple(known[name].shape), np.dtype(known[name].dtype)
                value = ws.get(name) if ws.has_blob(name) else None
                return (tuple(value.shape), np.dtype(value.dtype)) if hasattr(value, "shape") else None

            inputs = [shape_of(name) for name in op.input]
            read.update({n: spec(i[0], i[1].name) for n, i in zip(op.input, inputs, strict=True) if i is not None})
            outputs = SCHEMA_INFERENCE[op.type](op, inputs, shape_of)
            if outputs is None:
                position += 1
                continue
            if op.type in REPORTED_ONLY:
                reported.update({n: spec(o[0], o[1].name) for n, o in zip(op.output, outputs, strict=False) if o})
                position += 1
                continue
            fills = [_fill(name, out) for name, out in zip(op.output, outputs, strict=False) if out is not None]
            del net.op[position]
            for fill in reversed(fills):
                net.op.insert(position, fill)
            position += len(fills)
    return {**read, **trace(nets, given, ws), **reported}


def _copy_net(proto: Any) -> Any:
    copy = caffe2_pb2.NetDef()
    copy.CopyFrom(proto)
    return copy


def _fill(name: str, out: tuple[tuple[int, ...], np.dtype]) -> Any:
    """A ConstantFill standing for an output whose shape and type a schema answered."""
    fill = caffe2_pb2.OperatorDef(type="ConstantFill", output=[name])
    fill.arg.add(name="shape", ints=[int(d) for d in out[0]])
    fill.arg.add(name="dtype", i=_ENUM_OF_DTYPE[np.dtype(out[1])])
    return fill


# ------------------------------------------------------------------------------------------------
# C.Workspace objects


class _Blob:
    def __init__(self, ws: _RuntimeWorkspace, name: str):
        self._ws = ws
        self.name = name

    def fetch(self) -> Any:
        with _caffe2_errors():
            value = self._ws.fetch(self.name)
        return np.array(value, copy=True) if isinstance(value, np.ndarray) else value

    def to_torch(self) -> Any:
        """The blob as a CPU torch.Tensor that shares it (needs the `torch` extra)."""
        with _caffe2_errors():
            return _torch_interop.to_torch(self._ws, self.name)

    def feed(self, arr: Any, device_option: Any = None) -> bool:
        if _torch_interop.is_torch_tensor(arr):
            with _caffe2_errors():
                _torch_interop.feed(self._ws, self.name, arr)
            return True
        self._ws.feed(self.name, np.array(arr, copy=True) if not isinstance(arr, str | bytes) else arr)
        return True

    def is_tensor(self) -> bool:
        return isinstance(self._ws.get(self.name), jax.Array | np.ndarray)

    def tensor(self) -> _BlobTensor:
        """The blob as Caffe2's TensorCPU: `data` writes through to the blob."""
        return _BlobTensor(self._ws, self.name)

    as_tensor = tensor

    def serialize(self, name: str) -> bytes:
        """The blob as one BlobProto named `name`, as Caffe2's SerializeBlob writes it."""
        with _caffe2_errors():
            (_, record), *_ = _serialize_blob(name, self._ws.fetch(self.name), chunk_size=0)
        return record

    def deserialize(self, serialized: bytes) -> None:
        """Set the blob from a serialized BlobProto (its name inside is not used)."""
        where = f"Blob('{self.name}').deserialize"
        assembler = BlobAssembler(where)
        try:
            assembler.add(self.name.encode("utf-8"), serialized)
        except ValueError as error:
            raise _as_runtime_error(BadArgumentError(f"{where}: {error}")) from None
        values, problems = assembler.finish()
        if problems:
            raise _as_runtime_error(BadArgumentError(f"{where}: {next(iter(problems.values()))}"))
        self._ws.feed(self.name, next(iter(values.values())))


class _NetHandle:
    def __init__(self, ws: _RuntimeWorkspace, name: str):
        self._ws = ws
        self.name = name

    def run(self) -> None:
        with _caffe2_errors():
            _run_observed(self._ws, self.name, 1)

    def cancel(self) -> None:
        """Caffe2's NetBase::Cancel, which calls its ops' Cancel. Caffe2's queue ops have none (closing the
        queue is what ends their wait), and rnn2jax's other ops do not wait: nothing to do."""


class _BlobTensor:
    """Caffe2's `TensorCPU` of a blob (`C.Blob.tensor()`): `data` is the blob's own array, so writing into
    it changes the blob. A numeric blob held as a JAX array becomes a NumPy array (same values) on first
    access; the next op that writes the blob makes it a JAX array again."""

    def __init__(self, ws: _RuntimeWorkspace, name: str):
        self._ws = ws
        self._name = name

    @property
    def data(self) -> np.ndarray:
        value = self._ws.get(self._name)
        if isinstance(value, np.ndarray) and value.flags.writeable:
            return value
        if not isinstance(value, jax.Array | np.ndarray):
            raise _as_runtime_error(InputTypeError(f"blob '{self._name}' holds a {type(value).__name__}, not a tensor"))
        array = np.array(value, copy=True)
        self._ws.put(self._name, array)
        return array

    @property
    def _shape(self) -> list[int]:
        return list(self.data.shape)

    @property
    def shape(self) -> list[int]:
        return self._shape

    def init(self, dims: Sequence[int], caffe_type: int) -> None:
        """Resize the blob to `dims` of Caffe2 data type `caffe_type` (its values are not meaningful until
        written, as in Caffe2; rnn2jax's are zeros). Strings cannot be made this way, as in Caffe2."""
        if caffe_type == caffe2_pb2.TensorProto.STRING:
            raise _as_runtime_error(BadArgumentError("TensorCPU.init: Cannot initialize strings from Python"))
        dtype = DATA_TYPES.get(caffe_type)
        if dtype is None:
            raise _as_runtime_error(BadArgumentError(f"TensorCPU.init: unknown data type {caffe_type}"))
        self._ws.put(self._name, np.zeros([int(d) for d in dims], dtype=dtype))

    def _reshape(self, dims: Sequence[int]) -> None:
        self.reshape(dims)

    def reshape(self, dims: Sequence[int]) -> None:
        data = self.data
        dims = tuple(int(d) for d in dims)
        if data.shape != dims:
            self._ws.put(self._name, np.zeros(dims, dtype=data.dtype if data.size else np.float32))

    def feed(self, arr: Any) -> bool:
        """Copy `arr` into the blob."""
        with _caffe2_errors():
            self._ws.feed(self._name, np.array(arr, copy=True))
        return True

    def fetch(self) -> Any:
        """A copy of the blob's value."""
        return np.array(self.data, copy=True)


class _CurrentWorkspaceProperty(type):
    @property
    def current(cls) -> _CWorkspace:
        """`C.Workspace.current`: the current workspace, as an object (a class property in Caffe2)."""
        return cls(_ws())


class _CWorkspace(metaclass=_CurrentWorkspaceProperty):
    """Caffe2's `workspace.C.Workspace`: a workspace object used directly, apart from the current one."""

    def __init__(self, ws: _RuntimeWorkspace | _CWorkspace | None = None):
        """A new workspace; `C.Workspace(parent)` (another `C.Workspace`) is a child that sees the parent's
        blobs, as a session's private task workspace."""
        if isinstance(ws, _CWorkspace):
            ws = ws._ws.child()
        self._ws = ws if ws is not None else _new_workspace()

    @property
    def blobs(self) -> dict[str, _Blob]:
        return {name: _Blob(self._ws, name) for name in _blob_names(self._ws)}

    @property
    def nets(self) -> dict[str, _NetHandle]:
        return {name: _NetHandle(self._ws, name) for name in self._ws.nets()}

    def create_blob(self, name: str) -> _Blob:
        self._ws._declare([name])
        return _Blob(self._ws, name)

    def has_blob(self, name: str) -> bool:
        return self._ws.exists(StringifyBlobName(name))

    def fetch_blob(self, name: str) -> Any:
        return _Blob(self._ws, StringifyBlobName(name)).fetch()

    def feed_blob(self, name: str, arr: Any, device_option: Any = None) -> bool:
        return _Blob(self._ws, StringifyBlobName(name)).feed(arr)

    def create_net(self, net: Any, overwrite: bool = False) -> _NetHandle:
        if isinstance(net, str):  # Caffe2 hands a str on to the C++ binding, which takes only bytes
            raise TypeError("create_net: a net is a core.Net, a NetDef or its serialized bytes, not a str")
        with _caffe2_errors():
            name = self._ws.create_net(_proto(net), overwrite=overwrite)
        return _NetHandle(self._ws, name)

    def run(self, obj: Any) -> None:
        """Run an op, a net, a plan or an execution step once."""
        from .core import ExecutionStep, Plan

        with _caffe2_errors():
            if isinstance(obj, caffe2_pb2.OperatorDef):
                self._ws.run(_op_net([obj]))
            elif isinstance(obj, ExecutionStep | Plan | caffe2_pb2.PlanDef | caffe2_pb2.ExecutionStep):
                plan = Plan(obj) if isinstance(obj, ExecutionStep) else obj
                self._ws.run_plan(_proto(plan))
            else:
                self._ws.run(_proto(obj))

    def _run_net(self, net: bytes) -> None:
        with _caffe2_errors():
            self.run(parse_binary(net, caffe2_pb2.NetDef, "Workspace._run_net"))

    def _run_operator(self, op: bytes) -> None:
        with _caffe2_errors():
            self.run(parse_binary(op, caffe2_pb2.OperatorDef, "Workspace._run_operator"))


Workspace = _CWorkspace  # Caffe2's `workspace.Workspace`, its `C.Workspace`
python_op.default_workspace_view = _CWorkspace  # what a built `pass_workspace` Python op function gets


class _OpSchema:
    """Caffe2's `C.OpSchema`: what is known about an op type's interface (arity, docs).

    rnn2jax's registry knows input/output counts; it keeps no per-argument or per-input docs, so those
    lists are empty. Caffe2's serialized-test coverage report and doc generator read these.
    """

    inf = 2147483647  # Caffe2's "unbounded"

    def __init__(self, op_type: str, inputs: tuple[int, int], outputs: tuple[int, int], doc: str):
        self.name = op_type
        self.min_input, self.max_input = inputs[0], self._bound(inputs[1])
        self.min_output, self.max_output = outputs[0], self._bound(outputs[1])
        self.doc = doc
        self.private = False
        self.args: list[Any] = []
        self.input_desc: list[tuple[str, str]] = []
        self.output_desc: list[tuple[str, str]] = []
        self.file = ""
        self.line = 0

    @classmethod
    def _bound(cls, count: int) -> int:
        from ...ops.registry import UNBOUNDED

        return cls.inf if count >= UNBOUNDED else count

    def num_inputs_allowed(self, n: int) -> bool:
        return self.min_input <= n <= self.max_input

    def num_outputs_allowed(self, n: int) -> bool:
        return self.min_output <= n <= self.max_output

    def num_inputs_outputs_allowed(self, n_in: int, n_out: int) -> bool:
        return self.num_inputs_allowed(n_in) and self.num_outputs_allowed(n_out)

    def inplace_enforced(self, i: int, o: int) -> bool:
        """Whether Caffe2's schema enforces input i and output o in place (EnforceInplace)."""
        from ._inplace import inplace_enforced

        return inplace_enforced(self.name, i, o)

    # The op types whose Caffe2 schema says SameNumberOfOutput (as many outputs as inputs) with a range of counts
    _SAME_NUMBER_OF_OUTPUT = frozenset({"Free", "SparseDropoutWithReplacement", "SparseItemwiseDropoutWithReplacement"})

    def CalculateOutput(self, num_input: int) -> int:
        """Caffe2's `OpSchema::CalculateOutput`: the output count, fixed or from the input count, else -1
        (kCannotComputeNumOutputs)."""
        if self.min_output == self.max_output:
            return self.min_output
        if self.name in self._SAME_NUMBER_OF_OUTPUT:
            return num_input
        return -1

    @staticmethod
    def get(op_type: str) -> _OpSchema | None:
        """The schema of `op_type`, or None when rnn2jax cannot run it (as Caffe2 for schemaless ops)."""
        from ...ops.registry import find, find_host

        opdef = find(op_type)
        if opdef is not None:
            return _OpSchema(op_type, opdef.inputs, opdef.outputs, (opdef.build.__doc__ or "").strip())
        host = find_host(op_type)
        if host is not None:
            return _OpSchema(op_type, (0, _OpSchema.inf), (0, _OpSchema.inf), (host.run.__doc__ or "").strip())
        return None

    @staticmethod
    def get_cpu_impl(op_type: str) -> str:
        return "rnn2jax" if _OpSchema.get(op_type) is not None else ""

    @staticmethod
    def get_cuda_impl(op_type: str) -> str:
        return ""

    @staticmethod
    def get_gradient_impl(op_type: str) -> str:
        from ...ops.gradient_makers import has_gradient_maker

        return "rnn2jax" if has_gradient_maker(op_type) else ""


def RegisteredOperators() -> list[str]:
    from ...ops.registry import REGISTRY

    return sorted(REGISTRY)
