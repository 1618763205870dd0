"""The facet vocabulary of the op registry: what an op's record says about a facet it has none of (`Absent`,
with the absences most families state named once), what it reads its inputs as (`Roles`), and the facets'
names (`FACETS`). Family modules state their absences in these words (`declare_family`); the scoreboard,
shape inference and codegen read them off the records."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..ir.netdef import Op


@dataclass(frozen=True)
class Absent:
    """A facet an op has none of, and why (the scoreboard prints the reason). Falsy, like a missing value."""

    why: str

    def __bool__(self) -> bool:
        return False


UNSTATED = Absent("unstated")  # what a facet nobody stated holds; the scoreboard test fails on it

Positions = tuple[int, ...] | slice | Callable[[Op], Iterable[int]]


def _positions(positions: Positions, op: Op) -> list[int]:
    if callable(positions):
        return [p for p in positions(op) if p < len(op.inputs)]
    if isinstance(positions, slice):
        return list(range(len(op.inputs)))[positions]
    return [p for p in positions if p < len(op.inputs)]


@dataclass(frozen=True)
class Roles:
    """What an op reads some of its inputs as, beyond float values: sequence lengths (int32 in [0, T]) and
    other integers (indices, values compared with a timestep). `verify`, `compare` and shape inference draw
    or declare such blobs as integers. Positions are a tuple, a slice, or a function of the op (for roles
    that depend on its arguments)."""

    lengths: Positions = ()
    integers: Positions = ()

    def length_inputs(self, op: Op) -> list[str]:
        return [op.inputs[p] for p in _positions(self.lengths, op)]

    def integer_inputs(self, op: Op) -> list[str]:
        return [op.inputs[p] for p in _positions(self.integers, op)]


NO_ROLES = Roles()  # every input is a value: the explicit statement of an op without roles

# The absences most families state, named once (each family still says which of them holds for its ops).
NO_SHAPE_RULE = Absent("no shape rule: shape inference does not guess this op's inputs")
NO_EMITTER = Absent("codegen does not write this op")
GRADIENT_OP = Absent("a gradient op: Caffe2 registers no gradient for it")
NO_GRADIENT = Absent("Caffe2 registers no gradient for it")
HOST_OP_NO_SHAPE_RULE = Absent("host op: shape inference traces no host op")
HOST_OP_NO_EMITTER = Absent("host op: codegen writes only jitted code")

FACETS = ("roles", "shape_rule", "gradient", "emitter")
