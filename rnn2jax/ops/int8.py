"""Caffe2's quantized Int8 ops (caffe2/operators/quantized/int8_*.h), on `Int8Tensor` blobs.

An Int8 blob is uint8 data with a scale and zero point (rnn2jax/ir/int8.py says why they are static).
These ops compute what Caffe2's CPU kernels compute, in their integer arithmetic: QNNPACK's fixed-point
requantization for Int8Add/Int8Sum (the x86 parameters of `qnnp_compute_add_quantization_params`), its
256-entry lookup tables for Int8Sigmoid and Int8LeakyRelu (built on the host in float32, as QNNPACK
builds them), and `QuantizeUint8`'s round-to-nearest-even for Int8Quantize. The layout ops copy bytes and
keep the input's quantization; like Caffe2 they require `Y_scale`/`Y_zero_point` (default 1 and 0) to
equal it.

Caffe2 checks many of these with glog's CHECK, which aborts the process; rnn2jax raises a
BadArgumentError instead.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.budget import check_array
from ..ir.int8 import Int8Tensor, int8_tensor
from ..ir.netdef import Op
from . import image as _image  # noqa: F401  (the base ops the layout ops reuse are registered first)
from . import pool as _pool  # noqa: F401
from . import shape as _shape  # noqa: F401
from .conv import geometry, resolve
from .facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .registry import REGISTRY, Kernel, declare_family, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)


# --------------------------------------------------------------------------------------------------
# Reading Int8 blobs and quantization arguments


def _int8(op: Op, index: int, x: Any, dtype: Any = np.uint8) -> Int8Tensor:
    """Input `index` as an Int8 blob of `dtype` data (Caffe2: `Get<Int8TensorCPU>()`, then `data<uint8_t>()`)."""
    name = op.inputs[index]
    if not isinstance(x, Int8Tensor):
        raise InputTypeError(
            f"{op.where}: blob '{name}' must be an Int8 tensor (Int8TensorCPU), got "
            f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', []))}"
        )
    if np.dtype(x.dtype) != np.dtype(dtype):
        raise InputTypeError(
            f"{op.where}: Int8 blob '{name}' holds {np.dtype(x.dtype)} data; this op reads {np.dtype(dtype)}"
        )
    return x


def _y_quantization(op: Op) -> tuple[float, int]:
    """`Y_scale` (a float, default 1) and `Y_zero_point` (an int, default 0), as Caffe2 reads them."""
    return float(np.float32(op.float("Y_scale", 1.0))), op.int("Y_zero_point", 0)


def _keeps_quantization(op: Op, x: Int8Tensor) -> None:
    """The layout ops' CHECK_EQ(Y_zero_point, X.zero_point) and CHECK_EQ(Y_scale, X.scale)."""
    scale, zero_point = _y_quantization(op)
    if zero_point != x.zero_point or np.float32(scale) != np.float32(x.scale):
        raise BadArgumentError(
            f"{op.where}: Y_scale {scale:g} and Y_zero_point {zero_point} must equal input '{op.inputs[0]}''s "
            f"scale {x.scale:g} and zero point {x.zero_point} (this op does not requantize)"
        )


def _zero_point_in_uint8(op: Op, zero_point: int, what: str) -> None:
    if not 0 <= zero_point <= 255:
        raise BadArgumentError(f"{op.where}: {what} zero point {zero_point} is outside [0, 255]")


def _quantize_uint8(scale: float, zero_point: int, value: float) -> int:
    """Caffe2's QuantizeUint8 of one number (the clamp limits of the fused Relus)."""
    r = zero_point + int(np.rint(np.float32(value) / np.float32(scale)))
    return min(max(r, 0), 255)


# --------------------------------------------------------------------------------------------------
# Quantize, dequantize, fills


@register("Int8Quantize", inputs=(1, 2))
def int8_quantize(op: Op) -> Kernel:
    """`zero_point + int32(nearbyint(x / Y_scale))`, clamped to [0, 255]. The float-to-int32 conversion is
    x86's: a quotient outside int32 (or NaN) becomes INT32_MIN, so it clamps to 0 (1e10 quantizes to 0)."""
    if len(op.inputs) == 2:
        raise BadArgumentError(
            f"{op.where}: the quantization-parameters input '{op.inputs[1]}' (an Int8QuantParams blob made by "
            "Int8GenQuantParams) is not supported; give Y_scale and Y_zero_point"
        )
    scale, zero_point = _y_quantization(op)

    def kernel(x: Any) -> Int8Tensor:
        if np.dtype(x.dtype) != np.float32:
            raise InputTypeError(f"{op.where}: input '{op.inputs[0]}' must be float32, got {np.dtype(x.dtype)}")
        q = jnp.rint(x / jnp.float32(scale))
        inside = jnp.abs(q) < 2.0**31  # False for NaN too
        r = jnp.where(inside, q, -(2.0**31)).astype(jnp.int64) + zero_point
        return Int8Tensor(jnp.clip(r, 0, 255).astype(jnp.uint8), scale, zero_point)

    return kernel


@register("Int8Dequantize")
def int8_dequantize(op: Op) -> Kernel:
    """`(int32(x) - zero_point) * scale` in float32."""

    def kernel(x: Any) -> Any:
        x = _int8(op, 0, x)
        return (x.data.astype(jnp.int32) - jnp.int32(x.zero_point)).astype(jnp.float32) * jnp.float32(x.scale)

    return kernel


