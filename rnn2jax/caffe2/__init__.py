"""Caffe2's Python API on JAX: `rnn2jax.caffe2` is a `caffe2` package.

`rnn2jax.caffe2.python.core`, `.workspace`, `.model_helper`, `.brew`, `.rnn_cell`, ... and
`rnn2jax.caffe2.proto.caffe2_pb2` have Caffe2's names and signatures. `install()` makes
`import caffe2` resolve to this package for the current process, so old Caffe2 scripts run unchanged
(`rnn2jax exec script.py` does that for a script).
"""

from __future__ import annotations

import warnings
from typing import Any

from .import_hook import caffe2_source, install, installed, uninstall

__all__ = ["caffe2_source", "install", "installed", "uninstall"]

# The snake_case builder of earlier releases, kept as deprecated aliases: name -> (module, attribute), the
# module under rnn2jax.caffe2 or, for the gradient machinery that moved into the core, a full module name.
_DEPRECATED = {
    "create_operator": ("opdef", "create_operator"),
    "create_net": ("opdef", "create_net"),
    "make_argument": ("opdef", "make_argument"),
    "make_tensor": ("opdef", "make_tensor"),
    "get_backward_pass": ("rnn2jax.ops.backward_pass", "get_backward_pass"),
    "get_gradient_for_op": ("rnn2jax.ops.gradient_makers", "get_gradient_for_op"),
    "register_gradient": ("rnn2jax.ops.gradient_makers", "register_gradient"),
    "GradientError": ("rnn2jax.ops.gradient_makers", "GradientError"),
    "version_checks": ("rnn2jax.ops.backward_pass", "version_checks"),
    "reset_net_names": ("python.core", "reset_net_names"),
    "BlobReference": ("python.core", "BlobReference"),
    "Net": ("python.core", "Net"),
    "ModelHelper": ("python.model_helper", "ModelHelper"),
    "name_scope": ("python.scope", "NameScope"),
    "current_name_scope": ("python.scope", "CurrentNameScope"),
    "recurrent_net": ("python.recurrent", "recurrent_net"),
    "brew": ("python", "brew"),
    "rnn_cell": ("python", "rnn_cell"),
    "gru_cell": ("python", "gru_cell"),
    "attention": ("python", "attention"),
    "AttentionCell": ("python.rnn_cell", "AttentionCell"),
    "AttentionType": ("python.attention", "AttentionType"),
    "LSTMWithAttention": ("python.rnn_cell", "LSTMWithAttention"),
    "LSTMWithAttentionCell": ("python.rnn_cell", "LSTMWithAttentionCell"),
    "GRU": ("python.gru_cell", "GRU"),
    "GRUCell": ("python.gru_cell", "GRUCell"),
    **{
        name: ("python.rnn_cell", name)
        for name in (
            "LSTM",
            "MILSTM",
            "BasicRNN",
            "BasicRNNCell",
            "DropoutCell",
            "LayerNormLSTM",
            "LayerNormLSTMCell",
            "LayerNormMILSTM",
            "LayerNormMILSTMCell",
            "LSTMCell",
            "LSTMInitializer",
            "MILSTMCell",
            "MultiRNNCell",
            "RNNCell",
        )
    },
}


def __getattr__(name: str) -> Any:
    if name not in _DEPRECATED:
        raise AttributeError(f"module 'rnn2jax.caffe2' has no attribute '{name}'")
    import importlib

    module, attribute = _DEPRECATED[name]
    if module.startswith("rnn2jax."):
        path, caffe2_name = module, ""
    else:
        path, caffe2_name = f"{__name__}.{module}", f" (Caffe2's caffe2.{module}.{attribute})"
    warnings.warn(
        f"rnn2jax.caffe2.{name} is deprecated: use {path}.{attribute}{caffe2_name}",
        DeprecationWarning,
        stacklevel=2,
    )
    parent = importlib.import_module(path)
    if hasattr(parent, attribute):
        return getattr(parent, attribute)
    return importlib.import_module(f"{path}.{attribute}")  # a submodule not imported yet
