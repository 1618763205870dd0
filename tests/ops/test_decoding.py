"""The decoding family (rnn2jax/ops/decoding.py): CTC decoders and the CRF's Viterbi path against real Caffe2
(see tests/differential.py), and the beam search against the reference of Caffe2's own test."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, invalid, make_op, run_case, run_rnn2jax
from rnn2jax.errors import BadArgumentError, Rnn2JaxError, ShapeError


def draw_ctc_inputs(data, low: float = 0.0):
    steps, batch, classes = (data.draw(st.integers(lo, 4)) for lo in (0, 0, 1))
    scores = data.draw(arrays((steps, batch, classes), np.float32, low, 1.0))
    if invalid(data):
        scores = scores.astype(np.float64)
    inputs = {"x": scores}
    if data.draw(st.booleans()):
        high = steps + (1 if invalid(data) else 0)
        inputs["len"] = data.draw(arrays((batch,), np.int32, 0, high))
    return inputs


def draw_greedy(data):
    inputs = draw_ctc_inputs(data, -1.0)
    if "len" in inputs and inputs["len"].size and data.draw(st.booleans()):
        inputs["len"][0] = -1  # Caffe2 decodes nothing for it
    args = {} if data.draw(st.booleans()) else {"merge_repeated": data.draw(st.booleans())}
    return make_op("CTCGreedyDecoder", list(inputs), ["out_len", "values"], **args), inputs


def draw_beam(data):
    inputs = draw_ctc_inputs(data)
    args = {}
    if data.draw(st.booleans()):
        args["beam_width"] = data.draw(st.integers(-1, 4))
    if data.draw(st.booleans()):
        args["num_candidates"] = data.draw(st.integers(0, 3))
    if data.draw(st.booleans()):
        args["prune_threshold"] = data.draw(st.sampled_from([0.0, 0.3, 0.7, 2.0]))
    return make_op("CTCBeamSearchDecoder", list(inputs), ["out_len", "values", "prob"], **args), inputs


def draw_viterbi(data):
    steps, states = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4))
    # few distinct values: ties, which both break towards the lower state
    predictions = data.draw(arrays((steps, states), np.float32, -2, 2)).round(data.draw(st.sampled_from([0, 3])))
    transitions = data.draw(arrays((states, states), np.float32, -2, 2))
    return make_op("ViterbiPath", ["p", "t"], ["path"]), {"p": predictions, "t": transitions}


def draw_swap(data):
    rows, states = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    predictions = data.draw(arrays((rows, states), np.float32, -2, 2)).round(1)
    best = data.draw(arrays((rows,), np.int32, 0, states - 1))
    return make_op("SwapBestPath", ["p", "best"], ["out"]), {"p": predictions, "best": best}


CASES = cases(
    Case("CTCGreedyDecoder", draw_greedy),
    Case("CTCBeamSearchDecoder", draw_beam),
    Case("ViterbiPath", draw_viterbi),
    Case("SwapBestPath", draw_swap),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_refusals_match_caffe2(caffe2):
    """Inputs Caffe2 refuses: rnn2jax refuses them too, naming the op and the blob."""
    x = np.random.default_rng(0).random((2, 2, 3), np.float32)
    for op_type, outputs in (("CTCGreedyDecoder", ["l", "v"]), ("CTCBeamSearchDecoder", ["l", "v", "p"])):
        for inputs in (
            {"x": x, "len": np.array([3, 1], np.int32)},  # longer than max_time
            {"x": x, "len": np.array([1, 1], np.int64)},
            {"x": x[:, :, :0], "len": np.array([1, 1], np.int32)},  # no classes
            {"x": x[0]},
        ):
            assert check_op(caffe2, make_op(op_type, list(inputs), outputs), inputs) is None
    # Caffe2 1.10.2's beam search writes a third output whether or not the op names one
    op = make_op("CTCBeamSearchDecoder", ["x"], ["l", "v"])
    assert check_op(caffe2, op, {"x": x}) is None
    with pytest.raises(BadArgumentError, match="OUTPUT_PROB"):
        run_rnn2jax([op], {"x": x}, ["l", "v"])
    p, t = np.zeros((2, 2), np.float32), np.zeros((3, 3), np.float32)
    assert check_op(caffe2, make_op("ViterbiPath", ["p", "t"], ["y"]), {"p": p, "t": t}) is None
    assert check_op(caffe2, make_op("ViterbiPath", ["p", "t"], ["y"]), {"p": p[0], "t": t}) is None


def test_undefined_inputs_are_refused():
    """Inputs Caffe2 reads out of bounds for (or crashes on): rnn2jax refuses them."""
    x = np.zeros((2, 2, 3), np.float32)
    beam = make_op("CTCBeamSearchDecoder", ["x", "len"], ["l", "v", "p"])
    with pytest.raises(ShapeError, match="negative length"):
        run_rnn2jax([beam], {"x": x, "len": np.array([-1, 1], np.int32)}, ["l"], jit=False)
    with pytest.raises(ShapeError, match="'len' has 1 lengths for a batch of 2"):
        run_rnn2jax([beam], {"x": x, "len": np.array([1], np.int32)}, ["l"], jit=False)
    with pytest.raises(BadArgumentError, match="num_candidates"):
        run_rnn2jax([make_op("CTCBeamSearchDecoder", ["x"], ["l", "v", "p"], num_candidates=-1)], {"x": x}, ["l"])
    viterbi = make_op("ViterbiPath", ["p", "t"], ["y"])
    with pytest.raises(ShapeError, match="no rows"):  # Caffe2 dies of a division by zero
        run_rnn2jax([viterbi], {"p": np.zeros((0, 3), np.float32), "t": np.zeros((3, 3), np.float32)}, ["y"])
    with pytest.raises(ShapeError, match=r"transitions 't' must be \[3, 3\]"):
        run_rnn2jax([viterbi], {"p": np.zeros((2, 3), np.float32), "t": np.zeros((3, 4), np.float32)}, ["y"])
    swap = make_op("SwapBestPath", ["p", "best"], ["y"])
    with pytest.raises(ShapeError, match="empty"):  # Caffe2 dies of a division by zero
        run_rnn2jax([swap], {"p": np.zeros((0, 3), np.float32), "best": np.zeros(0, np.int32)}, ["y"])
    inputs = {"p": np.zeros((2, 3), np.float32), "best": np.array([0, 3], np.int32)}
    for jit in (True, False):
        with pytest.raises(Rnn2JaxError, match=r"SwapBestPath.*'best' holds index 3"):
            run_rnn2jax([swap], inputs, ["y"], jit=jit)


def beam_reference(inputs, seq_len, beam_width, num_candidates, threshold=0.001):
    """The reference of Caffe2's ctc_beam_search_decoder_op_test.py (in float64)."""
    _, batch, classes = inputs.shape
    output_len = np.zeros(batch * num_candidates, np.int32)
    output_prob = np.zeros(batch * num_candidates, np.float32)
    values = []
    for i in range(batch):
        pb, pnb = defaultdict(Counter), defaultdict(Counter)
        pb[0][()], pnb[0][()] = 1, 0
        beam = [()]
        ctc = np.vstack((np.zeros(classes), inputs[:, i, :]))
        for t in range(1, seq_len[i] + 1):
            for prefix in beam:
                for c in np.where(ctc[t] > threshold)[0]:
                    if c == 0:
                        pb[t][prefix] += ctc[t][c] * (pb[t - 1][prefix] + pnb[t - 1][prefix])
                        continue
                    extended = (*prefix, c)
                    if prefix and c == prefix[-1]:
                        pnb[t][extended] += ctc[t][c] * pb[t - 1][prefix]
                        pnb[t][prefix] += ctc[t][c] * pnb[t - 1][prefix]
                    else:
                        pnb[t][extended] += ctc[t][c] * (pb[t - 1][prefix] + pnb[t - 1][prefix])
                    if extended not in beam:
                        pb[t][extended] += ctc[t][0] * (pb[t - 1][extended] + pnb[t - 1][extended])
                        pnb[t][extended] += ctc[t][c] * pnb[t - 1][extended]
            ranked = pb[t] + pnb[t]
            beam = sorted(ranked, key=ranked.get, reverse=True)[:beam_width]
        for j, prefix in enumerate(beam[:num_candidates]):
            values.extend(prefix)
            output_len[i * num_candidates + j] = len(prefix)
            output_prob[i * num_candidates + j] = ranked[prefix]
    return output_len, np.array(values, np.int32), output_prob


@given(data=st.data())
def test_beam_search_matches_caffe2_test_reference(data):
    steps, batch, classes = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.random((steps, batch, classes), dtype=np.float32)
    lengths = rng.integers(1, steps + 1, batch).astype(np.int32)
    width, candidates = data.draw(st.sampled_from([1, 2, 16])), data.draw(st.integers(1, 2))
    candidates = min(candidates, width)
    op = make_op("CTCBeamSearchDecoder", ["x", "len"], ["l", "v", "p"], beam_width=width, num_candidates=candidates)
    got = run_rnn2jax([op], {"x": x, "len": lengths}, ["l", "v", "p"], jit=False)
    want_len, want_values, want_prob = beam_reference(x, lengths, width, candidates)
    np.testing.assert_array_equal(got["l"], want_len)
    np.testing.assert_array_equal(got["v"], want_values)
    np.testing.assert_allclose(got["p"], want_prob, rtol=1e-4)
