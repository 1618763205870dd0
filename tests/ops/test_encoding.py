"""The encoding family (rnn2jax/ops/encoding.py): PiecewiseLinearTransform and SinusoidPositionEncoding against
real Caffe2 (see tests/differential.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, invalid, make_op, run_case, run_rnn2jax
from rnn2jax.errors import BadArgumentError


def draw_piecewise(data):
    binary = data.draw(st.booleans())
    groups = 1 if binary else data.draw(st.integers(1, 3))
    pieces = data.draw(st.integers(1, 4))
    bounds = np.sort(data.draw(arrays((groups, pieces + 1), np.float32, -1, 1)), axis=1)
    slopes = data.draw(arrays((groups, pieces), np.float32, -2, 2))
    intercepts = data.draw(arrays((groups, pieces), np.float32, -2, 2))
    rows = data.draw(st.integers(0, 4))
    if binary:
        shape = data.draw(st.sampled_from([(rows,), (rows, 1), (rows, 2)]))
    else:
        shape = (rows, groups + (1 if invalid(data) else 0))
    # values at the bounds too: they pick the piece std::lower_bound gives them
    x = data.draw(arrays(shape, np.float32, -1.5, 1.5))
    if x.size and data.draw(st.booleans()):
        x.reshape(-1)[0] = bounds[0, min(1, pieces)]
    args = {"binary": 1} if binary else {}
    if data.draw(st.booleans()):
        args.update(
            bounds=bounds.ravel().tolist(), slopes=slopes.ravel().tolist(), intercepts=intercepts.ravel().tolist()
        )
        return make_op("PiecewiseLinearTransform", ["x"], ["y"], **args), {"x": x}
    inputs = {"x": x, "bounds": bounds, "slopes": slopes, "intercepts": intercepts}
    return make_op("PiecewiseLinearTransform", list(inputs), ["y"], **args), inputs


def draw_sinusoid(data):
    rows, k = data.draw(st.integers(0, 5)), data.draw(st.integers(1, 4))
    dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    positions = data.draw(arrays((rows, k), dtype, 1, 10))
    args = {}
    if data.draw(st.booleans()):
        args["embedding_size"] = data.draw(st.integers(1, 20))
    if data.draw(st.booleans()):
        args["alpha"] = data.draw(st.floats(5000.0, 20000.0, width=32))
    if data.draw(st.booleans()):
        args["amplitude"] = data.draw(st.sampled_from([0.125, 1.0, 3.5, 10.0]))
    return make_op("SinusoidPositionEncoding", ["positions"], ["y"], **args), {"positions": positions}


CASES = cases(
    Case("PiecewiseLinearTransform", draw_piecewise),
    Case("SinusoidPositionEncoding", draw_sinusoid, rtol=1e-5),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_refusals(caffe2):
    x = np.zeros((2, 1), np.float32)
    args = {"bounds": [0.0, 1.0], "slopes": [1.0], "intercepts": [0.0]}
    for bad in (
        {"bounds": [1.0, 0.0], "slopes": [1.0], "intercepts": [0.0]},  # not sorted
        {"bounds": [0.0, 1.0], "slopes": [1.0]},  # not all set
        {"bounds": [0.0, 1.0], "slopes": [1.0, 2.0], "intercepts": [0.0, 1.0]},  # no group
    ):
        assert check_op(caffe2, make_op("PiecewiseLinearTransform", ["x"], ["y"], **bad), {"x": x}) is None
    assert check_op(caffe2, make_op("PiecewiseLinearTransform", ["x"], ["y"], **args), {"x": x[:, 0]}) is None
    assert check_op(caffe2, make_op("PiecewiseLinearTransform", ["x"], ["y"], binary=1, **args), {"x": x[0, :0]})
    positions = {"positions": np.ones((2, 2, 2), np.int32)}
    assert check_op(caffe2, make_op("SinusoidPositionEncoding", ["positions"], ["y"]), positions) is None
    with pytest.raises(BadArgumentError, match="takes 1 input"):
        run_rnn2jax([make_op("PiecewiseLinearTransform", ["x", "b", "s", "i"], ["y"], **args)], {}, ["y"])
