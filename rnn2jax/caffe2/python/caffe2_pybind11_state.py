"""Caffe2's C extension, `caffe2.python.caffe2_pybind11_state`, on rnn2jax's runtime.

Caffe2's pure-Python modules reach its C++ through this module (`import caffe2.python._import_c_extension as C`):
memonger's passes, workspace and blob functions taking serialized protos, the gradient registry, shape
inference, Python ops, the nomnigraph graphs (`_nomni`), the nomnigraph passes (`_opt_passes`) and transforms
(`_transforms`). Here each is the rnn2jax function that does the job,
mostly `rnn2jax.caffe2.python.workspace`'s, so state (the current workspace, its blobs and nets) is one and
the same whichever module a script calls.

What rnn2jax cannot do (observers timing single ops, which XLA fuses; the MKL-DNN and TensorRT rewrites and ONNX
export; GPU queries of CUDA's own) is still here, by its Caffe2 name, and raises an `Rnn2JaxError` that
names it. Built as Caffe2's CPU-only build: no MKL-DNN, no TensorRT, no NUMA.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import BadArgumentError, InputTypeError, Rnn2JaxError
from ...ir.wire import parse_binary
from ...ops.gradient_makers import get_gradient_for_op
from ...storage.db import DB_TYPES
from ..proto import caffe2_pb2
from . import _memonger, _nomni, _opt_passes, python_op, workspace
from ._caffe2_operators import CAFFE2_OPERATOR_TYPES
from ._db import DB, Cursor, Transaction, create_db  # noqa: F401  (Caffe2's database bindings)
from ._nomni import *  # noqa: F403  (the nomnigraph bindings, pybind_state_nomni.cc)

# ------------------------------------------------------------------------------------------------
# Build flags: a CPU build without the optional libraries

is_asan = False
has_mkldnn = False
use_mkldnn = True  # as the torch 1.10.2 CPU wheel reports (built with USE_MKLDNN, has_mkldnn False)
use_trt = False
use_rocm = False
define_caffe2_no_operator_schema = False
has_fbgemm = workspace.has_fbgemm
has_hip_support = workspace.has_hip_support


def get_build_options() -> dict[str, str]:
    """Caffe2's build options, as a CPU build without CUDA, MKL-DNN, NCCL or TensorRT reported them."""
    options = dict.fromkeys(("USE_CUDA", "USE_CUDNN", "USE_MKL", "USE_MKLDNN", "USE_NCCL", "USE_NNPACK"), "OFF")
    options.update(BUILD_TYPE="Release", USE_GFLAGS="OFF", USE_GLOG="OFF", USE_MPI="OFF", USE_TRT="", USE_GLOO="")
    return options


def builtin_cpu_supports_avx2() -> bool:
    """Whether the CPU has AVX2 (read from /proc/cpuinfo; False where there is none)."""
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def global_init(args: Sequence[str]) -> None:
    workspace.GlobalInit(args)


def on_module_exit() -> None:
    """Caffe2 freed its workspaces here at exit; Python frees rnn2jax's."""


# ------------------------------------------------------------------------------------------------
# Operators


def registered_operators() -> list[str]:
    """The op types rnn2jax runs (lowered, host and user ops), sorted."""
    return workspace.RegisteredOperators()


def op_registry_key(op_type: str, engine: str) -> str:
    return op_type if engine in ("", "DEFAULT") else f"{op_type}_ENGINE_{engine}"


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def nearby_opnames(name: str) -> list[str]:
    """Op types within 3 edits of `name`: what Caffe2 suggested for a misspelt op."""
    known = set(registered_operators()) | CAFFE2_OPERATOR_TYPES
    return sorted(op for op in known if abs(len(op) - len(name)) <= 3 and _edit_distance(op, name) <= 3)


OpSchema = workspace._OpSchema


class GradientWrapper:
    """A gradient as Caffe2's C++ passed it: a dense blob, or the indices and values of a sparse one."""

    def __init__(self) -> None:
        self.dense = ""
        self.indices = ""
        self.values = ""

    def is_dense(self) -> bool:
        return bool(self.dense)

    def is_sparse(self) -> bool:
        return bool(self.indices) or bool(self.values)

    def is_empty(self) -> bool:
        return not self.is_dense() and not self.is_sparse()

    def _plain(self) -> str | tuple[str, str] | None:
        if self.is_dense():
            return self.dense
        return (self.indices, self.values) if self.is_sparse() else None

    @classmethod
    def _of(cls, grad: str | tuple[str, str] | None) -> GradientWrapper:
        wrapper = cls()
        if isinstance(grad, tuple):
            wrapper.indices, wrapper.values = grad
        elif grad is not None:
            wrapper.dense = grad
        return wrapper


