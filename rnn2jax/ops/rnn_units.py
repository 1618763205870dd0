"""The fused cell ops of Caffe2's step nets: LSTMUnit and GRUUnit.

Both take one time step of `[1, N, ...]` blobs and the int32 `timestep` blob; with `sequence_lengths`
(the default) a batch row whose sequence has ended (`t >= seq_lengths[n]`) keeps its previous state,
or is zeroed when `drop_states` is set. Their gradient ops (what Caffe2's backward step nets run) follow
caffe2/operators/lstm_unit_op.h (perfkernels/lstm_unit_cpu-impl.h) and gru_unit_op.h.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .registry import NO_ROLES, Absent, declare_family, register

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=Absent("no shape rule: shape inference does not guess this op's inputs"),
    gradient=Absent("no builder gradient maker"),
    emitter=Absent("codegen does not write this op"),
)


def _sigmoid(x: jax.Array) -> jax.Array:
    """Caffe2's `sigmoid` (lstm_unit_cpu-impl.h, gru_unit_op.h) is 1 / (1 + exp(-x)); jax.nn.sigmoid
    agrees to float32 rounding and stays finite under differentiation for large -x."""
    return jax.nn.sigmoid(x)


def _tanh(x: jax.Array) -> jax.Array:
    """Caffe2's `host_tanh`: 2 * sigmoid(2x) - 1 with sigmoid(y) = 1 / (1 + exp(-y)). It differs from
    tanh near 0 (it cancels to exactly 0 for |x| below ~1e-8, and loses ~1e-5 relative precision around
    4e-3); the units match Caffe2 so. Beyond |x| = 20 it is +-1 in float32; clipping there keeps the
    derivative finite (exp(-2x) would overflow)."""
    return 2 / (1 + jnp.exp(-2 * jnp.clip(x, -20, 20))) - 1


def _gru_tanh(x: jax.Array) -> jax.Array:
    """GRUUnit's `host_tanh` (gru_unit_op.h): the same formula, but its sigmoid comes out correctly
    rounded to float32 (as if computed in double), so 2 * round(sigmoid(2x)) - 1 is emulated here with
    an accurate tanh (0.5 + 0.5 * tanh(x) is sigmoid(2x))."""
    return 2 * (0.5 + 0.5 * jnp.tanh(x)) - 1


def _unit_inputs(op: Op, fixed: int, names: str, after: str = "") -> bool:
    """Whether the op has a seq_lengths input (Caffe2: argument `sequence_lengths`, default true).
    `fixed` counts the other inputs but timestep: `names` before seq_lengths, `after` behind timestep."""
    with_lengths = op.bool("sequence_lengths", True)
    expected = fixed + (2 if with_lengths else 1)
    if len(op.inputs) != expected:
        form = f"{names}, seq_lengths, timestep" if with_lengths else f"{names}, timestep"
        form += f", {after}" if after else ""
        raise BadArgumentError(
            f"{op.where}: with sequence_lengths={int(with_lengths)} {op.type} takes {expected} inputs "
            f"({form}), got {len(op.inputs)}"
        )
    return with_lengths


def _valid_rows(
    op: Op, seq_lengths: jax.Array | None, timestep: jax.Array, batch: int, index: int = -2
) -> jax.Array | None:
    """[1, N, 1] mask of rows still inside their sequence at this timestep (None: all are);
    `index` is seq_lengths' position among the op's inputs (for messages)."""
    if seq_lengths is None:
        return None
    if seq_lengths.size != batch:
        raise ShapeError(
            f"{op.where}: seq_lengths '{op.inputs[index]}' has {seq_lengths.size} entries for a batch "
            f"of {batch}"
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
    (seq_lengths, timestep) or (timestep,). Shared with the fused LSTM step (rnn2jax.ops.recurrent.fusion)."""
    with_lengths = op.bool("sequence_lengths", True)
    forget_bias = op.float("forget_bias", 0.0)
    seq_lengths, timestep = extra if with_lengths else (None, *extra)
    i, f = _sigmoid(pre["i"]), _sigmoid(pre["f"] + forget_bias)
    o, g = _sigmoid(pre["o"]), _tanh(pre["g"])
    cell = f * cell_prev + i * g
    hidden = o * _tanh(cell)
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
        u, o = _sigmoid(u), _gru_tanh(o)
        hidden = u * hidden_prev + (1 - u) * o
        return _finish(_valid_rows(op, seq_lengths, timestep, batch), hidden, hidden_prev, drop_states)

    return kernel


def _split_rest(rest: tuple, with_lengths: bool) -> tuple[jax.Array | None, jax.Array, tuple]:
    """(seq_lengths, timestep, the inputs after timestep) from the inputs after the fixed ones."""
    if with_lengths:
        return rest[0], rest[1], rest[2:]
    return None, rest[0], rest[1:]


