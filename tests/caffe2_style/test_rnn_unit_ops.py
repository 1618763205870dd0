"""LSTMUnit and GRUUnit, tested the way a Caffe2 user's operator test would (hypothesis_test_util).

Run under the plugin: `pytest -p rnn2jax.caffe2.pytest_plugin --caffe2-source $C2 tests/caffe2_api`.
The references are NumPy, written here from the ops' documented semantics (gate order, forget_bias inside
the sigmoid, past-the-end rows keep or drop the previous state); they were cross-checked against real
Caffe2 by running this same file under torch 1.10.2's caffe2 (`python -m unittest`).
"""

from __future__ import annotations

import caffe2.python.hypothesis_test_util as hu
import hypothesis.strategies as st
import numpy as np
from caffe2.python import core, workspace
from hypothesis import given

TIMESTEP_ON_CPU = {"timestep": hu.cpu_do}


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def valid_rows(seq_lengths: np.ndarray | None, timestep: np.ndarray, batch: int) -> np.ndarray:
    """[1, N, 1] booleans: rows whose sequence is still running at `timestep` (all without lengths)."""
    if seq_lengths is None:
        return np.ones((1, batch, 1), dtype=bool)
    return (int(timestep[0]) < seq_lengths.reshape(-1))[None, :, None]


def split_unit_inputs(rest: tuple, sequence_lengths: bool) -> tuple[np.ndarray | None, np.ndarray]:
    """(seq_lengths, timestep) from the inputs after the state/gates ones."""
    return (rest[0], rest[1]) if sequence_lengths else (None, rest[0])


