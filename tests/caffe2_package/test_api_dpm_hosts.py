"""`data_parallel_model` across hosts: two shards, started as two processes on this machine (loopback only),
train one model as one process would on the global batch.

dpm_hosts_script.py (beside this file) is a Caffe2 script in the manner of Caffe2's resnet50_trainer.py: a
FileStoreHandlerCreate store, `rendezvous=dict(kv_handler=..., shard_id=..., num_shards=2, engine="GLOO")`, an
MLP on 2 CPU devices per shard with SGD. Each (shard, device) copy gets its own rows of each step's global
batch, and each shard starts from its own random parameters. After 3 steps every copy of every shard must
hold the parameters of one plain model (no data_parallel_model) trained by one process on the whole global
batch from shard 0's start (float32, rtol 1e-5), and those of the same SGD written in NumPy here: that holds
only if the init net's Broadcast gave every shard shard 0's start and every step's Allreduce summed the
gradients of all four copies. The same SGD on shard 0's rows alone ends elsewhere, so a missing all-reduce
would show. Where real Caffe2 is installed, it runs the same script as two processes over Gloo: its nets
equal rnn2jax's op for op, and its parameters the NumPy SGD's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from processes import run_together

from rnn2jax.caffe2.python import data_parallel_model, model_helper, workspace
from rnn2jax.errors import BadArgumentError, DistributedError
from rnn2jax.proto import caffe2_pb2 as pb
from tests.conftest import ROOT, real_caffe2_python

SCRIPT = Path(__file__).with_name("dpm_hosts_script.py")
PARAMS = ("fc1_w", "fc1_b", "fc2_w", "fc2_b")
COPIES = ("cpu_0", "cpu_1")
ROWS_PER_SHARD = 8  # 2 devices x 4 rows
TIMEOUT = 120  # seconds for a whole two-process run; it takes a few
RNN2JAX = [sys.executable, "-m", "rnn2jax", "exec"]
# Real Caffe2 lacks networkx, which caffe2.python.memonger imports at module level (test_api_dpm.py says more).
CAFFE2_RUNNER = (
    "import runpy, sys, types; sys.modules.setdefault('networkx', types.ModuleType('networkx')); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
# Builds the nets without meeting the other shard: Parallelize's join of JAX's runtime made a no-op.
BUILD_ONLY_RUNNER = (
    "import runpy, sys; import rnn2jax.caffe2; rnn2jax.caffe2.install(); import rnn2jax.ops.distributed as d; "
    "d.join = lambda *args, **kwargs: None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def environment() -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}


def run_shards(python: list[str], folder: Path, name: str, *extra: str) -> list[dict]:
    """Run the script as shards 0 and 1 at once, sharing a store folder; each shard's arrays and nets."""
    store = folder / f"{name}_store"
    store.mkdir()
    commands = [
        [*python, str(SCRIPT), str(folder / f"{name}{shard}"), "--shard_id", str(shard), "--num_shards", "2",
         "--file_store_path", str(store), "--interface", "lo", *extra]
        for shard in (0, 1)
    ]  # fmt: skip
    for done in run_together(commands, TIMEOUT, cwd=folder, env=environment()):
        assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return [read_outputs(folder / f"{name}{shard}") for shard in (0, 1)]


def read_outputs(out: Path) -> dict:
    found: dict = {}
    if Path(f"{out}.npz").exists():
        with np.load(f"{out}.npz") as arrays:
            found.update(arrays)
    for kind in ("net", "init"):
        if Path(f"{out}.{kind}").exists():
            found[kind] = pb.NetDef.FromString(Path(f"{out}.{kind}").read_bytes())
    return found


