"""Gradient makers of the math ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""

from __future__ import annotations

import numpy as np

from ..grad_makers import GradientContext, GradientError, gradient_op, register_gradient
from ..opdef import make_argument


def _single(op_type: str, inputs: list[str], outputs: list[str], args: list = ()) -> list:
    return [gradient_op(op_type, inputs, outputs, args)]


@register_gradient("ReplaceNaN", "EnforceFinite", "Sign", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "IsMemberOf")
def _should_not_do_gradient(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")


@register_gradient("Ceil", "Floor")
def _not_implemented_yet(g: GradientContext) -> list:
    raise GradientError(f"Operator {g.op.type} should have a gradient but is not implemented yet.")


@register_gradient("Logit", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Log1p")
def _input_then_grad(g: GradientContext) -> list:
    """`<Op>Gradient(X, dY)`."""
    return _single(g.op.type + "Gradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_gradient("Cube", "Sinh", "Cosh")
def _grad_then_input(g: GradientContext) -> list:
    """`<Op>Gradient(dY, X)`."""
    return _single(g.op.type + "Gradient", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("Rsqrt", "Cbrt")
def _grad_then_output(g: GradientContext) -> list:
    """`<Op>Gradient(dY, Y)`."""
    return _single(g.op.type + "Gradient", [g.GO(0), g.O(0)], [g.GI(0)])


@register_gradient("Reciprocal")
def _reciprocal(g: GradientContext) -> list:
    return _single("ReciprocalGradient", [g.O(0), g.GO(0)], [g.GI(0)])


@register_gradient("Sqr")
def _sqr(g: GradientContext) -> list:
    """dX = 2 dY X: Scale doubles dY IN PLACE (sqr_op.cc), then Mul."""
    return [
        gradient_op("Scale", [g.GO(0)], [g.GO(0)], [make_argument("scale", 2.0)]),
        gradient_op("Mul", [g.GO(0), g.I(0)], [g.GI(0)]),
    ]


def _legacy_args(g: GradientContext) -> list:
    """The forward's broadcast, axis, axis_str and order, defaults filled in (GetPowGradient)."""
    defaults = (("broadcast", 0), ("axis", -1), ("axis_str", ""), ("order", "NCHW"))
    args = []
    for name, default in defaults:
        arg = g.arg(name)
        if arg is None:
            arg = make_argument(name, default)
        args.append(arg)
    return args


@register_gradient("Pow")
def _pow(g: GradientContext) -> list:
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
            gradient_op("Pow", [g.I(0)], [g.GI(0)], [make_argument("exponent", float(power))]),
            gradient_op("Mul", [g.GI(0), g.GO(0)], [g.GI(0)]),
            gradient_op("Scale", [g.GI(0)], [g.GI(0)], [make_argument("scale", float(e))]),
        ]
    if g.I(0) == g.O(0) or g.I(1) == g.O(0):
        raise GradientError("Gradient computation cannot be carried out if Pow uses in-place computation")
    legacy = g.arg("broadcast") is not None
    args = _legacy_args(g) if legacy else []
    x, e, gx, ge = g.I(0), g.I(1), g.GI(0), g.GI(1)
    pre = ge + "_autogen_pre_red"
    ops = [
        gradient_op("ConstantFill", [e], [ge], [make_argument("value", 1.0)]),
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


@register_gradient("Max", "Min")
def _select(g: GradientContext) -> list:
    """`<Op>Gradient(Y, dY, X0, X1, ...) -> (dX0, dX1, ...)`."""
    n = len(g.op.input)
    inputs = [g.O(0), g.GO(0), *(g.I(i) for i in range(n))]
    return _single(g.op.type + "Gradient", inputs, [g.GI(i) for i in range(n)])


@register_gradient("Mean")
def _mean(g: GradientContext) -> list:
    return _single("MeanGradient", [g.GO(0)], [g.GI(i) for i in range(len(g.op.input))])


@register_gradient("DotProduct", "CosineSimilarity", "L1Distance")
def _pairwise(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])


@register_gradient("DotProductWithPadding")
def _dot_product_with_padding(g: GradientContext) -> list:
    """Its own `pad_value` and `replicate` (read from fields f and i), then the copied forward args."""
    pad, replicate = g.arg("pad_value"), g.arg("replicate")
    args = [
        make_argument("pad_value", float(pad.f) if pad is not None else 0.0),
        make_argument("replicate", bool(replicate.i) if replicate is not None else False),
    ]
    return _single("DotProductWithPaddingGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)], args)


@register_gradient("SquareRootDivide")
def _square_root_divide(g: GradientContext) -> list:
    return _single("SquareRootDivide", [g.GO(0), g.I(1)], [g.GI(0)])


@register_gradient("RowMul")
def _row_mul(g: GradientContext) -> list:
    """dMAT = RowMul(dY, W); dW = the row sums of dY * MAT (reduction_ops.cc)."""
    before = g.GI(1) + "before_aggregate"
    return [
        gradient_op("RowMul", [g.GO(0), g.I(1)], [g.GI(0)]),
        gradient_op("Mul", [g.GO(0), g.I(0)], [before]),
        gradient_op("ReduceTailSum", [before], [g.GI(1)]),
    ]


@register_gradient("NanCheck")
def _nan_check(g: GradientContext) -> list:
    return _single("NanCheck", [g.GO(0)], [g.GI(0)])


@register_gradient("NegateGradient")
def _negate_gradient(g: GradientContext) -> list:
    return _single("Negative", [g.GO(0)], [g.GI(0)])


@register_gradient("ZeroGradient")
def _zero_gradient(g: GradientContext) -> list:
    return _single("ConstantFill", [g.I(0)], [g.GI(0)], [make_argument("value", 0.0)])
