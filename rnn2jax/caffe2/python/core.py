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

import pickle
import sys
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

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
from . import _import_c_extension as C
from . import scope, workspace
from ._caffe2_operators import CAFFE2_OPERATOR_TYPES
from .lazy import TriggerLazyImport
from .scope import DeviceScope, NameScope

DataType = caffe2_pb2.TensorProto.DataType
GradientSlice = namedtuple("GradientSlice", ["indices", "values"])
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
        # at least one option is for CPU: equal only if both are
        return not opt1.device_type and not opt2.device_type
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
    """The device option of each input and of each output of `op` (the C extension's answer, parsed)."""
    inputs, outputs = C.infer_op_input_output_device(op.SerializeToString())
    parse = caffe2_pb2.DeviceOption.FromString
    return [parse(d) for d in inputs], [parse(d) for d in outputs]


# Engine preferences are the C extension's, as in Caffe2 (recorded only: XLA picks the kernels)
SetPerOpEnginePref = C.set_per_op_engine_pref
SetGlobalEnginePref = C.set_global_engine_pref
SetEnginePref = C.set_engine_pref
SetOpEnginePref = C.set_op_engine_pref


def RefreshRegisteredOperators(trigger_lazy: bool = True) -> None:
    """Ops registered with `rnn2jax.register_op` are seen at once; only the lazy imports
    (`lazy_dyndep.RegisterOpsLibrary`) run, as in Caffe2."""
    if trigger_lazy:
        TriggerLazyImport()


_GLOBAL_INIT_ARGS: list[str] = []


def GlobalInit(args: Sequence[str]) -> None:
    """Initialize with Caffe2's command-line flags (`args[0]` is the program name); the others are kept
    for `GetGlobalInitArgs`, as Caffe2 keeps them (even when a flag is refused)."""
    TriggerLazyImport()
    _GLOBAL_INIT_ARGS.extend(args[1:])
    C.global_init(args)


def GetGlobalInitArgs() -> list[str]:
    return _GLOBAL_INIT_ARGS[:]


def IsOperator(op_type: str) -> bool:
    """True for op types rnn2jax can run: lowered ops, user ops, host ops and the Python op."""
    from ...ops.registry import supported

    return supported(op_type)


def IsOperatorWithEngine(op_type: str, engine: str) -> bool:
    """Caffe2 looks up the op's registry key for `engine` (`Conv_ENGINE_CUDNN`); rnn2jax registers no
    engine-specific kernels (XLA picks them), so only the default engine is an operator."""
    if C.op_registry_key(op_type, engine) == op_type:
        return IsOperator(op_type)
    return False


def _GetRegisteredOperators() -> set[str]:
    """Every op type rnn2jax can run (Caffe2's serialized-test coverage report iterates them)."""
    from .workspace import RegisteredOperators

    return set(RegisteredOperators())


def __getattr__(name: str) -> Any:
    """`core._REGISTERED_OPERATORS`, Caffe2's cached set of registered op types, is computed when read, so ops
    registered later (`rnn2jax.register_op`) are in it without `RefreshRegisteredOperators`."""
    if name == "_REGISTERED_OPERATORS":
        return _GetRegisteredOperators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class IR(_backward_pass._IR):
    """Caffe2's `core.IR`: a list of ops played into SSA form, whose `GetBackwardPass(ys)` returns the
    gradient ops and the blob-to-gradient map (what `GradientRegistry.GetBackwardPass` builds one for)."""

    IS_AUTO_GEN_SUM_OPS_TAG = _backward_pass.AUTO_GEN_SUM_TAG.rpartition(":")[0]
    ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG = _backward_pass.ONLY_KEEP_TAG.rpartition(":")[0]

    def __init__(self, operators: Iterable[caffe2_pb2.OperatorDef]):
        super().__init__(list(operators))

    def GetBackwardPass(self, ys: Any) -> tuple[list, dict]:
        if not isinstance(ys, Mapping):
            ys = dict.fromkeys(ys)
        return self.backward_pass({str(k): v for k, v in ys.items()})


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
        # through the net's attribute, as Caffe2 (the op's recorded traceback starts at this frame)
        return getattr(self._from_net, op_type)([self, *inputs], *args, **kwargs)

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
    if workspace.IsImmediate():
        workspace.RunOperatorImmediate(operator)
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
                    # a maker may answer fewer (control_ops_grad's `return [], []`): Caffe2's zip stops short
                    ctx.g_input += [None] * (len(ctx.op.input) - len(ctx.g_input))
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


def _control_ops_gradient(name: str) -> Callable:
    """Caffe2's Python maker `name` of caffe2/python/control_ops_grad.py (If, Do, While), which Caffe2's
    core.py registers: that module is Caffe2's own, run from the Caffe2 source tree on this API, imported
    when a gradient is first asked for."""

    def maker(op: caffe2_pb2.OperatorDef, g_output: Sequence[Any]) -> tuple[list, list]:
        try:
            from caffe2.python import control_ops_grad
        except ImportError as error:
            raise GradientError(
                f"the gradient of {op.type} is Caffe2's control_ops_grad.{name}, a module of Caffe2's source "
                f"tree, which could not be imported ({error}); rnn2jax.caffe2.install() finds the tree"
            ) from None
        return getattr(control_ops_grad, name)(op, g_output)

    maker.__name__ = name
    return maker


for _type, _name in (("Do", "gen_do_gradient"), ("If", "gen_if_gradient"), ("While", "gen_while_gradient")):
    GradientRegistry.RegisterGradient(_type)(_control_ops_gradient(_name))


def _plain(grad: Any) -> Any:
    if isinstance(grad, tuple):
        return (str(grad[0]), str(grad[1]))
    return None if grad is None else str(grad)


# ------------------------------------------------------------------------------------------------
# SSA: which version of each blob each op reads and writes


def get_ssa(net: Any, blob_versions: dict[str, int] | None = None) -> tuple[Any, dict[str, int]]:
    """Caffe2's `get_ssa`: per op (versioned inputs, versioned outputs) and the latest version of each blob.
    Versions go on from `blob_versions` (updated in place); a blob not in it starts at 0."""
    if blob_versions is None:
        blob_versions = {}
    if isinstance(net, list):
        return [get_ssa(n, blob_versions) for n in net], blob_versions
    proto = net.Proto() if isinstance(net, Net) else net
    if not isinstance(proto, caffe2_pb2.NetDef):
        raise TypeError(f"get_ssa: a Net or a NetDef, not a {type(net).__name__}")
    for name in proto.external_input:
        blob_versions.setdefault(str(name), 0)
    ssa = []
    for op in proto.op:
        if not proto.external_input:
            for name in op.input:
                blob_versions.setdefault(str(name), 0)
        inputs = [(str(i), blob_versions.get(str(i), 0)) for i in op.input]
        for o in op.output:
            blob_versions[str(o)] = blob_versions.get(str(o), 0) + 1
        ssa.append((inputs, [(str(o), blob_versions[str(o)]) for o in op.output]))
    return ssa, blob_versions


