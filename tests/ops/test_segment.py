"""The segment family (rnn2jax/ops/segment.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: Segment reductions beyond the differential tests: each gradient op agrees
with `jax.vjp` of its forward op (ties broken apart, where Caffe2's Max gradient goes to every tied row), and
segment ids whose values decide the output shape are refused when traced (caffe2/operators/segment_reduction_op.h).

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the segment reductions
(SortedSegmentRange*, {Sorted,Unsorted}Segment*, their Sparse* forms, Lengths*, ReduceFrontWeightedSum), their
gradient ops, and the lengths / segment-id conversions against real Caffe2 (see tests/differential.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, invalid, make_op, run_case, shapes
from helpers import forward, run_op
from rnn2jax.errors import ShapeError

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_segment.py)

SEEDS = st.integers(0, 2**32 - 1)
# Fixed shapes (values vary with the seed): each op compiles once, eagerly and under jit.
IDS = np.array([0, 0, 1, 2, 2, 2], np.int32)
LENGTHS = np.array([2, 0, 1, 3], np.int32)


def rand(seed: int, shape) -> np.ndarray:
    """Distinct values (no ties), so that a max has one arg max."""
    rng = np.random.default_rng(seed)
    return (rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0 - 1.0).astype(np.float32)


def vjp(op_type, inputs, grad, wrt=(0,), **args):
    """The gradient of `op_type`'s output w.r.t. inputs `wrt`, by jax.vjp of its lowering."""
    fn = forward(op_type, len(inputs), **args)

    def f(*diff):
        full = list(inputs)
        for i, x in zip(wrt, diff, strict=True):
            full[i] = x
        return fn(*full)[0]

    _, back = jax.vjp(f, *(jnp.asarray(inputs[i]) for i in wrt))
    return [np.asarray(g) for g in back(jnp.asarray(grad))]


@pytest.mark.parametrize("reducer", ["Sum", "Mean", "Max", "LogSumExp", "LogMeanExp"])
@given(seed=SEEDS)
def test_sorted_segment_range_gradients_are_vjps(reducer, seed):
    ids = IDS
    x = rand(seed, (ids.size, 2))
    (y,) = run_op(f"SortedSegmentRange{reducer}", [x, ids], jit=False)
    grad = rand(seed + 1, y.shape)
    (got,) = run_op(f"SortedSegmentRange{reducer}Gradient", [x, y, grad, ids], jit=False)
    (want,) = vjp(f"SortedSegmentRange{reducer}", [x, ids], grad)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["SortedSegment", "UnsortedSegment"])
@pytest.mark.parametrize("reducer", ["Sum", "Mean", "WeightedSum"])
@given(seed=SEEDS)
def test_segment_gradients_are_vjps(layout, reducer, seed):
    ids = IDS
    if layout == "UnsortedSegment":
        ids = np.random.default_rng(seed).permutation(ids)
    x = rand(seed, (ids.size, 3))
    scalars = [rand(seed + 2, (ids.size,))] if reducer == "WeightedSum" else []
    op_type = f"{layout}{reducer}"
    (y,) = run_op(op_type, [x, *scalars, ids], jit=False)
    grad = rand(seed + 1, y.shape)
    (got,) = run_op(f"{op_type}Gradient", [*scalars, grad, ids], jit=False)
    (want,) = vjp(op_type, [x, *scalars, ids], grad)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@given(seed=SEEDS)
