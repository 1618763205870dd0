"""Gradient makers of the convolution and pooling ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""

from __future__ import annotations

from ..grad_makers import GradientContext, GradientError, gradient_op, register_gradient
from ..opdef import make_argument


@register_gradient("Conv", "Conv1D", "Conv2D", "Conv3D", "ConvTranspose")
def _conv(g: GradientContext) -> list:
    """GetConvGradient (conv_gradient_op.cc) and GetConvTransposeGradient: (X, W, dY) -> dW, db, dX;
    without a bias input the op gets no_bias=1, and no_gradient_to_input=1 leaves dX out."""
    if len(g.op.input) not in (2, 3):
        raise GradientError(f"{g.op.type} takes 2 or 3 inputs, got {len(g.op.input)}")
    with_dx = not g.flag("no_gradient_to_input", False)
    inputs = [g.I(0), g.I(1), g.GO(0)]
    if len(g.op.input) == 3:
        outputs = [g.GI(1), g.GI(2)] + ([g.GI(0)] if with_dx else [])
        return [gradient_op(g.op.type + "Gradient", inputs, outputs)]
    outputs = [g.GI(1)] + ([g.GI(0)] if with_dx else [])
    return [gradient_op(g.op.type + "Gradient", inputs, outputs, [make_argument("no_bias", 1)])]


_POOLS = (*tuple(f"{kind}{rank}" for kind in ("MaxPool", "AveragePool") for rank in ("", "1D", "2D", "3D")), "LpPool")


@register_gradient(*_POOLS)
def _pool(g: GradientContext) -> list:
    """GetPoolGradient (pool_gradient_op.cc, lp_pool_op.cc): (X, Y, dY) -> dX."""
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])]