def get_output_producers(ssa: Sequence[Any]) -> dict[tuple[str, int], int]:
    """Each versioned blob -> the index of the op that writes that version."""
    return {o: i for i, (_inputs, outputs) in enumerate(ssa) for o in outputs}


def get_op_ids_in_path(ssa: Sequence[Any], blob_versions: Mapping[str, int], inputs: Iterable[Any],
                       outputs: Iterable[Any]) -> list[int]:  # fmt: skip
    """The sorted indices of the ops needed to compute `outputs` from `inputs` (taken at their latest
    versions)."""
    given = {(str(i), blob_versions[str(i)]) for i in inputs}
    producers = get_output_producers(ssa)
    queue = [(str(o), blob_versions[str(o)]) for o in outputs]
    used: set[int] = set()
    while queue:
        blob = queue.pop()
        if blob not in given and blob in producers and producers[blob] not in used:
            used.add(producers[blob])
            queue.extend(ssa[producers[blob]][0])
    return sorted(used)


def remap_input(op: caffe2_pb2.OperatorDef, blob_name_remapping: Mapping[str, str]) -> None:
    """Rename the inputs of `op` in place."""
    op.input[:] = [blob_name_remapping.get(b, b) for b in op.input]


# ------------------------------------------------------------------------------------------------
# Net


def _RegisterPythonImpl(
    f: Callable | tuple,
    grad_f: Callable | tuple | None = None,
    python_func_type: Any = None,
    pass_workspace: bool = False,
) -> str:
    """Register a Python op's function (and gradient function) in this process; returns its token."""
    from .python_op import register_python_function

    return register_python_function(f, grad_f, python_func_type, C.Workspace if pass_workspace else None)


def CreatePythonOperator(
    f: Callable | tuple,
    inputs: Any,
    outputs: Any,
    grad_f: Callable | tuple | None = None,
    pass_workspace: bool = False,
    python_func_type: Any = None,
    *args: Any,
    **kwargs: Any,
) -> caffe2_pb2.OperatorDef:
    """A Python op as one OperatorDef: `f(inputs, outputs)` (with `pass_workspace`, `f(inputs, outputs,
    workspace)`, the workspace the op runs in) is registered in this process under the op's `token`."""
    kwargs["token"] = _RegisterPythonImpl(f, grad_f, python_func_type, pass_workspace=pass_workspace)
    return CreateOperator("Python", inputs, outputs, *args, **kwargs)


def _next_unused_name(basename: str, used: set[str]) -> str:
    """`basename`, else `basename_1`, `basename_2`, ...: the first not in `used`, which it joins (Caffe2 named
    nets and execution steps so)."""
    name, next_idx = basename, 1
    while name in used:
        name = f"{basename}_{next_idx}"
        next_idx += 1
    used.add(name)
    return name


