"""The real nets against real Caffe2 (through the oracle worker), with random parameters of the right shapes:
breadbread's predict net (every blob it writes), one iteration of its train plan's net (every blob it writes:
activations, loss, gradients, the iteration counter, the learning rate and the updated parameters), and both
of dper's RecurrentNetwork ops, forward and gradient (Caffe2's own gradient maker derives the gradient op).

Caffe2 runs the nets as they are, except that their CUDA device options are set to the CPU (the worker does
that) and the train net's database reader is left out: its outputs are fed instead. Blobs that are not
tensors (the RNN's step workspaces, the iteration mutex) cannot be fetched and are not compared.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnn2jax
from differential import assert_blob_equal, assert_same_ops, run_rnn2jax
from helpers import REALNETS
from rnn2jax.ir.netdef import Net
from rnn2jax.ir.wire import parse_message
from rnn2jax.ops.gradient_makers import get_gradient_for_op, has_gradient_maker
from rnn2jax.proto import caffe2_pb2 as pb

PREDICT = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
TRAIN_PLAN = REALNETS / "breadbread_lstmdemo_train_plan.pbtxt"
DPER = REALNETS / "dper_train_net_lstm_pooling.pbtxt"
pytestmark = pytest.mark.skipif(not DPER.exists(), reason=f"real nets folder {REALNETS} is absent")
DB_OPS = ("CreateDB", "TensorProtosDBInput")
F32 = np.float32


def _message(path) -> pb.NetDef | pb.PlanDef:
    return parse_message(path.read_bytes(), f"file '{path}'")


def _random(rng, shape, scale=0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(F32)


def _written(net: pb.NetDef) -> list[str]:
    return list(dict.fromkeys(name for op in net.op for name in op.output))


def _assert_agree(got: dict, want: dict, names) -> None:
    failures = []
    for name in names:
        try:
            assert_blob_equal(name, got[name], want[name])
        except AssertionError as error:
            failures.append(str(error).splitlines()[0])
    assert not failures, "rnn2jax and Caffe2 disagree:\n" + "\n".join(failures)


def _without_db(net: pb.NetDef) -> pb.NetDef:
    """The net less its database ops; what they wrote becomes the net's external input (fed)."""
    copy = pb.NetDef()
    copy.CopyFrom(net)
    del copy.op[:]
    copy.op.extend(op for op in net.op if op.type not in DB_OPS)
    for op in net.op:
        if op.type in DB_OPS:
            copy.external_input.extend(name for name in op.output if name not in copy.external_input)
    return copy


def test_breadbread_predict_net(caffe2):
    net = _message(PREDICT)
    rng = np.random.default_rng(0)
    steps, batch, vocab, hidden = 6, 3, 62, 100
    feeds = {
        "input_blob": _random(rng, (steps, batch, vocab), 1.0),
        "seq_lengths": np.array([6, 2, 0], np.int32),
        "hidden_init": _random(rng, (1, batch, hidden)),
        "cell_init": _random(rng, (1, batch, hidden)),
        "LSTM/i2h_w": _random(rng, (4 * hidden, vocab)),
        "LSTM/i2h_b": _random(rng, (4 * hidden,)),
        "LSTM/gates_t_w": _random(rng, (4 * hidden, hidden)),
        "LSTM/gates_t_b": _random(rng, (4 * hidden,)),
        "char_rnn_blob_0_w": _random(rng, (vocab, hidden)),
        "char_rnn_blob_0_b": _random(rng, (vocab,)),
    }
    written = _written(net)
    want = caffe2.run_net(net, feeds, fetch=written)
    assert set(written) - set(want) == {"LSTM/step_workspaces"}  # not a tensor
    assert set(net.external_output) <= set(want)
    # Copy ops write input_blob, hidden_init and cell_init back: those are compared too.
    names = [n for n in written if n in want]
    fn = rnn2jax.compile(net, outputs=names)
    got = {k: np.asarray(v) for k, v in fn(feeds).items()}
    _assert_agree(got, want, names)


@pytest.fixture(scope="module")
def train_plan():
    plan = _message(TRAIN_PLAN)
    nets = {net.name: net for net in plan.network}
    return _without_db(nets["char_rnn_init"]), _without_db(nets["char_rnn"])


