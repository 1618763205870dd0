"""The optimizer family (rnn2jax/ops/optimizer.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: Training-step ops (Iter, AtomicIter, CreateMutex, LearningRate, WeightedSum
and its gradient) against NumPy references written from Caffe2's caffe2/sgd/iter_op.h, learning_rate_functors.h and
operators/utility_ops.h, plus the SGD step of a real Caffe2 training net.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the training-step ops
against real Caffe2 (see tests/differential.py).

Mutex blobs cannot be fetched from Caffe2 (they are not tensors): CreateMutex and AtomicIter are run as the net
`CreateMutex -> AtomicIter` in both, and the iteration counter is compared.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

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
from helpers import run_op
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower
from rnn2jax.proto import caffe2_pb2 as pb

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_optimizer.py)

INT64 = np.dtype(np.int64)  # the iteration counter's dtype, as in Caffe2
F32 = {"rtol": 1e-5, "atol": 1e-6}

small_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


def floats(shape, low=-10.0, high=10.0) -> st.SearchStrategy[np.ndarray]:
    elements = st.floats(low, high, width=32, allow_subnormal=False)
    return hnp.arrays(np.float32, shape, elements=elements)


def counter(value: int) -> np.ndarray:
    return np.array([value], INT64)


def run_net(ops, inputs: dict, outputs: list[str], jit: bool) -> list[np.ndarray]:
    lowered = lower(load(create_net("t", ops)))

    def fn(env):
        out = lowered(env)
        return [out[n] for n in outputs]

    return [np.asarray(o) for o in (jax.jit(fn) if jit else fn)(inputs)]


# --------------------------------------------------------------------------------------------------
# Iter / AtomicIter / CreateMutex


@given(value=st.integers(0, 2**30))
def test_iter_increments_in_place(jit, value):
    (it,) = run_op("Iter", [counter(value)], jit=jit, input_names=["it"], output_names=["it"])
    assert it.dtype == INT64
    np.testing.assert_array_equal(it, [value + 1])


def test_iter_without_input_starts_at_one_or_increments_the_blob(jit):
    (it,) = run_op("Iter", [], jit=jit, output_names=["it"])
    assert it.dtype == INT64
    np.testing.assert_array_equal(it, [1])
    ops = [
        create_operator("ConstantFill", [], ["it"], shape=[1], value=41, dtype=pb.TensorProto.INT64),
        create_operator("Iter", [], ["it"]),
    ]
    (it,) = run_net(ops, {}, ["it"], jit)
    np.testing.assert_array_equal(it, [42])


def test_atomic_iter_with_mutex(jit):
    """The counter ops of a real Caffe2 training net: CreateMutex once, then AtomicIter each step."""
    ops = [
        create_operator("ConstantFill", [], ["it"], shape=[1], value=0, dtype=pb.TensorProto.INT64),
        create_operator("CreateMutex", [], ["mutex"]),
        *[create_operator("AtomicIter", ["mutex", "it"], ["it"]) for _ in range(3)],
    ]
    (it,) = run_net(ops, {}, ["it"], jit)
    assert it.dtype == INT64
    np.testing.assert_array_equal(it, [3])


@pytest.mark.parametrize(
    ("op_type", "inputs", "names", "error", "match"),
    [
        ("Iter", [counter(0)], (["a"], ["b"]), BadArgumentError, "in place: input 'a' and output 'b'"),
        ("AtomicIter", [np.int32(0), counter(0)], (["m", "a"], ["b"]), BadArgumentError, "in place"),
        ("Iter", [np.zeros(2, INT64)], (["it"], ["it"]), ShapeError, "must hold one element"),
        ("Iter", [np.zeros(1, np.float32)], (["it"], ["it"]), ShapeError, "integer"),
    ],
)
def test_iter_errors(jit, op_type, inputs, names, error, match):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, jit=jit, input_names=names[0], output_names=names[1])


# --------------------------------------------------------------------------------------------------
# LearningRate


def lr_reference(policy: str, it: int, base_lr: float, **a) -> np.float32:
    """Caffe2's learning-rate functors, in float32 like the C++ (T = float)."""
    f = np.float32
    if policy == "fixed":
        m = f(1)
    elif policy == "step":
        m = np.power(f(a.get("gamma", 0)), f(it // a["stepsize"]))
    elif policy == "exp":
        m = np.power(f(a.get("gamma", 0)), f(it))
    elif policy == "inv":
        m = np.power(f(1) + f(a.get("gamma", 0)) * f(it), -f(a.get("power", 0)))
    else:  # poly; max_iter is stored as uint64
        limit = f(a.get("max_iter", -1) % 2**64)
        m = np.power(f(1) - f(it) / limit, f(a.get("power", 0)))
    return f(base_lr) * m  # Caffe2's LearningRateOp ignores lr_scale


@st.composite
def lr_cases(draw):
    policy = draw(st.sampled_from(["fixed", "step", "exp", "inv", "poly"]))
    args: dict = {}
    if policy == "step":
        args["stepsize"] = draw(st.integers(1, 50))
    if policy in ("step", "exp", "inv") and draw(st.booleans()):
        args["gamma"] = draw(st.floats(0.5, 1.0, width=32))
    if policy in ("inv", "poly") and draw(st.booleans()):
        args["power"] = draw(st.floats(0.25, 2.0, width=32))
    it = draw(st.integers(0, 2000))
    if policy == "poly" and draw(st.booleans()):
        args["max_iter"] = draw(st.integers(it + 1, 5000))
    if draw(st.booleans()):
        args["lr_scale"] = draw(st.floats(0.5, 2.0, width=32))
    base_lr = draw(st.floats(-3, 3, width=32))
    return policy, it, base_lr, args


@given(case=lr_cases())
def test_learning_rate_policies(jit, case):
    policy, it, base_lr, args = case
    (lr,) = run_op("LearningRate", [counter(it)], jit=jit, policy=policy, base_lr=base_lr, **args)
    assert lr.shape == ()
    assert lr.dtype == np.float32
    np.testing.assert_allclose(lr, lr_reference(policy, it, base_lr, **args), rtol=2e-5, atol=1e-7)


def test_learning_rate_step_as_in_a_real_training_net(jit):
    """breadbread's train plan: policy step, stepsize 1, base_lr -2.5, gamma 0.9999."""
    args = {"policy": "step", "stepsize": 1, "base_lr": -2.5, "gamma": 0.9999}
    for it in (0, 1, 2, 1000):
        (lr,) = run_op("LearningRate", [counter(it)], jit=jit, **args)
        np.testing.assert_allclose(lr, -2.5 * np.float32(0.9999) ** np.float32(it), rtol=1e-5)


# Schedules as real Caffe2 (torch 1.10.2) prints them for iterations 0, 1, 2, ... (step `every`).
PINNED_SCHEDULES = [
    (
        {"policy": "cyclical", "base_lr": 0.1, "max_lr": 0.5, "stepsize": 4, "decay": 0.5},
        2,
        [0.1, 0.3, 0.5, 0.3, 0.1, 0.2, 0.3, 0.2, 0.1, 0.15],
    ),
    ({"policy": "cyclical", "base_lr": 0.1, "stepsize": 4}, 2, [0.1, 0.0525, 0.005, 0.0525, 0.1, 0.0525]),
    (
        {"policy": "cosine", "base_lr": 1.0, "max_lr": 0.5, "min_lr": 0.1, "period": 4},
        2,
        [0.5, 0.3, 0.495, 0.297, 0.49005, 0.29403],
    ),
    ({"policy": "cosine", "base_lr": 1.0}, 20, [0.5, 0.3618034, 0.1381966, 0.45718536, 0.23581463, 0.49005]),
    (
        {
            "policy": "cosine",
            "base_lr": 1.0,
            "max_lr": 0.5,
            "min_lr": 0.1,
            "period": 4,
            "t_mult": 2.0,
            "lr_shrink": 0.5,
        },
        3,
        [0.5, 0.15857865, 0.22071068, 0.11173166, 0.125, 0.11657348, 0.09413417, 0.06524549, 0.03964466, 0.02596074],
    ),
    (
        {"policy": "gate", "base_lr": 1.0, "multiplier_1": 0.5, "multiplier_2": 2.0, "num_iter": 3},
        1,
        [0.5, 0.5, 0.5, 2.0, 2.0],
    ),
    ({"policy": "gate", "base_lr": 1.0}, 1, [1.0, 1.0]),
    (
        {"policy": "pieceWarmup", "base_lr": 1.0, "m1": 0.1, "n1": 2, "m2": 0.3, "n2": 4, "m3": 0.7},
        1,
        [0.1, 0.1, 0.3, 0.3, 0.7, 0.7],
    ),
    (
        {
            "policy": "composite",
            "base_lr": 1.0,
            "sub_policy_num_iters": [2, 3],
            "sub_policy_0_policy": "exp",
            "sub_policy_0_gamma": 0.5,
            "sub_policy_0_lr_scale": 2.0,
            "sub_policy_1_policy": "fixed",
        },
        1,
        [2.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0],
    ),
    (
        {
            "policy": "constantThenLinearWarmup",
            "base_lr": 1.0,
            "start_warmup_multiplier": 0.2,
            "constant_warmup_num_iter": 2,
            "linear_warmup_num_iter": 4,
        },
        1,
        [0.2, 0.2, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0],
    ),
    (
        {
            "policy": "compositeCyclical",
            "base_lr": 0.1,
            "start_warmup_multiplier": 0.2,
            "constant_warmup_num_iter": 2,
            "linear_warmup_num_iter": 2,
            "cyclical_max_lr": 0.5,
            "cyclical_step_size": 2,
            "cyclical_decay": 0.5,
        },
        1,
        [0.02, 0.02, 0.02, 0.06, 0.1, 0.3, 0.5, 0.3, 0.1, 0.2, 0.3, 0.2],
    ),
    (
        {
            "policy": "compositeCosine",
            "base_lr": 1.0,
            "start_warmup_multiplier": 0.2,
            "constant_warmup_num_iter": 2,
            "linear_warmup_num_iter": 2,
            "cosine_max_lr": 0.5,
            "cosine_min_lr": 0.1,
            "cosine_period": 4,
        },
        1,
        [0.2, 0.2, 0.2, 0.6, 0.5, 0.44142136, 0.3, 0.15857865, 0.495, 0.43700713, 0.297, 0.15699285],
    ),
    ({"policy": "alter", "base_lr": 1.0, "active_period": 2, "inactive_period": 3}, 1, [1, 1, 0, 0, 0, 1, 1]),
    (
        {
            "policy": "hill",
            "base_lr": 1.0,
            "num_iter": 3,
            "start_multiplier": 0.1,
            "gamma": 0.5,
            "power": 1.0,
            "end_multiplier": 0.2,
        },
        1,
        [0.1, 0.4, 0.7, 1.0, 0.6666667, 0.5, 0.4, 0.33333334, 0.2857143, 0.25],
    ),
    (
        {"policy": "linearWarmup", "base_lr": 1.0, "start_multiplier": 0.1, "num_iter": 4},
        1,
        [0.1, 0.325, 0.55, 0.775, 1.0, 1.0],
    ),
    ({"policy": "constantWarmup", "base_lr": 1.0, "num_iter": 2}, 1, [0.5, 0.5, 1.0, 1.0]),
]


@pytest.mark.parametrize(
    ("args", "every", "want"),
    PINNED_SCHEDULES,
    ids=[f"{a['policy']}-{i}" for i, (a, _, _) in enumerate(PINNED_SCHEDULES)],
)
def test_learning_rate_schedules_as_caffe2_prints_them(jit, args, every, want):
    got = [run_op("LearningRate", [counter(k * every)], jit=jit, **args)[0] for k in range(len(want))]
    np.testing.assert_allclose(np.array(got), np.array(want, np.float32), rtol=1e-6, atol=1e-7)


def cosine_reference(it, min_lr, max_lr, period, t_mult, lr_shrink):
    """SGDR (arXiv 1608.03983) in float64, written from the paper's formulas."""
    if t_mult != 1:
        i = np.floor(np.log(1 - it / period * (1 - t_mult)) / np.log(t_mult))
        t_i = t_mult**i * period
        t_curr = it - (1 - t_mult**i) / (1 - t_mult) * period
    else:
        i = np.floor(it / period)
        t_i, t_curr = period, it - period * i
    low, high = min_lr * lr_shrink**i, max_lr * lr_shrink**i
    return low + 0.5 * (high - low) * (1 + np.cos(np.pi * t_curr / t_i))


def cyclical_reference(it, base_lr, max_lr, stepsize, decay):
    """Triangular cyclical rate (arXiv 1506.01186) with a per-cycle decay of the peak, in float64."""
    cycle = it // (2 * stepsize)
    x = abs(it / stepsize - 2 * (cycle + 1) + 1)
    return base_lr * (1 + (abs(max_lr) / abs(base_lr) - 1) * max(0.0, 1 - x) * decay**cycle)


@given(
    it=st.integers(0, 10**5),
    period=st.integers(1, 1000),
    t_mult=st.sampled_from([1.0, 1.5, 2.0]),
    lr_shrink=st.floats(0.5, 1.0),
)
def test_learning_rate_cosine(jit, it, period, t_mult, lr_shrink):
    args = {"min_lr": 0.125, "max_lr": 0.75, "period": period, "t_mult": t_mult, "lr_shrink": lr_shrink}
    (lr,) = run_op("LearningRate", [counter(it)], jit=jit, policy="cosine", base_lr=2.0, **args)
    f32 = {k: float(np.float32(v)) for k, v in args.items()}
    np.testing.assert_allclose(lr, 2.0 * cosine_reference(it, **f32), rtol=1e-4, atol=1e-6)


@given(it=st.integers(0, 10**5), stepsize=st.integers(1, 1000), decay=st.floats(0.5, 1.0))
def test_learning_rate_cyclical(jit, it, stepsize, decay):
    (lr,) = run_op(
        "LearningRate",
        [counter(it)],
        jit=jit,
        policy="cyclical",
        base_lr=0.25,
        max_lr=1.0,
        stepsize=stepsize,
        decay=decay,
    )
    want = cyclical_reference(it, 0.25, 1.0, stepsize, float(np.float32(decay)))
    np.testing.assert_allclose(lr, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"policy": "fixed"}, "missing required argument 'base_lr'"),
        ({"base_lr": 0.1}, "missing required argument 'policy'"),
        ({"base_lr": 0.1, "policy": "multistep"}, "'multistep' is not supported"),
        ({"base_lr": 0.1, "policy": "step"}, "'stepsize' > 0"),
        ({"base_lr": 0.1, "policy": "poly", "max_iter": 0}, "'max_iter' != 0"),
        ({"base_lr": 0.1, "policy": "cyclical"}, "'stepsize' > 0"),
        ({"base_lr": 0.1, "policy": "cosine", "period": 0}, "'period' > 0"),
        ({"base_lr": 0.1, "policy": "alter", "active_period": 0, "inactive_period": 0}, "!= 0"),
        ({"base_lr": 0.1, "policy": "composite"}, "non-empty 'sub_policy_num_iters'"),
        ({"base_lr": 0.1, "policy": "composite", "sub_policy_num_iters": [0]}, "must be positive"),
        (
            {"base_lr": 0.1, "policy": "composite", "sub_policy_num_iters": [1], "sub_policy_0_policy": "composite"},
            "cannot be a sub-policy",
        ),
        (
            {"base_lr": 0.1, "policy": "composite", "sub_policy_num_iters": [1], "sub_policy_0_policy": "step"},
            "'sub_policy_0_stepsize' > 0",
        ),
        ({"base_lr": 0.1, "policy": 3}, "must be a string"),
    ],
)
def test_learning_rate_bad_arguments(jit, args, match):
    with pytest.raises(BadArgumentError, match=match):
        run_op("LearningRate", [counter(0)], jit=jit, **args)


