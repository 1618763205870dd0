"""A character-level LSTM language model, built and trained the way Caffe2's char_rnn example did it.

The forward net is built with `rnn2jax.caffe2` (one-hot input [T, N, V] -> LSTM -> FC(axis=2) ->
Softmax(axis=2) -> Reshape -> LabelCrossEntropy -> AveragedLoss). Its backward ops, including the
hand-written RecurrentNetworkGradient, come from `get_backward_pass`, exactly as Caffe2's
`model.AddGradientOperators` made them. The training net compiles into one pure function, which is
jitted together with an SGD update. The model is then sampled from the compiled forward net.

    python examples/char_lstm.py            # default size, well under a minute on 2 CPU cores
    python examples/char_lstm.py --small    # a quick run
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import rnn2jax
from rnn2jax.caffe2.python import brew
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.proto import caffe2_pb2 as pb

TEXT = """\
the quick brown fox jumps over the lazy dog.
the lazy dog sleeps in the sun, and the quick brown fox runs away.
a fox is quick and a dog is lazy; the fox jumps and the dog sleeps.
the sun is warm, the day is long, and the brown fox jumps over the dog again.
"""


@dataclass(frozen=True)
class Sizes:
    hidden: int
    steps: int
    batch: int
    seq_len: int
    learning_rate: float


SIZES = {
    "small": Sizes(hidden=32, steps=150, batch=8, seq_len=16, learning_rate=2.0),
    "default": Sizes(hidden=64, steps=400, batch=16, seq_len=25, learning_rate=2.0),
}


def build_model(vocab: int, hidden: int) -> tuple[ModelHelper, pb.NetDef, dict[str, str]]:
    """The forward net in Caffe2's form. Returns the model, its predict net (the ops up to the
    softmax, which sampling runs) and the names of the blobs sampling reads."""
    model = ModelHelper(name="char_rnn")
    hidden_all, hidden_last, _, cell_last = LSTM(
        model, "input_blob", "seq_lengths", ("hidden_init", "cell_init"), vocab, hidden, scope="LSTM"
    )
    logits = brew.fc(model, hidden_all, "logits", dim_in=hidden, dim_out=vocab, axis=2)
    softmax = model.net.Softmax(logits, "softmax", axis=2)
    predict = pb.NetDef()
    predict.CopyFrom(model.net.Proto())
    reshaped, _ = model.net.Reshape(softmax, ["softmax_reshaped", "_"], shape=[-1, vocab])
    xent = model.net.LabelCrossEntropy([reshaped, "target"], "xent")
    model.net.AveragedLoss(xent, "loss")
    return model, predict, {"softmax": softmax, "hidden_last": hidden_last, "cell_last": cell_last}


def training_net(model: ModelHelper) -> tuple[pb.NetDef, dict[str, str]]:
    """The forward net followed by its gradient ops; returns it and the map param -> gradient blob."""
    proto = pb.NetDef()
    proto.CopyFrom(model.net.Proto())
    backward, grad_map = get_backward_pass(list(proto.op), {"loss": None})
    proto.op.extend(backward)
    return proto, {str(p): grad_map[str(p)] for p in model.params}


def batches(data: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator):
    """Random windows of the text: inputs [T, N] and next-character targets [T, N]."""
    while True:
        starts = rng.integers(0, len(data) - seq_len - 1, size=batch)
        window = np.stack([data[s : s + seq_len + 1] for s in starts], axis=1)
        yield window[:-1], window[1:]


def train(sizes: Sizes, text: str, seed: int = 0) -> tuple[list[float], dict, pb.NetDef, dict, list[str]]:
    """Train with SGD; returns the losses, the trained parameters, the forward net, its blob names and
    the vocabulary."""
    chars = sorted(set(text))
    vocab = len(chars)
    data = np.array([chars.index(c) for c in text], np.int32)
    model, predict, blobs = build_model(vocab, sizes.hidden)
    proto, grads = training_net(model)
    print(f"vocabulary {vocab} characters, text {len(text)} characters")
    print(
        f"training net: {len(model.net.Proto().op)} forward ops + {len(proto.op) - len(model.net.Proto().op)} "
        f"gradient ops ({', '.join(sorted({op.type for op in proto.op if 'Gradient' in op.type}))})"
    )
    names = list(grads)
    train_fn = rnn2jax.compile(
        proto, init_net=model.param_init_net.Proto(), outputs=["loss", *(grads[p] for p in names)], seed=seed
    )
    eye = jnp.eye(vocab, dtype=jnp.float32)
    zeros = jnp.zeros((1, sizes.batch, sizes.hidden), jnp.float32)
    lengths = jnp.full((sizes.batch,), sizes.seq_len, jnp.int32)

    @jax.jit
    def step(params, x, y):
        inputs = {
            "input_blob": eye[x],
            "target": y.reshape(-1),
            "seq_lengths": lengths,
            "hidden_init": zeros,
            "cell_init": zeros,
        }
        out = train_fn.apply(params, inputs)
        # Plain SGD with the gradient norm clipped at 5, as char_rnn examples usually did.
        g = {p: out[grads[p]] for p in names}
        norm = jnp.sqrt(sum(jnp.sum(v * v) for v in g.values()))
        scale = sizes.learning_rate * jnp.minimum(1.0, 5.0 / (norm + 1e-6))
        return {p: params[p] - scale * g[p] for p in names}, out["loss"]

    params = {p: jnp.asarray(train_fn.params[p]) for p in names}
    rng = np.random.default_rng(seed)
    losses = []
    start = time.perf_counter()
    for i, (x, y) in zip(range(sizes.steps), batches(data, sizes.batch, sizes.seq_len, rng), strict=False):
        params, loss = step(params, x, y)
        losses.append(float(loss))
        if i % max(1, sizes.steps // 10) == 0 or i == sizes.steps - 1:
            print(f"step {i:4d}  loss {losses[-1]:.4f}")
    print(f"{sizes.steps} steps in {time.perf_counter() - start:.1f} s")
    return losses, params, predict, blobs, chars


def sample(
    net: pb.NetDef, blobs: dict, params: dict, chars: list[str], hidden: int, seed_text: str, length: int
) -> str:
    """Greedy decoding, one character at a time, with the forward net run for T = 1, N = 1."""
    predict = rnn2jax.compile(net, outputs=[blobs["softmax"], blobs["hidden_last"], blobs["cell_last"]])
    run = jax.jit(predict.apply)
    eye = np.eye(len(chars), dtype=np.float32)
    h = c = np.zeros((1, 1, hidden), np.float32)
    text, prob = seed_text, None
    for i in range(len(seed_text) + length):
        ch = seed_text[i] if i < len(seed_text) else chars[int(np.argmax(prob))]
        if i >= len(seed_text):
            text += ch
        inputs = {
            "input_blob": eye[[chars.index(ch)]][None],
            "seq_lengths": np.ones((1,), np.int32),
            "hidden_init": h,
            "cell_init": c,
        }
        out = run(params, inputs)
        prob = np.asarray(out[blobs["softmax"]])[0, 0]
        h, c = out[blobs["hidden_last"]], out[blobs["cell_last"]]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="fewer steps and smaller sizes (a quick run)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = SIZES["small" if args.small else "default"]
    losses, params, net, blobs, chars = train(sizes, TEXT, seed=args.seed)
    first, last = losses[0], float(np.mean(losses[-10:]))
    print(f"first loss {first:.4f}, final loss (mean of last 10) {last:.4f}")
    assert last <= first / 2, f"the loss did not halve: {first:.4f} -> {last:.4f}"
    print("the loss halved: ok")
    text = sample(net, blobs, params, chars, sizes.hidden, seed_text="the ", length=60)
    print(f"greedy sample: {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
