"""Caffe2's `model_helper.ModelHelper`: a `net`, a `param_init_net`, and what is known of the parameters.

A step model is created with `param_model=<main model>`: it then shares the main model's
`param_init_net` and parameter records, so step-net parameters are filled by the main init net.
`arg_scope` holds the arguments every brew helper with `**kwargs` passes on (order, use_cudnn,
cudnn_exhaustive_search), which is why they appear on FC/Sum/Concat ops of Caffe2 RNN nets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ...errors import BadArgumentError
from . import core, scope

WEIGHT, BIAS, COMPUTED_PARAM = "WEIGHT", "BIAS", "COMPUTED_PARAM"


class ParameterTags:
    """Caffe2's `modeling.parameter_info.ParameterTags`."""

    BIAS = BIAS
    WEIGHT = WEIGHT
    COMPUTED_PARAM = COMPUTED_PARAM


class _ParameterShapeError(BadArgumentError, AssertionError):
    """A shared parameter asked for with another shape: Caffe2 asserted, so it is also an AssertionError."""


@dataclasses.dataclass
class ParameterInfo:
    """What the model knows of one parameter: its blob, shape and (after AddGradientOperators) gradient."""

    param_id: int | None
    param: core.BlobReference
    key: str | None = None
    shape: list[int] | None = None
    length: int | None = None
    grad: Any = None
    optimizer: Any = None
    blob_copy: dict | None = None

    @property
    def blob(self) -> core.BlobReference:
        return self.param

    @property
    def name(self) -> str:
        return str(self.param)

    def cloned_init_net(self) -> Any:  # Caffe2 API; nothing here needs it
        raise NotImplementedError("ParameterInfo.cloned_init_net is not part of rnn2jax's Caffe2 API")

    def __str__(self) -> str:
        return str(self.param)


class ParameterSharingContext:
    """Caffe2's `modeling.parameter_sharing` scope overrides: inside `ParameterSharing({"b": "a"})`,
    parameters created under name scope `b/...` are named as if created under `a/...` (so they are the
    same blobs). Overrides chain: a scope mapped to another that is itself mapped resolves fully."""

    def __init__(self) -> None:
        self._scope_overrides: dict[str, str] = {}
        self._contexts: list[dict[str, str]] = []

    def _resolve(self, candidate: str) -> str:
        parts = candidate.split(scope._NAMESCOPE_SEPARATOR)
        prefix, best, best_index = "", candidate, 0
        for index, part in enumerate(parts):
            prefix += part + scope._NAMESCOPE_SEPARATOR
            if prefix in self._scope_overrides:
                best, best_index = self._scope_overrides[prefix], index
        if best == candidate:
            return candidate
        return self._resolve(best) + scope._NAMESCOPE_SEPARATOR.join(parts[best_index + 1 :])

    def get_parameter_name(self, name: str) -> str:
        return self._resolve(scope.CurrentNameScope()) + name

    def add_scope_overrides(self, shared_scopes: Mapping[str, str]) -> None:
        self._contexts.append(dict(shared_scopes))
        self._scope_overrides.update(shared_scopes)

    def pop(self) -> None:
        self._contexts.pop()
        self._scope_overrides = {}
        for context in self._contexts:
            self._scope_overrides.update(context)


parameter_sharing_context = ParameterSharingContext()


def _as_scope(name: str) -> str:
    return name + scope._NAMESCOPE_SEPARATOR if name and not name.endswith(scope._NAMESCOPE_SEPARATOR) else name


@contextlib.contextmanager
def ParameterSharing(shared_scopes: Mapping[str, str]) -> Iterator[None]:
    """Share parameters between name scopes, relative to the current one: `{"b": "a"}` makes
    parameters of `<current>/b/...` those of `<current>/a/...` (`UnrolledCell` maps every
    `timestep_<t>` scope to `""`, so all steps use one set of weights)."""
    current = scope.CurrentNameScope()
    overrides = {}
    for source, target in shared_scopes.items():
        if target.startswith(source):
            raise ValueError(f"illegal parameter sharing override: {source!r} is a prefix of {target!r}")
        overrides[_as_scope(current + source)] = _as_scope(current + target)
    parameter_sharing_context.add_scope_overrides(overrides)
    try:
        yield
    finally:
        parameter_sharing_context.pop()


