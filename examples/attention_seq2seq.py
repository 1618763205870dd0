"""An encoder-decoder with attention, in the form of Caffe2's seq2seq models, compiled to JAX.

Encoder: embeddings (Gather) -> a bidirectional LSTM: one LSTM over the sequence, one over the sequence
reversed per row (ReversePackedSegs, which honours each row's length), its outputs reversed back, and
the two concatenated into [T_enc, N, 2H]. Decoder: embeddings -> LSTMWithAttention over the encoder
outputs -> Concat(state, context) -> FC(axis=2) -> Softmax(axis=2). The net is compiled once with
`rnn2jax.compile`, jitted, and run on random token ids with random encoder lengths.

    python examples/attention_seq2seq.py [--small] [--attention regular|recurrent|dot]
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

import rnn2jax
from rnn2jax.caffe2 import LSTM, AttentionType, LSTMWithAttention, ModelHelper, brew

SIZES = {
    "small": {"vocab": 12, "embed": 8, "hidden": 8, "enc_steps": 5, "dec_steps": 4, "batch": 2},
    "default": {"vocab": 200, "embed": 64, "hidden": 128, "enc_steps": 30, "dec_steps": 25, "batch": 16},
}


def bidirectional_lstm(model: ModelHelper, embedded: str, lengths: str, embed: int, hidden: int) -> str:
    """[T, N, E] -> [T, N, 2H]: forward and backward LSTM outputs, concatenated per step."""
    forward, *_ = LSTM(model, embedded, lengths, ("enc_h0", "enc_c0"), embed, hidden, scope="encoder/fwd")
    reversed_in = model.net.ReversePackedSegs([embedded, lengths], "encoder/reversed_embedded")
    backward, *_ = LSTM(model, reversed_in, lengths, ("enc_h0", "enc_c0"), embed, hidden, scope="encoder/bwd")
    backward = model.net.ReversePackedSegs([backward, lengths], "encoder/bwd/outputs_reversed")
    outputs, _ = model.net.Concat([forward, backward], ["encoder/outputs", "encoder/outputs_dims"], axis=2)
    return outputs


def build(sizes: dict, attention: AttentionType) -> tuple[ModelHelper, str]:
    """The seq2seq forward net; returns the model and its output (decoder softmax) blob."""
    vocab, embed, hidden = sizes["vocab"], sizes["embed"], sizes["hidden"]
    model = ModelHelper(name="seq2seq")
    gauss = ("GaussianFill", {"std": 0.1})
    enc_emb = model.create_param("encoder_embeddings", [vocab, embed], gauss)
    dec_emb = model.create_param("decoder_embeddings", [vocab, embed], gauss)
    enc_in = model.net.Gather([enc_emb, "encoder_inputs"], "encoder/embedded")
    encoder_outputs = bidirectional_lstm(model, enc_in, "encoder_lengths", embed, hidden)
    dec_in = model.net.Gather([dec_emb, "decoder_inputs"], "decoder/embedded")
    decoder_outputs = LSTMWithAttention(
        model,
        dec_in,
        "decoder_lengths",
        "dec_h0",
        "dec_c0",
        "dec_ctx0",
        encoder_output_dim=2 * hidden,
        encoder_outputs=encoder_outputs,
        encoder_lengths="encoder_lengths",
        decoder_input_dim=embed,
        decoder_state_dim=hidden,
        scope="decoder",
        attention_type=attention,
    )
    # As Caffe2's seq2seq did: the output projection sees the decoder state and the attention context
    # (outputs 0 and 4, the two outputs LSTMWithAttention declares gradients for).
    features, _ = model.net.Concat(
        [decoder_outputs[0], decoder_outputs[4]], ["decoder/features", "decoder/features_dims"], axis=2
    )
    logits = brew.fc(model, features, "decoder/logits", dim_in=3 * hidden, dim_out=vocab, axis=2)
    return model, model.net.Softmax(logits, "decoder/softmax", axis=2)


def random_inputs(sizes: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n, h, te, td, v = sizes["batch"], sizes["hidden"], sizes["enc_steps"], sizes["dec_steps"], sizes["vocab"]
    enc_len = rng.integers(1, te + 1, size=n).astype(np.int32)
    enc_len[0] = te
    zeros = np.zeros((1, n, h), np.float32)
    return {
        "encoder_inputs": rng.integers(0, v, size=(te, n)).astype(np.int32),
        "encoder_lengths": enc_len,
        "enc_h0": zeros,
        "enc_c0": zeros,
        "decoder_inputs": rng.integers(0, v, size=(td, n)).astype(np.int32),
        "decoder_lengths": np.full((n,), td, np.int32),
        "dec_h0": zeros,
        "dec_c0": zeros,
        "dec_ctx0": np.zeros((1, n, 2 * h), np.float32),
    }


def timed(label: str, fn, *args):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    print(f"{label}: {time.perf_counter() - start:.2f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small sizes (a quick run)")
    parser.add_argument("--attention", choices=("regular", "recurrent", "dot"), default="regular")
    args = parser.parse_args(argv)
    sizes = SIZES["small" if args.small else "default"]
    attention = {"regular": AttentionType.Regular, "recurrent": AttentionType.Recurrent}.get(
        args.attention, AttentionType.Dot
    )
    model, softmax = build(sizes, attention)
    rng = np.random.default_rng(0)
    inputs = random_inputs(sizes, rng)
    recurrent = sum(op.type == "RecurrentNetwork" for op in model.net.proto.op)
    print(f"forward net: {len(model.net.proto.op)} ops, {recurrent} RecurrentNetwork ops")
    fn = rnn2jax.compile(model.net.proto, init_net=model.param_init_net.proto, outputs=[softmax])
    print("parameters: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in fn.params.items()))
    print("inputs: " + ", ".join(f"{k} {v.shape}" for k, v in inputs.items()))
    run = jax.jit(fn.apply)
    timed("forward compile + run", run, fn.params, inputs)
    out = timed("forward run", run, fn.params, inputs)
    prob = np.asarray(out[softmax])
    print(f"output '{softmax}' {prob.shape}, rows sum to 1: {np.allclose(prob.sum(-1), 1, atol=1e-5)}")
    assert prob.shape == (sizes["dec_steps"], sizes["batch"], sizes["vocab"])
    assert np.isfinite(prob).all() and np.allclose(prob.sum(-1), 1, atol=1e-5)

    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
