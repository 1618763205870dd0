"""Caffe2's `data_parallel_model` for CPU devices: one model copy per device, gradients all-reduced.

`Parallelize(model, input_builder_fun, forward_pass_builder_fun, ..., devices=[0, 1], cpu_device=True)`
builds the nets Caffe2 built on one host:

* for each device `d`, under `DeviceScope(CPU, d)` and `NameScope("cpu_<d>")`, the input builder, the
  forward builder (given `loss_scale = 1 / len(devices)`, by which it should scale its losses: that is
  what makes the summed gradients an average) and, later, the parameter-update builder;
* a `ConstantFill(value=1)` gradient seed per loss, then the backward pass of the whole net;
* per gradient (in reverse order of the parameters): `Sum` of every device's copy into device 0's copy,
  then `Copy` of it back to the other devices (Caffe2's "poor man's allreduce" on the CPU);
* computed parameters (`COMPUTED_PARAM`, e.g. batch-norm statistics) copied from device 0 to the others;
* in the init net, after the fills, every `cpu_<d>/` blob it writes copied from device 0's, so all
  copies start equal (random fills differ per device).

On rnn2jax all "devices" of a process are one JAX host: the copies run in one compiled net, in the order
Caffe2's DAG executor was free to choose.

Across hosts (`rendezvous=dict(kv_handler=..., shard_id=..., num_shards=..., engine="GLOO")`, the same
script started once per shard) the nets are Caffe2's too: the forward builder's `loss_scale` is
1 / (devices x shards); each gradient is summed over every device of every shard by one `Allreduce`; the
init net `Broadcast`s shard 0's parameters; a barrier net runs before the training net. Those ops run on
JAX's multi-process runtime (rnn2jax/ops/distributed.py), which must start before JAX's backend: so
Parallelize joins it at once, through the store handler blob `kv_handler` (made by FileStoreHandlerCreate
or RedisStoreHandlerCreate) or, with `kv_handler=None`, where JAX finds its cluster (MPI, SLURM, or a
`jax.distributed.initialize` the script called itself). Nothing may have computed in the process before.

What is not provided is refused with an rnn2jax error naming the option: GPU and iDeep devices (GPUs
serve as JAX's default device instead), engines other than GLOO, `shared_model`, `combine_spatial_bn`,
`optimize_gradient_memory`/`dynamic_memory_management` (memonger) and sparse (GradientSlice) gradients;
`use_nccl` is accepted and, as in Caffe2 on the CPU, has no effect.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import cpu_count
from typing import Any

from ...errors import BadArgumentError
from ...ops import distributed
from ..proto import caffe2_pb2
from . import core, model_helper, scope, workspace

log = logging.getLogger("data_parallel_model")

_DEFAULT_TIMEOUT_SEC = 30
_DEFAULT_BARRIER_NET_TIMEOUT_SEC = 300


class UnsupportedParallelizeOption(BadArgumentError):
    """A Parallelize option rnn2jax does not implement."""


def _unsupported(option: str, why: str) -> UnsupportedParallelizeOption:
    return UnsupportedParallelizeOption(
        f"data_parallel_model.Parallelize: {option} is not supported on rnn2jax ({why})"
    )


def Parallelize_GPU(*args: Any, **kwargs: Any) -> None:
    kwargs["cpu_device"] = False
    Parallelize(*args, **kwargs)


def Parallelize_CPU(*args: Any, **kwargs: Any) -> None:
    kwargs["cpu_device"] = True
    Parallelize(*args, **kwargs)


def Parallelize_iDeep(*args: Any, **kwargs: Any) -> None:
    kwargs["ideep"] = True
    Parallelize(*args, **kwargs)


def _scoped_per_device(model: Any, devices: Sequence[int], build: Callable[[int], Any]) -> dict[int, Any]:
    results = {}
    for device in devices:
        with (
            core.DeviceScope(core.DeviceOption(model._device_type, device)),
            core.NameScope(f"{model._device_prefix}_{device}"),
        ):
            results[device] = build(device)
    return results


def Parallelize(
    model_helper_obj: model_helper.ModelHelper,
    input_builder_fun: Callable[[Any], Any],
    forward_pass_builder_fun: Callable[[Any, float], Any],
    param_update_builder_fun: Callable[[Any], Any] | None = None,
    optimizer_builder_fun: Callable[[Any], Any] | None = None,
    post_sync_builder_fun: Callable[[Any], Any] | None = None,
    pre_grad_net_transformer_fun: Callable[[Any], Any] | None = None,
    net_transformer_fun: Callable[..., Any] | None = None,
    devices: Sequence[int] | None = None,
    rendezvous: Any = None,
    net_type: str = "dag",
    broadcast_computed_params: bool = True,
    optimize_gradient_memory: bool = False,
    dynamic_memory_management: bool = False,
    blobs_to_keep: Iterable[str] | None = None,
    use_nccl: bool = False,
    max_concurrent_distributed_ops: int = 16,
    cpu_device: bool = False,
    ideep: bool = False,
    num_threads_per_device: int = 4,
    shared_model: bool = False,
    combine_spatial_bn: bool = False,
    barrier_net_timeout_sec: int = _DEFAULT_BARRIER_NET_TIMEOUT_SEC,
) -> None:
    """Build `model_helper_obj` as data parallel over CPU `devices` (see the module docstring).

    `forward_pass_builder_fun(model, loss_scale)` returns the list of loss blobs; give one of
    `param_update_builder_fun(model)` (called per device, in its scopes) or `optimizer_builder_fun(model)`
    (called once, unscoped) for a training model, neither for a forward-only (test) model. With a
    `rendezvous` of several shards, this process joins the others here, before any net runs.
    """
    current = scope.CurrentDeviceScope()
    if current is not None and current.device_type != caffe2_pb2.CPU:
        raise BadArgumentError(f"Parallelize must be called without device-scope, device scope was: {current}")
    if not cpu_device or ideep:
        raise _unsupported(
            "GPU and iDeep devices" if not ideep else "ideep=True",
            "give cpu_device=True (Parallelize_CPU): rnn2jax builds the CPU form and runs it on the JAX host",
        )
    if rendezvous is not None:
        _CheckRendezvous(rendezvous)
    if shared_model:
        raise _unsupported("shared_model=True", "every device keeps its own parameter copy")
    if combine_spatial_bn:
        raise _unsupported("combine_spatial_bn=True", "no cross-device SpatialBN rewrite")
    if optimize_gradient_memory or dynamic_memory_management:
        raise _unsupported(
            "optimize_gradient_memory / dynamic_memory_management",
            "memonger's blob sharing has no counterpart: XLA plans the memory of a compiled net",
        )
    if param_update_builder_fun is not None and optimizer_builder_fun is not None:
        raise BadArgumentError("Can only specify one of param_update_builder_fun, optimizer_builder_fun")
    if not isinstance(model_helper_obj, model_helper.ModelHelper):
        raise BadArgumentError(f"Parallelize takes a ModelHelper, got {type(model_helper_obj).__name__}")

    model = model_helper_obj
    devices = list(range(cpu_count())) if devices is None else list(devices)
    num_shards = 1 if rendezvous is None else rendezvous["num_shards"]
    if num_shards > 1:
        _JoinShards(rendezvous, barrier_net_timeout_sec)
    model._device_type = caffe2_pb2.CPU
    model._device_prefix = "cpu"
    model._shared_model = shared_model
    log.info("Parallelizing model for devices: %s", devices)
    extra_workers = 8 if rendezvous is not None else 0  # Caffe2's best guess for the collectives
    num_workers = len(devices) * num_threads_per_device + extra_workers
    max_concurrent_distributed_ops = min(max_concurrent_distributed_ops, num_workers - 1)
    model.net.Proto().num_workers = num_workers
    model.net.Proto().type = net_type
    model._devices = devices
    model._rendezvous = rendezvous
    model._sync_barrier_net = None
    model._broadcast_context = None
    model._grad_names = []
    model._optimizer = None

    # Parameters created before: not data parallel, handled apart.
    non_datapar_params = copy.copy(model.params)
    loss_scale = 1.0 / (len(devices) * num_shards)
    has_parameter_updates = param_update_builder_fun is not None or optimizer_builder_fun is not None
    if not has_parameter_updates and model.init_params:
        log.warning(
            "Model %s is used for testing/validation but has init_params=True: running its param init net "
            "would overwrite the parameters the training model synchronized (use init_params=False)",
            model.name,
        )

    def build_forward(device: int) -> Any:
        input_builder_fun(model)
        losses = forward_pass_builder_fun(model, loss_scale)
        if has_parameter_updates and (
            not isinstance(losses, list) or not all(isinstance(b, core.BlobReference) for b in losses)
        ):
            raise BadArgumentError("Model builder function must return list of loss blobs")
        return losses

    losses_by_device = _scoped_per_device(model, devices, build_forward)
    _ValidateParams(model.params)

    model._device_grouped_blobs = _GroupByDevice(model, devices, model.params, non_datapar_params)
    computed_params_grouped = _GroupByDevice(model, devices, model.GetComputedParams(""), [])
    model._device_grouped_blobs.update(computed_params_grouped)
    model._param_names = list(model._device_grouped_blobs)
    model._computed_param_names = list(computed_params_grouped)

    if pre_grad_net_transformer_fun:
        pre_grad_net_transformer_fun(model)
    if has_parameter_updates:
        _AddGradientOperators(devices, model, losses_by_device)
    if net_transformer_fun:
        net_transformer_fun(model, len(devices), model._device_prefix, model._device_type)
    if not has_parameter_updates:
        log.info("Parameter update function not defined --> only forward")
        _InferBlobDevice(model)
        return

    _ValidateParams(model.params)
    param_to_grad = model.param_to_grad
    grads_ordered = [param_to_grad[p] for p in model.params if p in param_to_grad]
    non_datapar_grads = [param_to_grad[p] for p in non_datapar_params]
    gradients_grouped = _GroupByDevice(model, devices, grads_ordered, non_datapar_grads)
    model._device_grouped_blobs.update(gradients_grouped)
    model._grad_names = list(gradients_grouped)
    model._losses_by_gpu = losses_by_device
    _InferBlobDevice(model)

    if broadcast_computed_params:
        _BroadcastComputedParams(devices, model, rendezvous, use_nccl)
    if model._grad_names:
        _AllReduceBlobs(
            _GetReverseOrderedGrads(model),
            devices,
            model,
            model.net,
            rendezvous,
            use_nccl,
            max_concurrent_distributed_ops,
        )

    if param_update_builder_fun is not None:
        _scoped_per_device(model, devices, lambda _device: param_update_builder_fun(model))
    else:
        model._optimizer = optimizer_builder_fun(model)

    sync_blobs, sync_names = _ComputeBlobsToSync(model)
    model._device_grouped_blobs.update(_GroupByDevice(model, devices, sync_blobs, []))
    _InferBlobDevice(model)

    # Caffe2's DAG net ran its first iteration on one worker (allocation and NCCL races); kept for equal nets.
    model.Proto().arg.add(name="first_iter_only_one_worker", i=1)

    _SyncAllParams(
        devices,
        model,
        model.param_init_net,
        model.param_init_net,
        rendezvous,
        sync_names,
        max_concurrent_distributed_ops=1,
    )
    if post_sync_builder_fun is not None:
        _scoped_per_device(model, devices, lambda _device: post_sync_builder_fun(model))
    model._data_parallel_model_init_nets = [model.param_init_net]
    model._data_parallel_model_nets = [model.net]
    _AddBarrierToModelNets(model, barrier_net_timeout_sec)


_RENDEZVOUS_KEYS = ("kv_handler", "shard_id", "num_shards", "engine")


def _CheckRendezvous(rendezvous: Any) -> None:
    """The rendezvous dict Caffe2 reads: kv_handler, shard_id, num_shards and engine GLOO."""
    where = "data_parallel_model.Parallelize: rendezvous"
    if not isinstance(rendezvous, dict):
        raise BadArgumentError(
            f"{where} must be a dict ({', '.join(_RENDEZVOUS_KEYS)}), got {type(rendezvous).__name__}"
        )
    missing = [key for key in _RENDEZVOUS_KEYS if key not in rendezvous]
    if missing:
        raise BadArgumentError(
            f"{where} lacks {', '.join(repr(k) for k in missing)} (it needs {', '.join(_RENDEZVOUS_KEYS)})"
        )
    shards, shard = rendezvous["num_shards"], rendezvous["shard_id"]
    if not isinstance(shards, int) or not isinstance(shard, int) or shards < 1 or not 0 <= shard < shards:
        raise BadArgumentError(f"{where}: shard_id {shard!r} of num_shards {shards!r}: need 0 <= shard_id < num_shards")
    if rendezvous["engine"] != "GLOO":
        raise _unsupported(
            f"rendezvous engine {rendezvous['engine']!r}",
            "give engine='GLOO': the collectives run on JAX's runtime, Gloo between CPUs and NCCL between GPUs",
        )


def _JoinShards(rendezvous: dict[str, Any], timeout_sec: float) -> None:
    """Join JAX's multi-process runtime as shard `shard_id` now, before the nets run: JAX can start it only
    before its backend. The store is the `kv_handler` blob; the shards wait for each other up to the barrier's
    timeout, as Caffe2's pre-training barrier did."""
    where = "data_parallel_model.Parallelize"
    store = None
    if rendezvous["kv_handler"]:
        name = str(rendezvous["kv_handler"])
        if not workspace.HasBlob(name):
            raise BadArgumentError(
                f"{where}: rendezvous kv_handler '{name}' is no blob of the workspace; create it first with "
                "FileStoreHandlerCreate (or RedisStoreHandlerCreate)"
            )
        store = workspace.FetchBlob(name)
        if not isinstance(store, distributed.StoreHandler):
            raise BadArgumentError(
                f"{where}: rendezvous kv_handler '{name}' holds no store handler (make it with FileStoreHandlerCreate)"
            )
    distributed.join(
        store,
        rendezvous["num_shards"],
        rendezvous["shard_id"],
        where=where,
        interface=rendezvous.get("interface") or "",
        timeout=timeout_sec,
    )


