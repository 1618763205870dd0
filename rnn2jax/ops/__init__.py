"""Caffe2 ops as JAX functions: the registry, and one module per op family.

Importing this package registers every family (each module registers its ops on import), so the
registry is complete wherever it is used, host ops (Print, the DB ops) included. Add a new family to
the list below. Nothing under `ops/` imports the interpreter (`rnn2jax.lower`) or anything above it: ops
that carry nets (RecurrentNetwork) are handed the interpreter's lowering function when built, and host
ops the workspace that runs them.
"""

from . import (  # noqa: F401
    activation,
    aliasing,
    array,
    compare,
    containers,
    control_flow,
    conv,
    counters,
    dataset,
    decoding,
    detection,
    distributed,
    dnnlowp,
    elementwise,
    embedding,
    features,
    fill,
    half,
    histogram,
    hsoftmax,
    image,
    inference_lstm,
    int8,
    linear,
    locally_connected,
    loss,
    math,
    metrics,
    misc,
    misc_extra,
    norm,
    optimizer,
    optimizer_extra,
    pool,
    positions,
    printing,
    queues,
    recurrent,
    reduce,
    rnn_internal,
    rnn_units,
    rowwise_quant,
    sampling,
    segment,
    sequence,
    sequence_packing,
    shape,
    sparse,
    stats,
    storage,
    strings,
    tensor_train,
)
from .registry import REGISTRY, OpDef, check_supported, lookup, register, supported, unsupported_ops

__all__ = ["REGISTRY", "OpDef", "check_supported", "lookup", "register", "supported", "unsupported_ops"]
