"""`caffe2.python.data_parallel_model` (CPU devices) on rnn2jax against real Caffe2.

One Caffe2 script (below) builds a small FC model with `data_parallel_model.Parallelize_CPU` over drawn
devices, with either a per-device parameter-update builder (Iter, LearningRate, WeightedSum) or an
optimizer builder (`optimizer.build_sgd` with momentum), runs `RunInitNet`, then a few `RunNet`
iterations with a different batch per device and iteration. The same file runs under real Caffe2 and
under `rnn2jax exec`; both write the nets they built and every blob's final value:

* the training net and the init net must be equal OperatorDef for OperatorDef (the init net's
  device-0 -> device-k Copy ops compared as a set: Caffe2 emits them in the order of a Python set of
  strings, which depends on the process's hash seed);
* every parameter, gradient, optimizer state, loss and learning rate must agree, and all devices'
  parameter copies must stay equal (the all-reduce), which a NumPy model of data-parallel SGD written
  here also checks for the plain update builder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnn2jax.caffe2.python import data_parallel_model, model_helper
from rnn2jax.errors import BadArgumentError
from rnn2jax.proto import caffe2_pb2 as pb
from tests.conftest import ROOT, caffe2_python

SCRIPT = r"""
import json, sys
import numpy as np
from caffe2.python import brew, core, data_parallel_model, model_helper, optimizer, workspace

config = json.loads(open(sys.argv[1]).read())
out = sys.argv[2]
rng = np.random.RandomState(config["seed"])
D, H, O, B = config["dims"]
devices = config["devices"]
w1 = rng.randn(H, D).astype(np.float32) * 0.5
w2 = rng.randn(O, H).astype(np.float32) * 0.5
model = model_helper.ModelHelper(name="dpm_test")


def input_builder(model):
    pass  # the data are fed per device: cpu_<d>/data, cpu_<d>/label


