"""The host ops for training across processes (rnn2jax/ops/distributed.py): Caffe2's store handlers and its Gloo
collectives, on JAX's multi-process runtime.

In this process: the store handlers' contract (set once, get waits, an earlier run's key refused), the ops'
argument checks, and a common world of one process, where Allreduce sums the op's inputs and Broadcast copies
the first (NumPy says what to expect). Across processes: two processes on this machine (loopback only) join
through a file store and run Allreduce, Broadcast from process 1 and Barrier on int64 and float32 blobs, each
process with its own values; every one must get the NumPy sums of all of them. Training with these ops
(data_parallel_model) is tests/caffe2_package/test_api_dpm_hosts.py.
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
from rnn2jax.ops import distributed
from rnn2jax.ops.distributed import CommonWorld, FileStoreHandler, RedisStoreHandler

ROOT = Path(__file__).resolve().parents[2]


def run(workspace: rnn2jax.Workspace, *ops) -> None:
    workspace.run(create_net("collectives", list(ops)))


# ------------------------------------------------------------------------------------------------
# Store handlers


def test_file_store_sets_once_and_waits_for_keys(tmp_path):
    store = FileStoreHandler(str(tmp_path), "run/1")
    assert Path(store.base).parent == tmp_path.resolve() and Path(store.base).is_dir()
    assert not store.check(["a/b"])
    store.set("a/b", b"value")
    store.set("a/b", "value")  # the same value again: Caffe2's contract allows it
    assert store.get("a/b") == b"value" and store.check(["a/b"])
    assert FileStoreHandler(str(tmp_path), "run/1").get("a/b", timeout=0.01) == b"value"  # another process's view
    with pytest.raises(DistributedError, match="key 'a/b' already holds another value, left by an earlier run"):
        store.set("a/b", b"other")
    with pytest.raises(DistributedError, match=r"key\(s\) missing did not appear within 0.05 s"):
        store.get("missing", timeout=0.05)
    assert sorted(os.listdir(store.base)) == ["a%2Fb"]  # no temporary file left behind


def test_file_store_needs_an_existing_folder(tmp_path):
    with pytest.raises(DistributedError, match="is not an existing folder"):
        FileStoreHandler(str(tmp_path / "nowhere"))


class FakeRedis:
    """The three commands RedisStoreHandler sends (GET, SET NX), on a dict."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def set(self, key: str, value: bytes, nx: bool = False) -> bool | None:
        if nx and key in self.data:
            return None
        self.data[key] = value
        return True


def test_redis_store_keys_live_under_the_prefix():
    client = FakeRedis()
    store = RedisStoreHandler("redis.example", 6379, "run_7", client=client)
    store.set("rank/0", b"x")
    assert client.data == {"run_7/rank/0": b"x"} and store.get("rank/0") == b"x"
    with pytest.raises(DistributedError, match=r"redis store redis\.example:6379/run_7: key 'rank/0' already holds"):
        store.set("rank/0", b"y")


def test_redis_store_names_the_package_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # what `import redis` finds where it is not installed
    workspace = rnn2jax.Workspace()
    op = create_operator("RedisStoreHandlerCreate", [], ["store"], host="localhost", port=6379, prefix="p")
    with pytest.raises(
        DistributedError, match=r"RedisStoreHandlerCreate.*needs the Python package 'redis'.*pip install redis"
    ):
        run(workspace, op)


def test_file_store_handler_create_makes_a_store_blob(tmp_path):
    workspace = rnn2jax.Workspace()
    run(workspace, create_operator("FileStoreHandlerCreate", [], ["store"], path=str(tmp_path), prefix="p"))
    store = workspace.fetch("store")
    assert isinstance(store, FileStoreHandler) and store.base == str(tmp_path.resolve() / "p")


@pytest.mark.parametrize(
    ("op", "error", "words"),
    [
        (create_operator("FileStoreHandlerCreate", [], ["s"]), BadArgumentError, "path is a required argument"),
        (create_operator("FileStoreHandlerCreate", ["x"], ["s"], path="."), BadArgumentError, "no inputs and 1 output"),
        (create_operator("RedisStoreHandlerCreate", [], ["s"], port=1), BadArgumentError, "host is a required"),
        (create_operator("RedisStoreHandlerCreate", [], ["s"], host="h"), BadArgumentError, "port is a required"),
        (create_operator("CreateCommonWorld", [], ["w"], size=0), BadArgumentError, "rank 0 of size 0"),
        (create_operator("CreateCommonWorld", [], ["w"], size=2, rank=2), BadArgumentError, "rank 2 of size 2"),
        (create_operator("CreateCommonWorld", [], ["w"], size=1, engine="MPI"), BadArgumentError, "engine 'MPI'"),
        (create_operator("Allreduce", ["w", "x"], ["y"], engine="GLOO"), BadArgumentError, "works in place"),
        (create_operator("Allreduce", ["w"], [], engine="GLOO"), BadArgumentError, "1 or more blobs"),
        (create_operator("Broadcast", ["w", "x"], ["x"], root=-1), BadArgumentError, "root -1"),
        (create_operator("Barrier", ["w"], ["x"]), BadArgumentError, "no outputs"),
        (create_operator("CloneCommonWorld", [], ["w"]), BadArgumentError, "1 input"),
    ],
)
def test_arguments_are_checked_when_the_net_is_created(op, error, words):
    workspace = rnn2jax.Workspace()
    workspace.feed("w", np.zeros(1, np.float32))
    workspace.feed("x", np.zeros(1, np.float32))
    with pytest.raises(error, match=words):
        workspace.create_net(create_net("bad", [op]))


