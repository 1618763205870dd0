"""Caffe2's C++ gradient makers (`REGISTER_GRADIENT`) for the ops of RNN step nets, as OperatorDefs.

A maker sees the forward op and the gradient blob of each output (None when it has none) and returns
gradient ops plus the gradient blob of each input. Conventions, as in `GradientMakerBase`:
`GO(i)` is output i's gradient (an error if it has none), `GI(i)` is `input(i) + "_grad"` and records
it as input i's gradient, `set_dense` passes an existing gradient through with no op.
`get_gradient_for_op` then marks the ops `is_gradient_op`, copies the forward device option and engine
(when set) and appends all forward arguments unless the maker builds its own (`copy_args = False`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..proto import caffe2_pb2 as pb
from .opdef import make_argument


class GradientError(RuntimeError):
    """A gradient cannot be built (no maker, a maker refusing, or core.py's version checks)."""


class GradientContext:
    """What a maker works with: the forward op, output gradients, and input gradients being set."""

    def __init__(self, op: pb.OperatorDef, g_output: Sequence[str | None]):
        self.op = op
        self.g_output = list(g_output)
        self.g_input: list[str | None] = [None] * len(op.input)
        self.copy_args = True
        self.as_returned = False  # a Python maker (core.GradientRegistry.RegisterGradient): ops kept as they are

    def I(self, i: int) -> str:  # noqa: E743 (Caffe2's name)
        return self.op.input[i]

    def O(self, i: int) -> str:  # noqa: E743 (Caffe2's name)
        return self.op.output[i]

    def GO(self, i: int) -> str:
        grad = self.g_output[i]
        if grad is None:
            raise GradientError(f"Gradient of output {self.op.output[i]} is not provided!")
        return grad

    def GI(self, i: int) -> str:
        self.g_input[i] = self.op.input[i] + "_grad"
        return self.g_input[i]

    def set_dense(self, i: int, grad: str) -> None:
        self.g_input[i] = grad

    def arg(self, name: str) -> pb.Argument | None:
        return next((a for a in self.op.arg if a.name == name), None)

    def flag(self, name: str, default: bool) -> bool:
        arg = self.arg(name)
        return default if arg is None else bool(arg.i)


Maker = Callable[[GradientContext], list[pb.OperatorDef] | None]
_MAKERS: dict[str, Maker] = {}


def register_gradient(*op_types: str) -> Callable[[Maker], Maker]:
    """Register a maker for op types (replacing any earlier one)."""

    def wrap(maker: Maker) -> Maker:
        for op_type in op_types:
            _MAKERS[op_type] = maker
        return maker

    return wrap


def gradient_op(
    op_type: str, inputs: Iterable[str], outputs: Iterable[str], args: Iterable[pb.Argument] = ()
) -> pb.OperatorDef:
    """C++ `CreateOperatorDef`: name "" set, no engine, no device option."""
    op = pb.OperatorDef(type=op_type, name="")
    op.input.extend(inputs)
    op.output.extend(outputs)
    op.arg.extend(args)
    return op


def get_gradient_for_op(
    op: pb.OperatorDef, g_output: Sequence[str | None]
) -> tuple[list[pb.OperatorDef], list[str | None]]:
    """C++ `GetGradientForOp`: (gradient ops, gradient blob of each forward input)."""
    maker = _MAKERS.get(op.type)
    if maker is None:
        raise GradientError(
            f"Exception when creating gradient for [{op.type}]: Gradient maker for operator {op.type} not implemented."
        )
    ctx = GradientContext(op, g_output)
    try:
        grad_ops = maker(ctx) or []
    except GradientError as error:
        raise GradientError(f"Exception when creating gradient for [{op.type}]: {error}") from None
    if ctx.as_returned:
        return list(grad_ops), ctx.g_input
    for grad_op in grad_ops:
        grad_op.is_gradient_op = True
        if op.HasField("device_option"):
            grad_op.device_option.CopyFrom(op.device_option)
        if op.HasField("engine"):
            grad_op.engine = op.engine
        if ctx.copy_args:
            grad_op.arg.extend(op.arg)
    return grad_ops, ctx.g_input


def has_gradient_maker(op_type: str) -> bool:
    return op_type in _MAKERS


# ------------------------------------------------------------------------------------------------
# Makers


def _single(op_type: str, inputs: Iterable[str], outputs: Iterable[str], args: Iterable[Any] = ()) -> list:
    return [gradient_op(op_type, inputs, outputs, args)]


@register_gradient("FC", "FCTransposed")
def _fc(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(1), g.GI(2), g.GI(0)])