def lstm_unit_reference(
    hidden_prev: np.ndarray,
    cell_prev: np.ndarray,
    gates: np.ndarray,
    *rest: np.ndarray,
    forget_bias: float,
    drop_states: bool,
    sequence_lengths: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Gate blocks [i, f, o, g]; f = sigmoid(f + forget_bias); a finished row keeps its state (or 0)."""
    seq_lengths, timestep = split_unit_inputs(rest, sequence_lengths)
    d = cell_prev.shape[-1]
    x = gates.astype(np.float64)
    i = sigmoid(x[..., :d])
    f = sigmoid(x[..., d : 2 * d] + forget_bias)
    o = sigmoid(x[..., 2 * d : 3 * d])
    g = np.tanh(x[..., 3 * d :])
    cell = f * cell_prev + i * g
    hidden = o * np.tanh(cell)
    valid = valid_rows(seq_lengths, timestep, cell_prev.shape[1])
    keep = 0.0 if drop_states else 1.0
    return (
        np.where(valid, hidden, keep * hidden_prev).astype(np.float32),
        np.where(valid, cell, keep * cell_prev).astype(np.float32),
    )


def gru_unit_reference(
    hidden_prev: np.ndarray, gates: np.ndarray, *rest: np.ndarray, drop_states: bool, sequence_lengths: bool
) -> tuple[np.ndarray]:
    """Gate blocks [r, u, o]: h = u * h_prev + (1 - u) * tanh(o); the reset block is not read."""
    seq_lengths, timestep = split_unit_inputs(rest, sequence_lengths)
    d = hidden_prev.shape[-1]
    x = gates.astype(np.float64)
    u = sigmoid(x[..., d : 2 * d])
    o = np.tanh(x[..., 2 * d :])
    hidden = u * hidden_prev + (1 - u) * o
    valid = valid_rows(seq_lengths, timestep, hidden_prev.shape[1])
    keep = 0.0 if drop_states else 1.0
    return (np.where(valid, hidden, keep * hidden_prev).astype(np.float32),)


def gru_unit_grad_reference(
    d_hidden: np.ndarray, hidden_prev: np.ndarray, gates: np.ndarray, valid: np.ndarray, drop_states: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(dHidden_prev, dGates) by hand: the reset block gets exactly 0; finished rows pass dHidden
    through to the previous state (or drop it) and give the gates nothing."""
    d = hidden_prev.shape[-1]
    x = gates.astype(np.float64)
    u = sigmoid(x[..., d : 2 * d])
    o = np.tanh(x[..., 2 * d :])
    d_gates = np.concatenate(
        [np.zeros_like(u), d_hidden * (hidden_prev - o) * u * (1 - u), d_hidden * (1 - u) * (1 - o * o)], axis=-1
    )
    keep = 0.0 if drop_states else 1.0
    return np.where(valid, d_hidden * u, keep * d_hidden), np.where(valid, d_gates, 0.0)


def unit_case(rng: np.random.RandomState, n: int, d: int, t: int, gate_blocks: int, zero_lengths: bool):
    """Random (hidden_prev, cell_prev, gates, seq_lengths, timestep) for one step of a T-step batch:
    lengths in [0, T] (0 only if `zero_lengths`), so rows past their end occur."""
    hidden_prev = rng.randn(1, n, d).astype(np.float32)
    cell_prev = rng.randn(1, n, d).astype(np.float32)
    gates = (2 * rng.randn(1, n, gate_blocks * d)).astype(np.float32)
    seq_lengths = rng.randint(0 if zero_lengths else 1, t + 1, size=(n,)).astype(np.int32)
    timestep = rng.randint(0, t, size=(1,)).astype(np.int32)
    return hidden_prev, cell_prev, gates, seq_lengths, timestep


class TestLSTMUnit(hu.HypothesisTestCase):
    @given(
        seed=st.integers(0, 2**31 - 1),
        n=st.integers(1, 4),
        d=st.integers(1, 4),
        t=st.integers(1, 5),
        forget_bias=st.floats(-10.0, 10.0),
        drop_states=st.booleans(),
        use_sequence_lengths=st.booleans(),
        **hu.gcs_cpu_only,
    )
    def test_lstm_unit(self, seed, n, d, t, forget_bias, drop_states, use_sequence_lengths, gc, dc):
        rng = np.random.RandomState(seed)
        hidden_prev, cell_prev, gates, seq_lengths, timestep = unit_case(rng, n, d, t, 4, zero_lengths=True)
        names = ["hidden_t_prev", "cell_t_prev", "gates_t", "seq_lengths", "timestep"]
        inputs = [hidden_prev, cell_prev, gates, seq_lengths, timestep]
        if not use_sequence_lengths:
            del names[3], inputs[3]
        op = core.CreateOperator(
            "LSTMUnit",
            names,
            ["hidden_t", "cell_t"],
            forget_bias=forget_bias,
            drop_states=drop_states,
            sequence_lengths=use_sequence_lengths,
        )

        def reference(*args):
            return lstm_unit_reference(
                *args, forget_bias=forget_bias, drop_states=drop_states, sequence_lengths=use_sequence_lengths
            )

        self.assertReferenceChecks(gc, op, inputs, reference, input_device_options=TIMESTEP_ON_CPU)
        self.assertDeviceChecks(dc, op, inputs, [0, 1], input_device_options=TIMESTEP_ON_CPU)
        # Caffe2's own test checks the two states only; the gates' gradient is checked too.
        for index in range(3):
            self.assertGradientChecks(gc, op, inputs, index, [0, 1], input_device_options=TIMESTEP_ON_CPU)

    @given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 4), d=st.integers(1, 3), **hu.gcs_cpu_only)
    def test_lstm_unit_hidden_prev_gradient(self, seed, n, d, gc, dc):
        """LSTMUnit reads hidden_t_prev only for rows past their sequence (it reaches a running row
        through the step net's FC): its gradient is dHidden on finished rows and exactly 0 on the others."""
        rng = np.random.RandomState(seed)
        hidden_prev, cell_prev, gates, _, _ = unit_case(rng, n, d, 3, 4, zero_lengths=True)
        seq_lengths = np.arange(n, dtype=np.int32) % 3  # 0, 1, 2, 0...: rows 0 and 3 are finished at t=1
        timestep = np.array([1], dtype=np.int32)
        op = core.CreateOperator(
            "LSTMUnit",
            ["hidden_t_prev", "cell_t_prev", "gates_t", "seq_lengths", "timestep"],
            ["hidden_t", "cell_t"],
        )
        grad_ops, grad_map = core.GradientRegistry.GetGradientForOp(op, ["hidden_t_grad", "cell_t_grad"])
        inputs = [hidden_prev, cell_prev, gates, seq_lengths, timestep]
        for index, name in enumerate(op.input):
            workspace.FeedBlob(name, inputs[index])
        workspace.RunOperatorOnce(op)
        d_hidden = rng.randn(1, n, d).astype(np.float32)
        workspace.FeedBlob("hidden_t_grad", d_hidden)
        workspace.FeedBlob("cell_t_grad", rng.randn(1, n, d).astype(np.float32))
        workspace.RunOperatorsOnce(grad_ops)
        finished = (seq_lengths <= 1)[None, :, None]
        np.testing.assert_array_equal(workspace.FetchBlob(grad_map[0]), np.where(finished, d_hidden, 0.0))