# ------------------------------------------------------------------------------------------------
# A common world of one process


def test_collectives_in_a_world_of_one_process():
    workspace = rnn2jax.Workspace()
    values = [np.arange(6, dtype=np.int64).reshape(2, 3) * k + k for k in (1, 2, 3)]
    for name, value in zip("abc", values, strict=True):
        workspace.feed(name, value)
    workspace.feed("f", np.array([1.5, -2.0], np.float32))
    workspace.feed("g", np.array([4.0, 8.0], np.float32))
    run(
        workspace,
        create_operator("CreateCommonWorld", [], ["world"], size=1, rank=0, engine="GLOO"),
        create_operator("CloneCommonWorld", ["world"], ["clone"], engine="GLOO"),
        create_operator("Allreduce", ["world", "a", "b", "c"], ["a", "b", "c"], engine="GLOO"),
        create_operator("Broadcast", ["clone", "f", "g"], ["f", "g"], engine="GLOO", root=0),
        create_operator("Barrier", ["world"], [], engine="GLOO"),
        create_operator("DestroyCommonWorld", ["clone"], []),
    )
    world = workspace.fetch("world")
    assert isinstance(world, CommonWorld) and (world.size, world.rank, world.group) == (1, 0, None)
    for name in "abc":
        got = workspace.fetch(name)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, values[0] + values[1] + values[2])
    for name in "fg":
        np.testing.assert_array_equal(workspace.fetch(name), np.array([1.5, -2.0], np.float32))


def test_collective_errors_name_the_op_and_blob(tmp_path):
    workspace = rnn2jax.Workspace()
    workspace.feed("x", np.zeros(2, np.float32))
    workspace.feed("y", np.zeros(3, np.float32))
    run(workspace, create_operator("CreateCommonWorld", [], ["world"], size=1))
    with pytest.raises(DistributedError, match=r"Allreduce.*blob 'x' is not a common world \(make one with"):
        run(workspace, create_operator("Allreduce", ["x", "y"], ["y"]))
    with pytest.raises(ShapeError, match=r"blob 'y' is float32 \[3\], blob 'x' float32 \[2\]"):
        run(workspace, create_operator("Allreduce", ["world", "x", "y"], ["x", "y"]))
    with pytest.raises(BadArgumentError, match="root 1 is not a process of a common world of size 1"):
        run(workspace, create_operator("Broadcast", ["world", "x"], ["x"], root=1))
    with pytest.raises(DistributedError, match="blob 'x' is not a store handler"):
        run(workspace, create_operator("CreateCommonWorld", ["x"], ["w2"], size=1))


def test_joining_once_jax_has_started_is_refused_before_publishing(tmp_path):
    """JAX starts its multi-process runtime only before its backend, which this test process has started."""
    store = FileStoreHandler(str(tmp_path))
    with pytest.raises(DistributedError, match="JAX starts it only before its backend"):
        distributed.join(store, 2, 0, where="here", timeout=1)
    assert not os.listdir(tmp_path)
    assert distributed.join(store, 1, 0, where="here") is None  # a world of one process needs no runtime
    with pytest.raises(BadArgumentError, match="rank 3 of size 2"):
        distributed.join(store, 2, 3, where="here")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="interface addresses are read the Linux way")
def test_interface_addresses():
    assert distributed._interface_address("lo", "here") == "127.0.0.1"
    with pytest.raises(DistributedError, match=r"network interface 'no-such-if' has no IPv4 address here; .*lo"):
        distributed._interface_address("no-such-if", "here")


# ------------------------------------------------------------------------------------------------
# Two processes

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
    workspace.feed("i", np.arange(4, dtype=np.int64) * (rank + 1) + 10 ** (rank + 12))  # beyond int32
    workspace.feed("j", np.full(4, 100 * rank, np.int64))
    workspace.feed("f", np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3) + rank)
    workspace.run(create_net("collectives", [
        create_operator("Allreduce", ["world", "i", "j"], ["i", "j"], engine="GLOO"),
        create_operator("Barrier", ["world"], [], engine="GLOO"),
        create_operator("Broadcast", ["world", "f"], ["f"], engine="GLOO", root=1),
    ]))
    np.savez(out, **{name: workspace.fetch(name) for name in "ijf"})
    """
)


def test_two_processes_allreduce_broadcast_and_barrier(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    commands = [
        [sys.executable, "-c", TWO_PROCESSES, str(rank), str(store), str(tmp_path / f"rank{rank}.npz")]
        for rank in (0, 1)
    ]
    for done in run_together(commands, timeout=120, env=env):
        assert done.returncode == 0, f"{done.args[3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    mine = [np.arange(4, dtype=np.int64) * (r + 1) + 10 ** (r + 12) + np.full(4, 100 * r) for r in (0, 1)]
    for rank in (0, 1):
        with np.load(tmp_path / f"rank{rank}.npz") as got:
            for name in "ij":
                assert got[name].dtype == np.int64
                np.testing.assert_array_equal(got[name], mine[0] + mine[1], err_msg=f"rank {rank}: {name}")
            assert got["f"].dtype == np.float32
            np.testing.assert_array_equal(got["f"], np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3) + 1)
