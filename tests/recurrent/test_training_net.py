"""Training nets: RecurrentNetwork followed by RecurrentNetworkGradient, as Caffe2's gradient maker
emitted them, compile into one function. The real one is breadbread's train plan: forward, loss,
the hand-written backward ops (RecurrentNetworkGradient included), then SGD (AtomicIter,
LearningRate, WeightedSum)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rnn2jax
from helpers import REALNETS
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.ir.netdef import Net
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.proto import caffe2_pb2 as pb

TRAIN_PLAN = REALNETS / "breadbread_lstmdemo_train_plan.pbtxt"
needs_realnets = pytest.mark.skipif(not TRAIN_PLAN.exists(), reason=f"real nets folder {REALNETS} is absent")
PARAMS = ("LSTM/i2h_w", "LSTM/i2h_b", "LSTM/gates_t_w", "LSTM/gates_t_b", "char_rnn_blob_0_w", "char_rnn_blob_0_b")


def _without_db(net: Net) -> Net:
    """The net less its database ops (CreateDB, TensorProtosDBInput): their outputs become inputs."""
    ops = tuple(op for op in net.ops if op.type not in ("CreateDB", "TensorProtosDBInput"))
    return Net(net.name, ops, net.external_inputs, net.external_outputs, where=net.where)


@pytest.fixture(scope="module")
def breadbread():
    plan = rnn2jax.load(TRAIN_PLAN)
    train = _without_db(plan["char_rnn"])
    params = rnn2jax.compile(Net("empty", (), (), ()), init_net=_without_db(plan["char_rnn_init"])).params
    rng = np.random.default_rng(0)
    batch, steps, vocab = 10, 25, 62
    labels = rng.integers(0, vocab, size=(batch, steps)).astype(np.int32)
    inputs = {
        "data_float": np.eye(vocab, dtype=np.float32)[rng.integers(0, vocab, size=(batch, steps))],
        "label_int32": labels,
        "hidden_init": np.zeros((batch, 100), np.float32),
        "cell_init": np.zeros((batch, 100), np.float32),
    }
    return train, dict(params), inputs


@needs_realnets
def test_breadbread_training_step_equals_sgd_with_jax_grad(breadbread):
    train, params, inputs = breadbread
    step = rnn2jax.compile(train, params=params, outputs=["loss", "lr", *PARAMS, *(p + "_grad" for p in PARAMS)])
    out = step(inputs)

    forward_ops = tuple(op for op in train.ops if op.index <= 10)  # up to AveragedLoss
    forward = rnn2jax.compile(Net("forward", forward_ops, (), ("loss",)), params=params)

    def loss(p):
        return forward.apply({**forward.params, **p}, inputs)["loss"]

    value, grads = jax.value_and_grad(loss)({k: jnp.asarray(params[k]) for k in PARAMS})
    np.testing.assert_allclose(float(out["loss"]), float(value), rtol=1e-6)
    for name in PARAMS:
        np.testing.assert_allclose(np.asarray(out[name + "_grad"]), np.asarray(grads[name]), rtol=1e-4, atol=1e-7)
    # Caffe2's step policy: lr = base_lr * gamma ** floor(iter / stepsize), after AtomicIter made iter 1
    lr = -2.5 * np.float32(0.9998999834060669) ** 1
    np.testing.assert_allclose(float(np.ravel(out["lr"])[0]), lr, rtol=1e-6)
    for name in PARAMS:
        expected = np.asarray(params[name]) + lr * np.asarray(grads[name])
        np.testing.assert_allclose(np.asarray(out[name]), expected, rtol=1e-4, atol=1e-6)


@needs_realnets
def test_breadbread_training_loss_falls(breadbread):
    train, params, inputs = breadbread
    step = rnn2jax.compile(train, params=params, outputs=["loss", "optimizer_iteration", *PARAMS])
    losses = []
    state = dict(params)
    for _ in range(5):
        out = step.apply(state, inputs)
        losses.append(float(out["loss"]))
        state.update({k: out[k] for k in (*PARAMS, "optimizer_iteration")})
    assert int(np.ravel(state["optimizer_iteration"])[0]) == 5
    assert losses[-1] < losses[0], losses


def test_builder_training_net_gradients_match_jax():
    """A training net built the way Caffe2 users built one: LSTM, a loss, and the gradient ops from
    core.py's GetBackwardPass (which emits RecurrentNetworkGradient)."""
    model = ModelHelper(name="train")
    hidden_all, *_ = LSTM(model, "x", "seq_lengths", ("h0", "c0"), 3, 4, scope="lstm")
    model.net.SumElements([hidden_all], "loss")
    proto = pb.NetDef()
    proto.CopyFrom(model.net.Proto())
    backward, grad_map = get_backward_pass(list(proto.op), {"loss": None})
    proto.op.extend(backward)
    weights = ("lstm/i2h_w", "lstm/i2h_b", "lstm/gates_t_w", "lstm/gates_t_b")
    train = rnn2jax.compile(proto, init_net=model.param_init_net.Proto(), outputs=[grad_map[w] for w in weights])
    rng = np.random.default_rng(1)
    params = {k: (rng.standard_normal(np.shape(v)) * 0.5).astype(np.float32) for k, v in train.params.items()}
    inputs = {
        "x": rng.standard_normal((5, 2, 3)).astype(np.float32),
        "h0": rng.standard_normal((1, 2, 4)).astype(np.float32),
        "c0": rng.standard_normal((1, 2, 4)).astype(np.float32),
        "seq_lengths": np.array([5, 2], np.int32),
    }
    out = train.apply(params, inputs)
    forward = rnn2jax.compile(model.net.Proto(), outputs=["loss"])
    grads = jax.grad(lambda p: forward.apply({}, {**inputs, **p})["loss"])({w: params[w] for w in weights})
    for w in weights:
        np.testing.assert_allclose(np.asarray(out[grad_map[w]]), np.asarray(grads[w]), rtol=1e-5, atol=1e-6)
