"""Float16 (caffe2/operators/half_float_ops.h): the casts between float32 and float16 and the two float16
fillers. Float16 stays float16: the fillers write it and FloatToHalf's output is float16, as in Caffe2."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError
from ..ir.budget import check_array
from ..ir.netdef import Op
from .common import shape_arg
from .emit import EmitWriter, codegen_helper
from .facets import NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Absent
from .gradient_makers import no_gradient, single_gradient
from .registry import Kernel, declare_family, facet, register
from .shape_facts import output_like_input

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=NO_SHAPE_RULE,
    gradient=NO_GRADIENT,
    emitter=Absent("codegen does not write the float16 fillers"),
)

_HALF = np.dtype(np.float16)


def _expect(op: Op, x: Any, dtype: np.dtype) -> None:
    """Caffe2's `Input(0).data<T>()`: the input must already be of the type the op converts from."""
    if np.dtype(x.dtype) != dtype:
        raise InputTypeError(
            f"{op.where}: input '{op.inputs[0]}' must be {dtype}, got {np.dtype(x.dtype)} "
            f"(Caffe2: tensor type mismatch)"
        )


@codegen_helper
def float_to_half(x: jax.Array, clip: bool) -> jax.Array:
    """Round to nearest even, as Caffe2's fp16 conversion does. With `clip`, values beyond float16's range
    (inf included) become +-65504 (float16's max) first; NaN becomes -65504, as Caffe2's
    `max(lowest, min(x, max))` does."""
    if clip:
        top = jnp.where(jnp.float32(65504.0) < x, jnp.float32(65504.0), x)
        x = jnp.where(jnp.float32(-65504.0) < top, top, jnp.float32(-65504.0))
    return x.astype(jnp.float16)


@register("FloatToHalf", gradient=single_gradient("HalfToFloat", "GO(0)"), shape_rule=output_like_input)
def float_to_half_op(op: Op) -> Kernel:
    """float32 -> float16; `clip` (false) saturates at float16's largest magnitude instead of overflowing."""
    clip = op.bool("clip", False)

    def kernel(x: jax.Array) -> jax.Array:
        _expect(op, x, np.dtype(np.float32))
        return float_to_half(x, clip)

    return kernel


@register("HalfToFloat", gradient=single_gradient("FloatToHalf", "GO(0)"), shape_rule=output_like_input)
def half_to_float(op: Op) -> Kernel:
    """float16 -> float32 (exact)."""

    def kernel(x: jax.Array) -> jax.Array:
        _expect(op, x, _HALF)
        return x.astype(jnp.float32)

    return kernel


@facet("emitter", "FloatToHalf", "HalfToFloat")
def emit_half_casts(w: EmitWriter, op: Op, xs: list[str]) -> str:
    """The cast, written out (FloatToHalf through the lowering's `float_to_half`)."""
    if op.type == "HalfToFloat":
        return f"jnp.asarray({xs[0]}).astype(jnp.float32)"
    return f"{w.helper(float_to_half)}(jnp.asarray({xs[0]}), {op.bool('clip', False)!r})"


def _fill_shape(op: Op) -> tuple[int, ...]:
    shape = shape_arg(op, "shape") if op.has("shape") else ()
    check_array(op.where, op.outputs[0], shape, _HALF)
    return shape


@register("Float16ConstantFill", inputs=0, gradient=no_gradient)
def float16_constant_fill(op: Op) -> Kernel:
    """Every element is `value` (0.0) as float16 (out of range: inf) in `shape` (none: a scalar)."""
    shape = _fill_shape(op)
    with np.errstate(over="ignore"):
        value = np.float16(np.float32(op.float("value", 0.0)))
    return lambda: jnp.full(shape, value, jnp.float16)


@register("Float16UniformFill", inputs=0, random=True, gradient=no_gradient)
def float16_uniform_fill(op: Op) -> Kernel:
    """U[min, max) (0, 1) drawn in float32, then rounded to float16, in `shape`.

    Caffe2 reads the output's dim 0, so it refuses a scalar (no `shape`) and dies of SIGFPE on a zero dim:
    the scalar is refused here too, and a zero dim is an empty output."""
    shape = _fill_shape(op)
    if not shape:
        raise BadArgumentError(f"{op.where}: Float16UniformFill needs a 'shape' of rank >= 1 (Caffe2 reads dim 0)")
    low, high = op.float("min", 0.0), op.float("max", 1.0)
    if not low < high:
        raise BadArgumentError(f"{op.where}: Max value should be bigger than min value ({low} vs {high})")

    def kernel(*, key: jax.Array) -> jax.Array:
        flat = jax.random.uniform(key, (math.prod(shape),), jnp.float32, low, high)
        return flat.reshape(shape).astype(jnp.float16)

    return kernel