# ------------------------------------------------------------------------------------------------
# Running


def CreateNet(model: Any, overwrite: bool = False) -> None:
    for net in model._data_parallel_model_nets:
        workspace.CreateNet(net[0] if isinstance(net, tuple) else net, overwrite=overwrite)


def RunInitNet(model: Any) -> None:
    for init_net in model._data_parallel_model_init_nets:
        workspace.RunNetOnce(init_net)
    CreateNet(model)


def RunNet(model: Any, num_iterations: int) -> None:
    for net in model._data_parallel_model_nets:
        if isinstance(net, tuple):
            workspace.RunNet(net[0].Proto().name, net[1])
        else:
            workspace.RunNet(net, num_iterations)


def _AddBarrierToModelNets(model: Any, barrier_net_timeout_sec: int) -> None:
    """Across hosts, a barrier net before the training net (and its common world's init net before the init
    net): shards that start an epoch sooner wait for the slower ones, as in Caffe2."""
    if model._rendezvous is not None and model._rendezvous["engine"] == "GLOO":
        model._barrier_init_net = core.Net("barrier_init_net")
        model._barrier_net = _CreateBarrierNet(model, model._barrier_init_net, "pre_training", barrier_net_timeout_sec)
        model._data_parallel_model_init_nets.insert(0, model._barrier_init_net)
        model._data_parallel_model_nets.insert(0, model._barrier_net)


