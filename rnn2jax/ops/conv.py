"""Convolutions: Conv (1-D to N-D, NCHW and NHWC, groups, dilations), its fixed-name aliases
Conv1D/2D/3D, ConvRelu, ConvTranspose, and their gradient ops.

Caffe2 reads the window geometry (kernel, strides, dilations, pads, legacy padding) the same way for
convolutions and pooling (caffe2/operators/conv_pool_op_base.h): `geometry` and `resolve` mirror that
class, and the pooling ops (pool.py) use them too. The gradient ops are the vjp of the forward kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .common import matmul_precision
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import GradientContext, GradientError, GradientOps, argument, gradient_op
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

# caffe2_legacy.proto LegacyPadding
NOTSET, VALID, SAME, CAFFE_LEGACY_POOLING = 0, 1, 2, 3

FLOATS = frozenset(np.dtype(t) for t in (np.float32, np.float64))


# --------------------------------------------------------------------------------------------------
# Window geometry (ConvPoolOpBase)


@dataclass(frozen=True)
class Geometry:
    """The arguments as ConvPoolOpBase's constructor leaves them: `pads` holds every head pad, then
    every tail pad (pad_t, pad_l, pad_b, pad_r for 2-D)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    legacy_pad: int
    global_pooling: bool
    nhwc: bool


