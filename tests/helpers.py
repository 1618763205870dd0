"""Test helpers: build one Caffe2 op (through protobuf, as a user's net would hold it) and run it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rnn2jax.caffe2 import create_net, create_operator
from rnn2jax.load import load
from rnn2jax.lower import lower

REALNETS = Path(__file__).resolve().parents[2] / "shared" / "realnets"


def run_op(
    op_type: str,
    inputs: Sequence[Any],
    num_outputs: int = 1,
    *,
    jit: bool = True,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    key: jax.Array | None = None,
    **args: Any,
) -> tuple[np.ndarray, ...]:
    """Run a single `op_type` op on `inputs`, under `jax.jit` or eagerly; outputs as NumPy arrays."""
    in_names = list(input_names or [f"x{i}" for i in range(len(inputs))])
    out_names = list(output_names or [f"y{i}" for i in range(num_outputs)])
    proto = create_net("t", [create_operator(op_type, in_names, out_names, **args)])
    lowered = lower(load(proto))

    def fn(arrays, key):
        env = lowered(dict(zip(in_names, arrays, strict=True)), key=key)
        return tuple(env[n] for n in out_names)

    if jit:
        fn = jax.jit(fn)
    outs = fn(tuple(inputs), key if key is not None else jax.random.key(0))
    return tuple(np.asarray(o) for o in outs)
