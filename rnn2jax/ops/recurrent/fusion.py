"""Step-net rewrites that make the scan body fast, with the same results.

Every Caffe2 LSTM step net computes `gates = FC(h_prev, W, b) + x_t` and hands the `[1, N, 4H]`
gates to LSTMUnit, which slices them into four blocks. Written literally, XLA fuses the per-step
column slices into the gate nonlinearities and the step runs several times slower than it should.
The rewrite feeds the scan four `[T, N, H]` input blocks (with the FC bias folded in, outside the
loop) and multiplies by four `[K, H]` weight blocks inside the step, so no slicing happens per step.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ...ir.netdef import Net, Op
from ..common import matmul_precision
from ..rnn_units import lstm_state_update
from .dataflow import last_writer, readers

GATES = ("i", "f", "o", "g")


@dataclass(frozen=True)
class FusedLSTM:
    """Positions of `FC -> Sum -> LSTMUnit` in a step net and the blobs they use."""

    fc: int
    sum: int
    unit: int
    fc_input: str
    weight: str
    bias: str
    sequence: str  # the per-step input link internal (x_t)
    gates: str  # the Sum's output, LSTMUnit's gates input
    keep_gates: bool  # something else (the backward step net) needs the gates blob itself
    keep_sequence: bool  # another op reads x_t too

    def block_name(self, gate: str) -> str:
        return f"{self.sequence}#{gate}"

    def prepare(self, sequences: MutableMapping[str, jax.Array], scope: Mapping[str, Any]) -> dict[str, jax.Array]:
        """Outside the loop: replace the sequence by its four bias-added gate blocks; return the four
        weight blocks, transposed to [K, H]."""
        x = sequences[self.sequence] if self.keep_sequence else sequences.pop(self.sequence)
        x = x + scope[self.bias]
        for gate, block in zip(GATES, jnp.split(x, 4, axis=-1), strict=True):
            sequences[self.block_name(gate)] = block
        return dict(zip(GATES, (w.T for w in jnp.split(scope[self.weight], 4, axis=0)), strict=True))

    def step(self, unit: Op, env: MutableMapping[str, Any], weights: Mapping[str, jax.Array]) -> None:
        """Inside the loop: the FC, the Sum and LSTMUnit as one computation on gate blocks."""
        a, row = env[self.fc_input], env[self.block_name("i")]
        k = weights["i"].shape[0]
        if getattr(a, "ndim", 0) < 1 or a.shape[-1] != k:
            raise ValueError(
                f"FC input '{self.fc_input}' {list(getattr(a, 'shape', ()))} does not have the K = {k} columns "
                f"of weight '{self.weight}'"
            )
        if a.shape[:-1] != row.shape[:-1]:  # Caffe2's Sum takes equal shapes only; nothing broadcasts
            raise ValueError(
                f"Sum of FC output '{self.gates}' {[*a.shape[:-1], 4 * row.shape[-1]]} and '{self.sequence}' "
                f"{[*row.shape[:-1], 4 * row.shape[-1]]}: inputs must have the same shape"
            )
        precision = matmul_precision()
        pre = {
            gate: env[self.block_name(gate)] + jnp.matmul(a, weights[gate], precision=precision) for gate in GATES
        }
        if self.keep_gates:
            env[self.gates] = jnp.concatenate([pre[gate] for gate in GATES], axis=-1)
        hidden, cell = lstm_state_update(unit, *(env[name] for name in unit.inputs[:2]), pre, _extra(unit, env))
        env[unit.outputs[0]], env[unit.outputs[1]] = hidden, cell


def _extra(unit: Op, env: Mapping[str, Any]) -> tuple:
    return tuple(env[name] for name in unit.inputs[3:])


def find_fused_lstms(net: Net, sequences: set[str], kept: set[str], per_step: set[str]) -> list[FusedLSTM]:
    """Every `FC(a, W, b) -> Sum(gates, x_t) -> LSTMUnit(h, c, gates, ...)` chain whose FC and Sum
    outputs nobody else reads, where x_t is a per-step sequence (`sequences`) and W and b are the same
    at every step: no step op writes them and they are not `per_step` blobs (links, the timestep).
    `kept` names blobs needed after the step (the backward step net's scratches)."""
    ops = net.ops
    found = []
    for unit_pos, unit in enumerate(ops):
        if unit.type != "LSTMUnit" or len(unit.inputs) < 4:
            continue
        gates = unit.inputs[2]
        sum_pos = last_writer(ops, gates, unit_pos)
        if sum_pos is None or ops[sum_pos].type != "Sum" or len(ops[sum_pos].inputs) != 2:
            continue
        summed = ops[sum_pos]
        fc_out, seq = summed.inputs
        if seq not in sequences:
            fc_out, seq = seq, fc_out
        fc_pos = last_writer(ops, fc_out, sum_pos)
        if seq not in sequences or fc_pos is None or not _plain_fc(ops[fc_pos]):
            continue
        fc = ops[fc_pos]
        private = (
            readers(ops, fc_out, fc_pos) == [sum_pos]
            and readers(ops, gates, sum_pos) == [unit_pos]
            # Caffe2's Sum is in place (gates_t -> gates_t): a kept `gates` is then the Sum's output, which
            # `keep_gates` provides; only a separately named FC output must not be needed afterwards.
            and (fc_out == gates or fc_out not in kept)
            and last_writer(ops, fc.inputs[0], unit_pos) == last_writer(ops, fc.inputs[0], fc_pos)
            and last_writer(ops, fc.inputs[1], len(ops)) is None
            and last_writer(ops, fc.inputs[2], len(ops)) is None
            and not per_step & {fc.inputs[1], fc.inputs[2]}
        )
        if private:
            others = [i for i, op in enumerate(ops) if seq in op.inputs and i != sum_pos]
            found.append(
                FusedLSTM(
                    fc_pos,
                    sum_pos,
                    unit_pos,
                    *fc.inputs,
                    seq,
                    gates,
                    keep_gates=gates in kept,
                    keep_sequence=bool(others),
                )
            )
    return found


def _plain_fc(op: Op) -> bool:
    """An FC whose input is [1, N, K] at axis 2 (as every cell builds it), weights [4H, K] at axis_w 1."""
    return op.type == "FC" and len(op.inputs) == 3 and op.int("axis", 1) == 2 and op.int("axis_w", 1) == 1
