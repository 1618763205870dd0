"""RecurrentNetwork's internal ops (rnn2jax/ops/rnn_internal.py) against real Caffe2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, make_op, run_case, run_rnn2jax
from rnn2jax.errors import Rnn2JaxError


def draw_accumulate(data):
    steps, width = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    offset = data.draw(st.integers(0, 2))
    t = data.draw(st.integers(0, steps - 1))
    g = data.draw(arrays((steps + offset, width)))
    og = data.draw(arrays((steps, width)))
    op = make_op("rnn_internal_accumulate_gradient_input", ["t", "og", "g"], ["g"], offset=offset)
    return op, {"t": np.array([t], np.int32), "og": og, "g": g}


def draw_link(data):
    steps, width = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    window = data.draw(st.integers(0, steps))
    offset = data.draw(st.integers(0, steps - window))
    t = data.draw(st.integers(0, steps - window - offset))
    op = make_op("rnn_internal_apply_link", ["t", "external"], ["internal", "external"], offset=offset, window=window)
    return op, {"t": np.array([t], np.int32), "external": data.draw(arrays((steps, width)))}


CASES = cases(
    Case("rnn_internal_accumulate_gradient_input", draw_accumulate),
    Case("rnn_internal_apply_link", draw_link),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_refusals(caffe2):
    g = np.zeros((2, 2), np.float32)
    no_offset = make_op("rnn_internal_accumulate_gradient_input", ["t", "og", "g"], ["g"])
    assert check_op(caffe2, no_offset, {"t": np.array([0], np.int32), "og": g, "g": g}) is None
    over = make_op("rnn_internal_accumulate_gradient_input", ["t", "og", "g"], ["g"], offset=2)
    inputs = {"t": np.array([1], np.int32), "og": g, "g": g}
    assert check_op(caffe2, over, inputs) is None
    with pytest.raises(Rnn2JaxError, match="out of bounds"):
        run_rnn2jax([over], inputs, ["g"])
