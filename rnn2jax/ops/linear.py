"""Linear algebra: FC (the RNN input/recurrent projections), MatMul, BatchMatMul (attention) and
ElementwiseLinear, each with Caffe2's own rules for flattening inputs to matrices."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError
from ..ir.netdef import Op
from .common import broadcast_shapes, canonical_axis, is_symbolic, matmul_precision, size_from_dim, size_to_dim
from .registry import NO_ROLES, Absent, Kernel, declare_family, register

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=Absent("no shape rule: shape inference does not guess this op's inputs"),
    gradient=Absent("no builder gradient maker"),
    emitter=Absent("codegen does not write this op"),
)


def _check_float_inputs(op: Op, arrays: Sequence[jax.Array]) -> None:
    """Float inputs of one dtype. (Caffe2's CPU build registers these ops for float32 only; doubles are
    accepted here on purpose, for rnn2jax's float64 verification mode, rnn2jax/checking/verification.py.)"""
    for name, a in zip(op.inputs, arrays, strict=False):
        if getattr(a, "dtype", None) is None:
            raise ShapeError(f"{op.where}: input '{name}' is a {type(a).__name__}, not a tensor")
    dtypes = [np.dtype(a.dtype) for a in arrays]
    for name, dtype in zip(op.inputs, dtypes, strict=False):
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ShapeError(f"{op.where}: input '{name}' has dtype {dtype}; {op.type} needs a float tensor")
    if len(set(dtypes)) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in zip(op.inputs, dtypes, strict=False))
        raise ShapeError(f"{op.where}: {op.type} inputs must share one dtype, got {listed}")


def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b, precision=matmul_precision())


# --------------------------------------------------------------------------------------------------
# FC


def _fc_dims(
    op: Op, x: jax.Array, w: jax.Array, axis: int, axis_w: int, weight_n_by_k: bool
) -> tuple[int, int, int, int, int, int]:
    """(x_axis, M, K, N, rows, cols): X is `M x K` at `axis`, W `rows x cols` at `axis_w`, which
    is `N x K` (FC) or `K x N` (FCTransposed). FC and its gradient check shapes alike."""
    x_axis = canonical_axis(op, axis, x.ndim, "axis")
    w_axis = canonical_axis(op, axis_w, w.ndim, "axis_w")
    m, k = size_to_dim(x.shape, x_axis), size_from_dim(x.shape, x_axis)
    rows, cols = size_to_dim(w.shape, w_axis), size_from_dim(w.shape, w_axis)
    n, w_k = (rows, cols) if weight_n_by_k else (cols, rows)
    layout = "N x K" if weight_n_by_k else "K x N"
    if w_k != k:
        raise ShapeError(
            f"{op.where}: weight '{op.inputs[1]}' {list(w.shape)} is {rows} x {cols} at axis_w={axis_w} "
            f"({layout}), but input '{op.inputs[0]}' {list(x.shape)} has K = {k} at axis={axis}"
        )
    return x_axis, m, k, n, rows, cols


def _fc(op: Op, weight_n_by_k: bool) -> Kernel:
    """X is flattened to `M x K` at `axis`, W to `N x K` (FC) or `K x N` (FCTransposed) at `axis_w`;
    Y keeps X's dims before `axis` and gets N as its last dim."""
    axis = op.int("axis", 1)
    axis_w = op.int("axis_w", 1)
    op.bool("float16_compute", False)  # only changes the GEMM's compute type on GPU

    def kernel(x, w, b):
        _check_float_inputs(op, (x, w, b))
        x_axis, m, k, n, rows, cols = _fc_dims(op, x, w, axis, axis_w, weight_n_by_k)
        if b.ndim != 1 or b.shape[0] != n:
            raise ShapeError(f"{op.where}: bias '{op.inputs[2]}' must be 1-D [{n}], got {list(b.shape)}")
        w2 = jnp.reshape(w, (rows, cols))
        y = _matmul(jnp.reshape(x, (m, k)), w2.T if weight_n_by_k else w2) + b
        return jnp.reshape(y, (*x.shape[:x_axis], n))

    return kernel


@register("FC", inputs=3)
def fc(op: Op) -> Kernel:
    """`Y = X·Wᵀ + b` with W `[dim_out, dim_in]` (caffe2/operators/fully_connected_op.h)."""
    return _fc(op, weight_n_by_k=True)


@register("FCTransposed", inputs=3)
def fc_transposed(op: Op) -> Kernel:
    """`Y = X·W + b` with W `[dim_in, dim_out]`."""
    return _fc(op, weight_n_by_k=False)


