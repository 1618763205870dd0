"""Caffe2's nomnigraph bindings (`caffe2_pybind11_state`'s NNModule, NNGraph, NodeRef, matching, annotations,
the NetDef conversions) and its ONNX DummyName, against real Caffe2 running the same calls.

One script of calls runs here and in the real-Caffe2 venv (torch 1.10.2); what each gives back (node names,
execution orders, the converted NetDefs, whether a call is refused) must be the same. NetDefs are compared as
messages; where Caffe2 writes external inputs/outputs from a hash set (no old NetDef given), as sets.
"""

from __future__ import annotations

import pickle
import subprocess

import pytest

import rnn2jax.caffe2.python._import_c_extension as C
from rnn2jax.caffe2.proto import caffe2_pb2
from rnn2jax.caffe2.python import core
from rnn2jax.errors import BadArgumentError
from tests.conftest import real_caffe2_python

SCRIPT = """\
R = {}


def netdef(nn, old=None):
    return nn.convertToCaffe2Proto(old if old is not None else caffe2_pb2.NetDef())


def raises(f):
    try:
        f()
    except Exception:
        return True
    return False


# 1. Ops of many kinds, arguments, device options, external inputs and outputs (one unused, one unknown)
net = core.Net("rich")
net.Proto().type = "dag"
net.Proto().num_workers = 3
net.Conv(["X", "w", "b"], ["y"], kernel=3, pad=1, order="nchw", engine="CUDNN",
         device_option=core.DeviceOption(caffe2_pb2.CPU, 0))
net.SpatialBN(["y", "s", "bb", "m", "v"], ["z"], is_test=1, epsilon=1e-3)
net.Relu("z", "z", device_option=core.DeviceOption(1, 2))
net.Add(["z", "X"], "q", broadcast=1, engine="E", name="adder")
net.FC(["q", "W2", "b2"], "f", axis=1)
net.Clip("f", "c", min=-1.0, max=1.0)
net.Concat(["c", "f"], ["cat", "split"], axis=1, order="NHWC")
net.MaxPool("cat", "p", kernel=2, order="NCHW")
net.Copy("p", "z")
net.GivenTensorFill([], "g", shape=[2], values=[1.0, 2.0], node_name="n1")
net.Sum(["g", "g"], "h")
net.Proto().external_input.extend(["unused"])
net.Proto().external_output.extend(["z", "h", "nonexistent"])
nn, ops = C.NNModuleFromProtobuf(net.Proto().SerializeToString())
R["rich_names"] = [n.getName() for n in nn.dataFlow().getMutableNodes()]
R["rich_ops"] = [n.getName() for n in ops]
R["rich"] = netdef(nn, net.Proto())
R["rich_noold"] = netdef(nn)

# 2. Edits: replace a node by one from an OperatorDef, a new op inserted mid-net, device types, names
net = core.Net("edit")
net.Mul(["a", "b"], "c")
net.Add(["c", "d"], "e")
net.Relu("e", "f")
nn, ops = C.NNModuleFromProtobuf(net.Proto().SerializeToString())
dfg = nn.dataFlow()
mul, add, relu = ops
new = dfg.createNode(core.CreateOperator("Sub", [], [], engine="X", arg=[]))
dfg.replaceNode(mul, new)
dfg.deleteNode(mul)
sq = dfg.createNode(C.NeuralNetOperator("Sqr"))
c = add.inputs[0]
t = nn.createUniqueDataNode("c")
dfg.deleteEdge(c, add)
dfg.createEdge(c, sq)
dfg.createEdge(sq, t)
dfg.createEdge(t, add)
add.getAnnotation().setDeviceType(7)
relu.getAnnotation().setDeviceType(7)
plain = dfg.createNode(C.NeuralNetOperator("Conv"))
dfg.createEdge(relu.outputs[0], plain)
u = nn.createUniqueDataNode("c")
dfg.createEdge(plain, u)
R["edit_order"] = [n.getName() for n in nn.getExecutionOrder()]
R["edit_unique"] = [t.getName(), u.getName()]
R["edit"] = netdef(nn, net.Proto())

# 3. Rewire (Caffe2's test_simple_rewire), then replaceProducer / replaceAllUsesWith / replaceAsConsumer
net = core.Net("rewire")
net.Mul(["a", "b"], ["c"])
net.Add(["c", "d"], ["e"])
nn, (mul, add) = C.NNModuleFromProtobuf(net.Proto().SerializeToString())
dfg = nn.dataFlow()
a, b = mul.inputs
c = mul.outputs[0]
d = add.inputs[1]
e = add.outputs[0]
for x, y in [(a, mul), (b, mul), (mul, c), (c, add), (d, add), (add, e)]:
    dfg.deleteEdge(x, y)
for x, y in [(a, add), (d, add), (add, c), (c, mul), (b, mul), (mul, e)]:
    dfg.createEdge(x, y)
R["rewire"] = netdef(nn, net.Proto())
net = core.Net("replace")
net.FC(["X", "W"], ["Y"])
net.FC(["X", "W2"], ["Y2"])
nn, (fc1, fc2) = C.NNModuleFromProtobuf(net.Proto().SerializeToString())
dfg = nn.dataFlow()
T = dfg.createNode(C.NeuralNetData("T"))
C.replaceAllUsesWith(fc1.inputs[0], T)
op = dfg.createNode(C.NeuralNetOperator("TestOp"))
C.replaceProducer(fc1.outputs[0], op)
op2 = dfg.createNode(core.CreateOperator("Tanh", [], []))
C.replaceAsConsumer(fc2, op2)
dfg.deleteNode(fc1)
dfg.deleteNode(fc2)
R["replace_order"] = [n.getName() for n in nn.getExecutionOrder()]
R["replace"] = netdef(nn, net.Proto())

# 4. Distributed: Declare and Export ops carrying the blobs' device options
net = core.Net("dist")
net.FC(["X", "W"], ["Y"])
net.Proto().external_output.extend(["Y"])
d1 = core.DeviceOption(caffe2_pb2.CPU, 0)
d1.node_name = "host1"
d2 = core.DeviceOption(caffe2_pb2.CPU, 1)
nn = C.NNModuleFromProtobufDistributed(
    net.Proto().SerializeToString(), {"X": d1.SerializeToString(), "Y": d2.SerializeToString()})
R["dist"] = netdef(nn, net.Proto())
R["dist_unused"] = raises(lambda: C.NNModuleFromProtobufDistributed(
    net.Proto().SerializeToString(), {"Fake": d1.SerializeToString()}))

# 5. Refusals, annotations, matching, DummyName
nn = C.NNModule()
dfg = nn.dataFlow()
x = dfg.createNode(C.NeuralNetData("x"))
y = dfg.createNode(C.NeuralNetData("y"))
R["edge_tensors"] = raises(lambda: dfg.createEdge(x, y))
R["node_int"] = raises(lambda: dfg.createNode(7))
annot = C.Annotation()
R["annot"] = [annot.getDevice(), annot.getDeviceType(), annot.hasDeviceOption(), annot.getComponentLevels(),
              raises(annot.getKeyNode), raises(lambda: annot.operator_def), raises(lambda: annot.device_option)]
mg = C.NNMatchGraph()
m1 = mg.createNode(C.NeuralNetOperator("Relu"), strict=True)
m2 = mg.createNode(C.NeuralNetData("t"), strict=True)
m3 = mg.createNode(strict=False)
mg.createEdge(m1, m2)
mg.createEdge(m2, m3)
net = core.Net("match")
net.Relu("a", "b")
net.Relu("b", "c")
net.Tanh("c", "d")
nn, _ = C.NNModuleFromProtobuf(net.Proto().SerializeToString())
R["match"] = [len(C.matchSubgraph(n, mg)) for n in nn.dataFlow().getMutableNodes()]
g = C.DummyName()
g.reset()
first = [g.new_dummy_name() for _ in range(3)]
g.reset({"OC2_DUMMY_1", "x"})
R["dummy"] = first + [g.new_dummy_name() for _ in range(3)]
"""

