"""An SGD training plan (FC + squared loss, Caffe2's own gradient ops, Iter/LearningRate/WeightedSum) run
for hundreds of iterations: the workspace equals real Caffe2's after RunPlan, the weights equal a NumPy
SGD written here from the maths, and the training step runs as one jitted function per iteration."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import net, op, plan, run_caffe2, step

import rnn2jax
from differential import assert_blobs_equal
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.runtime import executor

ITERS = 300
BASE_LR, GAMMA, STEPSIZE = -0.02, 0.5, 100  # slow enough that gradients stay far from 0
N, D, M = 16, 4, 3


def _data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, D)).astype(np.float32)
    w_true = rng.normal(size=(M, D)).astype(np.float32)
    y = (x @ w_true.T + 0.5 + 0.3 * rng.normal(size=(N, M))).astype(np.float32)  # noise: a loss > 0 to fit
    w0 = (0.1 * rng.normal(size=(M, D))).astype(np.float32)
    return x, y, w0


@pytest.fixture(scope="module")
def training_plan(caffe2):
    x, y, w0 = _data()
    forward = [
        op("FC", ["X", "W", "b"], ["pred"]),
        op("SquaredL2Distance", ["pred", "Y"], ["dist"]),
        op("AveragedLoss", ["dist"], ["loss"]),
    ]
    gradient_ops, _ = caffe2.backward_pass(forward, {"loss": None})  # real Caffe2's gradient makers
    sgd = [
        op("Iter", ["iter"], ["iter"]),
        op("LearningRate", ["iter"], ["lr"], base_lr=BASE_LR, policy="step", stepsize=STEPSIZE, gamma=GAMMA),
        op("WeightedSum", ["W", "ONE", "W_grad", "lr"], ["W"]),
        op("WeightedSum", ["b", "ONE", "b_grad", "lr"], ["b"]),
    ]
    init = net(
        "init",
        op("GivenTensorFill", [], ["W"], shape=[M, D], values=w0.ravel().tolist()),
        op("ConstantFill", [], ["b"], shape=[M], value=0.0),
        op("ConstantFill", [], ["ONE"], shape=[1], value=1.0),
        op("ConstantFill", [], ["iter"], shape=[1], value=0, dtype=pb.TensorProto.INT64),
    )
    train = net("train", *forward, *gradient_ops)
    update = net("sgd", *sgd)
    message = plan(
        [init, train, update], step("init", network="init"), step("train", network=["train", "sgd"], num_iter=ITERS)
    )
    return message, {"X": x, "Y": y}


def _numpy_sgd(x, y, w0):
    """SGD on 0.5 * mean_n |x_n W^T + b - y_n|^2 in float64, with Caffe2's step learning rate after Iter."""
    w, b = w0.astype(np.float64), np.zeros(M)
    for t in range(1, ITERS + 1):
        lr = BASE_LR * GAMMA ** (t // STEPSIZE)
        residual = (x @ w.T + b - y) / N
        w, b = w + lr * residual.T @ x, b + lr * residual.sum(0)
    loss = 0.5 * np.mean(np.sum((x @ w.T + b - y) ** 2, axis=1))
    return w, b, loss


def test_training_plan_matches_caffe2_and_numpy(caffe2, training_plan):
    message, feeds = training_plan
    want = run_caffe2(caffe2, message, feeds)
    workspace = rnn2jax.Workspace()
    for name, value in feeds.items():
        workspace.feed(name, value)
    workspace.run_plan(message)
    got = {name: workspace.fetch(name) for name in workspace.blobs()}
    assert_blobs_equal(got, want, rtol=1e-4)
    assert int(got["iter"][0]) == ITERS

    x, y, w0 = _data()
    w, b, loss = _numpy_sgd(x, y, w0)
    np.testing.assert_allclose(got["W"], w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["b"], b, rtol=1e-4, atol=1e-5)
    first_loss = 0.5 * np.mean(np.sum((x @ w0.T - y) ** 2, axis=1))
    assert float(got["loss"]) < 0.5 * first_loss  # the loss of the last iteration's weights, before its update
    assert loss <= float(got["loss"]) * (1 + 1e-3)


def test_a_pure_training_step_is_one_jitted_call_per_iteration(training_plan, monkeypatch):
    message, feeds = training_plan
    calls, traces = [], []
    run, apply = executor.PureSegment.run, executor.PureSegment._apply
    monkeypatch.setattr(executor.PureSegment, "run", lambda self, *a: (calls.append(self), run(self, *a))[1])
    monkeypatch.setattr(executor.PureSegment, "_apply", lambda self, *a: (traces.append(self), apply(self, *a))[1])
    workspace = rnn2jax.Workspace()
    for name, value in feeds.items():
        workspace.feed(name, value)
    workspace.run_plan(message)
    train_segment = calls[-1]
    assert len(calls) == 1 + ITERS  # the init net once, then one call per iteration for both nets
    assert all(segment is train_segment for segment in calls[1:])
    assert len(train_segment.lowered.net.ops) == len(message.network[1].op) + len(message.network[2].op)  # fused
    assert traces.count(train_segment) == 1  # traced once: later iterations reuse the compiled function