def forward(model, loss_scale):
    h = brew.fc(model, "data", "fc1", D, H, weight_init=("GivenTensorFill", {"values": w1}))
    h = brew.relu(model, h, "relu1")
    y = brew.fc(model, h, "fc2", H, O, weight_init=("GivenTensorFill", {"values": w2}),
                bias_init=("ConstantFill", {"value": 0.1}))
    dist = model.net.SquaredL2Distance([y, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def update(model):
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-config["lr"], policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        model.WeightedSum([param, one, model.param_to_grad[param], lr], param)


def build_optimizer(model):
    return optimizer.build_sgd(model, config["lr"], policy="fixed", momentum=0.9)


if config["mode"] == "update":
    kwargs = {"param_update_builder_fun": update}
else:
    kwargs = {"optimizer_builder_fun": build_optimizer}
data_parallel_model.Parallelize_CPU(model, input_builder_fun=input_builder, forward_pass_builder_fun=forward,
                                    devices=devices, **kwargs)
feeds = {}
for step in range(config["steps"]):
    for d in devices:
        feeds["step%d/cpu_%d/data" % (step, d)] = data = rng.randn(B, D).astype(np.float32)
        feeds["step%d/cpu_%d/label" % (step, d)] = label = rng.randn(B, O).astype(np.float32)
        workspace.FeedBlob("cpu_%d/data" % d, data)
        workspace.FeedBlob("cpu_%d/label" % d, label)
    if step == 0:
        data_parallel_model.RunInitNet(model)  # creates the net: its inputs must exist by then
    data_parallel_model.RunNet(model, 1)
blobs = {}
for name in workspace.Blobs():
    value = workspace.FetchBlob(name)
    if isinstance(value, np.ndarray) and value.dtype != object:
        blobs["blob:" + name] = value
np.savez(out + ".npz", **blobs, **{"feed:" + k: v for k, v in feeds.items()})
with open(out + ".nets", "wb") as f:
    f.write(model.net.Proto().SerializeToString())
with open(out + ".init", "wb") as f:
    f.write(model.param_init_net.Proto().SerializeToString())
info = {
    "grad_names": list(model._grad_names),
    "param_names": list(model._param_names),
    # Caffe2 answers only with an optimizer: with an update builder, model._optimizer was never set.
    "lr_blobs": [str(b) for b in data_parallel_model.GetLearningRateBlobNames(model)]
    if config["mode"] == "optimizer" else None,
    "checkpoint": sorted(str(b) for b in data_parallel_model.GetCheckpointParams(model)),
    "devices": list(model.GetDevices()),
}
with open(out + ".json", "w") as f:
    json.dump(info, f)
"""


# The real-Caffe2 venv has no networkx, which caffe2.python.memonger imports at module level and
# data_parallel_model imports memonger; memonger is only used for optimize_gradient_memory, which the
# script does not ask for, so the Caffe2 run gets an empty stand-in module.
CAFFE2_RUNNER = (
    "import runpy, sys, types; sys.modules.setdefault('networkx', types.ModuleType('networkx')); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _run(python: list[str], script: Path, config: dict, out: Path) -> dict[str, Any]:
    config_path = out.with_suffix(".config.json")
    config_path.write_text(json.dumps(config))
    proc = subprocess.run(
        [*python, str(script), str(config_path), str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, f"{python[0]} failed:\n{proc.stderr[-3000:]}"
    nets = [pb.NetDef.FromString(Path(f"{out}.{kind}").read_bytes()) for kind in ("nets", "init")]
    with np.load(f"{out}.npz") as arrays:
        values = dict(arrays)
    return {"net": nets[0], "init": nets[1], "values": values, "info": json.loads(Path(f"{out}.json").read_text())}


def _ops(net: pb.NetDef) -> list[bytes]:
    return [op.SerializeToString() for op in net.op]


def _assert_same_init(ours: pb.NetDef, theirs: pb.NetDef) -> None:
    def split(net: pb.NetDef) -> tuple[list[bytes], list[bytes]]:
        copies = [op.SerializeToString() for op in net.op if op.type == "Copy"]
        return [op.SerializeToString() for op in net.op if op.type != "Copy"], sorted(copies)

    assert split(ours) == split(theirs)
    types = [op.type for op in ours.op]
    if "Copy" in types:  # the parameter syncs come after every fill
        assert set(types[types.index("Copy") :]) == {"Copy"}


def _numpy_reference(config: dict, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Data-parallel SGD as math: device d's loss is 0.5 * mean_b ||y - label||^2 / len(devices); the
    gradients summed over devices, times -lr, update the one shared parameter set."""
    d_in, hidden, d_out, batch = config["dims"]
    devices = config["devices"]
    rng = np.random.RandomState(config["seed"])  # the script's initial weights
    w1 = (rng.randn(hidden, d_in).astype(np.float32) * 0.5).astype(np.float64)
    w2 = (rng.randn(d_out, hidden).astype(np.float32) * 0.5).astype(np.float64)
    b1, b2 = np.zeros(hidden), np.full(d_out, 0.1)
    for step in range(config["steps"]):
        grads = [np.zeros_like(w1), np.zeros_like(b1), np.zeros_like(w2), np.zeros_like(b2)]
        for d in devices:
            x = feeds[f"feed:step{step}/cpu_{d}/data"].astype(np.float64)
            label = feeds[f"feed:step{step}/cpu_{d}/label"].astype(np.float64)
            pre = x @ w1.T + b1
            h = np.maximum(pre, 0)
            y = h @ w2.T + b2
            dy = (y - label) / batch / len(devices)
            grads[2] += dy.T @ h
            grads[3] += dy.sum(0)
            dh = (dy @ w2) * (pre > 0)
            grads[0] += dh.T @ x
            grads[1] += dh.sum(0)
        lr = config["lr"]
        w1, b1, w2, b2 = w1 - lr * grads[0], b1 - lr * grads[1], w2 - lr * grads[2], b2 - lr * grads[3]
    return {"fc1_w": w1, "fc1_b": b1, "fc2_w": w2, "fc2_b": b2}


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    return {
        "devices": draw(st.sampled_from([[0, 1], [0, 1, 2], [1, 3], [0]]), "devices"),
        "dims": [draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(1, 4))],
        "mode": draw(st.sampled_from(["update", "optimizer"]), "mode"),
        "lr": draw(st.sampled_from([0.05, 0.2]), "lr"),
        "steps": draw(st.integers(1, 3), "steps"),
        "seed": draw(st.integers(0, 2**16), "seed"),
    }


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dpm") / "dpm_script.py"
    path.write_text(SCRIPT)
    return path


@settings(max_examples=4)
@given(config=configs())
def test_parallelize_cpu_matches_caffe2(script, tmp_path_factory, config):
    python = caffe2_python()
    if not python.exists():
        pytest.fail(f"{python} is missing: `make test` creates the real-Caffe2 venv")
    out = tmp_path_factory.mktemp("dpm")
    theirs = _run([str(python), "-c", CAFFE2_RUNNER], script, config, out / "caffe2")
    ours = _run([sys.executable, "-m", "rnn2jax", "exec"], script, config, out / "rnn2jax")

    assert _ops(ours["net"]) == _ops(theirs["net"])
    assert ours["net"].type == theirs["net"].type == "dag"
    assert ours["net"].num_workers == theirs["net"].num_workers
    assert list(ours["net"].arg) == list(theirs["net"].arg)
    _assert_same_init(ours["init"], theirs["init"])
    assert ours["info"] == theirs["info"]

    # rnn2jax's CreateMutex blob is a placeholder int32 scalar (a tensor to FetchBlob); Caffe2's is no tensor.
    assert set(ours["values"]) - set(theirs["values"]) <= {"blob:iteration_mutex"}
    assert set(theirs["values"]) <= set(ours["values"])
    for name, value in theirs["values"].items():
        np.testing.assert_allclose(ours["values"][name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    values = ours["values"]
    devices = config["devices"]
    for param in ("fc1_w", "fc1_b", "fc2_w", "fc2_b"):
        for d in devices[1:]:  # the all-reduce keeps every copy equal
            np.testing.assert_array_equal(values[f"blob:cpu_{d}/{param}"], values[f"blob:cpu_{devices[0]}/{param}"])
    if config["mode"] == "update":
        expected = _numpy_reference(config, values)
        for param, value in expected.items():
            np.testing.assert_allclose(
                values[f"blob:cpu_{devices[0]}/{param}"], value, rtol=1e-4, atol=1e-5, err_msg=param
            )


def _noop(*args: Any) -> list:
    return []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cpu_device": False}, "GPU"),
        ({"cpu_device": True, "rendezvous": {"num_shards": 2}}, "rendezvous"),
        ({"cpu_device": True, "shared_model": True}, "shared_model"),
        ({"cpu_device": True, "combine_spatial_bn": True}, "combine_spatial_bn"),
        ({"cpu_device": True, "optimize_gradient_memory": True}, "memonger"),
        ({"cpu_device": True, "param_update_builder_fun": _noop, "optimizer_builder_fun": _noop}, "one of"),
    ],
)
def test_unsupported_options_are_refused(kwargs, match):
    model = model_helper.ModelHelper(name="refused")
    with pytest.raises(BadArgumentError, match=match):
        data_parallel_model.Parallelize(model, _noop, _noop, devices=[0, 1], **kwargs)


def test_forward_only_model_gets_device_scopes():
    """A test model (no update builder): per-device copies under `cpu_<d>/`, no gradients, no syncs."""
    from rnn2jax.caffe2.python import brew

    model = model_helper.ModelHelper(name="fwd", init_params=False)

    def forward(m: Any, loss_scale: float) -> list:
        assert loss_scale == pytest.approx(1 / 3)
        return [brew.fc(m, "x", "y", 2, 3)]

    data_parallel_model.Parallelize_CPU(model, _noop, forward, devices=[0, 2, 5])
    assert [list(op.input) for op in model.net.Proto().op] == [
        [f"cpu_{d}/x", f"cpu_{d}/y_w", f"cpu_{d}/y_b"] for d in (0, 2, 5)
    ]
    assert [op.device_option.device_id for op in model.net.Proto().op] == [0, 2, 5]
    assert list(model._device_grouped_blobs) == ["y_w", "y_b"]
    assert model.GetDevices() == [0, 2, 5] and not model.param_init_net.Proto().op
