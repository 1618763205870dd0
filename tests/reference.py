"""Plain NumPy step-by-step references of Caffe2's recurrent cells, written from SEMANTICS.md sections 3
and 4 (never by calling rnn2jax). Shapes: sequences [T, N, ...], states [N, D]."""

from __future__ import annotations

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def valid_rows(t, seq_lengths, batch):
    """[N, 1] mask of rows still inside their sequence at step t."""
    if seq_lengths is None:
        return np.ones((batch, 1), bool)
    return (t < np.asarray(seq_lengths))[:, None]


def lstm_unit(h_prev, c_prev, gates, valid, forget_bias=0.0, drop_states=False):
    """Caffe2 LSTMUnit on [N, ...] rows: gate order i, f, o, g."""
    i, f, o, g = np.split(gates, 4, axis=-1)
    i, f, o, g = sigmoid(i), sigmoid(f + forget_bias), sigmoid(o), np.tanh(g)
    c = f * c_prev + i * g
    h = o * np.tanh(c)
    keep_h = np.zeros_like(h_prev) if drop_states else h_prev
    keep_c = np.zeros_like(c_prev) if drop_states else c_prev
    return np.where(valid, h, keep_h), np.where(valid, c, keep_c)


def gru_unit(h_prev, gates, valid, drop_states=False):
    """Caffe2 GRUUnit: blocks r, u, o; h = u * h_prev + (1 - u) * tanh(o)."""
    _, u, o = np.split(gates, 3, axis=-1)
    u = sigmoid(u)
    h = u * h_prev + (1 - u) * np.tanh(o)
    return np.where(valid, h, np.zeros_like(h_prev) if drop_states else h_prev)


def lstm(x_proj, h0, c0, w, b, seq_lengths=None, forget_bias=0.0, drop_states=False):
    """LSTM over a pre-projected input `x_proj` [T, N, 4H]: gates = h W^T + b + x_t. Returns
    (hidden_all [T, N, H], hidden_last [N, H], cell_all, cell_last)."""
    h, c = np.asarray(h0), np.asarray(c0)
    hs, cs = [], []
    for t in range(x_proj.shape[0]):
        gates = h @ w.T + b + x_proj[t]
        h, c = lstm_unit(h, c, gates, valid_rows(t, seq_lengths, h.shape[0]), forget_bias, drop_states)
        hs.append(h)
        cs.append(c)
    stack = lambda rows, like: np.stack(rows) if rows else np.zeros((0, *like.shape), like.dtype)  # noqa: E731
    return stack(hs, h), h, stack(cs, c), c


def _stack(rows, like):
    return np.stack(rows) if rows else np.zeros((0, *like.shape), like.dtype)


def layer_norm(x, scale, bias, epsilon=1e-4):
    """LayerNorm over the last axis (biased variance), then the cell's scale and bias."""
    mean = x.mean(-1, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + epsilon)
    return (x - mean) / std * scale + bias


def lstm_family(x_proj, h0, c0, gates_of, seq_lengths=None, forget_bias=0.0, drop_states=False):
    """Any LSTM-family cell: `gates_of(h_prev, x_t)` gives the [N, 4H] pre-activations."""
    h, c = np.asarray(h0), np.asarray(c0)
    hs, cs = [], []
    for t in range(x_proj.shape[0]):
        gates = gates_of(h, x_proj[t])
        h, c = lstm_unit(h, c, gates, valid_rows(t, seq_lengths, h.shape[0]), forget_bias, drop_states)
        hs.append(h)
        cs.append(c)
    return _stack(hs, h), h, _stack(cs, c), c


def milstm_gates(w, b_prev, alpha, beta1, beta2, b):
    """MILSTM: p = h W^T + b_prev; gates = (alpha x + beta1) p + (beta2 x + b)."""
    return lambda h, x: (alpha * x + beta1) * (h @ w.T + b_prev) + (beta2 * x + b)


def lstm_gates(w, b):
    return lambda h, x: h @ w.T + b + x


def layer_normed(gates_of, scale, bias):
    return lambda h, x: layer_norm(gates_of(h, x), scale, bias)


def gru(
    x_proj, h0, w_r, b_r, w_u, b_u, w_o, b_o, seq_lengths=None, linear_before_reset=False, drop_states=False
):
    """Caffe2's GRU cell (gate blocks r, u, o of the pre-projected input)."""
    h = np.asarray(h0)
    hs = []
    for t in range(x_proj.shape[0]):
        x_r, x_u, x_o = np.split(x_proj[t], 3, axis=-1)
        r = h @ w_r.T + b_r + x_r
        u = h @ w_u.T + b_u + x_u
        # the reset gate scales the output gate's FC result, or (by default) its input
        o = sigmoid(r) * (h @ w_o.T + b_o) + x_o if linear_before_reset else (sigmoid(r) * h) @ w_o.T + b_o + x_o
        h = gru_unit(h, np.concatenate([r, u, o], -1), valid_rows(t, seq_lengths, h.shape[0]), drop_states)
        hs.append(h)
    return _stack(hs, h), h


def basic_rnn(x_proj, h0, w, b, seq_lengths=None, activation="tanh"):
    """h' = act(h W^T + b + x_t); rows past their length keep h (the forward-only masking)."""
    act = np.tanh if activation == "tanh" else (lambda z: np.maximum(z, 0))
    h = np.asarray(h0)
    hs = []
    for t in range(x_proj.shape[0]):
        new = act(h @ w.T + b + x_proj[t])
        h = np.where(valid_rows(t, seq_lengths, h.shape[0]), new, h)
        hs.append(h)
    return _stack(hs, h), h
