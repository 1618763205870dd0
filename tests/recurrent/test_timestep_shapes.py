"""Step nets whose shapes depend on the timestep (ops/recurrent/peeling.py), against real Caffe2.

Beam search's step net slices `Conditional(timestep == 0, BEAM_SIZE, -1)` scores: one hypothesis at the
first step, `beam_size` after it. The nets here follow that pattern with a settling step drawn by
hypothesis: the first steps run outside the loop, the rest in one scan, and both must give Caffe2's values.
Shapes that keep changing past the peeling limit are refused, naming the op, the blob and the step.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from differential import check_op
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import BadArgumentError, ShapeError, UnsupportedOpError
from rnn2jax.ops.recurrent.peeling import MAX_PEELED_STEPS
from rnn2jax.serving.codegen import generate

F32, I32 = np.float32, np.int32


def _recurrent(step_ops, *, k: int, extra_inputs=(), links=()):
    """A RecurrentNetwork over x [T, 1, D] with one state s [K] (rows [1, 1, K]) written by the step's
    'top' ([1, K], a view of the row as in Caffe2); the step's other blobs come from the enclosing net."""
    links = [("s_prev", "s_states", 0), ("top", "s_states", 1), ("x_t", "x", 0), *links]
    # Caffe2 refuses a step net that reads a blob neither declared external nor written before
    written = {name for o in step_ops for name in o.output}
    reads = [name for o in step_ops for name in o.input if name not in written]
    step = create_net("step", step_ops, external_inputs=dict.fromkeys(["timestep", *reads]))
    return create_operator(
        "RecurrentNetwork",
        ["x", "s0", *extra_inputs],
        ["s_all", "s_last", "step_workspaces"],
        alias_src=["s_states", "s_states"],
        alias_dst=["s_all", "s_last"],
        alias_offset=[1, -1],
        recurrent_states=["s_states"],
        initial_recurrent_state_ids=[1],
        link_internal=[link[0] for link in links],
        link_external=[link[1] for link in links],
        link_offset=[link[2] for link in links],
        step_net=step,
        timestep="timestep",
    )


def _beam_like_step(k: int) -> list:
    """Until step PEEL, top-K of the first END values of x_t (plus the state); then top-K of all of them."""
    return [
        create_operator("LT", ["timestep", "PEEL"], "on_first_steps"),
        create_operator("Conditional", ["on_first_steps", "END", "MINUS_ONE"], "slice_end"),
        create_operator("Conditional", ["on_first_steps", "PENALTY", "NO_PENALTY"], "penalty"),
        create_operator("FlattenToVec", ["x_t"], "x_flat"),
        create_operator("Slice", ["x_flat", "ZERO", "slice_end"], "x_head"),
        create_operator("Reshape", ["x_head"], ["x_row", "x_old_shape"], shape=[1, -1]),
        create_operator("TopK", ["x_row"], ["best", "best_index"], k=k),
        create_operator("Reshape", ["s_prev"], ["s_row", "s_old_shape"], shape=[1, -1]),
        create_operator("Add", ["best", "s_row"], "summed"),
        create_operator("Add", ["summed", "penalty"], "top", broadcast=1),
    ]


def _constants(peel: int, end: int) -> dict[str, np.ndarray]:
    return {
        "PEEL": np.array([peel], I32),
        "END": np.array([end], I32),
        "MINUS_ONE": np.array([-1], I32),
        "ZERO": np.array([0], I32),
        "PENALTY": np.array([-0.5], F32),
        "NO_PENALTY": np.array([0.0], F32),
    }


