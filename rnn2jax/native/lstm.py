"""Calls of the native LSTM layer kernels (src/lstm.cc), for the CPU branch of a recognised LSTM stack.

One call runs one layer's whole recurrence: `x` is the layer's input projection ([T, N, 4H]), `w` the
recurrent FC's weights ([4H, H]) and `b` the biases added to every step's gates ([4H]: gates = h w^T + x + b;
the kernel adds them, which saves XLA a pass over x), `lengths` how many leading steps
of each batch row are inside its sequence ([N] int32 in [0, T]; LSTMUnit's `t < seq_lengths[n]`). Float32
only: the caller keeps other dtypes on the pure lowering.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .library import target


def lstm_forward(
    x: jax.Array,
    h0: jax.Array,
    c0: jax.Array,
    w: jax.Array,
    b: jax.Array,
    lengths: jax.Array,
    *,
    forget_bias: float,
    drop_states: bool,
    save: bool,
    pre_activations: bool = False,
) -> tuple[jax.Array, ...]:
    """(h, c), each [T, N, H]; with `save` also the activated gates (i, f, o, g) the backward reads; with
    `pre_activations` (not with `save`) also the gates before their nonlinearities, [T, N, 4H]."""
    steps, batch, width = x.shape
    row = jax.ShapeDtypeStruct((steps, batch, width // 4), jnp.float32)
    if save:
        handler, outputs = "rnn2jax_lstm_forward_train", (row,) * 6
    elif pre_activations:
        handler, outputs = "rnn2jax_lstm_forward_gates", (row, row, jax.ShapeDtypeStruct(x.shape, jnp.float32))
    else:
        handler, outputs = "rnn2jax_lstm_forward", (row, row)
    call = jax.ffi.ffi_call(target(handler), outputs, vmap_method="sequential")
    return tuple(
        call(
            x,
            jnp.reshape(h0, (batch, -1)),
            jnp.reshape(c0, (batch, -1)),
            w,
            b,
            lengths,
            forget_bias=np.float32(forget_bias),
            drop_states=np.int32(drop_states),
        )
    )


def lstm_backward(
    w: jax.Array,
    c0: jax.Array,
    c: jax.Array,
    gates: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
    lengths: jax.Array,
    dh: jax.Array | None,
    dc: jax.Array | None,
    dgates_out: jax.Array | None,
    *,
    drop_states: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(d x [T, N, 4H], d h0, d c0 [N, H]) from the cotangents of h and c ([T, N, H]; the final state's
    cotangent already added at T-1) and of the pre-activations ([T, N, 4H]); None for zero."""
    steps, batch, hidden = c.shape
    empty = jnp.zeros((0,), jnp.float32)
    outputs = (
        jax.ShapeDtypeStruct((steps, batch, 4 * hidden), jnp.float32),
        jax.ShapeDtypeStruct((batch, hidden), jnp.float32),
        jax.ShapeDtypeStruct((batch, hidden), jnp.float32),
    )
    call = jax.ffi.ffi_call(target("rnn2jax_lstm_backward"), outputs, vmap_method="sequential")
    return tuple(
        call(
            w,
            jnp.reshape(c0, (batch, hidden)),
            c,
            *gates,
            lengths,
            empty if dh is None else dh,
            empty if dc is None else dc,
            empty if dgates_out is None else dgates_out,
            drop_states=np.int32(drop_states),
        )
    )
