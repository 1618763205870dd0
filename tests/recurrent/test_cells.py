"""Every cell Caffe2's front end could build, compiled and compared with a NumPy step-by-step reference.

Nets come from `rnn2jax.caffe2` (op for op what Caffe2 built); parameters are drawn at random (biases
and scales too, so every parameter matters); the references in reference.py are written from
SEMANTICS.md, not from rnn2jax.
"""

from __future__ import annotations

from contextlib import contextmanager

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
import rnn2jax
from rnn2jax.caffe2.python.attention import AttentionType
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

CELL_EXAMPLES = settings(max_examples=6, deadline=None)
# The dtype the cell tests run in, with its tolerance: float32 by default; test_cells_in_float64
# reruns every cell with x64 on. (rtol, atol) for plain cells and for those with layer norm/attention.
PRECISION = {"dtype": np.float32, "tight": (1e-5, 1e-6), "loose": (2e-5, 2e-6)}


@contextmanager
def float64():
    saved = dict(PRECISION)
    PRECISION.update(dtype=np.float64, tight=(1e-10, 1e-12), loose=(1e-10, 1e-12))
    try:
        with jax.enable_x64(True):  # the test's own float64 references (NumPy-style JAX) need it
            yield
    finally:
        PRECISION.update(saved)


def real(a):
    return np.asarray(a).astype(PRECISION["dtype"])


def compile_model(model: ModelHelper, outputs, rng):
    """Compile the model's main net; parameters drawn from N(0, 0.5^2) in the init net's shapes."""
    init = model.param_init_net.Proto()
    fn = rnn2jax.compile(model.net.Proto(), init_net=init, outputs=[str(o) for o in outputs])
    params = {k: real(rng.standard_normal(v.shape) * 0.5) for k, v in fn.params.items()}
    return fn, params


def run(fn, params, inputs):
    out = jax.jit(fn.apply)(params, inputs)
    return {k: np.asarray(v) for k, v in out.items()}


def initial_state(rng, form, batch, size):
    """An initial state in one of the forms Caffe2 accepts, and its value per batch row."""
    shape = {"1-D": (size,), "2-D": (batch, size), "3-D": (1, batch, size)}[form]
    value = real(rng.standard_normal(shape) * 0.5)
    return value, np.broadcast_to(value.reshape(-1, size), (batch, size))


def lengths_for(rng, use, steps, batch):
    return rng.integers(0, steps + 1, size=batch).astype(np.int32) if use else None


def close(actual, expected, loose=False):
    assert np.asarray(actual).dtype == PRECISION["dtype"]
    rtol, atol = PRECISION["loose" if loose else "tight"]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


sizes = st.fixed_dictionaries(
    {
        "steps": st.integers(0, 4),
        "batch": st.integers(1, 3),
        "dim_in": st.integers(1, 4),
        "hidden": st.integers(1, 4),
        "form": st.sampled_from(["1-D", "2-D", "3-D"]),
        "lengths": st.booleans(),
        "seed": st.integers(0, 2**16),
    }
)

LSTM_VARIANTS = {
    "lstm": dict(),
    "memory_optimization": dict(memory_optimization=True),
    "forget_bias": dict(forget_bias=0.7),
    "drop_states": dict(drop_states=True),
    "forward_only": dict(forward_only=True),
}


@pytest.mark.parametrize("variant", LSTM_VARIANTS)
@CELL_EXAMPLES
@given(s=sizes)
def test_lstm(variant, s):
    rng = np.random.default_rng(s["seed"])
    kwargs = LSTM_VARIANTS[variant]
    model = ModelHelper(name="lstm_model")
    lengths_blob = "seq_lengths" if s["lengths"] else None
    outs = LSTM(model, "x", lengths_blob, ("h0", "c0"), s["dim_in"], s["hidden"], scope="lstm", **kwargs)
    fn, p = compile_model(model, outs, rng)
    x = real(rng.standard_normal((s["steps"], s["batch"], s["dim_in"])))
    h0, h0_rows = initial_state(rng, s["form"], s["batch"], s["hidden"])
    c0, c0_rows = initial_state(rng, s["form"], s["batch"], s["hidden"])
    lengths = lengths_for(rng, s["lengths"], s["steps"], s["batch"])
    inputs = {"x": x, "h0": h0, "c0": c0} | ({"seq_lengths": lengths} if s["lengths"] else {})
    out = run(fn, p, inputs)
    x_proj = x @ p["lstm/i2h_w"].T + p["lstm/i2h_b"]
    expected = ref.lstm(
        x_proj,
        h0_rows,
        c0_rows,
        p["lstm/gates_t_w"],
        p["lstm/gates_t_b"],
        lengths,
        float(np.float32(kwargs.get("forget_bias", 0.0))),  # the argument is stored as a float32
        kwargs.get("drop_states", False),
    )
    for name, value in zip(outs, expected, strict=True):
        close(out[name], value.reshape(out[name].shape))


