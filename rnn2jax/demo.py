"""`rnn2jax demo`: compile the bundled example net with its init net, run it, and check the result
against a NumPy computation of the same maths."""

from __future__ import annotations

from importlib import resources

import numpy as np

from .compile import compile


def _example(name: str) -> bytes:
    return resources.files("rnn2jax.examples").joinpath(name).read_bytes()


def run_demo() -> int:
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
    print(f"max |rnn2jax - NumPy| = {error:.2e}: {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1
