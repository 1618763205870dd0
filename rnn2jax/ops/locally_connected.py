"""Locally connected layers (caffe2/operators/locally_connected_op.cc, _impl.h): a convolution whose filter
differs at every output position, and their gradients.

X [N, C, *in] (NCHW) or [N, H, W, C] (NHWC, 2-D only), filter [*out, M, C/group, *kernel] (NHWC:
[*out, M, kh, kw, C]), bias [*out, M]. The window geometry is ConvPoolOpBase's, as for Conv (conv.py);
the patches come from `lax.conv_general_dilated_patches` and every output position contracts its own
filter slice with them.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .common import matmul_precision
from .conv import Window, check_float, check_image, geometry, resolve, spatial_axes
from .facets import GRADIENT_OP, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import GradientContext, GradientError, GradientOps, argument, gradient_op
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_TYPES = ("LC", "LC1D", "LC2D", "LC3D")


def _patches(x: jax.Array, window: Window) -> jax.Array:
    """[N, C * prod(kernel), *out] (C slowest) of NCHW `x`; a negative tail pad crops the input first."""
    crop = [(0, 0, 0)] * 2 + [(0, min(high, 0), 0) for high in window.high]
    x = lax.pad(x, jnp.zeros((), x.dtype), crop)
    return lax.conv_general_dilated_patches(
        x,
        window.kernel,
        window.strides,
        [(low, max(high, 0)) for low, high in zip(window.low, window.high, strict=True)],
        rhs_dilation=window.dilations,
        precision=lax.Precision.HIGHEST,
    )


def _layout(op: Op, x: jax.Array, w: jax.Array, nhwc: bool, groups: int) -> tuple[Window, int]:
    """LocallyConnectedOp's checks of X and the filter: the window, and the output channels M."""
    check_image(op, x)
    nd = x.ndim - 2
    if nhwc and nd != 2:
        raise ShapeError(f"{op.where}: Only 2d locally connected op is supported for NHWC storage type.")
    if w.ndim != x.ndim + nd:
        raise ShapeError(
            f"{op.where}: filter '{op.inputs[1]}' {list(w.shape)} must have rank {x.ndim + nd} for input "
            f"'{op.inputs[0]}' {list(x.shape)}"
        )
    channels = x.shape[-1] if nhwc else x.shape[1]
    m = w.shape[nd]
    per_group = w.shape[-1] if nhwc else w.shape[nd + 1]
    if channels != per_group * (1 if nhwc else groups):
        raise ShapeError(
            f"{op.where}: input channels does not match: # of input channels {channels} is not equal to kernel "
            f"channels * group: {per_group}*{groups}"
        )
    if not nhwc and m % groups:
        raise ShapeError(f"{op.where}: The number of output channels is not divisible by group.")
    window = resolve(op, geometry(op), [x.shape[a] for a in spatial_axes(x.ndim, nhwc)])
    if tuple(w.shape[:nd]) != window.out:
        raise ShapeError(
            f"{op.where}: filter '{op.inputs[1]}' {list(w.shape)} must start with the output size {list(window.out)}"
        )
    kernel = tuple(w.shape[nd + 1 : nd + 3]) if nhwc else tuple(w.shape[nd + 2 :])
    if kernel != window.kernel:
        raise ShapeError(
            f"{op.where}: filter '{op.inputs[1]}' {list(w.shape)} does not match the kernel {list(window.kernel)}"
        )
    return window, m