def _int8_fill(op: Op, values: np.ndarray) -> Kernel:
    shape = tuple(int(d) for d in op.ints("shape", ()))
    if any(d < 0 for d in shape):
        raise ShapeError(f"{op.where}: argument 'shape' holds negative dims {list(shape)}")
    check_array(op.where, op.outputs[0], shape, values.dtype)
    # Caffe2 only DCHECKs the count (a release build copies `shape`'s size from a buffer of the wrong size).
    if math.prod(shape) != values.size:
        raise ShapeError(
            f"{op.where}: argument 'values' holds {values.size} values but 'shape' {list(shape)} needs "
            f"{math.prod(shape)}"
        )
    scale, zero_point = _y_quantization(op)
    constant = values.reshape(shape)
    return lambda: Int8Tensor(jnp.asarray(constant), scale, zero_point)


@register("Int8GivenTensorFill", inputs=0)
def int8_given_tensor_fill(op: Op) -> Kernel:
    """`values` is one byte string: its bytes are the uint8 data."""
    arg = op.args.get("values")
    if arg is not None and arg.kind != "s":
        raise BadArgumentError(f"{op.where}: argument 'values' must be one byte string (field s), got {arg.kind}")
    value = b"" if arg is None else arg.value  # str where the bytes are UTF-8, else bytes
    data = value.encode("utf-8") if isinstance(value, str) else value
    return _int8_fill(op, np.frombuffer(data, dtype=np.uint8).copy())


@register("Int8GivenIntTensorFill", inputs=0)
def int8_given_int_tensor_fill(op: Op) -> Kernel:
    """int32 data (Int8Conv's and Int8FC's biases), from the ints of `values`."""
    values = [int(v) for v in op.ints("values", ())]
    if any(not -(2**31) <= v < 2**31 for v in values):
        raise BadArgumentError(f"{op.where}: argument 'values' has values outside the int32 range")
    return _int8_fill(op, np.asarray(values, dtype=np.int32))


# --------------------------------------------------------------------------------------------------
# Elementwise: QNNPACK's add, clamp and lookup tables


def _add_parameters(op: Op, a: Int8Tensor, b: Int8Tensor, y_scale: float, y_zero_point: int, relu: bool):
    """qnnp_create_add_nc_q8's checks and qnnp_compute_add_quantization_params (x86): integer multipliers
    of the two inputs, a shift and its rounding, the output clamp."""
    f32 = np.float32
    for name, scale in (("A", a.scale), ("B", b.scale), ("output", y_scale)):
        if not (np.isfinite(scale) and f32(scale) > 0 and abs(f32(scale)) >= np.finfo(np.float32).tiny):
            raise BadArgumentError(f"{op.where}: failed to create QNNPACK add operator: {name} scale {scale:g}")
    low = _quantize_uint8(y_scale, y_zero_point, 0.0) if relu else 0
    high = 255
    if low >= high:
        raise BadArgumentError(f"{op.where}: failed to create QNNPACK add operator: output range [{low}, {high}]")
    a_out, b_out = f32(a.scale) / f32(y_scale), f32(b.scale) / f32(y_scale)
    for ratio in (a_out, b_out):
        if not 2.0**-14 <= ratio < 2.0**8:
            raise BadArgumentError(
                f"{op.where}: failed to create QNNPACK add operator: input-to-output scale ratio {ratio:g} "
                "must be in [2**-14, 2**8)"
            )
    biggest = max(a_out, b_out)
    exponent = int((np.asarray(biggest, f32).view(np.uint32) >> 23) & 0xFF) - 127
    shift = 21 - exponent
    multiplier = np.asarray((21 - exponent + 127) << 23, np.uint32).view(f32)
    a_mul = int(np.rint(f32(a_out * multiplier)))
    b_mul = int(np.rint(f32(b_out * multiplier)))
    zero_point_product = -(a_mul * a.zero_point + b_mul * b.zero_point)
    zero_point_product = ((zero_point_product + 2**31) % 2**32) - 2**31  # int32, as QNNPACK wraps it
    return a_mul, b_mul, zero_point_product, shift, low, high


def _add(op: Op, a: Int8Tensor, b: Int8Tensor, y_scale: float, y_zero_point: int, relu: bool) -> Any:
    a_mul, b_mul, product, shift, low, high = _add_parameters(op, a, b, y_scale, y_zero_point, relu)
    acc = jnp.int32(product) + a.data.astype(jnp.int32) * jnp.int32(a_mul) + b.data.astype(jnp.int32) * jnp.int32(b_mul)
    mask = (1 << shift) - 1
    remainder = (acc & jnp.int32(mask)) - (acc < 0).astype(jnp.int32)
    acc = (acc >> shift) + (remainder > (mask >> 1)).astype(jnp.int32)
    return jnp.clip(acc + y_zero_point, low, high).astype(jnp.uint8)


def _adder(op: Op, relu: bool) -> Kernel:
    y_scale, y_zero_point = _y_quantization(op)
    _zero_point_in_uint8(op, y_zero_point, "Y")

    def kernel(*xs: Any) -> Int8Tensor:
        if len(xs) != 2:
            raise BadArgumentError(f"{op.where}: {op.type} takes exactly 2 inputs here (QNNPACK's add), got {len(xs)}")
        a, b = (_int8(op, i, x) for i, x in enumerate(xs))
        if a.shape != b.shape:
            raise ShapeError(
                f"{op.where}: inputs must have the same shape (broadcast semantics is not supported): "
                f"'{op.inputs[0]}' {list(a.shape)}, '{op.inputs[1]}' {list(b.shape)}"
            )
        return Int8Tensor(_add(op, a, b, y_scale, y_zero_point, relu), y_scale, y_zero_point)

    return kernel


@register("Int8Add", inputs=2)
def int8_add(op: Op) -> Kernel:
    return _adder(op, relu=False)


@register("Int8AddRelu", inputs=2)
def int8_add_relu(op: Op) -> Kernel:
    return _adder(op, relu=True)


@register("Int8Sum", inputs=(1, None))
def int8_sum(op: Op) -> Kernel:
    """Caffe2 registers Int8AddOp for it: exactly two inputs, however many the schema allows."""
    return _adder(op, relu=False)


