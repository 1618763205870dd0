"""The fused cell ops of Caffe2's step nets: LSTMUnit and GRUUnit.

Both take one time step of `[1, N, ...]` blobs and the int32 `timestep` blob; with `sequence_lengths`
(the default) a batch row whose sequence has ended (`t >= seq_lengths[n]`) keeps its previous state,
or is zeroed when `drop_states` is set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import BadArgumentError, ShapeError
from ..netdef import Op
from .registry import register


def _unit_inputs(op: Op, fixed: int, names: str) -> bool:
    """Whether the op has a seq_lengths input (Caffe2: argument `sequence_lengths`, default true)."""
    with_lengths = op.bool("sequence_lengths", True)
    expected = fixed + (2 if with_lengths else 1)
    if len(op.inputs) != expected:
        form = f"{names}, seq_lengths, timestep" if with_lengths else f"{names}, timestep"
        raise BadArgumentError(
            f"{op.where}: with sequence_lengths={int(with_lengths)} {op.type} takes {expected} inputs "
            f"({form}), got {len(op.inputs)}"
        )
    return with_lengths


def _valid_rows(op: Op, seq_lengths: jax.Array | None, timestep: jax.Array, batch: int) -> jax.Array | None:
    """[1, N, 1] mask of rows still inside their sequence at this timestep (None: all are)."""
    if seq_lengths is None:
        return None
    if seq_lengths.size != batch:
        raise ShapeError(
            f"{op.where}: seq_lengths '{op.inputs[-2]}' has {seq_lengths.size} entries for a batch of {batch}"
        )
    t = jnp.reshape(timestep, (-1,))[0]
    return (t < jnp.reshape(seq_lengths, (-1,)))[None, :, None]


def _finish(valid: jax.Array | None, new: jax.Array, prev: jax.Array, drop_states: bool) -> jax.Array:
    if valid is None:
        return new
    return jnp.where(valid, new, jnp.zeros_like(prev) if drop_states else prev)


def _check_state(op: Op, name: str, value: jax.Array, batch: int, size: int) -> None:
    if value.shape != (1, batch, size):
        raise ShapeError(f"{op.where}: '{name}' has shape {list(value.shape)}, expected [1, {batch}, {size}]")


def lstm_state_update(
    op: Op, hidden_prev: jax.Array, cell_prev: jax.Array, pre: dict[str, jax.Array], extra: tuple
) -> tuple[jax.Array, jax.Array]:
    """LSTMUnit's maths from the four gate pre-activations `pre` (keys i, f, o, g); `extra` is
    (seq_lengths, timestep) or (timestep,). Shared with the fused LSTM step (rnn2jax.fusion)."""
    with_lengths = op.bool("sequence_lengths", True)
    forget_bias = op.float("forget_bias", 0.0)
    seq_lengths, timestep = extra if with_lengths else (None, *extra)
    i, f = jax.nn.sigmoid(pre["i"]), jax.nn.sigmoid(pre["f"] + forget_bias)
    o, g = jax.nn.sigmoid(pre["o"]), jnp.tanh(pre["g"])
    cell = f * cell_prev + i * g
    hidden = o * jnp.tanh(cell)
    valid = _valid_rows(op, seq_lengths, timestep, cell_prev.shape[1])
    drop_states = op.bool("drop_states", False)
    return _finish(valid, hidden, hidden_prev, drop_states), _finish(valid, cell, cell_prev, drop_states)


@register("LSTMUnit", inputs=(4, 5), outputs=2)
def lstm_unit(op: Op):
    """Gate blocks in Caffe2's order i, f, o, g; `forget_bias` is added to f before its sigmoid."""
    _unit_inputs(op, 3, "hidden_prev, cell_prev, gates")
    op.float("forget_bias", 0.0)  # checked here, before tracing
    op.bool("drop_states", False)

    def kernel(hidden_prev, cell_prev, gates, *extra):
        if cell_prev.ndim != 3:
            raise ShapeError(
                f"{op.where}: cell_prev '{op.inputs[1]}' must be [1, N, D], got {list(cell_prev.shape)}"
            )
        _, batch, size = cell_prev.shape
        _check_state(op, op.inputs[0], hidden_prev, batch, size)
        _check_state(op, op.inputs[2], gates, batch, 4 * size)
        pre = dict(zip("ifog", jnp.split(gates, 4, axis=-1), strict=True))
        return lstm_state_update(op, hidden_prev, cell_prev, pre, extra)

    return kernel


@register("GRUUnit", inputs=(3, 4), outputs=1)
def gru_unit(op: Op):
    """Gate blocks r, u, o: `h = u * h_prev + (1 - u) * tanh(o)` with `u = sigmoid(gates[u])`. The reset
    block is not read here: the GRU step net applies the reset gate with its own Sigmoid and Mul ops."""
    with_lengths = _unit_inputs(op, 2, "hidden_prev, gates")
    drop_states = op.bool("drop_states", False)

    def kernel(hidden_prev, gates, *rest):
        seq_lengths, timestep = rest if with_lengths else (None, *rest)
        if hidden_prev.ndim != 3:
            raise ShapeError(
                f"{op.where}: hidden_prev '{op.inputs[0]}' must be [1, N, D], got {list(hidden_prev.shape)}"
            )
        _, batch, size = hidden_prev.shape
        _check_state(op, op.inputs[1], gates, batch, 3 * size)
        _, u, o = jnp.split(gates, 3, axis=-1)
        u, o = jax.nn.sigmoid(u), jnp.tanh(o)
        hidden = u * hidden_prev + (1 - u) * o
        return _finish(_valid_rows(op, seq_lengths, timestep, batch), hidden, hidden_prev, drop_states)

    return kernel
