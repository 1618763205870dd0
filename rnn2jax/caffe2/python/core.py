"""Caffe2's `core`: `CreateOperator`, `Net`, `BlobReference`, the gradient registry, device options.

The names a Caffe2 script gets back are decided here, exactly as Caffe2's front end decided them:

* a plain `str` blob name is prefixed with the current `NameScope` when an op is created, while a
  `BlobReference` (a name that was already resolved) is used as is;
* a net auto-registers every op input that no earlier op produced as an external input, which is how
  a step net's parameters, sequence lengths etc. become "references" of the RecurrentNetwork op;
* net names are made unique by a process-wide counter (`lstm`, `lstm_1`, ...);
* ops given no output names get `<net>/<OpType>` (then `_2`, `_3`, ...) or `<net>_blob_<k>`.

Gradients come from rnn2jax's port of Caffe2's gradient makers (each the `gradient` facet of its op's
registry record, `rnn2jax.ops.gradient_makers`) and IR (`rnn2jax.ops.backward_pass`), which emit the
OperatorDefs real Caffe2 emitted, byte for byte.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from ...ops import backward_pass as _backward_pass
from ...ops.gradient_makers import (
    GradientContext,
    GradientError,
    get_gradient_for_op,
    gradient_maker,
    register_gradient,
)
from ..opdef import make_argument
from ..proto import caffe2_pb2
from . import scope
from .scope import DeviceScope, NameScope  # noqa: F401  (Caffe2 scripts use core.NameScope)

DataType = caffe2_pb2.TensorProto.DataType
GradientSlice = namedtuple("GradientSlice", ["indices", "values"])
get_ssa = _backward_pass.get_ssa
get_undefined_blobs = _backward_pass.get_undefined_blobs

# ------------------------------------------------------------------------------------------------
# Devices and engines


def DeviceOption(
    device_type: int,
    device_id: int = 0,
    random_seed: int | None = None,
    node_name: str | None = None,
    numa_node_id: int | None = None,
    extra_info: Sequence[str] | None = None,
) -> caffe2_pb2.DeviceOption:
    option = caffe2_pb2.DeviceOption(device_type=device_type, device_id=device_id)
    if node_name is not None:
        option.node_name = node_name
    if random_seed is not None:
        option.random_seed = random_seed
    if numa_node_id is not None:
        option.numa_node_id = numa_node_id
    if extra_info is not None:
        option.extra_info.extend(extra_info)
    return option


def device_option_equal(opt1: Any, opt2: Any, ignore_node_name: bool = True, ignore_random_seed: bool = True) -> bool:
    if not opt1 or not opt2:
        return opt1 == opt2
    if not ignore_node_name and opt1.node_name != opt2.node_name:
        return False
    if not ignore_random_seed and opt1.random_seed != opt2.random_seed:
        return False
    if not opt1.device_type or not opt2.device_type:
        return True  # one of them is the default CPU option
    return opt1.device_id == opt2.device_id


def IsGPUDeviceType(device_type: int) -> bool:
    return device_type in {caffe2_pb2.CUDA, caffe2_pb2.HIP}


def InferBlobDevices(net: Any) -> dict[str, caffe2_pb2.DeviceOption]:
    """Each blob an op of `net` writes -> that op's device option (the last writer wins), as
    Caffe2's optimizers use it to build every parameter's update under the parameter's device."""
    mapping: dict[str, caffe2_pb2.DeviceOption] = {}
    for op in net.Proto().op:
        for blob in op.output:
            mapping[blob] = op.device_option
    return mapping


def InferOpBlobDevicesAsDict(
    op: caffe2_pb2.OperatorDef,
) -> tuple[dict[str, caffe2_pb2.DeviceOption], dict[str, caffe2_pb2.DeviceOption]]:
    """Every blob an op reads and writes lives on the op's device (no cross-device ops run here)."""
    inputs, outputs = InferOpBlobDevices(op)
    return dict(zip(op.input, inputs, strict=True)), dict(zip(op.output, outputs, strict=True))