class TestGRUUnit(hu.HypothesisTestCase):
    @given(
        seed=st.integers(0, 2**31 - 1),
        n=st.integers(1, 4),
        d=st.integers(1, 4),
        t=st.integers(1, 5),
        drop_states=st.booleans(),
        use_sequence_lengths=st.booleans(),
        **hu.gcs_cpu_only,
    )
    def test_gru_unit(self, seed, n, d, t, drop_states, use_sequence_lengths, gc, dc):
        rng = np.random.RandomState(seed)
        hidden_prev, _, gates, seq_lengths, timestep = unit_case(rng, n, d, t, 3, zero_lengths=True)
        names = ["hidden_t_prev", "gates_t", "seq_lengths", "timestep"]
        inputs = [hidden_prev, gates, seq_lengths, timestep]
        if not use_sequence_lengths:
            del names[2], inputs[2]
        op = core.CreateOperator(
            "GRUUnit",
            names,
            ["hidden_t"],
            forget_bias=0.0,  # GRUUnit carries the argument and ignores it
            drop_states=drop_states,
            sequence_lengths=use_sequence_lengths,
        )
        valid = valid_rows(seq_lengths if use_sequence_lengths else None, timestep, n)

        def reference(*args):
            return gru_unit_reference(*args, drop_states=drop_states, sequence_lengths=use_sequence_lengths)

        def grad_reference(d_hidden, outputs, args):
            d_prev, d_gates = gru_unit_grad_reference(d_hidden, args[0], args[1], valid, drop_states)
            return [d_prev, d_gates] + [None] * (len(args) - 2)

        self.assertReferenceChecks(
            gc,
            op,
            inputs,
            reference,
            input_device_options=TIMESTEP_ON_CPU,
            output_to_grad="hidden_t",
            grad_reference=grad_reference,
        )
        # the reset block is not read, so its gradient is exactly zero, not merely small
        grad_ops, grad_map = core.GradientRegistry.GetGradientForOp(op, ["hidden_t_grad"])
        with hu.temp_workspace():
            for index, name in enumerate(op.input):
                workspace.FeedBlob(name, inputs[index])
            workspace.RunOperatorOnce(op)
            workspace.FeedBlob("hidden_t_grad", np.ones((1, n, d), dtype=np.float32))
            workspace.RunOperatorsOnce(grad_ops)
            d_gates = workspace.FetchBlob(grad_map[1])
        self.assertEqual(d_gates.shape, (1, n, 3 * d))
        np.testing.assert_array_equal(d_gates[..., :d], 0.0)
        self.assertDeviceChecks(dc, op, inputs, [0], input_device_options=TIMESTEP_ON_CPU)
        # Caffe2's GRU unit test: threshold 1e-4, stepsize 0.005, on the whole gates input
        for index in range(2):
            self.assertGradientChecks(
                gc, op, inputs, index, [0], threshold=1e-4, stepsize=0.005, input_device_options=TIMESTEP_ON_CPU
            )