MILSTM_FAMILY = {"milstm": MILSTM, "layernorm_lstm": LayerNormLSTM, "layernorm_milstm": LayerNormMILSTM}


@pytest.mark.parametrize("cell", MILSTM_FAMILY)
@CELL_EXAMPLES
@given(s=sizes)
def test_milstm_and_layer_norm_cells(cell, s):
    """MILSTM and the layer-norm cells need sequence lengths (their LSTMUnit reads them)."""
    rng = np.random.default_rng(s["seed"])
    model = ModelHelper(name="m")
    scope = {"milstm": "milstm", "layernorm_lstm": "lnlstm", "layernorm_milstm": "lnmilstm"}[cell]
    outs = MILSTM_FAMILY[cell](model, "x", "seq_lengths", ("h0", "c0"), s["dim_in"], s["hidden"], scope=scope)
    fn, p = compile_model(model, outs, rng)
    x = real(rng.standard_normal((s["steps"], s["batch"], s["dim_in"])))
    h0, h0_rows = initial_state(rng, s["form"], s["batch"], s["hidden"])
    c0, c0_rows = initial_state(rng, s["form"], s["batch"], s["hidden"])
    lengths = lengths_for(rng, True, s["steps"], s["batch"])
    out = run(fn, p, {"x": x, "h0": h0, "c0": c0, "seq_lengths": lengths})
    q = {k.split("/", 1)[1]: v for k, v in p.items()}
    x_proj = x @ q["i2h_w"].T + q["i2h_b"]
    if cell == "layernorm_lstm":
        gates = ref.lstm_gates(q["gates_t_w"], q["gates_t_b"])
    else:
        gates = ref.milstm_gates(q["prev_t_w"], q["prev_t_b"], q["alpha"], q["beta1"], q["beta2"], q["b"])
    if cell != "milstm":
        gates = ref.layer_normed(gates, q["gates_t_norm_scale"], q["gates_t_norm_bias"])
    expected = ref.lstm_family(x_proj, h0_rows, c0_rows, gates, lengths)
    for name, value in zip(outs, expected, strict=True):
        close(out[name], value.reshape(out[name].shape), loose=True)


