"""The rnn_units family (rnn2jax/ops/rnn_units.py): its lowering, gradient ops and builder makers.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of LSTMUnit and GRUUnit
(and their gradient ops) against real Caffe2 (see tests/differential.py).

Gradient ops against references and jax.vjp: LSTMUnitGradient and GRUUnitGradient against NumPy references written
from SEMANTICS.md section 4 and Caffe2's kernels (caffe2/perfkernels/lstm_unit_cpu-impl.h,
caffe2/operators/gru_unit_op.h), and against `jax.vjp` of the forward LSTMUnit/GRUUnit.

Why the vjp agrees everywhere, hidden_prev included: the gradient ops give dHidden_prev = 0 on valid rows of an LSTM
step because hidden_prev reaches the cell only through the step net's FC (whose own gradient op carries it), and
LSTMUnit itself never reads hidden_prev on a valid row, so the vjp of the op alone is 0 there too. On rows past
their sequence LSTMUnit copies (hidden_prev, cell_prev) or writes zeros (drop_states), so the vjp is the pass-
through (dH, dC) or 0, with no gradient into the gates: exactly the gradient op. GRUUnit reads hidden_prev as `u *
hidden_prev` on valid rows (vjp dH*u) and never reads the reset block (vjp 0), matching GRUUnitGradient.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, cases, make_op, run_case
from helpers import forward, run_op
from rnn2jax.errors import BadArgumentError, ShapeError

# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_rnn_units.py)

def unit_args(data, with_forget_bias):
    """sequence_lengths on/off (default on), drop_states, forget_bias: each given or left to its default."""
    args = {}
    with_lengths = data.draw(st.booleans())
    if not with_lengths or data.draw(st.booleans()):
        args["sequence_lengths"] = int(with_lengths)
    if data.draw(st.booleans()):
        args["drop_states"] = int(data.draw(st.booleans()))
    if with_forget_bias and data.draw(st.booleans()):
        args["forget_bias"] = data.draw(st.sampled_from([0.0, 1.0, -0.5, 2.5]))
    return args, with_lengths


def step_inputs(data, n, t_max=4):
    """seq_lengths (zero-length sequences included) and a timestep at, before or after them."""
    return (
        data.draw(arrays((n,), np.int32, 0, t_max)),
        np.asarray([data.draw(st.integers(0, t_max))], np.int32),
    )


def draw_lstm_unit(data):
    n, d = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    args, with_lengths = unit_args(data, True)
    inputs = {
        "hidden_prev": data.draw(arrays((1, n, d), np.float32)),
        "cell_prev": data.draw(arrays((1, n, d), np.float32, -2, 2)),
        "gates": data.draw(arrays((1, n, 4 * d), np.float32, -3, 3)),
    }
    seq_lengths, timestep = step_inputs(data, n)
    if with_lengths:
        inputs["seq_lengths"] = seq_lengths
    inputs["timestep"] = timestep
    return make_op("LSTMUnit", list(inputs), ["hidden", "cell"], **args), inputs


def draw_gru_unit(data):
    n, d = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    args, with_lengths = unit_args(data, False)
    inputs = {
        "hidden_prev": data.draw(arrays((1, n, d), np.float32)),
        "gates": data.draw(arrays((1, n, 3 * d), np.float32, -3, 3)),
    }
    seq_lengths, timestep = step_inputs(data, n)
    if with_lengths:
        inputs["seq_lengths"] = seq_lengths
    inputs["timestep"] = timestep
    return make_op("GRUUnit", list(inputs), ["hidden"], **args), inputs


CASES = cases(
    Case("LSTMUnit", draw_lstm_unit, gradient_ops=("LSTMUnitGradient",)),
    Case("GRUUnit", draw_gru_unit, gradient_ops=("GRUUnitGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


# ----------------------------------------------------------------------------------------------------
# Gradient ops against references and jax.vjp (was tests/ops/test_rnn_units.py)

RTOL, ATOL = 1e-5, 1e-6


def floats(shape, bound: float = 3.0):
    return hnp.arrays(np.float32, shape, elements=st.floats(-bound, bound, width=32, allow_subnormal=False))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def close(actual, expected):
    assert actual.shape == np.shape(expected) and actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


@st.composite
def unit_case(draw, blocks: int):
    """Shared draws: N, D, the arguments, [1, N, D] states, [1, N, blocks*D] gates, lengths, t."""
    n, d = draw(st.integers(1, 3), label="N"), draw(st.integers(1, 3), label="D")
    with_lengths = draw(st.booleans(), label="sequence_lengths")
    args = {"sequence_lengths": int(with_lengths), "drop_states": int(draw(st.booleans(), label="drop"))}
    case = {
        "hidden_prev": draw(floats((1, n, d)), label="hidden_prev"),
        "gates": draw(floats((1, n, blocks * d)), label="gates"),
        "d_hidden": draw(floats((1, n, d)), label="dH"),
        "timestep": np.array([draw(st.integers(0, 3), label="t")], np.int32),
        "seq_lengths": draw(hnp.arrays(np.int32, n, elements=st.integers(0, 4)), label="seq_lengths")
        if with_lengths
        else None,
    }
    return case, args


def _valid(case) -> np.ndarray:
    """[1, N, 1]: rows with t < seq_lengths[n] (all rows without seq_lengths)."""
    if case["seq_lengths"] is None:
        return np.ones((1, case["gates"].shape[1], 1), bool)
    return (case["timestep"][0] < case["seq_lengths"])[None, :, None]


def _extra(case) -> list:
    """[seq_lengths,] timestep: the inputs between the fixed ones and the outputs."""
    return [x for x in (case["seq_lengths"], case["timestep"]) if x is not None]


# ---------------------------------------------------------------------------------------------------
# LSTMUnitGradient


def _lstm_grad(hp, cp, gates, cell, dh, dc_in, valid, forget_bias, drop_states):
    """SEMANTICS.md 4 / lstm_unit_cpu-impl.h, in float64. Valid rows: tc = tanh(cell),
    dc = dC + dH*o*(1 - tc^2), dc_prev = dc*f, dh_prev = 0, di = dc*g*i(1-i), df = dc*c_prev*f(1-f),
    do = dH*tc*o(1-o), dg = dc*i*(1-g^2). Invalid rows: dgates = 0; (dh_prev, dc_prev) = drop_states ?
    0 : (dH, dC)."""
    hp, cp, gates, cell, dh, dc_in = (a.astype(np.float64) for a in (hp, cp, gates, cell, dh, dc_in))
    x_i, x_f, x_o, x_g = np.split(gates, 4, axis=-1)
    i, f, o, g = sigmoid(x_i), sigmoid(x_f + forget_bias), sigmoid(x_o), np.tanh(x_g)
    tc = np.tanh(cell)
    dc = dc_in + dh * o * (1 - tc**2)
    d_gates = np.concatenate(
        [dc * g * i * (1 - i), dc * cp * f * (1 - f), dh * tc * o * (1 - o), dc * i * (1 - g**2)], axis=-1
    )
    keep = 0.0 if drop_states else 1.0
    return (
        np.where(valid, 0.0, keep * dh),
        np.where(valid, dc * f, keep * dc_in),
        np.where(valid, d_gates, 0.0),
    )


@given(data=st.data())
def test_lstm_unit_gradient(jit, data):
    case, args = data.draw(unit_case(blocks=4), label="case")
    forget_bias = data.draw(st.sampled_from([0.0, 1.0, -0.5]), label="forget_bias")
    args["forget_bias"] = forget_bias
    _, n, d = case["hidden_prev"].shape
    cell_prev = data.draw(floats((1, n, d)), label="cell_prev")
    d_cell = data.draw(floats((1, n, d)), label="dC")
    extra = _extra(case)
    hp, gates, dh = case["hidden_prev"], case["gates"], case["d_hidden"]

    fn = forward("LSTMUnit", 3 + len(extra), 2, **args)
    (hidden, cell), pullback = jax.vjp(lambda h, c, x: fn(h, c, x, *extra), hp, cell_prev, gates)
    vjp = pullback((dh, d_cell))
    hidden, cell = np.asarray(hidden), np.asarray(cell)

    inputs = [hp, cell_prev, gates, *extra, hidden, cell, dh, d_cell]
    outs = run_op("LSTMUnitGradient", inputs, 3, jit=jit, **args)
    expected = _lstm_grad(
        hp, cell_prev, gates, cell, dh, d_cell, _valid(case), forget_bias, args["drop_states"]
    )
    for got, ref, want, like in zip(outs, expected, vjp, (hp, cell_prev, gates), strict=True):
        assert got.shape == like.shape
        close(got, ref)
        close(got, np.asarray(want))


def test_lstm_unit_gradient_reads_cell_input_not_hidden(jit):
    """tanh(c) comes from the `cell` input (not recomputed from the gates); `hidden` is not read.
    Argument defaults: sequence_lengths=1 (9 inputs), forget_bias=0, drop_states=0."""
    hp = np.zeros((1, 2, 1), np.float32)
    cp = np.array([[[0.5], [-1.0]]], np.float32)
    gates = np.array([[[0.1, 0.2, 0.3, 0.4], [1.0, -1.0, 0.5, 2.0]]], np.float32)
    lengths, t = np.array([5, 0], np.int32), np.array([0], np.int32)
    dh, dc = np.array([[[1.0], [2.0]]], np.float32), np.array([[[0.5], [3.0]]], np.float32)
    cell = np.array([[[0.7], [9.0]]], np.float32)  # deliberately not the forward's cell
    inputs = [hp, cp, gates, lengths, t, np.full_like(hp, 123.0), cell, dh, dc]
    outs = run_op("LSTMUnitGradient", inputs, 3, jit=jit)
    valid = np.array([True, False])[None, :, None]
    for got, ref in zip(outs, _lstm_grad(hp, cp, gates, cell, dh, dc, valid, 0.0, False), strict=True):
        close(got, ref)
    # The invalid row (t=0 >= length 0) passes dH and dC through, no gate gradient.
    np.testing.assert_array_equal(outs[0][0, 1], [2.0])
    np.testing.assert_array_equal(outs[1][0, 1], [3.0])
    np.testing.assert_array_equal(outs[2][0, 1], np.zeros(4, np.float32))


def test_lstm_unit_gradient_bad(jit):
    hp = np.zeros((1, 2, 3), np.float32)
    gates = np.zeros((1, 2, 12), np.float32)
    lengths, t = np.ones(2, np.int32), np.zeros(1, np.int32)
    names = ["hp", "cp", "g", "len", "t", "h", "c", "dh", "dc"]
    with pytest.raises(BadArgumentError, match=r"sequence_lengths=0 LSTMUnitGradient takes 8 inputs"):
        run_op(
            "LSTMUnitGradient", [hp, hp, gates, lengths, t, hp, hp, hp, hp], 3, jit=jit, sequence_lengths=0
        )
    with pytest.raises(
        ShapeError, match=r"LSTMUnitGradient.*'g' has shape \[1, 2, 9\], expected \[1, 2, 12\]"
    ):
        run_op(
            "LSTMUnitGradient",
            [hp, hp, gates[..., :9], lengths, t, hp, hp, hp, hp],
            3,
            jit=jit,
            input_names=names,
        )
    with pytest.raises(ShapeError, match=r"'dc' has shape \[1, 2, 2\], expected \[1, 2, 3\]"):
        run_op(
            "LSTMUnitGradient",
            [hp, hp, gates, lengths, t, hp, hp, hp, hp[..., :2]],
            3,
            jit=jit,
            input_names=names,
        )
    with pytest.raises(ShapeError, match="seq_lengths 'len' has 3 entries for a batch of 2"):
        run_op(
            "LSTMUnitGradient",
            [hp, hp, gates, np.ones(3, np.int32), t, hp, hp, hp, hp],
            3,
            jit=jit,
            input_names=names,
        )


# ---------------------------------------------------------------------------------------------------
# GRUUnitGradient


def _gru_grad(hp, gates, dh, valid, drop_states):
    """SEMANTICS.md 4 / gru_unit_op.h, in float64. Valid rows: u = sigmoid(X[D:2D]),
    o = tanh(X[2D:3D]); dh_prev = dH*u, dr = 0, du = (dH*h_prev - dH*o)*u(1-u), do = dH*(1-u)(1-o^2).
    Invalid rows: dgates = 0, dh_prev = drop_states ? 0 : dH."""
    hp, gates, dh = (a.astype(np.float64) for a in (hp, gates, dh))
    _, x_u, x_o = np.split(gates, 3, axis=-1)
    u, o = sigmoid(x_u), np.tanh(x_o)
    d_gates = np.concatenate(
        [np.zeros_like(u), (dh * hp - dh * o) * u * (1 - u), dh * (1 - u) * (1 - o**2)], axis=-1
    )
    keep = 0.0 if drop_states else 1.0
    return np.where(valid, dh * u, keep * dh), np.where(valid, d_gates, 0.0)


@given(data=st.data())
def test_gru_unit_gradient(jit, data):
    case, args = data.draw(unit_case(blocks=3), label="case")
    extra = _extra(case)
    hp, gates, dh = case["hidden_prev"], case["gates"], case["d_hidden"]

    fn = forward("GRUUnit", 2 + len(extra), 1, **args)
    (hidden,), pullback = jax.vjp(lambda h, x: fn(h, x, *extra), hp, gates)
    vjp = pullback((dh,))

    outs = run_op("GRUUnitGradient", [hp, gates, *extra, np.asarray(hidden), dh], 2, jit=jit, **args)
    expected = _gru_grad(hp, gates, dh, _valid(case), args["drop_states"])
    for got, ref, want, like in zip(outs, expected, vjp, (hp, gates), strict=True):
        assert got.shape == like.shape
        close(got, ref)
        close(got, np.asarray(want))


def test_gru_unit_gradient_defaults(jit):
    """sequence_lengths defaults to 1 (6 inputs) and drop_states to 0; the reset block gets 0."""
    hp = np.array([[[1.0], [2.0]]], np.float32)
    gates = np.array([[[5.0, 0.3, -0.2], [5.0, 1.0, 1.0]]], np.float32)
    lengths, t = np.array([1, 1], np.int32), np.array([1], np.int32)  # both rows have ended
    dh = np.array([[[1.5], [-2.0]]], np.float32)
    d_hp, d_gates = run_op("GRUUnitGradient", [hp, gates, lengths, t, hp, dh], 2, jit=jit)
    np.testing.assert_array_equal(d_hp, dh)
    np.testing.assert_array_equal(d_gates, np.zeros_like(gates))
    d_hp, d_gates = run_op(
        "GRUUnitGradient", [hp, gates, lengths, np.array([0], np.int32), hp, dh], 2, jit=jit
    )
    np.testing.assert_array_equal(d_gates[..., 0], np.zeros((1, 2), np.float32))
    close(d_hp, _gru_grad(hp, gates, dh, np.ones((1, 2, 1), bool), False)[0])


def test_gru_unit_gradient_bad(jit):
    hp = np.zeros((1, 2, 3), np.float32)
    gates = np.zeros((1, 2, 9), np.float32)
    t = np.zeros(1, np.int32)
    names = ["hp", "g", "t", "h", "dh"]
    with pytest.raises(BadArgumentError, match=r"sequence_lengths=1 GRUUnitGradient takes 6 inputs"):
        run_op("GRUUnitGradient", [hp, gates, t, hp, hp], 2, jit=jit)
    with pytest.raises(ShapeError, match=r"GRUUnitGradient.*'g' has shape \[1, 2, 6\], expected \[1, 2, 9\]"):
        run_op(
            "GRUUnitGradient",
            [hp, gates[..., :6], t, hp, hp],
            2,
            jit=jit,
            input_names=names,
            sequence_lengths=0,
        )
    with pytest.raises(ShapeError, match=r"'dh' has shape \[1, 1, 3\], expected \[1, 2, 3\]"):
        run_op(
            "GRUUnitGradient",
            [hp, gates, t, hp, hp[:, :1]],
            2,
            jit=jit,
            input_names=names,
            sequence_lengths=0,
        )
    with pytest.raises(ShapeError, match=r"hidden_prev 'hp' must be \[1, N, D\]"):
        run_op(
            "GRUUnitGradient", [hp[0], gates, t, hp, hp], 2, jit=jit, input_names=names, sequence_lengths=0
        )
