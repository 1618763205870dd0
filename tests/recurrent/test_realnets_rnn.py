"""The RecurrentNetwork ops of the real nets compile and compute Caffe2's LSTM (NumPy reference)."""

from __future__ import annotations

import numpy as np
import pytest

import rnn2jax
from helpers import REALNETS
from reference import lstm
from rnn2jax.ir.netdef import Net

DPER = REALNETS / "dper_train_net_lstm_pooling.pbtxt"
BREADBREAD = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
needs_realnets = pytest.mark.skipif(not DPER.exists(), reason=f"real nets folder {REALNETS} is absent")
F32 = np.float32


def _random(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(F32)


@needs_realnets
@pytest.mark.parametrize("which", [0, 1])
def test_dper_recurrent_ops_match_numpy_lstm(which):
    """Each of dper's two LSTM ops, compiled on its own, with 1-D initial states (dper's
    LSTMInitializer params) and zero-length sequences in the batch."""
    train_net = rnn2jax.load(DPER)
    op = [op for op in train_net.ops if op.type == "RecurrentNetwork"][which]
    net = Net("dper_lstm", (op,), op.inputs, op.outputs[:4], where=f"{op.where} (alone)")
    fn = rnn2jax.compile(net)
    assert set(fn.input_names) == set(op.inputs)
    rng = np.random.default_rng(which)
    steps, batch, hidden = 7, 5, 32
    i2h, h0, c0, w, b, lengths = op.inputs
    values = {
        i2h: _random(rng, steps, batch, 4 * hidden),
        h0: _random(rng, hidden),
        c0: _random(rng, hidden),
        w: _random(rng, 4 * hidden, hidden),
        b: _random(rng, 4 * hidden),
        lengths: np.array([7, 0, 3, 1, 6], np.int32),
    }
    out = fn(values)
    h0_rows, c0_rows = np.tile(values[h0], (batch, 1)), np.tile(values[c0], (batch, 1))
    h_all, h_last, c_all, c_last = lstm(values[i2h], h0_rows, c0_rows, values[w], values[b], values[lengths])
    for name, expected in zip(op.outputs[:4], (h_all, h_last[None], c_all, c_last[None]), strict=True):
        np.testing.assert_allclose(np.asarray(out[name]), expected, rtol=1e-5, atol=1e-6)


@needs_realnets
def test_breadbread_predict_net_matches_numpy():
    net = rnn2jax.load(BREADBREAD)
    fn = rnn2jax.compile(
        net, outputs=["LSTM/hidden_t_all", "LSTM/hidden_t_last", "LSTM/cell_t_last", "softmax"]
    )
    rng = np.random.default_rng(0)
    steps, batch, vocab, hidden = 6, 3, 62, 100
    v = {
        "input_blob": _random(rng, steps, batch, vocab, scale=1.0),
        "seq_lengths": np.array([6, 2, 0], np.int32),
        "hidden_init": _random(rng, 1, batch, hidden),
        "cell_init": _random(rng, 1, batch, hidden),
        "LSTM/i2h_w": _random(rng, 4 * hidden, vocab),
        "LSTM/i2h_b": _random(rng, 4 * hidden),
        "LSTM/gates_t_w": _random(rng, 4 * hidden, hidden),
        "LSTM/gates_t_b": _random(rng, 4 * hidden),
        "char_rnn_blob_0_w": _random(rng, vocab, hidden),
        "char_rnn_blob_0_b": _random(rng, vocab),
    }
    out = fn(v)
    x_proj = v["input_blob"] @ v["LSTM/i2h_w"].T + v["LSTM/i2h_b"]
    h_all, h_last, _, c_last = lstm(
        x_proj,
        v["hidden_init"][0],
        v["cell_init"][0],
        v["LSTM/gates_t_w"],
        v["LSTM/gates_t_b"],
        v["seq_lengths"],
    )
    logits = h_all @ v["char_rnn_blob_0_w"].T + v["char_rnn_blob_0_b"]
    softmax = np.exp(logits - logits.max(2, keepdims=True))  # the net's Softmax has axis=2
    softmax /= softmax.sum(2, keepdims=True)
    np.testing.assert_allclose(np.asarray(out["LSTM/hidden_t_all"]), h_all, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["LSTM/hidden_t_last"])[0], h_last, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["LSTM/cell_t_last"])[0], c_last, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["softmax"]), softmax, rtol=1e-5, atol=1e-7)
