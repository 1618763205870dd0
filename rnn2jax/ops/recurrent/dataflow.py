"""Who writes and who reads a blob in a step net's op list: the questions every step-net rewrite asks
(fusion.py, deferred.py) before it may move or merge ops."""

from __future__ import annotations

from collections.abc import Sequence

from ...ir.netdef import Op


def last_writer(ops: Sequence[Op], name: str, before: int) -> int | None:
    """Position of the last op before `before` that writes `name`."""
    for i in range(before - 1, -1, -1):
        if name in ops[i].outputs:
            return i
    return None


def readers(ops: Sequence[Op], name: str, writer: int) -> list[int]:
    """Ops that read the value `ops[writer]` wrote to `name`, up to and including the op that
    overwrites it (which reads first: Caffe2's in-place Sum)."""
    found = []
    for i in range(writer + 1, len(ops)):
        if name in ops[i].inputs:
            found.append(i)
        if name in ops[i].outputs:
            break
    return found
