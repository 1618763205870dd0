"""The compat `core` module: what it builds and the Python op, against real Caffe2 running the same code.

Each comparison runs one piece of Caffe2 Python source twice: here, with `core`/`workspace` from
`rnn2jax.caffe2.python`, and in the real-Caffe2 venv (torch 1.10.2) with `from caffe2.python import ...`.
Protos are compared as messages (text formatting differs between protobuf versions), numbers with
`assert_allclose`. In-process tests check the Python op against NumPy written here.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rnn2jax.caffe2.proto import caffe2_pb2
from rnn2jax.caffe2.python import core, workspace
from rnn2jax.ops import gradient_makers

ROOT = Path(__file__).resolve().parents[2]
_PRELUDE = """import numpy as np
from caffe2.python import core, workspace
from caffe2.proto import caffe2_pb2

def _arrays(obj):  # NumPy 2's pickles do not load in the Caffe2 venv's NumPy 1: arrays come as raw bytes
    if isinstance(obj, tuple) and obj[:1] == ("__ndarray__",):
        return np.frombuffer(obj[3], dtype=obj[1]).reshape(obj[2]).copy()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_arrays(item) for item in obj)
    return obj
"""


def _encoded(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        return ("__ndarray__", obj.dtype.str, obj.shape, obj.tobytes())
    if isinstance(obj, list | tuple):
        return type(obj)(_encoded(item) for item in obj)
    return obj


@pytest.fixture(scope="module")
def real_caffe2(caffe2, tmp_path_factory):
    """Runs Caffe2 source in the real-Caffe2 venv; returns its `R` (the `caffe2` fixture decides whether
    that venv is available, as for every oracle test)."""
    python = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python"))
    directory = tmp_path_factory.mktemp("real_caffe2")

    def run(source: str, inputs: object = None) -> dict:
        name = uuid.uuid4().hex[:8]
        script, data, result = (directory / f"{name}{suffix}" for suffix in (".py", ".in.pkl", ".out.pkl"))
        data.write_bytes(pickle.dumps(_encoded(inputs), protocol=4))
        script.write_text(
            _PRELUDE
            + f"import pickle\nINPUTS = _arrays(pickle.load(open({str(data)!r}, 'rb')))\n"
            + textwrap.dedent(source)
            + f"\npickle.dump(R, open({str(result)!r}, 'wb'), protocol=4)\n"
        )
        done = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return pickle.loads(result.read_bytes())

    return run


def run_here(source: str, inputs: object = None) -> dict:
    """The same source on rnn2jax, in a workspace of its own, with net names counted from scratch (as in
    the fresh Caffe2 process)."""
    used = set(core.Net._net_names_used)
    core.Net._net_names_used = set()
    previous = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace(f"core_test_{uuid.uuid4().hex[:8]}", True)
    scope = {"np": np, "core": core, "workspace": workspace, "caffe2_pb2": caffe2_pb2, "INPUTS": inputs}
    try:
        exec(compile(textwrap.dedent(source), "<caffe2 source>", "exec"), scope)
    finally:
        workspace.ResetWorkspace()
        workspace.SwitchWorkspace(previous)
        core.Net._net_names_used = used | core.Net._net_names_used
    return scope["R"]


def parsed(text: str, message_type: type) -> object:
    message = message_type()
    text_format.Parse(text, message)
    return message


def assert_same_protos(ours: list[str], theirs: list[str], message_type: type) -> None:
    assert len(ours) == len(theirs)
    for mine, real in zip(ours, theirs, strict=True):
        assert parsed(mine, message_type) == parsed(real, message_type), f"ours:\n{mine}\nCaffe2:\n{real}"


# --------------------------------------------------------------------------------------------------
# Building ops and nets

BUILDER = """
R = {}
op = core.CreateOperator("Conv", ["x", "w"], "y", name="c", kernel=3, pads=[1, 1, 1, 1], alpha=0.5,
                         order="NCHW", engine="CUDNN", random_seed=7,
                         device_option=core.DeviceOption(caffe2_pb2.CPU, 0))
