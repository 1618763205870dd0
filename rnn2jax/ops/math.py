"""Elementwise math beyond the arithmetic of `elementwise.py`: the unary functions (Sqr, Rsqrt, Sin,
Erf...) and their gradient ops, Pow, Mod, the n-ary Max/Min/Mean, the bitwise ops, the row-wise
products and distances (DotProduct, CosineSimilarity, L1Distance...) and the value checks (NanCheck,
EnforceFinite, ReplaceNaN).

Dtypes follow Caffe2's CPU registrations; where Caffe2 registers float32 only, other float types are
accepted on purpose (rnn2jax's float64 verification mode, rnn2jax/checking/verification.py) and integers are refused.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from ..proto import caffe2_pb2 as pb
from .checks import enforce, first_bad, literal, runtime_checked
from .elementwise import FLOATING, NUMERIC, _check_dtypes, _legacy_axis, _legacy_b_shape, binary, unary
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import (
    GradientContext,
    GradientError,
    GradientOps,
    argument,
    gradient_from_input,
    gradient_from_output,
    gradient_not_implemented_yet,
    gradient_op,
    should_not_do_gradient,
    single_gradient,
)
from .registry import Kernel, declare_family, facet, register
from .shape_facts import all_same_shape, output_like_input

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_FLOAT_KIND = "float"
_NUMERIC_KIND = "int32, int64, float and double"
INTEGERS = frozenset(np.dtype(t) for t in (np.int32, np.int64))
BITWISE = INTEGERS | {np.dtype(np.bool_)}


def _same_size(op: Op, first: jax.Array, other: jax.Array, index: int, first_index: int = 0) -> jax.Array:
    """`other` (input `index`) read flat in `first`'s shape, as Caffe2's gradient kernels read it."""
    if other.size != first.size:
        raise ShapeError(
            f"{op.where}: {op.type} needs '{op.inputs[first_index]}' {list(first.shape)} and "
            f"'{op.inputs[index]}' {list(other.shape)} of one size"
        )
    return jnp.reshape(other, first.shape)


def _same_shapes(op: Op, xs: Sequence[jax.Array], start: int = 0) -> None:
    """Inputs `start`.. must have the first input's shape (no broadcasting)."""
    for name, x in zip(op.inputs[start:], xs[start:], strict=False):
        if x.shape != xs[0].shape:
            raise ShapeError(
                f"{op.where}: input '{name}' {list(x.shape)} must have the shape of "
                f"'{op.inputs[0]}' {list(xs[0].shape)}"
            )


# --------------------------------------------------------------------------------------------------
# Unary functions and their gradient ops


def _sign(x: jax.Array) -> jax.Array:
    """Caffe2's `(0 < x) - (x < 0)`: NaN gives 0, not NaN."""
    return ((x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)).astype(x.dtype)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

# op type -> (function, dtypes). Caffe2 registers Cube and Sign for its NumericTypes, the rest for float.
UNARY: dict[str, tuple[Callable[[jax.Array], jax.Array], frozenset[np.dtype]]] = {
    "Sqr": (jnp.square, FLOATING),
    "Rsqrt": (jax.lax.rsqrt, FLOATING),
    "Reciprocal": (jnp.reciprocal, FLOATING),
    "Cube": (lambda x: x * x * x, NUMERIC),
    "Cbrt": (jnp.cbrt, FLOATING),
    "Sign": (_sign, NUMERIC),
    "Ceil": (jnp.ceil, FLOATING),
    "Floor": (jnp.floor, FLOATING),
    "Erf": (jax.lax.erf, FLOATING),
    "Sin": (jnp.sin, FLOATING),
    "Cos": (jnp.cos, FLOATING),
    "Tan": (jnp.tan, FLOATING),
    "Asin": (jnp.arcsin, FLOATING),
    "Acos": (jnp.arccos, FLOATING),
    "Atan": (jnp.arctan, FLOATING),
    "Sinh": (jnp.sinh, FLOATING),
    "Cosh": (jnp.cosh, FLOATING),
    "Log1p": (jnp.log1p, FLOATING),
}


def _kind(allowed: frozenset[np.dtype]) -> str:
    return _NUMERIC_KIND if allowed == NUMERIC else _FLOAT_KIND


def _register_unary(op_type: str, fn: Callable[[jax.Array], jax.Array], allowed: frozenset[np.dtype]) -> None:
    register(op_type)(lambda op: unary(op, fn, allowed, _kind(allowed)))


for _type, (_fn, _allowed) in UNARY.items():
    _register_unary(_type, _fn, _allowed)


