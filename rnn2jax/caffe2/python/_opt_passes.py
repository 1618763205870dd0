"""Caffe2's nomnigraph optimization passes (caffe2/opt/), which `caffe2.python.transformations` runs through the
C extension: `AddNNPACK`, `FuseNNPACKConvRelu` and `DeadCodeElim` rewrite a NetDef; `FuseConvBN` (a workspace
pass) also folds a test-mode SpatialBN into the weights and bias blobs of the Conv before it.

Each pass works as Caffe2's does, on its data-flow graph (`_NNModule`, built and written back as
caffe2/opt/converter.cc does), so the rewritten net is Caffe2's to the byte: ops keep their order, an op's
inputs and outputs follow the graph's edges, `order` arguments are normalized, ops without a registered
converter get their `device_option.device_type` set, and external inputs and outputs that the graph does not
reach are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import BadArgumentError, MissingBlobError
from ..proto import caffe2_pb2

# Op types with a nomnigraph converter (caffe2/opt/converter.cc): their nom operator is of that name, except
# SpatialBN's (BatchNormalization), so only those names write the stored OperatorDef back unchanged.
_CONVERTER_TYPES = frozenset(
    {"Conv", "ConvTranspose", "Relu", "Sum", "SpatialBN", "Flatten", "Clip", "AveragePool", "MaxPool", "Concat", "FC"}
)
_NOM_NAMES = {"SpatialBN": "BatchNormalization"}


class _Edge:
    __slots__ = ("head", "tail")

    def __init__(self, tail: _Node, head: _Node):
        self.tail, self.head = tail, head


class _Node:
    """A tensor (`name`) or an operator (`op`, its OperatorDef) of the data-flow graph."""

    __slots__ = ("alive", "in_edges", "name", "op", "out_edges")

    def __init__(self, name: str = "", op: caffe2_pb2.OperatorDef | None = None):
        self.name, self.op = name, op
        self.in_edges: list[_Edge] = []
        self.out_edges: list[_Edge] = []
        self.alive = True

    @property
    def kind(self) -> str:
        return "" if self.op is None else self.op.type

    def inputs(self) -> list[_Node]:
        return [e.tail for e in self.in_edges]

    def outputs(self) -> list[_Node]:
        return [e.head for e in self.out_edges]


class _NNModule:
    """nomnigraph's NNModule: the graph, the ops in program order (one basic block), external inputs/outputs."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.instructions: list[_Node] = []
        self.inputs: dict[_Node, None] = {}
        self.outputs: dict[_Node, None] = {}

    def create_node(self, name: str = "", op: caffe2_pb2.OperatorDef | None = None) -> _Node:
        node = _Node(name, op)
        self.nodes.append(node)
        return node

    @staticmethod
    def create_edge(tail: _Node, head: _Node) -> None:
        edge = _Edge(tail, head)
        head.in_edges.append(edge)
        tail.out_edges.append(edge)

    def delete_node(self, node: _Node) -> None:
        for edge in list(node.in_edges):
            edge.tail.out_edges.remove(edge)
        for edge in list(node.out_edges):
            edge.head.in_edges.remove(edge)
        node.in_edges, node.out_edges, node.alive = [], [], False
        self.nodes.remove(node)
        if node in self.instructions:
            self.instructions.remove(node)

    @staticmethod
    def replace_node(old: _Node, new: _Node) -> None:
        """The edges of `old` become `new`'s (each keeps its place at its other end)."""
        for edge in list(old.in_edges):
            edge.head = new
            old.in_edges.remove(edge)
            new.in_edges.append(edge)
        for edge in list(old.out_edges):
            edge.tail = new
            old.out_edges.remove(edge)
            new.out_edges.append(edge)

    def op_nodes(self, op_type: str) -> list[_Node]:
        return [n for n in self.nodes if n.op is not None and n.op.type == op_type]