def _CreateBarrierNet(model: Any, init_net: core.Net, name_prefix: str, timeout_sec: int) -> core.Net:
    comm_world = _CreateOrCloneCommonWorld(
        init_net, name_prefix + "_barrier_cw", rendezvous=model._rendezvous, timeout_sec=timeout_sec
    )
    barrier_net = core.Net(name_prefix + "_barrier_net")
    barrier_net.Barrier(inputs=[comm_world], outputs=[], engine=model._rendezvous["engine"])
    return barrier_net


def Synchronize(model: Any, timeout_sec: int = _DEFAULT_BARRIER_NET_TIMEOUT_SEC) -> None:
    """Deprecated in Caffe2 (Parallelize adds a barrier net): a barrier between the shards."""
    warnings.warn(
        "The Synchronize API has been deprecated: Parallelize adds a barrier net that runs before training "
        "(its timeout is Parallelize's barrier_net_timeout_sec)",
        category=DeprecationWarning,
        stacklevel=2,
    )
    if model._rendezvous is None or model._rendezvous["num_shards"] <= 1:
        return
    if model._sync_barrier_net is None:
        barrier_init_net = core.Net("sync_barrier_init_net")
        model._sync_barrier_net = _CreateBarrierNet(model, barrier_init_net, "sync", timeout_sec)
        workspace.RunNetOnce(barrier_init_net)
        workspace.CreateNet(model._sync_barrier_net)
        model._sync_barrier_net_timeout = timeout_sec
    if model._sync_barrier_net_timeout != timeout_sec:
        raise BadArgumentError(
            "data_parallel_model.Synchronize: must use fixed timeout, "
            f"{model._sync_barrier_net_timeout} != {timeout_sec}"
        )
    workspace.RunNet(model._sync_barrier_net)