def test_lengths_gradients_are_vjps(seed):
    lengths = LENGTHS
    n = int(lengths.sum())
    x, w = rand(seed, (n, 2)), rand(seed + 2, (n,))
    grad = rand(seed + 1, (lengths.size, 2))
    (y,) = run_op("LengthsMax", [x, lengths], jit=False)
    (got,) = run_op("LengthsMaxWithMainInputAndForwardOutputGradient", [y, grad, lengths, x], jit=False)
    np.testing.assert_allclose(got, vjp("LengthsMax", [x, lengths], grad)[0], rtol=1e-6)
    got_x, got_w = run_op("LengthsWeightedSumWithMainInputGradient", [w, grad, lengths, x], 2, jit=False)
    want_x, want_w = vjp("LengthsWeightedSum", [x, w, lengths], grad, wrt=(0, 1))
    np.testing.assert_allclose(got_x, want_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    (plain,) = run_op("LengthsWeightedSumGradient", [w, grad, lengths], jit=False)
    np.testing.assert_array_equal(plain, got_x)


@pytest.mark.parametrize("num", [0, 1, 2, 3])
@given(seed=SEEDS)
def test_reduce_front_weighted_sum_gradient_is_a_vjp(num, seed):
    shape = (2, 3, 2)
    x, w = rand(seed, shape), rand(seed + 2, shape[:num])
    (y,) = run_op("ReduceFrontWeightedSum", [x, w], jit=False, num_reduce_dim=num)
    grad = rand(seed + 1, y.shape)
    dims = np.asarray(shape, np.int64)
    (got,) = run_op("ReduceFrontWeightedSumGradient", [w, grad, dims], jit=False, num_reduce_dim=num)
    np.testing.assert_allclose(got, vjp("ReduceFrontWeightedSum", [x, w], grad, num_reduce_dim=num)[0], rtol=1e-6)


@pytest.mark.parametrize("op_type", ["SortedSegmentRangeMax", "SortedSegmentSum", "UnsortedSegmentMean"])
def test_traced_segment_ids_are_refused(op_type):
    """The number of segments comes from the ids' values: under the user's own jax.jit they are traced."""
    x, ids = np.ones((3, 2), np.float32), np.array([0, 0, 1], np.int32)
    with pytest.raises(ShapeError, match=rf"{op_type}.*'x1'.*traced"):
        run_op(op_type, [x, ids], jit=True)
    (y,) = run_op(op_type, [x, ids], jit=False)
    assert y.shape == (2, 2)


def test_traced_lengths_are_checked_when_the_net_runs():
    """LENGTHS only decide values: under jit the lengths' total is checked by the compiled net."""
    import rnn2jax
    from rnn2jax.caffe2.opdef import create_net, create_operator

    net = create_net("n", [create_operator("LengthsMax", ["x", "lengths"], ["y"])])
    fn = rnn2jax.compile(net, outputs=["y"])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(fn({"x": x, "lengths": np.array([1, 0, 2], np.int32)})["y"], [[0, 1], [0, 0], [4, 5]])
    with pytest.raises(ShapeError, match="sum to 4"):
        fn({"x": x, "lengths": np.array([2, 0, 2], np.int32)})


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_segment.py)

RANGE = ("Sum", "Mean", "Max", "LogSumExp", "LogMeanExp")
REDUCERS = ("Sum", "Mean", "WeightedSum")
INDEX_TYPES = (np.int32, np.int64)
LAYOUTS = ("SortedSegment", "UnsortedSegment", "SparseSortedSegment", "SparseUnsortedSegment")


def block(data):
    """The dims of one row: none, or up to two small ones."""
    return data.draw(shapes(0, 2, min_side=1, max_side=3))


def floats(data, shape, ties: bool = False):
    """Floats in [-1, 1]; with `ties` often rounded to halves, so that maxima repeat. Subnormals are drawn
    as 0: XLA on CPU treats them as 0 (so a subnormal max equals a 0 row), Caffe2's comparisons do not."""
    x = data.draw(arrays(shape, np.float32))
    x[np.abs(x) < np.finfo(np.float32).tiny] = 0
    return np.round(x * 2) / 2 if ties and data.draw(st.booleans()) else x


def lengths_of(data, count, high=3, low=0):
    return np.asarray(data.draw(st.lists(st.integers(low, high), min_size=count, max_size=count)), np.int32)


def sorted_ids(data, low=1):
    """Sorted segment ids from 0 without gaps (runs of 1..3, or `low`..3)."""
    runs = lengths_of(data, data.draw(st.integers(0, 4)), low=low)
    return np.repeat(np.arange(runs.size), runs).astype(np.int32)


def spoil_ids(data, ids):
    """Segment ids Caffe2 refuses: int64, shifted off 0, or out of order."""
    how = data.draw(st.sampled_from(["int64", "shift", "reverse"]))
    if how == "int64" or ids.size < 2 or ids[0] == ids[-1]:
        return ids.astype(np.int64) if how == "int64" or ids.size == 0 else ids + 1
    return ids + 1 if how == "shift" else ids[::-1].copy()


# --------------------------------------------------------------------------------------------------
# SortedSegmentRange*