@facet("gradient", "Cube", "Sinh", "Cosh")
def _gradient_from_dy_and_input(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(dY, X)`."""
    return [gradient_op(g.op.type + "Gradient", [g.GO(0), g.I(0)], [g.GI(0)])]


@facet("gradient", "Rsqrt", "Cbrt")
def _gradient_from_dy_and_output(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(dY, Y)`."""
    return [gradient_op(g.op.type + "Gradient", [g.GO(0), g.O(0)], [g.GI(0)])]


@facet("gradient", "Sqr")
def _sqr_gradient_maker(g: GradientContext) -> GradientOps:
    """dX = 2 dY X: Scale doubles dY IN PLACE (sqr_op.cc), then Mul."""
    return [
        gradient_op("Scale", [g.GO(0)], [g.GO(0)], [argument("scale", 2.0)]),
        gradient_op("Mul", [g.GO(0), g.I(0)], [g.GI(0)]),
    ]


facet("gradient", "Sign")(should_not_do_gradient)


facet("gradient", "Ceil", "Floor")(gradient_not_implemented_yet)


facet("gradient", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Log1p")(gradient_from_input)


facet("gradient", "Reciprocal")(gradient_from_output)


facet("shape_rule", "Sqr")(output_like_input)


# Gradient op -> (dY is its first input, formula of (value, dY), dtypes); `value` is X or Y as Caffe2's
# maker passes it (caffe2/operators/<op>_op.cc, the *GradientFunctor).
UNARY_GRADIENTS: dict[str, tuple[bool, Callable[[jax.Array, jax.Array], jax.Array], frozenset[np.dtype]]] = {
    "RsqrtGradient": (True, lambda y, dy: dy * (y * y * y) * -0.5, FLOATING),
    "ReciprocalGradient": (False, lambda y, dy: dy * -(y * y), FLOATING),
    "CubeGradient": (True, lambda x, dy: dy * (x * x) * 3, NUMERIC),
    "CbrtGradient": (True, lambda y, dy: dy / (y * y * 3), FLOATING),
    "ErfGradient": (False, lambda x, dy: _TWO_OVER_SQRT_PI * jnp.exp(-x * x) * dy, FLOATING),
    "SinGradient": (False, lambda x, dy: dy * jnp.cos(x), FLOATING),
    "CosGradient": (False, lambda x, dy: -dy * jnp.sin(x), FLOATING),
    "TanGradient": (False, lambda x, dy: dy / jnp.square(jnp.cos(x)), FLOATING),
    "AsinGradient": (False, lambda x, dy: dy * jax.lax.rsqrt(1 - x * x), FLOATING),
    "AcosGradient": (False, lambda x, dy: -dy * jax.lax.rsqrt(1 - x * x), FLOATING),
    "AtanGradient": (False, lambda x, dy: dy / (1 + x * x), FLOATING),
    "SinhGradient": (True, lambda x, dy: dy * jnp.cosh(x), FLOATING),
    # cosh_op.cc writes sinh as (exp(x) - exp(-x)) / 2, which cancels for tiny x: kept, so gradients agree
    "CoshGradient": (True, lambda x, dy: dy * (jnp.exp(x) - jnp.exp(-x)) / 2, FLOATING),
    "Log1pGradient": (False, lambda x, dy: dy / (x + 1), FLOATING),
}


def elementwise_gradient(
    op: Op, dy_first: bool, formula: Callable[[jax.Array, jax.Array], jax.Array], allowed: frozenset[np.dtype]
) -> Kernel:
    """A `(value, dY)` or `(dY, value)` gradient op: both of one dtype and size; dX has value's shape."""

    def kernel(a, b):
        _check_dtypes(op, (a, b), allowed, _kind(allowed))
        if dy_first:
            value, dy = b, _same_size(op, b, a, 0, first_index=1)
        else:
            value, dy = a, _same_size(op, a, b, 1)
        return formula(value, dy).astype(value.dtype)

    return kernel


def _register_unary_gradient(op_type: str, dy_first: bool, formula: Callable, allowed: frozenset[np.dtype]) -> None:
    register(op_type, inputs=2)(lambda op: elementwise_gradient(op, dy_first, formula, allowed))


for _type, (_dy_first, _formula, _allowed) in UNARY_GRADIENTS.items():
    _register_unary_gradient(_type, _dy_first, _formula, _allowed)


# --------------------------------------------------------------------------------------------------
# Logit, ReplaceNaN, EnforceFinite, NanCheck, IsNaN


def _logit_eps(op: Op) -> float:
    """`eps` (1e-6) must lie in (0, 0.5) (caffe2/operators/logit_op.h)."""
    eps = op.float("eps", 1e-6)
    if not 0.0 < eps < 0.5:
        raise BadArgumentError(f"{op.where}: argument 'eps' = {eps} must lie in (0, 0.5)")
    return eps


@register("Logit", gradient=gradient_from_input)
def logit(op: Op) -> Kernel:
    """`log(x / (1 - x))` of X clamped to [eps, 1 - eps]."""
    eps = _logit_eps(op)

    def fn(x):
        clamped = jnp.maximum(jnp.minimum(x, jnp.asarray(1.0 - eps, x.dtype)), jnp.asarray(eps, x.dtype))
        return jnp.log(clamped / (1 - clamped))

    return unary(op, fn, FLOATING, _FLOAT_KIND)


@register("LogitGradient", inputs=2)
def logit_gradient(op: Op) -> Kernel:
    """`(X, dY) -> dY / (X (1 - X))`, 0 where X is outside [eps, 1 - eps]."""
    eps = _logit_eps(op)

    def formula(x, dy):
        outside = (x < eps) | (x > 1.0 - eps)
        return jnp.where(outside, jnp.zeros((), dy.dtype), dy / ((1 - x) * x))

    return elementwise_gradient(op, False, formula, FLOATING)


_FLOAT_DOUBLE = frozenset(np.dtype(t) for t in (np.float32, np.float64))


@register("ReplaceNaN", gradient=should_not_do_gradient)
def replace_nan(op: Op) -> Kernel:
    """NaNs become `value` (0.0, a float argument); float and double."""
    value = op.float("value", 0.0)
    return unary(op, lambda x: jnp.where(jnp.isnan(x), jnp.asarray(value, x.dtype), x), _FLOAT_DOUBLE, _FLOAT_KIND)


def _require_finite(op: Op, x: jax.Array) -> None:
    bad = ~jnp.isfinite(x)
    message = f"{literal(op.where)}: '{literal(op.inputs[0])}' holds a non-finite value ({{bad}})"
    enforce(~jnp.any(bad), message, bad=first_bad(x, bad))


@register("EnforceFinite", outputs=0, gradient=should_not_do_gradient)
def enforce_finite(op: Op) -> Kernel:
    """Refuses an input holding NaN or infinity; no output."""

    def kernel(x):
        _check_dtypes(op, (x,), _FLOAT_DOUBLE, _FLOAT_KIND)
        _require_finite(op, x)
        return ()

    return kernel


@register("NanCheck", inputs=(1, None), gradient=single_gradient("NanCheck", "GO(0)"))
def nan_check(op: Op) -> Kernel:
    """Copies input 0, refusing it when it holds NaN or infinity; the other inputs are only printed by
    Caffe2 on failure (caffe2/operators/utility_ops.cc)."""

    def kernel(x, *others):
        _check_dtypes(op, (x,), FLOATING, _FLOAT_KIND)
        _require_finite(op, x)
        return jnp.asarray(x)

    return kernel


@register("IsNaN", gradient=NO_GRADIENT)
def is_nan(op: Op) -> Kernel:
    """A uint8 mask of the NaNs (caffe2/operators/isnan_op.cc)."""
    return unary(op, lambda x: jnp.isnan(x).astype(jnp.uint8), _FLOAT_DOUBLE, _FLOAT_KIND)


runtime_checked("EnforceFinite", "NanCheck", "SquareRootDivide")


# --------------------------------------------------------------------------------------------------
# Pow


def _pow_broadcast(op: Op) -> tuple[bool, int]:
    """(broadcast, axis) as PowOp's constructor reads them: without broadcast, `axis`/`axis_str` are errors."""
    legacy = op.bool("broadcast", False)
    if legacy:
        return True, _legacy_axis(op)
    if op.int("axis", -1) != -1 or op.str("axis_str", ""):
        raise BadArgumentError(f"{op.where}: do not set 'axis' or 'axis_str' without broadcast=1")
    return False, -1


@register("Pow", inputs=(1, 2))
def pow_(op: Op) -> Kernel:
    """`Y = X ^ exponent`: the `exponent` argument with one input, or the second input (the same shape as
    X, or with broadcast=1 a scalar or a legacy block of X). float only (caffe2/operators/pow_op.h)."""
    if len(op.inputs) == 1:
        if not op.has("exponent"):
            raise BadArgumentError(f"{op.where}: Pow with one input needs the argument 'exponent'")
        if op.args["exponent"].kind != "f":
            raise BadArgumentError(f"{op.where}: argument 'exponent' must be a float (field f)")
        exponent = op.float("exponent")
        return unary(op, lambda x: jnp.power(x, jnp.asarray(exponent, x.dtype)), FLOATING, _FLOAT_KIND)
    legacy, axis = _pow_broadcast(op)

    def kernel(a, b):
        _check_dtypes(op, (a, b), FLOATING, _FLOAT_KIND)
        if not legacy:
            if a.shape != b.shape:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[0]}' {list(a.shape)} and '{op.inputs[1]}' {list(b.shape)} differ; "
                    "set broadcast=1 to broadcast"
                )
            return jnp.power(a, b)
        return jnp.power(a, jnp.reshape(b, _legacy_b_shape(op, a.shape, b.shape, axis)))

    return kernel


