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
from .emit import Call, EmitWriter, call, codegen_helper
from .facets import GRADIENT_OP, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import GradientContext, GradientOps, gradient_op
from .registry import declare_family, facet, register
from .shape_facts import FLOAT32, INT32, Context, Guesses, Rule, Solver, Spec

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)


@codegen_helper
def caffe2_sigmoid(x: jax.Array) -> jax.Array:
    """Caffe2's `sigmoid` (lstm_unit_cpu-impl.h, gru_unit_op.h) is 1 / (1 + exp(-x)); jax.nn.sigmoid
    agrees to float32 rounding and stays finite under differentiation for large -x."""
    return jax.nn.sigmoid(x)


@codegen_helper
def caffe2_tanh(x: jax.Array) -> jax.Array:
    """Caffe2's `host_tanh`: 2 * sigmoid(2x) - 1 with sigmoid(y) = 1 / (1 + exp(-y)). It differs from
    tanh near 0 (it cancels to exactly 0 for |x| below ~1e-8, and loses ~1e-5 relative precision around
    4e-3); the units match Caffe2 so. Beyond |x| = 20 it is +-1 in float32; clipping there keeps the
    derivative finite (exp(-2x) would overflow)."""
    return 2 / (1 + jnp.exp(-2 * jnp.clip(x, -20, 20))) - 1


@codegen_helper
def gru_tanh(x: jax.Array) -> jax.Array:
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


@codegen_helper
def rows_in_sequence(seq_lengths: jax.Array | None, timestep: jax.Array) -> jax.Array | None:
    """[1, N, 1]: whether each batch row is still inside its sequence at `timestep` (t < seq_lengths[n]);
    None without seq_lengths (every row is)."""
    if seq_lengths is None:
        return None
    return (jnp.reshape(timestep, (-1,))[0] < jnp.reshape(seq_lengths, (-1,)))[None, :, None]


@codegen_helper
def keep_finished(valid: jax.Array | None, new: jax.Array, prev: jax.Array, drop_states: bool = False) -> jax.Array:
    """`new` on the rows still inside their sequence (`valid`, None: all); the others keep `prev`, or are
    zeroed with drop_states."""
    if valid is None:
        return new
    return jnp.where(valid, new, jnp.zeros_like(prev) if drop_states else prev)


def _check_lengths(op: Op, seq_lengths: jax.Array | None, batch: int, index: int = -2) -> None:
    """seq_lengths holds one length per batch row; `index` is its position among the op's inputs."""
    if seq_lengths is not None and seq_lengths.size != batch:
        raise ShapeError(
            f"{op.where}: seq_lengths '{op.inputs[index]}' has {seq_lengths.size} entries for a batch "
            f"of {batch}"
        )


def _valid_rows(
    op: Op, seq_lengths: jax.Array | None, timestep: jax.Array, batch: int, index: int = -2
) -> jax.Array | None:
    """[1, N, 1] mask of rows still inside their sequence at this timestep (None: all are);
    `index` is seq_lengths' position among the op's inputs (for messages)."""
    _check_lengths(op, seq_lengths, batch, index)
    return rows_in_sequence(seq_lengths, timestep)


def _check_state(op: Op, name: str, value: jax.Array, batch: int, size: int) -> None:
    if value.shape != (1, batch, size):
        raise ShapeError(f"{op.where}: '{name}' has shape {list(value.shape)}, expected [1, {batch}, {size}]")