def draw_range(reducer):
    op_type = f"SortedSegmentRange{reducer}"

    def draw(data):
        ids = sorted_ids(data)
        inputs = {"x": floats(data, (ids.size, *block(data)), ties=True), "ids": ids}
        if invalid(data):
            if data.draw(st.booleans()):
                inputs["ids"] = spoil_ids(data, ids)
            else:
                inputs["x"] = inputs["x"][: max(ids.size - 1, 0)] if ids.size else inputs["x"].astype(np.int32)
        return make_op(op_type, ["x", "ids"], ["y"]), inputs

    return draw


# --------------------------------------------------------------------------------------------------
# {Sorted,Unsorted}Segment* and Sparse{Sorted,Unsorted}Segment*


def draw_segment(op_type):
    sparse = op_type.startswith("Sparse")
    weighted = op_type.endswith("WeightedSum")
    unsorted = "Unsorted" in op_type

    def draw(data):
        args = {}
        if unsorted:
            n = data.draw(st.integers(0, 5))
            k = data.draw(st.integers(1, 4))
            ids = data.draw(arrays((n,), np.int32, 0, k - 1))
            if data.draw(st.booleans()):
                args["num_segments"] = int(ids.max(initial=-1)) + 1 + data.draw(st.integers(0, 2))
        else:
            ids = sorted_ids(data)
            n = ids.size
        row = block(data)
        inputs = {}
        if sparse:
            m = data.draw(st.integers(1, 4))
            inputs["x"] = floats(data, (m, *row))
        else:
            inputs["x"] = floats(data, (n, *row))
        if weighted:
            inputs["w"] = floats(data, (n,))
        if sparse:
            inputs["indices"] = data.draw(arrays((n,), data.draw(st.sampled_from(INDEX_TYPES)), 0, m - 1))
        inputs["ids"] = ids
        if invalid(data):
            how = data.draw(st.sampled_from(["ids", "rows", "index", "weights"]))
            if how == "ids" and n:
                inputs["ids"] = (ids - 1) if unsorted else spoil_ids(data, ids)
            elif how == "index" and sparse and n:
                inputs["indices"] = inputs["indices"] + inputs["x"].shape[0]
            elif how == "weights" and weighted:
                inputs["w"] = floats(data, (n + 1,))
            else:
                inputs["x"] = inputs["x"].astype(np.int32)
            if "num_segments" in args and how == "ids" and n:
                args["num_segments"] = int(ids.max())  # the largest id is then out of range
        if weighted and data.draw(st.integers(0, 3)) == 0:
            args["grad_on_weights"] = 1  # Caffe2's maker refuses: no gradient on SCALARS for segment ops
        return make_op(op_type, list(inputs), ["y"], **args), inputs

    return draw


def draw_segment_gradient(op_type):
    """The Sparse* gradient ops Caffe2 registers but whose makers emit the non-sparse ones."""
    weighted = "WeightedSum" in op_type
    unsorted = "Unsorted" in op_type

    def draw(data):
        if unsorted:
            k = data.draw(st.integers(1, 4))
            ids = data.draw(arrays((data.draw(st.integers(0, 5)),), np.int32, 0, k - 1))
        else:
            ids = sorted_ids(data)
            k = int(ids[-1]) + 1 if ids.size else data.draw(st.integers(0, 2))
        inputs = {"w": floats(data, (ids.size,))} if weighted else {}
        inputs["dy"] = floats(data, (k, *block(data)))
        inputs["ids"] = ids
        if invalid(data) and ids.size:
            inputs["dy"] = inputs["dy"][:-1] if k > 1 and not unsorted else inputs["dy"].astype(np.int32)
        return make_op(op_type, list(inputs), ["dx"]), inputs

    return draw


# --------------------------------------------------------------------------------------------------
# Lengths*


def draw_lengths(op_type):
    weighted = op_type == "LengthsWeightedSum"

    def draw(data):
        lengths = lengths_of(data, data.draw(st.integers(0, 4)))
        n = int(lengths.sum())
        inputs = {"x": floats(data, (n, *block(data)), ties=op_type == "LengthsMax")}
        if weighted:
            inputs["w"] = floats(data, (n,))
        inputs["lengths"] = lengths
        args = {}
        if weighted and data.draw(st.booleans()):
            args["grad_on_weights"] = 1
        if invalid(data):
            how = data.draw(st.sampled_from(["rows", "int64", "weights"]))
            if how == "rows":
                inputs["x"] = floats(data, (n + data.draw(st.sampled_from([1, 2])), *inputs["x"].shape[1:]))
            elif how == "weights" and weighted:
                inputs["w"] = floats(data, (n, 1))
            else:
                inputs["lengths"] = lengths.astype(np.int64)
        return make_op(op_type, list(inputs), ["y"], **args), inputs

    return draw


