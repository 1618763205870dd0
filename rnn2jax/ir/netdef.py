"""The immutable IR of Caffe2 nets: `Net`, `Op`, `Arg`, `Tensor`, `Plan`.

Everything protobuf is decoded here, once: arguments become Python values, nested step nets (given as a
message in `n` or as a text-format string in `s`) become `Net`s, tensors become read-only NumPy arrays.
Nothing downstream touches a protobuf object, so lowering and tracing never depend on protobuf.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import BadArgumentError, ParseError
from ..proto import caffe2_pb2 as pb
from ..proto.tensor import DATA_TYPES as DATA_TYPES  # re-exported: ops and the caffe2 API read it here
from ..proto.tensor import tensor_values
from .wire import MAX_NET_NESTING, parse_text

_NESTING: ContextVar[int] = ContextVar("net_nesting", default=0)

# Arguments whose value is a net. Caffe2 (2017) passed them as text-format strings in `s`; later as `n`.
NET_ARGUMENTS = frozenset({"step_net", "backward_step_net", "net", "then_net", "else_net", "loop_net", "cond_net"})


class Tensor:
    """A decoded `TensorProto`: a read-only NumPy array plus the tensor's name; compares by value."""

    __slots__ = ("array", "name")

    def __init__(self, array: np.ndarray, name: str = ""):
        array = np.array(array, copy=True)
        array.flags.writeable = False
        self.array = array
        self.name = name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensor):
            return NotImplemented
        return (
            self.name == other.name
            and self.array.dtype == other.array.dtype
            and self.array.shape == other.array.shape
            and self.array.tobytes() == other.array.tobytes()
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, shape={self.array.shape}, dtype={self.array.dtype})"


@dataclass(frozen=True)
class Arg:
    """One decoded `Argument`. `kind` names the protobuf field that held the value, because Caffe2's
    meaning can depend on it (ConstantFill's `value` given in `i` means an int64 tensor); an Argument
    with only a name (Python's empty list) has kind "empty" and value ()."""

    name: str
    kind: str
    value: Any


@dataclass(frozen=True)
class Device:
    """A `DeviceOption`. Kept for inspection; on the CPU/XLA path it does not change meaning."""

    device_type: int = 0
    device_id: int = 0
    random_seed: int | None = None
    node_name: str = ""


REQUIRED: Any = object()  # sentinel: an argument with no default


def _names(names: tuple[str, ...], shown: int = 3) -> str:
    """Blob or net names for a one-line repr: the first few, then how many more."""
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