# ------------------------------------------------------------------------------------------------
# Nets for export and checkpoints


def ConvertNetForDevice(net: core.Net, device: caffe2_pb2.DeviceOption | None = None) -> core.Net:
    """A copy of `net` with every blob under `cpu_<id>/` (`gpu_<id>/` for a GPU device) and every op on
    `device` (the current device scope by default), for `AppendNet` inside a forward builder."""
    mnet = copy.deepcopy(net)
    device = device if device is not None else scope.CurrentDeviceScope()
    if device is None:
        raise BadArgumentError("ConvertNetForDevice: give a device, or call it inside a device scope")
    prefix = "gpu" if core.IsGPUDeviceType(device.device_type) else "cpu"
    namescope = f"{prefix}_{device.device_id}/"
    proto = mnet.Proto()
    for op in proto.op:
        if "RecurrentNetwork" in op.type:
            raise NotImplementedError("RecurrentNetwork conversion not yet supported")
        op.input[:] = [namescope + b for b in op.input]
        op.output[:] = [namescope + b for b in op.output]
        op.control_input[:] = [namescope + b for b in op.control_input]
        op.device_option.CopyFrom(device)
    proto.external_input[:] = [namescope + b for b in proto.external_input]
    proto.external_output[:] = [namescope + b for b in proto.external_output]
    return mnet


