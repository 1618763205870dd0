"""LSTM forward: the compiled Caffe2 net vs a hand-written `lax.scan` vs PyTorch `nn.LSTM`.

All are timed in one process on the same inputs. The Caffe2 net is built by `rnn2jax.caffe2.python.rnn_cell.LSTM`
in the form Caffe2's front end produced: an input-projection FC in the main net, then a
RecurrentNetwork whose step net is FC -> Sum -> LSTMUnit. The hand-written scan is the idiomatic JAX
version of the same maths. Times are medians over repeated runs, and the ratio is taken run by run.

    python benchmarks/lstm_forward.py [--repeats 30] [--sizes 50,32,256 100,64,512] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sizes", nargs="+", default=["50,32,256", "100,64,512"], help="T,N,H (input dim = H)")
    parser.add_argument("--threads", type=int, default=2, help="PyTorch threads (XLA uses every CPU it may)")
    parser.add_argument("--compile-lengths", default="50,1000", help="T values for the compile-time check")
    return parser.parse_args()


ARGS = _parse_args()
# XLA CPU has no thread-count flag: its intra-op pool has one thread per CPU the process may run on
# (`taskset -c 0 python ...` for one). `intra_op_parallelism_threads=N` in XLA_FLAGS, without "--", was
# silently ignored; --threads sets PyTorch's threads only.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import rnn2jax  # noqa: E402
from rnn2jax.caffe2.python.model_helper import ModelHelper  # noqa: E402
from rnn2jax.caffe2.python.rnn_cell import LSTM  # noqa: E402


def caffe2_lstm_net(dim_in: int, hidden: int):
    """The NetDef Caffe2's rnn_cell.LSTM built (forward only, as served)."""
    model = ModelHelper(name="bench")
    LSTM(model, "x", "seq_lengths", ("h0", "c0"), dim_in, hidden, scope="lstm", forward_only=True)
    return model.net.Proto(), model.param_init_net.Proto()


def hand_written_lstm(params, x, h0, c0, lengths):
    """An idiomatic lax.scan LSTM with Caffe2's maths (gate order i, f, o, g; masked by lengths)."""
    x_proj = jnp.einsum("tnd,gd->tng", x, params["i2h_w"]) + params["i2h_b"]
    w_t = params["w"].T

    def step(carry, inputs):
        h, c = carry
        x_t, t = inputs
        gates = x_t + h @ w_t + params["b"]
        i, f, o, g = jnp.split(gates, 4, axis=-1)
        c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
        valid = (t < lengths)[:, None]
        h, c = jnp.where(valid, h_new, h), jnp.where(valid, c_new, c)
        return (h, c), h

    (h, c), hs = jax.lax.scan(step, (h0, c0), (x_proj, jnp.arange(x.shape[0])))
    return hs, h, c


def _time(fn, repeats: int) -> list[float]:
    fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _torch_lstm(params, x, hidden, threads):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    lstm = torch.nn.LSTM(x.shape[-1], hidden)
    # PyTorch's gate blocks i, f, g, o from Caffe2's i, f, o, g
    order = np.concatenate([np.arange(k * hidden, (k + 1) * hidden) for k in (0, 1, 3, 2)])
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.from_numpy(params["i2h_w"][order]))
        lstm.bias_ih_l0.copy_(torch.from_numpy(params["i2h_b"][order]))
        lstm.weight_hh_l0.copy_(torch.from_numpy(params["w"][order]))
        lstm.bias_hh_l0.copy_(torch.from_numpy(params["b"][order]))
    tx = torch.from_numpy(x)

    def run():
        with torch.no_grad():
            return lstm(tx)

    return run