@dataclass(frozen=True)
class Window:
    """The geometry for one input's spatial dims: `low`/`high` pad each dim so that the output has
    `out` windows of `kernel` (dilated) taken every `strides` (`high` < 0 crops the tail)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    low: tuple[int, ...]
    high: tuple[int, ...]
    out: tuple[int, ...]


def _resize(values: list[int], size: int, fill: int) -> list[int]:
    """std::vector::resize: truncate, or extend with `fill`."""
    return values[:size] + [fill] * max(0, size - len(values))


def _legacy_arg(op: Op) -> int:
    legacy = op.int("legacy_pad", NOTSET)
    if legacy not in (NOTSET, VALID, SAME, CAFFE_LEGACY_POOLING):
        raise BadArgumentError(f"{op.where}: argument 'legacy_pad' = {legacy} is not a LegacyPadding value (0-3)")
    return legacy


def _explicit_pads(op: Op, pads: list[int], legacy: int, count: int) -> list[int]:
    """`pad` (every side) or all four of pad_t/pad_l/pad_b/pad_r, which refuse legacy VALID/SAME."""
    sides = ("pad_t", "pad_l", "pad_b", "pad_r")
    if op.has("pad") or all(op.has(name) for name in sides):
        if legacy in (VALID, SAME):
            raise BadArgumentError(
                f"{op.where}: with legacy_pad VALID or SAME, no explicit padding may be given (pad, pad_t...)"
            )
        if op.has("pad"):
            return _resize(pads, count, op.int("pad"))
        return pads + [op.int(name) for name in sides]
    return pads


def _pair(op: Op, values: list[int], name: str) -> list[int]:
    """`name` (both dims) or `name_h` and `name_w`, after the repeated form `name + 's'`."""
    if op.has(name):
        return _resize(values, 2, op.int(name))
    if op.has(f"{name}_h") and op.has(f"{name}_w"):
        return [*values, op.int(f"{name}_h"), op.int(f"{name}_w")]
    return values


def _order(op: Op) -> bool:
    order = op.str("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise BadArgumentError(f"{op.where}: argument 'order' = {order!r} must be NCHW or NHWC")
    return order == "NHWC"


def geometry(op: Op, pooling: bool = False) -> Geometry:
    """ConvPoolOpBase's constructor (and PoolOp's: no dilation, pads smaller than the kernel). Strides
    and dilations of 0 and negative pads, which Caffe2 lets through to undefined arithmetic, are refused."""
    legacy = _legacy_arg(op)
    global_pooling = op.bool("global_pooling", False)
    if legacy in (VALID, SAME) and op.has("pads"):
        raise BadArgumentError(f"{op.where}: with legacy_pad VALID or SAME, argument 'pads' may not be given")
    kernel = _pair(op, list(op.ints("kernels", ())), "kernel")
    strides = _pair(op, list(op.ints("strides", ())), "stride")
    dilations = _pair(op, list(op.ints("dilations", ())), "dilation")
    pads = _explicit_pads(op, list(op.ints("pads", ())), legacy, 4)
    kernel = kernel or [0, 0]
    strides = strides or [1] * len(kernel)
    pads = pads or [0] * (2 * len(kernel))
    dilations = dilations or [1] * len(kernel)
    for name, values in (("strides", strides), ("dilations", dilations)):
        if len(values) != len(kernel):
            raise BadArgumentError(f"{op.where}: {len(values)} {name} for a kernel of {len(kernel)} dims")
    if legacy not in (VALID, SAME) and len(pads) != 2 * len(kernel):
        raise BadArgumentError(f"{op.where}: {len(pads)} pads for a kernel of {len(kernel)} dims (need two per dim)")
    if global_pooling and (any(pads) or any(d != 1 for d in dilations) or any(s != 1 for s in strides)):
        raise BadArgumentError(f"{op.where}: with global_pooling, pads, dilations and strides may not be set")
    for name, values, low in (("kernel", kernel, 0), ("strides", strides, 1), ("dilations", dilations, 1)):
        if any(v < low for v in values):
            raise BadArgumentError(f"{op.where}: argument '{name}' = {values} must be at least {low}")
    if any(p < 0 for p in pads):
        raise BadArgumentError(f"{op.where}: pads {pads} must not be negative")
    if pooling:
        if any(d != 1 for d in dilations):
            raise BadArgumentError(f"{op.where}: pooling does not support dilations, got {dilations}")
        count = len(kernel)
        if not global_pooling and any(pads[i] >= kernel[i] or pads[i + count] >= kernel[i] for i in range(count)):
            raise BadArgumentError(f"{op.where}: pads {pads} must be smaller than the kernel {kernel}")
    return Geometry(tuple(kernel), tuple(strides), tuple(dilations), tuple(pads), legacy, global_pooling, _order(op))


def _size_and_pad(op: Op, size: int, stride: int, kernel: int, dilation: int, legacy: int, head: int, tail: int):
    """ComputeSizeAndPad: (output size, head pad, tail pad) of one dim."""
    dkernel = dilation * (kernel - 1) + 1
    if legacy == NOTSET:
        if size + head + tail < dkernel:
            raise ShapeError(
                f"{op.where}: a spatial dim of {size} padded by {head}+{tail} is smaller than the (dilated) "
                f"kernel {dkernel}"
            )
        return (size + head + tail - dkernel) // stride + 1, head, tail
    if legacy == VALID:
        return int((size - dkernel) / stride) + 1, 0, 0  # C++ division truncates toward zero
    if legacy == SAME:
        if dilation != 1:
            raise BadArgumentError(f"{op.where}: legacy_pad SAME does not support dilations")
        target = (size + stride - 1) // stride
        needed = (target - 1) * stride + kernel - size
        # CAFFE2_PAD_HEAD_MORE is false: the tail gets the odd pad. A stride above the kernel makes
        # `needed` negative: C++ division truncates it toward zero, and the negative tail crops.
        head = int(needed / 2)
        return int((size + needed - dkernel) / stride) + 1, head, needed - head
    # CAFFE_LEGACY_POOLING: Caffe's ceil, computed in float as Caffe2 does; the last window must start
    # inside the image (or its head padding).
    ratio = np.float32(size + 2 * head - kernel) / np.float32(stride)
    out = math.ceil(ratio + np.float32(1))
    if head > 0 and (out - 1) * stride >= size + head:
        out -= 1
    standard = int(ratio + np.float32(1))
    if out < standard:  # a head pad of the kernel size or more (Caffe2: "This should never happen")
        raise ShapeError(f"{op.where}: legacy_pad CAFFE_LEGACY_POOLING with head pad {head} gives no valid size")
    return out, head, head + stride * (out - standard)


def resolve(op: Op, geo: Geometry, spatial: Sequence[int]) -> Window:
    """InferOutputSize for an input with these spatial dims."""
    nd = len(spatial)
    if geo.global_pooling:
        ones = (1,) * nd
        return Window(tuple(spatial), ones, ones, (0,) * nd, (0,) * nd, ones)
    if len(geo.kernel) != nd:
        raise ShapeError(
            f"{op.where}: a kernel of {len(geo.kernel)} dims ({list(geo.kernel)}) for an input with {nd} "
            f"spatial dims {list(spatial)}"
        )
    if any(k <= 0 for k in geo.kernel):
        raise BadArgumentError(f"{op.where}: the kernel size must be set (kernel, kernels or kernel_h/kernel_w)")
    pads = geo.pads if len(geo.pads) == 2 * nd else (0,) * (2 * nd)
    out, low, high = [], [], []
    for i, size in enumerate(spatial):
        stride, kernel, dilation = geo.strides[i], geo.kernel[i], geo.dilations[i]
        size_out, head, _ = _size_and_pad(op, size, stride, kernel, dilation, geo.legacy_pad, pads[i], pads[i + nd])
        if size_out < 0:
            raise ShapeError(f"{op.where}: spatial dim {i} of size {size} gives a negative output size")
        dkernel = dilation * (kernel - 1) + 1
        out.append(size_out)
        if size_out == 0:  # legacy VALID on a dim shorter than the kernel: pad so that no window fits
            low.append(0)
            high.append(dkernel - 1 - size)
        else:  # the windows reach (out - 1) * stride + dkernel - head past the start: pad (or crop) to that
            low.append(head)
            high.append((size_out - 1) * stride + dkernel - size - head)
    return Window(geo.kernel, geo.strides, geo.dilations, tuple(low), tuple(high), tuple(out))


def spatial_axes(ndim: int, nhwc: bool) -> tuple[int, ...]:
    return tuple(range(1, ndim - 1)) if nhwc else tuple(range(2, ndim))


def channel_axis(ndim: int, nhwc: bool) -> int:
    return ndim - 1 if nhwc else 1


def check_float(op: Op, *values: jax.Array) -> None:
    """Caffe2 registers these ops for float only (float64 is accepted here for rnn2jax's float64
    verification mode, rnn2jax/checking/verification.py); every input shares the first one's dtype."""
    for name, value in zip(op.inputs, values, strict=False):
        if np.dtype(value.dtype) not in FLOATS:
            raise ShapeError(f"{op.where}: input '{name}' has dtype {value.dtype}; {op.type} takes float tensors")
    dtypes = {np.dtype(v.dtype) for v in values}
    if len(dtypes) > 1:
        raise ShapeError(f"{op.where}: {op.type} inputs must share one dtype, got {sorted(map(str, dtypes))}")


