"""RecurrentNetworkGradient on the native LSTM backward kernel, when (and only when) its backward step net is
Caffe2's own for a recognised LSTM stack (gradient.py's `native_plan`, ops/recurrent/backward_step.py).

Checked here:
- training nets of the builder's LSTM cells (one layer with and without sequence lengths, forget_bias,
  drop_states, gradients for every output; two layers) compiled by rnn2jax call `rnn2jax_lstm_backward`
  for the gradient op, and give real Caffe2's training-net gradients and the plain lowering's (which scans
  the backward step net), drawn by hypothesis (T = 0, sequence lengths of 0, T and beyond T among them,
  1-D, 2-D and 3-D initial states);
- the same for nets built by REAL Caffe2's `rnn_cell.LSTM` (1 and 2 layers), its gradient ops made by
  real Caffe2 too;
- a backward step net with one op changed does not take the native path: it gives what the scan of that
  net gives, which is what Caffe2 gives for it, and not the true gradient; nor does a net whose backward
  Caffe2 built differently (recompute_blobs_on_backward);
- CUDA and TPU lowerings of the training net call no native handler;
- the comparison of backward step nets: Caffe2's run of independent gradient Sums may come in any order,
  nothing else may differ.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

# the kernels at these tests' small shapes too (an autouse fixture), and the float32 comparison
from test_builder_cells import CELLS, build_cell, random_params, run_caffe2, training_net
from test_builder_cells import sizes as builder_sizes
from test_native_kernels import assert_close, native_targets, recurrences_of_every_size_native  # noqa: F401

import rnn2jax
from differential import assert_blobs_equal
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.ir.loader import load
from rnn2jax.ir.netdef import decode_net
from rnn2jax.lowering.interpreter import lower
from rnn2jax.native import library
from rnn2jax.ops.recurrent.backward_step import same_net
from rnn2jax.proto import caffe2_pb2 as pb

NATIVE_BACKWARD = {"rnn2jax_lstm_forward_gates", "rnn2jax_lstm_backward"}


def kernels_in_use() -> bool:
    return library.status().in_use


def sizes():
    """Small LSTM sizes, T = 0 and lengths past T among them, the initial states in every form."""
    return builder_sizes(min_steps=0, max_steps=5, max_input=4, max_hidden=9)


EDGES = (
    {"T": 4, "N": 3, "D": 2, "H": 9, "L": 1, "E": 1, "forms": ["3-D", "1-D", "2-D", "3-D"], "use_lengths": True,
     "lengths": [0, 4, 2], "seed": 5},
    {"T": 0, "N": 2, "D": 3, "H": 4, "L": 1, "E": 1, "forms": ["2-D", "3-D", "1-D", "3-D"], "use_lengths": True,
     "lengths": [0, 0], "seed": 6},
)  # fmt: skip


def _randn(rng, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _plain(train: pb.NetDef, values: dict) -> dict[str, np.ndarray]:
    """The training net lowered plain (verify's reference): the backward step net scanned as written."""
    return {k: np.asarray(v) for k, v in jax.jit(lower(load(train), plain=True))(values).items()}


def _check_training_net(caffe2, init, net, params, inputs, grad_outputs, rng, native: bool) -> dict:
    """Caffe2's training net (gradient ops from rnn2jax's gradient makers) against rnn2jax's compiled
    one; whether the gradient op ran on the native backward; the plain lowering's gradients too.
    Returns rnn2jax's gradients."""
    forward = run_caffe2(caffe2, init, net, {**inputs, **params}, grad_outputs)
    train, grad_map = training_net(net, grad_outputs)
    feeds = {**inputs, **{f"{y}_grad": _randn(rng, forward[y].shape) for y in grad_outputs}}
    fetch = [grad_map[n] for n, v in {**inputs, **params}.items() if v.dtype.kind == "f"]
    want = run_caffe2(caffe2, init, train, {**feeds, **params}, fetch)
    fn = rnn2jax.compile(train, params=params, outputs=fetch)
    targets = native_targets(fn.lower(feeds).as_text())
    if kernels_in_use():
        assert ("rnn2jax_lstm_backward" in targets) == native, targets
    got = {k: np.asarray(v) for k, v in fn(feeds).items()}
    assert_blobs_equal(got, want)
    plain = _plain(train, {**params, **feeds})
    for name in fetch:
        assert_close(got[name], plain[name], name)
    return got


# -- (a) the builder's cells --------------------------------------------------------------------------

NATIVE_CELLS = ("lstm", "lstm-forget_bias", "lstm-drop_states", "lstm-all_output_grads", "multi_rnn_cell")


@pytest.mark.parametrize("cell", NATIVE_CELLS)
@settings(max_examples=2, deadline=None)
@given(s=sizes())
@example(s=EDGES[0])
@example(s=EDGES[1])
def test_builder_training_nets_run_the_native_backward(caffe2, cell, s):
    """Every input and parameter gradient of the training net equals Caffe2's and the plain lowering's,
    with the gradient op on `rnn2jax_lstm_backward` wherever a step runs (T = 0 runs no step: the scan's
    trivial answer, no kernel)."""
    built, init, net, params, rng = build_cell(cell, s)
    _check_training_net(caffe2, init, net, params, built.inputs, built.grad_outputs, rng, native=s["T"] > 0)


# -- (a) nets built by real Caffe2 --------------------------------------------------------------------


@st.composite
def real_cases(draw) -> dict:
    steps, batch = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    return {
        "layers": draw(st.sampled_from([1, 2])),
        "T": steps,
        "N": batch,
        "D": draw(st.integers(1, 4)),
        "H": draw(st.integers(1, 7)),
        "lengths": draw(st.none() | st.lists(st.integers(0, steps), min_size=batch, max_size=batch)),
        "forget_bias": draw(st.sampled_from([0.0, 0.7])),
        "drop_states": draw(st.booleans()),
        # the builder's outputs_with_grads counts the last layer's outputs: (0, 1) are its hidden `_all`, `_last`
        "outputs_with_grads": draw(st.sampled_from([[0], [0, 1], [0, 1, 2, 3]])),
        "seed": draw(st.integers(0, 2**16)),
    }


REAL_EDGE = {"layers": 2, "T": 3, "N": 3, "D": 2, "H": 5, "lengths": [0, 3, 1], "forget_bias": 0.7,
             "drop_states": True, "outputs_with_grads": [0, 1, 2, 3], "seed": 1}  # fmt: skip


def _build_in_caffe2(caffe2, case):
    layers, hidden = case["layers"], case["H"]
    initial = ["h0", "c0"] if layers == 1 else ["h0_0", "c0_0", "h0_1", "c0_1"]
    kwargs = {
        "scope": "lstm",
        "forget_bias": case["forget_bias"],
        "drop_states": case["drop_states"],
        "outputs_with_grads": case["outputs_with_grads"],
    }
    if layers == 2:
        kwargs["return_last_layer_only"] = False
    lengths = "seq_lengths" if case["lengths"] is not None else None
    dims = hidden if layers == 1 else [hidden, hidden + 1]
    call = {"fn": "rnn_cell.LSTM", "args": [{"$model": "model"}, "x", lengths, initial, case["D"], dims],
            "kwargs": kwargs}  # fmt: skip
    nets, _ = caffe2.build([call], {"model": {"name": "model"}})
    return nets["model"], initial


@settings(max_examples=6, deadline=None)
@given(case=real_cases())
@example(case=REAL_EDGE)
@example(case=REAL_EDGE | {"layers": 1, "lengths": None, "drop_states": False, "forget_bias": 0.0})
def test_real_caffe2_lstm_training_nets_run_the_native_backward(caffe2, case):
    """`rnn_cell.LSTM` as real Caffe2 builds it, with real Caffe2's gradient ops (GetBackwardPass): the
    backward step net is recognised as Caffe2's own, runs natively, and gives Caffe2's gradients."""
    (net, init), initial = _build_in_caffe2(caffe2, case)
    rng = np.random.default_rng(case["seed"])
    params = {}
    for op in init.op:
        (shape,) = [list(a.ints) for a in op.arg if a.name == "shape"]
        params[op.output[0]] = _randn(rng, shape) * np.float32(0.5)
    rnn = next(op for op in net.op if op.type == "RecurrentNetwork")
    inputs = {"x": _randn(rng, (case["T"], case["N"], case["D"]))}
    for name, width in zip(initial, [case["H"]] * 2 + [case["H"] + 1] * 2, strict=False):
        inputs[name] = _randn(rng, (1, case["N"], width))
    if case["lengths"] is not None:
        inputs["seq_lengths"] = np.asarray(case["lengths"], np.int32)
    with_grads = next(list(a.ints) for a in rnn.arg if a.name == "outputs_with_grads")
    outputs = [rnn.output[k] for k in with_grads]
    forward = run_caffe2(caffe2, init, net, {**inputs, **params}, outputs)
    ys = {y: f"{y}_grad" for y in outputs}
    grad_ops, grad_map = caffe2.backward_pass(list(net.op), ys)
    train = pb.NetDef()
    train.CopyFrom(net)
    train.op.extend(grad_ops)
    train.external_input.extend(ys.values())
    feeds = {**inputs, **{g: _randn(rng, forward[y].shape) for y, g in ys.items()}}
    fetch = [grad_map[n] for n in [*inputs, *params] if n != "seq_lengths"]
    want = run_caffe2(caffe2, init, train, {**feeds, **params}, fetch)
    fn = rnn2jax.compile(train, params=params, outputs=fetch)
    if kernels_in_use():
        assert native_targets(fn.lower(feeds).as_text()) >= NATIVE_BACKWARD
    got = {k: np.asarray(v) for k, v in fn(feeds).items()}
    assert_blobs_equal(got, want)
    plain = _plain(train, {**params, **feeds})
    for name in fetch:
        assert_close(got[name], plain[name], name)


# -- (b) anything else runs the backward step net as written --------------------------------------------


def _edit_backward(net: pb.NetDef, edit) -> None:
    rnn = next(op for op in net.op if op.type == "RecurrentNetwork")
    arg = next(a for a in rnn.arg if a.name == "backward_step_net")
    edit(arg.n)


def _scaled_gates_gradient(bsn: pb.NetDef) -> None:
    """A Scale(2) of the gates' gradient after LSTMUnitGradient: every gradient but the state's is doubled."""
    position = next(i for i, op in enumerate(bsn.op) if op.type == "LSTMUnitGradient")
    grad = bsn.op[position].output[2]
    scale = pb.OperatorDef(type="Scale", input=[grad], output=[grad])
    scale.arg.add(name="scale", f=2.0)
    ops = list(bsn.op)
    ops.insert(position + 1, scale)
    del bsn.op[:]
    bsn.op.extend(ops)


def _swapped_state_gradients(bsn: pb.NetDef) -> None:
    """LSTMUnitGradient reading the cell's output gradient as the hidden's and the other way round."""
    op = next(op for op in bsn.op if op.type == "LSTMUnitGradient")
    op.input[7], op.input[8] = op.input[8], op.input[7]


def _other_forget_bias(bsn: pb.NetDef) -> None:
    """LSTMUnitGradient with a forget_bias the forward LSTMUnit does not have."""
    op = next(op for op in bsn.op if op.type == "LSTMUnitGradient")
    next(a for a in op.arg if a.name == "forget_bias").f = 0.5


EDITS = {
    "scaled gates gradient": _scaled_gates_gradient,
    "swapped state gradients": _swapped_state_gradients,
    "other forget_bias": _other_forget_bias,
}
EDIT_SIZES = {"T": 4, "N": 3, "D": 2, "H": 5, "L": 1, "E": 1, "forms": ["3-D"] * 4, "use_lengths": True,
              "lengths": [4, 2, 3], "seed": 7}  # fmt: skip


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_backward_step_net_runs_as_written(caffe2, edit):
    """The wrong gradients of the edited net, as Caffe2 and the scan of the net give them (no native
    backward), and not the true ones."""

    def build():
        reset_net_names()
        rng = np.random.default_rng(EDIT_SIZES["seed"])
        built = CELLS["lstm"](EDIT_SIZES, rng)
        return built, random_params(built.model, rng)

    built, params = build()
    init, net = built.model.param_init_net.Proto(), built.model.net.Proto()
    true = _check_training_net(caffe2, init, net, params, built.inputs, built.grad_outputs,
                               np.random.default_rng(0), native=True)  # fmt: skip
    built, params = build()
    init, net = built.model.param_init_net.Proto(), built.model.net.Proto()
    _edit_backward(net, EDITS[edit])
    wrong = _check_training_net(caffe2, init, net, params, built.inputs, built.grad_outputs,
                                np.random.default_rng(0), native=False)  # fmt: skip
    assert any(np.abs(wrong[n] - true[n]).max() > 1e-3 * max(np.abs(true[n]).max(), 1.0) for n in true), edit


def test_a_recomputing_backward_runs_as_written(caffe2):
    """memory_optimization's recompute_blobs_on_backward: Caffe2's backward, but not the one the kernels
    stand for (the forward ops it recomputes run in it), so the scan runs it."""
    reset_net_names()
    rng = np.random.default_rng(3)
    built = CELLS["lstm-memory_optimization"](EDIT_SIZES, rng)
    params = random_params(built.model, rng)
    init, net = built.model.param_init_net.Proto(), built.model.net.Proto()
    _check_training_net(caffe2, init, net, params, built.inputs, built.grad_outputs, rng, native=False)


# -- (c) other platforms ----------------------------------------------------------------------------------


def test_other_platforms_lower_the_scan_of_the_backward_step_net():
    if not kernels_in_use():
        pytest.skip(f"the native kernels are not in use here: {library.status().reason}")
    reset_net_names()
    rng = np.random.default_rng(2)
    built = CELLS["multi_rnn_cell"](EDIT_SIZES, rng)
    params = random_params(built.model, rng)
    train, _ = training_net(built.model.net.Proto(), built.grad_outputs)
    fn = rnn2jax.compile(train, params=params)
    run = rnn2jax.compile(built.model.net.Proto(), params=params)(built.inputs)
    feeds = {**built.inputs, **{f"{y}_grad": _randn(rng, run[y].shape) for y in built.grad_outputs}}
    apply = jax.jit(fn.apply)
    assert native_targets(apply.lower(params, feeds).as_text()) >= NATIVE_BACKWARD
    for platforms in (("cuda",), ("tpu",), ("cuda", "tpu")):
        module = jax.export.export(apply, platforms=platforms)(params, feeds).mlir_module()
        assert not native_targets(module), platforms
        assert module.count("stablehlo.while") == 2, platforms  # the forward scan and the reverse one


# -- comparing backward step nets -------------------------------------------------------------------------


def _net(*ops: tuple[str, list[str], list[str]]) -> pb.NetDef:
    return pb.NetDef(op=[pb.OperatorDef(type=t, input=i, output=o) for t, i, o in ops], external_input=["a", "b"])


def test_same_net_allows_independent_sums_in_any_order_only():
    grad = ("FCGradient", ["a", "b"], ["x", "y"])
    first, second = ("Sum", ["x", "a"], ["x"]), ("Sum", ["y", "b"], ["y"])
    ours = decode_net(_net(grad, first, second))
    assert same_net(ours, decode_net(_net(grad, second, first)))
    dependent = ("Sum", ["x", "y"], ["y"])
    assert not same_net(decode_net(_net(grad, first, dependent)), decode_net(_net(grad, dependent, first)))
    assert not same_net(ours, decode_net(_net(grad, ("Sum", ["a", "x"], ["x"]), second)))
    named = _net(grad, first, second)
    named.op[0].name, named.op[0].is_gradient_op = "renamed", True
    named.op[1].device_option.extra_info.append("is_auto_gen_sum_ops:1")
    assert same_net(ours, decode_net(named))
    with_arg = _net(grad, first, second)
    with_arg.op[0].arg.add(name="axis", i=2)
    assert not same_net(ours, decode_net(with_arg))