@dataclass(frozen=True, eq=True)
class Op:
    """One `OperatorDef`, with its position (`index`) and a human-readable location (`where`)."""

    type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    args: Mapping[str, Arg]
    index: int
    where: str = field(compare=False)
    name: str = ""
    engine: str = ""
    device: Device | None = None
    control_inputs: tuple[str, ...] = ()
    is_gradient_op: bool = False
    debug_info: str = ""

    def __repr__(self) -> str:  # one line: a step net's ops would print whole nets
        return f"Op({self.where or f'op #{self.index} ({self.type})'}: {_names(self.inputs)} -> {_names(self.outputs)})"

    def has(self, name: str) -> bool:
        return name in self.args

    def _get(self, name: str, default: Any, kinds: tuple[str, ...], what: str) -> Any:
        arg = self.args.get(name)
        if arg is None:
            if default is REQUIRED:
                raise BadArgumentError(f"{self.where}: missing required argument '{name}' ({what})")
            return default
        if arg.kind not in kinds:
            got = f"{arg.kind} = {arg.value!r}" if arg.kind != "n" else "a net"
            raise BadArgumentError(f"{self.where}: argument '{name}' must be {what}, got {got}")
        return arg.value

    def int(self, name: str, default: Any = REQUIRED) -> int:
        """A single integer argument (Caffe2 reads field `i`)."""
        return self._get(name, default, ("i",), "an integer (field i)")

    def bool(self, name: str, default: Any = REQUIRED) -> bool:
        value = self._get(name, default, ("i",), "a boolean (field i)")
        return bool(value)

    def float(self, name: str, default: Any = REQUIRED) -> float:
        """A single float argument. An integer in `i` is accepted too: Python front ends wrote
        `forget_bias=0` as an int, and the conversion is lossless."""
        value = self._get(name, default, ("f", "i"), "a number (field f)")
        return value if value is default else float(value)

    def str(self, name: str, default: Any = REQUIRED) -> str:
        value = self._get(name, default, ("s",), "a string (field s)")
        if isinstance(value, bytes):
            raise BadArgumentError(f"{self.where}: argument '{name}' is not valid UTF-8 text")
        return value

    def ints(self, name: str, default: Any = REQUIRED) -> tuple[int, ...]:
        return self._get(name, default, ("ints", "empty"), "a list of integers (field ints)")

    def floats(self, name: str, default: Any = REQUIRED) -> tuple[float, ...]:
        value = self._get(name, default, ("floats", "ints", "empty"), "a list of numbers (field floats)")
        return value if value is default else tuple(float(v) for v in value)

    def strings(self, name: str, default: Any = REQUIRED) -> tuple[str, ...]:
        """A list of text (blob names, mostly): an item that is not UTF-8 is refused."""
        values = self.byte_strings(name, default)
        for index, value in enumerate(values if values is not default else ()):
            if isinstance(value, bytes):
                raise BadArgumentError(
                    f"{self.where}: argument '{name}' item {index} {value!r} is not valid UTF-8 text"
                )
        return values

    def byte_strings(self, name: str, default: Any = REQUIRED) -> tuple[str | bytes, ...]:
        """A list of strings as stored: str where the bytes are UTF-8, else bytes (raw data)."""
        return self._get(name, default, ("strings", "empty"), "a list of strings (field strings)")

    def net(self, name: str, default: Any = REQUIRED) -> Net:
        return self._get(name, default, ("n",), "a net (field n, or a text-format net in s)")

    def tensor(self, name: str, default: Any = REQUIRED) -> Tensor:
        return self._get(name, default, ("t",), "a tensor (field t)")

    def nested_nets(self) -> Iterator[tuple[str, Net]]:
        """(argument name, net) for every net this op carries."""
        for arg in self.args.values():
            if arg.kind == "n":
                yield arg.name, arg.value
            elif arg.kind == "nets":
                for i, net in enumerate(arg.value):
                    yield f"{arg.name}[{i}]", net


@dataclass(frozen=True, eq=True)
class Net:
    """One `NetDef`. `where` says how to find it ("net 'x'", or a step net inside an op of one)."""

    name: str
    ops: tuple[Op, ...]
    external_inputs: tuple[str, ...]
    external_outputs: tuple[str, ...]
    type: str = ""
    args: Mapping[str, Arg] = field(default_factory=lambda: MappingProxyType({}))
    device: Device | None = None
    where: str = field(default="", compare=False)

    def __repr__(self) -> str:  # one line, not the whole net (a big one printed 141,000 characters)
        return (
            f"Net({self.name!r}: {len(self.ops)} ops, {len(self.external_inputs)} external inputs, "
            f"{len(self.external_outputs)} external outputs)"
        )

    def walk(self) -> Iterator[Op]:
        """Every op of this net and of every net nested in its ops, depth first, in order."""
        for op in self.ops:
            yield op
            for _, inner in op.nested_nets():
                yield from inner.walk()


@dataclass(frozen=True)
class ExecutionStep:
    """An `ExecutionStep`. Optional fields are None when unset, because Caffe2's plan executor asks
    `has_...()` (an `only_once: false` that is set still counts)."""

    name: str
    substeps: tuple[ExecutionStep, ...]
    networks: tuple[str, ...]
    num_iter: int | None
    concurrent_substeps: bool = False
    should_stop_blob: str | None = None
    only_once: bool | None = None
    criteria_network: str | None = None
    report_net: str | None = None
    report_interval: int | None = None
    run_every_ms: int | None = None
    create_workspace: bool = False
    num_concurrent_instances: int | None = None


@dataclass(frozen=True)
class Plan:
    """A `PlanDef`: its nets by name, and the execution steps that say how Caffe2 ran them."""

    name: str
    nets: Mapping[str, Net]
    steps: tuple[ExecutionStep, ...]

    def __repr__(self) -> str:  # one line, not every net
        nets = _names(tuple(self.nets))
        return f"Plan({self.name!r}: {len(self.nets)} nets ({nets}), {len(self.steps)} execution steps)"

    def __getitem__(self, name: str) -> Net:
        try:
            return self.nets[name]
        except KeyError:
            raise ParseError(f"plan '{self.name}' has no net '{name}'; its nets are: {', '.join(self.nets)}") from None