class Net:
    """A NetDef under construction, with Caffe2's bookkeeping of names and external inputs.

    `net.FC([...], "out", axis=2)` adds an op (any attribute naming an op type rnn2jax runs or real Caffe2
    registers: a net may hold ops rnn2jax refuses to run, such as If, to be read or rewritten), as in Caffe2;
    `net.Python(f)` adds a Python op that runs `f` on the host.
    """

    _net_names_used: ClassVar[set[str]] = set()

    @staticmethod
    def current_prefix() -> str:
        """The name of the NetBuilder being built (`with NetBuilder(name)`), else "": nets made inside one are
        named under it. NetBuilder is Caffe2's own module (net_builder.py): none is active unless it was
        imported."""
        net_builder = sys.modules.get("caffe2.python.net_builder")
        builder = net_builder.NetBuilder.current(required=False) if net_builder is not None else None
        return builder.name if builder else ""

    @staticmethod
    def _get_next_net_name(basename: str | None) -> str:
        return _next_unused_name("/".join(x for x in [Net.current_prefix(), basename] if x), Net._net_names_used)

    @staticmethod
    def _reset_used_names() -> None:
        Net._net_names_used = set()

    def __init__(self, name_or_proto: str | caffe2_pb2.NetDef | Net, inplace: bool = False):
        self._next_blob_name_ids: dict[str, int] = {}
        self._registered_blob_names: set[str] = set()  # NextBlob never hands out a name twice
        self._attr_dict: defaultdict[str, list] = defaultdict(list)
        self._input_record: Any = None
        self._output_record: Any = None
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
        """`NextBlob` of the name in the current name scope."""
        return self.NextBlob(ScopedName(prefix))

    def NextBlob(self, prefix: str = "unnamed") -> BlobReference:
        """`prefix` itself, else `prefix_auto_<i>`: a name neither defined in this net nor handed out before."""
        base = BlobReference(prefix)
        blob = base
        index = 0
        while str(blob) in self._registered_blob_names or self.BlobIsDefined(blob):
            blob = base + f"_auto_{index}"
            index += 1
        self._registered_blob_names.add(str(blob))
        return blob

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
        workspace.operator_tracebacks[self.Name()][len(self._net.op) - 1] = _extract_stacktrace()
        if not op.output:
            return None
        if len(op.output) == 1:
            return BlobReference(op.output[0], self)
        return tuple(BlobReference(o, self) for o in op.output)

    def __getattr__(self, op_type: str) -> Any:
        if op_type.startswith("__") or not op_type[:1].isupper():
            raise AttributeError(op_type)
        if not IsOperator(op_type) and op_type not in CAFFE2_OPERATOR_TYPES:
            raise AttributeError(f"Method {op_type} is not a registered operator.")
        return lambda *args, **kwargs: self._CreateAndAddToSelf(op_type, *args, **kwargs)

    def Python(
        self,
        f: Callable | tuple,
        grad_f: Callable | tuple | None = None,
        python_func_type: Any = None,
        pass_workspace: bool = False,
        grad_output_indices: Sequence[int] | None = None,
        grad_input_indices: Sequence[int] | None = None,
    ) -> Callable[..., Any]:
        """A Python op: `f(inputs, outputs)` runs on the host with the input blobs and writable outputs
        (`f(inputs, outputs, workspace)` with `pass_workspace`); `grad_f` likewise for its gradient.

        `f` (and `grad_f`) may be a builder tuple `(func, args, kwargs)`: as in Caffe2 it is pickled into
        the op (`pickled_builder`), and `func(*args, **kwargs)` builds the function once per created net."""

        def make_builder(t: Any) -> bytes:
            if not isinstance(t, tuple):
                return b""
            assert len(t) == 3, "Expected builder tuple (func, args, kwargs)"
            func, args, kwargs = t
            return pickle.dumps((func, tuple(args), dict(kwargs)))

        f_builder, grad_f_builder = make_builder(f), make_builder(grad_f)
        assert (not grad_f) or ((not f_builder) == (not grad_f_builder)), (
            "A tuple has to be passed to both f and grad_f or neither."
        )
        core_kwargs: dict[str, Any] = {}
        if f_builder:
            core_kwargs.update(
                pickled_builder=f_builder, pickled_grad_builder=grad_f_builder, pass_workspace=pass_workspace
            )
        else:
            core_kwargs["token"] = _RegisterPythonImpl(f, grad_f, python_func_type, pass_workspace=pass_workspace)
        return lambda *args, **kwargs: self._CreateAndAddToSelf(
            "Python",
            *args,
            grad_output_indices=list(grad_output_indices or []),  # Caffe2's argument order; [] = all
            grad_input_indices=list(grad_input_indices or []),
            **{**kwargs, **core_kwargs},
        )

    # -- whole-net operations ----------------------------------------------------------------------

    def AddObserver(self, observer_type: str) -> Any:
        """Attach a TimeObserver or RunCountObserver to this net, created in the current workspace."""
        return C.add_observer_to_net(self._net.name, observer_type)

    def RemoveObserver(self, observer: Any) -> None:
        C.remove_observer_from_net(self._net.name, observer)

    def NumObservers(self) -> int:
        return C.num_observers_on_net(self._net.name)

    def AddGradientOperators(self, ys: Any, skip: int = 0) -> dict:
        """Append the backward pass of this net's ops (from `skip` on) for `ys`; returns the map from
        each blob to its gradient (a BlobReference, or a GradientSlice for sparse gradients)."""
        grad_ops, input_to_grad = GradientRegistry.GetBackwardPass(self._net.op[skip:], ys)
        if workspace.IsImmediate():  # the gradient ops bypass CreateOperator: run them here
            for op in grad_ops:
                workspace.RunOperatorImmediate(op)
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
        """A copy of this net under a new (unique) name, blobs renamed by `blob_remap`; as in Caffe2, the
        nets inside If, While, AsyncIf and RecurrentNetwork(Gradient) ops are renamed too (`remap_funcs`,
        op type -> function(op, prefix, blob_remap), adds to or replaces those)."""
        remap = {str(k): str(v) for k, v in (blob_remap or {}).items()}
        remap_funcs = {**DEFAULT_REMAP_FUNCS, **(remap_funcs or {})}
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
            op.input[:] = remapped(op.input)
            op.output[:] = remapped(op.output)
            if op.type in remap_funcs:
                remap_funcs[op.type](op, (name + "/") if name else "", remap)
            proto.op.append(op)
        proto.external_input[:] = remapped(proto.external_input)
        proto.external_output[:] = remapped(proto.external_output)
        new_net = Net(proto)
        if keep_schema:
            self._clone_records(new_net, remap)
        new_net._attr_dict.update(self._attr_dict)
        if update_external_list:
            _recompute_external_lists(new_net.Proto())
        return new_net

    def ClonePartial(self, name: str, inputs: Any, outputs: Sequence[Any],
                     remap_funcs: Mapping[str, Callable] | None = None) -> tuple[Net, list[BlobReference]]:  # fmt: skip
        """A clone holding only the ops needed to compute `outputs` from `inputs`, and references to its outputs.
        `inputs` maps blobs of this net to the clone's external inputs (a list keeps their names); blobs made
        and used inside are renamed under `name/`, blobs read before any op writes them keep their names."""
        pair_list = isinstance(inputs, list) and all(isinstance(i, tuple) and len(i) == 2 for i in inputs)
        if not isinstance(inputs, dict):
            inputs = OrderedDict(inputs) if pair_list else OrderedDict(zip(inputs, inputs, strict=True))
        for output in outputs:
            if not self.BlobIsDefined(output):
                raise AssertionError(f"{output} is not defined")
        input_names = {str(k): str(v) for k, v in inputs.items()}
        output_names = [str(o) for o in outputs]
        ssa, blob_versions = get_ssa(self._net, {str(i): 0 for i in inputs})
        used_op_ids = get_op_ids_in_path(ssa, blob_versions, inputs, outputs)
        disallowed_op_ids = get_op_ids_in_path(ssa, blob_versions, [], inputs)
        if set(used_op_ids) & set(disallowed_op_ids):
            raise AssertionError("Cannot partially clone net: some of the ops required would generate the given input.")
        undefined = get_undefined_blobs([op for i, op in enumerate(ssa) if i in used_op_ids]) - set(input_names)
        prefix = (name + "/") if name else ""

        def remap(blob: str) -> str:
            if blob in input_names:
                return input_names[blob]
            return blob if blob in undefined else prefix + blob

        mapping = {b: remap(b) for b in blob_versions}
        new_net = self.Clone(name, mapping, used_op_ids, remap_funcs)
        new_in = [mapping[i] for i in input_names] + list(undefined)
        new_out = [mapping[o] for o in output_names]
        new_net.Proto().external_input[:] = new_in
        new_net.Proto().external_output[:] = new_out
        return new_net, [new_net.GetBlobRef(o) for o in new_out]

    def insert_op_at_idx(self, op: caffe2_pb2.OperatorDef, op_idx: int) -> None:
        """Insert `op` before the op at `op_idx`."""
        if op_idx < 0:
            raise AssertionError(f"insert_op_at_idx: op_idx {op_idx} < 0")
        rest = [caffe2_pb2.OperatorDef.FromString(o.SerializeToString()) for o in self._net.op[op_idx:]]
        del self._net.op[op_idx:]
        self._net.op.extend([op, *rest])

    def reroute_tensor(self, tensor: Any, new_producer: caffe2_pb2.OperatorDef, can_modify: Any = None) -> int:
        """Insert `new_producer` (an op reading `tensor`) right after the ops writing its inputs, make its
        first output replace `tensor` among the external outputs and as the input of the ops in `can_modify`;
        returns how many ops were rerouted. Assumes no blob is written in place."""
        tensor = str(tensor)

        def producer_index(blob: str) -> int:
            if blob in self._net.external_input:
                return -1
            if blob not in new_producer.input:
                raise AssertionError(f"new producer {new_producer.type} is not taking in {blob}")
            return next((i for i, op in enumerate(self._net.op) if blob in op.output), -2)

        self.insert_op_at_idx(new_producer, max(producer_index(b) for b in new_producer.input) + 1)
        new_tensor = new_producer.output[0]
        if tensor in self._net.external_output:
            self._net.external_output[:] = [new_tensor if b == tensor else b for b in self._net.external_output]
        rerouted = 0
        if can_modify:
            for op in self._net.op:
                if op in can_modify:
                    remap_input(op, {tensor: new_tensor})
                    rerouted += 1
        return rerouted

    def PopulateProtoWithFileName(self) -> None:
        """Name each op `file:line:function` of the code that created it (where Caffe2's traceback of the
        op starts)."""
        net_tb = workspace.operator_tracebacks.get(self.Name())
        if net_tb is not None:
            for idx, op in enumerate(self._net.op):
                if idx in net_tb:
                    op.name = ":".join(map(str, net_tb[idx][0]))

    def _CheckLookupTables(self) -> None:
        """Caffe2's tests check its lookup tables (op outputs, external inputs) against the proto; rnn2jax
        keeps none (BlobIsDefined reads the proto), so there is nothing that can disagree."""

    def _clone_records(self, new_net: Net, remap: Mapping[str, str]) -> None:
        """The input and output records of a clone: this net's, over the renamed blobs (Caffe2's keep_schema).
        Records are Caffe2's `schema` module's, from the source tree: a net has none unless it was imported."""
        for attribute in ("_input_record", "_output_record"):
            record = getattr(self, attribute)
            if record:
                from . import schema

                blobs = [BlobReference(remap.get(str(b), str(b)), net=new_net) for b in record.field_blobs()]
                setattr(new_net, attribute, schema.from_blob_list(record, blobs))

    def AppendNet(self, net: Net | caffe2_pb2.NetDef, device_option: Any = None) -> Net:
        """Append `net`'s ops; its external inputs that this net neither has nor produces become this net's,
        and its external outputs are added (as Caffe2 did: duplicates within `net`'s list are kept)."""
        proto = net.Proto() if isinstance(net, Net) else net
        produced = {blob for op in self._net.op for blob in op.output}
        for name in proto.external_input:
            if name not in self._net.external_input and name not in produced:
                self._net.external_input.append(name)
        self._net.external_output.extend([o for o in proto.external_output if o not in self._net.external_output])
        ops = list(proto.op)
        if device_option is not None:
            ops = [_with_device(op, device_option) for op in ops]
            for op in ops:
                if op.type == "RecurrentNetwork":
                    for arg in op.arg:
                        if arg.name.endswith("step_net"):
                            for step_op in arg.n.op:
                                step_op.device_option.CopyFrom(device_option)
        self._ExtendOps(ops)
        return self

    def Const(self, array: Any, blob_out: Any = None, dtype: Any = None) -> BlobReference:
        """A constant blob: ConstantFill for a bool, else the GivenTensor*Fill of the array's dtype. Strings get
        GivenTensorFill, as in Caffe2 (its test `dtype == np.str` never held for a string array)."""
        if isinstance(array, bool):
            return self.ConstantFill([], blob_out or 1, dtype=caffe2_pb2.TensorProto.BOOL, value=array)
        array = np.array(array) if dtype is None else np.array(array, dtype=dtype)
        fill = {
            np.dtype(np.int32): "GivenTensorIntFill",
            np.dtype(np.int64): "GivenTensorInt64Fill",
            np.dtype(np.bool_): "GivenTensorBoolFill",
        }.get(array.dtype, "GivenTensorFill")
        return getattr(self, fill)([], blob_out or 1, shape=array.shape, values=array.flatten().tolist())

    def LogInfo(self, *msg_or_blobs: Any) -> None:
        """Print each message (a string constant) or blob when the net runs."""
        for item in msg_or_blobs:
            blob = item
            if not isinstance(item, BlobReference):
                blob = self.GivenTensorStringFill([], self.NextName("log"), shape=[], values=[item])
            self.Print(blob, [])

    def add_attribute(self, name: str, obj: Any) -> None:
        """Keep `obj` under `name`: user objects that travel with the net (tasks read them back)."""
        self._attr_dict[name].append(obj)

    def get_attributes(self, name: str) -> list:
        return self._attr_dict.get(name, [])

    def set_rand_seed(self, seed: int = 100, sequence_seed: bool = True, seed_on_op_def: bool = False) -> None:
        """Give op i the random seed `seed + i` (or `seed`; or, with `seed_on_op_def`, a hash of the op)."""
        if sequence_seed and seed_on_op_def:
            raise AssertionError("sequence_seed and seed_on_op_def cannot be both set to True.")
        for i, op in enumerate(self._net.op):
            if sequence_seed:
                op.device_option.random_seed = seed + i
            elif seed_on_op_def:
                op.device_option.random_seed = hash(str(op) + str(seed)) % np.iinfo(np.uint32).max
            else:
                op.device_option.random_seed = seed

    def UsedBlobNames(self) -> set[str]:
        """Every blob an op reads or writes, and the external inputs and outputs."""
        names = set(self._net.external_input) | set(self._net.external_output)
        for op in self._net.op:
            names |= set(op.input) | set(op.output)
        return names

    def is_external_input(self, blob: Any) -> bool:
        return str(blob) in self._net.external_input

    def extend_ops(self, new_ops: Iterable[caffe2_pb2.OperatorDef]) -> None:
        self._ExtendOps(new_ops)

    def AddArgument(self, arg_name: str, arg_value: Any) -> None:
        self._net.arg.append(make_argument(arg_name, arg_value))

    def DeduplicateGradientSlices(self, g: GradientSlice, aggregator: str = "sum") -> GradientSlice:
        """One gradient row per index: Unique the indices, then sum (or average) the rows of each."""
        if not isinstance(g, GradientSlice):
            raise TypeError(f"DeduplicateGradientSlices takes a GradientSlice, got {type(g).__name__}")
        unique, remapping = self.Unique([g.indices], 2, engine="SparseHash")
        if aggregator.lower() == "sum":
            values = self.UnsortedSegmentSum([g.values, remapping], 1)
        elif aggregator.lower() == "mean":
            values = self.UnsortedSegmentMean([g.values, remapping], 1)
        else:
            raise ValueError(f"{aggregator} is not supported")
        return GradientSlice(indices=unique, values=values)

    # -- records (caffe2.python.schema), as Caffe2's Net keeps them ---------------------------------

    def input_record(self) -> Any:
        return self._input_record

    def output_record(self) -> Any:
        return self._output_record

    def set_input_record(self, input_record: Any) -> Any:
        """The record of the net's inputs; a record without blobs gets new ones, named in this net's scope.
        Every blob of it becomes an external input."""
        from . import schema

        if self._input_record is not None and not (
            input_record.has_blobs() and set(input_record.field_blobs()) == set(self._input_record.field_blobs())
        ):
            raise AssertionError("Input schema cannot be reset")
        if not input_record.has_blobs():
            with NameScope(self.Name()):
                self._input_record = schema.NewRecord(self, input_record)
        else:
            self._input_record = input_record
        for blob in self._input_record.field_blobs():
            if not self.is_external_input(blob):
                self.AddExternalInput(blob)
        return self._input_record

    def recover_input_record_by_prefix(self, prefix: str) -> None:
        record = _recover_record_by_prefix(self._net.external_input, prefix)
        if record:
            self.set_input_record(record)

    def set_output_record(self, record: Any) -> None:
        """The record of the net's outputs: each blob must be defined here, and becomes an external output."""
        if self._output_record is not None and not (
            record.has_blobs() and set(record.field_blobs()) == set(self._output_record.field_blobs())
        ):
            raise AssertionError("Output schema cannot be reset")
        for blob in record.field_blobs():
            if not self.BlobIsDefined(blob):
                raise AssertionError(f"{blob} is not defined in net {self.Proto()}")
        for blob in record.field_blobs():
            if blob not in self.external_outputs:
                self.AddExternalOutput(blob)
        self._output_record = record

    def recover_output_record_by_prefix(self, prefix: str) -> None:
        record = _recover_record_by_prefix(self._net.external_output, prefix)
        if record:
            self.set_output_record(record)

    def AppendOutputRecordField(self, field_name: str, record: Any) -> None:
        from . import schema

        if self._output_record is None:
            raise AssertionError("Tried to append to missing output record")
        for blob in record.field_blobs():
            if not self.BlobIsDefined(blob):
                raise AssertionError(f"{blob} is not defined")
        for blob in record.field_blobs():
            self.AddExternalOutput(blob)
        self._output_record = self._output_record + schema.Struct((field_name, record))

    @staticmethod
    def _RunAllOnGPU(net: caffe2_pb2.NetDef, gpu_id: int = 0, use_cudnn: bool = False) -> None:
        net.device_option.CopyFrom(caffe2_pb2.DeviceOption(device_type=workspace.GpuDeviceType, device_id=gpu_id))
        if use_cudnn:
            for op in net.op:
                op.engine = "CUDNN"
        for op in net.op:  # RecurrentNetwork's step nets move too
            if op.type == "RecurrentNetwork":
                for arg in op.arg:
                    if arg.name == "step_net":
                        Net._RunAllOnGPU(arg.n, gpu_id, use_cudnn)

    def RunAllOnGPU(self, gpu_id: int = 0, use_cudnn: bool = False) -> None:
        """Mark the net (and RecurrentNetwork step nets) for GPU `gpu_id`, as Caffe2 does. rnn2jax records
        the device options; the net runs on JAX's default device whatever they say."""
        self._RunAllOnGPU(self._net, gpu_id, use_cudnn)

    def RunAllOnMKL(self) -> None:
        """No MKL engine here: a no-op."""


