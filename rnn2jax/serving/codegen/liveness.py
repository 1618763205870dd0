"""Which blobs are still needed after each op: the generator writes only ops whose outputs are read."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ...ir.netdef import Op


def live_after(
    ops: Sequence[Op], wanted: Iterable[str], reads: Callable[[Op], Iterable[str]]
) -> tuple[list[set[str]], set[str]]:
    """For each op, the blobs still needed after it; and the blobs needed before the first op."""
    live = set(wanted)
    after: list[set[str]] = [set() for _ in ops]
    for position in reversed(range(len(ops))):
        op = ops[position]
        after[position] = set(live)
        if live & set(op.outputs):
            live -= set(op.outputs)
            live |= set(reads(op))
    return after, live