# --------------------------------------------------------------------------------------------------
# Decoding protobuf messages into the IR


def decode_tensor(proto: pb.TensorProto, where: str) -> Tensor:
    """A `TensorProto` as a NumPy array, from whichever data field its data type uses."""
    _str(proto.name, where, "the tensor name")
    dims = tuple(int(d) for d in proto.dims)
    if any(d < 0 for d in dims):
        raise ParseError(f"{where}: tensor '{proto.name}' has negative dims {dims}")
    size = int(np.prod(dims, dtype=np.int64))
    try:
        values = tensor_values(proto)
    except ValueError as error:
        raise ParseError(f"{where}: tensor '{proto.name}' {error}") from None
    if values.size != size:
        raise ParseError(
            f"{where}: tensor '{proto.name}' has dims {list(dims)} ({size} values) but holds {values.size}"
        )
    return Tensor(values.reshape(dims), proto.name)


def _text(value: bytes) -> str | bytes:
    """Caffe2 `bytes` fields mostly hold text; keep raw bytes only when they are not UTF-8."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _str(value: str | bytes, where: str, field: str) -> str:
    """A protobuf `string` field. Caffe2's schema is proto2, which does not check UTF-8, so a broken
    file gives bytes here; Caffe2's own Python could not read such a name either."""
    if isinstance(value, bytes):
        raise ParseError(f"{where}: {field} {value!r} is not UTF-8 text")
    return value


def _strs(values: Any, where: str, field: str) -> tuple[str, ...]:
    return tuple(_str(v, where, f"{field} #{i}") for i, v in enumerate(values))


_SINGLE_FIELDS = ("f", "i", "s", "t", "n")
_REPEATED_FIELDS = ("floats", "ints", "strings", "tensors", "nets", "qtensors")


def decode_argument(arg: pb.Argument, where: str) -> Arg:
    """An `Argument` as an `Arg`; nets (in `n`, `nets`, or as text in `s`) parse recursively."""
    name = _str(arg.name, where, "an argument name")
    here = f"{where}, argument '{name}'"
    for kind in _SINGLE_FIELDS:
        if not arg.HasField(kind):
            continue
        value = getattr(arg, kind)
        if kind == "s":
            if name in NET_ARGUMENTS and value:  # an empty string is "no net" (forward-only RNNs)
                return Arg(name, "n", net_from_text(value, here))
            return Arg(name, "s", _text(value))
        if kind == "t":
            return Arg(name, "t", decode_tensor(value, here))
        if kind == "n":
            return Arg(name, "n", decode_net(value, here))
        return Arg(name, kind, value)
    for kind in _REPEATED_FIELDS:
        values = getattr(arg, kind)
        if not values:
            continue
        if kind == "strings":
            return Arg(name, kind, tuple(_text(v) for v in values))
        if kind == "tensors":
            return Arg(name, kind, tuple(decode_tensor(t, f"{here}[{i}]") for i, t in enumerate(values)))
        if kind == "nets":
            return Arg(name, kind, tuple(decode_net(n, f"{here}[{i}]") for i, n in enumerate(values)))
        if kind == "qtensors":
            return Arg(name, kind, tuple(q.SerializeToString() for q in values))
        return Arg(name, kind, tuple(values))
    return Arg(name, "empty", ())


def _decode_arguments(args: Any, where: str, allow_repeats: bool = False) -> Mapping[str, Arg]:
    """Arguments by name. Caffe2 let an operator repeat an argument with identical contents (its Scale
    gradient maker does) and refused different contents, or any repeat on a net."""
    decoded: dict[str, Arg] = {}
    first: dict[str, Any] = {}
    for arg in args:
        if arg.name in decoded:
            if not allow_repeats or arg != first[arg.name]:
                raise ParseError(f"{where}: argument '{arg.name}' is given twice")
            continue
        first[arg.name] = arg
        decoded[arg.name] = decode_argument(arg, where)
    return MappingProxyType(decoded)


def _decode_device(message: Any, has: bool, where: str) -> Device | None:
    if not has:
        return None
    return Device(
        device_type=message.device_type,
        device_id=message.device_id,
        random_seed=message.random_seed if message.HasField("random_seed") else None,
        node_name=_str(message.node_name, where, "the device option's node_name"),
    )