@register_gradient("Sum")
def _sum(g: GradientContext) -> list:
    for i in range(len(g.op.input)):
        g.set_dense(i, g.GO(0))
    return []


@register_gradient("Alias")
def _alias(g: GradientContext) -> list:
    g.set_dense(0, g.GO(0))
    return []


@register_gradient("StopGradient")
def _no_gradient(g: GradientContext) -> list:
    return []


@register_gradient("GT", "GE", "LT", "LE", "EQ", "NE", "Shape")
def _should_not_do_gradient(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")


@register_gradient("LSTMUnit")
def _lstm_unit(g: GradientContext) -> list:
    n = 5 if g.flag("sequence_lengths", True) else 4
    inputs = [g.I(i) for i in range(n)] + [g.O(0), g.O(1), g.GO(0), g.GO(1)]
    return _single("LSTMUnitGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])


@register_gradient("GRUUnit")
def _gru_unit(g: GradientContext) -> list:
    n = 4 if g.flag("sequence_lengths", True) else 3
    inputs = [g.I(i) for i in range(n)] + [g.O(0), g.GO(0)]
    return _single("GRUUnitGradient", inputs, [g.GI(0), g.GI(1)])


@register_gradient("ElementwiseLinear")
def _elementwise_linear(g: GradientContext) -> list:
    return _single("ElementwiseLinearGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1), g.GI(2)])


@register_gradient("Add", "Sub", "Mul")
def _binary(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1)])


@register_gradient("Div")
def _div(g: GradientContext) -> list:
    return _single("DivGradient", [g.GO(0), g.I(0), g.I(1), g.O(0)], [g.GI(0), g.GI(1)])


@register_gradient("Sigmoid", "Tanh", "Relu", "Softmax")
def _activation(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.O(0), g.GO(0)], [g.GI(0)])