def check_image(op: Op, x: jax.Array, min_spatial: int = 1) -> None:
    """SetOutputSize: a batch, channels and spatial dims, with something in each image."""
    if x.ndim < 2 + min_spatial:
        raise ShapeError(
            f"{op.where}: input '{op.inputs[0]}' of shape {list(x.shape)} needs a batch, a channel and "
            f"{min_spatial}+ spatial dims"
        )
    if math.prod(x.shape[1:]) == 0:
        raise ShapeError(f"{op.where}: input '{op.inputs[0]}' of shape {list(x.shape)} has empty images")


# --------------------------------------------------------------------------------------------------
# Conv


def _dimension_numbers(nd: int, nhwc: bool) -> lax.ConvDimensionNumbers:
    """Caffe2's layouts: X and Y as NC<spatial> or N<spatial>C, the filter as M C/G <kernel> or M <kernel> C/G."""
    spec = (0, nd + 1, *range(1, nd + 1)) if nhwc else tuple(range(nd + 2))
    return lax.ConvDimensionNumbers(spec, spec, spec)


def convolve(x: jax.Array, w: jax.Array, window: Window, groups: int, nhwc: bool, pads=None) -> jax.Array:
    """The convolution of `x` with `w` over `window` (`pads` overrides its (low, high) pairs)."""
    nd = x.ndim - 2
    pads = list(zip(window.low, window.high, strict=True)) if pads is None else pads
    axes = spatial_axes(x.ndim, nhwc)
    crop = [(0, 0, 0)] * x.ndim
    for axis, (_, high) in zip(axes, pads, strict=True):
        crop[axis] = (0, min(high, 0), 0)
    x = lax.pad(x, jnp.zeros((), x.dtype), crop)  # negative tail pads crop the input first
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=window.strides,
        padding=[(low, max(high, 0)) for low, high in pads],
        rhs_dilation=window.dilations,
        dimension_numbers=_dimension_numbers(nd, nhwc),
        feature_group_count=groups,
        precision=matmul_precision(),
    )


@dataclass(frozen=True)
class _ConvArgs:
    geo: Geometry
    groups: int


def _conv_args(op: Op) -> _ConvArgs:
    geo = geometry(op)
    groups = op.int("group", 1)
    if groups < 1:
        raise BadArgumentError(f"{op.where}: argument 'group' = {groups} must be positive")
    return _ConvArgs(geo, groups)