def _initializer(initializer: Any) -> tuple[str, Mapping[str, Any]]:
    """`(op type, kwargs)`, from a tuple or from a Caffe2 `Initializer` object."""
    if isinstance(initializer, tuple):
        return initializer[0], dict(initializer[1]) if len(initializer) > 1 and initializer[1] else {}
    name = getattr(initializer, "operator_name", None)
    if name is None:
        raise TypeError(f"unsupported initializer {initializer!r}: give (op_type, kwargs) or an Initializer")
    return name, dict(getattr(initializer, "operator_kwargs", {}) or {})


class ModelHelper:
    """A model: `net`, `param_init_net`, `params`; ops called on it go to `net` (`model.Softmax(...)`)."""

    def __init__(
        self,
        name: str | None = None,
        init_params: bool = True,
        allow_not_known_ops: bool = True,
        skip_sparse_optim: bool = False,
        param_model: ModelHelper | None = None,
        arg_scope: Mapping[str, Any] | None = None,
    ):
        self.name = name or "model"
        self.net = core.Net(self.name)
        if param_model is not None:
            self.param_init_net = param_model.param_init_net
            self.param_to_grad = param_model.param_to_grad
            self.params = param_model.params
            self._parameters_info = param_model._parameters_info
            self._computed_params = param_model._computed_params
        else:
            self.param_init_net = core.Net(self.name + "_init")
            self.param_to_grad: dict = {}
            self.params: list[core.BlobReference] = []
            self._parameters_info: dict[str, ParameterInfo] = {}
            self._computed_params: list[core.BlobReference] = []
        self.gradient_ops_added = False
        self.grad_map: dict = {}
        self.init_params = init_params
        self.allow_not_known_ops = allow_not_known_ops
        self.skip_sparse_optim = skip_sparse_optim
        self.weights: list[core.BlobReference] = []
        self.biases: list[core.BlobReference] = []
        self._devices: list[int] = []  # set by data_parallel_model.Parallelize
        self._arg_scope: dict[str, Any] = {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": False}
        self._arg_scope.update(arg_scope or {})

    @property
    def arg_scope(self) -> dict[str, Any]:
        return self._arg_scope

    def Proto(self) -> Any:
        return self.net.Proto()

    def InitProto(self) -> Any:
        return self.param_init_net.Proto()

    # -- parameters ------------------------------------------------------------------------------

    def create_param(
        self, param_name: str, shape: Sequence[int], initializer: Any, tags: Iterable[str] | str | None = None
    ) -> core.BlobReference:
        """A parameter filled by `initializer` in `param_init_net`, once per name: a plain-string name is
        put in the current name scope (as rewritten by `ParameterSharing`), a `BlobReference` is used as
        is; asking again returns the blob."""
        if isinstance(param_name, core.BlobReference):
            name = str(param_name)
        elif isinstance(param_name, str):
            name = parameter_sharing_context.get_parameter_name(param_name)
        else:
            raise TypeError("Unsupported type for param_name")
        if name in self._parameters_info:
            if self._parameters_info[name].shape != list(shape):
                raise _ParameterShapeError(
                    f"create_param: parameter {name} exists with shape {self._parameters_info[name].shape}, "
                    f"asked for {list(shape)} (Caffe2 asserted equal shapes)"
                )
            return self._parameters_info[name].blob
        blob = core.BlobReference(name)
        if hasattr(initializer, "create_param"):  # a modeling.initializers object: it adds its own ops
            info = initializer.create_param(param_name=blob, init_net=self.param_init_net, shape=list(shape))
            self._parameters_info[name] = info
            self.AddParameter(info.blob, tags)
            return info.blob
        if self.init_params:
            op_type, args = _initializer(initializer)
            self.param_init_net._CreateAndAddToSelf(op_type, [], blob, shape=list(shape), **args)
        self._parameters_info[name] = ParameterInfo(param_id=None, param=blob, shape=list(shape))
        self.AddParameter(blob, tags)
        return blob

    def AddParameter(self, param: core.BlobReference, tags: Iterable[str] | str | None = None) -> None:
        tags = self._normalize_tags(tags)
        (self._computed_params if COMPUTED_PARAM in tags else self.params).append(param)
        if WEIGHT in tags:
            self.weights.append(param)
        if BIAS in tags:
            self.biases.append(param)

    @staticmethod
    def _normalize_tags(tags: Iterable[str] | str | None) -> set[str]:
        if tags is None:
            return set()
        return {tags} if isinstance(tags, str) else set(tags)

    def get_param_info(self, param: str) -> ParameterInfo | None:
        return self._parameters_info.get(str(param))

    @staticmethod
    def _NormalizeNamescope(namescope: str | None) -> str:
        """The current name scope for None; '' (every scope) as it is; else the scope with its separator."""
        if namescope is None:
            return scope.CurrentNameScope()
        if namescope == "" or namescope.endswith(scope._NAMESCOPE_SEPARATOR):
            return namescope
        return namescope + scope._NAMESCOPE_SEPARATOR

    def GetParams(self, namescope: str | None = None, top_scope: bool = False) -> list[core.BlobReference]:
        """The parameters under `namescope` (the current name scope by default; '' for all)."""
        namescope = self._NormalizeNamescope(namescope)
        return [p for p in self.params if p.GetNameScope().startswith(namescope)]

    def GetComputedParams(self, namescope: str | None = None) -> list[core.BlobReference]:
        """The computed parameters (running statistics, not optimized) under `namescope`, as GetParams."""
        namescope = self._NormalizeNamescope(namescope)
        return [p for p in self._computed_params if p.GetNameScope().startswith(namescope)]

    def GetAllParams(self, namescope: str | None = None) -> list[core.BlobReference]:
        return self.GetParams(namescope) + self.GetComputedParams(namescope)

    # -- gradients -------------------------------------------------------------------------------

    def AddGradientOperators(self, *args: Any, **kwargs: Any) -> dict:
        if self.gradient_ops_added:
            raise RuntimeError("You cannot run AddGradientOperators twice.")
        self.gradient_ops_added = True
        self.grad_map = self.net.AddGradientOperators(*args, **kwargs)
        self.param_to_grad = self.get_param_to_grad(self.params)
        for param, grad in self.param_to_grad.items():
            info = self.get_param_info(param)
            if info is not None:
                info.grad = grad
            else:
                self._parameters_info[str(param)] = ParameterInfo(param_id=None, param=param, grad=grad)
        return self.grad_map

    def get_param_to_grad(self, params: Iterable[str]) -> dict:
        return {p: self.grad_map[p] for p in params if p in self.grad_map}

    def GetOptimizationParamInfo(self, params: list | None = None) -> list[ParameterInfo]:
        """The parameters an optimizer updates: those with a gradient (not sparse ones with
        `skip_sparse_optim`)."""
        param_to_grad = self.param_to_grad if params is None else self.get_param_to_grad(params)
        return [
            self.get_param_info(param)
            for param, grad in param_to_grad.items()
            if not self.skip_sparse_optim or not isinstance(grad, core.GradientSlice)
        ]

    def GetDevices(self) -> list[int]:
        """The devices data_parallel_model.Parallelize built this model for."""
        if not self._devices:
            raise AssertionError("Use data_parallel_model to run model on multiple GPUs.")
        return self._devices

    def _Validate(self) -> list[str]:
        """The parameters added more than once, sorted."""
        names = sorted(str(p) for p in self.params)
        return sorted({a for a, b in itertools.pairwise(names) if a == b})

    def Validate(self) -> None:
        dupes = self._Validate()
        assert dupes == [], f"Duplicate params: {dupes}"

    def GetCompleteNet(self) -> core.Net:
        """One net: a clone of param_init_net (each op's debug_info marked `/param_init_net`) then net, with
        net's execution type."""
        new_net = self.param_init_net.Clone(self.name + "_complete_net", keep_schema=True)
        for op in new_net.Proto().op:
            op.debug_info = op.debug_info + "/param_init_net"
        new_net.AppendNet(self.net)
        if self.net.Proto().HasField("type"):
            new_net.Proto().type = self.net.Proto().type
        return new_net

    def ConstructInitTrainNetfromNet(self, net: core.Net) -> None:
        """Split a `GetCompleteNet` net back into param_init_net (its ops marked `/param_init_net`) and net."""
        param_op_mask, train_op_mask = [], []
        for idx, op in enumerate(net.Proto().op):
            (param_op_mask if op.debug_info.endswith("/param_init_net") else train_op_mask).append(idx)
        self.param_init_net = net.Clone(
            net.Name() + "/generated_param_init_net", keep_schema=True, op_id_mask=param_op_mask,
            update_external_list=True,
        )  # fmt: skip
        self.net = net.Clone(
            net.Name() + "/generated_net", keep_schema=True, op_id_mask=train_op_mask, update_external_list=True
        )

    def __getattr__(self, op_type: str) -> Any:
        """`model.Copy(...)` etc.: ops called on the model go to `net`."""
        if op_type.startswith("__") or not op_type[:1].isupper():
            raise AttributeError(op_type)
        return getattr(self.net, op_type)


def ExtractPredictorNet(
    net_proto: Any,
    input_blobs: Iterable[str],
    output_blobs: Iterable[str],
    device: Any = None,
    renames: Mapping[str, str] | None = None,
    disabled_inputs: Iterable[str] | None = None,
) -> tuple[core.Net, list[str]]:
    """The inference part of a training net: `(predict_net, blobs to export)`.

    Keeps the ops between the first one reading an input and the last one writing an output whose
    inputs are all computable from the inputs and the net's external inputs (minus `disabled_inputs`).
    A RecurrentNetwork keeps its step net (ops moved to `device`, external inputs of the step net that
    are external inputs of the net become predictor inputs too, e.g. `seq_lengths`) and loses its
    backward step net (the argument stays, holding an empty NetDef). Blobs are renamed by `renames`.
    Unlike Caffe2, which edited the ops of `net_proto` in place, this works on copies.
    """
    from ..proto import caffe2_pb2

    predict_net = core.Net(net_proto.name + "_predict")
    predict_proto = predict_net.Proto()
    renames = dict(renames or {})
    orig_inputs = set(net_proto.external_input)
    orig_outputs = set(net_proto.external_output)
    input_blobs = {str(b) for b in input_blobs}
    output_blobs = {str(b) for b in output_blobs}
    known = (orig_inputs | input_blobs) - set(disabled_inputs or ())
    external_inputs, external_outputs = set(input_blobs), set(output_blobs)

    ops = list(net_proto.op)
    first = [j for j, op in enumerate(ops) if input_blobs & set(op.input) and op.type != "StopGradient"]
    if not first:
        raise BadArgumentError(
            f"ExtractPredictorNet: no op of net {net_proto.name!r} reads any of {sorted(input_blobs)}"
        )
    last = [j for j, op in enumerate(ops) if output_blobs & set(op.output)]
    if not last:
        raise BadArgumentError(
            f"ExtractPredictorNet: no op of net {net_proto.name!r} writes any of {sorted(output_blobs)}"
        )

    def rename(names: Any) -> None:
        renamed = [renames.get(b, b) for b in names]
        del names[:]
        names.extend(renamed)

    def place(op: Any) -> None:
        if device is not None:
            op.device_option.device_type = device.device_type
            op.device_option.device_id = device.device_id

    for source in ops[min(first) : max(last) + 1]:
        if not known.issuperset(source.input):
            continue
        op = caffe2_pb2.OperatorDef()
        op.CopyFrom(source)
        if op.type == "RecurrentNetwork":
            for arg in op.arg:
                if arg.name == "backward_step_net":
                    arg.ClearField("n")
                elif arg.name == "step_net":
                    for step_op in arg.n.op:
                        rename(step_op.input)
                        rename(step_op.output)
                        place(step_op)
                    rename(arg.n.external_input)
                    rename(arg.n.external_output)
                    external_inputs |= set(arg.n.external_input) & orig_inputs
        place(op)
        for arg in op.arg:
            if arg.name == "is_test" and arg.i == 0:
                raise BadArgumentError(
                    f"ExtractPredictorNet: op {op.type} of net {net_proto.name!r} has is_test=0 "
                    "(extracting a predictor from a training model?)"
                )
        predict_proto.op.append(op)
        known |= set(op.output)
        external_inputs |= set(op.input) & orig_inputs
        external_outputs |= set(op.output) & orig_outputs

    predict_proto.external_input.extend(sorted(external_inputs))
    predict_proto.external_output.extend(sorted(external_outputs))
    rename(predict_proto.external_input)
    rename(predict_proto.external_output)
    for op in predict_proto.op:
        rename(op.input)
        rename(op.output)
    renamed_inputs = {renames.get(b, b) for b in input_blobs}
    return predict_net, sorted(set(predict_proto.external_input) - renamed_inputs)