def ExtractPredictorNet(
    model: Any, inputs: Sequence[str], outputs: Sequence[str], device: caffe2_pb2.DeviceOption
) -> tuple[core.Net, list[str]]:
    """The predict net of the first device's copy, its blobs without the `cpu_<d>/` prefix for inputs
    and outputs; returns (net, blobs to export) as `model_helper.ExtractPredictorNet`."""
    prefix = f"{model._device_prefix}_{model._devices[0]}/"
    prefix_inputs = [prefix + str(b) for b in inputs]
    prefix_outputs = [prefix + str(b) for b in outputs]
    return model_helper.ExtractPredictorNet(
        net_proto=model.net.Proto(),
        input_blobs=prefix_inputs,
        output_blobs=prefix_outputs,
        device=device,
        renames=dict(zip(prefix_inputs + prefix_outputs, [str(b) for b in [*inputs, *outputs]], strict=True)),
    )


def GetCheckpointParams(model: Any) -> set[core.BlobReference]:
    """What a complete checkpoint needs: the first device's init-net blobs, and iteration counters."""
    all_blobs, _ = _ComputeBlobsToSync(model)
    first = f"{model._device_prefix}_{model._devices[0]}/"
    first_device_blobs = {b for b in all_blobs if str(b).startswith(first)}
    iteration_blobs = {
        core.BlobReference(op.output[0])
        for op in model.net.Proto().op
        if op.type in ("Iter", "AtomicIter") and not op.output[0].startswith(f"{model._device_prefix}_")
    }
    return first_device_blobs | iteration_blobs


def FinalizeAfterCheckpoint(model: Any, blobs: Iterable[Any] | None = None, cpu_mode: bool = False) -> None:
    """After loading a checkpoint of the first device's blobs: copy them to the other devices, and across
    hosts broadcast shard 0's (a `checkpoint_sync_net`, created once, run on every call)."""
    if not hasattr(model, "_checkpoint_net"):
        if blobs is None:
            _, unique_names = _ComputeBlobsToSync(model)
        else:
            unique_names = [stripBlobName(p) for p in blobs]
        devices = model.GetDevices()
        for name in unique_names:
            if name not in model._device_grouped_blobs:
                model._device_grouped_blobs[name] = {
                    d: core.BlobReference(f"{model._device_prefix}_{d}{scope._NAMESCOPE_SEPARATOR}{name}")
                    for d in devices
                }
        model._checkpoint_net = core.Net("checkpoint_sync_net")
        if not cpu_mode:
            model._checkpoint_net.RunAllOnGPU()
        checkpoint_init_net = None
        if model._rendezvous is not None and model._rendezvous["num_shards"] > 1:
            checkpoint_init_net = core.Net("checkpoint_init_net")
            if not cpu_mode:
                checkpoint_init_net.RunAllOnGPU()
        _SyncAllParams(
            devices,
            model,
            checkpoint_init_net,
            model._checkpoint_net,
            model._rendezvous,
            unique_names,
            max_concurrent_distributed_ops=1,
        )
        if checkpoint_init_net is not None:
            workspace.RunNetOnce(checkpoint_init_net)
        workspace.CreateNet(model._checkpoint_net)
    workspace.RunNet(model._checkpoint_net.Proto().name)


def GetLearningRateBlobNames(model: Any) -> list[str]:
    """The learning-rate blobs: the optimizer's CPU `lr` blob, or every LearningRate op's output."""
    if getattr(model, "_optimizer", None) is not None:
        return [model._optimizer.get_cpu_blob_name("lr")]
    return [op.output[0] for op in model.net.Proto().op if op.type == "LearningRate"]


