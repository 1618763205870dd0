"""`compile()` and `CompiledNet`: a Caffe2 net (plus its init net) as a jitted JAX function.

Blob roles follow from the nets, as in a Caffe2 workspace: what the init net writes (or the caller
gives as `params`) are parameters; what the net reads before writing and is not a parameter is an
input; the net's `external_output`s (or, when it declares none, every blob it writes that no later op
reads) are outputs.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from ..errors import Advice, InputTypeError, MissingBlobError, ParseError, ResourceError
from ..ir.budget import check_array, format_bytes, memory_budget
from ..ir.dtypes import caffe2_dtypes, check_not_narrowed, device_array, in_caffe2_dtypes
from ..ir.int8 import Int8Tensor
from ..ir.loader import load
from ..ir.netdef import Net, Op, Plan
from ..ir.packed import PackedFP16Matrix
from ..lowering.interpreter import LoweredNet, lower, specialisation_key
from ..lowering.user_ops import as_opdefs
from ..ops.checks import CHECKED_OP_TYPES, checked_call, raise_failed
from ..ops.registry import overlay
from ..runtime.params import PathLike, resolve_params, run_storage_init_net, save_params, uses_storage
from .cache import enable_compilation_cache
from .sharding import check_batch_axes, replicate, shard_inputs

Arrays = dict[str, jax.Array]


def as_net(source: Any, what: str = "net") -> Net:
    """`load(source)`, insisting on a single net (a Plan must be indexed by net name first)."""
    loaded = load(source)
    if isinstance(loaded, Plan):
        raise ParseError(
            f"the {what} is plan '{loaded.name}' holding nets {', '.join(loaded.nets)}",
            advice=Advice(
                f"pick one, e.g. rnn2jax.load(...)[{next(iter(loaded.nets), 'name')!r}]",
                "pick one with --net NAME" if what == "net" else "name one of the plan's nets with --init NAME",
            ),
        )
    return loaded


@in_caffe2_dtypes
def run_init_net(init_net: Any, seed: int = 0, db_root: PathLike | None = None) -> Arrays:
    """Run an init net once, eagerly: every blob it writes, by name (random fills seeded by `seed`).

    An init net that reads databases (Load, CreateDB, ...) runs in a `Workspace(db_root=db_root)`, its
    host ops between jitted segments, and every array blob it leaves is a parameter."""
    net = as_net(init_net, "init net")
    if uses_storage(net):
        return run_storage_init_net(net, seed, db_root)
    lowered = lower(net)
    needed = lowered.reads_before_writes()
    if needed:
        raise MissingBlobError(
            f"{net.where}: the init net reads {', '.join(needed)} before writing them; "
            "an init net must create every blob it uses",
            advice=Advice("pass such arrays with params= instead", "pass such arrays with --params P.npz instead"),
        )
    with xla_out_of_memory(net.where):
        env = lowered({}, key=jax.random.key(seed))
    written = set(lowered.writes())
    return {name: value for name, value in env.items() if name in written}


def _leaf_outputs(net: Net) -> list[str]:
    """Blobs written by the net that no later op reads, in the order they are last written.
    (An in-place op reads its input before writing it, so its output can still be a leaf.)"""
    unread: dict[str, None] = {}
    for op in net.ops:
        for name in op.inputs:
            unread.pop(name, None)
        for name in op.outputs:
            unread.pop(name, None)
            unread[name] = None
    return list(unread)


class CompiledNet:
    """A compiled Caffe2 net. Call it with inputs by blob name; get a dict of outputs by blob name.

    `apply(params, inputs)` is the pure function underneath, for `jax.grad`, `jax.vmap` and friends.

    Inputs whose values decide a shape (PackRNNSequence's lengths, OneHot's size, Slice's starts, a
    Reshape's shape blob: `static_inputs`) are static: each call reads their values on the host and runs
    the executable specialised to them, compiling one on the first call with new values. The cost is
    a compilation per distinct value (the last `MAX_SPECIALISATIONS` are kept), so feed such inputs
    values from a small set (bucketed lengths) when calls are frequent.
    """

    MAX_SPECIALISATIONS = 32

    @in_caffe2_dtypes
    def __init__(
        self,
        net: Net,
        params: Mapping[str, Any],
        output_names: Sequence[str] | None = None,
        jit: bool = True,
        mesh: Mesh | None = None,
        batch_axes: Mapping[str, int | None] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ):
        self.net = net
        self.mesh = mesh
        self._batch_axes = check_batch_axes(batch_axes, f"{net.where}: compile")
        self._lowered: LoweredNet = lower(net)
        self.params: Arrays = {k: _as_array(v, f"{net.where}: parameter '{k}'") for k, v in params.items()}
        # blob -> the op that reads it before anything writes it: what names a missing input
        self.first_reader: dict[str, Op] = self._lowered.reads_before_writes()
        self.input_names: tuple[str, ...] = tuple(n for n in self.first_reader if n not in self.params)
        # inputs an init net (or params=) also filled: a call that does not give them uses these values
        self.defaults: dict[str, Any] = {n: v for n, v in (defaults or {}).items() if n in self.input_names}
        if output_names is None:
            output_names = net.external_outputs or _leaf_outputs(net)
        self.output_names: tuple[str, ...] = _blob_names(output_names, f"{net.where}: outputs=")
        self._check_outputs()
        if mesh is not None:
            self.params = replicate(mesh, self.params, f"{net.where}: compile")
        # Nets with ops that check values only known at run time (traced Gather indices, lengths) run
        # under checkify, and a failed check is raised after the call (ops/checks.py).
        self._runtime_checks = any(op.type in CHECKED_OP_TYPES for op in net.walk())
        self._jit = jit
        static = self._lowered.static_inputs()
        self.static_inputs: tuple[str, ...] = tuple(n for n in static if n in self.input_names)
        # parameters whose values decide shapes (a Reshape's shape blob): NumPy constants, so shapes fold
        self.static_params = {n: np.asarray(self.params[n]) for n in static if n in self.params}
        self.static_readers: dict[str, Op] = static  # blob -> the op whose shape it decides
        self._executables: OrderedDict[tuple, Callable[..., Any]] = OrderedDict()

    def _check_outputs(self) -> None:
        known = set(self._lowered.writes()) | set(self.input_names) | set(self.params)
        missing = [n for n in self.output_names if n not in known]
        if missing:
            raise MissingBlobError(
                f"{self.net.where}: output(s) {', '.join(missing)} are neither written by the net "
                f"nor given to it; the net writes: {', '.join(sorted(known)) or '(nothing)'}"
            )

    def apply(self, params: Mapping[str, Any], inputs: Mapping[str, Any], key: jax.Array | None = None) -> Arrays:
        """The net as a pure function of its parameters and inputs (and a PRNG key for random ops).

        It runs with Caffe2's dtypes (64-bit types on) wherever it is called. Under a caller's own `jax.jit`
        with x64 off, JAX narrows 64-bit arguments before they get here: a parameter held as int64 or float64
        that arrives narrowed is refused rather than used with its values wrapped."""
        for name, value in _given_items(params):
            held = self.params.get(name)
            if held is not None and hasattr(value, "dtype"):
                check_not_narrowed(f"{self.net.where}: apply's params", name, held.dtype, value.dtype)
        with caffe2_dtypes():
            env = self._lowered({**self._arrays(params, "params"), **self._arrays(inputs, "inputs")}, key=key)
            unset = [name for name in self.output_names if name not in env]
            if unset:  # an If or While whose nets did not write it (Caffe2 leaves it unset too)
                raise MissingBlobError(f"{self.net.where}: output(s) {', '.join(unset)} left unset by the net")
            return {name: env[name] for name in self.output_names}

    def _arrays(self, given: Any, what: str) -> Mapping[str, Any]:
        """`apply`'s arguments checked at trace time: a mapping of blob names to arrays (tracers pass)."""
        if not isinstance(given, Mapping):
            raise InputTypeError(
                f"{self.net.where}: apply's {what} must be a mapping of blob name -> array, "
                f"got a {type(given).__name__}"
            )
        _blob_names(given, f"{self.net.where}: names in apply's {what}")
        return {name: self._array(name, value, what[:-1]) for name, value in given.items()}

    def _array(self, name: str, value: Any, what: str) -> Any:
        """A jax.Array (or tracer) as it is; anything else as an array. The values of static blobs stay
        NumPy constants, so the ops computing shapes from them fold, even under jax.jit."""
        if isinstance(value, jax.Array | Int8Tensor):
            return value
        if name in self.static_inputs or name in self.static_params:
            try:
                array = np.asarray(value)
            except (TypeError, ValueError):
                array = None
            if array is not None and array.dtype.kind in "biuf":
                return array
        return _as_array(value, f"{self.net.where}: {what} '{name}'")

    @in_caffe2_dtypes
    def __call__(self, inputs: Mapping[str, Any] | None = None, /, **named: Any) -> Arrays:
        given = self._given(inputs, named)
        for name, value in given.items():
            shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
            if shape is not None and dtype is not None:  # an array: its size is known before copying it
                check_array(self.first_reader[name].where, name, shape, _jax_dtype(dtype))
        with xla_out_of_memory(self.net.where):
            executable, params, arrays = self._prepared(given)
            result = executable(params, arrays)
            if self._runtime_checks:
                error, result = result
                raise_failed(error)
            return result

    @in_caffe2_dtypes
    def lower(self, inputs: Mapping[str, Any] | None = None, /, **named: Any) -> jax.stages.Lowered:
        """The program a call with these inputs runs, lowered but not compiled: `.as_text()` is its StableHLO,
        `.compile()` the executable (`.cost_analysis()`, `.memory_analysis()`)."""
        executable, params, arrays = self._prepared(self._given(inputs, named))
        return (executable if self._jit else jax.jit(executable)).lower(params, arrays)

    def _given(self, inputs: Any, named: Mapping[str, Any]) -> dict[str, Any]:
        """A call's inputs, checked by name, with the defaults for those it does not give."""
        if inputs is not None and not isinstance(inputs, Mapping):
            raise InputTypeError(
                f"{self.net.where}: inputs must be a mapping of blob name -> array (or keyword arguments), "
                f"got a {type(inputs).__name__}; the net's inputs are: {', '.join(self.input_names) or '(none)'}"
            )
        given = {**(inputs or {}), **named}
        self._check_inputs({**self.defaults, **given})
        return {**{n: v for n, v in self.defaults.items() if n not in given}, **given}

    def _prepared(self, given: Mapping[str, Any]) -> tuple[Any, Arrays, Arrays]:
        """(the jitted net specialised to the static inputs' values, its parameters, its array inputs)."""
        arrays = {name: _as_array(value, f"{self.net.where}: input '{name}'") for name, value in given.items()}
        # Static values are read on the host, in the dtype given (int64 stays int64, as Caffe2 sees it).
        static = {name: np.asarray(given[name]) for name in self.static_inputs}
        arrays = {name: value for name, value in arrays.items() if name not in static}
        if self.mesh is not None:
            arrays = shard_inputs(self.mesh, arrays, self._batch_axes, self.net.where)
        params = {k: v for k, v in self.params.items() if k not in self.static_params}
        return self._executable(static), params, arrays

    def _executable(self, static: Mapping[str, np.ndarray]) -> Callable[..., Any]:
        """The jitted net specialised to the values of the static inputs (and static parameters)."""
        key = specialisation_key(static)
        executable = self._executables.get(key)
        if executable is not None:
            self._executables.move_to_end(key)
            return executable

        def rnn2jax_net(params: Mapping[str, Any], inputs: Mapping[str, Any]) -> Arrays:
            # Static values enter as NumPy constants, so the ops computing shapes from them fold.
            return self.apply({**params, **self.static_params}, {**inputs, **static})

        call = checked_call(rnn2jax_net) if self._runtime_checks else rnn2jax_net
        executable = jax.jit(call) if self._jit else call
        self._executables[key] = executable
        if len(self._executables) > self.MAX_SPECIALISATIONS:
            self._executables.popitem(last=False)
        return executable

    @property
    def specialisations(self) -> int:
        """How many executables are held (one per distinct value of the static inputs)."""
        return len(self._executables)

    def _check_inputs(self, given: Mapping[str, Any]) -> None:
        _blob_names(given, f"{self.net.where}: input names")
        unknown = [n for n in given if n not in self.input_names]
        if unknown:
            hint = [n for n in unknown if n in self.params]
            extra = f" ({', '.join(hint)} are parameters: use .apply(params, inputs) to replace them)" if hint else ""
            raise MissingBlobError(
                f"{self.net.where}: unknown input(s) {', '.join(unknown)}{extra}; "
                f"the net's inputs are: {', '.join(self.input_names) or '(none)'}"
            )
        missing = [n for n in self.input_names if n not in given]
        if missing:
            readers = "; ".join(f"'{n}' is read by {_how_read(self.first_reader[n], n)}" for n in missing)
            raise MissingBlobError(
                f"{self.net.where}: missing input(s) {', '.join(missing)} ({readers}); "
                f"the net's inputs are: {', '.join(self.input_names)}"
            )

    def save_params(self, path: PathLike) -> None:
        """Write `params` to an `.npz` file (read it back with `rnn2jax.load_params` or `params=path`)."""
        save_params(self.params, path)

    def __repr__(self) -> str:
        static = ""
        if self.static_inputs:
            static = (
                f", static_inputs={list(self.static_inputs)} (specialised per value: {self.specialisations} compiled)"
            )
        return (
            f"CompiledNet({self.net.name!r}, inputs={list(self.input_names)}, "
            f"outputs={list(self.output_names)}, params={len(self.params)}{static})"
        )


def _given_items(given: Any) -> list[tuple[Any, Any]]:
    """The (name, value) pairs of a mapping, or none for anything else (`_arrays` names the mistake)."""
    return list(given.items()) if isinstance(given, Mapping) else []


def _how_read(op: Any, name: str) -> str:
    """Where `op` reads blob `name`: an input, or (a step net's scope read) the argument naming it."""
    if name in op.inputs:
        return op.where
    for arg in op.args.values():
        if arg.kind == "strings" and name in arg.value:
            return f"{op.where} through argument '{arg.name}'"
    return op.where


def _blob_names(names: Any, what: str) -> tuple[str, ...]:
    """`names` as a tuple of blob names, refusing a bare string and anything that is not a str."""
    if isinstance(names, str | bytes | bytearray) or not isinstance(names, Iterable):
        raise InputTypeError(f"{what} must be a list of blob names (str), got a {type(names).__name__}")
    names = tuple(names)
    wrong = [n for n in names if not isinstance(n, str)]
    if wrong:
        raise InputTypeError(
            f"{what} must be blob names (str); got {', '.join(f'{n!r} ({type(n).__name__})' for n in wrong)}"
        )
    return names


def _jax_dtype(dtype: Any) -> Any:
    """The dtype an input keeps on the device (its own: rnn2jax runs with 64-bit types on)."""
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError):
        return np.dtype(np.uint8)  # not a NumPy dtype: _as_array names it; count it as one byte per element


