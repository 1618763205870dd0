"""Image-layout ops: space/batch moves, PadImage, ChannelShuffle, bilinear and nearest resizing, LRN,
Im2Col/Col2Im, BatchPermutation and IntegralImage, with their gradient ops.

Caffe2 registers all of them for float only. Most are gathers whose indices follow from shapes and
arguments (computed with NumPy at trace time); their gradient ops are the vjp of the same gather, except
where Caffe2's gradient op computes something else (IntegralImageGradient, LRNGradient reading Y).
Resizing ops whose scales come as an input decide their output shape from its values: that input is static.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import first_bad, literal, runtime_check, runtime_checked
from .conv import geometry
from .facets import GRADIENT_OP, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import GradientContext, GradientOps, gradient_op, single_gradient
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)

# --------------------------------------------------------------------------------------------------
# Helpers


def _check_float(op: Op, *xs: Any, first: int = 0) -> None:
    for i, x in enumerate(xs, start=first):
        if np.dtype(x.dtype) != _F32:
            raise ShapeError(f"{op.where}: input '{op.inputs[i]}' has dtype {x.dtype}; {op.type} takes float tensors")


def _check_rank(op: Op, x: Any, rank: int, index: int = 0) -> None:
    if x.ndim != rank:
        raise ShapeError(f"{op.where}: input '{op.inputs[index]}' must be {rank}-D, got shape {list(x.shape)}")


def _nhwc(op: Op) -> bool:
    order = op.str("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise BadArgumentError(f"{op.where}: argument 'order' = {order!r} must be NCHW or NHWC")
    return order == "NHWC"


def _vjp(forward: Callable[[Any], Any], shape: tuple[int, ...], grad: Any) -> Any:
    """The gradient of the linear map `forward` at an input of `shape`, for the output gradient `grad`."""
    _, pullback = jax.vjp(forward, jnp.zeros(shape, grad.dtype))
    return pullback(grad)[0]


def _nchw(x: Any, nhwc: bool) -> Any:
    return jnp.moveaxis(x, -1, 1) if nhwc else x


def _back(x: Any, nhwc: bool) -> Any:
    return jnp.moveaxis(x, 1, -1) if nhwc else x


# --------------------------------------------------------------------------------------------------
# SpaceToBatch / BatchToSpace (space_batch_op.h: NCHW only)


def _space_batch_args(op: Op) -> tuple[int, int, int]:
    """(pad_t, pad (left, bottom and right all read `pad`: space_batch_op.h), block_size)."""
    if op.str("order", "NCHW") != "NCHW":
        raise BadArgumentError(f"{op.where}: {op.type} supports order NCHW only")
    pad = op.int("pad", 0)
    pad_t = op.int("pad_t", pad)
    block = op.int("block_size", 2)
    if block < 1:
        raise BadArgumentError(f"{op.where}: argument 'block_size' = {block} must be >= 1")
    if pad < 0 or pad_t < 0:
        raise BadArgumentError(f"{op.where}: pads must not be negative (pad = {pad}, pad_t = {pad_t})")
    return pad_t, pad, block


def _space_to_batch(op: Op, x: Any, pad_t: int, pad: int, b: int) -> Any:
    _check_rank(op, x, 4)
    n, c, h, w = x.shape
    height, width = h + pad_t + pad, w + 2 * pad
    if height % b or width % b:
        raise ShapeError(
            f"{op.where}: the padded image {height}x{width} is not a multiple of block_size = {b} ({list(x.shape)})"
        )
    padded = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, 0, 0), (pad_t, pad, 0), (pad, pad, 0)])
    blocks = padded.reshape(n, c, height // b, b, width // b, b)
    return blocks.transpose(3, 5, 0, 1, 2, 4).reshape(n * b * b, c, height // b, width // b)


def _batch_to_space(op: Op, x: Any, pad_t: int, pad: int, b: int) -> Any:
    _check_rank(op, x, 4)
    batch, c, h, w = x.shape
    if batch % (b * b) or (batch == 0):
        raise ShapeError(f"{op.where}: batch {batch} must be a positive multiple of block_size^2 = {b * b}")
    height, width = h * b - pad_t - pad, w * b - 2 * pad
    if height <= 0 or width <= 0:
        raise ShapeError(f"{op.where}: pads {pad_t}/{pad} leave no image of {list(x.shape)} (block_size {b})")
    n = batch // (b * b)
    full = x.reshape(b, b, n, c, h, w).transpose(2, 3, 4, 0, 5, 1).reshape(n, c, h * b, w * b)
    return full[:, :, pad_t : pad_t + height, pad : pad + width]


@register("SpaceToBatch")
def space_to_batch(op: Op) -> Kernel:
    """(N, C, H, W) -> (N*b*b, C, H'/b, W'/b): the zero-padded image cut into b x b interleaved blocks."""
    pad_t, pad, b = _space_batch_args(op)

    def kernel(x):
        _check_float(op, x)
        return _space_to_batch(op, x, pad_t, pad, b)

    return kernel


# The op whose output is the gradient of these ops' input (their inverse, or their own gradient op)
_INVERSE_OP = {
    "SpaceToBatch": "BatchToSpace",
    "BatchToSpace": "SpaceToBatch",
    "Col2Im": "Im2Col",
    "PadImage": "PadImageGradient",
    "ChannelShuffle": "ChannelShuffleGradient",
}


@facet("gradient", "SpaceToBatch")
def _inverse_gradient_maker(g: GradientContext) -> GradientOps:
    """dY -> dX by one op (the inverse op, or the op's own gradient op)."""
    return [gradient_op(_INVERSE_OP[g.op.type], [g.GO(0)], [g.GI(0)])]


@register("BatchToSpace", gradient=_inverse_gradient_maker)
def batch_to_space(op: Op) -> Kernel:
    """SpaceToBatch's inverse (the padding cropped off)."""
    pad_t, pad, b = _space_batch_args(op)

    def kernel(x):
        _check_float(op, x)
        return _batch_to_space(op, x, pad_t, pad, b)

    return kernel


# --------------------------------------------------------------------------------------------------
# PadImage (pad_op.cc)

_PAD_MODES = ("constant", "reflect", "edge")


def _pad_args(op: Op) -> tuple[tuple[int, int, int, int], str, float, bool]:
    """((pad_t, pad_l, pad_b, pad_r), mode, value, nhwc): ConvPoolOpBase's pads, stride and dilation 1."""
    geo = geometry(op)
    if geo.legacy_pad != 0:
        raise BadArgumentError(f"{op.where}: PadImage only supports explicit pad values (no legacy_pad)")
    if any(s != 1 for s in geo.strides) or any(d != 1 for d in geo.dilations):
        raise BadArgumentError(f"{op.where}: PadImage supports neither strides nor dilations")
    if len(geo.pads) != 4:
        raise BadArgumentError(f"{op.where}: PadImage pads 2-D images; got pads {list(geo.pads)}")
    mode = op.str("mode", "constant")
    if mode not in _PAD_MODES:
        raise BadArgumentError(f"{op.where}: unknown padding mode {mode!r} (constant, reflect or edge)")
    return tuple(geo.pads), mode, op.float("value", 0.0), geo.nhwc  # type: ignore[return-value]


def _pad_index(op: Op, size: int, head: int, tail: int, mode: str) -> np.ndarray:
    """For each padded position of one dim, the source index (-1: the constant value)."""
    index = np.arange(size + head + tail) - head
    if mode == "constant":
        return np.where((index >= 0) & (index < size), index, -1)
    if mode == "edge":
        index = np.clip(index, 0, size - 1)
    else:  # reflect over 0, then over size - 1, once (pad_op.cc)
        index = np.abs(index)
        index = np.minimum(index, 2 * size - index - 2)
    if size == 0 or index.min() < 0 or index.max() >= size:
        raise ShapeError(
            f"{op.where}: {mode} padding by {head}/{tail} needs more than the {size} pixels of the image "
            "(Caffe2 reads outside it)"
        )
    return index


def _pad_image(op: Op, x: Any, pads: tuple[int, ...], mode: str, value: float, nhwc: bool) -> Any:
    _check_rank(op, x, 4)
    if not all(x.shape[1:]):  # ConvPoolOpBase::SetOutputSize
        raise ShapeError(f"{op.where}: input '{op.inputs[0]}' of shape {list(x.shape)} has empty images")
    pad_t, pad_l, pad_b, pad_r = pads
    image = _nchw(x, nhwc)
    _, _, h, w = image.shape
    rows, cols = _pad_index(op, h, pad_t, pad_b, mode), _pad_index(op, w, pad_l, pad_r, mode)
    out = image[:, :, np.maximum(rows, 0)][:, :, :, np.maximum(cols, 0)]
    if mode == "constant":
        mask = (rows >= 0)[:, None] & (cols >= 0)[None, :]
        out = jnp.where(jnp.asarray(mask), out, jnp.asarray(value, x.dtype))
    return _back(out, nhwc)


@register("PadImage", gradient=_inverse_gradient_maker)
def pad_image(op: Op) -> Kernel:
    """4-D images padded by pad_t/pad_l/pad_b/pad_r (ConvPoolOpBase's pad arguments), mode constant
    (`value`), reflect or edge; order NCHW or NHWC."""
    pads, mode, value, nhwc = _pad_args(op)

    def kernel(x):
        _check_float(op, x)
        return _pad_image(op, x, pads, mode, value, nhwc)

    return kernel


@register("PadImageGradient")
def pad_image_gradient(op: Op) -> Kernel:
    """dY -> dX: each padded position's gradient added to the pixel it copies (the pad value gets none)."""
    pads, mode, value, nhwc = _pad_args(op)

    def kernel(grad):
        _check_float(op, grad)
        _check_rank(op, grad, 4)
        pad_t, pad_l, pad_b, pad_r = pads
        n, *dims = grad.shape
        h_axis, w_axis = (0, 1) if nhwc else (1, 2)
        dims[h_axis] -= pad_t + pad_b
        dims[w_axis] -= pad_l + pad_r
        if min(dims) < 0:
            raise ShapeError(f"{op.where}: dY {list(grad.shape)} is smaller than the pads {list(pads)}")
        return _vjp(lambda x: _pad_image(op, x, pads, mode, value, nhwc), (n, *dims), grad)

    return kernel


# --------------------------------------------------------------------------------------------------
# ChannelShuffle


def _shuffle(op: Op, x: Any, groups: int, nhwc: bool, inverse: bool) -> Any:
    """Channels c = g * K + k (G groups of K) to k * G + g; `inverse` undoes it."""
    _check_float(op, x)
    if x.ndim < 2:
        raise ShapeError(f"{op.where}: input '{op.inputs[0]}' needs a batch and a channel dim")
    axis = x.ndim - 1 if nhwc else 1
    channels = x.shape[axis]
    if channels % groups:
        raise ShapeError(f"{op.where}: {channels} channels are not a multiple of group = {groups}")
    split = (channels // groups, groups) if inverse else (groups, channels // groups)
    y = x.reshape(*x.shape[:axis], *split, *x.shape[axis + 1 :])
    return jnp.swapaxes(y, axis, axis + 1).reshape(x.shape)


def _shuffle_args(op: Op) -> tuple[int, bool]:
    groups = op.int("group", 1)
    if groups < 1:  # Caffe2 divides by it (group = 0 kills the process)
        raise BadArgumentError(f"{op.where}: argument 'group' = {groups} must be >= 1")
    return groups, _nhwc(op)


@register("ChannelShuffle", gradient=_inverse_gradient_maker)
def channel_shuffle(op: Op) -> Kernel:
    groups, nhwc = _shuffle_args(op)
    return lambda x: _shuffle(op, x, groups, nhwc, inverse=False)


@register("ChannelShuffleGradient")
def channel_shuffle_gradient(op: Op) -> Kernel:
    groups, nhwc = _shuffle_args(op)
    return lambda grad: _shuffle(op, grad, groups, nhwc, inverse=True)


# --------------------------------------------------------------------------------------------------
# Resizing: UpsampleBilinear (NCHW), ResizeNearest (NCHW/NHWC), ResizeNearest3D (NCHW)


def _scale_args(op: Op, names: tuple[str, ...]) -> list[float]:
    scales = [float(np.float32(op.float(name, 1.0))) for name in names]
    bad = [f"{name} = {s}" for name, s in zip(names, scales, strict=True) if s <= 0]
    if bad:
        raise BadArgumentError(f"{op.where}: scales must be > 0: {', '.join(bad)}")
    return scales


def _scales_input(op: Op, index: int, scales: Any, static: bool) -> Any:
    """[height_scale, width_scale] from a float input (1-D, 2 values)."""
    _check_float(op, scales, first=index)
    if scales.ndim != 1 or scales.shape[0] != 2:
        raise ShapeError(f"{op.where}: scales '{op.inputs[index]}' must be 1-D with 2 values, got {list(scales.shape)}")
    if not static:
        return scales
    if isinstance(scales, jax.core.Tracer):
        raise ShapeError(f"{op.where}: scales '{op.inputs[index]}' decide the output shape; feed them as a constant")
    return [float(v) for v in np.asarray(scales)]


def _scaled(size: int, scale: float) -> int:
    """`int output = input * scale` in C++ (float product, truncated)."""
    return int(np.float32(size) * np.float32(scale))


def _nearest(out_size: int, scale: Any, in_size: int) -> Any:
    """min((int)(y / scale), in_size - 1) for each output position y, in float32 (resize_op.cc)."""
    positions = jnp.arange(out_size, dtype=jnp.float32) / jnp.asarray(scale, jnp.float32)
    return jnp.minimum(positions.astype(jnp.int32), in_size - 1)


def _resize_nearest(x: Any, out: tuple[int, ...], scales: Any, axes: tuple[int, ...]) -> Any:
    for axis, size, scale in zip(axes, out, scales, strict=True):
        x = jnp.take(x, _nearest(size, scale, x.shape[axis]), axis=axis)
    return x


@register("ResizeNearest", inputs=(1, 2), static_inputs=(1,))
def resize_nearest(op: Op) -> Kernel:
    """(X[, scales]) -> X resized to int(H * height_scale) x int(W * width_scale), nearest pixel."""
    arg_scales = _scale_args(op, ("height_scale", "width_scale"))
    nhwc = _nhwc(op)

    def kernel(x, *scales_input):
        _check_float(op, x)
        _check_rank(op, x, 4)
        scales = _scales_input(op, 1, scales_input[0], True) if scales_input else arg_scales
        axes = (1, 2) if nhwc else (2, 3)
        out = tuple(_scaled(x.shape[a], s) for a, s in zip(axes, scales, strict=True))
        if min(out) > 0 and min(x.shape[a] for a in axes) == 0:
            raise ShapeError(f"{op.where}: an empty image {list(x.shape)} cannot be resized")
        return _resize_nearest(x, out, scales, axes)

    return kernel


@facet("gradient", "ResizeNearest")
def _resize_gradient_maker(g: GradientContext) -> GradientOps:
    """(dY, X[, scales])."""
    return [gradient_op(g.op.type + "Gradient", [g.GO(0), g.I(0), *g.op.input[1:2]], [g.GI(0)])]


@register("ResizeNearestGradient", inputs=(2, 3))
def resize_nearest_gradient(op: Op) -> Kernel:
    """(dY, X[, scales]) -> dX [dY's batch and channels, X's spatial dims]: each dY pixel added to the
    X pixel it came from (the scales, not the shapes, decide which)."""
    arg_scales = _scale_args(op, ("height_scale", "width_scale"))
    nhwc = _nhwc(op)

    def kernel(grad, x, *scales_input):
        _check_float(op, grad)
        _check_rank(op, grad, 4)
        _check_rank(op, x, 4, 1)
        scales = _scales_input(op, 2, scales_input[0], False) if scales_input else arg_scales
        axes = (1, 2) if nhwc else (2, 3)
        shape = list(grad.shape)
        for a in axes:
            shape[a] = x.shape[a]
        out = tuple(grad.shape[a] for a in axes)
        if min(out) > 0 and min(shape[a] for a in axes) == 0:
            raise ShapeError(f"{op.where}: X {list(x.shape)} has an empty image")
        return _vjp(lambda v: _resize_nearest(v, out, scales, axes), tuple(shape), grad)

    return kernel


_SCALES_3D = ("temporal_scale", "height_scale", "width_scale")


def _check_nchw(op: Op) -> None:
    if _nhwc(op):
        raise BadArgumentError(f"{op.where}: {op.type} is not implemented for order NHWC")


@register("ResizeNearest3D", gradient=_resize_gradient_maker)
def resize_nearest_3d(op: Op) -> Kernel:
    """(N, C, T, H, W) -> nearest resize; Caffe2 implements only height and width scale 2 with temporal
    scale 1 or 2 (resize_3d_op.cc)."""
    scales = _scale_args(op, _SCALES_3D)
    _check_nchw(op)
    if scales[1:] != [2.0, 2.0] or scales[0] not in (1.0, 2.0):
        raise BadArgumentError(
            f"{op.where}: ResizeNearest3D needs height_scale = width_scale = 2 and temporal_scale 1 or 2, got {scales}"
        )
    factors = (int(scales[0]), 2, 2)

    def kernel(x):
        _check_float(op, x)
        _check_rank(op, x, 5)
        out = tuple(_scaled(x.shape[a], s) for a, s in zip((2, 3, 4), scales, strict=True))
        y = x
        for axis, factor, size in zip((2, 3, 4), factors, out, strict=True):
            y = jnp.take(y, np.arange(size) // factor, axis=axis)
        return y

    return kernel


@register("ResizeNearest3DGradient", inputs=2)
def resize_nearest_3d_gradient(op: Op) -> Kernel:
    """(dY, X) -> dX, as ResizeNearestGradient over the frames, rows and columns (any scales)."""
    scales = _scale_args(op, _SCALES_3D)
    _check_nchw(op)

    def kernel(grad, x):
        _check_float(op, grad)
        _check_rank(op, grad, 5)
        _check_rank(op, x, 5, 1)
        shape = (*grad.shape[:2], *x.shape[2:])
        out = grad.shape[2:]
        if min(out) > 0 and min(x.shape[2:]) == 0:
            raise ShapeError(f"{op.where}: X {list(x.shape)} has an empty volume")
        return _vjp(lambda v: _resize_nearest(v, out, scales, (2, 3, 4)), shape, grad)

    return kernel


def _bilinear(x: Any, out_h: int, out_w: int) -> Any:
    """UpsampleBilinear's interpolation (upsample_op.cc, align-corners ratios) of NCHW `x`, in float32."""
    _, _, h, w = x.shape

    def axis_weights(size: int, out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ratio = np.float32(size - 1) / np.float32(out - 1) if out > 1 else np.float32(0)
        real = ratio * np.arange(out, dtype=np.float32)
        low = real.astype(np.int32)
        step = (low < size - 1).astype(np.int32)
        lam = (real - low.astype(np.float32)).astype(np.float32)
        return low, low + step, lam

    h0, h1, hl = axis_weights(h, out_h)
    w0, w1, wl = axis_weights(w, out_w)
    hl, wl = jnp.asarray(hl)[:, None], jnp.asarray(wl)[None, :]
    hl0, wl0 = 1.0 - hl, 1.0 - wl
    rows0, rows1 = x[:, :, h0], x[:, :, h1]
    top = wl0 * rows0[:, :, :, w0] + wl * rows0[:, :, :, w1]
    bottom = wl0 * rows1[:, :, :, w0] + wl * rows1[:, :, :, w1]
    return hl0 * top + hl * bottom


@register("UpsampleBilinear", inputs=(1, 2), static_inputs=(1,), gradient=_resize_gradient_maker)
def upsample_bilinear(op: Op) -> Kernel:
    """(X [N, C, H, W][, scales]) -> [N, C, int(H * height_scale), int(W * width_scale)], bilinear."""
    arg_scales = _scale_args(op, ("height_scale", "width_scale"))

    def kernel(x, *scales_input):
        _check_float(op, x)
        _check_rank(op, x, 4)
        scales = _scales_input(op, 1, scales_input[0], True) if scales_input else arg_scales
        out_h, out_w = (_scaled(x.shape[2], scales[0]), _scaled(x.shape[3], scales[1]))
        if out_h < 0 or out_w < 0:
            raise ShapeError(f"{op.where}: scales {scales} give a negative output size")
        if min(out_h, out_w) > 0 and min(x.shape[2:]) == 0:
            raise ShapeError(f"{op.where}: an empty image {list(x.shape)} cannot be resized")
        return _bilinear(x, out_h, out_w)

    return kernel


@register("UpsampleBilinearGradient", inputs=(2, 3))
def upsample_bilinear_gradient(op: Op) -> Kernel:
    """(dY, X[, scales]) -> dX [dY's batch and channels, X's spatial dims]: the vjp of the interpolation
    from X's size to dY's (the scales are not used)."""
    _scale_args(op, ("height_scale", "width_scale"))

    def kernel(grad, x, *scales_input):
        _check_float(op, grad)
        _check_rank(op, grad, 4)
        if x.ndim < 4:
            raise ShapeError(f"{op.where}: X '{op.inputs[1]}' must be 4-D, got {list(x.shape)}")
        if scales_input:
            _scales_input(op, 2, scales_input[0], False)
        shape = (*grad.shape[:2], *x.shape[2:4])
        if min(grad.shape[2:]) > 0 and min(shape[2:]) == 0:
            raise ShapeError(f"{op.where}: X {list(x.shape)} has an empty image")
        return _vjp(lambda v: _bilinear(v, grad.shape[2], grad.shape[3]), shape, grad)

    return kernel


# --------------------------------------------------------------------------------------------------
# LRN (local_response_normalization_op.cc)


def _lrn_args(op: Op) -> tuple[int, float, float, float, bool]:
    size = op.int("size", 0)
    alpha, beta, bias = op.float("alpha", 0.0), op.float("beta", 0.0), op.float("bias", 1.0)
    if size <= 0 or size % 2 == 0:
        raise BadArgumentError(f"{op.where}: argument 'size' = {size} must be odd and positive")
    return size, alpha, beta, bias, _nhwc(op)


def _window_sum(values: Any, size: int, axis: int) -> Any:
    """Sum over the `size` channels centred on each channel (zero beyond the edges)."""
    half = (size - 1) // 2
    pads = [(0, 0)] * values.ndim
    pads[axis] = (half, size - 1 - half)
    padded = jnp.pad(values, pads)
    channels = values.shape[axis]
    return sum(lax.slice_in_dim(padded, i, i + channels, axis=axis) for i in range(size))


def _lrn_scale(x: Any, size: int, alpha: float, bias: float, axis: int) -> Any:
    return np.float32(bias) + _window_sum(x * x * (np.float32(alpha) / np.float32(size)), size, axis)


@register("LRN", outputs=(1, 2), gradient=single_gradient("LRNGradient", "I(0) O(0) GO(0)"))
def lrn(op: Op) -> Kernel:
    """X -> (Y = X * scale^-beta, scale = bias + alpha/size * sum of X^2 over `size` channels); 4-D."""
    size, alpha, beta, bias, nhwc = _lrn_args(op)

    def kernel(x):
        _check_float(op, x)
        _check_rank(op, x, 4)
        scale = _lrn_scale(x, size, alpha, bias, 3 if nhwc else 1)
        return x * scale ** np.float32(-beta), scale

    return kernel


@register("LRNGradient", inputs=3)
def lrn_gradient(op: Op) -> Kernel:
    """(X, Y, dY) -> dX = dY * scale^-beta - 2 alpha beta / size * X * window_sum(dY * Y / scale), with the
    given Y (Caffe2 recomputes only the scale)."""
    size, alpha, beta, bias, nhwc = _lrn_args(op)

    def kernel(x, y, grad):
        _check_float(op, x, y, grad)
        _check_rank(op, x, 4)
        if y.shape != x.shape or grad.shape != x.shape:
            raise ShapeError(f"{op.where}: X {list(x.shape)}, Y {list(y.shape)} and dY {list(grad.shape)} differ")
        axis = 3 if nhwc else 1
        scale = _lrn_scale(x, size, alpha, bias, axis)
        ratio = _window_sum(grad * y / scale, size, axis)
        return grad * scale ** np.float32(-beta) - np.float32(2.0 * alpha * beta / size) * x * ratio

    return kernel


# --------------------------------------------------------------------------------------------------
# Im2Col / Col2Im (im2col_op.h)


def _im2col_args(op: Op) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], int, bool]:
    """(kernel, dilation, stride) as (h, w) pairs, pad (every side), nhwc."""

    def pair(name: str, default: int) -> tuple[int, int]:
        base = op.int(name, default)
        return op.int(f"{name}_h", base), op.int(f"{name}_w", base)

    kernel, dilation, stride = pair("kernel", 0), pair("dilation", 1), pair("stride", 1)
    pad = op.int("pad", 0)
    if min(kernel) <= 0 or min(dilation) <= 0 or min(stride) <= 0 or pad < 0:
        raise BadArgumentError(
            f"{op.where}: kernel {kernel}, dilation {dilation} and stride {stride} must be > 0 and pad {pad} >= 0"
        )
    return kernel, dilation, stride, pad, _nhwc(op)


def _im2col(op: Op, x: Any, args: tuple) -> Any:
    (kh, kw), (dh, dw), (sh, sw), pad, nhwc = args
    image = _nchw(x, nhwc)
    n, c, h, w = image.shape
    ekh, ekw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    if h < ekh or w < ekw:
        raise ShapeError(f"{op.where}: the image {h}x{w} is smaller than the dilated kernel {ekh}x{ekw}")
    oh, ow = (h + 2 * pad - ekh) // sh + 1, (w + 2 * pad - ekw) // sw + 1
    padded = jnp.pad(image, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    patches = [
        padded[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]
    stacked = jnp.stack(patches, axis=2)  # N, C, kh*kw, oh, ow
    if nhwc:  # N, oh, ow, (kh*kw, C)
        return stacked.transpose(0, 3, 4, 2, 1).reshape(n, oh, ow, kh * kw * c)
    return stacked.reshape(n, c * kh * kw, oh, ow)


@register("Im2Col", gradient=single_gradient("Col2Im", "GO(0) I(0)"))
def im2col(op: Op) -> Kernel:
    """4-D image -> its patches: NCHW [N, C*kh*kw, oh, ow] (channel-major), NHWC [N, oh, ow, kh*kw*C]."""
    args = _im2col_args(op)

    def kernel(x):
        _check_float(op, x)
        _check_rank(op, x, 4)
        return _im2col(op, x, args)

    return kernel


@register("Col2Im", inputs=2, gradient=_inverse_gradient_maker)
def col2im(op: Op) -> Kernel:
    """(cols, Z) -> an image of Z's shape with each patch element added back at its pixel."""
    args = _im2col_args(op)

    def kernel(cols, like):
        _check_float(op, cols)
        _check_rank(op, like, 4, 1)
        shape = tuple(like.shape)
        patches_shape = jax.eval_shape(lambda v: _im2col(op, v, args), jax.ShapeDtypeStruct(shape, cols.dtype)).shape
        if cols.size != np.prod(patches_shape):
            raise ShapeError(
                f"{op.where}: cols {list(cols.shape)} do not hold the patches {list(patches_shape)} of an "
                f"image {list(shape)}"
            )
        return _vjp(lambda v: _im2col(op, v, args), shape, cols.reshape(patches_shape))

    return kernel


# --------------------------------------------------------------------------------------------------
# BatchPermutation, IntegralImage


def _check_permutation(op: Op, index: int, indices: Any, n: int) -> None:
    """Caffe2 checks the rank and the length first, and reads the indices as int32 only for a nonempty batch
    (an empty one takes indices of any type)."""
    if indices.ndim != 1 or indices.shape[0] != n:
        raise ShapeError(f"{op.where}: indices {list(indices.shape)} must be 1-D with one entry per row ({n})")
    if not indices.size:
        return
    if np.dtype(indices.dtype) != np.dtype(np.int32):
        raise ShapeError(f"{op.where}: indices '{op.inputs[index]}' must be int32, got {indices.dtype}")
    message = f"{literal(op.where)}: index {{bad}} is out of the range [0, {n}) of the batch"
    bad = (indices < 0) | (indices >= n)
    if isinstance(indices, jax.core.Tracer):
        runtime_check(~jnp.any(bad), message, bad=first_bad(indices, bad))
    elif np.any(np.asarray(bad)):
        raise ShapeError(message.format(bad=int(np.asarray(indices)[np.asarray(bad)][0])))


runtime_checked("BatchPermutation", "BatchPermutationGradient")


@register("BatchPermutation", inputs=2, gradient=single_gradient("BatchPermutationGradient", "I(1) GO(0)"))
def batch_permutation(op: Op) -> Kernel:
    """(X [N, ...], indices int32 [N]) -> Y[i] = X[indices[i]]."""

    def kernel(x, indices):
        _check_float(op, x)
        if x.ndim < 1:
            raise ShapeError(f"{op.where}: X '{op.inputs[0]}' must have rank >= 1")
        _check_permutation(op, 1, indices, x.shape[0])
        return x[jnp.clip(indices, 0, max(x.shape[0] - 1, 0))] if x.shape[0] else x

    return kernel


@register("BatchPermutationGradient", inputs=2)
def batch_permutation_gradient(op: Op) -> Kernel:
    """(indices, dY) -> dX[indices[i]] = dY[i] (indices is a permutation)."""

    def kernel(indices, grad):
        _check_float(op, grad, first=1)
        if grad.ndim < 1:
            raise ShapeError(f"{op.where}: dY '{op.inputs[1]}' must have rank >= 1")
        _check_permutation(op, 0, indices, grad.shape[0])
        if not grad.shape[0]:
            return grad
        return jnp.zeros_like(grad).at[jnp.clip(indices, 0, grad.shape[0] - 1)].add(grad)

    return kernel


@register("IntegralImage", gradient=single_gradient("IntegralImageGradient", "I(0) GO(0)"))
def integral_image(op: Op) -> Kernel:
    """(N, C, H, W) -> (N, C, H+1, W+1): Y[h, w] = sum of X[:h, :w]."""

    def kernel(x):
        _check_float(op, x)
        _check_rank(op, x, 4)
        sums = jnp.cumsum(jnp.cumsum(x, axis=3), axis=2)
        return jnp.pad(sums, [(0, 0), (0, 0), (1, 0), (1, 0)])

    return kernel


@register("IntegralImageGradient", inputs=2)
def integral_image_gradient(op: Op) -> Kernel:
    """(X, dY) -> dX[h, w] = sum of dY[:h+1, :w+1]: what Caffe2's kernel computes (integral_image_op.cc), a
    forward prefix sum of dY rather than the true gradient (a suffix sum of dY[h+1:, w+1:])."""

    def kernel(x, grad):
        _check_float(op, x, grad)
        _check_rank(op, x, 4)
        n, c, h, w = x.shape
        if grad.shape != (n, c, h + 1, w + 1):
            raise ShapeError(f"{op.where}: dY {list(grad.shape)} must be [N, C, H+1, W+1] for X {list(x.shape)}")
        return jnp.cumsum(jnp.cumsum(grad[:, :, :h, :w], axis=3), axis=2)

    return kernel
