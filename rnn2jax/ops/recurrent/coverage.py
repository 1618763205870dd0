"""Which recurrent-state rows a RecurrentNetwork's steps write, and refusing reads of the others.

Caffe2 gives each recurrent state a tensor of T + L rows and fills only its L initial rows; every other
row holds whatever that memory held until a step writes it through a link (`rnn_internal_apply_link`
makes a link's internal blob a view of rows [t + offset, t + offset + window)). A step net that never
writes a state's rows, or reads rows before any step wrote them, or an alias that exposes them, gives
answers that depend on uninitialised memory (1.7e11 in one run, zeros in another). rnn2jax refuses
those nets when it traces the op (T and L are then known) instead of answering with zeros.

The analysis is closed-form in T: with the links' offsets o and windows w, step t reads and writes the
rows t + o .. t + o + w - 1, so whether a row is written before it is read reduces to comparisons of
offsets and windows (no loop over steps). A symbolic T (an export for every T) is checked as a T
larger than any offset: a net is refused if some T would read unwritten rows.

`unwritten_fill` is the test-only switch of `tests/fuzz/contract.py`: inside `filling_unwritten(v)`,
the rows Caffe2 leaves uninitialised start as `v` instead of zeros, so an answer that still depends
on them (a case this analysis misses) changes with `v`. Off by default; when off it costs nothing.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

from ...errors import UnwrittenStateError
from ...ir.netdef import Net, Op
from .spec import Link, RecurrentSpec

# A symbolic T (jax.export) is checked as this many steps: larger than any offset or window that fits.
_SYMBOLIC_STEPS = 2**40

# Concrete T replayed exactly up to this many steps (past the links' reach every T behaves alike).
_REPLAYED_STEPS = 4096

_FILL: ContextVar[float | None] = ContextVar("rnn2jax_unwritten_fill", default=None)


@contextlib.contextmanager
def filling_unwritten(value: float) -> Iterator[None]:
    """Test-only: within this scope, lowerings traced here start the state rows Caffe2 leaves
    uninitialised (and the gradient rows it does not zero) as `value` instead of 0. Nets compiled
    here keep the value baked in; compile again outside the scope for the normal behaviour."""
    token = _FILL.set(value)
    try:
        yield
    finally:
        _FILL.reset(token)


def unwritten_fill() -> float | None:
    """The value of `filling_unwritten`'s scope, or None (the default: zeros)."""
    return _FILL.get()


def _as_int(value: object) -> int | None:
    try:
        return int(value)  # a symbolic dimension refuses
    except Exception:  # jax's symbolic dimensions raise their own error types
        return None


def _reads(op: Op) -> set[str]:
    """What an op reads: its inputs, and what the nets it carries read (by name, from its workspace)."""
    names = set(op.inputs)
    for _, net in op.nested_nets():
        names.update(n for inner in net.walk() for n in inner.inputs)
    return names


def _first_writers(net: Net, links: list[Link]) -> dict[Link, int]:
    """Each link whose internal blob a step op writes, with the position of the first such op."""
    found = {}
    for link in links:
        for position, o in enumerate(net.ops):
            if link.internal in o.outputs:
                found[link] = position
                break
    return found


def _steps(steps: object) -> int:
    value = _as_int(steps)
    return _SYMBOLIC_STEPS if value is None else value


def _first_unwritten_read(
    read: Link, position: int, written: Mapping[Link, int], initial: int, steps: int
) -> tuple[int, int] | None:
    """(step, row) of the first read of an unwritten row through `read` by the op at `position`, if any.
    Row r = t + read.offset + i (0 <= i < window) is defined at step t when r < L (an initial row), when
    a link m written before `position` in the same step covers it (0 <= d + i < m.window, with
    d = read.offset - m.offset), or when a step before t wrote it (d + i <= m.window - 2 and
    t >= max(1, -(d + i)))."""
    for i in range(read.window):
        if any(p < position and 0 <= read.offset - m.offset + i < m.window for m, p in written.items()):
            continue
        earliest = math.inf
        for m in written:
            d = read.offset - m.offset + i
            if d <= m.window - 2:
                earliest = min(earliest, max(1, -d))
        first = max(0, initial - read.offset - i)
        if first < min(steps, earliest):
            return first, first + read.offset + i
    return None


def check_forward_rows(spec: RecurrentSpec, initial: Mapping[str, int], steps: object) -> None:
    """Refuse a RecurrentNetwork whose steps read, or whose aliases expose, state rows no step writes."""
    op, net = spec.op, spec.step_net
    t_count = _steps(steps)
    if t_count == 0:
        return
    for state in spec.states:
        rows = _as_int(initial[state])
        if rows is None:
            continue
        links = [link for link in spec.links if link.external == state]
        written = _first_writers(net, links)
        for position, step_op in enumerate(net.ops):
            reads = _reads(step_op)
            for link in links:
                if link.internal not in reads:
                    continue
                found = _first_unwritten_read(link, position, written, rows, t_count)
                if found is not None:
                    raise UnwrittenStateError(
                        f"{step_op.where} reads '{link.internal}' (argument 'link_internal' of the "
                        f"{op.type}, a view of recurrent state '{state}' at 'link_offset' {link.offset}), but at "
                        f"step {found[0]} "
                        f"row {found[1]} of '{state}' is neither one of its {rows} initial rows nor written by "
                        f"an earlier step; {_written_by(written, state)}. Caffe2 reads uninitialised memory there"
                    )
        top = max((m.offset + m.window for m in written), default=None)
        for alias in spec.aliases:
            if alias.src != state:
                continue
            exposes_steps = alias.offset < 0 or alias.offset < t_count + rows
            if exposes_steps and (top is None or top < rows + 1):
                raise UnwrittenStateError(
                    f"{op.where}: output '{alias.dst}' (argument 'alias_dst', 'alias_src' '{state}', "
                    f"'alias_offset' {alias.offset}) exposes rows of recurrent state '{state}' that no step "
                    f"writes: {_written_by(written, state)}, and the last row ({rows} initial + T - 1) is never "
                    "written. Caffe2 returns uninitialised memory there"
                )