def _layout(op: caffe2_pb2.OperatorDef) -> str:
    order = ""
    for arg in op.arg:
        if arg.name == "order":
            order = arg.s.decode("utf-8", "replace")
    return {"NCHW": "NCHW", "nchw": "NCHW", "NHWC": "NHWC", "nhwc": "NHWC"}.get(order, "")


def to_nnmodule(net: caffe2_pb2.NetDef) -> _NNModule:
    """caffe2::convertToNNModule (not strict: external inputs no op reads and outputs no op writes are left out)."""
    module = _NNModule()
    blobs: dict[str, _Node] = {}
    external = set(net.external_input)
    for source in net.op:
        op = caffe2_pb2.OperatorDef()
        op.CopyFrom(source)
        node = module.create_node(op=op)
        for name in op.input:
            if name not in blobs:
                blobs[name] = module.create_node(name)
                if name in external:
                    module.inputs[blobs[name]] = None
                    external.discard(name)
            module.create_edge(blobs[name], node)
        for name in op.output:
            blobs[name] = module.create_node(name)
            module.create_edge(node, blobs[name])
        module.instructions.append(node)
    for name in net.external_output:
        if name in blobs:
            module.outputs[blobs[name]] = None
    return module


def _merge_external(current: dict[_Node, None], old: list[str]) -> list[str]:
    names = list(dict.fromkeys(n.name for n in current if n.alive))
    kept = [name for name in old if name in names]
    return list(dict.fromkeys(kept)) + [name for name in names if name not in kept]


def to_netdef(module: _NNModule, old: caffe2_pb2.NetDef) -> caffe2_pb2.NetDef:
    """caffe2::convertToCaffe2Proto(module, old): `old` with the graph's ops and external blobs."""
    net = caffe2_pb2.NetDef()
    net.CopyFrom(old)
    del net.op[:]
    for node in module.instructions:
        op = net.op.add()
        op.CopyFrom(node.op)
        if _NOM_NAMES.get(op.type, op.type) not in _CONVERTER_TYPES:
            op.device_option.device_type = op.device_option.device_type
        del op.input[:]
        del op.output[:]
        op.input.extend(t.name for t in node.inputs())
        op.output.extend(t.name for t in node.outputs())
        layout = _layout(node.op)
        if layout:
            order = next((a for a in op.arg if a.name == "order"), None)
            if order is None:
                order = op.arg.add()
                order.name = "order"
            order.s = layout.encode()
    inputs = _merge_external(module.inputs, list(old.external_input))
    outputs = _merge_external(module.outputs, list(old.external_output))
    del net.external_input[:]
    del net.external_output[:]
    net.external_input.extend(inputs)
    net.external_output.extend(outputs)
    return net


# ------------------------------------------------------------------------------------------------
# The passes


def _int_arg(op: caffe2_pb2.OperatorDef, name: str) -> int | None:
    value = None
    for arg in op.arg:
        if arg.name == name:
            value = int(arg.i)
    return value


def _kernel_shape(op: caffe2_pb2.OperatorDef) -> list[int]:
    """nomnigraph's Conv kernel shape: `kernel`, else `kernels`, else `kernel_h` and `kernel_w`."""
    args = {a.name: a for a in op.arg}
    if "kernel" in args:
        return [int(args["kernel"].i)] * 2
    if "kernels" in args:
        return [int(k) for k in args["kernels"].ints]
    if "kernel_h" in args and "kernel_w" in args:
        return [int(args["kernel_h"].i), int(args["kernel_w"].i)]
    return []


def _strides(op: caffe2_pb2.OperatorDef) -> list[int]:
    stride = _int_arg(op, "stride")  # nomnigraph reads `stride` only
    return [] if stride is None else [stride, stride]


