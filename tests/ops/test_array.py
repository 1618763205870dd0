"""The array family (rnn2jax/ops/array.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: The ranking and normalisation ops against NumPy references written from
Caffe2's documented semantics (top_k.cc, flexible_top_k.cc, local_response_normalization_op.cc), independent of the
Caffe2 oracle.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the array ops (tiling,
broadcasting, top-k, ranges, layout switches, small shape and control ops) against real Caffe2 (see
tests/differential.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, assert_same_ops, cases, invalid, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op
from rnn2jax.proto import caffe2_pb2 as pb

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_array.py)

def top_k_reference(x: np.ndarray, k: int, axis: int):
    """Largest first, ties by lower index; k beyond the dim padded with value 0 and index -1."""
    moved = np.moveaxis(x, axis, -1)
    n = moved.shape[-1]
    order = np.argsort(-moved, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(moved, order, axis=-1)
    pad = [(0, 0)] * (moved.ndim - 1) + [(0, max(k - n, 0))]
    values, order = np.pad(values, pad), np.pad(order, pad, constant_values=-1)
    values, order = np.moveaxis(values, -1, axis), np.moveaxis(order, -1, axis)
    flat = np.full(order.shape, -1, np.int64)
    for pos in np.ndindex(order.shape):
        if order[pos] >= 0:
            source = list(pos)
            source[axis] = order[pos]
            flat[pos] = np.ravel_multi_index(source, x.shape)
    return values, order, flat.reshape(-1)


@given(data=st.data())
def test_top_k_matches_reference(data, jit):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=4))
    x = data.draw(arrays(shape, np.float32, -2, 2))
    if data.draw(st.booleans()):
        x = x.round().astype(np.float32)  # ties
    axis = data.draw(st.integers(0, len(shape) - 1))
    k = data.draw(st.integers(1, 5))
    op = make_op("TopK", ["x"], ["v", "i", "f"], k=k, axis=axis)
    got = run_rnn2jax([op], {"x": x}, ["v", "i", "f"], jit=jit)
    values, indices, flat = top_k_reference(x, k, axis)
    np.testing.assert_array_equal(got["v"], values)
    np.testing.assert_array_equal(got["i"], indices)
    np.testing.assert_array_equal(got["f"], flat)


@given(data=st.data())
def test_top_k_gradient_scatters_back(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    x = data.draw(arrays(shape, np.float32, -2, 2))
    k = data.draw(st.integers(1, 5))
    _, indices, _ = top_k_reference(x, k, len(shape) - 1)
    grad = data.draw(arrays(indices.shape, np.float32))
    want = np.zeros_like(x)
    for pos in np.ndindex(indices.shape):
        if indices[pos] >= 0:
            want[(*pos[:-1], indices[pos])] = grad[pos]
    op = make_op("TopKGradient", ["g", "i", "x"], ["dx"], k=k)
    got = run_rnn2jax([op], {"g": grad, "i": indices.astype(np.int64), "x": x}, ["dx"])
    np.testing.assert_array_equal(got["dx"], want)


@given(data=st.data())
def test_flexible_top_k_matches_reference(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    x = data.draw(arrays(shape, np.float32, -2, 2)).round().astype(np.float32)
    rows = x.reshape(-1, shape[-1])
    ks = np.array([data.draw(st.integers(1, shape[-1])) for _ in rows], np.int64)
    values, indices = [], []
    for row, k in zip(rows, ks, strict=True):
        v, i, _ = top_k_reference(row, int(k), 0)
        values.append(v)
        indices.append(i)
    op = make_op("FlexibleTopK", ["x", "k"], ["v", "i"])
    got = run_rnn2jax([op], {"x": x, "k": ks}, ["v", "i"], jit=False)
    np.testing.assert_array_equal(got["v"], np.concatenate(values))
    np.testing.assert_array_equal(got["i"], np.concatenate(indices))


def lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float, axis: int):
    """scale_c = bias + alpha / size * sum of x^2 over channels [c - (size-1)/2, c + (size-1)/2]."""
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    half = (size - 1) // 2
    squares = np.pad(moved**2, [(0, 0)] * (moved.ndim - 1) + [(half, half)])
    channels = moved.shape[-1]
    window = sum(squares[..., i : i + channels] for i in range(size))
    scale = bias + alpha / size * window
    return np.moveaxis(moved * scale**-beta, -1, axis), np.moveaxis(scale, -1, axis)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@given(data=st.data())
def test_lrn_matches_reference(data, order):
    x = data.draw(arrays((2, 4, 3, 2), np.float32))
    size = data.draw(st.sampled_from([1, 3, 5]))
    alpha, beta, bias = 0.5, 0.75, 1.5
    op = make_op("LRN", ["x"], ["y", "s"], size=size, alpha=alpha, beta=beta, bias=bias, order=order)
    got = run_rnn2jax([op], {"x": x}, ["y", "s"])
    want_y, want_s = lrn_reference(x, size, alpha, beta, bias, 3 if order == "NHWC" else 1)
    np.testing.assert_allclose(got["y"], want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["s"], want_s, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_array.py)

DT = pb.TensorProto
NUMERIC = [np.float32, np.float64, np.int32, np.int64]


def values(data, shape, dtype=np.float32):
    """Floats in [-1, 1], integers in [-9, 9], or bools."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return data.draw(arrays(shape, dtype, -9, 9))
    return data.draw(arrays(shape, dtype))


