"""Caffe2's own pure-Python modules run unmodified on rnn2jax: net_builder, task, session, checkpoint, dataset,
schema, control_ops_util, crf, layer_model_helper, memonger and cnn, loaded from the Caffe2 source tree, build
the same NetDefs and PlanDefs, op for op, as they build on real Caffe2; where rnn2jax runs those nets, they give
the same values.

One child process per side (real Caffe2 in its venv, rnn2jax with the venv's tree as its source) runs every case
and prints a report; each test compares one case. Nets are compared as rnn2jax's messages parsed from both sides'
serializations. Two things are canonicalized first, both orders Caffe2 itself left to chance:

* control ops (If, While, Do) list the blobs of Python sets, whose order depends on the interpreter's string
  hash (Python 3.9 and 3.11 hash differently): their inputs, outputs, inner/outer blob pairs and the nets'
  external blob lists are compared as sets;
* memonger numbers its shared blobs (`__m<i>_shared`) in the order of a C++ hash map: real Caffe2's are
  renumbered in order of first appearance, which is rnn2jax's order, and then must equal rnn2jax's net as is.
"""

from __future__ import annotations

import base64
import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from rnn2jax.caffe2.python._caffe2_operators import CAFFE2_OPERATOR_TYPES
from rnn2jax.proto import caffe2_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
CAFFE2_PYTHON = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python"))

