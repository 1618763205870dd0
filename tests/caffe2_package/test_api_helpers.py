"""`caffe2.python.helpers.*`, `brew.arg_scope` and `modeling.initializers` on rnn2jax against real Caffe2.

One script builds a model through the helper modules called directly (no arg scope reaches the op),
through `brew` (the model's arg scope, then `brew.arg_scope` defaults per helper, then the call's
keywords), with `weight_init` tuples, `WeightInitializer` classes, `init_params=False` (external
parameters) and `model.create_param` with Initializer objects. Run under real Caffe2 and under
`rnn2jax exec`, the serialized nets, the parameter lists and the init net's values must be equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, caffe2_python

SCRIPT = r"""
import json, sys
import numpy as np
from caffe2.python import brew, model_helper, workspace
from caffe2.python.helpers import algebra, array_helpers, fc, nonlinearity, train
from caffe2.python.modeling import initializers

config = json.loads(sys.argv[1])
D, H = config["dims"]
m = model_helper.ModelHelper(name="m", arg_scope={"order": config["order"]})
with brew.arg_scope([brew.fc], axis=config["axis"]):
    brew.fc(m, "x", "y", D, H)
    with brew.arg_scope(brew.fc, axis=1, engine="X"):
        brew.fc(m, "y", "y1", H, H, axis=2)
fc.fc(m, "y", "z", H, 5, WeightInitializer=initializers.Initializer)
fc.fc(m, "z", "z2", 5, 5, weight_init=("ConstantFill", {"value": config["value"]}))
brew.relu(m, "z", "r")
nonlinearity.relu(m, "r", "r2")
with brew.arg_scope([brew.relu, brew.tanh], order="NHWC"):
    brew.tanh(m, "r2", "t")
    brew.relu(m, "t", "t2", order="NCHW")
brew.prelu(m, "t", "p", num_channels=2)
nonlinearity.prelu(m, "p", "p2", slope_init=("ConstantFill", {"value": 0.5}))
brew.iter(m, "it")
train.iter(m, "it2")
brew.accuracy(m, ["p", "label"], "acc", top_k=3)
brew.sub(m, ["p", "z"], "d")
algebra.mat_mul(m, ["d", "z_w"], "mm", trans_b=1)
algebra.transpose(m, "mm", "mmt", axes=[1, 0])
brew.concat(m, ["mm", "d"], "c", axis=1)
array_helpers.concat(m, ["mm", "d"], "c2", axis=1)
brew.sum(m, ["c", "c2"], "s")
algebra.sum(m, ["c", "c2"], "s2")
brew.reduce_sum(m, "s", "rs", axes=[0])
brew.softmax(m, "s", "sm")
brew.dropout(m, "sm", "dr", is_test=1, ratio=0.3)
m.create_param("given", [2, 2], initializers.Initializer("GivenTensorFill", values=[1.0, 2.0, 3.0, 4.0]))
m.create_param("ext", [3], initializers.ExternalInitializer())
m2 = model_helper.ModelHelper(name="m2", init_params=False)
fc.fc(m2, "x", "y", D, H)
brew.fc(m2, "y", "y2", H, H)
workspace.RunNetOnce(m.param_init_net)
values = {b: workspace.FetchBlob(b) for b in workspace.Blobs() if b not in ("fc", "y_w", "y1_w", "z_w")}
np.savez(sys.argv[2] + ".npz", **values)
with open(sys.argv[2] + ".pb", "wb") as f:
    for net in (m.net, m.param_init_net, m2.net, m2.param_init_net):
        f.write(net.Proto().SerializeToString() + b"\n-----\n")
with open(sys.argv[2] + ".json", "w") as f:
    json.dump([[str(p) for p in model.params] + ["|"] + [str(w) for w in model.weights] for model in (m, m2)], f)
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("helpers") / "helpers_script.py"
    path.write_text(SCRIPT)
    return path


def _run(python: list[str], script: Path, config: dict, out: Path) -> tuple[bytes, dict, list]:
    proc = subprocess.run(
        [*python, str(script), json.dumps(config), str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, f"{python[0]} failed:\n{proc.stderr[-3000:]}"
    with np.load(f"{out}.npz") as arrays:
        values = dict(arrays)
    return Path(f"{out}.pb").read_bytes(), values, json.loads(Path(f"{out}.json").read_text())


@settings(max_examples=3)
@given(
    config=st.fixed_dictionaries(
        {
            "dims": st.tuples(st.integers(1, 6), st.integers(1, 6)),
            "order": st.sampled_from(["NCHW", "NHWC"]),
            "axis": st.integers(1, 3),
            "value": st.sampled_from([0.5, -2.0]),
        }
    )
)
def test_helpers_build_caffe2s_nets(script, tmp_path_factory, config):
    python = caffe2_python()
    if not python.exists():
        pytest.fail(f"{python} is missing: `make test` creates the real-Caffe2 venv")
    out = tmp_path_factory.mktemp("helpers")
    theirs = _run([str(python)], script, config, out / "caffe2")
    ours = _run([sys.executable, "-m", "rnn2jax", "exec"], script, config, out / "rnn2jax")
    assert ours[0] == theirs[0]  # all four nets, byte for byte
    assert ours[2] == theirs[2]  # parameters and weights, in order
    assert sorted(ours[1]) == sorted(theirs[1])
    for name, value in theirs[1].items():
        np.testing.assert_array_equal(ours[1][name], value, err_msg=name)
