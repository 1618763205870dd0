"""A net, or the nets of an execution step fused into one, as jitted segments of pure ops with host ops
between them.

Consecutive pure ops form one segment: one `jax.jit` function from the blobs the segment reads to every
blob it writes (written back to the workspace, as Caffe2's in-place updates are). A net of pure ops is
one segment, so one dispatch per run; jax.jit compiles it once per input signature (the shapes and
dtypes of the blobs it reads) and caches it. Host ops (records of the op registry with a `host` facet)
run in Python between segments. An op whose record says it runs eagerly here (registry `eager`: what it writes
depends on values it computes) is a segment of its own, run outside jit on concrete values.

The executor builds on no other runtime module: it reads and writes blobs through `SegmentWorkspace`,
which `rnn2jax.runtime.workspace.Workspace` implements (the workspace makes executors, never the reverse).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from ..errors import InputTypeError, UnsupportedOpError
from ..ir.netdef import Net, Op
from ..lowering.interpreter import LoweredNet, specialisation_key
from ..ops.checks import CHECKED_OP_TYPES, checked_call, raise_failed
from ..ops.registry import REGISTER_EACH_ADVICE, HostOp, HostWorkspace, find_host, lookup, unsupported_ops
from ..ops.stats import GLOBAL_REGISTRY, op_events
from ..ops.waits import OP_LOCK, needs_op_lock


class SegmentWorkspace(HostWorkspace, Protocol):
    """What running an executor needs of a workspace, beyond what host ops get: the blobs of the
    workspace itself (read directly on the fast path), writing back every blob a segment writes, and the
    run counter that random ops fold into their keys."""

    _values: dict[str, Any]

    def _write_all(self, values: Mapping[str, Any]) -> None: ...

    def _next_counter(self) -> int: ...


MAX_SPECIALISATIONS = 32  # executables kept per segment, one per distinct value of its static blobs


class SharedCode:
    """A segment's jitted functions (one per value of its static blobs). Twin segments, the same ops in
    nets that differ only in name (Caffe2's checkers run `net.Clone(name + "_copy")` again and again),
    share one, so they compile once between them."""

    def __init__(self) -> None:
        self.fns: dict[tuple, Any] = {}


class _Specialised:
    """jit's static argument: the segment to trace, with its static values. Handles of twin segments are
    equal (same shared code, same static values), so they hit the same executables; a new trace runs
    through the calling segment itself, so its errors name that segment's net."""

    __slots__ = ("_hash", "key", "segment", "static")

    def __init__(self, segment: PureSegment, static: dict[str, np.ndarray], key: tuple):
        self.segment, self.static, self.key = segment, static, key
        self._hash = hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, _Specialised) and self.segment.code is other.segment.code and self.key == other.key
        )


def _traced_segment() -> Any:
    """A fresh function to jit (jit's caches are per function, so each SharedCode entry owns its own)."""

    def call(handle: _Specialised, env: dict[str, Any], counter: Any, net_run: Any, seed: Any) -> Any:
        def apply(env: dict[str, Any], counter: Any, net_run: Any, seed: Any) -> dict[str, Any]:
            return handle.segment._apply({**env, **handle.static}, counter, net_run, seed)

        # ops that check traced values (EnforceFinite, Gather's indices) run under checkify, as in CompiledNet
        if handle.segment.runtime_checks:
            return checked_call(apply)(env, counter, net_run, seed)
        return apply(env, counter, net_run, seed)

    return call


