"""Check a Caffe2 LSTM's hand-written backward step net against JAX's automatic differentiation.

The LSTM is built with `rnn2jax.caffe2`, a loss is put on its outputs, and `get_backward_pass` adds the
gradient ops (RecurrentNetworkGradient with the backward step net core.py's gradient machinery made).
`rnn2jax.verify` then compares that backward step net, per gradient blob, with `jax.vjp` of the
forward scan. The exit status is 0 when every gradient agrees, 1 when one does not.

    python examples/verify_lstm.py [--small] [--cell lstm|milstm|gru] [--dtype float64] [--fd] [--json]
"""

from __future__ import annotations

import argparse
import sys

import rnn2jax
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM, MILSTM
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.proto import caffe2_pb2 as pb

CELLS = {"lstm": LSTM, "milstm": MILSTM, "gru": GRU}
SIZES = {"small": (5, 3, 4, 6), "default": (25, 16, 64, 128)}  # T, N, input dim, hidden dim


def training_net(cell: str, dim_in: int, hidden: int) -> tuple[pb.NetDef, pb.NetDef]:
    """(training net, init net): the recurrent layer, a sum-of-squares-like loss, and its gradient ops."""
    model = ModelHelper(name="verify")
    states = ("h0",) if cell == "gru" else ("h0", "c0")
    outputs = CELLS[cell](model, "x", "seq_lengths", states, dim_in, hidden, scope="rnn")
    squared = model.net.Mul([outputs[0], outputs[0]], "squared")
    model.net.SumElements(squared, "loss")
    net = pb.NetDef()
    net.CopyFrom(model.net.Proto())
    backward, _ = get_backward_pass(list(net.op), {"loss": None})
    net.op.extend(backward)
    return net, model.param_init_net.Proto()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small sizes (a quick run)")
    parser.add_argument("--cell", choices=sorted(CELLS), default="lstm")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--fd", action="store_true", help="also check against finite differences")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    steps, batch, dim_in, hidden = SIZES["small" if args.small else "default"]
    net, init = training_net(args.cell, dim_in, hidden)
    kinds = [op.type for op in net.op if op.type.startswith("RecurrentNetwork")]
    print(f"{args.cell} training net: {len(net.op)} ops ({', '.join(kinds)}), T={steps} N={batch} H={hidden}")
    gates = 3 if args.cell == "gru" else 4
    shapes = {
        "rnn/i2h": (steps, batch, gates * hidden),  # the input projection the RecurrentNetwork op reads
        "h0": (1, batch, hidden),
        "seq_lengths": (batch,),
    }
    if args.cell != "gru":
        shapes["c0"] = (1, batch, hidden)
    report = rnn2jax.verify(net, shapes=shapes, init_net=init, dtype=args.dtype, finite_differences=args.fd)
    print(report.to_json() if args.json else report)
    print("all gradients agree" if report.ok else "SOME GRADIENTS DISAGREE")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