def InferOpBlobDevices(op: caffe2_pb2.OperatorDef) -> tuple[list, list]:
    def copy() -> caffe2_pb2.DeviceOption:
        option = caffe2_pb2.DeviceOption()
        option.CopyFrom(op.device_option)
        return option

    return [copy() for _ in op.input], [copy() for _ in op.output]


_engine_prefs: dict[str, Any] = {"global": {}, "op": {}}


def SetGlobalEnginePref(global_engine_pref: Mapping[int, Sequence[str]]) -> None:
    """Recorded only: XLA picks the kernels, there are no engines to choose between."""
    _engine_prefs["global"] = dict(global_engine_pref)


def SetOpEnginePref(op_type: str, op_engine_pref: Mapping[int, Sequence[str]]) -> None:
    _engine_prefs["op"][op_type] = dict(op_engine_pref)


def SetEnginePref(per_op_engine_pref: Mapping[str, Any], global_engine_pref: Mapping[int, Any]) -> None:
    SetGlobalEnginePref(global_engine_pref)
    for op_type, pref in per_op_engine_pref.items():
        SetOpEnginePref(op_type, pref)


def TriggerLazyImport() -> None:
    """Nothing to import lazily: every op family is registered when rnn2jax is imported."""


def RefreshRegisteredOperators(trigger_lazy: bool = True) -> None:
    """Ops registered with `rnn2jax.register_op` are seen at once; nothing to refresh."""


def IsOperator(op_type: str) -> bool:
    """True for op types rnn2jax can run: lowered ops, user ops, host ops and the Python op."""
    from ...ops.registry import supported

    return supported(op_type)


def IsOperatorWithEngine(op_type: str, engine: str) -> bool:
    return IsOperator(op_type)


def _GetRegisteredOperators() -> set[str]:
    """Every op type rnn2jax can run (Caffe2's serialized-test coverage report iterates them)."""
    from .workspace import RegisteredOperators

    return set(RegisteredOperators())


# ------------------------------------------------------------------------------------------------
# Blob references


class BlobReference(str):
    """A resolved blob name: ops use it verbatim, never re-prefixed by a name scope.

    Unlike Caffe2's it is a `str` (so it goes anywhere a name goes); it remembers the net it came from,
    `ref + "_suffix"` stays a reference, and `ref.Relu([], "y")` adds an op reading it to that net.
    """

    def __new__(cls, name: str | bytes, net: Net | None = None) -> BlobReference:
        if isinstance(name, bytes):
            name = name.decode("utf-8")
        ref = super().__new__(cls, str(name))
        ref._from_net = net
        ref.meta = {}
        return ref

    def __getnewargs__(self) -> tuple[str]:
        return (str(self),)

    def __add__(self, other: str) -> BlobReference:
        if not isinstance(other, str | bytes):
            raise RuntimeError("Cannot add BlobReference to a non-string.")
        return BlobReference(str(self) + (other.decode() if isinstance(other, bytes) else other), self._from_net)

    def __radd__(self, other: str) -> BlobReference:
        if not isinstance(other, str | bytes):
            raise RuntimeError("Cannot add a non-string to BlobReference.")
        return BlobReference((other.decode() if isinstance(other, bytes) else other) + str(self), self._from_net)

    def __repr__(self) -> str:
        return f'BlobReference("{self}")'  # as Caffe2 wrote it

    def Net(self) -> Net | None:
        return self._from_net

    def GetNameScope(self) -> str:
        return self[: self.rfind(scope._NAMESCOPE_SEPARATOR) + 1]

    def GetUnscopedName(self) -> str:
        return self[self.rfind(scope._NAMESCOPE_SEPARATOR) + 1 :]

    def _CreateAndAddToNet(self, op_type: str, inputs: Any = None, *args: Any, **kwargs: Any) -> Any:
        inputs = _RectifyInputOutput(inputs) if inputs is not None else []
        return self._from_net._CreateAndAddToSelf(op_type, [self, *inputs], *args, **kwargs)

    def __getattr__(self, op_type: str) -> Any:
        if op_type.startswith("__") or not op_type[:1].isupper():
            raise AttributeError(op_type)
        if self._from_net is None:
            raise AttributeError(
                f"You cannot use a blob reference that does not have a net source to create op {op_type}."
            )
        return lambda *args, **kwargs: self._CreateAndAddToNet(op_type, *args, **kwargs)


