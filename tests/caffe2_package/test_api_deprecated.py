"""The snake_case builder names of earlier releases are thin deprecated aliases of the Caffe2-named API."""

import importlib
import re

import pytest

import rnn2jax.caffe2
from rnn2jax.caffe2 import _DEPRECATED


@pytest.mark.parametrize("old", sorted(_DEPRECATED))
def test_an_old_name_warns_and_is_the_new_object(old):
    module, attribute = _DEPRECATED[old]
    path = module if module.startswith("rnn2jax.") else f"rnn2jax.caffe2.{module}"  # moved into the core, or not
    parent = importlib.import_module(path)
    new = getattr(parent, attribute, None) or importlib.import_module(f"{path}.{attribute}")
    message = rf"rnn2jax\.caffe2\.{old} is deprecated: use {re.escape(path)}\.{attribute}"
    with pytest.warns(DeprecationWarning, match=message):
        assert getattr(rnn2jax.caffe2, old) is new


def test_the_aliases_cover_the_old_public_api():
    """Every name the 0.1 builder exported (its __all__) still resolves."""
    old_all = {
        "GRU", "LSTM", "MILSTM", "AttentionCell", "AttentionType", "BasicRNN", "BasicRNNCell", "BlobReference",
        "DropoutCell", "GRUCell", "GradientError", "LSTMCell", "LSTMInitializer", "LSTMWithAttention",
        "LSTMWithAttentionCell", "LayerNormLSTM", "LayerNormLSTMCell", "LayerNormMILSTM", "LayerNormMILSTMCell",
        "MILSTMCell", "ModelHelper", "MultiRNNCell", "Net", "RNNCell", "create_net", "create_operator",
        "current_name_scope", "get_backward_pass", "get_gradient_for_op", "make_argument", "make_tensor",
        "name_scope", "recurrent_net", "register_gradient", "reset_net_names", "version_checks",
    }  # fmt: skip
    assert old_all <= set(_DEPRECATED)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rnn2jax.caffe2.nope  # noqa: B018