R["ops"] = [str(op)]
with core.NameScope("outer"):
    with core.NameScope("inner"):
        R["ops"].append(str(core.CreateOperator("Relu", ["a", core.BlobReference("ref")], "b")))
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        R["ops"].append(str(core.CreateOperator("Relu", "a", "b")))
R["names"] = [core.Net("basics").Name() for _ in range(3)]
net = core.Net("auto")
a = net.Relu("x")
b = net.Relu(a)
c, d = net.Split(b, 2, axis=0)
e = c.Add(d, "e")
net.AddExternalOutput(e)
with core.NameScope("s"):
    f = net.Sigmoid(e, "f")
    net.Sum([f, "loose"], "g")
R["net"] = [str(net.Proto())]
R["refs"] = [str(a), str(b), str(c), str(d), str(e), str(f), repr(e), e.GetUnscopedName(), f.GetNameScope()]
clone = net.Clone("auto_clone", blob_remap={"x": "x2"})
R["clone"] = [clone.Name(), list(clone.Proto().op[0].input), list(clone.Proto().external_input)]
grad_map = net.AddGradientOperators(["g"])
R["net"].append(str(net.Proto()))
R["grad_map"] = sorted((str(k), str(v)) for k, v in grad_map.items())
ops, gm = core.GradientRegistry.GetBackwardPass([core.CreateOperator("FC", ["X", "W", "B"], "Y")], {"Y": "Y_grad"})
R["ops"] += [str(o) for o in ops]
R["bp_map"] = sorted((str(k), str(v)) for k, v in gm.items())
gops, gin = core.GradientRegistry.GetGradientForOp(core.CreateOperator("Mul", ["A", "B"], "C"), ["C_grad"])
R["ops"] += [str(o) for o in gops]
R["gfo"] = [str(x) for x in gin]
R["is_operator"] = [core.IsOperator("FC"), core.IsOperator("NoSuchOpXyz")]
"""


def test_built_ops_nets_names_and_gradients_match_caffe2(real_caffe2):
    ours, theirs = run_here(BUILDER), real_caffe2(BUILDER)
    assert_same_protos(ours.pop("ops"), theirs.pop("ops"), caffe2_pb2.OperatorDef)
    assert_same_protos(ours.pop("net"), theirs.pop("net"), caffe2_pb2.NetDef)
    assert ours == theirs
    assert ours["names"] == ["basics", "basics_1", "basics_2"]  # what Caffe2 gave: the check is not vacuous
    assert ours["refs"][6] == 'BlobReference("e")'


# --------------------------------------------------------------------------------------------------
# The Python op, forward and gradient

PYTHON_OP = """
def f(inputs, outputs):
    x, w = inputs[0].data, inputs[1].data
    outputs[0].reshape(x.shape)
    outputs[0].data[...] = x * x * w
    outputs[1].feed(np.array([x.sum()], dtype=np.float32))

def grad_f(inputs, outputs):
    x, w, y, s, dy, ds = (t.data for t in inputs)
    outputs[0].reshape(x.shape)
    outputs[0].data[...] = 2 * x * w * dy + ds[0]
    outputs[1].reshape(w.shape)
    outputs[1].data[...] = x * x * dy

def grad_x_only(inputs, outputs):  # grad_output_indices=[0], grad_input_indices=[0]
    x, w, y, s, dy = (t.data for t in inputs)
    outputs[0].reshape(x.shape)
    outputs[0].data[...] = 2 * x * w * dy

def scaled(inputs, outputs, ws):  # pass_workspace: reads a blob the op does not take as input
    outputs[0].feed(inputs[0].data * ws.blobs["factor"].fetch())

