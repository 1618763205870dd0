"""Tensor-train layers (caffe2/operators/tt_linear_op.h): TT, a fully connected layer whose weight matrix is
a train of small cores, and TTLinearGradient, which Caffe2 registers but never implemented.

TT multiplies the input by the cores from the last to the first, each product's columns regrouped as
Caffe2's column-major Eigen maps regroup them; the emulation below does the same reshapes in row-major
terms. Where the values do not fill whole rows, Caffe2's resizes keep the first values and drop the rest
(it checks only the final width), and so does the emulation.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .common import matmul_precision
from .facets import GRADIENT_OP, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import gradient_not_implemented_yet
from .registry import Kernel, declare_family, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)


def _shape_text(x: Any) -> str:
    return f"{np.dtype(x.dtype)}{list(np.shape(x))}"


@register("TT", inputs=3, gradient=gradient_not_implemented_yet)
def tt(op: Op) -> Kernel:
    """(X [batch, ...], b [prod(out_sizes)], cores (1-D, the cores one after another)) -> Y [batch,
    prod(out_sizes)] = X W + b, W the tensor train of cores i of shape [inp_sizes[i] * tt_ranks[i + 1],
    tt_ranks[i] * out_sizes[i]], taken from the last."""
    inp, out, ranks = (list(op.ints(name, ())) for name in ("inp_sizes", "out_sizes", "tt_ranks"))
    if len(inp) != len(out):
        raise BadArgumentError(f"{op.where}: inp_sizes has size: {len(inp)}, out_sizes has size: {len(out)}")
    if len(ranks) != len(inp) + 1:  # Caffe2 reads tt_ranks[d] past a shorter list
        raise BadArgumentError(f"{op.where}: tt_ranks must hold {len(inp) + 1} ranks, got {len(ranks)}")
    if any(v < 1 for v in inp + out + ranks):
        raise BadArgumentError(f"{op.where}: inp_sizes, out_sizes and tt_ranks must be positive")

    def kernel(x, b, cores):
        for i, value in enumerate((x, b, cores)):
            if np.dtype(value.dtype) != _F32:
                raise ShapeError(f"{op.where}: input '{op.inputs[i]}' must be float32, got {_shape_text(value)}")
        if x.ndim <= 1:
            raise ShapeError(f"{op.where}: Number of dimensions in X: {x.ndim}")
        if b.ndim != 1:
            raise ShapeError(f"{op.where}: Number of dimensions in b: {b.ndim}")
        if cores.ndim != 1:
            raise ShapeError(f"{op.where}: Number of dimensions in cores: {cores.ndim}")
        batch = x.shape[0]
        y = jnp.reshape(x, (-1,))
        offset = 0
        for i in reversed(range(len(inp))):
            rows, cols = inp[i] * ranks[i + 1], ranks[i] * out[i]
            y = y[: y.size // rows * rows]  # Caffe2 resizes to whole rows, keeping the buffer's first values
            if offset + rows * cols > cores.size:
                raise ShapeError(
                    f"{op.where}: cores '{op.inputs[2]}' has {cores.size} values, core {i} reads up to "
                    f"{offset + rows * cols}"
                )
            core = jnp.reshape(cores[offset : offset + rows * cols], (rows, cols))
            product = jnp.matmul(jnp.reshape(y, (-1, rows)), core, precision=matmul_precision())
            y = jnp.reshape(jnp.reshape(product, (-1, out[i])).T, (-1,))
            offset += rows * cols
        if batch == 0:
            raise ShapeError(f"{op.where}: X '{op.inputs[0]}' has no rows")
        width = y.size // batch
        y = y[: batch * width]  # likewise
        if width != math.prod(out):
            raise ShapeError(f"{op.where}: Output dimension of Y: {width}, product of out_sizes: {math.prod(out)}")
        if b.shape[0] < width:  # Caffe2 reads past the end of b
            raise ShapeError(f"{op.where}: b '{op.inputs[1]}' has {b.shape[0]} values for {width} outputs")
        return jnp.reshape(jnp.reshape(y, (batch, width)).T, (batch, width)) + b[:width]

    return kernel


@register("TTLinearGradient", inputs=(0, None), outputs=(0, None))
def tt_linear_gradient(op: Op) -> Kernel:
    """Caffe2's TTLinearGradientOp returns false whatever its inputs (a TODO): every run fails."""
    raise BadArgumentError(f"{op.where}: TTLinearGradient is not implemented in Caffe2 (its run always fails)")
