"""Caffe2's Python API as its own API/runtime test files (workspace_test.py, core_test.py, scope_test.py, ...)
meet it: each piece of Caffe2 source runs here and in the real-Caffe2 venv, and the answers are compared.
"""

from __future__ import annotations

from test_api_core import assert_same_protos, real_caffe2, run_here  # noqa: F401  (real_caffe2: a fixture)

from rnn2jax.caffe2.proto import caffe2_pb2

DEVICE_OPTIONS = """
R = {}
pairs = []
for t1, i1, t2, i2 in [(None, 5, None, 0), (0, 5, None, 0), (1, 0, None, 0), (1, 0, 0, 0), (1, 1, 1, 1),
                       (1, 1, 1, 2), (0, 0, 0, 3)]:
    a, b = caffe2_pb2.DeviceOption(), caffe2_pb2.DeviceOption()
    if t1 is not None:
        a.device_type = t1
    if t2 is not None:
        b.device_type = t2
    a.device_id, b.device_id = i1, i2
    pairs.append(core.device_option_equal(a, b))
R["equal"] = pairs
R["engine"] = [core.IsOperatorWithEngine("Relu", "DEFAULT"), core.IsOperatorWithEngine("Relu", "NOEXIST"),
               core.IsOperatorWithEngine("NoSuchOpXyz", "DEFAULT")]
R["registered"] = [name in core._REGISTERED_OPERATORS for name in ("Relu", "FC", "NoSuchOpXyz")]
"""


def test_device_option_equality_and_registered_operators_match_caffe2(real_caffe2):  # noqa: F811
    assert run_here(DEVICE_OPTIONS) == real_caffe2(DEVICE_OPTIONS)


GRADIENT_SCHEMA = """
R = {}
net = core.Net("test_net")
a, b, one = net.AddExternalInput("a", "b", "one")
m1 = net.Mul(a, b)  # Mul reading a alone, writing b: its schema wants two inputs
sub = net.Sub([m1, one])
try:
    net.AddGradientOperators([sub])
    R["error"] = None
except Exception as e:
    R["error"] = "schema checking" in str(e)
ops = [core.CreateOperator("Relu", "x", "h", device_option=core.DeviceOption(
           caffe2_pb2.CPU, extra_info=["{}:1".format(core.IR.ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG)])),
       core.CreateOperator("Sigmoid", "x", "k"), core.CreateOperator("Add", ["h", "k"], "y")]
grad_ops, grad_map = core.IR(ops).GetBackwardPass({"y": "y_grad"})
R["ir"] = [str(op) for op in grad_ops]
R["map"] = sorted((str(k), str(v)) for k, v in grad_map.items())
R["tags"] = [core.IR.IS_AUTO_GEN_SUM_OPS_TAG, core.IR.ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG]
"""


def test_ir_and_gradient_makers_schema_check_match_caffe2(real_caffe2):  # noqa: F811
    ours, theirs = run_here(GRADIENT_SCHEMA), real_caffe2(GRADIENT_SCHEMA)
    assert ours["error"] is True and theirs["error"] is True
    assert_same_protos(ours.pop("ir"), theirs.pop("ir"), caffe2_pb2.OperatorDef)
    assert ours == theirs


SCOPES = """
from caffe2.python import scope
R = {}
with core.NameScope("a"), core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0, extra_info=["z", "b"])):
    with scope.EmptyNameScope():
        R["inner_name"] = scope.CurrentNameScope()
        R["op"] = str(core.CreateOperator("Relu", "x", "y"))
    with scope.EmptyDeviceScope():
        R["inner_device"] = scope.CurrentDeviceScope()
        R["op"] += str(core.CreateOperator("Relu", "x", "y"))
    R["outer"] = [scope.CurrentNameScope(), str(scope.CurrentDeviceScope())]
"""


def test_empty_name_and_device_scopes_match_caffe2(real_caffe2):  # noqa: F811
    ours, theirs = (
        run_here(SCOPES.replace("from caffe2.python import scope", "from rnn2jax.caffe2.python import scope")),
        real_caffe2(SCOPES),
    )
    assert ours == theirs


