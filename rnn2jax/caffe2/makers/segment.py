"""Gradient makers of the segment ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs), from
caffe2/operators/segment_reduction_op.h (AbstractSortedSegmentRangeDef, SegmentOpGetGradient,
LengthsOpGetGradient, AbstractReduceFrontDef) and utility_ops.cc. LengthsSum/LengthsMean's maker is
in grad_makers.py."""

from __future__ import annotations

from ..grad_makers import GradientContext, GradientError, gradient_op, register_gradient

_RANGE = ("Sum", "Mean", "Max", "LogSumExp", "LogMeanExp")
_REDUCERS = ("Sum", "Mean", "WeightedSum")
_LAYOUTS = ("SortedSegment", "UnsortedSegment", "SparseSortedSegment", "SparseUnsortedSegment")


@register_gradient(*(f"SortedSegmentRange{r}" for r in _RANGE))
def _sorted_segment_range(g: GradientContext) -> list:
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.O(0), g.GO(0), g.I(1)], [g.GI(0)])]


@register_gradient(*(f"{layout}{r}" for layout in _LAYOUTS for r in _REDUCERS))
def _segment(g: GradientContext) -> list:
    """The Sparse* forms' gradient is a GradientSlice (INDICES, values) from the same gradient op."""
    if g.flag("grad_on_weights", False) and g.op.type.endswith("WeightedSum"):
        raise GradientError("grads on aux inputs are not yet implemented for Segment operators.")
    reducer = next(r for r in _REDUCERS[::-1] if g.op.type.endswith(r))
    sparse = g.op.type.startswith("Sparse")
    layout = g.op.type.removeprefix("Sparse").removesuffix(reducer)
    aux = 2 if reducer == "WeightedSum" else 1
    inputs = [g.I(1)] if reducer == "WeightedSum" else []
    inputs += [g.GO(0), g.I(aux + sparse)]
    if sparse:
        values = g.I(0) + "_grad_values"
        g.set_dense(0, (g.I(aux), values))  # type: ignore[arg-type]  (a sparse gradient: indices, values)
    else:
        values = g.GI(0)
    return [gradient_op(f"{layout}{reducer}Gradient", inputs, [values])]


@register_gradient("LengthsMax")
def _lengths_max(g: GradientContext) -> list:
    inputs = [g.O(0), g.GO(0), g.I(1), g.I(0)]
    return [gradient_op("LengthsMaxWithMainInputAndForwardOutputGradient", inputs, [g.GI(0)])]


@register_gradient("LengthsWeightedSum")
def _lengths_weighted_sum(g: GradientContext) -> list:
    """With `grad_on_weights` the gradient op also reads DATA and gives SCALARS' gradient."""
    if g.flag("grad_on_weights", False):
        inputs, outputs = [g.I(1), g.GO(0), g.I(2), g.I(0)], [g.GI(0), g.GI(1)]
        return [gradient_op("LengthsWeightedSumWithMainInputGradient", inputs, outputs)]
    return [gradient_op("LengthsWeightedSumGradient", [g.I(1), g.GO(0), g.I(2)], [g.GI(0)])]


@register_gradient("ReduceFrontWeightedSum")
def _reduce_front_weighted_sum(g: GradientContext) -> list:
    """DATA's shape through a Shape op; both ops get the forward arguments."""
    dims = "_" + g.O(0) + "_dims"
    return [
        gradient_op("Shape", [g.I(0)], [dims]),
        gradient_op("ReduceFrontWeightedSumGradient", [g.I(1), g.GO(0), dims], [g.GI(0)]),
    ]


@register_gradient("SegmentIdsToLengths", "SegmentIdsToRanges", "LengthsToShape")
def _should_not_do_gradient(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")