def draw_lengths_gradient(op_type):
    def draw(data):
        lengths = lengths_of(data, data.draw(st.integers(0, 4)))
        inputs = {"dy": floats(data, (lengths.size, *block(data))), "lengths": lengths}
        if invalid(data):
            inputs["dy"] = inputs["dy"][:-1] if lengths.size else inputs["dy"].astype(np.int32)
        return make_op(op_type, ["dy", "lengths"], ["dx"]), inputs

    return draw


# --------------------------------------------------------------------------------------------------
# ReduceFrontWeightedSum, ReduceTailSum


def draw_reduce_front_weighted_sum(data):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=3))
    num = data.draw(st.integers(0, len(shape)))
    args = {"num_reduce_dim": num} if num != 1 or data.draw(st.booleans()) else {}
    inputs = {"x": floats(data, shape), "w": floats(data, shape[:num])}
    if invalid(data):
        if data.draw(st.booleans()) or num == 0:
            args["num_reduce_dim"] = len(shape) + 1
        else:
            inputs["w"] = inputs["w"].reshape(-1, 1) if num == 1 else inputs["w"].reshape(-1)
    return make_op("ReduceFrontWeightedSum", ["x", "w"], ["y"], **args), inputs


def draw_reduce_tail_sum(data):
    x = floats(data, data.draw(shapes(1, 3, min_side=0, max_side=3)))
    if invalid(data):
        x = x.astype(np.int32)
    return make_op("ReduceTailSum", ["x"], ["y"]), {"x": x}


# --------------------------------------------------------------------------------------------------
# Conversions


def draw_lengths_to(op_type, **arg_strategies):
    def draw(data):
        lengths = lengths_of(data, data.draw(st.integers(0, 5)), 4)
        args = {name: data.draw(s) for name, s in arg_strategies.items() if data.draw(st.booleans())}
        if invalid(data):
            lengths = lengths.astype(np.int64) if data.draw(st.booleans()) else lengths.reshape(1, -1)
        return make_op(op_type, ["lengths"], ["y"], **args), {"lengths": lengths}

    return draw


def draw_lengths_to_shape(data):
    n = data.draw(st.integers(1, 5))  # Caffe2 reads LENGTHS[0] of an empty input
    lengths = np.full((n,), data.draw(st.integers(0, 4)), np.int32)
    if invalid(data):
        lengths[-1] += 1 if n > 1 else 0
        lengths = lengths if n > 1 else lengths.astype(np.int64)
    return make_op("LengthsToShape", ["lengths"], ["y"]), {"lengths": lengths}


def draw_lengths_to_weights(data):
    dtype = data.draw(st.sampled_from(INDEX_TYPES))
    lengths = lengths_of(data, data.draw(st.integers(0, 5)), 4).astype(dtype)
    args = {}
    if data.draw(st.booleans()):
        args["power"] = data.draw(st.sampled_from([0.5, 1.0, 0.0, 0.7, 2.0, -1.5]))
    if invalid(data) and lengths.size:
        lengths[0] = -1
    return make_op("LengthsToWeights", ["lengths"], ["y"], **args), {"lengths": lengths}


