"""What a net uses a blob as, told by the ops that read it: sequence lengths (int32 in [0, T]) and other
integer blobs (indices, compared values). `verify`, `compare` and shape inference draw or declare such
blobs as integers instead of floats. Each op states its own in its `roles` facet (`Roles`, in its family
module), so the three agree and a new op says it where it is registered."""

from __future__ import annotations

from collections.abc import Iterator

from ..ir.netdef import Net, Op
from .facets import Roles
from .registry import record_for


def _roles(net: Net) -> Iterator[tuple[Op, Roles]]:
    """Each op of the net (step nets included) with the roles its record states (none for ops without)."""
    for op in net.walk():
        opdef = record_for(op)  # an engine variant's record: the op it runs
        if opdef is not None and isinstance(opdef.roles, Roles):
            yield op, opdef.roles


def length_blobs(net: Net) -> set[str]:
    """Blobs the net (step nets included) reads as sequence lengths."""
    return {name for op, roles in _roles(net) for name in roles.length_inputs(op)}


def integer_blobs(net: Net) -> set[str]:
    """Blobs the net (step nets included) reads as integers: lengths, compared values and indices."""
    return {name for op, roles in _roles(net) for name in (*roles.length_inputs(op), *roles.integer_inputs(op))}