@register("Int8SumRelu", inputs=(1, None))
def int8_sum_relu(op: Op) -> Kernel:
    return _adder(op, relu=True)


@register("Int8Relu")
def int8_relu(op: Op) -> Kernel:
    """QNNPACK's clamp to [zero_point, 255]; the output keeps the input's quantization."""

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        _zero_point_in_uint8(op, x.zero_point, f"input '{op.inputs[0]}'")
        _keeps_quantization(op, x)
        return Int8Tensor(jnp.maximum(x.data, jnp.uint8(x.zero_point)), x.scale, x.zero_point)

    return kernel


def _lookup(table: np.ndarray, x: Int8Tensor, scale: float, zero_point: int) -> Int8Tensor:
    return Int8Tensor(jnp.asarray(table)[x.data.astype(jnp.int32)], scale, zero_point)


@register("Int8Sigmoid")
def int8_sigmoid(op: Op) -> Kernel:
    """QNNPACK's sigmoid: a table of `lrintf(256 / (1 + expf(-x)))` clamped to [0, 255]; the output must be
    quantized with scale 1/256 and zero point 0."""
    y_scale, y_zero_point = _y_quantization(op)
    if y_zero_point != 0 or np.float32(y_scale) != np.float32(1.0 / 256):
        raise BadArgumentError(
            f"{op.where}: failed to create QNNPACK Sigmoid operator: the output scale must be 1/256 and its "
            f"zero point 0, got Y_scale {y_scale:g}, Y_zero_point {y_zero_point}"
        )

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        f32 = np.float32
        i = np.arange(256, dtype=np.int32)
        xs = f32(x.scale) * (i - x.zero_point).astype(f32)
        with np.errstate(over="ignore"):
            y = (f32(1) / f32(y_scale)) / (f32(1) + np.exp(-xs))
        table = (np.rint(np.clip(y, f32(0), f32(255))).astype(np.int32) + y_zero_point).astype(np.uint8)
        return _lookup(table, x, y_scale, y_zero_point)

    return kernel


@register("Int8LeakyRelu")
def int8_leaky_relu(op: Op) -> Kernel:
    """QNNPACK's leaky ReLU: a table of `x < 0 ? x * alpha : x` in output units, clamped, rounded, shifted by
    the output zero point."""
    alpha = float(np.float32(op.float("alpha", 0.01)))
    y_scale, y_zero_point = _y_quantization(op)
    if not 0 < alpha < 1:
        raise BadArgumentError(f"{op.where}: alpha must be in (0, 1), got {alpha:g}")

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        f32 = np.float32
        ratio = f32(x.scale) / f32(y_scale)
        if not 2.0**-8 <= ratio < 2.0**8:
            raise BadArgumentError(
                f"{op.where}: failed to create QNNPACK Leaky ReLU operator: input-to-output scale ratio "
                f"{ratio:g} must be in [2**-8, 2**8)"
            )
        i = np.arange(256, dtype=np.int32)
        xs = ratio * (i - x.zero_point).astype(f32)
        y = np.where(xs < 0, xs * f32(alpha), xs).astype(f32)
        y = np.clip(y, f32(0 - y_zero_point), f32(255 - y_zero_point))
        table = (np.rint(y).astype(np.int64) + y_zero_point).astype(np.uint8)
        return _lookup(table, x, y_scale, y_zero_point)

    return kernel


@register("Int8Softmax")
def int8_softmax(op: Op) -> Kernel:
    """QNNPACK's SoftArgMax over each row (dim 0 is the batch, the rest one row): a uint32 table of
    `lrint(qscale * exp((i - 255) * X_scale))`, indexed from the row's maximum, each output
    `min(((t << 8) + sum / 2) / sum, 255)`. The output must be quantized with scale 1/256 and zero point 0."""
    y_scale, y_zero_point = _y_quantization(op)
    if y_zero_point != 0 or np.float32(y_scale) != np.float32(1.0 / 256):
        raise BadArgumentError(
            f"{op.where}: Int8Softmax's output must have Y_scale 1/256 and Y_zero_point 0, got Y_scale "
            f"{y_scale:g}, Y_zero_point {y_zero_point}"
        )

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        if not x.shape or x.shape[0] == 0 or math.prod(x.shape) == 0:
            raise ShapeError(f"{op.where}: failed to create QNNPACK SoftArgMax operator for input {list(x.shape)}")
        if not (np.isfinite(x.scale) and x.scale >= np.finfo(np.float32).tiny):
            raise BadArgumentError(f"{op.where}: failed to create QNNPACK SoftArgMax operator: X scale {x.scale:g}")
        channels = math.prod(x.shape) // x.shape[0]
        qscale = min(float(2**32 - 1) / channels, 8388607.0)
        i = np.arange(256, dtype=np.float64)
        table = np.rint(qscale * np.exp((i - 255) * float(np.float32(x.scale)))).astype(np.uint32)
        rows = x.data.reshape(x.shape[0], channels).astype(jnp.int32)
        t = jnp.asarray(table)[rows - rows.max(axis=1, keepdims=True) + 255]
        total = t.sum(axis=1, keepdims=True)
        q = ((t << 8) + (total >> 1)) // total  # uint32 throughout, as QNNPACK: t < 2**23, total < 2**32
        return Int8Tensor(jnp.minimum(q, 255).astype(jnp.uint8).reshape(x.shape), y_scale, y_zero_point)

    return kernel


# --------------------------------------------------------------------------------------------------
# Layout: the float ops' own kernels on the bytes, the quantization kept


