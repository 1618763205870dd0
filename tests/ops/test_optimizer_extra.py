"""The rest of the optimizer family (rnn2jax/ops/optimizer_extra.py) against real Caffe2 (tests/differential.py).

Sparse draws repeat indices on purpose: Caffe2 updates a repeated row again from its first update's result.
Ops Caffe2 runs in place only (the fused Adagrads, SparseStorm, RowWiseCounter, ...) are drawn in place; an
invalid draw sometimes names another output blob, which both must refuse.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, invalid, make_op, run_case, shapes
from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError


def f32(low: float, high: float):
    return st.floats(float(np.float32(low)), float(np.float32(high)), width=32, allow_subnormal=False)


def _args(data, **strategies):
    """Each argument drawn or left to its default."""
    return {name: data.draw(s) for name, s in strategies.items() if data.draw(st.booleans())}


def _lr(data):
    return data.draw(arrays((1,), np.float32, -1, 1))


def _sparse(data, n_tables: int, positive=(), row_wise=(), max_index_count: int = 6):
    """PARAM-shaped tables [R, ...] (row-wise ones [R]), 1-D indices with repeats, GRAD [n, ...]."""
    rows = data.draw(st.integers(1, 5))
    block = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    tables = []
    for i in range(n_tables):
        shape = (rows,) if i in row_wise else (rows, *block)
        tables.append(data.draw(arrays(shape, np.float32, 0.0 if i in positive else -1.0, 1.0)))
    n = data.draw(st.integers(0, max_index_count))
    indices = data.draw(arrays((n,), data.draw(st.sampled_from([np.int32, np.int64])), 0, rows - 1))
    grad = data.draw(arrays((n, *block), np.float32))
    return tables, indices, grad, block


# --- Storm ---------------------------------------------------------------------------------------

STORM_ARGS = {"momentum": f32(0.0, 20.0), "beta": f32(0.01, 1.0)}


def draw_storm(data):
    shape = data.draw(shapes(1, 3, max_side=4))
    w, m, g = (data.draw(arrays(shape, np.float32)) for _ in range(3))
    if invalid(data):
        g = data.draw(arrays((shape[0] + 1,), np.float32))
    inputs = {"w": w, "m": m, "s": data.draw(arrays((1,), np.float32, 0, 4)), "g": g, "lr": _lr(data)}
    return make_op("Storm", list(inputs), ["w", "m", "s"], **_args(data, **STORM_ARGS)), inputs


def draw_sparse_storm(data):
    (w, m), indices, g, _ = _sparse(data, 2)
    inputs = {"w": w, "m": m, "s": data.draw(arrays((1,), np.float32, 0, 4)), "g": g, "i": indices, "lr": _lr(data)}
    outputs = ["w", "m", "s"] if not invalid(data) else ["w2", "m", "s"]
    return make_op("SparseStorm", list(inputs), outputs, **_args(data, **STORM_ARGS)), inputs


# --- GFtrl ---------------------------------------------------------------------------------------


def draw_gftrl(data):
    shape = data.draw(shapes(1, 3, max_side=4))
    w, g = data.draw(arrays(shape, np.float32)), data.draw(arrays(shape, np.float32))
    n = data.draw(arrays(shape, np.float32, 0, 1))
    z = data.draw(arrays(shape, np.float32, -2, 2))
    nz = np.stack([n, z], axis=-1)
    args = _args(data, beta=f32(0.5, 2.0), lambda1=f32(0.0, 0.5), lambda2=f32(0.0, 0.1))
    inputs = {"w": w, "nz": nz, "g": g}
    if data.draw(st.booleans()):
        inputs["alpha"] = data.draw(arrays((1,), np.float32, 0.015625, 1.0))
        if invalid(data):
            args["alpha"] = 0.5
    elif data.draw(st.booleans()):
        args["alpha"] = data.draw(f32(0.01, 1.0))
    return make_op("GFtrl", list(inputs), ["w", "nz"], **args), inputs


# --- SmartDecaySparseAdam ------------------------------------------------------------------------


def draw_smart_decay_sparse_adam(data):
    (w, m, v), indices, g, _ = _sparse(data, 3, positive=(2,))
    it = data.draw(st.integers(0, 50))
    last = data.draw(arrays((w.shape[0],), np.int64, 0, it))
    args = _args(data, beta1=f32(0.5, 0.99), beta2=f32(0.9, 0.999), epsilon=f32(1e-6, 1e-2))
    inputs = {"w": w, "m": m, "v": v, "last": last, "i": indices, "g": g, "lr": _lr(data)}
    inputs["it"] = np.array([it], np.int64)
    outputs = ["w", "m", "v", "last"] if not invalid(data) else ["w", "m", "v", "last2"]
    return make_op("SmartDecaySparseAdam", list(inputs), outputs, **args), inputs


# --- Fused Adagrad -------------------------------------------------------------------------------


def draw_fused(data, op_type):
    row_wise = op_type.startswith("RowWise")
    weighted = "WeightedSum" in op_type
    (w, h), _, _, block = _sparse(data, 2, positive=(1,), row_wise=(1,) if row_wise else ())
    rows = w.shape[0]
    lengths = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4)), np.int32)
    n = int(lengths.sum())
    indices = data.draw(arrays((n,), data.draw(st.sampled_from([np.int32, np.int64])), 0, rows - 1))
    g = data.draw(arrays((lengths.size, *block), np.float32))
    bad = invalid(data)
    if bad:
        kind = data.draw(st.sampled_from(["lengths", "inplace", "lengths_dtype"]))
        if kind == "lengths" and n:  # fewer indices covered (more would make Caffe2 read past INDICES)
            lengths = lengths.copy()
            lengths[np.flatnonzero(lengths)[-1]] -= 1
        elif kind == "lengths_dtype":
            lengths = lengths.astype(np.int64)
    inputs = {"w": w, "h": h}
    if weighted:
        inputs["aux"] = data.draw(arrays((max(int(lengths.max()), 1),), np.float32, -2, 2))
    inputs.update({"i": indices, "g": g, "lr": _lr(data), "lengths": lengths})
    outputs = ["w", "h"] + (["aux_grad"] if weighted else [])
    if bad and kind == "inplace":
        outputs[0] = "w2"
    args = _args(data, epsilon=f32(1e-6, 1e-2))
    if row_wise or data.draw(st.booleans()):
        args.update(_args(data, weight_decay=f32(0.0, 0.1)))
    return make_op(op_type, list(inputs), outputs, **args), inputs


FUSED_TYPES = [
    f"{prefix}SparseAdagradFusedWithSparseLengths{kind}Gradient{approx}"
    for prefix in ("", "RowWise")
    for kind in ("Sum", "Mean", "WeightedSum")
    for approx in ("", "Approx")
]


# --- LearningRateAdaption, YellowFin, RowWiseCounter ----------------------------------------------


def draw_learning_rate_adaption(data):
    shape = data.draw(shapes(1, 3, max_side=4))
    g = data.draw(arrays(shape, np.float32))
    e = data.draw(arrays(shape if not invalid(data) else (shape[0] + 1,), np.float32))
    inputs = {"lr": data.draw(arrays((1,), np.float32, 0, 1)), "g": g, "e": e}
    args = _args(data, lr_alpha=f32(0.0, 0.5), normalized_lr_adaption=st.integers(0, 1))
    return make_op("LearningRateAdaption", list(inputs), ["lr_out"], **args), inputs


def draw_yellow_fin(data):
    shape = data.draw(shapes(1, 2, max_side=4))
    width = data.draw(st.integers(1, 5))
    w, m, g = (data.draw(arrays(shape, np.float32)) for _ in range(3))
    it = data.draw(st.integers(1, 12))
    inputs = {
        "w": w,
        "m": m,
        "lr": data.draw(arrays((1,), np.float32, 0, 0.5)),
        "mu": data.draw(arrays((1,), np.float32, 0, 0.875)),
        "curv": data.draw(arrays((width,), np.float32, -2, 2)),
        "g_avg": data.draw(arrays(shape, np.float32)),
        "g2_avg": data.draw(arrays(shape, np.float32, 0, 1)),
        "mem": data.draw(arrays((5,), np.float32, 0.25, 2)),
        "g": g,
        "it": np.array([it], np.int64),
    }
    if invalid(data):
        inputs["g_avg"] = data.draw(arrays((shape[0] + 1,), np.float32))
    args = _args(data, beta=f32(0.5, 0.999), nesterov=st.integers(0, 1), zero_debias=st.integers(0, 1))
    args["curv_win_width"] = width
    outputs = ["w", "m", "lr", "mu", "curv", "g_avg", "g2_avg", "mem"]
    return make_op("YellowFin", list(inputs), outputs, **args), inputs


def draw_row_wise_counter(data):
    rows = data.draw(st.integers(1, 5))
    it = data.draw(st.integers(0, 100))
    prev = data.draw(arrays((rows,), np.int64, 0, 120))
    counter = data.draw(arrays((rows,), np.float64, 0, 5))
    n = data.draw(st.integers(0, 6))
    indices = data.draw(arrays((n,), data.draw(st.sampled_from([np.int32, np.int64])), 0, rows - 1))
    args = _args(data, counter_halflife=st.integers(-1, 50))
    inputs = {"prev": prev, "c": counter, "i": indices, "it": np.array([it], np.int64)}
    outputs = ["prev", "c"] if not invalid(data) else ["prev2", "c"]
    return make_op("RowWiseCounter", list(inputs), outputs, **args), inputs


# --- SparseLpRegularizer, Float16SparseNormalize, EnsureClipped ----------------------------------


def draw_sparse_lp_regularizer(data):
    (w,), indices, g, _ = _sparse(data, 1)
    args = _args(data, reg_lambda=f32(0.0, 0.5))
    args["p"] = 3.0 if invalid(data) else data.draw(st.sampled_from([1.0, 2.0]))
    inputs = {"w": w, "i": indices}
    if data.draw(st.booleans()):
        inputs["g"] = g
    return make_op("SparseLpRegularizer", list(inputs), ["w"], **args), inputs


def draw_float16_sparse_normalize(data):
    """Distinct indices: with a repeated row, the second pass compares the norm just set to `norm` with
    `norm` itself, which rounding decides either way."""
    (w,), indices, _, _ = _sparse(data, 1)
    unique = np.unique(indices).astype(indices.dtype)
    w16 = (w * 3).astype(np.float16 if not invalid(data) else np.float32)
    args = _args(data, norm=f32(0.25, 2.0), use_max_norm=st.integers(0, 1))
    return make_op("Float16SparseNormalize", ["w", "i"], ["w"], **args), {"w": w16, "i": unique}


def draw_ensure_clipped(data):
    args = _args(data, min=f32(-1.0, 0.0), max=f32(0.0, 1.0))
    if data.draw(st.booleans()):
        w = data.draw(arrays(shapes(1, 3, max_side=4), np.float32, -2, 2))
        return make_op("EnsureClipped", ["w"], ["y"], **args), {"w": w}
    (w,), indices, g, _ = _sparse(data, 1)
    outputs = ["w"] if not invalid(data) else ["w2"]
    return make_op("EnsureClipped", ["w", "i", "g"], outputs, **args), {"w": w * 2, "i": indices, "g": g}


CASES = cases(
    Case("Storm", draw_storm),
    Case("SparseStorm", draw_sparse_storm),
    Case("GFtrl", draw_gftrl),
    Case("SmartDecaySparseAdam", draw_smart_decay_sparse_adam),
    *[Case(t, lambda data, t=t: draw_fused(data, t)) for t in FUSED_TYPES],
    Case("LearningRateAdaption", draw_learning_rate_adaption),
    Case("YellowFin", draw_yellow_fin, rtol=1e-4, note="the lr/mu tuning solves a cubic in float"),
    Case("RowWiseCounter", draw_row_wise_counter),
    Case("SparseLpRegularizer", draw_sparse_lp_regularizer),
    Case("Float16SparseNormalize", draw_float16_sparse_normalize),
    Case("EnsureClipped", draw_ensure_clipped),
)


# The twelve fused Adagrads share one test drawing the op type (each example compiles: one test per type
# would take minutes).
OTHER = {name: case for name, case in CASES.items() if name not in FUSED_TYPES}


@pytest.mark.parametrize("case", OTHER.values(), ids=OTHER.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


@given(data=st.data())
def test_fused_adagrads_match_caffe2(caffe2, data):
    run_case(caffe2, CASES[data.draw(st.sampled_from(FUSED_TYPES))], data)


def test_fused_adagrad_repeats_rows_in_order(caffe2):
    """Row 1 named three times across two segments; the WeightedSum pair shows the aux gradient's
    difference (the parameter before the update, or as the Approx loop reaches each index)."""
    rng = np.random.default_rng(3)
    w = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
    for op_type in [t for t in FUSED_TYPES if ("Mean" in t and "Approx" not in t) or "WeightedSum" in t]:
        row_wise = op_type.startswith("RowWise")
        h = rng.uniform(0.25, 1, (3,) if row_wise else (3, 2)).astype(np.float32)
        inputs = {"w": w, "h": h}
        if "WeightedSum" in op_type:
            inputs["aux"] = np.array([0.5, 2.0, -1.0], np.float32)
        inputs.update(
            {
                "i": np.array([1, 1, 0, 1], np.int64),
                "g": rng.uniform(-1, 1, (2, 2)).astype(np.float32),
                "lr": np.array([0.5], np.float32),
                "lengths": np.array([2, 2], np.int32),
            }
        )
        outputs = ["w", "h"] + (["ag"] if "WeightedSum" in op_type else [])
        assert check_op(caffe2, make_op(op_type, list(inputs), outputs, weight_decay=0.05), inputs) is not None


def test_refusals():
    w = np.ones((3, 2), np.float32)
    with pytest.raises(BadArgumentError, match="in place"):
        run_op(
            "SparseAdagradFusedWithSparseLengthsSumGradient",
            [w, w, np.array([0], np.int64), w[:1], np.ones(1, np.float32), np.array([1], np.int32)],
            input_names=["w", "h", "i", "g", "lr", "L"],
            output_names=["w2", "h"],
        )
    with pytest.raises(ShapeError, match="LENGTHS 'L' must be int32"):
        run_op(
            "SparseAdagradFusedWithSparseLengthsSumGradient",
            [w, w, np.array([0], np.int64), w[:1], np.ones(1, np.float32), np.array([1], np.int64)],
            input_names=["w", "h", "i", "g", "lr", "L"],
            output_names=["w", "h"],
        )
    with pytest.raises(BadArgumentError, match="p=1 or p=2"):
        run_op("SparseLpRegularizer", [w, np.array([0])], input_names=["w", "i"], output_names=["w"], p=3.0)


@pytest.mark.parametrize("halflife", [-1, 5])
def test_row_wise_sparse_adagrad_with_counter(caffe2, halflife):
    """RowWiseSparseAdagrad's 6th input (RowWiseCounter's counter) scales each row's weight decay by
    counter_halflife / counter where the counter is positive."""
    rng = np.random.default_rng(5)
    inputs = {
        "w": rng.uniform(-1, 1, (4, 3)).astype(np.float32),
        "h": rng.uniform(0.25, 1, (4,)).astype(np.float32),
        "i": np.array([1, 3, 1, 0], np.int64),
        "g": rng.uniform(-1, 1, (4, 3)).astype(np.float32),
        "lr": np.array([0.5], np.float32),
        "c": np.array([0.0, 2.5, -1.0, 7.0], np.float64),
    }
    op = make_op("RowWiseSparseAdagrad", list(inputs), ["w", "h"], weight_decay=0.125, counter_halflife=halflife)
    assert check_op(caffe2, op, inputs) is not None


@pytest.mark.parametrize("it", [0, 4, 5, 1000])
@pytest.mark.parametrize("grad_out", [False, True])
def test_sparse_adam_radam(caffe2, it, grad_out):
    """SparseAdam with enableRAdam: the plain momentum step while ρt < 5 (the first steps), then the
    rectified Adam step (optimizer.AdamOptimizer(enableRAdam=True) builds it)."""
    rng = np.random.default_rng(it)
    inputs = {
        "w": rng.uniform(-1, 1, (4, 2)).astype(np.float32),
        "m": rng.uniform(-1, 1, (4, 2)).astype(np.float32),
        "v": rng.uniform(0, 1, (4, 2)).astype(np.float32),
        "i": np.array([2, 0, 2], np.int64),
        "g": rng.uniform(-1, 1, (3, 2)).astype(np.float32),
        "lr": np.array([0.25], np.float32),
        "it": np.array([it], np.int64),
    }
    outputs = ["w", "m", "v"] + (["g_out"] if grad_out else [])
    op = make_op("SparseAdam", list(inputs), outputs, enableRAdam=1, beta2=0.99)
    assert check_op(caffe2, op, inputs) is not None
