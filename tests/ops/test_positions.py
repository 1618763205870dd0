"""The positions family (rnn2jax/ops/positions.py) against real Caffe2: the sinusoid position encoding and
the padding past each sequence's end."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, make_op, run_case, run_rnn2jax
from rnn2jax.errors import BadArgumentError


def draw_sinusoid(data):
    m, k = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))  # K = 0: Caffe2 reads past the data
    dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    low = data.draw(st.sampled_from([0, 1]))  # position 0: NaN where Caffe2 takes log 0
    column = np.asarray(data.draw(st.lists(st.integers(low, 50), min_size=m, max_size=m)), dtype)
    positions = np.repeat(column[:, None], k, axis=1)
    args = {}
    if data.draw(st.booleans()):
        args["embedding_size"] = data.draw(st.integers(1, 9))
    if data.draw(st.booleans()):
        args["alpha"] = data.draw(st.sampled_from([2.0, 100.0, 10000.0]))
    if data.draw(st.booleans()):
        args["amplitude"] = data.draw(st.sampled_from([0.5, 2.0]))
    return make_op("SinusoidPositionEncoding", ["p"], ["y"], **args), {"p": positions}


def draw_padding(data):
    n, b, m = (data.draw(st.integers(1, 4)) for _ in range(3))
    x = data.draw(arrays((n, b, m)))
    lengths = np.asarray(data.draw(st.lists(st.integers(0, n), min_size=b, max_size=b)), np.int32)
    return make_op("VariableLengthSequencePadding", ["x", "lengths"], ["x"]), {"x": x, "lengths": lengths}


CASES = cases(
    Case("SinusoidPositionEncoding", draw_sinusoid, rtol=1e-4),
    Case("VariableLengthSequencePadding", draw_padding),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_refusals(caffe2):
    bad = make_op("SinusoidPositionEncoding", ["p"], ["y"])
    for positions in (np.ones(3, np.int32), np.ones((2, 2), np.float32)):
        assert check_op(caffe2, bad, {"p": positions}) is None
    with pytest.raises(BadArgumentError, match="in place"):
        run_rnn2jax(
            [make_op("VariableLengthSequencePadding", ["x", "l"], ["y"])],
            {"x": np.ones((2, 2, 2), np.float32), "l": np.ones(2, np.int32)},
            ["y"],
        )