def _pow_legacy_arguments(g: GradientContext) -> list[pb.Argument]:
    """The forward's broadcast, axis, axis_str and order, defaults filled in (GetPowGradient)."""
    defaults = (("broadcast", 0), ("axis", -1), ("axis_str", ""), ("order", "NCHW"))
    args = []
    for name, default in defaults:
        arg = g.arg(name)
        if arg is None:
            arg = argument(name, default)
        args.append(arg)
    return args


@facet("gradient", "Pow")
def _pow_gradient_maker(g: GradientContext) -> GradientOps:
    """With the `exponent` argument: `dX = e X^(e-1) dY` (Pow, Mul, Scale). With an exponent input E:
    `dX = E X^(E-1) dY` and `dE = log(X) Y dY`, summed back to E's shape with SumReduceLike when the
    forward has a `broadcast` argument (caffe2/operators/pow_op.cc). Only the maker's arguments."""
    g.copy_args = False
    exponent_arg = g.arg("exponent")
    if exponent_arg is not None:
        e = np.float32(exponent_arg.f)
        if g.I(0) != g.O(0):
            power = np.float32(e - np.float32(1))
        else:
            if not abs(float(e)) > 1e-12:
                raise GradientError("In-place Pow gradient needs a nonzero exponent")
            power = np.float32(np.float32(e - np.float32(1)) / e)
        return [
            gradient_op("Pow", [g.I(0)], [g.GI(0)], [argument("exponent", float(power))]),
            gradient_op("Mul", [g.GI(0), g.GO(0)], [g.GI(0)]),
            gradient_op("Scale", [g.GI(0)], [g.GI(0)], [argument("scale", float(e))]),
        ]
    if g.I(0) == g.O(0) or g.I(1) == g.O(0):
        raise GradientError("Gradient computation cannot be carried out if Pow uses in-place computation")
    legacy = g.arg("broadcast") is not None
    args = _pow_legacy_arguments(g) if legacy else []
    x, e, gx, ge = g.I(0), g.I(1), g.GI(0), g.GI(1)
    pre = ge + "_autogen_pre_red"
    ops = [
        gradient_op("ConstantFill", [e], [ge], [argument("value", 1.0)]),
        gradient_op("Sub", [e, ge], [ge]),
        gradient_op("Pow", [x, ge], [gx], args),
        gradient_op("Mul", [gx, g.GO(0)], [gx]),
        gradient_op("Mul", [gx, e], [gx], args),
        gradient_op("Log", [x], [pre]),
        gradient_op("Mul", [pre, g.O(0)], [pre]),
    ]
    if legacy:
        return [
            *ops,
            gradient_op("Mul", [pre, g.GO(0)], [pre]),
            gradient_op("SumReduceLike", [pre, e], [ge], args[1:]),
        ]
    return [*ops, gradient_op("Mul", [pre, g.GO(0)], [ge])]


