"""jax.grad of a recognised LSTM step net goes through rnn2jax/ops/recurrent/cell_vjp.py's custom VJP.

Its gradients are checked against jax.grad of an LSTM written here in plain JAX from Caffe2's maths
(LSTMUnit: gate order i, f, o, g; forget_bias on f; rows at or past their length keep or, with
drop_states, zero their state) and against jax.grad of the plain lowering (`lower(net, plain=True)`,
verify's reference: the step net's ops as written, no fused step, no custom VJP; its jaxpr is checked
to hold no custom_vjp call). A structural test checks the point of it: the reverse scan's body does
one matmul, dh_prev = dgates @ W, and no weight-gradient matmul.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnn2jax
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.errors import ShapeError
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower
from rnn2jax.ops.recurrent import forward as forward_module

OUTPUTS = ("lstm/hidden_state_all", "lstm/hidden_state_last", "lstm/cell_state_all", "lstm/cell_state_last")
PARAMS = ("lstm/i2h_w", "lstm/i2h_b", "lstm/gates_t_w", "lstm/gates_t_b")


def build(dim_in: int, hidden, lengths: bool, forget_bias: float, drop_states: bool, forward_only: bool):
    """One LSTM (`hidden` an int) or a stack of them (`hidden` a list: Caffe2's MultiRNNCell), compiled;
    `fn.plain(params, inputs)` runs the same net lowered plain (verify's reference)."""
    layers = 1 if isinstance(hidden, int) else len(hidden)
    states = [name for k in range(layers) for name in (f"h{k}", f"c{k}")]
    model = ModelHelper(name="cell_vjp")
    LSTM(
        model, "x", "seq_lengths" if lengths else None, states, dim_in, hidden, scope="lstm",
        forget_bias=forget_bias, drop_states=drop_states, forward_only=forward_only,
    )  # fmt: skip
    outputs = [name for k in range(layers) for name in outputs_of(layers, k)]
    fn = rnn2jax.compile(model.net.Proto(), init_net=model.param_init_net.Proto(), outputs=outputs)
    plain = lower(load(model.net.Proto()), plain=True)

    def run_plain(params, inputs):
        env = plain({**params, **inputs})
        return {name: env[name] for name in outputs}

    fn.plain = run_plain
    return fn


def outputs_of(layers: int, k: int) -> tuple[str, ...]:
    """Layer k's outputs (hidden all, hidden last, cell all, cell last), named as Caffe2 names them."""
    return OUTPUTS if layers == 1 else tuple(name.replace("lstm/", f"lstm/layer_{k}/") for name in OUTPUTS)


def params_of(layers: int, k: int) -> tuple[str, ...]:
    """Layer k's (input W, input b, recurrent W, recurrent b): layer 0's input FC runs before the loop."""
    if layers == 1:
        return PARAMS
    i2h = ("lstm/i2h_w", "lstm/i2h_b") if k == 0 else (f"lstm/layer_{k}/i2h_w", f"lstm/layer_{k}/i2h_b")
    return (*i2h, f"lstm/layer_{k}/gates_t_w", f"lstm/layer_{k}/gates_t_b")


def reference_lstm(params, x, h0, c0, lengths, forget_bias, drop_states):
    """Caffe2's LSTM (the i2h FC, then per step FC(h) + i2h_t and LSTMUnit) in plain JAX."""
    i2h = x @ params["lstm/i2h_w"].T + params["lstm/i2h_b"]
    w, b = params["lstm/gates_t_w"], params["lstm/gates_t_b"]
    steps = jnp.arange(x.shape[0])

    def step(carry, xs):
        h, c = carry
        t, i2h_t = xs
        a_i, a_f, a_o, a_g = jnp.split(i2h_t + h @ w.T + b, 4, axis=-1)
        i, f, o, g = jax.nn.sigmoid(a_i), jax.nn.sigmoid(a_f + forget_bias), jax.nn.sigmoid(a_o), jnp.tanh(a_g)
        c_new = f * c + i * g
        h_new = o * jnp.tanh(c_new)
        if lengths is not None:
            valid = (t < lengths)[:, None]
            h_new = jnp.where(valid, h_new, 0.0 if drop_states else h)
            c_new = jnp.where(valid, c_new, 0.0 if drop_states else c)
        return (h_new, c_new), (h_new, c_new)

    (h, c), (hs, cs) = jax.lax.scan(step, (h0, c0), (steps, i2h))
    return {OUTPUTS[0]: hs, OUTPUTS[1]: h[None], OUTPUTS[2]: cs, OUTPUTS[3]: c[None]}


def reference_stack(params, x, h0s, c0s, lengths, forget_bias, drop_states):
    """The stack layer by layer (as torch.nn.LSTM runs it): each layer a whole sequence over the layer
    below's hidden rows."""
    layers, outputs, rows = len(h0s), {}, x
    for k in range(layers):
        w_i, b_i, w, b = (params[name] for name in params_of(layers, k))
        named = reference_lstm(
            {PARAMS[0]: w_i, PARAMS[1]: b_i, PARAMS[2]: w, PARAMS[3]: b}, rows, h0s[k], c0s[k], lengths, forget_bias,
            drop_states,
        )  # fmt: skip
        outputs |= dict(zip(outputs_of(layers, k), (named[name] for name in OUTPUTS), strict=True))
        rows = named[OUTPUTS[0]]
    return outputs


def loss_of(outputs, weights, used):
    return sum(jnp.sum(outputs[name] * weights[name]) for name in used)


def assert_close(actual, expected, rtol=1e-5):
    """Within rtol of the gradient's scale (what rnn2jax.verify uses): summation order differs."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-3)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale)


@st.composite
def cases(draw):
    steps, batch = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    use_lengths = draw(st.booleans())
    layers = draw(st.sampled_from([1, 1, 2, 3]))
    lengths = draw(st.lists(st.integers(0, steps), min_size=batch, max_size=batch)) if use_lengths else None
    outputs = [name for k in range(layers) for name in outputs_of(layers, k)]
    return {
        "steps": steps,
        "batch": batch,
        "dim_in": draw(st.integers(1, 5)),
        "hidden": draw(st.lists(st.integers(1, 5), min_size=layers, max_size=layers)),
        "lengths": lengths,
        "forget_bias": draw(st.sampled_from([0.0, 1.0, -0.5])),
        "drop_states": draw(st.booleans()),
        "forward_only": draw(st.booleans()),
        "used": draw(st.lists(st.sampled_from(outputs), min_size=1, max_size=4, unique=True)),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=8, deadline=None)
@given(cases())
def test_custom_vjp_equals_reference_and_plain_scan(case):
    """One cell or a stack of them (Caffe2's MultiRNNCell: one step net, two states per layer)."""
    hiddens = case["hidden"]
    layers = len(hiddens)
    fn = build(
        case["dim_in"], hiddens[0] if layers == 1 else hiddens, case["lengths"] is not None, case["forget_bias"],
        case["drop_states"], case["forward_only"],
    )  # fmt: skip
    rng = np.random.default_rng(case["seed"])
    steps, batch = case["steps"], case["batch"]
    params = {k: jnp.asarray(rng.standard_normal(v.shape) * 0.5, jnp.float32) for k, v in fn.params.items()}
    data = {"x": jnp.asarray(rng.standard_normal((steps, batch, case["dim_in"])), jnp.float32)}
    for k, hidden in enumerate(hiddens):  # layer k's initial states are h{k}, c{k}
        for state in (f"h{k}", f"c{k}"):
            data[state] = jnp.asarray(rng.standard_normal((1, batch, hidden)) * 0.5, jnp.float32)
    lengths = None if case["lengths"] is None else jnp.asarray(case["lengths"], jnp.int32)
    weights = {}
    for k, hidden in enumerate(hiddens):
        shapes = [(steps, batch, hidden), (1, batch, hidden)] * 2
        for name, shape in zip(outputs_of(layers, k), shapes, strict=True):
            weights[name] = jnp.asarray(rng.standard_normal(shape), jnp.float32)

    def compiled_loss(p, d):
        outputs = fn.apply(p, d if lengths is None else d | {"seq_lengths": lengths})
        return loss_of(outputs, weights, case["used"]), outputs

    def plain_loss(p, d):
        outputs = fn.plain(p, d if lengths is None else d | {"seq_lengths": lengths})
        return loss_of(outputs, weights, case["used"]), outputs

    def reference_loss(p, d):
        h0s, c0s = [d[f"h{k}"][0] for k in range(layers)], [d[f"c{k}"][0] for k in range(layers)]
        outputs = reference_stack(p, d["x"], h0s, c0s, lengths, case["forget_bias"], case["drop_states"])
        return loss_of(outputs, weights, case["used"]), outputs

    def gradient(loss):
        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, data)

    assert _path_taken(lambda p, d: compiled_loss(p, d)[0], params, data)
    assert not _path_taken(lambda p, d: plain_loss(p, d)[0], params, data)
    assert not _custom_calls(jax.make_jaxpr(lambda p, d: plain_loss(p, d)[0])(params, data).jaxpr)
    ours, expected, plain = gradient(compiled_loss), gradient(reference_loss), gradient(plain_loss)
    for got, want, other in zip(ours[0], expected[0], plain[0], strict=True):
        for name in want:
            assert_close(got[name], want[name])
            assert_close(got[name], other[name])
    for name in expected[1]:  # the forward too: the recognised path also runs forward-only nets
        assert_close(ours[1][name], expected[1][name])


def _path_taken(loss, params, data) -> bool:
    """Whether tracing the loss's gradient went through the custom VJP."""
    calls = []
    original = forward_module.lstm_cell_rows

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(result is not None)
        return result

    forward_module.lstm_cell_rows = spy
    try:
        jax.make_jaxpr(jax.grad(loss))(params, data)
    finally:
        forward_module.lstm_cell_rows = original
    return calls == [True]


def _custom_calls(jaxpr) -> list[str]:
    """The custom_vjp/custom_jvp primitives of a jaxpr, nested jaxprs included."""
    found = [eqn.primitive.name for eqn in jaxpr.eqns if "custom" in eqn.primitive.name]
    for eqn in jaxpr.eqns:
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    found += _custom_calls(inner if hasattr(inner, "eqns") else inner.jaxpr)
    return found


def _scans(jaxpr):
    """Every scan equation in a closed jaxpr, nested jaxprs included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    yield from _scans(inner if hasattr(inner, "eqns") else inner.jaxpr)


def _dots(jaxpr):
    return [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general"]


def _reverse_scan_dots(loss, params, data):
    closed = jax.make_jaxpr(jax.grad(loss))(params, data)
    reverse = [eqn for eqn in _scans(closed.jaxpr) if eqn.params["reverse"]]
    assert len(reverse) == 1
    return [tuple(v.aval.shape for v in eqn.outvars) for eqn in _dots(reverse[0].params["jaxpr"].jaxpr)]


def test_reverse_scan_does_only_dh_prev_matmul():
    """The custom VJP's reverse scan has one matmul, shaped [N, H] (dh_prev), none shaped like the
    weight [4H, H]; the plain differentiated scan does accumulate dW inside its reverse loop."""
    steps, batch, hidden = 5, 3, 4
    fn = build(hidden, hidden, True, 1.0, False, False)
    rng = np.random.default_rng(0)
    params = {k: jnp.asarray(rng.standard_normal(v.shape) * 0.5, jnp.float32) for k, v in fn.params.items()}
    data = {
        "x": jnp.ones((steps, batch, hidden), jnp.float32),
        "h0": jnp.zeros((1, batch, hidden), jnp.float32),
        "c0": jnp.zeros((1, batch, hidden), jnp.float32),
    }

    def loss(p, d):
        return jnp.sum(fn.apply(p, d | {"seq_lengths": jnp.full(batch, steps, jnp.int32)})[OUTPUTS[0]])

    def plain_loss(p, d):
        return jnp.sum(fn.plain(p, d | {"seq_lengths": jnp.full(batch, steps, jnp.int32)})[OUTPUTS[0]])

    assert _reverse_scan_dots(loss, params, data) == [((batch, hidden),)]
    plain = _reverse_scan_dots(plain_loss, params, data)
    # the plain scan's weight gradient, whole ([4H, H]: the step's FC as written, no gate blocks)
    assert any(shape == (4 * hidden, hidden) for shapes in plain for shape in shapes)


def test_unused_outputs_get_no_state_gradient_rows():
    """With only `_last` outputs in the loss, the reverse scan reads no [T, N, H] cotangent rows (the
    custom VJP sees symbolic zeros for `_all`), so its per-step inputs are the residuals alone."""
    steps, batch, hidden = 4, 2, 3
    fn = build(hidden, hidden, False, 0.0, False, True)
    params = {k: jnp.full(v.shape, 0.1, jnp.float32) for k, v in fn.params.items()}
    data = {
        "x": jnp.ones((steps, batch, hidden), jnp.float32),
        "h0": jnp.zeros((1, batch, hidden), jnp.float32),
        "c0": jnp.zeros((1, batch, hidden), jnp.float32),
    }

    def loss(p, d):
        outputs = fn.apply(p, d)
        return jnp.sum(outputs[OUTPUTS[1]]) + jnp.sum(outputs[OUTPUTS[3]])

    closed = jax.make_jaxpr(jax.grad(loss))(params, data)
    (reverse,) = [eqn for eqn in _scans(closed.jaxpr) if eqn.params["reverse"]]
    body = reverse.params["jaxpr"].jaxpr
    consts, carries = reverse.params["num_consts"], reverse.params["num_carry"]
    per_step = body.invars[consts + carries :]
    # c_t, c_{t-1} and the four activated gates: no cotangent rows
    assert len(per_step) == 6


def test_wrong_lengths_fall_back_to_the_plain_error():
    """Arrays outside the recognised case take the plain scan, which names the problem."""
    fn = build(3, 2, True, 0.0, False, False)
    params = {k: jnp.zeros(v.shape, jnp.float32) for k, v in fn.params.items()}
    inputs = {
        "x": jnp.ones((2, 3, 3), jnp.float32),
        "h0": jnp.zeros((1, 3, 2), jnp.float32),
        "c0": jnp.zeros((1, 3, 2), jnp.float32),
        "seq_lengths": jnp.ones((4,), jnp.int32),
    }
    with pytest.raises(ShapeError, match="seq_lengths") as caught:
        fn.apply(params, inputs)
    message = str(caught.value)  # where, once: "<the LSTMUnit> (fused with op #0 FC): seq_lengths ..."
    assert message.count("op #2 (LSTMUnit)") == 1 and "(fused with op #0 FC): seq_lengths 'seq_lengths'" in message


def _cell_dot_precisions(loss, params, data):
    closed = jax.make_jaxpr(jax.grad(loss))(params, data)
    return {str(eqn.params["precision"]) for scan in _scans(closed.jaxpr) for eqn in _dots(scan.params["jaxpr"].jaxpr)}


def test_matmul_precision_follows_jax_default_matmul_precision():
    """float32 products (Caffe2's) unless the user sets jax_default_matmul_precision, which then rules."""
    fn = build(3, 2, False, 0.0, False, True)
    params = {k: jnp.full(v.shape, 0.1, jnp.float32) for k, v in fn.params.items()}
    data = {"x": jnp.ones((2, 1, 3)), "h0": jnp.zeros((1, 1, 2)), "c0": jnp.zeros((1, 1, 2))}

    def loss(p, d):
        return jnp.sum(fn.apply(p, d)[OUTPUTS[0]])

    highest = str((jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST))
    assert _cell_dot_precisions(loss, params, data) == {highest}
    with jax.default_matmul_precision("tensorfloat32"):
        chosen = _cell_dot_precisions(loss, params, data)
    assert chosen and highest not in chosen
