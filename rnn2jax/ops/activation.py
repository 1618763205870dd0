"""Nonlinearities: the elementwise activations RNN cells use, Caffe2's 2-D-coerced Softmax, and the
gradient ops that Caffe2's backward nets run for them."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .common import canonical_axis, size_from_dim, size_to_dim
from .elementwise import FLOATING, unary
from .emit import Call, EmitWriter, call, codegen_helper
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import (
    GradientContext,
    GradientOps,
    gradient_from_input,
    gradient_from_output,
    gradient_op,
    single_gradient,
)
from .registry import Kernel, declare_family, facet, register
from .shape_facts import output_like_input

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

# Caffe2's CPU build registers every op here, and its gradient, for float32 only ("Unsupported type of
# tensor" / "Tensor type mismatch" otherwise). Integers are refused here too; other float types are
# accepted on purpose (float64 for rnn2jax's verification mode, rnn2jax/checking/verification.py).


@register("Sigmoid", shape_rule=output_like_input, gradient=gradient_from_output)
def sigmoid(op: Op) -> Kernel:
    return unary(op, jax.nn.sigmoid, FLOATING, "float")


@register("Tanh", shape_rule=output_like_input, gradient=gradient_from_output)
def tanh(op: Op) -> Kernel:
    return unary(op, jnp.tanh, FLOATING, "float")


@register("Relu", shape_rule=output_like_input, gradient=gradient_from_output)
def relu(op: Op) -> Kernel:
    return unary(op, lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)), FLOATING, "float")


@facet("emitter", "Sigmoid")
def emit_sigmoid(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    return call("jax.nn.sigmoid", xs[0])


@facet("emitter", "Tanh")
def emit_tanh(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    return call("jnp.tanh", xs[0])


@facet("emitter", "Relu")
def emit_relu(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    """The lowering's expression, written out (the zero in x's dtype keeps integer inputs integer)."""
    return call("jnp.maximum", xs[0], f"jnp.zeros((), {xs[0]}.dtype)")


@register("LeakyRelu", shape_rule=output_like_input, gradient=gradient_from_output)
def leaky_relu(op: Op) -> Kernel:
    """`alpha` (0.01, caffe2/operators/leaky_relu_op.h) is the slope for negative inputs; the formula
    is Caffe2's `max(x, 0) + min(x, 0) * alpha`."""
    alpha = op.float("alpha", 0.01)

    def fn(x):
        zero = jnp.zeros((), x.dtype)
        return jnp.maximum(x, zero) + jnp.minimum(x, zero) * jnp.asarray(alpha, x.dtype)

    return unary(op, fn, FLOATING, "float")


@register("Softsign", shape_rule=output_like_input, gradient=gradient_from_input)
def softsign(op: Op) -> Kernel:
    return unary(op, lambda x: x / (1 + jnp.abs(x)), FLOATING, "float")


@register("Softmax", shape_rule=output_like_input, gradient=gradient_from_output)
def softmax(op: Op) -> Kernel:
    """Caffe2 views X as `size_to_dim(axis) x size_from_dim(axis)` and normalises each row, so with
    axis=1 on a 3-D input the softmax runs over the last two dims together, not over one axis."""
    axis = op.int("axis", 1)

    def kernel(x):
        _require_float(op, x, 0)
        return softmax_rows(x, canonical_axis(op, axis, x.ndim))

    return kernel


@codegen_helper
def softmax_rows(x: jax.Array, axis: int = 1) -> jax.Array:
    """Caffe2's Softmax: x viewed as [dims before axis, dims from axis]; each row is normalised (shifted by
    its max first)."""
    axis = axis % x.ndim
    if x.size == 0:
        return x
    rows = jnp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    e = jnp.exp(rows - jnp.max(rows, axis=1, keepdims=True))
    return jnp.reshape(e / jnp.sum(e, axis=1, keepdims=True), x.shape)


