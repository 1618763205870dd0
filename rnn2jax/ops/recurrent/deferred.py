"""Parameter gradients after the reverse scan: one matmul over all steps instead of one per step.

At every step a backward step net computes per-step parameter gradients, such as FCGradient's
`dW = dYᵀ·X` and `db = Σ dY`, and RecurrentNetworkGradient sums them over the steps. Each is
bilinear (or linear) in values of its step, so their sum over steps is one contraction over (step,
row). The reverse scan then only has to keep the operands, and most are stored already: X is a
forward state's rows, dY the input sequence's gradient. The weight gradient becomes a single large
matmul after the loop, as oneDNN's LSTM computes it. Only what must be sequential stays in the loop:
`dX = dY·W` and the cell's own backward.

A parameter's gradient is deferred when its per-step blob is written by such an op (FCGradient's dW
or db, MatMul, BatchMatMul), or by an in-place Sum of such blobs (a weight used twice in a step),
and nothing else in the step reads those blobs. Everything else runs in the loop as written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ...errors import ShapeError
from ...ir.netdef import Op
from ..common import canonical_axis, matmul_precision, size_from_dim, size_to_dim
from .dataflow import last_writer, readers

# Which output of which op is a per-step term, and what kind of term it is.
_TERM_OUTPUTS = {
    "FCGradient": {0: "fc_weight", 1: "fc_bias"},
    "FCTransposedGradient": {0: "fc_weight_transposed", 1: "fc_bias"},
    "MatMul": {0: "matmul"},
    "BatchMatMul": {0: "batch_matmul"},
}


@dataclass(frozen=True)
class Term:
    """One per-step term of a parameter's gradient: output `output` of the op at `position`."""

    op: Op
    position: int
    output: int

    @property
    def kind(self) -> str:
        return _TERM_OUTPUTS[self.op.type][self.output]

    @property
    def runs_in_loop(self) -> bool:
        """FCGradient still runs in the loop for its dX; a MatMul term does not run there at all."""
        return self.op.type.startswith("FC")

    @property
    def operands(self) -> tuple[str, ...]:
        """The blobs the term is computed from: (X, dY) for FCGradient, (A, B) for the matmuls."""
        if self.runs_in_loop:
            return (self.op.inputs[0], self.op.inputs[2])
        return self.op.inputs[:2]

    def total(self, stacked: Sequence[jax.Array], param_shape: tuple[int, ...]) -> jax.Array:
        """Σ over steps of the term, from its operands stacked over steps ([T, ...per-step shape])."""
        kind = self.kind
        if kind.startswith("fc_"):
            total = _fc_total(self.op, kind, *stacked, param_shape)
        elif kind == "matmul":
            total = _matmul_total(self.op, *stacked)
        else:
            total = _batch_matmul_total(self.op, *stacked)
        if total.size != math.prod(param_shape):
            raise ShapeError(
                f"{self.op.where}: output '{self.op.outputs[self.output]}' has {total.size} values, but the "
                f"parameter gradient it is summed into has shape {list(param_shape)}"
            )
        return jnp.reshape(total, param_shape)


@dataclass(frozen=True)
class DeferredGrads:
    """The parameters whose gradients are summed after the loop, and what that changes in the step."""

    terms: Mapping[int, tuple[Term, ...]]  # parameter index -> its terms
    skipped: frozenset[int]  # positions not run in the loop (matmul terms and the Sums over terms)
    dropped: Mapping[int, frozenset[int]]  # positions run in the loop whose outputs (indices) are left out

    @property
    def by_position(self) -> dict[int, list[Term]]:
        found: dict[int, list[Term]] = {}
        for terms in self.terms.values():
            for term in terms:
                found.setdefault(term.position, []).append(term)
        return found


NOTHING_DEFERRED = DeferredGrads({}, frozenset(), {})


def find_deferred(ops: Sequence[Op], param_blobs: Sequence[str], protected: set[str]) -> DeferredGrads:
    """Which parameter gradients (per-step blobs `param_blobs`) can be summed after the loop.
    `protected` names blobs the loop needs as they are (links, the timestep)."""
    if any(True for op in ops for _ in op.nested_nets()):
        return NOTHING_DEFERRED  # a nested net may read any blob by name
    terms: dict[int, tuple[Term, ...]] = {}
    skipped: set[int] = set()
    dropped: dict[int, set[int]] = {}
    for index, blob in enumerate(param_blobs):
        last = last_writer(ops, blob, len(ops))
        if blob in protected or last is None or readers(ops, blob, last) or param_blobs.count(blob) > 1:
            continue
        found = _terms(ops, blob, last, protected)
        if found is None:
            continue
        chain, sums = found
        terms[index] = tuple(chain)
        skipped |= sums
        for term in chain:
            if term.runs_in_loop:
                dropped.setdefault(term.position, set()).add(term.output)
            else:
                skipped.add(term.position)
    return DeferredGrads(terms, frozenset(skipped), {p: frozenset(o) for p, o in dropped.items()})