@pytest.mark.parametrize("linear_before_reset", [False, True])
@CELL_EXAMPLES
@given(s=sizes)
def test_gru(linear_before_reset, s):
    rng = np.random.default_rng(s["seed"])
    model = ModelHelper(name="g")
    lengths_blob = "seq_lengths" if s["lengths"] else None
    outs = GRU(
        model, "x", lengths_blob, ("h0",), s["dim_in"], s["hidden"], scope="gru",
        linear_before_reset=linear_before_reset,
    )  # fmt: skip
    fn, p = compile_model(model, outs, rng)
    x = real(rng.standard_normal((s["steps"], s["batch"], s["dim_in"])))
    h0, h0_rows = initial_state(rng, s["form"], s["batch"], s["hidden"])
    lengths = lengths_for(rng, s["lengths"], s["steps"], s["batch"])
    out = run(fn, p, {"x": x, "h0": h0} | ({"seq_lengths": lengths} if s["lengths"] else {}))
    g = {k.split("/", 1)[1]: v for k, v in p.items()}
    x_proj = x @ g["i2h_w"].T + g["i2h_b"]
    expected = ref.gru(
        x_proj, h0_rows, g["reset_gate_t_w"], g["reset_gate_t_b"], g["update_gate_t_w"], g["update_gate_t_b"],
        g["output_gate_t_w"], g["output_gate_t_b"], lengths, linear_before_reset,
    )  # fmt: skip
    for name, value in zip(outs, expected, strict=True):
        close(out[name], value.reshape(out[name].shape))


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@CELL_EXAMPLES
@given(s=sizes)
def test_basic_rnn(activation, s):
    """With sequence lengths Caffe2 could only build BasicRNN forward-only (SEMANTICS.md 3.3)."""
    rng = np.random.default_rng(s["seed"])
    model = ModelHelper(name="b")
    lengths_blob = "seq_lengths" if s["lengths"] else None
    outs = BasicRNN(
        model, "x", lengths_blob, ("h0",), s["dim_in"], s["hidden"], scope="basic_rnn", activation=activation,
        forward_only=s["lengths"],
    )  # fmt: skip
    fn, p = compile_model(model, outs, rng)
    x = real(rng.standard_normal((s["steps"], s["batch"], s["dim_in"])))
    h0, h0_rows = initial_state(rng, s["form"], s["batch"], s["hidden"])
    lengths = lengths_for(rng, s["lengths"], s["steps"], s["batch"])
    out = run(fn, p, {"x": x, "h0": h0} | ({"seq_lengths": lengths} if s["lengths"] else {}))
    x_proj = x @ p["basic_rnn/i2h_w"].T + p["basic_rnn/i2h_b"]
    expected = ref.basic_rnn(
        x_proj, h0_rows, p["basic_rnn/gates_t_w"], p["basic_rnn/gates_t_b"], lengths, activation
    )
    for name, value in zip(outs, expected, strict=True):
        close(out[name], value.reshape(out[name].shape))


def _two_layer_reference(p, names, x, states, lengths):
    """Layer 0 on the projected input, layer 1 on an FC of layer 0's hidden states. `names` are the
    8 parameter blob names: (i2h_w, i2h_b, gates_t_w, gates_t_b) of layer 0, then of layer 1."""
    w = [p[n] for n in names]
    h0 = ref.lstm(x @ w[0].T + w[1], states[0], states[1], w[2], w[3], lengths)
    h1 = ref.lstm(h0[0] @ w[4].T + w[5], states[2], states[3], w[6], w[7], lengths)
    return h0, h1


def _names(p, *suffixes):
    """The parameter names ending in each suffix (exactly one each)."""
    found = []
    for suffix in suffixes:
        (name,) = [k for k in p if k.endswith(suffix)]
        found.append(name)
    return found


@CELL_EXAMPLES
@given(s=sizes)
def test_multi_rnn_cell_stack(s):
    """rnn_cell.LSTM with a list of sizes: layer 1's input FC runs inside the step net."""
    rng = np.random.default_rng(s["seed"])
    model = ModelHelper(name="stack")
    hidden = s["hidden"]
    initial = [f"{k}0_{i}" for i in range(2) for k in ("h", "c")]
    lengths_blob = "seq_lengths" if s["lengths"] else None
    outs = LSTM(
        model, "x", lengths_blob, initial, s["dim_in"], [hidden, hidden + 1], scope="lstm",
        return_last_layer_only=False,
    )  # fmt: skip
    fn, p = compile_model(model, outs, rng)
    x = real(rng.standard_normal((s["steps"], s["batch"], s["dim_in"])))
    values, rows = {}, []
    for name, size in zip(initial, (hidden, hidden, hidden + 1, hidden + 1), strict=True):
        values[name], row = initial_state(rng, s["form"], s["batch"], size)
        rows.append(row)
    lengths = lengths_for(rng, s["lengths"], s["steps"], s["batch"])
    out = run(fn, p, {"x": x, **values} | ({"seq_lengths": lengths} if s["lengths"] else {}))
    names = ["lstm/i2h_w", "lstm/i2h_b", *_names(p, "layer_0/gates_t_w", "layer_0/gates_t_b")]
    names += _names(p, "layer_1/i2h_w", "layer_1/i2h_b", "layer_1/gates_t_w", "layer_1/gates_t_b")
    h0, h1 = _two_layer_reference(p, names, x, rows, lengths)
    for name, value in zip(outs, (*h0, *h1), strict=True):
        close(out[name], value.reshape(out[name].shape))