def get_gradient_defs(
    op_def: bytes, output_gradients: Sequence[GradientWrapper]
) -> tuple[list[bytes], list[GradientWrapper]]:
    """The gradient ops of a serialized op (serialized) and the gradient of each of its inputs, from rnn2jax's
    port of Caffe2's gradient makers."""
    op = _parse(op_def, caffe2_pb2.OperatorDef, "get_gradient_defs")
    ops, g_input = get_gradient_for_op(op, [g._plain() for g in output_gradients])
    return [o.SerializeToString() for o in ops], [GradientWrapper._of(g) for g in g_input]


def infer_op_input_output_device(op: bytes) -> tuple[list[bytes], list[bytes]]:
    """Serialized device options of each input and output of a serialized op: every blob an op reads and writes
    lives on the op's device (no op here moves data between devices)."""
    device = _parse(op, caffe2_pb2.OperatorDef, "infer_op_input_output_device")
    option = device.device_option.SerializeToString()
    return [option for _ in device.input], [option for _ in device.output]


# ------------------------------------------------------------------------------------------------
# Workspaces, blobs, nets and plans (the current workspace's, as in Caffe2)

Workspace = workspace._CWorkspace
Blob = workspace._Blob
Net = workspace._NetHandle
Predictor = workspace.Predictor
TensorCPU = python_op.TensorCPU


def _parse(data: Any, kind: type, where: str) -> Any:
    """A message from its serialization (a message passes as it is)."""
    if isinstance(data, kind):
        return data
    if not isinstance(data, bytes):
        raise InputTypeError(f"{where}: expects a serialized {kind.__name__}, got a {type(data).__name__}")
    return parse_binary(data, kind, f"caffe2_pybind11_state.{where}")


def switch_workspace(name: str | bytes, create_if_missing: bool | None = None) -> None:
    if not isinstance(name, str | bytes):
        raise InputTypeError(
            f"switch_workspace: rnn2jax switches workspaces by name only, not to a {type(name).__name__}"
        )
    workspace.SwitchWorkspace(name, bool(create_if_missing))


def reset_workspace(root_folder: str | None = None) -> bool:
    return workspace.ResetWorkspace(root_folder)


def root_folder() -> str:
    """Where the current workspace's databases resolve relative paths ("." unless reset with another)."""
    return workspace.RootFolder()


def current_workspace() -> str:
    return workspace.CurrentWorkspace()


def workspaces() -> list[str]:
    return sorted(workspace.Workspaces())


def blobs() -> list[str]:
    return workspace.Blobs()


local_blobs = blobs


def has_blob(name: str) -> bool:
    return workspace.HasBlob(name)


def create_blob(name: str) -> bool:
    return workspace.CreateBlob(name)


def reset_blob(name: str) -> bool:
    return workspace.ResetBlob(name)


def fetch_blob(name: str) -> Any:
    return workspace.FetchBlob(name)


def feed_blob(name: str, arg: Any, device_option: Any = None) -> bool:
    """Feed an array or a string; the device option (serialized) is read and, as everywhere, not needed."""
    if isinstance(device_option, bytes):
        _parse(device_option, caffe2_pb2.DeviceOption, "feed_blob")
    return workspace.FeedBlob(name, arg)


# The same functions as the workspace module's (Caffe2's workspace.SerializeBlob is C.serialize_blob)
serialize_blob = workspace.SerializeBlob
deserialize_blob = workspace.DeserializeBlob


def get_blob_size_bytes(name: str) -> int:
    """Caffe2's BlobStat size of a blob (`workspace.GetBlobSizeBytes`)."""
    return workspace.GetBlobSizeBytes(name)


def create_net(net_def: bytes, overwrite: bool = False) -> bool:
    return workspace.CreateNet(_parse(net_def, caffe2_pb2.NetDef, "create_net"), overwrite)


def run_net(name: str, num_iter: int, allow_fail: bool) -> bool:
    return workspace.RunNet(name, num_iter, allow_fail)


def run_net_once(net_def: bytes) -> bool:
    return workspace.RunNetOnce(_parse(net_def, caffe2_pb2.NetDef, "run_net_once"))


def run_operator_once(op_def: bytes) -> bool:
    return workspace.RunOperatorOnce(_parse(op_def, caffe2_pb2.OperatorDef, "run_operator_once"))


def run_operator_multiple(op_def: bytes, num_runs: int) -> bool:
    return workspace.RunOperatorMultiple(_parse(op_def, caffe2_pb2.OperatorDef, "run_operator_multiple"), num_runs)


