"""Every cell net the builder makes, run in real Caffe2 and in rnn2jax: forward outputs and, for the
trainable ones, the training net (main net + its gradient ops) with random output gradients.

The NetDefs are the builder's (`rnn2jax.caffe2`); Caffe2 runs them as a Caffe2 program would (the init
net, then the given parameters fed over its fills, then the main or training net); rnn2jax compiles the
same protos with `rnn2jax.compile(net, init_net=..., params=...)`. Every parameter (biases, scales and
the MILSTM/layer-norm vectors too) is drawn at random, so every one of them matters. Sizes are drawn by
hypothesis, with T = 0 and T = 1 and sequence lengths of 0 and T always among the examples (and lengths
beyond T, which Caffe2 treats as T); initial states come 1-D `(H,)`, 2-D `(N, H)` or 3-D `(1, N, H)`.

What Caffe2 does at the edges (checked here, so rnn2jax must do the same):
- T = 0: every `_all` output is `(0, N, H)`, every `_last` is the initial state (as `(1, N, H)`); the
  gradient op runs no step, parameter gradients are zeros and an initial state's gradient is the
  gradient of its `_last` output (zeros without one).
- a sequence length of 0: the row keeps its initial state (or zeros with drop_states) at every step,
  and all of its gradient flows to the initial state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import rnn2jax
from differential import Case, assert_blobs_equal, assert_same_ops, cases, check_op, run_rnn2jax
from rnn2jax.caffe2.python.attention import AttentionType
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import (
    LSTM,
    MILSTM,
    BasicRNN,
    DropoutCell,
    LayerNormLSTM,
    LayerNormMILSTM,
    LSTMCell,
    LSTMWithAttention,
    MultiRNNCell,
)
from rnn2jax.checking.oracle import Caffe2Error, Caffe2Oracle
from rnn2jax.errors import ShapeError, UnwrittenStateError
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.ops.gradient_makers import get_gradient_for_op
from rnn2jax.proto import caffe2_pb2 as pb

FORMS = ("1-D", "2-D", "3-D")


@st.composite
def sizes(
    draw,
    min_steps: int = 0,
    max_steps: int = 3,
    max_input: int = 3,
    max_hidden: int = 3,
    forms: Sequence[str] | None = None,
    past_the_end: bool = True,
) -> dict[str, Any]:
    """A builder cell's sizes; `forms` fixes the initial states' forms (else drawn), and `past_the_end` lets a
    length exceed T."""
    steps = draw(st.integers(min_steps, max_steps))
    batch = draw(st.integers(1, 3))
    return {
        "T": steps,
        "N": batch,
        "D": draw(st.integers(1, max_input)),
        "H": draw(st.integers(1, max_hidden)),
        "L": draw(st.integers(1, 3)),  # encoder length (attention)
        "E": draw(st.integers(1, 3)),  # encoder dim (attention)
        "forms": list(forms) if forms is not None else draw(st.lists(st.sampled_from(FORMS), min_size=4, max_size=4)),
        "use_lengths": draw(st.booleans()),
        # up to T + 1: a length beyond T means "valid at every step", in Caffe2 as in rnn2jax
        "lengths": draw(st.lists(st.integers(0, steps + past_the_end), min_size=batch, max_size=batch)),
        "seed": draw(st.integers(0, 2**16)),
    }


# Always run: T = 0 (zero lengths) and T = 1 with lengths 0 and T side by side; hypothesis adds T up to 3.
EDGES = (
    {"T": 0, "N": 2, "D": 2, "H": 3, "L": 2, "E": 2, "forms": ["3-D", "2-D", "1-D", "3-D"],
     "use_lengths": True, "lengths": [0, 0], "seed": 1},
    {"T": 1, "N": 3, "D": 1, "H": 2, "L": 3, "E": 3, "forms": ["1-D", "3-D", "2-D", "2-D"],
     "use_lengths": True, "lengths": [0, 1, 1], "seed": 2},
)  # fmt: skip


def with_edges(test):
    for edge in reversed(EDGES):
        test = example(s=edge)(test)
    return test


# ------------------------------------------------------------------------------------------------
# The cells


@dataclass
class Built:
    """A built model: the blobs to compare, the blobs given output gradients in training, the inputs."""

    model: ModelHelper
    outputs: list[str]
    grad_outputs: list[str]
    inputs: dict[str, np.ndarray]
    trainable: bool = True


def _randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _state(rng, form: str, batch: int, size: int) -> np.ndarray:
    shape = {"1-D": (size,), "2-D": (batch, size), "3-D": (1, batch, size)}[form]
    return _randn(rng, *shape, scale=0.5)


def _lengths(s) -> np.ndarray:
    return np.asarray(s["lengths"], np.int32)


def _sequence_inputs(s, rng, state_names: Sequence[str], sizes_: Sequence[int], lengths: bool) -> dict:
    inputs = {"x": _randn(rng, s["T"], s["N"], s["D"])}
    for i, (name, size) in enumerate(zip(state_names, sizes_, strict=True)):
        inputs[name] = _state(rng, s["forms"][i % 4], s["N"], size)
    if lengths:
        inputs["seq_lengths"] = _lengths(s)
    return inputs


def lstm_family(builder, scope: str, needs_lengths: bool = False, **kwargs) -> Callable:
    """LSTM, MILSTM and the layer-norm cells (the MILSTM family's LSTMUnit always reads lengths)."""

    def build(s, rng) -> Built:
        model = ModelHelper(name="model")
        lengths = needs_lengths or s["use_lengths"]
        outs = builder(
            model, "x", "seq_lengths" if lengths else None, ("h0", "c0"), s["D"], s["H"], scope=scope, **kwargs
        )
        grads = [outs[i] for i in kwargs.get("outputs_with_grads", (0,))]
        inputs = _sequence_inputs(s, rng, ("h0", "c0"), (s["H"], s["H"]), lengths)
        return Built(model, list(outs), grads, inputs, not kwargs.get("forward_only", False))

    return build


def lstm_initializer(s, rng) -> Built:
    """No initial states given: LSTMInitializer's 1-D parameters `initial_hidden_state`/`_cell_state`."""
    model = ModelHelper(name="model")
    outs = LSTM(model, "x", "seq_lengths", None, s["D"], s["H"], scope="lstm")
    return Built(model, list(outs), [outs[0]], _sequence_inputs(s, rng, (), (), True))


def single_state(builder, scope: str, **kwargs) -> Callable:
    """GRU and BasicRNN (one state). Caffe2 cannot build BasicRNN's backward with sequence lengths
    (SEMANTICS.md 3.3, checked below), so with lengths it is built forward-only."""

    def build(s, rng) -> Built:
        model = ModelHelper(name="model")
        lengths = s["use_lengths"]
        forward_only = builder is BasicRNN and lengths
        outs = builder(
            model, "x", "seq_lengths" if lengths else None, ("h0",), s["D"], s["H"], scope=scope,
            forward_only=forward_only, **kwargs,
        )  # fmt: skip
        inputs = _sequence_inputs(s, rng, ("h0",), (s["H"],), lengths)
        return Built(model, list(outs), [outs[0]], inputs, not forward_only)

    return build


def multi_layer(s, rng) -> Built:
    """rnn_cell.LSTM with two layers of different sizes (layer 1's i2h FC runs in the step net)."""
    model = ModelHelper(name="model")
    initial = ("h0_0", "c0_0", "h0_1", "c0_1")
    lengths = s["use_lengths"]
    hidden = s["H"]
    outs = LSTM(
        model, "x", "seq_lengths" if lengths else None, initial, s["D"], [hidden, hidden + 1], scope="lstm",
        return_last_layer_only=False, outputs_with_grads=(0, 1),
    )  # fmt: skip
    inputs = _sequence_inputs(s, rng, initial, (hidden, hidden, hidden + 1, hidden + 1), lengths)
    return Built(model, list(outs), [outs[4], outs[5]], inputs)


def dropout_stack(ratio: float, is_test: int) -> Callable:
    """A MultiRNNCell of two DropoutCell-wrapped LSTMCells: with ratio > 0 a Dropout(is_test) sits in the
    step net (after layer 0) and in the main net (on the output sequence); with ratio 0 there is none."""

    def build(s, rng) -> Built:
        model = ModelHelper(name="model")
        hidden = s["H"]
        cells = [
            DropoutCell(
                LSTMCell(s["D"] if i == 0 else hidden, hidden, 0.0, False, name=None),
                dropout_ratio=ratio,
                is_test=is_test,
                name=f"drop{i}",
            )
            for i in range(2)
        ]
        stack = MultiRNNCell(cells, name="lstm")
        initial = ["h0_0", "c0_0", "h0_1", "c0_1"]
        lengths = s["use_lengths"]
        output, states = stack.apply_over_sequence(
            model, "x", "seq_lengths" if lengths else None, initial, outputs_with_grads=[4]
        )
        types = [op.type for op in rnn2jax.load(model.net.Proto()).walk()]
        assert types.count("Dropout") == (2 if ratio else 0)
        inputs = _sequence_inputs(s, rng, initial, (hidden,) * 4, lengths)
        outputs = list(dict.fromkeys([*map(str, states), str(output)]))
        return Built(model, outputs, [str(output)], inputs)

    return build


def attention(kind: AttentionType, same_size: bool = False, masked: bool = False) -> Callable:
    """LSTMWithAttention; training output gradients go to the main net's Concat of the hidden and context
    sequences (so its Split gradient feeds the RecurrentNetworkGradient's outputs 0 and 4)."""

    def build(s, rng) -> Built:
        model = ModelHelper(name="att_model")
        hidden, dec_dim = s["H"], s["D"]
        enc_dim = hidden if same_size else s["E"]
        coverage = kind == AttentionType.SoftCoverage
        lengths = s["use_lengths"]
        outs = LSTMWithAttention(
            model, "dec_in", "dec_len" if lengths else None, "h0", "c0", "ctx0", enc_dim, "enc",
            "enc_len" if masked else None, dec_dim, hidden, "att", attention_type=kind,
            forward_only=coverage, attention_memory_optimization=masked,
        )  # fmt: skip
        (combination,) = [
            op.output[0] for op in model.net.Proto().op if op.type == "Concat" and "combination" in op.output[0]
        ]
        forms = s["forms"]
        inputs = {
            "dec_in": _randn(rng, s["T"], s["N"], dec_dim),
            "enc": _randn(rng, s["L"], s["N"], enc_dim),
            "h0": _state(rng, forms[0], s["N"], hidden),
            "c0": _state(rng, forms[1], s["N"], hidden),
            "ctx0": _state(rng, forms[2], s["N"], enc_dim),
        }
        if lengths:
            inputs["dec_len"] = _lengths(s)
        if masked:
            inputs["enc_len"] = rng.integers(1, s["L"] + 1, size=s["N"]).astype(np.int32)
        return Built(model, [*map(str, outs), combination], [combination], inputs, not coverage)

    return build


CELLS: dict[str, Callable[[dict, np.random.Generator], Built]] = {
    "lstm": lstm_family(LSTM, "lstm"),
    "lstm-memory_optimization": lstm_family(LSTM, "lstm", memory_optimization=True),
    "lstm-forget_bias": lstm_family(LSTM, "lstm", forget_bias=0.7),
    "lstm-drop_states": lstm_family(LSTM, "lstm", drop_states=True),
    "lstm-forward_only": lstm_family(LSTM, "lstm", forward_only=True),
    "lstm-all_output_grads": lstm_family(LSTM, "lstm", outputs_with_grads=(0, 1, 2, 3)),
    "lstm-initializer": lstm_initializer,
    "milstm": lstm_family(MILSTM, "milstm", needs_lengths=True),
    "layernorm_lstm": lstm_family(LayerNormLSTM, "lnlstm", needs_lengths=True),
    "layernorm_milstm": lstm_family(LayerNormMILSTM, "lnmilstm", needs_lengths=True),
    "gru": single_state(GRU, "gru"),
    "gru-linear_before_reset": single_state(GRU, "gru", linear_before_reset=True),
    "gru-drop_states": single_state(GRU, "gru", drop_states=True),
    "basic_rnn-tanh": single_state(BasicRNN, "basic_rnn", activation="tanh"),
    "basic_rnn-relu": single_state(BasicRNN, "basic_rnn", activation="relu"),
    "basic_rnn-drop_states": single_state(BasicRNN, "basic_rnn", activation="tanh", drop_states=True),
    "multi_rnn_cell": multi_layer,
    "dropout-is_test": dropout_stack(0.5, 1),
    "dropout-ratio_0": dropout_stack(0.0, 0),
    "attention-regular": attention(AttentionType.Regular),
    "attention-regular-masked": attention(AttentionType.Regular, masked=True),
    "attention-recurrent": attention(AttentionType.Recurrent),
    "attention-dot": attention(AttentionType.Dot),
    "attention-dot-same_size": attention(AttentionType.Dot, same_size=True),
    "attention-soft_coverage": attention(AttentionType.SoftCoverage),
}


# ------------------------------------------------------------------------------------------------
# Running both


def random_params(model: ModelHelper, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A random value for every blob the init net fills (in its shape): N(0, 0.5^2)."""
    params = {}
    for op in model.param_init_net.Proto().op:
        (shape,) = [list(a.ints) for a in op.arg if a.name == "shape"]
        params[op.output[0]] = _randn(rng, *shape, scale=0.5)
    return params


def run_caffe2(caffe2: Caffe2Oracle, init: pb.NetDef, net: pb.NetDef, feeds, fetch) -> dict[str, np.ndarray]:
    """The init net, then `feeds` (the parameters over the init net's fills, and the inputs), then `net`."""
    caffe2.run([("net", init)], fetch=[])
    return caffe2.run([("net", net)], feeds, fetch=list(fetch), reset=False)


def run_compiled(init: pb.NetDef | None, net: pb.NetDef, params, inputs, outputs) -> dict[str, np.ndarray]:
    fn = rnn2jax.compile(net, init_net=init, params=params, outputs=list(outputs))
    return {name: np.asarray(value) for name, value in fn(inputs).items()}


def training_net(net: pb.NetDef, grad_outputs: Sequence[str]) -> tuple[pb.NetDef, dict[str, str]]:
    """`model.AddGradientOperators({y: y + "_grad"})`, the given gradients declared external inputs
    (Caffe2 refuses a net that reads an undeclared blob when it declares any)."""
    ys = {y: f"{y}_grad" for y in grad_outputs}
    grad_ops, grad_map = get_backward_pass(net.op, ys)
    train = pb.NetDef()
    train.CopyFrom(net)
    train.external_input.extend(ys.values())
    train.op.extend(grad_ops)
    return train, grad_map


# Attention gradients get an absolute floor besides the harness's relative tolerance. Every gradient
# that flows back through the attention softmax, `Y * (dY - sum(dY * Y))`, is a difference of nearly
# equal O(1) terms, so its float32 error is set by those terms, not by its own (often tiny) scale. Measured
# against a float64 jax.grad of the same decoder (111 runs of the regular, masked and recurrent
# attentions, T, N, L, dims <= 3): relative to their own scale the attention parameters' gradients are off
# by up to 1.5e-4 in Caffe2 and 2.6e-3 in rnn2jax (a row with one valid encoder step, where Caffe2's
# softmax gradient is exactly 0 and XLA's fused one 1e-8, against a true scale of 1e-5); in absolute
# terms both stay within 2.3e-7 x max|output gradient| (75 of those runs; the worst is the logits bias,
# whose true gradient is exactly 0 since the softmax is shift-invariant: pure noise, up to 3.6e-7 in
# Caffe2). The floor is 2e-6 x max|output gradient|; all else is held to the harness's 1e-5 of its scale.
ATTENTION_ATOL = 2e-6


def assert_gradients_equal(got: dict, want: dict, atol: float = 0.0) -> None:
    """`assert_blobs_equal`, elements within `atol` of Caffe2's counting as equal."""
    if atol:
        for name, value in want.items():
            close = np.isfinite(value) & (np.abs(got[name] - value) <= atol)
            if got[name].shape == value.shape and value.dtype.kind == "f":
                got[name] = np.where(close, value, got[name])
    assert_blobs_equal(got, want)


def gradient_atol(is_attention: bool, output_grads: Mapping[str, np.ndarray]) -> float:
    scale = max((float(np.abs(g).max(initial=0.0)) for g in output_grads.values()), default=0.0)
    return ATTENTION_ATOL * scale if is_attention else 0.0


def build_cell(name: str, s: dict[str, Any], seed: int | None = None):
    """(built cell, init net, net, random parameters, the rng that drew them, to draw more): the cell `name`
    at sizes `s`, from fresh net names, drawn from `seed` (default s["seed"])."""
    reset_net_names()
    rng = np.random.default_rng(s["seed"] if seed is None else seed)
    built = CELLS[name](s, rng)
    params = random_params(built.model, rng)
    return built, built.model.param_init_net.Proto(), built.model.net.Proto(), params, rng


def check_cell(caffe2: Caffe2Oracle, name: str, s: dict[str, Any]) -> None:
    built, init, net, params, rng = build_cell(name, s)

    want = run_caffe2(caffe2, init, net, {**built.inputs, **params}, built.outputs)
    got = run_compiled(init, net, params, built.inputs, built.outputs)
    assert_blobs_equal(got, want)
    if built.trainable:
        train, grad_map = training_net(net, built.grad_outputs)
        differentiable = [n for n, v in {**built.inputs, **params}.items() if v.dtype.kind == "f"]
        assert set(differentiable) <= set(grad_map), f"no gradient for {set(differentiable) - set(grad_map)}"
        output_grads = {f"{y}_grad": _randn(rng, *want[y].shape) for y in built.grad_outputs}
        fetch = [*built.outputs, *dict.fromkeys(g for g in grad_map.values() if g not in output_grads)]
        feeds = {**built.inputs, **output_grads}
        want = run_caffe2(caffe2, init, train, {**feeds, **params}, fetch)
        # `params` holds every blob the init net writes, and the forward run above already compiled with
        # init_net=: running the init net again (eagerly, a compilation per fill) would add ~20% to the
        # test and check nothing new.
        assert set(params) == {name for op in init.op for name in op.output}
        got = run_compiled(None, train, params, feeds, fetch)
        assert_gradients_equal(got, want, gradient_atol(name.startswith("attention"), output_grads))
    else:
        assert not any(a.name == "backward_step_net" for op in net.op for a in op.arg)


@pytest.mark.parametrize("cell", CELLS)
@settings(max_examples=1, deadline=None)
@given(s=sizes(min_steps=2))
@with_edges
def test_cell_against_caffe2(caffe2, cell, s):
    check_cell(caffe2, cell, s)


# ------------------------------------------------------------------------------------------------
# The RecurrentNetwork op on its own (the scoreboard's case): the op of a drawn trainable cell, its
# inputs (the pre-projected sequence, initial states, parameters, lengths, encoder tensors) drawn or
# computed by the main-net ops before it.

OP_CELLS = (
    "lstm", "lstm-memory_optimization", "lstm-all_output_grads", "milstm", "layernorm_milstm", "gru",
    "basic_rnn-tanh", "multi_rnn_cell", "dropout-is_test", "attention-recurrent", "attention-dot",
    "attention-regular-masked",
)  # fmt: skip


def draw_recurrent_network(data: st.DataObject) -> tuple[pb.OperatorDef, dict[str, np.ndarray]]:
    cell = data.draw(st.sampled_from(OP_CELLS), label="cell")
    s = data.draw(sizes(), label="sizes")
    reset_net_names()
    rng = np.random.default_rng(s["seed"])
    built = CELLS[cell](s, rng)
    # BasicRNN with lengths is built forward-only (Caffe2 cannot build its backward): no gradient to ask for.
    assume(built.trainable)
    feeds = {**built.inputs, **random_params(built.model, rng)}
    ops = list(built.model.net.Proto().op)
    index = next(i for i, op in enumerate(ops) if op.type == "RecurrentNetwork")
    op = ops[index]
    computed = [name for name in op.input if name not in feeds]
    feeds.update(run_rnn2jax(ops[:index], feeds, computed) if computed else {})
    return op, {name: feeds[name] for name in dict.fromkeys(op.input)}


CASES = cases(
    Case(
        "RecurrentNetwork",
        draw_recurrent_network,
        gradient_ops=("RecurrentNetworkGradient",),
        note="driven by test_recurrent_network_op: the gradient op needs the forward op's step_workspaces, "
        "so both run in one workspace",
    ),
)


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_recurrent_network_op(caffe2, data):
    """The op alone, forward; then the op and Caffe2's gradient op for it (the builder's gradient maker
    must emit the same OperatorDef) run together with random output gradients."""
    case = CASES["RecurrentNetwork"]
    op, inputs = case.draw(data)
    outputs = list(op.output[:-1])  # the last output, step_workspaces, is no tensor
    want = check_op(caffe2, op, inputs, outputs=outputs)
    assert want is not None
    with_grads = op_ints(op, "outputs_with_grads")
    g_output = [f"{name}_grad" if k in with_grads else None for k, name in enumerate(op.output)]
    grad_ops, g_input = caffe2.gradient_for_op(op, g_output)
    ours, our_g_input = get_gradient_for_op(op, g_output)
    assert_same_ops(ours, grad_ops, "RecurrentNetwork's gradient")
    assert list(our_g_input) == g_input
    assert {g.type for g in grad_ops} <= set(case.gradient_ops)
    rng = np.random.default_rng(len(op.input))
    feeds = dict(inputs)
    feeds.update({g: _randn(rng, *want[op.output[k]].shape) for k, g in enumerate(g_output) if g})
    fetch = [name for g in grad_ops for name in g.output]
    want = caffe2.run([("ops", [op, *grad_ops])], feeds, fetch=fetch)
    got = run_rnn2jax([op, *grad_ops], feeds, fetch)
    output_grads = {g: feeds[g] for g in g_output if g}
    assert_gradients_equal(got, want, gradient_atol(op.input[0].startswith("att/"), output_grads))


def op_ints(op: pb.OperatorDef, name: str) -> list[int]:
    return next((list(a.ints) for a in op.arg if a.name == name), [])


# ------------------------------------------------------------------------------------------------
# Edges, spelled out


def _lstm_run(caffe2, s, h0, c0, all_grads: bool, train: bool):
    """An LSTM (outputs_with_grads 0..3 when `all_grads`) in Caffe2 and rnn2jax; the training net gets
    output gradients of ones x 0.5^k (k = output index), so they are known exactly."""
    reset_net_names()
    rng = np.random.default_rng(s["seed"])
    grads = (0, 1, 2, 3) if all_grads else (0,)
    built = lstm_family(LSTM, "lstm", outputs_with_grads=grads)(s, rng)
    built.inputs.update(h0=h0, c0=c0)
    init, net = built.model.param_init_net.Proto(), built.model.net.Proto()
    params = random_params(built.model, rng)
    fetch = list(built.outputs)
    feeds = dict(built.inputs)
    if train:
        net, grad_map = training_net(net, built.grad_outputs)
        rows = {0: s["T"] + h0.shape[0] - 1 if h0.ndim == 3 else s["T"], 1: 1, 2: s["T"], 3: 1}
        for k in grads:
            feeds[f"{built.outputs[k]}_grad"] = np.full((rows[k], s["N"], s["H"]), 0.5**k, np.float32)
        fetch += [grad_map[n] for n in ("x", "h0", "c0", *params)]
    want = run_caffe2(caffe2, init, net, {**feeds, **params}, fetch)
    got = run_compiled(init, net, params, feeds, fetch)
    return got, want


def test_empty_sequence(caffe2):
    """T = 0: `_all` outputs are empty, `_last` ones the initial states; the gradient op runs no step:
    parameter gradients are zero and an initial state's gradient is its `_last` output's (summed over
    the batch for a 1-D state)."""
    s = {"T": 0, "N": 3, "D": 2, "H": 2, "forms": ["2-D"] * 4, "use_lengths": True, "lengths": [0, 0, 0], "seed": 4}
    rng = np.random.default_rng(0)
    h0, c0 = _randn(rng, 1, 3, 2), _randn(rng, 2)
    got, want = _lstm_run(caffe2, s, h0, c0, all_grads=True, train=True)
    assert_blobs_equal(got, want)
    for values in (got, want):
        assert values["lstm/hidden_state_all"].shape == (0, 3, 2)
        np.testing.assert_array_equal(values["lstm/hidden_state_last"], h0)
        np.testing.assert_array_equal(values["lstm/cell_state_last"], np.broadcast_to(c0, (1, 3, 2)))
        np.testing.assert_array_equal(values["h0_grad"], np.full((1, 3, 2), 0.5, np.float32))
        np.testing.assert_array_equal(values["c0_grad"], np.full(2, 3 * 0.125, np.float32))
        for name in ("lstm/gates_t_w_grad", "lstm/gates_t_b_grad", "lstm/i2h_w_grad", "lstm/i2h_b_grad"):
            assert not values[name].any(), name


def test_multi_row_initial_state_of_a_builder_net(caffe2):
    """Caffe2 takes an initial state of L > 1 rows `(L, N, H)` (SEMANTICS.md 2.4), but the builder's nets
    read row t and write row t + 1, as if L = 1: step 0 overwrites initial row 1, and the last state row
    (T + L - 1) is never written, yet the `_all` output (T + L - 1 rows) and `_last` expose it.

    Caffe2's answer there is whatever the state tensor's memory held (garbage such as 5.9e23, or zeros,
    from run to run; in training every gradient too, as only the last row of a state gradient is zeroed).
    This test shows it by feeding the state blob first, filled with two different values: Caffe2 resizes
    it in place, and `_last` comes out as the value fed. rnn2jax refuses the net (`UnwrittenStateError`)."""
    s = {"T": 3, "N": 2, "D": 2, "H": 3, "forms": ["2-D"] * 4, "use_lengths": True, "lengths": [3, 1], "seed": 5}
    rng = np.random.default_rng(1)
    h0, c0 = _randn(rng, 2, 2, 3), _randn(rng, 2, 3)
    reset_net_names()
    built = lstm_family(LSTM, "lstm", outputs_with_grads=(0,))(s, np.random.default_rng(s["seed"]))
    built.inputs.update(h0=h0, c0=c0)
    init, net = built.model.param_init_net.Proto(), built.model.net.Proto()
    params = random_params(built.model, rng)
    (rnn,) = [op for op in net.op if op.type == "RecurrentNetwork"]
    state = next(a for a in rnn.arg if a.name == "recurrent_states").strings[0].decode()
    last = "lstm/hidden_state_last"
    answers = []
    for value in (1.5e11, -7.0):
        memory = {state: np.full((s["T"] + 2, s["N"], s["H"]), value, np.float32)}
        answers.append(run_caffe2(caffe2, init, net, {**built.inputs, **params, **memory}, [last])[last])
    np.testing.assert_array_equal(answers[0], np.float32(1.5e11))
    np.testing.assert_array_equal(answers[1], -7.0)
    with pytest.raises(UnwrittenStateError, match="alias_offset") as caught:
        run_compiled(init, net, params, built.inputs, list(built.outputs))
    assert state in str(caught.value) and "RecurrentNetwork" in str(caught.value)


@pytest.mark.parametrize("cell", ["lstm", "gru", "basic_rnn-tanh", "attention-regular"])
@pytest.mark.parametrize("steps", [0, 2])
def test_empty_batch(caffe2, cell, steps):
    """N = 0: Caffe2 runs T = 0 (empty outputs, and empty gradients), but refuses any step on an empty
    batch (`rnn_internal_apply_link` enforces `external.numel() > 0`; its log: "Crash at thread 0
    timestep 0 op: ... rnn_internal_apply_link"). rnn2jax does the same, with a ShapeError."""
    s = {"T": steps, "N": 0, "D": 2, "H": 3, "L": 2, "E": 2, "forms": ["1-D", "2-D", "3-D", "2-D"],
         "use_lengths": False, "lengths": [], "seed": 6}  # fmt: skip
    if steps == 0:
        check_cell(caffe2, cell, s)
        return
    built, init, net, params, _ = build_cell(cell, s, seed=0)
    with pytest.raises(Caffe2Error):
        run_caffe2(caffe2, init, net, {**built.inputs, **params}, built.outputs)
    with pytest.raises(ShapeError, match="empty batch"):
        run_compiled(init, net, params, built.inputs, built.outputs)


def test_fully_masked_encoder(caffe2):
    """An encoder length of 0 masks every attention logit: the softmax is 0/0, NaN in Caffe2 (context,
    then every gradient that depends on it) and in rnn2jax alike."""
    s = {"T": 2, "N": 2, "D": 2, "H": 3, "L": 3, "E": 2, "forms": ["2-D"] * 4, "use_lengths": True,
         "lengths": [2, 1], "seed": 0}  # fmt: skip
    reset_net_names()
    rng = np.random.default_rng(0)
    built = CELLS["attention-regular-masked"](s, rng)
    built.inputs["enc_len"] = np.array([0, 2], np.int32)
    init, net = built.model.param_init_net.Proto(), built.model.net.Proto()
    params = random_params(built.model, rng)
    want = run_caffe2(caffe2, init, net, {**built.inputs, **params}, built.outputs)
    assert np.isnan(want["att/attention_weighted_encoder_context_all"][:, 0]).all()
    assert np.isfinite(want["att/attention_weighted_encoder_context_all"][:, 1]).all()
    assert_blobs_equal(run_compiled(init, net, params, built.inputs, built.outputs), want)
    train, grad_map = training_net(net, built.grad_outputs)
    feeds = {**built.inputs, **{f"{y}_grad": _randn(rng, *want[y].shape) for y in built.grad_outputs}}
    fetch = [g for g in dict.fromkeys(grad_map.values()) if g not in feeds]
    want = run_caffe2(caffe2, init, train, {**feeds, **params}, fetch)
    got = run_compiled(init, train, params, feeds, fetch)
    assert np.isnan(want["enc_grad"][:, 0]).all()
    output_grads = {g: v for g, v in feeds.items() if g.endswith("_grad")}
    assert_gradients_equal(got, want, gradient_atol(True, output_grads))