def _conv_window(op: Op, args: _ConvArgs, x: jax.Array, w: jax.Array) -> Window:
    """ConvOp's checks of X and the filter; the window of X's spatial dims."""
    geo, groups = args.geo, args.groups
    check_image(op, x)
    if x.ndim != w.ndim:
        raise ShapeError(
            f"{op.where}: input '{op.inputs[0]}' {list(x.shape)} and filter '{op.inputs[1]}' {list(w.shape)} "
            f"must have the same rank"
        )
    nd = x.ndim - 2
    if geo.nhwc and nd > 3:
        raise ShapeError(f"{op.where}: NHWC convolution supports 1 to 3 spatial dims, got {nd}")
    channels = x.shape[channel_axis(x.ndim, geo.nhwc)]
    per_group = w.shape[-1] if geo.nhwc else w.shape[1]
    if channels != per_group * groups:
        raise ShapeError(
            f"{op.where}: input '{op.inputs[0]}' has {channels} channels, filter '{op.inputs[1]}' "
            f"{list(w.shape)} takes {per_group} per group x {groups} groups"
        )
    if w.shape[0] % groups:
        raise ShapeError(f"{op.where}: {w.shape[0]} output channels are not divisible by group {groups}")
    window = resolve(op, geo, [x.shape[a] for a in spatial_axes(x.ndim, geo.nhwc)])
    kernel_dims = tuple(w.shape[1:-1] if geo.nhwc else w.shape[2:])
    if kernel_dims != window.kernel:
        raise ShapeError(
            f"{op.where}: filter '{op.inputs[1]}' {list(w.shape)} does not match the kernel {list(window.kernel)}"
        )
    return window


def _add_bias(op: Op, y: jax.Array, b: jax.Array, channels: int, nhwc: bool) -> jax.Array:
    if b.ndim != 1 or b.shape[0] != channels:
        raise ShapeError(f"{op.where}: bias '{op.inputs[2]}' {list(b.shape)} must be a vector of {channels}")
    shape = [1] * y.ndim
    shape[channel_axis(y.ndim, nhwc)] = channels
    return y + b.reshape(shape)


def _conv_kernel(op: Op, relu: bool = False) -> Kernel:
    args = _conv_args(op)

    def kernel(x, w, b=None):
        check_float(op, x, w, *(() if b is None else (b,)))
        window = _conv_window(op, args, x, w)
        y = convolve(x, w, window, args.groups, args.geo.nhwc)
        if b is not None and x.shape[0]:  # Caffe2 returns an empty batch before it looks at the bias
            y = _add_bias(op, y, b, w.shape[0], args.geo.nhwc)
        return jnp.maximum(y, jnp.zeros((), y.dtype)) if relu else y

    return kernel


@register("Conv", "Conv1D", "Conv2D", "Conv3D", inputs=(2, 3))
def conv(op: Op) -> Kernel:
    """Y = X * W (+ b) (caffe2/operators/conv_op_impl.h). The 1D/2D/3D names are plain aliases: Caffe2
    does not check the rank against them."""
    return _conv_kernel(op)


@facet("gradient", "Conv", "Conv1D", "Conv2D", "Conv3D")
def _conv_gradient_maker(g: GradientContext) -> GradientOps:
    """GetConvGradient (conv_gradient_op.cc) and GetConvTransposeGradient: (X, W, dY) -> dW, db, dX;
    without a bias input the op gets no_bias=1, and no_gradient_to_input=1 leaves dX out."""
    if len(g.op.input) not in (2, 3):
        raise GradientError(f"{g.op.type} takes 2 or 3 inputs, got {len(g.op.input)}")
    with_dx = not g.flag("no_gradient_to_input", False)
    inputs = [g.I(0), g.I(1), g.GO(0)]
    if len(g.op.input) == 3:
        outputs = [g.GI(1), g.GI(2)] + ([g.GI(0)] if with_dx else [])
        return [gradient_op(g.op.type + "Gradient", inputs, outputs)]
    outputs = [g.GI(1)] + ([g.GI(0)] if with_dx else [])
    return [gradient_op(g.op.type + "Gradient", inputs, outputs, [argument("no_bias", 1)])]


@register("ConvRelu", inputs=(2, 3), gradient=NO_GRADIENT)
def conv_relu(op: Op) -> Kernel:
    """Relu(Conv(X, W, b)) (caffe2/operators/conv_relu_op.cc); Caffe2 has no gradient for it."""
    return _conv_kernel(op, relu=True)