def _written_by(written: Mapping[Link, int], state: str) -> str:
    if not written:
        return f"the step net writes no link of '{state}' (no op writes a 'link_internal' blob of it)"
    views = ", ".join(f"'{m.internal}' (offset {m.offset}, window {m.window})" for m in written)
    return f"the step net writes '{state}' only through {views}"


def check_backward_reads(
    op: Op, spec: RecurrentSpec, backward: Net, state_rows: Mapping[str, int], steps: object
) -> None:
    """Refuse a RecurrentNetworkGradient whose backward step net reads, through a forward link, state
    rows that the forward steps never wrote (rows L .. of the forward op's state tensors)."""
    t_count = _steps(steps)
    if t_count == 0:
        return
    reads = set().union(*(_reads(o) for o in backward.ops)) if backward.ops else set()
    for state in spec.states:
        total = _as_int(state_rows.get(state))
        if total is None:
            continue
        rows = total - t_count if _as_int(steps) is not None else None
        if rows is None:
            continue
        links = [link for link in spec.links if link.external == state]
        written = _first_writers(spec.step_net, links)
        top = max((m.offset + m.window for m in written), default=-math.inf)
        defined_below = t_count - 1 + top  # rows [L, T - 1 + top) are written by some step
        for link in links:
            if link.internal not in reads:
                continue
            lowest = max(link.offset, rows, defined_below)
            if lowest < t_count - 1 + link.offset + link.window:
                raise UnwrittenStateError(
                    f"{op.where}: the backward_step_net reads '{link.internal}' (argument 'link_internal', a "
                    f"view of recurrent state '{state}' at 'link_offset' {link.offset}), but row {int(lowest)} "
                    f"of '{state}' is neither an initial row nor written by a forward step; "
                    f"{_written_by(written, state)}. Caffe2 reads uninitialised memory there"
                )



def check_gradient_rows(
    op: Op,
    backward: Net,
    links: list[Link],
    gradients: Mapping[str, tuple[int, int]],
    accumulated: set[str],
    steps: object,
) -> None:
    """Refuse a RecurrentNetworkGradient whose backward steps read, or whose outputs hold, gradient rows no
    backward step writes. `gradients` maps each gradient tensor (a state's, then the input sequence's) to
    (its rows beyond T: a state's L, 0 for the sequence; the rows it outputs from row 0: L, or T). A state
    gradient's last row starts at zero (Caffe2 zeroes it); every other row is uninitialised in Caffe2 until
    a step writes it through a backward link. `accumulated` are the state gradients an `_all` output's
    gradient is added to (row t + 1 at step t, before the step's ops).

    The steps run from T - 1 down to 0, each reading and writing the same rows relative to t, so every T
    past the links' reach behaves alike: the check replays T steps, or that reach when T is longer or
    symbolic (the rows it names are then those of a net of that many steps)."""
    t_count = _steps(steps)
    if t_count == 0 or not gradients:
        return
    reach = 2 * max((abs(link.offset) + link.window for link in links), default=1) + 4
    t_count = min(t_count, max(reach, _REPLAYED_STEPS) if _as_int(steps) is not None else reach)
    first = {name: _first_writers(backward, [lk for lk in links if lk.external == name]) for name in gradients}
    defined = {name: {t_count + extra - 1} if extra else set() for name, (extra, _) in gradients.items()}
    for t in range(t_count - 1, -1, -1):
        for name in accumulated:
            if t + 1 not in defined[name]:
                raise _unwritten_gradient(op, name, first[name], t, t + 1, "its '_all' output's gradient is added")
        for position, step_op in enumerate(backward.ops):
            reads = _reads(step_op)
            for link in (lk for lk in links if lk.external in defined):
                rows = range(t + link.offset, t + link.offset + link.window)
                missing = [r for r in rows if r not in defined[link.external]] if link.internal in reads else []
                if missing:
                    use = (
                        f"{step_op.where} reads it through '{link.internal}' (argument 'backward_link_internal', "
                        f"'backward_link_offset' {link.offset})"
                    )
                    raise _unwritten_gradient(op, link.external, first[link.external], t, missing[0], use)
                if first[link.external].get(link) == position:
                    defined[link.external].update(rows)
    for name, (_, outputs) in gradients.items():
        count = _as_int(outputs)
        missing = [r for r in range(t_count if count is None else min(count, t_count)) if r not in defined[name]]
        if missing:
            raise _unwritten_gradient(op, name, first[name], None, missing[0], "the op outputs it")


def _unwritten_gradient(
    op: Op, name: str, written: Mapping[Link, int], step: int | None, row: int, use: str
) -> UnwrittenStateError:
    by = (
        "no backward step op writes a 'backward_link_internal' blob of it"
        if not written
        else "the backward step net writes it only through "
        + ", ".join(f"'{m.internal}' (offset {m.offset}, window {m.window})" for m in written)
    )
    when = f"at step {step}" if step is not None else "after the last step"
    return UnwrittenStateError(
        f"{op.where}: row {row} of gradient '{name}' is needed {when} ({use}), but no backward step writes it: "
        f"{by}. Caffe2 leaves that row uninitialised, so its answer there is whatever memory held"
    )
