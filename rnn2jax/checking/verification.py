"""The verification harness: hand-built backward step nets against `jax.vjp` of the plain forward scan.

For every RecurrentNetwork op that carries a `backward_step_net`, `verify` draws inputs and output
gradients, then computes the op's input gradients twice: by running the RecurrentNetworkGradient op that
Caffe2's gradient maker derived from it (the backward step net, as rnn2jax runs it for training: its
deferred parameter gradients included), and by `jax.vjp` of the forward op lowered plain
(`lower(net, plain=True)`: the step net's ops as written, with none of rnn2jax's fused steps or custom
VJPs), so the reference is JAX's own differentiation and never rnn2jax's hand-written gradients. It
reports, per gradient blob, how far apart they are; optionally a third opinion comes from central finite
differences of that forward computed in float64 along a random direction, and another from real Caffe2
(`caffe2=`): its own gradient maker's RecurrentNetworkGradient, run in its own interpreter after the same
forward op on the same inputs and output gradients (Caffe2 computes in float32).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compiler.compiled_net import run_init_net
from ..errors import Advice, BadArgumentError, InputTypeError, Rnn2JaxError, ShapeError, UnwrittenStateError
from ..ir.budget import check_array
from ..ir.dtypes import caffe2_dtypes, device_array
from ..ir.loader import load
from ..ir.netdef import Net, Op, Plan
from ..lowering.interpreter import lower
from ..ops.recurrent.spec import decode_spec
from ..ops.roles import integer_blobs
from ..proto import caffe2_pb2 as pb
from .table import text_table

TOLERANCES = {"float32": (1e-4, 1e-5), "float64": (1e-9, 1e-11)}  # (rtol, atol) per dtype
# Central differences are always computed in float64 (the forward run under x64 on float64 copies of the
# inputs), with this step; in float32 their rounding noise (eps / step) swamps what they should check.
FD_STEP = 1e-6
# The rtol per dtype of the hand-built gradient they judge. A check passes when |fd - <g, v>| <= rtol *
# max(|fd|, |<g, v>|), or when the difference is within noise: the jax.vjp check's atol per element of g
# (atol * |v|, v's Euclidean norm) plus float64's own noise in the difference (FD_NOISE of the loss), so a
# gradient that is zero (say, a bias in front of a softmax, which a hand-built net gives as float32
# cancellation noise) is not judged by the ratio of two noises.
FINITE_DIFFERENCES = {"float32": 1e-3, "float64": 1e-5}
FD_NOISE = 1e-9


@dataclass(frozen=True)
class GradientCheck:
    """One gradient blob of one RecurrentNetwork op: hand-built backward vs `jax.vjp` of the plain lowering."""

    op: str
    blob: str
    of: str
    kind: str  # "input", "parameter" or "initial state"
    max_abs: float
    max_rel: float
    ok: bool
    fd_rel: float | None = None  # finite-difference relative error of the hand-built gradient
    caffe2_rel: float | None = None  # real Caffe2's RecurrentNetworkGradient against jax.vjp (max rel error)
    undefined: str | None = None  # why the hand-built gradient has no defined value (Caffe2 reads unset memory)


@dataclass
class VerificationReport:
    """The checks, and the tolerances applied: `rtol`/`atol` against jax.vjp (a gradient passes when its
    max abs error <= atol + rtol * the reference's largest magnitude); `tolerances` has one entry per kind
    of check that ran ("jax.vjp", "finite differences", "caffe2"), exactly as applied."""

    dtype: str
    rtol: float
    atol: float
    checks: list[GradientCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how inputs were made (shapes inferred, values replaced)
    tolerances: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[GradientCheck]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> str:
        return json.dumps({"ok": self.ok, **asdict(self)}, indent=2)

    def __str__(self) -> str:
        with_caffe2 = any(c.caffe2_rel is not None for c in self.checks)
        rows = [("op", "gradient blob", "kind", "max abs err", "max rel err", "fd rel err", "")]
        if with_caffe2:
            rows[0] = (*rows[0][:-1], "caffe2 rel err", "")
        for c in self.checks:
            fd = "-" if c.fd_rel is None else f"{c.fd_rel:.2e}"
            verdict = "ok" if c.ok else "UNDEFINED" if c.undefined else "MISMATCH"
            row = (c.op, c.blob, c.kind, f"{c.max_abs:.2e}", f"{c.max_rel:.2e}", fd)
            if with_caffe2:
                row += ("-" if c.caffe2_rel is None else f"{c.caffe2_rel:.2e}",)
            rows.append((*row, verdict))
        lines = text_table(rows)
        verdict = "all gradients agree" if self.ok else f"{len(self.failed)} gradient(s) disagree"
        lines.append(f"{verdict} (dtype {self.dtype})")
        lines.append(
            f"max abs/rel err: the backward step net against jax.vjp of the plain forward lowering; ok within "
            f"atol {self.atol:g} + rtol {self.rtol:g} x the gradient's largest magnitude"
        )
        fd = self.tolerances.get("finite differences")
        if fd is not None:
            lines.append(
                f"fd rel err: <gradient, v> against a float64 central difference (step {fd['step']:g}) along a "
                f"random v; ok up to rtol {fd['rtol']:g}, or within atol {fd['atol']:g} x |v| + {fd['noise']:g} "
                "x |loss|"
            )
        caffe2 = self.tolerances.get("caffe2")
        if with_caffe2 and caffe2 is not None:
            lines.append(
                "caffe2 rel err: real Caffe2's RecurrentNetworkGradient (float32) against jax.vjp; ok within "
                f"atol {caffe2['atol']:g} + rtol {caffe2['rtol']:g} x the gradient's largest magnitude"
            )
        lines.extend(f"note: {note}" for note in self.notes)
        lines.extend(dict.fromkeys(f"undefined: {c.undefined}" for c in self.checks if c.undefined))
        return "\n".join(lines)


def gradient_op(op: Op) -> Op:
    """The RecurrentNetworkGradient op Caffe2's gradient maker derives from a RecurrentNetwork op
    (SEMANTICS.md 2.7): output gradients, forward inputs, forward outputs in; input, parameter and
    initial-state gradients out; every forward argument copied."""
    with_grads = op.ints("outputs_with_grads")
    params = op.ints("param", ())
    spec = decode_spec(op)
    for name, indices, limit, what in (
        ("param", params, len(op.inputs), "inputs"),
        ("outputs_with_grads", with_grads, len(op.outputs) - 1, "outputs besides step_workspaces"),
    ):
        wrong = [i for i in indices if not 0 <= i < limit]
        if wrong:
            raise BadArgumentError(
                f"{op.where}: argument '{name}' names #{wrong[0]}, but the op has {limit} {what}; "
                "its gradient op cannot be derived"
            )
    inputs = [op.outputs[k] + "_grad" for k in with_grads] + list(op.inputs) + list(op.outputs)
    outputs = [op.inputs[0] + "_grad"] + [op.inputs[i] + "_grad" for i in (*params, *spec.initial_ids)]
    return Op(
        type="RecurrentNetworkGradient",
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        args=op.args,
        index=op.index + 1,
        where=f"{op.where} (its gradient)",
        is_gradient_op=True,
    )


def _shape_of(spec: Any, where: str = "") -> tuple[int, ...]:
    try:
        if isinstance(spec, str):
            shape = tuple(int(v) for v in spec.split(",") if v.strip())
        else:
            shape = tuple(int(v) for v in spec)
    except (TypeError, ValueError) as error:
        raise BadArgumentError(f"{where}: shape {spec!r} is not a list of integers ({error})") from None
    if any(d < 0 for d in shape):
        raise BadArgumentError(f"{where}: shape {list(shape)} has a negative dimension")
    return shape


class _OpCheck:
    """Inputs, forward function and both gradient paths for one RecurrentNetwork op."""

    def __init__(self, op: Op, values: Mapping[str, Any], shapes: Mapping[str, Any], rng, dtype, plain: bool = True):
        self.op = op
        self.spec = decode_spec(op)
        self.integers = integer_blobs(self.spec.step_net)
        self.inputs = self._draw_inputs(values, shapes, rng, dtype)
        self.forward_net = Net(f"{op.type}#{op.index}", (op,), op.inputs, op.outputs, where=op.where)
        self.backward_net = Net(f"{op.type}#{op.index} with gradient", (op, gradient_op(op)), (), (), where=op.where)
        # The reference: the forward op lowered plain (no fused step, no custom VJP), so that jax.vjp of it is
        # JAX's own differentiation of the ops as written. The hand-built side runs as training runs it.
        self.reference = lower(self.forward_net, plain=plain)
        self.training = lower(self.backward_net)
        # Compiled once: finite differences run it three times per blob, and jax.vjp's linearisation
        # would otherwise compile every primitive on its own. (Its values are tracers either way.)
        self.jitted_vjp = jax.jit(self._vjp)
        self._forward64 = None  # the float64 forward of finite differences, made when first needed

    def _draw_inputs(self, values, shapes, rng, dtype) -> dict[str, Any]:
        missing = [n for n in self.op.inputs if n not in values and n not in shapes]
        if missing:
            shapes = ", ".join(f"{n!r}: (D0, D1, ...)" for n in missing)
            flags = " ".join(f"--shape {n}=D0,D1,..." for n in missing)
            raise BadArgumentError(
                f"{self.op.where}: give the shapes of {', '.join(missing)}",
                advice=Advice(
                    f"shapes={{{shapes}}}, or an init net that creates them (init_net=), or the batch size and "
                    "sequence length to infer them from (batch=N, steps=T)",
                    f"{flags}, or an init net that creates them (--init INIT), or the batch size and sequence "
                    "length to infer them from (--batch N --steps T)",
                    separator=": ",
                ),
            )
        steps = None
        drawn: dict[str, Any] = {}
        for position, name in enumerate(self.op.inputs):
            if name in values:
                value = np.asarray(values[name])
                drawn[name] = value if value.dtype.kind in "iub" else value.astype(dtype)
                if position == 0:
                    steps = value.shape[0]
                continue
            shape = _shape_of(shapes[name], f"{self.op.where}: input '{name}'")
            if position == 0:
                steps = shape[0]
            check_array(self.op.where, name, shape, np.int32 if name in self.integers else dtype)
            if name in self.integers:
                drawn[name] = rng.integers(0, (steps or 1) + 1, size=shape).astype(np.int32)
            else:
                drawn[name] = (rng.standard_normal(shape) * 0.5).astype(dtype)
        return drawn

    def float_names(self) -> list[str]:
        """What gets gradients: input 0, the parameters and the initial states."""
        picked = [0, *self.op.ints("param", ()), *self.spec.initial_ids]
        return [self.op.inputs[i] for i in dict.fromkeys(picked)]

    def forward(self, floats: Mapping[str, jax.Array], inputs: Mapping[str, Any] | None = None) -> dict[str, jax.Array]:
        """The reference forward: the op's outputs (step_workspaces aside) as a function of `floats`."""
        env = self.reference({**(self.inputs if inputs is None else inputs), **floats})
        return {name: env[name] for name in self.op.outputs[:-1]}

    def output_grads(self, rng, dtype) -> dict[str, np.ndarray]:
        shapes = jax.eval_shape(self.forward, {n: self.inputs[n] for n in self.float_names()})
        names = [self.op.outputs[k] for k in self.op.ints("outputs_with_grads")]
        for n in names:
            check_array(self.op.where, n + "_grad", shapes[n].shape, dtype)
        return {n: (rng.standard_normal(shapes[n].shape)).astype(dtype) for n in names}

    def hand_built(self, grads: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        grad_op = self.backward_net.ops[1]
        env = self.training({**self.inputs, **{n + "_grad": g for n, g in grads.items()}})
        return {name: env[name] for name in grad_op.outputs}

    def autodiff(self, grads: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        floats = {n: device_array(self.inputs[n]) for n in self.float_names()}
        return self.jitted_vjp(floats, {n: device_array(g) for n, g in grads.items()})

    def _vjp(self, floats: Mapping[str, jax.Array], grads: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        outputs, pullback = jax.vjp(self.forward, floats)
        cotangents = {n: grads[n] if n in grads else jnp.zeros_like(v) for n, v in outputs.items()}
        (result,) = pullback(cotangents)
        return result

    def finite_difference(self, grads, name: str, hand: jax.Array, rng, rtol: float, atol: float) -> float:
        """Error of <hand-built gradient, v> against a central difference along a random v, relative to the
        larger of the two or to the noise floor (see FINITE_DIFFERENCES); it passes at most `rtol`.
        The difference is computed in float64 whatever `dtype` is: the forward runs under x64 on float64
        copies of the inputs and output gradients, so only the hand-built gradient carries `dtype`'s rounding."""
        direction = rng.standard_normal(np.shape(self.inputs[name]))
        hand64 = np.asarray(hand, np.float64)
        wide = {n: v.astype(np.float64) if v.dtype.kind == "f" else v for n, v in self.inputs.items()}
        with caffe2_dtypes():
            if self._forward64 is None:  # the other inputs are constants, as in the reference
                self._forward64 = jax.jit(lambda floats: self.forward(floats, wide))
            base = {n: device_array(wide[n]) for n in self.float_names()}
            cotangents = {n: np.asarray(g, np.float64) for n, g in grads.items()}

            def loss(scale: float) -> float:
                out = self._forward64({**base, name: base[name] + scale * device_array(direction)})
                return float(sum(np.vdot(np.asarray(out[n], np.float64), g) for n, g in cotangents.items()))

            numeric = (loss(FD_STEP) - loss(-FD_STEP)) / (2 * FD_STEP)
            noise = FD_NOISE * max(1.0, abs(loss(0.0)))
        analytic = float(np.vdot(hand64, direction))
        floor = (atol * float(np.linalg.norm(direction)) + noise) / rtol
        return abs(numeric - analytic) / max(abs(numeric), abs(analytic), floor)


def _kind(op: Op, name: str) -> str:
    position = op.inputs.index(name)
    if position == 0:
        return "input"
    return "initial state" if position in decode_spec(op).initial_ids else "parameter"


def _recurrent_ops(loaded: Net | Plan) -> list[Op]:
    """The RecurrentNetwork ops with a backward_step_net, in net order; a usage error when there are none."""
    nets = loaded.nets.values() if isinstance(loaded, Plan) else [loaded]
    found, forward_only = [], 0
    for net in nets:
        for op in net.ops:
            if op.type == "RecurrentNetwork":
                if decode_spec(op).backward_step_net is not None:
                    found.append(op)
                else:
                    forward_only += 1
    if not found:
        what = f"plan '{loaded.name}' (nets {', '.join(loaded.nets) or 'none'})" if isinstance(loaded, Plan) else None
        what = what or loaded.where or f"net '{loaded.name}'"
        has = (
            f"its {forward_only} RecurrentNetwork op(s) have none (built forward-only: build the net for training)"
            if forward_only
            else "it has no RecurrentNetwork op"
        )
        raise BadArgumentError(
            f"{what}: nothing to verify: verify checks RecurrentNetwork ops that have a backward_step_net (the "
            f"hand-built backward pass of a training net) against jax.grad, and {has}"
        )
    return found


def _prepare(net, shapes, seed, dtype, init_net, params, db_root, batch, steps):
    """(ops, values, shapes, rng, notes, loaded): what every check of `verify` starts from."""
    if dtype not in TOLERANCES:
        raise BadArgumentError(f"dtype must be one of {', '.join(TOLERANCES)}, got {dtype!r}")
    loaded = load(net)
    ops = _recurrent_ops(loaded)
    _check_shapes_first(loaded, shapes or {}, dtype)
    values: dict[str, Any] = dict(run_init_net(init_net, seed, db_root)) if init_net is not None else {}
    values.update(_checked_params(params))
    rng = np.random.default_rng(seed)
    shapes = dict(shapes or {})
    notes = _infer_shapes(loaded, ops, values, shapes, batch, steps)
    return ops, values, shapes, rng, notes


def verify(
    net: Any,
    shapes: Mapping[str, Sequence[int] | str] | None = None,
    seed: int = 0,
    dtype: str = "float32",
    *,
    init_net: Any = None,
    params: Mapping[str, Any] | None = None,
    finite_differences: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    caffe2: Any = None,
    db_root: str | os.PathLike | None = None,
    batch: int | None = None,
    steps: int | None = None,
) -> VerificationReport:
    """Check every RecurrentNetwork op's backward step net against `jax.vjp` of its forward scan.

    The reference is JAX's own differentiation of the forward op lowered plain (`lower(net, plain=True)`):
    the step net's ops as written, without rnn2jax's fused LSTM step or its custom-VJP LSTM stack, so
    nothing rnn2jax wrote by hand about gradients is in it. The hand-built side is the backward step net
    run as rnn2jax trains with it (its deferred parameter gradients included), so both are checked.

    Input values come from `params`, then from `init_net` (run once), then are drawn at random with
    the `shapes` given (`{blob: dims}`; sequence lengths are drawn in [0, T]). `dtype` is "float32" or
    "float64". A gradient passes when its max abs error is at most
    `atol + rtol * its largest magnitude` (defaults per dtype: TOLERANCES). `finite_differences` adds a
    central difference along a random direction, computed in float64 whatever `dtype` is (see
    FINITE_DIFFERENCES for its tolerance). `caffe2` (a `Caffe2Oracle`, or the Python of a Caffe2 venv made
    by `rnn2jax setup-caffe2`) adds real Caffe2's gradient as a third opinion, judged against `jax.vjp`
    with float32's tolerances. The report's `tolerances` records each kind of check's tolerance as
    applied. `db_root` is where an init net that Loads from databases finds them (relative names; the
    current directory by default).

    Shapes not given are inferred (`rnn2jax.checking.shape_inference`) from the parameters, the values and `batch`
    (N) / `steps` (T), blobs the net computes before a RecurrentNetwork op included. `batch`/`steps` decide
    the data inputs' shapes: a data input whose value (an init net's one-sample setup, say) does not fit them
    is drawn at random with the shape they give instead, while parameters keep their values; the report's
    `notes` say which.

    A net (or plan) without a RecurrentNetwork op that has a backward_step_net is refused with a
    `BadArgumentError`: there is nothing to check.
    """
    ops, values, shapes, rng, notes = _prepare(net, shapes, seed, dtype, init_net, params, db_root, batch, steps)
    default_rtol, default_atol = TOLERANCES[dtype]
    report = VerificationReport(dtype, default_rtol if rtol is None else rtol, default_atol if atol is None else atol)
    report.tolerances["jax.vjp"] = {"rtol": report.rtol, "atol": report.atol}
    if finite_differences:
        report.tolerances["finite differences"] = {
            "step": FD_STEP, "rtol": FINITE_DIFFERENCES[dtype], "atol": report.atol, "noise": FD_NOISE
        }  # fmt: skip
    report.notes.extend(notes)
    protos = _recurrent_protos(net, len(ops)) if caffe2 is not None else [None] * len(ops)
    oracle, owned = _oracle(caffe2) if caffe2 is not None else (None, False)
    if oracle is not None:
        report.tolerances["caffe2"] = dict(zip(("rtol", "atol"), TOLERANCES["float32"], strict=True))
    try:
        with caffe2_dtypes():  # float32 draws stay float32: every array has its dtype
            for op, proto in zip(ops, protos, strict=True):
                checks, check, grads, auto = _check_op(op, values, shapes, rng, dtype, report, finite_differences)
                if oracle is not None:
                    checks = _with_caffe2(oracle, proto, checks, check, grads, auto)
                report.checks.extend(checks)
    finally:
        if owned:
            oracle.close()
    return report


def reference_jaxprs(
    net: Any,
    shapes: Mapping[str, Sequence[int] | str] | None = None,
    seed: int = 0,
    dtype: str = "float32",
    *,
    init_net: Any = None,
    params: Mapping[str, Any] | None = None,
    db_root: str | os.PathLike | None = None,
    batch: int | None = None,
    steps: int | None = None,
    plain: bool = True,
) -> dict[str, jax.extend.core.ClosedJaxpr]:
    """The jaxpr of each forward function `verify` differentiates with `jax.vjp`, by op (`op.where`), for
    the same arguments: evidence of what the reference is made of (no custom_vjp or custom_jvp call).
    `plain=False` shows the same function lowered as `compile` lowers it, for comparison."""
    ops, values, shapes, rng, _ = _prepare(net, shapes, seed, dtype, init_net, params, db_root, batch, steps)
    found = {}
    with caffe2_dtypes():
        for op in ops:
            check = _OpCheck(op, values, shapes, rng, dtype, plain=plain)
            floats = {n: device_array(check.inputs[n]) for n in check.float_names()}
            found[op.where] = jax.make_jaxpr(check.forward)(floats)
    return found


def _infer_shapes(
    loaded: Net | Plan,
    ops: Sequence[Op],
    values: dict[str, Any],
    shapes: dict[str, Any],
    batch: int | None,
    steps: int | None,
) -> list[str]:
    """Fill `shapes` with what the nets holding `ops` give every blob those ops read, and drop from `values`
    the data inputs `batch`/`steps` replace; the notes say what was done. Without batch/steps the inference
    only helps: what it cannot find is left to the shapes given (and _OpCheck's error)."""
    from .input_rule import infer_with_defaults, named_inputs
    from .shape_inference import missing_advice, missing_message

    explicit = batch is not None or steps is not None
    for name, value in (("batch", batch), ("steps", steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise BadArgumentError(f"verify: {name}= must be a positive int, got {value!r}")
    notes = []
    named = named_inputs(values, shapes)  # a shape given for a filled blob: an input, drawn at that shape
    if named:
        notes.append(f"a shape given for {', '.join(named)}: drawn at random instead of taking the filled values")
        for name in named:
            del values[name]
    if not explicit and all(n in values or n in shapes for op in ops for n in op.inputs):
        return notes
    nets = list(loaded.nets.values()) if isinstance(loaded, Plan) else [loaded]
    for net in nets:
        checked = [op for op in net.ops if any(op is o for o in ops)]
        if not checked:
            continue
        try:
            found = infer_with_defaults(net, values, shapes, batch=batch, steps=steps)
        except Rnn2JaxError:
            if explicit:
                raise
            continue
        old = {name: list(np.shape(values[name])) for name in found.replaced}
        for name in found.replaced:
            del values[name]
        inferred = [n for n in found.blobs if n not in values and n not in shapes]
        shapes.update({n: found.blobs[n].shape for n in inferred})
        missing = {n: op for op in checked for n in op.inputs if n not in values and n not in shapes}
        if missing and explicit:
            advice = missing_advice(list(missing), batch, steps)
            raise ShapeError(
                missing_message(net, missing),
                advice=Advice(
                    f"{advice.python}; parameters come from an init net (init_net=) or params=",
                    f"{advice.command_line}; parameters come from an init net (--init INIT) or --params P.npz",
                ),
            )
        reads = {n for op in checked for n in op.inputs}
        shown = [n for n in inferred if n in reads]
        if shown:
            listed = ", ".join(f"{n} {list(found.blobs[n].shape)}" for n in shown)
            notes.append(f"{net.where}: shapes inferred: {listed}")
        if old:
            flags = " ".join(f"--{k} {v}" for k, v in (("batch", batch), ("steps", steps)) if v is not None)
            listed = ", ".join(f"{n} {old[n]} -> {list(found.blobs[n].shape)}" for n in old)
            notes.append(
                f"{net.where}: {flags} decide the data inputs' shapes: {listed} are drawn at random instead of "
                "taking the given or init net's values; parameters keep their values"
            )
    return notes


def _checked_params(params: Any) -> dict[str, Any]:
    """`verify`'s params=: a mapping of blob names to numeric arrays, else an InputTypeError."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise InputTypeError(f"verify: params= must be a mapping of blob name -> array, got a {type(params).__name__}")
    checked = {}
    for name, value in params.items():
        if not isinstance(name, str):
            raise InputTypeError(f"verify: params= names must be blob names (str); got {name!r}")
        array = None if isinstance(value, Mapping | str | bytes) or value is None else np.asarray(value)
        if array is None or array.dtype.kind not in "biuf":
            raise InputTypeError(
                f"verify: parameter '{name}' must be an array of numbers, got a {type(value).__name__}"
            )
        checked[name] = value
    return checked


def _check_shapes_first(loaded: Net | Plan, shapes: Mapping[str, Any], dtype: str) -> None:
    """Bad or absurd shapes are refused before the init net runs or anything is traced, naming the first
    op that reads each blob (the drawing checks again, with the blob's actual dtype)."""
    nets = list(loaded.nets.values()) if isinstance(loaded, Plan) else [loaded]
    readers: dict[str, str] = {}
    for net in nets:
        for op in net.walk():
            for name in op.inputs:
                readers.setdefault(name, op.where)
    for name, spec in shapes.items():
        where = readers.get(name, nets[0].where if nets else "verify")
        check_array(where, name, _shape_of(spec, f"{where}: input '{name}'"), dtype)


def _check_op(op, values, shapes, rng, dtype, report, finite_differences):
    """The checks of one op, with what the Caffe2 column needs: the inputs, output gradients and jax.vjp."""
    check = _OpCheck(op, values, shapes, rng, dtype)
    grads = check.output_grads(rng, dtype)
    auto = check.autodiff(grads)
    try:
        hand = check.hand_built(grads)
    except UnwrittenStateError as error:  # a broken backward step net: Caffe2's answer would be unset memory
        hand, undefined = None, str(error)
    grad_op = check.backward_net.ops[1]
    of_blobs = [op.inputs[0]] + [op.inputs[i] for i in (*op.ints("param", ()), *check.spec.initial_ids)]
    results = []
    for grad_name, of in zip(grad_op.outputs, of_blobs, strict=True):
        if hand is None:
            inf = float("inf")
            results.append(GradientCheck(op.where, grad_name, of, _kind(op, of), inf, inf, False, undefined=undefined))
            continue
        ours, reference = np.asarray(hand[grad_name], np.float64), np.asarray(auto[of], np.float64)
        if ours.shape != reference.shape:
            max_abs, max_rel, ok = float("inf"), float("inf"), False
        else:
            max_abs = float(np.max(np.abs(ours - reference), initial=0.0))
            scale = float(np.max(np.abs(reference), initial=0.0))
            max_rel = max_abs / scale if scale else max_abs
            ok = max_abs <= report.atol + report.rtol * scale
        fd = None
        if finite_differences:
            fd_rtol = report.tolerances["finite differences"]["rtol"]
            fd = check.finite_difference(grads, of, hand[grad_name], rng, fd_rtol, report.atol)
            ok = ok and fd <= fd_rtol
        results.append(GradientCheck(op.where, grad_name, of, _kind(op, of), max_abs, max_rel, ok, fd))
    return results, check, grads, auto


# ------------------------------------------------------------------------------------------------
# Real Caffe2 as a third opinion


def _oracle(caffe2: Any):
    from .oracle.session import open_oracle

    return open_oracle(caffe2)


def _recurrent_protos(source: Any, count: int) -> list[Any]:
    """The RecurrentNetwork OperatorDefs `_recurrent_ops` found, as protobuf messages for Caffe2."""
    from ..ir.wire import read_message

    if isinstance(source, Net | Plan):
        raise BadArgumentError("caffe2= needs the net as a file, bytes, text or protobuf message, not a loaded Net")
    message = read_message(source)
    nets = list(message.network) if isinstance(message, pb.PlanDef) else [message]
    found = [
        op
        for net in nets
        for op in net.op
        if op.type == "RecurrentNetwork" and any(a.name == "backward_step_net" for a in op.arg)
    ]
    if len(found) != count:
        raise BadArgumentError(f"found {len(found)} RecurrentNetwork ops for Caffe2 but {count} to verify")
    return found


def _with_caffe2(oracle, proto, checks: list[GradientCheck], check: _OpCheck, grads, auto) -> list[GradientCheck]:
    """Run the forward op and Caffe2's own RecurrentNetworkGradient in Caffe2 (float32) on the same inputs
    and output gradients; add each gradient's error against jax.vjp to its check."""
    from .oracle import Caffe2Error, OracleCrashedError
    from .oracle.session import caffe2_refused

    op = check.op
    names = {op.outputs[k]: f"{op.outputs[k]}_grad" for k in op.ints("outputs_with_grads")}
    g_output = [names.get(name) for name in op.outputs]
    feeds = {n: v.astype(np.float32) if v.dtype.kind == "f" else v for n, v in check.inputs.items()}
    feeds.update({names[n]: np.asarray(g, np.float32) for n, g in grads.items()})
    try:
        grad_ops, g_input = oracle.gradient_for_op(proto, g_output)
        wanted = [g for g in g_input if isinstance(g, str)]
        theirs = oracle.run([("op", proto), ("ops", grad_ops)], feeds, wanted, workspace="verify")
    except (Caffe2Error, OracleCrashedError) as error:
        raise caffe2_refused(error, f"{op.where} or its gradient") from None
    rtol, atol = TOLERANCES["float32"]
    result = []
    for c in checks:
        name = g_input[op.inputs.index(c.of)]
        reference = np.asarray(auto[c.of], np.float64)
        if not isinstance(name, str) or name not in theirs or theirs[name].shape != reference.shape:
            rel, ok = float("inf"), False
        else:
            error = float(np.max(np.abs(theirs[name].astype(np.float64) - reference), initial=0.0))
            scale = float(np.max(np.abs(reference), initial=0.0))
            rel, ok = (error / scale if scale else error), error <= atol + rtol * scale
        result.append(replace(c, caffe2_rel=rel, ok=c.ok and ok))
    return result
