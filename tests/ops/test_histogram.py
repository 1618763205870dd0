"""The histogram family (rnn2jax/ops/histogram.py) against real Caffe2: histograms, quantiles, percentile
maps and calibration transforms. AccumulateHistogram is a host op whose running histogram lives with its
net: it is run several times in real Caffe2 and in an rnn2jax Workspace and compared after each run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from differential import Case, assert_blobs_equal, cases, check_op, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.caffe2.opdef import create_net
from rnn2jax.errors import BadArgumentError, InputTypeError, Rnn2JaxError

# Values on a coarse grid, so that they hit bin edges, samples and thresholds exactly.
grid = st.integers(-8, 8).map(lambda v: v / 4)


def grid_array(data, shape, dtype=np.float32):
    return np.asarray(
        data.draw(st.lists(grid, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))), dtype
    ).reshape(shape)


def float_inputs(data, min_count=1, max_count=3, min_side=0):
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    count = data.draw(st.integers(min_count, max_count))
    return {
        f"x{i}": grid_array(data, data.draw(shapes(1, 2, min_side=min_side, max_side=4)), dtype) for i in range(count)
    }


def draw_histogram(data):
    inputs = float_inputs(data)
    edges = sorted(set(data.draw(st.lists(grid, min_size=2, max_size=6))))
    if len(edges) < 2 or data.draw(st.integers(0, 9)) == 0:  # refused: too few edges, or not increasing
        edges = edges[:1] if len(edges) < 2 else edges[::-1]
    return make_op("Histogram", list(inputs), ["h"], bin_edges=[float(e) for e in edges]), inputs


def draw_self_binning(data):
    inputs = float_inputs(data)
    args = {"num_bins": data.draw(st.integers(1, 5))}
    if data.draw(st.booleans()):
        args["bin_spacing"] = data.draw(st.sampled_from(["linear", "logarithmic"]))
    if data.draw(st.booleans()):
        args["abs"] = data.draw(st.booleans())
    if args.get("bin_spacing") == "logarithmic" and data.draw(st.booleans()):
        args["logspace_start"] = data.draw(st.sampled_from([1e-3, 0.25, 1.0]))
    return make_op("SelfBinningHistogram", list(inputs), ["values", "counts"], **args), inputs


def draw_quantile(data):
    inputs = float_inputs(data, min_side=1)
    args = {"quantile": data.draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]))}
    if data.draw(st.booleans()):
        args["abs"] = data.draw(st.booleans())
    if data.draw(st.booleans()):
        args["tol"] = data.draw(st.sampled_from([1e-2, 1e-3, 1e-4]))
    return make_op("Quantile", list(inputs), ["q"], **args), inputs


def sorted_samples(data, lengths):
    values, pcts = [], []
    for n in lengths:
        column = sorted(set(data.draw(st.lists(grid, min_size=n, max_size=n, unique=True))))
        values += column
        pcts += sorted(data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)))
    return np.asarray(values, np.float32), np.asarray(pcts, np.float32) / 100


def draw_percentile(data):
    n, m = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    lengths = data.draw(st.lists(st.integers(0, 4), min_size=m, max_size=m))
    values, pcts = sorted_samples(data, lengths)
    pairs = np.stack([values, pcts], axis=1).reshape(-1, 2).astype(np.float32)
    lengths = np.asarray(lengths, np.int32)
    if data.draw(st.integers(0, 9)) == 0:
        lengths[0] += 1  # refused: the lengths do not add up to the samples
    return make_op("Percentile", ["x", "pairs", "lengths"], ["y"]), {
        "x": grid_array(data, (n, m)),
        "pairs": pairs,
        "lengths": lengths,
    }


def draw_bisect(data):
    m = data.draw(st.integers(1, 3))
    lengths = data.draw(st.lists(st.integers(1, 5), min_size=m, max_size=m))
    raw, mapping = sorted_samples(data, lengths)
    lengths = [int(n) for n in lengths]
    lengths = [len(raw) - sum(lengths[1:]), *lengths[1:]]  # after dropping duplicates
    lower = np.clip(mapping - 0.05, 0, 1)
    upper = np.clip(mapping + 0.05, 0, 1)
    op = make_op(
        "BisectPercentile",
        ["x"],
        ["y"],
        percentile_raw=raw.tolist(),
        percentile_mapping=mapping.tolist(),
        percentile_lower=lower.tolist(),
        percentile_upper=upper.tolist(),
        lengths=lengths,
    )
    return op, {"x": grid_array(data, (data.draw(st.integers(1, 4)), m))}


def draw_piecewise(data):
    binary = data.draw(st.booleans())
    groups = 1 if binary else data.draw(st.integers(1, 3))
    pieces = data.draw(st.integers(1, 3))
    bounds = np.concatenate(
        [sorted(data.draw(st.lists(grid, min_size=pieces + 1, max_size=pieces + 1))) for _ in range(groups)]
    ).astype(np.float32)
    slopes = grid_array(data, (groups * pieces,))
    intercepts = grid_array(data, (groups * pieces,))
    shape = data.draw(st.sampled_from([(3,), (3, 1), (2, 2)])) if binary else (data.draw(st.integers(1, 4)), groups)
    x = grid_array(data, shape)
    args = {"binary": True} if binary else {}
    if data.draw(st.booleans()):
        op = make_op(
            "PiecewiseLinearTransform",
            ["x"],
            ["y"],
            bounds=bounds.tolist(),
            slopes=slopes.tolist(),
            intercepts=intercepts.tolist(),
            **args,
        )
        return op, {"x": x}
    op = make_op("PiecewiseLinearTransform", ["x", "b", "s", "i"], ["y"], **args)
    return op, {"x": x, "b": bounds, "s": slopes, "i": intercepts}


def draw_stump(data):
    args = {name: data.draw(grid) for name in ("threshold", "low_value", "high_value") if data.draw(st.booleans())}
    return make_op("StumpFunc", ["x"], ["y"], **args), {"x": grid_array(data, data.draw(shapes(0, 3, min_side=0)))}


def draw_stump_index(data):
    args = {"threshold": data.draw(grid)} if data.draw(st.booleans()) else {}
    x = grid_array(data, data.draw(shapes(1, 3, min_side=0)))
    return make_op("StumpFuncIndex", ["x"], ["low", "high"], **args), {"x": x}


def draw_accumulate(data):
    low = data.draw(grid)
    args = {
        "lower_bound": low,
        "upper_bound": low + data.draw(st.sampled_from([0.25, 1.0, 1.5])),
        "num_buckets": data.draw(st.integers(1, 4)),
    }
    runs = [grid_array(data, data.draw(shapes(1, 2, min_side=0))) for _ in range(data.draw(st.integers(1, 3)))]
    return make_op("AccumulateHistogram", ["x"], ["current", "total"], **args), {"runs": runs}


CASES = cases(
    Case("Histogram", draw_histogram),
    Case("SelfBinningHistogram", draw_self_binning),
    Case("Quantile", draw_quantile),
    Case("Percentile", draw_percentile),
    Case("BisectPercentile", draw_bisect),
    Case("PiecewiseLinearTransform", draw_piecewise),
    Case("StumpFunc", draw_stump),
    Case("StumpFuncIndex", draw_stump_index),
    Case("AccumulateHistogram", draw_accumulate, jit=False, note="host op, state kept between runs"),
)


def check_accumulate(caffe2, op, inputs):
    """Run the op's net several times in both, one workspace each, comparing both outputs after each run."""
    net = create_net("acc", [op])
    workspace = rnn2jax.Workspace()
    workspace.feed("x", inputs["runs"][0])
    workspace.create_net(net)
    caffe2.run([("create_net", net)], {"x": inputs["runs"][0]}, [], workspace="acc", reset=True)
    for x in inputs["runs"]:
        want = caffe2.run([("run_net", "acc")], {"x": x}, ["current", "total"], workspace="acc", reset=False)
        workspace.feed("x", x)
        workspace.run_net("acc")
        assert_blobs_equal({name: np.asarray(workspace.fetch(name)) for name in want}, want)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type == "AccumulateHistogram":
        check_accumulate(caffe2, *case.draw(data))
    else:
        run_case(caffe2, case, data)