def ScopedName(name: str) -> str:
    return scope.CurrentNameScope() + name


def ScopedBlobReference(name: str | bytes, *args: Any, **kwargs: Any) -> BlobReference:
    """A reference to `name` in the current name scope."""
    if isinstance(name, bytes):
        name = name.decode("utf-8")
    return BlobReference(scope.CurrentNameScope() + name, *args, **kwargs)


def _RectifyInputOutput(blobs: Any, net: Net | None = None) -> list[BlobReference]:
    """Plain strings get the current name scope, references stay as they are."""
    if isinstance(blobs, BlobReference):
        return [blobs]
    if isinstance(blobs, str | bytes):
        return [ScopedBlobReference(blobs, net=net)]
    if isinstance(blobs, list | tuple):
        rectified = []
        for blob in blobs:
            if isinstance(blob, BlobReference):
                rectified.append(blob)
            elif isinstance(blob, str | bytes):
                rectified.append(ScopedBlobReference(blob, net=net))
            else:
                raise TypeError(f"I/O blob #{len(rectified)} of unsupported type: {blob} of type {type(blob)}")
        return rectified
    raise TypeError(f"Unknown input/output type: {blobs} of type {type(blobs)}.")


# ------------------------------------------------------------------------------------------------
# Operators


def CreateOperator(
    operator_type: str,
    inputs: Any,
    outputs: Any,
    name: str = "",
    control_input: Any = None,
    device_option: caffe2_pb2.DeviceOption | None = None,
    arg: Iterable[caffe2_pb2.Argument] | None = None,
    engine: str | None = None,
    debug_info: str | None = None,
    **kwargs: Any,
) -> caffe2_pb2.OperatorDef:
    """An OperatorDef as Caffe2 built it: scoped names, the device scope's option when none is given,
    `random_seed` into the device option, then `arg`, then the keyword arguments in order."""
    operator = caffe2_pb2.OperatorDef()
    operator.type = operator_type
    operator.name = name
    operator.input.extend(str(i) for i in _RectifyInputOutput(inputs))
    operator.output.extend(str(o) for o in _RectifyInputOutput(outputs))
    if control_input:
        operator.control_input.extend(str(i) for i in _RectifyInputOutput(control_input))
    if device_option is not None:
        operator.device_option.CopyFrom(device_option)
    elif scope.CurrentDeviceScope() is not None:
        operator.device_option.CopyFrom(scope.CurrentDeviceScope())
    if engine is not None:
        operator.engine = engine
    if debug_info is not None:
        operator.debug_info = debug_info
    if "random_seed" in kwargs:
        operator.device_option.random_seed = kwargs.pop("random_seed")
    if arg is not None:
        operator.arg.extend(arg)
    for key, value in kwargs.items():
        if value is not None:
            operator.arg.append(make_argument(key, value))
    return operator


# ------------------------------------------------------------------------------------------------
# Gradients


def _as_gradient(grad: Any) -> Any:
    if isinstance(grad, tuple):
        return GradientSlice(BlobReference(grad[0]), BlobReference(grad[1]))
    return None if grad is None else BlobReference(grad)


