"""RecurrentNetwork built by `recurrent.recurrent_net` from a small step net, tested as a Caffe2 user's
operator test would (hypothesis_test_util): forward against a NumPy loop written here, gradients w.r.t.
the input sequence, the initial state and the step net's parameters by Caffe2's gradient checker.

Run under the plugin: `pytest -p rnn2jax.caffe2.pytest_plugin --caffe2-source $C2 tests/caffe2_api`.
Cross-checked against real Caffe2 by running this same file under torch 1.10.2's caffe2.
"""

from __future__ import annotations

from collections.abc import Callable

import caffe2.python.hypothesis_test_util as hu
import hypothesis.strategies as st
import numpy as np
from caffe2.python import core, recurrent, workspace
from caffe2.python.model_helper import ModelHelper
from hypothesis import given


def build_recurrent_net(
    cell: str, outputs_with_grads: tuple[int, ...], forward_only: bool = False
) -> tuple[ModelHelper, core.BlobReference, core.BlobReference]:
    """A model whose net holds one RecurrentNetwork op over `input` (T, N, D) from `initial_hidden`.

    Cells: "elman" h = Tanh(FC(h_prev; W, b) + x) (W, b are step-net references, so they get
    gradients); "sum_mul" h = x * (x + h_prev); "mul" h = x * h_prev."""
    model = ModelHelper(name="external")
    input_blob, initial_hidden = model.net.AddExternalInputs("input", "initial_hidden")
    step = ModelHelper(name="step", param_model=model)
    input_t, hidden_prev = step.net.AddExternalInput("input_t", "hidden_t_prev")
    if cell == "elman":
        weight, bias = step.net.AddExternalInputs("W", "b")
        model.net.AddExternalInputs(weight, bias)
        projected = step.net.FC([hidden_prev, weight, bias], "projected", axis=2)
        hidden_t = step.net.Tanh(step.net.Sum([projected, input_t], "pre_activation"), "hidden_t")
    elif cell == "sum_mul":
        hidden_t = step.net.Mul([input_t, step.net.Sum([input_t, hidden_prev], "summed")], "hidden_t")
    else:
        hidden_t = step.net.Mul([input_t, hidden_prev], "hidden_t")
    step.net.AddExternalOutput(hidden_t)
    hidden_all, hidden_last = recurrent.recurrent_net(
        net=model.net,
        cell_net=step.net,
        inputs=[(input_t, input_blob)],
        initial_cell_inputs=[(hidden_prev, initial_hidden)],
        links={hidden_prev: hidden_t},
        scope="rnn",
        outputs_with_grads=outputs_with_grads,
        forward_only=forward_only,
    )
    return model, hidden_all, hidden_last


def step_function(cell: str) -> Callable[..., np.ndarray]:
    """The cell's step in NumPy (float64): (x_t, h_prev, *params) -> h_t."""
    if cell == "elman":
        return lambda x, h, w, b: np.tanh(h @ w.T + b + x)
    if cell == "sum_mul":
        return lambda x, h: x * (x + h)
    return lambda x, h: x * h


def recurrent_reference(cell: str) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """(input, initial_hidden, *params) -> (hidden_all (T, N, D), hidden_last (1, N, D)) by a loop;
    with T = 0 the last state is the initial one."""
    step = step_function(cell)

    def reference(inputs, initial_hidden, *params):
        n, d = inputs.shape[1], inputs.shape[2]
        hidden = initial_hidden.astype(np.float64).reshape(n, d)
        states = []
        for x_t in inputs.astype(np.float64):
            hidden = step(x_t, hidden, *(p.astype(np.float64) for p in params))
            states.append(hidden)
        hidden_all = np.array(states).reshape(inputs.shape)
        return hidden_all.astype(np.float32), hidden.reshape(1, n, d).astype(np.float32)

    return reference


def feed_case(
    rng: np.random.RandomState, cell: str, t: int, n: int, d: int, two_d_initial: bool
) -> dict[str, np.ndarray]:
    values = {
        "input": rng.randn(t, n, d).astype(np.float32),
        "initial_hidden": rng.randn(*((n, d) if two_d_initial else (1, n, d))).astype(np.float32),
    }
    if cell == "elman":
        values["W"] = (rng.randn(d, d) / np.sqrt(d)).astype(np.float32)
        values["b"] = (0.5 * rng.randn(d)).astype(np.float32)
    for name, value in values.items():
        workspace.FeedBlob(name, value)
    return values


