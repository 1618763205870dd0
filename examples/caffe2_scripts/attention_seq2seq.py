"""A small attention encoder-decoder written against Caffe2's plain Python API: learn to reverse digits.

The same file runs on real Caffe2 and on rnn2jax:

    python attention_seq2seq.py --iters 300                   # real Caffe2 (torch<=1.10 wheel)
    python -m rnn2jax exec attention_seq2seq.py --iters 300   # rnn2jax: `import caffe2` is rnn2jax's

Task: a source row of 3..max_len random digits (padded with PAD) must be answered with the same
digits reversed, followed by EOS. Model: the one-hot source goes through an `rnn_cell.LSTM` encoder
(with the real row lengths); its last hidden and cell states start an `rnn_cell.LSTMWithAttention`
decoder that reads the one-hot target shifted right by GO and attends over the encoder outputs
(masked by the source lengths). Each decoder step's hidden state and attention context are
concatenated and projected to the vocabulary: FC(axis=2) -> Softmax -> LabelCrossEntropy, weighted by
a mask of the real target positions (normalised to sum to 1, so the loss is the mean per token).
Gradients come from AddGradientOperators and the update from optimizer.build_sgd.

All randomness is NumPy's with a fixed seed (parameters: `param_init_net` runs for the names and
shapes, then every parameter is overwritten from a seeded RandomState; data: a second RandomState), so
runs on both backends start from the same point, see the same batches, and can be compared with
`--save run.npz`.
"""

import argparse
import time

import numpy as np
from caffe2.python import brew, model_helper, optimizer, rnn_cell, workspace
from caffe2.python.attention import AttentionType

PAD, GO, EOS = 0, 1, 2
FIRST_DIGIT = 3  # digit d has id FIRST_DIGIT + d
VOCAB = FIRST_DIGIT + 10
ATTENTION = {"regular": AttentionType.Regular, "recurrent": AttentionType.Recurrent, "dot": AttentionType.Dot}