def _fc_gradient(op: Op, weight_n_by_k: bool) -> Kernel:
    """`(X, W, dY) -> (dW, db[, dX])` (FullyConnectedGradientOp): X and W flattened as in the
    forward op, dY read as `M x N`. An empty X gives dW = db = 0 (even if dY is not empty)."""
    axis = op.int("axis", 1)
    axis_w = op.int("axis_w", 1)
    op.bool("float16_compute", False)

    def kernel(x, w, dy):
        _check_float_inputs(op, (x, w, dy))
        _, m, k, n, rows, cols = _fc_dims(op, x, w, axis, axis_w, weight_n_by_k)
        if dy.size != m * n:
            raise ShapeError(
                f"{op.where}: output gradient '{op.inputs[2]}' {list(dy.shape)} must hold M x N = "
                f"{m} x {n} values (M from '{op.inputs[0]}', N from '{op.inputs[1]}')"
            )
        x2, dy2, w2 = jnp.reshape(x, (m, k)), jnp.reshape(dy, (m, n)), jnp.reshape(w, (rows, cols))
        dw = _matmul(dy2.T, x2) if weight_n_by_k else _matmul(x2.T, dy2)
        db = jnp.sum(dy2, axis=0) if x.size else jnp.zeros((n,), dy.dtype)
        dx = _matmul(dy2, w2 if weight_n_by_k else w2.T)
        return jnp.reshape(dw, w.shape), db, jnp.reshape(dx, x.shape)

    return kernel


@register("FCGradient", inputs=3, outputs=(2, 3))
def fc_gradient(op: Op) -> Kernel:
    """`dW = dYᵀ·X`, `db = Σ_rows dY`, `dX = dY·W`; outputs in the maker's order dW, db, dX."""
    return _fc_gradient(op, weight_n_by_k=True)


@register("FCTransposedGradient", inputs=3, outputs=(2, 3))
def fc_transposed_gradient(op: Op) -> Kernel:
    """`dW = Xᵀ·dY`, `db = Σ_rows dY`, `dX = dY·Wᵀ`."""
    return _fc_gradient(op, weight_n_by_k=False)


# --------------------------------------------------------------------------------------------------
# MatMul