def benchmark(steps: int, batch: int, hidden: int, repeats: int) -> dict[str, float]:
    predict, init = caffe2_lstm_net(hidden, hidden)
    fn = rnn2jax.compile(predict, init_net=init, outputs=["lstm/hidden_state_all", "lstm/hidden_state_last"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps, batch, hidden)).astype(np.float32)
    params = {
        "i2h_w": np.asarray(fn.params["lstm/i2h_w"]),
        "i2h_b": np.asarray(fn.params["lstm/i2h_b"]),
        "w": np.asarray(fn.params["lstm/gates_t_w"]),
        "b": np.asarray(fn.params["lstm/gates_t_b"]),
    }
    h0 = np.zeros((1, batch, hidden), np.float32)
    lengths = np.full(batch, steps, np.int32)
    inputs = {k: jnp.asarray(v) for k, v in {"x": x, "h0": h0, "c0": h0, "seq_lengths": lengths}.items()}
    caffe2 = jax.jit(fn.apply)
    hand = jax.jit(hand_written_lstm)
    hand_args = ({k: jnp.asarray(v) for k, v in params.items()}, inputs["x"], h0[0], h0[0], inputs["seq_lengths"])
    ours = caffe2(fn.params, inputs)["lstm/hidden_state_all"]
    np.testing.assert_allclose(np.asarray(ours), np.asarray(hand(*hand_args)[0]), rtol=1e-4, atol=1e-5)

    run_caffe2 = lambda: jax.block_until_ready(caffe2(fn.params, inputs))  # noqa: E731
    run_hand = lambda: jax.block_until_ready(hand(*hand_args))  # noqa: E731
    run_caffe2(), run_hand()
    pairs = [(_time(run_caffe2, 1)[0], _time(run_hand, 1)[0]) for _ in range(repeats)]
    result = {
        "caffe2_ms": 1e3 * statistics.median(a for a, _ in pairs),
        "hand_ms": 1e3 * statistics.median(b for _, b in pairs),
        "ratio": statistics.median(a / b for a, b in pairs),
    }
    run_torch = _torch_lstm(params, x, hidden, ARGS.threads)
    if run_torch is not None:
        result["torch_ms"] = 1e3 * statistics.median(_time(run_torch, repeats))
    return result


def compile_seconds(steps: int, hidden: int = 256, batch: int = 32) -> float:
    """Wall time of tracing + XLA compilation of the Caffe2 net at sequence length `steps`."""
    predict, init = caffe2_lstm_net(hidden, hidden)
    fn = rnn2jax.compile(predict, init_net=init, outputs=["lstm/hidden_state_all"])
    inputs = {
        "x": jnp.zeros((steps, batch, hidden)),
        "h0": jnp.zeros((1, batch, hidden)),
        "c0": jnp.zeros((1, batch, hidden)),
        "seq_lengths": jnp.full(batch, steps, jnp.int32),
    }
    start = time.perf_counter()
    jax.jit(fn.apply).lower(fn.params, inputs).compile()
    return time.perf_counter() - start


def main() -> None:
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {ARGS.threads} threads, {ARGS.repeats} repeats")
    print(f"{'T,N,H':>14} {'caffe2 ms':>10} {'hand ms':>10} {'ratio':>7} {'torch ms':>9}")
    for size in ARGS.sizes:
        steps, batch, hidden = (int(v) for v in size.split(","))
        r = benchmark(steps, batch, hidden, ARGS.repeats)
        torch_ms = f"{r['torch_ms']:9.2f}" if "torch_ms" in r else f"{'-':>9}"
        print(f"{size:>14} {r['caffe2_ms']:10.2f} {r['hand_ms']:10.2f} {r['ratio']:7.3f} {torch_ms}")
    print("ratio = median over runs of (compiled Caffe2 net time / hand-written scan time); target <= 1.10")
    short, long = (int(v) for v in ARGS.compile_lengths.split(","))
    times = {steps: statistics.median(compile_seconds(steps) for _ in range(3)) for steps in (short, long)}
    print(
        f"compile time: T={short} {times[short]:.2f}s, T={long} {times[long]:.2f}s, "
        f"ratio {times[long] / times[short]:.2f} (target <= 1.5)"
    )


if __name__ == "__main__":
    main()
