"""Small parts of Caffe2's `workspace` and `core` API, against real Caffe2 running the same source:
`workspace.Workspace`, `C.Workspace.has_blob`, `Blob.tensor()` (writes through to the blob),
`FillRandomNetworkInputs`, `GetOperatorCost`, `InjectCrossDeviceCopies`, `Clone` renaming blobs inside
control ops' nets, and net observers (TimeObserver, RunCountObserver)."""

from __future__ import annotations

import numpy as np
import pytest
from test_api_core import assert_same_protos, real_caffe2, run_here  # noqa: F401  (real_caffe2: a fixture)

from rnn2jax.caffe2.proto import caffe2_pb2
from rnn2jax.caffe2.python import core, workspace

SOURCE = """
R = {}
ws = workspace.Workspace()
R["same_class"] = workspace.Workspace is workspace.C.Workspace
ws.create_blob("t").feed(np.array([1.5, 2.5, 3.5]))
R["has"] = [ws.has_blob("t"), ws.has_blob("nope")]
t = ws.blobs["t"].tensor()
t.data[0] = 9.0
R["written_through"] = ws.blobs["t"].fetch()
t.init([2, 3], core.DataType.INT32)
t.data[1, 2] = 7
after = ws.blobs["t"].fetch()
R["after_init"] = (str(after.dtype), after.shape, int(after[1, 2]))  # the rest is uninitialized in Caffe2
try:
    t.init([1], core.DataType.STRING)
    R["string_init"] = "ok"
except RuntimeError:
    R["string_init"] = "RuntimeError"
t.feed(np.array([[b"ab", b"cd"]], dtype=object))
R["strings"] = ws.blobs["t"].fetch().tolist()
t.feed(np.array([4.0, 5.0]))
copy = t.fetch()
t.data[1] = -1.0
R["fetch_is_copy"] = [copy.tolist(), ws.blobs["t"].fetch().tolist()]

net = core.Net("fill")
net.Concat(["X0", "X1"], ["cat", "split"])
net.Relu("cat", "r")
net.Add(["r", "Y"], "s")
workspace.FillRandomNetworkInputs(net, [[(3, 2), (3, 2)], [(6, 2)]], [["float", "int64_t"], ["double"]])
R["filled"] = {b: (str(workspace.FetchBlob(b).dtype), workspace.FetchBlob(b).shape) for b in ["X0", "X1", "Y"]}
R["in_range"] = [bool(0 <= workspace.FetchBlob(b).min() and workspace.FetchBlob(b).max() <= 1) for b in ["X0", "X1"]]
R["fill_errors"] = []
bad_fills = [
    ([[(3, 2)]], [["float"]]),
    ([[(3, 2)] * 2], [["float"] * 2]),
    ([[(3, 2)] * 2, [(1,)]], [["float", "string"], ["float"]]),
]
for dims, types in bad_fills:
    try:
        workspace.FillRandomNetworkInputs(net, dims, types)
        R["fill_errors"].append(None)
    except RuntimeError:
        R["fill_errors"].append("RuntimeError")
    except ValueError:
        R["fill_errors"].append("ValueError")

R["costs"] = []
for x, w, kwargs in INPUTS:
    workspace.FeedBlob("X", x)
    workspace.FeedBlob("W", w)
    op = core.CreateOperator("Conv", ["X", "W"], ["Y"], **kwargs)
    R["costs"].append(tuple(workspace.GetOperatorCost(op.SerializeToString(), ["X", "W"])))
for op_type in ["Relu", "LeakyRelu", "HardSigmoid"]:
    R["costs"].append(tuple(workspace.GetOperatorCost(core.CreateOperator(op_type, ["X"], ["Y"]), ["X"])))
MOVES = [  # Concat and Split: (op type, inputs' arrays, arguments)
    ("Concat", [np.ones((2, 3), np.float32), np.ones((2, 1), np.float32)], {}),
    ("Concat", [np.ones((2, 3), np.float16)] * 2, {"axis": 2, "add_axis": 1}),
    ("Concat", [np.ones((2, 3), np.float32), np.ones((1, 3), np.int64)], {"axis": 0}),
    ("Concat", [np.ones((1, 2, 3, 4), np.int8)] * 3, {"order": "NHWC"}),
    ("Concat", [np.ones((2, 3, 4), np.float32)] * 2, {"axis": -1}),
    ("Concat", [np.ones((2, 3, 4), np.float32)] * 2, {"order": "NHWC"}),  # axis 3 of 3 dims: refused
    ("Split", [np.ones((2, 3), np.int64), np.array([1, 2], np.int32)], {"axis": 1}),
    ("Split", [np.ones((4, 2), np.int8)], {"axis": 0}),
]
for op_type, arrays, kwargs in MOVES:
    names = [f"M{i}" for i in range(len(arrays))]
    for name, value in zip(names, arrays):
        workspace.FeedBlob(name, value)
    outputs = ["cat", "info"] if op_type == "Concat" else ["p", "q"]
    try:
        moved = core.CreateOperator(op_type, names, outputs, **kwargs)
        R["costs"].append(tuple(workspace.GetOperatorCost(moved, names)))
    except RuntimeError:
        R["costs"].append("RuntimeError")
try:
    workspace.GetOperatorCost(core.CreateOperator("Sigmoid", ["X"], ["Y"]), ["X"])
except RuntimeError as e:
    R["no_cost"] = "Cost inference function not defined" in str(e)

init = core.Net("init")
with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0, node_name="a")):
    init.ConstantFill([], "w", shape=[2])
train = core.Net("train")
train.Proto().external_input.extend(["w"])
with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0, node_name="b")):
    train.Proto().op.extend([core.CreateOperator("Placeholder:Recv", [], ["w_recv"])])
    train.Relu(["w_recv"], "y")
    train.Relu(["w"], "w")
init2, devices = core.InjectCrossDeviceCopies(init, placeHolderOps=["Placeholder:Recv"])
train2, devices = core.InjectCrossDeviceCopies(train, devices, placeHolderOps=["Placeholder:Recv"])
R["injected"] = [str(init2.Proto()), str(train2.Proto())]
R["devices"] = sorted(devices)

outer = core.Net("outer")
then_net, loop_net = core.Net("then"), core.Net("loop")
then_net.Relu("a", "b")
loop_net.Relu("a", "c")
outer.If(["cond"], [], then_net=then_net.Proto())
outer.While(["cond"], [], loop_net=loop_net.Proto())
R["cloned"] = str(outer.Clone("cloned", blob_remap={"a": "z", "cond": "k"}).Proto())

observed = core.Net("observed")
observed.Relu("x", "y")
workspace.FeedBlob("x", np.ones(3, np.float32))
workspace.CreateNet(observed)
timer = observed.AddObserver("TimeObserver")
counter = observed.AddObserver("RunCountObserver")
R["observers"] = [observed.NumObservers(), bool(np.isnan(timer.average_time()))]
workspace.RunNet(observed)
workspace.RunNet(observed.Name(), 2)
R["observers"] += [timer.average_time() > 0, counter.debug_info(), timer.debug_info()]
observed.RemoveObserver(timer)
R["observers"].append(observed.NumObservers())
for net, kind in ((observed, "NoSuchObserver"), (core.Net("not_created"), "TimeObserver")):
    try:
        net.AddObserver(kind)
    except RuntimeError:
        R["observers"].append("RuntimeError")
"""