def add_nnpack(module: _NNModule, low_memory: bool = False) -> None:
    """caffe2::opt::addNNPACK: the NNPACK engine for each 2D NCHW Conv of stride 1 with a bias."""
    for node in list(module.nodes):
        if node.kind != "Conv" or len(node.in_edges) < 3 or _layout(node.op) != "NCHW":
            continue
        if any(s != 1 for s in _strides(node.op)):
            continue
        kernel = _kernel_shape(node.op)
        if len(kernel) != 2 or (kernel[0] != kernel[1] and 1 in kernel):
            continue
        node.op.engine = "NNPACK"
        if not low_memory:
            arg = node.op.arg.add()
            arg.name = "convolution_transform_strategy"
            arg.s = b"PRECOMPUTE"


def _nnpack_conv_relu_efficient(op: caffe2_pb2.OperatorDef) -> bool:
    if op.engine != "NNPACK":
        return False
    algo = "AUTO"
    for arg in op.arg:
        if arg.name == "algo":
            algo = arg.s.decode("utf-8", "replace")
    if algo in ("AUTO", ""):
        return all(s <= 1 for s in _strides(op)) and all(k >= 2 for k in _kernel_shape(op))
    return algo in ("WINOGRAD", "WINOGRAD_FP16", "FT8x8", "FT16x16")


def _consumers(tensor: _Node) -> list[_Node]:
    return tensor.outputs()


def fuse_activation(
    module: _NNModule, op_type: str, activation: str, should_fuse: Callable[[caffe2_pb2.OperatorDef], bool]
) -> list[_Node]:
    """caffe2::opt::fuseActivation: an op whose one output only `activation` reads writes the activation's
    output itself (never in place: an output named as the op's first input keeps the op's own name, and one a
    consumer writes again becomes `<name>_fusion_fix`). Returns the fused op nodes."""
    fused = []
    for node in module.op_nodes(op_type):
        outputs = node.outputs()
        if len(outputs) != 1:
            continue
        output = outputs[0]
        consumers = _consumers(output)
        if len(consumers) != 1 or consumers[0].kind != activation:
            continue
        act = consumers[0]
        act_outputs = act.outputs()
        if len(act_outputs) != 1 or not should_fuse(node.op):
            continue
        act_output = act_outputs[0]
        out_node = act_output
        if act_output.name != node.inputs()[0].name:
            module.replace_node(output, act_output)
            module.delete_node(act)
            module.delete_node(output)
        else:
            module.replace_node(act_output, output)
            out_node = output
            module.delete_node(act)
            module.delete_node(act_output)
        if any(o.name == out_node.name for c in _consumers(out_node) for o in c.outputs()):
            module.replace_node(out_node, module.create_node(out_node.name + "_fusion_fix"))
        fused.append(node)
    return fused


def fuse_nnpack_conv_relu(module: _NNModule) -> None:
    """caffe2::opt::fuseNNPACKConvRelu: an NNPACK Conv followed by its only Relu gets `activation` "Relu"."""
    for node in fuse_activation(module, "Conv", "Relu", _nnpack_conv_relu_efficient):
        arg = node.op.arg.add()
        arg.name = "activation"
        arg.s = b"Relu"


def dead_code_elim(module: _NNModule) -> None:
    """caffe2::opt::deadCodeElim: drop ops none of whose outputs is read or external, until none is left."""
    changed = True
    while changed:
        changed = False
        for node in module.nodes:
            if node.op is None:
                continue
            if any(o.out_edges or o in module.outputs for o in node.outputs()):
                continue
            for output in node.outputs():
                module.delete_node(output)
            module.delete_node(node)
            changed = True
            break


# nomnigraph's BatchNormalization is made without reading the op's arguments: its epsilon is the default
_NOM_BN_EPSILON = np.float32(1e-5)