class PureSegment:
    """Consecutive pure ops as one jitted function `blobs read -> blobs written`."""

    def __init__(self, ops: Sequence[Op], label: str, seed: int):
        net = Net(name=label, ops=tuple(ops), external_inputs=(), external_outputs=(), where=label)
        self.lowered = LoweredNet(net)
        self.first_reader: dict[str, Op] = self.lowered.reads_before_writes()
        self.inputs: tuple[str, ...] = tuple(self.first_reader)
        # A scoped op may read its own output by name when it exists (Iter without an input). Not an op
        # that carries nets (RecurrentNetwork): it never reads its outputs, and passing them in would make
        # the jit signature depend on the previous run's sequence length (a recompile per (T, previous T)).
        self.optional: tuple[str, ...] = tuple(
            dict.fromkeys(
                name
                for op in ops
                if lookup(op).scoped and not lookup(op).carries_nets
                for name in op.outputs
                if name not in self.first_reader
            )
        )
        # Ops that run nets in their own workspace (If, While, Do) read what their nets may leave as it was
        # when it exists, and may write blobs they do not declare
        self.optional += tuple(n for n in self.lowered.optional_reads() if n not in self.optional)
        self.outputs: tuple[str, ...] = self.lowered.writes()
        # Random ops draw a fresh key per run; so may ops that run nets of their own.
        self.random = any(lookup(op).random or next(op.nested_nets(), None) is not None for op in ops)
        self._seed = seed
        # Blobs whose values decide shapes are read on the host: one executable per distinct value.
        self.static: tuple[str, ...] = tuple(self.lowered.static_inputs())
        # ... and those whose values decide shapes only when they pass a test (registry `static_if`)
        self.static_if = {n: t for n, t in self.lowered.static_inputs_if().items() if n not in self.static}
        # Blobs only shape-only ops read (IsEmpty, Shape, Size): a string tensor there is read by its shape.
        self.shape_read: tuple[str, ...] = tuple(
            name for name in self.inputs if all(lookup(op).shape_only for op in ops if name in op.inputs)
        )
        self.code = SharedCode()
        # stats the ops count in Caffe2's global registry (AtomicIter's num_iter), there from now on at 0
        self.events = tuple(key for op in ops for key in op_events(op))
        for key in self.events:
            GLOBAL_REGISTRY.add(key)
        # Ops whose kernels check values only known when the segment runs: the segment returns the first
        # failed check too, raised after the call (ops/checks.py), as Caffe2 refused the input at the op.
        self.runtime_checks = any(op.type in CHECKED_OP_TYPES for op in net.walk())

    def _apply(self, env: dict[str, Any], counter: Any, net_run: Any, seed: Any) -> dict[str, Any]:
        # the workspace's seed is an argument (int64, so key(seed) is key(int) exactly): workspaces of other
        # seeds share the compiled code
        key = jax.random.fold_in(jax.random.key(seed), counter) if self.random else None
        out = self.lowered(env, key=key, net_run=net_run if self.random else 0)
        return {name: out[name] for name in self.outputs if name in out}  # If/While may leave one unset

    def run(self, workspace: SegmentWorkspace, counter: int, net_run: int = 0) -> None:
        with OP_LOCK:  # read, compute and write as one step when threads share the workspace
            self._run(workspace, counter, net_run)

    def _run(self, workspace: SegmentWorkspace, counter: int, net_run: int) -> None:
        values = workspace._values
        try:
            env = {name: values[name] for name in self.inputs}
        except KeyError:
            env = {name: workspace.get(name, self.first_reader[name]) for name in self.inputs}
        for name in self.optional:
            if workspace.has_blob(name):
                env[name] = workspace.get(name)
        for name in self.shape_read:
            value = env.get(name)
            if _is_strings(value):  # only their shape is read
                env[name] = np.zeros(value.shape, np.bool_)
        static = {name: np.asarray(env.pop(name)) for name in self.static if name in env}
        for name, test in self.static_if.items():
            if name in env and test(env[name]):
                static[name] = np.asarray(env.pop(name))
        key = specialisation_key(static)
        try:
            result = self._executable(key)(
                _Specialised(self, static, key),
                env,
                np.uint32(counter & 0xFFFFFFFF) if self.random else None,
                np.uint32(net_run & 0xFFFFFFFF) if self.random else None,
                np.int64(getattr(workspace, "seed", self._seed)) if self.random else None,
            )
        except TypeError:
            self._check_arrays(env)
            raise
        if self.runtime_checks:
            error, result = result
            raise_failed(error)
        workspace._write_all(result)
        for key in self.events:
            GLOBAL_REGISTRY.increment(key, 1)

    def _executable(self, key: tuple) -> Any:
        fns = self.code.fns
        fn = fns.get(key)
        if fn is None:
            if len(fns) >= MAX_SPECIALISATIONS:
                fns.pop(next(iter(fns)))
            fn = fns[key] = jax.jit(_traced_segment(), static_argnums=0)
        return fn

    def _check_arrays(self, env: dict[str, Any]) -> None:
        """Name the blob when a pure op was handed a string or host object (jit's TypeError would not)."""
        for name, value in env.items():
            if not isinstance(value, jax.Array | np.ndarray) or value.dtype == object:
                reader = self.first_reader.get(name)
                where = f"{reader.where}: " if reader is not None else ""
                kind = "strings" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
                raise InputTypeError(f"{where}blob '{name}' holds {kind}, which this op cannot read")


class EagerSegment(PureSegment):
    """One op run outside jit (registry `eager`), with the blob handling of a pure segment: its kernel sees
    concrete values, so it may choose shapes or quantization from what it computes."""

    def __init__(self, ops: Sequence[Op], label: str, seed: int):
        super().__init__(ops, label, seed)
        self.runtime_checks = False  # its checks see concrete values, and refuse at once (ops/checks.py)

    def _executable(self, key: tuple) -> Any:
        return _eager_call


