"""Pooling: MaxPool, AveragePool (1-D to 3-D, NCHW and NHWC, global pooling, count_include_pad), their
fixed-name aliases (MaxPool1D/2D/3D, AveragePool1D/2D/3D), LpPool (2-D), and their gradient ops.

The window geometry is Caffe2's ConvPoolOpBase (conv.py). Windows are clipped to the image: padding
takes no part in a max, adds nothing to a sum, and counts in an average only with count_include_pad
(which divides by the whole kernel size). The gradients follow Caffe2's CPU kernels
(caffe2/operators/pool_gradient_op.cc, lp_pool_op.cc): MaxPool's sends dY to EVERY element of a window
equal to its maximum, not to one of them as a vjp of the max would.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import ShapeError
from ..ir.netdef import Op
from .conv import Geometry, Window, check_float, check_image, geometry, resolve, spatial_axes
from .facets import GRADIENT_OP, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import GradientContext, GradientOps, gradient_op
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_MAX = ("MaxPool", "MaxPool1D", "MaxPool2D", "MaxPool3D")
_AVERAGE = ("AveragePool", "AveragePool1D", "AveragePool2D", "AveragePool3D")


def _window(op: Op, geo: Geometry, x: jax.Array, lp: bool = False) -> Window:
    """PoolOp's checks of X; the window of its spatial dims. Caffe2's CPU kernels pool 1 to 3 spatial
    dims (LpPool: exactly 2)."""
    check_float(op, x)
    check_image(op, x)
    nd = x.ndim - 2
    if (lp and nd != 2) or not 1 <= nd <= 3:
        supported = "2" if lp else "1 to 3"
        raise ShapeError(f"{op.where}: {op.type} pools {supported} spatial dims, input has shape {list(x.shape)}")
    return resolve(op, geo, [x.shape[a] for a in spatial_axes(x.ndim, geo.nhwc)])


def _padding(x: jax.Array, window: Window, nhwc: bool, value) -> jax.Array:
    """X padded (or cropped) on its spatial dims so that the windows tile it exactly."""
    config = [(0, 0, 0)] * x.ndim
    for axis, low, high in zip(spatial_axes(x.ndim, nhwc), window.low, window.high, strict=True):
        config[axis] = (low, high, 0)
    return lax.pad(x, np.asarray(value, x.dtype), config)


def _full(x: jax.Array, values, nhwc: bool) -> tuple[int, ...]:
    """`values` for the spatial dims, 1 for batch and channels (reduce_window's window and strides)."""
    full = [1] * x.ndim
    for axis, value in zip(spatial_axes(x.ndim, nhwc), values, strict=True):
        full[axis] = value
    return tuple(full)


def _reduce(x: jax.Array, window: Window, nhwc: bool, init, computation) -> jax.Array:
    padded = _padding(x, window, nhwc, init)
    dims, strides = _full(x, window.kernel, nhwc), _full(x, window.strides, nhwc)
    return lax.reduce_window(padded, np.asarray(init, x.dtype), computation, dims, strides, "VALID")


def _windows(x: jax.Array, window: Window, nhwc: bool) -> jax.Array:
    """Every window's elements, one kernel offset per row: shape (kernel size, *Y's shape). Padding
    reads as 0 (callers throw its share away: the transpose of the padding drops it)."""
    padded = _padding(x, window, nhwc, 0)
    axes = spatial_axes(x.ndim, nhwc)
    rows = []
    for offset in itertools.product(*(range(k) for k in window.kernel)):
        start, limit, step = [0] * x.ndim, list(padded.shape), [1] * x.ndim
        for axis, k, out, stride in zip(axes, offset, window.out, window.strides, strict=True):
            start[axis], limit[axis], step[axis] = k, k + (out - 1) * stride + 1, stride
            if out == 0:  # no window (legacy VALID on a dim shorter than the kernel)
                start[axis] = limit[axis] = 0
        rows.append(lax.slice(padded, start, limit, step))
    return jnp.stack(rows)


def _scatter(x: jax.Array, window: Window, nhwc: bool, rows: jax.Array) -> jax.Array:
    """The transpose of `_windows`: each row's values added back onto the elements they were read from."""
    _, vjp = jax.vjp(lambda x_: _windows(x_, window, nhwc), x)
    (dx,) = vjp(rows)
    return dx


def _counts(x: jax.Array, window: Window, nhwc: bool, include_pad: bool) -> np.ndarray:
    """How many elements each average divides by, shaped to broadcast against Y: the window clipped
    to the image, or the whole kernel with count_include_pad."""
    if include_pad:
        return np.asarray(math.prod(window.kernel))
    counts = np.ones((), np.int64)
    for i, axis in enumerate(spatial_axes(x.ndim, nhwc)):
        start = np.arange(window.out[i]) * window.strides[i] - window.low[i]
        clipped = np.minimum(start + window.kernel[i], x.shape[axis]) - np.maximum(start, 0)
        counts = np.multiply.outer(counts, clipped)
    shape = list(counts.shape)
    shape.insert(len(shape) if nhwc else 0, 1)  # the channel dim
    return counts.reshape(shape)


def _average(x: jax.Array, window: Window, nhwc: bool, include_pad: bool) -> jax.Array:
    total = _reduce(x, window, nhwc, 0, lax.add)
    return total / _counts(x, window, nhwc, include_pad).astype(x.dtype)


def _lp(x: jax.Array, window: Window, nhwc: bool, p: float) -> jax.Array:
    total = _reduce(jnp.power(jnp.abs(x), jnp.asarray(p, x.dtype)), window, nhwc, 0, lax.add)
    return jnp.power(total, jnp.asarray(1.0 / p, x.dtype))


@register(*_MAX)
def max_pool(op: Op) -> Kernel:
    """The maximum of each window (padding takes no part)."""
    geo = geometry(op, pooling=True)

    def kernel(x):
        window = _window(op, geo, x)
        # Caffe2 starts each max at the lowest finite float: a window wholly in legacy padding gives it
        return _reduce(x, window, geo.nhwc, np.finfo(x.dtype).min, lax.max)

    return kernel


@facet("gradient", "MaxPool", "MaxPool1D", "MaxPool2D", "MaxPool3D")
def _pool_gradient_maker(g: GradientContext) -> GradientOps:
    """GetPoolGradient (pool_gradient_op.cc, lp_pool_op.cc): (X, Y, dY) -> dX."""
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])]


