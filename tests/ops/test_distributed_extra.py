"""Allgather and ReduceScatter (rnn2jax/ops/distributed.py), Caffe2's Gloo collectives, as
tests/ops/test_distributed.py tests the others, and against real Caffe2.

In this process: a common world of one process. ReduceScatter runs in real Caffe2 there too and must match it;
Caffe2's Allgather fails in a world of one (Gloo's ring asks for a pair to itself: "pair missing"), so there
NumPy says what to expect. Across processes: one script, run as two rnn2jax processes (its Caffe2 API on JAX's
runtime) and as two real Caffe2 processes (Gloo), each pair joining through a file store on loopback, runs both
ops on float32 and int64 blobs; the results must agree (Allgather: process 0's blobs, then process 1's;
ReduceScatter with counts [3, 2]: process 0 gets elements 0-2 of the sum, process 1 elements 3-4, at the start
of its blob, after which Caffe2 leaves partial sums). Caffe2's Reduce has no CPU implementation (no engine
registers it), so rnn2jax has none.
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
from tests.conftest import real_caffe2_python
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


# One script for rnn2jax's Caffe2 API and for real Caffe2: a world of two processes through a file store
TWO_PROCESSES = textwrap.dedent(
    """
    import sys
    import numpy as np

    if sys.argv[4] == "rnn2jax":
        import rnn2jax.caffe2

        rnn2jax.caffe2.install()
    from caffe2.python import core, workspace

    rank, store_path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    workspace.RunOperatorOnce(core.CreateOperator("FileStoreHandlerCreate", [], ["store"], path=store_path))
    workspace.RunOperatorOnce(core.CreateOperator(
        "CreateCommonWorld", ["store"], ["world"], size=2, rank=rank, engine="GLOO", interface="lo", timeout_ms=60000
    ))
    workspace.FeedBlob("a", np.arange(6, dtype=np.float32).reshape(2, 3) + 100 * rank)
    workspace.FeedBlob("b", np.arange(6, dtype=np.float32).reshape(2, 3) * 10 + 1000 * rank)
    workspace.FeedBlob("i", np.arange(2, dtype=np.int64) + 10 ** (rank + 12))
    workspace.FeedBlob("x", np.arange(7, dtype=np.float32) + 100 * rank)
    workspace.FeedBlob("counts", np.array([3, 2], np.int32))
    for op_type, inputs, outputs in [
        ("Allgather", ["world", "a", "b"], ["g"]),
        ("Allgather", ["world", "i"], ["gi"]),
        ("ReduceScatter", ["world", "x", "counts"], ["x", "counts"]),
        # neither process exits while the other is still in a collective: Gloo then fails the other with
        # "Connection closed by peer" (seen once in CI, on real Caffe2's side after ReduceScatter)
        ("Barrier", ["world"], []),
    ]:
        workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, engine="GLOO"))
    np.savez(out, **{name: workspace.FetchBlob(name) for name in ("g", "gi", "x")})
    """
)


def run_two(python: str, folder: Path, env: dict[str, str], which: str) -> list[dict[str, np.ndarray]]:
    """Run TWO_PROCESSES as two processes of `python` (`which`: rnn2jax or caffe2); each one's blobs."""
    store = folder / "store"
    store.mkdir()
    commands = [
        [python, "-c", TWO_PROCESSES, str(rank), str(store), str(folder / f"rank{rank}.npz"), which] for rank in (0, 1)
    ]
    for done in run_together(commands, timeout=120, env=env):
        assert done.returncode == 0, f"{done.args[3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    results = []
    for rank in (0, 1):
        with np.load(folder / f"rank{rank}.npz") as got:
            results.append({name: got[name] for name in got.files})
    return results


def test_two_processes_allgather_and_reduce_scatter_match_caffe2(tmp_path):
    """Two rnn2jax processes (its Caffe2 API, JAX's runtime) and two real Caffe2 processes (Gloo) run the
    same script; the results must agree (ReduceScatter: each process's share; Caffe2 leaves partial sums after
    it)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    (tmp_path / "ours").mkdir()
    (tmp_path / "caffe2").mkdir()
    ours = run_two(sys.executable, tmp_path / "ours", env, "rnn2jax")
    caffe2_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    theirs = run_two(str(real_caffe2_python()), tmp_path / "caffe2", caffe2_env, "caffe2")
    total = np.arange(7, dtype=np.float32) * 2 + 100
    gathered = np.concatenate([np.arange(6), np.arange(6) * 10, np.arange(6) + 100, np.arange(6) * 10 + 1000])
    for rank, (start, count) in enumerate([(0, 3), (3, 2)]):
        got, want = ours[rank], theirs[rank]
        for name in ("g", "gi"):
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"rank {rank}: {name}")
        np.testing.assert_array_equal(got["g"], gathered.astype(np.float32))
        np.testing.assert_array_equal(got["gi"], np.array([10**12, 10**12 + 1, 10**13, 10**13 + 1]))
        assert got["x"].dtype == want["x"].dtype == np.float32
        np.testing.assert_array_equal(got["x"][:count], want["x"][:count], err_msg=f"rank {rank}")
        np.testing.assert_array_equal(got["x"][:count], total[start : start + count])
