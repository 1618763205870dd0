"""A RecurrentNetwork op as `lax.scan` (what its `emitter` facet, rnn2jax/ops/recurrent/forward.py, asks
the writer for): its step net becomes the scan body, whose carry is the current row of each recurrent
state, whose xs are the timestep and a row of each linked sequence, and whose ys are the rows the step
writes; aliases then pick the final row (`_last`), all written rows (`_all`) or the initial and written rows.

This is the common form of rnn2jax's lowering (rnn2jax/ops/recurrent/forward.py): each state read at
offset 0 and written at offset 1 through links of window 1, one initial row. Other arrangements
(windows, other offsets) are refused with the op and the link named, and so are step nets whose shapes
depend on the timestep (beam search), whose first steps the lowering runs outside its loop.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...ir.netdef import Op
from ...lowering.interpreter import lower
from ...ops.emit import Unsupported, call
from ...ops.recurrent.forward import initial_row
from ...ops.recurrent.spec import Link, RecurrentSpec, decode_spec
from .body import emit_ops
from .liveness import live_after
from .names import Scope, sanitise
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
        """The blobs writing `op` reads: a RecurrentNetwork's are those its step net needs."""
        return self.get(op).reads if op.type == "RecurrentNetwork" else op.inputs

    def write_scan(self, w: Writer, op: Op) -> None:
        """`Writer.write_scan`: the op as a scan, for its outputs that `w.live` says are read."""
        emit_recurrent(w, self.get(op), w.live)


class RecurrentPlan:
    """What the generated scan needs of one RecurrentNetwork op, checked once."""

    def __init__(self, op: Op, plans: Plans):
        self.op = op
        self.plans = plans
        self.spec = spec = decode_spec(op)
        self.problem = ""
        ops = spec.step_net.ops
        written = {name for o in ops for name in o.outputs}
        self.reads_of: dict[str, Link] = {}
        self.writes_of: dict[str, Link] = {}
        self.sequences: list[Link] = []
        try:
            for state in spec.states:
                self._state_links(state, written)
            for link in spec.links:
                if link.external not in spec.states:
                    if (link.offset, link.window) != (0, 1):
                        raise Unsupported(
                            _link_text(link) + ": only sequence links at offset 0, window 1 are supported"
                        )
                    self.sequences.append(link)
            for alias in spec.aliases:
                if alias.src not in spec.states or alias.offset not in (-1, 0, 1):
                    raise Unsupported(
                        f"alias {alias.src} -> {alias.dst} at offset {alias.offset}: only aliases of a recurrent "
                        "state at offset 1 (all rows), -1 (the last) or 0 (with the initial row) are supported"
                    )
            nested = [o for o in ops if any(True for _ in o.nested_nets())]
            if nested:
                raise Unsupported(f"the step net's {nested[0].where} holds a net of its own")
            reader = lower(spec.step_net).static_inputs().get(spec.timestep)
            if reader is not None:
                raise Unsupported(
                    f"the timestep decides a shape in the step net ({reader.where}): the generated module runs "
                    "every step in one lax.scan; rnn2jax.compile and export run such nets"
                )
        except Unsupported as why:
            self.problem = str(why)
        wanted = [self.writes_of[s].internal for s in spec.states if s in self.writes_of]
        self.after, needed = live_after(ops, wanted, plans.reads)
        local = {link.internal for link in spec.links} | {spec.timestep}
        self.needed = needed
        initial = [op.inputs[i] for i in spec.initial_ids]
        scope = sorted(needed - local)
        self.reads = list(dict.fromkeys([op.inputs[0], *(lk.external for lk in self.sequences), *initial, *scope]))

    def _state_links(self, state: str, written: set[str]) -> None:
        links = [link for link in self.spec.links if link.external == state]
        reads = [link for link in links if link.offset == 0]
        writes = [link for link in links if link.offset == 1]
        odd = [link for link in links if link.window != 1 or link.offset not in (0, 1)]
        if odd or len(writes) != 1 or len(reads) > 1 or writes[0].internal not in written:
            shown = "; ".join(_link_text(link) for link in links) or "no links"
            raise Unsupported(
                f"recurrent state '{state}' ({shown}): only a state read at offset 0 and written once at offset 1 "
                "by a step op, windows 1, is supported"
            )
        if reads and reads[0].internal in written:
            raise Unsupported(f"the step net writes '{reads[0].internal}', the row of '{state}' it reads")
        self.writes_of[state] = writes[0]
        if reads:
            self.reads_of[state] = reads[0]


