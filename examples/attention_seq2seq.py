"""An encoder-decoder with attention, built and trained the way Caffe2's seq2seq models were, run by rnn2jax.

Encoder: embeddings (Gather) -> a bidirectional LSTM: one LSTM over the sequence, one over the sequence
reversed per row (ReversePackedSegs, which honours each row's length), its outputs reversed back, and
the two concatenated into [T_enc, N, 2H]. Decoder: embeddings -> LSTMWithAttention over the encoder
outputs -> Concat(state, context) -> FC(axis=2) -> logits.

Training follows caffe2/python/models/seq2seq/train.py: SoftmaxWithLoss over the logits against the
target ids, weighted by a mask of the real (not padding) positions, times the number of words over the
batch size; `get_backward_pass` (Caffe2's `AddGradientOperators`) for the gradient ops, in which each
embedding Gather's gradient is a GradientSlice (the ids and the gradient of the embedded rows); then
train.py's update: the gradients are scaled to a global norm of at most `max_norm` (the dense ones and
the sparse ones separately) and applied with WeightedSum, or ScatterWeightedSum for a GradientSlice,
which updates only the rows the batch looked up. A `rnn2jax.Workspace` runs the init net once and the
training net once per batch, as Caffe2's workspace did, on a toy task: reverse the source sequence.
The forward net then runs with the trained parameters.

    python examples/attention_seq2seq.py [--small] [--attention regular|recurrent|dot] [--steps N]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np

import rnn2jax
from rnn2jax.caffe2.python import brew
from rnn2jax.caffe2.python.attention import AttentionType
from rnn2jax.caffe2.python.core import BlobReference
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM, LSTMWithAttention
from rnn2jax.caffe2.python.scope import NameScope as name_scope
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.proto import caffe2_pb2 as pb

PAD, GO, EOS = 0, 1, 2  # seq2seq_util's special token ids; the other ids are "words"


@dataclass(frozen=True)
class Sizes:
    vocab: int
    embed: int
    hidden: int
    max_len: int  # longest source sentence: T_enc = max_len, T_dec = max_len + 1 (GO / EOS)
    batch: int
    steps: int
    learning_rate: float
    max_norm: float


SIZES = {
    "small": Sizes(vocab=12, embed=8, hidden=16, max_len=5, batch=16, steps=60, learning_rate=1.0, max_norm=5.0),
    "default": Sizes(vocab=24, embed=32, hidden=64, max_len=8, batch=32, steps=300, learning_rate=1.0, max_norm=5.0),
}

LOSS = "total_loss_scalar_weighted"


def bidirectional_lstm(model: ModelHelper, embedded: str, lengths: str, embed: int, hidden: int) -> str:
    """[T, N, E] -> [T, N, 2H]: forward and backward LSTM outputs, concatenated per step."""
    forward, *_ = LSTM(model, embedded, lengths, ("enc_h0", "enc_c0"), embed, hidden, scope="encoder/fwd")
    reversed_in = model.net.ReversePackedSegs([embedded, lengths], "encoder/reversed_embedded")
    backward, *_ = LSTM(model, reversed_in, lengths, ("enc_h0", "enc_c0"), embed, hidden, scope="encoder/bwd")
    backward = model.net.ReversePackedSegs([backward, lengths], "encoder/bwd/outputs_reversed")
    outputs, _ = model.net.Concat([forward, backward], ["encoder/outputs", "encoder/outputs_dims"], axis=2)
    return outputs


def build(sizes: Sizes, attention: AttentionType) -> tuple[ModelHelper, str]:
    """The seq2seq forward net up to the logits [T_dec, N, V]; returns the model and the logits blob."""
    vocab, embed, hidden = sizes.vocab, sizes.embed, sizes.hidden
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
    return model, brew.fc(model, features, "decoder/logits", dim_in=3 * hidden, dim_out=vocab, axis=2)


def predict_net(model: ModelHelper, logits: str) -> tuple[pb.NetDef, str]:
    """A copy of the forward net with a Softmax(axis=2) on the logits; returns it and the softmax blob."""
    net = pb.NetDef()
    net.CopyFrom(model.net.Proto())
    net.op.add(type="Softmax", input=[logits], output=["decoder/softmax"]).arg.add(name="axis", i=2)
    return net, "decoder/softmax"


def add_loss(model: ModelHelper, logits: str, sizes: Sizes) -> str:
    """train.py's loss: the summed per-word cross entropy over the real target words, over the batch size."""
    net = model.net
    logits_2d, _ = net.Reshape(logits, ["decoder/logits_2d", "decoder/logits_old_shape"], shape=[-1, sizes.vocab])
    targets, _ = net.Reshape("targets", ["targets_1d", "targets_old_shape"], shape=[-1])
    weights, _ = net.Reshape("target_weights", ["target_weights_1d", "target_weights_old_shape"], shape=[-1])
    _, loss_per_word = net.SoftmaxWithLoss(
        [logits_2d, targets, weights], ["OutputProbs_INVALID", "loss_per_word"], only_loss=True
    )
    num_words = net.SumElements(weights, "num_words")
    total = net.Mul([loss_per_word, num_words], "total_loss_scalar")
    return net.Scale(total, LOSS, scale=1.0 / sizes.batch)