WORKSPACE = """
import os
R = {"root": [workspace.RootFolder()]}
workspace.ResetWorkspace("/tmp/caffe2-api-root")
R["root"].append(workspace.RootFolder())
R["switch"] = workspace.SwitchWorkspace(workspace.CurrentWorkspace())
R["sizes"] = []
for value in [np.zeros((2, 3), np.float16), np.zeros(5, np.int64), np.array([True, False]),
              np.array([b"ab", b"cde"]), np.array([b"ab", b"c" * 40], dtype=object), b"plain"]:
    workspace.FeedBlob("sized", value)
    R["sizes"].append(workspace.GetBlobSizeBytes("sized"))
try:
    workspace.GetBlobSizeBytes("no_such_blob")
except RuntimeError:
    R["sizes"].append("RuntimeError")
workspace.StartImmediate(i_know=True)
folder = workspace._immediate_root_folder
net = core.Net("immediate")
net.ConstantFill([], "filled", shape=[2], value=3.0)
net.AddGradientOperators([])
R["immediate"] = [workspace.IsImmediate(), os.path.isdir(folder), workspace.ImmediateBlobs(),
                  workspace.FetchImmediate("filled").tolist(), workspace.HasBlob("filled")]
workspace.StopImmediate()
R["immediate"] += [workspace.IsImmediate(), os.path.exists(folder), workspace._immediate_root_folder]
"""


def test_workspace_root_folder_blob_sizes_and_immediate_mode_match_caffe2(real_caffe2):  # noqa: F811
    assert run_here(WORKSPACE) == real_caffe2(WORKSPACE)


PREDICTOR_AND_BLOBS = """
R = {}
init, predict = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
predict.name = "predict"
predict.external_input[:] = ["A", "B"]
predict.external_output[:] = ["C"]
predict.op.extend([core.CreateOperator("MatMul", ["A", "B"], ["C"])])
init.op.extend([core.CreateOperator("GivenTensorFill", [], ["A"], shape=(2, 3), values=[1.0] * 6),
                core.CreateOperator("GivenTensorFill", [], ["B"], shape=(3, 4), values=[2.0] * 12)])
predictor = workspace.Predictor(init.SerializeToString(), predict.SerializeToString())
R["list"] = [o.tolist() for o in predictor.run([np.full((2, 3), 3.0, np.float32)])]
R["map"] = [o.tolist() for o in predictor.run({"B": np.ones((3, 1), np.float32)})]
R["blobs_after"] = workspace.Blobs()
ws = workspace.C.Workspace()
R["serde"] = []
for name, value in [("t", np.arange(6, dtype=np.int32).reshape(2, 3)), ("s", b"bytes"),
                    ("f", np.array([1.5, -2.0], np.float64))]:
    ws.create_blob(name).feed(value)
    copy = ws.create_blob(name + "_serde")
    copy.deserialize(ws.blobs[name].serialize(name))
    fetched = copy.fetch()
    R["serde"].append([fetched.tolist(), str(fetched.dtype)] if isinstance(fetched, np.ndarray) else fetched)
try:
    ws.create_net("...")
except TypeError:
    R["create_net_str"] = "TypeError"
"""


def test_predictor_blob_serde_and_create_net_match_caffe2(real_caffe2):  # noqa: F811
    assert run_here(PREDICTOR_AND_BLOBS) == real_caffe2(PREDICTOR_AND_BLOBS)


BACKGROUND_PLAN = """
R = {}
for name, shape in [("ok", [2]), ("bad", [-5])]:
    net = core.Net("bg_" + name)
    net.ConstantFill([], "bg_" + name, shape=shape, value=1.0)
    plan = core.Plan("plan_" + name)
    plan.AddStep(core.ExecutionStep("step_" + name, net))
    background = workspace.RunPlanInBackground(plan)
    while not background.is_done():
        pass
    try:
        R[name] = background.is_succeeded()
    except RuntimeError:
        R[name] = "RuntimeError"
R["blob"] = workspace.FetchBlob("bg_ok").tolist()
"""