# --------------------------------------------------------------------------------------------------
# Mod, bitwise, IsMemberOf


@register("Mod", gradient=NO_GRADIENT)
def mod(op: Op) -> Kernel:
    """`X % divisor` with C's sign (the dividend's), or the divisor's with `sign_follow_divisor`."""
    divisor = op.int("divisor", 0)
    if divisor == 0:
        raise BadArgumentError(f"{op.where}: argument 'divisor' must be given and nonzero")
    follow = op.bool("sign_follow_divisor", False)

    def fn(x):
        info = np.iinfo(x.dtype)
        if not info.min <= divisor <= info.max:
            raise BadArgumentError(f"{op.where}: argument 'divisor' = {divisor} does not fit in {x.dtype}")
        d = jnp.asarray(divisor, x.dtype)
        return jnp.remainder(x, d) if follow else jax.lax.rem(x, jnp.broadcast_to(d, x.shape))

    return unary(op, fn, INTEGERS, "int32 and int64")


for _type, _fn in (("BitwiseAnd", jnp.bitwise_and), ("BitwiseOr", jnp.bitwise_or), ("BitwiseXor", jnp.bitwise_xor)):
    register(_type, inputs=2)(functools.partial(binary, fn=_fn, allowed=BITWISE, kind="int32, int64 and bool"))


facet("gradient", "BitwiseAnd", "BitwiseOr", "BitwiseXor")(should_not_do_gradient)


_DTYPE_CODES = {2: np.dtype(np.int32), 10: np.dtype(np.int64), 5: np.dtype(np.bool_)}


@register("IsMemberOf", gradient=should_not_do_gradient)
def is_member_of(op: Op) -> Kernel:
    """A bool mask of the elements found in `value` (a list). `dtype` (a TensorProto type) says which
    type the list is read as; an input of another type then matches nothing (IsMemberOfValueHolder).
    String tensors are not supported."""
    values = op.ints("value", ())
    dtype = op.int("dtype", 0)
    if dtype not in (0, 4, *_DTYPE_CODES):
        raise BadArgumentError(f"{op.where}: unexpected 'dtype' argument value {dtype}")

    def kernel(x):
        _check_dtypes(op, (x,), BITWISE, "int32, int64 and bool")
        if dtype and _DTYPE_CODES.get(dtype) != np.dtype(x.dtype):
            return jnp.zeros(x.shape, jnp.bool_)
        if x.dtype == jnp.bool_:
            wanted = {bool(v) for v in values}
            return jnp.isin(x, jnp.asarray(sorted(wanted), jnp.bool_)) if wanted else jnp.zeros(x.shape, jnp.bool_)
        info = np.iinfo(x.dtype)
        kept = sorted({v for v in values if info.min <= v <= info.max})
        if not kept:
            return jnp.zeros(x.shape, jnp.bool_)
        return jnp.isin(x, jnp.asarray(kept, x.dtype))

    return kernel


# --------------------------------------------------------------------------------------------------
# n-ary: Max, Min, Mean, SumInt, SumRelu


def _nary(op: Op, xs: Sequence[jax.Array], allowed: frozenset[np.dtype], kind: str) -> None:
    _check_dtypes(op, xs, allowed, kind)
    _same_shapes(op, xs)


