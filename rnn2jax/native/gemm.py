"""Caffe2's FC on CPU as one oneDNN GEMM (src/gemm.cc), forward and backward, for the large float32 ones.

The recurrent nets' input projections (`[T·N, D] x [D, 4H]`) and their gradients are the largest matmuls
of a Caffe2 RNN; oneDNN's sgemm runs them up to 1.5x faster than XLA's CPU dot. `fully_connected` puts
the GEMM under `lax.platform_dependent`'s CPU branch only, with a custom VJP whose backward is two more
GEMMs (dX = dY·W, dW = dYᵀ·X, also what the FCGradient op computes) and a sum: other platforms, and every
FC below `MIN_MACS` multiply-adds (where a call costs more than XLA's fused dot), keep `jnp.matmul`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .library import available, target

MIN_MACS = 1 << 20  # below about a million multiply-adds XLA's dot, fused with its neighbours, is as fast


def eligible(m: int, k: int, n: int, *arrays: jax.Array) -> bool:
    """Whether an FC of these sizes and arrays runs as the native GEMM on CPU."""
    sizes = (m, k, n)
    if not all(isinstance(d, int) for d in sizes) or m * k * n < MIN_MACS:
        return False  # a symbolic dim (jax.export) or a small FC
    return all(a.dtype == jnp.float32 for a in arrays) and available()


def gemm(a: jax.Array, b: jax.Array, bias: jax.Array | None = None, *, trans_a: bool, trans_b: bool) -> jax.Array:
    """op(a) @ op(b) (+ bias) as one native call (CPU only: call it under a platform_dependent CPU branch)."""
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    call = jax.ffi.ffi_call(target("rnn2jax_gemm"), jax.ShapeDtypeStruct((m, n), jnp.float32))
    no_bias = jnp.zeros((0,), jnp.float32)
    return call(a, b, no_bias if bias is None else bias, trans_a=np.int32(trans_a), trans_b=np.int32(trans_b))


def fully_connected(
    x: jax.Array, w: jax.Array, b: jax.Array, w_is_n_by_k: bool, precision: lax.Precision | None
) -> jax.Array:
    """`x [M, K] @ w.T + b` (w [N, K]; `w @` for [K, N] when not `w_is_n_by_k`): the native GEMM on CPU,
    `jnp.matmul` at `precision` elsewhere, with one VJP for both."""
    return _fc(w_is_n_by_k, precision)(x, w, b)


def fully_connected_gradients(
    x: jax.Array, w: jax.Array, dy: jax.Array, w_is_n_by_k: bool, precision: lax.Precision | None
) -> tuple[jax.Array, jax.Array]:
    """(dX, dW) of `fully_connected` for the output gradient `dy [M, N]` (what FCGradient computes), as
    two native GEMMs on CPU; differentiable (through the `jnp` formulas) for higher orders."""
    return _fc_gradients(w_is_n_by_k, precision)(x, w, dy)


def _fc(w_is_n_by_k: bool, precision: lax.Precision | None):
    def xla_forward(x, w, b):
        return jnp.matmul(x, w.T if w_is_n_by_k else w, precision=precision) + b

    def native_forward(x, w, b):
        return gemm(x, w, b, trans_a=False, trans_b=w_is_n_by_k)

    @jax.custom_vjp
    def fc(x, w, b):
        return lax.platform_dependent(x, w, b, cpu=native_forward, default=xla_forward)

    def fc_fwd(x, w, b):
        return fc(x, w, b), (x, w)

    def fc_bwd(residuals, dy):
        x, w = residuals
        dx, dw = _fc_gradients(w_is_n_by_k, precision)(x, w, dy)
        return dx, dw, jnp.sum(dy, axis=0)

    fc.defvjp(fc_fwd, fc_bwd)
    return fc


def _fc_gradients(w_is_n_by_k: bool, precision: lax.Precision | None):
    def xla_gradients(x, w, dy):
        dx = jnp.matmul(dy, w if w_is_n_by_k else w.T, precision=precision)
        dw = jnp.matmul(dy.T, x, precision=precision) if w_is_n_by_k else jnp.matmul(x.T, dy, precision=precision)
        return dx, dw

    def native_gradients(x, w, dy):
        dx = gemm(dy, w, trans_a=False, trans_b=not w_is_n_by_k)
        dw_t = gemm(x, dy, trans_a=True, trans_b=False)  # xᵀ dy: oneDNN's faster orientation (rows_contraction)
        return dx, dw_t.T if w_is_n_by_k else dw_t

    @jax.custom_vjp
    def gradients(x, w, dy):
        return lax.platform_dependent(x, w, dy, cpu=native_gradients, default=xla_gradients)

    def gradients_fwd(x, w, dy):
        return gradients(x, w, dy), (x, w, dy)

    def gradients_bwd(residuals, cotangents):  # bilinear: the jnp formulas' own VJP
        return jax.vjp(xla_gradients, *residuals)[1](cotangents)

    gradients.defvjp(gradients_fwd, gradients_bwd)
    return gradients


# -- the recurrent kernels' GEMMs around the loop (CPU branches only) ---------------------------------


def rows_times(rows: jax.Array, w: jax.Array, *, w_is_n_by_k: bool = True) -> jax.Array:
    """`rows [..., K] @ w.T` (w [N, K]; `@ w` for [K, N]) as one native GEMM over all leading dims."""
    flat = jnp.reshape(rows, (-1, rows.shape[-1]))
    product = gemm(flat, w, trans_a=False, trans_b=w_is_n_by_k)
    return jnp.reshape(product, (*rows.shape[:-1], product.shape[-1]))


def rows_contraction(d: jax.Array, rows: jax.Array) -> jax.Array:
    """`sum over leading dims of d[..., J]ᵀ rows[..., K]` -> [J, K], a weight gradient over all steps: one
    native GEMM, computed as (rowsᵀ d)ᵀ: on one AVX2 core within 6% of dᵀ rows at the benchmark's LSTM sizes,
    and faster where they differ most (18.8 against 21.2 ms at [1600, 1024] x [1600, 256])."""
    m = math.prod(d.shape[:-1])
    return gemm(jnp.reshape(rows, (m, -1)), jnp.reshape(d, (m, -1)), trans_a=True, trans_b=False).T


def contraction(d: jax.Array, rows: jax.Array, precision: lax.Precision | None, native: bool) -> jax.Array:
    """`rows_contraction` on CPU where `native`, XLA's einsum elsewhere (for code both branches share)."""

    def xla(d, rows):
        return jnp.einsum("...j,...k->jk", d, rows, precision=precision)

    if not native:
        return xla(d, rows)
    return lax.platform_dependent(d, rows, cpu=rows_contraction, default=xla)