def test_plan_in_background_matches_caffe2(real_caffe2):  # noqa: F811
    assert run_here(BACKGROUND_PLAN) == real_caffe2(BACKGROUND_PLAN)


CLONE_PARTIAL_AND_REROUTE = """
R = {}
n = core.Net("n")
h = n.Relu(["x"], "h")
k = n.Sigmoid([h], "k")
m = n.Add([k, "y"], "m")
n.AddExternalOutput(n.Tanh([m], "out"))
part, outs = n.ClonePartial("part", {h: "h_in"}, ["out"])
R["partial"] = [str(part.Proto()), [str(o) for o in outs]]
part2, outs2 = n.ClonePartial("", ["k"], ["m"])
R["partial2"] = [str(part2.Proto()), [str(o) for o in outs2]]
ssa, versions = core.get_ssa(n)
R["ssa"] = [ssa, sorted(versions.items()), core.get_op_ids_in_path(ssa, versions, ["h"], ["out"])]
r = core.Net("r")
r.AddExternalInput("a")
b = r.Relu(["a"], "b")
r.Sigmoid([b], "c")
r.AddExternalOutput(b)
consumers = [r.Proto().op[1]]
count = r.reroute_tensor("b", core.CreateOperator("Copy", ["b"], ["b_copy"]), can_modify=consumers)
R["reroute"] = [count, str(r.Proto())]
"""


def test_clone_partial_get_ssa_and_reroute_tensor_match_caffe2(real_caffe2):  # noqa: F811
    ours, theirs = run_here(CLONE_PARTIAL_AND_REROUTE), real_caffe2(CLONE_PARTIAL_AND_REROUTE)
    for key in ("partial", "partial2", "reroute"):
        assert_same_protos(
            [ours[key].pop(-1 if key == "reroute" else 0)],
            [theirs[key].pop(-1 if key == "reroute" else 0)],
            caffe2_pb2.NetDef,
        )
    assert ours == theirs


TRACEBACKS = """
import sys
net = core.Net("traced")
a, b = net.AddExternalInput("a", "b")
c = net.Mul([a, b], "c"); line = sys._getframe().f_lineno
c.Relu([], "d")
before = [op.name for op in net.Proto().op]
net.PopulateProtoWithFileName()
file, number, function = net.Proto().op[0].name.rsplit(":", 2)
R = {"before": before, "mul": [int(number) == line, function, file == sys._getframe().f_code.co_filename],
     "relu": net.Proto().op[1].name.rsplit(":", 2)[2], "recorded": sorted(workspace.operator_tracebacks[net.Name()])}
"""


def test_operator_tracebacks_name_ops_as_caffe2(real_caffe2):  # noqa: F811
    assert run_here(TRACEBACKS) == real_caffe2(TRACEBACKS)


MAKE_ARGUMENT = """
from caffe2.python import utils
R = [str(utils.MakeArgument("v", value)) for value in [
    np.arange(6, dtype=np.int32).reshape(2, 3), np.array(2.5, np.float32), np.array([[True, False]]),
    np.array([b"a", b"bc"], dtype=object), np.zeros((0, 2), np.int64), np.ones((2, 2), np.float64)]]
"""


def test_make_argument_flattens_arrays_as_caffe2(real_caffe2):  # noqa: F811
    ours = run_here(MAKE_ARGUMENT.replace("from caffe2.python import utils", "from rnn2jax.caffe2.python import utils"))
    assert_same_protos(ours, real_caffe2(MAKE_ARGUMENT), caffe2_pb2.Argument)


CHILD_WORKSPACE = """
workspace.FeedBlob("parent_blob", np.ones(2, np.float32))
child = workspace.C.Workspace(workspace.C.Workspace.current)
child.create_blob("child_blob").feed(np.zeros(1, np.float32))
net = core.Net("in_child")
net.Relu(["parent_blob"], "child_relu")
child.run(net)
R = {"child": sorted(child.blobs), "parent": workspace.Blobs(), "relu": child.blobs["child_relu"].fetch().tolist()}
"""


