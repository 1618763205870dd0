"""Comparison and logical ops (GT/LT/GE/LE/EQ/NE, And/Or/Xor, Not): the bool masks that RNN step nets
build from sequence lengths and the timestep, with Add/Mul's two broadcasting modes."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..ir.netdef import Op
from .elementwise import binary, binary_emitter, unary
from .facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import should_not_do_gradient
from .registry import Kernel, declare_family, facet, register
from .shape_facts import Context, Guesses, Solver, Spec

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

# caffe2/operators/elementwise_ops.cc: comparisons dispatch on bool/int32/int64/float/double and always
# output bool; the logical ops take and give bool only (BoolTypes).
_COMPARABLE = frozenset(np.dtype(t) for t in (np.bool_, np.int32, np.int64, np.float32, np.float64))
_BOOL = frozenset({np.dtype(np.bool_)})


def _comparison(op: Op, fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Kernel:
    return binary(op, fn, _COMPARABLE, "bool, int32, int64, float and double")


def _logical(op: Op, fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Kernel:
    return binary(op, fn, _BOOL, "bool")


@register("EQ", inputs=2, gradient=should_not_do_gradient, emitter=binary_emitter("jnp.equal"))
def eq(op: Op) -> Kernel:
    return _comparison(op, jnp.equal)


@register("NE", inputs=2, gradient=should_not_do_gradient, emitter=binary_emitter("jnp.not_equal"))
def ne(op: Op) -> Kernel:
    return _comparison(op, jnp.not_equal)


@register("LT", inputs=2, gradient=should_not_do_gradient, emitter=binary_emitter("jnp.less"))
def lt(op: Op) -> Kernel:
    return _comparison(op, jnp.less)


@register("LE", inputs=2, gradient=should_not_do_gradient, emitter=binary_emitter("jnp.less_equal"))
def le(op: Op) -> Kernel:
    return _comparison(op, jnp.less_equal)


@register("GT", inputs=2, gradient=should_not_do_gradient, emitter=binary_emitter("jnp.greater"))
def gt(op: Op) -> Kernel:
    return _comparison(op, jnp.greater)


@register("GE", inputs=2, gradient=should_not_do_gradient, emitter=binary_emitter("jnp.greater_equal"))
def ge(op: Op) -> Kernel:
    return _comparison(op, jnp.greater_equal)


# Step nets compare a value (sequence lengths, say) with the timestep to make their masks.
facet("roles", "LT", "LE", "GT", "GE")(Roles(integers=(0,)))


@facet("shape_rule", "LT", "LE", "GT", "GE")
def compared_with_timestep(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """GT/LE/... of lengths against the timestep ([1], broadcast): the lengths are [N] (BasicRNN's masks)."""
    if len(ins) != 2 or ins[0] is not None or ins[1] is None or ctx.batch is None:
        return {}, {}
    if op.int("broadcast", 0) and ins[1].shape == (1,):
        return {0: Spec((ctx.batch,), ins[1].dtype)}, {}
    return {}, {}


@register("And", inputs=2, gradient=should_not_do_gradient)
def and_(op: Op) -> Kernel:
    return _logical(op, jnp.logical_and)


@register("Or", inputs=2, gradient=should_not_do_gradient)
def or_(op: Op) -> Kernel:
    return _logical(op, jnp.logical_or)


@register("Xor", inputs=2, gradient=should_not_do_gradient)
def xor(op: Op) -> Kernel:
    return _logical(op, jnp.logical_xor)


@register("Not", gradient=should_not_do_gradient)
def not_(op: Op) -> Kernel:
    """Elementwise logical negation of a bool tensor."""
    return unary(op, jnp.logical_not, _BOOL, "bool")