def numpy_sgd(run: dict, rows: int | None = None) -> dict[str, np.ndarray]:
    """SGD on the script's MLP as math, in float64: FC, Relu, FC, Softmax, the mean cross-entropy over the
    first `rows` rows of each step's global batch (all of them by default), from shard 0's start."""
    w1, b1, w2, b2 = (run[f"start:{n}"].astype(np.float64) for n in PARAMS)
    step = 0
    while f"data:{step}" in run:
        x, label = run[f"data:{step}"][:rows].astype(np.float64), run[f"label:{step}"][:rows]
        pre = x @ w1.T + b1
        hidden = np.maximum(pre, 0)
        logits = hidden @ w2.T + b2
        prob = np.exp(logits - logits.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
        dlogits = (prob - np.eye(prob.shape[1])[label]) / len(x)
        dpre = (dlogits @ w2) * (pre > 0)
        grads = (dpre.T @ x, dpre.sum(0), dlogits.T @ hidden, dlogits.sum(0))
        w1, b1, w2, b2 = (p - float(run["lr"]) * g for p, g in zip((w1, b1, w2, b2), grads, strict=True))
        step += 1
    return dict(zip(PARAMS, (w1, b1, w2, b2), strict=True))


def assert_trained_as_one(shards: list[dict], expected: dict[str, np.ndarray], rtol: float, atol: float) -> None:
    """Every copy of every shard holds the same parameters, bit for bit, and they are `expected`."""
    for name in PARAMS:
        final = shards[0][f"cpu_0/{name}"]
        for rank, shard in enumerate(shards):
            for copy in COPIES:
                np.testing.assert_array_equal(shard[f"{copy}/{name}"], final, err_msg=f"shard {rank}: {copy}/{name}")
        np.testing.assert_allclose(final, expected[name], rtol=rtol, atol=atol, err_msg=name)


def test_two_shards_train_as_one_process_on_the_global_batch(tmp_path):
    shards = run_shards(RNN2JAX, tmp_path, "rnn2jax")
    done = subprocess.run(
        [*RNN2JAX, str(SCRIPT), str(tmp_path / "reference"), "--reference"], cwd=tmp_path, env=environment(),
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    one_process = read_outputs(tmp_path / "reference")
    for name in PARAMS:
        # the shards started apart: only the Broadcast of shard 0's start makes them train one model
        assert not np.allclose(shards[1][f"start:{name}"], shards[0][f"start:{name}"]), name
        np.testing.assert_array_equal(one_process[f"start:{name}"], shards[0][f"start:{name}"])
        assert not np.allclose(one_process[name], one_process[f"start:{name}"], atol=1e-3), f"{name} did not train"
    assert_trained_as_one(shards, {n: one_process[n] for n in PARAMS}, rtol=1e-5, atol=1e-6)
    assert_trained_as_one(shards, numpy_sgd(one_process), rtol=1e-4, atol=1e-5)
    alone = numpy_sgd(one_process, rows=ROWS_PER_SHARD)  # shard 0's rows only: what it learns by itself
    assert max(float(np.abs(shards[0][f"cpu_0/{n}"] - alone[n]).max()) for n in PARAMS) > 1e-2

    # the nets: Caffe2's collectives
    for rank, shard in enumerate(shards):
        allreduces = [op for op in shard["net"].op if op.type == "Allreduce"]
        assert [op.name for op in allreduces] == ["fc2_b_grad", "fc2_w_grad", "fc1_b_grad", "fc1_w_grad"]
        for op in allreduces:  # the two device copies of a gradient, summed with the other shard's, in place
            assert list(op.input[1:]) == list(op.output) == [f"{c}/{op.name}" for c in COPIES]
            assert op.engine == "GLOO"
        worlds = [op for op in shard["init"].op if op.type == "CreateCommonWorld"]
        assert worlds and {op.input[0] for op in worlds} == {"store_handler"}
        for op in worlds:
            args = {arg.name: arg for arg in op.arg}
            assert (args["size"].i, args["rank"].i, args["interface"].s) == (2, rank, b"lo")
        broadcasts = [op.name for op in shard["init"].op if op.type == "Broadcast"]
        assert broadcasts == sorted(broadcasts) and set(PARAMS) <= set(broadcasts)
    assert shards[0]["net"] == shards[1]["net"]


def test_two_shards_of_real_caffe2_over_gloo_build_and_train_the_same(tmp_path):
    """Real Caffe2 runs the same script as two processes (its Gloo ops, its file store): its nets are rnn2jax's
    op for op (rnn2jax's built by each shard without meeting the other), and its parameters the NumPy SGD's."""
    theirs = run_shards([str(real_caffe2_python()), "-c", CAFFE2_RUNNER], tmp_path, "caffe2")
    ours = run_shards([sys.executable, "-c", BUILD_ONLY_RUNNER], tmp_path, "rnn2jax", "--build_only")
    for rank in (0, 1):
        for kind in ("net", "init"):
            assert [op.SerializeToString() for op in ours[rank][kind].op] == [
                op.SerializeToString() for op in theirs[rank][kind].op
            ], f"shard {rank}: {kind}"
        net, caffe2_net = ours[rank]["net"], theirs[rank]["net"]
        assert (net.type, net.num_workers, list(net.arg)) == (
            caffe2_net.type,
            caffe2_net.num_workers,
            list(caffe2_net.arg),
        )
    assert_trained_as_one(theirs, numpy_sgd(theirs[0]), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# In this process: what is refused before any process meets another


def _noop(*args: object) -> list:
    return []


@pytest.mark.parametrize(
    ("rendezvous", "error", "words"),
    [
        ({"num_shards": 2}, BadArgumentError, "lacks 'kv_handler', 'shard_id', 'engine'"),
        ({"kv_handler": None, "shard_id": 2, "num_shards": 2, "engine": "GLOO"}, BadArgumentError, "shard_id 2"),
        ({"kv_handler": None, "shard_id": 0, "num_shards": 2, "engine": "MPI"}, BadArgumentError, "engine 'MPI'"),
        ({"kv_handler": "no_store", "shard_id": 0, "num_shards": 2, "engine": "GLOO"}, BadArgumentError, "no_store"),
        ("shards", BadArgumentError, "must be a dict"),
    ],
)
def test_bad_rendezvous_is_refused(rendezvous, error, words):
    model = model_helper.ModelHelper(name="refused")
    with pytest.raises(error, match=words):
        data_parallel_model.Parallelize_CPU(model, _noop, _noop, devices=[0], rendezvous=rendezvous)


def test_a_store_blob_that_is_no_store_is_refused():
    workspace.ResetWorkspace()
    workspace.FeedBlob("not_a_store", np.zeros(1, np.float32))
    rendezvous = {"kv_handler": "not_a_store", "shard_id": 0, "num_shards": 2, "engine": "GLOO"}
    with pytest.raises(BadArgumentError, match="'not_a_store' holds no store handler"):
        data_parallel_model.Parallelize_CPU(model_helper.ModelHelper(name="m"), _noop, _noop, rendezvous=rendezvous)


def test_joining_after_jax_started_says_what_to_do(tmp_path):
    """The test process has run JAX already, as a script that fed a blob before Parallelize would have."""
    from rnn2jax.caffe2.python import core

    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator("FileStoreHandlerCreate", [], ["store"], path=str(tmp_path)))
    rendezvous = {"kv_handler": "store", "shard_id": 1, "num_shards": 2, "engine": "GLOO"}
    with pytest.raises(DistributedError, match=r"before its backend.*Parallelize\) before anything computes"):
        data_parallel_model.Parallelize_CPU(model_helper.ModelHelper(name="m"), _noop, _noop, rendezvous=rendezvous)
    assert not list(tmp_path.iterdir()), "nothing was published in the store"


def test_one_shard_rendezvous_trains_with_a_barrier_net(tmp_path):
    """num_shards=1 (a store, no other process): Caffe2's single-host nets plus the barrier net, run in a
    world of one process, train as without a rendezvous."""
    from rnn2jax.caffe2.python import brew, core, optimizer

    def forward(model, loss_scale):
        assert loss_scale == 0.5
        y = brew.fc(model, "x", "y", 2, 1, weight_init=("ConstantFill", {"value": 0.5}))
        loss = model.net.AveragedLoss(model.net.SquaredL2Distance([y, "t"], "d"), "loss")
        return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    results = []
    for name, rendezvous in (
        ("one_shard", {"kv_handler": "store", "shard_id": 0, "num_shards": 1, "engine": "GLOO"}),
        ("no_rendezvous", None),
    ):
        workspace.ResetWorkspace()
        workspace.RunOperatorOnce(core.CreateOperator("FileStoreHandlerCreate", [], ["store"], path=str(tmp_path)))
        model = model_helper.ModelHelper(name=name)
        data_parallel_model.Parallelize_CPU(
            model, _noop, forward, optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1), devices=[0, 1],
            rendezvous=rendezvous,
        )  # fmt: skip
        for d in (0, 1):
            workspace.FeedBlob(f"cpu_{d}/x", np.array([[1.0, 2.0], [3.0, d]], np.float32))
            workspace.FeedBlob(f"cpu_{d}/t", np.array([[1.0], [-1.0]], np.float32))
        data_parallel_model.RunInitNet(model)
        data_parallel_model.RunNet(model, 2)
        nets = [net.Proto().name for net in model._data_parallel_model_nets]
        results.append((nets, workspace.FetchBlob("cpu_1/y_w")))
    (with_barrier, trained), (plain, expected) = results
    assert with_barrier == ["pre_training_barrier_net", "one_shard"] and plain == ["no_rendezvous"]
    np.testing.assert_array_equal(trained, expected)
    assert not np.allclose(trained, 0.5)


def test_importing_the_caffe2_modules_leaves_jax_unstarted():
    """A script imports workspace and data_parallel_model before Parallelize: neither may start JAX's backend,
    or JAX's multi-process runtime could no longer start."""
    code = (
        "import rnn2jax.caffe2; rnn2jax.caffe2.install()\n"
        "from caffe2.python import core, workspace, model_helper, brew, optimizer, data_parallel_model, dyndep\n"
        "from jax._src import xla_bridge\n"
        "assert not xla_bridge.backends_are_initialized()\n"
        "assert workspace.has_gpu_support in (True, False) and xla_bridge.backends_are_initialized()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
