"""Caffe2's GRU through its custom VJP (rnn2jax/ops/recurrent/gru_vjp.py) and the native kernels (src/gru.cc).

Checked here:
- the compiled GRU's outputs and jax.grad equal jax.grad of the plain lowering (`lower(net, plain=True)`,
  verify's reference: the step net's ops as written, no custom VJP) for both linear_before_reset forms,
  with and without sequence lengths (0 and T among them), with and without drop_states; and the recognised
  path was taken (on CPU, the native handlers are what the lowering calls);
- a net built for training: the blobs its backward step net reads, which follow from the FC outputs the
  forward writes during its loop (the fc form), equal the plain lowering's, and so does jax.grad through
  them; Caffe2's training net compiled (RecurrentNetworkGradient running the backward step net) calls the
  fc form and gives real Caffe2's gradients;
- the GRU function's native CPU branch equals its scan branch, outputs (the FC outputs among them) and
  gradients;
- (in test_native_kernels.py, with the LSTM cells) the builder's GRU cells compiled by rnn2jax give real
  Caffe2's outputs and the gradients of Caffe2's training net;
- CUDA and TPU lowerings contain the scan and no native call.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_builder_cells import training_net

# the kernels at these tests' small shapes too (an autouse fixture), the float32 comparison, Caffe2's training
from test_native_kernels import (  # noqa: F401
    assert_close,
    caffe2_training,
    lstm_sizes,
    recurrences_of_every_size_native,
)

import rnn2jax
from differential import assert_blobs_equal
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower
from rnn2jax.native import library
from rnn2jax.ops.recurrent import forward as forward_module
from rnn2jax.ops.recurrent.gru_vjp import _gru
from rnn2jax.proto import caffe2_pb2 as pb

TARGET = re.compile(r"rnn2jax_gru_\w+")
TRAINING = {"rnn2jax_gru_forward_train", "rnn2jax_gru_backward"}
STEP_BLOBS = {"rnn2jax_gru_forward_fc"}  # the forward of a training net through its backward step net
OUTPUTS = ("gru/hidden_t_all", "gru/hidden_t_last")


def native_targets(text: str) -> set[str]:
    """The native GRU handlers a lowered module calls, without the library digest."""
    return {name.rsplit("_", 1)[0] for name in TARGET.findall(text)}


def native_in_use() -> bool:
    return library.status().in_use


# -- the compiled net against the plain lowering ---------------------------------------------------------


def build(dim_in: int, hidden: int, lengths: bool, linear_before_reset: bool, drop_states: bool, forward_only: bool):
    """Caffe2's GRU compiled, `fn.plain(params, inputs)`: the same net lowered plain, and `fn.model`."""
    reset_net_names()
    model = ModelHelper(name="gru_vjp")
    GRU(
        model, "x", "seq_lengths" if lengths else None, ("h0",), dim_in, hidden, scope="gru",
        linear_before_reset=linear_before_reset, drop_states=drop_states, forward_only=forward_only,
    )  # fmt: skip
    fn = rnn2jax.compile(model.net.Proto(), init_net=model.param_init_net.Proto(), outputs=list(OUTPUTS))
    plain = lower(load(model.net.Proto()), plain=True)

    def run_plain(params, inputs):
        env = plain({**params, **inputs})
        return {name: env[name] for name in OUTPUTS}

    fn.plain, fn.model = run_plain, model
    return fn


def build_case(case: dict, forward_only: bool):
    """(fn, random params, differentiable inputs, seq_lengths feed or {}, rng) for a drawn `nets()` case."""
    fn = build(
        case["dim_in"], case["hidden"], case["lengths"] is not None, case["linear_before_reset"],
        case["drop_states"], forward_only,
    )  # fmt: skip
    rng = np.random.default_rng(case["seed"])
    params = {k: jnp.asarray(rng.standard_normal(v.shape) * 0.5, jnp.float32) for k, v in fn.params.items()}
    data = {
        "x": jnp.asarray(rng.standard_normal((case["steps"], case["batch"], case["dim_in"])), jnp.float32),
        "h0": jnp.asarray(rng.standard_normal((1, case["batch"], case["hidden"])) * 0.5, jnp.float32),
    }
    fixed = {} if case["lengths"] is None else {"seq_lengths": jnp.asarray(case["lengths"], jnp.int32)}
    return fn, params, data, fixed, rng


def weights_like(rng, arrays: dict) -> dict:
    """A random weight per array, for a loss that sums each weighted (a random cotangent)."""
    return {name: jnp.asarray(rng.standard_normal(a.shape), jnp.float32) for name, a in arrays.items()}