def ties(data, shape):
    """Floats, often from a few values so that ties occur (top-k's index tie-break)."""
    if data.draw(st.booleans()):
        return data.draw(arrays(shape, np.float32, -2, 2)).round().astype(np.float32)
    return values(data, shape)


# --------------------------------------------------------------------------------------------------
# Tile, NumpyTile, Expand


def draw_tile(data):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=3))
    bad = invalid(data)
    dtype = np.bool_ if bad and data.draw(st.booleans()) else data.draw(st.sampled_from(NUMERIC))
    x = values(data, shape, dtype)
    ndim = len(shape)
    # tiles = 0 kills Caffe2 in TileGradient; tiles < 0 on an empty input makes a negative dim there.
    tiles = data.draw(st.sampled_from([-1, 1, 2, 3] if bad and x.size else [1, 2, 3]))
    axis = data.draw(st.integers(-ndim - 1, ndim) if bad else st.integers(-ndim, ndim - 1))
    form = data.draw(st.sampled_from(["args", "tiles", "both"]))
    if form == "args":
        return make_op("Tile", ["x"], ["y"], tiles=tiles, axis=axis), {"x": x}
    tiles_blob = np.array([tiles], data.draw(st.sampled_from([np.int32, np.int64])))
    if form == "tiles":
        return make_op("Tile", ["x", "tiles"], ["y"], axis=axis), {"x": x, "tiles": tiles_blob}
    axis_blob = np.array([axis], data.draw(st.sampled_from([np.int32, np.int64])))
    return make_op("Tile", ["x", "tiles", "axis"], ["y"]), {"x": x, "tiles": tiles_blob, "axis": axis_blob}


def draw_numpy_tile(data):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=3))
    x = values(data, shape, data.draw(st.sampled_from(NUMERIC)))
    bad = invalid(data)
    count = len(shape) + (data.draw(st.sampled_from([-1, 1])) if bad else 0)
    reps = np.array(data.draw(st.lists(st.integers(0, 2), min_size=count, max_size=count)), np.int64)
    if bad and data.draw(st.booleans()):
        reps = np.array(list(reps[: len(shape)]) + [1] * (len(shape) - len(reps)), np.int32)
    return make_op("NumpyTile", ["x", "repeats"], ["y"]), {"x": x, "repeats": reps}


def draw_expand(data):
    shape = data.draw(shapes(0, 3, min_side=1, max_side=3))
    x = values(data, shape, data.draw(st.sampled_from(NUMERIC)))
    target = []
    for d in shape:
        options = [d, -1, 0] if d != 1 else [1, 2, 3, -1]
        target.append(data.draw(st.sampled_from(options)))
    target = data.draw(st.lists(st.integers(1, 3), max_size=2)) + target
    if invalid(data) and target:
        target[data.draw(st.integers(0, len(target) - 1))] = data.draw(st.integers(2, 4))
    dtype = np.int32 if invalid(data) else np.int64
    return make_op("Expand", ["x", "shape"], ["y"]), {"x": x, "shape": np.array(target, dtype)}


# --------------------------------------------------------------------------------------------------
# Small shape and control ops


def draw_size(data):
    x = values(data, data.draw(shapes(0, 3, min_side=0, max_side=3)), data.draw(st.sampled_from(NUMERIC)))
    return make_op("Size", ["x"], ["y"]), {"x": x}


def draw_flatten_to_vec(data):
    x = values(data, data.draw(shapes(0 if invalid(data) else 1, 3, min_side=0, max_side=3)))
    return make_op("FlattenToVec", ["x"], ["y"]), {"x": x}


def draw_ensure_dense(data):
    x = values(data, data.draw(shapes(0, 3, min_side=0, max_side=3)), data.draw(st.sampled_from(NUMERIC)))
    return make_op("EnsureDense", ["x"], ["y"]), {"x": x}