def _extract_stacktrace() -> list[tuple[str, int, str]]:
    """The stack as (file, line, function) tuples, innermost first, read from the frames alone (no source files),
    leaving out this function, `_CreateAndAddToSelf` and whatever called that (`net.Op(...)`'s lambda)."""
    result = []
    frame = sys._getframe(3)
    while frame:
        result.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return result


def _recompute_external_lists(proto: caffe2_pb2.NetDef) -> None:
    """External inputs: what an op reads before any op writes it; outputs: what ops write and none reads
    (Caffe2's Clone with update_external_list; the outputs in set order, as Caffe2 listed them)."""
    written: set[str] = set()
    read_after_write: set[str] = set()
    del proto.external_input[:]
    del proto.external_output[:]
    for op in proto.op:
        for blob in op.input:
            if blob not in written:
                proto.external_input.append(blob)
            else:
                read_after_write.add(blob)
        written.update(op.output)
    proto.external_output.extend(b for b in written if b not in read_after_write)


def _get_blob_ref(blob_name_or_ref: Any) -> BlobReference:
    return blob_name_or_ref if isinstance(blob_name_or_ref, BlobReference) else BlobReference(blob_name_or_ref)


def _recover_record_by_prefix(names: Iterable[str], prefix: str = "") -> Any:
    """The record whose columns are the blobs of `names` that start with `prefix` (None when none do)."""
    from . import schema

    columns = [name[len(prefix) :] for name in names if name.startswith(prefix)]
    if not columns:
        return None
    return schema.from_column_list(columns, col_blobs=[_get_blob_ref(prefix + name) for name in columns])