def test_breadbread_train_net_one_iteration(caffe2, train_plan):
    init, train = train_plan
    # Caffe2 runs the init net (less its database) first: it makes the mutex, which cannot be fed.
    made = caffe2.run([("net", init)], {}, None, workspace="train")
    assert "iteration_mutex" not in made and {"optimizer_iteration", "ONE", "seq_lengths"} <= set(made)
    rng = np.random.default_rng(0)
    batch, steps, vocab = 10, 25, 62
    feeds = {
        name: _random(rng, value.shape) if value.dtype.kind == "f" and name != "ONE" else value
        for name, value in made.items()
    }
    feeds["optimizer_iteration"] = np.array([41], np.int64)  # the step policy then sees a nonzero iteration
    feeds["seq_lengths"] = rng.integers(0, steps + 1, size=batch).astype(np.int32)
    feeds["hidden_init"] = _random(rng, made["LSTM/hidden_t_last"].shape)
    feeds["cell_init"] = _random(rng, made["LSTM/cell_t_last"].shape)
    feeds["data_float"] = np.eye(vocab, dtype=F32)[rng.integers(0, vocab, size=(batch, steps))]
    feeds["label_int32"] = rng.integers(0, vocab, size=(batch, steps)).astype(np.int32)
    written = _written(train)
    want = caffe2.run([("net", train)], feeds, written, workspace="train", reset=False)
    assert set(written) - set(want) == {"LSTM/step_workspaces"}

    made_here = rnn2jax.compile(Net("empty", (), (), ()), init_net=init).params  # its mutex placeholder
    params = {**made_here, **{k: v for k, v in feeds.items() if k not in ("data_float", "label_int32")}}
    names = [n for n in written if n in want]
    fn = rnn2jax.compile(train, params=params, outputs=names)
    assert set(fn.input_names) == {"data_float", "label_int32"}
    got = {k: np.asarray(v) for k, v in fn({k: feeds[k] for k in fn.input_names}).items()}
    for required in ("loss", "lr", "LSTM/i2h_w_grad", "LSTM/gates_t_w_grad", "hidden_init_grad", "LSTM/i2h_w"):
        assert required in names
    _assert_agree(got, want, names)
    assert not np.array_equal(want["LSTM/gates_t_w"], feeds["LSTM/gates_t_w"])  # SGD did update it


@pytest.mark.parametrize("which", [0, 1])
def test_dper_recurrent_op_forward_and_gradient(caffe2, which):
    """Each of dper's LSTM ops with 1-D initial states and zero-length sequences: the forward outputs,
    then Caffe2's own RecurrentNetworkGradient (its gradient maker's op, which rnn2jax's builder must emit
    byte for byte) run after the forward op in the same workspace."""
    net = _message(DPER)
    op = [op for op in net.op if op.type == "RecurrentNetwork"][which]
    rng = np.random.default_rng(which)
    steps, batch, hidden = 7, 5, 32
    i2h, h0, c0, w, b, lengths = op.input
    feeds = {
        i2h: _random(rng, (steps, batch, 4 * hidden)),
        h0: _random(rng, (hidden,)),
        c0: _random(rng, (hidden,)),
        w: _random(rng, (4 * hidden, hidden)),
        b: _random(rng, (4 * hidden,)),
        lengths: np.array([7, 0, 3, 1, 6], np.int32),
    }
    outputs = list(op.output[:4])  # the fifth is the step workspaces
    want = caffe2.run_op(op, feeds, fetch=outputs)
    _assert_agree(run_rnn2jax([op], feeds, outputs), want, outputs)

    with_grads = next(a for a in op.arg if a.name == "outputs_with_grads").ints
    g_output = [f"{name}_grad" if i in with_grads else None for i, name in enumerate(op.output)]
    grad_ops, _ = caffe2.gradient_for_op(op, g_output)
    assert [g.type for g in grad_ops] == ["RecurrentNetworkGradient"]
    if has_gradient_maker(op.type):
        ours, _ = get_gradient_for_op(op, g_output)
        assert_same_ops(ours, grad_ops, "dper's RecurrentNetworkGradient")
    for i in with_grads:
        feeds[g_output[i]] = _random(rng, want[op.output[i]].shape, 1.0)
    produced = [name for g in grad_ops for name in g.output]
    want = caffe2.run([("op", op), ("ops", grad_ops)], feeds, fetch=produced)
    assert set(want) == set(produced)
    _assert_agree(run_rnn2jax([op, *grad_ops], feeds, produced), want, produced)
