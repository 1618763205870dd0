"""Elementwise arithmetic: Add/Sub/Mul/Div with Caffe2's two broadcasting modes, Sum, Scale, Clip and
the unary math ops that RNN cells and their gradient nets are built from."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .common import broadcast_shapes, is_symbolic
from .emit import Call, Emitter, EmitWriter, call, codegen_helper, literal
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import (
    GradientContext,
    GradientOps,
    argument,
    gradient_from_input,
    gradient_from_output,
    gradient_op,
    single_gradient,
)
from .registry import Kernel, declare_family, facet, register
from .shape_facts import all_same_shape, output_like_input

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

# Caffe2's `NumericTypes` (elementwise_ops.h); the float-only ops also run on CUDA half. (Caffe2's CPU
# build registers Abs/Exp/Log/Clip for float32 only, Scale/Sqrt for float32 and double; doubles are
# accepted here on purpose, for rnn2jax's float64 verification mode, rnn2jax/checking/verification.py.)
NUMERIC = frozenset(np.dtype(t) for t in (np.int32, np.int64, np.float32, np.float64))
FLOATING = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


_FLOAT_DOUBLE = frozenset(np.dtype(t) for t in (np.float32, np.float64))


def _check_dtypes(op: Op, arrays: Sequence[jax.Array], allowed: frozenset[np.dtype], kind: str) -> None:
    """Caffe2 dispatches on the first input's type among `allowed`; the others must match it."""
    dtypes = [np.dtype(a.dtype) for a in arrays]
    for name, dtype in zip(op.inputs, dtypes, strict=False):
        if dtype not in allowed:
            raise ShapeError(
                f"{op.where}: input '{name}' has dtype {dtype}; {op.type} supports {kind} tensors"
            )
    if len(set(dtypes)) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in zip(op.inputs, dtypes, strict=False))
        raise ShapeError(f"{op.where}: {op.type} inputs must share one dtype, got {listed}")


# --------------------------------------------------------------------------------------------------
# Binary arithmetic


def _legacy_axis(op: Op) -> int:
    """The broadcast axis of legacy mode: `axis`, or the position of `axis_str` in `order`, or -1
    (match B against A's trailing dims). Mirrors BinaryElementwiseWithArgsOp's constructor."""
    axis = op.int("axis", -1)
    axis_str = op.str("axis_str", "")
    order = op.str("order", "NCHW")
    if axis != -1:
        if axis_str:
            raise BadArgumentError(f"{op.where}: arguments 'axis' and 'axis_str' cannot be used together")
        return axis
    if not axis_str:
        return -1
    if len(axis_str) != 1 or axis_str not in order:
        raise BadArgumentError(
            f"{op.where}: argument 'axis_str' = {axis_str!r} is not a single letter of order {order!r}"
        )
    return order.index(axis_str)


def _legacy_b_shape(
    op: Op,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    axis: int,
    names: tuple[str, str] | None = None,
) -> tuple[int, ...]:
    """The shape to view B as so that NumPy broadcasting against A does Caffe2's legacy broadcast
    (elementwise_ops_utils.cc ComputeLegacyBroadcastSizes): B without its leading and trailing
    size-1 dims must equal A's dims starting at `axis` + (number of leading 1s stripped); A is then
    `pre x n x post` and B is `n`, repeated over pre and post. A B of one element is a scalar.
    `names` are the blob names of A and B for messages (default: the op's first two inputs)."""
    if math.prod(b_shape) == 1:
        return ()
    a_name, b_name = names or (op.inputs[0], op.inputs[1])
    if len(b_shape) > len(a_shape):
        raise ShapeError(
            f"{op.where}: with broadcast=1, '{b_name}' {list(b_shape)} may not have more dims than "
            f"'{a_name}' {list(a_shape)}"
        )
    if axis == -1:
        axis = len(a_shape) - len(b_shape)
    if not 0 <= axis <= len(a_shape) - len(b_shape):
        raise ShapeError(
            f"{op.where}: broadcast axis {axis} is outside [0, {len(a_shape) - len(b_shape)}] for "
            f"'{a_name}' {list(a_shape)} and '{b_name}' {list(b_shape)}"
        )
    start = 0
    while start < len(b_shape) and b_shape[start] == 1:
        start += 1
    end = len(b_shape)
    while end > start and b_shape[end - 1] == 1:
        end -= 1
    core = b_shape[start:end]
    first = axis + start
    if tuple(a_shape[first : first + len(core)]) != core:
        raise ShapeError(
            f"{op.where}: broadcast dimension mismatch: '{b_name}' {list(b_shape)} does not match "
            f"'{a_name}' {list(a_shape)} at axis {axis}"
        )
    return (*core, *(1,) * (len(a_shape) - first - len(core)))


