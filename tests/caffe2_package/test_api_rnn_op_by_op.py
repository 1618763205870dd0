"""RecurrentNetwork run op by op through the compat `workspace`, as Caffe2's own tests run it, against real Caffe2.

- Caffe2's gradient checker runs the forward op (`RunOperatorOnce`) and then its gradient ops
  (`RunOperatorsOnce`) as separate programs, so `step_workspaces` crosses from one compiled function into
  another. A GRU step net's Concat writes `_gates_t_concat_dims` (split_info), which the backward step's
  Split must read as concrete values: it has to survive that crossing (gru_test.test_gru_main).
- A recurrent state may start with 0 initial rows: the state tensor is its T written rows
  (recurrent_network_test.test_stateful_convolution_forward_only with conv_window 1).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rnn2jax.caffe2.python import core, workspace
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.proto import caffe2_pb2 as pb


def _random(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


@settings(max_examples=4, deadline=None, database=None)
@given(
    T=st.integers(1, 3),
    N=st.integers(1, 3),
    D=st.integers(1, 3),
    lengths=st.booleans(),
    linear_before_reset=st.booleans(),
    drop_states=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_gru_gradient_ops_run_apart_from_the_forward_op(
    caffe2, T, N, D, lengths, linear_before_reset, drop_states, seed
) -> None:
    rng = np.random.default_rng(seed)
    reset_net_names()
    model = ModelHelper(name="m")
    GRU(
        model,
        "x",
        "seq_lengths" if lengths else None,
        ["h0"],
        D,
        D,
        scope="gru",
        linear_before_reset=linear_before_reset,
        drop_states=drop_states,
    )
    op = model.net.Proto().op[-1]
    assert op.type == "RecurrentNetwork"
    workspace.ResetWorkspace()
    workspace.RunNetOnce(model.param_init_net)
    feeds = {name: _random(rng, workspace.FetchBlob(name).shape) for name in map(str, model.params)}
    feeds[op.input[0]] = _random(rng, (T, N, 3 * D))  # the i2h output the op reads
    feeds["h0"] = _random(rng, (1, N, D))
    if lengths:
        feeds["seq_lengths"] = rng.integers(0, T + 1, size=N).astype(np.int32)
    feeds = {name: value for name, value in feeds.items() if name in op.input}
    grad_ops, g_input = core.GradientRegistry.GetGradientForOp(op, [o + "_grad" for o in op.output])
    workspace.ResetWorkspace()
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(op)
    for name in op.output[:-1]:  # every output but step_workspaces gets a gradient
        feeds[name + "_grad"] = _random(rng, workspace.FetchBlob(name).shape)
        workspace.FeedBlob(name + "_grad", feeds[name + "_grad"])
    workspace.RunOperatorsOnce(grad_ops)
    wanted = [g for g in g_input if g is not None]
    ours = {name: workspace.FetchBlob(name) for name in wanted}
    theirs = caffe2.run([("op", op), ("ops", grad_ops)], feeds, wanted)
    assert set(theirs) == set(wanted)
    for name in wanted:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-5, err_msg=name)


def _arg(name: str, value) -> pb.Argument:
    return core.CreateOperator("X", [], [], **{name: value}).arg[0]


@settings(max_examples=4, deadline=None, database=None)
@given(T=st.integers(1, 4), N=st.integers(1, 3), D=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_state_with_no_initial_rows(caffe2, T, N, D, seed) -> None:
    """`input_state` has 0 initial rows: step t writes its row t (offset 0) and reads it back through a second
    link (offset 0); `output_state` accumulates it. Outputs: all of `input_state`, `output_state` from row 1."""
    rng = np.random.default_rng(seed)
    step = pb.NetDef(name="step")
    step.op.extend(
        [
            core.CreateOperator("Scale", ["x_t"], ["input_state_t"], scale=2.0),
            core.CreateOperator("Add", ["input_state_t_prev", "output_state_t_prev"], ["output_state_t"]),
        ]
    )
    step.external_input.extend(["x_t", "input_state_t_prev", "output_state_t_prev", "timestep"])
    op = core.CreateOperator(
        "RecurrentNetwork",
        ["x", "input_state_init", "output_state_init"],
        ["input_state_all", "output_state_all", "step_workspaces"],
    )
    op.arg.extend(
        [
            _arg("alias_src", ["input_state", "output_state"]),
            _arg("alias_dst", ["input_state_all", "output_state_all"]),
            _arg("alias_offset", [0, 1]),
            _arg("recurrent_states", ["input_state", "output_state"]),
            _arg("initial_recurrent_state_ids", [1, 2]),
            _arg(
                "link_internal", ["x_t", "input_state_t_prev", "input_state_t", "output_state_t_prev", "output_state_t"]
            ),
            _arg("link_external", ["x", "input_state", "input_state", "output_state", "output_state"]),
            _arg("link_offset", [0, 0, 0, 0, 1]),
            _arg("link_window", [1, 1, 1, 1, 1]),
            _arg("timestep", "timestep"),
            _arg("step_net", step),
            _arg("outputs_with_grads", []),
        ]
    )
    for name in ("backward_link_internal", "backward_link_external", "backward_link_offset", "param"):
        op.arg.append(_arg(name, []))
    feeds = {
        "x": _random(rng, (T, N, D)),
        "input_state_init": np.zeros((0, N, D), np.float32),
        "output_state_init": _random(rng, (1, N, D)),
    }
    workspace.ResetWorkspace()
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(op)
    theirs = caffe2.run([("op", op)], feeds, ["input_state_all", "output_state_all"])
    x = feeds["x"]
    np.testing.assert_allclose(theirs["input_state_all"], 2 * x, rtol=1e-6)  # the oracle agrees with NumPy
    np.testing.assert_allclose(theirs["output_state_all"], feeds["output_state_init"] + np.cumsum(2 * x, 0), rtol=1e-5)
    for name in ("input_state_all", "output_state_all"):
        got = workspace.FetchBlob(name)
        assert got.shape == theirs[name].shape, name
        np.testing.assert_allclose(got, theirs[name], rtol=1e-6, atol=1e-6, err_msg=name)