def test_dropout_cell_in_test_mode_is_the_plain_stack():
    """DropoutCell puts Dropout(is_test=1) between layers: the identity, so a plain 2-layer stack."""
    rng = np.random.default_rng(7)
    model = ModelHelper(name="drop")
    cells = [
        DropoutCell(
            LSTMCell(3, 4, 0.0, False, name="lstm/layer_0"), dropout_ratio=0.5, is_test=1, name="drop0"
        ),
        LSTMCell(4, 4, 0.0, False, name="lstm/layer_1"),
    ]
    stack = MultiRNNCell(cells, name="lstm")
    output, _ = stack.apply_over_sequence(model, "x", "seq_lengths", ["h0_0", "c0_0", "h0_1", "c0_1"])
    step_ops = [op.type for op in rnn2jax.load(model.net.Proto()).walk()]
    assert "Dropout" in step_ops
    fn, p = compile_model(model, [output], rng)
    x = real(rng.standard_normal((5, 2, 3)))
    states = {n: real(rng.standard_normal((1, 2, 4)) * 0.5) for n in ("h0_0", "c0_0", "h0_1", "c0_1")}
    lengths = np.array([5, 3], np.int32)
    out = run(fn, p, {"x": x, "seq_lengths": lengths, **states})
    rows = [v[0] for v in states.values()]
    suffixes = [f"layer_{i}/{n}" for i in range(2) for n in ("i2h_w", "i2h_b", "gates_t_w", "gates_t_b")]
    _, h1 = _two_layer_reference(p, _names(p, *suffixes), x, rows, lengths)
    close(out[str(output)], h1[0])


# --------------------------------------------------------------------------------------------------
# Attention decoders


def attention_reference(kind, p, dec_in, dec_len, h0, c0, ctx0, enc, enc_len=None, cov0=None):
    """LSTM decoder with attention (SEMANTICS.md 3.0 and the listings of 3.1), step by step."""
    x_proj = dec_in @ p["att/decoder/i2h_w"].T + p["att/decoder/i2h_b"]
    weo = (
        enc @ p["att/weighted_encoder_outputs_w"].T + p["att/weighted_encoder_outputs_b"]
        if not kind.startswith("dot")
        else None
    )
    cov_w = enc @ p["att/coverage_weights_w"].T + p["att/coverage_weights_b"] if kind == "coverage" else None
    h, c, ctx, cov = h0, c0, ctx0, cov0
    outs = {"h": [], "c": [], "ctx": [], "cov": []}
    for t in range(dec_in.shape[0]):
        gates = (
            np.concatenate([h, ctx], -1) @ p["att/decoder/gates_t_w"].T
            + p["att/decoder/gates_t_b"]
            + x_proj[t]
        )
        h, c = ref.lstm_unit(h, c, gates, ref.valid_rows(t, dec_len, h.shape[0]))
        if kind.startswith("dot"):
            query = (
                h @ p["att/weighted_decoder_hidden_state_w"].T + p["att/weighted_decoder_hidden_state_b"]
                if (kind == "dot")
                else h
            )
            logits = np.einsum("lne,ne->nl", enc, query)
        else:
            s = weo + (
                h @ p["att/weighted_decoder_hidden_state_w"].T + p["att/weighted_decoder_hidden_state_b"]
            )
            if kind == "recurrent":
                s = (
                    s
                    + ctx @ p["att/weighted_prev_attention_context_w"].T
                    + p["att/weighted_prev_attention_context_b"]
                )
            if kind == "coverage":
                s = s + cov_w * cov.T[:, :, None]
            logits = (np.tanh(s) @ p["att/attention_logits_w"].T + p["att/attention_logits_b"])[..., 0].T
        if enc_len is not None:
            logits = np.where(np.arange(enc.shape[0])[None, :] >= enc_len[:, None], -np.inf, logits)
        weights = np.exp(logits - logits.max(1, keepdims=True))
        weights /= weights.sum(1, keepdims=True)
        ctx = np.einsum("nl,lne->ne", weights, enc)
        if kind == "coverage":
            cov = cov + weights
        for key, value in (("h", h), ("c", c), ("ctx", ctx), ("cov", cov)):
            outs[key].append(value)
    return outs


ATTENTION = {
    "regular": AttentionType.Regular,
    "regular_masked": AttentionType.Regular,
    "recurrent": AttentionType.Recurrent,
    "dot": AttentionType.Dot,
    "dot_same_size": AttentionType.Dot,
    "coverage": AttentionType.SoftCoverage,
}


