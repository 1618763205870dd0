"""The vocabulary of shape rules: what an op's `shape_rule` facet sees and says about the blobs it reads and writes.

A rule sees the shapes known so far of an op's inputs and outputs (None where unknown) and guesses the
others, the way Caffe2's builders make them: sequences `[T, N, ...]`, recurrent initial states `[1, N, H]`,
lengths `[N]` int32. It never guesses a parameter: those come from the init net or the user. The solver
(`rnn2jax.checking.shape_inference`) checks every guess by running the net's own kernels on it. The rules
live with their ops, in the family modules; this module is the part they share, in the ops layer, so that
no family imports the solver above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..ir.netdef import Op

if TYPE_CHECKING:
    from .recurrent.spec import RecurrentSpec

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


class StepNet(Protocol):
    """A RecurrentNetwork's step net as the solver lowers it: the blobs it reads before writing them."""

    def reads_before_writes(self) -> Mapping[str, Op]: ...


class Solver(Protocol):
    """What the RecurrentNetwork rule asks of the solver: the op's step net, and its shapes given some."""

    def step_net(self, op: Op) -> tuple[RecurrentSpec, StepNet]: ...

    def solve_step_net(self, op: Op, lowered: StepNet, fixed: dict[str, Spec], batch: Dim) -> dict[Key, Spec]: ...


Guesses = tuple[dict[int, Spec], dict[int, Spec]]  # by input position, by output position
Rule = Callable[[Op, list, list, Context, Solver], Guesses]


def is_int(dim: Dim) -> bool:
    return isinstance(dim, int | np.integer)


def prod(dims: Sequence[Dim]) -> Dim:
    return math.prod(dims, start=1)


def latest(shapes: Mapping[Key, Spec], name: str) -> Spec | None:
    """A step-net blob's shape: as read at the step's start, else as last written."""
    if (name, -1) in shapes:
        return shapes[(name, -1)]
    versions = [(v, s) for (n, v), s in shapes.items() if n == name]
    return max(versions, key=lambda item: item[0])[1] if versions else None


# ------------------------------------------------------------------------------------------------
# Rules that ops of several families share


def output_like_input(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """Ops whose first output has their first input's shape (activations, Copy, Dropout, LayerNorm...)."""
    if not ins or not outs:
        return {}, {}
    if ins[0] is None and outs[0] is not None:
        return {0: Spec(outs[0].shape, outs[0].dtype)}, {}
    if ins[0] is not None and outs[0] is None:
        return {}, {0: Spec(ins[0].shape, ins[0].dtype)}
    return {}, {}


def all_same_shape(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """Elementwise ops without broadcasting: every input and the output have one shape."""
    if op.int("broadcast", 0):
        return {}, {}
    known = next((s for s in (*ins, *outs[:1]) if s is not None), None)
    if known is None:
        return {}, {}
    plain = Spec(known.shape, known.dtype)
    guess_in = {i: plain for i, s in enumerate(ins) if s is None}
    return guess_in, ({0: plain} if outs and outs[0] is None else {})
