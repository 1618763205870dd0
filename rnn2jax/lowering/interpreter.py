"""Net -> pure function: the interpreter that runs ops in order over a dict of blobs.

`lower(net)` checks every op (nested nets too) and builds every kernel up front, so unsupported ops
and bad arguments are reported before any array is touched. The result maps an environment
(blob name -> array) to the environment after the net ran. Caffe2's in-place ops (an output named
like an input) are plain rebinding here: the environment is a fresh dict, never mutated in place.
"""

from __future__ import annotations

import contextlib
from collections import ChainMap
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

import jax

from ..errors import MissingBlobError, Rnn2JaxError, ShapeError
from ..ir.budget import check_value
from ..ir.dtypes import in_caffe2_dtypes
from ..ir.netdef import Net, Op
from ..native import disabled as native_disabled
from ..ops.common import Dims, as_array
from ..ops.registry import OpDef, check_supported, lookup


@dataclass(frozen=True)
class _Step:
    op: Op
    opdef: OpDef
    kernel: Any
    decides_shapes: bool = False  # its outputs' values decide a shape further on (`static_ops`)


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None:
        return type(value).__name__
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


class LoweredNet:
    """A net as a pure function `env -> env`; call it inside or outside `jax.jit`."""

    @in_caffe2_dtypes  # kernels are built here, some with constants of their own
    def __init__(self, net: Net, *, plain: bool = False):
        check_supported(net)
        self.net = net
        self.plain = plain
        self._steps = tuple(_build(op, plain) for op in net.ops)
        deciding = set(self.static_ops())
        self._steps = tuple(replace(s, decides_shapes=True) if i in deciding else s for i, s in enumerate(self._steps))
        self.opdefs: tuple[OpDef, ...] = tuple(step.opdef for step in self._steps)
        self.inputs: tuple[str, ...] = tuple(self.reads_before_writes())

    @in_caffe2_dtypes
    def __call__(self, env: Mapping[str, Any], *, key: jax.Array | None = None, net_run: Any = 0) -> dict[str, Any]:
        env = dict(env)
        self.run(env, key=key, net_run=net_run)
        return env

    @in_caffe2_dtypes
    def run(
        self,
        env: MutableMapping[str, Any],
        *,
        key: jax.Array | None = None,
        after_op: Callable[[Op, MutableMapping[str, Any]], None] | None = None,
        ops: Iterable[int] | None = None,
        net_run: Any = 0,
    ) -> None:
        """Run the ops (all, or those at the positions `ops`) on `env` in place. `env` may be a
        `ChainMap` whose later maps are enclosing scopes: reads fall through, writes stay local.
        `after_op(op, env)` runs after each op has bound its outputs (recurrent links use it). A random op
        whose device option sets `random_seed` draws from that seed and `net_run` (how often the created
        net has run), not from `key`."""
        steps = self._steps if ops is None else [self._steps[i] for i in ops]
        # a plain net is verify's reference: JAX's own differentiation of jax.numpy, no native kernel
        with native_disabled() if self.plain else contextlib.nullcontext():
            for step in steps:
                _run(step, env, key, self.inputs, net_run)
                if after_op is not None:
                    after_op(step.op, env)
        for step in steps:  # symbolic dims kept as dims (ops/common.py Dims) leave the net as arrays
            for name in step.op.outputs:
                if isinstance(env.get(name), Dims):
                    env[name] = env[name].array()

    @in_caffe2_dtypes
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
        Reshape's old_shape, Concat's split_info: registry `shape_only`/`shape_outputs`). A scoped op
        (RecurrentNetwork) adds what its step net needs known from the enclosing scopes
        (`static_scope_reads`). The compiler makes these blobs static, so every op on the way computes
        with constants."""
        need, _ = self._static_walk()
        first_read = self.reads_before_writes()
        return {name: need[name] for name in first_read if name in need}

    def static_inputs_if(self) -> dict[str, Callable[[Any], bool]]:
        """Blobs read before written that an op reads as a shape when the value passes its test (registry
        `static_if`), each with that test: a workspace makes one static for a run where its value passes."""
        first_read = self.reads_before_writes()
        tests: dict[str, Callable[[Any], bool]] = {}
        for step in self._steps:
            for index, test in step.opdef.static_if:
                if index < len(step.op.inputs) and step.op.inputs[index] in first_read:
                    tests.setdefault(step.op.inputs[index], test)
        return tests

    def static_ops(self) -> tuple[int, ...]:
        """Positions, in order, of the ops whose outputs' values decide a shape further on (the ops the
        walk of `static_inputs` passes through): given known inputs they compute known values."""
        return self._static_walk()[1]

    def _static_walk(self) -> tuple[dict[str, Op], tuple[int, ...]]:
        need: dict[str, Op] = {}
        positions: list[int] = []
        for position in reversed(range(len(self._steps))):
            step = self._steps[position]
            op, opdef = step.op, step.opdef
            produced = [name for name in op.outputs if name in need]
            if produced:
                reader = need[produced[0]]
                for name in produced:
                    del need[name]
                if opdef.reads_values_for(op, produced):
                    positions.append(position)
                    for name in op.inputs:
                        need.setdefault(name, reader)
            for index in opdef.static_positions(op):
                need.setdefault(op.inputs[index], op)
            for name in getattr(step.kernel, "static_scope_reads", ()):
                need.setdefault(name, op)
        return need, tuple(reversed(positions))

    def writes(self) -> tuple[str, ...]:
        """Every blob the net may write: its ops' outputs, and what ops that run nets in their workspace (If,
        While, Do) write there undeclared (`scope_writes`)."""
        names: dict[str, None] = {}
        for step in self._steps:
            names.update(dict.fromkeys(step.op.outputs))
            names.update(dict.fromkeys(getattr(step.kernel, "scope_writes", ())))
        return tuple(names)

    def optional_reads(self) -> tuple[str, ...]:
        """Blobs ops read when they exist before anything in the net writes them (`optional_reads`: what an
        If's untaken branch or a While's step leaves as it was): a workspace passes them in when it has them."""
        written: set[str] = set()
        names: dict[str, None] = {}
        for step in self._steps:
            names.update(dict.fromkeys(n for n in getattr(step.kernel, "optional_reads", ()) if n not in written))
            written.update(step.op.outputs)
            written.update(getattr(step.kernel, "scope_writes", ()))
        return tuple(n for n in names if n not in self.reads_before_writes())

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
            written.update(getattr(step.kernel, "scope_writes", ()))  # If/While/Do: blobs their nets write
        return needed


def _build(op: Op, plain: bool) -> _Step:
    opdef = lookup(op)
    nested = _plain_lower if plain else lower  # a plain net's step nets are plain too
    kernel = opdef.build(op, nested) if opdef.carries_nets else opdef.build(op)
    return _Step(op, opdef, kernel)


def _run(
    step: _Step, env: MutableMapping[str, Any], key: jax.Array | None, net_inputs: tuple[str, ...], net_run: Any = 0
) -> None:
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
    _check_no_step_workspaces(step, args, env)
    keeps_dims = getattr(step.kernel, "dims_inputs", ())  # the inputs it reads as dims (Slice, fills)
    args = [a if i in keeps_dims else as_array(a) for i, a in enumerate(args)]
    kwargs: dict[str, Any] = {}
    if step.opdef.scoped:
        for name in getattr(step.kernel, "scope_reads", ()):
            if isinstance(env.get(name), Dims):
                env[name] = env[name].array()
        kwargs["scope"] = env
    if step.opdef.random:
        seed = op.device.random_seed if op.device is not None else None
        if seed is not None:  # Caffe2 seeds the op's own generator with it
            kwargs["key"] = jax.random.fold_in(jax.random.key(seed), net_run)
        else:
            kwargs["key"] = jax.random.fold_in(key if key is not None else jax.random.key(0), op.index)
    try:
        if (args or step.decides_shapes) and _foldable(step.opdef, args):
            # Every input is a constant (shapes and lengths that Caffe2 nets compute with Shape, Slice,
            # Cast...): compute now, so ops that need concrete values (fills with input_as_shape,
            # Reshape's new_shape) still get them under jax.jit. An op without inputs (a fill) is
            # computed now only where its values decide a shape (crf's Gather(Shape(x), ConstantFill 0)).
            with jax.ensure_compile_time_eval():
                result = step.kernel(*args, **kwargs)
        else:
            result = step.kernel(*args, **kwargs)
    except Rnn2JaxError:
        raise
    except _TRACED_VALUE_ERRORS as error:
        raise ShapeError(_traced_value_message(step, error)) from None
    except jax.errors.InconclusiveDimensionOperation as error:
        raise ShapeError(_symbolic_dim_message(step, args, error)) from None
    except (TypeError, ValueError, IndexError) as error:
        inputs = ", ".join(f"{n}: {_describe(v)}" for n, v in zip(op.inputs, args, strict=True))
        raise ShapeError(f"{op.where}: {error} (inputs: {inputs})") from error
    if getattr(step.kernel, "binds_outputs", False):
        return  # it bound what it wrote itself (If, While: Caffe2 leaves an output their nets skip unset)
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


def _check_no_step_workspaces(step: _Step, args: list[Any], env: Mapping[str, Any]) -> None:
    """A RecurrentNetwork's step_workspaces (its forward pass, kept for the backward step net) is read only
    by its RecurrentNetworkGradient, as the input the kernel names in `workspace_inputs`: anywhere else (an
    op's input, a step net's read from the enclosing net) it is no tensor, and named as such."""
    op = step.op
    allowed = getattr(step.kernel, "workspace_inputs", ())
    reads = [(n, v) for i, (n, v) in enumerate(zip(op.inputs, args, strict=True)) if i not in allowed]
    reads += [(n, env.get(n)) for n in getattr(step.kernel, "scope_reads", ())]
    for name, value in reads:
        if isinstance(value, Mapping):
            raise ShapeError(
                f"{op.where}: blob '{name}' is a RecurrentNetwork's step_workspaces (its forward pass, which only "
                "its RecurrentNetworkGradient reads, as its last input), not a tensor"
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


def _symbolic_dim_message(step: _Step, args: list[Any], error: Exception) -> str:
    """An op that needs a concrete size where `jax.export` gave a symbolic dim (shape polymorphism)."""
    op = step.op
    symbolic = {
        name: f"'{name}' ({_describe(value)})"
        for name, value in zip(op.inputs, args, strict=True)
        if not all(isinstance(d, int) for d in getattr(value, "shape", ()))
    }.values()
    blobs = f"input {', '.join(symbolic)}" if symbolic else "its inputs"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"{op.where}: cannot run with symbolic dims: it needs the concrete size of a dim of {blobs} "
        f"({first}); export with that dim given as a number"
    )


def _foldable(opdef: OpDef, args: list[Any]) -> bool:
    if opdef.random or opdef.scoped:
        return False
    return not any(isinstance(a, jax.core.Tracer | Dims) for a in args)  # symbolic dims are no constants


def specialisation_key(static: Mapping[str, Any]) -> tuple:
    """A hashable key for the values of a net's static inputs (NumPy arrays): one executable per key."""
    return tuple((name, value.dtype.str, value.shape, value.tobytes()) for name, value in static.items())


def lower(net: Net, *, plain: bool = False) -> LoweredNet:
    """The net as a pure function of a blob environment (see `LoweredNet`).

    `plain=True` lowers every op as written, recursively through step nets: none of rnn2jax's rewrites
    of a recurrent step (the fused LSTM gates, the custom-VJP LSTM stack, the deferred parameter
    gradients) and nothing rnn2jax wrote by hand about gradients, so `jax.grad` of it is JAX's own
    differentiation of the ops. It computes the same values, more slowly; `rnn2jax.verify` uses it as
    its reference. The choice is fixed when the net is lowered, so nothing else is affected."""
    return LoweredNet(net, plain=plain)


def _plain_lower(net: Net) -> LoweredNet:
    return LoweredNet(net, plain=True)