def draw_segment_ids_to(op_type):
    def draw(data):
        dtype = data.draw(st.sampled_from(INDEX_TYPES))
        ids = np.sort(data.draw(arrays((data.draw(st.integers(0, 5)),), dtype, 0, 4)))
        if data.draw(st.integers(0, 5)) == 0:
            ids = -ids - 1  # a last id of -1 gives no segments, before the ids are looked at
            ids = ids[::-1].copy() if op_type == "SegmentIdsToRanges" else ids
        inputs = {"ids": ids}
        if op_type == "SegmentIdsToLengths" and data.draw(st.booleans()):
            inputs["ids"] = ids.reshape((1, -1) if data.draw(st.booleans()) else (-1, 1))
        # Caffe2's SegmentIdsToRanges reads the first of no ids when SIZES asks for segments (it crashed),
        # and with a negative first id it writes before its output: SIZES only for sound ids there.
        sound = ids.size and ids[0] >= 0
        if data.draw(st.booleans()) and (sound or op_type == "SegmentIdsToLengths"):
            count = int(ids[-1]) + 1 if ids.size else 0
            inputs["sizes"] = floats(data, (max(count, 0) + data.draw(st.integers(0, 2)), 2))
        if invalid(data) and ids.size and ids[-1] > 0:
            # Out of order but none past the last: Caffe2 counts an id before checking the order, so an
            # id past the last one wrote past its output (the worker died of heap corruption).
            inputs["ids"] = np.array([ids[-1], 0, ids[-1]], ids.dtype)
        return make_op(op_type, list(inputs), ["y"]), inputs

    return draw


WEIGHTED_GRADS = ("LengthsWeightedSumGradient", "LengthsWeightedSumWithMainInputGradient")

CASES = cases(
    *(
        Case(
            f"SortedSegmentRange{r}",
            draw_range(r),
            gradient_ops=(f"SortedSegmentRange{r}Gradient",),
        )
        for r in RANGE
    ),
    *(
        Case(
            f"{layout}{r}", draw_segment(f"{layout}{r}"), gradient_ops=(f"{layout.removeprefix('Sparse')}{r}Gradient",)
        )
        for layout in ("SortedSegment", "UnsortedSegment", "SparseSortedSegment", "SparseUnsortedSegment")
        for r in REDUCERS
    ),
    *(
        Case(f"Sparse{layout}{r}Gradient", draw_segment_gradient(f"Sparse{layout}{r}Gradient"))
        for layout in ("SortedSegment", "UnsortedSegment")
        for r in REDUCERS
    ),
    Case("LengthsSum", draw_lengths("LengthsSum"), gradient_ops=("LengthsIndicesInGradientSumGradient",)),
    Case("LengthsMean", draw_lengths("LengthsMean"), gradient_ops=("LengthsIndicesInGradientMeanGradient",)),
    Case("LengthsMax", draw_lengths("LengthsMax"), gradient_ops=("LengthsMaxWithMainInputAndForwardOutputGradient",)),
    Case("LengthsWeightedSum", draw_lengths("LengthsWeightedSum"), gradient_ops=WEIGHTED_GRADS),
    Case("LengthsSumGradient", draw_lengths_gradient("LengthsSumGradient")),
    Case("LengthsMeanGradient", draw_lengths_gradient("LengthsMeanGradient")),
    Case(
        "ReduceFrontWeightedSum",
        draw_reduce_front_weighted_sum,
        gradient_ops=("Shape", "ReduceFrontWeightedSumGradient"),
    ),
    Case("ReduceTailSum", draw_reduce_tail_sum),
    Case("LengthsToRanges", draw_lengths_to("LengthsToRanges")),
    Case("LengthsToSegmentIds", draw_lengths_to("LengthsToSegmentIds")),
    Case("LengthsToOffsets", draw_lengths_to("LengthsToOffsets", include_last_offset=st.sampled_from([0, 1]))),
    Case("LengthsToShape", draw_lengths_to_shape),
    Case("LengthsToWeights", draw_lengths_to_weights),
    Case("SegmentIdsToLengths", draw_segment_ids_to("SegmentIdsToLengths")),
    Case("SegmentIdsToRanges", draw_segment_ids_to("SegmentIdsToRanges")),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


@pytest.mark.parametrize("op_type", ["LengthsSum", "LengthsMean"])
@given(data=st.data())
def test_lengths_that_do_not_cover_the_data_are_refused(caffe2, jit, op_type, data):
    """Caffe2 enforces that the lengths sum to the rows of the data. Eagerly rnn2jax refuses at the op;
    under jit the compiled net checks the traced lengths when it runs (ops/checks.py)."""
    lengths = lengths_of(data, data.draw(st.integers(1, 4)))
    total = int(lengths.sum())
    rows = total + data.draw(st.sampled_from([1, 2, -1] if total else [1, 2]))
    inputs = {"x": floats(data, (rows, *block(data))), "lengths": lengths}
    op = make_op(op_type, ["x", "lengths"], ["y"])
    assert check_op(caffe2, op, inputs, jit=jit) is None
