"""Seed inputs of the fuzzers: every cell net the builder makes (forward and training nets), and the real
nets, as fuzz containers (see `contract.py`) with random parameters and input hints.

`python tests/fuzz/seeds.py` rewrites `tests/fuzz/seeds/` (the builder seeds, committed); the real-net
seeds are made in memory from the real nets' folder when it is there and are never written into the
project.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the tests' own modules, when run as a script

from test_builder_cells import CELLS, random_params, training_net  # noqa: E402

import rnn2jax  # noqa: E402
from fuzz.contract import Hint, container  # noqa: E402
from helpers import REALNETS  # noqa: E402
from rnn2jax.caffe2.python.core import reset_net_names  # noqa: E402
from rnn2jax.ir.wire import parse_message  # noqa: E402
from rnn2jax.proto import caffe2_pb2 as pb  # noqa: E402

SEED_DIR = HERE / "seeds"
SIZES = {
    "T": 2, "N": 2, "D": 2, "H": 2, "L": 2, "E": 2, "forms": ["3-D", "2-D", "1-D", "3-D"],
    "use_lengths": True, "lengths": [2, 1], "seed": 0,
}  # fmt: skip


def fill_net(params: dict[str, np.ndarray]) -> pb.NetDef:
    """An init net of GivenTensorFill ops writing `params` (float32)."""
    net = pb.NetDef(name="init")
    for name, value in params.items():
        op = net.op.add(type="GivenTensorFill", output=[name])
        op.arg.add(name="shape", ints=value.shape)
        op.arg.add(name="values", floats=np.asarray(value, np.float32).ravel().tolist())
    return net


def _hints(arrays: dict[str, np.ndarray]) -> dict[str, Hint]:
    return {name: Hint(tuple(a.shape), str(a.dtype)) for name, a in arrays.items()}


def cell_seeds() -> Iterator[tuple[str, pb.PlanDef]]:
    """One forward container per builder cell, and one training container (with gradient ops) per
    trainable cell."""
    for index, (name, build) in enumerate(CELLS.items()):
        reset_net_names()
        rng = np.random.default_rng(index)
        built = build(dict(SIZES, seed=index), rng)
        params = random_params(built.model, rng)
        init, net = fill_net(params), built.model.net.Proto()
        yield name, container(init, net, _hints(built.inputs))
        if not built.trainable:
            continue
        outputs = rnn2jax.compile(net, init_net=init, outputs=built.grad_outputs)(built.inputs)
        train, _ = training_net(net, built.grad_outputs)
        grads = {f"{y}_grad": np.ones_like(np.asarray(v)) for y, v in outputs.items()}
        yield f"{name}-training", container(init, train, _hints({**built.inputs, **grads}))


def realnet_seeds() -> Iterator[tuple[str, pb.PlanDef]]:
    """The real nets that run on fed arrays alone (nothing when their folder is absent)."""
    path = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
    if not path.exists():
        return
    net = parse_message(path.read_bytes(), str(path))
    steps, batch, vocab, hidden = 3, 2, 62, 4
    rng = np.random.default_rng(0)
    params = {
        "LSTM/i2h_w": (4 * hidden, vocab), "LSTM/i2h_b": (4 * hidden,), "LSTM/gates_t_w": (4 * hidden, hidden),
        "LSTM/gates_t_b": (4 * hidden,), "char_rnn_blob_0_w": (vocab, hidden), "char_rnn_blob_0_b": (vocab,),
    }  # fmt: skip
    init = fill_net({name: rng.standard_normal(shape).astype(np.float32) * 0.3 for name, shape in params.items()})
    hints = {
        "input_blob": Hint((steps, batch, vocab), "float32"),
        "seq_lengths": Hint((batch,), "int32"),
        "hidden_init": Hint((1, batch, hidden), "float32"),
        "cell_init": Hint((1, batch, hidden), "float32"),
    }
    yield "breadbread_predict", container(init, net, hints)
    for name in ("dper_train_net_lstm_pooling.pbtxt", "breadbread_lstmdemo_train_plan.pbtxt"):
        message = parse_message((REALNETS / name).read_bytes(), name)
        nets = message.network if isinstance(message, pb.PlanDef) else [message]
        for net in nets:  # no hints: these exercise decoding and lowering, not running
            yield f"{Path(name).stem}-{net.name}", container(pb.NetDef(), net, {})


def write_seed_dir() -> None:
    SEED_DIR.mkdir(exist_ok=True)
    for old in SEED_DIR.glob("*.pb"):
        old.unlink()
    for name, plan in cell_seeds():
        (SEED_DIR / f"{name}.pb").write_bytes(plan.SerializeToString())


if __name__ == "__main__":
    write_seed_dir()
    print(f"wrote {len(list(SEED_DIR.glob('*.pb')))} seeds to {SEED_DIR}")