# The child: Python 3.9 syntax (it runs under real Caffe2 too). argv: side ("real" or "rnn2jax"), the source tree.
CHILD = r"""
import base64, json, sys, traceback
side, source = sys.argv[1], sys.argv[2]
checks = {}
if side == "rnn2jax":
    import rnn2jax.caffe2
    from rnn2jax.errors import Rnn2JaxError
    from rnn2jax.caffe2.python import brew, model_helper
    try:  # Caffe2's helpers/conv.py, with no source tree yet: a clear error
        brew.conv(model_helper.ModelHelper(name="m"), "x", "y", 1, 1, 3)
    except Rnn2JaxError as error:
        checks["conv_without_tree"] = str(error)
    rnn2jax.caffe2.install(source)
import logging
logging.disable(logging.WARNING)
import numpy as np
from caffe2.python import core, workspace

CASES = {}


def case(f):
    CASES[f.__name__] = f
    return f


def proto(message):
    if hasattr(message, "Proto"):
        message = message.Proto()
    return {"proto": type(message).__name__, "b64": base64.b64encode(message.SerializeToString()).decode()}


def value(x):
    x = np.asarray(x)
    if x.dtype.kind in "OSU":
        return [v.decode() if isinstance(v, bytes) else str(v) for v in x.flat]
    return {"dtype": str(x.dtype), "shape": list(x.shape), "data": x.astype(np.float64).ravel().tolist()}


@case
def net_builder_plan():
    # caffe2/python/net_builder_test.py test_ops: a loop, stop guards and ifs, as execution steps; run
    from caffe2.python.net_builder import ops, NetBuilder
    with NetBuilder() as nb:
        x = ops.Const(5)
        y = ops.Const(0)
        with ops.loop():
            ops.stop_if(ops.EQ([x, ops.Const(0)]))
            ops.Add([x, ops.Const(-1)], [x])
            ops.Add([y, ops.Const(1)], [y])
        guards = []
        for start in (10, 3):
            v = ops.Const(start)
            with ops.stop_guard() as g:
                ops.stop_if(ops.LT([v, ops.Const(5)]))
            guards.append(g)
        results = []
        for start in (75, 25):
            v = ops.Const(start)
            r = ops.Const(1)
            with ops.If(ops.GT([v, ops.Const(50)])):
                ops.Const(2, blob_out=r)
            with ops.If(ops.LT([v, ops.Const(50)])):
                ops.Const(3, blob_out=r)
                ops.stop()
                ops.Const(4, blob_out=r)
            results.append(r)
    plan = core.Plan("name")
    plan.AddStep(core.to_execution_step(nb))
    ws = workspace.C.Workspace()
    ws.run(plan)
    return {
        "plan": proto(plan),
        "values": [value(ws.blobs[str(b)].fetch()) for b in [y] + results],
        "stopped": [value(ws.blobs[str(g.has_stopped())].fetch()) for g in guards],
    }


@case
def net_builder_control_ops():
    # net_builder_test.py test_if_net and test_while_net: If and While ops holding their branch nets
    from caffe2.python.net_builder import ops, NetBuilder
    with NetBuilder() as nb:
        x0, x1 = ops.Const(0), ops.Const(1)
        res = ops.Const(0)
        with ops.IfNet(ops.LT([x0, x1])):
            local = ops.Const(900)
            ops.Add([ops.Const(100), local], [res])
            with ops.IfNet(ops.GT([x1, x0])):
                pass
            with ops.Else():
                ops.Add([res, local], [local])
        with ops.Else():
            pass
        x, y = ops.Const(0), ops.Const(0)
        with ops.WhileNet():
            with ops.Condition():
                ops.Add([x, ops.Const(1)], [x])
                ops.LT([x, ops.Const(7)])
            ops.Add([x, y], [y])
    plan = core.Plan(core.to_execution_step(nb))
    return {"plan": proto(plan), "types": sorted({op.type for n in plan.Proto().network for op in n.op})}


@case
def net_builder_task():
    # net_builder_test.py _actual_loop in a Task, compiled by LocalSession: nested loops, If/Elif/Else
    from caffe2.python.net_builder import ops
    from caffe2.python.task import Task, TaskGroup, final_output
    from caffe2.python.session import LocalSession
    with TaskGroup() as tg:
        with Task():
            total, large, small = ops.Const(0), ops.Const(0), ops.Const(0)
            with ops.loop(10) as loop:
                outer = ops.Mul([loop.iter(), ops.Const(10)])
                with ops.loop(loop.iter()) as inner:
                    val = ops.Add([outer, inner.iter()])
                    with ops.If(ops.GE([val, ops.Const(80)])) as c:
                        ops.Add([large, val], [large])
                    with c.Elif(ops.GE([val, ops.Const(50)])) as c:
                        ops.Add([small, val], [small])
                    with c.Else():
                        ops.Add([total, val], [total])
            for blob in (total, large, small):
                final_output(blob)
    plan, outputs, workspace_type = LocalSession._compile_task_group(tg)
    return {"plan": proto(plan), "outputs": [str(o) for o in outputs.names()], "workspace": str(workspace_type)}


@case
def control_ops_util():
    from caffe2.python import control_ops_util
    if_net, then_net, else_net = core.Net("if_net"), core.Net("then"), core.Net("else")
    cond = if_net.ConstantFill([], "cond", shape=[], value=True, dtype=core.DataType.BOOL)
    then_net.Copy("a", "out")
    else_net.Copy("b", "out")
    control_ops_util.add_if_op(if_net, cond, {"cond", "a", "b", "out"}, then_net, else_net)
    while_net, cond_net, loop_net = core.Net("while_net"), core.Net("cond_net"), core.Net("loop")
    cond_net.LT(["i", "n"], "while_cond")
    loop_net.Add(["i", "one"], "i")
    control_ops_util.add_while_op(while_net, "while_cond", {"i", "n", "one", "while_cond"}, loop_net, cond_net)
    return {"if": proto(if_net), "while": proto(while_net)}


@case
def control_ops_gradients():
    # control_ops_grad's makers (If, Do), which core registers: the gradient net, and its values when run
    from caffe2.python import control_ops_util
    net, then_net, else_net = core.Net("grad_if_net"), core.Net("then"), core.Net("else")
    then_net.Mul(["a", "w"], "out")
    else_net.Add(["a", "w"], "out")
    control_ops_util.add_if_op(net, "cond", {"cond", "a", "w", "out"}, then_net, else_net)
    net.AddGradientOperators(["out"])
    values = {}
    for flag in (True, False):
        workspace.FeedBlob("cond", np.array(flag))
        workspace.FeedBlob("a", np.array([1.5, -2.0], np.float32))
        workspace.FeedBlob("w", np.array([0.5, 3.0], np.float32))
        workspace.RunNetOnce(net)
        values[str(flag)] = [value(workspace.FetchBlob(b)) for b in ("out", "a_grad", "w_grad")]
    return {"net": proto(net), "values": values}


@case
def schema_records():
    from caffe2.python import schema
    s = schema.Struct(
        ("dense", schema.Scalar((np.float32, 3))),
        ("ids", schema.List(schema.Scalar(np.int64))),
        ("map", schema.Map(schema.Scalar(np.int32), schema.Scalar(np.float32))),
        ("meta", schema.Struct(("query", schema.Scalar(str)), ("user", schema.Scalar(np.int64)))),
    )
    net = core.Net("records")
    record = schema.NewRecord(net, s)
    contents = schema.from_blob_list(s, [
        np.array([[1, 2, 3], [4, 5, 6]], np.float32),
        np.array([2, 1], np.int32), np.array([7, 8, 9], np.int64),
        np.array([1, 1], np.int32), np.array([3, 4], np.int32), np.array([0.5, 1.5], np.float32),
        np.array([b"a", b"bc"], dtype=object), np.array([11, 12], np.int64),
    ])
    schema.FeedRecord(record, contents)
    fetched = schema.FetchRecord(record)
    const = schema.ConstRecord(net, schema.Struct(("v", np.array([1.5, 2.5], np.float32)), ("n", np.array([3]))))
    workspace.RunNetOnce(net)
    return {
        "names": s.field_names(),
        "types": [str(t) for t in s.field_types()],
        "blobs": [str(b) for b in record.field_blobs()],
        "net": proto(net),
        "fetched": [value(b) for b in fetched.field_blobs()],
        "const": [value(workspace.FetchBlob(str(b))) for b in const.field_blobs()],
        "repr": str(s),
    }


@case
def dataset_nets():
    from caffe2.python import dataset, schema
    s = schema.Struct(("label", schema.Scalar(np.float32)), ("ids", schema.List(schema.Scalar(np.int64))))
    ds = dataset.Dataset(s, name="ds")
    init_net, write_net, read_net, random_net = (core.Net(n) for n in ("init", "write", "read", "random_read"))
    ds.init_empty(init_net)
    writer = ds.writer(init_net)
    writer.write_record(write_net, schema.NewRecord(write_net, s))
    should_stop, record = ds.reader(init_net, batch_size=2).read_record(read_net)
    random_reader = ds.random_reader(init_net, batch_size=2)
    random_reader.computeoffset(random_net)
    random_reader.sort_and_shuffle(random_net, "label", 1, 2)
    ds.trim(write_net, multiple_of=2)
    return {
        "nets": [proto(n) for n in (init_net, write_net, read_net, random_net)],
        "record": [str(b) for b in record.field_blobs()],
        "stop": str(should_stop),
        "content": [str(b) for b in ds.content().field_blobs()],
    }


@case
def crf():
    # operator_test/crf_test.py's model: an FC, the CRF loss (a RecurrentNetwork), its gradient
    from caffe2.python import brew, crf
    from caffe2.python.model_helper import ModelHelper
    model = ModelHelper(name="external")
    emb, labels, transitions = model.net.AddExternalInputs("embeddings", "labels", "crf_transitions")
    predictions = brew.fc(model, emb, "fc_0", 4, 3)
    loss = crf.CRFWithLoss(model, 3, transitions).crf_loss(predictions, labels)
    model.net.AddGradientOperators([loss])
    return {"init": proto(model.param_init_net), "net": proto(model.net), "loss": str(loss)}


@case
def layer_model():
    from caffe2.python import layer_model_helper, layer_model_instantiator, schema
    from caffe2.python.optimizer import SgdOptimizer
    model = layer_model_helper.LayerModelHelper(
        "test_model",
        input_feature_schema=schema.Struct(("float_features", schema.Scalar((np.float32, (8,))))),
        trainer_extra_schema=schema.Struct(("label", schema.Scalar((np.float32, (1,))))),
    )
    model.default_optimizer = SgdOptimizer(0.1)
    fc = model.FC(model.input_feature_schema.float_features, 1)
    loss = model.BatchMSELoss(schema.Struct(("label", model.trainer_extra_schema.label), ("prediction", fc)))
    model.add_loss(loss)
    model.output_schema = schema.Struct(("prediction", fc))
    init_net, train_net = layer_model_instantiator.generate_training_nets(model)
    return {
        "init": proto(init_net),
        "train": proto(train_net),
        "predict": proto(layer_model_instantiator.generate_predict_net(model)),
        "loss": [str(b) for b in model.loss.field_blobs()],
    }


@case
def complete_net_with_spatial_bn():
    # model_helper_test.py: brew.spatial_bn (Caffe2's helpers/normalization.py), GetCompleteNet and back
    from caffe2.python import brew, model_helper
    model = model_helper.ModelHelper("test_orig")
    conv = brew.conv(model, "input", "conv", dim_in=3, dim_out=4, weight_init=("MSRAFill", {}), kernel=3)
    conv = brew.spatial_bn(model, conv, "conv_bn", 4, epsilon=1e-3, is_test=False)
    brew.fc(model, brew.relu(model, conv, "conv_relu"), "pred", dim_in=4 * 3 * 3, dim_out=2)
    model.net.Proto().type = "async_scheduling"
    net = model.GetCompleteNet()
    model2 = model_helper.ModelHelper("test_new")
    model2.ConstructInitTrainNetfromNet(net)
    result = {"complete": proto(net), "params": [str(p) for p in model.params]}
    for key, part in (("init", model2.param_init_net), ("train", model2.net)):
        # update_external_list builds the external lists from Python sets: compare them as sets
        part = part.Proto()
        result[key + "_external"] = [sorted(part.external_input), sorted(part.external_output)]
        del part.external_input[:], part.external_output[:]
        result[key] = proto(part)
    return result


@case
def memonger_inplace_head():
    # memonger_test.py: an in-place op at the head (its output is a head, not a shareable blob)
    from caffe2.python import memonger
    from caffe2.python.model_helper import ModelHelper
    m = ModelHelper()
    m.Proto().type = "dag"
    m.net.Relu("A", "A")  # in place, as Relu allows
    m.net.Sum(["A", "A"], "B")
    m.net.Relu("B", "C")
    m.net.Relu("C", "D")
    m.net.Sum(["D", "D"], "E")
    optimized = memonger.optimize_inference_for_dag(m.net, ["A"], "")
    # the shared blobs' numbers follow C++ unordered_map order: compare up to renaming (first use order)
    names = {}
    for op in optimized.op:
        for blob in list(op.input) + list(op.output):
            names.setdefault(blob, "b%d" % len(names))
    return {"ops": [[op.type, [names[b] for b in op.input], [names[b] for b in op.output]] for op in optimized.op],
            "blobs": len(names)}


@case
def memonger():
    from caffe2.python import brew, memonger
    from caffe2.python.model_helper import ModelHelper
    model = ModelHelper(name="mlp")
    x = model.net.AddExternalInput("data")
    widths = [6, 8, 4, 10, 6]
    for i in range(4):
        x = brew.relu(model, brew.fc(model, x, "fc%d" % i, widths[i], widths[i + 1]), "relu%d" % i)
    y = brew.fc(model, x, "y", 6, 2)
    loss = model.net.AveragedLoss(model.net.SquaredL2Distance([y, "label"], "dist"), "loss")
    forward = core.Net(model.net.Proto())
    forward.AddExternalOutput(forward.GetBlobRef("loss"))
    grads = model.AddGradientOperators([loss])
    param_grads = set(str(grads[p]) for p in model.params)
    shared = memonger.share_grad_blobs(model.net, ["loss"], param_grads, "")
    inference = memonger.optimize_inference_for_dag(forward, ["data"], "")
    fast = memonger.optimize_inference_fast(forward.Proto(), ["data", "label"])
    rng = np.random.RandomState(1)
    workspace.RunNetOnce(model.param_init_net)
    for blob in model.params:
        workspace.FeedBlob(str(blob), rng.randn(*workspace.FetchBlob(str(blob)).shape).astype(np.float32))
    workspace.FeedBlob("data", rng.randn(3, 6).astype(np.float32))
    workspace.FeedBlob("label", rng.randn(3, 2).astype(np.float32))
    workspace.RunNetOnce(forward)
    plain = value(workspace.FetchBlob("loss"))
    workspace.FeedBlob("loss", np.zeros((), np.float32))
    workspace.RunNetOnce(inference)
    memongered = value(workspace.FetchBlob("loss"))
    workspace.RunNetOnce(model.net)  # the training net, for every blob's shape: the best fit by size
    shapes = {name: list(np.shape(workspace.FetchBlob(name))) for name in workspace.Blobs()}
    sized = memonger.share_grad_blobs(
        model.net, ["loss"], param_grads, "", share_activations=True, blob_shapes=shapes)
    return {
        "grad": proto(shared), "inference": proto(inference), "fast": proto(fast), "sized": proto(sized),
        "loss": plain, "memongered_loss": memongered,
    }


@case
def checkpoint_job():
    # caffe2/python/checkpoint_test.py's pipeline (a dataset read 3 rows an epoch), compiled by LocalSession
    from caffe2.python.schema import Struct, ConstRecord
    from caffe2.python.dataset import Dataset
    from caffe2.python.pipeline import pipe
    from caffe2.python.checkpoint import CheckpointManager, Job
    from caffe2.python.net_builder import ops
    from caffe2.python.task import Node, Task, TaskGroup, Cluster
    from caffe2.python.dataio import ReaderWithLimit
    from caffe2.python.session import LocalSession
    with Cluster():
        with Job() as job:
            with Node("trainer_0"):
                with Job.current().init_group, Task():
                    data = ConstRecord(ops, Struct(("val", np.array(list(range(10))))))
                    full_reader = Dataset(data, name="dataset:0").reader(ops)
                    total = ops.Const([100])

                def inc_total(rec):
                    ops.Add([total, rec.val()], [total])

                epoch_reader = ReaderWithLimit(full_reader, num_iter=3)
                pipe(epoch_reader, processor=inc_total)
                Job.current().add_stop_condition(epoch_reader.data_finished())
        job.compile(LocalSession)
        manager = CheckpointManager(db_prefix="/tmp/ckpt", node_name="trainer_0", db_type="minidb")
        with Node("trainer_0"):
            checkpoint_init = TaskGroup()
            checkpoint_init.add(manager.init(nodes=["trainer_0"], retrieve_from_epoch=None))
    plans = {name: proto(group.obj[0]) for name, group in
             [("init", job.init_group), ("epoch", job.epoch_group), ("exit", job.exit_group)]}
    plans["checkpoint_init"] = proto(LocalSession._compile_task_group(checkpoint_init)[0])
    return plans


@case
def cnn():
    from caffe2.python import cnn
    model = cnn.CNNModelHelper(order="NCHW", name="cnn")
    conv = model.Conv("data", "conv1", 1, 4, 3, ("ConstantFill", {"value": 0.1}), ("ConstantFill", {}))
    pool = model.MaxPool(model.Relu(conv, "relu1"), "pool1", kernel=2, stride=2)
    softmax = model.Softmax(model.FC(pool, "fc1", 4 * 3 * 3, 5), "softmax")
    loss = model.AveragedLoss(model.LabelCrossEntropy([softmax, "label"], "xent"), "loss")
    model.AddGradientOperators([loss])
    rng = np.random.RandomState(2)
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob("fc1_w", rng.randn(5, 36).astype(np.float32))
    workspace.FeedBlob("data", rng.randn(2, 1, 8, 8).astype(np.float32))
    workspace.FeedBlob("label", np.array([1, 3], np.int32))
    workspace.RunNetOnce(model.net)
    return {
        "init": proto(model.param_init_net),
        "net": proto(model.net),
        "params": [str(p) for p in model.params],
        "loss": value(workspace.FetchBlob("loss")),
        "conv1_w_grad": value(workspace.FetchBlob("conv1_w_grad")),
    }


@case
def rnn_cell_apply():
    # seq2seq's decoder step: a cell applied once inside a step model (RNNCell.apply), under a name scope
    # read back with workspace.GetNameScope
    from caffe2.python import model_helper, rnn_cell
    model = model_helper.ModelHelper(name="decoder")
    step = model_helper.ModelHelper(name="decoder_step", param_model=model)
    with core.NameScope("decoder"):
        scope = workspace.GetNameScope()
        input_t, timestep, h_prev, c_prev = step.net.AddExternalInputs("input_t", "timestep", "h_prev", "c_prev")
        cell = rnn_cell.LSTMCell(input_size=3, hidden_size=4, forget_bias=0.5, memory_optimization=False,
                                 name="layer0", forward_only=True)
        output, states = cell.apply(step, input_t, "seq_lengths", [h_prev, c_prev], timestep)
    return {"scope": scope, "output": str(output), "states": [str(s) for s in states], "step": proto(step.net),
            "params": proto(model.param_init_net)}


@case
def c_extension():
    # what Caffe2's Python modules call on `caffe2.python._import_c_extension`, with serialized protos
    import caffe2.python._import_c_extension as C
    wrapper = C.GradientWrapper()
    wrapper.dense = "y_grad"
    fc = core.CreateOperator("FC", ["x", "w", "b"], ["y"])
    grad_ops, g_in = C.get_gradient_defs(fc.SerializeToString(), [wrapper])
    net = core.Net("shapes")
    net.Relu(net.FC(["x", "w", "b"], "y"), "z")
    shapes = C.infer_shapes_and_types_from_map([net.Proto().SerializeToString()], {"x": [4, 3], "w": [5, 3], "b": [5]})
    C.feed_blob("x", np.arange(6, dtype=np.float32).reshape(2, 3) - 2)
    C.run_operator_once(core.CreateOperator("Relu", ["x"], ["r"]).SerializeToString())
    relu_net = core.Net("relu_net")
    relu_net.Relu("x", "x_relu")
    C.create_net(relu_net.Proto().SerializeToString(), False)
    C.run_net("relu_net", 2, False)
    C.deserialize_blob("x_copy", C.serialize_blob("x"))
    return {
        "grad_ops": [{"proto": "OperatorDef", "b64": base64.b64encode(o).decode()} for o in grad_ops],
        "g_in": [[g.dense, g.indices, g.values, g.is_dense(), g.is_empty()] for g in g_in],
        "shapes": {"proto": "TensorShapes", "b64": base64.b64encode(shapes).decode()},
        "blobs": sorted(C.blobs()),
        "has": [C.has_blob("r"), C.has_blob("nope")],
        "r": value(C.fetch_blob("r")),
        "x_relu": value(C.fetch_blob("x_relu")),
        "x_copy": value(C.fetch_blob("x_copy")),
        "nets": C.nets(),
        "current": [C.current_workspace(), C.root_folder()],
        "keys": [C.op_registry_key("Conv", "CUDNN"), C.op_registry_key("Conv", "")],
        "blob_bytes": C.get_blob_size_bytes("x"),
        "same_workspace_class": workspace.C.Workspace is C.Workspace,
    }


report = {"cases": {}, "checks": checks}
for name, f in CASES.items():
    workspace.ResetWorkspace()
    core.Net._net_names_used = set()
    core.ExecutionStep._step_names_used = set()
    try:
        report["cases"][name] = f()
    except Exception:
        report["cases"][name] = {"error": traceback.format_exc()}

import caffe2.python._import_c_extension as C
checks["flags"] = [C.is_asan, C.has_mkldnn, C.use_mkldnn, C.has_cuda_support, C.num_cuda_devices()]
checks["workspace_C"] = workspace.C is C
if side == "real":
    checks["operator_types"] = sorted({o for o in workspace.RegisteredOperators() if "_ENGINE_" not in o})
else:
    import numpy
    from caffe2.python import schema
    from past.builtins import basestring
    checks["numpy_object_in_user_code"] = hasattr(numpy, "object")
    checks["numpy_untouched"] = [schema.np is not numpy, schema.np.float32 is numpy.float32, schema.np.object is object]
    checks["basestring"] = [isinstance(core.BlobReference("x"), basestring), isinstance(core.BlobReference("x"),
                            schema.basestring), isinstance("x", schema.basestring)]
    try:
        C.transform_trt(b"", {}, 0, True)
    except Rnn2JaxError as error:
        checks["unavailable"] = str(error)
    checks["core_C"] = core.C is C
print(json.dumps(report))
"""