def _bias_gradient(dy: jax.Array, nhwc: bool) -> jax.Array:
    axis = channel_axis(dy.ndim, nhwc)
    return jnp.sum(dy, axis=tuple(a for a in range(dy.ndim) if a != axis))


def _gradient_outputs(op: Op) -> tuple[bool, bool]:
    """(no_bias, compute dX) of a ConvGradient: outputs are dW, then db unless no_bias, then dX."""
    no_bias = op.bool("no_bias", False)
    count = len(op.outputs)
    if no_bias and count == 3:
        raise BadArgumentError(f"{op.where}: with no_bias, {op.type} has at most 2 outputs (dW, dX)")
    if not no_bias and count < 2:
        raise BadArgumentError(f"{op.where}: without no_bias, {op.type} needs outputs dW and db")
    return no_bias, count == 3 or (no_bias and count == 2)


def _check_dy(op: Op, dy: jax.Array, shape: tuple[int, ...]) -> None:
    if tuple(dy.shape) != tuple(shape):
        raise ShapeError(
            f"{op.where}: output gradient '{op.inputs[2]}' has shape {list(dy.shape)}, the forward output "
            f"has {list(shape)}"
        )


@register("ConvGradient", "Conv1DGradient", "Conv2DGradient", "Conv3DGradient", inputs=3, outputs=(1, 3))
def conv_gradient(op: Op) -> Kernel:
    """(X, W, dY) -> dW, db (unless no_bias), dX (when asked for): the vjp of Conv."""
    args = _conv_args(op)
    no_bias, with_dx = _gradient_outputs(op)

    def kernel(x, w, dy):
        check_float(op, x, w, dy)
        window = _conv_window(op, args, x, w)
        y, vjp = jax.vjp(lambda x_, w_: convolve(x_, w_, window, args.groups, args.geo.nhwc), x, w)
        _check_dy(op, dy, y.shape)
        dx, dw = vjp(dy)
        outputs = [dw]
        if not no_bias:
            outputs.append(_bias_gradient(dy, args.geo.nhwc))
        if with_dx:
            outputs.append(dx)
        return tuple(outputs)

    return kernel


# --------------------------------------------------------------------------------------------------
# ConvTranspose (ConvTransposeUnpoolBase: 2-D only, no dilation, `adjs` extend the output)


@dataclass(frozen=True)
class _TransposeArgs:
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    adjs: tuple[int, ...]
    legacy: int
    groups: int
    nhwc: bool


def _transpose_args(op: Op) -> _TransposeArgs:
    """ConvTransposeUnpoolBase's constructor."""
    legacy = _legacy_arg(op)
    if legacy == CAFFE_LEGACY_POOLING:  # Caffe2 aborts the process (LOG(FATAL))
        raise BadArgumentError(f"{op.where}: legacy_pad CAFFE_LEGACY_POOLING is not supported by {op.type}")
    if legacy in (VALID, SAME) and op.has("pads"):
        raise BadArgumentError(f"{op.where}: with legacy_pad VALID or SAME, argument 'pads' may not be given")
    kernel = _pair(op, list(op.ints("kernels", ())), "kernel") or [0, 0]
    strides = _pair(op, list(op.ints("strides", ())), "stride") or [1] * len(kernel)
    adjs = _pair(op, list(op.ints("adjs", ())), "adj") or [0] * len(kernel)
    pads = _explicit_pads(op, list(op.ints("pads", ())), legacy, 4) or [0] * (2 * len(kernel))
    for name, values in (("strides", strides), ("adjs", adjs)):
        if len(values) != len(kernel):
            raise BadArgumentError(f"{op.where}: {len(values)} {name} for a kernel of {len(kernel)} dims")
    if len(kernel) != 2:
        raise BadArgumentError(f"{op.where}: {op.type} takes a 2-D kernel, got {kernel}")
    if legacy in (VALID, SAME):
        pads = [0, 0, 0, 0]
    if len(pads) != 4:
        raise BadArgumentError(f"{op.where}: {len(pads)} pads for a 2-D kernel (need 4)")
    for i in range(2):
        if kernel[i] <= 0 or strides[i] <= 0 or not 0 <= adjs[i] <= strides[i]:
            raise BadArgumentError(
                f"{op.where}: need kernel > 0, stride > 0 and 0 <= adj <= stride; got kernel {kernel}, "
                f"strides {strides}, adjs {adjs}"
            )
    if any(p < 0 for p in pads):
        raise BadArgumentError(f"{op.where}: pads {pads} must not be negative")
    groups = op.int("group", 1)
    if groups < 1:
        raise BadArgumentError(f"{op.where}: argument 'group' = {groups} must be positive")
    return _TransposeArgs(tuple(kernel), tuple(strides), tuple(pads), tuple(adjs), legacy, groups, _order(op))


