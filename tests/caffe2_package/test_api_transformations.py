"""`caffe2.python.transformations` (the C extension's nomnigraph passes): each rewritten net equals, byte for
byte, the one real Caffe2 writes, and FuseConvBN leaves the same folded weights and biases in the workspace."""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rnn2jax.caffe2.proto import caffe2_pb2
from rnn2jax.caffe2.python import core, workspace

CAFFE2_PYTHON = os.environ.get(
    "RNN2JAX_CAFFE2_PYTHON", str(Path(__file__).resolve().parents[2] / ".venv-caffe2" / "bin" / "python")
)
C = workspace.C

# Real Caffe2's side: for each case (pass, serialized net, blobs), the rewritten net (or the error) and the blobs.
_SCRIPT = """
import pickle, sys
import numpy as np
from caffe2.python import workspace
import caffe2.python._import_c_extension as C
out = []
for name, net, blobs in pickle.load(open(sys.argv[1], "rb")):
    workspace.ResetWorkspace()
    for k, v in blobs.items():
        workspace.FeedBlob(k, np.frombuffer(v[0], np.float32).reshape(v[1]))
    try:
        if C.workspace_transform_exists(name):
            new = C.run_workspace_transform(name, net)
        else:
            new = C.run_transform(name, net)
        fetched = {b: workspace.FetchBlob(b) for b in workspace.Blobs()}
        out.append((new, {b: (v.tobytes(), v.shape) for b, v in fetched.items()}))
    except RuntimeError as e:
        out.append((None, str(e).splitlines()[0]))
pickle.dump(out, open(sys.argv[2], "wb"))
"""


def _conv(net: core.Net, x: str, y: str, bias: bool = True, **kwargs) -> None:
    net.Conv(
        [x, "w", "b"] if bias else [x, "w"], [y], **{"stride": 1, "pad": 0, "kernel": 3, "order": "NCHW", **kwargs}
    )


def _nnpack_nets() -> list[core.Net]:
    nets = []
    for relus in ([("Y", "Y2")], [("Y", "Y2"), ("Y", "Y3")], [("Y", "X")], [("Y", "Y")]):
        net = core.Net("n")
        _conv(net, "X", "Y")
        for a, b in relus:
            net.Relu([a], [b])
        nets.append(net)
    net = core.Net("pingpong")  # Relu back into the conv's input, then a conv reading it
    _conv(net, "X", "Y")
    net.Relu(["Y"], ["X"])
    _conv(net, "X", "Y")
    nets.append(net)
    net = core.Net("followed")  # the fused output is read and written again by the next ops
    _conv(net, "X", "Y")
    net.Relu(["Y"], ["Y"])
    _conv(net, "Y", "Y2")
    net.Relu(["Y2"], ["Y2"])
    nets.append(net)
    net = core.Net("mixed")  # lower-case order, ops without converters, unused external blobs, strides, kernels
    _conv(net, "X", "Y", order="nchw")
    net.Softmax(["Y"], ["S"])
    net.SpatialBN(["S", "s", "bb", "m", "v"], ["Z"], is_test=1)
    net.Sum(["Z", "X"], ["Q"])
    net.Conv(["Q", "w", "b"], ["P"], stride=2, kernel=3, order="NCHW")
    net.Conv(["P", "w", "b"], ["R"], kernel_h=1, kernel_w=3, order="NCHW")
    net.Conv(["R", "w", "b"], ["T"], kernel=3, order="NHWC")
    net.Conv(["T", "w"], ["U"], kernel=3, order="NCHW")
    net.Relu(["U"], ["V"])
    net.Proto().external_input.extend(["fake"])
    net.Proto().external_output.extend(["Q", "fakeout", "V"])
    nets.append(net)
    return nets


def _dead_code_net() -> core.Net:
    net = core.Net("dead")
    net.Relu(["X"], ["A"])
    net.Relu(["A"], ["B"])  # read by nothing, not external
    net.Sigmoid(["X"], ["C"])
    net.Proto().external_output.extend(["C"])
    return net


def _bn_case(seed: int, order: str, bias: bool, eps: float, kernels: list[int] | None = None, clash: bool = False):
    rng = np.random.default_rng(seed)
    net = core.Net("bn")
    c, k = 3, 3
    inputs = ["X", "w", "b"] if bias else ["X", "w"]
    if kernels:
        net.Conv(inputs, ["Y"], kernels=kernels)
        net.SpatialBN(["Y", "scale", "bias", "mean", "var"], ["Y2"], is_test=True, epsilon=eps)
        blobs = {"X": (1, c, 6, 6, 6), "w": (c, c, *kernels)}
    else:
        net.Conv(inputs, ["Y"], stride=1, pad=0, kernel=k, order=order)
        bn_bias = "_bias0" if clash else "bias"
        net.SpatialBN(["Y", "scale", bn_bias, "mean", "var"], ["Y2"], is_test=True, order=order, epsilon=eps)
        blobs = {"X": (1, c, 7, 7) if order == "NCHW" else (1, 7, 7, c)}
        blobs["w"] = (c, c, k, k) if order == "NCHW" else (c, k, k, c)
    values = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in blobs.items()}
    for name in (["b"] if bias else []) + ["scale", "_bias0" if clash else "bias", "mean"]:
        values[name] = rng.standard_normal(c).astype(np.float32)
    values["var"] = (rng.random(c) + 0.5).astype(np.float32)
    return net, values


