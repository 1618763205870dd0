"""The InferenceLSTM family (rnn2jax/ops/inference_lstm.py) against real Caffe2 (see tests/differential.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, make_op, run_case, run_rnn2jax
from rnn2jax.errors import ShapeError


def draw_inference_lstm(data):
    layers, bidirectional = data.draw(st.integers(1, 2)), data.draw(st.booleans())
    has_biases, batch_first = data.draw(st.booleans()), data.draw(st.booleans())
    steps, batch, features, hidden = (data.draw(st.integers(1, 3)) for _ in range(4))
    directions = 2 if bidirectional else 1
    x_shape = (batch, steps, features) if batch_first else (steps, batch, features)
    inputs = {"x": data.draw(arrays(x_shape))}
    states = layers * directions  # fewer: Caffe2 dies of a division by zero (test_wrong_counts_are_refused)
    inputs["hx"] = data.draw(arrays((states, batch, hidden)))
    inputs["cx"] = data.draw(arrays((states, batch, hidden)))
    for layer in range(layers):
        width = features if layer == 0 else hidden * directions
        for d in range(directions):
            inputs[f"w_ih{layer}{d}"] = data.draw(arrays((4 * hidden, width)))
            inputs[f"w_hh{layer}{d}"] = data.draw(arrays((4 * hidden, hidden)))
            if has_biases:
                inputs[f"b_ih{layer}{d}"] = data.draw(arrays((4 * hidden,)))
                inputs[f"b_hh{layer}{d}"] = data.draw(arrays((4 * hidden,)))
    args = {"num_layers": layers, "bidirectional": int(bidirectional), "has_biases": int(has_biases)}
    args["batch_first"] = int(batch_first)
    return make_op("InferenceLSTM", list(inputs), ["y", "hy", "cy"], **args), inputs


CASES = cases(Case("InferenceLSTM", draw_inference_lstm, rtol=1e-4))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_wrong_counts_are_refused(caffe2):
    x, state = np.zeros((2, 1, 3), np.float32), np.zeros((1, 1, 2), np.float32)
    inputs = {"x": x, "hx": state, "cx": state, "w_ih": np.zeros((8, 3), np.float32)}
    assert check_op(caffe2, make_op("InferenceLSTM", list(inputs), ["y", "hy", "cy"]), inputs) is None
    inputs["w_hh"] = np.zeros((8, 2), np.float32)
    op = make_op("InferenceLSTM", list(inputs), ["y", "hy", "cy"], has_biases=0, num_layers=2)
    with pytest.raises(ShapeError, match=r"2 layer\(s\) need as many parameter sets and states, got 1 and float32"):
        run_rnn2jax([op], inputs, ["y"])