def draw_has_elements(data):
    n = data.draw(st.integers(1, 3))
    names = [f"x{i}" for i in range(n)]
    inputs = {name: values(data, data.draw(shapes(0, 2, min_side=0, max_side=2))) for name in names}
    return make_op("HasElements", names, ["y"]), inputs


def draw_is_empty(data):
    return make_op("IsEmpty", ["x"], ["y"]), {"x": values(data, data.draw(shapes(0, 2, min_side=0, max_side=2)))}


def draw_conditional(data):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=3))
    dtype = data.draw(st.sampled_from(NUMERIC))
    cond = data.draw(arrays((shape[0],), np.bool_))
    a, b = values(data, shape, dtype), values(data, shape, dtype)
    if invalid(data):
        kind = data.draw(st.sampled_from(["cond_type", "cond_len", "cond_rank", "shape"]))
        if kind == "cond_type":
            cond = cond.astype(np.int32)
        elif kind == "cond_len":
            cond = np.ones(shape[0] + 1, np.bool_)
        elif kind == "cond_rank":
            cond = cond.reshape(-1, 1)
        else:
            b = values(data, (*shape, 2), dtype)
    return make_op("Conditional", ["cond", "a", "b"], ["y"]), {"cond": cond, "a": a, "b": b}


def draw_find(data):
    dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    index = data.draw(arrays(data.draw(shapes(1, 2, min_side=0, max_side=4)), dtype, 0, 5))
    query = data.draw(arrays(data.draw(shapes(0, 2, min_side=0, max_side=4)), dtype, 0, 7))
    if invalid(data):
        query = query.astype(data.draw(st.sampled_from([np.int32, np.int64, np.float32])))
    args = {"missing_value": data.draw(st.integers(-5, 5))} if data.draw(st.booleans()) else {}
    return make_op("Find", ["index", "query"], ["y"], **args), {"index": index, "query": query}


def draw_prepend_dim(data):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=4))
    x = values(data, shape, data.draw(st.sampled_from(NUMERIC)))
    divisors = [d for d in range(1, 5) if shape[0] % d == 0]
    dim_size = data.draw(st.integers(0, 4) if invalid(data) else st.sampled_from(divisors))
    return make_op("PrependDim", ["x"], ["y"], dim_size=dim_size), {"x": x}


def draw_merge_dim(data):
    x = values(data, data.draw(shapes(1 if invalid(data) else 2, 4, min_side=0, max_side=3)))
    return make_op("MergeDim", ["x"], ["y"]), {"x": x}


def draw_diagonal_fill(data):
    square = data.draw(st.booleans())
    if square:
        n, rank = data.draw(st.integers(0, 3)), data.draw(st.integers(2, 4))
        shape = (n,) * rank
    else:
        shape = data.draw(shapes(2, 2, min_side=0, max_side=4))
    if invalid(data):
        shape = data.draw(st.sampled_from([(3,), (2, 3, 2)]))
    args = {}
    kind = data.draw(st.sampled_from(["none", "float", "int", "dtype"]))
    if kind == "float":
        args["value"] = data.draw(st.floats(-10, 10, width=32, allow_subnormal=False))
    elif kind == "int":
        args["value"] = data.draw(st.integers(-100, 100))
    elif kind == "dtype":
        dtype = data.draw(st.sampled_from([DT.FLOAT, DT.DOUBLE, DT.INT32, DT.INT64, DT.BOOL, DT.INT16, DT.UINT8]))
        args["dtype"] = dtype
        if dtype in (DT.FLOAT, DT.DOUBLE):
            args["value"] = data.draw(st.floats(-10, 10, width=32, allow_subnormal=False))
        else:
            args["value"] = data.draw(st.integers(0, 1 if dtype == DT.BOOL else 100))
    how = data.draw(st.sampled_from(["arg", "like", "as_shape"]))
    if how == "arg":
        return make_op("DiagonalFill", [], ["y"], shape=list(shape), **args), {}
    if how == "like":
        return make_op("DiagonalFill", ["like"], ["y"], **args), {"like": np.zeros(shape, np.float32)}
    dims = np.array(shape, np.int64)
    return make_op("DiagonalFill", ["dims"], ["y"], input_as_shape=1, **args), {"dims": dims}


def draw_order_switch(op_type):
    def draw(data):
        bad = invalid(data)
        shape = data.draw(shapes(2 if bad else 3, 5, min_side=0, max_side=3))
        dtype = np.float64 if bad and data.draw(st.booleans()) else np.float32
        return make_op(op_type, ["x"], ["y"]), {"x": values(data, shape, dtype)}

    return draw