BN_CASES = [
    _bn_case(1, "NCHW", True, 1e-2),
    _bn_case(2, "NHWC", True, 1e-5),
    _bn_case(3, "NCHW", False, 1e-3),
    _bn_case(4, "NHWC", False, 1e-3, clash=True),
    _bn_case(5, "NCHW", True, 1e-4, kernels=[3, 2, 3]),
]


@functools.cache
def _cases() -> list[tuple[str, core.Net, dict]]:
    """Built once: core.Net makes each net's name unique, so a second build would differ from what Caffe2 saw."""
    cases: list[tuple[str, core.Net, dict]] = []
    for net in _nnpack_nets():
        cases.append(("AddNNPACK", net, {}))
        with_nnpack = core.Net(net.Proto())
        with_nnpack.Proto().ParseFromString(C.transform_addNNPACK(net.Proto().SerializeToString()))
        cases.append(("FuseNNPACKConvRelu", with_nnpack, {}))
    cases.append(("DeadCodeElim", _dead_code_net(), {}))
    cases.extend(("FuseConvBN", net, blobs) for net, blobs in BN_CASES)
    cases.append(("NoSuchPass", _dead_code_net(), {}))
    return cases


@pytest.fixture(scope="module")
def real_results(caffe2, tmp_path_factory) -> list:
    """Each case run by real Caffe2 (the `caffe2` fixture builds, or skips without, its venv)."""
    folder = tmp_path_factory.mktemp("transformations")
    request = [
        (name, net.Proto().SerializeToString(), {k: (v.tobytes(), v.shape) for k, v in blobs.items()})
        for name, net, blobs in _cases()
    ]  # no NumPy pickles: the two venvs' NumPy versions differ
    (folder / "in.pkl").write_bytes(pickle.dumps(request))
    subprocess.run(
        [CAFFE2_PYTHON, "-c", _SCRIPT, str(folder / "in.pkl"), str(folder / "out.pkl")],
        capture_output=True,
        timeout=300,
        check=True,
    )
    return pickle.loads((folder / "out.pkl").read_bytes())


def _ours(name: str, net: core.Net, blobs: dict) -> tuple[bytes | None, dict | str]:
    workspace.ResetWorkspace()
    for k, v in blobs.items():
        workspace.FeedBlob(k, v)
    try:
        if C.workspace_transform_exists(name):
            new = C.run_workspace_transform(name, net.Proto().SerializeToString())
        else:
            new = C.run_transform(name, net.Proto().SerializeToString())
    except RuntimeError as error:
        return None, str(error)
    return new, {b: workspace.FetchBlob(b) for b in workspace.Blobs()}


def _as_net(data: bytes) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef()
    net.ParseFromString(data)
    return net


def test_registries_are_real_caffe2s() -> None:
    assert [n for n in ("AddNNPACK", "FuseNNPACKConvRelu", "DeadCodeElim", "FuseConvBN") if C.transform_exists(n)] == [
        "AddNNPACK",
        "FuseNNPACKConvRelu",
        "DeadCodeElim",
    ]
    assert C.workspace_transform_exists("FuseConvBN") and not C.workspace_transform_exists("AddNNPACK")


def test_rewritten_nets_and_blobs_equal_real_caffe2s(real_results: list) -> None:
    for (name, net, blobs), (real_net, real_blobs) in zip(_cases(), real_results, strict=True):
        ours_net, ours_blobs = _ours(name, net, blobs)
        if real_net is None:
            assert ours_net is None and "Pass doesn't exist: NoSuchPass" in ours_blobs, (name, ours_blobs)
            continue
        assert _as_net(ours_net) == _as_net(real_net), (name, net.Proto())
        assert ours_net == real_net
        assert sorted(ours_blobs) == sorted(real_blobs)
        for blob, (data, shape) in real_blobs.items():
            value = np.frombuffer(data, np.float32).reshape(shape)
            if blob.startswith("_bias") and blob not in blobs:
                continue  # Caffe2 folds into a new bias it never initialized: compared below
            np.testing.assert_array_equal(ours_blobs[blob], value, err_msg=f"{name}: {blob}")


