"""Caffe2's `optimizer`: build the parameter-update ops of a model into its `net` and `param_init_net`.

The nets are Caffe2's, op for op: the shared iteration counter (`utils.BuildUniqueMutexIter`: an int64
ConstantFill and a CreateMutex in `param_init_net`, AtomicIter in `net`), one LearningRate blob per
optimizer instance named `<Class>_<instance>_lr_cpu` (instances are counted per process, as Caffe2
did, so a second `build_sgd` makes `SgdOptimizer_1_lr_cpu`), a `ONE_<device type>_<device id>` blob
filled once per parameter (Caffe2 re-emits the fill for every parameter), and then each parameter's
update op (WeightedSum, MomentumSGDUpdate, Adagrad, Adam, RmsProp + MomentumSGDUpdate, or their
sparse forms for a `GradientSlice` gradient). Each parameter's ops are built under the device of
the op that created it, which gives them Caffe2's `device_option {}`.

Learning rates are negated where Caffe2 negated them ("descent"): plain SGD's LearningRate has
`base_lr = -lr` and WeightedSum adds `lr * grad`; with momentum the rate stays positive because
MomentumSGDUpdate subtracts. The counter is int64 in Caffe2; with JAX's x64 mode off it lives as
int32 (the fill and AtomicIter follow JAX's integer width), which only matters past 2^31 iterations.

Also Wngrad, Storm, Adadelta, Ftrl, GFtrl, DecayAdagrad and YellowFin, Adagrad's row counters
(`counter_halflife`), and Adam's smart decay and learning-rate adaption, as Caffe2 builds them.

Not provided: the fp16 paths (no HalfToFloat/FloatToHalf ops), Adagrad's pruning masks, SWA, EMA and
weight scaling; these raise.
"""

from __future__ import annotations

import logging
from collections import defaultdict, namedtuple
from typing import Any

import numpy as np

from ...errors import BadArgumentError
from ..proto import caffe2_pb2
from . import core, scope, utils, workspace
from .model_helper import ParameterInfo

_LEARNING_RATE_INJECTION = "lr_injection"

AuxOptimizerParams = namedtuple("AuxOptimizerParams", ["local", "shared"])
_optimizer_instance_count: defaultdict[str, int] = defaultdict(int)

FP16_ENGINES = ["SIMD_Q_FP16", "SIMD_Q_STOC_FP16", "SIMD_Q_STOC_MKL_FP16"]

logger = logging.getLogger(__name__)


def reset_optimizer_instance_count() -> None:
    """Restart the per-class instance numbers that go into optimizer blob names (`SgdOptimizer_0_...`)."""
    _optimizer_instance_count.clear()


def _not_supported(what: str) -> BadArgumentError:
    return BadArgumentError(f"caffe2.python.optimizer: {what} is not supported by rnn2jax's Caffe2 API")