@register_gradient("LayerNorm")
def _layer_norm(g: GradientContext) -> list:
    affine = g.arg("elementwise_affine")
    if affine is not None and affine.i:
        inputs = [g.GO(0), g.O(0), g.O(1), g.O(2), g.I(0), g.I(1)]
        return _single("LayerNormGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])
    return _single("LayerNormGradient", [g.GO(0), g.O(0), g.O(1), g.O(2), g.I(0)], [g.GI(0)])


@register_gradient("Split")
def _split(g: GradientContext) -> list:
    grads = [g.GO(i) for i in range(len(g.op.output)) if g.g_output[i] is not None]
    if not grads:
        return []
    return _single("Concat", grads, [g.GI(0), "_" + g.GI(0) + "_dims"])


@register_gradient("Concat")
def _concat(g: GradientContext) -> list:
    if g.g_output[0] is None:
        return []
    return _single("Split", [g.GO(0), g.O(1)], [g.GI(i) for i in range(len(g.op.input))])


@register_gradient("Squeeze")
def _squeeze(g: GradientContext) -> list:
    return _single("ExpandDims", [g.GO(0)], [g.GI(0)])


@register_gradient("ExpandDims")
def _expand_dims(g: GradientContext) -> list:
    return _single("Squeeze", [g.GO(0)], [g.GI(0)])


@register_gradient("Transpose")
def _transpose(g: GradientContext) -> list:
    """Forward args copied in place, `axes` replaced by the inverse permutation."""
    g.copy_args = False
    op = gradient_op("Transpose", [g.GO(0)], [g.GI(0)], g.op.arg)
    for arg in op.arg:
        if arg.name == "axes":
            inverse = [0] * len(arg.ints)
            for i, axis in enumerate(arg.ints):
                inverse[axis] = i
            arg.ClearField("ints")
            arg.ints.extend(inverse)
    return [op]


@register_gradient("BatchMatMul")
def _batch_mat_mul(g: GradientContext) -> list:
    """dA, dB from BatchMatMuls of G, A, B chosen by trans_a/trans_b; the maker's own args only."""
    g.copy_args = False
    if g.flag("broadcast", False):
        raise GradientError("Gradient is currently not supported with broadcast=1 for BatchMatMul.")
    a, b, go = g.I(0), g.I(1), g.GO(0)
    trans_a, trans_b = g.flag("trans_a", False), g.flag("trans_b", False)
    if trans_a and trans_b:
        da, db, args_a, args_b = [b, go], [go, a], ("trans_a", "trans_b"), ("trans_a", "trans_b")
    elif trans_a:
        da, db, args_a, args_b = [b, go], [a, go], ("trans_b",), ()
    elif trans_b:
        da, db, args_a, args_b = [go, b], [go, a], (), ("trans_a",)
    else:
        da, db, args_a, args_b = [go, b], [a, go], ("trans_b",), ("trans_a",)
    return [
        gradient_op("BatchMatMul", da, [g.GI(0)], [make_argument(n, 1) for n in args_a]),
        gradient_op("BatchMatMul", db, [g.GI(1)], [make_argument(n, 1) for n in args_b]),
    ]


@register_gradient("Reshape")
def _reshape(g: GradientContext) -> list:
    g.copy_args = False
    return _single("Reshape", [g.GO(0), g.O(1)], [g.GI(0), "_" + g.GI(0) + "_dims"])


@register_gradient("Copy")
def _copy(g: GradientContext) -> list:
    return _single("CopyOnDeviceLike", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("SequenceMask")
def _sequence_mask(g: GradientContext) -> list:
    g.copy_args = False
    inputs = [g.GO(0)] if len(g.op.input) == 1 else [g.GO(0), g.I(1)]
    return _single("SequenceMask", inputs, [g.GI(0)], [*g.op.arg, make_argument("grad", True)])


@register_gradient("Dropout")
def _dropout(g: GradientContext) -> list:
    inputs = [g.GO(0)] if g.flag("is_test", False) else [g.GO(0), g.O(1)]
    return _single("DropoutGrad", inputs, [g.GI(0)])


@register_gradient("Cast")
def _cast(g: GradientContext) -> list:
    """`Cast(GO) -> GI` with `to` and `from_type` swapped; the forward op must name its `from_type`."""
    g.copy_args = False
    to, from_type = g.arg("to"), g.arg("from_type")
    if from_type is None:
        raise GradientError("Argument 'from_type' of type int or string is required to get the gradient of CastOp")
    args = [make_argument("to", _data_type(from_type)), make_argument("from_type", _data_type(to))]
    return _single("Cast", [g.GO(0)], [g.GI(0)], args)


def _data_type(arg: pb.Argument | None) -> int:
    """`cast::GetCastDataType`: an int, or a type name such as "float" / "INT32"."""
    if arg is None:
        return pb.TensorProto.FLOAT
    if arg.HasField("i"):
        return arg.i
    return pb.TensorProto.DataType.Value(arg.s.decode().upper())


@register_gradient("RecurrentNetwork")
def _recurrent_network(g: GradientContext) -> list:
    """One `RecurrentNetworkGradient` op carrying all forward args (section 2.7)."""

    def ints(name: str) -> list[int]:
        arg = g.arg(name)
        return [] if arg is None else list(arg.ints)

    with_grads = ints("outputs_with_grads")
    if not with_grads:
        raise GradientError("RecurrentNetwork needs a non-empty outputs_with_grads")
    inputs = [g.GO(k) for k in with_grads] + list(g.op.input) + list(g.op.output)
    outputs = [g.GI(0)] + [g.GI(i) for i in ints("param")] + [g.GI(i) for i in ints("initial_recurrent_state_ids")]
    return _single("RecurrentNetworkGradient", inputs, outputs)


# Loss ops met around RNNs in training nets and Caffe2's RNN tests.


@register_gradient("AveragedLoss", "SumElements")
def _reduce_loss(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_gradient("LabelCrossEntropy")
def _label_cross_entropy(g: GradientContext) -> list:
    return _single("LabelCrossEntropyGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_gradient("SquaredL2Distance")
def _squared_l2_distance(g: GradientContext) -> list:
    return _single("SquaredL2DistanceGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])


# Math, activation and loss ops of the differential tests (caffe2/operators/*_op.cc makers).


@register_gradient("And", "Or", "Xor", "Not")
def _should_not_do_gradient_logical(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")


@register_gradient("MatMul")
def _mat_mul(g: GradientContext) -> list:
    """GetMatMulGradient: its own args only. Caffe2 reads `axis_a`/`axis_b` into C++ `bool`s, so the
    gradient ops get axis 1 for any nonzero forward axis (0 stays 0); reproduced as emitted."""
    g.copy_args = False
    a, b, go = g.I(0), g.I(1), g.GO(0)
    trans_a, trans_b = g.flag("trans_a", False), g.flag("trans_b", False)
    axis_a, axis_b = int(g.flag("axis_a", True)), int(g.flag("axis_b", True))

    def mm(inputs, output, **args):
        return gradient_op("MatMul", inputs, [output], [make_argument(k, v) for k, v in args.items()])

    if trans_a and trans_b:
        return [
            mm([b, go, a], g.GI(0), trans_a=1, trans_b=1, axis_a=axis_b),
            mm([go, a, b], g.GI(1), trans_a=1, trans_b=1, axis_b=axis_a),
        ]
    if trans_a:
        return [mm([b, go, a], g.GI(0), trans_b=1, axis_a=axis_b), mm([a, go, b], g.GI(1), axis_a=axis_a)]
    if trans_b:
        return [mm([go, b, a], g.GI(0), axis_b=axis_b), mm([go, a, b], g.GI(1), trans_a=1, axis_b=axis_a)]
    return [mm([go, b, a], g.GI(0), trans_b=1, axis_b=axis_b), mm([a, go, b], g.GI(1), trans_a=1, axis_a=axis_a)]


@register_gradient("Abs", "Softsign")
def _from_input(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_gradient("Clip", "LeakyRelu")
def _from_output(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.O(0), g.GO(0)], [g.GI(0)])


@register_gradient("Exp")
def _exp(g: GradientContext) -> list:
    return _single("Mul", [g.O(0), g.GO(0)], [g.GI(0)])


@register_gradient("Log")
def _log(g: GradientContext) -> list:
    return _single("Div", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("Negative", "Scale")
def _same_op(g: GradientContext) -> list:
    return _single(g.op.type, [g.GO(0)], [g.GI(0)])


@register_gradient("Sqrt")
def _sqrt(g: GradientContext) -> list:
    """dX = (0.5 · dY) / Y, in place on GI(0)."""
    return [
        gradient_op("Scale", [g.GO(0)], [g.GI(0)], [make_argument("scale", 0.5)]),
        gradient_op("Div", [g.GI(0), g.O(0)], [g.GI(0)]),
    ]


@register_gradient("CrossEntropy")
def _cross_entropy(g: GradientContext) -> list:
    return _single("CrossEntropyGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_gradient("SigmoidCrossEntropyWithLogits")
def _sigmoid_cross_entropy_with_logits(g: GradientContext) -> list:
    return _single("SigmoidCrossEntropyWithLogitsGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0)])


@register_gradient("SoftmaxWithLoss")
def _softmax_with_loss(g: GradientContext) -> list:
    """(X, labels[, weights], softmax, dLoss); the softmax output's gradient is not read."""
    inputs = [g.I(i) for i in range(len(g.op.input))] + [g.O(0), g.GO(1)]
    return _single("SoftmaxWithLossGradient", inputs, [g.GI(0)])


# Shape, reduction, sequence-packing and optimizer ops (checked against real Caffe2's makers by the
# differential tests, tests/test_caffe2_ops_*.py).


@register_gradient(
    "EnsureCPUOutput",
    "OneHot",
    "BatchOneHot",
    "LearningRate",
    "Iter",
    "AtomicIter",
    "ConstantFill",
    "GaussianFill",
    "UniformFill",
    "UniformIntFill",
    "XavierFill",
    "MSRAFill",
    "RangeFill",
    "GivenTensorFill",
    "GivenTensorDoubleFill",
    "GivenTensorBoolFill",
    "GivenTensorInt16Fill",
    "GivenTensorIntFill",
    "GivenTensorInt64Fill",
    "GivenTensorStringFill",
    "GivenTensorByteStringToUInt8Fill",
)
def _no_gradient_either(g: GradientContext) -> list:
    return []


@register_gradient("ArgMax", "ArgMin", "Where", "LengthsToSegmentIds", "CreateMutex")
def _should_not_do_gradient_either(g: GradientContext) -> list:
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")


@register_gradient("CopyCPUToGPU", "CopyGPUToCPU")
def _device_copy(g: GradientContext) -> list:
    back = "CopyGPUToCPU" if g.op.type == "CopyCPUToGPU" else "CopyCPUToGPU"
    return _single(back, [g.GO(0)], [g.GI(0)])


@register_gradient("DepthConcat")
def _depth_concat(g: GradientContext) -> list:
    return _single("Split", [g.GO(0), g.O(1)], [g.GI(i) for i in range(len(g.op.input))])


@register_gradient("DepthSplit")
def _depth_split(g: GradientContext) -> list:
    return _split(g)


@register_gradient("Flatten")
def _flatten(g: GradientContext) -> list:
    return _single("ResizeLike", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("Gather")
def _gather(g: GradientContext) -> list:
    """axis 0: a GradientSlice (indices, GO), or SparseToDense with `dense_gradient`; else
    BatchGatherGradient with the maker's own `axis` ahead of the copied forward args."""
    axis_arg = g.arg("axis")
    axis = axis_arg.i if axis_arg is not None else 0
    if axis == 0:
        if g.flag("dense_gradient", False):
            return _single("SparseToDense", [g.I(1), g.GO(0), g.I(0)], [g.GI(0)])
        g.set_dense(0, (g.I(1), g.GO(0)))  # type: ignore[arg-type]  (a sparse gradient: indices, values)
        return []
    return _single("BatchGatherGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)], [make_argument("axis", axis)])


@register_gradient("Slice")
def _slice(g: GradientContext) -> list:
    inputs = [g.I(i) for i in range(len(g.op.input))] + [g.GO(0)]
    return _single("SliceGradient", inputs, [g.GI(0)])


@register_gradient("ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean")
def _reduce_front_back(g: GradientContext) -> list:
    inputs = [g.GO(0), g.I(0)] + ([g.I(1)] if len(g.op.input) == 2 else [])
    return _single(g.op.type + "Gradient", inputs, [g.GI(0)])


@register_gradient("ReduceSum", "ReduceMean")
def _reduce_axes(g: GradientContext) -> list:
    return _single(g.op.type + "Gradient", [g.GO(0), g.I(0), g.O(0)], [g.GI(0)])


@register_gradient("AddPadding")
def _add_padding(g: GradientContext) -> list:
    inputs = [g.GO(0)]
    if len(g.op.input) > 1:
        if len(g.op.output) < 2:
            raise GradientError("AddPadding with a lengths input needs its lengths output for the gradient")
        inputs.append(g.O(1))
    ops = _single("RemovePadding", inputs, [g.GI(0)])
    if len(g.op.input) >= 3:
        pads = [g.GI(i) for i in range(2, len(g.op.input))]
        ops += _single("GatherPadding", inputs, pads)
    return ops


@register_gradient("RemovePadding")
def _remove_padding(g: GradientContext) -> list:
    inputs = [g.GO(0)] + ([g.O(1)] if len(g.op.input) > 1 else [])
    return _single("AddPadding", inputs, [g.GI(0)])


@register_gradient("PackRNNSequence", "UnpackRNNSequence", "ReversePackedSegs")
def _pack_unpack(g: GradientContext) -> list:
    back = {"PackRNNSequence": "UnpackRNNSequence", "UnpackRNNSequence": "PackRNNSequence"}
    return _single(back.get(g.op.type, g.op.type), [g.GO(0), g.I(1)], [g.GI(0)])


@register_gradient("LengthsSum", "LengthsMean")
def _lengths_reduce(g: GradientContext) -> list:
    kind = g.op.type.removeprefix("Lengths")
    return _single(f"LengthsIndicesInGradient{kind}Gradient", [g.GO(0), g.I(1), g.I(0)], [g.GI(0)])


@register_gradient("WeightedSum")
def _weighted_sum(g: GradientContext) -> list:
    n = len(g.op.input)
    outputs = [g.GI(i) for i in range(0, n, 2)]
    if g.flag("grad_on_w", False):
        outputs += [g.GI(i) for i in range(1, n, 2)]
    return _single("WeightedSumGradient", [g.GO(0), *g.op.input], outputs)
