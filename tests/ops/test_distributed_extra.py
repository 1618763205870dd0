"""Allgather and ReduceScatter (rnn2jax/ops/distributed.py), Caffe2's Gloo collectives, as
tests/ops/test_distributed.py tests the others.

In this process: a common world of one process. ReduceScatter runs in real Caffe2 there too and must match it;
Caffe2's Allgather fails in a world of one (Gloo's ring asks for a pair to itself: "pair missing"), so there
NumPy says what to expect. Across processes: two processes on this machine (loopback only) join through a file
store and run both on float32 and int64 blobs; the expectations are what two real Caffe2 processes computed for
the same values (Allgather: process 0's blobs, then process 1's; ReduceScatter with counts [3, 2]: process 0
gets elements 0-2 of the sum, process 1 elements 3-4, at the start of its blob). Caffe2's Reduce has no CPU
implementation (no engine registers it), so rnn2jax has none.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from processes import run_together

import rnn2jax
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import BadArgumentError, DistributedError, ShapeError
from tests.differential import make_op
from tests.host_differential import check_net

ROOT = Path(__file__).resolve().parents[2]


def world_of_one(tmp_path: Path) -> list:
    return [
        make_op("FileStoreHandlerCreate", [], ["store"], path=str(tmp_path), prefix="one"),
        gloo("CreateCommonWorld", ["store"], ["world"], size=1, rank=0),
    ]


def gloo(op_type: str, inputs: list[str], outputs: list[str], **args):
    """An op of engine GLOO (Caffe2 registers its collectives under that engine only)."""
    op = make_op(op_type, inputs, outputs, **args)
    op.engine = "GLOO"
    return op


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reduce_scatter_in_a_world_of_one_matches_caffe2(caffe2, tmp_path, dtype):
    feeds = {
        "a": np.arange(6, dtype=dtype).reshape(2, 3),
        "b": np.linspace(-1, 1, 6).astype(dtype),
        "counts": np.array([4], np.int32),
    }
    ops = [*world_of_one(tmp_path), gloo("ReduceScatter", ["world", "a", "b", "counts"], ["a", "b", "counts"])]
    _, want = check_net(caffe2, ops, feeds)
    np.testing.assert_array_equal(want["a"], (feeds["a"].ravel() + feeds["b"]).reshape(2, 3))


@pytest.mark.parametrize(
    ("feeds", "words"),
    [
        ({"a": np.arange(3, dtype=np.int64), "counts": np.array([3], np.int32)}, "takes float32, float16"),
        ({"a": np.arange(3, dtype=np.float32), "counts": np.array([3, 0], np.int32)}, "one count per process"),
    ],
)
def test_reduce_scatter_refuses_as_caffe2_does(caffe2, tmp_path, feeds, words):
    ops = [*world_of_one(tmp_path), gloo("ReduceScatter", ["world", "a", "counts"], ["a", "counts"])]
    check_net(caffe2, ops, feeds, fails=True)
    workspace = rnn2jax.Workspace()
    for name, value in feeds.items():
        workspace.feed(name, value)
    with pytest.raises((DistributedError, ShapeError), match=words):
        workspace.run(create_net("rs", ops))


def test_allgather_in_a_world_of_one():
    workspace = rnn2jax.Workspace()
    values = {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.arange(6, dtype=np.int64)[::-1] + 2**40}
    for name, value in values.items():
        workspace.feed(name, value)
    workspace.run(
        create_net(
            "gather",
            [
                create_operator("CreateCommonWorld", [], ["world"], size=1, engine="GLOO"),
                create_operator("Allgather", ["world", "a", "b"], ["all"], engine="GLOO"),
            ],
        )
    )
    got = workspace.fetch("all")
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.concatenate([values["a"].ravel(), values["b"]]))


@pytest.mark.parametrize(
    ("op", "feeds", "error", "words"),
    [
        (create_operator("Allgather", ["world"], ["g"]), {}, BadArgumentError, "1 or more blobs"),
        (create_operator("Allgather", ["world", "x"], ["g", "h"]), {}, BadArgumentError, "1 output"),
        (create_operator("Allgather", ["world", "x", "y"], ["g"]), {}, ShapeError, "blob 'y' has 4 elements"),
        (create_operator("Allgather", ["world", "x"], ["g"], engine="MPI"), {}, BadArgumentError, "engine 'MPI'"),
        (create_operator("Allgather", ["world", "u"], ["g"]), {}, DistributedError, "Unhandled type"),
        (create_operator("ReduceScatter", ["world", "x"], ["x"]), {}, BadArgumentError, "receive counts"),
        (create_operator("ReduceScatter", ["world", "x", "c"], ["x"]), {}, BadArgumentError, "works in"),
        (create_operator("ReduceScatter", ["world", "x", "c"], ["x", "c"]), {"c": [9]}, ShapeError, "add up"),
    ],
)
def test_arguments_and_inputs_are_checked(op, feeds, error, words):
    workspace = rnn2jax.Workspace()
    blobs = {"x": np.zeros(3, np.float32), "y": np.zeros(4, np.float32), "u": np.zeros(3, np.uint8)}
    blobs["c"] = np.array(feeds.get("c", [3]), np.int32)
    for name, value in blobs.items():
        workspace.feed(name, value)
    workspace.run(create_net("world", [create_operator("CreateCommonWorld", [], ["world"], size=1)]))
    with pytest.raises(error, match=words):
        workspace.run(create_net("bad", [op]))


TWO_PROCESSES = textwrap.dedent(
    """
    import sys
    import numpy as np
    import rnn2jax
    from rnn2jax.caffe2.opdef import create_net, create_operator

    rank, store_path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    workspace = rnn2jax.Workspace()
    workspace.run(create_net("join", [
        create_operator("FileStoreHandlerCreate", [], ["store"], path=store_path, prefix="ops"),
        create_operator("CreateCommonWorld", ["store"], ["world"], size=2, rank=rank, engine="GLOO",
                        interface="lo", timeout_ms=60000),
    ]))
    workspace.feed("a", np.arange(6, dtype=np.float32).reshape(2, 3) + 100 * rank)
    workspace.feed("b", np.arange(6, dtype=np.float32).reshape(2, 3) * 10 + 1000 * rank)
    workspace.feed("i", np.arange(2, dtype=np.int64) + 10 ** (rank + 12))
    workspace.feed("x", np.arange(7, dtype=np.float32) + 100 * rank)
    workspace.feed("counts", np.array([3, 2], np.int32))
    workspace.run(create_net("collectives", [
        create_operator("Allgather", ["world", "a", "b"], ["g"], engine="GLOO"),
        create_operator("Allgather", ["world", "i"], ["gi"], engine="GLOO"),
        create_operator("ReduceScatter", ["world", "x", "counts"], ["x", "counts"], engine="GLOO"),
    ]))
    np.savez(out, **{name: workspace.fetch(name) for name in ("g", "gi", "x")})
    """
)


def test_two_processes_allgather_and_reduce_scatter(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    commands = [
        [sys.executable, "-c", TWO_PROCESSES, str(rank), str(store), str(tmp_path / f"rank{rank}.npz")]
        for rank in (0, 1)
    ]
    for done in run_together(commands, timeout=120, env=env):
        assert done.returncode == 0, f"{done.args[3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    gathered = [0, 1, 2, 3, 4, 5, 0, 10, 20, 30, 40, 50, 100, 101, 102, 103, 104, 105, 1000, 1010, 1020, 1030, 1040]
    gathered.append(1050)  # what real Caffe2's two processes gather, both
    total = np.arange(7, dtype=np.float32) * 2 + 100
    for rank, (start, count) in enumerate([(0, 3), (3, 2)]):
        with np.load(tmp_path / f"rank{rank}.npz") as got:
            assert got["g"].dtype == np.float32 and got["gi"].dtype == np.int64
            np.testing.assert_array_equal(got["g"], np.array(gathered, np.float32))
            np.testing.assert_array_equal(got["gi"], np.array([10**12, 10**12 + 1, 10**13, 10**13 + 1]))
            np.testing.assert_array_equal(got["x"][:count], total[start : start + count], err_msg=f"rank {rank}")
