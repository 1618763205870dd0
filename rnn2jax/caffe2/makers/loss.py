"""Gradient makers of the loss ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs): cross_entropy_op.cc,
margin_ranking_criterion_op.cc, cosine_embedding_criterion_op.cc, rank_loss_op.cc, jsd_op.cc,
spatial_softmax_with_loss_op.cc; the metrics are SHOULD_NOT_DO_GRADIENT."""

from __future__ import annotations

from ..grad_makers import GradientContext, GradientError, gradient_op, register_gradient


def _single(op_type: str, inputs: list[str], outputs: list[str]) -> list:
    return [gradient_op(op_type, inputs, outputs)]


@register_gradient("WeightedSigmoidCrossEntropyWithLogits")
def _weighted_sigmoid_xent(g: GradientContext) -> list:
    inputs = [g.GO(0), g.I(0), g.I(1), g.I(2)]
    return _single("WeightedSigmoidCrossEntropyWithLogitsGradient", inputs, [g.GI(0)])


@register_gradient("MakeTwoClass")
def _make_two_class(g: GradientContext) -> list:
    return _single("MakeTwoClassGradient", [g.GO(0)], [g.GI(0)])


@register_gradient("MarginRankingCriterion")
def _margin_ranking(g: GradientContext) -> list:
    inputs = [g.I(0), g.I(1), g.I(2), g.GO(0)]
    return _single("MarginRankingCriterionGradient", inputs, [g.GI(0), g.GI(1)])


@register_gradient("CosineEmbeddingCriterion")
def _cosine_embedding(g: GradientContext) -> list:
    return _single("CosineEmbeddingCriterionGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_gradient("PairWiseLoss")
def _pair_wise_loss(g: GradientContext) -> list:
    inputs = [g.I(0), g.I(1), g.GO(0)]
    if len(g.op.input) == 3:
        inputs.append(g.I(2))
    return _single("PairWiseLossGradient", inputs, [g.GI(0)])


@register_gradient("BernoulliJSD")
def _bernoulli_jsd(g: GradientContext) -> list:
    return _single("BernoulliJSDGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0)])


@register_gradient("SpatialSoftmaxWithLoss")
def _spatial_softmax_with_loss(g: GradientContext) -> list:
    inputs = [g.I(0), g.I(1), g.O(0), g.GO(1)]
    if len(g.op.input) == 3:
        inputs.insert(2, g.I(2))
    return _single("SpatialSoftmaxWithLossGradient", inputs, [g.GI(0)])


@register_gradient("Accuracy", "MultiClassAccuracy", "Perplexity")
def _should_not_do_gradient(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")
