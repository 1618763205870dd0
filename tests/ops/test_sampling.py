"""The sampling family (rnn2jax/ops/sampling.py) against real Caffe2. Draws never match Caffe2's, so each
case compares shapes and dtypes exactly and checks, of both Caffe2's and rnn2jax's outputs, the properties
every draw has: an index of positive weight (or 0 for a row of zeros), the sampled value at that index,
each value or example kept or replaced. Ratios 0 and 1 draw nothing, so there the outputs match exactly.
SparseDropoutWithReplacement is a host op (its output length depends on its draws)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from differential import Case, cases, check_op, make_op, run_rnn2jax
from rnn2jax.caffe2.opdef import create_net
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import Rnn2JaxError


def draw_weighted_sample(data):
    batch, width = data.draw(st.integers(0, 4)), data.draw(st.integers(1, 4))
    weights = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=batch * width, max_size=batch * width)))
    inputs = {"w": weights.reshape(batch, width).astype(np.float32)}
    if data.draw(st.booleans()):
        inputs["v"] = np.arange(batch * width, dtype=np.float32).reshape(batch, width) + 0.5
    return make_op("WeightedSample", list(inputs), ["i", "o"][: len(inputs)]), inputs


def draw_multi_sampling(data):
    steps = np.asarray(data.draw(st.lists(st.integers(0, 3), max_size=5)), np.float32)
    inputs = {"cdf": np.cumsum(steps).astype(np.float32)}
    if steps.size and steps.sum() == 0:
        inputs["cdf"][-1] = 1.0
    if data.draw(st.booleans()):
        inputs["shape"] = np.zeros(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=2)), np.float32)
        return make_op("WeightedMultiSampling", ["cdf", "shape"], ["i"]), inputs
    return make_op("WeightedMultiSampling", ["cdf"], ["i"], num_samples=data.draw(st.integers(0, 5))), inputs


def draw_sparse(op_type):
    def draw(data):
        lengths = np.asarray(data.draw(st.lists(st.integers(0, 3), max_size=4)), np.int32)
        x = np.arange(10, 10 + lengths.sum(), dtype=np.int64)
        ratio = data.draw(st.sampled_from([0.0, 1.0, 0.5]))
        op = make_op(op_type, ["x", "lengths"], ["y", "out_lengths"], ratio=ratio, replacement_value=-1)
        return op, {"x": x, "lengths": lengths}

    return draw


CASES = cases(
    Case("WeightedSample", draw_weighted_sample, note="random: shape, dtype and the sampled index's properties"),
    Case("WeightedMultiSampling", draw_multi_sampling, note="random: shape, dtype and the index's properties"),
    Case("SparseItemwiseDropoutWithReplacement", draw_sparse("SparseItemwiseDropoutWithReplacement"), note="random"),
    Case("SparseDropoutWithReplacement", draw_sparse("SparseDropoutWithReplacement"), jit=False, note="random host op"),
)


def run_workspace(op, inputs):
    workspace = rnn2jax.Workspace()
    for name, value in inputs.items():
        workspace.feed(name, value)
    workspace.run(create_net("sampling", [op]))
    return {name: np.asarray(workspace.fetch(name)) for name in op.output}


def check_draws(op, inputs, outputs):
    """What holds of every draw of `op`, for Caffe2's outputs and rnn2jax's alike."""
    if op.type == "WeightedSample":
        w = inputs["w"]
        index = outputs["i"]
        if w.size == 0:
            assert index.shape == (0,)
            return
        assert index.shape == (w.shape[0], 1)
        for row, (i,) in enumerate(index):
            assert 0 <= i < w.shape[1] and (w[row, i] > 0 or w[row].sum() == 0), (w[row], i)
            if "o" in outputs:
                assert outputs["o"][row, 0] == inputs["v"][row, i]
    elif op.type == "WeightedMultiSampling":
        cdf = inputs["cdf"]
        index = outputs["i"]
        if cdf.size == 0:
            assert index.shape == (0,)
            return
        steps = np.diff(cdf, prepend=0)
        assert index.size == 0 or (index.min() >= 0 and index.max() < cdf.size and (steps[index] > 0).all())
    else:
        x, lengths, ratio = inputs["x"], inputs["lengths"], next(a.f for a in op.arg if a.name == "ratio")
        y, out_lengths = outputs["y"], outputs["out_lengths"]
        if op.type == "SparseItemwiseDropoutWithReplacement":
            np.testing.assert_array_equal(out_lengths, lengths)
            assert ((y == x) | (y == -1)).all()
            expected = {0.0: x, 1.0: np.full_like(x, -1)}.get(ratio)
        else:
            start, at = 0, 0
            for n, m in zip(lengths, out_lengths, strict=True):
                kept = m == n and (n != 1 or y[at] == x[start])
                assert kept or (m == 1 and y[at] == -1)
                start, at = start + n, at + m
            assert at == y.size
            expected = {0.0: x, 1.0: np.full(lengths.size, -1, np.int64)}.get(ratio)
        if expected is not None:  # nothing random: exactly this
            np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    op, inputs = case.draw(data)
    want = caffe2.run_op(op, inputs)
    if case.op_type == "SparseDropoutWithReplacement":
        got = run_workspace(op, inputs)
    else:
        got = run_rnn2jax([op], inputs, list(op.output), jit=case.jit)
    for name in op.output:
        assert got[name].dtype == want[name].dtype, (name, got[name].dtype, want[name].dtype)
        if case.op_type != "SparseDropoutWithReplacement" or name == "out_lengths":
            assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
    check_draws(op, inputs, want)
    check_draws(op, inputs, got)


def test_refusals(caffe2):
    w = np.ones((2, 2), np.float32)
    for op, inputs in [
        (make_op("WeightedSample", ["w", "v"], ["i"]), {"w": w, "v": w}),
        (make_op("WeightedSample", ["w", "v"], ["i", "o"]), {"w": w, "v": np.ones((2, 3), np.float32)}),
        (make_op("WeightedMultiSampling", ["c", "s"], ["i"], num_samples=2), {"c": w[0], "s": w}),
        (make_op("WeightedMultiSampling", ["c"], ["i"], num_samples=2), {"c": w}),
        (
            make_op("SparseItemwiseDropoutWithReplacement", ["x", "l"], ["y", "m"], ratio=0.5),
            {"x": np.arange(3), "l": np.array([2], np.int32)},
        ),
    ]:
        assert check_op(caffe2, op, inputs) is None, op
    op = make_op("SparseDropoutWithReplacement", ["x", "l"], ["y", "m"], ratio=0.5)
    inputs = {"x": np.arange(3), "l": np.array([2], np.int32)}
    with pytest.raises(Caffe2Error):
        caffe2.run_op(op, inputs)
    with pytest.raises(Rnn2JaxError, match="Number of elements"):
        run_workspace(op, inputs)