def _transpose_fn(op: Op, args: _TransposeArgs, x: jax.Array, w: jax.Array):
    """Checks X and W; returns (the function W, X -> Y without bias, Y's channel count)."""
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"{op.where}: {op.type} takes a 4-D input and filter, got {list(x.shape)} and {list(w.shape)}")
    if math.prod(x.shape[1:]) == 0:
        raise ShapeError(f"{op.where}: input '{op.inputs[0]}' of shape {list(x.shape)} has empty images")
    nhwc, groups = args.nhwc, args.groups
    in_channels = x.shape[3 if nhwc else 1]
    if in_channels != w.shape[0] or in_channels % groups:
        raise ShapeError(
            f"{op.where}: input '{op.inputs[0]}' has {in_channels} channels; filter '{op.inputs[1]}' "
            f"{list(w.shape)} must have as many rows, divisible by group {groups}"
        )
    kernel_dims = tuple(w.shape[1:3] if nhwc else w.shape[2:4])
    if kernel_dims != args.kernel:
        raise ShapeError(f"{op.where}: filter '{op.inputs[1]}' {list(w.shape)} does not match kernel {args.kernel}")
    channels = (w.shape[3] if nhwc else w.shape[1]) * groups
    spatial = x.shape[1:3] if nhwc else x.shape[2:4]
    out = []
    for i in range(2):
        size = (spatial[i] - 1) * args.strides[i] + args.kernel[i] + args.adjs[i] - args.pads[i] - args.pads[i + 2]
        if size < 0:
            raise ShapeError(f"{op.where}: pads {list(args.pads)} leave a negative output size")
        out.append(size)
    y_shape = (x.shape[0], *out, channels) if nhwc else (x.shape[0], channels, *out)
    window = Window(args.kernel, args.strides, (1, 1), args.pads[:2], args.pads[2:], tuple(spatial))
    pads = [(args.pads[0], args.pads[2]), (args.pads[1], args.pads[3])]
    index = (slice(None), slice(0, spatial[0]), slice(0, spatial[1]))
    index = (*index, slice(None)) if nhwc else (index[0], slice(None), *index[1:])

    def forward_conv(w_, y):  # Conv(Y, W) maps Y's shape onto X's: ConvTranspose is its transpose
        return convolve(y, w_, window, groups, nhwc, pads)[index]

    def transpose(w_, x_):
        primal = jax.ShapeDtypeStruct(y_shape, x_.dtype)
        (y,) = jax.linear_transpose(lambda y_: forward_conv(w_, y_), primal)(x_)
        return y

    return transpose, channels


@register("ConvTranspose", inputs=(2, 3), gradient=_conv_gradient_maker)
def conv_transpose(op: Op) -> Kernel:
    """Y = X *^T W (+ b) (caffe2/operators/conv_transpose_op_impl.h): X (N, M, H, W) with a filter
    (M, C/G, kh, kw) gives Y (N, C, (H-1)*stride + kh + adj - pad_t - pad_b, ...)."""
    args = _transpose_args(op)

    def kernel(x, w, b=None):
        check_float(op, x, w, *(() if b is None else (b,)))
        transpose, channels = _transpose_fn(op, args, x, w)
        y = transpose(w, x)
        if b is None or x.size == 0:  # Caffe2 returns an empty input's output before it looks at the bias
            return y
        return _add_bias(op, y, b, channels, args.nhwc)

    return kernel


@register("ConvTransposeGradient", inputs=3, outputs=(1, 3))
def conv_transpose_gradient(op: Op) -> Kernel:
    """(X, W, dY) -> dW, db (unless no_bias), dX (when asked for): the vjp of ConvTranspose."""
    args = _transpose_args(op)
    no_bias, with_dx = _gradient_outputs(op)

    def kernel(x, w, dy):
        check_float(op, x, w, dy)
        transpose, _ = _transpose_fn(op, args, x, w)
        y, vjp = jax.vjp(transpose, w, x)
        _check_dy(op, dy, y.shape)
        dw, dx = vjp(dy)
        outputs = [dw]
        if not no_bias:
            outputs.append(_bias_gradient(dy, args.nhwc))
        if with_dx:
            outputs.append(dx)
        return tuple(outputs)

    return kernel
