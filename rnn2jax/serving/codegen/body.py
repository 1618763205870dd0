"""A net's ops as statements, in order: only those whose outputs are used (a liveness pass from the
wanted blobs back), each under a comment naming the original op."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...ir.netdef import Op
from .emitters import EMITTERS, Unsupported
from .recurrent import RecurrentPlan, emit_recurrent
from .writer import Writer, op_summary


class Plans:
    """The RecurrentNetwork ops' plans, built once per op (liveness asks for their reads first)."""

    def __init__(self) -> None:
        self._plans: dict[int, RecurrentPlan] = {}

    def get(self, op: Op) -> RecurrentPlan:
        key = id(op)
        if key not in self._plans:
            self._plans[key] = RecurrentPlan(op, self)
        return self._plans[key]

    def reads(self, op: Op) -> Iterable[str]:
        return self.get(op).reads if op.type == "RecurrentNetwork" else op.inputs


def emit_ops(w: Writer, ops: Sequence[Op], after: list[set[str]], plans: Plans) -> None:
    for position, op in enumerate(ops):
        live = [name in after[position] for name in op.outputs]
        if not any(live):
            w.comment(f"{op_summary(op)}: not emitted, nothing reads its outputs")
            continue
        if op.type == "RecurrentNetwork":
            emit_recurrent(w, plans.get(op), live, emit_ops)
            continue
        emit = EMITTERS.get(op.type)
        xs = [w.read(name, op) for name in op.inputs]
        try:
            if emit is None:
                raise Unsupported("no emitter for this op type")
            value = emit(w, op, xs)
        except Unsupported as why:
            w.problems.append((op, str(why)))
            for name in op.outputs:
                w.write(name)  # bound, so later ops still resolve their inputs
            continue
        w.comment(op_summary(op))
        w.assign([w.write(name, keep) for name, keep in zip(op.outputs, live, strict=True)], value)