R = {"runs": []}
net = core.Net("py")
y, s = net.Python(f, grad_f)(["x", "w"], ["y", "s"])
r = net.Tanh(y, "r")
tot = net.SumElements([r], "tot")
t2 = net.Add([tot, s], "t2")
R["grad_map"] = sorted((str(k), str(v)) for k, v in net.AddGradientOperators([t2]).items())
part = core.Net("py_part")
part.Python(f, grad_x_only, grad_output_indices=[0], grad_input_indices=[0])(["x", "w"], ["y2", "s2"])
part.Tanh("y2", "r2")
part.SumElements(["r2"], "tot2")
R["part_map"] = sorted((str(k), str(v)) for k, v in part.AddGradientOperators(["tot2"]).items())
ws_net = core.Net("py_ws")
ws_net.Python(scaled, pass_workspace=True)(["x"], ["xs"])
R["ops"] = [
    (op.type, list(op.input), list(op.output), [a.name for a in op.arg], [list(a.ints) for a in op.arg][:2],
     op.is_gradient_op)
    for n in (net, part, ws_net) for op in n.Proto().op
]
for x, w in INPUTS:
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("w", w)
    workspace.FeedBlob("factor", np.array(3.0, np.float32))
    workspace.RunNetOnce(net)
    run = {k: workspace.FetchBlob(k) for k in ["y", "s", "r", "t2", "x_grad", "w_grad"]}
    workspace.RunNetOnce(part)  # writes x_grad again
    workspace.RunNetOnce(ws_net)
    run.update({k: workspace.FetchBlob(k) for k in ["y2", "s2", "xs"]})
    run["part_x_grad"] = workspace.FetchBlob("x_grad")
    R["runs"].append(run)