@contextmanager
def xla_out_of_memory(where: str) -> Iterator[None]:
    """XLA's RESOURCE_EXHAUSTED (a `jax.errors.JaxRuntimeError`) as a `ResourceError` naming the net."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        budget = memory_budget()
        first = str(error).strip().splitlines()[0] if str(error).strip() else "RESOURCE_EXHAUSTED"
        raise ResourceError(
            f"{where}: XLA ran out of memory running the net ({first}); the memory budget of "
            f"{format_bytes(budget)} covers fills and inputs, not the blobs the net computes from them",
            budget=budget,
        ) from error


def _as_array(value: Any, what: str) -> jax.Array:
    """`value` as a JAX array (`device_array`), with a named InputTypeError for values that are not arrays of
    numbers."""
    if isinstance(value, Mapping | str | bytes) or value is None:
        raise InputTypeError(f"{what} must be an array (NumPy or JAX), got a {type(value).__name__}")
    if isinstance(value, Int8Tensor):  # a quantized blob: its data on the device, its scale and zero point static
        return Int8Tensor(_as_array(value.data, what), value.scale, value.zero_point)  # type: ignore[return-value]
    if isinstance(value, PackedFP16Matrix):  # FbGemmPack's packed weights (ir/packed.py)
        return PackedFP16Matrix(_as_array(value.b, what))  # type: ignore[return-value]
    try:
        return device_array(value)
    except (TypeError, ValueError) as error:
        raise InputTypeError(f"{what} must be an array of numbers (NumPy or JAX): {error}") from None


@in_caffe2_dtypes
def compile(
    net: Any,
    init_net: Any = None,
    *,
    params: Mapping[str, Any] | PathLike | None = None,
    outputs: Sequence[str] | None = None,
    seed: int = 0,
    jit: bool = True,
    mesh: Mesh | None = None,
    batch_axes: Mapping[str, int | None] | None = None,
    db_root: PathLike | None = None,
    custom_ops: Any = None,
    inputs: Sequence[str] | None = None,
    cache_dir: PathLike | None = None,
) -> CompiledNet:
    """Compile a Caffe2 net into a `CompiledNet`.

    `net` and `init_net` take anything `rnn2jax.load` takes. The init net runs once, now, to make the
    parameters (random fills seeded by `seed`); `params` (a dict, or the path of an `.npz` file) adds or
    replaces arrays by blob name. An init net that `Load`s its weights reads its databases under
    `db_root` (as Caffe2's workspace root folder; the current directory by default).
    `outputs` overrides which blobs are returned.
    With a `jax.sharding.Mesh`, calls split the batch dimension of every input over the mesh's devices
    and replicate the parameters (data parallelism). The batch axis is 1 for 3-D and larger inputs
    (Caffe2's [T, N, ...] sequences) and 0 otherwise; `batch_axes` overrides it per input, with None
    meaning replicate.
    `custom_ops` adds ops for this call only: a list of `rnn2jax.custom_op(...)`, or a mapping of op type to
    builder (see `rnn2jax.register_op` for the contract and for registering ops for good).
    `inputs` names blobs that are inputs even though the init net or `params` fill them (an init net that
    sets up one sample's data, say): the filled values become the inputs' `defaults`, which a call that
    does not give them uses (`rnn2jax.checking.input_rule` says how the command line picks them).
    `cache_dir` turns on JAX's persistent compilation cache there (for the whole process, as JAX has one
    cache per process; `rnn2jax.compiler.cache`), so the next process compiling this net compiles nothing.
    """
    if cache_dir is not None:
        enable_compilation_cache(cache_dir)
    if params is not None and not isinstance(params, Mapping | str | os.PathLike):
        raise InputTypeError(
            "params= must be a mapping of blob name -> array or the path of an .npz file, "
            f"got a {type(params).__name__}"
        )
    net = as_net(net)
    with overlay(as_opdefs(custom_ops) if custom_ops is not None else {}):  # kernels are built inside
        values: dict[str, Any] = run_init_net(init_net, seed, db_root) if init_net is not None else {}
        values.update(
            {k: np.asarray(v) if not isinstance(v, jax.Array) else v for k, v in resolve_params(params).items()}
        )
        reads = lower(net).reads_before_writes()
        # strings the net never reads (a vocabulary saved beside the weights) are no parameters of it
        values = {n: v for n, v in values.items() if n in reads or getattr(v, "dtype", None) != np.dtype(object)}
        defaults = _take_inputs(net, values, inputs, reads)
        return CompiledNet(net, values, outputs, jit=jit, mesh=mesh, batch_axes=batch_axes, defaults=defaults)


def _take_inputs(
    net: Net, values: dict[str, Any], inputs: Sequence[str] | None, reads: Mapping[str, Op]
) -> dict[str, Any]:
    """Move the blobs named in `inputs` out of `values` (the parameters): their values, as defaults."""
    if inputs is None:
        return {}
    names = _blob_names(inputs, f"{net.where}: inputs=")
    unread = [n for n in names if n not in reads]
    if unread:
        raise MissingBlobError(
            f"{net.where}: inputs= names {', '.join(unread)}, which the net does not read before writing; "
            f"the blobs it reads first are: {', '.join(reads) or '(none)'}"
        )
    return {n: values.pop(n) for n in names if n in values}
