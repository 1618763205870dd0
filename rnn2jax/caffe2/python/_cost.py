"""Caffe2's per-op cost inference (`workspace.GetOperatorCost`): the (flops, bytes_written, bytes_read) its
op schemas compute from the input shapes and dtypes, for the ops whose formulas rnn2jax carries.

XLA fuses a compiled net, so rnn2jax has no cost of its own per op: these are Caffe2's formulas (its
`CostInferenceForConv` and `PointwiseCostInference`), not measurements. An op Caffe2 has no cost function
for fails as in Caffe2; one Caffe2 has a function for but rnn2jax does not carry is an error naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import BadArgumentError, UnsupportedOpError
from ..proto import caffe2_pb2

Shape = tuple[tuple[int, ...], np.dtype]  # a blob's dims and dtype

# Caffe2 1.10's ops with a cost inference function (asked of the torch 1.10.2 wheel)
CAFFE2_COST_OPS = frozenset(
    [
        "Adagrad",
        "Add",
        "BatchMatMul",
        "BatchOneHot",
        "Concat",
        "Conv",
        "Conv2D",
        "Conv3D",
        "ConvRelu",
        "Div",
        "DotProduct",
        "FC",
        "FCGradient",
        "FCTransposed",
        "FCTransposedGradient",
        "FbFCPacked",
        "Gelu",
        "HardSigmoid",
        "Int8Concat",
        "Int8Conv",
        "Int8ConvRelu",
        "Int8FC",
        "Int8LeakyRelu",
        "Int8Relu",
        "Int8Sum",
        "Int8SumRelu",
        "LeakyRelu",
        "Mul",
        "MulGradient",
        "NCCLAllreduce",
        "Relu",
        "ReluN",
        "RowWiseSparseAdagrad",
        "SparseAdagrad",
        "SparseLengthsMean",
        "SparseLengthsSum",
        "SparseLengthsWeightedSum",
        "SpatialBN",
        "Split",
        "Sub",
        "Sum",
        "ThresholdedRelu",
        "Conv1D",
    ]
)
_CONV = frozenset({"Conv", "Conv1D", "Conv2D", "Conv3D", "ConvRelu"})
_POINTWISE = {"Relu": 0, "LeakyRelu": 2, "Gelu": 2, "ThresholdedRelu": 2, "ReluN": 2, "HardSigmoid": 4}


def operator_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[Shape]) -> tuple[int, int, int]:
    """Caffe2's `OpSchema::InferCost` of `op` given its inputs' shapes: (flops, bytes_written, bytes_read)."""
    if op.type in _CONV:
        return _conv_cost(op, shapes)
    if op.type == "Concat":
        return _concat_cost(op, shapes)
    if op.type == "Split":  # moves its first input: reads every input (the lengths too), writes the first's bytes
        return 0, _elements(shapes[0][0]) * shapes[0][1].itemsize, sum(_elements(d) * t.itemsize for d, t in shapes)
    if op.type in _POINTWISE:
        size = int(np.prod(shapes[0][0], dtype=np.int64))
        read = sum(int(np.prod(dims, dtype=np.int64)) * dtype.itemsize for dims, dtype in shapes)
        return size * _POINTWISE[op.type], size * shapes[0][1].itemsize, read
    if op.type in CAFFE2_COST_OPS:
        raise UnsupportedOpError(
            f"GetOperatorCost: rnn2jax does not carry Caffe2's cost inference of {op.type} (it has it for "
            f"{', '.join(sorted(_CONV | set(_POINTWISE) | {'Concat', 'Split'}))})",
            (("GetOperatorCost", op.type),),
        )
    raise BadArgumentError(f"GetOperatorCost: {op.type}: Cost inference function not defined.")


def _elements(dims: tuple[int, ...]) -> int:
    return int(np.prod(dims, dtype=np.int64))


def _concat_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[Shape]) -> tuple[int, int, int]:
    """Caffe2's `CostInferenceForConcat` (1.10, asked of the wheel): every element read and the result written
    at the first input's item size, plus the int32 split_info of one entry per input, written even when the op
    has no such output."""
    args = _args(op)
    if "axis" in args:
        axis = args["axis"].i
    else:
        order = args["order"].s.decode() if "order" in args else "NCHW"
        if order not in ("NCHW", "NHWC"):
            raise BadArgumentError(f"GetOperatorCost: Concat: unknown order {order!r}")
        axis = 1 if order == "NCHW" else 3
    add_axis = "add_axis" in args and args["add_axis"].i != 0
    dims0 = list(shapes[0][0])
    rank = len(dims0) + add_axis
    canonical = axis + rank if axis < 0 else axis
    if not 0 <= canonical < rank:
        raise BadArgumentError(f"GetOperatorCost: Concat: axis {axis} is out of range for {rank} dims")
    if add_axis:
        dims0.insert(canonical, len(shapes))
    else:
        for dims, _ in shapes[1:]:
            if len(dims) <= canonical:
                raise BadArgumentError(f"GetOperatorCost: Concat: an input of shape {list(dims)} has no axis {axis}")
            dims0[canonical] += dims[canonical]
    item = shapes[0][1].itemsize
    read = sum(_elements(dims) for dims, _ in shapes) * item
    return 0, _elements(tuple(dims0)) * item + 4 * len(shapes), read


def _args(op: caffe2_pb2.OperatorDef) -> dict[str, caffe2_pb2.Argument]:
    return {a.name: a for a in op.arg}


def _conv_output_spatial(op: caffe2_pb2.OperatorDef, x_dims: tuple[int, ...], nchw: bool) -> list[int]:
    """The output's spatial dims as Caffe2's Conv schema infers them (`TensorInferenceForSchema`)."""
    args = _args(op)

    def ints(name: str) -> list[int]:
        return list(args[name].ints) if name in args else []

    def one(name: str, default: int) -> int:
        return args[name].i if name in args else default

    pads, kernel, strides, dilations = ints("pads"), ints("kernels"), ints("strides"), ints("dilation")
    if "pad" in args:
        pads = (pads + [one("pad", 0)] * 4)[:4]  # C++ resize(4, pad)
    elif all(k in args for k in ("pad_t", "pad_l", "pad_b", "pad_r")):
        pads += [one(k, 0) for k in ("pad_t", "pad_l", "pad_b", "pad_r")]
    if "kernel" in args:
        kernel = (kernel + [one("kernel", 1)] * 2)[:2]
    elif "kernel_h" in args and "kernel_w" in args:
        kernel += [one("kernel_h", 1), one("kernel_w", 1)]
    if "stride" in args:
        strides = (strides + [one("stride", 1)] * 2)[:2]
    elif "stride_h" in args and "stride_w" in args:
        strides += [one("stride_h", 1), one("stride_w", 1)]
    kernel = kernel or [1, 1]
    strides = strides or [1] * len(kernel)
    pads = pads or [0] * (2 * len(kernel))
    dilations = dilations or [1] * len(kernel)
    spatial = list(x_dims[2:] if nchw else x_dims[1:-1])
    if one("global_pooling", 0):
        return [1] * len(spatial)
    if one("legacy_pad", 0) != 0 or len(spatial) != len(kernel):
        raise UnsupportedOpError(
            f"GetOperatorCost: {op.type}: rnn2jax infers Caffe2's Conv output shape only without legacy_pad "
            f"and with one kernel size per spatial dim ({len(spatial)} spatial dims, kernel {kernel})",
            (("GetOperatorCost", op.type),),
        )
    out = []
    for i, size in enumerate(spatial):
        head, tail = pads[i], pads[i + len(kernel)]
        dkernel = dilations[i] * (kernel[i] - 1) + 1
        if size + head + tail < dkernel:
            raise BadArgumentError(f"GetOperatorCost: {op.type}: kernel {dkernel} is larger than padded input {size}")
        out.append(int((size + head + tail - dkernel) / strides[i] + 1))
    return out


def _conv_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[Shape]) -> tuple[int, int, int]:
    """Caffe2's `CostInferenceForConv` (grouping ignored, as Caffe2 ignores it; Y is float32, as its schema says)."""
    if len(shapes) < 2:
        raise BadArgumentError(f"GetOperatorCost: {op.type}: Conv requires at least 2 inputs")
    (x, x_dtype), (w, _) = shapes[0], shapes[1]
    if not x or not w:
        return 0, 0, 0
    order = _args(op)["order"].s.decode() if "order" in _args(op) else "NCHW"
    nchw = order != "NHWC"
    y_spatial = _conv_output_spatial(op, x, nchw)
    out_channels = w[0]
    in_channels = w[1] if nchw else w[-1]
    kernel = w[2:] if nchw else w[1:-1]
    if len(x) in (3, 4) and len(w) != len(x):
        raise BadArgumentError(f"GetOperatorCost: Conv{len(x) - 2}D should have {len(x)}D filter tensor")
    n = x[0]
    flops = n * int(np.prod(y_spatial)) * int(np.prod(kernel)) * in_channels * out_channels * 2
    read = sum(int(np.prod(dims, dtype=np.int64)) for dims, _ in shapes[:3]) * x_dtype.itemsize
    written = n * out_channels * int(np.prod(y_spatial)) * np.dtype(np.float32).itemsize
    return int(flops), int(written), int(read)