# std::max / std::min semantics (Eigen cwiseMax/cwiseMin): a NaN in the running result is kept,
# a NaN in the new input is not.
def _max(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.where(a < b, b, a)


def _min(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.where(b < a, b, a)


def _select(op: Op, fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Kernel:
    def kernel(*xs):
        _nary(op, xs, FLOATING, _FLOAT_KIND)
        return functools.reduce(fn, xs[1:], jnp.asarray(xs[0]))

    return kernel


@register("Max", inputs=(1, None), shape_rule=all_same_shape)
def max_(op: Op) -> Kernel:
    """Elementwise max of inputs of one shape. (Caffe2 1.10 never checks input 1's shape and reads past
    a smaller one; rnn2jax refuses it.)"""
    return _select(op, _max)


@facet("gradient", "Max")
def _select_gradient_maker(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(Y, dY, X0, X1, ...) -> (dX0, dX1, ...)`."""
    n = len(g.op.input)
    inputs = [g.O(0), g.GO(0), *(g.I(i) for i in range(n))]
    return [gradient_op(g.op.type + "Gradient", inputs, [g.GI(i) for i in range(n)])]


@register("Min", inputs=(1, None), shape_rule=all_same_shape, gradient=_select_gradient_maker)
def min_(op: Op) -> Kernel:
    """Elementwise min of inputs of one shape (see Max)."""
    return _select(op, _min)


def _select_gradient(op: Op) -> Kernel:
    """`(Y, dY, X0, X1, ...) -> dXi = dY where Xi == Y, else 0` (minmax_gradient_ops.cc): every input
    equal to the result gets the whole gradient."""

    def kernel(y, dy, *xs):
        _check_dtypes(op, (y, dy, *xs), FLOATING, _FLOAT_KIND)
        dy = _same_size(op, y, dy, 1)
        count = len(op.outputs)
        if len(xs) < count:
            raise BadArgumentError(f"{op.where}: {op.type} has {count} outputs but {len(xs)} forward inputs")
        grads = []
        for i, x in enumerate(xs[:count]):
            if x.size != y.size:
                raise ShapeError(
                    f"{op.where}: input '{op.inputs[i + 2]}' {list(x.shape)} does not have the size of "
                    f"'{op.inputs[0]}' {list(y.shape)}"
                )
            equal = jnp.reshape(x, y.shape) == y
            grads.append(jnp.reshape(dy * equal.astype(dy.dtype), x.shape))
        return tuple(grads)

    return kernel


register("MaxGradient", inputs=(3, None), outputs=(1, None))(_select_gradient)
register("MinGradient", inputs=(3, None), outputs=(1, None))(_select_gradient)


@register("Mean", inputs=(1, None))
def mean(op: Op) -> Kernel:
    """The elementwise mean of inputs of one shape: their sum times 1/n (caffe2/operators/mean_op.h)."""

    def kernel(*xs):
        _nary(op, xs, FLOATING, _FLOAT_KIND)
        total = functools.reduce(jnp.add, xs[1:], jnp.asarray(xs[0]))
        return total * jnp.asarray(1.0 / len(xs), total.dtype)

    return kernel


@facet("gradient", "Mean")
def _mean_gradient_maker(g: GradientContext) -> GradientOps:
    return [gradient_op("MeanGradient", [g.GO(0)], [g.GI(i) for i in range(len(g.op.input))])]


@register("MeanGradient", outputs=(1, None))
def mean_gradient(op: Op) -> Kernel:
    """`dY -> dY / n` for each of the n outputs (the forward's inputs)."""
    count = len(op.outputs)

    def kernel(dy):
        _check_dtypes(op, (dy,), FLOATING, _FLOAT_KIND)
        grad = dy * jnp.asarray(1.0 / count, dy.dtype)
        return tuple(grad for _ in range(count))

    return kernel


@register("SumInt", inputs=(1, None), gradient=NO_GRADIENT)
def sum_int(op: Op) -> Kernel:
    """Caffe2 runs SumInt with Sum's kernel (utility_ops.cc): inputs of one shape and one numeric type."""

    def kernel(*xs):
        _nary(op, xs, NUMERIC, _NUMERIC_KIND)
        return functools.reduce(jnp.add, xs[1:], jnp.asarray(xs[0]))

    return kernel


_SUM_RELU_TYPES = frozenset(np.dtype(t) for t in (np.int32, np.float16, np.float32, np.float64))


@register("SumRelu", inputs=(1, None), gradient=NO_GRADIENT)
def sum_relu(op: Op) -> Kernel:
    """`max(X0 + X1 + ..., 0)`: float, double or int32 inputs of one shape (elementwise_sum_relu_op.cc)."""

    def kernel(*xs):
        _nary(op, xs, _SUM_RELU_TYPES, "int32, float and double")
        total = functools.reduce(jnp.add, xs[1:], jnp.asarray(xs[0]))
        return jnp.maximum(total, jnp.zeros((), total.dtype))

    return kernel


# --------------------------------------------------------------------------------------------------
# Identity-like ops of gradient plumbing


@register("NegateGradient", gradient=single_gradient("Negative", "GO(0)"))
def negate_gradient(op: Op) -> Kernel:
    """A copy forward; its gradient is the negated output gradient (negate_gradient_op.cc)."""
    return lambda x: jnp.asarray(x)


@register("ZeroGradient", outputs=0)
def zero_gradient(op: Op) -> Kernel:
    """No output forward; its gradient maker feeds X a zero gradient (zero_gradient_op.cc)."""
    return lambda x: ()


@facet("gradient", "ZeroGradient")
def _zero_gradient_maker(g: GradientContext) -> GradientOps:
    return [gradient_op("ConstantFill", [g.I(0)], [g.GI(0)], [argument("value", 0.0)])]


# --------------------------------------------------------------------------------------------------
# Row-wise products and distances: X and Y viewed as N rows (N = X's first dim, 1 for a scalar)


def _rows(x: jax.Array) -> int:
    return x.shape[0] if x.ndim > 0 else 1


def _same_dims(op: Op, x: jax.Array, y: jax.Array) -> None:
    if x.shape != y.shape:
        raise ShapeError(
            f"{op.where}: '{op.inputs[0]}' {list(x.shape)} and '{op.inputs[1]}' {list(y.shape)} must have one shape"
        )


def _row_gradient_input(op: Op, dz: jax.Array, n: int) -> jax.Array:
    if dz.shape != (n,):
        raise ShapeError(f"{op.where}: the gradient '{op.inputs[2]}' {list(dz.shape)} must have shape [{n}]")
    return dz


def _float_pair(op: Op, *arrays: jax.Array) -> None:
    _check_dtypes(op, arrays, FLOATING, _FLOAT_KIND)


def _dot_rows(x: jax.Array) -> int:
    """DotProduct's N: 0 for an empty X, whatever its first dim (distance_op.cc)."""
    return 0 if x.size == 0 else _rows(x)


@register("DotProduct", inputs=2)
def dot_product(op: Op) -> Kernel:
    """`Z[i] = <X[i], Y[i]>` over rows of X and Y (one shape); an empty X gives an empty Z."""

    def kernel(x, y):
        _float_pair(op, x, y)
        _same_dims(op, x, y)
        n = _dot_rows(x)
        return jnp.sum(jnp.reshape(x, (n, -1)) * jnp.reshape(y, (n, -1)), axis=1) if n else jnp.zeros((0,), x.dtype)

    return kernel


@facet("gradient", "DotProduct")
def _pairwise_gradient_maker(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(X, Y, dZ) -> dX, dY`."""
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])]


@register("DotProductGradient", inputs=3, outputs=2)
def dot_product_gradient(op: Op) -> Kernel:
    """`(X, Y, dZ) -> (dZ[i] Y[i], dZ[i] X[i])`."""

    def kernel(x, y, dz):
        _float_pair(op, x, y, dz)
        _same_dims(op, x, y)
        n = _dot_rows(x)
        dz = _row_gradient_input(op, dz, n)
        if n == 0:
            return jnp.zeros_like(x), jnp.zeros_like(y)
        scale = jnp.reshape(dz, (n, 1))
        return (
            jnp.reshape(scale * jnp.reshape(y, (n, -1)), x.shape),
            jnp.reshape(scale * jnp.reshape(x, (n, -1)), y.shape),
        )

    return kernel


def _padding_dims(op: Op, x: jax.Array, y: jax.Array) -> tuple[int, int, int]:
    """(N, DX, DY) of DotProductWithPadding: X and Y of one rank and one first dim."""
    if x.ndim != y.ndim:
        raise ShapeError(f"{op.where}: '{op.inputs[0]}' and '{op.inputs[1]}' must have one rank")
    if x.ndim == 0:
        raise ShapeError(f"{op.where}: '{op.inputs[0]}' must have at least one dimension")
    if x.shape[0] != y.shape[0]:
        raise ShapeError(
            f"{op.where}: '{op.inputs[0]}' {list(x.shape)} and '{op.inputs[1]}' {list(y.shape)} "
            "must have one first dimension"
        )
    if x.size == 0:
        return 0, 0, 0
    n = x.shape[0]
    return n, x.size // n, y.size // n


def _padding_args(op: Op) -> tuple[float, bool]:
    return op.float("pad_value", 0.0), op.bool("replicate", False)


def _replicas(op: Op, dx: int, dy: int) -> int:
    """How many copies of the shorter row the longer one holds (the forward drops a remainder)."""
    short = min(dx, dy)
    if short == 0:
        raise ShapeError(f"{op.where}: replicate=1 needs non-empty rows in both inputs")
    return max(dx, dy) // short


@register("DotProductWithPadding", inputs=2)
def dot_product_with_padding(op: Op) -> Kernel:
    """The dot product of rows of different lengths: the shorter row padded with `pad_value`, or with
    `replicate` repeated along the longer one (distance_op.cc)."""
    pad_value, replicate = _padding_args(op)

    def kernel(x, y):
        _float_pair(op, x, y)
        n, dx, dy = _padding_dims(op, x, y)
        if n == 0:
            return jnp.zeros((0,), x.dtype)
        xr, yr = jnp.reshape(x, (n, dx)), jnp.reshape(y, (n, dy))
        long_, short = (xr, yr) if dx > dy else (yr, xr)
        ds = short.shape[1]
        if replicate:
            k = _replicas(op, dx, dy)
            blocks = jnp.reshape(long_[:, : k * ds], (n, k, ds))
            return jnp.sum(blocks * short[:, None, :], axis=(1, 2))
        dot = jnp.sum(long_[:, :ds] * short, axis=1)
        return dot + jnp.sum(long_[:, ds:], axis=1) * jnp.asarray(pad_value, x.dtype)

    return kernel


@facet("gradient", "DotProductWithPadding")
def _dot_product_with_padding_gradient_maker(g: GradientContext) -> GradientOps:
    """Its own `pad_value` and `replicate` (read from fields f and i), then the copied forward args."""
    pad, replicate = g.arg("pad_value"), g.arg("replicate")
    args = [
        argument("pad_value", float(pad.f) if pad is not None else 0.0),
        argument("replicate", bool(replicate.i) if replicate is not None else False),
    ]
    inputs, outputs = [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)]
    return [gradient_op("DotProductWithPaddingGradient", inputs, outputs, args)]


@register("DotProductWithPaddingGradient", inputs=3, outputs=2)
def dot_product_with_padding_gradient(op: Op) -> Kernel:
    """`(X, Y, dZ) -> (dX, dY)`: each row of one input times dZ[i] goes to the other's matching part;
    padded positions get `dZ[i] * pad_value`. With `replicate` the row lengths must divide."""
    pad_value, replicate = _padding_args(op)

    def kernel(x, y, dz):
        _float_pair(op, x, y, dz)
        n, dx, dy = _padding_dims(op, x, y)
        if replicate and n and min(dx, dy) and max(dx, dy) % min(dx, dy):
            raise ShapeError(f"{op.where}: with replicate=1 one row length must divide the other ({dx}, {dy})")
        dz = _row_gradient_input(op, dz, n)
        if n == 0:
            return jnp.zeros_like(x), jnp.zeros_like(y)
        xr, yr = jnp.reshape(x, (n, dx)), jnp.reshape(y, (n, dy))
        x_longer = dx > dy
        long_, short = (xr, yr) if x_longer else (yr, xr)
        ds, dl = short.shape[1], long_.shape[1]
        g = jnp.reshape(dz, (n, 1))
        if replicate:
            k = _replicas(op, dx, dy)
            d_long = jnp.tile(g * short, (1, k))
            d_short = jnp.sum(jnp.reshape(g[:, :, None] * jnp.reshape(long_, (n, k, ds)), (n, k, ds)), axis=1)
        else:
            pad = jnp.broadcast_to(g * jnp.asarray(pad_value, x.dtype), (n, dl - ds))
            d_long = jnp.concatenate([g * short, pad], axis=1)
            d_short = g * long_[:, :ds]
        d_x, d_y = (d_long, d_short) if x_longer else (d_short, d_long)
        return jnp.reshape(d_x, x.shape), jnp.reshape(d_y, y.shape)

    return kernel


_COSINE_EPS = 1e-12


def _row_view(x: jax.Array) -> tuple[int, jax.Array]:
    """(N, X as N x size_from_dim(1))."""
    n = _rows(x)
    return n, jnp.reshape(x, (n, math.prod(x.shape[1:])))


@register("CosineSimilarity", inputs=2, gradient=_pairwise_gradient_maker)
def cosine_similarity(op: Op) -> Kernel:
    """`<X[i], Y[i]> / sqrt(max(|X[i]|^2, 1e-12) max(|Y[i]|^2, 1e-12))`."""

    def kernel(x, y):
        _float_pair(op, x, y)
        _same_dims(op, x, y)
        _, xr = _row_view(x)
        _, yr = _row_view(y)
        x2, y2 = jnp.sum(xr * xr, axis=1), jnp.sum(yr * yr, axis=1)
        eps = jnp.asarray(_COSINE_EPS, x.dtype)
        return jnp.sum(xr * yr, axis=1) / jnp.sqrt(jnp.maximum(x2, eps) * jnp.maximum(y2, eps))

    return kernel


@register("CosineSimilarityGradient", inputs=3, outputs=2)
def cosine_similarity_gradient(op: Op) -> Kernel:
    """dX[i] = dC[i] (Y[i] / (|X||Y|) - <X,Y> X[i] / (|X|^3 |Y|)), and symmetrically dY (distance_op.cc)."""

    def kernel(x, y, dc):
        _float_pair(op, x, y, dc)
        _same_dims(op, x, y)
        n, xr = _row_view(x)
        _, yr = _row_view(y)
        dc = jnp.reshape(_row_gradient_input(op, dc, n), (n, 1))
        eps = jnp.asarray(_COSINE_EPS, x.dtype)
        xn = jnp.sqrt(jnp.maximum(jnp.sum(xr * xr, axis=1, keepdims=True), eps))
        yn = jnp.sqrt(jnp.maximum(jnp.sum(yr * yr, axis=1, keepdims=True), eps))
        xyn = xn * yn
        xy = jnp.sum(xr * yr, axis=1, keepdims=True)
        own = dc / xyn
        x_own, x_cross = own * yr, (-dc * xy / (xn * xn * xyn)) * xr
        y_own, y_cross = own * xr, (-dc * xy / (yn * yn * xyn)) * yr
        dx, dy = x_own + x_cross, y_own + y_cross
        return jnp.reshape(dx, x.shape), jnp.reshape(dy, y.shape)

    return kernel


def _l1_view(x: jax.Array) -> tuple[int, jax.Array]:
    """(N, X as N x D) with D = size / N (0 when N is 0)."""
    n = _rows(x)
    return n, jnp.reshape(x, (n, x.size // n if n else 0))


@register("L1Distance", inputs=2, gradient=_pairwise_gradient_maker)
def l1_distance(op: Op) -> Kernel:
    """`sum_j |X[i, j] - Y[i, j]|` over rows of X and Y (one shape)."""

    def kernel(x, y):
        _float_pair(op, x, y)
        _same_dims(op, x, y)
        _, xr = _l1_view(x)
        _, yr = _l1_view(y)
        return jnp.sum(jnp.abs(xr - yr), axis=1)

    return kernel


@register("L1DistanceGradient", inputs=3, outputs=2)
def l1_distance_gradient(op: Op) -> Kernel:
    """`dX = dZ[i] sign(X - Y)`, 0 where |X - Y| <= 1e-12; `dY = -dX`."""

    def kernel(x, y, dz):
        _float_pair(op, x, y, dz)
        _same_dims(op, x, y)
        n, xr = _l1_view(x)
        _, yr = _l1_view(y)
        g = jnp.reshape(_row_gradient_input(op, dz, n), (n, 1))
        diff = xr - yr
        zero = jnp.zeros((), x.dtype)
        dx = jnp.where(diff < -_COSINE_EPS, -g, jnp.where(diff > _COSINE_EPS, g, zero))
        dy = jnp.where(diff < -_COSINE_EPS, g, jnp.where(diff > _COSINE_EPS, -g, zero))
        return jnp.reshape(dx, x.shape), jnp.reshape(dy, y.shape)

    return kernel


_SCALE_TYPES = frozenset(np.dtype(t) for t in (np.float32, np.int32, np.int64))


@register("SquareRootDivide", inputs=2, gradient=single_gradient("SquareRootDivide", "GO(0) I(1)"))
def square_root_divide(op: Op) -> Kernel:
    """Row i of DATA divided by sqrt(SCALE[i]) (unchanged where SCALE[i] is 0); SCALE (float, int32 or
    int64, first dim the batch size) must not be negative (square_root_divide_op.h)."""

    def kernel(data, scale):
        _check_dtypes(op, (data,), FLOATING, _FLOAT_KIND)
        if np.dtype(scale.dtype) not in _SCALE_TYPES:
            raise ShapeError(f"{op.where}: SCALE '{op.inputs[1]}' must be float, int32 or int64, got {scale.dtype}")
        if data.ndim == 0 or scale.ndim == 0:
            raise ShapeError(f"{op.where}: DATA and SCALE must have at least one dimension")
        n = data.shape[0]
        if scale.shape[0] != n:
            raise ShapeError(f"{op.where}: SCALE '{op.inputs[1]}' {list(scale.shape)} must have DATA's batch size {n}")
        s = jnp.reshape(scale, (-1,))[:n]
        message = f"{literal(op.where)}: SCALE '{literal(op.inputs[1])}' holds a negative value ({{bad}})"
        enforce(~jnp.any(s < 0), message, bad=first_bad(s, s < 0))
        sf = s.astype(data.dtype)
        multiplier = jnp.where(s == 0, jnp.ones((), data.dtype), 1 / jnp.sqrt(jnp.where(s == 0, 1, sf)))
        return data * jnp.reshape(multiplier, (n,) + (1,) * (data.ndim - 1))

    return kernel


@register("RowMul", inputs=2)
def row_mul(op: Op) -> Kernel:
    """Row i of MAT times W[i]; W (any shape) holds one value per row (caffe2/operators/rowmul_op.h)."""

    def kernel(mat, w):
        _float_pair(op, mat, w)
        if mat.ndim == 0 or w.size != mat.shape[0]:
            raise ShapeError(
                f"{op.where}: W '{op.inputs[1]}' {list(w.shape)} must hold one value per row of "
                f"'{op.inputs[0]}' {list(mat.shape)}"
            )
        return mat * jnp.reshape(w, (mat.shape[0],) + (1,) * (mat.ndim - 1))

    return kernel


@facet("gradient", "RowMul")
def _row_mul_gradient_maker(g: GradientContext) -> GradientOps:
    """dMAT = RowMul(dY, W); dW = the row sums of dY * MAT (reduction_ops.cc)."""
    before = g.GI(1) + "before_aggregate"
    return [
        gradient_op("RowMul", [g.GO(0), g.I(1)], [g.GI(0)]),
        gradient_op("Mul", [g.GO(0), g.I(0)], [before]),
        gradient_op("ReduceTailSum", [before], [g.GI(1)]),
    ]