def _numpy_shape(
    op: Op, a_shape: tuple[int, ...], b_shape: tuple[int, ...], names: tuple[str, str] | None = None
) -> tuple[int, ...]:
    a_name, b_name = names or (op.inputs[0], op.inputs[1])
    try:
        return broadcast_shapes(a_shape, b_shape)
    except ValueError:
        every = " for every size of their symbolic dims" if is_symbolic((*a_shape, *b_shape)) else ""
        raise ShapeError(
            f"{op.where}: '{a_name}' {list(a_shape)} and '{b_name}' {list(b_shape)} do not "
            f"broadcast{every} (numpy rules, broadcast=0); old nets set broadcast=1 for Caffe2's legacy mode"
        ) from None


def binary(
    op: Op,
    fn: Callable[[jax.Array, jax.Array], jax.Array],
    allowed: frozenset[np.dtype] = NUMERIC,
    kind: str = "int32, int64, float and double",
) -> Kernel:
    """A two-input op with Caffe2's broadcasting (Add/Sub/Mul/Div, comparisons, logical ops):
    `broadcast`=0 is NumPy broadcasting, 1 the legacy suffix/axis broadcast whose output has A's shape.
    `axis`/`axis_str`/`order` matter only in legacy mode. Both inputs must have one dtype of `allowed`."""
    legacy = op.bool("broadcast", False)
    axis = _legacy_axis(op) if legacy else -1

    def kernel(a, b):
        _check_dtypes(op, (a, b), allowed, kind)
        if legacy:
            _legacy_b_shape(op, a.shape, b.shape, axis)  # Caffe2's checks; broadcast_like views B alike
            a, b = jnp.asarray(a), broadcast_like(b, a, axis)
        else:
            shape = _numpy_shape(op, a.shape, b.shape)
            a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
        return fn(a, b)

    return kernel


@codegen_helper
def broadcast_like(b: jax.Array, a: jax.Array, axis: int = -1) -> jax.Array:
    """Caffe2's legacy broadcast (broadcast=1) of B over A: B without its leading and trailing 1s matches A's
    dims from `axis` (-1: A's last dims) and repeats over the others; a B of one element is a scalar."""
    if math.prod(b.shape) == 1:
        return jnp.broadcast_to(jnp.reshape(b, ()), a.shape)
    start, end = 0, b.ndim
    while b.shape[start] == 1:
        start += 1
    while b.shape[end - 1] == 1:
        end -= 1
    first = (a.ndim - b.ndim if axis == -1 else axis) + start
    core = b.shape[start:end]
    return jnp.broadcast_to(jnp.reshape(b, (*core, *(1,) * (a.ndim - first - len(core)))), a.shape)


def binary_emitter(fn: str | Callable[..., jax.Array]) -> Emitter:
    """The emitter of a `binary` op computing `fn` (a jnp function's name, or a `@codegen_helper`): NumPy
    broadcasting is jnp's own; broadcast=1 views B over A first."""

    def emit(w: EmitWriter, op: Op, xs: list[str]) -> Call:
        a, b = xs
        if op.bool("broadcast", False):
            axis = _legacy_axis(op)
            b = call(w.helper(broadcast_like), b, a, *((literal(axis),) if axis != -1 else ())).flat()
        return call(fn if isinstance(fn, str) else w.helper(fn), a, b)

    return emit


@codegen_helper
def divide(a: jax.Array, b: jax.Array) -> jax.Array:
    """Caffe2's Div: integers truncate toward zero (C++ `/`, lax.div), unlike Python's floor division."""
    if jnp.issubdtype(a.dtype, jnp.integer):
        return jax.lax.div(a, b)
    return a / b


@register("Add", inputs=2, shape_rule=all_same_shape, emitter=binary_emitter("jnp.add"))
def add(op: Op) -> Kernel:
    return binary(op, jnp.add)


