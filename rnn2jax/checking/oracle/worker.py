"""The real-Caffe2 side of the oracle: a long-lived process in the Caffe2 venv (Python 3.9, torch 1.10.2).

This file runs under *that* interpreter, never inside rnn2jax's process: it imports nothing from rnn2jax,
only the standard library, NumPy 1.x and `caffe2`. It reads requests from stdin and writes answers to
stdout as frames (an 8-byte big-endian length, then an `.npz` archive without pickles): the archive holds
the JSON header as `__json__` (uint8) and every array or serialized protobuf as `a<i>` (string tensors
travel as fixed-width bytes arrays). Anything Caffe2 itself prints goes to stderr, because fd 1 is moved
there before Caffe2 is imported.

Commands: `hello` (versions, registered ops, schema files), `gradient_kinds` (what the gradient registry
says of each op), `run` (feed blobs, then run
ops, nets, plans in one workspace and fetch blobs), `gradient_for_op`, `backward_pass`, `build`
(call Caffe2's front-end builders such as `rnn_cell.LSTM` from a JSON recipe and return the nets), and
`save_predictor` / `run_predictor` (write a predictor export with `predictor_exporter.save_to_db`; load
one with `prepare_prediction_net` and run it, as a serving process would).
A Caffe2 failure is answered as `{"ok": false, "error": {...}}`; an abort kills the process, and the
client notices the closed pipe.
"""

import io
import json
import os
import struct
import sys
import traceback

_PROTOCOL_FD = os.dup(1)
os.dup2(2, 1)  # whatever Caffe2 or glog prints must not corrupt the protocol stream
sys.stdout = sys.stderr

import numpy as np
from caffe2.proto import caffe2_pb2
from caffe2.python import (
    attention,
    brew,
    core,
    gru_cell,
    model_helper,
    optimizer,
    recurrent,
    rnn_cell,
    scope,
    workspace,
)
from caffe2.python.predictor import predictor_exporter
from google.protobuf import text_format

workspace.GlobalInit(["caffe2", "--caffe2_log_level=2"])

# Modules a `build` recipe may name (`"fn": "rnn_cell.LSTM"`): Caffe2's front end, nothing else.
_MODULES = {
    "attention": attention,
    "brew": brew,
    "core": core,
    "gru_cell": gru_cell,
    "model_helper": model_helper,
    "optimizer": optimizer,
    "recurrent": recurrent,
    "rnn_cell": rnn_cell,
    "scope": scope,
}


# ------------------------------------------------------------------------------------------------
# Framing


def _read_exact(stream, count):
    chunks = []
    while count:
        chunk = stream.read(count)
        if not chunk:
            return None
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def read_frame(stream):
    head = _read_exact(stream, 8)
    if head is None:
        return None
    (size,) = struct.unpack(">Q", head)
    body = _read_exact(stream, size)
    if body is None:
        return None
    with np.load(io.BytesIO(body), allow_pickle=False) as archive:
        header = json.loads(archive["__json__"].tobytes().decode("utf-8"))
        arrays = [archive["a%d" % i] for i in range(header.pop("__arrays__", 0))]
    return header, arrays


def write_frame(fd, header, arrays):
    payload = dict(("a%d" % i, a) for i, a in enumerate(arrays))
    header = dict(header, __arrays__=len(arrays))
    payload["__json__"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **payload)
    body = buffer.getvalue()
    data = struct.pack(">Q", len(body)) + body
    while data:
        written = os.write(fd, data)
        data = data[written:]


class Arrays(object):
    """The arrays of an answer, referenced from its JSON header by index."""

    def __init__(self):
        self.items = []

    def add(self, array):
        self.items.append(array)
        return len(self.items) - 1

    def proto(self, message):
        return self.add(np.frombuffer(message.SerializeToString(), dtype=np.uint8))


def _proto(arrays, index, cls):
    message = cls()
    message.ParseFromString(arrays[index].tobytes())
    return message