# ------------------------------------------------------------------------------------------------
# Cross-device copies (Caffe2's pass over a net's device options; on one device it changes nothing)


def InferOpDeviceAsBlobDevices(op: caffe2_pb2.OperatorDef) -> tuple[list, list]:
    """Every input and output on the op's own device (for placeholder ops, which have no schema)."""
    device = op.device_option if op.HasField("device_option") else caffe2_pb2.DeviceOption()
    return [device] * len(op.input), [device] * len(op.output)


def device_equal(src: caffe2_pb2.DeviceOption, dst: caffe2_pb2.DeviceOption) -> bool:
    """Same device type and id (an unset option and CPU id 0 are equal, unlike `==` on the messages)."""
    return src.device_type == dst.device_type and src.device_id == dst.device_id


def copy_func_between_devices(src: caffe2_pb2.DeviceOption, dst: caffe2_pb2.DeviceOption) -> Callable | None:
    """How a blob goes from device `src` to `dst` (a function adding the copy op to a net), or None."""
    src_gpu, dst_gpu = IsGPUDeviceType(src.device_type), IsGPUDeviceType(dst.device_type)
    if src.device_type == caffe2_pb2.CPU and dst.device_type == caffe2_pb2.CPU:
        return None
    if src_gpu and dst_gpu:
        if src.device_id == dst.device_id:
            return None
        op_type, scope_device = "Copy", dst
    elif src_gpu and dst.device_type == caffe2_pb2.CPU:
        op_type, scope_device = "CopyGPUToCPU", src
    elif src.device_type == caffe2_pb2.CPU and dst_gpu:
        op_type, scope_device = "CopyCPUToGPU", dst
    else:
        raise ValueError(f"Non-supported devices: {src} and {dst}")

    def copy(net: Net, *args: Any, **kwargs: Any) -> Any:
        with DeviceScope(scope_device):
            return net._CreateAndAddToSelf(op_type, *args, **kwargs)

    return copy


def update_placeholder_op_output(op: caffe2_pb2.OperatorDef, blob_to_device: Mapping[str, Any]) -> None:
    """Placeholder ops (Recv, ...) run on the CPU: an output known to live elsewhere gets a `_cpu` twin."""
    outputs = [
        o + "_cpu" if o in blob_to_device and blob_to_device[o].device_type != caffe2_pb2.CPU else o for o in op.output
    ]
    op.output[:] = outputs


class RemapEntry:
    """A (blob, device) key of InjectCrossDeviceCopies's `blob_remap`."""

    def __init__(self, blob: str, device: caffe2_pb2.DeviceOption):
        self.blob = blob
        self.device = device

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemapEntry) and self.blob == other.blob and self.device == other.device

    def __hash__(self) -> int:
        return hash(self.blob + str(self.device))


def _copied_name(blob: str, device: caffe2_pb2.DeviceOption) -> str:
    if device.device_type == caffe2_pb2.CPU:
        return blob + "_cpu"
    if IsGPUDeviceType(device.device_type):
        return f"{blob}_gpu_{device.device_id}"
    raise RuntimeError(f"Unknown device type: {device.device_type}")


