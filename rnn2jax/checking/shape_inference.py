"""Shape inference for a net's inputs: what `--batch N --steps T`, the given shapes and the parameters decide.

Users of `verify`, `export` and `codegen` know their batch size and sequence length, not the shape of every
blob a machine-written net reads. Those shapes follow from the ops that read a blob (an FC's weight gives its
input's last dimension, a RecurrentNetwork's step net gives its initial states and its input sequence) and
from what the net computes out of the blobs already known: a forward pass under `jax.eval_shape`, by the
same kernels `rnn2jax.compile` runs, so the shapes found are the ones the compiled net sees (and
inconsistent givens fail there, naming the op). Both are repeated until nothing new is learnt.

Rules work on blob versions (a blob written twice, as an in-place Sum does, has two shapes), guess only
what Caffe2's builders make (sequences `[T, N, ...]`, initial states `[1, N, H]`, lengths `[N]` int32),
and never guess a parameter. Each op's rule is its registry record's `shape_rule` facet, written next to
its kernel in its family module (the vocabulary they share is `rnn2jax.ops.shape_facts`). Dimensions
given as names (str) stay symbolic: jax.export shape polymorphism.

`trace_shapes` is the plain forward half, for nets whose inputs are all known (a workspace's blobs): what
the Caffe2 API's `workspace.InferShapesAndTypes` answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from ..compiler.compiled_net import as_net
from ..errors import Advice, BadArgumentError, InputTypeError, MissingBlobError, Rnn2JaxError, ShapeError
from ..ir.dtypes import in_caffe2_dtypes
from ..ir.netdef import Net, Op
from ..lowering.interpreter import LoweredNet, lower
from ..ops.recurrent.spec import RecurrentSpec, decode_spec
from ..ops.registry import unsupported_ops
from ..ops.roles import integer_blobs
from ..ops.shape_facts import Context, Dim, Guesses, Key, Rule, Spec, fits, is_int
from ..runtime.workspace import Workspace

MAX_ROUNDS = 8  # forward passes; each adds what the previous one made known (nets need 2 or 3)
MAX_SWEEPS = 12  # rule sweeps over the ops between two forward passes


@dataclass(frozen=True)
class InputSpec:
    """The shape and dtype of one input (or blob). A str dimension is a symbolic name (jax.export shape
    polymorphism)."""

    shape: tuple[int | str, ...]
    dtype: str


@dataclass(frozen=True)
class ShapeInference:
    """What `infer_shapes` found. `inputs`: every input of the net that is not a parameter, in the net's
    input order (those still unknown are in `missing`, with the op that first reads each); `blobs`: every
    blob whose shape is known (inputs, parameters and what the net computes, as the net first sees it);
    `replaced`: `defaults` whose shape --batch/--steps changed (their values no longer fit the net)."""

    net: Net
    inputs: dict[str, InputSpec]
    blobs: dict[str, InputSpec]
    missing: dict[str, Op] = field(default_factory=dict)
    replaced: tuple[str, ...] = ()
    batch: int | str | None = None
    steps: int | str | None = None
    obstacles: tuple[str, ...] = ()  # why shapes may stay unknown: kernels that need concrete sizes, step nets

    def require_all(self, flag: str | None = None) -> None:
        """Raise the ShapeError naming every input still missing, its reader and what to pass (in Python's
        words and the command line's: `flag` is its spelling of --shape)."""
        if self.missing:
            message = missing_message(self.net, self.missing)
            raise ShapeError(
                message + "".join(f" ({obstacle})" for obstacle in self.obstacles),
                advice=missing_advice(list(self.missing), self.batch, self.steps, flag),
            )


@in_caffe2_dtypes
def infer_input_specs(
    net: Any,
    params: Mapping[str, Any],
    given: Mapping[str, Sequence[int | str]],
    *,
    batch: int | str | None = None,
    steps: int | str | None = None,
    dtypes: Mapping[str, str] | None = None,
    flag: str | None = None,
) -> dict[str, InputSpec]:
    """The shape and dtype of every input of `net` that is not in `params`, in the net's input order.

    They come from the `given` shapes, the parameters' shapes and `batch` (N) / `steps` (T): an FC's input is
    `[N, K]` (axis 1) or `[T, N, K]` (axis 2) with K from its weight, a RecurrentNetwork's input sequence
    `[T, N, D]`, its initial states `[1, N, H]` and its sequence lengths `[N]` (int32), with D and H from its
    step net, and so on. A str dimension (or batch/steps given as str) is symbolic and stays a str.
    Raises a ShapeError naming the net, every input still unknown and the op that reads it, with what to
    give (`flag`: the command line's spelling, --shape by default); or when the shapes do not fit an op.
    """
    found = infer_shapes(net, params, given, batch=batch, steps=steps, dtypes=dtypes)
    found.require_all(flag)
    return found.inputs


@in_caffe2_dtypes
def infer_shapes(
    net: Any,
    params: Mapping[str, Any],
    given: Mapping[str, Sequence[int | str]],
    *,
    batch: int | str | None = None,
    steps: int | str | None = None,
    dtypes: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> ShapeInference:
    """`infer_input_specs`, without raising for what stays unknown, and with every blob's shape.

    `defaults` are values (an init net's) whose shapes hold unless `batch`/`steps` decide otherwise: a data
    input the init net fills for one sample (`[1, 1, D]`) takes the shape the batch and steps give, and is
    listed in `replaced`; parameters keep theirs (no rule ever guesses a parameter's shape)."""
    net = as_net(net)
    lowered = lower(net)
    dims = _Dims()
    ctx = Context(dims.parse(batch, "batch"), dims.parse(steps, "steps"), batch is not None or steps is not None)
    constants = {**_arrays(defaults or {}, "defaults"), **_arrays(params, "params")}
    hard = {name: _as_spec(value) for name, value in _arrays(params, "params").items()}
    integers = integer_blobs(net)
    for name, shape in given.items():
        if not isinstance(name, str):
            raise InputTypeError(f"{net.where}: shape names must be blob names (str), got {name!r}")
        dtype = (dtypes or {}).get(name) or ("int32" if name in integers else "float32")
        hard[name] = Spec(dims.shape(shape, f"{net.where}: shape of '{name}'"), _dtype(dtype, name, net))
        constants.pop(name, None)
    for name, dtype in (dtypes or {}).items():
        _dtype(dtype, name, net)
    soft = {n: _as_spec(v) for n, v in (defaults or {}).items() if n not in hard}
    solver = _Solver(net, lowered, constants, hard, soft, ctx, dtypes or {})
    shapes = solver.solve()
    params_names = set(params)
    first = lowered.reads_before_writes()
    inputs, missing = {}, {}
    for name, reader in first.items():
        if name in params_names:
            continue
        spec = shapes.get((name, -1))
        if spec is None:
            missing[name] = reader
        else:
            inputs[name] = _public(spec)
    blobs: dict[str, InputSpec] = {}
    for (name, _version), spec in sorted(shapes.items(), key=lambda item: item[0][1]):
        blobs.setdefault(name, _public(spec))
    obstacles = [
        f"{where}: cannot run with symbolic dimensions" for where in dict.fromkeys(o.where for o in solver.symbolic)
    ]
    obstacles += [f"in the step net of {error}" for error in solver.step_errors.values()]
    return ShapeInference(net, inputs, blobs, missing, tuple(solver.replaced), batch, steps, tuple(obstacles))


# ------------------------------------------------------------------------------------------------
# Tracing nets whose inputs are known


@in_caffe2_dtypes
def trace_shapes(nets: Sequence[Any], given: Mapping[str, InputSpec], workspace: Workspace) -> dict[str, InputSpec]:
    """The shape and dtype of every tensor blob `nets` read and write, run in turn, traced with
    `jax.eval_shape` (nothing runs). A net reads what an earlier one wrote, else the `given` shapes, else the
    workspace's blobs: the values of those that decide a shape (a Reshape's shape input), the shapes of the
    others. Raises a MissingBlobError naming the reader of a blob with no known shape, a ShapeError for a
    net that cannot be traced; no guessing (that is `infer_shapes`)."""
    specs: dict[str, Any] = {}
    for source in nets:
        net = as_net(source)
        lowered = LoweredNet(net)
        static = set(lowered.static_inputs())
        env: dict[str, Any] = {}
        concrete: dict[str, Any] = {}
        for name, reader in lowered.reads_before_writes().items():
            if name in specs:
                env[name] = specs[name]
            elif name in given:
                env[name] = jax.ShapeDtypeStruct(tuple(given[name].shape), np.dtype(given[name].dtype))
            elif workspace.has_blob(name):
                value = workspace.get(name, reader)
                if not hasattr(value, "shape"):
                    raise ShapeError(f"{reader.where}: blob '{name}' is not a tensor")
                if name in static:
                    concrete[name] = np.asarray(value)
                else:
                    env[name] = jax.ShapeDtypeStruct(value.shape, value.dtype)
            else:
                raise MissingBlobError(f"{reader.where}: no shape known for blob '{name}'")
        try:
            out = jax.eval_shape(lambda e, c=concrete, f=lowered: f({**e, **c}, key=jax.random.key(0)), env)
        except Rnn2JaxError:
            raise
        except Exception as error:
            raise ShapeError(f"net '{net.name}': shapes cannot be inferred: {error}") from None
        out.update({k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in concrete.items()})
        specs.update(out)
    return {
        name: InputSpec(tuple(int(d) for d in spec.shape), np.dtype(spec.dtype).name)
        for name, spec in specs.items()
        if isinstance(spec, jax.ShapeDtypeStruct)  # not a tensor (step_workspaces): Caffe2 infers nothing for it
    }


# ------------------------------------------------------------------------------------------------
# Dimensions


class _Dims:
    """Symbolic dimension names, all in one jax.export scope (so that T and N can meet in one shape)."""

    def __init__(self) -> None:
        self.scope = jax.export.SymbolicScope()
        self.named: dict[str, Dim] = {}

    def parse(self, value: Any, what: str) -> Dim | None:
        if value is None:
            return None
        if isinstance(value, str):
            text = value.strip()
            if text.lstrip("-").isdigit():
                value = int(text)
            else:
                if text not in self.named:
                    try:
                        (self.named[text],) = jax.export.symbolic_shape(text, scope=self.scope)
                    except Exception as error:  # jax's parser: ValueError or its own error type
                        raise BadArgumentError(f"{what}: {value!r} is not a dimension name ({error})") from None
                return self.named[text]
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise BadArgumentError(f"{what}: a dimension is an int or a name (str), got {value!r}")
        if value < 0:
            raise BadArgumentError(f"{what}: dimension {value} is negative")
        return int(value)

    def shape(self, shape: Any, what: str) -> tuple[Dim, ...]:
        if isinstance(shape, str):
            shape = [d for d in shape.split(",") if d.strip()]
        try:
            return tuple(self.parse(d, what) for d in shape)
        except TypeError:
            raise BadArgumentError(f"{what}: {shape!r} is not a list of dimensions") from None


def _public(spec: Spec) -> InputSpec:
    return InputSpec(tuple(int(d) if is_int(d) else str(d) for d in spec.shape), spec.dtype.name)


def _arrays(values: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise InputTypeError(f"{what} must be a mapping of blob name -> array, got a {type(values).__name__}")
    out = {}
    for name, value in values.items():
        array = value if isinstance(value, jax.Array) else np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise InputTypeError(f"{what}: '{name}' must be an array of numbers, got {array.dtype}")
        out[name] = array
    return out


def _as_spec(value: Any) -> Spec:
    return Spec(tuple(int(d) for d in value.shape), np.dtype(value.dtype))


def _dtype(text: str, name: str, net: Net) -> np.dtype:
    try:
        dtype = np.dtype(text)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise BadArgumentError(f"{net.where}: dtype {text!r} of '{name}' is not a numeric NumPy dtype")
    return dtype


# ------------------------------------------------------------------------------------------------
# The solver: forward passes and reader rules, in turn


class _Solver:
    """Forward passes and reader rules in turn, over blob versions, until nothing new is learnt. `hard`
    shapes (parameters, given) never change; `soft` ones (defaults) give way to what batch/steps decide."""

    def __init__(
        self,
        net: Net,
        lowered: LoweredNet,
        constants: Mapping[str, Any],
        hard: Mapping[str, Spec],
        soft: Mapping[str, Spec],
        ctx: Context,
        dtypes: Mapping[str, str],
    ):
        self.net, self.lowered, self.ctx, self.dtypes = net, lowered, ctx, dtypes
        self.constants = dict(constants)
        self.hard, self.soft = dict(hard), dict(soft)
        self.inputs = lowered.reads_before_writes()
        self.reads: list[tuple[int, ...]] = []
        last: dict[str, int] = {}
        for index, op in enumerate(net.ops):
            self.reads.append(tuple(last.get(n, -1) for n in op.inputs))
            for name in op.outputs:
                last[name] = index
        self.replaced: list[str] = []
        self.masked: str | None = None  # the default a rule is being asked about (see _sweep)
        self.errors: list[tuple[Op, str]] = []
        self.symbolic: list[Op] = []  # ops whose kernels could not run with symbolic dims
        self.inner: dict[Any, tuple[dict[Key, Spec], str | None]] = {}  # step-net solves, and their errors
        self.step_errors: dict[int, str] = {}  # by op index: shapes a step net refused in the last sweep
        self.step_nets: dict[int, tuple[RecurrentSpec, LoweredNet]] = {}

    def solve(self) -> dict[Key, Spec]:
        known = {**self.soft, **self.hard}
        shapes: dict[Key, Spec] = {}
        for _ in range(MAX_ROUNDS):
            computed = self._forward(known)
            shapes = {**{(n, -1): s for n, s in known.items()}, **computed}
            overrides = self._sweep(shapes)
            learnt = {k[0]: s for k, s in shapes.items() if k[1] == -1 and k[0] not in known and k[0] in self.inputs}
            if not learnt and not overrides:
                break
            for name, spec in overrides.items():
                self.soft.pop(name, None)
                self.constants.pop(name, None)
                self.replaced.append(name)
                known[name] = spec
            known.update(learnt)
        if self.errors:
            message = self.errors[0][1]
            described = _describe_known(self, known)
            raise ShapeError(f"{message} (the net's input shapes: {described})" if described else message)
        return shapes

    # -- the forward pass ------------------------------------------------------------------------

    def _forward(self, known: Mapping[str, Spec]) -> dict[Key, Spec]:
        """The shapes of every blob the net computes from what is known, by its own kernels."""
        computed: dict[Key, Spec] = {}
        self.errors, self.symbolic = [], []
        abstract = {n: jax.ShapeDtypeStruct(s.shape, s.dtype) for n, s in known.items() if n not in self.constants}
        key = jax.random.key(0)

        def run(inputs: Mapping[str, Any]) -> None:
            env = {**self.constants, **inputs}
            for index, op in enumerate(self.net.ops):
                if not self._run_op(index, op, env, key):
                    for name in op.outputs:  # later readers must not see an older version
                        env.pop(name, None)
                    continue
                for name in op.outputs:
                    value = env.get(name)
                    if hasattr(value, "shape") and hasattr(value, "dtype"):
                        computed[(name, index)] = Spec(tuple(value.shape), np.dtype(value.dtype))

        jax.eval_shape(run, abstract)
        return computed

    def _run_op(self, index: int, op: Op, env: dict[str, Any], key: Any) -> bool:
        if any(name not in env for name in op.inputs):
            return False
        opdef = self.lowered.opdefs[index]
        if any(isinstance(env[op.inputs[p]], jax.core.Tracer) for p in opdef.static_positions(op)):
            return False  # the values of an input decide the shapes, and only its shape is known
        try:
            self.lowered.run(env, key=key, ops=[index])
        except MissingBlobError:  # a step net's read of a blob not known yet
            return False
        except (ShapeError, BadArgumentError) as error:
            if _symbolic_failure(error, [env[n] for n in op.inputs]):
                self.symbolic.append(op)  # its kernel needs concrete sizes; the rules may still help
            else:
                self.errors.append((op, str(error)))
            return False
        except Rnn2JaxError:
            return False
        except Exception as error:  # a kernel that cannot run on abstract or symbolic shapes
            if _symbolic_failure(error, [env[n] for n in op.inputs]):
                self.symbolic.append(op)
            return False
        return True

    # -- the rules -------------------------------------------------------------------------------

    def _sweep(self, shapes: dict[Key, Spec]) -> dict[str, Spec]:
        """Apply the reader rules until they learn nothing new; return the defaults batch/steps replace."""
        overrides: dict[str, Spec] = {}
        self.step_errors = {}
        for _ in range(MAX_SWEEPS):
            changed = False
            for index, op in enumerate(self.net.ops):
                rule = self.lowered.opdefs[index].shape_rule  # Absent (falsy) for an op without one
                if not rule:
                    continue
                ins = [shapes.get((n, v)) for n, v in zip(op.inputs, self.reads[index], strict=True)]
                outs = [shapes.get((n, index)) for n in op.outputs]
                guess_in, guess_out = self._apply(rule, op, ins, outs, None)
                for position, spec in guess_in.items():
                    key = (op.inputs[position], self.reads[index][position])
                    changed |= self._offer(key, spec, shapes, overrides)
                for position, spec in guess_out.items():
                    changed |= self._offer((op.outputs[position], index), spec, shapes, overrides)
                if self.ctx.explicit:  # what would batch/steps make of each default this op reads?
                    for position, (name, version) in enumerate(zip(op.inputs, self.reads[index], strict=True)):
                        if version == -1 and name in self.soft and name not in overrides:
                            masked = [None if p == position else s for p, s in enumerate(ins)]
                            guess = self._apply(rule, op, masked, outs, name)[0].get(position)
                            if guess is not None:
                                self._offer((name, -1), guess, shapes, overrides)
            if not changed:
                break
        return overrides

    def _apply(self, rule: Rule, op: Op, ins: list, outs: list, masked: str | None) -> Guesses:
        self.masked = masked
        try:
            return rule(op, ins, outs, self.ctx, self)
        except Exception:  # a rule is a guess: one that does not apply (odd ranks, symbolic division) is silent
            return {}, {}
        finally:
            self.masked = None

    def _offer(self, key: Key, spec: Spec, shapes: dict[Key, Spec], overrides: dict[str, Spec]) -> bool:
        name = key[0]
        if key[1] == -1 and name in self.dtypes:
            spec = Spec(spec.shape, np.dtype(self.dtypes[name]), spec.state)
        if key not in shapes:
            shapes[key] = spec
            return True
        soft = key[1] == -1 and name in self.soft and self.ctx.explicit and name not in overrides
        if soft and not fits(shapes[key], spec):
            overrides[name] = spec
        return False

    def solve_step_net(self, op: Op, lowered: LoweredNet, fixed: dict[str, Spec], batch: Dim) -> dict[Key, Spec]:
        """The shapes in a RecurrentNetwork's step net (batch N, one step), from those `fixed` (cached)."""
        cache_key = (op.index, batch, self.masked, tuple(sorted((n, s.shape, s.dtype.str) for n, s in fixed.items())))
        if cache_key not in self.inner:
            constants = {
                n: self.constants[n]
                for n in lowered.reads_before_writes()
                if n in self.constants and n != self.masked  # a default the rule asks batch/steps about
            }
            inner = _Solver(lowered.net, lowered, constants, fixed, {}, Context(batch, 1, False), {})
            try:
                self.inner[cache_key] = (inner.solve(), None)
            except ShapeError as error:  # the outer forward pass names the op too, once it can run
                self.inner[cache_key] = ({}, f"{op.where}: {error}")
        shapes, error = self.inner[cache_key]
        if error is not None and self.masked is None:
            self.step_errors[op.index] = error
        return shapes

    def step_net(self, op: Op) -> tuple[RecurrentSpec, LoweredNet]:
        if op.index not in self.step_nets:
            spec = decode_spec(op)
            self.step_nets[op.index] = (spec, lower(spec.step_net))
        return self.step_nets[op.index]


def _symbolic_failure(error: BaseException, values: Sequence[Any]) -> bool:
    """Whether a kernel failed because a dimension is symbolic (not because the shapes do not fit)."""
    if all(is_int(d) for v in values for d in getattr(v, "shape", ())):
        return False
    text = f"{type(error).__name__} {error} {type(error.__cause__).__name__} {error.__cause__}"
    return any(word in text for word in ("_DimExpr", "ymbolic", "InconclusiveDimension", "DimExpr"))


def _describe_known(solver: _Solver, known: Mapping[str, Spec]) -> str:
    parts = []
    for name, spec in known.items():
        if name in solver.constants:
            continue
        origin = "given" if name in solver.hard else "inferred"
        parts.append(f"{name}: {spec.dtype.name}[{', '.join(str(d) for d in spec.shape)}] ({origin})")
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------
# The error


def missing_message(net: Net, missing: Mapping[str, Op]) -> str:
    """What a user reads when shapes stay unknown: the net, each blob with the op reading it
    (`missing_advice` says what to pass)."""
    readers = "; ".join(f"'{n}' (read by {_op_name(op)})" for n, op in missing.items())
    return f"{net.where}: cannot infer the shape of {len(missing)} input(s): {readers}"


def missing_advice(names: Sequence[str], batch: Any, steps: Any, flag: str | None = None) -> Advice:
    """What to pass so that shapes are known: the batch size and sequence length where not given, or the
    shapes themselves; in Python's keywords and in the command line's flags (`flag`, --shape by default)."""
    given = (("batch=N", "--batch N", batch), ("steps=T", "--steps T", steps))
    unset = [(keyword, flag_) for keyword, flag_, value in given if value is None]
    one = len(names) == 1
    shapes = ", ".join(f"{n!r}: (D0, D1, ...)" for n in names)
    flags = " ".join(f"{flag or '--shape'} {n}=D0,D1,..." for n in names)
    python = f"pass {' and '.join(keyword for keyword, _ in unset)} or " if unset else ""
    command_line = f"pass {' and '.join(flag_ for _, flag_ in unset)} or " if unset else ""
    return Advice(
        f"{python}give {'its shape' if one else 'their shapes'}: {{{shapes}}}",
        f"{command_line}give {'it' if one else 'them'}: {flags}",
    )


def runnable_part(net: Net) -> Net:
    """The net without the ops rnn2jax cannot lower (a training net's database readers, say): what they
    write is then read before written, and inferred from its readers like an input."""
    kept = tuple(op for op in net.ops if not unsupported_ops([replace(net, ops=(op,))], runnable_only=True))
    return net if len(kept) == len(net.ops) else replace(net, ops=kept)


def _op_name(op: Op) -> str:
    return f"op #{op.index} ({op.type})"