def _on_data(base: str, op: Op, *, extra: bool = False) -> Kernel:
    """The kernel of float op `base` (same arguments) applied to the Int8 input's data; `extra` inputs
    after the first are ordinary tensors (Reshape's shape, Slice's starts and ends)."""
    inner = REGISTRY[base].build(op)  # type: ignore[misc]

    def kernel(x: Any, *rest: Any) -> Any:
        x = _int8(op, 0, x)
        _keeps_quantization(op, x)
        result = inner(x.data, *rest)
        outputs = result if isinstance(result, tuple) else (result,)
        return (Int8Tensor(outputs[0], x.scale, x.zero_point), *outputs[1:])

    if hasattr(inner, "dims_inputs"):
        kernel.dims_inputs = inner.dims_inputs  # type: ignore[attr-defined]
    return kernel


@register("Int8Reshape", inputs=(1, 2), outputs=2, static_inputs=(1,), shape_outputs=(1,))
def int8_reshape(op: Op) -> Kernel:
    if len(op.inputs) == 1 and not op.has("shape"):
        raise BadArgumentError(f"{op.where}: Argument `shape` is missing.")
    return _on_data("Reshape", op)


@register("Int8Flatten")
def int8_flatten(op: Op) -> Kernel:
    return _on_data("Flatten", op)


@register("Int8Transpose")
def int8_transpose(op: Op) -> Kernel:
    return _on_data("Transpose", op)


@register("Int8Slice", inputs=(1, 3), static_inputs=(1, 2))
def int8_slice(op: Op) -> Kernel:
    return _on_data("Slice", op)


@register("Int8Concat", inputs=(1, None), outputs=(1, 2))
def int8_concat(op: Op) -> Kernel:
    """Concatenation along `axis` (default 3 for order NHWC, 1 for NCHW, else 0; never negative); every
    input keeps the first one's quantization (Caffe2 reads only the first's)."""
    order = op.str("order", "")
    axis = op.int("axis", {"NHWC": 3, "NCHW": 1}.get(order, 0))
    if order in ("NHWC", "NCHW") and not 0 <= axis < 4:
        raise BadArgumentError(f"{op.where}: axis {axis} must be in [0, 4) for order {order}")

    def kernel(*xs: Any) -> Any:
        xs = tuple(_int8(op, i, x) for i, x in enumerate(xs))
        first = xs[0]
        _keeps_quantization(op, first)
        _zero_point_in_uint8(op, first.zero_point, f"input '{op.inputs[0]}'")
        ndim = len(first.shape)
        if order == "NHWC" and ndim != 4:
            raise ShapeError(f"{op.where}: order NHWC needs 4-D inputs, got '{op.inputs[0]}' {list(first.shape)}")
        if not 0 <= axis < max(ndim, 1):
            raise BadArgumentError(f"{op.where}: axis {axis} is out of range for inputs of rank {ndim}")
        for i, x in enumerate(xs[1:], 1):
            if len(x.shape) != ndim or any(x.shape[j] != first.shape[j] for j in range(ndim) if j != axis):
                raise ShapeError(
                    f"{op.where}: input '{op.inputs[i]}' {list(x.shape)} does not match '{op.inputs[0]}' "
                    f"{list(first.shape)} outside axis {axis}"
                )
        # Caffe2's schema allows a split_info output, but Int8ConcatOp never writes it: it stays unset here too.
        return Int8Tensor(jnp.concatenate([x.data for x in xs], axis=axis), first.scale, first.zero_point)

    return kernel


def _nhwc_only(op: Op) -> None:
    if op.str("order", "NCHW") != "NHWC":
        raise BadArgumentError(f"{op.where}: {op.type} only supports NHWC order")