@facet("emitter", "Softmax")
def emit_softmax(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    axis = op.int("axis", 1)
    return call(w.helper(softmax_rows), xs[0], **({"axis": axis} if axis != 1 else {}))


# --------------------------------------------------------------------------------------------------
# Gradients: each takes the forward output Y (Softsign: the input X) and dY, both float and of one
# shape (Caffe2 registers them for float only and indexes both by the first input's size).


def _require_float(op: Op, value: jax.Array, index: int) -> None:
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise ShapeError(f"{op.where}: {op.type} takes float inputs, '{op.inputs[index]}' is {value.dtype}")


def _grad_pair(op: Op, first: jax.Array, dy: jax.Array) -> None:
    for index, value in enumerate((first, dy)):
        _require_float(op, value, index)
    if first.shape != dy.shape:
        raise ShapeError(
            f"{op.where}: {op.type} needs '{op.inputs[0]}' and '{op.inputs[1]}' of one shape, got "
            f"{list(first.shape)} and {list(dy.shape)}"
        )


def _elementwise_gradient(op: Op, formula: Callable[[jax.Array, jax.Array], jax.Array]) -> Kernel:
    def kernel(first, dy):
        _grad_pair(op, first, dy)
        return formula(first, dy)

    return kernel


@register("SigmoidGradient", inputs=2)
def sigmoid_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY * Y * (1 - Y)`."""
    return _elementwise_gradient(op, lambda y, dy: dy * y * (1 - y))


@register("TanhGradient", inputs=2)
def tanh_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY * (1 - Y^2)`."""
    return _elementwise_gradient(op, lambda y, dy: dy * (1 - y * y))


@register("ReluGradient", inputs=2)
def relu_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY where Y > 0, else 0` (so 0 at Y == 0)."""
    return _elementwise_gradient(op, lambda y, dy: jnp.where(y > 0, dy, jnp.zeros((), dy.dtype)))


@register("LeakyReluGradient", inputs=2)
def leaky_relu_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY where Y >= 0, else alpha * dY` (caffe2/operators/leaky_relu_op.cc: the test is
    on Y and includes 0). Caffe2 only needs Y and dY to have one size; dX is shaped like Y."""
    alpha = op.float("alpha", 0.01)

    def kernel(y, dy):
        if dy.size != y.size:
            raise ShapeError(
                f"{op.where}: LeakyReluGradient needs '{op.inputs[0]}' and '{op.inputs[1]}' of one size, "
                f"got {list(y.shape)} and {list(dy.shape)}"
            )
        dy = dy.reshape(y.shape)
        _grad_pair(op, y, dy)
        return jnp.where(y >= 0, dy, dy * jnp.asarray(alpha, dy.dtype))

    return kernel


@register("SoftsignGradient", inputs=2)
def softsign_gradient(op: Op) -> Kernel:
    """`(X, dY) -> dY / (1 + |X|)^2`: Softsign's maker passes the forward INPUT, not its output."""
    return _elementwise_gradient(op, lambda x, dy: dy * (1 / jnp.square(1 + jnp.abs(x))))


@register("SoftmaxGradient", inputs=2)
def softmax_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> Y * (dY - sum(dY * Y))`, the sum over each row of the same 2-D view as Softmax
    (`size_to_dim(axis) x size_from_dim(axis)`)."""
    axis = op.int("axis", 1)

    def kernel(y, dy):
        _grad_pair(op, y, dy)
        k = canonical_axis(op, axis, y.ndim)
        if y.size == 0:
            return jnp.zeros_like(y)
        shape = (size_to_dim(y.shape, k), size_from_dim(y.shape, k))
        rows, drows = y.reshape(shape), dy.reshape(shape)
        dot = jnp.sum(rows * drows, axis=1, keepdims=True)
        return ((drows - dot) * rows).reshape(y.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# More activations (float only in Caffe2; see the note at the top). Each formula is Caffe2's
# (caffe2/operators/<op>_op.cc) so that overflow and rounding go the same way.


def _float_gradient(op: Op, formula: Callable[[jax.Array, jax.Array], jax.Array]) -> Kernel:
    """A `(Y, dY)` gradient op: dY is read flat in Y's shape."""

    def kernel(y, dy):
        if dy.size != y.size:
            raise ShapeError(
                f"{op.where}: {op.type} needs '{op.inputs[0]}' {list(y.shape)} and '{op.inputs[1]}' "
                f"{list(dy.shape)} of one size"
            )
        dy = dy.reshape(y.shape)
        _grad_pair(op, y, dy)
        return formula(y, dy)

    return kernel


def _three_input_gradient(op: Op, formula: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]) -> Kernel:
    """An `(X, Y, dY)` gradient op (Swish, Mish): all float of one size; dX has Y's shape."""

    def kernel(x, y, dy):
        for index, value in enumerate((x, y, dy)):
            _require_float(op, value, index)
            if value.size != y.size:
                raise ShapeError(
                    f"{op.where}: {op.type} needs inputs of one size, '{op.inputs[index]}' is {list(value.shape)} "
                    f"and '{op.inputs[1]}' {list(y.shape)}"
                )
        return formula(x.reshape(y.shape), y, dy.reshape(y.shape))

    return kernel


