"""Caffe2's DNNLOWP quantization server (caffe2/quantization/server/*_dnnlowp_op.cc), on `Int8Tensor` blobs.

These types exist in Caffe2 only under an engine (`Quantize_ENGINE_DNNLOWP`, no plain `Quantize`): each record
declares the engines Caffe2 registers it under, and an op of the type with another engine, or none, is refused
as Caffe2 refuses it ("Cannot create operator of type 'Quantize'"). The `_16` engines hold uint16 data.

DNNLOWP chooses quantization parameters itself: from an op's `Y_scale`/`Y_zero_point` (static quantization,
adjusted by `followed_by`), or else from the min and max of the data (`fbgemm::ChooseQuantizationParams`, with
the `activation_precision`, `preserve_activation_sparsity` and `force_scale_power_of_two` arguments). A scale is
static in an `Int8Tensor` (rnn2jax/ir/int8.py says why), so an op that chooses it from data reads that input's
values (`static_inputs`): rnn2jax.compile makes the net input it comes from static, specialised per value. The
ops that may choose them from values they compute (a float input's range, the float result's min and max) run
eagerly in a workspace (registry `eager`), on concrete values; a compiled net traces them, where Int8 inputs and
static output quantization are what they take.

The arithmetic is fbgemm's as this Caffe2 build runs it on x86 with AVX2 and FMA: an 8-bit quantization rounds
`x * (1/scale) + zero_point` fused (one rounding), a NaN saturating to 255; other precisions round
`zero_point + x * (1/scale)` in float32 and clamp (a NaN becomes 0).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.int8 import Int8Tensor
from ..ir.netdef import Op
from . import shape as _shape  # noqa: F401  (Gather, which Int8Gather runs on float data, is registered first)
from .checks import runtime_checked
from .elementwise import _legacy_axis, _legacy_b_shape
from .facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .int8 import _int8
from .registry import REGISTRY, Kernel, declare_family, engine_variant, register
from .shape import _check_indices, _check_range

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

f32 = np.float32
ENGINES = ("DNNLOWP", "DNNLOWP_ROWWISE", "DNNLOWP_16", "DNNLOWP_ROWWISE_16")
SMALL_SCALE_THRESHOLD = float(f32(6.1e-5))  # fbgemm: a smaller scale is cut off to this
TANH_IN = (float(f32(3.0 / 127)), 128)  # dnnlowp::Tanh<uint8_t>'s input quantization (max_abs_err 0.02: x_sq 3)
SIGMOID_IN = (float(f32(2 * f32(3.0 / 127))), 128)  # Sigmoid's: tanh(x / 2)


def _dtype(op: Op) -> Any:
    return np.uint16 if op.engine.endswith("_16") else np.uint8


# --------------------------------------------------------------------------------------------------
# Quantization parameters: fbgemm::ChooseQuantizationParams and DNNLOWP's arguments


def choose_quantization_params(
    low: float, high: float, precision: int = 8, preserve_sparsity: bool = False, power_of_two: bool = False
) -> tuple[float, int]:
    """fbgemm's ChooseQuantizationParams for [low, high] onto [0, 2**precision - 1]: (scale, zero point)."""
    qmin, qmax = 0, (1 << precision) - 1
    low, high = f32(low), f32(high)
    if low < 0 < high and preserve_sparsity:
        sym_min, sym_max = -((qmax - qmin) // 2 + 1), (qmax - qmin) // 2
        largest = max(abs(float(low / f32(sym_min))), abs(float(high / f32(sym_max))))
        low, high = f32(largest * sym_min), f32(largest * sym_max)
    low, high = min(low, f32(0)), max(high, f32(0))
    scale = float(f32((float(high) - float(low)) / (qmax - qmin)))  # a float: the zero point divides by it
    if f32(scale) == 0 or math.isinf(float(f32(1) / f32(scale))):
        scale = float(f32(0.1))
    if power_of_two:  # (1 << k) in C's int: the shift count wraps at 32
        if scale < 1:
            scale = 1.0 / _c_shift(math.floor(math.log(1.0 / scale) / math.log(2)))
        else:
            scale = float(_c_shift(math.ceil(math.log(scale) / math.log(2))))
    if scale < SMALL_SCALE_THRESHOLD:
        original, scale = f32(scale), SMALL_SCALE_THRESHOLD
        if low == 0:
            high = f32(SMALL_SCALE_THRESHOLD * (qmax - qmin))
        elif high == 0:
            low = f32(-SMALL_SCALE_THRESHOLD * (qmax - qmin))
        else:
            amplifier = f32(f32(SMALL_SCALE_THRESHOLD) / original)
            low, high = f32(low * amplifier), f32(high * amplifier)
    from_min, from_max = qmin - float(low) / scale, qmax - float(high) / scale
    error_min, error_max = abs(qmin) - abs(float(low) / scale), abs(qmax) - abs(float(high) / scale)
    zero_point = from_min if error_min < error_max else from_max
    if low < 0 < high and preserve_sparsity:
        zero_point = (qmin + qmax) / 2.0
    nudged = qmin if zero_point < qmin else qmax if zero_point > qmax else int(np.rint(zero_point))
    return float(f32(scale)), nudged


def _c_shift(count: int) -> int:
    value = (1 << (count & 31)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class Factory:
    """An op's QuantizationFactory: the DNNLOWP arguments that choose quantization parameters."""

    def __init__(self, op: Op) -> None:
        self.precision = op.int("activation_precision", 8)
        if not 1 <= self.precision <= 16:
            raise BadArgumentError(f"{op.where}: activation_precision {self.precision} is outside [1, 16]")
        self.preserve_sparsity = op.bool("preserve_activation_sparsity", False)
        # activation_quantization_kind plays no part: these ops choose activations' parameters from min and max
        self.power_of_two = op.bool("force_scale_power_of_two", False)

    def choose(self, low: float, high: float) -> tuple[float, int]:
        return choose_quantization_params(low, high, self.precision, self.preserve_sparsity, self.power_of_two)

    def of_values(self, values: np.ndarray) -> tuple[float, int]:
        """fbgemm::FindMinMax (0 and 0 for no values), then the parameters of that range."""
        values = np.asarray(values, np.float32)
        if values.size == 0:
            return self.choose(0.0, 0.0)
        return self.choose(float(values.min()), float(values.max()))


def static_quantization(op: Op, factory: Factory) -> tuple[float, int] | None:
    """`Y_scale` (a float argument: an integer one is no static quantization, as in Caffe2) and `Y_zero_point`,
    after `followed_by` (ParseDNNLowPOperatorArguments): Sigmoid and Tanh fix them to their lookup tables' input
    quantization, Relu narrows a static range to [0, its max]."""
    followed_by = op.str("followed_by", "") if op.has("followed_by") else ""
    if followed_by == "Sigmoid":
        return SIGMOID_IN
    if followed_by == "Tanh":
        return TANH_IN
    arg = op.args.get("Y_scale")
    if arg is None or arg.kind != "f":
        return None
    scale, zero_point = float(f32(arg.value)), op.int("Y_zero_point", 0)
    if followed_by == "Relu":
        top = f32(scale) * f32((1 << factory.precision) - 1 - zero_point)
        return factory.choose(0.0, float(top))
    return scale, zero_point


@functools.partial(jax.jit, static_argnames=("scale", "zero_point", "precision", "dtype"))
def quantize(x: Any, scale: float, zero_point: int, precision: int, dtype: Any) -> Any:
    """fbgemm::Quantize<T> of float32 `x` (module docstring: which rounding)."""
    inverse = f32(1) / f32(scale)
    if np.dtype(dtype) == np.uint8 and precision == 8:  # QuantizeAvx2: fmadd, min with INT32_MAX, cvtps
        t = (x.astype(jnp.float64) * np.float64(inverse) + np.float64(zero_point)).astype(jnp.float32)
        t = jnp.where(jnp.isnan(t), f32(2147483520.0), jnp.minimum(t, f32(2147483520.0)))
        return jnp.clip(jnp.rint(t), 0, 255).astype(jnp.uint8)
    t = jnp.rint(jnp.float32(zero_point) + x * jnp.float32(inverse))
    t = jnp.clip(t, 0, (1 << precision) - 1)
    q = jnp.where(jnp.isnan(t), 0, t).astype(jnp.int32)
    return (q & 0xFF if np.dtype(dtype) == np.uint8 else q).astype(dtype)  # a precision over 8 wraps in uint8


@jax.jit
def dequantize(x: Int8Tensor) -> Any:
    """fbgemm::Dequantize: `scale * (q - zero_point)` in float32."""
    return jnp.float32(x.scale) * (x.data.astype(jnp.int32) - jnp.int32(x.zero_point)).astype(jnp.float32)


def _float_input(op: Op, index: int, x: Any) -> Any:
    if isinstance(x, Int8Tensor) or np.dtype(x.dtype) != np.float32:
        raise InputTypeError(
            f"{op.where}: input '{op.inputs[index]}' must be float32, got "
            f"{'an Int8 tensor' if isinstance(x, Int8Tensor) else np.dtype(x.dtype)}"
        )
    return x


# --------------------------------------------------------------------------------------------------
# Quantize, Dequantize


def _quantize_static_inputs(op: Op) -> tuple[int, ...]:
    """For parameters chosen from the data, the data itself."""
    factory_free = op.has("followed_by") and op.args["followed_by"].value in ("Sigmoid", "Tanh")
    has_scale = op.has("Y_scale") and op.args["Y_scale"].kind == "f"
    return () if factory_free or has_scale else (0,)


@register("Quantize", inputs=(1, 2), engines=ENGINES, static_inputs=_quantize_static_inputs)
def quantize_dnnlowp(op: Op) -> Kernel:
    """QuantizeDNNLowPOp: float32 to an Int8 blob, with the op's static quantization or the data's min and max."""
    if len(op.inputs) == 2:
        raise BadArgumentError(
            f"{op.where}: the quantization-parameters input '{op.inputs[1]}' (an Int8QuantParams blob made by "
            "Int8GenQuantParams) is not supported; give Y_scale and Y_zero_point"
        )
    factory, dtype = Factory(op), _dtype(op)
    fixed = static_quantization(op, factory)

    def kernel(x: Any) -> Int8Tensor:
        x = _float_input(op, 0, x)
        scale, zero_point = fixed if fixed is not None else factory.of_values(np.asarray(x))
        return Int8Tensor(quantize(x, scale, zero_point, factory.precision, dtype), scale, zero_point)

    return kernel


# QuantizeDNNLowPOp<uint8_t> and DequantizeDNNLowPOp<uint8_t> under the Int8 names too (QNNPACK's plain ones differ)
engine_variant("Int8Quantize", "DNNLOWP", "Quantize")
engine_variant("Int8Quantize", "DNNLOWP_ROWWISE", "Quantize")
engine_variant("Int8Dequantize", "DNNLOWP", "Dequantize")
engine_variant("Int8Dequantize", "DNNLOWP_ROWWISE", "Dequantize")


@register("Dequantize", engines=ENGINES)
def dequantize_dnnlowp(op: Op) -> Kernel:
    """DequantizeDNNLowPOp: an Int8 blob (uint16 data for the _16 engines) to float32."""
    dtype = _dtype(op)
    Factory(op)
    return lambda x: dequantize(_int8(op, 0, x, dtype))


@register("Int8DequantizeRowWise", engines=("DNNLOWP",))
def int8_dequantize_row_wise(op: Op) -> Kernel:
    """Caffe2 registers DequantizeDNNLowPOp<uint8_t> for it: the blob's one scale and zero point, not per row."""
    Factory(op)
    return lambda x: dequantize(_int8(op, 0, x, np.uint8))


# --------------------------------------------------------------------------------------------------
# Int8Tanh, Int8Sigmoid: dnnlowp::Tanh's lookup table


def _tanh_table() -> np.ndarray:
    """dnnlowp::Tanh<uint8_t>::Compute for every input byte: the input is read as (3/127, 128) whatever the
    blob's quantization, the output is (1/127, 128); each table entry rounds the mean of tanh at the ends of
    its quantization bin (pass region empty: GetPassRegionEnd_ returns 0)."""
    scale_in, scale_out = float(f32(3.0 / 127)), float(f32(1.0 / 127))
    table = [
        int(np.rint((math.tanh((i - 0.5) * scale_in) + math.tanh((i + 0.5) * scale_in)) / 2 / scale_out))
        for i in range(127)
    ]
    table += [127, 127]  # saturation: magnitudes 127 and 128
    out = np.empty(256, np.uint8)
    for x in range(256):
        adjusted = x - 128
        out[x] = 128 + int(np.sign(adjusted)) * table[abs(adjusted)]
    return out


TANH_OUT = (float(f32(1.0 / 127)), 128)
SIGMOID_OUT = (float(f32(0.5 / 127)), 0)  # dnnlowp::Sigmoid's output: 0 -> 0, 1/2 -> 127, 1 -> 254


@register("Int8Tanh", engines=("DNNLOWP",))
def int8_tanh(op: Op) -> Kernel:
    """UnaryElementwiseWithArgsDNNLowPOp with TanhFunctor: a 256-entry table; the output is (1/127, 128)."""
    Factory(op)
    table = _tanh_table()

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x, np.uint8)
        return Int8Tensor(jnp.asarray(table)[x.data.astype(jnp.int32)], *TANH_OUT)

    return kernel


engine_variant("Tanh", "DNNLOWP", "Int8Tanh")  # the same UnaryElementwiseWithArgsDNNLowPOp<TanhFunctor>


@register("Int8Sigmoid_ENGINE_DNNLOWP")
def int8_sigmoid_dnnlowp(op: Op) -> Kernel:
    """UnaryElementwiseWithArgsDNNLowPOp with SigmoidFunctor: `sigmoid(x) = (1 + tanh(x / 2)) / 2`, so
    dnnlowp::Sigmoid reads the input as (6/127, 128), looks it up in the tanh table and subtracts 1: the output
    is (0.5/127, 0). Named by its operator key: the plain Int8Sigmoid is QNNPACK's (ops/int8.py)."""
    Factory(op)
    table = _tanh_table() - np.uint8(1)  # the table's least entry is 1

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x, np.uint8)
        return Int8Tensor(jnp.asarray(table)[x.data.astype(jnp.int32)], *SIGMOID_OUT)

    return kernel