def run_plan(plan_def: bytes) -> bool:
    return workspace.RunPlan(_parse(plan_def, caffe2_pb2.PlanDef, "run_plan"))


def run_plan_in_background(plan_def: bytes) -> Any:
    return workspace.RunPlanInBackground(_parse(plan_def, caffe2_pb2.PlanDef, "run_plan_in_background"))


def nets() -> list[str]:
    return workspace.Nets()


def delete_net(name: str) -> bool:
    workspace._ws()._nets.pop(name, None)
    return True


def benchmark_net(name: str, warmup_runs: int, main_runs: int, run_individual: bool) -> list[float]:
    return workspace.BenchmarkNet(name, warmup_runs, main_runs, run_individual)


def num_cuda_devices() -> int:
    return workspace.NumCudaDevices()


def num_hip_devices() -> int:
    return 0


def registered_dbs() -> list[str]:
    """The database types rnn2jax reads and writes, under both of Caffe2's names for each."""
    camel = {"minidb": "MiniDB", "lmdb": "LMDB", "leveldb": "LevelDB", "rocksdb": "RocksDB"}
    return [name for db_type in DB_TYPES for name in (db_type, camel.get(db_type, db_type))]


class Mode(enum.IntEnum):
    """A database's open mode (`create_db`'s third argument)."""

    read = 0
    write = 1
    new = 2


def get_stats() -> dict[str, int]:
    """Caffe2's stat registry: rnn2jax keeps no statistics, so it is empty."""
    return {}


def is_numa_enabled() -> bool:
    return False


def get_num_numa_nodes() -> int:
    return -1  # Caffe2's answer without NUMA support


_engine_prefs: dict[str, Any] = {"global": {}, "op": {}}


def set_global_engine_pref(pref: Mapping[int, Sequence[str]]) -> None:
    """Engine preferences are recorded only: XLA picks the kernels, there are no engines to choose between."""
    _engine_prefs["global"] = dict(pref)


def set_op_engine_pref(op_type: str, op_pref: Mapping[int, Sequence[str]]) -> None:
    _engine_prefs["op"][op_type] = dict(op_pref)


def set_per_op_engine_pref(pref: Mapping[str, Mapping[int, Sequence[str]]]) -> None:
    for op_type, op_pref in pref.items():
        set_op_engine_pref(op_type, op_pref)


def set_engine_pref(per_op_pref: Mapping[str, Any], global_pref: Mapping[int, Any]) -> None:
    set_global_engine_pref(global_pref)
    set_per_op_engine_pref(per_op_pref)


# ------------------------------------------------------------------------------------------------
# Shape inference


def _shapes_proto(nets: Iterable[Any], dims: Mapping[str, Sequence[int]] | None, types: Any) -> bytes:
    protos = [_parse(n, caffe2_pb2.NetDef, "infer_shapes_and_types") for n in nets]
    shapes, dtypes = workspace.InferShapesAndTypes(protos, dict(dims) if dims else None, False, types)
    result = caffe2_pb2.TensorShapes()
    for name in sorted(shapes):
        shape = result.shapes.add(name=name, dims=shapes[name])
        if name in dtypes and not (dims and name in dims and name not in (types or {})):
            shape.data_type = dtypes[name]  # a blob given by its dims alone keeps the default type, unset
    return result.SerializeToString()


def infer_shapes_and_types_from_workspace(net_protos: Sequence[bytes]) -> bytes:
    """A serialized TensorShapes of every blob the (serialized) nets read and write, from the current
    workspace's blobs, traced without running anything (`workspace.InferShapesAndTypes`)."""
    return _shapes_proto(net_protos, None, None)


def infer_shapes_and_types_from_map(
    net_protos: Sequence[bytes],
    blob_dimensions: Mapping[str, Sequence[int]],
    int_blob_types: Mapping[str, int] | None = None,
) -> bytes:
    """As `infer_shapes_and_types_from_workspace`, the inputs' shapes (and TensorProto types) given."""
    return _shapes_proto(net_protos, blob_dimensions, int_blob_types)


# ------------------------------------------------------------------------------------------------
# Python ops


def get_operator_cost(op_def: bytes, input_blobs: Sequence[str]) -> tuple[int, int, int]:
    """Caffe2's cost inference of a serialized op, from its inputs' shapes in the current workspace."""
    return workspace.GetOperatorCost(op_def, input_blobs)


def fill_random_network_inputs(
    net_def: bytes, input_dims: Sequence[Sequence[Sequence[int]]], input_types: Sequence[Sequence[str]]
) -> None:
    """Random data for the blobs a serialized net reads before writing (Caffe2's TestDataRandomFiller)."""
    workspace.FillRandomNetworkInputs(
        _parse(net_def, caffe2_pb2.NetDef, "fill_random_network_inputs"), input_dims, input_types
    )


