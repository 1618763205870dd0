"""Differential tests of the training-step ops against real Caffe2 (see tests/differential.py).

Mutex blobs cannot be fetched from Caffe2 (they are not tensors): CreateMutex and AtomicIter are run as
the net `CreateMutex -> AtomicIter` in both, and the iteration counter is compared."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import (
    Case,
    arrays,
    assert_blobs_equal,
    cases,
    check_op,
    invalid,
    make_op,
    run_case,
    run_rnn2jax,
    shapes,
)


def f32(low: float, high: float):
    """float32 values in [low, high] (the bounds rounded to float32)."""
    return st.floats(float(np.float32(low)), float(np.float32(high)), width=32, allow_subnormal=False)


def counter(data):
    return np.asarray([data.draw(st.integers(0, 10**6))], np.int64)


def draw_iter(data):
    return make_op("Iter", ["iter"], ["iter"]), {"iter": counter(data)}


def draw_atomic_iter(data):
    """The op under test is the last of the two (AtomicIter); CreateMutex runs before it."""
    return make_op("AtomicIter", ["mutex", "iter"], ["iter"]), {"iter": counter(data)}


def draw_create_mutex(data):
    return make_op("CreateMutex", [], ["mutex"]), {"iter": counter(data)}


def _iters(upper: int = 10**6):
    """Iteration counts and thresholds: small (near the boundaries) or large."""
    return st.one_of(st.integers(0, 12), st.integers(0, upper))


_UNIT = f32(0.0, 1.0)
_WARMUP = {
    "start_warmup_multiplier": _UNIT,
    "constant_warmup_num_iter": _iters(),
    "linear_warmup_num_iter": _iters(),
}
POLICIES = {
    "fixed": {},
    "step": {"stepsize": st.integers(1, 1000), "gamma": f32(0.125, 1.0)},
    "exp": {"gamma": f32(0.5, 1.0)},
    "inv": {"gamma": f32(0.0, 0.5), "power": f32(0.0, 2.0)},
    "poly": {"power": f32(0.0, 2.0), "max_iter": st.integers(10**6 + 1, 10**7)},
    "linearWarmup": {"start_multiplier": _UNIT, "num_iter": _iters()},
    "constantWarmup": {"multiplier": f32(0.0, 2.0), "num_iter": _iters()},
    "gate": {"multiplier_1": _UNIT, "multiplier_2": f32(0.0, 2.0), "num_iter": _iters()},
    "slope": {"num_iter_1": _iters(), "multiplier_1": _UNIT, "num_iter_2": _iters(), "multiplier_2": _UNIT},
    "pieceWarmup": {"m1": _UNIT, "n1": _iters(), "m2": _UNIT, "n2": _iters(), "m3": _UNIT},
    "alter": {
        "active_first": st.integers(0, 1),
        "active_period": _iters(1000),
        "inactive_period": st.integers(1, 1000),
    },
    "hill": {
        "num_iter": _iters(),
        "start_multiplier": _UNIT,
        "gamma": f32(0.0, 0.5),
        "power": f32(0.0, 2.0),
        "end_multiplier": _UNIT,
    },
    "cyclical": {"max_lr": _UNIT, "stepsize": st.integers(1, 10**5), "decay": f32(0.5, 1.0)},
    "cosine": {
        "min_lr": _UNIT,
        "max_lr": _UNIT,
        "period": st.integers(1, 10**5),
        "t_mult": st.sampled_from([1.0, 1.5, 2.0]),
        "lr_shrink": f32(0.5, 1.0),
    },
    "constantThenLinearWarmup": _WARMUP,
    "compositeCyclical": {
        **_WARMUP,
        "cyclical_max_lr": _UNIT,
        "cyclical_step_size": st.integers(1, 10**5),
        "cyclical_decay": f32(0.5, 1.0),
    },
    "compositeCosine": {
        **_WARMUP,
        "cosine_min_lr": _UNIT,
        "cosine_max_lr": _UNIT,
        "cosine_period": st.integers(1, 10**5),
        "cosine_t_mult": st.sampled_from([1.0, 1.5, 2.0]),
        "cosine_lr_shrink": f32(0.5, 1.0),
    },
    "composite": {},  # sub-policies drawn in draw_learning_rate
}
# Integer arguments Caffe2 divides by (0 kills it with SIGFPE): drawn > 0 above.


def _policy_args(data, policy, prefix=""):
    args = {}
    for name, strategy in POLICIES[policy].items():
        if data.draw(st.integers(0, 5)):  # mostly given, sometimes left to the default
            args[prefix + name] = data.draw(strategy)
    for name in ("stepsize", "period", "cosine_period", "cyclical_step_size"):
        if name in POLICIES[policy] and prefix + name not in args and policy != "cosine":
            args[prefix + name] = data.draw(POLICIES[policy][name])  # defaults 0 (stepsize) or huge
    return args


def draw_learning_rate(data):
    policy = data.draw(st.sampled_from(sorted(POLICIES)))
    base_lr = data.draw(f32(-1.0, 1.0))
    if policy in ("cyclical", "compositeCyclical", "composite") and base_lr == 0:
        base_lr = 0.5  # the cyclical policies divide by base_lr
    args = {"base_lr": base_lr, "policy": policy}
    if policy == "composite":
        subs = data.draw(st.lists(st.sampled_from(sorted(set(POLICIES) - {"composite"})), min_size=1, max_size=3))
        args["sub_policy_num_iters"] = [data.draw(_iters(1000).map(lambda n: n + 1)) for _ in subs]
        for k, sub in enumerate(subs):
            args[f"sub_policy_{k}_policy"] = sub
            args.update(_policy_args(data, sub, f"sub_policy_{k}_"))
            if data.draw(st.booleans()):
                args[f"sub_policy_{k}_lr_scale"] = data.draw(f32(0.0, 2.0))
        if invalid(data):
            args[f"sub_policy_{len(subs) - 1}_policy"] = data.draw(st.sampled_from(["composite", "nope", ""]))
    else:
        args.update(_policy_args(data, policy))
    if policy == "poly" and "max_iter" in args and data.draw(st.booleans()):
        del args["max_iter"]  # the default -1: Caffe2 keeps it as uint64, a rate that never decays
    if data.draw(st.booleans()):
        args["lr_scale"] = data.draw(f32(0.0, 2.0))
    if invalid(data):
        args["policy"] = data.draw(st.sampled_from(["nope", "cyclic", ""]))
    it = np.asarray([data.draw(st.integers(0, 10**4) if policy == "exp" else _iters())], np.int64)
    return make_op("LearningRate", ["iter"], ["lr"], **args), {"iter": it}


def draw_weighted_sum(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    pairs = data.draw(st.integers(1, 3))
    inputs = {}
    for i in range(pairs):
        inputs[f"x{i}"] = data.draw(arrays(shape, np.float32))
        inputs[f"w{i}"] = data.draw(arrays((1,), np.float32, -2, 2))
    args = {"grad_on_w": 1} if data.draw(st.booleans()) else {}
    # Not in place: see test_weighted_sum_in_place.
    return make_op("WeightedSum", list(inputs), ["y"], **args), inputs


CASES = cases(
    Case("Iter", draw_iter),
    Case("AtomicIter", draw_atomic_iter, note="run after CreateMutex; the counter is compared"),
    Case("CreateMutex", draw_create_mutex, note="run before AtomicIter; the counter is compared"),
    Case("LearningRate", draw_learning_rate),
    Case("WeightedSum", draw_weighted_sum, gradient_ops=("WeightedSumGradient",)),
)
BASE_CASES = dict(CASES)


@pytest.mark.parametrize("case", BASE_CASES.values(), ids=BASE_CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type in ("AtomicIter", "CreateMutex"):
        _, inputs = case.draw(data)
        ops = [make_op("CreateMutex", [], ["mutex"]), make_op("AtomicIter", ["mutex", "iter"], ["iter"])]
        want = caffe2.run([("ops", ops)], inputs, fetch=["iter"])
        assert_blobs_equal(run_rnn2jax(ops, inputs, ["iter"]), want)
        return
    run_case(caffe2, case, data)


def test_iter_without_input_starts_at_one(caffe2):
    """The old form `Iter() -> iter` creates an int64 [1] counter on its first run."""
    op = make_op("Iter", [], ["iter"])
    want = caffe2.run_op(op, {})
    assert_blobs_equal(run_rnn2jax([op], {}, ["iter"]), want)


@given(data=st.data())
def test_weighted_sum_in_place(caffe2, data):
    """In place (`WeightedSum(x0, w0, ...) -> x0`, SGD's update) the forward matches. Caffe2's gradient of
    that form is broken: its maker names the gradient op's output x0_grad, also its input 0, and
    WeightedSumGradient's own schema refuses that ("Operator def did not pass schema checking"); the
    builder makes the same ops, and rnn2jax runs them."""
    op, inputs = draw_weighted_sum(data)
    op.output[0] = "x0"
    check_op(caffe2, op, inputs)


# --------------------------------------------------------------------------------------------------
# Optimizer updates. Each runs in place, as Caffe2's optimizers build them (the sparse ones must).


def _lr(data):
    return data.draw(arrays((1,), np.float32, -1, 1))


def _dense(data, n_moments: int, positive: tuple[int, ...] = ()):
    """A parameter-shaped float tensor per name; those in `positive` are non-negative (second moments)."""
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    values = []
    for i in range(n_moments):
        low = 0.0 if i in positive else -1.0
        values.append(data.draw(arrays(shape, np.float32, low, 1.0)))
    return shape, values


def _maybe_bad_grad(data, shape):
    """The gradient's shape: the parameter's, or (invalid) one element more."""
    if invalid(data):
        return (*shape[:-1], shape[-1] + 1)
    return shape


def _args(data, **strategies):
    """Each argument drawn or left to its default."""
    return {name: data.draw(s) for name, s in strategies.items() if data.draw(st.booleans())}


def _iter(data):
    return np.asarray([data.draw(st.integers(0, 10**4))], np.int64)


def draw_adam(data):
    shape, (w, m, v) = _dense(data, 3, positive=(2,))
    g = data.draw(arrays(_maybe_bad_grad(data, shape), np.float32))
    outputs = ["w", "m", "v"] + (["g_out"] if data.draw(st.booleans()) else [])
    args = _args(
        data,
        beta1=f32(0.5, 0.99),
        beta2=f32(0.9, 0.999),
        epsilon=f32(1e-6, 1e-2),
    )
    inputs = {"w": w, "m": m, "v": v, "g": g, "lr": _lr(data), "iter": _iter(data)}
    return make_op("Adam", list(inputs), outputs, **args), inputs


def draw_decay_adagrad(data):
    shape, (w, m, v) = _dense(data, 3, positive=(2,))
    g = data.draw(arrays(_maybe_bad_grad(data, shape), np.float32))
    args = _args(
        data,
        beta1=f32(0.5, 0.99),
        epsilon=f32(1e-6, 1e-2),
        weight_decay=f32(0.0, 0.1),
        bias_correction_first=st.integers(0, 1),
    )
    inputs = {"w": w, "m": m, "v": v, "g": g, "lr": _lr(data), "iter": _iter(data)}
    return make_op("DecayAdagrad", list(inputs), ["w", "m", "v"], **args), inputs


def draw_adagrad(data):
    shape, (w, h) = _dense(data, 2, positive=(1,))
    g = data.draw(arrays(_maybe_bad_grad(data, shape), np.float32))
    outputs = ["w", "h", "effective_lr", "update"][: data.draw(st.integers(2, 4))]
    args = _args(
        data,
        epsilon=f32(1e-6, 1e-2),
        decay=f32(0.5, 1.0),
        weight_decay=f32(0.0, 0.1),
    )
    inputs = {"w": w, "h": h, "g": g, "lr": _lr(data)}
    return make_op("Adagrad", list(inputs), outputs, **args), inputs


def draw_momentum_sgd(data):
    _shape, (g, m) = _dense(data, 2)
    if invalid(data):
        m = np.zeros((m.size + 1,), np.float32)
    args = _args(data, momentum=f32(0.0, 0.99), nesterov=st.integers(0, 1))
    inputs = {"g": g, "m": m, "lr": _lr(data)}
    return make_op("MomentumSGD", list(inputs), ["g", "m"], **args), inputs


def draw_momentum_sgd_update(data):
    _shape, (g, m, w) = _dense(data, 3)
    args = _args(data, momentum=f32(0.0, 0.99), nesterov=st.integers(0, 1))
    inputs = {"g": g, "m": m, "lr": _lr(data), "w": w}
    if invalid(data):
        inputs["lr"] = np.zeros((2,), np.float32)
    return make_op("MomentumSGDUpdate", list(inputs), ["g", "m", "w"], **args), inputs


def draw_adadelta(data):
    shape, (w, h, d) = _dense(data, 3, positive=(1, 2))
    g = data.draw(arrays(_maybe_bad_grad(data, shape), np.float32))
    args = _args(data, epsilon=f32(1e-6, 1e-2), decay=f32(0.5, 0.99))
    if invalid(data):
        args["decay"] = 1.0
    inputs = {"w": w, "h": h, "d": d, "g": g, "lr": _lr(data)}
    return make_op("Adadelta", list(inputs), ["w", "h", "d"], **args), inputs


def draw_wngrad(data):
    shape, (w,) = _dense(data, 1)
    g = data.draw(arrays(_maybe_bad_grad(data, shape), np.float32))
    b = data.draw(arrays((1,), np.float32, 0.5, 2.0))
    outputs = ["w", "b", "effective_lr", "update"][: data.draw(st.integers(2, 4))]
    args = _args(data, epsilon=f32(1e-6, 1e-2))
    inputs = {"w": w, "b": b, "g": g, "lr": _lr(data)}
    return make_op("Wngrad", list(inputs), outputs, **args), inputs


def draw_rms_prop(data):
    _shape, (g, ms, mom) = _dense(data, 3, positive=(1,))
    if invalid(data):
        mom = np.zeros((mom.size + 1,), np.float32)
    args = _args(
        data,
        decay=f32(0.5, 0.99),
        momentum=f32(0.0, 0.9),
        epsilon=f32(1e-6, 1e-2),
    )
    inputs = {"g": g, "ms": ms, "mom": mom, "lr": _lr(data)}
    return make_op("RmsProp", list(inputs), ["g", "ms", "mom"], **args), inputs


FTRL_ARGS = {
    "beta": f32(0.5, 2.0),
    "lambda1": f32(0.0, 0.1),
    "lambda2": f32(0.0, 0.1),
}


def draw_ftrl(data):
    shape, (w, g) = _dense(data, 2)
    nz = np.stack([data.draw(arrays(shape, np.float32, 0, 1)), data.draw(arrays(shape, np.float32))], axis=-1)
    args = _args(data, **FTRL_ARGS)
    inputs = {"w": w, "nz": nz, "g": g}
    if data.draw(st.booleans()):
        inputs["alpha"] = data.draw(arrays((1,), np.float32, 0.015625, 1.0))
        if invalid(data):
            args["alpha"] = 0.5  # both input and argument
    elif data.draw(st.booleans()):
        args["alpha"] = data.draw(f32(0.01, 1.0))
    return make_op("Ftrl", list(inputs), ["w", "nz"], **args), inputs


def draw_lars(data):
    _shape, (x, dx) = _dense(data, 2)
    if data.draw(st.booleans()):
        x = np.zeros_like(x)
    inputs = {
        "X": x,
        "dX": dx,
        "wd": data.draw(arrays((1,), np.float32, 0, 0.125)),
        "trust": data.draw(arrays((1,), np.float32, 0, 1)),
        "lr_max": data.draw(arrays((1,), np.float32, 0, 2)),
    }
    args = _args(data, offset=f32(0.0, 1.0), lr_min=f32(0.0, 0.1))
    if invalid(data):
        args["offset"] = -1.0
    return make_op("Lars", list(inputs), ["rescale"], **args), inputs


def draw_clip_tensor_by_scaling(data):
    x = data.draw(arrays(shapes(1, 3, min_side=0 if invalid(data) else 1), np.float32, -2, 2))
    inputs = {"X": x, "val": data.draw(arrays((1,), np.float32, 0, 4))}
    if data.draw(st.booleans()):
        inputs["extra"] = data.draw(arrays((1,), np.float32, 0.25, 2))
    threshold = data.draw(f32(0.125, 3.0)) if not invalid(data) else 0.0
    return make_op("ClipTensorByScaling", list(inputs), ["Y"], threshold=threshold), inputs


# Sparse: PARAM [R, ...], INDICES of any shape with repeats, GRAD = INDICES.shape + PARAM.shape[1:].


def _sparse(data, n_tables: int, positive: tuple[int, ...] = (), row_wise: tuple[int, ...] = (), checked=True):
    """`checked`: Caffe2 checks the gradient's shape (SparseFtrl only DCHECKs it: no invalid draw)."""
    rows = data.draw(st.integers(1, 5))
    block = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    tables = []
    for i in range(n_tables):
        shape = (rows,) if i in row_wise else (rows, *block)
        tables.append(data.draw(arrays(shape, np.float32, 0.0 if i in positive else -1.0, 1.0)))
    index_shape = data.draw(st.sampled_from([(data.draw(st.integers(0, 5)),), (2, data.draw(st.integers(1, 2)))]))
    dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    indices = data.draw(arrays(index_shape, dtype, 0, rows - 1))
    grad_shape = (*index_shape, *block)
    if checked and invalid(data):
        grad_shape = (*index_shape, *block, 2)
    grad = data.draw(arrays(grad_shape, np.float32))
    return tables, indices, grad


def draw_sparse_adam(data, op_type="SparseAdam"):
    row_wise = (2,) if op_type == "RowWiseSparseAdam" else ()
    (w, m, v), indices, g = _sparse(data, 3, positive=(2,), row_wise=row_wise)
    outputs = ["w", "m", "v"] + (["g_out"] if data.draw(st.booleans()) else [])
    args = _args(
        data,
        beta1=f32(0.5, 0.99),
        beta2=f32(0.9, 0.999),
        epsilon=f32(1e-6, 1e-2),
    )
    inputs = {"w": w, "m": m, "v": v, "indices": indices, "g": g, "lr": _lr(data), "iter": _iter(data)}
    return make_op(op_type, list(inputs), outputs, **args), inputs


def draw_sparse_adagrad(data, op_type="SparseAdagrad"):
    row_wise = (1,) if op_type == "RowWiseSparseAdagrad" else ()
    (w, h), indices, g = _sparse(data, 2, positive=(1,), row_wise=row_wise)
    args = _args(data, epsilon=f32(1e-6, 1e-2), weight_decay=f32(0.0, 0.1))
    inputs = {"w": w, "h": h, "indices": indices, "g": g, "lr": _lr(data)}
    outputs = ["w", "h"] if not invalid(data) else ["w_new", "h"]
    return make_op(op_type, list(inputs), outputs, **args), inputs


def draw_sparse_momentum_sgd_update(data):
    (m, w), indices, g = _sparse(data, 2)
    args = _args(data, momentum=f32(0.0, 0.99), nesterov=st.integers(0, 1))
    inputs = {"g": g, "m": m, "lr": _lr(data), "w": w, "indices": indices}
    return make_op("SparseMomentumSGDUpdate", list(inputs), ["g_out", "m", "w"], **args), inputs


def draw_sparse_adadelta(data):
    (w, h, d), indices, g = _sparse(data, 3, positive=(1, 2))
    args = _args(data, epsilon=f32(1e-6, 1e-2), decay=f32(0.5, 0.99))
    inputs = {"w": w, "h": h, "d": d, "indices": indices, "g": g, "lr": _lr(data)}
    return make_op("SparseAdadelta", list(inputs), ["w", "h", "d"], **args), inputs


def draw_sparse_wngrad(data):
    (w,), indices, g = _sparse(data, 1)
    b = data.draw(arrays((1,), np.float32, 0.5, 2.0))
    args = _args(data, epsilon=f32(1e-6, 1e-2))
    inputs = {"w": w, "b": b, "indices": indices, "g": g, "lr": _lr(data)}
    return make_op("SparseWngrad", list(inputs), ["w", "b"], **args), inputs


def draw_sparse_ftrl(data):
    (w, n, z), indices, g = _sparse(data, 3, positive=(1,), checked=False)
    nz = np.stack([n, z], axis=-1)
    args = _args(data, **FTRL_ARGS)
    inputs = {"w": w, "nz": nz, "indices": indices, "g": g}
    if data.draw(st.booleans()):
        inputs["alpha"] = data.draw(arrays((1,), np.float32, 0.015625, 1.0))
    elif data.draw(st.booleans()):
        args["alpha"] = data.draw(f32(0.01, 1.0))
    return make_op("SparseFtrl", list(inputs), ["w", "nz"], **args), inputs


def draw_sparse_normalize(data):
    """Distinct indices: with a repeated row, the second pass compares the norm just set to `norm`
    with `norm` itself, which float rounding decides either way."""
    (w,), indices, g = _sparse(data, 1)
    unique = np.unique(indices.reshape(-1)).astype(indices.dtype)
    g = np.zeros((unique.size, *w.shape[1:]), np.float32)
    inputs = {"w": w * 3, "indices": unique}
    if data.draw(st.booleans()):
        inputs["g"] = g
    args = _args(data, norm=f32(0.25, 2.0), use_max_norm=st.integers(0, 1))
    return make_op("SparseNormalize", list(inputs), ["w"], **args), inputs


OPTIMIZER_CASES = cases(
    Case("Adam", draw_adam),
    Case("SparseAdam", draw_sparse_adam),
    Case("RowWiseSparseAdam", lambda data: draw_sparse_adam(data, "RowWiseSparseAdam")),
    Case("Adagrad", draw_adagrad),
    Case("SparseAdagrad", draw_sparse_adagrad),
    Case("RowWiseSparseAdagrad", lambda data: draw_sparse_adagrad(data, "RowWiseSparseAdagrad")),
    Case("DecayAdagrad", draw_decay_adagrad),
    Case("MomentumSGD", draw_momentum_sgd),
    Case("MomentumSGDUpdate", draw_momentum_sgd_update),
    Case("SparseMomentumSGDUpdate", draw_sparse_momentum_sgd_update),
    Case("Adadelta", draw_adadelta),
    Case("SparseAdadelta", draw_sparse_adadelta),
    Case("Wngrad", draw_wngrad),
    Case("SparseWngrad", draw_sparse_wngrad),
    Case("RmsProp", draw_rms_prop),
    Case("Ftrl", draw_ftrl),
    Case("SparseFtrl", draw_sparse_ftrl),
    Case("Lars", draw_lars),
    Case("ClipTensorByScaling", draw_clip_tensor_by_scaling),
    Case("SparseNormalize", draw_sparse_normalize),
)
CASES.update(OPTIMIZER_CASES)


@pytest.mark.parametrize("case", OPTIMIZER_CASES.values(), ids=OPTIMIZER_CASES.keys())
@given(data=st.data())
def test_optimizers_match_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def _repeated_rows_op(op_type):
    """Each sparse optimizer on PARAM [3, 2] with INDICES [1, 1, 0, 1]: row 1 is updated three times in a row."""
    rng = np.random.default_rng(7)
    w = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
    pos = rng.uniform(0.25, 1, (3, 2)).astype(np.float32)
    indices = np.array([1, 1, 0, 1], np.int64)
    g = rng.uniform(-1, 1, (4, 2)).astype(np.float32)
    lr, it = np.array([0.5], np.float32), np.array([3], np.int64)
    inputs = {
        "SparseAdam": (
            {"w": w, "m": w * 0.5, "v": pos, "i": indices, "g": g, "lr": lr, "it": it},
            ["w", "m", "v", "go"],
        ),
        "RowWiseSparseAdam": (
            {"w": w, "m": w * 0.5, "v": pos[:, 0], "i": indices, "g": g, "lr": lr, "it": it},
            ["w", "m", "v"],
        ),
        "SparseAdagrad": ({"w": w, "h": pos, "i": indices, "g": g, "lr": lr}, ["w", "h"]),
        "RowWiseSparseAdagrad": ({"w": w, "h": pos[:, 0], "i": indices, "g": g, "lr": lr}, ["w", "h"]),
        "SparseMomentumSGDUpdate": ({"g": g, "m": w * 0.5, "lr": lr, "w": w, "i": indices}, ["go", "m", "w"]),
        "SparseAdadelta": ({"w": w, "h": pos, "d": pos * 0.5, "i": indices, "g": g, "lr": lr}, ["w", "h", "d"]),
        "SparseWngrad": ({"w": w, "b": np.array([1.5], np.float32), "i": indices, "g": g, "lr": lr}, ["w", "b"]),
        "SparseFtrl": ({"w": w, "nz": np.stack([pos, w], -1), "i": indices, "g": g}, ["w", "nz"]),
    }[op_type]
    args = {"momentum": 0.9} if op_type == "SparseMomentumSGDUpdate" else {}
    return make_op(op_type, list(inputs[0]), inputs[1], **args), inputs[0]


@pytest.mark.parametrize(
    "op_type",
    [
        "SparseAdam",
        "RowWiseSparseAdam",
        "SparseAdagrad",
        "RowWiseSparseAdagrad",
        "SparseMomentumSGDUpdate",
        "SparseAdadelta",
        "SparseWngrad",
        "SparseFtrl",
    ],
)
def test_sparse_updates_repeat_rows_in_order(caffe2, op_type):
    """Caffe2 updates a row named twice twice, the second time from the first's result (its loops run in
    place); rnn2jax's rounds do the same, under jit."""
    op, inputs = _repeated_rows_op(op_type)
    assert check_op(caffe2, op, inputs) is not None