def _eager_call(handle: _Specialised, env: dict[str, Any], counter: Any, net_run: Any, seed: Any) -> Any:
    return handle.segment._apply({**env, **handle.static}, counter, net_run, seed)


@dataclasses.dataclass
class HostStep:
    """One host op, with the state it keeps for as long as its net exists."""

    op: Op
    host: HostOp
    state: dict[str, Any] = dataclasses.field(default_factory=dict)

    def run(self, workspace: SegmentWorkspace, counter: int, net_run: int = 0) -> None:
        if needs_op_lock(self.op.type):
            with OP_LOCK:
                self.host.run(workspace, self.op, self.state)
        else:
            self.host.run(workspace, self.op, self.state)


@dataclasses.dataclass
class StringStep:
    """An op whose type is lowered but runs on the host when one of its `string_inputs` holds strings
    (PackSegments of strings): which one it is, its inputs at run time decide. `segment` runs it jitted."""

    op: Op
    host: HostOp
    segment: PureSegment
    state: dict[str, Any] = dataclasses.field(default_factory=dict)

    def run(self, workspace: SegmentWorkspace, counter: int, net_run: int = 0) -> None:
        if self.host.reads_strings(self.op, lambda name: _holds_strings(workspace, name)):
            self.host.run(workspace, self.op, self.state)
        else:
            self.segment.run(workspace, counter, net_run)


def _is_strings(value: Any) -> bool:
    """A string tensor: the workspace holds strings as object arrays of bytes."""
    return isinstance(value, np.ndarray) and value.dtype == object


def _holds_strings(workspace: SegmentWorkspace, name: str) -> bool:
    value = workspace._values.get(name)
    if value is None and workspace.has_blob(name):
        value = workspace.get(name)
    return _is_strings(value)


Piece = PureSegment | HostStep | StringStep


