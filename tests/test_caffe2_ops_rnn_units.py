"""Differential tests of LSTMUnit and GRUUnit (and their gradient ops) against real Caffe2
(see tests/differential.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, make_op, run_case


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