class GradientRegistry:
    """Caffe2's gradient registry: the makers of every op rnn2jax knows (ported from Caffe2's C++ and
    Python makers), plus Python makers registered with `RegisterGradient`."""

    gradient_registry_: ClassVar[dict[str, Callable]] = {}

    @classmethod
    def RegisterGradient(cls, op_type: str) -> Callable[[Callable], Callable]:
        """Register `f(op, g_output) -> (gradient ops, g_input)` as the gradient of `op_type`.

        As in Caffe2, the built-in (C++) maker comes first: `f` is used only when there is none or it
        refuses (Floor, Sign, ...). `f`'s ops are used as returned: no arguments, device option or
        `is_gradient_op` are added (Caffe2 adds them only to C++ makers' ops)."""

        def wrapper(func: Callable) -> Callable:
            if op_type not in cls.gradient_registry_:
                builtin = _builtin_maker(op_type)

                def maker(ctx: GradientContext) -> list[caffe2_pb2.OperatorDef]:
                    if builtin is not None:
                        try:
                            return builtin(ctx)
                        except GradientError:
                            ctx.g_input = [None] * len(ctx.op.input)
                    ops, g_input = cls.gradient_registry_[op_type](ctx.op, ctx.g_output)
                    ctx.as_returned = True
                    ctx.g_input = [
                        (str(g[0]), str(g[1])) if isinstance(g, tuple) else (None if g is None else str(g))
                        for g in g_input
                    ]
                    if ops is None:
                        return []
                    return list(ops) if isinstance(ops, list | tuple) else [ops]

                register_gradient(op_type)(maker)
            cls.gradient_registry_[op_type] = func
            return func

        return wrapper

    @classmethod
    def GetGradientForOp(cls, op: caffe2_pb2.OperatorDef, g_output: Sequence[Any]) -> tuple[list, list]:
        ops, g_input = get_gradient_for_op(op, [_plain(g) for g in g_output])
        return list(ops), [_as_gradient(g) if isinstance(g, tuple) else g for g in g_input]

    @classmethod
    def GetBackwardPass(
        cls, operators: Iterable[caffe2_pb2.OperatorDef], ys: Any, ys_generate_gradient: bool = False
    ) -> tuple[list, dict]:
        if isinstance(ys, Mapping):
            ys = {str(y): _plain(g) for y, g in ys.items()}
        elif isinstance(ys, list | tuple):
            ys = [str(y) for y in ys]
        else:
            raise TypeError("ys should be a list or a dict of blob names.")
        ops, grad_map = _backward_pass.get_backward_pass(list(operators), ys)
        return ops, {BlobReference(k): _as_gradient(v) for k, v in grad_map.items() if v is not None}


def _builtin_maker(op_type: str) -> Callable | None:
    return gradient_maker(op_type)


def _plain(grad: Any) -> Any:
    if isinstance(grad, tuple):
        return (str(grad[0]), str(grad[1]))
    return None if grad is None else str(grad)


# ------------------------------------------------------------------------------------------------
# Net