class TestRecurrentNetwork(hu.HypothesisTestCase):
    def check_cell(self, cell, seed, t, n, d, two_d_initial, outputs_with_grads, gc, dc, threshold, stepsize):
        rng = np.random.RandomState(seed)
        model, hidden_all, hidden_last = build_recurrent_net(cell, outputs_with_grads)
        op = model.net.Proto().op[-1]
        self.assertEqual(op.type, "RecurrentNetwork")
        values = feed_case(rng, cell, t, n, d, two_d_initial)
        # the op's inputs: the sequence, the initial state, then the step net's references (W, b)
        expected = ["input", "initial_hidden"] + (["W", "b"] if cell == "elman" else [])
        self.assertEqual(list(op.input), expected)
        self.assertEqual(list(op.output[:2]), [str(hidden_all), str(hidden_last)])
        inputs = [values[name] for name in op.input]

        self.assertReferenceChecks(gc, op, inputs, recurrent_reference(cell), outputs_to_check=[0, 1])
        self.assertDeviceChecks(dc, op, inputs, [0, 1])
        for index in range(len(inputs)):
            self.assertGradientChecks(
                gc, op, inputs, index, list(outputs_with_grads), threshold=threshold, stepsize=stepsize
            )

    @given(
        seed=st.integers(0, 2**31 - 1),
        t=st.integers(1, 4),
        n=st.integers(1, 3),
        d=st.integers(1, 3),
        two_d_initial=st.booleans(),
        outputs_with_grads=st.sampled_from([(0,), (0, 1)]),
        **hu.gcs_cpu_only,
    )
    def test_elman(self, seed, t, n, d, two_d_initial, outputs_with_grads, gc, dc):
        """Gradients reach the input, the initial state (2-D or 3-D, returned in its own shape) and
        both step-net parameters, accumulated over time. Threshold 0.005 (Caffe2's default) with the
        RNN tests' stepsize 0.005: the default 0.05 step's truncation error alone exceeds 0.005 on tanh
        near saturation (real Caffe2 fails such a case, e.g. seed=398, t=1, n=3, d=1, at 0.05)."""
        self.check_cell("elman", seed, t, n, d, two_d_initial, outputs_with_grads, gc, dc, 0.005, 0.005)

    @given(
        seed=st.integers(0, 2**31 - 1),
        t=st.integers(1, 4),
        n=st.integers(1, 3),
        d=st.integers(1, 3),
        cell=st.sampled_from(["sum_mul", "mul"]),
        two_d_initial=st.booleans(),
        **hu.gcs_cpu_only,
    )
    def test_sum_mul(self, seed, t, n, d, cell, two_d_initial, gc, dc):
        """Caffe2's sum/mul RNN tests' thresholds: 0.01, stepsize 0.005."""
        self.check_cell(cell, seed, t, n, d, two_d_initial, (0,), gc, dc, 0.01, 0.005)

    @given(seed=st.integers(0, 2**31 - 1), t=st.integers(1, 3), n=st.integers(1, 3), **hu.gcs_cpu_only)
    def test_infer_shapes(self, seed, t, n, gc, dc):
        """InferShapesAndTypes (which assertReferenceChecks calls) works on a net with a RecurrentNetwork:
        it names no shape for the non-tensor step_workspaces output (rnn2jax once failed there on the
        dict it keeps in that blob). Caffe2 infers the inputs only; rnn2jax the outputs too."""
        d = 2
        model, hidden_all, hidden_last = build_recurrent_net("elman", (0,))
        feed_case(np.random.RandomState(seed), "elman", t, n, d, two_d_initial=False)
        shapes, _ = workspace.InferShapesAndTypes([model.net])
        op = model.net.Proto().op[-1]
        self.assertNotIn(op.output[-1], shapes)
        expected = {"input": [t, n, d], "initial_hidden": [1, n, d], "W": [d, d], "b": [d]}
        expected.update({str(hidden_all): [t, n, d], str(hidden_last): [1, n, d]})
        for name, shape in shapes.items():
            self.assertEqual(shape, expected[name], name)
        self.assertLessEqual(set(expected) - {str(hidden_all), str(hidden_last)}, set(shapes))

    @given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 3), d=st.integers(1, 3), **hu.gcs_cpu_only)
    def test_reshaped_reruns(self, seed, n, d, gc, dc):
        """One created net re-run with sequences of different lengths, including an empty one (whose
        all-states output is empty and whose last state is the initial one)."""
        rng = np.random.RandomState(seed)
        model, hidden_all, hidden_last = build_recurrent_net("elman", (0,), forward_only=True)
        reference = recurrent_reference("elman")
        feed_case(rng, "elman", 1, n, d, two_d_initial=False)
        workspace.CreateNet(model.net)
        for t in (2, 0, 3, 1):
            values = feed_case(rng, "elman", t, n, d, two_d_initial=False)
            workspace.RunNet(model.net.Proto().name)
            expected_all, expected_last = reference(*(values[k] for k in ("input", "initial_hidden", "W", "b")))
            got_all = workspace.FetchBlob(hidden_all)
            self.assertEqual(got_all.shape, (t, n, d))
            np.testing.assert_allclose(got_all, expected_all, atol=1e-4, rtol=1e-4)
            np.testing.assert_allclose(workspace.FetchBlob(hidden_last), expected_last, atol=1e-4, rtol=1e-4)
