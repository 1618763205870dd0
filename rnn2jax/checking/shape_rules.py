"""The reader rules of shape inference: what an op says about the shapes of the blobs it reads and writes.

A rule sees the shapes known so far of an op's inputs and outputs (None where unknown) and guesses the
others, the way Caffe2's builders make them: sequences `[T, N, ...]`, recurrent initial states `[1, N, H]`,
lengths `[N]` int32. It never guesses a parameter: those come from the init net or the user. The solver
(`rnn2jax.checking.shape_inference`) checks every guess by running the net's own kernels on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..ir.netdef import Op
from ..lowering.interpreter import LoweredNet
from ..ops.recurrent.spec import RecurrentSpec

Dim = Any  # an int, or a jax.export symbolic dimension
Key = tuple[str, int]  # (blob, version): the index of the op that wrote it, -1 for the net's input
INT32 = np.dtype(np.int32)
FLOAT32 = np.dtype(np.float32)


@dataclass(frozen=True)
class Spec:
    shape: tuple[Dim, ...]
    dtype: np.dtype
    state: bool = False  # a recurrent state's initial value: [D], [N, D] and [L, N, D] fit it too


@dataclass(frozen=True)
class Context:
    batch: Dim | None
    steps: Dim | None
    explicit: bool  # batch or steps was given: they decide data inputs' shapes over defaults

    def leading(self, count: int, known: Sequence[Dim] | None = None) -> tuple[Dim, ...] | None:
        """The dims in front of an FC's axis: [N] (axis 1) or [T, N] (axis 2), as builders make them; N and
        T from batch/steps, else from `known` (what the output's shape says)."""
        if count not in (1, 2) or (known is not None and len(known) != count):
            return None
        batch = self.batch if self.batch is not None else (known[-1] if known is not None else None)
        steps = self.steps if self.steps is not None else (known[0] if known is not None else None)
        if count == 1:
            return None if batch is None else (batch,)
        return None if batch is None or steps is None else (steps, batch)


def fits(old: Spec, new: Spec) -> bool:
    """Whether a default's shape is one the guess allows (an initial state may be [D], [N, D], [L, N, D])."""
    if old.shape == new.shape:
        return True
    if not new.state or len(new.shape) != 3:
        return False
    _, batch, size = new.shape
    if len(old.shape) == 1:
        return old.shape[0] == size
    return old.shape[-2:] == (batch, size) and len(old.shape) in (2, 3)


class Solver(Protocol):
    """What the RecurrentNetwork rule asks of the solver: the op's step net, and its shapes given some."""

    def step_net(self, op: Op) -> tuple[RecurrentSpec, LoweredNet]: ...

    def solve_step_net(self, op: Op, lowered: LoweredNet, fixed: dict[str, Spec], batch: Dim) -> dict[Key, Spec]: ...


Guesses = tuple[dict[int, Spec], dict[int, Spec]]  # by input position, by output position
Rule = Callable[[Op, list, list, Context, Solver], Guesses]


def is_int(dim: Dim) -> bool:
    return isinstance(dim, int | np.integer)


def prod(dims: Sequence[Dim]) -> Dim:
    return math.prod(dims, start=1)


def _fc(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """FC(X, W, b): X is [N, K] (axis 1) or [T, N, K] (axis 2), K from W and axis_w."""
    if len(ins) < 2 or ins[1] is None:
        return {}, {}
    axis, axis_w, weight = op.int("axis", 1), op.int("axis_w", 1), ins[1].shape
    if op.type == "FCTransposed":
        size, units = prod(weight[:axis_w]), prod(weight[axis_w:])
    else:
        units, size = prod(weight[:axis_w]), prod(weight[axis_w:])
    x, y = ins[0], outs[0] if outs else None
    if x is None:
        lead = ctx.leading(axis, y.shape[:axis] if y is not None and len(y.shape) == axis + 1 else None)
        return ({0: Spec((*lead, size), ins[1].dtype)} if lead is not None else {}), {}
    if y is None and len(x.shape) >= axis and axis >= 0:
        return {}, {0: Spec((*x.shape[:axis], units), x.dtype)}
    return {}, {}


def _same_shape(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """Elementwise ops without broadcasting: every input and the output have one shape."""
    if op.int("broadcast", 0):
        return {}, {}
    known = next((s for s in (*ins, *outs[:1]) if s is not None), None)
    if known is None:
        return {}, {}
    plain = Spec(known.shape, known.dtype)
    guess_in = {i: plain for i, s in enumerate(ins) if s is None}
    return guess_in, ({0: plain} if outs and outs[0] is None else {})


def _unary(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """Ops whose first output has their first input's shape (activations, Copy, Dropout, LayerNorm...)."""
    if not ins or not outs:
        return {}, {}
    if ins[0] is None and outs[0] is not None:
        return {0: Spec(outs[0].shape, outs[0].dtype)}, {}
    if ins[0] is not None and outs[0] is None:
        return {}, {0: Spec(ins[0].shape, ins[0].dtype)}
    return {}, {}


def _rnn_unit(gates_per_unit: int, gates_at: int) -> Rule:
    """LSTMUnit (h, c, gates[, lengths], timestep) and GRUUnit (h, gates[, lengths], timestep):
    states [1, N, H], gates [1, N, kH], lengths [N] int32, timestep [1] int32."""

    def rule(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
        states = list(range(gates_at))
        with_lengths = op.bool("sequence_lengths", True) and len(op.inputs) >= gates_at + 3
        known_states = [s for s in (*(ins[i] for i in states), *outs) if s is not None and len(s.shape) >= 2]
        gates = ins[gates_at]
        if known_states:
            lead, size = known_states[0].shape[:-1], known_states[0].shape[-1]
        elif gates is not None and len(gates.shape) >= 2:
            lead, size = gates.shape[:-1], gates.shape[-1] // gates_per_unit
        elif ctx.batch is not None:
            lead, size = (1, ctx.batch), None
        else:
            return {}, {}
        guess_in: dict[int, Spec] = {}
        if size is not None:
            state = Spec((*lead, size), FLOAT32)
            guess_in.update({i: state for i in states if ins[i] is None})
            if gates is None:
                guess_in[gates_at] = Spec((*lead, gates_per_unit * size), FLOAT32)
        if with_lengths and ins[gates_at + 1] is None:
            guess_in[gates_at + 1] = Spec((lead[-1],), INT32)
        if ins[-1] is None:
            guess_in[len(ins) - 1] = Spec((1,), INT32)
        guess_out = {i: state for i, s in enumerate(outs) if s is None} if size is not None else {}
        return guess_in, guess_out

    return rule


def _sequence_mask(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """SequenceMask(X, lengths): lengths hold one int32 per row of X's leading `axis` dims."""
    if len(ins) < 2 or ins[1] is not None or ins[0] is None or op.str("mode", "sequence") != "sequence":
        return {}, {}
    axis = op.int("axis", 1)
    return {1: Spec((prod(ins[0].shape[:axis]),), INT32)}, {}


def _concat(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """Concat: the one input not known is what the output has beyond the others along the axis."""
    if op.int("add_axis", 0) or op.has("order") or not outs or outs[0] is None:
        return {}, {}
    missing = [i for i, s in enumerate(ins) if s is None]
    out = outs[0].shape
    if len(missing) != 1 or any(len(s.shape) != len(out) for s in ins if s is not None):
        return {}, {}
    axis = op.int("axis", 1) % len(out)
    rest = out[axis] - sum(s.shape[axis] for s in ins if s is not None)
    return {missing[0]: Spec((*out[:axis], rest, *out[axis + 1 :]), outs[0].dtype)}, {}


def _gather(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """Gather(DATA, INDICES): int32 indices whose shape is the output's leading dims, else [T, N] ([N])."""
    if len(ins) < 2 or ins[1] is not None or ins[0] is None:
        return {}, {}
    rank = len(ins[0].shape) - 1
    if outs and outs[0] is not None and len(outs[0].shape) > rank:
        return {1: Spec(outs[0].shape[: len(outs[0].shape) - rank], INT32)}, {}
    lead = ctx.leading(2) or ctx.leading(1)
    return ({1: Spec(lead, INT32)} if lead else {}), {}


def _compare(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """GT/LE/... of lengths against the timestep ([1], broadcast): the lengths are [N] (BasicRNN's masks)."""
    if len(ins) != 2 or ins[0] is not None or ins[1] is None or ctx.batch is None:
        return {}, {}
    if op.int("broadcast", 0) and ins[1].shape == (1,):
        return {0: Spec((ctx.batch,), ins[1].dtype)}, {}
    return {}, {}


def _recurrent(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """RecurrentNetwork: infer its step net (batch N, one step) from what the op's inputs give, then read
    back the initial states ([1, N, H]), the input sequence ([T, N, D]) and the references it reads."""
    spec, lowered = solver.step_net(op)
    sequence = ins[0]
    steps, batch = ctx.steps, ctx.batch  # --batch/--steps decide, over what a default made of the sequence
    if steps is None and sequence is not None and sequence.shape:
        steps = sequence.shape[0]
    if batch is None and sequence is not None and len(sequence.shape) >= 2:
        batch = sequence.shape[1]
    if batch is None:
        batch = next((ins[i].shape[1] for i in spec.initial_ids if ins[i] is not None and len(ins[i].shape) == 3), None)
    if batch is None:
        return {}, {}
    known = {n: s for n, s in zip(op.inputs, ins, strict=True) if s is not None}
    initial = {state: op.inputs[i] for state, i in zip(spec.states, spec.initial_ids, strict=True)}
    fixed: dict[str, Spec] = {spec.timestep: Spec((1,), INT32)}
    for link in spec.links:
        if link.external in initial:
            start = known.get(initial[link.external])
            if start is not None and start.shape:
                fixed[link.internal] = Spec((link.window, batch, start.shape[-1]), start.dtype)
        elif link.external in known:
            outer = known[link.external]
            fixed[link.internal] = Spec((link.window, *outer.shape[1:]), outer.dtype)
    local = {link.internal for link in spec.links} | {spec.timestep}
    for name in lowered.reads_before_writes():
        if name not in local and name in known:
            fixed[name] = known[name]
    inner = solver.solve_step_net(op, lowered, fixed, batch)
    guess_in: dict[int, Spec] = {}
    for state, name in initial.items():
        position = op.inputs.index(name)
        if ins[position] is not None:
            continue
        for link in spec.links:
            found = latest(inner, link.internal) if link.external == state else None
            if found is not None and found.shape:
                guess_in[position] = Spec((1, batch, found.shape[-1]), found.dtype, state=True)
                break
    for link in spec.links:
        if link.external in initial or link.external not in op.inputs or steps is None:
            continue
        position = op.inputs.index(link.external)
        found = latest(inner, link.internal)
        if ins[position] is None and found is not None and found.shape:
            rows = steps - 1 + link.offset + link.window
            guess_in[position] = Spec((rows, *found.shape[1:]), found.dtype)
    for position, name in enumerate(op.inputs):
        if ins[position] is None and position not in guess_in and (name, -1) in inner and name not in local:
            guess_in[position] = inner[(name, -1)]
    return guess_in, {}


def latest(shapes: Mapping[Key, Spec], name: str) -> Spec | None:
    """A step-net blob's shape: as read at the step's start, else as last written."""
    if (name, -1) in shapes:
        return shapes[(name, -1)]
    versions = [(v, s) for (n, v), s in shapes.items() if n == name]
    return max(versions, key=lambda item: item[0])[1] if versions else None


UNARY = (
    "Copy", "Alias", "StopGradient", "EnsureCPUOutput", "CopyGPUToCPU", "CopyCPUToGPU", "Relu", "Tanh",
    "Sigmoid", "Softmax", "Softsign", "Elu", "LeakyRelu", "Exp", "Log", "Sqr", "Sqrt", "Negative", "Abs",
    "Clip", "Scale", "Dropout", "LayerNorm", "ElementwiseLinear", "Print", "Swish",
)  # fmt: skip
SAME_SHAPE = ("Sum", "Add", "Sub", "Mul", "Div", "Max", "Min")

RULES: dict[str, Rule] = {
    "FC": _fc,
    "FCTransposed": _fc,
    "LSTMUnit": _rnn_unit(4, 2),
    "GRUUnit": _rnn_unit(3, 1),
    "SequenceMask": _sequence_mask,
    "Concat": _concat,
    "Gather": _gather,
    "RecurrentNetwork": _recurrent,
    **{t: _compare for t in ("GT", "GE", "LT", "LE")},
    **{t: _unary for t in UNARY},
    **{t: _same_shape for t in SAME_SHAPE},
}