def test_refusals(caffe2):
    """Where Caffe2 refuses, rnn2jax refuses too (naming the op and blob)."""
    x = {"x": np.ones((2, 2), np.float32)}
    for op, inputs in [
        (make_op("Histogram", ["x", "y"], ["h"], bin_edges=[0.0, 1.0]), {"x": x["x"], "y": np.ones(2)}),
        (make_op("Histogram", ["x"], ["h"], bin_edges=[0.0, 1.0]), {"x": np.ones(2, np.int32)}),
        (make_op("SelfBinningHistogram", ["x"], ["v", "c"], num_bins=0), x),
        (make_op("SelfBinningHistogram", ["x"], ["v", "c"], num_bins=2, bin_spacing="cubic"), x),
        (make_op("Quantile", ["x"], ["q"]), x),  # no quantile
        (make_op("Quantile", ["x"], ["q"], quantile=0.5), {"x": np.zeros(0, np.float32)}),
        (make_op("StumpFunc", ["x"], ["y"]), {"x": np.ones(2)}),
        (make_op("PiecewiseLinearTransform", ["x"], ["y"], bounds=[0.0, 1.0], slopes=[1.0]), x),
        (
            make_op("PiecewiseLinearTransform", ["x"], ["y"], bounds=[1.0, 0.0], slopes=[1.0], intercepts=[0.0]),
            {"x": np.ones((2, 1), np.float32)},
        ),
        (
            make_op(
                "BisectPercentile",
                ["x"],
                ["y"],
                percentile_raw=[0.0],
                percentile_mapping=[0.5],
                percentile_lower=[0.5],
                percentile_upper=[0.5],
                lengths=[2],
            ),
            x,
        ),
    ]:
        assert check_op(caffe2, op, inputs, jit=False) is None, op.type
    with pytest.raises(InputTypeError, match="'y'"):
        run_rnn2jax([make_op("Histogram", ["x", "y"], ["h"], bin_edges=[0.0, 1.0])], {**x, "y": np.ones(2)}, ["h"])
    with pytest.raises(BadArgumentError, match="bin_edges"):
        run_rnn2jax([make_op("Histogram", ["x"], ["h"], bin_edges=[1.0, 0.0])], x, ["h"])
    accumulate = make_op("AccumulateHistogram", ["x"], ["c", "a"], num_buckets=0)
    with pytest.raises(Rnn2JaxError, match="num_buckets"):
        workspace = rnn2jax.Workspace()
        workspace.feed("x", x["x"])
        workspace.run(create_net("n", [accumulate]))
