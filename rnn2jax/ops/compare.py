"""Comparison and logical ops (GT/LT/GE/LE/EQ/NE, And/Or/Xor, Not): the bool masks that RNN step nets
build from sequence lengths and the timestep, with Add/Mul's two broadcasting modes."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..ir.netdef import Op
from .elementwise import binary, unary
from .registry import NO_ROLES, Absent, Kernel, declare_family, register

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=Absent("no shape rule: shape inference does not guess this op's inputs"),
    gradient=Absent("no builder gradient maker"),
    emitter=Absent("codegen does not write this op"),
)

# caffe2/operators/elementwise_ops.cc: comparisons dispatch on bool/int32/int64/float/double and always
# output bool; the logical ops take and give bool only (BoolTypes).
_COMPARABLE = frozenset(np.dtype(t) for t in (np.bool_, np.int32, np.int64, np.float32, np.float64))
_BOOL = frozenset({np.dtype(np.bool_)})


def _comparison(op: Op, fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Kernel:
    return binary(op, fn, _COMPARABLE, "bool, int32, int64, float and double")


def _logical(op: Op, fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Kernel:
    return binary(op, fn, _BOOL, "bool")


@register("EQ", inputs=2)
def eq(op: Op) -> Kernel:
    return _comparison(op, jnp.equal)


@register("NE", inputs=2)
def ne(op: Op) -> Kernel:
    return _comparison(op, jnp.not_equal)


@register("LT", inputs=2)
def lt(op: Op) -> Kernel:
    return _comparison(op, jnp.less)


@register("LE", inputs=2)
def le(op: Op) -> Kernel:
    return _comparison(op, jnp.less_equal)


@register("GT", inputs=2)
def gt(op: Op) -> Kernel:
    return _comparison(op, jnp.greater)


@register("GE", inputs=2)
def ge(op: Op) -> Kernel:
    return _comparison(op, jnp.greater_equal)


@register("And", inputs=2)
def and_(op: Op) -> Kernel:
    return _logical(op, jnp.logical_and)


@register("Or", inputs=2)
def or_(op: Op) -> Kernel:
    return _logical(op, jnp.logical_or)


@register("Xor", inputs=2)
def xor(op: Op) -> Kernel:
    return _logical(op, jnp.logical_xor)


@register("Not")
def not_(op: Op) -> Kernel:
    """Elementwise logical negation of a bool tensor."""
    return unary(op, jnp.logical_not, _BOOL, "bool")