def InjectCrossDeviceCopies(
    net: Net,
    blob_to_device: dict[str, caffe2_pb2.DeviceOption] | None = None,
    blob_remap: dict[RemapEntry, str] | None = None,
    placeHolderOps: Sequence[str] | None = None,
) -> tuple[Net, dict[str, caffe2_pb2.DeviceOption]]:
    """A copy of `net` (named `<name>_cross_device`) with a copy op before each op that reads a blob living
    on another device, and the map from each blob to its device. `blob_to_device` says where blobs from
    earlier nets live (updated and returned); `blob_remap` maps (blob, device) to copies made already.
    Ops of a `placeHolderOps` type keep all their blobs on their own device. On one device (what rnn2jax
    runs) no copy is needed and the ops come back unchanged."""
    new_net = net.Clone(net._net.name + "_cross_device", keep_schema=True)
    del new_net._net.op[:]
    blob_to_device = {} if blob_to_device is None else blob_to_device
    blob_remap = {} if blob_remap is None else blob_remap
    net_option = net._net.device_option if net._net.HasField("device_option") else caffe2_pb2.DeviceOption()
    mapped: dict[str, list[str]] = defaultdict(list)
    for entry, mapped_blob in blob_remap.items():
        mapped[entry.blob].append(mapped_blob)
    new_net._net.external_input.extend([m for name in list(new_net._net.external_input) for m in mapped[name]])
    for op in net._net.op:
        remap: dict[str, str] = {}
        placeholder = placeHolderOps is not None and op.type in placeHolderOps
        input_dev, output_dev = InferOpDeviceAsBlobDevices(op) if placeholder else InferOpBlobDevices(op)
        for dev, name in zip(input_dev, op.input, strict=True):
            if not net.BlobIsDefined(name):
                raise AssertionError(f"input {name} should be defined in the net.")
            if name not in blob_to_device:
                if not net.is_external_input(name):
                    raise AttributeError(f"No device information found for blob {name}.")
                blob_to_device[name] = net_option
            if device_equal(blob_to_device[name], dev):
                continue
            entry = RemapEntry(name, dev)
            if entry in blob_remap and blob_to_device[blob_remap[entry]] == dev:  # moved already
                remap[name] = blob_remap[entry]
                continue
            copied = _copied_name(name, dev)
            copy_func_between_devices(blob_to_device[name], dev)(new_net, name, copied)
            blob_remap[entry] = remap[name] = copied
            blob_to_device[copied] = dev
        if placeholder:
            update_placeholder_op_output(op, blob_to_device)
        for dev, name in zip(output_dev, op.output, strict=True):
            if name in blob_to_device and name not in op.input and not device_equal(blob_to_device[name], dev):
                raise RuntimeError(
                    f"In-place blob: {name} is not supported between operators with different device option "
                    f"previous:{blob_to_device[name]} now: {dev}. Failed op:\n {op}"
                )
        new_op = caffe2_pb2.OperatorDef()
        new_op.CopyFrom(op)
        new_op.input[:] = [remap.get(b, b) for b in new_op.input]
        original_inputs = list(op.input)
        for i, out in enumerate(new_op.output):  # an in-place op stays in place
            if out in original_inputs:
                new_op.output[i] = new_op.input[original_inputs.index(out)]
        blob_to_device.update({o: d for d, o in zip(output_dev, new_op.output, strict=True)})
        new_net.extend_ops([new_op])
    return new_net, blob_to_device


def InjectDeviceCopiesAmongNets(
    nets: list[Net], blob_to_device_init: dict[str, caffe2_pb2.DeviceOption] | None = None
) -> tuple[list[Net], dict[str, caffe2_pb2.DeviceOption]]:
    """InjectCrossDeviceCopies over nets in execution order, sharing where each blob lives."""
    assert isinstance(nets, list), f"nets {nets} should be a list of nets."
    assert all(isinstance(net, Net) for net in nets), f"nets {nets} should be a list of nets."
    blob_to_device = blob_to_device_init or {}
    blob_remap: dict[RemapEntry, str] = {}
    new_nets = []
    for net in nets:
        new_net, blob_to_device = InjectCrossDeviceCopies(net, blob_to_device=blob_to_device, blob_remap=blob_remap)
        new_nets.append(new_net)
    return new_nets, blob_to_device


def InjectDeviceCopiesAmongNetsWithoutB2D(
    nets: list[Net], blob_to_device_init: dict[str, caffe2_pb2.DeviceOption] | None = None
) -> list[Net]:
    return InjectDeviceCopiesAmongNets(nets, blob_to_device_init)[0]


def remap_proto(argument: caffe2_pb2.Argument, blob_remap: Mapping[str, str]) -> None:
    """Rename the blobs of the net an argument holds (in place), as `Net.Clone` renames a net's."""
    argument.n.CopyFrom(Net(argument.n).Clone("cloned_sub_net", blob_remap).Proto())


def recurrent_network_op_remap(op: caffe2_pb2.OperatorDef, prefix: str, blob_remap: Mapping[str, str]) -> None:
    """Clone's renaming inside a RecurrentNetwork(Gradient) op: its string-list arguments (links, aliases),
    `timestep`, and the step nets (`prefix` is unused, as in Caffe2)."""

    def remapped(name: str | bytes) -> bytes:
        text = name.decode("utf-8") if isinstance(name, bytes) else name
        return str(blob_remap.get(text, text)).encode("utf-8")

    for argument in op.arg:
        if len(argument.strings) > 0:
            argument.strings[:] = [remapped(b) for b in argument.strings]
        elif argument.name == "timestep":
            argument.s = remapped(argument.s)
        elif argument.name.endswith("step_net"):
            remap_proto(argument, blob_remap)


def control_op_remap(op: caffe2_pb2.OperatorDef, prefix: str, blob_remap: Mapping[str, str]) -> None:
    """Clone's renaming inside If/AsyncIf (then_net, else_net) and While (loop_net, cond_net)."""
    names = ("then_net", "else_net") if op.type in ("If", "AsyncIf") else ("loop_net", "cond_net")
    for argument in op.arg:
        if argument.name in names:
            assert argument.n, f"Expected non empty net in {op.type}'s {argument.name} argument"
            subnet = Net(argument.n)
            argument.n.CopyFrom(subnet.Clone(name=subnet._net.name + "_remapped", blob_remap=blob_remap).Proto())


DEFAULT_REMAP_FUNCS: dict[str, Callable] = {
    "RecurrentNetwork": recurrent_network_op_remap,
    "RecurrentNetworkGradient": recurrent_network_op_remap,
    "If": control_op_remap,
    "While": control_op_remap,
    "AsyncIf": control_op_remap,
}


