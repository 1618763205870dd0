"""The scripts in examples/ run end to end (with --small) and print what they promise."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

import rnn2jax
from rnn2jax.caffe2.python.attention import AttentionType
from rnn2jax.lowering.interpreter import LoweredNet
from rnn2jax.proto import caffe2_pb2 as pb

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--small", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_char_lstm_trains_and_samples():
    out = run_example("char_lstm.py")
    assert "RecurrentNetworkGradient" in out
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", out, re.MULTILINE)]
    assert len(losses) >= 5 and losses[-1] < losses[0]
    assert "the loss halved: ok" in out  # the script asserts the halving itself
    assert re.search(r"^greedy sample: 'the .{10,}'$", out, re.MULTILINE)


def _attention_seq2seq():
    """The example as a module (its build functions), registered so its dataclass resolves."""
    name = "attention_seq2seq_example"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / "attention_seq2seq.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def seq2seq_step():
    """The --small training model, its initial parameters and one batch."""
    ex = _attention_seq2seq()
    model, _, grads, loss_ops = ex.build_training(ex.SIZES["small"], AttentionType.Regular)
    forward = pb.NetDef()  # the forward net and the loss
    forward.op.extend(model.net.Proto().op[:loss_ops])
    ws = rnn2jax.Workspace(seed=0)
    ws.run(model.param_init_net.Proto())
    params = {name: ws.fetch(name) for op in model.param_init_net.Proto().op for name in op.output}
    batch = ex.reverse_batch(ex.SIZES["small"], np.random.default_rng(3))
    return SimpleNamespace(model=model, loss=ex.LOSS, grads=grads, forward=forward, params=params, batch=batch)


def _dense(grad, param: np.ndarray, blobs: dict) -> np.ndarray:
    """A gradient blob, or a GradientSlice (indices, values) added up into a dense gradient."""
    if not isinstance(grad, tuple):
        return np.asarray(blobs[grad])
    dense = np.zeros_like(param)
    np.add.at(dense, np.asarray(blobs[grad[0]]), np.asarray(blobs[grad[1]]))
    return dense


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-5, atol: float = 1e-9) -> bool:
    """float32 agreement relative to the blob's scale: |a - e| <= rtol * (|e| + max|e|) + atol.

    `atol`: near-uniform attention at initialisation leaves the attention biases' gradients ~1e-6, sums
    of terms ~1e-2 that nearly cancel, so they carry float32 rounding of ~1e-10 in absolute terms."""
    scale = np.abs(expected) + np.abs(expected).max()
    return bool(np.all(np.abs(actual - expected) <= rtol * scale + atol))


def test_attention_seq2seq_trains():
    step = _attention_seq2seq()
    model, _, _, _ = step.build_training(step.SIZES["small"], AttentionType.Regular)
    # nothing in a training net decides a shape by its values: one executable serves every step
    assert LoweredNet(rnn2jax.load(model.net.Proto())).static_inputs() == {}
    out = run_example("attention_seq2seq.py")
    assert "RecurrentNetworkGradient" in out and "SoftmaxWithLossGradient" in out
    assert "encoder_embeddings <- ('encoder_inputs', 'encoder/embedded_grad')" in out  # a GradientSlice
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", out, re.MULTILINE)]
    assert len(losses) >= 5
    final = float(re.search(r"final loss \(mean of last 5\) ([0-9.]+)", out).group(1))
    assert final < 0.7 * losses[0], out
    assert "the loss fell: ok" in out
    assert "3 RecurrentNetwork ops" in out
    assert "output 'decoder/softmax' (6, 16, 12), rows sum to 1: True" in out
    assert out.rstrip().endswith("ok")


def test_attention_seq2seq_gradients_match_jax_grad(seq2seq_step):
    """The gradient ops (RecurrentNetworkGradient, the embeddings' GradientSlices...) against jax.grad of
    the forward net and loss."""
    s = seq2seq_step
    names = list(s.grads)
    fetch = [b for p in names for b in (s.grads[p] if isinstance(s.grads[p], tuple) else (s.grads[p],))]
    train = rnn2jax.compile(s.model.net.Proto(), params=s.params, outputs=[s.loss, *dict.fromkeys(fetch)])
    inputs = {k: v for k, v in s.batch.items() if k in train.input_names}
    blobs = train(inputs)
    loss_fn = rnn2jax.compile(s.forward, params=s.params, outputs=[s.loss])
    inputs = {k: v for k, v in s.batch.items() if k in loss_fn.input_names}
    # Under jax.jit: one XLA compilation of the whole gradient, not one per primitive run eagerly (~200).
    loss, expected = jax.jit(jax.value_and_grad(lambda p: loss_fn.apply({**loss_fn.params, **p}, inputs)[s.loss]))(
        {p: loss_fn.params[p] for p in names}
    )
    assert np.isclose(float(blobs[s.loss]), float(loss), rtol=1e-6)
    for p in names:
        actual = _dense(s.grads[p], s.params[p], blobs)
        assert _close(actual, np.asarray(expected[p])), (p, np.abs(actual - expected[p]).max())
    assert np.abs(_dense(s.grads["encoder_embeddings"], s.params["encoder_embeddings"], blobs)).max() > 0


def test_attention_seq2seq_training_step_matches_caffe2(seq2seq_step, caffe2):
    """One step of the training net (gradients, norm clipping, WeightedSum / ScatterWeightedSum) in
    rnn2jax and in real Caffe2, from the same parameters and batch."""
    s = seq2seq_step
    grads = [b for g in s.grads.values() for b in (g if isinstance(g, tuple) else (g,))]
    fetch = list(dict.fromkeys([s.loss, *grads, *s.grads]))
    feeds = {**s.params, **s.batch}
    expected = caffe2.run([("net", s.model.net.Proto())], feeds, fetch)
    ws = rnn2jax.Workspace(seed=0)
    for name, value in feeds.items():
        ws.feed(name, value)
    ws.run(s.model.net.Proto())
    for name in fetch:
        actual = ws.fetch(name)
        assert actual.shape == expected[name].shape, name
        if actual.dtype.kind == "f":
            assert _close(actual, expected[name]), (name, np.abs(actual - expected[name]).max())
        else:
            np.testing.assert_array_equal(actual, expected[name], err_msg=name)
    # The step moved every parameter, and only the looked-up rows of the embeddings.
    for p in s.grads:
        assert not np.array_equal(ws.fetch(p), s.params[p]), p
    untouched = np.setdiff1d(np.arange(s.params["encoder_embeddings"].shape[0]), s.batch["encoder_inputs"])
    assert len(untouched) and np.array_equal(
        ws.fetch("encoder_embeddings")[untouched], s.params["encoder_embeddings"][untouched]
    )


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_verify_lstm_reports_agreement(cell):
    out = run_example("verify_lstm.py", "--cell", cell)
    assert "RecurrentNetworkGradient" in out and "h0_grad" in out
    assert "all gradients agree" in out
