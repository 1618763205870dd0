"""The op registry: Caffe2 op type -> one record (`OpDef`) holding every facet of the op.

An entry's `build(op)` reads and checks the op's arguments once, before any tracing, and returns a
kernel: a function of the op's input arrays that returns its output arrays (one array or a tuple).
Kernels are pure `jax.numpy` code; they may return more outputs than an op names (optional outputs
such as Reshape's `old_shape`): the interpreter keeps as many as the op lists.

The other facets of an op live in the same family module as its lowering, attached to the same record:
its input roles (`Roles`), its shape rule, its builder gradient maker (Caffe2's REGISTER_GRADIENT), its
codegen emitter. A family module first states which facets its ops have none of (`declare_family`), then
registers each op (`register`) and attaches the facets it has (`facet`). A facet is a value, or an
`Absent` saying why the op has none; `UNSTATED` (never said) is what the scoreboard test refuses. Those
words (`Absent`, the absences most families state, `Roles`) are facets.py's.

Host ops (Save, Load, Print, ...) are records here too: their `host` facet is a `HostOp`, a function run
in Python between jitted segments with the workspace in hand. A record may have a host op and no lowering
(`build` is None): the lowering paths (`find`, `lookup`, `check_supported`) see only lowerings, so a host
op is refused inside jitted code and step nets; `kind`, `supported` and `unsupported_ops(host_ops=True)`
count it. A host op wins over a lowering of the same type when a workspace runs the net.

Some Caffe2 types exist only under an engine (DNNLOWP's `Quantize`: Caffe2 registers `Quantize_ENGINE_DNNLOWP`
and no plain `Quantize`). Their record declares the `engines` it accepts; `lookup` refuses an op of the type
with any other engine, or none, as Caffe2 cannot create it, and `operator_keys` names the Caffe2 operator keys
the record stands for (`Quantize_ENGINE_DNNLOWP`, ...), which is what the scoreboard counts.

Caffe2 often registers one engine class under several keys (`Tanh_ENGINE_DNNLOWP` and `Int8Tanh_ENGINE_DNNLOWP`
are both DNNLOWP's tanh table): `engine_variant` sends an op of the other type under that engine to the class's
record. Where the type also exists without the engine, as a different class (QNNPACK's plain `Int8Sigmoid`
beside `Int8Sigmoid_ENGINE_DNNLOWP`), the engine class's record is named by its Caffe2 operator key
(`Int8Sigmoid_ENGINE_DNNLOWP`, as Caffe2's own registry names it) and both types reach it by `engine_variant`.
`lookup` finds a record so named for any op under its engine, as Caffe2 does. An engine whose class rnn2jax
lacks, where the type's own record would compute something else (DNNLOWP's Add), has its operator key in
unsupported.py, and `lookup` refuses the op with that reason.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Literal, Protocol

from ..errors import Advice, BadArgumentError, RegistrationError, UnsupportedOpError
from ..ir.netdef import Net, Op
from .facets import FACETS, UNSTATED, Absent, Roles
from .unsupported import why_unsupported

Kernel = Callable[..., Any]
Builder = Callable[..., Kernel]  # build(op), or build(op, lower) for an op that `carries_nets`


class HostWorkspace(Protocol):
    """What a host op is handed: the workspace running its net (`rnn2jax.runtime.Workspace`). `get` names
    the reading op in its errors; `put` stores any value unconverted (DB cursors); `feed` converts as
    `Workspace.feed` does; `db_root` is where relative DB names resolve (None: Caffe2's "."). `exists` and
    `all_blobs` count empty blobs too (Caffe2's HasBlob, Blobs()), and `reset` empties a blob that stays
    (Caffe2's Blob::Reset: Free, and the queues, which swap blobs)."""

    db_root: str | None

    def get(self, name: str, op: Op | None = None) -> Any: ...

    def put(self, name: str, value: Any) -> None: ...

    def feed(self, name: str, value: Any) -> None: ...

    def has_blob(self, name: str) -> bool: ...

    def exists(self, name: str) -> bool: ...

    def all_blobs(self, shared: bool = True) -> list[str]: ...

    def reset(self, name: str) -> None: ...

    def blobs(self) -> list[str]: ...


HostRun = Callable[[Any, Op, dict[str, Any]], None]  # run(workspace: HostWorkspace, op, state)
HostCheck = Callable[[Op], None]


@dataclass(frozen=True)
class HostOp:
    """An op run on the host: `run(workspace, op, state)` between the jitted segments around it, where
    `state` lives as long as the created net (Print's `every_n` counter), and `check(op)`, which validates
    the op's arguments when its net is created (so a bad argument is reported before anything runs).
    `module` registered it. `applies(op)`, where given, says which ops of a type that is also lowered run on
    the host (ConstantFill of strings, which JAX has no arrays for); the others run in jitted segments.
    `string_inputs` are the input positions (negative: from the end; "all": any input) whose holding strings
    sends an op of a lowered type to the host (PackSegments of strings): that depends on the blobs, not the
    op, so the executor decides it when the net runs."""

    run: HostRun
    check: HostCheck | None = None
    module: str = ""
    applies: Callable[[Op], bool] | None = None
    string_inputs: tuple[int, ...] | Literal["all"] = ()

    def runs(self, op: Op) -> bool:
        """Whether this op runs on the host whatever its inputs hold (rather than in a jitted segment)."""
        if self.applies is not None:
            return self.applies(op)
        return not self.string_inputs

    def string_input_names(self, op: Op) -> tuple[str, ...]:
        """The blobs at the op's `string_inputs` (negative positions count from the end)."""
        if self.string_inputs == "all":
            return tuple(op.inputs)
        count = len(op.inputs)
        return tuple(op.inputs[i] for i in self.string_inputs if -count <= i < count)

    def reads_strings(self, op: Op, holds_strings: Callable[[str], bool]) -> bool:
        """Whether one of the op's `string_inputs` holds strings (`holds_strings(blob)`)."""
        return any(holds_strings(name) for name in self.string_input_names(op))


class NetFunction(Protocol):
    """A lowered net, as the interpreter (`rnn2jax.lower`) makes it for ops that carry nets."""

    inputs: tuple[str, ...]
    opdefs: tuple[OpDef, ...]

    def run(self, env: MutableMapping[str, Any], **kwargs: Any) -> None: ...

    def abstract_outputs(self, position: int, env: Mapping[str, Any]) -> tuple[Any, ...]: ...


LowerNet = Callable[[Net], NetFunction]

UNBOUNDED = 1 << 30


@dataclass(frozen=True)
class OpDef:
    """How one op type lowers. `inputs`/`outputs` are the (min, max) counts Caffe2's schema allows.
    A `random` kernel takes a `key=` keyword (a JAX PRNG key derived from the net's key and the op);
    a `scoped` kernel takes `scope=`, the blob environment at the op (step nets read it by name).
    An op that `carries_nets` (RecurrentNetwork) is built with `build(op, lower)`: `lower` turns its nested
    nets into `NetFunction`s, so op families never import the interpreter above them. A scoped kernel says
    what it reads by name (`scope_reads`); one running nets in the enclosing workspace (If, While) may also
    say what it writes there undeclared (`scope_writes`), what it reads only when it exists
    (`optional_reads`), and that it binds its outputs in `scope` itself (`binds_outputs`: one left unset
    stays unset).
    `static_if` holds (position, test) pairs: an input whose value decides the output's shape only when
    `test(value)` holds (ReduceFrontSumGradient's second input is X's shape, not X, when it is a 1-D int64
    tensor: Caffe2's pre-2018 form); a workspace reads such a value on the host, and specialises on it, when the
    test holds for the blob it is given, and a compiled net, where it is traced, gets the kernel's error.
    `eager` (or `eager(op)`) says that a workspace runs the op outside jitted code, its kernel on concrete values,
    because what it writes depends on values it computes (DNNLOWP's output quantization chosen from the float
    result, ONNXWhile's scan outputs when the condition decides the trip count); a compiled net still traces it,
    and the kernel then says why it cannot run there.
    `static_inputs` are the positions of inputs whose VALUES decide the output's shape (lengths, sizes,
    starts): the compiler makes the net inputs they come from static, so the kernel receives them as
    concrete arrays (`np.asarray` works on them) and is specialised per value. A `shape_only` op's outputs
    depend on its inputs' shapes alone (Shape, Size), and so do an op's `shape_outputs` (Reshape's
    old_shape, Concat's split_info): the values feeding them need not be static. A host op's record has
    `host` (and `build` None where the type has no lowering)."""

    type: str
    build: Builder | None
    inputs: tuple[int, int]
    outputs: tuple[int, int]
    random: bool = False
    scoped: bool = False
    static_inputs: tuple[int, ...] | Callable[[Op], tuple[int, ...]] = ()
    carries_nets: bool = False
    shape_only: bool = False
    shape_outputs: tuple[int, ...] = ()
    eager: bool | Callable[[Op], bool] = False
    static_if: tuple[tuple[int, Callable[[Any], bool]], ...] = ()
    user: bool = False  # registered by `rnn2jax.register_op` or given to compile(custom_ops=)
    module: str = ""  # the family module that holds every facet of the op
    roles: Roles | Absent = UNSTATED
    shape_rule: Callable[..., Any] | Absent = UNSTATED  # guesses unknown shapes for shape inference
    gradient: Callable[..., Any] | Absent = UNSTATED  # the builder gradient maker (a GradientContext -> ops)
    emitter: Callable[..., Any] | Absent = UNSTATED  # the op as a statement of the generated module (codegen)
    host: HostOp | None = None  # run on the host between jitted segments (Save, Load, Print, ...)
    engines: tuple[str, ...] = ()  # Caffe2 has the type only under these engines (none: the plain type)

    def reads_values_for(self, op: Op, outputs: Iterable[str]) -> bool:
        """Whether computing `outputs` of `op` reads its inputs' values (not only their shapes)."""
        if self.shape_only:
            return False
        return any(i not in self.shape_outputs for i, name in enumerate(op.outputs) if name in outputs)

    def runs_eagerly(self, op: Op) -> bool:
        """Whether a workspace runs `op` outside jitted code (`eager`)."""
        return self.eager(op) if callable(self.eager) else self.eager

    def static_positions(self, op: Op) -> tuple[int, ...]:
        """The positions of `op`'s inputs whose values decide its output shapes (some depend on arguments:
        a fill's input decides the shape only with `input_as_shape`)."""
        positions = self.static_inputs(op) if callable(self.static_inputs) else self.static_inputs
        return tuple(p for p in positions if p < len(op.inputs))


REGISTRY: dict[str, OpDef] = {}

# module -> the facets its ops have none of unless an op states one (`declare_family`)
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {}


def declare_family(module: str, **absent: Absent | Roles) -> None:
    """State once, for every op `module` registers, the facets they have none of (each an `Absent` saying
    why, or `roles=NO_ROLES`); `register` and `facet` then give the ops that do have one."""
    unknown = set(absent) - set(FACETS)
    if unknown:
        raise RegistrationError(f"{module}: unknown facets {sorted(unknown)}; facets are {', '.join(FACETS)}")
    _FAMILY_DEFAULTS[module] = dict(absent)


def _caller_module(depth: int) -> str:
    return sys._getframe(depth + 1).f_globals.get("__name__", "")


def facet(name: str, *types: str, module: str | None = None) -> Callable[[Any], Any]:
    """Attach facet `name` (the decorated value) to each of `types`, registered in the same module:
    an op's facets live in its family module, so a facet given anywhere else is a `RegistrationError`."""
    if name not in FACETS:
        raise RegistrationError(f"unknown facet {name!r}; facets are {', '.join(FACETS)}")
    where = module or _caller_module(1)

    def decorate(value: Any) -> Any:
        for op_type in types:
            opdef = REGISTRY.get(op_type)
            if opdef is None:
                raise RegistrationError(f"{where}: {name} of op type '{op_type}', which is not registered")
            if opdef.module != where:
                raise RegistrationError(
                    f"{where}: {name} of op type '{op_type}', which {opdef.module} registers: an op's facets "
                    "live in its family module"
                )
            REGISTRY[op_type] = replace(opdef, **{name: value})
        return value

    return decorate


# Ops given to one `compile(..., custom_ops=)` call: they take precedence while that net is lowered.
_OVERLAY: ContextVar[Mapping[str, OpDef]] = ContextVar("rnn2jax_custom_ops", default=MappingProxyType({}))


@contextmanager
def overlay(opdefs: Mapping[str, OpDef]) -> Iterator[None]:
    """Make `opdefs` visible to `lookup` (and the support checks) inside the block only."""
    token = _OVERLAY.set({**_OVERLAY.get(), **opdefs})
    try:
        yield
    finally:
        _OVERLAY.reset(token)


def record(op_type: str) -> OpDef | None:
    return _OVERLAY.get().get(op_type) or REGISTRY.get(op_type)


def find(op_type: str) -> OpDef | None:
    """The OpDef that lowers `op_type`: a custom op of the current `overlay`, else the registry's; None
    for a type without a lowering (a host-only op such as Save cannot run inside jitted code)."""
    opdef = record(op_type)
    return opdef if opdef is not None and opdef.build is not None else None


def find_host(op_type: str) -> HostOp | None:
    """The host op of `op_type`, which a workspace runs instead of any lowering of the type."""
    opdef = REGISTRY.get(op_type)
    return opdef.host if opdef is not None else None


def kind(op_type: str) -> Literal["lowered", "host", "user"] | None:
    """How rnn2jax runs `op_type`: "host" (a host op, between jitted segments, top level only), "user"
    (lowered by a `register_op` or `custom_ops` op), "lowered" (a built-in lowering), None (it cannot)."""
    opdef = record(op_type)
    if opdef is None:
        return None
    host = find_host(op_type)
    if host is not None and ((host.applies is None and not host.string_inputs) or opdef.build is None):
        return "host"
    return "user" if opdef.user else "lowered"


def lowered_types() -> frozenset[str]:
    """Every op type the registry lowers (what `compile` can run), host ops with no lowering left out."""
    return frozenset(op_type for op_type, opdef in REGISTRY.items() if opdef.build is not None)


def operator_keys(opdef: OpDef) -> tuple[str, ...]:
    """The Caffe2 operator keys `opdef` stands for: its type, or `Type_ENGINE_E` for each engine of a type
    Caffe2 registers only under engines."""
    if not opdef.engines:
        return (opdef.type,)
    return tuple(f"{opdef.type}_ENGINE_{engine}" for engine in opdef.engines)


def lowered_keys() -> frozenset[str]:
    """`lowered_types` as Caffe2's operator keys (`Quantize_ENGINE_DNNLOWP` for the record of `Quantize`), and
    the engine variants (`Tanh_ENGINE_DNNLOWP`) whose record is lowered."""
    records = {key for opdef in REGISTRY.values() if opdef.build is not None for key in operator_keys(opdef)}
    variants = {f"{t}_ENGINE_{e}" for (t, e), record_type in ENGINE_VARIANTS.items() if find(record_type) is not None}
    return frozenset(records | variants)


def _bounds(count: int | tuple[int, int | None]) -> tuple[int, int]:
    if isinstance(count, int):
        return count, count
    low, high = count
    return low, UNBOUNDED if high is None else high


def register(
    *types: str,
    inputs: int | tuple[int, int | None] = 1,
    outputs: int | tuple[int, int | None] = 1,
    random: bool = False,
    scoped: bool = False,
    static_inputs: tuple[int, ...] | Callable[[Op], tuple[int, ...]] = (),
    carries_nets: bool = False,
    shape_only: bool = False,
    shape_outputs: tuple[int, ...] = (),
    engines: tuple[str, ...] = (),
    eager: bool | Callable[[Op], bool] = False,
    static_if: tuple[tuple[int, Callable[[Any], bool]], ...] = (),
    **facets: Any,
) -> Callable[[Builder], Builder]:
    """Register `build` for each of `types` (aliases share one builder), with any facets given here
    (`roles=Roles(lengths=(1,))`, ...) over the family's declared defaults. `engines`: the type exists only
    under these engines (module docstring)."""
    module = _caller_module(1)
    unknown = set(facets) - set(FACETS)
    if unknown:
        raise RegistrationError(f"{module}: unknown facets {sorted(unknown)}; facets are {', '.join(FACETS)}")
    stated = {**_FAMILY_DEFAULTS.get(module, {}), **facets}

    def decorate(build: Builder) -> Builder:
        for op_type in types:
            existing = REGISTRY.get(op_type)
            if existing is not None and existing.build is not None:
                raise RuntimeError(f"op type {op_type} registered twice")
            REGISTRY[op_type] = OpDef(
                op_type,
                build,
                _bounds(inputs),
                _bounds(outputs),
                random,
                scoped,
                static_inputs,
                carries_nets,
                shape_only,
                shape_outputs,
                eager,
                static_if,
                module=module,
                **stated,
                host=existing.host if existing is not None else None,
                engines=tuple(engines),
            )
        return build

    return decorate


def register_host_op(
    op_type: str,
    run: HostRun,
    check: HostCheck | None = None,
    applies: Callable[[Op], bool] | None = None,
    string_inputs: tuple[int, ...] | Literal["all"] = (),
    **facets: Any,
) -> HostRun:
    """Register `run` as the host op of `op_type` (`check` validates an op when its net is created), with
    any facets over the registering module's declared defaults. A type may also have a lowering (from
    `register`, in either order): the host op wins when a workspace runs it, for every op of the type or,
    with `applies`, for the ops it accepts, or, with `string_inputs`, for ops one of whose inputs at those
    positions holds strings when the net runs."""
    module = _caller_module(1)
    return _register_host_op(
        module,
        op_type,
        HostOp(run, check, module, applies, string_inputs if string_inputs == "all" else tuple(string_inputs)),
        facets,
    )


def host_op(*types: str, check: HostCheck | None = None, **facets: Any) -> Callable[[HostRun], HostRun]:
    """Decorator form of `register_host_op`, for one or more op types."""
    module = _caller_module(1)

    def decorate(run: HostRun) -> HostRun:
        for op_type in types:
            _register_host_op(module, op_type, HostOp(run, check, module), facets)
        return run

    return decorate


def _register_host_op(module: str, op_type: str, host: HostOp, facets: dict[str, Any]) -> HostRun:
    unknown = set(facets) - set(FACETS)
    if unknown:
        raise RegistrationError(f"{module}: unknown facets {sorted(unknown)}; facets are {', '.join(FACETS)}")
    existing = REGISTRY.get(op_type)
    if existing is not None and existing.host is not None:
        raise RuntimeError(f"host op {op_type} registered twice")
    if existing is not None:
        if facets:
            raise RegistrationError(
                f"{module}: facets of op type '{op_type}', which {existing.module} registers: an op's facets "
                "live in its family module"
            )
        REGISTRY[op_type] = replace(existing, host=host)
    else:
        stated = {**_FAMILY_DEFAULTS.get(module, {}), **facets}
        everything = (0, UNBOUNDED)
        REGISTRY[op_type] = OpDef(op_type, None, everything, everything, module=module, host=host, **stated)
    return host.run


def supported(op_type: str) -> bool:
    """Whether rnn2jax runs `op_type` at all: lowered, or a host op (which only a workspace runs)."""
    return kind(op_type) is not None


# What to do about an op type rnn2jax lacks, in Python and on the command line (whose --ops imports the module)
REGISTER_ADVICE = Advice(
    python="give it a lowering with rnn2jax.register_op (or compile(..., custom_ops=))",
    command_line="give it a lowering with rnn2jax.register_op in a module of yours, loaded with --ops FILE",
)
REGISTER_EACH_ADVICE = replace(REGISTER_ADVICE, separator="\nfor each type: ")  # after a list of ops


# (op type, engine) -> the record Caffe2 runs for it: DNNLOWP registers one class under both keys
# (`LSTMUnit_ENGINE_DNNLOWP` and `Int8LSTMUnit_ENGINE_DNNLOWP` are both LSTMUnitDNNLowPOp)
ENGINE_VARIANTS: dict[tuple[str, str], str] = {}


def engine_variant(op_type: str, engine: str, record_type: str) -> None:
    """Caffe2 runs `record_type`'s op for `op_type` under `engine` (a family module declares it beside the record)."""
    ENGINE_VARIANTS[(op_type, engine)] = record_type


def record_for(op: Op) -> OpDef | None:
    """The lowering that runs `op`: its engine variant's record (the class Caffe2 registers for that engine),
    else its type's; None where there is none. What `lookup` finds, unchecked: the facets an op's roles,
    codegen and the like read are the record's that runs it (Mul under DNNLOWP is Int8Mul's, not Mul's)."""
    opdef = _engine_record(op)
    if opdef is not None:
        return opdef
    return None if _engine_refused(op) else find(op.type)


def _engine_record(op: Op) -> OpDef | None:
    """The record of the class Caffe2 registers for the op's type under its engine: the engine variant's, else
    one named by the operator key (`Add_ENGINE_DNNLOWP`), as Caffe2 looks an engine up; None where rnn2jax has
    neither (the type's own record then runs, as Caffe2 falls back to the type's default)."""
    if not op.engine:
        return None
    return find(ENGINE_VARIANTS.get((op.type, op.engine), f"{op.type}_ENGINE_{op.engine}"))


def _engine_refused(op: Op) -> bool:
    """Caffe2 runs another class under the op's engine, which rnn2jax has not lowered (unsupported.py says why:
    DNNLOWP's Add): the type's own record would compute something else."""
    return bool(op.engine) and bool(why_unsupported(f"{op.type}_ENGINE_{op.engine}"))


def lookup(op: Op) -> OpDef:
    opdef = _engine_record(op)
    if opdef is not None:
        _check_arity(op, opdef)
        return opdef
    if _engine_refused(op):
        key = f"{op.type}_ENGINE_{op.engine}"
        raise UnsupportedOpError(
            f"{op.where}: op type '{op.type}' under engine '{op.engine}' is not supported"
            + _why_not(op.type, op.engine),
            ((op.where, op.type),),
            advice=Advice(
                python=f"give it a lowering with rnn2jax.register_op named '{key}' (or compile(..., custom_ops=))",
                command_line=f"give it a lowering named '{key}' with rnn2jax.register_op in a module of yours, "
                "loaded with --ops FILE",
            ),
        )
    opdef = find(op.type)
    if opdef is None:
        raise UnsupportedOpError(
            f"{op.where}: op type '{op.type}' is not supported{_host_only(op.type)}{_why_not(op.type, op.engine)}",
            ((op.where, op.type),),
            advice=REGISTER_ADVICE,
        )
    if opdef.engines and op.engine not in opdef.engines:
        engine = f"engine '{op.engine}'" if op.engine else "no engine"
        raise UnsupportedOpError(
            f"{op.where}: cannot create operator of type '{op.type}' with {engine}: Caffe2 registers it only "
            f"under the engines {', '.join(opdef.engines)}",
            ((op.where, op.type),),
            advice=REGISTER_ADVICE,
        )
    _check_arity(op, opdef)
    return opdef


def _why_not(op_type: str, engine: str = "") -> str:
    """Why rnn2jax does not run the op type at all (unsupported.py), where it is known."""
    return why_unsupported(f"{op_type}_ENGINE_{engine}" if engine else op_type) or why_unsupported(op_type)


def _host_only(op_type: str) -> str:
    """Why a host op's type cannot run here: it has no lowering (string ops: JAX has no strings)."""
    if find_host(op_type) is None:
        return ""
    return (
        f" inside jitted code: {op_type} is a host op, which only a Workspace runs, at the top level of a net "
        "(between jitted segments)"
    )


def _count_text(low: int, high: int, what: str) -> str:
    if low == high:
        return f"{low} {what}"
    if high >= UNBOUNDED:
        return f"at least {low} {what}"
    return f"{low} to {high} {what}"


def _check_arity(op: Op, opdef: OpDef) -> None:
    for names, (low, high), what in (
        (op.inputs, opdef.inputs, "inputs"),
        (op.outputs, opdef.outputs, "outputs"),
    ):
        if not low <= len(names) <= high:
            given = f"got {len(names)} ({', '.join(names)})"
            raise BadArgumentError(f"{op.where}: {op.type} takes {_count_text(low, high, what)}, {given}")


# Nested nets an op carries but never runs: RecurrentNetwork keeps its backward step net only for the
# RecurrentNetworkGradient op that Caffe2's gradient maker derives from it (which copies every argument).
NOT_RUN = {
    "RecurrentNetwork": frozenset({"backward_step_net"}),
    "RecurrentNetworkGradient": frozenset({"step_net"}),  # it reads the forward op's step_workspaces
}


def _ops_to_check(net: Net, runnable_only: bool) -> Iterable[Op]:
    for op in net.ops:
        yield op
        skip = NOT_RUN.get(op.type, frozenset()) if runnable_only else frozenset()
        for label, inner in op.nested_nets():
            if label not in skip:
                yield from _ops_to_check(inner, runnable_only)


def unsupported_ops(nets: Iterable[Net], runnable_only: bool = False, host_ops: bool = False) -> list[tuple[str, str]]:
    """(location, op type) of every op, nested nets included, that has no lowering. With
    `runnable_only`, nets an op carries but does not run (a forward op's backward step net) are
    left out. With `host_ops` (a workspace runs the nets), a host op at the top level of a net counts as
    supported; one inside a step net does not (step nets are traced)."""
    missing = []
    for net in nets:
        top = {id(op) for op in net.ops} if host_ops else set()
        for op in _ops_to_check(net, runnable_only):
            if record_for(op) is None and not (id(op) in top and find_host(op.type) is not None):
                # an engine rnn2jax refuses is named by its operator key, whose reason check_supported gives
                missing.append((op.where, f"{op.type}_ENGINE_{op.engine}" if _engine_refused(op) else op.type))
    return missing


def check_supported(*nets: Net) -> None:
    """Raise one `UnsupportedOpError` that lists every unsupported op that running `nets` would
    execute, nested step nets included, with where it is."""
    missing = unsupported_ops(nets, runnable_only=True)
    if missing:
        types = sorted({t for _, t in missing})
        lines = "\n".join(f"  {where}" for where, _ in missing)
        hosts = [t for t in types if find_host(t) is not None]
        if hosts:  # host ops run only in a Workspace, at the top level of a net, between jitted segments
            lines += f"\n{', '.join(hosts)}: host op(s), which only a Workspace runs, at the top level of a net"
        lines += "".join(f"\n{t}{why}" for t in types if (why := _why_not(t)))
        raise UnsupportedOpError(
            f"{len(missing)} op(s) of {len(types)} unsupported type(s) ({', '.join(types)}):\n{lines}",
            tuple(missing),
            advice=REGISTER_EACH_ADVICE,
        )