"""


def python_op_inputs() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(5)
    shapes = [(2, 3), (1,), (0, 4), (3, 1, 2)]
    return [tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(2)) for shape in shapes]


def test_python_op_forward_and_gradients_match_caffe2(real_caffe2):
    inputs = python_op_inputs()
    ours, theirs = run_here(PYTHON_OP, inputs), real_caffe2(PYTHON_OP, inputs)
    assert ours["grad_map"] == theirs["grad_map"] and ours["part_map"] == theirs["part_map"]
    # Caffe2's tokens are the function's name with a counter ('f', 'f:1'); ours differ, so compare the rest.
    assert ours["ops"] == theirs["ops"]
    python_gradient = [op for op in ours["ops"] if op[0] == "PythonGradient"]
    assert [op[1] for op in python_gradient] == [
        ["x", "w", "y", "s", "y_grad", "s_grad"],
        ["x", "w", "y2", "s2", "y2_grad"],
    ]
    assert len(ours["runs"]) == len(theirs["runs"]) == len(inputs)
    for mine, real, (x, w) in zip(ours["runs"], theirs["runs"], inputs, strict=True):
        assert mine.keys() == real.keys()
        for key in mine:
            assert mine[key].shape == real[key].shape, key
            np.testing.assert_allclose(mine[key], real[key], rtol=1e-5, atol=1e-5, err_msg=key)
        # and against NumPy: d/dx [sum(tanh(x^2 w)) + sum(x)] = 2xw(1 - tanh^2) + 1
        dr = 1 - np.tanh(x * x * w) ** 2
        np.testing.assert_allclose(mine["x_grad"], 2 * x * w * dr + 1, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mine["w_grad"], x * x * dr, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mine["part_x_grad"], 2 * x * w * dr, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mine["xs"], 3 * x, rtol=1e-6)


@given(
    x=hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        elements=st.floats(-4, 4, width=32),
    ),
    power=st.integers(1, 3),
)
def test_python_op_in_a_net_with_jitted_ops_around_it(x, power):
    def pow_f(inputs, outputs):
        outputs[0].feed(inputs[0].data ** power)

    def pow_grad(inputs, outputs):
        x_value, _, dy = (t.data for t in inputs)
        outputs[0].feed(power * x_value ** (power - 1) * dy)

    net = core.Net("hyp_py")
    doubled = net.Scale("x", "x2", scale=2.0)
    powered = net.Python(pow_f, pow_grad)(doubled, "p")
    net.Relu(powered, "out")
    grads = net.AddGradientOperators({"out": "out_grad"})
    workspace.SwitchWorkspace("hyp_py", True)
    try:
        workspace.ResetWorkspace()
        workspace.FeedBlob("x", x)
        out_grad = np.ones_like(x) * 0.5
        workspace.FeedBlob("out_grad", out_grad)
        workspace.RunNetOnce(net)
        p = (2 * x) ** power
        np.testing.assert_allclose(workspace.FetchBlob("out"), np.maximum(p, 0), rtol=1e-5, atol=1e-5)
        expected = 2 * power * (2 * x) ** (power - 1) * out_grad * (p > 0)
        np.testing.assert_allclose(workspace.FetchBlob(grads["x"]), expected, rtol=1e-5, atol=1e-5)
    finally:
        workspace.SwitchWorkspace("default")


def make_adder(amount, *, sign=1):
    """A Python op builder: module-level, as Caffe2 pickles the (func, args, kwargs) tuple into the op."""
    return lambda inputs, outputs: outputs[0].feed(inputs[0].data + sign * amount)


def test_python_op_builders_and_func_types():
    class Doubler:  # Caffe2's python_func_type: constructed with f, exposes forward and backward
        def __init__(self, offset):
            self.offset = offset

        def forward(self, inputs, outputs):
            outputs[0].feed(inputs[0].data * 2 + self.offset)

        def backward(self, inputs, outputs):
            outputs[0].feed(inputs[2].data * 2)

    net = core.Net("builders")
    net.Python(1.5, python_func_type=Doubler)("x", "d")
    net.Python((make_adder, (4.0,), {"sign": -1}))("x", "a")  # a (func, args, kwargs) builder, pickled
    grads = net.AddGradientOperators({"d": "d_grad"})
    x = np.array([1.0, -2.0], np.float32)
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("d_grad", np.array([1.0, 3.0], np.float32))
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("d"), x * 2 + 1.5)
    np.testing.assert_array_equal(workspace.FetchBlob("a"), x - 4.0)
    np.testing.assert_array_equal(workspace.FetchBlob(grads["x"]), [2.0, 6.0])
    workspace.ResetWorkspace()


def test_python_op_without_gradient_function_fails_when_its_gradient_runs():
    net = core.Net("no_grad_f")
    net.Python(lambda inputs, outputs: outputs[0].feed(inputs[0].data))("x", "y")
    net.AddGradientOperators({"y": "y_grad"})
    workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.FeedBlob("y_grad", np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match=r"PythonGradient.*without a gradient function"):
        workspace.RunNetOnce(net)
    workspace.ResetWorkspace()


# --------------------------------------------------------------------------------------------------
# A user's Python gradient

REGISTERED = """
@core.GradientRegistry.RegisterGradient("Floor")
def floor_grad(op, g_output):  # straight-through, halved: Caffe2 has no Floor gradient of its own
    return ([core.CreateOperator("Scale", [g_output[0]], [op.input[0] + "_grad"], scale=0.5)],
            [op.input[0] + "_grad"])

@core.GradientRegistry.RegisterGradient("Relu")
def relu_grad(op, g_output):  # Caffe2 keeps its own ReluGradient: the C++ maker comes first
    return [core.CreateOperator("Copy", [g_output[0]], [op.input[0] + "_grad"])], [op.input[0] + "_grad"]

net = core.Net("floor")
net.Floor("x", "fx")
net.Relu("x", "rx")
net.Sum(["fx", "rx", "x"], "z")
grad_map = net.AddGradientOperators(["z"])
workspace.FeedBlob("x", INPUTS)
workspace.RunNetOnce(net)
R = {"ops": [str(op) for op in net.Proto().op], "x_grad": workspace.FetchBlob("x_grad"),
     "grad_map": sorted((str(k), str(v)) for k, v in grad_map.items())}