def add_gradients(model: ModelHelper, loss: str) -> dict[str, str | tuple[str, str]]:
    """`model.AddGradientOperators([loss])`: appends the gradient ops and returns param -> gradient,
    a blob, or (indices, values) for a GradientSlice (the embeddings' Gather)."""
    ops, grad_map = get_backward_pass(list(model.net.Proto().op), [loss])
    model.net.Proto().op.extend(ops)
    grads = {}
    for param in model.params:  # blob references, as Caffe2's param_to_grad held: name scopes keep them
        grad = grad_map[param]
        grads[str(param)] = tuple(map(BlobReference, grad)) if isinstance(grad, tuple) else BlobReference(grad)
    return grads


def add_clipped_sgd(model: ModelHelper, grads: dict, params: list[str], sizes: Sizes, scope: str) -> None:
    """train.py's norm_clipped_(sparse_)grad_update: scale the gradients of `params` to a global norm of
    at most max_norm, then param += -lr * ratio * grad (ScatterWeightedSum for a GradientSlice)."""
    net, init = model.net, model.param_init_net
    one = init.ConstantFill([], "ONE", shape=[1], value=1.0)
    learning_rate = init.ConstantFill([], "learning_rate", shape=[1], value=sizes.learning_rate)
    with name_scope(scope):
        squared_sums = []
        for i, param in enumerate(params):
            values = grads[param][1] if isinstance(grads[param], tuple) else grads[param]
            squared = net.Sqr(values, f"grad_{i}_squared")
            squared_sums.append(net.SumElements(squared, f"grad_{i}_squared_sum"))
        norm = net.Pow(net.Sum(squared_sums, "grad_squared_full_sum"), "global_norm", exponent=0.5)
        clip_norm = init.ConstantFill([], "clip_norm", shape=[], value=sizes.max_norm)
        ratio = net.Div([clip_norm, net.Max([norm, clip_norm], "max_norm")], "norm_ratio")
    negative_lr = net.Negative(learning_rate, "negative_learning_rate")
    with name_scope(scope):
        coeff = net.Mul([negative_lr, ratio], "update_coeff", broadcast=1)
    for param in params:
        grad = grads[param]
        if isinstance(grad, tuple):
            indices, values = grad
            net.ScatterWeightedSum([param, one, indices, values, coeff], param)
        else:
            net.WeightedSum([param, one, grad, coeff], param)


def build_training(sizes: Sizes, attention: AttentionType) -> tuple[ModelHelper, pb.NetDef, dict, int]:
    """The training model (forward ops, loss, gradient ops, updates), the forward net, the gradients, and
    how many ops of the training net compute the loss (the gradient ops follow them)."""
    model, logits = build(sizes, attention)
    predict, _ = predict_net(model, logits)
    loss = add_loss(model, logits, sizes)
    loss_ops = len(model.net.Proto().op)
    grads = add_gradients(model, loss)
    dense = [p for p, g in grads.items() if not isinstance(g, tuple)]
    sparse = [p for p, g in grads.items() if isinstance(g, tuple)]
    add_clipped_sgd(model, grads, dense, sizes, scope="norm_clipped_grad_update")
    add_clipped_sgd(model, grads, sparse, sizes, scope="norm_clipped_sparse_grad_update")
    return model, predict, grads, loss_ops