def decode_op(proto: pb.OperatorDef, index: int, net_where: str) -> Op:
    where = f"{net_where}, op #{index}"
    op_type = _str(proto.type, where, "the op type")
    where = f"{where} ({op_type or '<no type>'})"
    return Op(
        type=op_type,
        inputs=_strs(proto.input, where, "input"),
        outputs=_strs(proto.output, where, "output"),
        args=_decode_arguments(proto.arg, where, allow_repeats=True),
        index=index,
        where=where,
        name=_str(proto.name, where, "the op name"),
        engine=_str(proto.engine, where, "the engine"),
        device=_decode_device(proto.device_option, proto.HasField("device_option"), where),
        control_inputs=_strs(proto.control_input, where, "control input"),
        is_gradient_op=proto.is_gradient_op,
        debug_info=_str(proto.debug_info, where, "debug_info"),
    )


def decode_net(proto: pb.NetDef, parent: str = "") -> Net:
    """A `NetDef` message as a `Net`. `parent` locates a nested net (the op argument holding it)."""
    label = f"net '{_str(proto.name, parent or 'a net', 'the net name')}'" if proto.name else "net <unnamed>"
    where = f"{label} (in {parent})" if parent else label
    depth = _NESTING.get() + 1 if parent else 0
    if depth > MAX_NET_NESTING:
        raise ParseError(f"{where}: step nets nest more than {MAX_NET_NESTING} deep, rnn2jax's limit")
    token = _NESTING.set(depth)
    try:
        return Net(
            name=proto.name,
            ops=tuple(decode_op(op, i, where) for i, op in enumerate(proto.op)),
            external_inputs=_strs(proto.external_input, where, "external_input"),
            external_outputs=_strs(proto.external_output, where, "external_output"),
            type=_str(proto.type, where, "the net type"),
            args=_decode_arguments(proto.arg, where),
            device=_decode_device(proto.device_option, proto.HasField("device_option"), where),
            where=where,
        )
    except (UnicodeDecodeError, ValueError, TypeError) as error:
        if isinstance(error, ParseError | BadArgumentError):
            raise
        raise ParseError(f"{where}: cannot decode: {error}") from error
    finally:
        _NESTING.reset(token)


def _optional(proto: pb.ExecutionStep, name: str, where: str = "") -> Any:
    if not proto.HasField(name):
        return None
    value = getattr(proto, name)
    return _str(value, where, name) if isinstance(value, str | bytes) else value


def _decode_step(proto: pb.ExecutionStep, plan_where: str) -> ExecutionStep:
    where = f"{plan_where}, execution step '{_str(proto.name, plan_where, 'an execution step name')}'"
    return ExecutionStep(
        name=proto.name,
        substeps=tuple(_decode_step(s, where) for s in proto.substep),
        networks=_strs(proto.network, where, "network"),
        num_iter=_optional(proto, "num_iter"),
        concurrent_substeps=proto.concurrent_substeps,
        should_stop_blob=_optional(proto, "should_stop_blob", where),
        only_once=_optional(proto, "only_once"),
        criteria_network=_optional(proto, "criteria_network", where),
        report_net=_optional(proto, "report_net", where),
        report_interval=_optional(proto, "report_interval"),
        run_every_ms=_optional(proto, "run_every_ms"),
        create_workspace=proto.create_workspace,
        num_concurrent_instances=_optional(proto, "num_concurrent_instances"),
    )


def decode_plan(proto: pb.PlanDef) -> Plan:
    where = f"plan '{_str(proto.name, 'a plan', 'the plan name')}'"
    nets: dict[str, Net] = {}
    token = _NESTING.set(-1)  # a plan's nets are top-level nets, not nested ones
    try:
        for net in proto.network:
            if net.name in nets:  # an unnamed net is named "" (Caffe2's plans name nets built in a NetBuilder so)
                raise ParseError(f"{where}: two nets are named '{net.name}'")
            nets[net.name] = decode_net(net, where)
    finally:
        _NESTING.reset(token)
    return Plan(proto.name, MappingProxyType(nets), tuple(_decode_step(s, where) for s in proto.execution_step))


def net_from_text(value: bytes | str, where: str) -> Net:
    """A text-format NetDef held in a string argument (old Caffe2 step nets)."""
    message = parse_text(value, pb.NetDef, where)
    return decode_net(message, where)