@register("Int8ChannelShuffle")
def int8_channel_shuffle(op: Op) -> Kernel:
    """QNNPACK's channel shuffle of the last (NHWC) dim: (G, C/G) -> (C/G, G). The op is a ConvPoolOpBase,
    so Caffe2 needs a kernel > 0 (or global_pooling) although nothing uses it."""
    _nhwc_only(op)
    geo = geometry(op)
    if not geo.global_pooling and not all(k > 0 for k in geo.kernel):
        raise BadArgumentError(
            f"{op.where}: kernel_[dim] > 0 (a ConvPoolOpBase needs a kernel), got {list(geo.kernel)}"
        )
    groups = op.int("group", 1)

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        _keeps_quantization(op, x)
        if len(x.shape) < 4:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be 4-D NHWC, got {list(x.shape)}")
        channels = x.shape[3]
        if groups < 2:
            raise BadArgumentError(f"{op.where}: QNNPACK's channel shuffle needs at least two groups, got {groups}")
        if channels % groups:
            raise ShapeError(f"{op.where}: {channels} channels do not split into {groups} groups")
        rows = x.data.reshape(-1, groups, channels // groups)
        return Int8Tensor(jnp.swapaxes(rows, 1, 2).reshape(x.shape), x.scale, x.zero_point)

    return kernel


@register("Int8ResizeNearest")
def int8_resize_nearest(op: Op) -> Kernel:
    """NHWC nearest-neighbour upsampling by float32 `width_scale` and `height_scale` (output size and
    source indices truncated, as Caffe2's int conversions do)."""
    width_scale = np.float32(op.float("width_scale", 1.0))
    height_scale = np.float32(op.float("height_scale", 1.0))
    if not (width_scale > 0 and height_scale > 0):
        raise BadArgumentError(f"{op.where}: width_scale and height_scale must be > 0")

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        if len(x.shape) != 4:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be 4-D NHWC, got {list(x.shape)}")
        _keeps_quantization(op, x)
        n, ih, iw, c = x.shape
        oh, ow = int(np.float32(ih) * height_scale), int(np.float32(iw) * width_scale)
        check_array(op.where, op.outputs[0], (n, oh, ow, c), np.uint8)
        rows = np.minimum((np.arange(oh, dtype=np.float32) / height_scale).astype(np.int64), ih - 1)
        cols = np.minimum((np.arange(ow, dtype=np.float32) / width_scale).astype(np.int64), iw - 1)
        return Int8Tensor(x.data[:, rows][:, :, cols], x.scale, x.zero_point)

    return kernel


def _not_one_by_one(op: Op, kernel: tuple[int, ...]) -> None:
    if math.prod(kernel) == 1:
        raise BadArgumentError(
            f"{op.where}: failed to create the QNNPACK pooling operator: 1x1 pooling is not supported"
        )


def _max_pool(op: Op, relu: bool) -> Kernel:
    """MaxPool in NHWC on the bytes (the input's quantization kept); the Relu form clamps below at the
    zero point."""
    _nhwc_only(op)
    inner = REGISTRY["MaxPool"].build(op)  # type: ignore[misc]

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        _keeps_quantization(op, x)
        if len(x.shape) != 4:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be 4-D NHWC, got {list(x.shape)}")
        _not_one_by_one(op, resolve(op, geometry(op, pooling=True), x.shape[1:3]).kernel)
        y = inner(x.data.astype(jnp.float32)).astype(jnp.uint8)  # uint8 is exact in float32
        if relu:
            y = jnp.maximum(y, jnp.uint8(_quantize_uint8(x.scale, x.zero_point, 0.0)))
        return Int8Tensor(y, x.scale, x.zero_point)

    return kernel


@register("Int8MaxPool")
def int8_max_pool(op: Op) -> Kernel:
    return _max_pool(op, relu=False)


@register("Int8MaxPoolRelu")
def int8_max_pool_relu(op: Op) -> Kernel:
    return _max_pool(op, relu=True)


def _average_pool(op: Op, relu: bool) -> Kernel:
    """QNNPACK's average pooling (NHWC): the window sum with padding read as the input's zero point, less
    `zero_point * kernel size`, times `X_scale / (Y_scale * kernel size)` in its fixed point (a 24-bit
    multiplier and a shift, rounding half away from zero), plus Y_zero_point, clamped (below at
    Y_zero_point for the Relu form). Global pooling takes the whole image as the window."""
    _nhwc_only(op)
    geo = geometry(op, pooling=True)
    y_scale, y_zero_point = _y_quantization(op)
    _zero_point_in_uint8(op, y_zero_point, "Y")
    low = _quantize_uint8(y_scale, y_zero_point, 0.0) if relu else 0

    def kernel(x: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        if len(x.shape) != 4:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be 4-D NHWC, got {list(x.shape)}")
        f32 = np.float32
        ratio = f32(x.scale) / f32(y_scale)
        if not 2.0**-8 <= ratio < 2.0**8:
            raise BadArgumentError(
                f"{op.where}: failed to create QNNPACK average pooling operator: input-to-output scale ratio "
                f"{ratio:g} must be in [2**-8, 2**8)"
            )
        window = resolve(op, geo, x.shape[1:3])
        if not geo.global_pooling:  # global pooling is QNNPACK's global-average operator, which takes any size
            _not_one_by_one(op, window.kernel)
        size = int(np.prod(window.kernel))
        scale = f32(x.scale) / (f32(y_scale) * f32(size))
        bits = int(np.asarray(scale, f32).view(np.uint32))
        multiplier = (bits & 0x007FFFFF) | 0x00800000
        shift = 127 + 23 - (bits >> 23)
        padded = [(0, 0), *zip(window.low, window.high, strict=True), (0, 0)]
        total = lax.reduce_window(
            lax.pad(x.data.astype(jnp.int64), jnp.int64(x.zero_point), [(a, b, 0) for a, b in padded]),
            jnp.int64(0),
            lax.add,
            (1, *window.kernel, 1),
            (1, *window.strides, 1),
            "VALID",
        )
        acc = total - x.zero_point * size
        scaled = (jnp.abs(acc) * multiplier + (1 << (shift - 1))) >> shift
        y = jnp.where(acc < 0, -scaled, scaled) + y_zero_point
        return Int8Tensor(jnp.clip(y, low, 255).astype(jnp.uint8), y_scale, y_zero_point)

    return kernel


@register("Int8AveragePool")
def int8_average_pool(op: Op) -> Kernel:
    return _average_pool(op, relu=False)


@register("Int8AveragePoolRelu")
def int8_average_pool_relu(op: Op) -> Kernel:
    return _average_pool(op, relu=True)


def _q31_parameters(op: Op, scale: float) -> tuple[int, int]:
    """qnnp_compute_conv_quantization_params: a Q31 multiplier (the float32 mantissa << 7) and a shift."""
    if not 0 < scale < 1:
        raise BadArgumentError(
            f"{op.where}: failed to create the QNNPACK operator: requantization scale {scale:g} (input scale * "
            "weight scale / output scale) must be in (0, 1)"
        )
    bits = int(np.asarray(scale, np.float32).view(np.uint32))
    shift = 126 - (bits >> 23)
    if shift >= 32:
        raise BadArgumentError(f"{op.where}: requantization scale {scale:g} is below what QNNPACK supports")
    return ((bits & 0x007FFFFF) | 0x00800000) << 7, shift


def _q31_requantize(acc: Any, multiplier: int, shift: int, zero_point: int, low: int = 0) -> Any:
    """QNNPACK's Q31 requantization of int32 accumulators (the SSE2 kernels' arithmetic): a rounding
    Q31 multiply, then a rounding arithmetic shift (ties away from zero), plus the zero point, clamped."""
    q31 = ((acc.astype(jnp.int64) * multiplier + (1 << 30)) >> 31).astype(jnp.int32)
    mask = (1 << shift) - 1
    remainder = (q31 & jnp.int32(mask)) - (q31 < 0).astype(jnp.int32)
    n = (q31 >> shift) + (remainder > (mask >> 1)).astype(jnp.int32)
    return jnp.clip(n.astype(jnp.int64) + zero_point, low, 255).astype(jnp.uint8)


@register("Int8FC", inputs=(3, 4), outputs=(1, 4))
def int8_fc(op: Op) -> Kernel:
    """QNNPACK's fully connected op: X [M, K] (dims after the first flattened) times W [N, K] (uint8, with its
    own zero point) plus B [N] (int32) as int32 sums of zero-point-shifted products, requantized to
    Y_scale/Y_zero_point."""
    if len(op.inputs) == 4:
        raise BadArgumentError(
            f"{op.where}: the quantization-parameters input '{op.inputs[3]}' (an Int8QuantParams blob) is not supported"
        )
    y_scale, y_zero_point = _y_quantization(op)
    _zero_point_in_uint8(op, y_zero_point, "Y")

    def kernel(x: Any, w: Any, b: Any) -> Int8Tensor:
        x, w, b = _int8(op, 0, x), _int8(op, 1, w), _int8(op, 2, b, np.int32)
        if len(x.shape) < 1 or len(w.shape) != 2:
            raise ShapeError(f"{op.where}: X {list(x.shape)} and W {list(w.shape)} (must be 2-D) do not fit")
        k = math.prod(x.shape[1:])
        n = w.shape[0]
        if k != w.shape[1] or n != math.prod(b.shape):
            raise ShapeError(
                f"{op.where}: X {list(x.shape)}, W {list(w.shape)} and B {list(b.shape)} do not fit "
                f"(K = {k} must be W's dim 1, N = W's dim 0 must be B's size)"
            )
        f32 = np.float32
        for what, scale in (("input", x.scale), ("weight", w.scale), ("output", y_scale)):
            if not (np.isfinite(scale) and f32(scale) >= np.finfo(np.float32).tiny):
                raise BadArgumentError(f"{op.where}: failed to create QNNPACK fully connected operator: {what} scale")
        multiplier, shift = _q31_parameters(op, float(f32(x.scale) * f32(w.scale) / f32(y_scale)))
        m = math.prod(x.shape) // k if k else 0
        xs = x.data.reshape(m, k).astype(jnp.int32) - x.zero_point
        ws = w.data.astype(jnp.int32) - w.zero_point
        acc = jnp.matmul(xs, ws.T, preferred_element_type=jnp.int32) + b.data.reshape(1, n)
        return Int8Tensor(_q31_requantize(acc, multiplier, shift, y_zero_point), y_scale, y_zero_point)

    return kernel


def _conv(op: Op, relu: bool) -> Kernel:
    """QNNPACK's NHWC convolution: W [M, KH, KW, C/group] (uint8, its own zero point), B [M] (int32); int32
    sums of zero-point-shifted products (padding reads the input's zero point, so adds nothing), plus B,
    Q31-requantized to Y_scale/Y_zero_point (clamped below at Y_zero_point for the Relu form)."""
    if op.str("order", "NCHW") != "NHWC":
        raise BadArgumentError(f"{op.where}: Int8Conv only supports NHWC order")
    geo = geometry(op)
    groups = op.int("group", 1)
    y_scale, y_zero_point = _y_quantization(op)
    _zero_point_in_uint8(op, y_zero_point, "Y")
    low = _quantize_uint8(y_scale, y_zero_point, 0.0) if relu else 0

    def kernel(*inputs: Any) -> Int8Tensor:
        if len(inputs) != 3:
            raise BadArgumentError(f"{op.where}: {op.type} needs 3 inputs (X, W, B), got {len(inputs)}")
        x, w, b = _int8(op, 0, inputs[0]), _int8(op, 1, inputs[1]), _int8(op, 2, inputs[2], np.int32)
        if len(x.shape) != 4 or len(w.shape) != 4:
            raise ShapeError(f"{op.where}: X {list(x.shape)} and W {list(w.shape)} must be 4-D (NHWC)")
        window = resolve(op, geo, x.shape[1:3])
        m, kh, kw, kc = w.shape
        c = x.shape[3]
        if groups <= 0 or c % groups or m % groups:
            raise ShapeError(f"{op.where}: {c} input and {m} output channels must be divisible by group {groups}")
        if (kh, kw) != tuple(window.kernel) or kc != c // groups or math.prod(b.shape) != m:
            raise ShapeError(
                f"{op.where}: W {list(w.shape)} and B {list(b.shape)} do not fit X {list(x.shape)} with kernel "
                f"{list(window.kernel)} and group {groups}"
            )
        f32 = np.float32
        for what, scale in (("input", x.scale), ("weight", w.scale), ("output", y_scale)):
            if not (np.isfinite(scale) and f32(scale) >= np.finfo(np.float32).tiny):
                raise BadArgumentError(f"{op.where}: failed to create QNNPACK convolution object: {what} scale")
        multiplier, shift = _q31_parameters(op, float(f32(x.scale) * f32(w.scale) / f32(y_scale)))
        xs = x.data.astype(jnp.int32) - x.zero_point
        padded = lax.pad(
            xs, jnp.int32(0), [(0, 0, 0), *((a, z, 0) for a, z in zip(window.low, window.high, strict=True)), (0, 0, 0)]
        )
        ws = jnp.transpose(w.data.astype(jnp.int32) - w.zero_point, (1, 2, 3, 0))  # HWIO
        acc = lax.conv_general_dilated(
            padded,
            ws,
            window.strides,
            "VALID",
            rhs_dilation=window.dilations,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups,
            preferred_element_type=jnp.int32,
        )
        acc = acc + b.data.reshape(m)
        return Int8Tensor(_q31_requantize(acc, multiplier, shift, y_zero_point, low), y_scale, y_zero_point)

    return kernel


@register("Int8Conv", inputs=(2, 3))
def int8_conv(op: Op) -> Kernel:
    return _conv(op, relu=False)


@register("Int8ConvRelu", inputs=(2, 3))
def int8_conv_relu(op: Op) -> Kernel:
    return _conv(op, relu=True)


def _pair_arg(op: Op, name: str, default: int) -> tuple[int, int]:
    """ConvTransposeUnpoolBase's `name` (one value for both dims) or `name`_h and `name`_w."""
    value = op.int(name, default)
    return op.int(f"{name}_h", value), op.int(f"{name}_w", value)


@register("Int8ConvTranspose", inputs=3)
def int8_conv_transpose(op: Op) -> Kernel:
    """QNNPACK's NHWC deconvolution: each input pixel scatters its zero-point-shifted channels times the
    kernel (W is [IC, KH, KW, OC]) into the output at `input * stride - pad + k`, no groups nor dilation
    (Caffe2 passes 1); then B, then Q31 requantization."""
    if op.str("order", "NCHW") != "NHWC":
        raise BadArgumentError(f"{op.where}: Int8ConvTransposeOp only supports NHWC order")
    stride = _pair_arg(op, "stride", 1)
    adj = _pair_arg(op, "adj", 0)
    pad = op.int("pad", 0)
    pads = op.ints("pads", ()) or (
        op.int("pad_t", pad),
        op.int("pad_l", pad),
        op.int("pad_b", pad),
        op.int("pad_r", pad),
    )
    if len(pads) != 4 or min(pads) < 0 or min(stride) < 1 or min(adj) < 0:
        raise BadArgumentError(f"{op.where}: pads {list(pads)}, strides {list(stride)}, adj {list(adj)} are invalid")
    pad_t, pad_l, pad_b, pad_r = pads
    y_scale, y_zero_point = _y_quantization(op)
    _zero_point_in_uint8(op, y_zero_point, "Y")

    def kernel(x: Any, w: Any, b: Any) -> Int8Tensor:
        x, w, b = _int8(op, 0, x), _int8(op, 1, w), _int8(op, 2, b, np.int32)
        if len(x.shape) != 4 or len(w.shape) != 4 or w.shape[0] != x.shape[3]:
            raise ShapeError(f"{op.where}: X {list(x.shape)} and W {list(w.shape)} (IC, KH, KW, OC) do not fit")
        _, kh, kw, oc = w.shape
        if op.has("kernel") and (op.int("kernel"), op.int("kernel")) != (kh, kw):
            raise ShapeError(f"{op.where}: kernel {op.int('kernel')} differs from W's {kh}x{kw}")
        if math.prod(b.shape) != oc:
            raise ShapeError(f"{op.where}: B {list(b.shape)} must hold one bias per output channel ({oc})")
        _, ih, iw, _ = x.shape
        oh = (ih - 1) * stride[0] - pad_t - pad_b + kh + adj[0]
        ow = (iw - 1) * stride[1] - pad_l - pad_r + kw + adj[1]
        if oh < 0 or ow < 0:
            raise ShapeError(f"{op.where}: output size {oh}x{ow} is negative")
        f32 = np.float32
        for what, scale in (("input", x.scale), ("weight", w.scale), ("output", y_scale)):
            if not (np.isfinite(scale) and f32(scale) >= np.finfo(np.float32).tiny):
                raise BadArgumentError(f"{op.where}: failed to create QNNPACK convolution object: {what} scale")
        multiplier, shift = _q31_parameters(op, float(f32(x.scale) * f32(w.scale) / f32(y_scale)))
        if oh == 0 or ow == 0:  # the pads eat the whole output: Caffe2 returns it empty
            return Int8Tensor(jnp.zeros((x.shape[0], oh, ow, oc), jnp.uint8), y_scale, y_zero_point)
        xs = x.data.astype(jnp.int32) - x.zero_point
        weights = jnp.transpose(w.data.astype(jnp.int32) - w.zero_point, (3, 1, 2, 0))  # [OC, KH, KW, IC]
        flipped = jnp.transpose(weights[:, ::-1, ::-1, :], (1, 2, 3, 0))  # HWIO
        padding = [(kh - 1 - pad_t, kh - 1 - pad_b + adj[0]), (kw - 1 - pad_l, kw - 1 - pad_r + adj[1])]
        acc = lax.conv_general_dilated(
            xs,
            flipped,
            (1, 1),
            padding,
            lhs_dilation=stride,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            preferred_element_type=jnp.int32,
        )
        acc = acc + b.data.reshape(oc)
        return Int8Tensor(_q31_requantize(acc, multiplier, shift, y_zero_point), y_scale, y_zero_point)

    return kernel


def _gemmlowp_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplierSmallerThanOne (int8_utils.h): a Q31 multiplier and a right shift for `real` in [0, 1)."""
    if real == 0:
        return 0, 0
    q, exponent = math.frexp(real)
    q_fixed = int(np.rint(q * (1 << 31)))
    if q_fixed == 1 << 31:
        q_fixed //= 2
        exponent += 1
    return q_fixed, -exponent


def _gemmlowp_requantize(acc: Any, multiplier: int, shift: int) -> Any:
    """MultiplyByQuantizedMultiplierSmallerThanOne: gemmlowp's SaturatingRoundingDoublingHighMul (a division
    truncating toward zero) then RoundingDivideByPOT, on int32 accumulators."""
    product = acc.astype(jnp.int64) * multiplier
    nudge = jnp.where(product >= 0, 1 << 30, 1 - (1 << 30))
    total = product + nudge
    high = jnp.where(total >= 0, total >> 31, -((-total) >> 31)).astype(jnp.int32)
    mask = (1 << shift) - 1
    remainder = high & jnp.int32(mask)
    threshold = (mask >> 1) + (high < 0).astype(jnp.int32)
    return (high >> shift) + (remainder > threshold).astype(jnp.int32)


def _roi_samples(roi: np.ndarray, spatial_scale: float, height: int, width: int, pooled: tuple[int, int], ratio: int):
    """One RoI's bilinear taps (pre_calc_for_bilinear_interpolate, in float32 as Caffe2 computes them): for
    each output cell, the flat positions and uint8 weights (x255) of every sample, and the sample count."""
    f32 = np.float32
    start_w, start_h, end_w, end_h = (f32(v) * f32(spatial_scale) for v in roi)
    roi_w, roi_h = max(end_w - start_w, f32(1)), max(end_h - start_h, f32(1))
    bin_h, bin_w = roi_h / f32(pooled[0]), roi_w / f32(pooled[1])
    grid_h = ratio if ratio > 0 else math.ceil(roi_h / pooled[0])
    grid_w = ratio if ratio > 0 else math.ceil(roi_w / pooled[1])
    positions = np.zeros((pooled[0], pooled[1], grid_h * grid_w, 4), np.int64)
    weights = np.zeros((pooled[0], pooled[1], grid_h * grid_w, 4), np.int64)
    for ph in range(pooled[0]):
        for pw in range(pooled[1]):
            for iy in range(grid_h):
                yy = start_h + f32(ph) * bin_h + f32(iy + 0.5) * bin_h / f32(grid_h)
                for ix in range(grid_w):
                    xx = start_w + f32(pw) * bin_w + f32(ix + 0.5) * bin_w / f32(grid_w)
                    y, x = f32(yy), f32(xx)
                    if y < -1.0 or y > height or x < -1.0 or x > width:
                        continue  # weights stay 0
                    y, x = max(y, f32(0)), max(x, f32(0))
                    y_low, x_low = int(y), int(x)
                    if y_low >= height - 1:
                        y_low = y_high = height - 1
                        y = f32(y_low)
                    else:
                        y_high = y_low + 1
                    if x_low >= width - 1:
                        x_low = x_high = width - 1
                        x = f32(x_low)
                    else:
                        x_high = x_low + 1
                    ly, lx = f32(y - f32(y_low)), f32(x - f32(x_low))
                    hy, hx = f32(1.0 - float(ly)), f32(1.0 - float(lx))
                    taps = (hy * hx, hy * lx, ly * hx, ly * lx)
                    i = iy * grid_w + ix
                    weights[ph, pw, i] = [int(np.rint(f32(t) * f32(255.0))) & 0xFF for t in taps]
                    positions[ph, pw, i] = [
                        y_low * width + x_low,
                        y_low * width + x_high,
                        y_high * width + x_low,
                        y_high * width + x_high,
                    ]
    return positions, weights, grid_h * grid_w


@register("Int8RoIAlign", inputs=2, static_inputs=(1,))
def int8_roi_align(op: Op) -> Kernel:
    """Caffe2's integer RoIAlign (NHWC): bilinear taps with weights rounded to uint8 (x255), summed as int32
    less the input zero point per tap, requantized with gemmlowp's fixed point to Y_scale/Y_zero_point.
    The RoIs decide each cell's sampling grid, so they must be known when the net is compiled."""
    if op.str("order", "NHWC") != "NHWC":
        raise BadArgumentError(f"{op.where}: Int8RoIAlign only supports NHWC order")
    spatial_scale = float(np.float32(op.float("spatial_scale", 1.0)))
    pooled = (op.int("pooled_h", 1), op.int("pooled_w", 1))
    ratio = op.int("sampling_ratio", -1)
    if min(pooled) <= 0 or spatial_scale <= 0:
        raise BadArgumentError(f"{op.where}: pooled_h, pooled_w and spatial_scale must be positive")
    y_scale, y_zero_point = _y_quantization(op)

    def kernel(x: Any, rois: Any) -> Int8Tensor:
        x = _int8(op, 0, x)
        if len(x.shape) != 4:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be 4-D NHWC, got {list(x.shape)}")
        n, height, width, channels = x.shape
        r = np.asarray(rois)
        if r.size == 0:
            return Int8Tensor(jnp.zeros((0, *pooled, channels), jnp.uint8), y_scale, y_zero_point)
        if r.dtype != np.float32 or r.ndim != 2 or r.shape[1] not in (4, 5):
            raise ShapeError(
                f"{op.where}: RoIs '{op.inputs[1]}' must be float32 [R, 4 or 5], got {r.dtype}{list(r.shape)}"
            )
        flat = x.data.reshape(n, height * width, channels).astype(jnp.int32)
        cells = []
        for roi in r:
            batch = int(roi[0]) if r.shape[1] == 5 else 0
            if not 0 <= batch < n:
                raise ShapeError(f"{op.where}: RoI batch index {batch} is outside the input's {n} images")
            positions, weights, count = _roi_samples(roi[-4:], spatial_scale, height, width, pooled, ratio)
            real = float(np.float32(x.scale)) / (float(np.float32(y_scale)) * 255.0 * count)
            if not real < 1:
                raise BadArgumentError(f"{op.where}: the requantization multiplier {real:g} must be below 1")
            multiplier, shift = _gemmlowp_multiplier(real)
            taps = flat[batch][jnp.asarray(positions)]  # [ph, pw, samples, 4, C]
            acc = (taps * jnp.asarray(weights, jnp.int32)[..., None]).sum(axis=(2, 3))
            acc = acc - jnp.int32(x.zero_point * 255 * count)
            y = _gemmlowp_requantize(acc, multiplier, shift) + y_zero_point
            cells.append(jnp.clip(y, 0, 255).astype(jnp.uint8))
        return Int8Tensor(jnp.stack(cells), y_scale, y_zero_point)

    return kernel


__all__ = ["Int8Tensor", "int8_tensor"]