def test_child_c_workspace_matches_caffe2(real_caffe2):  # noqa: F811
    assert run_here(CHILD_WORKSPACE) == real_caffe2(CHILD_WORKSPACE)


def _here(source: str) -> dict:
    """`run_here` with Caffe2's module imports read as rnn2jax's."""
    return run_here(source.replace("from caffe2.python", "from rnn2jax.caffe2.python"))


PSEUDO_FP16 = """
from caffe2.python import brew, model_helper
from caffe2.python.modeling.initializers import (
    Initializer, PseudoFP16Initializer, ReversePseudoFP16Initializer)
R = {}
for cls in (Initializer, PseudoFP16Initializer, ReversePseudoFP16Initializer):
    model = model_helper.ModelHelper(name="m_" + cls.__name__)
    brew.fc(model, "data", "fc", dim_in=2, dim_out=3, WeightInitializer=cls, BiasInitializer=cls,
            weight_init=("ConstantFill", {"value": 0.5}))
    info = model.get_param_info(model.params[0])
    R[cls.__name__] = [str(model.param_init_net.Proto()), str(model.net.Proto()), str(info.blob),
                       sorted((int(k), str(v)) for k, v in (info.blob_copy or {}).items())]
"""


def test_pseudo_fp16_initializers_match_caffe2(real_caffe2):  # noqa: F811
    ours, theirs = _here(PSEUDO_FP16), real_caffe2(PSEUDO_FP16)
    for key in ours:
        assert_same_protos(ours[key][:2], theirs[key][:2], caffe2_pb2.NetDef)
        assert ours[key][2:] == theirs[key][2:]


PARAMETER_SHARING = """
from caffe2.python import brew, model_helper, scope
from caffe2.python.modeling.parameter_sharing import ParameterSharing
model = model_helper.ModelHelper(name="sharing")
fc1 = brew.fc(model, "data", "fc1", dim_in=4, dim_out=4)
R = {}
try:
    brew.fc(model, "data", "fc1", dim_in=2, dim_out=2)
except AssertionError:
    R["shape_mismatch"] = "AssertionError"
outputs = []
with scope.NameScope("g"):
    with scope.NameScope("model_a"):
        outputs.append(str(brew.fc(model, fc1, "output", 4, 4)))
    with ParameterSharing({"model_b": "model_a"}), scope.NameScope("model_b"):
        with ParameterSharing({"shared": ""}), scope.NameScope("shared"):
            outputs.append(str(brew.fc(model, fc1, "output", 4, 4)))
        with scope.NameScope("unshared"):
            outputs.append(str(brew.fc(model, fc1, "output", 4, 4)))
R["params"] = sorted(model._parameters_info)
R["outputs"] = outputs
"""


def test_parameter_sharing_is_the_context_create_param_reads_as_caffe2(real_caffe2):  # noqa: F811
    assert _here(PARAMETER_SHARING) == real_caffe2(PARAMETER_SHARING)


FAILING_NETS = """
R = []
for kind in ("ThrowException", "Fail"):
    for net_type in ("simple", "async_scheduling"):
        workspace.ResetWorkspace()
        net = core.Net("failing_" + kind + net_type)
        getattr(net, kind)([], [])
        net.Proto().type = net_type
        workspace.CreateNet(net)
        for allow_fail in (False, True):
            try:
                R.append([kind, net_type, allow_fail, workspace.RunNet(net, allow_fail=allow_fail)])
            except RuntimeError:
                R.append([kind, net_type, allow_fail, "RuntimeError"])
try:
    workspace.RunNet("no_such_net", allow_fail=True)
except RuntimeError:
    R.append("unknown net: RuntimeError")
"""


def test_run_net_allow_fail_answers_false_only_for_an_op_that_fails_as_caffe2s(real_caffe2):  # noqa: F811
    """allow_fail turns an op whose run returns false (Fail) into False; an exception is raised all the same."""
    assert run_here(FAILING_NETS) == real_caffe2(FAILING_NETS)