def _fuse_conv_bn_once(module: _NNModule, ws: Any) -> bool:
    """One step of caffe2::opt::fuseConvBN (see its comment: W' = W s / sqrt(var + eps),
    b' = (b - mean) s / sqrt(var + eps) + bias), in float32 as Caffe2 computes it."""
    order = 0
    for conv in module.op_nodes("Conv"):
        if not conv.out_edges:
            continue
        output = conv.outputs()[0]
        consumers = _consumers(output)
        if len(consumers) != 1 or consumers[0].kind != "SpatialBN":
            continue
        bn = consumers[0]
        bn_outputs = bn.outputs()
        if len(bn_outputs) != 1:
            continue
        conv_inputs = conv.inputs()
        if len(conv_inputs) < 2:
            continue
        bn_inputs = bn.inputs()
        if len(bn_inputs) < 5:
            raise BadArgumentError("FuseConvBN: Invalid batch normalization input size")

        def tensor(name: str) -> np.ndarray:
            if not ws.exists(name):
                raise MissingBlobError(f"FuseConvBN: blob '{name}' is not in the workspace")
            value = np.asarray(ws.fetch(name))
            if value.dtype != np.float32:
                raise BadArgumentError(f"FuseConvBN: blob '{name}' is {value.dtype}, not float32")
            return np.array(value, copy=True)

        filter_name = conv_inputs[1].name
        weights = tensor(filter_name)
        scale, bias_bn, mean, var = (tensor(t.name).reshape(-1) for t in bn_inputs[1:5])
        if len(conv_inputs) == 2:
            while True:
                bias_name = f"{conv.op.name}_bias{order}"
                if not ws.exists(bias_name):
                    bias_node = module.create_node(bias_name)
                    module.inputs[bias_node] = None
                    module.create_edge(bias_node, conv)
                    # Caffe2 leaves the new tensor's memory as it is; rnn2jax starts it at zero
                    ws.put(bias_name, np.zeros(weights.shape[0], dtype=np.float32))
                    break
                order += 1
        bias_name = conv.inputs()[2].name
        bias = tensor(bias_name).reshape(-1)
        channels = weights.shape[0]
        if min(len(scale), len(bias_bn), len(mean), len(var), len(bias)) < channels:
            raise BadArgumentError(
                f"FuseConvBN: the SpatialBN after Conv '{conv.op.name}' has fewer than the filter's {channels} channels"
            )
        coeff = scale[:channels] / np.sqrt(var[:channels] + _NOM_BN_EPSILON)
        weights = (weights.reshape(channels, -1) * coeff[:, None]).reshape(weights.shape)
        fused_bias = bias.copy()
        fused_bias[:channels] = (bias[:channels] - mean[:channels]) * coeff + bias_bn[:channels]
        ws.put(filter_name, weights)
        ws.put(bias_name, fused_bias.reshape(np.asarray(ws.fetch(bias_name)).shape))
        bn_output = bn_outputs[0]
        module.delete_node(output)
        module.create_edge(conv, bn_output)
        module.delete_node(bn)
        return True
    return False


def fuse_conv_bn(module: _NNModule, ws: Any) -> None:
    """caffe2::opt::fuseConvBN: fold each test-mode SpatialBN that alone reads a Conv's output into the Conv."""
    while _fuse_conv_bn_once(module, ws):
        pass


PASSES: dict[str, Callable[[_NNModule], None]] = {
    "AddNNPACK": add_nnpack,
    "DeadCodeElim": dead_code_elim,
    "FuseNNPACKConvRelu": fuse_nnpack_conv_relu,
}
WORKSPACE_PASSES: dict[str, Callable[[_NNModule, Any], None]] = {"FuseConvBN": fuse_conv_bn}


def run_pass(name: str, net: caffe2_pb2.NetDef, ws: Any = None) -> caffe2_pb2.NetDef:
    """Run pass `name` (a workspace pass when `ws` is given) over `net`, as Caffe2's run_transform does."""
    module = to_nnmodule(net)
    if ws is None:
        if name not in PASSES:
            raise BadArgumentError(f"Pass doesn't exist: {name}")
        PASSES[name](module)
    else:
        if name not in WORKSPACE_PASSES:
            raise BadArgumentError(f"Pass doesn't exist: {name}")
        WORKSPACE_PASSES[name](module, ws)
    return to_netdef(module, net)
