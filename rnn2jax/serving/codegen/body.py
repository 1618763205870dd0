"""A net's ops as statements, in order: only those whose outputs are used (a liveness pass from the
wanted blobs back), each under a comment naming the original op and written by the op's `emitter` facet
(rnn2jax/ops, through `Writer`)."""

from __future__ import annotations

from collections.abc import Sequence

from ...ir.netdef import Op
from ...ops.emit import Unsupported
from ...ops.facets import UNSTATED, Absent
from ...ops.registry import record_for
from .writer import Writer, op_summary

_GENERIC = "codegen does not write this op"  # what most families declare; no news to a reader of the error


def why_not_written(op: Op) -> str | None:
    """Why codegen has no code for `op` (None: its record has an emitter), with the op family's reason when
    that says more than the generic one. The record is the one that runs the op: under an engine variant
    (Mul under DNNLOWP) that class's, not the plain type's."""
    opdef = record_for(op)
    if opdef is not None and opdef.emitter:
        return None
    what = "this op type"
    if opdef is not None and opdef.type != op.type:
        what = f"{op.type} under engine {op.engine} (Caffe2 runs {opdef.type}'s op there)"
    why = opdef.emitter.why if opdef is not None and isinstance(opdef.emitter, Absent) else ""
    if not why or why == _GENERIC or opdef.emitter is UNSTATED:
        return f"no emitter for {what}"
    return f"no emitter for {what} ({why})"


def emit_ops(w: Writer, ops: Sequence[Op], after: list[set[str]]) -> None:
    """Write `ops`; `after[i]` are the blobs still needed after ops[i]. An op codegen cannot write is kept
    in `w.problems` (all are reported at once) and its outputs bound, so later ops still resolve them."""
    for position, op in enumerate(ops):
        live = [name in after[position] for name in op.outputs]
        if not any(live):
            w.comment(f"{op_summary(op)}: not emitted, nothing reads its outputs")
            continue
        opdef = record_for(op)
        # an op that carries nets (RecurrentNetwork) reads what its step net needs itself
        xs = [] if opdef is not None and opdef.carries_nets else [w.read(name, op) for name in op.inputs]
        w.live = live
        try:
            why = why_not_written(op)
            if why is not None:
                raise Unsupported(why)
            value = opdef.emitter(w, op, xs)
        except Unsupported as why:
            w.problems.append((op, str(why)))
            for name in op.outputs:
                w.write(name)  # bound, so later ops still resolve their inputs
            continue
        if value is None:  # the emitter wrote the op's statements itself
            continue
        w.comment(op_summary(op))
        w.assign([w.write(name, keep) for name, keep in zip(op.outputs, live, strict=True)], value)
