"""Gradient makers of the array and image-layout ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs):
caffe2/operators/tile_op.cc, expand_op.cc, utility_ops.cc, conditional_op.cc, top_k.cc, flexible_top_k.cc,
ensure_dense_op.cc, prepend_dim_op.cc, order_switch_ops.cc, filler_op.cc, space_batch_op.cc, pad_op.cc,
channel_shuffle_op.cc, upsample_op.cc, resize_op.cc, resize_3d_op.cc, local_response_normalization_op.cc,
im2col_op.cc, batch_permutation_op.cc, integral_image_op.cc."""

from __future__ import annotations

from ..grad_makers import GradientContext, GradientError, gradient_op, register_gradient


def _single(op_type: str, inputs: list[str], outputs: list[str]) -> list:
    return [gradient_op(op_type, inputs, outputs)]


@register_gradient("Size", "Conditional", "Range", "DiagonalFill", "UniqueUniformFill")
def _no_gradient(g: GradientContext) -> list:
    return []


@register_gradient("HasElements", "IsEmpty", "Accumulate", "WeightScale")
def _should_not_do_gradient(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")


@register_gradient("Tile")
def _tile(g: GradientContext) -> list:
    """tiles and axis inputs (when given) go along."""
    return _single("TileGradient", [g.GO(0), *g.op.input[1:3]], [g.GI(0)])


@register_gradient("Expand")
def _expand(g: GradientContext) -> list:
    return _single("ExpandGradient", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("FlattenToVec")
def _flatten_to_vec(g: GradientContext) -> list:
    return _single("ResizeLike", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("TopK")
def _top_k(g: GradientContext) -> list:
    return _single("TopKGradient", [g.GO(0), g.O(1), g.I(0)], [g.GI(0)])


@register_gradient("FlexibleTopK")
def _flexible_top_k(g: GradientContext) -> list:
    return _single("FlexibleTopKGradient", [g.I(0), g.I(1), g.GO(0), g.O(1)], [g.GI(0)])


@register_gradient("EnsureDense")
def _ensure_dense(g: GradientContext) -> list:
    g.set_dense(0, g.GO(0))
    return []


@register_gradient("PrependDim")
def _prepend_dim(g: GradientContext) -> list:
    g.copy_args = False  # MergeDim takes no dim_size
    return _single("MergeDim", [g.GO(0)], [g.GI(0)])


_INVERSE = {
    "NCHW2NHWC": "NHWC2NCHW",
    "NHWC2NCHW": "NCHW2NHWC",
    "SpaceToBatch": "BatchToSpace",
    "BatchToSpace": "SpaceToBatch",
    "Col2Im": "Im2Col",
    "PadImage": "PadImageGradient",
    "ChannelShuffle": "ChannelShuffleGradient",
}


@register_gradient(*_INVERSE)
def _inverse(g: GradientContext) -> list:
    """dY -> dX by one op (the inverse layout switch, or the op's own gradient op)."""
    return _single(_INVERSE[g.op.type], [g.GO(0)], [g.GI(0)])


@register_gradient("UpsampleBilinear", "ResizeNearest", "ResizeNearest3D")
def _resize(g: GradientContext) -> list:
    """(dY, X[, scales])."""
    return _single(g.op.type + "Gradient", [g.GO(0), g.I(0), *g.op.input[1:2]], [g.GI(0)])


@register_gradient("LRN")
def _lrn(g: GradientContext) -> list:
    return _single("LRNGradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])


@register_gradient("Im2Col")
def _im2col(g: GradientContext) -> list:
    return _single("Col2Im", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("BatchPermutation")
def _batch_permutation(g: GradientContext) -> list:
    return _single("BatchPermutationGradient", [g.I(1), g.GO(0)], [g.GI(0)])


@register_gradient("IntegralImage")
def _integral_image(g: GradientContext) -> list:
    return _single("IntegralImageGradient", [g.I(0), g.GO(0)], [g.GI(0)])
