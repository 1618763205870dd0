"""Gradient makers of the activation ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""

from __future__ import annotations

from ..grad_makers import GradientContext, gradient_op, register_gradient


@register_gradient("HardSigmoid", "Elu", "Selu", "ReluN", "ThresholdedRelu", "Softplus")
def _from_output(g: GradientContext) -> list:
    """`<Op>Gradient(Y, dY)`."""
    return [gradient_op(g.op.type + "Gradient", [g.O(0), g.GO(0)], [g.GI(0)])]


@register_gradient("Swish", "Mish")
def _from_input_and_output(g: GradientContext) -> list:
    """`<Op>Gradient(X, Y, dY)`."""
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])]


@register_gradient("Gelu")
def _gelu(g: GradientContext) -> list:
    return [gradient_op("GeluGradient", [g.GO(0), g.I(0)], [g.GI(0)])]


@register_gradient("PRelu")
def _prelu(g: GradientContext) -> list:
    return [gradient_op("PReluGradient", [g.O(0), g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1)])]
