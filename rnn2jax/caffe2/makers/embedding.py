"""Gradient makers of the embedding ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs).

SparseLengths{Sum,Mean,WeightedSum} use `LengthsOpGetGradient` (caffe2/operators/segment_reduction_op.h,
SparseFused, GradientNeedIndices): one `SparseLengthsIndicesInGradient*Gradient` op whose output is the
values of DATA's gradient slice, indexed by the forward op's INDICES. The quantized lookups and the
quantizers are NO_GRADIENT.
"""

from __future__ import annotations

from ..grad_makers import GradientContext, gradient_op, register_gradient


def _values(g: GradientContext) -> str:
    """Caffe2's GI_V(0): DATA's gradient slice values, indexed by INDICES."""
    return g.I(0) + "_grad_values"


@register_gradient("SparseLengthsSum", "SparseLengthsMean")
def _sparse_lengths(g: GradientContext) -> list:
    reducer = g.op.type.removeprefix("SparseLengths")
    values = _values(g)
    op = gradient_op(f"SparseLengthsIndicesInGradient{reducer}Gradient", [g.GO(0), g.I(2), g.I(1)], [values])
    g.set_dense(0, (g.I(1), values))  # type: ignore[arg-type]  (a sparse gradient: indices, values)
    return [op]


@register_gradient("SparseLengthsWeightedSum")
def _sparse_lengths_weighted_sum(g: GradientContext) -> list:
    """With `grad_on_weights`, the WithMainInput op also reads DATA and gives WEIGHTS' gradient."""
    values = _values(g)
    if g.flag("grad_on_weights", False):
        inputs, outputs = [g.I(1), g.GO(0), g.I(3), g.I(0), g.I(2)], [values, g.GI(1)]
        op_type = "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient"
    else:
        inputs, outputs = [g.I(1), g.GO(0), g.I(3), g.I(2)], [values]
        op_type = "SparseLengthsIndicesInGradientWeightedSumGradient"
    op = gradient_op(op_type, inputs, outputs)
    g.set_dense(0, (g.I(2), values))  # type: ignore[arg-type]
    return [op]


# NO_GRADIENT (caffe2/operators/lengths_reducer_*rowwise*_ops.cc, fused_rowwise_*_conversion_ops.cc)
@register_gradient(
    *(
        f"SparseLengths{kind}{form}"
        for kind in ("Sum", "Mean", "WeightedSum")
        for form in ("8BitsRowwise", "Fused8BitRowwise", "Fused4BitRowwise", "Fused2BitRowwise")
    ),
    "SparseLengthsWeightedMean8BitsRowwise",
    "FloatToFused8BitRowwiseQuantized",
    "HalfFloatToFused8BitRowwiseQuantized",
    "FloatToFused8BitRowwiseQuantizedHalfScaleBias",
    "HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias",
    "Fused8BitRowwiseQuantizedToFloat",
    "Fused8BitRowwiseQuantizedToHalfFloat",
    "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat",
    "Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat",
    "FloatToFused4BitRowwiseQuantized",
    "HalfToFused4BitRowwiseQuantized",
    "FloatToFused2BitRowwiseQuantized",
    "HalfToFused2BitRowwiseQuantized",
    "Fused4BitRowwiseQuantizedToFloat",
    "Fused4BitRowwiseQuantizedToHalf",
    "Fused2BitRowwiseQuantizedToFloat",
    "Fused2BitRowwiseQuantizedToHalf",
    "FloatToRowwiseQuantized8Bits",
    "Rowwise8BitQuantizedToFloat",
)
def _no_gradient(g: GradientContext) -> list:
    return []