@st.composite
def nets(draw):
    steps, batch = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    use_lengths = draw(st.booleans())
    return {
        "steps": steps,
        "batch": batch,
        "dim_in": draw(st.integers(1, 5)),
        "hidden": draw(st.integers(1, 19)),  # around the 8-float vector: remainders of the gate loops
        "lengths": draw(st.lists(st.integers(0, steps), min_size=batch, max_size=batch)) if use_lengths else None,
        "linear_before_reset": draw(st.booleans()),
        "drop_states": draw(st.booleans()),
        "forward_only": draw(st.booleans()),
        "used": draw(st.lists(st.sampled_from(OUTPUTS), min_size=1, max_size=2, unique=True)),
        "seed": draw(st.integers(0, 2**16)),
    }


def _net_case(linear_before_reset: bool, drop_states: bool) -> dict:
    return {
        "steps": 4, "batch": 4, "dim_in": 3, "hidden": 9, "lengths": [0, 4, 2, 4],
        "linear_before_reset": linear_before_reset, "drop_states": drop_states, "forward_only": False,
        "used": list(OUTPUTS), "seed": 7,
    }  # fmt: skip


@settings(max_examples=6, deadline=None)
@given(case=nets())
@example(case=_net_case(False, False))
@example(case=_net_case(True, True))
def test_compiled_gru_equals_plain_lowering(case):
    fn, params, data, fixed, rng = build_case(case, case["forward_only"])
    rows = np.zeros((case["steps"], case["batch"], case["hidden"]))
    weights = weights_like(rng, {OUTPUTS[0]: rows, OUTPUTS[1]: rows[-1:]})

    def loss(run):
        def value(p, d):
            outputs = run(p, d | fixed)
            return sum(jnp.sum(outputs[name] * weights[name]) for name in case["used"]), outputs

        return jax.jit(jax.grad(value, argnums=(0, 1), has_aux=True))

    assert _path_taken(lambda p, d: loss(fn.apply)(p, d)[0], params, data)
    if native_in_use():
        assert native_targets(loss(fn.apply).lower(params, data).as_text()) == TRAINING
    assert not native_targets(loss(fn.plain).lower(params, data).as_text())
    (ours, ours_out), (plain, plain_out) = loss(fn.apply)(params, data), loss(fn.plain)(params, data)
    for got, want in zip(ours, plain, strict=True):
        for name in want:
            assert_close(got[name], want[name], f"gradient {name}")
    for name in OUTPUTS:
        assert_close(ours_out[name], plain_out[name], name)
    forward = jax.jit(fn.apply)(params, data | fixed)  # the forward-only call: the inference handler
    for name in OUTPUTS:
        assert_close(forward[name], plain_out[name], f"forward {name}")
    if native_in_use():
        # a net built for training has a backward step net, whose step blobs (step_workspaces) the fc form writes
        handler = "rnn2jax_gru_forward" if case["forward_only"] else "rnn2jax_gru_forward_fc"
        assert native_targets(jax.jit(fn.apply).lower(params, data | fixed).as_text()) == {handler}


def _path_taken(grad, params, data) -> bool:
    """Whether tracing the gradient went through the GRU's custom VJP."""
    calls = []
    original = forward_module.gru_cell_rows

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(result is not None)
        return result

    forward_module.gru_cell_rows = spy
    try:
        jax.make_jaxpr(grad)(params, data)
    finally:
        forward_module.gru_cell_rows = original
    return calls == [True]


# -- the step blobs a backward step net reads ----------------------------------------------------------


def step_blobs(net: pb.NetDef, plain: bool):
    """`(params, inputs) -> (per-step blobs, outputs)`: the net lowered (plain or not) returning, besides its
    outputs, the blobs of each step that step_workspaces carries to the backward step net, [T, 1, N, ...]."""
    loaded = load(net)
    lowered = lower(loaded, plain=plain)
    (workspaces,) = [op.outputs[-1] for op in loaded.ops if op.type == "RecurrentNetwork"]

    def run(params, inputs):
        env = lowered({**params, **inputs})
        return env[workspaces]["per_step"], {name: env[name] for name in OUTPUTS}

    return run