def _terms(ops: Sequence[Op], blob: str, position: int, protected: set[str]) -> tuple[list[Term], set[int]] | None:
    """The terms whose sum op `position` writes to `blob`, and the Sum ops on the way; None if the
    value is anything else."""
    op = ops[position]
    if op.type == "Sum":
        if op.outputs != (blob,) or len(set(op.inputs)) != len(op.inputs):
            return None
        chain: list[Term] = []
        sums = {position}
        for name in op.inputs:
            writer = last_writer(ops, name, position)
            if writer is None or (name != blob and name in protected) or readers(ops, name, writer) != [position]:
                return None
            found = _terms(ops, name, writer, protected)
            if found is None:
                return None
            chain += found[0]
            sums |= found[1]
        return chain, sums
    kinds = _TERM_OUTPUTS.get(op.type, {})
    if op.outputs.count(blob) != 1 or blob in op.inputs:
        return None
    output = op.outputs.index(blob)
    if output not in kinds or (op.type in ("MatMul", "BatchMatMul") and len(op.outputs) != 1):
        return None
    return [Term(op, position, output)], set()


# -- the sums over steps --------------------------------------------------------------------------


def _fc_total(op: Op, kind: str, x: jax.Array, dy: jax.Array, param_shape: tuple[int, ...]) -> jax.Array:
    """FCGradient's dW or db summed over steps: X flattened to [T·M, K] at `axis` (per step), dY to
    [T·M, N]. An empty per-step X gives zeros, as FullyConnectedGradientOp does."""
    per_step = x.shape[1:]
    k = size_from_dim(per_step, canonical_axis(op, op.int("axis", 1), len(per_step)))
    if kind == "fc_bias":
        n = math.prod(param_shape)
        if math.prod(per_step) == 0:
            return jnp.zeros((n,), dy.dtype)
        return jnp.sum(jnp.reshape(dy, (-1, n)), axis=0)
    n = math.prod(param_shape) // max(k, 1)
    x2, dy2 = jnp.reshape(x, (-1, k)), jnp.reshape(dy, (-1, n))
    if kind == "fc_weight":
        return jnp.matmul(dy2.T, x2, precision=matmul_precision())
    return jnp.matmul(x2.T, dy2, precision=matmul_precision())


def _as_matrices(a: jax.Array, axis: int, trans: bool, op: Op, what: str) -> jax.Array:
    """MatMul's per-step flattening to a matrix, over stacked steps: [T, rows, cols] (transposed)."""
    per_step = a.shape[1:]
    k = canonical_axis(op, axis, len(per_step), what)
    m = jnp.reshape(a, (a.shape[0], size_to_dim(per_step, k), size_from_dim(per_step, k)))
    return jnp.swapaxes(m, 1, 2) if trans else m


def _matmul_total(op: Op, a: jax.Array, b: jax.Array) -> jax.Array:
    a3 = _as_matrices(a, op.int("axis_a", 1), op.bool("trans_a", False), op, "axis_a")
    b3 = _as_matrices(b, op.int("axis_b", 1), op.bool("trans_b", False), op, "axis_b")
    return jnp.einsum("tmk,tkn->mn", a3, b3, precision=matmul_precision())


def _batch_matmul_total(op: Op, a: jax.Array, b: jax.Array) -> jax.Array:
    """Σ_t op(A_t)·op(B_t) over the last two dims, batch dims broadcast: the step joins the contraction.
    A 1-D operand (broadcast=1) is a row or column vector whose flag is ignored; the caller reshapes the
    result to the op's output shape, which drops the vector's unit dim."""
    if a.ndim == 2:
        a = a[:, None, :]
    elif op.bool("trans_a", False):
        a = jnp.swapaxes(a, -1, -2)
    if b.ndim == 2:
        b = b[:, :, None]
    elif op.bool("trans_b", False):
        b = jnp.swapaxes(b, -1, -2)
    return jnp.einsum("t...mk,t...kn->...mn", a, b, precision=matmul_precision())
