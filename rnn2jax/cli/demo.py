"""`rnn2jax demo`: two bundled examples, each checked against an independent computation.

1. A plain net: the bundled MLP predict and init nets, compiled and compared with NumPy.
2. A recurrent net: a character-level LSTM language model built in Caffe2's form with `rnn2jax.caffe2`,
   with Caffe2's hand-built gradient ops (RecurrentNetworkGradient included). Its gradients are
   compared with `jax.grad`, it is trained with SGD on the bundled text until the loss halves, and a
   greedy sample is drawn from it.
"""

from __future__ import annotations

import argparse
import time
from importlib import resources

LM_HIDDEN, LM_BATCH, LM_SEQ_LEN, LM_STEPS, LM_LEARNING_RATE, LM_CLIP = 64, 16, 25, 400, 2.0, 5.0

NAME = "demo"
HELP = "compile and run the bundled examples, each checked"
DESCRIPTION = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(handler=lambda args: run_demo())


def _example(name: str) -> bytes:
    return resources.files("rnn2jax.examples").joinpath(name).read_bytes()


def _status(ok: bool) -> str:
    return "ok" if ok else "MISMATCH"


def run_mlp_demo() -> bool:
    """The bundled MLP: compile, run, and compare with the same maths in NumPy."""
    import numpy as np

    from ..compiler.compiled_net import compile

    predict, init = _example("mlp_predict_net.pbtxt"), _example("mlp_init_net.pbtxt")
    fn = compile(predict, init_net=init)
    print(f"compiled {fn!r}")
    print("parameters from the init net: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in fn.params.items()))
    data = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    prob = np.asarray(fn(data=data)["prob"])
    print(f"input 'data' {data.shape} -> output 'prob' {prob.shape}:")
    print(np.array2string(prob, precision=4, suppress_small=True))

    p = {k: np.asarray(v) for k, v in fn.params.items()}
    hidden = np.maximum(data @ p["fc1_w"].T + p["fc1_b"], 0)
    logits = hidden @ p["fc2_w"].T + p["fc2_b"]
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    error = float(np.abs(prob - expected).max())
    ok = error < 1e-5
    print(f"max |rnn2jax - NumPy| = {error:.2e}: {_status(ok)}")
    return ok


def _char_lm(vocab: int, hidden: int):
    """The language model's nets: (predict net, training net, init net, param -> gradient blob)."""
    from ..caffe2.python import brew
    from ..caffe2.python.model_helper import ModelHelper
    from ..caffe2.python.rnn_cell import LSTM
    from ..ops.backward_pass import get_backward_pass
    from ..proto import caffe2_pb2 as pb

    model = ModelHelper(name="char_rnn")
    hidden_all, hidden_last, _, cell_last = LSTM(
        model, "input_blob", "seq_lengths", ("hidden_init", "cell_init"), vocab, hidden, scope="LSTM"
    )
    logits = brew.fc(model, hidden_all, "logits", dim_in=hidden, dim_out=vocab, axis=2)
    model.net.Softmax(logits, "softmax", axis=2)
    predict = pb.NetDef()
    predict.CopyFrom(model.net.Proto())
    predict.external_output.extend(["softmax", hidden_last, cell_last])
    model.net.Reshape("softmax", ["softmax_reshaped", "_"], shape=[-1, vocab])
    model.net.LabelCrossEntropy(["softmax_reshaped", "target"], "xent")
    model.net.AveragedLoss("xent", "loss")
    train = pb.NetDef()
    train.CopyFrom(model.net.Proto())
    backward, grad_map = get_backward_pass(list(train.op), {"loss": None})
    train.op.extend(backward)
    return predict, train, model.param_init_net.Proto(), {str(p): grad_map[str(p)] for p in model.params}


def run_lm_demo() -> bool:
    """Train the character LSTM on the bundled text; True when every check passed."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ..compiler.compiled_net import compile

    text = _example("char_lstm_text.txt").decode()
    chars = sorted(set(text))
    vocab, data = len(chars), np.array([chars.index(c) for c in text], np.int32)
    predict_net, train_net, init_net, grads = _char_lm(vocab, LM_HIDDEN)
    names = list(grads)
    gradient_ops = sorted({op.type for op in train_net.op if op.type.endswith("Gradient")})
    print(f"bundled text: {len(text)} characters, vocabulary {vocab}")
    print(f"built with rnn2jax.caffe2: LSTM(hidden {LM_HIDDEN}) -> FC -> Softmax -> LabelCrossEntropy -> AveragedLoss")
    print(f"training net: {len(train_net.op)} ops; gradient ops from get_backward_pass: {', '.join(gradient_ops)}")
    train = compile(train_net, init_net=init_net, outputs=["loss", *grads.values()])
    forward = compile(_forward_loss(train_net, predict_net))

    eye = jnp.eye(vocab, dtype=jnp.float32)
    zeros = jnp.zeros((1, LM_BATCH, LM_HIDDEN), jnp.float32)
    lengths = jnp.full((LM_BATCH,), LM_SEQ_LEN, jnp.int32)

    def inputs(x, y):
        return {"input_blob": eye[x], "target": y.reshape(-1), "seq_lengths": lengths}

    state = {"hidden_init": zeros, "cell_init": zeros}
    rng = np.random.default_rng(0)

    def batch():
        starts = rng.integers(0, len(data) - LM_SEQ_LEN - 1, size=LM_BATCH)
        window = np.stack([data[s : s + LM_SEQ_LEN + 1] for s in starts], axis=1)
        return window[:-1], window[1:]

    # Check 1: the hand-built backward pass (RecurrentNetworkGradient's step net) against jax.grad.
    params = {p: jnp.asarray(train.params[p]) for p in names}
    x, y = batch()
    out = jax.jit(train.apply)(params, inputs(x, y) | state)
    auto = jax.jit(jax.grad(lambda p: forward.apply({}, inputs(x, y) | state | p)["loss"]))(params)
    error = max(float(jnp.max(jnp.abs(out[grads[p]] - auto[p]))) for p in names)
    grads_ok = error < 1e-4
    print(f"max |Caffe2 gradient ops - jax.grad| over {len(names)} parameters = {error:.2e}: {_status(grads_ok)}")

    @jax.jit
    def step(params, x, y):
        out = train.apply(params, inputs(x, y) | state)
        g = {p: out[grads[p]] for p in names}
        norm = jnp.sqrt(sum(jnp.sum(v * v) for v in g.values()))
        scale = LM_LEARNING_RATE * jnp.minimum(1.0, LM_CLIP / (norm + 1e-6))
        return {p: params[p] - scale * g[p] for p in names}, out["loss"]

    start, losses = time.perf_counter(), []
    for i in range(LM_STEPS):
        params, loss = step(params, *batch())
        losses.append(float(loss))
        if i % (LM_STEPS // 8) == 0 or i == LM_STEPS - 1:
            print(f"  step {i:3d}  loss {losses[-1]:.4f}")
    first, last = losses[0], float(np.mean(losses[-10:]))
    print(f"{LM_STEPS} SGD steps (jitted training net) in {time.perf_counter() - start:.1f} s")
    loss_ok = last <= first / 2
    print(f"loss {first:.4f} -> {last:.4f} (mean of the last 10 steps), at most half: {_status(loss_ok)}")

    sample = _sample(compile(predict_net), list(predict_net.external_output), params, chars, "the ", 60)
    print(f"greedy sample from the compiled predict net: {sample!r}")
    return grads_ok and loss_ok


def _forward_loss(train_net, predict_net):
    """The training net's forward ops only, for jax.grad: the predict ops and the three loss ops
    (Reshape, LabelCrossEntropy, AveragedLoss) that `_char_lm` adds after them."""
    from ..proto import caffe2_pb2 as pb

    net = pb.NetDef()
    net.name = train_net.name
    net.op.extend(train_net.op[: len(predict_net.op) + 3])
    net.external_output.append("loss")
    return net


def _sample(predict, outputs: list[str], params: dict, chars: list[str], seed_text: str, length: int) -> str:
    """Greedy decoding one character at a time (T = 1, N = 1), carrying the LSTM state."""
    import jax
    import numpy as np

    run = jax.jit(predict.apply)
    eye = np.eye(len(chars), dtype=np.float32)
    h = c = np.zeros((1, 1, LM_HIDDEN), np.float32)
    text, prob = seed_text, None
    for i in range(len(seed_text) + length):
        ch = seed_text[i] if i < len(seed_text) else chars[int(np.argmax(prob))]
        if i >= len(seed_text):
            text += ch
        feed = {"input_blob": eye[[chars.index(ch)]][None], "seq_lengths": np.ones(1, np.int32)}
        out = run(params, feed | {"hidden_init": h, "cell_init": c})
        prob, h, c = (out[name] for name in outputs)  # softmax, hidden_last, cell_last
        prob = np.asarray(prob)[0, 0]
    return text


def run_demo() -> int:
    print("1. a plain net: the bundled MLP")
    mlp_ok = run_mlp_demo()
    print()
    print("2. a recurrent net: a character-level LSTM language model, trained with Caffe2's gradient ops")
    lm_ok = run_lm_demo()
    print()
    print("demo: all checks ok" if mlp_ok and lm_ok else "demo: a check FAILED")
    return 0 if mlp_ok and lm_ok else 1