# --------------------------------------------------------------------------------------------------
# TopK, FlexibleTopK


def draw_top_k(data):
    shape = data.draw(shapes(1, 3, min_side=0, max_side=4))
    bad = invalid(data)
    x = ties(data, shape)
    if bad and data.draw(st.booleans()):
        x = x.astype(np.float64)
    args = {}
    if data.draw(st.booleans()):
        args["axis"] = data.draw(st.integers(-2, len(shape)) if bad else st.integers(-1, len(shape) - 1))
    k = data.draw(st.integers(0, 5) if bad else st.integers(1, 5))
    outputs = ["values", "indices"] + (["flat"] if data.draw(st.booleans()) else [])
    if data.draw(st.booleans()):
        k_blob = np.array([k], np.int32 if bad and data.draw(st.booleans()) else np.int64)
        return make_op("TopK", ["x", "k"], outputs, **args), {"x": x, "k": k_blob}
    return make_op("TopK", ["x"], outputs, k=k, **args), {"x": x}


def draw_flexible_top_k(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    x = ties(data, shape)
    rows = int(np.prod(shape[:-1]))
    ks = np.array(data.draw(st.lists(st.integers(1, shape[-1]), min_size=rows, max_size=rows)), np.int64)
    if invalid(data):
        kind = data.draw(st.sampled_from(["zero", "big", "count", "int32"]))
        if kind == "zero":
            ks[0] = 0
        elif kind == "big":
            ks[0] = shape[-1] + 1
        elif kind == "count":
            ks = np.concatenate([ks, [1]]).astype(np.int64)
        else:
            ks = ks.astype(np.int32)
    return make_op("FlexibleTopK", ["x", "k"], ["values", "indices"]), {"x": x, "k": ks}


# --------------------------------------------------------------------------------------------------
# Range, ScaleBlobs, WeightScale


def draw_range(data):
    dtype = np.dtype(data.draw(st.sampled_from(NUMERIC)))
    n = data.draw(st.integers(1, 3))
    numbers = [data.draw(st.integers(-6, 6)) for _ in range(n)]
    if dtype.kind == "f" and data.draw(st.booleans()):
        numbers = [
            data.draw(st.floats(-3, 3, width=32, allow_subnormal=False).filter(lambda v: abs(v) > 0.05))
            for _ in range(n)
        ]
    if n == 3 and not invalid(data) and numbers[2] == 0:
        numbers[2] = 1
    names = ["start", "stop", "step"][:n] if n > 1 else ["stop"]
    inputs = {}
    for name, v in zip(names, numbers, strict=True):
        shape = data.draw(st.sampled_from([(), (1,)]))
        inputs[name] = np.full(shape, v, dtype)
    if n > 1 and invalid(data):
        other = np.int32 if dtype != np.int32 else np.int64
        inputs[names[-1]] = inputs[names[-1]].astype(other)
    return make_op("Range", names, ["y"]), inputs


def draw_scale_blobs(data):
    n = data.draw(st.integers(1, 3))
    names = [f"x{i}" for i in range(n)]
    dtype = np.float64 if invalid(data) else np.float32
    inputs = {name: values(data, data.draw(shapes(0, 3, min_side=0, max_side=3)), dtype) for name in names}
    outputs = [f"y{i}" for i in range(n + (1 if invalid(data) else 0))]
    args = {"scale": data.draw(st.floats(-2, 2, width=32, allow_subnormal=False))} if data.draw(st.booleans()) else {}
    return make_op("ScaleBlobs", names, outputs, **args), inputs


def draw_weight_scale(data):
    w = values(data, data.draw(shapes(1, 2, min_side=0, max_side=3)), np.float64 if invalid(data) else np.float32)
    it = np.array([data.draw(st.integers(0, 12))], np.int32 if invalid(data) else np.int64)
    args = {}
    if data.draw(st.booleans()):
        args["stepsize"] = data.draw(st.integers(1, 4))
    if data.draw(st.booleans()):
        args["upper_bound_iter"] = data.draw(st.integers(0, 12))
    if data.draw(st.booleans()):
        args["scale"] = data.draw(st.floats(-2, 2, width=32, allow_subnormal=False))
    return make_op("WeightScale", ["w", "iter"], ["y"], **args), {"w": w, "iter": it}


def draw_accumulate(data):
    """Y must exist with X's shape (Caffe2 starts from uninitialised memory otherwise): fed as a blob."""
    shape = data.draw(shapes(0, 3, min_side=0, max_side=3))
    x = values(data, shape, np.float64 if invalid(data) else np.float32)
    args = {"gamma": data.draw(st.floats(-2, 2, width=32, allow_subnormal=False))} if data.draw(st.booleans()) else {}
    return make_op("Accumulate", ["x"], ["y"], **args), {"x": x, "y": values(data, shape)}


CASES = cases(
    Case("Tile", draw_tile, gradient_ops=("TileGradient",)),
    Case("NumpyTile", draw_numpy_tile),
    Case("Expand", draw_expand, gradient_ops=("ExpandGradient",)),
    Case("Size", draw_size),
    Case("FlattenToVec", draw_flatten_to_vec, gradient_ops=("ResizeLike",)),
    Case("EnsureDense", draw_ensure_dense),
    Case("HasElements", draw_has_elements),
    Case("IsEmpty", draw_is_empty),
    Case("Conditional", draw_conditional),
    Case("Find", draw_find),
    Case("PrependDim", draw_prepend_dim, gradient_ops=("MergeDim",)),
    Case("MergeDim", draw_merge_dim),
    Case("DiagonalFill", draw_diagonal_fill),
    Case("NCHW2NHWC", draw_order_switch("NCHW2NHWC"), gradient_ops=("NHWC2NCHW",)),
    Case("NHWC2NCHW", draw_order_switch("NHWC2NCHW"), gradient_ops=("NCHW2NHWC",)),
    Case("TopK", draw_top_k, gradient_ops=("TopKGradient",)),
    Case("FlexibleTopK", draw_flexible_top_k, gradient_ops=("FlexibleTopKGradient",)),
    Case("Range", draw_range),
    Case("ScaleBlobs", draw_scale_blobs),
    Case("WeightScale", draw_weight_scale),
    Case("Accumulate", draw_accumulate, note="Y's previous value is fed as a blob"),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_array(caffe2, case, data):
    run_case(caffe2, case, data)


# Makers the cases above do not reach (no float output to flow back from, or ops not lowered here): the
# builder's gradient (or its refusal) must equal Caffe2's.
MAKER_OPS = [
    ("Size", ["x"], ["y"], {}),
    ("Conditional", ["c", "a", "b"], ["y"], {}),
    ("Range", ["a", "b"], ["y"], {}),
    ("DiagonalFill", [], ["y"], {"shape": [2, 2]}),
    ("UniqueUniformFill", ["x"], ["y"], {}),
    ("EnsureDense", ["x"], ["y"], {}),
    ("HasElements", ["x"], ["y"], {}),
    ("IsEmpty", ["x"], ["y"], {}),
    ("Accumulate", ["x"], ["y"], {"gamma": 0.5}),
    ("WeightScale", ["w", "iter"], ["y"], {"stepsize": 2}),
    ("Tile", ["x", "tiles"], ["y"], {"axis": 1}),
    ("Tile", ["x", "tiles", "axis"], ["y"], {}),
    ("TopK", ["x", "k"], ["v", "i", "f"], {}),
    ("UpsampleBilinear", ["x", "scales"], ["y"], {}),
    ("ResizeNearest", ["x", "scales"], ["y"], {"order": "NHWC"}),
    ("PrependDim", ["x"], ["y"], {"dim_size": 2}),
]


@pytest.mark.parametrize("spec", MAKER_OPS, ids=[f"{s[0]}-{len(s[1])}" for s in MAKER_OPS])
def test_gradient_maker_matches_caffe2(caffe2, spec):
    op_type, inputs, outputs, args = spec
    op = make_op(op_type, inputs, outputs, **args)
    g_output = [f"{o}_grad" for o in outputs]
    try:
        c2_ops, c2_g_input = caffe2.gradient_for_op(op, g_output)
    except Caffe2Error:
        with pytest.raises(GradientError):
            get_gradient_for_op(op, g_output)
        return
    ours, g_input = get_gradient_for_op(op, g_output)
    assert_same_ops(ours, c2_ops, f"gradient ops of {op_type}")
    assert list(g_input) == list(c2_g_input)


def test_accumulate_refuses_a_missing_or_reshaped_output():
    """Caffe2 accumulates into uninitialised memory there; rnn2jax refuses."""
    op = make_op("Accumulate", ["x"], ["y"], gamma=0.5)
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError):
        run_rnn2jax([op], {"x": x}, ["y"], jit=False)
    with pytest.raises(ShapeError):
        run_rnn2jax([op], {"x": x, "y": np.ones((3, 2), np.float32)}, ["y"], jit=False)
    with pytest.raises(BadArgumentError):
        run_rnn2jax([make_op("Accumulate", ["x"], ["x"])], {"x": x}, ["x"], jit=False)