def _zero_invalid(valid: jax.Array | None, grad: jax.Array) -> jax.Array:
    return grad if valid is None else jnp.where(valid, grad, jnp.zeros_like(grad))


@register("LSTMUnitGradient", inputs=(8, 9), outputs=3)
def lstm_unit_gradient(op: Op):
    """`(hidden_prev, cell_prev, gates, [seq_lengths,] timestep, hidden, cell, dHidden, dCell) ->
    (dHidden_prev, dCell_prev, dGates)`. On valid rows, with `tc = tanh(cell)` from the cell INPUT,
    `dc = dCell + dHidden*o*(1 - tc^2)`, `dCell_prev = dc*f` and dHidden_prev = 0: LSTMUnit never reads
    hidden_prev there (it reaches the cell through the step net's FC, whose own gradient op handles
    it). On rows past their sequence dGates = 0 and (dHidden_prev, dCell_prev) = (dHidden, dCell), or 0
    with drop_states. The `hidden` input is not read."""
    with_lengths = _unit_inputs(op, 7, "hidden_prev, cell_prev, gates", "hidden, cell, dHidden, dCell")
    forget_bias = op.float("forget_bias", 0.0)
    drop_states = op.bool("drop_states", False)

    def kernel(hidden_prev, cell_prev, gates, *rest):
        seq_lengths, timestep, (_, cell, d_hidden, d_cell) = _split_rest(rest, with_lengths)
        if cell_prev.ndim != 3:
            raise ShapeError(
                f"{op.where}: cell_prev '{op.inputs[1]}' must be [1, N, D], got {list(cell_prev.shape)}"
            )
        _, batch, size = cell_prev.shape
        after = len(op.inputs) - 4  # position of `hidden`
        for index, value in ((0, hidden_prev), (after + 1, cell), (after + 2, d_hidden), (after + 3, d_cell)):
            _check_state(op, op.inputs[index], value, batch, size)
        _check_state(op, op.inputs[2], gates, batch, 4 * size)
        x_i, x_f, x_o, x_g = jnp.split(gates, 4, axis=-1)
        i, f = _sigmoid(x_i), _sigmoid(x_f + forget_bias)
        o, g = _sigmoid(x_o), _tanh(x_g)
        tc = _tanh(cell)
        dc = d_cell + d_hidden * o * (1 - tc * tc)
        d_gates = jnp.concatenate(
            [
                dc * g * i * (1 - i),
                dc * cell_prev * f * (1 - f),
                d_hidden * tc * o * (1 - o),
                dc * i * (1 - g * g),
            ],
            axis=-1,
        )
        valid = _valid_rows(op, seq_lengths, timestep, batch, index=3)
        return (
            _finish(valid, jnp.zeros_like(d_hidden), d_hidden, drop_states),
            _finish(valid, dc * f, d_cell, drop_states),
            _zero_invalid(valid, d_gates),
        )

    return kernel


@register("GRUUnitGradient", inputs=(5, 6), outputs=2)
def gru_unit_gradient(op: Op):
    """`(hidden_prev, gates, [seq_lengths,] timestep, hidden, dHidden) -> (dHidden_prev, dGates)`. On
    valid rows `dHidden_prev = dH*u`, the reset block's gradient is 0 (GRUUnit does not read it),
    `du = (dH*hidden_prev - dH*o)*u(1 - u)` and `do = dH*(1 - u)(1 - o^2)`; on rows past their sequence
    dGates = 0 and dHidden_prev = dHidden, or 0 with drop_states. The `hidden` input is not read."""
    with_lengths = _unit_inputs(op, 4, "hidden_prev, gates", "hidden, dHidden")
    drop_states = op.bool("drop_states", False)

    def kernel(hidden_prev, gates, *rest):
        seq_lengths, timestep, (_, d_hidden) = _split_rest(rest, with_lengths)
        if hidden_prev.ndim != 3:
            raise ShapeError(
                f"{op.where}: hidden_prev '{op.inputs[0]}' must be [1, N, D], got {list(hidden_prev.shape)}"
            )
        _, batch, size = hidden_prev.shape
        _check_state(op, op.inputs[1], gates, batch, 3 * size)
        _check_state(op, op.inputs[-1], d_hidden, batch, size)
        _, x_u, x_o = jnp.split(gates, 3, axis=-1)
        u, o = _sigmoid(x_u), _gru_tanh(x_o)
        d_gates = jnp.concatenate(
            [
                jnp.zeros_like(u),
                (d_hidden * hidden_prev - d_hidden * o) * u * (1 - u),
                d_hidden * (1 - u) * (1 - o * o),
            ],
            axis=-1,
        )
        valid = _valid_rows(op, seq_lengths, timestep, batch, index=2)
        return _finish(valid, d_hidden * u, d_hidden, drop_states), _zero_invalid(valid, d_gates)

    return kernel