def test_learning_rate_bad_counter(jit):
    with pytest.raises(ShapeError, match="non-empty integer tensor"):
        run_op("LearningRate", [np.zeros(1, np.float32)], jit=jit, policy="fixed", base_lr=0.1)


# --------------------------------------------------------------------------------------------------
# WeightedSum / WeightedSumGradient


@st.composite
def weighted_sum_cases(draw):
    """(xs, weights): X0 of some shape, the other Xs of the same size (maybe another shape)."""
    shape = draw(small_shapes)
    xs, ws = [], []
    for i in range(draw(st.integers(1, 4))):
        x = draw(floats(shape))
        if i and draw(st.booleans()):
            x = x.reshape(-1)  # only the element count has to match X0's
        xs.append(x)
        ws.append(draw(floats(draw(st.sampled_from([(1,), ()])), -3, 3)))
    return xs, ws


@given(case=weighted_sum_cases())
def test_weighted_sum(jit, case):
    xs, ws = case
    inputs = [a for pair in zip(xs, ws, strict=True) for a in pair]
    (y,) = run_op("WeightedSum", inputs, jit=jit)
    expected = sum(np.float64(w.reshape(())) * x.reshape(xs[0].shape) for x, w in zip(xs, ws, strict=True))
    assert y.shape == xs[0].shape
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@given(case=weighted_sum_cases(), grad_on_w=st.booleans(), data=st.data())
def test_weighted_sum_gradient(jit, case, grad_on_w, data):
    """GetWeightedSumGradient: (GO, I0, I1, ...) -> (GI0, GI2, ...[, GI1, GI3, ...])."""
    xs, ws = case
    xs = [x.reshape(xs[0].shape) for x in xs]
    dy = data.draw(floats(xs[0].shape))
    inputs = [dy, *(a for pair in zip(xs, ws, strict=True) for a in pair)]
    n_out = 2 * len(xs) if grad_on_w else len(xs)
    outs = run_op("WeightedSumGradient", inputs, n_out, jit=jit, grad_on_w=int(grad_on_w))
    for dx, w in zip(outs[: len(xs)], ws, strict=True):
        np.testing.assert_allclose(dx, np.float64(w.reshape(())) * dy, **F32)
    if grad_on_w:
        for dw, x in zip(outs[len(xs) :], xs, strict=True):
            assert dw.shape == (1,)
            np.testing.assert_allclose(dw, [(dy.astype(np.float64) * x).sum()], rtol=1e-4, atol=1e-4)
    if jit:  # against jax.vjp of the forward WeightedSum (once per example)
        names = [n for i in range(len(xs)) for n in (f"x{i}", f"w{i}")]
        lowered = lower(load(create_net("f", [create_operator("WeightedSum", names, ["y"])])))
        _, pullback = jax.vjp(lambda *a: lowered(dict(zip(names, a, strict=True)))["y"], *inputs[1:])
        grads = pullback(dy)
        for dx, g in zip(outs[: len(xs)], grads[0::2], strict=True):
            np.testing.assert_allclose(dx, g, **F32)
        if grad_on_w:
            for dw, g in zip(outs[len(xs) :], grads[1::2], strict=True):
                np.testing.assert_allclose(dw.reshape(np.shape(g)), g, rtol=1e-4, atol=1e-4)


