"""Training-step ops (Iter, AtomicIter, CreateMutex, LearningRate, WeightedSum and its gradient) against
NumPy references written from Caffe2's caffe2/sgd/iter_op.h, learning_rate_functors.h and
operators/utility_ops.h, plus the SGD step of a real Caffe2 training net."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import run_op
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower
from rnn2jax.proto import caffe2_pb2 as pb

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
