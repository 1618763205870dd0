"""Test helpers: build one Caffe2 op (through protobuf, as a user's net would hold it) and run it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.ir.dtypes import caffe2_dtypes
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower

REALNETS = Path(__file__).resolve().parents[2] / "shared" / "realnets"
# The breadbread character LSTM's weights (what its init net Loads from a database that is not published):
# names and shapes as its nets use them (vocabulary 62, hidden 100).
BREADBREAD_VOCAB, BREADBREAD_HIDDEN = 62, 100
BREADBREAD_WEIGHTS = {
    "LSTM/i2h_w": (4 * BREADBREAD_HIDDEN, BREADBREAD_VOCAB),
    "LSTM/i2h_b": (4 * BREADBREAD_HIDDEN,),
    "LSTM/gates_t_w": (4 * BREADBREAD_HIDDEN, BREADBREAD_HIDDEN),
    "LSTM/gates_t_b": (4 * BREADBREAD_HIDDEN,),
    "char_rnn_blob_0_w": (BREADBREAD_VOCAB, BREADBREAD_HIDDEN),
    "char_rnn_blob_0_b": (BREADBREAD_VOCAB,),
}

# Every XLA compilation of this process, by function name: JAX's own monitoring event, not rnn2jax's cache.
_COMPILED: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, _duration, **kw: (
        _COMPILED.append(kw.get("fun_name", "")) if event == "/jax/core/compile/backend_compile_duration" else None
    )
)


@contextmanager
def count_compilations(of: str | None = None) -> Iterator[list[int]]:
    """`with count_compilations() as n:` sets `n[0]` to the XLA compilations inside the block: all of them,
    or those of functions whose name contains `of`."""
    start = len(_COMPILED)
    counted = [0]
    yield counted
    counted[0] = sum(of is None or of in name for name in _COMPILED[start:])


def forward(
    op_type: str,
    num_inputs: int,
    num_outputs: int = 1,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    **args: Any,
):
    """A single `op_type` op (built through protobuf, as a user's net holds it) as a traceable
    function of its input arrays returning its output arrays. Blobs are x0.., y0.. unless named
    (some ops care, e.g. in-place forms)."""
    ins = list(input_names or [f"x{i}" for i in range(num_inputs)])
    outs = list(output_names or [f"y{i}" for i in range(num_outputs)])
    net = lower(load(create_net("forward", [create_operator(op_type, ins, outs, **args)])))

    def fn(*arrays: Any, key: jax.Array | None = None) -> tuple:
        env = net(dict(zip(ins, arrays, strict=True)), key=key)
        return tuple(env[name] for name in outs)

    return fn


def run_op(
    op_type: str,
    inputs: Sequence[Any],
    num_outputs: int = 1,
    *,
    jit: bool = True,
    key: jax.Array | None = None,
    **args: Any,
) -> tuple[np.ndarray, ...]:
    """Run a single `op_type` op on `inputs`, under `jax.jit` or eagerly; outputs as NumPy arrays. The jit runs
    with 64-bit types on, as rnn2jax's own do (else JAX would narrow int64 inputs at its boundary)."""
    fn = forward(op_type, len(inputs), num_outputs, **args)
    if jit:
        fn = jax.jit(fn)
    with caffe2_dtypes():
        outs = fn(*inputs, key=key if key is not None else jax.random.key(0))
    return tuple(np.asarray(o) for o in outs)


BREADBREAD_PREDICT_NET = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"


def write_breadbread_run(folder: Path, steps: int, batch: int) -> list[str]:
    """Random parameters (seed 0, scale 0.1) and one-hot inputs of the breadbread predict net written to
    `folder`; returns the `rnn2jax run` arguments that read them."""
    rng = np.random.default_rng(0)
    weights = {n: rng.standard_normal(s).astype(np.float32) * 0.1 for n, s in BREADBREAD_WEIGHTS.items()}
    np.savez(folder / "params.npz", **weights)
    np.savez(
        folder / "inputs.npz",
        input_blob=np.eye(BREADBREAD_VOCAB, dtype=np.float32)[rng.integers(BREADBREAD_VOCAB, size=(steps, batch))],
        seq_lengths=np.full(batch, steps, np.int32),
        hidden_init=np.zeros((1, batch, BREADBREAD_HIDDEN), np.float32),
        cell_init=np.zeros((1, batch, BREADBREAD_HIDDEN), np.float32),
    )
    return [
        "run",
        str(BREADBREAD_PREDICT_NET),
        "--params",
        str(folder / "params.npz"),
        "--inputs",
        str(folder / "inputs.npz"),
    ]