engine_variant("Sigmoid", "DNNLOWP", "Int8Sigmoid_ENGINE_DNNLOWP")
engine_variant("Int8Sigmoid", "DNNLOWP", "Int8Sigmoid_ENGINE_DNNLOWP")


# --------------------------------------------------------------------------------------------------
# Int8Relu, Int8ChannelShuffle: the input's quantization kept


@register("Int8Relu_ENGINE_DNNLOWP")
def int8_relu_dnnlowp(op: Op) -> Kernel:
    """ReluDNNLowPOp: `max(q, zero_point)`, keeping the Int8 input's quantization. Named by its operator key: the
    plain Int8Relu is QNNPACK's (ops/int8.py). A float input Caffe2 quantizes, then writes the output as an Int8
    blob and through the float tensor it just replaced (a crash): refused here."""
    Factory(op)

    def kernel(x: Any) -> Int8Tensor:
        if not isinstance(x, Int8Tensor):
            raise InputTypeError(
                f"{op.where}: input '{op.inputs[0]}' must be an Int8 tensor: Caffe2's ReluDNNLowPOp crashes on "
                f"float data, got {getattr(x, 'dtype', type(x).__name__)}"
            )
        x = _int8(op, 0, x, np.uint8)
        if not 0 <= x.zero_point <= 255:
            raise BadArgumentError(
                f"{op.where}: input '{op.inputs[0]}''s zero point {x.zero_point} is outside [0, 255]"
            )
        return Int8Tensor(jnp.maximum(x.data, jnp.uint8(x.zero_point)), x.scale, x.zero_point)

    return kernel