def AddBlobSync(model: Any, blobs: Iterable[Any], net: core.Net | None = None) -> None:
    """Copy `blobs` (names of device 0's copies, or unscoped names) from device 0 to the other devices, and
    across hosts from shard 0 to the others, at the end of `net` (the model's net by default)."""
    names = [stripBlobName(b) for b in blobs]
    for name in names:
        if name not in model._device_grouped_blobs:
            model._device_grouped_blobs[name] = {
                d: core.BlobReference(f"{model._device_prefix}_{d}/{name}") for d in model._devices
            }
    _SyncAllParams(model._devices, model, model.param_init_net, net or model.net, model._rendezvous, names)


def AddDistributedBlobSync(model: Any, blobs: Sequence[Any]) -> None:
    """Sum `blobs` over the shards (not over the devices) at the end of the model's net."""
    if model._rendezvous is None:
        return
    synth_name = "_".join(str(b) for b in blobs)
    comm_world = _CreateOrCloneCommonWorld(
        model.param_init_net, "blob_sync_cw_" + synth_name, rendezvous=model._rendezvous
    )
    model.net.Allreduce(inputs=[comm_world, *blobs], outputs=blobs, engine=model._rendezvous["engine"])


# ------------------------------------------------------------------------------------------------
# Building blocks (Caffe2's private helpers, which scripts sometimes call)


def _AddGradientOperators(devices: Sequence[int], model: Any, losses_by_gpu: dict[int, Any]) -> None:
    loss_grad = {}
    for device in devices:
        with core.DeviceScope(core.DeviceOption(model._device_type, device)):
            for loss in losses_by_gpu[device]:
                loss_grad[str(loss)] = str(model.ConstantFill(loss, str(loss) + "_grad", value=1.0))
    model.AddGradientOperators(loss_grad)


def _Broadcast(devices: Sequence[int], model: Any, net: core.Net, param: str, use_nccl: bool = False) -> None:
    """Copy device 0's copy of `param` to the other devices (the Copy ops run on CPU device 0)."""
    master = devices[0]
    for device in devices[1:]:
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
            net.Copy(model._device_grouped_blobs[param][master], model._device_grouped_blobs[param][device])


def _SyncAllParams(
    devices: Sequence[int],
    model: Any,
    init_net: core.Net | None,
    net: core.Net,
    rendezvous: Any,
    unique_param_names: Iterable[str],
    max_concurrent_distributed_ops: int = 4,
) -> None:
    if rendezvous is None or rendezvous["num_shards"] <= 1:
        for param in unique_param_names:
            _Broadcast(devices, model, net, param)
        return
    _SyncAllParamsDistributed(
        devices, model, init_net, net, rendezvous, unique_param_names, max_concurrent_distributed_ops
    )


def _SyncAllParamsDistributed(
    devices: Sequence[int],
    model: Any,
    init_net: core.Net | None,
    net: core.Net,
    rendezvous: dict[str, Any],
    unique_param_names: Iterable[str],
    max_concurrent_distributed_ops: int,
) -> None:
    """Per parameter (sorted by name): one Broadcast of shard 0's device-0 copy to every copy of every shard."""
    if model._broadcast_context is None:
        model._broadcast_context = CollectivesConcurrencyControl(
            "broadcast", max_concurrent_distributed_ops, init_net, rendezvous
        )
    context = model._broadcast_context
    for param_name in sorted(unique_param_names):
        params_group = list(model._device_grouped_blobs[param_name].values())
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
            comm_world, control_input = context.get_control_and_context(params_group)
            net.Broadcast(
                inputs=[comm_world, *params_group],
                outputs=params_group,
                name=param_name,
                engine=rendezvous["engine"],
                control_input=control_input,
            )


def _AllReduceBlobs(
    blob_names: Sequence[str],
    devices: Sequence[int],
    model: Any,
    net: core.Net,
    rendezvous: Any,
    use_nccl: bool,
    max_concurrent_distributed_ops: int,
) -> None:
    """On one host, per blob: Sum of all device copies into device 0's, then broadcast back; across hosts,
    one Allreduce of every copy of every shard."""
    if rendezvous is not None and rendezvous["num_shards"] > 1:
        _AllReduceBlobsDistributed(blob_names, devices, model, net, rendezvous, max_concurrent_distributed_ops)
        return
    if len(devices) == 1:
        return
    for blob_name in blob_names:
        group = list(model._device_grouped_blobs[blob_name].values())
        if len(group) == 1:
            continue  # not data parallel
        if len(group) != len(devices):
            raise BadArgumentError(f"Each device from {list(devices)} should have a copy of {blob_name}.")
        if isinstance(group[0], core.GradientSlice):
            raise _unsupported(
                f"the sparse gradient of '{blob_name}'", "Caffe2 synchronized GradientSlices on GPUs only"
            )
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
            net.Sum(group, [group[0]])
            _Broadcast(devices, model, net, blob_name)