class Executor:
    """`nets` run one after another as one program: jitted segments of pure ops, host ops between.
    Ops whose host op depends on strings in their inputs (registry `string_inputs`) make the program depend on
    the blobs: each run picks the plan for which of them may read strings (`_plan_key`); plans are built once
    and shared by the executor's instances (each with fresh host-op state)."""

    def __init__(self, nets: Sequence[Net], seed: int = 0):
        self.nets = tuple(nets)
        self.label = " + ".join(net.where for net in self.nets)
        ops = [op for net in self.nets for op in net.ops]
        if len(self.nets) > 1:  # fused: distinct op positions, so random ops draw distinct keys
            ops = [dataclasses.replace(op, index=i) for i, op in enumerate(ops)]
        _check_supported(self.nets)
        self.ops = tuple(ops)
        self.seed = seed
        self.runs = 0  # how often this net has run: seeded random ops fold it into their keys
        # position -> host op of each op that runs on the host only for string inputs
        self.by_strings: dict[int, HostOp] = {}
        for position, op in enumerate(ops):
            host = find_host(op.type)
            if host is not None and host.string_inputs and not host.runs(op):
                self.by_strings[position] = host
        self._sources = self._string_sources()
        self._templates: dict[tuple[bool, ...], list[Piece]] = {}
        self._plans: dict[tuple[bool, ...], list[Piece]] = {}
        self.pieces: list[Piece] = self._plan((False,) * len(self.by_strings))

    def _plan(self, key: tuple[bool, ...]) -> list[Piece]:
        """The pieces run when the ops of `by_strings` read strings where `key` says (this instance's state)."""
        plan = self._plans.get(key)
        if plan is None:
            template = self._templates.get(key)
            if template is None:
                template = self._templates[key] = self._build(dict(zip(self.by_strings, key, strict=True)))
            plan = self._plans[key] = [_fresh(p) for p in template]
        return plan

    def _build(self, on_host: dict[int, bool]) -> list[Piece]:
        seed = self.seed
        pieces: list[Piece] = []
        pending: list[Op] = []

        def flush(label: str) -> None:
            if pending:
                pieces.append(PureSegment(pending.copy(), label, seed))
                pending.clear()

        for position, op in enumerate(self.ops):
            host = find_host(op.type)
            if position in on_host:  # a piece of its own where it may read strings this run
                eager, alone = False, on_host[position]
            else:
                eager = host is None and lookup(op).runs_eagerly(op)
                alone = eager or (host is not None and host.runs(op))
            if not alone:
                pending.append(op)
                continue
            if pending:
                flush(f"{self.label}, ops #{pending[0].index}-")
            label = f"{self.label}, op #{op.index}"
            if position in on_host:
                pieces.append(StringStep(op, host, PureSegment([op], label, seed)))
            elif eager:
                pieces.append(EagerSegment([op], label, seed))
            else:
                if host.check is not None:
                    host.check(op)
                pieces.append(HostStep(op, host))
        flush(self.label)
        return pieces

    def _string_sources(self) -> list[tuple[tuple[str, Any], ...]]:
        """For each op of `by_strings`, where each of its string inputs comes from: ("blob", name), one the net
        has not written before it (what the workspace holds decides); ("op", k), the k-th op of `by_strings`
        (strings when it ran on the host); ("fixed", bool), another op (a host op's output may be strings,
        a jitted op's never is; after a host op, a blob the net has not written may be strings too)."""
        last: dict[str, tuple[str, Any]] = {}
        sources: list[tuple[tuple[str, Any], ...]] = []
        unread: tuple[str, Any] | None = None  # after a host op, which may write blobs it does not list (Load)
        for position, op in enumerate(self.ops):
            host = self.by_strings.get(position)
            if host is not None:
                names = host.string_input_names(op)
                sources.append(tuple(last.get(name, unread or ("blob", name)) for name in names))
                written: tuple[str, Any] = ("op", len(sources) - 1)
            else:
                found = find_host(op.type)
                on_host = found is not None and found.runs(op)
                written = ("fixed", on_host)
                if on_host:
                    unread = ("fixed", True)
            for name in op.outputs:
                last[name] = written
        return sources

    def _plan_key(self, workspace: SegmentWorkspace) -> tuple[bool, ...]:
        """Which ops of `by_strings` may read strings this run (`_string_sources`), checking only the blobs
        the net reads from the workspace."""
        key: list[bool] = []
        for sources in self._sources:
            strings = False
            for kind, what in sources:
                if kind == "blob":
                    strings = _holds_strings(workspace, what)
                elif kind == "op":
                    strings = key[what]
                else:
                    strings = what
                if strings:
                    break
            key.append(strings)
        return tuple(key)

    def share_code(self, twin: Executor) -> None:
        """Use `twin`'s compiled code: it runs the same ops (in nets that may differ in name), with the
        same seed, so its executables compute exactly what this executor's would."""
        if len(twin.pieces) != len(self.pieces):
            raise ValueError("share_code: the executors run different programs")
        for mine, theirs in zip(self.pieces, twin.pieces, strict=True):
            if isinstance(mine, PureSegment) and isinstance(theirs, PureSegment):
                mine.code = theirs.code

    def instance(self) -> Executor:
        """The same segments (and jit caches) with fresh host-op state: a newly created net."""
        clone = object.__new__(Executor)
        clone.__dict__.update(self.__dict__)
        clone._plans = {}
        clone.pieces = clone._plan((False,) * len(self.by_strings))
        clone.runs = 0
        return clone

    @property
    def pure(self) -> bool:
        """True when the nets run as one jitted function (no host op)."""
        return all(isinstance(p, PureSegment) for p in self.pieces)

    def first_readers(self) -> dict[str, Op]:
        """Blobs some op reads before any earlier op writes them, with that op: what Caffe2 wants to
        exist when it creates the net."""
        written: set[str] = set()
        needed: dict[str, Op] = {}
        for op in self.ops:
            for name in op.inputs:
                if name not in written:
                    needed.setdefault(name, op)
            written.update(op.outputs)
        return needed

    def outputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for op in self.ops for name in op.outputs))

    def run(self, workspace: SegmentWorkspace) -> None:
        """Run the nets once. An op whose device option sets `random_seed` draws from that seed and this
        net's run count (`net_run`), as Caffe2 seeds the op's generator when it creates the net: RunNetOnce
        draws the same values each time, a created net's runs go on down the seed's stream."""
        net_run = self.runs
        self.runs += 1
        pieces = self._plan(self._plan_key(workspace)) if self.by_strings else self.pieces
        for piece in pieces:
            piece.run(workspace, workspace._next_counter(), net_run)


def _fresh(piece: Piece) -> Piece:
    """`piece` with fresh host-op state (segments, and their compiled code, shared)."""
    if isinstance(piece, HostStep):
        return HostStep(piece.op, piece.host)
    if isinstance(piece, StringStep):
        return StringStep(piece.op, piece.host, piece.segment)
    return piece


def _check_supported(nets: Sequence[Net]) -> None:
    """Every op has a lowering or a host op (host ops only at the top level); all misses at once."""
    missing = unsupported_ops(nets, runnable_only=True, host_ops=True)
    if missing:
        types = sorted({t for _, t in missing})
        lines = "\n".join(f"  {where}" for where, _ in missing)
        raise UnsupportedOpError(
            f"{len(missing)} op(s) of {len(types)} unsupported type(s) ({', '.join(types)}), with neither "
            f"a lowering nor a host op:\n{lines}",
            tuple(missing),
            advice=REGISTER_EACH_ADVICE,
        )
