"""The backward-step-net path's reverse scan does only what must be sequential: per-step parameter
gradients (FCGradient's dW and db, the attention's BatchMatMul into the encoder outputs) are summed
after the loop in one contraction, and the state gradients are carried as rows, not [T, N, H] tensors.

The reference is the same net run with the rewrite switched off (the backward step net executed op by op
inside the loop, as before); test_cell_gradients.py compares every cell's rewritten gradients with
`jax.grad` of the forward net. The compiled HLO shows what is left inside the loop."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnn2jax
from rnn2jax.caffe2.python.attention import AttentionType
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM, LSTMWithAttention
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.ops.recurrent import gradient
from rnn2jax.ops.recurrent.deferred import NOTHING_DEFERRED
from rnn2jax.proto import caffe2_pb2 as pb


def _lstm(model, d, h):
    out, *_ = LSTM(model, "x", "seq_lengths", ("h0", "c0"), d, h, scope="lstm")
    return [out], {"x": (d,), "h0": (h,), "c0": (h,), "r0": (h,)}


def _gru(model, d, h):
    out, *_ = GRU(model, "x", "seq_lengths", ("h0",), d, h, scope="gru")
    return [out], {"x": (d,), "h0": (h,), "r0": (h,)}


def _attention(model, d, h):
    enc_dim = 3
    outputs = LSTMWithAttention(
        model, "x", "seq_lengths", "h0", "c0", "ctx0", enc_dim, "enc", None, d, h, "att",
        attention_type=AttentionType.Regular,
    )  # fmt: skip
    shapes = {"x": (d,), "h0": (h,), "c0": (h,), "ctx0": (enc_dim,), "enc": ("enc", enc_dim), "r0": (h,)}
    return [outputs[0], outputs[4]], shapes | {"r1": (enc_dim,)}


CELLS = {"lstm": _lstm, "gru": _gru, "attention": _attention}


def _training_net(cell, d, h):
    """The forward net with a loss, its training net (Caffe2's gradient ops) and the gradient blobs."""
    model = ModelHelper(name=f"deferred_{cell}")
    outputs, shapes = CELLS[cell](model, d, h)
    # A random cotangent per output (the r_i inputs), so every gradient row is different.
    weighted = [model.net.Mul([o, f"r{i}"], f"weighted{i}") for i, o in enumerate(outputs)]
    model.net.Sum([model.net.SumElements([w], f"loss{i}") for i, w in enumerate(weighted)], "loss")
    forward = pb.NetDef()
    forward.CopyFrom(model.net.Proto())
    train = pb.NetDef()
    train.CopyFrom(forward)
    backward, grads = get_backward_pass(list(forward.op), {"loss": None})
    train.op.extend(backward)
    return forward, train, model.param_init_net.Proto(), grads, shapes


def _inputs(shapes, steps, batch, seed):
    rng = np.random.default_rng(seed)
    values = {"seq_lengths": rng.integers(0, steps + 1, batch).astype(np.int32)}
    for name, shape in shapes.items():
        if name == "x" or name.startswith("r"):
            full = (steps, batch, *shape)
        elif name == "enc":
            full = (4, batch, shape[1])
        else:
            full = (1, batch, *shape)
        values[name] = rng.standard_normal(full).astype(np.float32)
    return values


def _gradients(train, init, grads, inputs, names):
    compiled = rnn2jax.compile(train, init_net=init, outputs=[grads[n] for n in names])
    params = {k: np.asarray(v) * 3 for k, v in compiled.params.items()}  # past the init's small values
    return compiled.apply(params, inputs), params


def _without_rewrite(monkeypatch):
    """The reverse scan as it was: the whole backward step net in the loop, whole gradient tensors."""
    monkeypatch.setattr(gradient, "find_deferred", lambda *args: NOTHING_DEFERRED)
    monkeypatch.setattr(gradient.RecurrentGradientLowering, "_compact_links", lambda self: None)


@settings(max_examples=3)  # each example compiles two training nets; every cell's rewritten
# gradients are also checked against jax.grad in test_cell_gradients.py
@given(
    cell=st.sampled_from(sorted(CELLS)),
    steps=st.integers(1, 5),
    batch=st.integers(1, 3),
    dims=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    seed=st.integers(0, 2**16),
)
def test_rewritten_reverse_scan_equals_the_backward_step_net_run_op_by_op(cell, steps, batch, dims, seed):
    d, h = dims
    _, train, init, grads, shapes = _training_net(cell, d, h)
    inputs = _inputs(shapes, steps, batch, seed)
    params = [n for n in grads if n in {o for op in init.op for o in op.output}]
    names = [*params, *(n for n in shapes if n in grads)]
    ours, _ = _gradients(train, init, grads, inputs, names)
    with pytest.MonkeyPatch.context() as patch:
        _without_rewrite(patch)
        before, _ = _gradients(train, init, grads, inputs, names)
    for name in names:
        np.testing.assert_allclose(
            np.asarray(ours[grads[name]]), np.asarray(before[grads[name]]), rtol=1e-5, atol=1e-5, err_msg=name
        )


def _computations(hlo: str) -> dict[str, str]:
    """HLO module text -> {computation name: its body text}."""
    found = {}
    for match in re.finditer(r"^(?:ENTRY )?%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S | re.M):
        found[match.group(1)] = match.group(2)
    return found


def _loop_dot_shapes(hlo: str) -> list[tuple[int, ...]]:
    """Output shapes of every dot inside a while loop's body (and what the body calls)."""
    computations = _computations(hlo)
    pending = [m for text in computations.values() for m in re.findall(r"body=%?([\w.\-]+)", text)]
    seen: set[str] = set()
    shapes = []
    while pending:
        name = pending.pop()
        if name in seen or name not in computations:
            continue
        seen.add(name)
        text = computations[name]
        pending += re.findall(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)", text)
        for dims in re.findall(r"= f32\[([\d,]*)\]\{?[\d,]*\}? dot\(", text):
            shapes.append(tuple(int(v) for v in dims.split(",") if v))
    return shapes


@pytest.mark.parametrize("cell", ["lstm", "attention"])
def test_backward_scan_body_has_no_weight_gradient_matmul(cell):
    d, h, steps, batch = 5, 8, 6, 2  # sizes chosen so that no weight shape equals an activation shape
    _, train, init, grads, shapes = _training_net(cell, d, h)
    inputs = _inputs(shapes, steps, batch, 0)
    weights = [n for n in grads if n in {o for op in init.op for o in op.output}]
    compiled = rnn2jax.compile(train, init_net=init, outputs=[grads[n] for n in weights])
    params = compiled.params
    weight_shapes = {tuple(np.shape(params[n])) for n in weights}
    hlo = jax.jit(lambda p: compiled.apply(p, inputs)).lower(params).compile().as_text()
    in_loop = _loop_dot_shapes(hlo)
    assert in_loop, "the loops compute no matmul at all: the HLO parse found no while body"
    if cell == "lstm":  # only h_prev·W (forward, as gate blocks or whole) and dgates·W (backward) remain
        assert set(in_loop) <= {(batch, h), (batch, 4 * h)}, in_loop
    else:  # and the attention's gradient into its encoder outputs is summed after the loop too
        weight_shapes.add((batch, 3, 4))  # [N, enc_dim, enc_len]
    assert not weight_shapes & set(in_loop), (weight_shapes, in_loop)
    with pytest.MonkeyPatch.context() as patch:  # the check itself sees per-step weight gradients
        _without_rewrite(patch)
        before = rnn2jax.compile(train, init_net=init, outputs=[grads[n] for n in weights])
        hlo = jax.jit(lambda p: before.apply(p, inputs)).lower(params).compile().as_text()
    assert weight_shapes & set(_loop_dot_shapes(hlo))


def test_state_gradients_are_carried_as_rows():
    """The reverse scan's carry holds one row per state gradient, not the [T + 1, N, H] tensor."""
    steps, batch, h = 7, 3, 4
    _, train, init, grads, shapes = _training_net("lstm", 2, h)
    inputs = _inputs(shapes, steps, batch, 1)
    compiled = rnn2jax.compile(train, init_net=init, outputs=[grads["lstm/gates_t_w"]])
    jaxpr = jax.make_jaxpr(lambda p: compiled.apply(p, inputs))(compiled.params)
    scans = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan" and e.params["reverse"]]
    assert len(scans) == 1
    carry = [v.aval.shape for v in scans[0].outvars[: scans[0].params["num_carry"]]]
    assert carry and all(shape[0] == 1 for shape in carry), carry