class CollectivesConcurrencyControl:
    """Caffe2's pool of common worlds for a kind of collective: up to `max_concurrent_context` worlds (made in
    `param_init_net`), used in turn, each collective given the previous one of its world as control input."""

    def __init__(self, name: str, max_concurrent_context: int, param_init_net: core.Net | None, rendezvous: Any):
        self.name = name
        self.param_init_net = param_init_net
        self.max_concurrent_context = max_concurrent_context
        self.counter = 0
        self.common_worlds: list[Any] = []
        self.control_inputs: list[Any] = []
        self.rendezvous = rendezvous

    def get_control_and_context(self, control_output_blob: Any) -> tuple[Any, Any]:
        common_world, control_input = None, None
        current_slot = self.counter % self.max_concurrent_context
        if len(self.common_worlds) < self.max_concurrent_context:
            if self.param_init_net is None:
                raise BadArgumentError(
                    "data_parallel_model: a collective across hosts needs an init net for its common world"
                )
            common_world = _CreateOrCloneCommonWorld(
                self.param_init_net, f"{self.name}_{current_slot}_cw", rendezvous=self.rendezvous
            )
            self.common_worlds.append(common_world)
            self.control_inputs.append(control_output_blob)
        else:
            common_world = self.common_worlds[current_slot]
            control_input = self.control_inputs[current_slot]
            self.control_inputs[current_slot] = control_output_blob
        self.counter += 1
        return common_world, control_input


def _CreateOrCloneCommonWorld(
    net: core.Net, common_world_blob: str, rendezvous: Any, name: str | None = None, timeout_sec: int | None = None
) -> core.BlobReference:
    """A CreateCommonWorld op in `net`, or a CloneCommonWorld of one it has with the same timeout."""
    timeout_ms = (_DEFAULT_TIMEOUT_SEC if timeout_sec is None else timeout_sec) * 1000
    existing = None
    for op in net.Proto().op:
        if op.type != "CreateCommonWorld":
            continue
        op_timeout_ms = next((arg.i for arg in op.arg if arg.name == "timeout_ms"), -1)
        if op_timeout_ms == timeout_ms:
            existing = op.output[0]
            break
    if name is None:
        name = f"{common_world_blob}_op"
    if existing is not None:
        return net.CloneCommonWorld([existing], common_world_blob, name=name, engine=rendezvous["engine"])
    kwargs = {key: rendezvous[key] for key in ("transport", "interface", "mpi_rendezvous") if key in rendezvous}
    return net.CreateCommonWorld(
        rendezvous["kv_handler"] or [],
        common_world_blob,
        name=name,
        size=rendezvous["num_shards"],
        rank=rendezvous["shard_id"],
        engine=rendezvous["engine"],
        timeout_ms=timeout_ms,
        **kwargs,
    )


def _AllReduceBlobsDistributed(
    blob_names: Sequence[str],
    devices: Sequence[int],
    model: Any,
    net: core.Net,
    rendezvous: dict[str, Any],
    max_concurrent_distributed_ops: int,
) -> None:
    """Per blob: one Allreduce (GLOO: across devices and hosts at once) over every device copy, on device 0."""
    if model.net.Proto().num_workers <= 1:
        raise BadArgumentError("data_parallel_model: please specify more than 1 worker")
    reducing_device_opt = core.DeviceOption(model._device_type, devices[0])
    context = CollectivesConcurrencyControl(
        "allreduce", max_concurrent_distributed_ops, model.param_init_net, rendezvous
    )
    for blob_name in blob_names:
        blobs_group = list(model._device_grouped_blobs[blob_name].values())
        if isinstance(blobs_group[0], core.GradientSlice):
            raise _unsupported(
                f"the sparse gradient of '{blob_name}'", "Caffe2 synchronized GradientSlices on GPUs only"
            )
        with core.DeviceScope(reducing_device_opt):
            comm_world, control_input = context.get_control_and_context(blobs_group[0])
            net.Allreduce(
                inputs=[comm_world, *blobs_group],
                outputs=blobs_group,
                name=blob_name,
                engine=rendezvous["engine"],
                control_input=control_input,
                gpu_direct=rendezvous.get("transport") == "ibverbs",
            )


