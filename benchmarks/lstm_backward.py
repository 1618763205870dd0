"""LSTM training step: Caffe2's hand-built backward step net vs `jax.grad` of the forward scan.

Both compute the same parameter gradients for one LSTM layer and a sum loss, in one process on the
same inputs. The first runs the training net that Caffe2's gradient machinery built (forward
RecurrentNetwork, then RecurrentNetworkGradient running the backward step net in a reverse scan);
the second differentiates the compiled forward net with `jax.grad`. Times are medians, and the ratio
is taken run by run.

    python benchmarks/lstm_backward.py [--repeats 20] [--size 50,32,256] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--size", default="50,32,256", help="T,N,H (input dim = H)")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


ARGS = _parse_args()
os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={ARGS.threads}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import rnn2jax  # noqa: E402
from rnn2jax.caffe2.python.model_helper import ModelHelper  # noqa: E402
from rnn2jax.caffe2.python.rnn_cell import LSTM  # noqa: E402
from rnn2jax.ops.backward_pass import get_backward_pass  # noqa: E402
from rnn2jax.proto import caffe2_pb2 as pb  # noqa: E402

WEIGHTS = ("lstm/i2h_w", "lstm/i2h_b", "lstm/gates_t_w", "lstm/gates_t_b")


def build(dim_in: int, hidden: int):
    model = ModelHelper(name="bench_train")
    hidden_all, *_ = LSTM(model, "x", "seq_lengths", ("h0", "c0"), dim_in, hidden, scope="lstm")
    model.net.SumElements([hidden_all], "loss")
    forward = pb.NetDef()
    forward.CopyFrom(model.net.Proto())
    train = pb.NetDef()
    train.CopyFrom(forward)
    backward, grads = get_backward_pass(list(forward.op), {"loss": None})
    train.op.extend(backward)
    return forward, train, model.param_init_net.Proto(), [grads[w] for w in WEIGHTS]


def _median_pairs(a, b, repeats: int) -> tuple[float, float, float]:
    a(), b()
    pairs = []
    for _ in range(repeats):
        start = time.perf_counter()
        a()
        middle = time.perf_counter()
        b()
        pairs.append((middle - start, time.perf_counter() - middle))
    return (
        statistics.median(x for x, _ in pairs),
        statistics.median(y for _, y in pairs),
        statistics.median(x / y for x, y in pairs),
    )


def main() -> None:
    steps, batch, hidden = (int(v) for v in ARGS.size.split(","))
    forward_net, train_net, init, grad_names = build(hidden, hidden)
    train = rnn2jax.compile(train_net, init_net=init, outputs=grad_names)
    forward = rnn2jax.compile(forward_net, init_net=init, outputs=["loss"])
    rng = np.random.default_rng(0)
    inputs = {
        "x": jnp.asarray(rng.standard_normal((steps, batch, hidden)), jnp.float32),
        "h0": jnp.zeros((1, batch, hidden)),
        "c0": jnp.zeros((1, batch, hidden)),
        "seq_lengths": jnp.full(batch, steps, jnp.int32),
    }
    params = train.params

    hand_built = jax.jit(lambda p: train.apply(p, inputs))
    autodiff = jax.jit(jax.grad(lambda p: forward.apply(p, inputs)["loss"]))
    ours, theirs = hand_built(params), autodiff(params)
    for name, weight in zip(grad_names, WEIGHTS, strict=True):
        np.testing.assert_allclose(np.asarray(ours[name]), np.asarray(theirs[weight]), rtol=1e-3, atol=1e-4)

    a, b, ratio = _median_pairs(
        lambda: jax.block_until_ready(hand_built(params)),
        lambda: jax.block_until_ready(autodiff(params)),
        ARGS.repeats,
    )
    print(f"jax {jax.__version__}, {ARGS.threads} threads, T,N,H = {ARGS.size}, {ARGS.repeats} repeats")
    print(f"backward step net (forward + RecurrentNetworkGradient): {1e3 * a:8.2f} ms")
    print(f"jax.grad of the forward scan:                           {1e3 * b:8.2f} ms")
    print(f"ratio (median of per-run ratios): {ratio:.3f}")


if __name__ == "__main__":
    main()