def clone_and_bind_net(
    net: Net,
    name: str,
    prefix: str,
    blob_remap: dict[str, str] | None = None,
    inputs: Any = None,
    keep_schema: bool = True,
) -> tuple[Net, dict[str, str]]:
    """Clone `net` as `name`, its own blobs prefixed with `prefix`, its input record bound to the blobs of
    `inputs` (a schema.Field with at least the record's fields). Returns the clone and the renaming."""
    from . import schema

    if not isinstance(net, Net):
        raise TypeError(f"clone_and_bind_net takes a core.Net, got {type(net).__name__}")
    blob_remap = {} if blob_remap is None else blob_remap
    if inputs is not None:
        if not isinstance(inputs, schema.Field):
            raise TypeError(f"inputs must be a schema.Field, got {type(inputs).__name__}")
        original = net.input_record()
        if original is None:
            raise AssertionError(f"net {net.Name()} has no input record to bind")
        extra = set(original.field_names()) - set(inputs.field_names())
        if extra:
            raise AssertionError(
                f"Schemas don't match, extra fields {extra} found in the net {net.Name()}. "
                f"original: {original.field_names()}; inputs: {inputs.field_names()}"
            )
        original_mapping = dict(zip(original.field_names(), original.field_blobs(), strict=True))
        for field, blob in zip(inputs.field_names(), inputs.field_blobs(), strict=True):
            if field in original_mapping:
                blob_remap[str(original_mapping[field])] = str(blob)
    ssa, blob_versions = get_ssa(net.Proto())
    undefined = get_undefined_blobs(ssa)
    for blob in blob_versions:
        if blob not in blob_remap:
            blob_remap[blob] = blob if blob in undefined else prefix + blob
    cloned = net.Clone(name, blob_remap, keep_schema=keep_schema)
    if not keep_schema and inputs:
        cloned.set_input_record(inputs)
    return cloned, blob_remap


def output_to_list(op_output: Any) -> list[BlobReference]:
    """An op's outputs as a list, whether it returned one BlobReference or a tuple of them."""
    if type(op_output) not in (list, tuple, BlobReference):
        raise TypeError(f"not an op's output: {op_output!r}")
    return [op_output] if isinstance(op_output, BlobReference) else list(op_output)


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


def get_net_name(netlike: Any) -> str:
    """The name of a Net, a NetDef, or a name."""
    if isinstance(netlike, Net):
        return netlike.Proto().name
    if isinstance(netlike, caffe2_pb2.NetDef):
        return netlike.name
    return netlike


def _add_net_to_dict(net_dict: dict[str, Net | None], net: Any) -> bool:
    """Record `net` under its name; False when the name is there already (the same net, or a name only)."""
    name = get_net_name(net)
    if name in net_dict:
        if net_dict[name] is not None and net != net_dict[name]:
            raise AssertionError("Different nets with same name: " + name)
        return False
    net_dict[name] = net if isinstance(net, Net) else None
    return True