class Net:
    """A NetDef under construction, with Caffe2's bookkeeping of names and external inputs.

    `net.FC([...], "out", axis=2)` adds an op (any attribute naming an op type rnn2jax knows), as in
    Caffe2; `net.Python(f)` adds a Python op that runs `f` on the host.
    """

    _net_names_used: ClassVar[set[str]] = set()

    @staticmethod
    def current_prefix() -> str:
        return scope.CurrentNameScope()

    @staticmethod
    def _get_next_net_name(basename: str) -> str:
        name = basename
        next_idx = 1
        while name in Net._net_names_used:
            name = f"{basename}_{next_idx}"
            next_idx += 1
        Net._net_names_used |= {name}
        return name

    @staticmethod
    def _reset_used_names() -> None:
        Net._net_names_used = set()

    def __init__(self, name_or_proto: str | caffe2_pb2.NetDef | Net, inplace: bool = False):
        self._next_blob_name_ids: dict[str, int] = {}
        if isinstance(name_or_proto, Net):
            name_or_proto = name_or_proto.Proto()
        if isinstance(name_or_proto, caffe2_pb2.NetDef):
            if inplace:
                self._net = name_or_proto
            else:
                self._net = caffe2_pb2.NetDef()
                self._net.CopyFrom(name_or_proto)
            prefix = self._net.name + "_blob_"
            indices = []
            for op in self._net.op:
                for blob in list(op.input) + list(op.output):
                    if blob.startswith(prefix) and blob[len(prefix) : len(prefix) + 1].isdigit():
                        indices.append(int(blob[len(prefix)]))  # Caffe2 read one digit only
            self._next_name_index = max(indices) + 1 if indices else 0
            name = self._net.name
        else:
            name = name_or_proto.decode() if isinstance(name_or_proto, bytes) else name_or_proto
            self._net = caffe2_pb2.NetDef()
            self._next_name_index = 0
        self._net.name = Net._get_next_net_name(name)

    # -- the proto -------------------------------------------------------------------------------

    def Proto(self) -> caffe2_pb2.NetDef:
        return self._net

    def Name(self) -> str:
        return self._net.name

    def __str__(self) -> str:
        return self.Name()

    def __repr__(self) -> str:
        return f"Net({self.Name()!r}, {len(self._net.op)} ops)"

    @property
    def external_inputs(self) -> list[BlobReference]:
        return [BlobReference(x, self) for x in self._net.external_input]

    @property
    def external_outputs(self) -> list[BlobReference]:
        return [BlobReference(x, self) for x in self._net.external_output]

    def BlobIsDefined(self, blob: str) -> bool:
        """True when an op of this net outputs `blob` or it is an external input."""
        name = str(blob)
        return name in self._net.external_input or any(name in op.output for op in self._net.op)

    def UsesBlob(self, blob: str) -> bool:
        name = str(blob)
        return any(name in op.input or name in op.output for op in self._net.op)

    def GetBlobRef(self, blob_name: str) -> BlobReference:
        if not self.BlobIsDefined(blob_name):
            raise KeyError(f"Net does not define blob {blob_name}")
        return BlobReference(blob_name, self)

    def AddExternalInput(self, *inputs: str) -> BlobReference | list[BlobReference]:
        """Register names verbatim (no scoping); a name given twice is an error."""
        if not inputs:
            raise ValueError("AddExternalInput needs at least one blob")
        names = [str(b) for b in inputs]
        for i, name in enumerate(names):
            if name in self._net.external_input or name in names[:i]:
                raise AssertionError(f"Net already contains an input named {name}")
        self._net.external_input.extend(names)
        refs = [BlobReference(n, self) for n in names]
        return refs[0] if len(refs) == 1 else refs

    AddExternalInputs = AddExternalInput

    def AddScopedExternalInputs(self, *inputs: str) -> list[BlobReference]:
        refs = self.AddExternalInput(*(ScopedBlobReference(b) for b in inputs))
        return refs if isinstance(refs, list) else [refs]

    def AddExternalOutput(self, *outputs: str) -> None:
        """Every output must be produced here or be an input; no deduplication (as in Caffe2)."""
        for output in outputs:
            if not self.BlobIsDefined(output):
                raise AssertionError(f"{output} is not defined")
        self._net.external_output.extend(str(o) for o in outputs)

    AddExternalOutputs = AddExternalOutput

    def AddScopedExternalOutputs(self, *outputs: str) -> list[BlobReference]:
        refs = [ScopedBlobReference(b) for b in outputs]
        self.AddExternalOutput(*refs)
        return refs

    def NextName(self, prefix: str | None = None, output_id: int | None = None) -> str:
        """`<net>/<prefix>` (with `_2`, `_3`... while taken) or `<net>_blob_<k>` without a prefix."""
        if not prefix:
            name = f"{self._net.name}_blob_{self._next_name_index}"
            self._next_name_index += 1
            return name
        base = f"{self._net.name}/{prefix}"
        suffix = "" if output_id is None else f":{output_id}"
        name = key = base + suffix
        index = self._next_blob_name_ids.get(key, 2)
        while self.BlobIsDefined(str(ScopedBlobReference(name))):
            name = f"{base}_{index}{suffix}"
            index += 1
            self._next_blob_name_ids[key] = index
        return name

    def NextScopedBlob(self, prefix: str = "unnamed") -> BlobReference:
        return ScopedBlobReference(self.NextName(prefix))

    def NextBlob(self, prefix: str = "unnamed") -> BlobReference:
        return BlobReference(self.NextName(prefix))

    # -- ops -------------------------------------------------------------------------------------

    def _ExtendOps(self, new_ops: Iterable[caffe2_pb2.OperatorDef]) -> None:
        self._net.op.extend(new_ops)

    def _CreateAndAddToSelf(self, op_type: str, inputs: Any, outputs: Any = None, **kwargs: Any) -> Any:
        """Undefined inputs become external inputs, then the op is added; returns its output reference
        (one output), a tuple of them (several), or None (no output)."""
        inputs = _RectifyInputOutput(inputs)
        for blob in inputs:
            if not self.BlobIsDefined(blob):
                self.AddExternalInput(blob)
        if outputs is None:
            outputs = self.NextName(prefix=op_type)
        elif isinstance(outputs, int):
            outputs = [self.NextName(prefix=op_type, output_id=i) for i in range(outputs)]
        outputs = _RectifyInputOutput(outputs, net=self)
        op = CreateOperator(op_type, inputs, outputs, **kwargs)
        self._ExtendOps([op])
        if not op.output:
            return None
        if len(op.output) == 1:
            return BlobReference(op.output[0], self)
        return tuple(BlobReference(o, self) for o in op.output)

    def __getattr__(self, op_type: str) -> Any:
        if op_type.startswith("__") or not op_type[:1].isupper():
            raise AttributeError(op_type)
        if not IsOperator(op_type):
            raise AttributeError(f"Method {op_type} is not a registered operator.")
        return lambda *args, **kwargs: self._CreateAndAddToSelf(op_type, *args, **kwargs)

    def Python(
        self,
        f: Callable,
        grad_f: Callable | None = None,
        python_func_type: Any = None,
        pass_workspace: bool = False,
        grad_output_indices: Sequence[int] | None = None,
        grad_input_indices: Sequence[int] | None = None,
    ) -> Callable[..., Any]:
        """A Python op: `f(inputs, outputs)` runs on the host with the input blobs and writable outputs
        (`f(inputs, outputs, workspace)` with `pass_workspace`); `grad_f` likewise for its gradient."""
        from .python_op import register_python_function
        from .workspace import C

        token = register_python_function(f, grad_f, python_func_type, C.Workspace if pass_workspace else None)
        return lambda *args, **kwargs: self._CreateAndAddToSelf(
            "Python",
            *args,
            grad_output_indices=list(grad_output_indices or []),  # Caffe2's argument order; [] = all
            grad_input_indices=list(grad_input_indices or []),
            token=token,
            **kwargs,
        )

    # -- whole-net operations ----------------------------------------------------------------------

    def AddGradientOperators(self, ys: Any, skip: int = 0) -> dict:
        """Append the backward pass of this net's ops (from `skip` on) for `ys`; returns the map from
        each blob to its gradient (a BlobReference, or a GradientSlice for sparse gradients)."""
        grad_ops, input_to_grad = GradientRegistry.GetBackwardPass(self._net.op[skip:], ys)
        self._ExtendOps(grad_ops)
        return input_to_grad

    def Clone(
        self,
        name: str,
        blob_remap: Mapping[str, str] | None = None,
        op_id_mask: Sequence[int] | None = None,
        remap_funcs: Mapping[str, Callable] | None = None,
        keep_schema: bool = True,
        update_external_list: bool = False,
    ) -> Net:
        """A copy of this net under a new (unique) name, blobs renamed by `blob_remap`."""
        remap = {str(k): str(v) for k, v in (blob_remap or {}).items()}
        proto = caffe2_pb2.NetDef()
        proto.CopyFrom(self._net)
        proto.name = name
        mask = range(len(self._net.op)) if op_id_mask is None else op_id_mask

        def remapped(names: Iterable[str]) -> list[str]:
            return [remap.get(n, n) for n in names]

        del proto.op[:]
        for op_id in mask:
            op = caffe2_pb2.OperatorDef()
            op.CopyFrom(self._net.op[op_id])
            if remap and any(a.HasField("n") or a.nets for a in op.arg):
                from ...errors import Rnn2JaxError

                raise Rnn2JaxError(
                    f"net '{self.Name()}', op #{op_id} ({op.type}): Clone with blob_remap does not rename "
                    "blobs inside nested nets"
                )
            op.input[:] = remapped(op.input)
            op.output[:] = remapped(op.output)
            if remap_funcs and op.type in remap_funcs:
                remap_funcs[op.type](op, (name + "/") if name else "", remap)
            proto.op.append(op)
        proto.external_input[:] = remapped(proto.external_input)
        proto.external_output[:] = remapped(proto.external_output)
        return Net(proto)

    def AppendNet(self, net: Net | caffe2_pb2.NetDef, device_option: Any = None) -> Net:
        proto = net.Proto() if isinstance(net, Net) else net
        ops = list(proto.op)
        if device_option is not None:
            ops = [_with_device(op, device_option) for op in ops]
        self._ExtendOps(ops)
        for name in proto.external_input:
            if name not in self._net.external_input:
                self._net.external_input.append(name)
        for name in proto.external_output:
            if name not in self._net.external_output:
                self._net.external_output.append(name)
        return self

    def RunAllOnGPU(self, gpu_id: int = 0, use_cudnn: bool = False) -> None:
        """Device options say nothing to XLA: the net runs on JAX's default device, so this is a no-op."""

    def RunAllOnMKL(self) -> None:
        """No MKL engine here: a no-op."""