@facet("gradient", "Add")
def _binary_gradient_maker(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(dC, A, B) -> dA, dB`."""
    return [gradient_op(g.op.type + "Gradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1)])]


@register(
    "Sub",
    inputs=2,
    shape_rule=all_same_shape,
    gradient=_binary_gradient_maker,
    emitter=binary_emitter("jnp.subtract"),
)
def sub(op: Op) -> Kernel:
    return binary(op, jnp.subtract)


@register(
    "Mul",
    inputs=2,
    shape_rule=all_same_shape,
    gradient=_binary_gradient_maker,
    emitter=binary_emitter("jnp.multiply"),
)
def mul(op: Op) -> Kernel:
    return binary(op, jnp.multiply)


@register(
    "Div",
    inputs=2,
    shape_rule=all_same_shape,
    emitter=binary_emitter(divide),
    gradient=single_gradient("DivGradient", "GO(0) I(0) I(1) O(0)", "GI(0) GI(1)"),
)
def div(op: Op) -> Kernel:
    return binary(op, divide)


# --------------------------------------------------------------------------------------------------
# Gradients of the binary arithmetic ops


def _sum_to(g: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sum `g` down to `shape`, a shape that broadcasts to g's (right-aligned): the leading dims g
    has in excess and the dims where `shape` is 1 are summed (ComputeBinaryBroadcastBackwardAxes)."""
    lead = g.ndim - len(shape)
    ones = [lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1]
    axes = (*range(lead), *ones)
    return jnp.reshape(jnp.sum(g, axis=axes, dtype=g.dtype) if axes else g, shape)


def _gradient_views(
    op: Op, a: jax.Array, b: jax.Array, legacy: bool, axis: int, names: tuple[str, str]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape of the forward output C, shape to view B as) under the forward op's broadcast mode:
    legacy mode makes C A-shaped and B an `n` block of A's `pre x n x post`; numpy mode broadcasts."""
    if legacy:
        return tuple(a.shape), _legacy_b_shape(op, a.shape, b.shape, axis, names)
    return _numpy_shape(op, a.shape, b.shape, names), tuple(b.shape)


def _check_like(op: Op, name: str, x: jax.Array, shape: tuple[int, ...], what: str) -> jax.Array:
    """Caffe2 reads the output (gradient) blobs as flat C-shaped buffers; the sizes must agree."""
    if x.size != math.prod(shape):
        raise ShapeError(
            f"{op.where}: {what} '{name}' {list(x.shape)} does not have the forward output's "
            f"shape {list(shape)}"
        )
    return jnp.reshape(x, shape)


# (dC, A, B, C) -> (dA, dB), each still C-shaped (or broadcasting to it) before the reduction.
Backward = Callable[[jax.Array, jax.Array, jax.Array, jax.Array | None], tuple[jax.Array, jax.Array]]


def binary_gradient(op: Op, backward: Backward) -> Kernel:
    """`<Op>Gradient(dC, A, B[, C]) -> (dA, dB)` (BinaryElementwiseWithArgsGradientOp): the forward
    op's `broadcast`/`axis`/`axis_str`/`order` say how A and B were broadcast; each elementwise
    derivative is summed back over the broadcast dims to its input's shape."""
    legacy = op.bool("broadcast", False)
    axis = _legacy_axis(op) if legacy else -1
    names = (op.inputs[1], op.inputs[2])

    def kernel(dc, a, b, c=None):
        arrays = (dc, a, b) if c is None else (dc, a, b, c)
        _check_dtypes(op, arrays, NUMERIC, "int32, int64, float and double")
        c_shape, b_view = _gradient_views(op, a, b, legacy, axis, names)
        dc = _check_like(op, op.inputs[0], dc, c_shape, "output gradient")
        if c is not None:
            c = _check_like(op, op.inputs[3], c, c_shape, "output")
        da, db = backward(dc, a, jnp.reshape(b, b_view), c)
        da = _sum_to(jnp.broadcast_to(da, c_shape), a.shape)
        db = _sum_to(jnp.broadcast_to(db, c_shape), b_view)
        return da, jnp.reshape(db, b.shape)

    return kernel


@register("AddGradient", inputs=3, outputs=2)
def add_gradient(op: Op) -> Kernel:
    return binary_gradient(op, lambda dc, a, b, c: (dc, dc))


@register("SubGradient", inputs=3, outputs=2)
def sub_gradient(op: Op) -> Kernel:
    return binary_gradient(op, lambda dc, a, b, c: (dc, -dc))


@register("MulGradient", inputs=3, outputs=2)
def mul_gradient(op: Op) -> Kernel:
    return binary_gradient(op, lambda dc, a, b, c: (dc * b, dc * a))


def _div_backward(dc, a, b, c):
    """dA = dC / B, dB = -dC·C / B, in Caffe2's order of evaluation (integers truncate)."""
    b = jnp.broadcast_to(b, dc.shape)  # lax.div does not broadcast
    return divide(dc, b), divide(-dc * c, b)


@register("DivGradient", inputs=(3, 4), outputs=2)
def div_gradient(op: Op) -> Kernel:
    """Two layouts (elementwise_div_op.cc): `(dC, A, B, C)` from the current maker, and the
    pre-2018 `(B, C, dC)`, where A's shape is taken to be C's (dA gets C's shape)."""
    if len(op.inputs) == 4:
        return binary_gradient(op, _div_backward)
    legacy = op.bool("broadcast", False)
    axis = _legacy_axis(op) if legacy else -1
    names = (op.inputs[1], op.inputs[0])

    def kernel(b, c, dc):
        _check_dtypes(op, (b, c, dc), NUMERIC, "int32, int64, float and double")
        c_shape, b_view = _gradient_views(op, c, b, legacy, axis, names)
        c = _check_like(op, op.inputs[1], c, c_shape, "output")
        dc = _check_like(op, op.inputs[2], dc, c_shape, "output gradient")
        da, db = _div_backward(dc, None, jnp.reshape(b, b_view), c)
        return jnp.broadcast_to(da, c_shape), jnp.reshape(_sum_to(db, b_view), b.shape)

    return kernel


@register("SumReduceLike", inputs=2, gradient=NO_GRADIENT)
def sum_reduce_like(op: Op) -> Kernel:
    """Pre-2018 broadcast gradients: sum A down to B's shape, B placed in A as by the legacy
    broadcast (`axis`/`axis_str`/`order`; a one-element B takes the sum of all of A). Only B's
    shape is read; the output has A's float type (elementwise_ops.cc SumReduceLikeOp)."""
    axis = _legacy_axis(op)

    def kernel(a, b):
        _check_dtypes(op, (a,), _FLOAT_DOUBLE, "float and double")
        b_view = _legacy_b_shape(op, a.shape, b.shape, axis)
        return jnp.reshape(_sum_to(a, b_view), b.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# Sum, Scale, Clip


@register("Sum", inputs=(1, None), shape_rule=all_same_shape)
def sum_(op: Op) -> Kernel:
    """`Sum(x0, x1, ...)`: all inputs must have x0's shape (no broadcasting); one input is a copy."""

    def kernel(*xs):
        if len(xs) == 1:
            return jnp.asarray(xs[0])
        _check_dtypes(op, xs, NUMERIC, "int32, int64, float and double")
        for name, x in zip(op.inputs[1:], xs[1:], strict=True):
            if x.shape != xs[0].shape:
                raise ShapeError(
                    f"{op.where}: input '{name}' {list(x.shape)} must have the shape of "
                    f"'{op.inputs[0]}' {list(xs[0].shape)}"
                )
        return functools.reduce(jnp.add, xs)

    return kernel


@facet("emitter", "Sum")
def emit_sum(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    """One input is a copy; more are added left to right, as the kernel's reduce adds them."""
    if len(xs) == 1:
        return call("jnp.asarray", xs[0])
    value = call("jnp.add", xs[0], xs[1])
    for x in xs[2:]:
        value = call("jnp.add", value.flat(), x)
    return value


@facet("gradient", "Sum")
def _sum_gradient_maker(g: GradientContext) -> GradientOps:
    """Every input's gradient is the output's, passed through with no op."""
    for i in range(len(g.op.input)):
        g.set_dense(i, g.GO(0))
    return []


@register("Scale", shape_rule=output_like_input)
def scale(op: Op) -> Kernel:
    """`Y = scale·X`, `scale` (1.0) a float applied in X's float type."""
    factor = op.float("scale", 1.0)

    def kernel(x):
        _check_dtypes(op, (x,), _FLOAT_DOUBLE, "float and double")
        return x * jnp.asarray(factor, x.dtype)

    return kernel


@facet("gradient", "Scale")
def _same_op_gradient_maker(g: GradientContext) -> GradientOps:
    """The op itself, on dY: both are linear."""
    return [gradient_op(g.op.type, [g.GO(0)], [g.GI(0)])]


_FLOAT_LOWEST = float(np.finfo(np.float32).min)
_FLOAT_MAX = float(np.finfo(np.float32).max)


@register("Clip", shape_rule=output_like_input, gradient=gradient_from_output)
def clip(op: Op) -> Kernel:
    """`Y = min(max(X, min), max)`; `min`/`max` default to the lowest/largest float
    (caffe2/operators/clip_op.h). With min > max every element becomes max, as in Caffe2."""
    low = op.float("min", _FLOAT_LOWEST)
    high = op.float("max", _FLOAT_MAX)

    def kernel(x):
        _check_dtypes(op, (x,), FLOATING, "float")
        return jnp.minimum(jnp.maximum(x, jnp.asarray(low, x.dtype)), jnp.asarray(high, x.dtype))

    return kernel


# --------------------------------------------------------------------------------------------------
# Unary math


def unary(op: Op, fn: Callable[[jax.Array], jax.Array], allowed: frozenset[np.dtype], kind: str) -> Kernel:
    def kernel(x):
        _check_dtypes(op, (x,), allowed, kind)
        return fn(x)

    return kernel


@register("Negative", shape_rule=output_like_input, gradient=_same_op_gradient_maker)
def negative(op: Op) -> Kernel:
    return unary(op, jnp.negative, NUMERIC, "int32, int64, float and double")


@register("Abs", shape_rule=output_like_input, gradient=gradient_from_input)
def abs_(op: Op) -> Kernel:
    return unary(op, jnp.abs, FLOATING, "float")


@register("Exp", shape_rule=output_like_input, gradient=single_gradient("Mul", "O(0) GO(0)"))
def exp(op: Op) -> Kernel:
    return unary(op, jnp.exp, FLOATING, "float")


@register("Log", shape_rule=output_like_input, gradient=single_gradient("Div", "GO(0) I(0)"))
def log(op: Op) -> Kernel:
    return unary(op, jnp.log, FLOATING, "float")


@register("Sqrt", shape_rule=output_like_input)
def sqrt(op: Op) -> Kernel:
    return unary(op, jnp.sqrt, _FLOAT_DOUBLE, "float and double")


@facet("gradient", "Sqrt")
def _sqrt_gradient_maker(g: GradientContext) -> GradientOps:
    """dX = (0.5 · dY) / Y, in place on GI(0)."""
    return [
        gradient_op("Scale", [g.GO(0)], [g.GI(0)], [argument("scale", 0.5)]),
        gradient_op("Div", [g.GI(0), g.O(0)], [g.GI(0)]),
    ]


# --------------------------------------------------------------------------------------------------
# Gradients of Abs and Clip (the other unary gradients are built from Mul/Div/Scale/Negative)


def _unary_gradient_inputs(op: Op, first: jax.Array, dy: jax.Array) -> jax.Array:
    """Both float of one dtype and one size; dY is read flat in the first input's shape."""
    _check_dtypes(op, (first, dy), FLOATING, "float")
    if dy.size != first.size:
        raise ShapeError(
            f"{op.where}: {op.type} needs '{op.inputs[0]}' {list(first.shape)} and '{op.inputs[1]}' "
            f"{list(dy.shape)} of one size"
        )
    return jnp.reshape(dy, first.shape)


@register("AbsGradient", inputs=2)
def abs_gradient(op: Op) -> Kernel:
    """`(X, dY) -> dX = sign(X)·dY`, 0 where X is 0 (caffe2/operators/abs_op.cc)."""

    def kernel(x, dy):
        dy = _unary_gradient_inputs(op, x, dy)
        zero = jnp.zeros((), dy.dtype)
        return jnp.where(x == 0, zero, jnp.where(x > 0, dy, -dy))

    return kernel


@register("ClipGradient", inputs=2)
def clip_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dX = dY where min < Y < max, else 0` (caffe2/operators/clip_op.cc): the test is on
    the clipped output, so elements at a bound get no gradient."""
    low = op.float("min", _FLOAT_LOWEST)
    high = op.float("max", _FLOAT_MAX)

    def kernel(y, dy):
        dy = _unary_gradient_inputs(op, y, dy)
        inside = (y > jnp.asarray(low, y.dtype)) & (y < jnp.asarray(high, y.dtype))
        return jnp.where(inside, dy, jnp.zeros((), dy.dtype))

    return kernel
