"""`caffe2.python.optimizer` on rnn2jax against real Caffe2.

Each example builds one small model in both (brew.fc layers, a Gather from an embedding table for a
sparse GradientSlice gradient, SquaredL2Distance + AveragedLoss, AddGradientOperators), then an
optimizer builder; the serialized `net` and `param_init_net` must be byte-identical to Caffe2's. Then
both run the init net once and the training net a few times from the same (GivenTensorFill)
parameters and data, and every parameter and optimizer blob must agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnn2jax.caffe2.python import core, optimizer, workspace
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.model_helper import ModelHelper
from tests.recipes import Recipe

# ------------------------------------------------------------------------------------------------
# A recipe (the oracle's `build` language) and a local interpreter for it


def build_ours(calls: Sequence[Mapping[str, Any]], arrays: Sequence[np.ndarray]) -> ModelHelper:
    reset_net_names()
    recipe = Recipe(arrays)
    recipe.models["model"] = ModelHelper(name="model")
    for spec in calls:
        recipe.results.append(recipe.call(spec))
    return recipe.models["model"]


MODEL = {"$model": "model"}


def _given(index: int) -> dict:
    return {"$tuple": ["GivenTensorFill", {"values": {"$array": index}}]}


def model_recipe(case: Mapping[str, Any], rng: np.random.Generator) -> tuple[list, list, dict]:
    """(calls, arrays, feeds): X -> fc -> Relu -> fc (+ fc of Gather(emb, I) when sparse) -> L2 loss.

    Relu, not Tanh: scale-free optimizers (RmsProp, Adagrad, Adam) move parameters by about the learning rate
    whatever the gradient, which saturates a tanh within two steps, and TanhGradient's 1 - t*t then turns one
    ulp of t into 4e-5 relative error in every gradient upstream: a test of the activation's conditioning,
    not of the optimizer. ReluGradient is exact."""
    n, d_in, hidden, d_out = case["n"], case["d_in"], case["hidden"], case["d_out"]
    arrays: list[np.ndarray] = []

    def array(shape: tuple[int, ...]) -> dict:
        arrays.append(rng.uniform(-1, 1, shape).astype(np.float32))
        return _given(len(arrays) - 1)

    def fc(blob_in: str, blob_out: str, dim_in: int, dim_out: int) -> dict:
        return {
            "fn": "brew.fc",
            "args": [MODEL, blob_in, blob_out, dim_in, dim_out],
            "kwargs": {"weight_init": array((dim_out, dim_in)), "bias_init": array((dim_out,))},
        }

    def net_op(op_type: str, inputs: list, output: str, **kwargs: Any) -> dict:
        return {"fn": MODEL, "method": op_type, "args": [inputs, output], "kwargs": kwargs}

    calls = [fc("X", "h", d_in, hidden), net_op("Relu", ["h"], "t"), fc("t", "y", hidden, d_out)]
    prediction = "y"
    feeds = {"X": rng.uniform(-1, 1, (n, d_in)).astype(np.float32)}
    if case["sparse"]:
        vocab, emb_dim = case["vocab"], case["emb_dim"]
        values = array((vocab, emb_dim))["$tuple"][1]
        initializer = {"fn": "rnn_cell.Initializer", "args": ["GivenTensorFill"], "kwargs": values}
        calls.append(
            {
                "fn": MODEL,
                "method": "create_param",
                "args": ["emb", [vocab, emb_dim], {"$call": initializer}],
                "kwargs": {"tags": "WEIGHT"},
            }
        )
        calls += [net_op("Gather", ["emb", "I"], "g"), fc("g", "gy", emb_dim, d_out), net_op("Add", ["y", "gy"], "s")]
        prediction = "s"
        feeds["I"] = rng.integers(0, vocab, (n,)).astype(np.int32)  # repeats happen: duplicate rows
    if case.get("only_embedding"):  # every parameter sparse: what the row-wise optimizers accept
        calls = [c for c in calls if c.get("method") in ("create_param", "Gather")]
        prediction, d_out = "g", case["emb_dim"]
    calls += [net_op("SquaredL2Distance", [prediction, "T"], "d"), net_op("AveragedLoss", ["d"], "loss")]
    calls.append({"fn": MODEL, "method": "AddGradientOperators", "args": [["loss"]]})
    feeds["T"] = rng.uniform(-1, 1, (n, d_out)).astype(np.float32)
    return calls, arrays, feeds


# ------------------------------------------------------------------------------------------------
# Strategies


def policies() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.just({"policy": "fixed"}),
        st.builds(lambda s, g: {"policy": "step", "stepsize": s, "gamma": g}, st.integers(1, 3), st.floats(0.5, 1.0)),
        st.builds(lambda g: {"policy": "exp", "gamma": g}, st.floats(0.5, 1.0)),
        st.builds(lambda g, p: {"policy": "inv", "gamma": g, "power": p}, st.floats(0.0, 0.5), st.floats(0.0, 1.0)),
    )


LEARNING_RATES = st.floats(1e-3, 0.5)

OPTIMIZERS = st.one_of(
    st.builds(lambda: ("build_sgd", {})),
    st.builds(
        lambda m, nesterov: ("build_sgd", {"momentum": m, "nesterov": nesterov}),
        st.floats(0.1, 0.95),
        st.booleans(),
    ),
    st.builds(
        lambda eps, wd, decay: ("build_adagrad", {"epsilon": eps, "weight_decay": wd, "decay": decay}),
        st.sampled_from([1e-4, 1e-2]),
        st.sampled_from([0.0, 0.1]),
        st.sampled_from([1.0, 0.9]),
    ),
    st.builds(
        lambda b1, b2, eps: ("build_adam", {"beta1": b1, "beta2": b2, "epsilon": eps}),
        st.floats(0.5, 0.95),
        st.floats(0.9, 0.999),
        st.sampled_from([1e-8, 1e-4]),
    ),
    st.builds(
        lambda decay, m, eps: ("build_rms_prop", {"decay": decay, "momentum": m, "epsilon": eps}),
        st.floats(0.5, 0.99),
        st.sampled_from([0.0, 0.9]),
        st.sampled_from([1e-5, 1e-3]),
    ),
)

CASES = st.fixed_dictionaries(
    {
        "n": st.integers(1, 4),
        "d_in": st.integers(1, 4),
        "hidden": st.integers(1, 4),
        "d_out": st.integers(1, 3),
        "sparse": st.booleans(),
        "vocab": st.integers(1, 5),
        "emb_dim": st.integers(1, 3),
        "iterations": st.integers(1, 4),
        "weight_decay": st.sampled_from([None, 0.01]),
        "max_gradient_norm": st.sampled_from([None, 0.5]),
        "seed": st.integers(0, 2**16),
    }
)

# ------------------------------------------------------------------------------------------------
# Both sides


def _optimizer_calls(builder: str, kwargs: dict, case: Mapping[str, Any]) -> list[dict]:
    calls: list[dict] = [{"fn": "optimizer.reset_optimizer_instance_count"}]
    if case["weight_decay"] is not None:
        calls.append({"fn": "optimizer.add_weight_decay", "args": [MODEL, case["weight_decay"]]})
    extra = {} if case["max_gradient_norm"] is None else {"max_gradient_norm": case["max_gradient_norm"]}
    calls.append({"fn": f"optimizer.{builder}", "args": [MODEL, case["lr"]], "kwargs": {**kwargs, **extra}})
    return calls


def _blobs(net: Any, init: Any) -> list[str]:
    """Every tensor the two nets write, but the mutex."""
    names = {o for n in (net, init) for op in n.op for o in op.output if op.type != "CreateMutex"}
    return sorted(names)


def _run_ours(model: ModelHelper, feeds: Mapping[str, np.ndarray], iterations: int, fetch: list[str]) -> dict:
    workspace.SwitchWorkspace("optimizer_test", True)
    workspace.ResetWorkspace()
    try:
        for name, value in feeds.items():
            workspace.FeedBlob(name, value)
        workspace.RunNetOnce(model.param_init_net)
        workspace.CreateNet(model.net)
        workspace.RunNet(model.net.Name(), iterations)
        return {name: workspace.FetchBlob(name) for name in fetch}
    finally:
        workspace.ResetWorkspace()
        workspace.SwitchWorkspace("default")


def _compare_values(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray]) -> None:
    assert sorted(ours) == sorted(theirs)
    for name, expected in theirs.items():
        got = np.asarray(ours[name])
        assert got.shape == expected.shape, name
        if expected.dtype == np.int64:  # the optimizer counter
            assert got.dtype == np.int64, name
            np.testing.assert_array_equal(got, expected, err_msg=name)
        else:
            assert got.dtype == expected.dtype, name
            # rtol 1e-5 as asked; atol for entries that pass through zero (float32 sums in another order)
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def check_against_caffe2(caffe2: Any, case: Mapping[str, Any], builder: str, kwargs: dict) -> ModelHelper:
    rng = np.random.default_rng(case["seed"])
    calls, arrays, feeds = model_recipe(case, rng)
    calls += _optimizer_calls(builder, kwargs, case)
    theirs = caffe2.build(calls, {"model": {"name": "model"}}, arrays)[0]["model"]
    model = build_ours(calls, arrays)
    assert model.param_init_net.Proto().SerializeToString() == theirs[1].SerializeToString(), (
        f"param_init_net differs:\n{model.param_init_net.Proto()}\nvs Caffe2's\n{theirs[1]}"
    )
    assert model.net.Proto().SerializeToString() == theirs[0].SerializeToString(), (
        f"net differs:\n{model.net.Proto()}\nvs Caffe2's\n{theirs[0]}"
    )
    fetch = _blobs(theirs[0], theirs[1])
    their_values = caffe2.run(
        [("net", theirs[1]), ("create_net", theirs[0]), ("run_net", (theirs[0].name, case["iterations"]))],
        feeds,
        fetch,
    )
    _compare_values(_run_ours(model, feeds, case["iterations"], fetch), their_values)
    return model


@settings(max_examples=12, deadline=None)
@given(case=CASES, lr=LEARNING_RATES, policy=policies(), opt=OPTIMIZERS)
def test_optimizer_nets_and_updates_match_caffe2(caffe2, case, lr, policy, opt):
    builder, kwargs = opt
    if builder == "build_rms_prop" and case["sparse"]:
        case = {**case, "sparse": False}  # RmsProp refuses GradientSlices (tested below)
    if builder == "build_adagrad" and case["sparse"] and kwargs["decay"] != 1.0:
        kwargs = {**kwargs, "decay": 1.0}  # SparseAdagrad has no decay (tested below)
    if case["sparse"] and case["weight_decay"] is not None:
        case = {**case, "weight_decay": None}  # add_weight_decay refuses GradientSlices (tested below)
    check_against_caffe2(caffe2, {**case, "lr": lr}, builder, {**kwargs, **policy})


BASE = {
    "n": 3, "d_in": 2, "hidden": 3, "d_out": 2, "sparse": True, "vocab": 3, "emb_dim": 2, "iterations": 3,
    "weight_decay": None, "max_gradient_norm": None, "seed": 7, "lr": 0.1,
}  # fmt: skip


@pytest.mark.parametrize(
    "builder, kwargs",
    [
        ("build_sgd", {"policy": "step", "stepsize": 1, "gamma": 0.9999}),  # char_rnn's
        ("build_sgd", {"momentum": 0.9, "nesterov": False}),
        ("build_adagrad", {"weight_decay": 0.1}),
        ("build_adam", {}),
        ("build_multi_precision_sgd", {"momentum": 0.5}),
        ("build_adagrad", {"rowWise": True}),
        ("build_adam", {"rowWise": True}),
        ("build_adagrad", {"max_gradient_norm": 0.1, "allow_lr_injection": True}),
        # (LARS is not compared: real Caffe2 fails to build it on NumPy >= 1.23, np.asscalar is gone)
    ],
)
def test_sparse_and_named_builders_match_caffe2(caffe2, builder, kwargs):
    """Sparse updates (ScatterWeightedSum, SparseMomentumSGDUpdate, SparseAdagrad, SparseAdam, the
    row-wise forms) on duplicate indices, and the builders the hypothesis test does not draw."""
    case = dict(BASE)
    if kwargs.get("rowWise"):
        case["only_embedding"] = True
    model = check_against_caffe2(caffe2, case, builder, kwargs)
    types = [op.type for op in model.net.Proto().op]
    assert types.count("AtomicIter") == 1 and types.count("LearningRate") == 1


def test_two_builders_number_their_learning_rates_and_share_the_counter(caffe2):
    """A second optimizer instance gets `SgdOptimizer_1_lr_cpu`; both use one counter (AtomicIter once)."""
    case = {**BASE, "sparse": False}
    rng = np.random.default_rng(0)
    calls, arrays, feeds = model_recipe(case, rng)
    calls += _optimizer_calls("build_sgd", {}, case)
    calls.append({"fn": "optimizer.build_sgd", "args": [MODEL, 0.2], "kwargs": {"policy": "exp", "gamma": 0.9}})
    theirs = caffe2.build(calls, {"model": {"name": "model"}}, arrays)[0]["model"]
    model = build_ours(calls, arrays)
    assert model.net.Proto().SerializeToString() == theirs[0].SerializeToString()
    assert model.param_init_net.Proto().SerializeToString() == theirs[1].SerializeToString()
    lrs = [op.output[0] for op in model.net.Proto().op if op.type == "LearningRate"]
    assert lrs == ["SgdOptimizer_0_lr_cpu", "SgdOptimizer_1_lr_cpu"]
    fetch = _blobs(theirs[0], theirs[1])
    their_values = caffe2.run(
        [("net", theirs[1]), ("create_net", theirs[0]), ("run_net", (theirs[0].name, 2))], feeds, fetch
    )
    _compare_values(_run_ours(model, feeds, 2, fetch), their_values)


def test_sgd_update_matches_numpy():
    """Independent of Caffe2: one SGD step with a step policy is w - lr * gamma^floor(it/s) * grad,
    with the gradient of 0.5 * mean ||W x + b - t||^2 written out in NumPy."""
    reset_net_names()
    optimizer.reset_optimizer_instance_count()
    rng = np.random.default_rng(3)
    w0 = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    b0 = rng.uniform(-1, 1, (2,)).astype(np.float32)
    x = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    t = rng.uniform(-1, 1, (4, 2)).astype(np.float32)
    model = ModelHelper(name="numpy_sgd")
    from rnn2jax.caffe2.python import brew

    y = brew.fc(model, "X", "y", 3, 2, weight_init=("GivenTensorFill", {"values": w0}),
                bias_init=("GivenTensorFill", {"values": b0}))  # fmt: skip
    d = model.net.SquaredL2Distance([y, "T"], "d")
    model.AddGradientOperators([model.net.AveragedLoss(d, "loss")])
    optimizer.build_sgd(model, 0.5, policy="step", stepsize=1, gamma=0.5)
    values = _run_ours(model, {"X": x, "T": t}, 2, ["y_w", "y_b", "optimizer_iteration"])
    w, b = w0.astype(np.float64), b0.astype(np.float64)
    for it in range(2):  # LearningRate reads the counter after AtomicIter incremented it
        lr = 0.5 * 0.5 ** (it + 1)
        residual = x @ w.T + b - t
        grad_w, grad_b = residual.T @ x / len(x), residual.mean(axis=0)
        w, b = w - lr * grad_w, b - lr * grad_b
    np.testing.assert_allclose(values["y_w"], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values["y_b"], b, rtol=1e-5, atol=1e-6)
    assert int(values["optimizer_iteration"][0]) == 2


def test_refusals():
    """What Caffe2 refused is refused here too; the features rnn2jax lacks name themselves."""
    reset_net_names()
    optimizer.reset_optimizer_instance_count()
    calls, arrays, _ = model_recipe(dict(BASE), np.random.default_rng(0))
    with pytest.raises(ValueError, match="sparse gradients"):
        model = build_ours(calls, arrays)
        optimizer.build_rms_prop(model, 0.1)
    with pytest.raises(ValueError, match="sparse gradients"):
        optimizer.add_weight_decay(build_ours(calls, arrays), 0.1)
    with pytest.raises(ValueError, match="Decay is not implemented for SparseAdagrad"):
        optimizer.build_adagrad(build_ours(calls, arrays), 0.1, decay=0.5)
    with pytest.raises(ValueError, match="positive base learning rate"):
        optimizer.build_sgd(build_ours(calls, arrays), -0.1)
    model = build_ours(calls, arrays)
    before = len(model.net.Proto().op)
    optimizer.build_sgd(model, 0.0)  # a zero rate adds nothing, as in Caffe2
    assert len(model.net.Proto().op) == before
    assert isinstance(core.InferBlobDevices(model.param_init_net)["emb"], type(core.DeviceOption(0)))
