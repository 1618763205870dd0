"""Gradient makers of the reduce and normalisation ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs):
caffe2/operators/reduce_ops.cc, reduce_front_back_max_ops.cc, reduction_ops.cc, moments_op.cc,
batch_moments_op.cc, spatial_batch_norm_op.cc, group_norm_op.cc, instance_norm_op.cc,
affine_channel_op.cc, lpnorm_op.cc, normalize_op.cc, rms_norm_op.cc."""

from __future__ import annotations

from ..grad_makers import GradientContext, GradientError, gradient_op, register_gradient


def _single(op_type: str, inputs: list[str], outputs: list[str]) -> list:
    return [gradient_op(op_type, inputs, outputs)]


@register_gradient("ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2")
def _reduce_axes(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.GO(0), g.I(0), g.O(0)], [g.GI(0)])


@register_gradient("ReduceFrontMax", "ReduceBackMax")
def _reduce_front_back_max(g: GradientContext) -> list:
    inputs = [g.GO(0), g.I(0), g.O(0)] + ([g.I(1)] if len(g.op.input) == 2 else [])
    return _single(g.op.type + "Gradient", inputs, [g.GI(0)])


@register_gradient("RowwiseMax", "ColwiseMax")
def _row_col_max(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])


@register_gradient("SumElementsInt", "ChannelStats", "ChannelBackpropStats", "Summarize")
def _should_not_do_gradient(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")


@register_gradient("BatchBoxCox")
def _gradient_not_implemented(g: GradientContext) -> list:
    raise GradientError(f"Operator {g.op.type} should have a gradient but is not implemented yet.")


@register_gradient("Moments")
def _moments(g: GradientContext) -> list:
    return _single("MomentsGradient", [g.GO(0), g.GO(1), g.I(0), g.O(0)], [g.GI(0)])


@register_gradient("BatchMoments")
def _batch_moments(g: GradientContext) -> list:
    return _single("BatchMomentsGradient", [g.GO(0), g.GO(1), g.I(0)], [g.GI(0)])


@register_gradient("SpatialBN")
def _spatial_bn(g: GradientContext) -> list:
    """Test mode hands the running mean and variance over as the saved mean and inverse std."""
    is_test = g.arg("is_test")
    num_batches = g.arg("num_batches")
    outputs = [g.GI(0), g.GI(1), g.GI(2)]
    n_in, n_out = len(g.op.input), len(g.op.output)
    if is_test is not None and is_test.i:
        _enforce(n_in == 5 and n_out == 1, "SpatialBN in test mode has 5 inputs and 1 output")
        inputs = [g.I(0), g.I(1), g.GO(0), g.I(3), g.I(4)]
    elif num_batches is not None and num_batches.i > 1:
        _enforce(n_in == 7 and n_out == 5, "SpatialBN with num_batches > 1 has 7 inputs and 5 outputs")
        inputs = [g.I(0), g.I(1), g.GO(0), g.O(3), g.O(4), g.GI(1), g.GI(2)]
    else:
        _enforce(n_in == 5 and n_out == 5, "SpatialBN in training mode has 5 inputs and 5 outputs")
        inputs = [g.I(0), g.I(1), g.GO(0), g.O(3), g.O(4)]
    return _single("SpatialBNGradient", inputs, outputs)


def _enforce(ok: bool, message: str) -> None:
    if not ok:
        raise GradientError(message)


@register_gradient("GroupNorm")
def _group_norm(g: GradientContext) -> list:
    _enforce(len(g.op.output) == 3, "(i >= 0) && (i < def_.output().size()): GroupNorm's gradient reads mu and rsig")
    inputs = [g.GO(0), g.I(0), g.I(1), g.I(2), g.O(1), g.O(2)]
    return _single("GroupNormGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])


@register_gradient("InstanceNorm")
def _instance_norm(g: GradientContext) -> list:
    inputs = [g.I(0), g.I(1), g.I(2), g.GO(0)] + [g.O(i) for i in range(1, len(g.op.output))]
    return _single("InstanceNormGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])


@register_gradient("AffineChannel")
def _affine_channel(g: GradientContext) -> list:
    if g.flag("is_learnable", False):
        return _single("AffineChannelGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1), g.GI(2)])
    return _single("AffineChannelGradient", [g.GO(0), g.I(1)], [g.GI(0)])


@register_gradient("LpNorm", "Normalize")
def _from_input(g: GradientContext) -> list:
    if g.op.type == "Normalize":
        _enforce(len(g.op.input) == 1, "Normalize has one input")
    return _single(g.op.type + "Gradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_gradient("RMSNorm")
def _rms_norm(g: GradientContext) -> list:
    return _single("RMSNormGradient", [g.GO(0), g.I(0), g.I(1), g.O(1)], [g.GI(0), g.GI(1), g.GI(2)])