def _with_device(op: caffe2_pb2.OperatorDef, device_option: caffe2_pb2.DeviceOption) -> caffe2_pb2.OperatorDef:
    new = caffe2_pb2.OperatorDef()
    new.CopyFrom(op)
    new.device_option.CopyFrom(device_option)
    return new


def reset_net_names() -> None:
    """Forget the net names handed out so far, so nets built again get the same names."""
    Net._reset_used_names()


# ------------------------------------------------------------------------------------------------
# Plans


class ExecutionStep:
    """A PlanDef execution step under construction: nets or substeps, run `num_iter` times."""

    def __init__(self, name: str, nets: Any = None, num_iter: int | None = None):
        self._step = caffe2_pb2.ExecutionStep(name=name)
        self._net_dict: dict[str, Net] = {}
        self._substeps: list[ExecutionStep] = []
        if nets is not None:
            for net in nets if isinstance(nets, list | tuple) else [nets]:
                self.AddNet(net)
        if num_iter is not None:
            self._step.num_iter = num_iter

    def Name(self) -> str:
        return self._step.name

    def __str__(self) -> str:
        return self.Name()

    def Proto(self) -> caffe2_pb2.ExecutionStep:
        return self._step

    def HasNets(self) -> bool:
        return bool(self._step.network)

    def HasSubsteps(self) -> bool:
        return bool(self._step.substep)

    def Nets(self) -> list[Net]:
        return list(self._net_dict.values())

    def Substeps(self) -> list[ExecutionStep]:
        return list(self._substeps)

    def get_net(self, name: str) -> Net:
        return self._net_dict[name]

    def SetIter(self, num_iter: int) -> None:
        self._step.num_iter = num_iter

    def SetCreateWorkspace(self, create_workspace: bool) -> None:
        self._step.create_workspace = create_workspace

    def SetNumConcurrentInstances(self, num_concurrent_instances: int) -> None:
        self._step.num_concurrent_instances = num_concurrent_instances

    def SetOnlyOnce(self, only_once: bool) -> None:
        self._step.only_once = only_once

    def SetShouldStopBlob(self, should_stop_blob: str) -> None:
        self._step.should_stop_blob = str(should_stop_blob)

    def RunEveryMillis(self, interval: int) -> None:
        self._step.run_every_ms = interval

    def SetReportNet(self, report_net: Net, report_interval: int) -> None:
        self._add_net(report_net)
        self._step.report_net = report_net.Name()
        self._step.report_interval = report_interval

    def SetConcurrentSubsteps(self, concurrent_substeps: bool) -> None:
        self._step.concurrent_substeps = concurrent_substeps

    def AddSubstep(self, substep: Any) -> ExecutionStep:
        if self._step.network:
            raise ValueError(f"execution step '{self.Name()}' has nets; it cannot also have substeps")
        if isinstance(substep, Net):
            substep = ExecutionStep(substep.Name(), substep)
        self._substeps.append(substep)
        self._step.substep.add().CopyFrom(substep.Proto())
        for net in substep._all_nets():
            self._net_dict.setdefault(net.Name(), net)
        return self

    def AddNet(self, net: Net) -> ExecutionStep:
        if self._step.substep:
            raise ValueError(f"execution step '{self.Name()}' has substeps; it cannot also have nets")
        self._add_net(net)
        self._step.network.append(net.Name())
        return self

    def _add_net(self, net: Net) -> None:
        if not isinstance(net, Net):
            raise TypeError(f"execution step '{self.Name()}': not a core.Net: {type(net).__name__}")
        self._net_dict.setdefault(net.Name(), net)

    def _all_nets(self) -> list[Net]:
        return list(self._net_dict.values())


