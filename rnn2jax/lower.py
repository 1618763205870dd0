"""Net -> pure function: the interpreter that runs ops in order over a dict of blobs.

`lower(net)` checks every op (nested nets too) and builds every kernel up front, so unsupported ops
and bad arguments are reported before any array is touched. The result maps an environment
(blob name -> array) to the environment after the net ran. Caffe2's in-place ops (an output named
like an input) are plain rebinding here: the environment is a fresh dict, never mutated in place.
"""

from __future__ import annotations

from collections import ChainMap, OrderedDict
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.experimental import checkify

from .budget import check_value
from .errors import MissingBlobError, Rnn2JaxError, ShapeError
from .netdef import Net, Op
from .ops.checks import CHECKED_OP_TYPES, enabled_checks
from .ops.registry import OpDef, check_supported, lookup


@dataclass(frozen=True)
class _Step:
    op: Op
    opdef: OpDef
    kernel: Any
    # compiled fold programs (or None: fold eagerly) by input shapes and constant values, least recent first
    folds: OrderedDict[tuple, Any] = field(default_factory=OrderedDict, compare=False, repr=False)


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None:
        return type(value).__name__
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


class LoweredNet:
    """A net as a pure function `env -> env`; call it inside or outside `jax.jit`."""

    def __init__(self, net: Net):
        check_supported(net)
        self.net = net
        self._steps = tuple(_build(op) for op in net.ops)
        self.opdefs: tuple[OpDef, ...] = tuple(step.opdef for step in self._steps)
        self.inputs: tuple[str, ...] = tuple(self.reads_before_writes())

    def __call__(self, env: Mapping[str, Any], *, key: jax.Array | None = None) -> dict[str, Any]:
        env = dict(env)
        self.run(env, key=key)
        return env

    def run(
        self,
        env: MutableMapping[str, Any],
        *,
        key: jax.Array | None = None,
        after_op: Callable[[Op, MutableMapping[str, Any]], None] | None = None,
        ops: Iterable[int] | None = None,
    ) -> None:
        """Run the ops (all, or those at the positions `ops`) on `env` in place. `env` may be a
        `ChainMap` whose later maps are enclosing scopes: reads fall through, writes stay local.
        `after_op(op, env)` runs after each op has bound its outputs (recurrent links use it)."""
        steps = self._steps if ops is None else [self._steps[i] for i in ops]
        for step in steps:
            _run(step, env, key, self.inputs)
            if after_op is not None:
                after_op(step.op, env)

    def abstract_outputs(self, position: int, env: Mapping[str, Any]) -> tuple[jax.ShapeDtypeStruct, ...]:
        """What the op at `position` would write (shapes and dtypes), checked as running it checks them,
        without computing it: for ops a rewrite moves out of a loop."""
        step = self._steps[position]

        def outputs() -> tuple[Any, ...]:
            local = ChainMap({}, env)
            _run(step, local, None, self.inputs)
            return tuple(local.maps[0][name] for name in step.op.outputs)

        return jax.eval_shape(outputs)

    def static_inputs(self) -> dict[str, Op]:
        """Blobs read before written whose VALUES decide a shape, each with the op that needs them.

        Walks back from every op's `static_inputs` through the ops that computed them (all of such an
        op's inputs then decide the shape too), stopping at outputs computed from shapes alone (Shape's,
        Reshape's old_shape, Concat's split_info: registry `shape_only`/`shape_outputs`).
        The compiler makes these blobs static, so every op on the way computes with constants."""
        need: dict[str, Op] = {}
        for step in reversed(self._steps):
            op, opdef = step.op, step.opdef
            produced = [name for name in op.outputs if name in need]
            if produced:
                reader = need[produced[0]]
                for name in produced:
                    del need[name]
                if opdef.reads_values_for(op, produced):
                    for name in op.inputs:
                        need.setdefault(name, reader)
            for position in opdef.static_positions(op):
                need.setdefault(op.inputs[position], op)
        first_read = self.reads_before_writes()
        return {name: need[name] for name in first_read if name in need}

    def reads_before_writes(self) -> dict[str, Op]:
        """Blobs the net reads before any of its ops writes them, in first-read order, each with the
        op that first reads it. A scoped op (RecurrentNetwork) also reads, by name, what its step
        net needs from enclosing scopes."""
        written: set[str] = set()
        needed: dict[str, Op] = {}
        for step in self._steps:
            for name in (*step.op.inputs, *getattr(step.kernel, "scope_reads", ())):
                if name not in written:
                    needed.setdefault(name, step.op)
            written.update(step.op.outputs)
        return needed