@settings(max_examples=6, deadline=None)
@given(case=nets())
@example(case=_net_case(False, False))
@example(case=_net_case(True, True))
def test_step_blobs_equal_plain_lowering(case):
    """A net built for training: the blobs its backward step net reads (the reset gate, the gates' pre-activations,
    r * h_prev or the output FC), derived from the FC outputs the fc form writes during the loop, equal the
    plain lowering's; jax.grad through them and the outputs (their cotangent goes through the GRU's VJP as
    the FC outputs') equals jax.grad of the plain lowering."""
    fn, params, data, fixed, rng = build_case(case, forward_only=False)
    ours, plain = step_blobs(fn.model.net.Proto(), False), step_blobs(fn.model.net.Proto(), True)
    want, want_out = jax.jit(plain)(params, data | fixed)
    assert {"gru/gates_t", "gru/reset_gate_t_sigmoid"} <= set(want)
    weights = weights_like(rng, {**want, **want_out})

    def loss(run):
        def value(p, d):
            blobs, outputs = run(p, d | fixed)
            return sum(jnp.sum(v * weights[name]) for name, v in {**blobs, **outputs}.items())

        return jax.jit(jax.grad(value, argnums=(0, 1)))

    assert _path_taken(loss(ours), params, data)
    if native_in_use():
        assert native_targets(jax.jit(ours).lower(params, data | fixed).as_text()) == STEP_BLOBS
        assert native_targets(loss(ours).lower(params, data).as_text()) == TRAINING
    got, got_out = jax.jit(ours)(params, data | fixed)
    assert set(got) == set(want)
    for name, value in {**want, **want_out}.items():
        assert_close({**got, **got_out}[name], value, name)
    for grads, expected in zip(loss(ours)(params, data), loss(plain)(params, data), strict=True):
        for name, value in expected.items():
            assert_close(grads[name], value, f"gradient {name}")


GRU_CELLS = ("gru", "gru-linear_before_reset", "gru-drop_states")  # test_builder_cells' builder cells
LENGTHS_0_AND_T = {"T": 3, "N": 3, "D": 2, "H": 9, "L": 1, "E": 1, "forms": ["3-D"] * 4, "use_lengths": True,
                   "lengths": [0, 3, 1], "seed": 11}  # fmt: skip


@pytest.mark.parametrize("cell", GRU_CELLS)
@settings(max_examples=2, deadline=None)
@given(s=lstm_sizes())
@example(s=LENGTHS_0_AND_T)
def test_training_through_backward_step_net_equals_caffe2(caffe2, cell, s):
    """Caffe2's training net (RecurrentNetworkGradient running the builder's backward step net) compiled: its
    forward is the fc form, and every input and parameter gradient equals real Caffe2's."""
    built, params, training = caffe2_training(caffe2, cell, s)
    init = built.model.param_init_net.Proto()
    fn = rnn2jax.compile(training.net, init_net=init, params=params, outputs=training.fetch)
    if native_in_use():
        assert native_targets(jax.jit(fn.apply).lower(dict(fn.params), training.feeds).as_text()) == STEP_BLOBS
    assert_blobs_equal({name: np.asarray(v) for name, v in fn(training.feeds).items()}, training.grads)


# -- the GRU function, native against scan ---------------------------------------------------------------


@st.composite
def cells(draw):
    steps, batch = draw(st.integers(1, 7)), draw(st.integers(1, 5))
    return {
        "steps": steps,
        "batch": batch,
        "hidden": draw(st.integers(1, 19)),
        "lengths": draw(st.none() | st.lists(st.integers(0, steps), min_size=batch, max_size=batch)),
        "linear_before_reset": draw(st.booleans()),
        "drop_states": draw(st.booleans()),
        # the step's FC outputs as a second output, and whether the loss reads them (their cotangent)
        "fc": draw(st.sampled_from([None, "unused", "used"])),
        "seed": draw(st.integers(0, 2**16)),
    }


FULL_AND_EMPTY = {
    "steps": 4, "batch": 3, "hidden": 9, "lengths": [0, 4, 2], "linear_before_reset": True, "drop_states": False,
    "fc": None, "seed": 3,
}  # fmt: skip