def test_weighted_sum_errors(jit):
    x, w = np.ones((2, 3), np.float32), np.ones(1, np.float32)
    cases = [
        ([x, w, x], ["x0", "w0", "x1"], BadArgumentError, "odd count"),
        ([x, w, x, w], ["x0", "w0", "y0", "w1"], BadArgumentError, "input 'y0' is the output"),
        ([x, np.ones(2, np.float32)], ["x0", "w0"], ShapeError, "weight 'w0' must hold one element"),
        ([x, w, np.ones(5, np.float32), w], ["x0", "w0", "x1", "w1"], ShapeError, "as many elements"),
        ([np.ones(0, np.float32), w], ["x0", "w0"], ShapeError, "is empty"),
    ]
    for inputs, names, error, match in cases:
        with pytest.raises(error, match=match):
            run_op("WeightedSum", inputs, jit=jit, input_names=names)
    with pytest.raises(BadArgumentError, match="2 outputs for 1"):
        run_op("WeightedSumGradient", [x, x, w], 1, jit=jit, grad_on_w=1)


# --------------------------------------------------------------------------------------------------
# One SGD step as a Caffe2 training net writes it


def test_sgd_step_of_a_real_training_net(jit):
    """breadbread_lstmdemo's update: AtomicIter -> LearningRate(step) -> WeightedSum(w, ONE, g, lr) -> w."""
    ops = [
        create_operator("AtomicIter", ["iteration_mutex", "optimizer_iteration"], ["optimizer_iteration"]),
        create_operator(
            "LearningRate",
            ["optimizer_iteration"],
            ["lr"],
            policy="step",
            stepsize=1,
            base_lr=-2.5,
            gamma=0.9999,
        ),
        create_operator("WeightedSum", ["w", "ONE", "w_grad", "lr"], ["w"]),
    ]
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    g = np.full((2, 3), 0.5, np.float32)
    env = {
        "iteration_mutex": np.zeros((), np.int32),
        "optimizer_iteration": counter(4),
        "ONE": np.ones(1, np.float32),
        "w": w,
        "w_grad": g,
    }
    it, lr, new_w = run_net(ops, env, ["optimizer_iteration", "lr", "w"], jit)
    np.testing.assert_array_equal(it, [5])
    np.testing.assert_allclose(lr, -2.5 * np.float32(0.9999) ** 5, rtol=1e-5)
    np.testing.assert_allclose(new_w, w + lr * g, **F32)


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_optimizer.py)

def f32(low: float, high: float):
    """float32 values in [low, high] (the bounds rounded to float32)."""
    return st.floats(float(np.float32(low)), float(np.float32(high)), width=32, allow_subnormal=False)


def counter_caffe2(data):
    return np.asarray([data.draw(st.integers(0, 10**6))], np.int64)


def draw_iter(data):
    return make_op("Iter", ["iter"], ["iter"]), {"iter": counter_caffe2(data)}


def draw_atomic_iter(data):
    """The op under test is the last of the two (AtomicIter); CreateMutex runs before it."""
    return make_op("AtomicIter", ["mutex", "iter"], ["iter"]), {"iter": counter_caffe2(data)}


def draw_create_mutex(data):
    return make_op("CreateMutex", [], ["mutex"]), {"iter": counter_caffe2(data)}


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
    Case("AtomicIter", draw_atomic_iter, note="run after CreateMutex; the counter_caffe2 is compared"),
    Case("CreateMutex", draw_create_mutex, note="run before AtomicIter; the counter_caffe2 is compared"),
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
    """The old form `Iter() -> iter` creates an int64 [1] counter_caffe2 on its first run."""
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