@codegen_helper
def lstm_unit_blocks(
    hidden_prev: jax.Array,
    cell_prev: jax.Array,
    i: jax.Array,
    f: jax.Array,
    o: jax.Array,
    g: jax.Array,
    seq_lengths: jax.Array | None,
    timestep: jax.Array,
    forget_bias: float = 0.0,
    drop_states: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """LSTMUnit from its four gate pre-activations i, f, o, g ([1, N, D] each) -> (hidden, cell). forget_bias
    is added to f before its sigmoid; rows past their sequence keep their state (see keep_finished)."""
    i, f = caffe2_sigmoid(i), caffe2_sigmoid(f + forget_bias)
    o, g = caffe2_sigmoid(o), caffe2_tanh(g)
    cell = f * cell_prev + i * g
    hidden = o * caffe2_tanh(cell)
    valid = rows_in_sequence(seq_lengths, timestep)
    return keep_finished(valid, hidden, hidden_prev, drop_states), keep_finished(valid, cell, cell_prev, drop_states)


@codegen_helper
def lstm_unit_step(
    hidden_prev: jax.Array,
    cell_prev: jax.Array,
    gates: jax.Array,
    seq_lengths: jax.Array | None,
    timestep: jax.Array,
    forget_bias: float = 0.0,
    drop_states: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Caffe2's LSTMUnit: gate blocks in the order i, f, o, g of [1, N, 4D] gates -> (hidden, cell)."""
    i, f, o, g = jnp.split(gates, 4, axis=-1)
    return lstm_unit_blocks(hidden_prev, cell_prev, i, f, o, g, seq_lengths, timestep, forget_bias, drop_states)


def lstm_state_update(
    op: Op, hidden_prev: jax.Array, cell_prev: jax.Array, pre: dict[str, jax.Array], extra: tuple
) -> tuple[jax.Array, jax.Array]:
    """LSTMUnit's maths from the four gate pre-activations `pre` (keys i, f, o, g); `extra` is
    (seq_lengths, timestep) or (timestep,). Shared with the fused LSTM step (rnn2jax.ops.recurrent.fusion)."""
    seq_lengths, timestep = extra if op.bool("sequence_lengths", True) else (None, *extra)
    _check_lengths(op, seq_lengths, cell_prev.shape[1])
    forget_bias, drop_states = op.float("forget_bias", 0.0), op.bool("drop_states", False)
    blocks = (pre["i"], pre["f"], pre["o"], pre["g"])
    return lstm_unit_blocks(hidden_prev, cell_prev, *blocks, seq_lengths, timestep, forget_bias, drop_states)


def _lengths_position(op: Op) -> tuple[int, ...]:
    """Where LSTMUnit and GRUUnit read sequence lengths: just before the timestep, when `sequence_lengths`."""
    return (len(op.inputs) - 2,) if op.bool("sequence_lengths", True) and len(op.inputs) >= 4 else ()


def _unit_shapes(gates_per_unit: int, gates_at: int) -> Rule:
    """LSTMUnit (h, c, gates[, lengths], timestep) and GRUUnit (h, gates[, lengths], timestep):
    states [1, N, H], gates [1, N, kH], lengths [N] int32, timestep [1] int32."""

    def rule(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
        states = list(range(gates_at))
        with_lengths = op.bool("sequence_lengths", True) and len(op.inputs) >= gates_at + 3
        known_states = [s for s in (*(ins[i] for i in states), *outs) if s is not None and len(s.shape) >= 2]
        gates = ins[gates_at]
        if known_states:
            lead, size = known_states[0].shape[:-1], known_states[0].shape[-1]
        elif gates is not None and len(gates.shape) >= 2:
            lead, size = gates.shape[:-1], gates.shape[-1] // gates_per_unit
        elif ctx.batch is not None:
            lead, size = (1, ctx.batch), None
        else:
            return {}, {}
        guess_in: dict[int, Spec] = {}
        if size is not None:
            state = Spec((*lead, size), FLOAT32)
            guess_in.update({i: state for i in states if ins[i] is None})
            if gates is None:
                guess_in[gates_at] = Spec((*lead, gates_per_unit * size), FLOAT32)
        if with_lengths and ins[gates_at + 1] is None:
            guess_in[gates_at + 1] = Spec((lead[-1],), INT32)
        if ins[-1] is None:
            guess_in[len(ins) - 1] = Spec((1,), INT32)
        guess_out = {i: state for i, s in enumerate(outs) if s is None} if size is not None else {}
        return guess_in, guess_out

    return rule


@register(
    "LSTMUnit",
    inputs=(4, 5),
    outputs=2,
    roles=Roles(lengths=_lengths_position),
    shape_rule=_unit_shapes(gates_per_unit=4, gates_at=2),
)
def lstm_unit(op: Op):
    """Gate blocks in Caffe2's order i, f, o, g; `forget_bias` is added to f before its sigmoid."""
    with_lengths = _unit_inputs(op, 3, "hidden_prev, cell_prev, gates")
    forget_bias = op.float("forget_bias", 0.0)  # checked here, before tracing
    drop_states = op.bool("drop_states", False)

    def kernel(hidden_prev, cell_prev, gates, *extra):
        if cell_prev.ndim != 3:
            raise ShapeError(
                f"{op.where}: cell_prev '{op.inputs[1]}' must be [1, N, D], got {list(cell_prev.shape)}"
            )
        _, batch, size = cell_prev.shape
        _check_state(op, op.inputs[0], hidden_prev, batch, size)
        _check_state(op, op.inputs[2], gates, batch, 4 * size)
        seq_lengths, timestep = extra if with_lengths else (None, *extra)
        _check_lengths(op, seq_lengths, batch)
        return lstm_unit_step(hidden_prev, cell_prev, gates, seq_lengths, timestep, forget_bias, drop_states)

    return kernel


@facet("gradient", "LSTMUnit")
def _lstm_unit_gradient_maker(g: GradientContext) -> GradientOps:
    """(hidden_t_prev, cell_t_prev, gates, seq_lengths, timestep, hidden_t, cell_t, dhidden_t, dcell_t);
    without `sequence_lengths` there is no seq_lengths input."""
    n = 5 if g.flag("sequence_lengths", True) else 4
    inputs = [g.I(i) for i in range(n)] + [g.O(0), g.O(1), g.GO(0), g.GO(1)]
    return [gradient_op("LSTMUnitGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])]


@facet("emitter", "LSTMUnit")
def emit_lstm_unit(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    lengths = op.bool("sequence_lengths", True)
    args = [*xs[:3], xs[3] if lengths else "None", xs[4] if lengths else xs[3]]
    keywords: dict = {}
    if op.float("forget_bias", 0.0):
        keywords["forget_bias"] = op.float("forget_bias")
    if op.bool("drop_states", False):
        keywords["drop_states"] = True
    return call(w.helper(lstm_unit_step), *args, **keywords)


@register(
    "GRUUnit",
    inputs=(3, 4),
    outputs=1,
    roles=Roles(lengths=_lengths_position),
    shape_rule=_unit_shapes(gates_per_unit=3, gates_at=1),
)
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
        _check_lengths(op, seq_lengths, batch)
        return gru_unit_step(hidden_prev, gates, seq_lengths, timestep, drop_states)

    return kernel


@facet("gradient", "GRUUnit")
def _gru_unit_gradient_maker(g: GradientContext) -> GradientOps:
    """(hidden_t_prev, gates, seq_lengths, timestep, hidden_t, dhidden_t); without `sequence_lengths`
    there is no seq_lengths input."""
    n = 4 if g.flag("sequence_lengths", True) else 3
    inputs = [g.I(i) for i in range(n)] + [g.O(0), g.GO(0)]
    return [gradient_op("GRUUnitGradient", inputs, [g.GI(0), g.GI(1)])]


@codegen_helper
def gru_unit_step(
    hidden_prev: jax.Array,
    gates: jax.Array,
    seq_lengths: jax.Array | None,
    timestep: jax.Array,
    drop_states: bool = False,
) -> jax.Array:
    """Caffe2's GRUUnit: gate blocks r, u, o of [1, N, 3D] gates; hidden = u * hidden_prev + (1 - u) * tanh(o)
    with u = sigmoid(u). The reset block is not read: the step net applied it with its own ops."""
    _, u, o = jnp.split(gates, 3, axis=-1)
    u, o = caffe2_sigmoid(u), gru_tanh(o)
    hidden = u * hidden_prev + (1 - u) * o
    return keep_finished(rows_in_sequence(seq_lengths, timestep), hidden, hidden_prev, drop_states)


@facet("emitter", "GRUUnit")
def emit_gru_unit(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    lengths = op.bool("sequence_lengths", True)
    args = [*xs[:2], xs[2] if lengths else "None", xs[3] if lengths else xs[2]]
    keywords = {"drop_states": True} if op.bool("drop_states", False) else {}
    return call(w.helper(gru_unit_step), *args, **keywords)


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
        i, f = caffe2_sigmoid(x_i), caffe2_sigmoid(x_f + forget_bias)
        o, g = caffe2_sigmoid(x_o), caffe2_tanh(x_g)
        tc = caffe2_tanh(cell)
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
            keep_finished(valid, jnp.zeros_like(d_hidden), d_hidden, drop_states),
            keep_finished(valid, dc * f, d_cell, drop_states),
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
        u, o = caffe2_sigmoid(x_u), gru_tanh(x_o)
        d_gates = jnp.concatenate(
            [
                jnp.zeros_like(u),
                (d_hidden * hidden_prev - d_hidden * o) * u * (1 - u),
                d_hidden * (1 - u) * (1 - o * o),
            ],
            axis=-1,
        )
        valid = _valid_rows(op, seq_lengths, timestep, batch, index=2)
        return keep_finished(valid, d_hidden * u, d_hidden, drop_states), _zero_invalid(valid, d_gates)

    return kernel
