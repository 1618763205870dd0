"""The features family (rnn2jax/ops/features.py) against real Caffe2: n-gram ids, dense vectors as id lists,
key splits and the pairwise dot interaction."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, make_op, run_case, run_rnn2jax
from rnn2jax.errors import Rnn2JaxError
from tests.host_differential import check_net, strings_of


def draw_ngram(data):
    n, d = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    columns = data.draw(st.lists(st.integers(0, d - 1), min_size=1, max_size=3))
    limits = [data.draw(st.integers(1, 3)) for _ in columns]
    vals = data.draw(st.lists(st.integers(-2, 3), min_size=sum(limits), max_size=sum(limits)))
    # halves, to exercise rounding half away from zero
    x = np.asarray(data.draw(st.lists(st.integers(-6, 7), min_size=n * d, max_size=n * d)), np.float32) / 2
    op = make_op("NGramFromCategorical", ["x"], ["y"], col_ids=columns, categorical_limits=limits, vals=vals)
    return op, {"x": x.reshape(n, d)}


def draw_dense_to_ids(data):
    x = np.asarray(data.draw(st.lists(st.integers(-4, 4), min_size=6, max_size=6)), np.float32) / 4
    rows = data.draw(st.sampled_from([1, 2, 3, 6]))
    return make_op("DenseVectorToIdList", ["x"], ["lengths", "values"]), {"x": x.reshape(rows, -1)}


def draw_key_split(data):
    limit = data.draw(st.integers(1, 4))
    keys = np.asarray(data.draw(st.lists(st.integers(0, limit - 1), max_size=6)), np.int64)
    return make_op("KeySplit", ["k"], [f"o{i}" for i in range(limit)], categorical_limit=limit), {"k": keys}


def draw_interaction(data):
    count, batch = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    shape = (batch, *data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    inputs = {f"x{i}": data.draw(arrays(shape)) for i in range(count)}
    indices = np.asarray(data.draw(st.lists(st.integers(0, count * count - 1), max_size=5)), np.int32)
    op = make_op("ConcatBatchMatMulBatchGatherOp", ["i", *inputs], ["y"])
    return op, {"i": indices, **inputs}


# Feature maps: N examples, F features, each value array drawn of one of the value types
VALUE_TYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]


def values_of(data, n, dtype):
    return data.draw(arrays((n,), dtype, -9, 9))


def draw_merge_dense(data):
    n, f = data.draw(st.integers(0, 3)), data.draw(st.integers(1, 3))
    dtype = data.draw(st.sampled_from(VALUE_TYPES))
    presence = np.asarray(data.draw(st.lists(st.booleans(), min_size=n * f, max_size=n * f)), bool).reshape(n, f)
    op = make_op("MergeDenseFeatureTensors", ["data", "presence"], ["l", "k", "v"], feature_ids=list(range(10, 10 + f)))
    return op, {"data": data.draw(arrays((n, f), dtype, -9, 9)), "presence": presence}


def draw_merge_single(kind):
    def draw(data):
        n, f = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
        dtype = data.draw(st.sampled_from(VALUE_TYPES[:2]))  # float: the gradient flows
        inputs, names = {}, []
        for i in range(f):
            presence = np.asarray(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
            if kind == "Scalar":
                group = {f"v{i}": values_of(data, n, dtype), f"p{i}": presence}
            else:
                lengths = np.asarray(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), np.int32)
                total = int(lengths[presence].sum())
                group = {f"l{i}": lengths}
                if kind == "Map":
                    group[f"k{i}"] = values_of(data, total, np.int64)
                group[f"v{i}"] = values_of(data, total, dtype)
                group[f"p{i}"] = presence
            inputs.update(group)
            names += list(group)
        outputs = {"Scalar": ["l", "k", "v"], "List": ["l", "k", "vl", "vv"], "Map": ["l", "k", "vl", "vk", "vv"]}[kind]
        op = make_op(f"MergeSingle{kind}FeatureTensors", names, outputs, feature_ids=list(range(20, 20 + f)))
        return op, inputs

    return draw


def draw_merge_multi(kind):
    def draw(data):
        n, f = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
        dtype = data.draw(st.sampled_from(VALUE_TYPES[:2]))
        inputs, names = {}, []
        for i in range(f):
            lengths = np.asarray(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), np.int32)
            features = int(lengths.sum())
            group = {f"l{i}": lengths, f"k{i}": values_of(data, features, np.int64)}
            if kind == "Scalar":
                group[f"v{i}"] = values_of(data, features, dtype)
            else:
                value_lengths = np.asarray(
                    data.draw(st.lists(st.integers(0, 2), min_size=features, max_size=features)), np.int32
                )
                group[f"vl{i}"] = value_lengths
                if kind == "Map":
                    group[f"vk{i}"] = values_of(data, int(value_lengths.sum()), np.int32)
                group[f"vv{i}"] = values_of(data, int(value_lengths.sum()), dtype)
            inputs.update(group)
            names += list(group)
        outputs = {"Scalar": ["l", "k", "v"], "List": ["l", "k", "vl", "vv"], "Map": ["l", "k", "vl", "vk", "vv"]}[kind]
        return make_op(f"MergeMulti{kind}FeatureTensors", names, outputs), inputs

    return draw


CASES = cases(
    Case("MergeDenseFeatureTensors", draw_merge_dense, jit=False),
    *(
        Case(f"MergeSingle{kind}FeatureTensors", draw_merge_single(kind), (f"MergeSingle{kind}FeatureTensorsGradient",))
        for kind in ("Scalar", "List", "Map")
    ),
    *(
        Case(f"MergeMulti{kind}FeatureTensors", draw_merge_multi(kind), (gradient,))
        for kind, gradient in (
            ("Scalar", "MergeMultiScalarFeatureTensorsGradient"),
            ("List", "MergeMultiListFeatureTensorsGradient"),
            ("Map", "MergeMultiMapFeatureTensorsGradient"),
        )
    ),
    Case("NGramFromCategorical", draw_ngram),
    Case("DenseVectorToIdList", draw_dense_to_ids),
    Case("KeySplit", draw_key_split),
    Case("ConcatBatchMatMulBatchGatherOp", draw_interaction),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_refusals(caffe2):
    x = np.ones((2, 3), np.float32)
    keys = {"k": np.array([0, 2, 1], np.int64)}
    for op, inputs in [
        (make_op("NGramFromCategorical", ["x"], ["y"], col_ids=[3], categorical_limits=[1], vals=[1]), {"x": x}),
        (make_op("NGramFromCategorical", ["x"], ["y"], col_ids=[0], categorical_limits=[2], vals=[1]), {"x": x}),
        (make_op("DenseVectorToIdList", ["x"], ["l", "v"]), {"x": x.astype(np.float64)}),
        (make_op("KeySplit", ["k"], ["a", "b"], categorical_limit=2), keys),  # key 2
        (make_op("KeySplit", ["k"], ["a", "b"], categorical_limit=3), keys),  # too few outputs
        (make_op("KeySplit", ["k"], ["a", "b", "c"], categorical_limit=3), {"k": np.array([0], np.int32)}),
        (make_op("ConcatBatchMatMulBatchGatherOp", ["i", "x"], ["y"]), {"i": np.array([0]), "x": x}),
    ]:
        assert check_op(caffe2, op, inputs) is None, op
    with pytest.raises(Rnn2JaxError, match="'i' holds 4"):
        run_rnn2jax(
            [make_op("ConcatBatchMatMulBatchGatherOp", ["i", "x"], ["y"])],
            {"i": np.array([4], np.int32), "x": x},
            ["y"],
        )


@given(data=st.data())
def test_merge_single_scalar_gradient_of_strings_matches_caffe2(caffe2, data):
    """MergeSingleScalarFeatureTensorsGradient on a string values_grad (Caffe2's CPU op is templated on the type):
    each feature's present items get theirs, absent ones b"" (a default std::string). At least one example: with
    none, Caffe2 leaves outputs of no type (not tensors it fetches), as for numbers (draw_merge_single)."""
    n, f = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    inputs = {f"p{i}": np.asarray(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool) for i in range(f)}
    present = int(sum(p.sum() for p in inputs.values()))
    inputs["g"] = strings_of(values_of(data, present, np.int32))
    op = make_op("MergeSingleScalarFeatureTensorsGradient", list(inputs), [f"g{i}" for i in range(f)])
    check_net(caffe2, [op], inputs)
