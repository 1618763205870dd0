"""Caffe2 LSTM, GRU and BasicRNN nets, compiled, against PyTorch's nn.LSTM / nn.GRU / nn.RNN with the
same weights (gate orders mapped: Caffe2 LSTM is i, f, o, g and PyTorch i, f, g, o; Caffe2 GRU's
r, u, o blocks are PyTorch's r, z, n, and Caffe2's GRU with linear_before_reset is PyTorch's GRU)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnn2jax
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM, BasicRNN

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[torch]')")

sizes = st.fixed_dictionaries(
    {
        "steps": st.integers(1, 6),
        "batch": st.integers(1, 4),
        "dim_in": st.integers(1, 6),
        "hidden": st.integers(1, 8),
        "seed": st.integers(0, 2**16),
    }
)


def _blocks(array: np.ndarray, order: list[int]) -> np.ndarray:
    return np.concatenate([np.split(array, len(order))[i] for i in order])


def _compile(model: ModelHelper, outputs):
    return rnn2jax.compile(
        model.net.Proto(), init_net=model.param_init_net.Proto(), outputs=[str(o) for o in outputs]
    )


def _numpy(t) -> np.ndarray:
    return t.detach().numpy().astype(np.float32)


def _close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual).reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=8, deadline=None)
@given(s=sizes)
def test_lstm_matches_torch(s):
    torch.manual_seed(s["seed"])
    module = torch.nn.LSTM(s["dim_in"], s["hidden"])
    x = torch.randn(s["steps"], s["batch"], s["dim_in"])
    h0, c0 = torch.randn(1, s["batch"], s["hidden"]), torch.randn(1, s["batch"], s["hidden"])
    with torch.no_grad():
        y, (h_n, c_n) = module(x, (h0, c0))
    model = ModelHelper(name="lstm_parity")
    outs = LSTM(
        model, "x", "seq_lengths", ("h0", "c0"), s["dim_in"], s["hidden"], scope="lstm", forward_only=True
    )
    fn = _compile(model, outs)
    ifog = [0, 1, 3, 2]  # PyTorch blocks i, f, g, o -> Caffe2's i, f, o, g
    params = {
        "lstm/i2h_w": _blocks(_numpy(module.weight_ih_l0), ifog),
        "lstm/i2h_b": _blocks(_numpy(module.bias_ih_l0), ifog),
        "lstm/gates_t_w": _blocks(_numpy(module.weight_hh_l0), ifog),
        "lstm/gates_t_b": _blocks(_numpy(module.bias_hh_l0), ifog),
    }
    inputs = {
        "x": _numpy(x),
        "h0": _numpy(h0),
        "c0": _numpy(c0),
        "seq_lengths": np.full(s["batch"], s["steps"], np.int32),
    }
    out = jax.jit(fn.apply)(params, inputs)
    _close(out[str(outs[0])], _numpy(y))
    _close(out[str(outs[1])], _numpy(h_n))
    _close(out[str(outs[3])], _numpy(c_n))


@settings(max_examples=8, deadline=None)
@given(s=sizes)
def test_gru_matches_torch(s):
    torch.manual_seed(s["seed"])
    module = torch.nn.GRU(s["dim_in"], s["hidden"])
    x = torch.randn(s["steps"], s["batch"], s["dim_in"])
    h0 = torch.randn(1, s["batch"], s["hidden"])
    with torch.no_grad():
        y, h_n = module(x, h0)
    model = ModelHelper(name="gru_parity")
    outs = GRU(model, "x", None, ("h0",), s["dim_in"], s["hidden"], scope="gru", linear_before_reset=True)
    fn = _compile(model, outs)
    w_hh, b_hh = np.split(_numpy(module.weight_hh_l0), 3), np.split(_numpy(module.bias_hh_l0), 3)
    params = {"gru/i2h_w": _numpy(module.weight_ih_l0), "gru/i2h_b": _numpy(module.bias_ih_l0)}
    for i, gate in enumerate(("reset", "update", "output")):
        params[f"gru/{gate}_gate_t_w"], params[f"gru/{gate}_gate_t_b"] = w_hh[i], b_hh[i]
    out = jax.jit(fn.apply)(params, {"x": _numpy(x), "h0": _numpy(h0)})
    _close(out[str(outs[0])], _numpy(y))
    _close(out[str(outs[1])], _numpy(h_n))


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@settings(max_examples=6, deadline=None)
@given(s=sizes)
def test_basic_rnn_matches_torch(activation, s):
    torch.manual_seed(s["seed"])
    module = torch.nn.RNN(s["dim_in"], s["hidden"], nonlinearity=activation)
    x = torch.randn(s["steps"], s["batch"], s["dim_in"])
    h0 = torch.randn(1, s["batch"], s["hidden"])
    with torch.no_grad():
        y, h_n = module(x, h0)
    model = ModelHelper(name="rnn_parity")
    outs = BasicRNN(model, "x", None, ("h0",), s["dim_in"], s["hidden"], scope="rnn", activation=activation)
    fn = _compile(model, outs)
    params = {
        "rnn/i2h_w": _numpy(module.weight_ih_l0),
        "rnn/i2h_b": _numpy(module.bias_ih_l0),
        "rnn/gates_t_w": _numpy(module.weight_hh_l0),
        "rnn/gates_t_b": _numpy(module.bias_hh_l0),
    }
    out = jax.jit(fn.apply)(params, {"x": _numpy(x), "h0": _numpy(h0)})
    _close(out[str(outs[0])], _numpy(y))
    _close(out[str(outs[1])], _numpy(h_n))