def _run(argv: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("RNN2JAX_CAFFE2_SOURCE", None)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _report(process: subprocess.Popen, side: str) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, f"the {side} child failed:\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reports() -> tuple[dict, dict]:
    """(real Caffe2's report, rnn2jax's), the two children run side by side."""
    found = sorted(CAFFE2_PYTHON.parent.parent.glob("lib/python3*/site-packages/caffe2/python/__init__.py"))
    if not CAFFE2_PYTHON.exists() or not found:
        pytest.skip(f"real-Caffe2 venv missing ({CAFFE2_PYTHON}; `make test` makes it): the oracle, and the tree")
    source = str(found[-1].parent.parent)
    real = _run([str(CAFFE2_PYTHON), "-c", CHILD, "real", source])
    ours = _run([sys.executable, "-c", CHILD, "rnn2jax", source])
    return _report(real, "real Caffe2"), _report(ours, "rnn2jax")


# ------------------------------------------------------------------------------------------------
# Canonical forms (see the module docstring)


def _canonical_control_ops(net: pb.NetDef) -> None:
    for op in net.op:
        for arg in op.arg:
            for nested in [arg.n] if arg.HasField("n") else list(arg.nets):
                _canonical_control_ops(nested)
        if op.type in ("If", "While", "Do"):
            inner = next((a for a in op.arg if a.name == "inner_blobs"), None)
            index = next((a for a in op.arg if a.name == "outer_blobs_idx"), None)
            if inner is not None and index is not None:  # a Do: indices into its blobs before the workspace one
                outer = [*op.input[:-1], *op.output[:-1]]
                pairs = sorted(f"{i.decode()}={outer[j]}" for i, j in zip(inner.strings, index.ints, strict=True))
                inner.strings[:] = [p.encode() for p in pairs]
                del index.ints[:]
            op.input[:] = sorted(op.input)
            op.output[:] = sorted(op.output)
    _sort_copy_runs(net)
    net.external_input[:] = sorted(net.external_input)
    net.external_output[:] = sorted(net.external_output)


def _sort_copy_runs(net: pb.NetDef) -> None:
    """control_ops_grad writes a gradient Do's Copy ops in the order of a Python set of blob names, which is the
    string hashes' (seeded per process): each run of consecutive Copy ops sorted by output."""
    ops, run = [], []
    for op in [*net.op, None]:
        if op is not None and op.type == "Copy":
            run.append(op)
            continue
        ops += sorted(run, key=lambda o: list(o.output))
        run = []
        if op is not None:
            ops.append(op)
    copies = [pb.OperatorDef() for _ in ops]
    for copy, op in zip(copies, ops, strict=True):
        copy.CopyFrom(op)
    del net.op[:]
    net.op.extend(copies)


def _renumbered_shared_blobs(net: pb.NetDef) -> None:
    shared = re.compile(r"^(.*)__m\d+_shared$")
    names: dict[str, str] = {}
    for op in net.op:
        for blob in [*op.input, *op.output]:
            match = shared.match(blob)
            if match and blob not in names:
                names[blob] = f"{match.group(1)}__m{len(names)}_shared"
    for op in net.op:
        op.input[:] = [names.get(b, b) for b in op.input]
        op.output[:] = [names.get(b, b) for b in op.output]


CONTROL_OP_CASES = {"net_builder_control_ops", "control_ops_util", "control_ops_gradients"}


def _message(item: dict, case: str, real: bool) -> Any:
    message = getattr(pb, item["proto"]).FromString(base64.b64decode(item["b64"]))
    nets = [message] if isinstance(message, pb.NetDef) else list(getattr(message, "network", []))
    for net in nets:
        if case in CONTROL_OP_CASES:
            _canonical_control_ops(net)
        if case == "memonger" and real:
            _renumbered_shared_blobs(net)
    return message


def _assert_same(real: Any, ours: Any, case: str, where: str) -> None:
    """`ours` equals `real`: protos op for op, arrays to float32 rounding, everything else exactly."""
    if isinstance(real, dict) and "proto" in real:
        expected, got = _message(real, case, True), _message(ours, case, False)
        if expected != got:
            diff = difflib.unified_diff(
                text_format.MessageToString(expected).splitlines(),
                text_format.MessageToString(got).splitlines(),
                "real Caffe2",
                "rnn2jax",
                lineterm="",
            )
            pytest.fail(f"{case}: {where} differs:\n" + "\n".join(list(diff)[:80]))
    elif isinstance(real, dict) and "dtype" in real:
        assert (ours["dtype"], ours["shape"]) == (real["dtype"], real["shape"]), f"{case}: {where}"
        np.testing.assert_allclose(ours["data"], real["data"], rtol=1e-5, atol=1e-6, err_msg=f"{case}: {where}")
    elif isinstance(real, dict):
        assert set(ours) == set(real), f"{case}: {where}"
        for key in real:
            _assert_same(real[key], ours[key], case, f"{where}.{key}")
    elif isinstance(real, list) and real and isinstance(real[0], dict | list):
        assert len(ours) == len(real), f"{case}: {where}"
        for i, (a, b) in enumerate(zip(real, ours, strict=True)):
            _assert_same(a, b, case, f"{where}[{i}]")
    else:
        assert ours == real, f"{case}: {where}"


CASES = [
    "net_builder_plan",
    "net_builder_control_ops",
    "net_builder_task",
    "control_ops_util",
    "control_ops_gradients",
    "schema_records",
    "dataset_nets",
    "crf",
    "layer_model",
    "memonger",
    "memonger_inplace_head",
    "complete_net_with_spatial_bn",
    "checkpoint_job",
    "cnn",
    "rnn_cell_apply",
    "c_extension",
]


@pytest.mark.parametrize("case", CASES)
def test_caffe2_module_builds_and_runs_as_on_real_caffe2(reports: tuple[dict, dict], case: str) -> None:
    real, ours = (report["cases"][case] for report in reports)
    assert "error" not in real, f"the case fails on real Caffe2:\n{real.get('error')}"
    assert "error" not in ours, f"the case fails on rnn2jax:\n{ours.get('error')}"
    _assert_same(real, ours, case, case)


def test_nets_run_where_rnn2jax_runs_them(reports: tuple[dict, dict]) -> None:
    """The values behind the comparisons are the expected ones, not merely equal (net_builder_test's)."""
    cases = reports[1]["cases"]
    plan = cases["net_builder_plan"]
    assert [v["data"] for v in plan["values"]] == [[5.0], [2.0], [3.0]]
    assert [v["data"] for v in plan["stopped"]] == [[0.0], [1.0]]
    assert {"If", "While", "CreateScope"} <= set(cases["net_builder_control_ops"]["types"])  # Do: in their nets
    memonger = cases["memonger"]
    assert memonger["memongered_loss"] == memonger["loss"]  # the memongered net computes the same loss


def test_the_numpy_and_basestring_views_stay_inside_caffe2s_modules(reports: tuple[dict, dict]) -> None:
    checks = reports[1]["checks"]
    assert checks["numpy_object_in_user_code"] is False  # NumPy itself has no np.object
    assert checks["numpy_untouched"] == [True, True, True]  # schema's numpy is a view that adds it
    # a user's past.builtins.basestring is past's (a BlobReference is a str); schema's leaves blob references out
    assert checks["basestring"] == [True, False, True]


def test_the_c_extension_is_a_cpu_build_and_refuses_what_rnn2jax_cannot_do(reports: tuple[dict, dict]) -> None:
    checks = reports[1]["checks"]
    assert checks["flags"] == reports[0]["checks"]["flags"]  # the torch 1.10.2 CPU wheel's
    assert checks["workspace_C"] is reports[0]["checks"]["workspace_C"] is True
    assert checks["unavailable"].startswith("caffe2_pybind11_state.transform_trt (Caffe2's C++) is not available")
    assert checks["core_C"] is True
    assert "brew.conv is Caffe2's own helpers/conv.py" in checks["conv_without_tree"]


def test_the_op_types_rnn2jax_builds_are_real_caffe2s(reports: tuple[dict, dict]) -> None:
    assert sorted(CAFFE2_OPERATOR_TYPES) == reports[0]["checks"]["operator_types"]