@given(
    steps=st.integers(1, 7),
    size=st.integers(2, 7),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_first_steps_with_other_shapes_run_outside_the_loop(caffe2, steps, size, data, seed):
    k = data.draw(st.integers(1, size), label="k")
    end = data.draw(st.integers(k, size), label="end")
    peel = data.draw(st.integers(0, 3), label="peel")
    rng = np.random.default_rng(seed)
    op = _recurrent(_beam_like_step(k), k=k)
    inputs = {
        "x": rng.standard_normal((steps, 1, size)).astype(F32),
        "s0": rng.standard_normal(k).astype(F32),
        **_constants(peel, end),
    }
    want = check_op(caffe2, op, inputs, outputs=["s_all", "s_last"])
    assert want is not None and want["s_all"].shape == (steps, 1, k)


def test_shapes_computed_from_a_step_blob_beside_the_timestep_ones(caffe2):
    """A Reshape whose shape is computed, per step, from x_t's Shape: a shape computation the loop runs at
    every step as usual, beside the timestep's, which only the peeled steps run."""
    k, size = 2, 5
    beam = _beam_like_step(k)
    for o in beam:
        o.input[:] = ["x_t_same" if name == "x_t" else name for name in o.input]
    step = [
        create_operator("Shape", ["x_t"], "x_shape"),
        create_operator("Mul", ["x_shape", "ONE64"], "x_shape_again", broadcast=1),
        create_operator("Reshape", ["x_t", "x_shape_again"], ["x_t_same", "x_t_old_shape"]),
        *beam,
    ]
    op = _recurrent(step, k=k)
    rng = np.random.default_rng(4)
    inputs = {
        "x": rng.standard_normal((4, 1, size)).astype(F32),
        "s0": np.zeros(k, F32),
        "ONE64": np.array([1], np.int64),
        **_constants(peel=1, end=3),
    }
    check_op(caffe2, op, inputs, outputs=["s_all"])


def test_the_loop_runs_only_the_settled_steps(caffe2):
    """The peeled steps' values differ from the settled ones (the test would not see a loop that ran
    every step with the first step's values, or the other way round)."""
    k, size, steps, peel = 2, 6, 5, 2
    op = _recurrent(_beam_like_step(k), k=k)
    x = np.arange(steps * size, dtype=F32)[::-1].reshape(steps, 1, size) % 7
    inputs = {"x": x, "s0": np.zeros(k, F32), **_constants(peel, end=3)}
    got = rnn2jax.compile(create_net("n", [op]), outputs=["s_all"])(inputs)["s_all"]
    # by hand: top-2 of x's first 3 values (minus 0.5) for 2 steps, then of all 6
    expected, state = [], np.zeros(k, F32)
    for t in range(steps):
        head = x[t, 0, :3] if t < peel else x[t, 0]
        state = np.sort(head)[::-1][:k] + state + (-0.5 if t < peel else 0.0)
        expected.append(state.copy())
    np.testing.assert_allclose(np.asarray(got)[:, 0], np.array(expected), rtol=1e-6)
    check_op(caffe2, op, inputs, outputs=["s_all"])


def _growing_step() -> list:
    """Sums x_t's first t + 1 values: the slice grows at every step, so the shapes never settle."""
    return [
        create_operator("Add", ["timestep", "ONE"], "slice_end"),
        create_operator("Reshape", ["x_t"], ["x_flat", "x_old_shape"], shape=[-1]),
        create_operator("Slice", ["x_flat", "ZERO", "slice_end"], "x_head"),
        create_operator("ReduceSum", ["x_head"], "head_sum", axes=[0], keepdims=1),
        create_operator("Add", ["s_prev", "head_sum"], "top", broadcast=1),
    ]


def test_shapes_that_change_at_every_step_are_peeled_up_to_the_limit(caffe2):
    steps = MAX_PEELED_STEPS + 1  # steps 0..15 peeled, step 16 in the loop
    op = _recurrent(_growing_step(), k=1)
    rng = np.random.default_rng(3)
    inputs = {
        "x": rng.standard_normal((steps, 1, steps)).astype(F32),
        "s0": np.zeros(1, F32),
        "ONE": np.array([1], I32),
        "ZERO": np.array([0], I32),
    }
    check_op(caffe2, op, inputs, outputs=["s_all", "s_last"])


def test_shapes_that_still_change_after_the_limit_are_refused():
    steps = MAX_PEELED_STEPS + 3
    op = _recurrent(_growing_step(), k=1)
    fn = rnn2jax.compile(create_net("growing", [op]), outputs=["s_all"])
    inputs = {
        "x": np.ones((steps, 1, steps), F32),
        "s0": np.zeros(1, F32),
        "ONE": np.array([1], I32),
        "ZERO": np.array([0], I32),
    }
    with pytest.raises(ShapeError) as error:
        fn(inputs)
    message = str(error.value)
    assert "net 'growing', op #0 (RecurrentNetwork)" in message
    assert "op #0 (Add) writes 'slice_end'" in message
    assert f"= [{steps - 1}] at step {steps - 2} and [{steps}] at step {steps - 1}" in message
    assert f"first {MAX_PEELED_STEPS} steps" in message


def test_a_shape_decided_by_a_recurrent_state_is_refused():
    """A state's values are only known when the step runs: no peeling can make them static."""
    ops = [
        create_operator("Cast", ["s_prev"], "end_float", to=2),  # int32
        create_operator("FlattenToVec", ["end_float"], "slice_end"),
        create_operator("FlattenToVec", ["x_t"], "x_flat"),
        create_operator("Slice", ["x_flat", "ZERO", "slice_end"], "x_head"),
        create_operator("ReduceSum", ["x_head"], "head_sum", axes=[0], keepdims=1),
        create_operator("Add", ["s_prev", "head_sum"], "top", broadcast=1),
    ]
    op = _recurrent(ops, k=1)
    fn = rnn2jax.compile(create_net("stateful", [op]), outputs=["s_all"])
    with pytest.raises(ShapeError, match=r"'slice_end'.*decide"):
        fn({"x": np.ones((3, 1, 4), F32), "s0": np.ones(1, F32), "ZERO": np.array([0], I32)})


def test_a_training_op_whose_step_shapes_depend_on_the_timestep_is_refused():
    op = _recurrent(_beam_like_step(1), k=1)
    op.arg.add(name="backward_step_net", n=create_net("backward", []))
    with pytest.raises(BadArgumentError, match="backward_step_net") as error:
        rnn2jax.compile(create_net("training", [op]), outputs=["s_all"])
    assert "net 'training', op #0 (RecurrentNetwork)" in str(error.value)


def test_codegen_refuses_a_step_net_whose_shapes_depend_on_the_timestep():
    """Slice's starts and ends are computed from the timestep (the same value at every step, which rnn2jax
    only knows by computing them): the generated module has no peeled steps, so it refuses."""
    ops = [
        create_operator("Mul", ["timestep", "ZERO"], "start"),
        create_operator("Add", ["start", "K"], "end"),
        create_operator("Reshape", ["x_t"], ["x_flat", "x_old_shape"], shape=[-1]),
        create_operator("Slice", ["x_flat", "start", "end"], "head"),
        create_operator("Reshape", ["head"], ["head_row", "head_old_shape"], shape=[1, -1]),
        create_operator("Reshape", ["s_prev"], ["s_row", "s_old_shape"], shape=[1, -1]),
        create_operator("Add", ["head_row", "s_row"], "top"),
    ]
    op = _recurrent(ops, k=2)
    constants = {"K": np.array([2], I32), "ZERO": np.array([0], I32)}
    with pytest.raises(UnsupportedOpError, match=r"timestep decides a shape in the step net \(net 'step'") as error:
        generate(create_net("decoder", [op]), constants, outputs=["s_all"])
    assert "codegen cannot write 1 op(s)" in str(error.value)
    x = np.arange(12, dtype=F32).reshape(3, 1, 4)
    got = rnn2jax.compile(create_net("decoder", [op]), outputs=["s_all"])({"x": x, "s0": np.zeros(2, F32), **constants})
    np.testing.assert_array_equal(np.asarray(got["s_all"])[:, 0], np.cumsum(x[:, 0, :2], axis=0))
