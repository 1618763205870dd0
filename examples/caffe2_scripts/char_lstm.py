"""A character-level LSTM language model written against Caffe2's plain Python API.

The same file runs on real Caffe2 and on rnn2jax:

    python char_lstm.py --iters 200                   # real Caffe2 (torch<=1.10 wheel)
    python -m rnn2jax exec char_lstm.py --iters 200   # rnn2jax: `import caffe2` resolves to rnn2jax

Every random number comes from NumPy with a fixed seed: parameters are created by `param_init_net`
(so their names and shapes are Caffe2's), then overwritten with values drawn from a seeded
`RandomState`, and the training windows are drawn from a second one. Two runs with the same
arguments therefore train on the same data from the same starting point, on either backend, and
their saved parameters (`--save run.npz`) can be compared blob by blob.

Model: one-hot characters [T, N, V] -> rnn_cell.LSTM -> FC(axis=2) -> Softmax(axis=2) ->
Reshape [T*N, V] -> LabelCrossEntropy -> AveragedLoss; gradients from AddGradientOperators and the
update from optimizer.build_sgd.
"""

import argparse
import time

import numpy as np
from caffe2.python import brew, model_helper, optimizer, rnn_cell, workspace

TEXT = (
    "a small lstm reads this text one character at a time and learns to guess the next one.\n"
    "the quick brown fox jumps over the lazy dog; the lazy dog sleeps in the warm sun.\n"
    "to be or not to be, that is the question the network does not need to answer.\n"
    "one two three four five six seven eight nine ten, and then we count back down again.\n"
)


def parse_args(argv=None):
    """The command line shared by both example scripts (iterations, seed, where to save)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=300, help="training iterations (RunNet calls)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the initial parameters and the data")
    parser.add_argument("--save", metavar="PATH", help="write the final parameters and the loss history (.npz)")
    parser.add_argument("--hidden", type=int, default=32, help="LSTM state size")
    parser.add_argument("--seq-len", type=int, default=20, help="characters per training window (T)")
    parser.add_argument("--batch", type=int, default=8, help="windows per batch (N)")
    parser.add_argument("--lr", type=float, default=2.0, help="base learning rate")
    parser.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (0: WeightedSum update)")
    parser.add_argument("--print-every", type=int, default=10, help="print the loss every N iterations")
    return parser.parse_args(argv)


class Vocabulary:
    """Maps characters to ids and back; ids are assigned in sorted order so they never depend on hashing."""

    def __init__(self, text):
        self.chars = sorted(set(text))
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def __len__(self):
        return len(self.chars)

    def encode(self, text):
        return np.array([self.ids[c] for c in text], dtype=np.int32)


def build_model(vocab_size, hidden, lr, momentum):
    """Builds the training model; returns (model, name of the loss blob, name of the last hidden state)."""
    model = model_helper.ModelHelper(name="char_lstm")
    # The LSTM reads [T, N, V] one-hot rows; lengths and initial states are fed every iteration.
    hidden_all, hidden_last, _, _ = rnn_cell.LSTM(
        model,
        "input_blob",
        "seq_lengths",
        ("hidden_init", "cell_init"),
        vocab_size,
        hidden,
        scope="LSTM",
    )
    logits = brew.fc(model, hidden_all, "logits", dim_in=hidden, dim_out=vocab_size, axis=2)
    softmax = model.net.Softmax(logits, "softmax", axis=2)
    softmax_2d, _ = model.net.Reshape(softmax, ["softmax_2d", "softmax_old_shape"], shape=[-1, vocab_size])
    xent = model.net.LabelCrossEntropy([softmax_2d, "target"], "xent")
    loss = model.net.AveragedLoss(xent, "loss")
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=lr, policy="fixed", momentum=momentum)
    return model, str(loss), str(hidden_last)


def seed_parameters(model, seed):
    """Overwrites every parameter `param_init_net` created with NumPy draws from one seeded stream.

    Parameters are visited in sorted-name order so the assignment of draws to blobs is fixed by the
    names alone; weights get U(-0.15, 0.15), biases a smaller U(-0.05, 0.05).
    """
    rs = np.random.RandomState(seed)
    for name in sorted(str(p) for p in model.params):
        shape = workspace.FetchBlob(name).shape
        scale = 0.05 if name.endswith("_b") else 0.15
        workspace.FeedBlob(name, rs.uniform(-scale, scale, size=shape).astype(np.float32))


def make_batch(rs, data, vocab_size, seq_len, batch):
    """Random windows of the text: one-hot inputs [T, N, V] and next-character targets [T*N]."""
    starts = rs.randint(0, len(data) - seq_len - 1, size=batch)
    windows = np.stack([data[s : s + seq_len + 1] for s in starts], axis=1)  # [T+1, N]
    inputs = np.zeros((seq_len, batch, vocab_size), dtype=np.float32)
    inputs[np.arange(seq_len)[:, None], np.arange(batch)[None, :], windows[:-1]] = 1.0
    targets = windows[1:].reshape(-1).astype(np.int32)  # row t*N + n, matching the Reshape above
    return inputs, targets


def main(argv=None):
    args = parse_args(argv)
    vocab = Vocabulary(TEXT)
    data = vocab.encode(TEXT)
    V, H, T, N = len(vocab), args.hidden, args.seq_len, args.batch

    workspace.ResetWorkspace()
    model, loss, _ = build_model(V, H, args.lr, args.momentum)
    workspace.RunNetOnce(model.param_init_net)
    seed_parameters(model, args.seed)

    data_rs = np.random.RandomState(args.seed + 1)
    workspace.FeedBlob("seq_lengths", np.full(N, T, dtype=np.int32))
    workspace.FeedBlob("hidden_init", np.zeros((1, N, H), dtype=np.float32))
    workspace.FeedBlob("cell_init", np.zeros((1, N, H), dtype=np.float32))
    inputs, targets = make_batch(data_rs, data, V, T, N)
    workspace.FeedBlob("input_blob", inputs)
    workspace.FeedBlob("target", targets)
    workspace.CreateNet(model.net)

    losses = []
    start = time.time()
    for it in range(1, args.iters + 1):
        if it > 1:
            inputs, targets = make_batch(data_rs, data, V, T, N)
            workspace.FeedBlob("input_blob", inputs)
            workspace.FeedBlob("target", targets)
        workspace.RunNet(model.net.Name())
        losses.append(float(workspace.FetchBlob(loss)))
        if args.print_every and (it % args.print_every == 0 or it == 1):
            print(f"iter {it:5d}  loss {losses[-1]:.4f}  ({time.time() - start:.1f}s)", flush=True)

    if args.save:
        blobs = {str(p): workspace.FetchBlob(str(p)) for p in model.GetParams()}
        np.savez(args.save, loss_history=np.array(losses, dtype=np.float64), **blobs)
        print(f"saved {len(blobs)} parameters to {args.save}")
    return losses


if __name__ == "__main__":
    main()
