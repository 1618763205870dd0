"""Every cell's hand-built backward step net (as Caffe2's front end built it) against jax.grad of the
forward scan, through `rnn2jax.verify`: float32 to 1e-5, float64 to 1e-9, and float64 central finite
differences as a third opinion."""

from __future__ import annotations

import numpy as np
import pytest

import rnn2jax
from rnn2jax.caffe2.python.attention import AttentionType
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM, MILSTM, BasicRNN, LayerNormLSTM, LayerNormMILSTM, LSTMWithAttention

T, N, D, H = 4, 3, 3, 4


def _model(build):
    model = ModelHelper(name="grad_model")
    build(model)
    return model


def _random_params(model, seed):
    """Every parameter of the init net drawn at random (biases and scales included)."""
    shapes = {op.outputs[0]: op.ints("shape") for op in rnn2jax.load(model.param_init_net.Proto()).ops}
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * 0.5).astype(np.float32) for name, shape in shapes.items()}


def _state_shape(form, size):
    return {"1-D": (size,), "2-D": (N, size)}[form]


def _lstm_like(builder, scope, lengths, form, **kwargs):
    def build(model):
        builder(model, "x", "seq_lengths" if lengths else None, ("h0", "c0"), D, H, scope=scope, **kwargs)

    shapes = {f"{scope}/i2h": (T, N, 4 * H), "h0": _state_shape(form, H), "c0": _state_shape(form, H)}
    return build, shapes | ({"seq_lengths": (N,)} if lengths else {})


def _single_state(builder, scope, lengths, form, width, **kwargs):
    def build(model):
        builder(model, "x", "seq_lengths" if lengths else None, ("h0",), D, H, scope=scope, **kwargs)

    shapes = {f"{scope}/i2h": (T, N, width * H), "h0": _state_shape(form, H)}
    return build, shapes | ({"seq_lengths": (N,)} if lengths else {})


def _attention(kind, form):
    enc_len, enc_dim = 5, (H if kind == "dot_same" else 3)

    def build(model):
        LSTMWithAttention(
            model, "dec_in", "dec_len", "h0", "c0", "ctx0", enc_dim, "enc", None, D, H, "att",
            attention_type=AttentionType.Dot if kind == "dot_same" else getattr(AttentionType, kind.capitalize()),
        )  # fmt: skip

    shapes = {
        "att/decoder/i2h": (T, N, 4 * H),
        "h0": _state_shape(form, H),
        "c0": _state_shape(form, H),
        "ctx0": _state_shape(form, enc_dim),
        "dec_len": (N,),
        "att/weighted_encoder_outputs": (enc_len, N, enc_dim),
        "att/encoder_outputs_transposed": (N, enc_dim, enc_len),
    }
    return build, shapes


CELLS = {
    "lstm": lambda lengths, form: _lstm_like(LSTM, "lstm", lengths, form),
    "lstm-memory-optimization": lambda lengths, form: _lstm_like(
        LSTM, "lstm", lengths, form, memory_optimization=True
    ),
    "lstm-several-output-grads": lambda lengths, form: _lstm_like(
        LSTM, "lstm", lengths, form, outputs_with_grads=(0, 1, 3)
    ),
    "lstm-drop-states": lambda lengths, form: _lstm_like(LSTM, "lstm", lengths, form, drop_states=True),
    "milstm": lambda lengths, form: _lstm_like(MILSTM, "milstm", True, form),
    "layernorm-lstm": lambda lengths, form: _lstm_like(LayerNormLSTM, "lnlstm", True, form),
    "layernorm-milstm": lambda lengths, form: _lstm_like(LayerNormMILSTM, "lnmilstm", True, form),
    "gru": lambda lengths, form: _single_state(GRU, "gru", lengths, form, 3),
    "gru-linear-before-reset": lambda lengths, form: _single_state(
        GRU, "gru", lengths, form, 3, linear_before_reset=True
    ),
    # Caffe2 could not build BasicRNN's backward with sequence lengths (SEMANTICS.md 3.3).
    "basic-rnn": lambda lengths, form: _single_state(
        BasicRNN, "basic_rnn", False, form, 1, activation="tanh"
    ),
    "attention-regular": lambda lengths, form: _attention("regular", form),
    "attention-recurrent": lambda lengths, form: _attention("recurrent", form),
    "attention-dot": lambda lengths, form: _attention("dot", form),
    "attention-dot-same-size": lambda lengths, form: _attention("dot_same", form),
}


def _multi_layer(lengths, form):
    def build(model):
        initial = ("h0_0", "c0_0", "h0_1", "c0_1")
        LSTM(model, "x", "seq_lengths" if lengths else None, initial, D, [H, H], scope="lstm")

    shapes = {"lstm/i2h": (T, N, 4 * H)} | {
        s: _state_shape(form, H) for s in ("h0_0", "c0_0", "h0_1", "c0_1")
    }
    return build, shapes | ({"seq_lengths": (N,)} if lengths else {})


CELLS["multi-rnn-cell"] = _multi_layer


@pytest.mark.parametrize(
    ("lengths", "form"), [(True, "1-D"), (False, "2-D")], ids=["lengths-1-D", "no-lengths-2-D"]
)
@pytest.mark.parametrize("cell", CELLS)
def test_backward_step_net_equals_jax_grad(cell, lengths, form):
    """Each cell with and without sequence lengths, and with 1-D and 2-D initial states (the float64
    test below adds lengths with 2-D states)."""
    build, shapes = CELLS[cell](lengths, form)
    model = _model(build)
    params = _random_params(model, seed=len(cell))
    report = rnn2jax.verify(model.net.Proto(), shapes=shapes, params=params, seed=1, rtol=1e-5, atol=1e-6)
    assert report.ok, str(report)  # every gradient blob within 1e-6 + 1e-5 * max|jax.grad|
    assert len(report.checks) >= 3


@pytest.mark.parametrize("cell", CELLS)
def test_backward_step_net_in_float64_with_finite_differences(cell):
    build, shapes = CELLS[cell](True, "2-D")
    model = _model(build)
    params = _random_params(model, seed=len(cell))
    report = rnn2jax.verify(
        model.net.Proto(), shapes=shapes, params=params, dtype="float64", finite_differences=True
    )
    assert report.rtol == 1e-9 and report.ok, str(report)  # within 1e-11 + 1e-9 * max|jax.grad|
    assert all(c.fd_rel is not None and c.fd_rel <= 1e-5 for c in report.checks), str(report)