def parse_args(argv=None):
    """Same conventions as char_lstm.py: --iters, --seed, --save PATH, plus the model sizes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=500, help="training iterations (RunNet calls)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the initial parameters and the data")
    parser.add_argument("--save", metavar="PATH", help="write the final parameters and the loss history (.npz)")
    parser.add_argument("--hidden", type=int, default=32, help="encoder and decoder state size")
    parser.add_argument("--max-len", type=int, default=6, help="longest source row (shortest is 3)")
    parser.add_argument("--batch", type=int, default=16, help="rows per batch (N)")
    parser.add_argument("--lr", type=float, default=2.0, help="base learning rate")
    parser.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (0: WeightedSum update)")
    parser.add_argument("--attention", choices=sorted(ATTENTION), default="regular", help="attention type")
    parser.add_argument("--print-every", type=int, default=10, help="print the loss every N iterations")
    return parser.parse_args(argv)


def build_model(hidden, attention, lr, momentum):
    """Builds the training model; returns (model, name of the loss blob)."""
    model = model_helper.ModelHelper(name="attention_seq2seq")
    # Encoder: gradients must reach its last states too (they start the decoder), hence (0, 1, 3).
    encoder_outputs, encoder_hidden_last, _, encoder_cell_last = rnn_cell.LSTM(
        model,
        "encoder_inputs",
        "encoder_lengths",
        ("encoder_hidden_init", "encoder_cell_init"),
        VOCAB,
        hidden,
        scope="encoder",
        outputs_with_grads=(0, 1, 3),
    )
    decoder_outputs = rnn_cell.LSTMWithAttention(
        model,
        decoder_inputs="decoder_inputs",
        decoder_input_lengths="decoder_lengths",
        initial_decoder_hidden_state=encoder_hidden_last,
        initial_decoder_cell_state=encoder_cell_last,
        initial_attention_weighted_encoder_context="initial_attention_context",
        encoder_output_dim=hidden,
        encoder_outputs=encoder_outputs,
        encoder_lengths="encoder_lengths",
        decoder_input_dim=VOCAB,
        decoder_state_dim=hidden,
        scope="decoder",
        attention_type=ATTENTION[attention],
        outputs_with_grads=(0, 4),
    )
    decoder_hidden_all, context_all = decoder_outputs[0], decoder_outputs[4]
    features, _ = model.net.Concat(
        [decoder_hidden_all, context_all], ["decoder_features", "decoder_features_split"], axis=2
    )
    logits = brew.fc(model, features, "logits", dim_in=2 * hidden, dim_out=VOCAB, axis=2)
    softmax = model.net.Softmax(logits, "softmax", axis=2)
    softmax_2d, _ = model.net.Reshape(softmax, ["softmax_2d", "softmax_old_shape"], shape=[-1, VOCAB])
    xent = model.net.LabelCrossEntropy([softmax_2d, "targets"], "xent")
    weighted = model.net.Mul([xent, "target_weights"], "weighted_xent")
    loss = model.net.SumElements(weighted, "loss")
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=lr, policy="fixed", momentum=momentum)
    return model, str(loss)


def seed_parameters(model, seed):
    """Overwrites every parameter with draws from one seeded stream, visiting names in sorted order."""
    rs = np.random.RandomState(seed)
    for name in sorted(str(p) for p in model.params):
        shape = workspace.FetchBlob(name).shape
        scale = 0.05 if name.endswith("_b") else 0.15
        workspace.FeedBlob(name, rs.uniform(-scale, scale, size=shape).astype(np.float32))


def one_hot(ids):
    """[T, N] int ids -> [T, N, VOCAB] float32 one-hot rows."""
    out = np.zeros((*ids.shape, VOCAB), dtype=np.float32)
    t, n = np.indices(ids.shape)
    out[t, n, ids] = 1.0
    return out


def make_batch(rs, batch, max_len):
    """Feeds one batch of the reversal task (time-major, padded to fixed lengths)."""
    lengths = rs.randint(3, max_len + 1, size=batch).astype(np.int32)
    source = np.full((max_len, batch), PAD, dtype=np.int64)
    decoder_in = np.full((max_len + 1, batch), PAD, dtype=np.int64)
    target = np.full((max_len + 1, batch), PAD, dtype=np.int64)
    for n, length in enumerate(lengths):
        digits = FIRST_DIGIT + rs.randint(0, 10, size=length)
        answer = [*digits[::-1], EOS]
        source[:length, n] = digits
        target[: length + 1, n] = answer
        decoder_in[: length + 1, n] = [GO, *answer[:-1]]
    mask = (np.arange(max_len + 1)[:, None] <= lengths[None, :]).astype(np.float32)  # [T_dec, N]
    workspace.FeedBlob("encoder_inputs", one_hot(source))
    workspace.FeedBlob("encoder_lengths", lengths)
    workspace.FeedBlob("decoder_inputs", one_hot(decoder_in))
    workspace.FeedBlob("decoder_lengths", lengths + 1)
    workspace.FeedBlob("targets", target.reshape(-1).astype(np.int32))  # row t*N + n, as Reshape lays out
    workspace.FeedBlob("target_weights", (mask / mask.sum()).reshape(-1))


def token_accuracy():
    """Share of real target positions of the last batch whose most likely token was the right one."""
    predicted = workspace.FetchBlob("softmax_2d").argmax(axis=1)
    weights = workspace.FetchBlob("target_weights")
    return float(((predicted == workspace.FetchBlob("targets")) * (weights > 0)).sum() / (weights > 0).sum())


def main(argv=None):
    args = parse_args(argv)
    H, N = args.hidden, args.batch

    workspace.ResetWorkspace()
    model, loss = build_model(H, args.attention, args.lr, args.momentum)
    workspace.RunNetOnce(model.param_init_net)
    seed_parameters(model, args.seed)

    workspace.FeedBlob("encoder_hidden_init", np.zeros((1, N, H), dtype=np.float32))
    workspace.FeedBlob("encoder_cell_init", np.zeros((1, N, H), dtype=np.float32))
    workspace.FeedBlob("initial_attention_context", np.zeros((1, N, H), dtype=np.float32))
    data_rs = np.random.RandomState(args.seed + 1)
    make_batch(data_rs, N, args.max_len)
    workspace.CreateNet(model.net)

    losses = []
    start = time.time()
    for it in range(1, args.iters + 1):
        if it > 1:
            make_batch(data_rs, N, args.max_len)
        workspace.RunNet(model.net.Name())
        losses.append(float(workspace.FetchBlob(loss)))
        if args.print_every and (it % args.print_every == 0 or it == 1):
            print(f"iter {it:5d}  loss {losses[-1]:.4f}  ({time.time() - start:.1f}s)", flush=True)
    if args.iters:
        print(f"teacher-forced token accuracy on the last batch: {token_accuracy():.3f}")

    if args.save:
        blobs = {str(p): workspace.FetchBlob(str(p)) for p in model.GetParams()}
        np.savez(args.save, loss_history=np.array(losses, dtype=np.float64), **blobs)
        print(f"saved {len(blobs)} parameters to {args.save}")
    return losses


if __name__ == "__main__":
    main()