class Plan:
    """A PlanDef under construction: execution steps and the nets they name."""

    def __init__(self, name_or_step: str | ExecutionStep):
        self._plan = caffe2_pb2.PlanDef()
        self._net_dict: dict[str, Net] = {}
        if isinstance(name_or_step, ExecutionStep):
            self._plan.name = name_or_step.Name()
            self.AddStep(name_or_step)
        elif isinstance(name_or_step, str):
            self._plan.name = name_or_step
        else:
            raise ValueError("name_or_step must be a string or ExecutionStep")

    def __str__(self) -> str:
        return self._plan.name

    def Proto(self) -> caffe2_pb2.PlanDef:
        return self._plan

    def AddNets(self, nets: Iterable[Net]) -> None:
        for net in nets:
            if net.Name() not in self._net_dict:
                self._net_dict[net.Name()] = net
                self._plan.network.add().CopyFrom(net.Proto())

    def Nets(self) -> list[Net]:
        return list(self._net_dict.values())

    def AddStep(self, step: ExecutionStep) -> None:
        if not step.HasNets() and not step.HasSubsteps():
            return
        self._plan.execution_step.add().CopyFrom(step.Proto())
        self.AddNets(step._all_nets())


def execution_step(
    default_name: str,
    steps_or_nets: Any,
    num_iter: int | None = None,
    report_net: Net | None = None,
    report_interval: int | None = None,
    concurrent_substeps: bool | None = None,
    should_stop_blob: str | None = None,
    only_once: bool | None = None,
    num_concurrent_instances: int | None = None,
    create_workspace: bool = False,
    run_every_ms: int | None = None,
) -> ExecutionStep:
    """Caffe2's helper: an ExecutionStep from a net, a step, or a list of either."""
    if isinstance(steps_or_nets, ExecutionStep) and not any(
        v is not None for v in (num_iter, report_net, concurrent_substeps, should_stop_blob, only_once)
    ):
        return steps_or_nets
    step = ExecutionStep(default_name)
    if num_iter is not None:
        step.SetIter(num_iter)
    if should_stop_blob is not None:
        step.SetShouldStopBlob(should_stop_blob)
    if only_once is not None:
        step.SetOnlyOnce(only_once)
    if concurrent_substeps is not None:
        step.SetConcurrentSubsteps(concurrent_substeps)
    if num_concurrent_instances is not None:
        step.SetNumConcurrentInstances(num_concurrent_instances)
    if create_workspace:
        step.SetCreateWorkspace(True)
    if run_every_ms:
        step.RunEveryMillis(run_every_ms)
    if report_net is not None:
        step.SetReportNet(report_net, report_interval or 1)
    items = steps_or_nets if isinstance(steps_or_nets, list | tuple) else [steps_or_nets]
    if items and all(isinstance(item, Net) for item in items):
        for net in items:
            step.AddNet(net)
    else:
        for item in items:
            step.AddSubstep(item)
    return step