class Optimizer:
    """Adds the update ops for one parameter per call: `optimizer(net, param_init_net, param, grad)`,
    with `param` a ParameterInfo (its `.grad` set) or a blob name and `grad` its gradient."""

    def __init__(self) -> None:
        self._aux_params = AuxOptimizerParams(local=[], shared=[])
        self._instance_num = _optimizer_instance_count[self.__class__.__name__]
        _optimizer_instance_count[self.__class__.__name__] += 1
        self._lr_multiplier: Any = None
        self._local_lr_multiplier: Any = None
        self._local_lr_multiplier_on_gpu = False

    def __call__(self, net: core.Net, param_init_net: core.Net, param: Any, grad: Any = None) -> None:
        if grad is None:
            if not isinstance(param, ParameterInfo):
                raise TypeError(f"Expected parameter to be of type ParameterInfo, got {param}")
            if param.grad is None:
                raise ValueError(f"parameter {param} has no gradient")
        else:
            if isinstance(param, str) and not isinstance(param, core.BlobReference):
                param = core.BlobReference(param)
            param = ParameterInfo(param_id=None, param=param, grad=grad)
        self._run(net, param_init_net, param)

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        raise NotImplementedError("Not Implemented")

    def get_cpu_blob_name(self, base_str: str, node_name: str = "") -> str:
        return f"{self.__class__.__name__}_{self._instance_num}_{base_str}{node_name}_cpu"

    def get_gpu_blob_name(self, base_str: str, gpu_id: int, node_name: str) -> str:
        return f"{self.__class__.__name__}_{self._instance_num}_{base_str}{node_name}_gpu{gpu_id}"

    @property
    def attributes(self) -> dict[str, Any]:
        """The constructor's settings (everything but the instance number)."""
        import copy

        attr = copy.deepcopy(self.__dict__)
        del attr["_instance_num"]
        return attr

    def make_unique_blob_name(self, base_str: str) -> str:
        """A blob name unique to this optimizer instance and the current device."""
        current = scope.CurrentDeviceScope()
        if current is None:
            return self.get_cpu_blob_name(base_str)
        if core.IsGPUDeviceType(current.device_type):
            return self.get_gpu_blob_name(base_str, current.device_id, current.node_name)
        return self.get_cpu_blob_name(base_str, current.node_name)

    def build_lr(
        self,
        net: core.Net,
        param_init_net: core.Net,
        base_learning_rate: float,
        learning_rate_blob: str | None = None,
        policy: str = "fixed",
        iter_val: int = 0,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """The shared counter and this instance's LearningRate blob (made once per net), scaled by the
        global and local multipliers when set. `base_lr` is `-base_learning_rate`: Caffe2 descends."""
        if learning_rate_blob is None:
            learning_rate_blob = self.make_unique_blob_name("lr")
        iteration = utils.BuildUniqueMutexIter(param_init_net, net, iter_val=iter_val)
        if not net.BlobIsDefined(learning_rate_blob):
            lr = net.LearningRate([iteration], learning_rate_blob, base_lr=-base_learning_rate, policy=policy, **kwargs)
        else:
            lr = net.GetBlobRef(learning_rate_blob)
        if self._lr_multiplier is not None:
            multiplier = net.CopyFromCPUInput(self._lr_multiplier, self.make_unique_blob_name("lr_multiplier"))
            lr = net.Mul([lr, multiplier], self.make_unique_blob_name("scaled_lr"), broadcast=1)
        if self._local_lr_multiplier is not None:
            current = scope.CurrentDeviceScope()
            local = self._local_lr_multiplier
            if (
                current is not None
                and core.IsGPUDeviceType(current.device_type)
                and not self._local_lr_multiplier_on_gpu
            ):
                local = net.CopyFromCPUInput(local, self.make_unique_blob_name("local_lr_multiplier"))
            lr = net.Mul([lr, local], self.make_unique_blob_name("local_scaled_lr"), broadcast=1)
        return lr, iteration

    def add_lr_multiplier(self, lr_multiplier: Any) -> None:
        """Multiply every later learning rate by the blob `lr_multiplier` (replaces an earlier one)."""
        self._lr_multiplier = lr_multiplier

    def _add_local_lr_multiplier(self, local_lr_multiplier: Any, is_gpu_blob: bool = False) -> None:
        self._local_lr_multiplier = local_lr_multiplier
        self._local_lr_multiplier_on_gpu = is_gpu_blob

    def _clear_local_lr_multiplier(self) -> None:
        self._local_lr_multiplier = None
        self._local_lr_multiplier_on_gpu = False

    @staticmethod
    def dedup(net: core.Net, sparse_dedup_aggregator: str | None, grad: Any) -> Any:
        """Merge repeated indices of a sparse gradient when an aggregator is named."""
        if not isinstance(grad, core.GradientSlice):
            raise TypeError(f"Dedup only works for sparse gradient, got {grad}")
        if sparse_dedup_aggregator:
            return net.DeduplicateGradientSlices(grad, aggregator=sparse_dedup_aggregator)
        return grad

    def get_auxiliary_parameters(self) -> AuxOptimizerParams:
        """Blobs the optimizer added: `local` (one per parameter, e.g. momenta) and `shared` (ONE,
        the counter)."""
        return self._aux_params

    def scale_learning_rate(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("Optimizer Need to Implement `scale_learning_rate` method.")

    def create_lars_inputs(self, param_init_net: core.Net, weight_decay: float, trust: float, lr_max: float) -> tuple:
        wd = param_init_net.ConstantFill([], "weight_decay", shape=[1], value=weight_decay)
        trust_blob = param_init_net.ConstantFill([], "trust", shape=[1], value=trust)
        lr_max_blob = param_init_net.ConstantFill([], "lr_max", shape=[1], value=lr_max)
        return wd, trust_blob, lr_max_blob

    def _add_lars(self, net: core.Net, param_init_net: core.Net, param: Any, grad: Any, offset: float) -> None:
        """LARS: a per-parameter learning-rate multiplier from the norms of the parameter and gradient."""
        if offset < 0:
            raise ValueError(f"Lars offset must be nonnegative, got {offset}")
        wd, trust, lr_max = self.create_lars_inputs(param_init_net, 0.0, 1.0, np.finfo(np.float32).max)
        multiplier = net.Lars(
            [param, grad, wd, trust, lr_max],
            self.make_unique_blob_name(str(param) + "_lars"),
            offset=offset,
            lr_min=0.0,
        )
        current = scope.CurrentDeviceScope()
        self._add_local_lr_multiplier(
            multiplier, is_gpu_blob=current is not None and core.IsGPUDeviceType(current.device_type)
        )


def _device() -> caffe2_pb2.DeviceOption:
    current = scope.CurrentDeviceScope()
    return current if current is not None else core.DeviceOption(caffe2_pb2.CPU)


class SgdOptimizer(Optimizer):
    """SGD: `WeightedSum(param, ONE, grad, lr)` (lr negative), or MomentumSGDUpdate with `momentum`."""

    def __init__(
        self,
        base_learning_rate: float = 0.01,
        policy: str = "fixed",
        momentum: float = 0.0,
        nesterov: bool = True,
        sparse_dedup_aggregator: str | None = None,
        lars: float | None = None,
        **kwargs: Any,
    ):
        super().__init__()
        self.base_learning_rate = base_learning_rate
        self.policy = policy
        self.momentum = momentum
        self.nesterov = nesterov
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.lars = lars
        self.init_kwargs = kwargs

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.base_learning_rate == 0:
            return
        if self.base_learning_rate < 0:
            raise ValueError(f"Expect positive base learning rate, got {self.base_learning_rate}")
        self._clear_local_lr_multiplier()
        if self.lars is not None and not isinstance(grad, core.GradientSlice):
            self._add_lars(net, param_init_net, param, grad, self.lars)
        # WeightedSum adds lr * grad, so plain SGD needs a negative rate; MomentumSGDUpdate subtracts.
        lr_sign = -1 if self.momentum else 1
        lr, _ = self.build_lr(
            net,
            param_init_net,
            base_learning_rate=self.base_learning_rate * lr_sign,
            policy=self.policy,
            **self.init_kwargs,
        )
        dev = _device()
        one = param_init_net.ConstantFill(
            [], f"ONE_{dev.device_type}_{dev.device_id}{dev.node_name}", shape=[1], value=1.0
        )
        self._aux_params.shared.append(one)
        if self.momentum > 0:
            momentum_data = param_init_net.ConstantFill(param, str(param) + "_momentum", value=0.0)
            self._aux_params.local.append(momentum_data)
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            if self.momentum > 0.0:
                net.SparseMomentumSGDUpdate(
                    [grad.values, momentum_data, lr, param, grad.indices],
                    [grad.values, momentum_data, param],
                    momentum=self.momentum,
                    nesterov=self.nesterov,
                )
            else:
                net.ScatterWeightedSum([param, one, grad.indices, grad.values, lr], param)
        elif self.momentum > 0.0:
            net.MomentumSGDUpdate(
                [grad, momentum_data, lr, param],
                [grad, momentum_data, param],
                momentum=self.momentum,
                nesterov=self.nesterov,
            )
        else:
            net.WeightedSum([param, one, grad, lr], param)

    def scale_learning_rate(self, scale: float) -> None:
        self.base_learning_rate *= scale


class MultiPrecisionSgdOptimizer(SgdOptimizer):
    """SGD on an fp32 master copy of fp16 parameters; plain SGD for parameters without a copy (the
    only case here: rnn2jax has no HalfToFloat/FloatToHalf)."""

    def __init__(
        self,
        base_learning_rate: float = 0.1,
        momentum: float = 0.0,
        policy: str = "fixed",
        nesterov: bool = True,
        sparse_dedup_aggregator: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(
            base_learning_rate=base_learning_rate,
            policy=policy,
            momentum=momentum,
            nesterov=nesterov,
            sparse_dedup_aggregator=sparse_dedup_aggregator,
            **kwargs,
        )

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        if param_info.blob_copy is None or core.DataType.FLOAT not in param_info.blob_copy:
            return SgdOptimizer._run(self, net, param_init_net, param_info)
        raise _not_supported(f"multi-precision SGD of the fp16 parameter '{param_info.blob}'")


class WeightDecayBuilder(Optimizer):
    """L2 regularisation: `grad += weight_decay * param` (WeightedSum in place on the gradient)."""

    def __init__(self, weight_decay: float):
        # Caffe2's builder skipped Optimizer.__init__ (no instance number): so does this one.
        self.weight_decay = weight_decay

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        dev = _device()
        one = param_init_net.ConstantFill([], f"ONE_{dev.device_type}_{dev.device_id}", shape=[1], value=1.0)
        wd = param_init_net.ConstantFill(
            [], f"wd_{dev.device_type}_{dev.device_id}", shape=[1], value=self.weight_decay
        )
        if isinstance(param_info.grad, core.GradientSlice):
            raise ValueError("Weight decay does not yet support sparse gradients")
        net.WeightedSum([param_info.grad, one, param_info.blob, wd], param_info.grad)


def _param_shape(param_init_net: core.Net, param_info: ParameterInfo) -> list[int]:
    """The parameter's shape, by shape inference over `param_init_net` as Caffe2 did (falling back to
    the shape the model recorded when inference cannot trace the init net)."""
    name = str(param_info.blob)
    try:
        shapes, _ = workspace.InferShapesAndTypes([param_init_net])
    except RuntimeError:
        shapes = {}
    if name in shapes:
        return list(shapes[name])
    if param_info.shape is not None:
        return list(param_info.shape)
    raise BadArgumentError(f"optimizer: cannot infer the shape of parameter '{name}' from {param_init_net.Name()}")


class AdagradOptimizer(Optimizer):
    """Adagrad (`Adagrad` / `SparseAdagrad` / `RowWiseSparseAdagrad`); weight decay skips 1-D params."""

    def __init__(
        self,
        alpha: float = 0.01,
        epsilon: float = 1e-4,
        decay: float = 1,
        weight_decay: float = 0.0,
        policy: str = "fixed",
        sparse_dedup_aggregator: str | None = None,
        rowWise: bool = False,
        engine: str = "",
        lars: float | None = None,
        output_effective_lr: bool = False,
        output_effective_lr_and_update: bool = False,
        pruning_options: dict | None = None,
        swa_options: dict | None = None,
        ema_options: dict | None = None,
        weight_scale: Any = None,
        counter_halflife: int = -1,
        **kwargs: Any,
    ):
        super().__init__()
        for option, value in (
            ("pruning_options", pruning_options),
            ("swa_options", swa_options),
            ("ema_options", ema_options),
            ("weight_scale", weight_scale),
        ):
            if value:
                raise _not_supported(f"AdagradOptimizer({option}=...)")
        if engine in FP16_ENGINES:
            raise _not_supported(f"AdagradOptimizer(engine={engine!r})")
        self.alpha = alpha
        self.epsilon = epsilon
        self.decay = decay
        self.weight_decay = float(weight_decay)
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.rowWise = rowWise
        self.engine = engine
        self.lars = lars
        self.output_effective_lr = output_effective_lr
        self.output_effective_lr_and_update = output_effective_lr_and_update
        self.counter_halflife = counter_halflife
        self.init_kwargs = kwargs
        self.weight_scale = weight_scale
        self.use_mask = False
        self.swa_enabled = self.ema_enabled = False

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        self._clear_local_lr_multiplier()
        if self.lars is not None and not isinstance(grad, core.GradientSlice):
            if self.weight_decay != 0:
                raise ValueError("weight decay is not implemented for LARS yet")
            self._add_lars(net, param_init_net, param, grad, self.lars)
        lr, iteration = self.build_lr(
            net, param_init_net, base_learning_rate=self.alpha, policy=self.policy, **self.init_kwargs
        )
        if self.counter_halflife > 0:
            self._aux_params.shared.append(iteration)
        if self.rowWise:
            rows = _param_shape(param_init_net, param_info)[0]
            squared_sum = param_init_net.ConstantFill([], str(param) + "_avg_squared_sum", shape=[rows], value=0.0)
        else:
            squared_sum = param_init_net.ConstantFill([param], str(param) + "_squared_sum", value=0.0)
        self._aux_params.local.append(squared_sum)
        if self.counter_halflife > 0:
            rows = _param_shape(param_init_net, param_info)[0]
            update_counter = param_init_net.ConstantFill(
                [], str(param) + "_update_counter", shape=[rows], value=0.0, dtype=core.DataType.DOUBLE
            )
            prev_update_iter = param_init_net.ConstantFill(
                [], str(param) + "_prev_update_iter", shape=[rows], value=0, dtype=core.DataType.INT64
            )
            self._aux_params.local.extend([update_counter, prev_update_iter])
        if self.rowWise and not isinstance(grad, core.GradientSlice):
            raise ValueError(
                "If SparseAdagrad with rowWise=True, gradient must be a gradientslice. PLease ensure that rowWise "
                "is not enabled for the dense Adagrad optimizer, as it is not supported."
            )
        # Caffe2 skipped weight decay for 1-D parameters (biases), dense or sparse.
        shape = _param_shape(param_init_net, param_info)
        weight_decay = 0.0 if len(shape) == 1 else self.weight_decay
        if isinstance(grad, core.GradientSlice):
            if self.decay != 1.0:
                raise ValueError("Decay is not implemented for SparseAdagrad and must be set to 1")
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            op = "RowWiseSparseAdagrad" if self.rowWise else "SparseAdagrad"
            inputs = [param, squared_sum, grad.indices, grad.values, lr]
            outputs = [param, squared_sum]
            if self.rowWise and self.counter_halflife > 0:
                inputs.append(update_counter)
            if weight_decay > 0 and self.counter_halflife != -1:
                getattr(net, op)(
                    inputs,
                    outputs,
                    epsilon=self.epsilon,
                    weight_decay=weight_decay,
                    engine=self.engine,
                    counter_halflife=self.counter_halflife,
                )
            elif weight_decay > 0:
                getattr(net, op)(inputs, outputs, epsilon=self.epsilon, weight_decay=weight_decay, engine=self.engine)
            else:
                getattr(net, op)(inputs, outputs, epsilon=self.epsilon, engine=self.engine)
            if self.counter_halflife > 0:
                net.RowWiseCounter(
                    [prev_update_iter, update_counter, grad.indices, iteration],
                    [prev_update_iter, update_counter],
                    counter_halflife=self.counter_halflife,
                )
            return
        outputs = [param, squared_sum]
        if self.output_effective_lr_and_update:
            outputs += [str(param) + "_effective_lr", str(param) + "_update"]
        elif self.output_effective_lr:
            outputs.append(str(param) + "_effective_lr")
        extra = {"weight_decay": weight_decay} if weight_decay > 0 else {}
        net.Adagrad(
            [param, squared_sum, grad, lr],
            outputs,
            epsilon=self.epsilon,
            decay=float(self.decay),
            **extra,
            engine=self.engine,
        )

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class AdamOptimizer(Optimizer):
    """Adam (`Adam` / `SparseAdam` / `RowWiseSparseAdam`) with moments `<param>_first_moment`,
    `<param>_second_moment` (`_avg_second_moment` row-wise)."""

    def __init__(
        self,
        alpha: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        policy: str = "fixed",
        use_lr_adaption: bool = False,
        lr_alpha: float = 0.01,
        normalized_lr_adaption: bool = True,
        sparse_dedup_aggregator: str | None = None,
        rowWise: bool = False,
        engine: str = "",
        enableRAdam: bool = False,
        use_smart_decay: bool = False,
        **kwargs: Any,
    ):
        super().__init__()
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.policy = policy
        self.use_lr_adaption = use_lr_adaption
        self.lr_alpha = lr_alpha
        self.normalized_lr_adaption = normalized_lr_adaption
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.rowWise = rowWise
        self.engine = engine
        self.enableRAdam = enableRAdam
        self.use_smart_decay = use_smart_decay
        self.init_kwargs = kwargs

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, iteration = self.build_lr(
            net, param_init_net, base_learning_rate=self.alpha, policy=self.policy, **self.init_kwargs
        )
        m1 = param_init_net.ConstantFill([param], param + "_first_moment", value=0.0)
        if self.rowWise:
            rows = _param_shape(param_init_net, param_info)[0]
            m2 = param_init_net.ConstantFill([], param + "_avg_second_moment", shape=[rows], value=0.0)
        else:
            m2 = param_init_net.ConstantFill([param], param + "_second_moment", value=0.0)
        if self.use_smart_decay:
            rows = _param_shape(param_init_net, param_info)[0]
            last_seen = param_init_net.ConstantFill(
                [], param + "_last_seen", shape=[rows], value=0, dtype=core.DataType.INT64
            )
            self._aux_params.local.append(last_seen)
        self._aux_params.shared.append(iteration)
        self._aux_params.local.extend([m1, m2])
        if self.rowWise and not isinstance(grad, core.GradientSlice):
            raise ValueError(
                "If SparseAdam with rowWise=True, gradient must be a gradientslice. PLease ensure that rowWise "
                "is not enabled for the dense Adam optimizer, as it is not supported."
            )
        outputs = [param, m1, m2]
        if self.use_smart_decay:
            outputs.append(last_seen)
        if self.use_lr_adaption:
            effective_grad = str(param) + "_effective_grad"
            outputs.append(effective_grad)
        args = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}
        adaption = {"lr_alpha": self.lr_alpha, "normalized_lr_adaption": self.normalized_lr_adaption}
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            inputs = [param, m1, m2, grad.indices, grad.values, lr, iteration]
            if self.rowWise:
                if self.enableRAdam:
                    raise ValueError("Currently, RowWiseSparseAdam is not supported by RAdam!")
                net.RowWiseSparseAdam(inputs, outputs, **args)
            elif self.use_smart_decay:
                net.SmartDecaySparseAdam(
                    [param, m1, m2, last_seen, grad.indices, grad.values, lr, iteration], outputs, **args
                )
            else:
                net.SparseAdam(inputs, outputs, **args, enableRAdam=self.enableRAdam)
            if self.use_lr_adaption:
                net.LearningRateAdaption([lr, grad.values, effective_grad], [lr], **adaption)
        else:
            net.Adam([param, m1, m2, grad, lr, iteration], outputs, **args)
            if self.use_lr_adaption:
                net.LearningRateAdaption([lr, grad, effective_grad], [lr], **adaption)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


def _add_lars_unless_sparse(
    optimizer: Optimizer, net: core.Net, param_init_net: core.Net, param: Any, grad: Any
) -> None:
    """The LARS multiplier of a dense gradient when `lars` (an offset) is set, as Caffe2's optimizers add it."""
    optimizer._clear_local_lr_multiplier()
    lars = getattr(optimizer, "lars", None)
    if lars is not None and not isinstance(grad, core.GradientSlice):
        optimizer._add_lars(net, param_init_net, param, grad, lars)


class WngradOptimizer(Optimizer):
    """WNGrad (`Wngrad` / `SparseWngrad`) with a one-element `<param>_moment` starting at `moment_init`."""

    def __init__(
        self,
        alpha: float = 1.0,
        epsilon: float = 1e-9,
        policy: str = "fixed",
        sparse_dedup_aggregator: str | None = None,
        engine: str = "",
        moment_init: float = 100.0,
        lars: float | None = None,
        output_effective_lr: bool = False,
        output_effective_lr_and_update: bool = False,
        **kwargs: Any,
    ):
        super().__init__()
        self.alpha = alpha
        self.epsilon = epsilon
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine
        self.moment_init = moment_init
        self.lars = lars
        self.output_effective_lr = output_effective_lr
        self.output_effective_lr_and_update = output_effective_lr_and_update
        self.init_kwargs = kwargs

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        _add_lars_unless_sparse(self, net, param_init_net, param, grad)
        lr, _ = self.build_lr(
            net, param_init_net, base_learning_rate=self.alpha, policy=self.policy, **self.init_kwargs
        )
        moment = param_init_net.ConstantFill([], str(param) + "_moment", shape=[1], value=self.moment_init)
        self._aux_params.local.append(moment)
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseWngrad(
                [param, moment, grad.indices, grad.values, lr],
                [param, moment],
                epsilon=self.epsilon,
                engine=self.engine,
            )
            return
        outputs = [param, moment]
        if self.output_effective_lr_and_update:
            outputs += [str(param) + "_effective_lr", str(param) + "_update"]
        elif self.output_effective_lr:
            outputs.append(str(param) + "_effective_lr")
        net.Wngrad([param, moment, grad, lr], outputs, epsilon=self.epsilon, engine=self.engine)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class StormOptimizer(Optimizer):
    """STORM (`Storm` / `SparseStorm`): `<param>_moment` and a one-element `<param>_grad_sq_sum` starting at
    `grad_sq_init`; `lr` is the paper's k, `momentum` its c, `beta` its w."""

    def __init__(
        self,
        lr: float = 0.1,
        momentum: float = 10.0,
        beta: float = 0.1,
        grad_sq_init: float = 0.01,
        policy: str = "fixed",
        sparse_dedup_aggregator: str | None = None,
        lars: float | None = None,
        **kwargs: Any,
    ):
        super().__init__()
        self.lr = lr
        self.momentum = momentum
        self.beta = beta
        self.grad_sq_init = grad_sq_init
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.lars = lars
        self.init_kwargs = kwargs

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.lr <= 0:
            return
        _add_lars_unless_sparse(self, net, param_init_net, param, grad)
        lr, _ = self.build_lr(net, param_init_net, base_learning_rate=self.lr, policy=self.policy, **self.init_kwargs)
        moment = param_init_net.ConstantFill(param, str(param) + "_moment", value=0.0)
        self._aux_params.local.append(moment)
        grad_sq_sum = param_init_net.ConstantFill([], str(param) + "_grad_sq_sum", shape=[1], value=self.grad_sq_init)
        self._aux_params.local.append(grad_sq_sum)
        args = {"momentum": self.momentum, "beta": self.beta}
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseStorm(
                [param, moment, grad_sq_sum, grad.values, grad.indices, lr], [param, moment, grad_sq_sum], **args
            )
        else:
            net.Storm([param, moment, grad_sq_sum, grad, lr], [param, moment, grad_sq_sum], **args)

    def scale_learning_rate(self, scale: float) -> None:
        self.lr *= scale


class AdadeltaOptimizer(Optimizer):
    """Adadelta (`Adadelta` / `SparseAdadelta`) with `<param>_squared_moment` and `..._squared_moment_update`."""

    def __init__(
        self,
        alpha: float = 0.01,
        epsilon: float = 1e-4,
        decay: float = 0.95,
        policy: str = "fixed",
        sparse_dedup_aggregator: str | None = None,
        engine: str = "",
        **kwargs: Any,
    ):
        super().__init__()
        self.alpha = alpha
        self.epsilon = epsilon
        self.decay = decay
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, _ = self.build_lr(
            net, param_init_net, base_learning_rate=self.alpha, policy=self.policy, **self.init_kwargs
        )
        moment = param_init_net.ConstantFill([param], str(param) + "_squared_moment", value=0.0)
        update = param_init_net.ConstantFill([param], str(param) + "_squared_moment_update", value=0.0)
        self._aux_params.local.extend([moment, update])
        args = {"epsilon": self.epsilon, "decay": self.decay, "engine": self.engine}
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseAdadelta([param, moment, update, grad.indices, grad.values, lr], [param, moment, update], **args)
        else:
            net.Adadelta([param, moment, update, grad, lr], [param, moment, update], **args)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class FtrlOptimizer(Optimizer):
    """FTRL-proximal (`Ftrl` / `SparseFtrl`) with its (n, z) pairs in `<param>_ftrl_nz` (param's shape + [2])."""

    _op, _suffix = "Ftrl", "_ftrl_nz"

    def __init__(
        self,
        alpha: float = 0.01,
        beta: float = 1e-4,
        lambda1: float = 0,
        lambda2: float = 0,
        sparse_dedup_aggregator: str | None = None,
        engine: str = "",
    ):
        super().__init__()
        self.alpha = alpha
        self.beta = beta
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        nz = param_init_net.ConstantFill([param], str(param) + self._suffix, extra_shape=[2], value=0.0)
        self._aux_params.local.append(nz)
        args = {
            "engine": self.engine,
            "alpha": self.alpha,
            "beta": self.beta,
            "lambda1": self.lambda1,
            "lambda2": self.lambda2,
        }
        if self._op == "Ftrl" and isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseFtrl([param, nz, grad.indices, grad.values], [param, nz], **args)
        else:
            getattr(net, self._op)([param, nz, grad], [param, nz], **args)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class GFtrlOptimizer(FtrlOptimizer):
    """Group Lasso FTRL (`GFtrl`, dense gradients only) with `<param>_gftrl_nz`."""

    _op, _suffix = "GFtrl", "_gftrl_nz"


class DecayAdagradOptimizer(Optimizer):
    """DecayAdagrad (moments `<param>_first_mo1ment`, Caffe2's spelling, and `<param>_second_moment`); a sparse
    gradient gets plain SparseAdagrad with `<param>_squared_sum`."""

    def __init__(
        self,
        alpha: float = 0.01,
        beta1: float = 0.0,
        beta2: float = 0.999,
        epsilon: float = 0.1,
        weight_decay: float = 0.0,
        ema_options: dict | None = None,
        bias_correction_first: bool = True,
        policy: str = "fixed",
        engine: str = "",
        **kwargs: Any,
    ):
        super().__init__()
        if ema_options:
            raise _not_supported("DecayAdagradOptimizer(ema_options=...) (no EMA op)")
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.weight_decay = weight_decay
        self.bias_correction_first = bias_correction_first
        self.policy = policy
        self.engine = engine
        self.init_kwargs = kwargs
        self.ema_enabled = False

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, iteration = self.build_lr(
            net, param_init_net, base_learning_rate=self.alpha, policy=self.policy, **self.init_kwargs
        )
        if isinstance(grad, core.GradientSlice):
            squared_sum = param_init_net.ConstantFill([param], param + "_squared_sum", value=0.0)
            self._aux_params.local.append(squared_sum)
            net.SparseAdagrad(
                [param, squared_sum, grad.indices, grad.values, lr], [param, squared_sum], epsilon=self.epsilon
            )
            return
        m1 = param_init_net.ConstantFill([param], param + "_first_mo1ment", value=0.0)
        m2 = param_init_net.ConstantFill([param], param + "_second_moment", value=0.0)
        self._aux_params.shared.append(iteration)
        self._aux_params.local.extend([m1, m2])
        net.DecayAdagrad(
            [param, m1, m2, grad, lr, iteration],
            [param, m1, m2],
            beta1=self.beta1,
            beta2=self.beta2,
            epsilon=self.epsilon,
            weight_decay=self.weight_decay,
            bias_correction_first=self.bias_correction_first,
        )

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class YellowFinOptimizer(Optimizer):
    """YellowFin (https://arxiv.org/abs/1706.03471): momentum SGD whose lr and mu are tuned per parameter
    (`<param>_lr_avg`, `_mu_avg`) from running statistics (`_curv_win`, `_g_avg`, `_g2_avg`, `_scalars_memory`);
    the YellowFin op updates them all in place. Dense gradients only."""

    def __init__(
        self,
        alpha: float = 0.1,
        mu: float = 0.0,
        beta: float = 0.999,
        curv_win_width: int = 20,
        zero_debias: bool = True,
        epsilon: float = 0.1**6,
        policy: str = "fixed",
        sparse_dedup_aggregator: str | None = None,
        **kwargs: Any,
    ):
        super().__init__()
        self.alpha = alpha
        self.mu = mu
        self.beta = beta
        self.curv_win_width = curv_win_width
        self.zero_debias = zero_debias
        self.epsilon = epsilon
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.init_kwargs = kwargs

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        moment = param_init_net.ConstantFill([param], param + "_moment", value=0.0)
        curv_win = param_init_net.ConstantFill([], param + "_curv_win", shape=[self.curv_win_width], value=0.0)
        g_avg = param_init_net.ConstantFill([param], param + "_g_avg", value=0.0)
        g2_avg = param_init_net.ConstantFill([param], param + "_g2_avg", value=0.0)
        lr_avg = param_init_net.ConstantFill([], param + "_lr_avg", shape=[1], value=self.alpha)
        mu_avg = param_init_net.ConstantFill([], param + "_mu_avg", shape=[1], value=self.mu)
        scalars_memory = param_init_net.ConstantFill([], param + "_scalars_memory", shape=[5], value=0.0)
        if self.alpha <= 0:
            raise ValueError(f"YellowFinOptimizer needs a positive learning rate, got {self.alpha}")
        if isinstance(grad, core.GradientSlice):
            raise ValueError("YellowFin does not support sparse gradients")
        iteration = utils.BuildUniqueMutexIter(param_init_net, net, iter_val=0)
        self._aux_params.shared.append(iteration)
        state = [param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars_memory]
        self._aux_params.local.extend(state[1:])
        net.YellowFin(
            [*state, grad, iteration],
            state,
            beta=self.beta,
            epsilon=self.epsilon,
            curv_win_width=self.curv_win_width,
            zero_debias=self.zero_debias,
        )

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class RmsPropOptimizer(Optimizer):
    """RMSProp: `RmsProp` writes the scaled step into `<param>_grad_o`, MomentumSGDUpdate applies it."""

    def __init__(
        self,
        alpha: float = 0.01,
        decay: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-5,
        policy: str = "fixed",
        engine: str = "",
        **kwargs: Any,
    ):
        super().__init__()
        self.alpha = alpha
        self.decay = decay
        self.momentum = momentum
        self.epsilon = epsilon
        self.policy = policy
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net: core.Net, param_init_net: core.Net, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            raise ValueError(f"RmsPropOptimizer needs a positive learning rate, got {self.alpha}")
        if isinstance(grad, core.GradientSlice):
            raise ValueError("RmsPropOptimizer doesn't support sparse gradients")
        dev = _device()
        one = param_init_net.ConstantFill([], f"ONE_{dev.device_type}_{dev.device_id}", shape=[1], value=1.0)
        lr, _ = self.build_lr(
            net, param_init_net, base_learning_rate=-self.alpha, policy=self.policy, **self.init_kwargs
        )
        # Caffe2 spelled the fill argument `values` here (ConstantFill's is `value`); it is kept, and
        # ignored: the fills are zeros either way.
        grad_o = param_init_net.ConstantFill([param], str(param) + "_grad_o", values=0.0)
        ms = param_init_net.ConstantFill([param], str(param) + "_mean_squares", values=0.0)
        mom = param_init_net.ConstantFill([param], str(param) + "_momentum", values=0.0)
        self._aux_params.local.extend([ms, mom])
        net.RmsProp(
            [grad, ms, mom, one],
            [grad_o, ms, mom],
            decay=self.decay,
            momentum=self.momentum,
            epsilon=self.epsilon,
            engine=self.engine,
        )
        net.MomentumSGDUpdate([grad_o, mom, lr, param], [grad_o, mom, param])

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


# --------------------------------------------------------------------------------------------------
# Building an optimizer into a model


def _get_param_to_device(model: Any) -> dict[str, caffe2_pb2.DeviceOption]:
    param_to_device = core.InferBlobDevices(model.net)
    param_to_device.update(core.InferBlobDevices(model.param_init_net))
    return param_to_device


def get_param_device(
    param_name: str, grad: Any, param_to_device: dict | None = None, default_device: Any = None
) -> caffe2_pb2.DeviceOption:
    """The device of the op that creates the parameter (or else its gradient)."""
    param_to_device = param_to_device or {}
    device = default_device
    if param_name in param_to_device:
        device = param_to_device[param_name]
    elif isinstance(grad, core.GradientSlice):
        for blob in (grad.values, grad.indices):
            if str(blob) in param_to_device:
                device = param_to_device[str(blob)]
                break
    elif str(grad) in param_to_device:
        device = param_to_device[str(grad)]
    if device is None:
        raise BadArgumentError(f"Cannot infer device for {param_name}: no op creates it")
    return device


def get_lr_injection() -> Any:
    """The current `lr_injection` multiplier (models built with `allow_lr_injection=True`)."""
    return workspace.FetchBlob(_LEARNING_RATE_INJECTION)


def set_lr_injection(lr_injection_value: float) -> None:
    workspace.FeedBlob(_LEARNING_RATE_INJECTION, np.array([float(lr_injection_value)], dtype=np.float32))


def _calc_norm_ratio(
    model: Any, params: list[ParameterInfo], name_scope: str, param_to_device: dict, max_gradient_norm: float
) -> Any:
    """`clip_norm / max(global gradient norm, clip_norm)`: the multiplier of gradient-norm clipping."""
    with core.NameScope(name_scope):
        squared_sums = []
        for i, param in enumerate(params):
            device = get_param_device(str(param.blob), param.grad, param_to_device)
            with core.DeviceScope(device):
                grad = param.grad.values if isinstance(param.grad, core.GradientSlice) else param.grad
                squared = model.net.SumSqrElements(grad, f"grad_{i}_squared_sum")
                squared_sums.append(model.net.EnsureCPUOutput(squared))
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
            full = model.net.Sum(squared_sums, "grad_squared_full_sum")
            global_norm = model.net.Pow(full, "global_norm", exponent=0.5)
            clip_norm = model.param_init_net.ConstantFill([], "clip_norm", shape=[], value=float(max_gradient_norm))
            max_norm = model.net.Max([global_norm, clip_norm], "max_norm")
            return model.net.Div([clip_norm, max_norm], "norm_ratio")


def _build(
    model: Any,
    optimizer: Optimizer,
    weights_only: bool = False,
    use_param_info_optim: bool = True,
    max_gradient_norm: float | None = None,
    allow_lr_injection: bool = False,
) -> Optimizer:
    """Run `optimizer` for every parameter with a gradient, each under its parameter's device."""
    param_to_device = _get_param_to_device(model)
    model.Validate()
    params = [info for info in model.GetOptimizationParamInfo() if not weights_only or info.blob in model.weights]
    lr_multiplier = None
    if max_gradient_norm is not None:
        lr_multiplier = _calc_norm_ratio(model, params, "norm_clipped_grad_update", param_to_device, max_gradient_norm)
    if allow_lr_injection:
        if not model.net.BlobIsDefined(_LEARNING_RATE_INJECTION):
            injection = model.param_init_net.ConstantFill([], _LEARNING_RATE_INJECTION, shape=[1], value=1.0)
        else:
            injection = _LEARNING_RATE_INJECTION
        if lr_multiplier is None:
            lr_multiplier = injection
        else:
            lr_multiplier = model.net.Mul([lr_multiplier, injection], "lr_multiplier", broadcast=1)
    optimizer.add_lr_multiplier(lr_multiplier)
    for info in params:
        device = get_param_device(str(info.blob), info.grad, param_to_device)
        with core.DeviceScope(device):
            if info.optimizer and use_param_info_optim:
                info.optimizer(model.net, model.param_init_net, info)
            else:
                optimizer(model.net, model.param_init_net, info)
    return optimizer


def add_weight_decay(model: Any, weight_decay: float) -> None:
    """L2 regularisation of the model's weights (not biases): `grad += weight_decay * w`."""
    _build(model, WeightDecayBuilder(weight_decay=weight_decay), weights_only=True, use_param_info_optim=False)


def build_sgd(
    model: Any,
    base_learning_rate: float,
    max_gradient_norm: float | None = None,
    allow_lr_injection: bool = False,
    **kwargs: Any,
) -> Optimizer:
    """SGD on every parameter (`policy`, `momentum`, `nesterov` and the LearningRate policy's arguments
    go in `kwargs`)."""
    return _build(
        model,
        SgdOptimizer(base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_multi_precision_sgd(
    model: Any,
    base_learning_rate: float,
    max_gradient_norm: float | None = None,
    allow_lr_injection: bool = False,
    **kwargs: Any,
) -> Optimizer:
    return _build(
        model,
        MultiPrecisionSgdOptimizer(base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_adagrad(
    model: Any,
    base_learning_rate: float,
    parameters: Any = None,
    max_gradient_norm: float | None = None,
    allow_lr_injection: bool = False,
    **kwargs: Any,
) -> Optimizer:
    return _build(
        model,
        AdagradOptimizer(alpha=base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_adam(
    model: Any,
    base_learning_rate: float,
    max_gradient_norm: float | None = None,
    allow_lr_injection: bool = False,
    **kwargs: Any,
) -> Optimizer:
    return _build(
        model,
        AdamOptimizer(alpha=base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_rms_prop(
    model: Any,
    base_learning_rate: float,
    max_gradient_norm: float | None = None,
    allow_lr_injection: bool = False,
    **kwargs: Any,
) -> Optimizer:
    return _build(
        model,
        RmsPropOptimizer(alpha=base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_ftrl(model: Any, engine: str = "SIMD", **kwargs: Any) -> Optimizer:
    """FTRL on every parameter. Caffe2 asserted its SIMD engine was built; rnn2jax's lowering ignores engines."""
    return _build(model, FtrlOptimizer(engine=engine, **kwargs))


def build_gftrl(model: Any, engine: str = "", **kwargs: Any) -> Optimizer:
    return _build(model, GFtrlOptimizer(engine=engine, **kwargs))


def _builder(cls: type, rate_name: str) -> Any:
    def build(
        model: Any,
        base_learning_rate: float,
        parameters: Any = None,
        max_gradient_norm: float | None = None,
        allow_lr_injection: bool = False,
        **kwargs: Any,
    ) -> Optimizer:
        return _build(
            model,
            cls(**{rate_name: base_learning_rate}, **kwargs),
            max_gradient_norm=max_gradient_norm,
            allow_lr_injection=allow_lr_injection,
        )

    build.__doc__ = f"{cls.__name__} on every parameter."
    return build


build_wngrad = _builder(WngradOptimizer, "alpha")
build_storm = _builder(StormOptimizer, "lr")
build_adadelta = _builder(AdadeltaOptimizer, "alpha")


def build_decay_adagrad(
    model: Any,
    base_learning_rate: float,
    max_gradient_norm: float | None = None,
    allow_lr_injection: bool = False,
    **kwargs: Any,
) -> Optimizer:
    return _build(
        model,
        DecayAdagradOptimizer(alpha=base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_yellowfin(model: Any, base_learning_rate: float = 0.1, **kwargs: Any) -> Optimizer:
    return _build(model, YellowFinOptimizer(alpha=base_learning_rate, **kwargs))
