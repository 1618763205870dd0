"""Every op that the backward step nets of Caffe2's cells contain is supported, so no forward op of
SEMANTICS.md section 3 lacks its gradient op."""

from __future__ import annotations

import pytest

import rnn2jax
from rnn2jax.caffe2.python.attention import AttentionType
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM, MILSTM, BasicRNN, LayerNormLSTM, LayerNormMILSTM
from rnn2jax.caffe2.python.rnn_cell import LSTMWithAttention as Attention
from rnn2jax.ops import supported

BUILDERS = {
    "lstm": lambda m: LSTM(m, "x", "l", ("h", "c"), 3, 4, scope="lstm"),
    "lstm-memory-optimization": lambda m: LSTM(
        m, "x", "l", ("h", "c"), 3, 4, scope="lstm", memory_optimization=True
    ),
    "lstm-stack": lambda m: LSTM(m, "x", "l", ("h0", "c0", "h1", "c1"), 3, [4, 4], scope="lstm"),
    "milstm": lambda m: MILSTM(m, "x", "l", ("h", "c"), 3, 4, scope="milstm"),
    "lnlstm": lambda m: LayerNormLSTM(m, "x", "l", ("h", "c"), 3, 4, scope="lnlstm"),
    "lnmilstm": lambda m: LayerNormMILSTM(m, "x", "l", ("h", "c"), 3, 4, scope="lnmilstm"),
    "gru": lambda m: GRU(m, "x", "l", ("h",), 3, 4, scope="gru"),
    "gru-lbr": lambda m: GRU(m, "x", "l", ("h",), 3, 4, scope="gru", linear_before_reset=True),
    "basic-rnn": lambda m: BasicRNN(m, "x", None, ("h",), 3, 4, scope="rnn", activation="tanh"),
    **{
        f"attention-{t.name}": lambda m, t=t: Attention(
            m, "d", "dl", "h", "c", "a", 3, "e", "el", 3, 4, "att", attention_type=t
        )
        for t in (AttentionType.Regular, AttentionType.Recurrent, AttentionType.Dot)
    },
}


@pytest.mark.parametrize("cell", BUILDERS)
def test_backward_step_net_ops_are_all_supported(cell):
    model = ModelHelper(name="coverage")
    BUILDERS[cell](model)
    net = rnn2jax.load(model.net.Proto())
    (rnn,) = [op for op in net.ops if op.type == "RecurrentNetwork"]
    backward = rnn.net("backward_step_net")
    types = {op.type for op in backward.walk()} | {op.type for op in rnn.net("step_net").walk()}
    assert types and not {t for t in types if not supported(t)}
