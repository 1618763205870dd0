"""`Workspace`: blobs by name, and the nets and plans that read and write them, the way Caffe2 ran them.

A blob holds an array (a JAX array for numbers; an object array of `bytes` for strings), `bytes`, or an
opaque host object (a DB cursor) that only host ops use. Running a net writes back every blob it writes,
as Caffe2's in-place updates do (parameters updated by WeightedSum, Iter's counter).

As in Caffe2, creating a net needs every blob it reads first to exist, and creates the blobs it writes
(empty until a run writes them): a plan may name such a blob as a `should_stop_blob` before any net
wrote it. `blobs()` and `has_blob()` count only blobs that hold a value. A child workspace (an execution
step's `create_workspace`) sees its parent's blobs and writes to them; blobs it creates itself go when
it goes.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import numpy as np

from ..errors import BadArgumentError, InputTypeError, MissingBlobError, WorkspaceError
from ..ir.dtypes import device_array, in_caffe2_dtypes
from ..ir.int8 import Int8Tensor
from ..ir.loader import load
from ..ir.netdef import Arg, Net, Plan
from ..ir.packed import PackedFP16Matrix
from . import plan as plan_runner
from .executor import Executor

_SHOWN_BLOBS = 30
_TWIN_CANDIDATES = 8  # programs kept per outline (ops' types and blob names) when looking for a twin


class CompileCache:
    """Decoded nets (by content) and their executors, whose jit caches hold the compiled code. Workspaces
    that share one (Caffe2's named workspaces do) compile a net once between them. The least recently used
    entries beyond `max_entries` are dropped, so a process that runs many different ops (a test suite) does
    not keep every executable it ever compiled."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self.loaded: dict[bytes, Net] = {}
        self.executors: dict[tuple[int, ...], tuple[tuple[Net, ...], Executor]] = {}
        # programs by outline: executors (weakly) of nets equal but for their names, to share code with
        self.programs: dict[tuple, list[tuple[tuple[Net, ...], weakref.ref]]] = {}

    def twin(self, nets: tuple[Net, ...], seed: int, executor: Executor) -> Executor | None:
        """A live executor of the same program (these nets but for their names), whose compiled code
        `executor` can share; `executor` is recorded as one for later nets. The seed does not matter: the
        compiled code takes the workspace's seed as an argument."""
        nameless = tuple(_nameless(net) for net in nets)
        outline = tuple((n.type, n.external_inputs, tuple((o.type, o.inputs, o.outputs) for o in n.ops)) for n in nets)
        known = self.get(self.programs, outline) or []
        known = [(program, ref) for program, ref in known if ref() is not None]
        twin = next((ref() for program, ref in known if program == nameless), None)
        if twin is None:
            known = [*known[-(_TWIN_CANDIDATES - 1) :], (nameless, weakref.ref(executor))]
        self.put(self.programs, outline, known)
        return twin

    def get(self, table: dict, key: Any) -> Any:
        """`table[key]` (or None), marked as the most recently used."""
        value = table.pop(key, None)
        if value is not None:
            table[key] = value
        return value

    def put(self, table: dict, key: Any, value: Any) -> Any:
        table[key] = value
        while len(table) > self.max_entries:
            table.pop(next(iter(table)))
        return value


def _nameless(net: Net) -> Net:
    """`net` with its name, and the names of the nets its ops carry, left out: what a twin must equal. A
    clone's step nets are renamed too (`core.Net.Clone` makes `cloned_sub_net_2` of `cloned_sub_net`)."""
    ops = tuple(
        dataclasses.replace(op, args=MappingProxyType({name: _nameless_arg(arg) for name, arg in op.args.items()}))
        if any(arg.kind in ("n", "nets") for arg in op.args.values())
        else op
        for op in net.ops
    )
    return dataclasses.replace(net, name="", ops=ops)


def _nameless_arg(arg: Arg) -> Arg:
    if arg.kind == "n":
        return dataclasses.replace(arg, value=_nameless(arg.value))
    if arg.kind == "nets":
        return dataclasses.replace(arg, value=tuple(_nameless(net) for net in arg.value))
    return arg


class Workspace:
    """Blobs by name, nets by name; `run(net)`, `run_net(name)`, `run_plan(plan)` as in Caffe2.

    `db_root` is where host ops that read and write databases resolve relative paths; `seed` seeds the
    random ops of every net run here (each run draws fresh keys); `cache` shares compiled nets with
    other workspaces.
    """

    def __init__(
        self,
        *,
        db_root: str | os.PathLike[str] | None = None,
        seed: int = 0,
        parent: Workspace | None = None,
        cache: CompileCache | None = None,
    ):
        if db_root is not None and not isinstance(db_root, str | os.PathLike):
            raise InputTypeError(f"Workspace: db_root must be a str or os.PathLike, got a {type(db_root).__name__}")
        self._values: dict[str, Any] = {}
        self._created: set[str] = set()
        self._nets: dict[str, Executor] = {}
        self._parent = parent
        self._root: Workspace = parent._root if parent is not None else self
        self.db_root: str | None = os.fspath(db_root) if db_root is not None else (parent.db_root if parent else None)
        self.seed = seed
        self._counter = 0
        self._cache = parent._cache if parent is not None else (cache or CompileCache())

    # -- blobs ---------------------------------------------------------------------------------------

    @in_caffe2_dtypes
    def feed(self, name: str, value: Any) -> None:
        """Set a blob to an array (a NumPy or JAX array, or anything `np.asarray` takes; strings become
        object arrays of bytes, as Caffe2 holds them)."""
        self.put(_check_name(name), _as_blob(name, value))

    def fetch(self, name: str) -> Any:
        """A blob's value: a NumPy array for arrays, the object itself for anything else."""
        value = self.get(_check_name(name))
        if isinstance(value, jax.Array):
            return np.asarray(value)
        if isinstance(value, Int8Tensor):
            return Int8Tensor(np.asarray(value.data), value.scale, value.zero_point)
        if isinstance(value, PackedFP16Matrix):
            return PackedFP16Matrix(np.asarray(value.b))
        return value

    def blobs(self) -> list[str]:
        """Names of the blobs that hold a value (the parent's too), sorted."""
        names = set(self._values)
        if self._parent is not None:
            names.update(self._parent.blobs())
        return sorted(names)

    def has_blob(self, name: str) -> bool:
        return self._has_value(name)

    def all_blobs(self, shared: bool = True) -> list[str]:
        """Names of every blob that exists, empty or not (Caffe2's Blobs()), sorted; with `shared`, the
        parent's too (Caffe2's include_shared)."""
        names = set(self._values) | self._created
        if shared and self._parent is not None:
            names.update(self._parent.all_blobs())
        return sorted(names)

    def get(self, name: str, op: Any = None) -> Any:
        """The raw value of a blob, for host ops; `op` (the reading op) goes into the error message."""
        workspace: Workspace | None = self
        while workspace is not None:
            if name in workspace._values:
                return workspace._values[name]
            workspace = workspace._parent
        where = f"{op.where}: " if op is not None else ""
        if self._exists(name):
            raise MissingBlobError(f"{where}blob '{name}' exists (a net writes it) but nothing has written it yet")
        reader = "reads blob" if op is not None else "no blob"
        raise MissingBlobError(
            f"{where}{reader} '{name}' before anything writes it; the workspace's blobs are: {self._blob_list()}"
        )

    def put(self, name: str, value: Any) -> None:
        """Set a blob to any value, unconverted (host ops keep cursors and such here). Like Caffe2, a
        blob the parent workspace holds is written there."""
        self._owner(name)._set(name, value)

    def exists(self, name: str) -> bool:
        """Whether blob `name` exists, empty or not (Caffe2's HasBlob)."""
        return self._exists(name)

    def reset(self, name: str) -> None:
        """Empty blob `name`, which goes on existing (Caffe2's Blob::Reset)."""
        owner = self._owner(name)
        owner._values.pop(name, None)
        owner._created.add(name)

    # -- nets ----------------------------------------------------------------------------------------

    @in_caffe2_dtypes
    def create_net(self, net: Any, overwrite: bool = False) -> str:
        """Create a net (anything `rnn2jax.load` takes) under its name, checking that the blobs it reads
        exist and creating those it writes; returns the name."""
        net = self._net(net)
        if net.name in self._nets and not overwrite:
            raise WorkspaceError(f"{net.where}: the workspace already has a net '{net.name}'; pass overwrite=True")
        executor = self._executor((net,))
        self._check_inputs_exist(executor)
        self._declare(executor.outputs())
        self._nets[net.name] = executor
        return net.name

    def nets(self) -> list[str]:
        return sorted(self._nets)

    def has_net(self, name: str) -> bool:
        return name in self._nets

    @in_caffe2_dtypes
    def run_net(self, name: str, num_iter: int = 1) -> None:
        """Run a created net `num_iter` times."""
        executor = self._nets.get(name)
        if executor is None:
            raise WorkspaceError(
                f"the workspace has no net '{name}'; its nets are: {', '.join(self.nets()) or '(none)'}"
            )
        for _ in range(num_iter):
            executor.run(self)

    @in_caffe2_dtypes
    def run(self, net: Any) -> None:
        """Run a net once without keeping it (Caffe2's RunNetOnce). Its compiled form is cached, so
        running the same net again (the same `Net`, message or bytes) compiles nothing unless the
        blobs it reads change shape or dtype."""
        net = self._net(net)
        executor = self._executor((net,))
        self._check_inputs_exist(executor)
        executor.run(self)

    @in_caffe2_dtypes
    def run_plan(
        self,
        plan: Any,
        *,
        should_continue: Callable[[int], bool] | None = None,
        observer: Any = None,
        progress: Any = None,
        defer_interrupt: bool = False,
    ) -> None:
        """Run a PlanDef's execution steps (see `rnn2jax.runtime.plan`). `should_continue(i)` is asked
        before iteration i of every step (Caffe2's RunPlan hook; the CLI's --iters); `observer` hears of
        every iteration, `progress` too with every running step (`rnn2jax run-plan`'s progress line); with
        `defer_interrupt`, Ctrl-C stops the plan between iterations."""
        loaded = load(plan)
        if not isinstance(loaded, Plan):
            raise InputTypeError(f"{loaded.where} is a net, not a plan; run it with Workspace.run")
        plan_runner.run_plan(
            self,
            loaded,
            should_continue=should_continue,
            observer=observer,
            progress=progress,
            defer_interrupt=defer_interrupt,
        )

    def child(self) -> Workspace:
        """A workspace that sees this one's blobs (an execution step's `create_workspace`)."""
        return Workspace(parent=self, seed=self.seed)

    def __repr__(self) -> str:
        return f"Workspace(blobs={len(self.blobs())}, nets={self.nets()})"

    # -- internals shared with the executor and the plan runner -------------------------------------

    def _net(self, source: Any) -> Net:
        """`source` as a `Net`, decoded once per message or bytes (content, not identity), so that running
        it again reuses the executor (and its compiled functions) made for it. Paths are read every time."""
        if isinstance(source, Net):
            return source
        serialize = getattr(source, "SerializeToString", None)
        key = serialize(deterministic=True) if serialize is not None else source
        if not isinstance(key, bytes):
            return _as_net(source)
        net = self._cache.get(self._cache.loaded, key)
        if net is None:
            net = self._cache.put(self._cache.loaded, key, _as_net(source))
        return net

    def _executor(self, nets: tuple[Net, ...]) -> Executor:
        """The executor of these nets, built once per workspace tree (the jit caches live in it); each
        call gets fresh host-op state, as a newly created Caffe2 net has."""
        key = tuple(id(net) for net in nets)  # the entry holds the nets, so their ids stay theirs
        entry = self._cache.get(self._cache.executors, key)
        if entry is None:
            executor = Executor(nets, seed=self.seed)
            twin = self._cache.twin(nets, self.seed, executor)
            if twin is not None:
                executor.share_code(twin)
            entry = self._cache.put(self._cache.executors, key, (nets, executor))
        return entry[1].instance()

    def _check_inputs_exist(self, executor: Executor) -> None:
        """Caffe2 refuses to create a net that reads a blob the workspace does not hold (operator.cc's
        'Encountered a non-existing input blob')."""
        for name, op in executor.first_readers().items():
            if not self._exists(name):
                raise MissingBlobError(
                    f"{op.where}: reads blob '{name}', which the workspace does not hold; "
                    f"the workspace's blobs are: {self._blob_list()}"
                )

    def _next_counter(self) -> int:
        root = self._root
        root._counter += 1
        return root._counter

    def _holder(self, name: str, created: bool = True) -> Workspace | None:
        """The nearest workspace up the parent chain that holds `name` (a value, or with `created` a blob a
        created net will write), or None."""
        workspace: Workspace | None = self
        while workspace is not None:
            if name in workspace._values or (created and name in workspace._created):
                return workspace
            workspace = workspace._parent
        return None

    def _owner(self, name: str) -> Workspace:
        return self._holder(name) or self

    def _set(self, name: str, value: Any) -> None:
        self._values[name] = value
        self._created.discard(name)

    def _write_all(self, values: Mapping[str, Any]) -> None:
        if self._parent is None:
            self._values.update(values)
            if self._created:
                self._created.difference_update(values)
            return
        for name, value in values.items():
            self._owner(name)._set(name, value)

    def _declare(self, names: Iterable[str]) -> None:
        for name in names:
            if not self._exists(name):
                self._created.add(name)

    def _exists(self, name: str) -> bool:
        return self._holder(name) is not None

    def _has_value(self, name: str) -> bool:
        return self._holder(name, created=False) is not None

    def _blob_list(self) -> str:
        names = self.blobs()
        shown = ", ".join(names[:_SHOWN_BLOBS])
        more = f", ... ({len(names) - _SHOWN_BLOBS} more)" if len(names) > _SHOWN_BLOBS else ""
        return (shown + more) or "(none)"


def _check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise InputTypeError(f"a blob name must be a str, got a {type(name).__name__}")
    return name


def _as_net(source: Any) -> Net:
    loaded = source if isinstance(source, Net) else load(source)
    if isinstance(loaded, Plan):
        raise InputTypeError(f"plan '{loaded.name}' is a plan, not a net; run it with Workspace.run_plan")
    return loaded


def _as_blob(name: str, value: Any) -> Any:
    """What `feed` stores: JAX arrays for numbers, object arrays of bytes for strings, bytes for bytes."""
    if isinstance(value, jax.Array):
        return value
    if isinstance(value, PackedFP16Matrix):  # FbGemmPack's packed weights
        return PackedFP16Matrix(_as_blob(name, value.b))
    if isinstance(value, Int8Tensor):  # a quantized blob (Int8TensorCPU)
        return Int8Tensor(_as_blob(name, value.data), value.scale, value.zero_point)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise InputTypeError(f"blob '{name}': cannot make an array of a {type(value).__name__}: {error}") from None
    if array.dtype.kind in "US" or array.dtype == object:
        strings = np.empty(array.shape, dtype=object)
        for index, item in np.ndenumerate(array):
            if isinstance(item, str | np.str_):
                item = item.encode("utf-8")
            if not isinstance(item, bytes):
                raise InputTypeError(f"blob '{name}': an object array must hold strings, got a {type(item).__name__}")
            strings[index] = bytes(item)
        return strings
    if array.dtype.kind not in "biufc":
        raise InputTypeError(f"blob '{name}': arrays of dtype {array.dtype} cannot be blobs")
    try:
        return device_array(array)
    except (TypeError, ValueError) as error:
        raise BadArgumentError(f"blob '{name}': {error}") from None