REAL_PRELUDE = """import pickle, sys
from caffe2.python import core
from caffe2.proto import caffe2_pb2
import caffe2.python._import_c_extension as C
"""


def _netdef(data: bytes, unordered_externals: bool) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef.FromString(data)
    if unordered_externals:
        for field in ("external_input", "external_output"):
            names = sorted(getattr(net, field))
            net.ClearField(field)
            getattr(net, field).extend(names)
    return net


@pytest.fixture(scope="module")
def theirs(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("nomnigraph")
    script, result = directory / "calls.py", directory / "calls.pkl"
    script.write_text(REAL_PRELUDE + SCRIPT + f"\npickle.dump(R, open({str(result)!r}, 'wb'), protocol=4)\n")
    done = subprocess.run([str(real_caffe2_python()), str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return pickle.loads(result.read_bytes())


def test_same_as_caffe2(theirs: dict) -> None:
    scope = {"core": core, "caffe2_pb2": caffe2_pb2, "C": C}
    exec(compile(SCRIPT, "<nomnigraph calls>", "exec"), scope)
    ours = scope["R"]
    assert sorted(ours) == sorted(theirs)
    for key, real in theirs.items():
        mine = ours[key]
        if isinstance(real, bytes):
            unordered = key.endswith("noold")
            mine, real = _netdef(mine, unordered), _netdef(real, unordered)
        assert mine == real, f"{key}: ours\n{mine}\nCaffe2's\n{real}"


def test_round_trip_keeps_the_net() -> None:
    """A NetDef through a module and back is itself, where no op is one nomnigraph rewrites (ops without a
    converter gain the annotation's device type)."""
    net = core.Net("keep")
    net.Relu("x", "y", device_option=core.DeviceOption(caffe2_pb2.CPU, 1))
    net.Sum(["y", "x"], "x")
    net.Proto().external_output.extend(["x"])
    nn, _ = C.NNModuleFromProtobuf(net.Proto().SerializeToString())
    assert caffe2_pb2.NetDef.FromString(nn.convertToCaffe2Proto(net.Proto())) == net.Proto()


def test_deleted_operator_leaves_the_control_flow() -> None:
    net = core.Net("delete")
    net.Relu("x", "y")
    net.Tanh("y", "z")
    nn, (relu, tanh) = C.NNModuleFromProtobuf(net.Proto().SerializeToString())
    nn.dataFlow().deleteNode(relu)
    assert [n.getName() for n in nn.getExecutionOrder()] == ["Tanh"]
    assert not tanh.inputs[0].hasProducer()


def test_replace_subgraph_and_dot() -> None:
    nn = C.NNModule()
    dfg = nn.dataFlow()
    a, x, b = (dfg.createNode(v) for v in (C.NeuralNetOperator("a"), C.NeuralNetData("x"), C.NeuralNetOperator("b")))
    dfg.createEdge(a, x)
    dfg.createEdge(x, b)
    assert repr(dfg).startswith("digraph G {\nrankdir=LR\n") and '[label="a",shape="box",];' in repr(dfg)
    mg = C.NNMatchGraph()
    ma, mx, mb = (
        mg.createNode(C.NeuralNetOperator("a"), True),
        mg.createNode(C.NeuralNetData("x"), True),
        mg.createNode(),
    )
    mg.createEdge(ma, mx)
    mg.createEdge(mx, mb)
    match = C.matchSubgraph(a, mg)
    assert len(match) == 3 and not C.matchSubgraph(b, mg)
    new = dfg.createNode(C.NeuralNetOperator("new"))
    nn.replaceSubgraph(match, new, [], [])
    assert [n.getName() for n in nn.getExecutionOrder()] == ["new"]


def test_refusals_are_rnn2jax_errors() -> None:
    nn = C.NNModule()
    x = nn.dataFlow().createNode(C.NeuralNetData("x"))
    with pytest.raises(BadArgumentError, match="between NeuralNetOperator and NeuralNetData"):
        nn.dataFlow().createEdge(x, x)
    with pytest.raises(BadArgumentError, match="createNode takes either OperatorDef"):
        nn.dataFlow().createNode(7)
    with pytest.raises(BadArgumentError, match="Invalid kernel argument"):
        nn.dataFlow().createNode(core.CreateOperator("Conv", [], [], kernel=1.5))
    with pytest.raises(BadArgumentError, match="Unused names in the blob map"):
        C.NNModuleFromProtobufDistributed(
            core.Net("d").Proto().SerializeToString(), {"Fake": caffe2_pb2.DeviceOption().SerializeToString()}
        )