class ExecutionStep:
    """A PlanDef execution step under construction: nets or substeps, run `num_iter` times. Once added to a
    plan or a step it is used, and can no longer change."""

    _step_names_used: ClassVar[set[str]] = set()

    @staticmethod
    def _get_next_step_name(basename: str) -> str:
        return _next_unused_name(basename, ExecutionStep._step_names_used)

    def __init__(self, name: str | None, nets: Any = None, num_iter: int | None = None):
        self._step = caffe2_pb2.ExecutionStep()
        self._step.name = name or ExecutionStep._get_next_step_name("step")
        self._net_dict: OrderedDict[str, Net | None] = OrderedDict()
        self._is_used = False
        self._substeps: list[ExecutionStep] = []
        if nets is not None:
            for net in [nets] if type(nets) is Net else nets:
                if _add_net_to_dict(self._net_dict, net):
                    self._step.network.append(get_net_name(net))
        if num_iter is not None:
            self._step.num_iter = num_iter

    def get_net(self, name: str) -> Net | None:
        return self._net_dict[name]

    def Name(self) -> str:
        return self._step.name

    def __str__(self) -> str:
        return self._step.name

    def _assert_can_mutate(self) -> None:
        if self._is_used:
            raise AssertionError("Cannot mutate a step that has already been added to a plan/step.")

    def _notify_is_used(self) -> None:
        self._is_used = True

    def Proto(self) -> caffe2_pb2.ExecutionStep:
        return self._step

    def HasNets(self) -> bool:
        return len(self._step.network) > 0

    def HasSubsteps(self) -> bool:
        return len(self._step.substep) > 0

    def Nets(self) -> list[Net | None]:
        return list(self._net_dict.values())

    def Substeps(self) -> list[ExecutionStep]:
        return self._substeps

    def SetIter(self, num_iter: int) -> None:
        self._assert_can_mutate()
        self._step.num_iter = num_iter

    def SetCreateWorkspace(self, create_workspace: bool) -> None:
        self._assert_can_mutate()
        self._step.create_workspace = create_workspace

    def SetNumConcurrentInstances(self, num_concurrent_instances: int) -> None:
        self._assert_can_mutate()
        self._step.num_concurrent_instances = num_concurrent_instances

    def SetOnlyOnce(self, only_once: bool) -> None:
        self._assert_can_mutate()
        self._step.only_once = only_once

    def SetShouldStopBlob(self, should_stop_blob: BlobReference) -> None:
        if not isinstance(should_stop_blob, BlobReference):
            raise AssertionError(f"expects BlobReference here, got {type(should_stop_blob)}")
        self._assert_can_mutate()
        self._step.should_stop_blob = str(should_stop_blob)

    def RunEveryMillis(self, interval: int) -> None:
        """Run this step every `interval` ms while its siblings run (and once after they finish)."""
        self._step.run_every_ms = interval

    def SetReportNet(self, report_net: Net, report_interval: int) -> None:
        """Deprecated in Caffe2 (RunEveryMillis replaces it)."""
        self._assert_can_mutate()
        _add_net_to_dict(self._net_dict, report_net)
        self._step.report_net = get_net_name(report_net)
        self._step.report_interval = report_interval

    def AddSubstep(self, substep: Any) -> ExecutionStep:
        """Add a step (an ExecutionStep, or an ExecutionStep message); an empty step is left out."""
        self._assert_can_mutate()
        if self.HasNets():
            raise AssertionError("Cannot have both network and substeps.")
        if isinstance(substep, ExecutionStep):
            substep._notify_is_used()
            if not substep.HasNets() and not substep.HasSubsteps():
                return self
            for net in substep.Nets():
                _add_net_to_dict(self._net_dict, net)
            self._substeps.append(substep)
            proto = substep.Proto()
        else:
            proto = substep
        self._step.substep.add().CopyFrom(proto)
        return self

    def SetConcurrentSubsteps(self, concurrent_substeps: bool) -> None:
        self._assert_can_mutate()
        if self.HasNets():
            raise AssertionError("Cannot have both network and substeps.")
        self._step.concurrent_substeps = concurrent_substeps

    def AddNet(self, net: Net) -> ExecutionStep:
        self._assert_can_mutate()
        if self.HasSubsteps():
            raise AssertionError("Cannot have both network and substeps.")
        if not isinstance(net, Net):
            raise TypeError(f"execution step '{self.Name()}': not a core.Net: {type(net).__name__}")
        _add_net_to_dict(self._net_dict, net)
        self._step.network.append(get_net_name(net))
        return self

    def get_all_attributes(self, name: str) -> list:
        """The attributes under `name` (`Net.add_attribute`) of every net of this step and its substeps."""
        return [attr for net in self._net_dict.values() for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(
        cls, step_proto: caffe2_pb2.ExecutionStep, net_obj_dict: dict[str, Net], net_proto_dict: dict[str, Any]
    ) -> ExecutionStep:
        """An ExecutionStep (and its substeps) from its message; nets by name from the dicts."""
        if bool(step_proto.network) == bool(step_proto.substep):
            raise AssertionError(f"execution step '{step_proto.name}' must have either nets or substeps")
        steps_or_nets: list[Any] = []
        if step_proto.substep:
            for substep_proto in step_proto.substep:
                steps_or_nets.append(ExecutionStep.create_from_proto(substep_proto, net_obj_dict, net_proto_dict))
        else:
            for net_name in step_proto.network:
                if net_name not in net_obj_dict:
                    net_obj_dict[net_name] = Net(net_proto_dict[net_name])
                steps_or_nets.append(net_obj_dict[net_name])

        def field(name: str) -> Any:
            return getattr(step_proto, name) if step_proto.HasField(name) else None

        stop = BlobReference(step_proto.should_stop_blob) if step_proto.HasField("should_stop_blob") else None
        return execution_step(
            step_proto.name,
            steps_or_nets,
            num_iter=field("num_iter"),
            concurrent_substeps=field("concurrent_substeps"),
            should_stop_blob=stop,
            only_once=field("only_once"),
            num_concurrent_instances=field("num_concurrent_instances"),
            create_workspace=field("create_workspace"),
            run_every_ms=field("run_every_ms"),
        )


def add_nets_in_order(step: ExecutionStep, net_list: list[str]) -> None:
    """The names of the nets `step` runs, substeps first, each once, appended to `net_list` (the order a
    plan lists them in)."""
    proto = step.Proto()
    for substep in step.Substeps():
        add_nets_in_order(substep, net_list)
    for net in proto.network:
        if net not in net_list:
            net_list.append(net)
    if proto.report_net and proto.report_net not in net_list:
        net_list.append(proto.report_net)


class Plan:
    """A PlanDef under construction: execution steps and the nets they name, in the order they run."""

    def __init__(self, name_or_step: str | ExecutionStep):
        self._plan = caffe2_pb2.PlanDef()
        self._net_dict: OrderedDict[str, Net | None] = OrderedDict()
        self._steps: list[ExecutionStep] = []
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
            if _add_net_to_dict(self._net_dict, net):
                if not isinstance(net, Net):
                    raise TypeError(f"plan '{self._plan.name}': not a core.Net: {type(net).__name__}")
                self._plan.network.add().CopyFrom(net.Proto())

    def Nets(self) -> list[Net | None]:
        return list(self._net_dict.values())

    def AddStep(self, step: ExecutionStep) -> None:
        if not isinstance(step, ExecutionStep):
            raise TypeError(f"plan '{self._plan.name}': not an ExecutionStep: {type(step).__name__}")
        step._notify_is_used()
        if not step.HasNets() and not step.HasSubsteps():
            return
        self._plan.execution_step.add().CopyFrom(step.Proto())
        self._steps.append(step)
        net_list: list[str] = []
        add_nets_in_order(step, net_list)
        self.AddNets([step.get_net(n) for n in net_list])

    def Steps(self) -> list[ExecutionStep]:
        return self._steps

    def get_all_attributes(self, name: str) -> list:
        return [attr for net in self._net_dict.values() for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(cls, plan_proto: caffe2_pb2.PlanDef) -> Plan:
        plan = Plan(plan_proto.name)
        plan._plan.CopyFrom(plan_proto)
        del plan._plan.network[:]
        del plan._plan.execution_step[:]
        net_obj_dict: dict[str, Net] = {}
        net_proto_dict = {}
        for net_proto in plan_proto.network:
            if net_proto.name in net_proto_dict:
                raise AssertionError(f"plan '{plan_proto.name}' has two nets named '{net_proto.name}'")
            net_proto_dict[net_proto.name] = net_proto
        for step_proto in plan_proto.execution_step:
            plan.AddStep(ExecutionStep.create_from_proto(step_proto, net_obj_dict, net_proto_dict))
        return plan


def to_execution_step(step_or_nets: Any, default_name: str | None = None) -> ExecutionStep:
    """A step as is; anything else (a net, a list, a NetBuilder with its stop blob) wrapped in one."""
    if isinstance(step_or_nets, ExecutionStep):
        return step_or_nets
    stop_blob = None
    if not default_name and hasattr(step_or_nets, "name"):
        default_name = step_or_nets.name
    if hasattr(step_or_nets, "_stop_blob") and hasattr(step_or_nets, "get"):  # net_builder.NetBuilder
        stop_blob = step_or_nets._stop_blob
        step_or_nets = step_or_nets.get()
    return execution_step(default_name, step_or_nets, should_stop_blob=stop_blob)


def execution_step(
    default_name: str | None,
    steps_or_nets: Any,
    num_iter: int | None = None,
    report_net: Net | None = None,
    report_interval: int | None = None,
    concurrent_substeps: bool | None = None,
    should_stop_blob: BlobReference | None = None,
    only_once: bool | None = None,
    num_concurrent_instances: int | None = None,
    create_workspace: bool = False,
    run_every_ms: int | None = None,
) -> ExecutionStep:
    """A new ExecutionStep running `steps_or_nets` (None, a net, a step, or a list of nets or of steps);
    it runs once unless `num_iter` or `should_stop_blob` (a bool scalar, checked after each pass) says
    otherwise."""
    if should_stop_blob is not None and num_iter is not None:
        raise AssertionError("Cannot set both should_stop_blob and num_iter.")
    if should_stop_blob is None and num_iter is None:
        num_iter = 1
    step = ExecutionStep(default_name)
    if should_stop_blob is not None:
        step.SetShouldStopBlob(should_stop_blob)
    if num_iter is not None:
        step.SetIter(num_iter)
    if only_once is not None:
        step.SetOnlyOnce(only_once)
    if concurrent_substeps is not None:
        step.SetConcurrentSubsteps(concurrent_substeps)
    if report_net is not None:
        if report_interval is None:
            raise AssertionError("report_net needs a report_interval")
        step.SetReportNet(report_net, report_interval)
    if num_concurrent_instances is not None:
        step.SetNumConcurrentInstances(num_concurrent_instances)
    if create_workspace:
        step.SetCreateWorkspace(True)
    if run_every_ms:
        step.RunEveryMillis(run_every_ms)
    if isinstance(steps_or_nets, ExecutionStep):
        step.AddSubstep(steps_or_nets)
    elif isinstance(steps_or_nets, Net):
        step.AddNet(steps_or_nets)
    elif isinstance(steps_or_nets, list):
        if all(isinstance(x, Net) for x in steps_or_nets):
            for net in steps_or_nets:
                step.AddNet(net)
        else:
            for x in steps_or_nets:
                step.AddSubstep(to_execution_step(x))
    elif steps_or_nets:
        raise ValueError("steps_or_nets must be a step, a net, or a list of nets or steps.")
    return step


def scoped_execution_step(name: str | None, *args: Any, **kwargs: Any) -> ExecutionStep:
    """`execution_step` with the name in the current name scope."""
    return execution_step(ScopedName(name) if name else name, *args, **kwargs)