@register("MatMul", inputs=(2, 3))
def matmul(op: Op) -> Kernel:
    """caffe2/operators/matmul_op.h: A and B are flattened to matrices at `axis_a`/`axis_b`, then
    optionally transposed; Y is always 2-D `M x N`. The optional third input (used by the gradient
    ops) only gives Y its shape."""
    axis_a = op.int("axis_a", 1)
    axis_b = op.int("axis_b", 1)
    trans_a = op.bool("trans_a", False)
    trans_b = op.bool("trans_b", False)

    def as_matrix(x, axis: int, trans: bool, what: str):
        k = canonical_axis(op, axis, x.ndim, what)
        m = jnp.reshape(x, (size_to_dim(x.shape, k), size_from_dim(x.shape, k)))
        return m.T if trans else m

    def kernel(a, b, like=None):
        _check_float_inputs(op, (a, b))
        a2 = as_matrix(a, axis_a, trans_a, "axis_a")
        b2 = as_matrix(b, axis_b, trans_b, "axis_b")
        if a2.shape[1] != b2.shape[0]:
            raise ShapeError(
                f"{op.where}: dimension mismatch: {'trans(A)' if trans_a else 'A'} '{op.inputs[0]}' is "
                f"{a2.shape[0]} x {a2.shape[1]}, {'trans(B)' if trans_b else 'B'} '{op.inputs[1]}' is "
                f"{b2.shape[0]} x {b2.shape[1]}"
            )
        y = _matmul(a2, b2)
        if like is None:
            return y
        if math.prod(like.shape) != y.size:
            raise ShapeError(
                f"{op.where}: shape input '{op.inputs[2]}' {list(like.shape)} does not hold the "
                f"{y.shape[0]} x {y.shape[1]} product"
            )
        return jnp.reshape(y, like.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# BatchMatMul


def _swap_last(x: jax.Array, trans: bool) -> jax.Array:
    return jnp.swapaxes(x, -1, -2) if trans else x


def _batch_shape(op: Op, a_batch: tuple[int, ...], b_batch: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting of the batch dims (right-aligned; equal or 1)."""
    try:
        return broadcast_shapes(a_batch, b_batch)
    except ValueError:
        every = " for every size of their symbolic dims" if is_symbolic((*a_batch, *b_batch)) else ""
        raise ShapeError(
            f"{op.where}: batch dims {list(a_batch)} of '{op.inputs[0]}' and {list(b_batch)} of "
            f"'{op.inputs[1]}' do not broadcast{every}"
        ) from None


@register("BatchMatMul", inputs=2)
def batch_matmul(op: Op) -> Kernel:
    """caffe2/operators/batch_matmul_op.h: `op(A)·op(B)` over the last two dims, where op transposes
    them when `trans_a`/`trans_b`. broadcast=0 needs equal ranks >= 2 and equal batch dims;
    broadcast=1 is numpy.matmul (batch dims broadcast, a 1-D operand is a vector and its flag is
    ignored), except that vector·vector gives shape [1] as in Caffe2."""
    trans_a = op.bool("trans_a", False)
    trans_b = op.bool("trans_b", False)
    broadcast = op.bool("broadcast", False)

    def mismatch(k_a: int, k_b: int) -> ShapeError:
        return ShapeError(
            f"{op.where}: inner dims differ: '{op.inputs[0]}' gives K = {k_a}, '{op.inputs[1]}' gives "
            f"K = {k_b} (trans_a={int(trans_a)}, trans_b={int(trans_b)})"
        )

    def kernel(a, b):
        _check_float_inputs(op, (a, b))
        if not broadcast and (a.ndim != b.ndim or a.ndim < 2 or a.shape[:-2] != b.shape[:-2]):
            raise ShapeError(
                f"{op.where}: with broadcast=0 both inputs need the same rank >= 2 and the same batch "
                f"dims, got '{op.inputs[0]}' {list(a.shape)} and '{op.inputs[1]}' {list(b.shape)}; "
                "did you forget broadcast=1?"
            )
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"{op.where}: BatchMatMul inputs must have rank >= 1")
        if a.ndim == 1 and b.ndim == 1:
            if a.shape != b.shape:
                raise mismatch(a.shape[0], b.shape[0])
            return jnp.reshape(_matmul(a, b), (1,))
        a_op = a if a.ndim == 1 else _swap_last(a, trans_a)
        b_op = b if b.ndim == 1 else _swap_last(b, trans_b)
        k_b = b_op.shape[0] if b_op.ndim == 1 else b_op.shape[-2]
        if a_op.shape[-1] != k_b:
            raise mismatch(a_op.shape[-1], k_b)
        _batch_shape(op, a_op.shape[:-2], b_op.shape[:-2])
        return _matmul(a_op, b_op)

    return kernel


# --------------------------------------------------------------------------------------------------
# ElementwiseLinear


@register("ElementwiseLinear", inputs=3)
def elementwise_linear(op: Op) -> Kernel:
    """caffe2/operators/elementwise_linear_op.cc: X viewed `N x D` at `axis`, `Y = X·a + b` with a
    and b 1-D `[D]` scaling each column."""
    axis = op.int("axis", 1)

    def kernel(x, a, b):
        _check_float_inputs(op, (x, a, b))
        k = canonical_axis(op, axis, x.ndim)
        d = size_from_dim(x.shape, k)
        for name, v in zip(op.inputs[1:], (a, b), strict=True):
            if v.ndim != 1 or v.shape[0] != d:
                raise ShapeError(
                    f"{op.where}: '{name}' must be 1-D [{d}] (the size of '{op.inputs[0]}' "
                    f"{list(x.shape)} from axis {axis}), got {list(v.shape)}"
                )
        rows = jnp.reshape(x, (size_to_dim(x.shape, k), d))
        return jnp.reshape(rows * a + b, x.shape)

    return kernel


@register("ElementwiseLinearGradient", inputs=3, outputs=3)
def elementwise_linear_gradient(op: Op) -> Kernel:
    """`(dY, X, a) -> (dX, da, db)` with X viewed `N x D` at `axis`: `dX = dY·a`,
    `da = Σ_n dY·X`, `db = Σ_n dY` (elementwise_linear_op.cc)."""
    axis = op.int("axis", 1)

    def kernel(dy, x, a):
        _check_float_inputs(op, (dy, x, a))
        k = canonical_axis(op, axis, x.ndim)
        n, d = size_to_dim(x.shape, k), size_from_dim(x.shape, k)
        if a.ndim != 1 or a.shape[0] != d:
            raise ShapeError(
                f"{op.where}: '{op.inputs[2]}' must be 1-D [{d}] (the size of '{op.inputs[1]}' "
                f"{list(x.shape)} from axis {axis}), got {list(a.shape)}"
            )
        if dy.size != x.size:
            raise ShapeError(
                f"{op.where}: output gradient '{op.inputs[0]}' {list(dy.shape)} must have the size of "
                f"'{op.inputs[1]}' {list(x.shape)}"
            )
        dy2, x2 = jnp.reshape(dy, (n, d)), jnp.reshape(x, (n, d))
        return jnp.reshape(dy2 * a, x.shape), jnp.sum(dy2 * x2, axis=0), jnp.sum(dy2, axis=0)

    return kernel