def _build(op: Op) -> _Step:
    opdef = lookup(op)
    kernel = opdef.build(op, lower) if opdef.carries_nets else opdef.build(op)
    return _Step(op, opdef, kernel)


def _run(step: _Step, env: MutableMapping[str, Any], key: jax.Array | None, net_inputs: tuple[str, ...]) -> None:
    op = step.op
    args = []
    for name in op.inputs:
        try:
            args.append(env[name])
        except KeyError:
            raise MissingBlobError(
                f"{op.where}: reads blob '{name}' before anything writes it; "
                f"the net's inputs are: {', '.join(net_inputs) or '(none)'}"
            ) from None
    kwargs: dict[str, Any] = {}
    if step.opdef.scoped:
        kwargs["scope"] = env
    if step.opdef.random:
        kwargs["key"] = jax.random.fold_in(key if key is not None else jax.random.key(0), op.index)
    try:
        # When every input is a constant (shapes and lengths that Caffe2 nets compute with Shape, Slice,
        # Cast...), compute now, so ops that need concrete values (fills with input_as_shape, Reshape's
        # new_shape) still get them under jax.jit.
        foldable = bool(args) and _foldable(step.opdef, args)
        result = _fold(step, args, kwargs) if foldable else step.kernel(*args, **kwargs)
    except Rnn2JaxError:
        raise
    except _TRACED_VALUE_ERRORS as error:
        raise ShapeError(_traced_value_message(step, error)) from None
    except (TypeError, ValueError, IndexError) as error:
        inputs = ", ".join(f"{n}: {_describe(v)}" for n, v in zip(op.inputs, args, strict=True))
        raise ShapeError(f"{op.where}: {error} (inputs: {inputs})") from error
    outputs = result if isinstance(result, tuple) else (result,)
    for name, value in zip(op.outputs, outputs, strict=False):
        check_value(op.where, name, value)  # under jit this runs at trace time, before XLA allocates
        env[name] = value


_TRACED_VALUE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerBoolConversionError,
)


def _traced_value_message(step: _Step, error: Exception) -> str:
    """Why a kernel met a traced value where it needs a known one, and what to do about it."""
    op = step.op
    named = [op.inputs[i] for i in step.opdef.static_positions(op)]
    what = f"the values of input(s) {', '.join(repr(n) for n in named)}" if named else "an input's values"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"{op.where}: {what} decide the output's shape, so they must be known when the net is compiled, "
        "but they are traced here. rnn2jax.compile makes such net inputs static by itself; this happens "
        "when the values are computed per step inside a step net, or when `apply` runs under your own "
        f"jax.jit/grad with them as traced arguments (pass them as NumPy arrays instead). ({first})"
    )