@pytest.mark.parametrize("case", range(len(BN_CASES)))
def test_fused_conv_bn_computes_the_unfused_net(case: int) -> None:
    """The fused net computes what Conv + SpatialBN did, up to nomnigraph's epsilon (1e-5, whatever the op's)."""
    net, blobs = BN_CASES[case]
    workspace.ResetWorkspace()
    for k, v in blobs.items():
        workspace.FeedBlob(k, v)
    bn = net.Proto().op[1]
    bn.arg[[a.name for a in bn.arg].index("epsilon")].f = 1e-5
    workspace.RunNetOnce(net)
    expected = workspace.FetchBlob("Y2")
    fused = core.Net("fused")
    fused.Proto().ParseFromString(C.transform_fuseConvBN(net.Proto().SerializeToString()))
    assert [op.type for op in fused.Proto().op] == ["Conv"]
    workspace.RunNetOnce(fused)
    np.testing.assert_allclose(workspace.FetchBlob("Y2"), expected, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# workspace.ApplyTransform: caffe2/transforms' registry

_APPLY_SCRIPT = """
import sys
from caffe2.proto import caffe2_pb2
import caffe2.python._import_c_extension as C
key, data = sys.argv[1], open(sys.argv[2], "rb").read()
try:
    sys.stdout.buffer.write(C.apply_transform(key.encode(), data))
except RuntimeError as e:
    sys.stdout.write("ERROR " + str(e).splitlines()[0])
"""


def _transform_nets() -> dict[str, core.Net]:
    conv = core.Net("convs")
    conv.FC(["data", "w0", "b0"], ["fc"])
    conv.Conv(["fc", "w", "b"], ["c1"], kernel=3, engine="CUDNN")
    conv.Conv(["c1", "w", "b"], ["c2"], kernel=3, engine="NNPACK")
    conv.Conv(["c2", "w", "b"], ["c3"], kernel=3, device_option=core.DeviceOption(caffe2_pb2.CUDA))
    conv.Relu(["c3"], ["c3"])
    cse = core.Net("cse")
    cse.Relu(["X"], ["A"])
    cse.FC(["A", "w", "b"], ["F1"])
    cse.FC(["A", "w", "b"], ["F2"])  # the same FC of the same A: one op writing transform/F1
    cse.FC(["A", "w", "b"], ["F3"], axis=2)  # other arguments
    cse.Relu(["X"], ["B"])
    cse.Relu(["X"], ["B2"])  # Relu is not among the ops it merges
    cse.Sum(["F1", "F2", "F3", "B", "B2"], ["S"])
    cse.LearningRate(["it"], ["lr1"], base_lr=0.1, policy="fixed")
    cse.LearningRate(["it"], ["lr2"], base_lr=0.1, policy="fixed")
    cse.Proto().external_output.extend(["S", "lr1"])
    return {"ConvToNNPack": conv, "CommonSubexpressionElimination": cse, "definitely_not_a_real_transform": cse}


@pytest.mark.parametrize("key", list(_transform_nets()))
def test_apply_transform_equals_real_caffe2s(caffe2, tmp_path: Path, key: str) -> None:
    net = _transform_nets()[key].Proto()
    (tmp_path / "net.pb").write_bytes(net.SerializeToString())
    done = subprocess.run(
        [CAFFE2_PYTHON, "-c", _APPLY_SCRIPT, key, str(tmp_path / "net.pb")], capture_output=True, timeout=300
    )
    if done.stdout.startswith(b"ERROR "):
        with pytest.raises(RuntimeError, match="Transform not found in registry: definitely_not_a_real_transform"):
            workspace.ApplyTransform(key, net)
        assert b"Transform not found in registry: definitely_not_a_real_transform" in done.stdout
        return
    assert workspace.ApplyTransform(key, net).SerializeToString() == done.stdout


def test_apply_transform_if_faster_gives_one_of_the_two_nets() -> None:
    workspace.ResetWorkspace()
    init = core.Net("init")
    init.ConstantFill([], ["data"], shape=[2, 3, 5, 5], value=1.0)
    init.ConstantFill([], ["w"], shape=[3, 3, 3, 3], value=0.5)
    init.ConstantFill([], ["b"], shape=[3], value=0.0)
    net = core.Net("timed")
    net.Conv(["data", "w", "b"], ["y"], kernel=3)
    net.Relu(["y"], ["y"])
    transformed = workspace.ApplyTransform("ConvToNNPack", net.Proto())
    chosen = workspace.ApplyTransformIfFaster("ConvToNNPack", net.Proto(), init.Proto(), warmup_runs=1, main_runs=2)
    assert chosen in (net.Proto(), transformed)
    # never chosen when it must be 1000 times faster
    slow = workspace.ApplyTransformIfFaster("ConvToNNPack", net.Proto(), init.Proto(), improvement_threshold=1000.0)
    assert slow == net.Proto()
    assert workspace.Blobs() == []  # timed in workspaces of its own
    with pytest.raises(RuntimeError, match="Number of main runs should be positive, provided 0"):
        workspace.ApplyTransformIfFaster("ConvToNNPack", net.Proto(), init.Proto(), main_runs=0)