engine_variant("Relu", "DNNLOWP", "Int8Relu_ENGINE_DNNLOWP")
engine_variant("Int8Relu", "DNNLOWP", "Int8Relu_ENGINE_DNNLOWP")


@register("Int8ChannelShuffle_ENGINE_DNNLOWP")
def int8_channel_shuffle_dnnlowp(op: Op) -> Kernel:
    """ChannelShuffleDNNLowPOp<uint8_t>: channels (G, C/G) -> (C/G, G), dim 1 (NCHW) or the last (NHWC), keeping
    the Int8 input's quantization (Y_scale plays no part). Unlike QNNPACK's plain Int8ChannelShuffle (ops/int8.py)
    it takes either order, one group, and no kernel; `dequantize_output` leaves Caffe2 an Int8 blob of no data
    type, which nothing can read: refused."""
    Factory(op)
    order = op.str("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise BadArgumentError(f'{op.where}: order should be either "NCHW" or "NHWC", got {order!r}')
    if op.bool("dequantize_output", False):
        raise BadArgumentError(f"{op.where}: dequantize_output=1 leaves Caffe2 an Int8 blob of no data type")
    groups = op.int("group", 1)
    if groups < 1:
        raise BadArgumentError(f"{op.where}: group must be positive, got {groups}")
    nhwc = order == "NHWC"

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x, np.uint8)
        shape = tuple(x.shape)
        if len(shape) < (1 if nhwc else 2):
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' {list(shape)} has no channel dim ({order})")
        axis = len(shape) - 1 if nhwc else 1
        channels = shape[axis]
        if channels % groups:
            raise ShapeError(f"{op.where}: C % G == 0 fails: {channels} channels, {groups} groups")
        split = (*shape[:axis], groups, channels // groups, *shape[axis + 1 :])
        data = jnp.swapaxes(jnp.reshape(x.data, split), axis, axis + 1)
        return Int8Tensor(jnp.reshape(data, shape), x.scale, x.zero_point)

    return kernel


engine_variant("ChannelShuffle", "DNNLOWP", "Int8ChannelShuffle_ENGINE_DNNLOWP")
engine_variant("Int8ChannelShuffle", "DNNLOWP", "Int8ChannelShuffle_ENGINE_DNNLOWP")


# --------------------------------------------------------------------------------------------------
# Int8Gather


def _concrete(op: Op, x: Any, what: str) -> np.ndarray:
    """Values the op chooses quantization parameters from: known only outside jitted code."""
    if isinstance(x, jax.core.Tracer):
        raise BadArgumentError(
            f"{op.where}: {what} is traced here, but DNNLOWP chooses the output's quantization from its values; "
            "give Y_scale (static quantization), or run the net in a workspace, which runs this op eagerly"
        )
    return np.asarray(x)


def output_quantization(op: Op, factory: Factory, y: Any) -> tuple[float, int]:
    """The output's parameters: static (Y_scale, followed_by), else OpWrapper's from the float output's min and
    max (with followed_by Relu, the range is clipped at 0 first)."""
    fixed = static_quantization(op, factory)
    return fixed if fixed is not None else dynamic_quantization(op, factory, y, 0)


def dynamic_quantization(op: Op, factory: Factory, y: Any, index: int) -> tuple[float, int]:
    """OpWrapper::GetOutputQuantizationParams: from the float op's output `index` (clipped at 0 with followed_by
    Relu)."""
    values = _concrete(op, y, f"output '{op.outputs[index]}'")
    if values.size == 0:
        low = high = 0.0
    else:
        low, high = float(values.min()), float(values.max())
    if op.has("followed_by") and op.args["followed_by"].value == "Relu":
        low, high = max(0.0, low), max(0.0, high)
    return factory.choose(low, high)


runtime_checked("Int8Gather")


@register("Int8Gather", inputs=2, engines=("DNNLOWP",), eager=True, roles=Roles(integers=(1,)))  # as Gather
def int8_gather(op: Op) -> Kernel:
    """GatherDNNLowPOp: rows (axis 0, whatever `axis` says) of Int8 DATA, keeping its quantization; float DATA is
    gathered by the float Gather, then quantized (or, with `dequantize_output`, left float)."""
    factory = Factory(op)
    dequantize_output = op.bool("dequantize_output", False)
    fp32_gather = REGISTRY["Gather"].build(op)

    def kernel(data: Any, indices: Any) -> Any:
        if not isinstance(data, Int8Tensor):
            data = _float_input(op, 0, data)
            y = fp32_gather(data, indices)
            if dequantize_output:
                return y
            scale, zero_point = output_quantization(op, factory, y)
            return Int8Tensor(quantize(y, scale, zero_point, factory.precision, np.uint8), scale, zero_point)
        data = _int8(op, 0, data, np.uint8)
        _check_indices(op, indices)
        if data.data.ndim < 1:
            raise ShapeError(f"{op.where}: DATA '{op.inputs[0]}' should be at least 1-D")
        _check_range(op, indices, data.shape[0], False)
        rows = jnp.take(data.data, indices, axis=0, mode="clip")
        return Int8Tensor(rows, data.scale, data.zero_point)

    return kernel


engine_variant("Gather", "DNNLOWP", "Int8Gather")  # the same GatherDNNLowPOp<uint8_t>


# --------------------------------------------------------------------------------------------------
# DNNLowPOp: inputs Int8 or float, the output's parameters static or from the float op's output


class WeightFactory(Factory):
    """The weight side of an op's QuantizationFactory (ElementwiseLinear's `a`): weight_precision and
    preserve_weight_sparsity."""

    def __init__(self, op: Op) -> None:
        super().__init__(op)
        self.precision = op.int("weight_precision", 8)
        if not 1 <= self.precision <= 16:
            raise BadArgumentError(f"{op.where}: weight_precision {self.precision} is outside [1, 16]")
        self.preserve_sparsity = op.bool("preserve_weight_sparsity", False)
        kind = op.str("weight_quantization_kind", "min_max").lower()
        if kind != "min_max":
            raise BadArgumentError(f"{op.where}: weight_quantization_kind '{kind}' is not supported (only min_max)")


def input_quantization(op: Op, factory: Factory, index: int, x: Any) -> tuple[float, int]:
    """GetInputTensorQuantizationParamsOf: an Int8 blob's own, or those of a float input's min and max."""
    if isinstance(x, Int8Tensor):
        return x.scale, x.zero_point
    x = _float_input(op, index, x)
    return factory.of_values(_concrete(op, x, f"input '{op.inputs[index]}'"))


def quantized(op: Op, index: int, x: Any, qparams: tuple[float, int], precision: int) -> Any:
    """QuantizeInputIfNeeded: an Int8 blob's uint8 data, or the float input quantized with `qparams`."""
    if isinstance(x, Int8Tensor):
        return _int8(op, index, x, np.uint8).data
    return quantize(x, *qparams, precision, np.uint8)


def dequantized(x: Any) -> Any:
    """OpWrapper::DequantizeInput: what the float op reads."""
    return dequantize(x) if isinstance(x, Int8Tensor) else x


@functools.partial(jax.jit, static_argnames=("multiplier", "zero_point", "precision"))
def requantize(raw: Any, multiplier: Any, zero_point: int, precision: int) -> Any:
    """fbgemm::Requantize<uint8_t> with the real multiplier: `zero_point + lrintf(float(raw) * multiplier)`,
    clamped to the precision."""
    q = jnp.rint(raw.astype(jnp.float32) * jnp.float32(multiplier)).astype(jnp.int64) + zero_point
    return (jnp.clip(q, 0, (1 << precision) - 1) & 0xFF).astype(jnp.uint8)


def finish(op: Op, q: Any, qparams: tuple[float, int]) -> Any:
    """RunOnDeviceEpilogue_: the Int8 output, or with `dequantize_output` its float values."""
    if op.bool("dequantize_output", False):
        return dequantize(Int8Tensor(q, *qparams))
    return Int8Tensor(q, *qparams)


def _real_multiplier(*scales: float, out: float) -> float:
    product = f32(1)
    for scale in scales:
        product = f32(product * f32(scale))
    return float(f32(product / f32(out)))


@register("Int8Mul", inputs=2, engines=("DNNLOWP",), eager=True)
def int8_mul(op: Op) -> Kernel:
    """MulDNNLowPOp: `(qa - za) * (qb - zb)` requantized by `sa * sb / sy`; with broadcast=1, B is a scalar or
    Caffe2's legacy broadcast of B over A (`axis`)."""
    factory = Factory(op)
    broadcast = op.bool("broadcast", False)
    if not broadcast and (op.int("axis", -1) != -1 or op.str("axis_str", "")):
        raise BadArgumentError(f"{op.where}: do not specify axis or axis_str if broadcast is not enabled")
    axis = _legacy_axis(op) if broadcast else -1

    def kernel(a: Any, b: Any) -> Any:
        qa, qb = (input_quantization(op, factory, i, x) for i, x in enumerate((a, b)))
        if broadcast:
            view = _legacy_b_shape(op, a.shape, b.shape, axis)
        elif tuple(a.shape) != tuple(b.shape):
            raise ShapeError(
                f"{op.where}: '{op.inputs[0]}' {list(a.shape)} and '{op.inputs[1]}' {list(b.shape)} differ: "
                "dimension mismatch - did you forget to set broadcast=1?"
            )
        else:
            view = tuple(b.shape)
        out = output_quantization_of(op, factory, lambda: dequantized(a) * jnp.reshape(dequantized(b), view))
        xa = quantized(op, 0, a, qa, factory.precision).astype(jnp.int32) - qa[1]
        xb = quantized(op, 1, b, qb, factory.precision).astype(jnp.int32) - qb[1]
        raw = xa * jnp.reshape(xb, view)
        multiplier = _real_multiplier(qa[0], qb[0], out=out[0])
        return finish(op, requantize(raw, multiplier, out[1], factory.precision), out)

    return kernel


engine_variant("Mul", "DNNLOWP", "Int8Mul")  # the same MulDNNLowPOp<uint8_t>


def output_quantization_of(op: Op, factory: Factory, reference: Any) -> tuple[float, int]:
    """GetOutputQuantizationParams_: static, else from the float op's output (`reference()`, run only then)."""
    fixed = static_quantization(op, factory)
    return fixed if fixed is not None else output_quantization(op, factory, reference())


@register("Int8ElementwiseLinear", inputs=3, engines=("DNNLOWP",), eager=True)
def int8_elementwise_linear(op: Op) -> Kernel:
    """ElementwiseLinearDNNLowPOp: X (N x D from `axis`) times `a` quantized as a weight, plus `b` quantized to
    int32 with scale `sx * sa`, requantized by `sx * sa / sy`."""
    factory, weights = Factory(op), WeightFactory(op)
    axis = op.int("axis", 1)

    def kernel(x: Any, a: Any, b: Any) -> Any:
        a, b = _float_input(op, 1, a), _float_input(op, 2, b)
        qx = input_quantization(op, factory, 0, x)
        rank = len(x.shape)
        if not -rank <= axis < rank:
            raise ShapeError(f"{op.where}: axis {axis} is out of range for '{op.inputs[0]}' of rank {rank}")
        ax = axis % rank
        d = math.prod(x.shape[ax:])
        for index, v in ((1, a), (2, b)):
            if v.ndim != 1 or v.shape[0] != d:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' {list(v.shape)} must be 1-D of size {d} (X's dims from axis)"
                )
        qa = weights.of_values(_concrete(op, a, f"input '{op.inputs[1]}'"))
        flat = (math.prod(x.shape[:ax]), d)

        def reference() -> Any:
            return jnp.reshape(jnp.reshape(dequantized(x), flat) * a + b, x.shape)

        out = output_quantization_of(op, factory, reference)
        xq = jnp.reshape(quantized(op, 0, x, qx, factory.precision), flat).astype(jnp.int32) - qx[1]
        aq = quantize(a, *qa, weights.precision, np.uint8).astype(jnp.int32) - qa[1]
        bq = quantize_int32(b, float(f32(f32(qx[0]) * f32(qa[0]))))
        raw = xq * aq + bq
        multiplier = _real_multiplier(qx[0], qa[0], out=out[0])
        return finish(op, jnp.reshape(requantize(raw, multiplier, out[1], factory.precision), x.shape), out)

    return kernel