@register(*_AVERAGE)
def average_pool(op: Op) -> Kernel:
    """The mean of each window's elements inside the image, or their sum over the kernel size with
    count_include_pad."""
    geo = geometry(op, pooling=True)
    include_pad = op.bool("count_include_pad", False)

    def kernel(x):
        return _average(x, _window(op, geo, x), geo.nhwc, include_pad)

    return kernel


facet("gradient", "AveragePool", "AveragePool1D", "AveragePool2D", "AveragePool3D")(_pool_gradient_maker)


@register("LpPool", gradient=_pool_gradient_maker)
def lp_pool(op: Op) -> Kernel:
    """(sum of |x|^p over each window) ^ (1/p), `p` defaulting to 2 (caffe2/operators/lp_pool_op.cc)."""
    geo = geometry(op, pooling=True)
    p = op.float("p", 2.0)

    def kernel(x):
        return _lp(x, _window(op, geo, x, lp=True), geo.nhwc, p)

    return kernel


# --------------------------------------------------------------------------------------------------
# Gradients: (X, Y, dY) -> dX


def _gradient_inputs(op: Op, geo: Geometry, x, y, dy, lp: bool = False) -> Window:
    check_float(op, x, y, dy)
    window = _window(op, geo, x, lp)
    axes = spatial_axes(x.ndim, geo.nhwc)
    shape = list(x.shape)
    for axis, out in zip(axes, window.out, strict=True):
        shape[axis] = out
    for index, value in ((1, y), (2, dy)):
        if list(value.shape) != shape:
            raise ShapeError(
                f"{op.where}: '{op.inputs[index]}' has shape {list(value.shape)}, the pooled output of "
                f"'{op.inputs[0]}' {list(x.shape)} has {shape}"
            )
    return window


@register(*(f"{name}Gradient" for name in _MAX), inputs=3)
def max_pool_gradient(op: Op) -> Kernel:
    """dX: each window's dY goes to every element of the window equal to its maximum Y (ties all get it)."""
    geo = geometry(op, pooling=True)

    def kernel(x, y, dy):
        window = _gradient_inputs(op, geo, x, y, dy)
        if geo.global_pooling:
            return jnp.where(x == y, dy, jnp.zeros((), dy.dtype))  # Y and dY broadcast over the image
        rows = _windows(x, window, geo.nhwc)
        return _scatter(x, window, geo.nhwc, jnp.where(rows == y[None], dy[None], jnp.zeros((), dy.dtype)))

    return kernel


@register(*(f"{name}Gradient" for name in _AVERAGE), inputs=3)
def average_pool_gradient(op: Op) -> Kernel:
    """dX: each window's dY divided by its count, spread over the window's elements in the image."""
    geo = geometry(op, pooling=True)
    include_pad = op.bool("count_include_pad", False)

    def kernel(x, y, dy):
        window = _gradient_inputs(op, geo, x, y, dy)
        _, vjp = jax.vjp(lambda x_: _average(x_, window, geo.nhwc, include_pad), x)
        (dx,) = vjp(dy)
        return dx

    return kernel


@register("LpPoolGradient", inputs=3)
def lp_pool_gradient(op: Op) -> Kernel:
    """dX: each window adds dY * x * |x|^(p-2) / y^(p-1) to its elements (NaN where a window is all 0,
    as in Caffe2)."""
    geo = geometry(op, pooling=True)
    p = op.float("p", 2.0)

    def kernel(x, y, dy):
        window = _gradient_inputs(op, geo, x, y, dy, lp=True)
        rows = _windows(x, window, geo.nhwc)
        power = jnp.asarray(p, x.dtype)
        share = dy[None] * rows * jnp.power(jnp.abs(rows), power - 2) / jnp.power(y[None], power - 1)
        return _scatter(x, window, geo.nhwc, share)

    return kernel
