"""Caffe2's Python op through `core.CreatePythonOperator` and `Net.Python`, against real Caffe2 running the
same source: tokens, builder tuples (built once per created net), what `f` raises, outputs fed and
reshaped from inside `f`, `pass_workspace`, and gradients with `grad_output_indices`/`grad_input_indices`."""

from __future__ import annotations

import numpy as np
from test_api_core import assert_same_protos, real_caffe2, run_here  # noqa: F401  (real_caffe2: a fixture)

from rnn2jax.caffe2.proto import caffe2_pb2

SOURCE = """
import sys, types
R = {}
# builders must be picklable (Caffe2 pickles the tuple into the op): define them in a module of their own
builders = types.ModuleType("python_op_builders")
sys.modules["python_op_builders"] = builders
exec('''
def counter(start, step=1):
    seen = [start]
    def f(inputs, outputs):
        outputs[0].feed(np.array([seen[0]], np.int64))
        seen[0] += step
    return f

def failing():
    raise KeyError("no such builder state")
''', builders.__dict__)
builders.np = np

def token_probe_api2(inputs, outputs):  # a name no other test registers: tokens are per process
    pass

R["tokens"] = [core.CreatePythonOperator(token_probe_api2, [], []).arg[0].s for _ in range(3)]
op = core.CreatePythonOperator(token_probe_api2, ["x"], ["y"], grad_f=token_probe_api2, name="p")
R["op"] = str(op)

def feeder(inputs, outputs):
    outputs[0].feed(np.arange(3, dtype=np.int64))
    outputs[1].reshape((2, 3))
    outputs[1].data[...] = inputs[0].data.sum()
    R["seen"] = (inputs[0].shape, str(inputs[0].data.dtype), type(inputs[0].shape).__name__)
workspace.FeedBlob("x", np.array([1.5, 2.5], np.float32))
workspace.RunOperatorOnce(core.CreatePythonOperator(feeder, ["x"], ["a", "b"]))
R["fed"] = [workspace.FetchBlob("a"), workspace.FetchBlob("b")]

def raising(inputs, outputs):
    raise ZeroDivisionError("from the op")
for run in (lambda: workspace.RunOperatorOnce(core.CreatePythonOperator(raising, [], [])),
            lambda: workspace.RunNetOnce(_net_with(raising))):
    try:
        run()
        R.setdefault("raised", []).append(None)
    except Exception as e:
        R.setdefault("raised", []).append((type(e).__name__, str(e)))

def with_ws(inputs, outputs, ws):
    outputs[0].feed(ws.blobs["x"].fetch() * 2)
workspace.RunOperatorOnce(core.CreatePythonOperator(with_ws, [], ["w"], pass_workspace=True))
R["with_ws"] = workspace.FetchBlob("w")

net = core.Net("built")
net.Python((builders.counter, [10], {"step": 5}))([], ["c"])
R["built"] = []
for _ in range(2):
    workspace.CreateNet(net, overwrite=True)
    for _ in range(2):
        workspace.RunNet(net)
        R["built"].append(int(workspace.FetchBlob("c")[0]))
bad = core.Net("bad_builder")
bad.Python((builders.failing, [], {}))([], [])
try:
    workspace.RunNetOnce(bad)
except Exception as e:
    R["builder_error"] = type(e).__name__

def three_outputs_api2(inputs, outputs):
    for i in range(3):
        outputs[i].feed(inputs[i].data * (i + 2))
def three_outputs_api2_grad(inputs, outputs):
    R.setdefault("grad_arity", []).append((len(inputs), len(outputs)))
    outputs[0].feed(inputs[6].data * 2 + inputs[7].data * 4)
g = core.Net("grads")
python_op = g.Python(three_outputs_api2, three_outputs_api2_grad, grad_output_indices=[0, 2], grad_input_indices=[0])
python_op(["x1", "x2", "x3"], ["y1", "y2", "y3"])
grads = g.AddGradientOperators(["y1", "y3"])
R["grad_ops"] = [str(o) for o in g.Proto().op[1:]]
for i, name in enumerate(["x1", "x2", "x3"]):
    workspace.FeedBlob(name, np.full(2, i + 1.0, np.float32))
workspace.RunNetOnce(g)
R["grad"] = workspace.FetchBlob(grads["x1"])
"""

HELPER = """
def _net_with(f):
    n = core.Net("raises")
    n.Python(f)([], [])
    return n
"""


def test_python_op_matches_real_caffe2(real_caffe2) -> None:  # noqa: F811
    theirs = real_caffe2(HELPER + SOURCE)
    ours = run_here(HELPER + SOURCE)
    assert ours["tokens"] == theirs["tokens"] == [b"token_probe_api2", b"token_probe_api2:1", b"token_probe_api2:2"]
    assert_same_protos([ours["op"]], [theirs["op"]], caffe2_pb2.OperatorDef)
    assert ours["seen"] == theirs["seen"]
    for mine, real in zip(ours["fed"], theirs["fed"], strict=True):
        assert mine.dtype == real.dtype and mine.shape == real.shape
        np.testing.assert_array_equal(mine, real)
    assert ours["raised"] == theirs["raised"] == [("ZeroDivisionError", "from the op")] * 2
    np.testing.assert_array_equal(ours["with_ws"], theirs["with_ws"])
    assert ours["built"] == theirs["built"] == [10, 15, 10, 15]  # one function per created net
    assert ours["builder_error"] == theirs["builder_error"] == "KeyError"
    assert_same_protos(ours["grad_ops"], theirs["grad_ops"], caffe2_pb2.OperatorDef)
    assert ours["grad_arity"] == theirs["grad_arity"] == [(8, 1)]
    np.testing.assert_array_equal(ours["grad"], theirs["grad"])