def _to_blob(array):
    """Arrays from the client: fixed-width bytes become Caffe2 string tensors (object arrays)."""
    if array.dtype.kind == "S":
        out = np.empty(array.shape, dtype=object)
        out.ravel()[:] = [bytes(v) for v in array.ravel()]
        return out
    return array


def _from_blob(value, name=""):
    """A fetched blob as an array that travels without pickles, or None when it is not a tensor."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            items = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in value.ravel()]
            width = max([len(v) for v in items] + [1])
            out = np.array(items, dtype="S%d" % width) if items else np.zeros(0, dtype="S1")
            return out.reshape(value.shape)
        return np.ascontiguousarray(value).reshape(value.shape)  # ascontiguousarray makes 0-d arrays 1-d
    if isinstance(value, bytes):
        if value.startswith(name.encode("utf-8") + b", a C++ native class of type "):
            return None  # FetchBlob's description of a blob that is not a tensor (a mutex, step workspaces)
        return np.array(value, dtype="S%d" % max(len(value), 1))
    if isinstance(value, (int, float, bool, np.generic)):
        return np.asarray(value)
    return None


# ------------------------------------------------------------------------------------------------
# Device options: nets written for CUDA run on the CPU here. IDEEP (MKL-DNN) is kept: the CPU wheel has it, and
# some ops (CopyCPUToIDEEP, CopyIDEEPToCPU) exist there only.


def _cpu_net(net):
    if net.device_option.device_type != caffe2_pb2.IDEEP:
        net.ClearField("device_option")
    for op in net.op:
        _cpu_op(op)
    return net


def _cpu_op(op):
    if op.device_option.device_type != caffe2_pb2.IDEEP:
        op.ClearField("device_option")
    for arg in op.arg:
        if arg.HasField("n"):
            _cpu_net(arg.n)
        for inner in arg.nets:
            _cpu_net(inner)
        if arg.name in ("step_net", "backward_step_net") and arg.HasField("s"):
            inner = caffe2_pb2.NetDef()
            try:
                text_format.Merge(arg.s.decode("utf-8"), inner)
            except Exception:  # not text: leave it to Caffe2 to complain
                continue
            arg.s = text_format.MessageToString(_cpu_net(inner)).encode("utf-8")
    return op


def _cpu_plan(plan):
    for net in plan.network:
        _cpu_net(net)
    return plan


# ------------------------------------------------------------------------------------------------
# Commands


# The IDEEP registry's own op types (caffe2/ideep/operators), which RegisteredOperators() (the CPU, CUDA and HIP
# registries) leaves out: listed when this build creates them on device IDEEP.
IDEEP_ONLY = ("CopyCPUToIDEEP", "CopyIDEEPToCPU")


def _ideep_only_ops():
    found = []
    device = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.IDEEP)
    ws = workspace.C.Workspace()
    ws.create_blob("x").feed(np.zeros(1, np.float32))
    for name in IDEEP_ONLY:
        op = caffe2_pb2.OperatorDef(type=name, input=["x"], output=["y"], device_option=device)
        try:
            ws._run_operator(op.SerializeToString())
        except Exception:
            continue
        found.append(name)
    return found


def cmd_hello(request, arrays, out):
    ops = sorted(set(workspace.RegisteredOperators()) | set(_ideep_only_ops()))
    schema_files = {}
    for name in ops:
        schema = workspace.C.OpSchema.get(name)
        if schema is not None:
            schema_files[name] = schema.file
    import torch

    return {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "ops": ops,
        "schema_files": schema_files,
    }


def _gradient_kind(name):
    schema = workspace.C.OpSchema.get(name)
    low_in = schema.min_input if schema else 1
    low_out = max(1, schema.min_output) if schema else 1
    # The schema's smallest op first; makers check the op against the schema, so when that arity is not
    # allowed (Partition: 0 inputs, 1 output), the next smallest ones are tried.
    arities = sorted(
        ((i, o) for i in range(low_in, low_in + 6) for o in range(low_out, low_out + 6)),
        key=lambda io: (io[0] + io[1], io),
    )
    for inputs, outputs in arities:
        kind = _gradient_kind_of(name, schema, inputs, outputs)
        if kind != "schema":
            return kind
    return "gradient"


def _gradient_kind_of(name, schema, inputs, outputs):
    names = []
    for o in range(outputs):  # outputs the schema wants in place (Iter, AtomicIter) reuse the input's name
        same = [i for i in range(inputs) if schema is not None and schema.inplace_enforced(i, o)]
        names.append("i%d" % same[0] if same else "o%d" % o)
    required = dict((a.name, 1.0) for a in schema.args if a.required) if schema else {}  # schema checks presence
    op = core.CreateOperator(name, ["i%d" % i for i in range(inputs)], names, **required)
    try:
        ops, _ = core.GradientRegistry.GetGradientForOp(op, [n + "_grad" for n in names])
    except Exception as error:
        message = str(error)
        if "GradientRegistry()->Has(def.type())" in message:
            return "none"
        if "not implemented" in message:
            return "not_implemented"
        if "hould not" in message or "not have gradient" in message:
            return "should_not"
        if "did not pass schema checking" in message:
            return "schema"
        return "gradient"  # a maker exists but wants real arguments or inputs (Cast's `to`, say)
    return "gradient" if ops else "no_gradient"


def cmd_gradient_kinds(request, arrays, out):
    """What Caffe2's gradient registry says of every op (or of `request["ops"]`): "gradient", "no_gradient"
    (NO_GRADIENT), "should_not" (SHOULD_NOT_DO_GRADIENT), "not_implemented" or "none" (no maker).
    Each op is asked in a forked child, because some makers crash on a bare op (Pow's reads past its
    inputs, and crashes or not from run to run): a maker that crashed exists, so that is "gradient"
    (the registry refuses an op without a maker before any maker runs)."""
    kinds = {}
    for name in request.get("ops") or sorted(workspace.RegisteredOperators()):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                os.write(write_end, _gradient_kind(name).encode("ascii"))
            finally:
                os._exit(0)
        os.close(write_end)
        answer = os.read(read_end, 64).decode("ascii")
        os.close(read_end)
        os.waitpid(pid, 0)
        kinds[name] = answer or "gradient"
    return {"kinds": kinds}


def _run_step(step, arrays):
    kind = step["kind"]
    if kind == "op":
        workspace.RunOperatorOnce(_cpu_op(_proto(arrays, step["proto"], caffe2_pb2.OperatorDef)))
    elif kind == "ops":
        workspace.RunOperatorsOnce([_cpu_op(_proto(arrays, i, caffe2_pb2.OperatorDef)) for i in step["protos"]])
    elif kind == "net":
        workspace.RunNetOnce(_cpu_net(_proto(arrays, step["proto"], caffe2_pb2.NetDef)))
    elif kind == "create_net":
        workspace.CreateNet(_cpu_net(_proto(arrays, step["proto"], caffe2_pb2.NetDef)), True)
    elif kind == "run_net":
        workspace.RunNet(step["name"], step.get("num_iter", 1))
    elif kind == "plan":
        workspace.RunPlan(_cpu_plan(_proto(arrays, step["proto"], caffe2_pb2.PlanDef)))
    else:
        raise ValueError("unknown step kind %r" % kind)


def cmd_run(request, arrays, out):
    workspace.SwitchWorkspace(request.get("workspace", "oracle"), True)
    if request.get("reset", True):
        workspace.ResetWorkspace()
    for name, index in request.get("feeds", {}).items():
        workspace.FeedBlob(name, _to_blob(arrays[index]))
    for step in request.get("steps", []):
        _run_step(step, arrays)
    wanted = request.get("fetch")
    names = workspace.Blobs() if wanted in (None, "*") else wanted
    fetched, skipped, int8 = {}, [], {}
    for name in names:
        if not workspace.HasBlob(name):
            skipped.append(name)
            continue
        try:
            value = _from_blob(workspace.FetchBlob(name), name)
        except TypeError:  # an Int8TensorCPU: "Use FetchInt8Blob to fetch Int8 Blob"
            quantized = workspace.FetchInt8Blob(name)
            value = np.ascontiguousarray(quantized.data).reshape(quantized.data.shape)
            int8[name] = [float(quantized.scale), int(quantized.zero_point)]
        except Exception:  # a blob of a type the Python binding cannot fetch (a mutex, a DB cursor)
            value = None
        if value is None:
            skipped.append(name)
        else:
            fetched[name] = out.add(value)
    return {"blobs": fetched, "skipped": skipped, "int8": int8}


def _gradient_names(g_input):
    names = []
    for item in g_input:
        if item is None:
            names.append(None)
        elif isinstance(item, core.GradientSlice):
            names.append({"indices": str(item.indices), "values": str(item.values)})
        else:
            names.append(str(item))
    return names


def cmd_gradient_for_op(request, arrays, out):
    op = _proto(arrays, request["op"], caffe2_pb2.OperatorDef)
    g_output = [None if g is None else g for g in request["g_output"]]
    ops, g_input = core.GradientRegistry.GetGradientForOp(op, g_output)
    return {"ops": [out.proto(o) for o in ops], "g_input": _gradient_names(g_input)}


def cmd_backward_pass(request, arrays, out):
    ops = [_proto(arrays, i, caffe2_pb2.OperatorDef) for i in request["ops"]]
    ops_out, grad_map = core.GradientRegistry.GetBackwardPass(ops, request["ys"])
    keys = list(grad_map.keys())
    return {
        "ops": [out.proto(o) for o in ops_out],
        "grad_map": dict(zip(map(str, keys), _gradient_names([grad_map[k] for k in keys]))),
    }


# ------------------------------------------------------------------------------------------------
# Front-end builders from a JSON recipe


def _attribute(path):
    module, _, rest = path.partition(".")
    if module not in _MODULES:
        raise ValueError("a recipe may only name %s, not %r" % (", ".join(sorted(_MODULES)), path))
    value = _MODULES[module]
    for part in rest.split(".") if rest else []:
        value = getattr(value, part)
    return value


class Recipe(object):
    def __init__(self, arrays):
        self.arrays = arrays
        self.models = {}
        self.results = []

    def value(self, spec):
        if isinstance(spec, list):
            return [self.value(v) for v in spec]
        if not isinstance(spec, dict):
            return spec
        if len(spec) == 1:
            ((key, arg),) = spec.items()
            if key == "$model":
                return self.models[arg]
            if key == "$blob":
                return core.BlobReference(arg)
            if key == "$ref":
                value = self.results[arg[0]]
                for part in arg[1:]:
                    value = getattr(value, part) if isinstance(part, str) else value[part]
                return value
            if key == "$call":
                return self.call(arg)
            if key == "$tuple":
                return tuple(self.value(v) for v in arg)
            if key == "$get":
                return _attribute(arg)
            if key == "$net":
                return _proto(self.arrays, arg, caffe2_pb2.NetDef)
            if key == "$array":
                return self.arrays[arg]
        return dict((k, self.value(v)) for k, v in spec.items())

    def call(self, spec):
        target = spec["fn"]
        fn = _attribute(target) if isinstance(target, str) else self.value(target)
        if "method" in spec:
            fn = getattr(fn, spec["method"])
        args = self.value(spec.get("args", []))
        kwargs = self.value(spec.get("kwargs", {}))
        if spec.get("scope"):
            with scope.NameScope(spec["scope"]):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)


def _describe(value):
    if isinstance(value, core.BlobReference):
        return str(value)
    if isinstance(value, core.GradientSlice):
        return {"indices": str(value.indices), "values": str(value.values)}
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return dict((str(k), _describe(v)) for k, v in value.items())
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


def cmd_build(request, arrays, out):
    core.Net._net_names_used = set()  # net names ("step_net", "step_net_1", ...) as in a fresh process
    scope.CURRENT_NAME_SCOPE = ""
    recipe = Recipe(arrays)
    for name, kwargs in request.get("models", {}).items():
        recipe.models[name] = model_helper.ModelHelper(**kwargs)
    for spec in request.get("calls", []):
        recipe.results.append(recipe.call(spec))
    nets = {}
    for name, model in recipe.models.items():
        nets[name] = {"net": out.proto(model.net.Proto()), "init": out.proto(model.param_init_net.Proto())}
    return {"nets": nets, "results": [_describe(r) for r in recipe.results]}


def cmd_save_predictor(request, arrays, out):
    """Feed the parameters and example inputs, run the predict net once (the export's predict-init net
    zero-fills inputs and outputs with the shapes they have in the workspace), then `save_to_db`."""
    workspace.SwitchWorkspace(request.get("workspace", "oracle"), True)
    workspace.ResetWorkspace()
    for name, index in request.get("feeds", {}).items():
        workspace.FeedBlob(name, _to_blob(arrays[index]))
    net = _cpu_net(_proto(arrays, request["net"], caffe2_pb2.NetDef))
    workspace.RunNetOnce(net)
    meta = predictor_exporter.PredictorExportMeta(
        predict_net=net,
        parameters=request["parameters"],
        inputs=request["inputs"],
        outputs=request["outputs"],
        shapes=dict((k, tuple(v)) for k, v in request.get("shapes", {}).items()),
        name=request.get("name", ""),
    )
    predictor_exporter.save_to_db(request["db_type"], request["db"], meta)
    return {}


def cmd_run_predictor(request, arrays, out):
    """Load an export the way Caffe2's Python serving code did (`prepare_prediction_net`: the global and
    predict init nets run, the predict net is created), feed the inputs, run it, fetch the outputs."""
    workspace.SwitchWorkspace(request.get("workspace", "oracle"), True)
    workspace.ResetWorkspace()
    net = predictor_exporter.prepare_prediction_net(request["db"], request["db_type"])
    for name, index in request.get("feeds", {}).items():
        workspace.FeedBlob(name, _to_blob(arrays[index]))
    workspace.RunNet(net.Proto().name)
    fetched = {}
    for name in request["fetch"]:
        fetched[name] = out.add(_from_blob(workspace.FetchBlob(name), name))
    return {"blobs": fetched}


def cmd_python_ops(request, arrays, out):
    """Register Python ops (`core.Net.Python`'s mechanism): each source defines `NAME(inputs, outputs)`
    over Caffe2's TensorCPU wrappers. The client's own code (a test's stand-ins for ops Caffe2 lacks),
    never anything read from a net. Returns each function's token, for ops of type "Python"."""
    tokens = {}
    for name, source in request["functions"].items():
        namespace = {"np": np}
        exec(compile(source, "<python op %s>" % name, "exec"), namespace)
        tokens[name] = core._RegisterPythonImpl(namespace[name])
    return {"tokens": tokens}


COMMANDS = {
    "hello": cmd_hello,
    "gradient_kinds": cmd_gradient_kinds,
    "run": cmd_run,
    "gradient_for_op": cmd_gradient_for_op,
    "backward_pass": cmd_backward_pass,
    "build": cmd_build,
    "save_predictor": cmd_save_predictor,
    "run_predictor": cmd_run_predictor,
    "python_ops": cmd_python_ops,
}


def main():
    stream = sys.stdin.buffer
    while True:
        frame = read_frame(stream)
        if frame is None:
            return
        request, arrays = frame
        out = Arrays()
        try:
            command = COMMANDS[request["cmd"]]
            answer = dict(command(request, arrays, out), ok=True)
        except BaseException as error:  # every failure becomes an answer; only an abort ends the process
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            out = Arrays()
            answer = {
                "ok": False,
                "error": {
                    "type": type(error).__name__,
                    "message": str(error),
                    "traceback": traceback.format_exc(),
                },
            }
        write_frame(_PROTOCOL_FD, answer, out.items)


if __name__ == "__main__":
    main()