def _BroadcastComputedParams(devices: Sequence[int], model: Any, rendezvous: Any, use_nccl: bool = False) -> None:
    """Computed parameters are copied from device 0 (Caffe2 did not average them, nor send them across
    hosts: it warned that it did not)."""
    if rendezvous is not None:
        log.warning("Distributed broadcast of computed params is not implemented yet")
    if len(devices) == 1:
        return
    for param_name in model._computed_param_names:
        _Broadcast(devices, model, model.net, param_name, use_nccl)


def _GetReverseOrderedGrads(model: Any) -> list[str]:
    """The gradient names, last parameter first: the order backprop makes them available."""
    return list(reversed(model._grad_names))


def stripBlobName(param: Any) -> str:
    """The blob name without its first scope: `cpu_0/fc/w` -> `fc/w`."""
    if isinstance(param, core.GradientSlice):
        return stripBlobName(param.indices) + ":" + stripBlobName(param.values)
    name = str(param)
    return name[name.index(scope._NAMESCOPE_SEPARATOR) + 1 :]


def _InferBlobDevice(model: Any) -> None:
    """`model._blob_to_device`: each blob's device, from the first op (init net first) that uses it."""
    mapping: dict[str, caffe2_pb2.DeviceOption] = {}

    def map_ops(proto: caffe2_pb2.NetDef) -> None:
        for op in proto.op:
            device_option = op.device_option
            if op.type == "Iter":  # its counter lives on the CPU
                device_option = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU)
            for blob in [*op.input, *op.output]:
                mapping.setdefault(blob, device_option)
            if op.type.startswith("RecurrentNetwork"):
                for arg in op.arg:
                    if arg.name.endswith("step_net"):
                        map_ops(arg.n)

    map_ops(model.param_init_net.Proto())
    map_ops(model.net.Proto())
    model._blob_to_device = mapping


def _GroupByDevice(
    model: Any, devices: Sequence[int], params: Sequence[Any], non_data_params: Sequence[Any]
) -> OrderedDict[str, dict[int, Any]]:
    """`{unscoped name: {device: blob}}` for the data-parallel blobs (those after `non_data_params`),
    in their order; each must be under its device's `cpu_<d>/` scope."""
    grouped: OrderedDict[str, dict[int, Any]] = OrderedDict()
    for p in params[len(non_data_params) :]:
        blob = p.indices if isinstance(p, core.GradientSlice) else p
        if not isinstance(blob, core.BlobReference):
            raise BadArgumentError(f"Param {p} is not BlobReference or GradientSlice")
        namescope = blob.GetNameScope()
        try:
            device = int(namescope.split("_")[1].split("/")[0])
        except (IndexError, ValueError):
            raise BadArgumentError(
                f"Param {p} expected to have namescope '{model._device_prefix}_<device>/' "
                "(was it created outside the forward builder?)"
            ) from None
        expected = f"{model._device_prefix}_{device}/"
        scoped = [blob] if not isinstance(p, core.GradientSlice) else [p.indices, p.values]
        if any(expected not in b.GetNameScope() for b in scoped):
            raise BadArgumentError(f"Param {p} expected to have namescope '{model._device_prefix}_{device}'")
        grouped.setdefault(stripBlobName(p), {})[device] = p
    return grouped


def _ValidateParams(params: Sequence[Any]) -> None:
    dupes = sorted({str(p) for p in params if list(params).count(p) > 1})
    if dupes:
        raise BadArgumentError(f"Duplicate entries in params: {dupes}")


def _ComputeBlobsToSync(model: Any) -> tuple[list[core.BlobReference], set[str]]:
    """Every device-scoped blob the init net writes (sorted by device, then name), and their unscoped names."""
    sync_names: set[str] = set()
    blobs_to_sync: list[str] = []
    prefix = f"{model._device_prefix}_"
    for op in model.param_init_net.Proto().op:
        dp_outputs = [o for o in op.output if o.startswith(prefix)]
        sync_names.update(stripBlobName(o) for o in dp_outputs)
        blobs_to_sync.extend(dp_outputs)
    missing = set(model._param_names) - sync_names
    if missing:
        raise BadArgumentError(f"Some params not instantiated in param init net: {sorted(missing)}")

    def sort_key(blob: str) -> tuple[int, str]:
        return int(blob[len(prefix) : blob.index(scope._NAMESCOPE_SEPARATOR)]), blob

    return [core.BlobReference(b) for b in sorted(set(blobs_to_sync), key=sort_key)], sync_names