def _fold(step: _Step, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The op's outputs from constant inputs, computed now (at trace time).

    As one compiled program per op where that is cheaper: run eagerly, a kernel is dispatched primitive
    by primitive, and each distinct primitive and shape is its own XLA compilation (tens of ms each on
    CPU; the sparse preprocessing of a dper net made 130 of them). The inputs at the op's static
    positions stay NumPy constants inside, as the kernel needs their values. A kernel that needs other
    values concretely, or that refuses its inputs, runs eagerly instead, so results and errors are
    those of the eager run.
    """
    program = _fold_program(step, args, kwargs)
    if program is not None:
        compiled, values = program
        try:
            error, result = compiled(*values)
        except Exception:  # the eager run below raises the kernel's own error
            pass
        else:
            if error is None or error.get() is None:
                return result
    with jax.ensure_compile_time_eval():
        return step.kernel(*args, **kwargs)


def _fold_program(step: _Step, args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, list[Any]] | None:
    """The op as a compiled program of its array inputs, or None where the eager run is as cheap
    (at most one primitive) or the kernel cannot be traced (it needs an input's value). Programs are
    kept per op, by input shapes and the values that enter as constants, so re-running (or re-tracing)
    a net compiles nothing new."""
    static = set(step.opdef.static_positions(step.op))
    traced = [i for i, a in enumerate(args) if i not in static and _jittable(a)]
    if not traced:
        return None
    values = [args[i] for i in traced]
    key = _fold_key(args, traced)
    if key is not None and key in step.folds:
        step.folds.move_to_end(key)
        compiled = step.folds[key]
        return None if compiled is None else (compiled, values)
    checked = step.op.type in CHECKED_OP_TYPES

    def kernel(*values: Any) -> Any:
        full = list(args)
        for i, value in zip(traced, values, strict=True):
            full[i] = value
        if not checked:
            return None, step.kernel(*full, **kwargs)
        with enabled_checks():
            return checkify.checkify(lambda: step.kernel(*full, **kwargs), errors=checkify.user_checks)()

    compiled = None
    try:
        lowered = jax.jit(kernel).trace(*values)
        if _equations(lowered.jaxpr.jaxpr) > 1:
            small = sum(int(np.size(a)) for a in args) <= _SMALL_FOLD
            compiled = lowered.lower().compile(compiler_options=_FOLD_COMPILER_OPTIONS if small else None)
    except Exception:  # the eager run raises the kernel's own error, if any
        compiled = None
    if key is not None:
        step.folds[key] = compiled
        if len(step.folds) > _MAX_FOLDS:
            step.folds.popitem(last=False)
    return None if compiled is None else (compiled, values)


_MAX_FOLDS = 8  # per op


def _fold_key(args: list[Any], traced: list[int]) -> tuple | None:
    """What an op's fold program depends on: the traced inputs' shapes and dtypes, and the values of
    the others; None when these cannot be keyed."""
    parts: list[Any] = []
    for i, arg in enumerate(args):
        dtype, shape = getattr(arg, "dtype", None), getattr(arg, "shape", None)
        if dtype is None or shape is None or np.dtype(dtype).kind == "O":
            return None
        parts.append((str(np.dtype(dtype)), tuple(shape)))
        if i not in traced:
            parts.append(np.asarray(arg).tobytes())
    return tuple(parts)


# A folded op on small values (lengths, shapes, ids) runs once, and its compilation costs more than
# its run: compile it without LLVM's optimisations (about 2.4x less XLA time for a SparseToDenseMask).
# Ops on larger arrays (an op-by-op run of a whole net) keep XLA's defaults.
_FOLD_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
_SMALL_FOLD = 1 << 16  # elements over all inputs


def _equations(jaxpr: Any) -> int:
    """How many primitives a jaxpr binds, counting inside nested jits (each is one eager compilation)."""
    count = 0
    for eqn in jaxpr.eqns:
        inner = eqn.params.get("jaxpr")
        count += _equations(getattr(inner, "jaxpr", inner)) if inner is not None and eqn.primitive.name == "pjit" else 1
    return count


def _jittable(value: Any) -> bool:
    """An array jax.jit can take as an argument (not strings, not Python objects)."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and getattr(value, "shape", None) is not None and np.dtype(dtype).kind in "biufc"


def _foldable(opdef: OpDef, args: list[Any]) -> bool:
    if opdef.random or opdef.scoped:
        return False
    return not any(isinstance(a, jax.core.Tracer) for a in args)


def specialisation_key(static: Mapping[str, Any]) -> tuple:
    """A hashable key for the values of a net's static inputs (NumPy arrays): one executable per key."""
    return tuple((name, value.dtype.str, value.shape, value.tobytes()) for name, value in static.items())


def lower(net: Net) -> LoweredNet:
    """The net as a pure function of a blob environment (see `LoweredNet`)."""
    return LoweredNet(net)