def add_observer_to_net(net_name: str, observer_type: str) -> workspace.Observer:
    return workspace.AddObserverToNet(net_name, observer_type)


def remove_observer_from_net(net_name: str, observer: workspace.Observer) -> None:
    workspace.RemoveObserverFromNet(net_name, observer)


def num_observers_on_net(net_name: str) -> int:
    return workspace.NumObserversOnNet(net_name)


Observer = workspace.Observer


def register_python_op(func: Callable, pass_workspace: bool, name: str) -> str:
    """Keep `func` for the Python ops of token returned (`f(inputs, outputs[, workspace])`)."""
    if func is None:
        raise BadArgumentError("register_python_op: func is None")
    return python_op.register_python_function(func, None, None, Workspace if pass_workspace else None, name)


def register_python_gradient_op(token: str, func: Callable) -> None:
    if func is None:
        raise BadArgumentError("register_python_gradient_op: func is None")
    python_op.register_gradient_function(token, func)


# ------------------------------------------------------------------------------------------------
# Memonger


def memonger_compute_blob_recycling_for_dag(
    net_def: bytes,
    input_blobs: Sequence[bytes | str],
    op_indices: Sequence[int],
    shareable_blob_names: Iterable[bytes | str],
    namescope: bytes | str,
    dont_share_blob_names: Iterable[bytes | str],
    blob_shapes: Mapping[str, Sequence[int]],
) -> bytes:
    """Caffe2's memonger over a DAG of ops (`memonger.share_grad_blobs`, `optimize_inference_for_dag`)."""
    net = _parse(net_def, caffe2_pb2.NetDef, "memonger_compute_blob_recycling_for_dag")
    with workspace._caffe2_errors():  # Caffe2's enforce failures are RuntimeErrors
        optimized = _memonger.compute_blob_recycling_for_dag(
            net,
            [_text(b) for b in input_blobs],
            list(op_indices),
            {_text(b) for b in shareable_blob_names},
            _text(namescope),
            {_text(b) for b in dont_share_blob_names},
            {_text(k): list(v) for k, v in blob_shapes.items()},
        )
    return optimized.SerializeToString()


def memonger_optimize_inference_net(net_def: bytes, static_blobs: Sequence[bytes | str]) -> bytes:
    """Caffe2's memonger for a simple inference net (`memonger.optimize_inference_fast`)."""
    net = _parse(net_def, caffe2_pb2.NetDef, "memonger_optimize_inference_net")
    with workspace._caffe2_errors():
        return _memonger.optimize_inference_net(net, [_text(b) for b in static_blobs]).SerializeToString()


def _text(name: bytes | str) -> str:
    return name.decode("utf-8") if isinstance(name, bytes) else str(name)


# ------------------------------------------------------------------------------------------------
# ONNX helpers


class DummyName:
    """Caffe2's ONNX name generator (caffe2/onnx/helper.cc): `OC2_DUMMY_<n>` names, none of them a name
    given to `reset` or one it made before."""

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._counter = 0

    def reset(self, args: Iterable[str] | None = None) -> None:
        """Forgets the names made, and counts from 0 again; `args` are names in use."""
        self._used = set() if args is None else {_text(name) for name in args}
        self._counter = 0

    def new_dummy_name(self) -> str:
        while True:
            name = f"OC2_DUMMY_{self._counter}"
            self._counter += 1
            if name not in self._used:
                self._used.add(name)
                return name


# ------------------------------------------------------------------------------------------------
# What rnn2jax cannot do


