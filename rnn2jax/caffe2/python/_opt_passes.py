"""Caffe2's nomnigraph optimization passes (caffe2/opt/), which `caffe2.python.transformations` runs through the
C extension: `AddNNPACK`, `FuseNNPACKConvRelu` and `DeadCodeElim` rewrite a NetDef; `FuseConvBN` (a workspace
pass) also folds a test-mode SpatialBN into the weights and bias blobs of the Conv before it.

Each pass works as Caffe2's does, on its data-flow graph (`_nomni.NNModule`, built and written back as
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
from ._nomni import NeuralNetData, NNModule, NodeRef, _to_module, _to_netdef


def _kind(node: NodeRef) -> str:
    """The node's nomnigraph operator kind ("Conv", "Relu", "BatchNormalization" for SpatialBN, ...), or ""."""
    return getattr(node._data, "_kind", "") if node.isOperator() else ""


def _op(node: NodeRef) -> caffe2_pb2.OperatorDef:
    """The operator's own OperatorDef (its Caffe2 annotation's), which a pass edits in place."""
    return node._data._annotation._op_def


def _ops_of_kind(module: NNModule, kind: str) -> list[NodeRef]:
    """nn::dataIterator: the operators of `kind`, in the graph's node order, listed before the pass changes it."""
    return [n for n in module._data_flow._node_list() if _kind(n) == kind]


def _inputs(node: NodeRef) -> list[NodeRef]:
    return [edge.tail for edge in node._in]


def _outputs(node: NodeRef) -> list[NodeRef]:
    return [edge.head for edge in node._out]


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


def add_nnpack(module: NNModule, low_memory: bool = False) -> None:
    """caffe2::opt::addNNPACK: the NNPACK engine for each 2D NCHW Conv of stride 1 with a bias."""
    for node in _ops_of_kind(module, "Conv"):
        op = _op(node)
        if len(node._in) < 3 or node._data._layout != "NCHW" or any(s != 1 for s in _strides(op)):
            continue
        kernel = _kernel_shape(op)
        if len(kernel) != 2 or (kernel[0] != kernel[1] and 1 in kernel):
            continue
        op.engine = "NNPACK"
        if not low_memory:
            op.arg.add(name="convolution_transform_strategy", s=b"PRECOMPUTE")


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


def fuse_activation(
    module: NNModule, kind: str, activation: str, should_fuse: Callable[[caffe2_pb2.OperatorDef], bool]
) -> list[NodeRef]:
    """caffe2::opt::fuseActivation: an op whose one output only `activation` reads writes the activation's
    output itself (never in place: an output named as the op's first input keeps the op's own name, and one a
    consumer writes again becomes `<name>_fusion_fix`). Returns the fused op nodes."""
    dfg = module._data_flow
    fused = []
    for node in _ops_of_kind(module, kind):
        outputs = _outputs(node)
        if len(outputs) != 1:
            continue
        output = outputs[0]
        consumers = _outputs(output)
        if len(consumers) != 1 or _kind(consumers[0]) != activation:
            continue
        act = consumers[0]
        act_outputs = _outputs(act)
        if len(act_outputs) != 1 or not should_fuse(_op(node)):
            continue
        act_output = act_outputs[0]
        out_node = act_output
        if act_output.getName() != _inputs(node)[0].getName():
            dfg._replace_node(output, act_output)
            dfg._delete_node(act)
            dfg._delete_node(output)
        else:
            dfg._replace_node(act_output, output)
            out_node = output
            dfg._delete_node(act)
            dfg._delete_node(act_output)
        name = out_node.getName()
        if any(o.getName() == name for c in _outputs(out_node) for o in _outputs(c)):
            dfg._replace_node(out_node, dfg._create_node(NeuralNetData(name + "_fusion_fix")))
        fused.append(node)
    return fused


def fuse_nnpack_conv_relu(module: NNModule) -> None:
    """caffe2::opt::fuseNNPACKConvRelu: an NNPACK Conv followed by its only Relu gets `activation` "Relu"."""
    for node in fuse_activation(module, "Conv", "Relu", _nnpack_conv_relu_efficient):
        _op(node).arg.add(name="activation", s=b"Relu")


def dead_code_elim(module: NNModule) -> None:
    """caffe2::opt::deadCodeElim: drop ops none of whose outputs is read or external, until none is left."""
    dfg = module._data_flow
    changed = True
    while changed:
        changed = False
        for node in dfg._node_list():
            if not node.isOperator():
                continue
            if any(o._out or o in module._outputs for o in _outputs(node)):
                continue
            for output in _outputs(node):
                dfg._delete_node(output)
            dfg._delete_node(node)
            changed = True
            break


