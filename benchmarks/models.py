"""The benchmarked recurrent models, each in four forms that compute the same maths.

For every model this module gives:

- the Caffe2 nets, built by rnn2jax's copy of Caffe2's front end (`rnn_cell`, `gru_cell`, `attention`,
  `model_helper`) the way Caffe2 built them: a forward-only net (as served), and a training net (the forward
  net, a loss `SumElements(Mul(output, cotangent))` and the gradient ops of `get_backward_pass`, i.e. the
  RecurrentNetworkGradient running the backward step net);
- the best hand-written JAX we can write for the same maths: input projection hoisted out of the loop as one
  matmul, both biases folded into it where the maths allows, recurrent weights pre-transposed (and split or
  concatenated so each step does one matmul per dependency), `lax.scan` over the projected inputs (no
  per-step dynamic slicing), the `seq_lengths` mask kept because the Caffe2 nets apply it;
- a `torch.nn` module (`nn.LSTM`, `nn.GRU`) with the same weights, where one exists.

Parameters go from Caffe2's layout to the hand-written and PyTorch layouts through *linear* JAX functions
(`hand_params`, `torch_params`: permutations, transposes, concatenations and bias sums), so gradients come
back to Caffe2's layout exactly with `jax.vjp` of that map (a bias folded into two places gets the sum).

Maths differences that decide what is compared (see also compare.py's docstring):

- LSTM: Caffe2's gate blocks are i, f, o, g; PyTorch's are i, f, g, o (permuted here). Caffe2 computes tanh as
  2*sigmoid(2x)-1, which agrees with tanh to float32 rounding at these magnitudes.
- GRU: Caffe2's default `GRUCell` applies the reset gate *before* the output-gate matmul,
  `o = tanh(x_o + W_o (r * h) + b_o)`; PyTorch's `nn.GRU` applies it after: `n = tanh(x_n + r * (W_n h + b_n))`.
  These are different functions. Caffe2's `linear_before_reset=True` (its cuDNN-compatible variant) is exactly
  PyTorch's maths with the same gate order (r, u/z, o/n), so model `gru` uses it and is checked against
  `nn.GRU`; model `gru_reset_first` is Caffe2's default GRU, compared with hand-written JAX and real Caffe2 only.
- LSTM with attention (`rnn_cell.LSTMWithAttention`, regular Bahdanau attention over an encoder output of
  length T and size H): PyTorch has no built-in, so it is compared with hand-written JAX and real Caffe2 only.
- PyTorch runs without a length mask (every sequence is full length here, so the mask is the identity).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rnn2jax.caffe2.python import attention, gru_cell, rnn_cell
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.proto import caffe2_pb2 as pb

Arrays = dict[str, Any]


@dataclass
class Nets:
    """A model's Caffe2 nets at one size, and the blob names the benchmark needs."""

    forward: pb.NetDef  # forward-only (as served)
    train_forward: pb.NetDef  # training model's forward net plus the loss (what jax.grad differentiates)
    train: pb.NetDef  # train_forward plus get_backward_pass's gradient ops
    init: pb.NetDef
    output: str  # the sequence output the loss weights by `cotangent`
    grads: dict[str, str]  # differentiated blob (parameter or input) -> its gradient blob in `train`


@dataclass
class Model:
    name: str
    description: str
    build: Callable[[ModelHelper, int, bool], str]  # (model, H, forward_only) -> output blob
    inputs: Callable[[int, int, int, np.random.Generator], dict[str, np.ndarray]]
    grad_inputs: tuple[str, ...]  # inputs whose gradients are compared (besides the parameters)
    hand_params: Callable[[Arrays], Any]
    hand_forward: Callable[[Any, Arrays], jax.Array]
    torch_params: Callable[[Arrays], Arrays] | None = None
    torch_module: Callable[[int], Any] | None = None
    torch_forward: Callable[[Any, Arrays], Any] | None = None
    frozen: tuple[str, ...] = ()  # parameters Caffe2 does not train: their gradients are not compared


def caffe2_nets(model: Model, hidden: int) -> Nets:
    """Build the forward-only net, and the training net with its backward pass, as Caffe2's front end did."""
    served = ModelHelper(name=f"{model.name}_forward")
    output = model.build(served, hidden, True)
    trained = ModelHelper(name=f"{model.name}_train")
    assert model.build(trained, hidden, False) == output
    trained.net.Mul([output, "cotangent"], "weighted_output")
    trained.net.SumElements(["weighted_output"], "loss")
    train_forward = pb.NetDef()
    train_forward.CopyFrom(trained.net.Proto())
    train = pb.NetDef()
    train.CopyFrom(train_forward)
    backward, grads = get_backward_pass(list(train_forward.op), {"loss": None})
    train.op.extend(backward)
    return Nets(served.net.Proto(), train_forward, train, trained.param_init_net.Proto(), output, dict(grads))