engine_variant("ElementwiseLinear", "DNNLOWP", "Int8ElementwiseLinear")  # the same ElementwiseLinearDNNLowPOp


@functools.partial(jax.jit, static_argnames=("scale",))
def quantize_int32(x: Any, scale: float) -> Any:
    """fbgemm::Quantize<int32_t> (zero point 0, 32-bit signed): `nearbyint(x * (1/scale))`, clamped."""
    t = jnp.rint(x * jnp.float32(f32(1) / f32(scale))).astype(jnp.float64)
    return jnp.clip(t, -(2.0**31), 2.0**31 - 1).astype(jnp.int32)


# --------------------------------------------------------------------------------------------------
# Int8BatchMatMul


def _batch_matmul_geometry(
    op: Op, a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_a: bool, trans_b: bool, broadcast: bool
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """BatchMatMulDNNLowPOp's checks: A's and B's shapes as matrices (a 1-D A is [1, K], a 1-D B [K, 1]) and
    the output's shape (a vector-vector product is [1])."""
    if not broadcast and (len(a_shape) != len(b_shape) or len(a_shape) < 2):
        raise ShapeError(
            f"{op.where}: inputs with dimensions A = {len(a_shape)} and B = {len(b_shape)} is not supported with "
            "broadcast=0. Did you forget to set the broadcast flag?"
        )
    if len(a_shape) == 1 and len(b_shape) == 1:
        if a_shape[0] != b_shape[0]:
            raise ShapeError(f"{op.where}: vector-vector product requires each of the vectors to be the same size")
        return (1, a_shape[0]), (b_shape[0], 1), (1,)
    a_dims = (1, *a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b_dims = (*b_shape, 1) if len(b_shape) == 1 else tuple(b_shape)
    for i in range(2, min(len(a_dims), len(b_dims))):
        if a_dims[-1 - i] != b_dims[-1 - i]:
            raise ShapeError(
                f"{op.where}: expected dimension {len(a_dims) - i - 1} of tensor A with value {a_dims[-1 - i]} to "
                f"match dimension {len(b_dims) - i - 1} of tensor B with value {b_dims[-1 - i]}"
            )
    m, k = (a_dims[-1], a_dims[-2]) if trans_a else (a_dims[-2], a_dims[-1])
    n, kb = (b_dims[-2], b_dims[-1]) if trans_b else (b_dims[-1], b_dims[-2])
    if k != kb:
        raise ShapeError(
            f"{op.where}: A's K {k} must match B's {kb} (trans_a = {int(trans_a)}, trans_b = {int(trans_b)})"
        )
    batch = a_dims[:-2] if len(a_dims) >= len(b_dims) else b_dims[:-2]
    out = [*batch, m if len(a_shape) > 1 else 1, n if len(b_shape) > 1 else 1]
    if len(a_shape) == 1:
        del out[-2]
    elif len(b_shape) == 1:
        del out[-1]
    return a_dims, b_dims, tuple(out)


@register("Int8BatchMatMul", inputs=2, engines=("DNNLOWP",), eager=True)
def int8_batch_matmul(op: Op) -> Kernel:
    """BatchMatMulDNNLowPOp's exact path: `sum_k (qa - za) * (qb - zb)` in int32, requantized by `sa * sb / sy`.
    With `constant_B` Caffe2 packs B for fbgemm (B quantized as int8, a different rounding): not supported."""
    factory = Factory(op)
    trans_a, trans_b = op.bool("trans_a", False), op.bool("trans_b", False)
    broadcast = op.int("broadcast", 0) != 0
    if op.bool("constant_B", False):
        raise BadArgumentError(f"{op.where}: constant_B=1 (fbgemm's packed int8 B) is not supported")

    def matrices(x: Any, dims: tuple[int, ...], trans: bool) -> Any:
        x = jnp.reshape(x, dims)
        return jnp.swapaxes(x, -1, -2) if trans else x

    def kernel(a: Any, b: Any) -> Any:
        a_dims, b_dims, out_shape = _batch_matmul_geometry(op, a.shape, b.shape, trans_a, trans_b, broadcast)
        vectors = len(a.shape) == 1 and len(b.shape) == 1  # a dot product: the trans flags play no part
        ta, tb = trans_a and not vectors, trans_b and not vectors
        if math.prod(a_dims[:-2]) == 0 or math.prod(b_dims[:-2]) == 0:  # no batches: Caffe2 returns early
            if op.bool("dequantize_output", False):
                return jnp.zeros(out_shape, jnp.float32)
            return Int8Tensor(jnp.zeros(out_shape, jnp.uint8), 1.0, 0)  # a new Int8TensorCPU's scale and zero point
        qa, qb = (input_quantization(op, factory, i, x) for i, x in enumerate((a, b)))

        def reference() -> Any:
            ma, mb = matrices(dequantized(a), a_dims, ta), matrices(dequantized(b), b_dims, tb)
            return jnp.matmul(ma, mb, precision="highest")

        out = output_quantization_of(op, factory, reference)
        xa = matrices(quantized(op, 0, a, qa, factory.precision).astype(jnp.int32) - qa[1], a_dims, ta)
        xb = matrices(quantized(op, 1, b, qb, factory.precision).astype(jnp.int32) - qb[1], b_dims, tb)
        raw = jnp.matmul(xa, xb, preferred_element_type=jnp.int32)
        multiplier = _real_multiplier(qa[0], qb[0], out=out[0])
        return finish(op, jnp.reshape(requantize(raw, multiplier, out[1], factory.precision), out_shape), out)

    return kernel


engine_variant("BatchMatMul", "DNNLOWP", "Int8BatchMatMul")  # the same BatchMatMulDNNLowPOp<uint8_t>


# --------------------------------------------------------------------------------------------------
# Int8SpatialBN, Int8SpatialBNRelu (inference only)


def _spatial_bn(op: Op, relu: bool) -> Kernel:
    """SpatialBNDNNLowPOp: `alpha = scale / sqrt(var + epsilon)`, `beta = bias - alpha * mean` (float32), scaled by
    `sx / sy` and `1 / sy`; each output `zy + lrintf(alpha * (qx - zx) + beta)` (fused multiply-add in NHWC's
    AVX2 kernel), at least `zy` with Relu, clamped to [0, 255]. Caffe2 computes `1 / sqrt` with Eigen, whose
    vectorised path (4 or more channels) approximates it (`rsqrtps` and a Newton step, CPU-specific): rnn2jax
    rounds it exactly, as Eigen's scalar path does."""
    factory = Factory(op)
    if not op.bool("is_test", False):
        raise BadArgumentError(f"{op.where}: SpatialBN DNNLOWP op only works for inference (is_test=1)")
    order = op.str("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise BadArgumentError(f'{op.where}: order should be either "NCHW" or "NHWC", got {order!r}')
    epsilon = f32(op.float("epsilon", 1e-5))
    if not epsilon > 0:
        raise BadArgumentError(f"{op.where}: epsilon {float(epsilon):g} must be positive")
    nhwc = order == "NHWC"

    def fused(scale: Any, bias: Any, mean: Any, var: Any) -> tuple[Any, Any]:
        alpha = scale * (jnp.float32(1) / jnp.sqrt(var + epsilon))
        return alpha, bias - alpha * mean

    def kernel(x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
        for index, v in ((1, scale), (2, bias), (3, mean), (4, var)):
            _float_input(op, index, v)
        if len(x.shape) < 3:
            raise ShapeError(f"{op.where}: X '{op.inputs[0]}' must have at least 3 dims, got {list(x.shape)}")
        c = x.shape[-1] if nhwc else x.shape[1]
        for index, v in ((1, scale), (2, bias), (3, mean), (4, var)):
            if math.prod(v.shape) != c:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' has {math.prod(v.shape)} values, X has {c} channels"
                )
        channel = (1,) * (len(x.shape) - 1) + (c,) if nhwc else (1, c) + (1,) * (len(x.shape) - 2)
        alpha, beta = (jnp.reshape(v, channel) for v in fused(*(jnp.ravel(v) for v in (scale, bias, mean, var))))

        def reference() -> Any:
            return dequantized(x) * alpha + beta

        out = _bn_output_quantization(op, factory, relu, reference)
        qx = input_quantization(op, factory, 0, x)
        if x.shape[0] == 0:  # Caffe2 returns before quantizing: a new Int8TensorCPU's (1, 0)
            if op.bool("dequantize_output", False):
                return jnp.zeros(x.shape, jnp.float32)
            return Int8Tensor(jnp.zeros(x.shape, jnp.uint8), 1.0, 0)
        xq = quantized(op, 0, x, qx, factory.precision)
        y = _bn_requantize(xq, alpha, beta, float(f32(f32(qx[0]) / f32(out[0]))), out[0], qx[1], out[1], relu, nhwc)
        return finish(op, y, out)

    return kernel


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7, 8))
def _bn_requantize(
    xq: Any, alpha: Any, beta: Any, ratio: float, out_scale: float, in_zero: int, out_zero: int, relu: bool, nhwc: bool
) -> Any:
    a, b = alpha * jnp.float32(ratio), beta / jnp.float32(out_scale)
    x = (xq.astype(jnp.int32) - in_zero).astype(jnp.float32)
    if nhwc:  # _mm256_fmadd_ps: one rounding
        t = (a.astype(jnp.float64) * x.astype(jnp.float64) + b.astype(jnp.float64)).astype(jnp.float32)
    else:
        t = a * x + b
    y = jnp.rint(t).astype(jnp.int64) + out_zero
    if relu:
        y = jnp.maximum(y, out_zero)
    return jnp.clip(y, 0, 255).astype(jnp.uint8)


def _bn_output_quantization(op: Op, factory: Factory, relu: bool, reference: Any) -> tuple[float, int]:
    """Int8SpatialBNRelu applies followed_by Relu after the op's own arguments: a static range (Y_scale, or
    Sigmoid's and Tanh's) narrowed to [0, its max]; a dynamic one from the float output clipped at 0."""
    fixed = static_quantization(op, factory)
    if relu and fixed is not None:  # after the op's own followed_by, Relu's narrowing once more
        top = f32(fixed[0]) * f32((1 << factory.precision) - 1 - fixed[1])
        fixed = factory.choose(0.0, float(top))
    if fixed is not None:
        return fixed
    values = _concrete(op, reference(), f"output '{op.outputs[0]}'")
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if relu or (op.has("followed_by") and op.args["followed_by"].value == "Relu"):
        low, high = max(0.0, low), max(0.0, high)
    return factory.choose(low, high)


@register("Int8SpatialBN", inputs=5, engines=("DNNLOWP",), eager=True)
def int8_spatial_bn(op: Op) -> Kernel:
    return _spatial_bn(op, relu=False)


engine_variant("SpatialBN", "DNNLOWP", "Int8SpatialBN")  # the same SpatialBNDNNLowPOp<uint8_t>


@register("Int8SpatialBNRelu", inputs=5, engines=("DNNLOWP",), eager=True)
def int8_spatial_bn_relu(op: Op) -> Kernel:
    return _spatial_bn(op, relu=True)


# --------------------------------------------------------------------------------------------------
# Int8LSTMUnit


def _requantize_real(src: Any, multiplier: float, zero_point: int, low: int, high: int) -> Any:
    """fbgemm::Requantize with the real multiplier: `zero_point + lrintf(float(src) * multiplier)`, clamped."""
    q = jnp.rint(src.astype(jnp.float32) * jnp.float32(multiplier)).astype(jnp.int64) + zero_point
    return jnp.clip(q, low, high)


def _divide(a: float, b: float) -> float:
    return float(f32(f32(a) / f32(b)))


def _output_static(op: Op, factory: Factory, index: int) -> tuple[float, int] | None:
    """HasStaticQuantization(op, index): `Y_scale` for output 0 (after followed_by), `Y2_scale` for output 1."""
    if index == 0:
        return static_quantization(op, factory)
    arg = op.args.get(f"Y{index + 1}_scale")
    if arg is None or arg.kind != "f":
        return None
    return float(f32(arg.value)), op.int(f"Y{index + 1}_zero_point", 0)


@register("Int8LSTMUnit", inputs=5, outputs=2, engines=("DNNLOWP",), eager=True, roles=Roles(lengths=(3,)))
def int8_lstm_unit(op: Op) -> Kernel:
    """LSTMUnitDNNLowPOp: (hidden_prev, cell_prev, gates [1, N, 4D], seq_lengths, timestep) -> (hidden, cell),
    with dnnlowp's sigmoid and tanh tables and fbgemm's float requantization between them. The gates are read
    with fixed parameters covering the tables' inputs (whatever an Int8 gates blob says); the outputs' parameters
    are static (`Y_scale`, `Y2_scale`) or from the float LSTMUnit's outputs."""
    factory = Factory(op)
    forget_bias = f32(op.float("forget_bias", 0.0))
    drop_states = op.bool("drop_states", False)
    tanh_table = _tanh_table().astype(np.int32)
    sigmoid_table = tanh_table - 1
    sig_in, tanh_in = SIGMOID_IN, TANH_IN
    sig_min, sig_max = f32(sig_in[0]) * f32(0 - sig_in[1]), f32(sig_in[0]) * f32(255 - sig_in[1])
    tanh_min, tanh_max = f32(tanh_in[0]) * f32(0 - tanh_in[1]), f32(tanh_in[0]) * f32(255 - tanh_in[1])
    gates_q = factory.choose(float(min(sig_min, tanh_min)), float(max(sig_max, tanh_max)))
    top = (1 << factory.precision) - 1

    def kernel(h_prev: Any, c_prev: Any, gates: Any, lengths: Any, timestep: Any) -> tuple[Any, Any]:
        if len(c_prev.shape) != 3 or len(gates.shape) != 3:
            raise ShapeError(f"{op.where}: cell_t_prev and gates must be 3-D ([1, N, D] and [1, N, 4D])")
        n, d = c_prev.shape[1], c_prev.shape[2]
        if gates.shape[2] != 4 * d:
            raise ShapeError(f"{op.where}: gates '{op.inputs[2]}' has {gates.shape[2]} columns; 4 * D = {4 * d}")
        for index, v in ((3, lengths), (4, timestep)):
            if isinstance(v, Int8Tensor) or np.dtype(v.dtype) != np.int32:
                raise InputTypeError(f"{op.where}: '{op.inputs[index]}' must be int32")
        if math.prod(lengths.shape) != n:
            raise ShapeError(f"{op.where}: seq_lengths '{op.inputs[3]}' must hold N = {n} values")
        qh, qc = input_quantization(op, factory, 0, h_prev), input_quantization(op, factory, 1, c_prev)
        out_h, out_c = _output_static(op, factory, 0), _output_static(op, factory, 1)
        if out_h is None or out_c is None:
            h_ref, c_ref = _lstm_unit_float(
                dequantized(h_prev),
                dequantized(c_prev),
                dequantized(gates),
                lengths,
                timestep,
                forget_bias,
                drop_states,
            )
            out_h = out_h or dynamic_quantization(op, factory, h_ref, 0)
            out_c = out_c or dynamic_quantization(op, factory, c_ref, 1)
        hq = jnp.reshape(quantized(op, 0, h_prev, qh, factory.precision).astype(jnp.int32), (n, d))
        cq = jnp.reshape(quantized(op, 1, c_prev, qc, factory.precision).astype(jnp.int32), (n, d))
        xq = jnp.reshape(quantized(op, 2, gates, gates_q, factory.precision).astype(jnp.int32), (n, 4 * d))
        zx = gates_q[1]
        bias = int(np.clip(np.rint(f32(zx) + forget_bias * (f32(1) / f32(gates_q[0]))), -128, 127))
        sig_scale, tanh_scale = SIGMOID_OUT[0], TANH_OUT[0]
        to_sig, to_tanh = _divide(gates_q[0], sig_in[0]), _divide(gates_q[0], tanh_in[0])
        sig = jnp.asarray(sigmoid_table)
        tnh = jnp.asarray(tanh_table)
        x_i, x_f, x_o, x_g = (xq[:, k * d : (k + 1) * d] for k in range(4))
        i = sig[_requantize_real(x_i - zx, to_sig, sig_in[1], 0, 255)]
        f = sig[_requantize_real(x_f + bias - 2 * zx, to_sig, sig_in[1], 0, 255)]
        o = sig[_requantize_real(x_o - zx, to_sig, sig_in[1], 0, 255)]
        g = tnh[_requantize_real(x_g - zx, to_tanh, tanh_in[1], 0, 255)]
        f_c = f * (cq - qc[1])
        i_g = i * (g - TANH_OUT[1])
        f_c = _requantize_real(f_c, _divide(qc[0], tanh_scale), 0, -(2**31), 2**31 - 1).astype(jnp.int32)
        c_temp = f_c + i_g
        product = float(f32(f32(sig_scale) * f32(tanh_scale)))
        c_new = _requantize_real(c_temp, _divide(product, out_c[0]), out_c[1], 0, top)
        tanh_c = tnh[_requantize_real(c_temp, _divide(product, tanh_in[0]), tanh_in[1], 0, 255)]
        h_new = _requantize_real(o * (tanh_c - TANH_OUT[1]), _divide(product, out_h[0]), out_h[1], 0, top)
        valid = (jnp.int32(jnp.ravel(timestep)[0]) < jnp.ravel(lengths))[:, None]
        if drop_states:
            h_keep, c_keep = jnp.full_like(h_new, out_h[1]), jnp.full_like(c_new, out_c[1])
        else:
            h_keep = _requantize_real(hq - qh[1], _divide(qh[0], out_h[0]), out_h[1], 0, top)
            c_keep = _requantize_real(cq - qc[1], _divide(qc[0], out_c[0]), out_c[1], 0, top)
        shape = c_prev.shape
        h_out = jnp.reshape(jnp.where(valid, h_new, h_keep) & 0xFF, shape).astype(jnp.uint8)
        c_out = jnp.reshape(jnp.where(valid, c_new, c_keep) & 0xFF, shape).astype(jnp.uint8)
        return finish(op, h_out, out_h), finish(op, c_out, out_c)

    return kernel


engine_variant("LSTMUnit", "DNNLOWP", "Int8LSTMUnit")  # the same LSTMUnitDNNLowPOp in Caffe2


def _lstm_unit_float(h_prev, c_prev, gates, lengths, timestep, forget_bias, drop_states):
    """Caffe2's float LSTMUnit (lstm_unit_op.h), which picks dynamic output parameters."""
    d = c_prev.shape[2]
    x = gates[0]
    sigmoid = lambda v: jnp.float32(1) / (jnp.float32(1) + jnp.exp(-v))  # noqa: E731
    i, f = sigmoid(x[:, :d]), sigmoid(x[:, d : 2 * d] + forget_bias)
    o, g = sigmoid(x[:, 2 * d : 3 * d]), jnp.float32(2) * sigmoid(jnp.float32(2) * x[:, 3 * d :]) - jnp.float32(1)
    c = f * c_prev[0] + i * g
    h = o * (jnp.float32(2) * sigmoid(jnp.float32(2) * c) - jnp.float32(1))
    valid = (jnp.ravel(timestep)[0] < jnp.ravel(lengths))[:, None]
    h_keep = jnp.zeros_like(h) if drop_states else h_prev[0]
    c_keep = jnp.zeros_like(c) if drop_states else c_prev[0]
    return jnp.where(valid, h, h_keep)[None], jnp.where(valid, c, c_keep)[None]
