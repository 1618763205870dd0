"""Caffe2's GRU through its custom VJP (rnn2jax/ops/recurrent/gru_vjp.py) and the native kernels (src/gru.cc).

Checked here:
- the compiled GRU's outputs and jax.grad equal jax.grad of the plain lowering (`lower(net, plain=True)`,
  verify's reference: the step net's ops as written, no custom VJP) for both linear_before_reset forms,
  with and without sequence lengths (0 and T among them), with and without drop_states; and the recognised
  path was taken (on CPU, the native handlers are what the lowering calls);
- the GRU function's native CPU branch equals its scan branch, outputs and gradients;
- (in test_native_kernels.py, with the LSTM cells) the builder's GRU cells compiled by rnn2jax give real
  Caffe2's outputs and the gradients of Caffe2's training net;
- a CUDA lowering contains the scan and no native call.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

# the kernels at these tests' small shapes too (an autouse fixture), and the float32 comparison
from test_native_kernels import assert_close, recurrences_of_every_size_native  # noqa: F401

import rnn2jax
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower
from rnn2jax.native import library
from rnn2jax.ops.recurrent import forward as forward_module
from rnn2jax.ops.recurrent.gru_vjp import _gru

TARGET = re.compile(r"rnn2jax_gru_\w+")
TRAINING = {"rnn2jax_gru_forward_train", "rnn2jax_gru_backward"}
OUTPUTS = ("gru/hidden_t_all", "gru/hidden_t_last")


def native_targets(text: str) -> set[str]:
    """The native GRU handlers a lowered module calls, without the library digest."""
    return {name.rsplit("_", 1)[0] for name in TARGET.findall(text)}


def native_in_use() -> bool:
    return library.status().in_use


# -- the compiled net against the plain lowering ---------------------------------------------------------


def build(dim_in: int, hidden: int, lengths: bool, linear_before_reset: bool, drop_states: bool, forward_only: bool):
    """Caffe2's GRU compiled, and `fn.plain(params, inputs)`: the same net lowered plain."""
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

    fn.plain = run_plain
    return fn


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
    fn = build(
        case["dim_in"], case["hidden"], case["lengths"] is not None, case["linear_before_reset"],
        case["drop_states"], case["forward_only"],
    )  # fmt: skip
    rng = np.random.default_rng(case["seed"])
    steps, batch, hidden = case["steps"], case["batch"], case["hidden"]
    params = {k: jnp.asarray(rng.standard_normal(v.shape) * 0.5, jnp.float32) for k, v in fn.params.items()}
    data = {
        "x": jnp.asarray(rng.standard_normal((steps, batch, case["dim_in"])), jnp.float32),
        "h0": jnp.asarray(rng.standard_normal((1, batch, hidden)) * 0.5, jnp.float32),
    }
    fixed = {} if case["lengths"] is None else {"seq_lengths": jnp.asarray(case["lengths"], jnp.int32)}
    weights = {
        OUTPUTS[0]: jnp.asarray(rng.standard_normal((steps, batch, hidden)), jnp.float32),
        OUTPUTS[1]: jnp.asarray(rng.standard_normal((1, batch, hidden)), jnp.float32),
    }

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
        assert native_targets(jax.jit(fn.apply).lower(params, data | fixed).as_text()) == {"rnn2jax_gru_forward"}


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
        "seed": draw(st.integers(0, 2**16)),
    }


FULL_AND_EMPTY = {
    "steps": 4, "batch": 3, "hidden": 9, "lengths": [0, 4, 2], "linear_before_reset": True, "drop_states": False,
    "seed": 3,
}  # fmt: skip


@settings(max_examples=6, deadline=None)
@given(case=cells())
@example(case=FULL_AND_EMPTY)
@example(case=FULL_AND_EMPTY | {"linear_before_reset": False, "drop_states": True})
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
    native, scan = _gru(*flags, native=True), _gru(*flags, native=False)
    weights = randn(steps, batch, hidden, scale=1.0)

    def loss(cell):
        def value(x, h0, ws, bs):
            rows = cell(x, h0, ws, bs, valid)
            return jnp.sum(rows * weights) + jnp.sum(rows[-1] ** 2)

        return jax.jit(jax.value_and_grad(value, argnums=(0, 1, 2, 3)))

    native_lowered, scan_lowered = loss(native).lower(x, h0, ws, bs), loss(scan).lower(x, h0, ws, bs)
    assert native_targets(native_lowered.as_text()) == TRAINING
    assert not native_targets(scan_lowered.as_text())
    assert_close(jax.jit(native)(x, h0, ws, bs, valid), jax.jit(scan)(x, h0, ws, bs, valid), "hidden rows")
    (_, grads), (_, expected) = native_lowered.compile()(x, h0, ws, bs), scan_lowered.compile()(x, h0, ws, bs)
    want = dict(jax.tree_util.tree_leaves_with_path(expected))
    for path, got in jax.tree_util.tree_leaves_with_path(grads):
        assert_close(got, want[path], f"gradient {jax.tree_util.keystr(path)}")


# -- other platforms ---------------------------------------------------------------------------------------


def test_cuda_lowering_has_no_native_call():
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
        assert native_targets(grad.lower(params).as_text()) == TRAINING
        module = jax.export.export(grad, platforms=("cuda",))(params).mlir_module()
        assert not native_targets(module)
        assert module.count("stablehlo.while") == 2  # the forward scan and the reverse one