CONV_CASES = [
    (
        np.zeros((1, 8, 8, 8)),
        np.zeros((1, 1, 3, 3)),
        dict(stride_h=1, stride_w=1, pad_t=1, pad_l=1, pad_b=1, pad_r=1, kernel=3),
    ),
    (np.zeros((2, 3, 9, 7), np.float32), np.zeros((4, 3, 3, 2), np.float32), dict(kernel_h=3, kernel_w=2, stride=2)),
    (np.zeros((2, 6, 5, 3), np.float32), np.zeros((5, 2, 2, 3), np.float32), dict(kernel=2, pad=1, order="NHWC")),
]


def test_workspace_extras_match_real_caffe2(real_caffe2) -> None:  # noqa: F811
    theirs = real_caffe2(SOURCE, CONV_CASES)
    ours = run_here(SOURCE, CONV_CASES)
    assert ours["same_class"] and theirs["same_class"]
    assert ours["has"] == theirs["has"] == [True, False]
    assert ours["written_through"].dtype == theirs["written_through"].dtype
    np.testing.assert_array_equal(ours["written_through"], theirs["written_through"])
    assert ours["after_init"] == theirs["after_init"] == ("int32", (2, 3), 7)
    assert ours["string_init"] == theirs["string_init"] == "RuntimeError"
    assert ours["strings"] == theirs["strings"]
    assert ours["fetch_is_copy"] == theirs["fetch_is_copy"] == [[4.0, 5.0], [4.0, -1.0]]
    assert ours["filled"] == theirs["filled"]
    assert ours["in_range"] == theirs["in_range"] == [True, True]
    assert ours["fill_errors"] == theirs["fill_errors"]
    assert ours["costs"] == theirs["costs"]
    assert ours["no_cost"] and theirs["no_cost"]
    assert_same_protos(ours["injected"], theirs["injected"], caffe2_pb2.NetDef)
    assert ours["devices"] == theirs["devices"]
    assert_same_protos([ours["cloned"]], [theirs["cloned"]], caffe2_pb2.NetDef)
    assert ours["observers"] == theirs["observers"]
    assert ours["observers"] == [
        2,
        True,
        True,
        "This operator runs 3 times.",
        "Not implemented.",
        1,
        *["RuntimeError"] * 2,
    ]


def test_cost_inference_rnn2jax_lacks_is_named() -> None:
    workspace.FeedBlob("X", np.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="does not carry Caffe2's cost inference of FC"):
        workspace.GetOperatorCost(core.CreateOperator("FC", ["X", "X", "X"], ["Y"]), ["X", "X", "X"])
    workspace.ResetWorkspace()
