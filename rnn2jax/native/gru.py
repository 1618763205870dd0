"""Calls of the native GRU layer kernels (src/gru.cc), for the CPU branch of a recognised GRU (gru_vjp.py).

One call runs the whole recurrence: `x` is the input projection ([T, N, 3H]: blocks r, u, o), `w` the
recurrent FCs' weights stacked ([3H, H]: Wr, Wu, Wo) and `b` their biases ([3H]: br, bu, bo; the kernel adds
them as the step net does, FC then Sum, which also saves XLA a pass over x), `lengths` how many leading steps
of each batch row are inside its sequence ([N] int32 in [0, T]; GRUUnit's `t < seq_lengths[n]`). Float32
only: the caller keeps other dtypes on the pure lowering.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .library import target


def gru_forward(
    x: jax.Array,
    h0: jax.Array,
    w: jax.Array,
    b: jax.Array,
    lengths: jax.Array,
    *,
    linear_before_reset: bool,
    drop_states: bool,
    save: bool,
    fc: bool = False,
) -> tuple[jax.Array, ...]:
    """(h,) [T, N, H]; with `save` also the activated gates r, u, o (zero on rows past their length) and, with
    linear_before_reset, the output FC's value `h_prev Wo^T + bo`: what the backward reads. With `fc` (not with
    `save`) also the step's three FC outputs [T, N, 3H] on every row, what a backward step net's blobs follow
    from."""
    steps, batch, width = x.shape
    row = jax.ShapeDtypeStruct((steps, batch, width // 3), jnp.float32)
    if save:
        handler = "rnn2jax_gru_forward_train"
        results = (row,) * 4 + (row if linear_before_reset else jax.ShapeDtypeStruct((0,), jnp.float32),)
    elif fc:
        handler, results = "rnn2jax_gru_forward_fc", (row, jax.ShapeDtypeStruct(x.shape, jnp.float32))
    else:
        handler, results = "rnn2jax_gru_forward", (row,)
    call = jax.ffi.ffi_call(target(handler), results, vmap_method="sequential")
    out = tuple(
        call(
            x,
            jnp.reshape(h0, (batch, -1)),
            w,
            b,
            lengths,
            linear_before_reset=np.int32(linear_before_reset),
            drop_states=np.int32(drop_states),
        )
    )
    return out if linear_before_reset or not save else out[:4]


def gru_backward(
    w: jax.Array,
    h0: jax.Array,
    h: jax.Array,
    saved: tuple[jax.Array, ...],
    lengths: jax.Array,
    dh: jax.Array,
    *,
    linear_before_reset: bool,
    drop_states: bool,
) -> tuple[jax.Array, jax.Array]:
    """(d x [T, N, 3H], d h0 [N, H]) from the cotangent of the hidden rows ([T, N, H], the final state's
    already added at T-1) and what the training forward saved (r, u, o[, the output FC's value])."""
    steps, batch, hidden = h.shape
    outputs = (
        jax.ShapeDtypeStruct((steps, batch, 3 * hidden), jnp.float32),
        jax.ShapeDtypeStruct((batch, hidden), jnp.float32),
    )
    o_fc = saved[3] if linear_before_reset else jnp.zeros((0,), jnp.float32)
    call = jax.ffi.ffi_call(target("rnn2jax_gru_backward"), outputs, vmap_method="sequential")
    return tuple(
        call(
            w,
            jnp.reshape(h0, (batch, hidden)),
            h,
            *saved[:3],
            o_fc,
            lengths,
            dh,
            linear_before_reset=np.int32(linear_before_reset),
            drop_states=np.int32(drop_states),
        )
    )