@pytest.mark.parametrize("kind", ATTENTION)
@settings(max_examples=4, deadline=None)
@given(
    steps=st.integers(0, 3), batch=st.integers(1, 3), enc_steps=st.integers(1, 4), seed=st.integers(0, 2**16)
)
def test_lstm_with_attention(kind, steps, batch, enc_steps, seed):
    rng = np.random.default_rng(seed)
    enc_dim, hidden, dec_dim = (4, 4, 2) if kind == "dot_same_size" else (3, 4, 2)
    model = ModelHelper(name="att_model")
    masked = kind == "regular_masked"
    outs = LSTMWithAttention(
        model, "dec_in", "dec_len", "h0", "c0", "ctx0", enc_dim, "enc", "enc_len" if masked else None,
        dec_dim, hidden, "att", attention_type=ATTENTION[kind], forward_only=kind == "coverage",
        attention_memory_optimization=masked,
    )  # fmt: skip
    fn, p = compile_model(model, outs, rng)
    dec_in = real(rng.standard_normal((steps, batch, dec_dim)))
    enc = real(rng.standard_normal((enc_steps, batch, enc_dim)))
    dec_len = rng.integers(0, steps + 1, size=batch).astype(np.int32)
    enc_len = rng.integers(1, enc_steps + 1, size=batch).astype(np.int32)
    h0, c0 = (real(rng.standard_normal((1, batch, hidden))) for _ in range(2))
    ctx0 = real(rng.standard_normal((1, batch, enc_dim)))
    inputs = {"dec_in": dec_in, "enc": enc, "dec_len": dec_len, "h0": h0, "c0": c0, "ctx0": ctx0}
    out = run(fn, p, inputs | ({"enc_len": enc_len} if masked else {}))
    name = {"regular_masked": "regular", "dot_same_size": "dot_same"}.get(kind, kind)
    initial = {"h": h0[0], "c": c0[0], "ctx": ctx0[0], "cov": real(np.zeros((batch, enc_steps)))}
    expected = attention_reference(
        name, p, dec_in, dec_len, h0[0], c0[0], ctx0[0], enc, enc_len if masked else None, initial["cov"]
    )
    keys = ["h", "h", "c", "c", "ctx", "ctx"] + (["cov", "cov"] if kind == "coverage" else [])
    for i, (blob, key) in enumerate(zip(outs, keys, strict=True)):
        series = expected[key]
        if i % 2 == 0:
            value = np.stack(series) if series else real(np.zeros((0, *out[blob].shape[1:])))
        else:
            value = (series[-1] if series else initial[key])[None]
        close(out[blob], value.reshape(out[blob].shape), loose=True)


FIXED = {"steps": 3, "batch": 2, "dim_in": 3, "hidden": 4, "form": "2-D", "lengths": True, "seed": 11}
FLOAT64_CASES = {
    **{f"lstm-{v}": (test_lstm, {"variant": v, "s": FIXED}) for v in LSTM_VARIANTS},
    **{c: (test_milstm_and_layer_norm_cells, {"cell": c, "s": FIXED}) for c in MILSTM_FAMILY},
    **{f"gru-{b}": (test_gru, {"linear_before_reset": b, "s": FIXED}) for b in (False, True)},
    # BasicRNN's length mask is Cast(to=float): float32 by definition, so float64 runs it without lengths.
    **{f"rnn-{a}": (test_basic_rnn, {"activation": a, "s": {**FIXED, "lengths": False}}) for a in ("tanh", "relu")},
    "stack": (test_multi_rnn_cell_stack, {"s": FIXED}),
    # SoftCoverage's initial coverage is a ConstantFill of dtype float: float32 by definition.
    **{
        f"attention-{k}": (test_lstm_with_attention, dict(kind=k, steps=3, batch=2, enc_steps=3, seed=5))
        for k in ATTENTION
        if k != "coverage"
    },
}


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_cells_in_float64(case):
    """Every cell again in float64 (x64 on), to 1e-10."""
    test, kwargs = FLOAT64_CASES[case]
    with float64():
        test.hypothesis.inner_test(**kwargs)
