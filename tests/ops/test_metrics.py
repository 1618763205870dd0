"""The metrics family (rnn2jax/ops/metrics.py) against real Caffe2: LambdaRankNdcg with its gradient, and
APMeter, a host op whose buffer lives with its net: its net runs several times in real Caffe2 and in an
rnn2jax Workspace, compared after each run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from differential import Case, arrays, assert_blobs_equal, cases, check_op, make_op, run_case, run_rnn2jax
from rnn2jax.caffe2.opdef import create_net
from rnn2jax.errors import ShapeError


def draw_lambda_rank(data):
    sessions = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    if data.draw(st.booleans()):
        sessions.insert(data.draw(st.integers(0, len(sessions) - 1)), 0)  # an empty session (not last)
    n = sum(sessions)
    y = data.draw(arrays((n,), np.float32, -2, 2))
    r = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.float32)
    args = {
        name: data.draw(st.booleans())
        for name in ("use_ndcg_as_loss", "use_idcg_normalization", "use_exp_gain")
        if data.draw(st.booleans())
    }
    op = make_op("LambdaRankNdcg", ["y", "r", "sessions"], ["loss", "dy"], **args)
    return op, {"y": y, "r": r, "sessions": np.asarray(sessions, np.int32)}


def draw_apmeter(data):
    classes = data.draw(st.integers(1, 3))
    runs = []
    for _ in range(data.draw(st.integers(1, 3))):
        n = data.draw(st.integers(1, 5))
        scores = np.asarray(
            data.draw(st.lists(st.integers(0, 4), min_size=n * classes, max_size=n * classes)), np.float32
        )
        labels = np.asarray(
            data.draw(st.lists(st.integers(0, 1), min_size=n * classes, max_size=n * classes)), np.int32
        )
        runs.append((scores.reshape(n, classes) / 4, labels.reshape(n, classes)))
    args = {"buffer_size": data.draw(st.integers(1, 8))} if data.draw(st.booleans()) else {}
    return make_op("APMeter", ["p", "l"], ["ap"], **args), {"runs": runs}


CASES = cases(
    Case("LambdaRankNdcg", draw_lambda_rank, gradient_ops=("LambdaRankNdcgGradient",), rtol=1e-4),
    Case("APMeter", draw_apmeter, jit=False, note="host op, buffer kept between runs"),
)


def check_apmeter(caffe2, op, inputs):
    net = create_net("ap", [op])
    first = inputs["runs"][0]
    workspace = rnn2jax.Workspace()
    workspace.feed("p", first[0])
    workspace.feed("l", first[1])
    workspace.create_net(net)
    caffe2.run([("create_net", net)], {"p": first[0], "l": first[1]}, [], workspace="ap", reset=True)
    for scores, labels in inputs["runs"]:
        want = caffe2.run([("run_net", "ap")], {"p": scores, "l": labels}, ["ap"], workspace="ap", reset=False)
        workspace.feed("p", scores)
        workspace.feed("l", labels)
        workspace.run_net("ap")
        assert_blobs_equal({"ap": np.asarray(workspace.fetch("ap"))}, want)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type == "APMeter":
        check_apmeter(caffe2, *case.draw(data))
    else:
        run_case(caffe2, case, data)


def test_refusals(caffe2):
    y = np.ones(5, np.float32)
    op = make_op("LambdaRankNdcg", ["y", "r", "s"], ["loss", "dy"])
    # a session starting at the end of the data
    assert check_op(caffe2, op, {"y": y, "r": y, "s": np.asarray([5, 0], np.int32)}) is None
    # Caffe2 reads past the data for a last session that overruns it; rnn2jax refuses it
    for sessions in ([2, 4], [6]):
        with pytest.raises(ShapeError, match="do not fit the 5 predictions"):
            run_rnn2jax([op], {"y": y, "r": y, "s": np.asarray(sessions, np.int32)}, ["loss", "dy"])