# nomnigraph's BatchNormalization is made without reading the op's arguments: its epsilon is the default
_NOM_BN_EPSILON = np.float32(1e-5)


def _fuse_conv_bn_once(module: NNModule, ws: Any) -> bool:
    """One step of caffe2::opt::fuseConvBN (see its comment: W' = W s / sqrt(var + eps),
    b' = (b - mean) s / sqrt(var + eps) + bias), in float32 as Caffe2 computes it."""
    dfg = module._data_flow
    order = 0
    for conv in _ops_of_kind(module, "Conv"):
        if not conv._out:
            continue
        output = _outputs(conv)[0]
        consumers = _outputs(output)
        if len(consumers) != 1 or _kind(consumers[0]) != "BatchNormalization":
            continue
        bn = consumers[0]
        bn_outputs = _outputs(bn)
        if len(bn_outputs) != 1:
            continue
        conv_inputs = _inputs(conv)
        if len(conv_inputs) < 2:
            continue
        bn_inputs = _inputs(bn)
        if len(bn_inputs) < 5:
            raise BadArgumentError("FuseConvBN: Invalid batch normalization input size")

        def tensor(name: str) -> np.ndarray:
            if not ws.exists(name):
                raise MissingBlobError(f"FuseConvBN: blob '{name}' is not in the workspace")
            value = np.asarray(ws.fetch(name))
            if value.dtype != np.float32:
                raise BadArgumentError(f"FuseConvBN: blob '{name}' is {value.dtype}, not float32")
            return np.array(value, copy=True)

        filter_name = conv_inputs[1].getName()
        weights = tensor(filter_name)
        scale, bias_bn, mean, var = (tensor(t.getName()).reshape(-1) for t in bn_inputs[1:5])
        if len(conv_inputs) == 2:
            while True:
                bias_name = f"{_op(conv).name}_bias{order}"
                if not ws.exists(bias_name):
                    bias_node = dfg._create_node(NeuralNetData(bias_name))
                    module._inputs[bias_node] = None
                    dfg._create_edge(bias_node, conv)
                    # Caffe2 leaves the new tensor's memory as it is; rnn2jax starts it at zero
                    ws.put(bias_name, np.zeros(weights.shape[0], dtype=np.float32))
                    break
                order += 1
        bias_name = _inputs(conv)[2].getName()
        bias = tensor(bias_name).reshape(-1)
        channels = weights.shape[0]
        if min(len(scale), len(bias_bn), len(mean), len(var), len(bias)) < channels:
            raise BadArgumentError(
                f"FuseConvBN: the SpatialBN after Conv '{_op(conv).name}' has fewer than the filter's "
                f"{channels} channels"
            )
        coeff = scale[:channels] / np.sqrt(var[:channels] + _NOM_BN_EPSILON)
        weights = (weights.reshape(channels, -1) * coeff[:, None]).reshape(weights.shape)
        fused_bias = bias.copy()
        fused_bias[:channels] = (bias[:channels] - mean[:channels]) * coeff + bias_bn[:channels]
        ws.put(filter_name, weights)
        ws.put(bias_name, fused_bias.reshape(np.asarray(ws.fetch(bias_name)).shape))
        bn_output = bn_outputs[0]
        dfg._delete_node(output)
        dfg._create_edge(conv, bn_output)
        dfg._delete_node(bn)
        return True
    return False


def fuse_conv_bn(module: NNModule, ws: Any) -> None:
    """caffe2::opt::fuseConvBN: fold each test-mode SpatialBN that alone reads a Conv's output into the Conv."""
    while _fuse_conv_bn_once(module, ws):
        pass


PASSES: dict[str, Callable[[NNModule], None]] = {
    "AddNNPACK": add_nnpack,
    "DeadCodeElim": dead_code_elim,
    "FuseNNPACKConvRelu": fuse_nnpack_conv_relu,
}
WORKSPACE_PASSES: dict[str, Callable[[NNModule, Any], None]] = {"FuseConvBN": fuse_conv_bn}


def run_pass(name: str, net: caffe2_pb2.NetDef, ws: Any = None) -> caffe2_pb2.NetDef:
    """Run pass `name` (a workspace pass when `ws` is given) over `net`, as Caffe2's run_transform does."""
    module, _ = _to_module(net)
    if ws is None:
        if name not in PASSES:
            raise BadArgumentError(f"Pass doesn't exist: {name}")
        PASSES[name](module)
    else:
        if name not in WORKSPACE_PASSES:
            raise BadArgumentError(f"Pass doesn't exist: {name}")
        WORKSPACE_PASSES[name](module, ws)
    return _to_netdef(module, net)