@settings(max_examples=6, deadline=None)
@given(case=cells())
@example(case=FULL_AND_EMPTY)
@example(case=FULL_AND_EMPTY | {"linear_before_reset": False, "drop_states": True})
@example(case=FULL_AND_EMPTY | {"fc": "used"})
@example(case=FULL_AND_EMPTY | {"linear_before_reset": False, "drop_states": True, "fc": "used"})
def test_native_gru_equals_scan(case):
    if not native_in_use():
        pytest.skip(f"the native kernels are not in use here: {library.status().reason}")
    rng = np.random.default_rng(case["seed"])
    steps, batch, hidden = case["steps"], case["batch"], case["hidden"]

    def randn(*shape, scale=0.5):
        return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)

    x, h0 = randn(steps, batch, 3 * hidden, scale=1.0), randn(batch, hidden)
    ws, bs = tuple(randn(hidden, hidden) for _ in range(3)), tuple(randn(hidden) for _ in range(3))
    valid = None
    if case["lengths"] is not None:
        valid = (jnp.arange(steps)[:, None] < jnp.asarray(case["lengths"], jnp.int32)[None, :])[..., None]
    flags = (case["linear_before_reset"], case["drop_states"])
    with_fc = case["fc"] is not None
    native, scan = _gru(*flags, native=True, with_fc=with_fc), _gru(*flags, native=False, with_fc=with_fc)
    weights, fc_weights = randn(steps, batch, hidden, scale=1.0), randn(steps, batch, 3 * hidden, scale=1.0)

    def loss(cell):
        def value(x, h0, ws, bs):
            rows, fc = cell(x, h0, ws, bs, valid)
            read = jnp.sum(fc * fc_weights) if case["fc"] == "used" else 0.0
            return jnp.sum(rows * weights) + jnp.sum(rows[-1] ** 2) + read

        return jax.jit(jax.value_and_grad(value, argnums=(0, 1, 2, 3)))

    native_lowered, scan_lowered = loss(native).lower(x, h0, ws, bs), loss(scan).lower(x, h0, ws, bs)
    assert native_targets(native_lowered.as_text()) == TRAINING
    assert not native_targets(scan_lowered.as_text())
    forward_handler = "rnn2jax_gru_forward_fc" if with_fc else "rnn2jax_gru_forward"
    assert native_targets(jax.jit(native).lower(x, h0, ws, bs, valid).as_text()) == {forward_handler}
    (rows, fc), (scan_rows, scan_fc) = jax.jit(native)(x, h0, ws, bs, valid), jax.jit(scan)(x, h0, ws, bs, valid)
    assert_close(rows, scan_rows, "hidden rows")
    assert (fc is None) == (scan_fc is None) == (not with_fc)
    if with_fc:
        assert_close(fc, scan_fc, "FC outputs")
    (_, grads), (_, expected) = native_lowered.compile()(x, h0, ws, bs), scan_lowered.compile()(x, h0, ws, bs)
    want = dict(jax.tree_util.tree_leaves_with_path(expected))
    for path, got in jax.tree_util.tree_leaves_with_path(grads):
        assert_close(got, want[path], f"gradient {jax.tree_util.keystr(path)}")


# -- other platforms ---------------------------------------------------------------------------------------


def test_other_platforms_have_no_native_call():
    """jax.grad of the net, and its training net through the backward step net: the native handlers on CPU,
    none on CUDA or TPU."""
    if not native_in_use():
        pytest.skip(f"the native kernels are not in use here: {library.status().reason}")
    for linear_before_reset in (False, True):
        fn = build(3, 4, True, linear_before_reset, False, False)
        params = {k: jnp.full(v.shape, 0.1, jnp.float32) for k, v in fn.params.items()}
        data = {
            "x": jnp.ones((3, 2, 3), jnp.float32),
            "h0": jnp.zeros((1, 2, 4), jnp.float32),
            "seq_lengths": jnp.asarray([3, 1], jnp.int32),
        }

        def loss(p, fn=fn, data=data):
            return jnp.sum(fn.apply(p, data)[OUTPUTS[0]] ** 2)

        grad = jax.jit(jax.grad(loss))
        train, grad_map = training_net(fn.model.net.Proto(), list(OUTPUTS))
        init = fn.model.param_init_net.Proto()
        train_step = jax.jit(rnn2jax.compile(train, init_net=init, outputs=[grad_map[n] for n in params]).apply)
        output_grads = {OUTPUTS[0]: jnp.ones((3, 2, 4), jnp.float32), OUTPUTS[1]: jnp.ones((1, 2, 4), jnp.float32)}
        feeds = data | {f"{y}_grad": g for y, g in output_grads.items()}
        assert native_targets(grad.lower(params).as_text()) == TRAINING
        assert native_targets(train_step.lower(params, feeds).as_text()) == STEP_BLOBS
        for platform in ("cuda", "tpu"):
            module = jax.export.export(grad, platforms=(platform,))(params).mlir_module()
            assert not native_targets(module), platform
            assert module.count("stablehlo.while") == 2, platform  # the forward scan and the reverse one
            assert not native_targets(jax.export.export(train_step, platforms=(platform,))(params, feeds).mlir_module())
