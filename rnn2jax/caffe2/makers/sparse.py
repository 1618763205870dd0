"""Gradient makers of the sparse ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""

from __future__ import annotations

from ..grad_makers import GradientContext, GradientError, gradient_op, register_gradient
from ..opdef import make_argument


@register_gradient("PackSegments")
def _pack_segments(g: GradientContext) -> list:
    return [gradient_op("UnpackSegments", [g.I(0), g.GO(0)], [g.GI(1)])]


@register_gradient("UnpackSegments")
def _unpack_segments(g: GradientContext) -> list:
    return [gradient_op("PackSegments", [g.I(0), g.GO(0)], [g.GI(1)])]


@register_gradient("BatchGather")
def _batch_gather(g: GradientContext) -> list:
    return [gradient_op("BatchGatherGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])]


@register_gradient("SparseToDenseMask")
def _sparse_to_dense_mask(g: GradientContext) -> list:
    inputs = [g.I(0), g.GO(0)] + ([g.I(3)] if len(g.op.input) == 4 else [])
    return [gradient_op("SparseToDenseMaskGradient", inputs, [g.GI(1)])]


# NO_GRADIENT: the op has no gradient and emits no gradient ops.
@register_gradient(
    "GatherRangesToDense",
    "LengthsPad",
    "LengthsRangeFill",
    "BooleanMaskLengths",
    "SegmentOneHot",
    "MergeIdLists",
    "Partition",
    "LengthsPartition",
    "BooleanUnmask",
    "BatchBucketize",
)
def _no_gradient(g: GradientContext) -> list:
    return []


# SHOULD_NOT_DO_GRADIENT: asking for the gradient is an error.
@register_gradient(
    "LengthsGather",
    "ScatterAssign",
    "ScatterWeightedSum",
    "Scatter",
    "Unique",
    "RemoveDataBlocks",
    "FindDuplicateElements",
    "IndexHash",
)
def _should_not_do_gradient(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")


@register_gradient("LengthsTile")
def _lengths_tile(g: GradientContext) -> list:
    return [gradient_op("LengthsSum", [g.GO(0), g.I(1)], [g.GI(0)])]


@register_gradient("LengthsTopK")
def _lengths_top_k(g: GradientContext) -> list:
    return [gradient_op("LengthsTopKGradient", [g.I(1), g.O(1), g.GO(0)], [g.GI(0)])]


@register_gradient("BatchSparseToDense")
def _batch_sparse_to_dense(g: GradientContext) -> list:
    return [gradient_op("BatchDenseToSparse", [g.I(0), g.I(1), g.GO(0)], [g.GI(2)])]


@register_gradient("BatchDenseToSparse")
def _batch_dense_to_sparse(g: GradientContext) -> list:
    return [gradient_op("BatchSparseToDense", [g.I(0), g.I(1), g.GO(0), g.I(2)], [g.GI(2)])]


@register_gradient("BooleanMask")
def _boolean_mask(g: GradientContext) -> list:
    return [gradient_op("BooleanMaskGradient", [g.I(1), g.GO(0)], [g.GI(0)])]


@register_gradient("SplitByLengths")
def _split_by_lengths(g: GradientContext) -> list:
    """Caffe2 registers Split's maker: Concat of the output gradients there are."""
    grads = [g.GO(i) for i in range(len(g.op.output)) if g.g_output[i] is not None]
    if not grads:
        return []
    return [gradient_op("Concat", grads, [g.GI(0), "_" + g.GI(0) + "_dims"])]


@register_gradient("GatherByKey")
def _gather_by_key(g: GradientContext) -> list:
    outputs = []
    for i in range(1, len(g.op.input)):
        outputs += ["_" + g.GI(i) + "_keys", g.GI(i)]
    return [gradient_op("Partition", [g.I(0), g.GO(0)], outputs, [make_argument("pack_first_input", 0)])]


@register_gradient("LengthsSplit")
def _gradient_not_implemented_yet(g: GradientContext) -> list:
    raise GradientError(f"Operator {g.op.type} should have a gradient but is not implemented yet.")