def _unavailable(name: str, why: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise Rnn2JaxError(f"caffe2_pybind11_state.{name} (Caffe2's C++) is not available on rnn2jax: {why}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not available on rnn2jax: {why}."
    return refuse


_NO_OBSERVERS = "XLA compiles a net into one program, so there are no single ops to observe or time"
_NO_TRANSFORMS = "rnn2jax does not implement Caffe2's MKL-DNN, TensorRT and fake-fp16 rewrites"
_NO_CUDA = "rnn2jax asks JAX for its devices (workspace.NumGpuDevices()); it has no CUDA runtime of its own"
_UNAVAILABLE = {
    "clear_global_net_observer": _NO_OBSERVERS,
    "benchmark_net_once": _NO_OBSERVERS,
    "transform_optimizeForMKLDNN": _NO_TRANSFORMS,
    "transform_trt": _NO_TRANSFORMS,
    "fakeFp16FuseOps": _NO_TRANSFORMS,
    "export_to_onnx": "rnn2jax does not export ONNX (rnn2jax export writes a jax.export artifact)",
    "onnxifi": "rnn2jax has no ONNXIFI backend",
    "get_blob_numa_node": "rnn2jax is built without NUMA support",
    "get_cuda_version": _NO_CUDA,
    "get_cudnn_version": _NO_CUDA,
    "get_device_properties": _NO_CUDA,
    "get_gpu_memory_info": _NO_CUDA,
    "get_cuda_peer_access_pattern": _NO_CUDA,
    "get_hip_version": _NO_CUDA,
    "get_hip_peer_access_pattern": _NO_CUDA,
}
globals().update({name: _unavailable(name, why) for name, why in _UNAVAILABLE.items()})


def transform_exists(transform_name: str) -> bool:
    """Whether Caffe2's nomnigraph pass registry has `transform_name` (AddNNPACK, FuseNNPACKConvRelu, DeadCodeElim)."""
    return transform_name in _opt_passes.PASSES


def workspace_transform_exists(transform_name: str) -> bool:
    """Whether its workspace pass registry has `transform_name` (FuseConvBN, which rewrites weight blobs)."""
    return transform_name in _opt_passes.WORKSPACE_PASSES


def _run_pass(name: str, net_def: bytes, where: str, *, with_workspace: bool = False) -> bytes:
    net = _parse(net_def, caffe2_pb2.NetDef, where)
    ws = workspace._ws() if with_workspace else None
    with workspace._caffe2_errors():
        return _opt_passes.run_pass(name, net, ws).SerializeToString()


def run_transform(transform_name: str, net_def: bytes) -> bytes:
    """Run nomnigraph pass `transform_name` over a serialized NetDef; the rewritten NetDef, serialized."""
    return _run_pass(_text(transform_name), net_def, "run_transform")


def run_workspace_transform(transform_name: str, net_def: bytes) -> bytes:
    """Run workspace pass `transform_name` over a serialized NetDef and the current workspace's blobs."""
    return _run_pass(_text(transform_name), net_def, "run_workspace_transform", with_workspace=True)


def apply_transform(transform_key: bytes | str, net_def: bytes) -> bytes:
    """caffe2::ApplyTransform: the registered transform (ConvToNNPack, CommonSubexpressionElimination) applied."""
    net = _parse(net_def, caffe2_pb2.NetDef, "apply_transform")
    return workspace.ApplyTransform(_text(transform_key), net).SerializeToString()


def apply_transform_if_faster(
    transform_key: bytes | str,
    net_def: bytes,
    init_net_def: bytes,
    warmup_runs: int,
    main_runs: int,
    improvement_threshold: float,
) -> bytes:
    """caffe2::ApplyTransformIfFaster: the transformed net if, timed in fresh workspaces set up by the init net,
    it runs `improvement_threshold` times faster than `net_def`; else `net_def`."""
    net = _parse(net_def, caffe2_pb2.NetDef, "apply_transform_if_faster")
    init_net = _parse(init_net_def, caffe2_pb2.NetDef, "apply_transform_if_faster")
    return workspace.ApplyTransformIfFaster(
        _text(transform_key),
        net,
        init_net,
        warmup_runs=warmup_runs,
        main_runs=main_runs,
        improvement_threshold=improvement_threshold,
    ).SerializeToString()


def transform_addNNPACK(net_def: bytes) -> bytes:
    return _run_pass("AddNNPACK", net_def, "transform_addNNPACK")


def transform_fuseNNPACKConvRelu(net_def: bytes) -> bytes:
    return _run_pass("FuseNNPACKConvRelu", net_def, "transform_fuseNNPACKConvRelu")


def transform_fuseConvBN(net_def: bytes) -> bytes:
    return _run_pass("FuseConvBN", net_def, "transform_fuseConvBN", with_workspace=True)


def support_onnx_export(op: str) -> bool:
    return False


# `from caffe2_pybind11_state import *` (what `_import_c_extension` does): the surface above, not its imports
_defined_here = {n for n, v in globals().items() if not n.startswith("_") and getattr(v, "__module__", "") == __name__}
__all__ = sorted(
    _defined_here
    | {"is_asan", "has_mkldnn", "use_mkldnn", "use_trt", "use_rocm", "define_caffe2_no_operator_schema"}
    | {"has_fbgemm", "has_hip_support", "OpSchema", "Workspace", "Blob", "Net", "TensorCPU", "Predictor", "Observer"}
    | {"create_db", "DB", "Cursor", "Transaction", "serialize_blob", "deserialize_blob"}
    | set(_nomni.__all__)
)