def reverse_batch(sizes: Sizes, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A batch of the toy task, laid out as train.py's prepare_batch did ([T, N], time-major, padded):
    the decoder reads GO + target and must predict target + EOS, where target is the source reversed."""
    n, h, t = sizes.batch, sizes.hidden, sizes.max_len
    lengths = rng.integers(1, t + 1, size=n).astype(np.int32)
    lengths[0] = t
    encoder_inputs = np.full((t, n), PAD, np.int32)
    decoder_inputs = np.full((t + 1, n), PAD, np.int32)
    targets = np.full((t + 1, n), PAD, np.int32)
    for i, length in enumerate(lengths):
        source = rng.integers(EOS + 1, sizes.vocab, size=length)
        encoder_inputs[:length, i] = source
        decoder_inputs[: length + 1, i] = [GO, *source[::-1]]
        targets[: length + 1, i] = [*source[::-1], EOS]
    zeros = np.zeros((1, n, h), np.float32)
    return {
        "encoder_inputs": encoder_inputs,
        "encoder_lengths": lengths,
        "decoder_inputs": decoder_inputs,
        "decoder_lengths": lengths + 1,
        "targets": targets,
        "target_weights": (targets != PAD).astype(np.float32),
        "enc_h0": zeros,
        "enc_c0": zeros,
        "dec_h0": zeros,
        "dec_c0": zeros,
        "dec_ctx0": np.zeros((1, n, 2 * h), np.float32),
    }


def train(sizes: Sizes, attention: AttentionType, steps: int, seed: int = 0) -> tuple[list[float], dict, pb.NetDef]:
    """Runs the training net `steps` times in a Workspace; returns the losses, the trained parameters
    (every blob the init net writes) and the forward net."""
    model, predict, grads, loss_ops = build_training(sizes, attention)
    n_forward = len(predict.op) - 1
    kinds = sorted({op.type for op in model.net.Proto().op[loss_ops:] if "Gradient" in op.type})
    print(
        f"training net: {n_forward} forward ops, {loss_ops - n_forward} loss ops, "
        f"{len(model.net.Proto().op) - loss_ops} gradient and update ops"
    )
    print(f"gradient ops: {', '.join(kinds)}")
    sparse = {p: g for p, g in grads.items() if isinstance(g, tuple)}
    print("sparse gradients (GradientSlice): " + ", ".join(f"{p} <- {tuple(map(str, g))}" for p, g in sparse.items()))
    rng = np.random.default_rng(seed)
    ws = rnn2jax.Workspace(seed=seed)
    ws.run(model.param_init_net.Proto())
    for name, value in reverse_batch(sizes, rng).items():
        ws.feed(name, value)
    net = ws.create_net(model.net.Proto())
    losses = []
    start = time.perf_counter()
    for i in range(steps):
        for blob, value in reverse_batch(sizes, rng).items():
            ws.feed(blob, value)
        ws.run_net(net)
        losses.append(float(ws.fetch(LOSS)))
        if i % max(1, steps // 10) == 0 or i == steps - 1:
            print(f"step {i:4d}  loss {losses[-1]:.4f}")
            if i == 0:
                print(f"first step (compiles the training net): {time.perf_counter() - start:.1f} s")
    print(f"{steps} steps in {time.perf_counter() - start:.1f} s")
    params = {out: ws.fetch(out) for op in model.param_init_net.Proto().op for out in op.output}
    return losses, params, predict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small sizes and fewer steps (a quick run)")
    parser.add_argument("--attention", choices=("regular", "recurrent", "dot"), default="regular")
    parser.add_argument("--steps", type=int, help="training steps (default: 60 with --small, else 300)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = SIZES["small" if args.small else "default"]
    attention = {"regular": AttentionType.Regular, "recurrent": AttentionType.Recurrent}.get(
        args.attention, AttentionType.Dot
    )
    losses, params, predict = train(sizes, attention, args.steps or sizes.steps, seed=args.seed)
    first, last = losses[0], float(np.mean(losses[-5:]))
    print(f"first loss {first:.4f}, final loss (mean of last 5) {last:.4f}")
    assert last < 0.7 * first, f"the loss did not fall by 30%: {first:.4f} -> {last:.4f}"
    print("the loss fell: ok")

    # The forward net (Softmax instead of the loss) with the trained parameters, on a fresh batch.
    recurrent = sum(op.type == "RecurrentNetwork" for op in predict.op)
    print(f"forward net: {len(predict.op)} ops, {recurrent} RecurrentNetwork ops")
    softmax = predict.op[-1].output[0]
    fn = rnn2jax.compile(predict, params=params, outputs=[softmax])
    batch = reverse_batch(sizes, np.random.default_rng(args.seed + 1))
    inputs = {k: v for k, v in batch.items() if k in fn.input_names}
    prob = np.asarray(fn.apply(fn.params, inputs)[softmax])
    print(f"output '{softmax}' {prob.shape}, rows sum to 1: {np.allclose(prob.sum(-1), 1, atol=1e-5)}")
    assert prob.shape == (sizes.max_len + 1, sizes.batch, sizes.vocab)
    mask = batch["target_weights"] > 0
    accuracy = float(np.mean(prob.argmax(-1)[mask] == batch["targets"][mask]))
    print(f"next-word accuracy with teacher forcing on a fresh batch: {accuracy:.2f}")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
