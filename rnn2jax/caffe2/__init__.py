"""Building Caffe2 nets in Python the way Caffe2's own front end did, for users with no Caffe2 left.

The functions here emit rnn2jax's wire-compatible protobuf messages (`rnn2jax.proto.caffe2_pb2`):
`create_operator`/`create_net` for single ops, and the recurrent builders of Caffe2's `rnn_cell`,
`gru_cell`, `attention` and `recurrent` modules (with the backward step nets core.py's gradient
machinery produced) on top of a small `ModelHelper`.
"""

from . import makers  # noqa: F401  (registers every family's gradient makers)
from .attention import AttentionCell, AttentionType, LSTMWithAttention, LSTMWithAttentionCell
from .core import create_net, create_operator, make_argument, make_tensor
from .gradients import (
    GradientError,
    get_backward_pass,
    get_gradient_for_op,
    register_gradient,
    version_checks,
)
from .gru_cell import GRU, GRUCell
from .model import BlobReference, ModelHelper, Net, current_name_scope, name_scope, reset_net_names
from .recurrent import recurrent_net
from .rnn_cell import (
    LSTM,
    MILSTM,
    BasicRNN,
    BasicRNNCell,
    DropoutCell,
    LayerNormLSTM,
    LayerNormLSTMCell,
    LayerNormMILSTM,
    LayerNormMILSTMCell,
    LSTMCell,
    LSTMInitializer,
    MILSTMCell,
    MultiRNNCell,
    RNNCell,
)

__all__ = [
    "GRU",
    "LSTM",
    "MILSTM",
    "AttentionCell",
    "AttentionType",
    "BasicRNN",
    "BasicRNNCell",
    "BlobReference",
    "DropoutCell",
    "GRUCell",
    "GradientError",
    "LSTMCell",
    "LSTMInitializer",
    "LSTMWithAttention",
    "LSTMWithAttentionCell",
    "LayerNormLSTM",
    "LayerNormLSTMCell",
    "LayerNormMILSTM",
    "LayerNormMILSTMCell",
    "MILSTMCell",
    "ModelHelper",
    "MultiRNNCell",
    "Net",
    "RNNCell",
    "create_net",
    "create_operator",
    "current_name_scope",
    "get_backward_pass",
    "get_gradient_for_op",
    "make_argument",
    "make_tensor",
    "name_scope",
    "recurrent_net",
    "register_gradient",
    "reset_net_names",
    "version_checks",
]