def random_params(init_params: Arrays, hidden: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Parameters of the init net's shapes, uniform in +-1/sqrt(H) like PyTorch's default (biases too, so a
    mixed-up bias would show), seeded by name so every framework and process gets the same values."""
    scale = 1.0 / np.sqrt(hidden)
    out = {}
    for name in sorted(init_params):
        shape = np.shape(init_params[name])
        rng = np.random.default_rng([seed, *name.encode()])
        out[name] = rng.uniform(-scale, scale, shape).astype(np.float32)
    return out


def _sequence_inputs(steps: int, batch: int, hidden: int, rng: np.random.Generator, states: list[str]):
    x = rng.standard_normal((steps, batch, hidden)).astype(np.float32)
    values = {"x": x, "seq_lengths": np.full(batch, steps, np.int32)}
    for name in states:
        values[name] = (0.1 * rng.standard_normal((1, batch, hidden))).astype(np.float32)
    return values


# ------------------------------------------------------------------------------------------------
# Hand-written JAX building blocks


def _project(x: jax.Array, w_t: jax.Array, b: jax.Array) -> jax.Array:
    """All steps' input projection as one matmul: [T, N, D] @ [D, G] + b."""
    steps, batch, dim = x.shape
    return (x.reshape(steps * batch, dim) @ w_t + b).reshape(steps, batch, -1)


def _lstm_cell(gates: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gate blocks in Caffe2's order i, f, o, g (the hand layout keeps it)."""
    hidden = c.shape[-1]
    i = jax.nn.sigmoid(gates[:, :hidden])
    f = jax.nn.sigmoid(gates[:, hidden : 2 * hidden])
    o = jax.nn.sigmoid(gates[:, 2 * hidden : 3 * hidden])
    g = jnp.tanh(gates[:, 3 * hidden :])
    c_new = f * c + i * g
    return o * jnp.tanh(c_new), c_new


def _masked(valid: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    return jnp.where(valid[:, None], new, old)


def hand_lstm_layer(xp, h0, c0, w_hh_t, lengths):
    """One LSTM layer over projected inputs xp [T, N, 4H] (biases included); returns h for all steps."""

    def step(carry, inputs):
        h, c = carry
        xp_t, t = inputs
        h_new, c_new = _lstm_cell(xp_t + h @ w_hh_t, c)
        valid = t < lengths
        h, c = _masked(valid, h_new, h), _masked(valid, c_new, c)
        return (h, c), h

    _, hs = jax.lax.scan(step, (h0, c0), (xp, jnp.arange(xp.shape[0])))
    return hs


# ------------------------------------------------------------------------------------------------
# LSTM (one layer) and 2-layer LSTM


# PyTorch's gate blocks i, f, g, o from Caffe2's i, f, o, g
def _to_torch_gates(w: jax.Array) -> jax.Array:
    i, f, o, g = jnp.split(w, 4, axis=0)
    return jnp.concatenate([i, f, g, o], axis=0)


def _lstm_layer_names(layers: int) -> list[tuple[str, str]]:
    """(input-projection prefix, recurrent FC prefix) per layer, as rnn_cell names them."""
    if layers == 1:
        return [("lstm/i2h", "lstm/gates_t")]
    return [("lstm/i2h" if k == 0 else f"lstm/layer_{k}/i2h", f"lstm/layer_{k}/gates_t") for k in range(layers)]


def _lstm_model(layers: int) -> Model:
    states = [name for k in range(layers) for name in (f"h{k}", f"c{k}")]
    names = _lstm_layer_names(layers)

    def build(model: ModelHelper, hidden: int, forward_only: bool) -> str:
        dims = hidden if layers == 1 else [hidden] * layers
        out = rnn_cell.LSTM(model, "x", "seq_lengths", states, hidden, dims, scope="lstm", forward_only=forward_only)
        return str(out[0])

    def hand_params(p):
        return [
            {"w_ih_t": p[f"{i2h}_w"].T, "b": p[f"{i2h}_b"] + p[f"{rec}_b"], "w_hh_t": p[f"{rec}_w"].T}
            for i2h, rec in names
        ]

    def hand_forward(hp, inputs):
        hs = inputs["x"]
        for k, layer in enumerate(hp):
            xp = _project(hs, layer["w_ih_t"], layer["b"])
            hs = hand_lstm_layer(xp, inputs[f"h{k}"][0], inputs[f"c{k}"][0], layer["w_hh_t"], inputs["seq_lengths"])
        return hs

    def torch_params(p):
        out = {}
        for k, (i2h, rec) in enumerate(names):
            out[f"weight_ih_l{k}"] = _to_torch_gates(p[f"{i2h}_w"])
            out[f"bias_ih_l{k}"] = _to_torch_gates(p[f"{i2h}_b"])
            out[f"weight_hh_l{k}"] = _to_torch_gates(p[f"{rec}_w"])
            out[f"bias_hh_l{k}"] = _to_torch_gates(p[f"{rec}_b"])
        return out

    def torch_module(hidden: int):
        import torch

        return torch.nn.LSTM(hidden, hidden, num_layers=layers)

    def torch_forward(module, t):
        import torch

        h0 = torch.cat([t[f"h{k}"] for k in range(layers)])
        c0 = torch.cat([t[f"c{k}"] for k in range(layers)])
        return module(t["x"], (h0, c0))[0]

    return Model(
        name="lstm" if layers == 1 else f"lstm{layers}",
        description="rnn_cell.LSTM" if layers == 1 else f"rnn_cell.LSTM, {layers} layers (MultiRNNCell)",
        build=build,
        inputs=lambda t, n, h, rng: _sequence_inputs(t, n, h, rng, states),
        grad_inputs=("x",),
        hand_params=hand_params,
        hand_forward=hand_forward,
        torch_params=torch_params,
        torch_module=torch_module,
        torch_forward=torch_forward,
    )


# ------------------------------------------------------------------------------------------------
# GRU

_GRU_FCS = ("gru/reset_gate_t", "gru/update_gate_t", "gru/output_gate_t")


def _gru_model(linear_before_reset: bool) -> Model:
    def build(model: ModelHelper, hidden: int, forward_only: bool) -> str:
        out = gru_cell.GRU(
            model,
            "x",
            "seq_lengths",
            ["h0"],
            hidden,
            hidden,
            scope="gru",
            forward_only=forward_only,
            linear_before_reset=linear_before_reset,
        )
        return str(out[0])

    def hand_params(p):
        zeros = jnp.zeros_like(p["gru/output_gate_t_b"])
        # r's and u's recurrent biases add linearly to the projection; o's stays inside (after reset or not)
        b = p["gru/i2h_b"] + jnp.concatenate([p["gru/reset_gate_t_b"], p["gru/update_gate_t_b"], zeros])
        hp = {"w_ih_t": p["gru/i2h_w"].T, "b": b, "b_o": p["gru/output_gate_t_b"]}
        if linear_before_reset:
            hp["w_hh_t"] = jnp.concatenate([p[f"{fc}_w"] for fc in _GRU_FCS]).T  # one matmul per step
        else:
            hp["w_ru_t"] = jnp.concatenate([p[f"{fc}_w"] for fc in _GRU_FCS[:2]]).T
            hp["w_o_t"] = p["gru/output_gate_t_w"].T
        return hp

    def hand_forward(hp, inputs):
        xp = _project(inputs["x"], hp["w_ih_t"], hp["b"])
        hidden = inputs["h0"].shape[-1]
        lengths = inputs["seq_lengths"]

        def step(h, xs):
            xp_t, t = xs
            if linear_before_reset:
                hh = h @ hp["w_hh_t"]
                ru = jax.nn.sigmoid(xp_t[:, : 2 * hidden] + hh[:, : 2 * hidden])
                r, u = ru[:, :hidden], ru[:, hidden:]
                o = jnp.tanh(xp_t[:, 2 * hidden :] + r * (hh[:, 2 * hidden :] + hp["b_o"]))
            else:
                ru = jax.nn.sigmoid(xp_t[:, : 2 * hidden] + h @ hp["w_ru_t"])
                r, u = ru[:, :hidden], ru[:, hidden:]
                o = jnp.tanh(xp_t[:, 2 * hidden :] + (r * h) @ hp["w_o_t"] + hp["b_o"])
            h_new = _masked(t < lengths, u * h + (1 - u) * o, h)
            return h_new, h_new

        _, hs = jax.lax.scan(step, inputs["h0"][0], (xp, jnp.arange(xp.shape[0])))
        return hs

    def torch_params(p):
        # gate order r, u, o is PyTorch's r, z, n
        return {
            "weight_ih_l0": p["gru/i2h_w"],
            "bias_ih_l0": p["gru/i2h_b"],
            "weight_hh_l0": jnp.concatenate([p[f"{fc}_w"] for fc in _GRU_FCS]),
            "bias_hh_l0": jnp.concatenate([p[f"{fc}_b"] for fc in _GRU_FCS]),
        }

    def torch_module(hidden: int):
        import torch

        return torch.nn.GRU(hidden, hidden)

    def torch_forward(module, t):
        return module(t["x"], t["h0"])[0]

    with_torch = linear_before_reset
    return Model(
        name="gru" if linear_before_reset else "gru_reset_first",
        description=(
            "gru_cell.GRU, linear_before_reset=True (PyTorch's maths)"
            if linear_before_reset
            else "gru_cell.GRU, Caffe2's default (reset before the matmul; no PyTorch equivalent)"
        ),
        build=build,
        inputs=lambda t, n, h, rng: _sequence_inputs(t, n, h, rng, ["h0"]),
        grad_inputs=("x",),
        hand_params=hand_params,
        hand_forward=hand_forward,
        torch_params=torch_params if with_torch else None,
        torch_module=torch_module if with_torch else None,
        torch_forward=torch_forward if with_torch else None,
    )


# ------------------------------------------------------------------------------------------------
# LSTM with attention (decoder over an encoder output)


def _attention_model() -> Model:
    scope = "att"

    def build(model: ModelHelper, hidden: int, forward_only: bool) -> str:
        rnn_cell.LSTMWithAttention(
            model,
            "x",
            "seq_lengths",
            "h0",
            "c0",
            "ctx0",
            hidden,
            "enc",
            None,
            hidden,
            hidden,
            scope=scope,
            attention_type=attention.AttentionType.Regular,
            forward_only=forward_only,
        )
        return f"{scope}/states_and_context_combination"  # concat(hidden_t_external_all, context_all)

    def inputs(steps, batch, hidden, rng):
        values = _sequence_inputs(steps, batch, hidden, rng, ["h0", "c0", "ctx0"])
        values["enc"] = rng.standard_normal((steps, batch, hidden)).astype(np.float32)  # encoder length = T
        return values

    def hand_params(p):
        hidden = p[f"{scope}/decoder/gates_t_w"].shape[0] // 4
        w_g_t = p[f"{scope}/decoder/gates_t_w"].T  # [H + De, 4H]: split so the step needs no concat
        return {
            "w_ih_t": p[f"{scope}/decoder/i2h_w"].T,
            "b": p[f"{scope}/decoder/i2h_b"] + p[f"{scope}/decoder/gates_t_b"],
            "w_hh_t": w_g_t[:hidden],
            "w_ch_t": w_g_t[hidden:],
            "w_enc_t": p[f"{scope}/weighted_encoder_outputs_w"].T,
            "b_enc": p[f"{scope}/weighted_encoder_outputs_b"],
            "w_dec_t": p[f"{scope}/weighted_decoder_hidden_state_w"].T,
            "b_dec": p[f"{scope}/weighted_decoder_hidden_state_b"],
            "v": p[f"{scope}/attention_logits_w"][0],
            "v_b": p[f"{scope}/attention_logits_b"][0],
        }

    def hand_forward(hp, inputs):
        xp = _project(inputs["x"], hp["w_ih_t"], hp["b"])
        enc = jnp.swapaxes(inputs["enc"], 0, 1)  # [N, Te, De], batch-major for the per-step contractions
        wenc = _project(enc, hp["w_enc_t"], hp["b_enc"])  # [N, Te, De]
        lengths = inputs["seq_lengths"]

        def step(carry, xs):
            h, c, ctx = carry
            xp_t, t = xs
            h_new, c_new = _lstm_cell(xp_t + h @ hp["w_hh_t"] + ctx @ hp["w_ch_t"], c)
            valid = t < lengths
            h, c = _masked(valid, h_new, h), _masked(valid, c_new, c)
            summed = jnp.tanh(wenc + (h @ hp["w_dec_t"] + hp["b_dec"])[:, None, :])
            weights = jax.nn.softmax(summed @ hp["v"] + hp["v_b"], axis=1)  # [N, Te]
            ctx = jnp.einsum("nt,ntd->nd", weights, enc)
            return (h, c, ctx), jnp.concatenate([h, ctx], axis=-1)

        init = (inputs["h0"][0], inputs["c0"][0], inputs["ctx0"][0])
        _, out = jax.lax.scan(step, init, (xp, jnp.arange(xp.shape[0])))
        return out

    return Model(
        name="attention",
        description="rnn_cell.LSTMWithAttention, regular attention, encoder length T (no PyTorch built-in)",
        build=build,
        inputs=inputs,
        grad_inputs=("x", "enc"),
        hand_params=hand_params,
        hand_forward=hand_forward,
        # built with freeze_bias=True: never trained, and its exact gradient is 0 (softmax ignores a shift of all
        # logits), so every framework returns rounding noise of a sum over T*N*T terms there
        frozen=(f"{scope}/attention_logits_b",),
    )


MODELS: dict[str, Callable[[], Model]] = {
    "lstm": lambda: _lstm_model(1),
    "gru": lambda: _gru_model(True),
    "lstm2": lambda: _lstm_model(2),
    "attention": _attention_model,
    "gru_reset_first": lambda: _gru_model(False),
}
DEFAULT_MODELS = ("lstm", "gru", "lstm2", "attention")
