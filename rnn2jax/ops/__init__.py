"""Caffe2 ops as JAX functions: the registry, and one module per op family.

Importing this package registers every family (each module registers its ops on import), so the
registry is complete wherever it is used, host ops (Print, the DB ops) included. Add a new family to
the list below. Nothing under `ops/` imports the interpreter (`rnn2jax.lower`) or anything above it: ops
that carry nets (RecurrentNetwork) are handed the interpreter's lowering function when built, and host
ops the workspace that runs them.
"""

from . import (  # noqa: F401
    activation,
    array,
    compare,
    conv,
    distributed,
    elementwise,
    embedding,
    fill,
    image,
    linear,
    loss,
    math,
    norm,
    optimizer,
    optimizer_extra,
    pool,
    printing,
    recurrent,
    reduce,
    rnn_units,
    segment,
    sequence,
    sequence_packing,
    shape,
    sparse,
    storage,
)
from .registry import REGISTRY, OpDef, check_supported, lookup, register, supported, unsupported_ops

__all__ = ["REGISTRY", "OpDef", "check_supported", "lookup", "register", "supported", "unsupported_ops"]