"""


@pytest.fixture
def restore_gradient_registry():
    saved = {t: gradient_makers._OVERRIDES.get(t) for t in ("Floor", "Relu")}
    saved_python = dict(core.GradientRegistry.gradient_registry_)
    yield
    for op_type, maker in saved.items():
        if maker is None:
            gradient_makers._OVERRIDES.pop(op_type, None)
        else:
            gradient_makers._OVERRIDES[op_type] = maker
    core.GradientRegistry.gradient_registry_.clear()
    core.GradientRegistry.gradient_registry_.update(saved_python)


def test_registered_python_gradient_matches_caffe2(real_caffe2, restore_gradient_registry):
    x = np.array([-1.5, 0.25, 2.0, -0.5], np.float32)
    ours, theirs = run_here(REGISTERED, x), real_caffe2(REGISTERED, x)
    assert_same_protos(ours["ops"], theirs["ops"], caffe2_pb2.OperatorDef)
    assert ours["grad_map"] == theirs["grad_map"]
    np.testing.assert_allclose(ours["x_grad"], theirs["x_grad"], rtol=1e-6)
    np.testing.assert_allclose(ours["x_grad"], 0.5 + (x > 0) + 1, rtol=1e-6)
    types = [parsed(text, caffe2_pb2.OperatorDef) for text in ours["ops"]]
    scale = next(op for op in types if op.type == "Scale")
    assert not scale.is_gradient_op  # a Python maker's ops are used as returned, as in Caffe2
    assert any(op.type == "ReluGradient" and op.is_gradient_op for op in types)
    # Registering again replaces the Python maker (Caffe2's dict), still behind the C++ one.
    core.GradientRegistry.RegisterGradient("Floor")(
        lambda op, g: ([core.CreateOperator("Copy", [g[0]], [op.input[0] + "_grad"])], [op.input[0] + "_grad"])
    )
    ops, _ = core.GradientRegistry.GetGradientForOp(core.CreateOperator("Floor", "x", "y"), ["y_grad"])
    assert [op.type for op in ops] == ["Copy"]


RUN_ALL_ON_GPU_AND_ENFORCE = """
R = {}
step = core.Net("step")
step.Relu(["x"], "y")
net = core.Net("gpu")
net.RecurrentNetwork(["x"], ["x"], step_net=step.Proto())
net.Relu(["x"], "z")
net.RunAllOnGPU(gpu_id=3, use_cudnn=True)
proto = net.Proto()
R["gpu"] = [proto.device_option.device_type, proto.device_option.device_id, [op.engine for op in proto.op],
            proto.op[0].arg[0].n.device_option.device_id, proto.op[0].arg[0].n.op[0].engine]
for kind in ("", "dag", "async_scheduling"):
    bad = core.Net("bad" + kind)
    bad.Proto().type = kind
    bad.Split("a", ["b", "c"], axis=0)
    workspace.FeedBlob("a", np.array([1, 2, 3], dtype=np.float32))
    try:
        workspace.RunNetOnce(bad)
    except RuntimeError as error:
        R[kind] = str(error).startswith("[enforce fail at ")
"""


def test_run_all_on_gpu_marks_the_net_and_op_refusals_read_as_caffe2s(real_caffe2):
    """RunAllOnGPU sets the device option (and CUDNN engines) down into RecurrentNetwork step nets, as
    Caffe2's does; an op's refusal is a RuntimeError opening with "[enforce fail at", whatever the net type
    (core_test.py's test_rnn_run_on_gpu and test_async_exception_handling)."""
    theirs = real_caffe2(RUN_ALL_ON_GPU_AND_ENFORCE)
    assert run_here(RUN_ALL_ON_GPU_AND_ENFORCE) == theirs
    assert theirs["dag"] is True