def _link_text(link: Link) -> str:
    return f"link {link.internal} -> {link.external} (offset {link.offset}, window {link.window})"


def emit_recurrent(w: Writer, plan: RecurrentPlan, live: list[bool]) -> None:
    """The step function, the scan and the aliases; `Unsupported` (before writing anything) for an
    arrangement the scan form does not cover."""
    op, spec = plan.op, plan.spec
    problem = plan.problem
    if not problem and live[-1] and op.outputs[-1] not in {a.dst for a in spec.aliases}:
        problem = f"output '{op.outputs[-1]}' (step_workspaces) is kept for a backward step net; codegen has none"
    if problem:
        raise Unsupported(problem)
    names = w.scope.names
    fn = names.fresh(f"{sanitise(spec.step_net.name or 'step')}_step")
    body = w.nested(spec.step_net, Scope(names, w.scope))
    w.comment(op_summary(op))
    w.comment(
        f"step net '{spec.step_net.name}' as a lax.scan body: carry = the recurrent states' rows "
        f"({', '.join(spec.states)}), xs = the timestep and the rows of the linked sequences"
    )
    w.line(f"def {fn}(carry, xs):")
    # carry: the row each state's read link views
    targets = []
    for state in spec.states:
        link = plan.reads_of.get(state)
        targets.append(body.write(link.internal, link.internal in plan.needed) if link else "_")
    body.unpack(targets, "carry")
    sequences = [link for link in plan.sequences if link.internal in plan.needed]
    ticking = spec.timestep in plan.needed
    rows = [body.write(link.internal) for link in sequences]
    body.unpack(["t" if ticking else "_", *rows], "xs")
    if ticking:
        body.assign(body.write(spec.timestep), "jnp.reshape(t, (1,))")
    for link, row in zip(sequences, rows, strict=True):
        body.comment(f"link: {link.internal} is row t of {link.external}")
        body.assign(row, f"{row}[None]")
    emit_ops(body, spec.step_net.ops, plan.after)
    new = [body.read(plan.writes_of[state].internal) for state in spec.states]
    kept = _kept_rows(spec)
    body.assign_tuple("new_carry", new)
    if kept:
        body.assign_tuple("rows", [f"{new[spec.states.index(s)]}[0]" for s in kept])
    else:
        body.line("rows = ()")
    body.line("return new_carry, rows")
    w.lines += body.lines
    w.blank()
    _emit_scan(w, plan, fn, live, kept)


def _kept_rows(spec: RecurrentSpec) -> list[str]:
    """The states whose written rows an alias needs (offset 1 or 0), in state order."""
    wanted = {a.src for a in spec.aliases if a.offset in (0, 1)}
    return [s for s in spec.states if s in wanted]


def _emit_scan(w: Writer, plan: RecurrentPlan, fn: str, live: list[bool], kept: list[str]) -> None:
    op, spec = plan.op, plan.spec
    sequence = w.read(op.inputs[0], op)
    initial = {}
    for state, index in zip(spec.states, spec.initial_ids, strict=True):
        value = w.read(op.inputs[index], op)
        initial[state] = w.write(state)
        w.assign(initial[state], call(w.helper(initial_row), value, f"{sequence}.shape[1]"))
    names = w.scope.names
    init, xs = names.fresh(f"{fn}_init"), names.fresh(f"{fn}_xs")
    final, rows = names.fresh(f"{fn}_final"), names.fresh(f"{fn}_rows")
    w.assign_tuple(init, [initial[s] for s in spec.states])
    steps = f"jnp.arange({sequence}.shape[0], dtype=jnp.int32)"
    w.assign_tuple(xs, [steps, *(w.read(link.external, op) for link in plan.sequences if link.internal in plan.needed)])
    w.assign([final, rows], call("lax.scan", fn, init, xs))
    live_dst = {name for name, keep in zip(op.outputs, live, strict=True) if keep}
    for alias in spec.aliases:
        if alias.dst not in live_dst:
            continue
        k = spec.states.index(alias.src)
        if alias.offset == -1:
            value, rows_of = f"{final}[{k}]", "the last row"
        elif alias.offset == 1:
            value, rows_of = f"{rows}[{kept.index(alias.src)}]", "the rows the steps wrote"
        else:
            value = f"jnp.concatenate([{initial[alias.src]}, {rows}[{kept.index(alias.src)}]])"
            rows_of = "every row, the initial one first"
        w.comment(f"alias: {alias.dst} is {rows_of} of {alias.src}")
        w.assign(w.write(alias.dst), value)