def _forward(x: jax.Array, w: jax.Array, window: Window, m: int, nhwc: bool, groups: int) -> jax.Array:
    """Y without the bias: [N, M, *out] (NCHW) or [N, oh, ow, M] (NHWC)."""
    nd = x.ndim - 2
    if nhwc:
        x = jnp.moveaxis(x, -1, 1)
        w = jnp.moveaxis(w, -1, nd + 1)  # [*out, M, C, kh, kw]
        groups = 1
    n, out = x.shape[0], window.out
    patches = _patches(x, window).reshape(n, groups, -1, math.prod(out))  # [N, G, C/G * K, P]
    filters = w.reshape(math.prod(out), groups, m // groups, -1)  # [P, G, M/G, C/G * K]
    y = jnp.einsum("pgmj,ngjp->ngmp", filters, patches, precision=matmul_precision())
    y = y.reshape(n, m, *out)
    return jnp.moveaxis(y, 1, -1) if nhwc else y


def _bias_layout(op: Op, b: jax.Array, window: Window, m: int) -> None:
    if tuple(b.shape) != (*window.out, m):
        raise ShapeError(f"{op.where}: bias '{op.inputs[2]}' {list(b.shape)} must be {[*window.out, m]}")


def _add_bias(y: jax.Array, b: jax.Array, nhwc: bool) -> jax.Array:
    return y + (b[None] if nhwc else jnp.moveaxis(b, -1, 0)[None])


def _args(op: Op) -> tuple[bool, int]:
    nhwc = geometry(op).nhwc
    groups = op.int("group", 1)
    if groups < 1:
        raise BadArgumentError(f"{op.where}: argument 'group' = {groups} must be positive")
    if groups > 1 and not nhwc:  # NHWC ignores the argument
        raise BadArgumentError(
            f"{op.where}: group = {groups}: Caffe2's locally connected op aborts for more than one group "
            "(its batched GEMM reads past its buffers), so rnn2jax has no answer to match"
        )
    return nhwc, groups


@register(*_TYPES, inputs=(2, 3))
def locally_connected(op: Op) -> Kernel:
    """Y[n, m, p] = sum over the window at p of filter[p, m] * X (+ bias[p, m]). The 1D/2D/3D names are
    plain aliases, as for Conv."""
    nhwc, groups = _args(op)

    def kernel(x, w, b=None):
        check_float(op, x, w, *(() if b is None else (b,)))
        window, m = _layout(op, x, w, nhwc, groups)
        y = _forward(x, w, window, m, nhwc, groups)
        if b is None:
            return y
        _bias_layout(op, b, window, m)
        return _add_bias(y, b, nhwc)

    return kernel


@facet("gradient", *_TYPES)
def _gradient_maker(g: GradientContext) -> GradientOps:
    """GetLocallyConnectedGradient: (X, filter, dY) -> dfilter, dbias, dX; without a bias input the op gets
    no_bias=1, and no_gradient_to_input=1 leaves dX out."""
    if len(g.op.input) not in (2, 3):
        raise GradientError(f"{g.op.type} takes 2 or 3 inputs, got {len(g.op.input)}")
    with_dx = not g.flag("no_gradient_to_input", False)
    inputs = [g.I(0), g.I(1), g.GO(0)]
    if len(g.op.input) == 3:
        outputs = [g.GI(1), g.GI(2)] + ([g.GI(0)] if with_dx else [])
        return [gradient_op(g.op.type + "Gradient", inputs, outputs)]
    outputs = [g.GI(1)] + ([g.GI(0)] if with_dx else [])
    return [gradient_op(g.op.type + "Gradient", inputs, outputs, [argument("no_bias", 1)])]


@register(*(t + "Gradient" for t in _TYPES), inputs=3, outputs=(1, 3))
def locally_connected_gradient(op: Op) -> Kernel:
    """(X, filter, dY) -> dfilter, dbias (unless no_bias), dX (when asked for): the vjp of the forward."""
    nhwc, groups = _args(op)
    no_bias = op.bool("no_bias", False)
    count = len(op.outputs)
    if not no_bias and count < 2:
        raise BadArgumentError(f"{op.where}: without no_bias, {op.type} needs outputs dfilter and dbias")
    with_dx = count == 3 or (no_bias and count == 2)
    if no_bias and count == 3:
        raise BadArgumentError(f"{op.where}: with no_bias, {op.type} has at most 2 outputs (dfilter, dX)")

    def kernel(x, w, dy):
        check_float(op, x, w, dy)
        window, m = _layout(op, x, w, nhwc, groups)
        y, vjp = jax.vjp(lambda x_, w_: _forward(x_, w_, window, m, nhwc, groups), x, w)
        if tuple(dy.shape) != tuple(y.shape):
            raise ShapeError(f"{op.where}: dY '{op.inputs[2]}' {list(dy.shape)} must be {list(y.shape)}")
        dx, dw = vjp(dy)
        outputs: list[Any] = [dw]
        if not no_bias:
            per_position = jnp.sum(dy, axis=0)
            outputs.append(per_position if nhwc else jnp.moveaxis(per_position, 0, -1))
        if with_dx:
            outputs.append(dx)
        return tuple(outputs)

    return kernel