def _scalar(value: float, like: jax.Array) -> jax.Array:
    return jnp.asarray(value, like.dtype)


@register("Swish", shape_rule=output_like_input)
def swish(op: Op) -> Kernel:
    """`X / (1 + exp(-X))`."""
    return unary(op, lambda x: x / (1 + jnp.exp(-x)), FLOATING, "float")


@facet("gradient", "Swish")
def _swish_mish_gradient_maker(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(X, Y, dY)`."""
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])]


@register("SwishGradient", inputs=3)
def swish_gradient(op: Op) -> Kernel:
    """`(X, Y, dY) -> dY (Y + sigmoid(X) (1 - Y))`."""
    return _three_input_gradient(op, lambda x, y, dy: dy * (y + (1 / (1 + jnp.exp(-x))) * (1 - y)))


@register("Mish", gradient=_swish_mish_gradient_maker)
def mish(op: Op) -> Kernel:
    """`X tanh(log(1 + exp(X)))`, written as Caffe2 does: `X (e - 1/e) / (e + 1/e)` with e = 1 + exp(X)
    (NaN where exp overflows, as in Caffe2)."""

    def fn(x):
        e = 1 + jnp.exp(x)
        return x * (e - 1 / e) / (e + 1 / e)

    return unary(op, fn, FLOATING, "float")


@register("MishGradient", inputs=3)
def mish_gradient(op: Op) -> Kernel:
    """`dY e^x w / q^2` with w = e^3x + 4e^2x + e^x (6 + 4x) + 4(1 + x), q = (e^x + 1)^2 + 1."""

    def formula(x, y, dy):
        ex = jnp.exp(x)
        w = jnp.exp(3 * x) + 4 * jnp.exp(2 * x) + ex * (6 + 4 * x) + 4 * (1 + x)
        q = (ex + 1) * (ex + 1) + 1
        return dy * ex * w / (q * q)

    return _three_input_gradient(op, formula)


@register("HardSigmoid", gradient=gradient_from_output)
def hard_sigmoid(op: Op) -> Kernel:
    """`max(0, min(1, alpha X + beta))`, alpha 0.2 and beta 0.5 by default."""
    alpha, beta = op.float("alpha", 0.2), op.float("beta", 0.5)

    def fn(x):
        y = x * _scalar(alpha, x) + _scalar(beta, x)
        return jnp.maximum(jnp.minimum(y, _scalar(1.0, x)), _scalar(0.0, x))

    return unary(op, fn, FLOATING, "float")


@register("HardSigmoidGradient", inputs=2)
def hard_sigmoid_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> alpha dY where 0 < Y < 1, else 0`."""
    alpha = op.float("alpha", 0.2)

    def formula(y, dy):
        inside = (y > 0) & (y < 1)
        return jnp.where(inside, dy * _scalar(alpha, dy), jnp.zeros((), dy.dtype))

    return _float_gradient(op, formula)


@register("Elu", shape_rule=output_like_input, gradient=gradient_from_output)
def elu(op: Op) -> Kernel:
    """`alpha (exp(X) - 1)` where X < 0, else X; alpha 1.0."""
    alpha = op.float("alpha", 1.0)
    return unary(op, lambda x: jnp.where(x < 0, _scalar(alpha, x) * (jnp.exp(x) - 1), x), FLOATING, "float")


@register("EluGradient", inputs=2)
def elu_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY (Y + alpha) where Y < 0, else dY`."""
    alpha = op.float("alpha", 1.0)
    return _float_gradient(op, lambda y, dy: jnp.where(y < 0, dy * (y + _scalar(alpha, y)), dy))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _selu_args(op: Op) -> tuple[float, float]:
    """`alpha` and `scale` (which must exceed 1, caffe2/operators/selu_op.h)."""
    alpha, scale = op.float("alpha", _SELU_ALPHA), op.float("scale", _SELU_SCALE)
    if not scale > 1.0:
        raise BadArgumentError(f"{op.where}: argument 'scale' = {scale} must be greater than 1")
    return alpha, scale


@register("Selu", gradient=gradient_from_output)
def selu(op: Op) -> Kernel:
    """`scale X` where X > 0, else `scale (alpha exp(X) - alpha)`."""
    alpha, scale = _selu_args(op)

    def fn(x):
        a = _scalar(alpha, x)
        return _scalar(scale, x) * jnp.where(x > 0, x, a * jnp.exp(x) - a)

    return unary(op, fn, FLOATING, "float")


@register("SeluGradient", inputs=2)
def selu_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> scale dY where Y > 0, else dY (Y + scale alpha)`."""
    alpha, scale = _selu_args(op)

    def formula(y, dy):
        la = _scalar(np.float32(scale) * np.float32(alpha), y)
        return jnp.where(y > 0, _scalar(scale, dy) * dy, dy * (y + la))

    return _float_gradient(op, formula)


def _relu_n_bound(op: Op) -> float:
    n = op.float("n", 6.0)
    if not n > 0:
        raise BadArgumentError(f"{op.where}: argument 'n' = {n} must be greater than 0")
    return n


@register("ReluN", gradient=gradient_from_output)
def relu_n(op: Op) -> Kernel:
    """`min(max(X, 0), n)`, n (6.0) > 0."""
    n = _relu_n_bound(op)
    return unary(op, lambda x: jnp.minimum(jnp.maximum(x, _scalar(0.0, x)), _scalar(n, x)), FLOATING, "float")


@register("ReluNGradient", inputs=2)
def relu_n_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY where 0 < Y < n, else 0`."""
    n = _relu_n_bound(op)
    return _float_gradient(op, lambda y, dy: jnp.where((y > 0) & (y < n), dy, jnp.zeros((), dy.dtype)))


@register("ThresholdedRelu", gradient=gradient_from_output)
def thresholded_relu(op: Op) -> Kernel:
    """`X where X > alpha, else 0`; alpha 1.0."""
    alpha = op.float("alpha", 1.0)
    return unary(op, lambda x: jnp.where(x > alpha, x, _scalar(0.0, x)), FLOATING, "float")


@register("ThresholdedReluGradient", inputs=2)
def thresholded_relu_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY sign(Y)` (thresholded_relu_op.cc): with a negative alpha, an output in (alpha, 0)
    gets -dY, not dY, as in Caffe2."""
    return _float_gradient(op, lambda y, dy: dy * jnp.sign(y))


@register("Softplus", gradient=gradient_from_output)
def softplus(op: Op) -> Kernel:
    """`log(exp(X) + 1)` (inf where exp overflows, as in Caffe2)."""
    return unary(op, lambda x: jnp.log(jnp.exp(x) + 1), FLOATING, "float")


@register("SoftplusGradient", inputs=2)
def softplus_gradient(op: Op) -> Kernel:
    """`(Y, dY) -> dY (1 - exp(-Y))`."""
    return _float_gradient(op, lambda y, dy: dy * (1 - jnp.exp(-y)))


_SQRT_2 = math.sqrt(2.0)
_FAST_GELU_ALPHA = math.sqrt(2.0) / math.sqrt(math.pi)
_FAST_GELU_COEFF = 0.044715


@register("Gelu", gradient=single_gradient("GeluGradient", "GO(0) I(0)"))
def gelu(op: Op) -> Kernel:
    """`X Phi(X)`, or with `fast_gelu` the tanh approximation `0.5 X (1 + tanh(sqrt(2/pi) (X + 0.044715 X^3)))`."""
    fast = op.bool("fast_gelu", False)

    def fn(x):
        if fast:
            inner = (x + x * x * x * _FAST_GELU_COEFF) * _FAST_GELU_ALPHA
            return x * (jnp.tanh(inner) + 1) * 0.5
        return x * (0.5 * jax.lax.erfc(-x / _SQRT_2))

    return unary(op, fn, FLOATING, "float")


@register("GeluGradient", inputs=2)
def gelu_gradient(op: Op) -> Kernel:
    """`(dY, X) -> dY (Phi(X) + X phi(X))`, or the derivative of the tanh approximation (gelu_op.cc)."""
    fast = op.bool("fast_gelu", False)

    def formula(x, dy):
        if fast:
            beta = _FAST_GELU_ALPHA * _FAST_GELU_COEFF * 3
            t = jnp.tanh((x + x * x * x * _FAST_GELU_COEFF) * _FAST_GELU_ALPHA)
            return (1 + t + x * (1 - t * t) * (beta * x * x + _FAST_GELU_ALPHA)) * dy * 0.5
        cdf = 0.5 * jax.lax.erfc(-x / _SQRT_2)
        return (cdf + x * jnp.exp(-x * x * 0.5) / math.sqrt(2 * math.pi)) * dy

    def kernel(dy, x):
        if dy.size != x.size:
            raise ShapeError(
                f"{op.where}: GeluGradient needs '{op.inputs[0]}' {list(dy.shape)} and '{op.inputs[1]}' "
                f"{list(x.shape)} of one size"
            )
        dy = dy.reshape(x.shape)
        _grad_pair(op, x, dy)
        return formula(x, dy)

    return kernel


# --------------------------------------------------------------------------------------------------
# PRelu, Glu


def _prelu_channels(op: Op, x: jax.Array, w: jax.Array, nchw: bool) -> tuple[int, int]:
    """(channel axis, C): C is X's dim 1 (NCHW) or last dim (NHWC); W holds C slopes or one shared slope."""
    _require_float(op, x, 0)
    _require_float(op, w, 1)
    if x.ndim < (2 if nchw else 1):
        raise ShapeError(f"{op.where}: X '{op.inputs[0]}' {list(x.shape)} has no channel dimension")
    axis = 1 if nchw else x.ndim - 1
    c = x.shape[axis]
    if w.size != 1 and w.size != c:
        raise ShapeError(f"{op.where}: slope '{op.inputs[1]}' {list(w.shape)} must hold 1 or {c} (channels) values")
    return axis, c


def _prelu_order(op: Op) -> bool:
    order = op.str("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise BadArgumentError(f"{op.where}: unknown storage order {order!r}")
    return order == "NCHW"


def _slopes(w: jax.Array, x: jax.Array, axis: int) -> jax.Array:
    """W broadcast against X along the channel axis (a single slope is a scalar)."""
    if w.size == 1:
        return jnp.reshape(w, ())
    shape = [1] * x.ndim
    shape[axis] = w.size
    return jnp.reshape(w, shape)


@register("PRelu", inputs=2, gradient=single_gradient("PReluGradient", "O(0) GO(0) I(0) I(1)", "GI(0) GI(1)"))
def prelu(op: Op) -> Kernel:
    """`max(X, 0) + min(X, 0) * slope[c]`, one slope per channel (`order` NCHW or NHWC) or one shared."""
    nchw = _prelu_order(op)

    def kernel(x, w):
        axis, _ = _prelu_channels(op, x, w, nchw)
        slope = _slopes(w, x, axis).astype(x.dtype)
        zero = jnp.zeros((), x.dtype)
        return jnp.where(x > 0, x, x * slope) if not nchw else jnp.maximum(x, zero) + jnp.minimum(x, zero) * slope

    return kernel


@register("PReluGradient", inputs=4, outputs=2)
def prelu_gradient(op: Op) -> Kernel:
    """`(Y, dY, X, W) -> (dX, dW)`: dX = dY where X > 0, else slope dY; dW sums dY X over X <= 0 per
    channel (over everything for a shared slope)."""
    nchw = _prelu_order(op)

    def kernel(y, dy, x, w):
        axis, _ = _prelu_channels(op, x, w, nchw)
        _require_float(op, dy, 1)
        if dy.size != x.size or y.size != x.size:
            raise ShapeError(f"{op.where}: Y, dY and X must have one size")
        dy = dy.reshape(x.shape)
        slope = _slopes(w, x, axis).astype(x.dtype)
        dx = jnp.where(x > 0, dy, dy * slope)
        contrib = jnp.where(x > 0, jnp.zeros((), x.dtype), dy * x)
        if w.size == 1:
            dw = jnp.reshape(jnp.sum(contrib), w.shape)
        else:
            axes = tuple(i for i in range(x.ndim) if i != axis)
            dw = jnp.reshape(jnp.sum(contrib, axis=axes), w.shape)
        return dx.reshape(y.shape), dw.astype(w.dtype)

    return kernel


@register("Glu", gradient=NO_GRADIENT)
def glu(op: Op) -> Kernel:
    """`A * sigmoid(B)` with X split in halves A, B along `dim` (-1: the last dim), whose size must be even."""
    dim = op.int("dim", -1)

    def kernel(x):
        _require_float(op, x, 0)
        axis = x.ndim - 1 if dim == -1 else dim
        if not 0 <= axis < x.ndim:
            raise ShapeError(f"{op.where}: argument 'dim' = {dim} is out of range for an input of rank {x.ndim}")
        if x.shape[axis] % 2:
            raise ShapeError(f"{op.where}: dimension {axis} of '{op.inputs[0]}' {list(x.shape)} must be even")
        a, b = jnp.split(x, 2, axis=axis)
        return a * (1 / (1 + jnp.exp(-b)))

    return kernel
