"""Caffe2's nomnigraph bindings (`caffe2/python/pybind_state_nomni.cc`), the C extension's part that Caffe2's
`caffe2.python.nomnigraph` and `nomnigraph_transformations` build on: a net as a data-flow graph of operator
and tensor nodes (`NNModule`, `NNGraph`, `NodeRef`), the control flow that orders its operators, subgraph
matching (`NNMatchGraph`, `matchSubgraph`), Caffe2 annotations, and the conversions between a NetDef and a
module (Caffe2's `caffe2/opt/converter.cc`, `distributed.cc`).

Names and behaviour are the bindings'. Where a C++ `CAFFE_ENFORCE` fails these raise `BadArgumentError`;
where Caffe2 only asserts (compiled out of its release builds) nothing is checked, as there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import BadArgumentError, InputTypeError
from ...ir.wire import parse_binary
from ..proto import caffe2_pb2
from . import _nomni_graph as _g
from ._nomni_match import MatchPredicate, is_subgraph_match

_log = logging.getLogger("caffe2.nomnigraph")

# Op types that Caffe2's ConverterRegistry converts (caffe2/opt/converter.cc, distributed.cc): back to an
# OperatorDef they give their annotation's def as it is, without the annotation's device type.
_REGISTERED_CONVERTERS = frozenset(
    {"AveragePool", "Clip", "Concat", "Conv", "ConvTranspose", "Declare", "Export", "FC", "Flatten", "MaxPool"}
    | {"Relu", "Sum"}
)
# Op types whose nomnigraph operator kind has a name of its own (`NeuralNetOperator::getName`)
_KIND_NAMES = {"SpatialBN": "BatchNormalization"}
_LAYOUTS = {"NCHW": "NCHW", "nchw": "NCHW", "NHWC": "NHWC", "nhwc": "NHWC"}


def _enforce(condition: bool, message: str) -> None:
    if not condition:
        raise BadArgumentError(message)


def _message(obj: Any, kind: type, what: str) -> Any:
    """A `kind` message from any object with `SerializeToString` (a protobuf message of that type)."""
    _enforce(hasattr(obj, "SerializeToString"), what)
    return parse_binary(obj.SerializeToString(), kind, what)


# ------------------------------------------------------------------------------------------------
# Node data: operators and tensors


class NeuralNetOperator:
    """An operator: its name (the op type, or its nomnigraph kind's name), layout and annotation."""

    def __init__(self, name: str):
        if not isinstance(name, str):
            raise InputTypeError(f"NeuralNetOperator(name): a str, not a {type(name).__name__}")
        self._name = name
        self._kind = "GenericOperator"  # or a kind with converters: "Conv", "Declare", ...
        self._layout: str | None = None
        self._annotation: Annotation | None = None

    def getName(self) -> str:
        return self._name


class NeuralNetData:
    """A tensor: a blob name."""

    def __init__(self, name: str):
        if not isinstance(name, str):
            raise InputTypeError(f"NeuralNetData(name): a str, not a {type(name).__name__}")
        self._name = name

    def getName(self) -> str:
        return self._name


def _kind_operator(kind: str) -> NeuralNetOperator:
    op = NeuralNetOperator(kind)
    op._kind = kind
    return op


# ------------------------------------------------------------------------------------------------
# Annotation


class Annotation:
    """Caffe2's annotation of an operator (`Caffe2Annotation`): its OperatorDef, device name and type, and
    the distributed key/length nodes and component levels."""

    def __init__(self) -> None:
        self._op_def = caffe2_pb2.OperatorDef()
        self._has_op_def = False
        self._device = ""
        self._device_type = caffe2_pb2.CPU
        self._key_node: NodeRef | None = None
        self._length_node: NodeRef | None = None
        self._component_levels: list[str] = []

    def _copy(self) -> Annotation:
        copy = Annotation()
        copy._op_def.CopyFrom(self._op_def)
        copy._has_op_def = self._has_op_def
        copy._device, copy._device_type = self._device, self._device_type
        copy._key_node, copy._length_node = self._key_node, self._length_node
        copy._component_levels = list(self._component_levels)
        return copy

    def _set_op_def(self, op: caffe2_pb2.OperatorDef) -> None:
        self._op_def.CopyFrom(op)
        self._has_op_def = True

    def _get_op_def(self) -> caffe2_pb2.OperatorDef:
        _enforce(self._has_op_def, "OperatorDef was never set.  Use Caffe2Annotation::setOperatorDef.")
        copy = caffe2_pb2.OperatorDef()
        copy.CopyFrom(self._op_def)
        return copy

    def setDevice(self, device: str) -> None:
        self._device = str(device)

    def getDevice(self) -> str:
        return self._device

    def setDeviceType(self, device_type: int) -> None:
        self._device_type = int(device_type)

    def getDeviceType(self) -> int:
        return self._device_type

    def setKeyNode(self, node: NodeRef) -> None:
        self._key_node = node

    def getKeyNode(self) -> NodeRef:
        _enforce(self._key_node is not None, "No key node has been annotated")
        return self._key_node  # type: ignore[return-value]

    def setLengthNode(self, node: NodeRef) -> None:
        self._length_node = node

    def getLengthNode(self) -> NodeRef:
        _enforce(self._length_node is not None, "No length node has been annotated")
        return self._length_node  # type: ignore[return-value]

    def setComponentLevels(self, levels: Sequence[str]) -> None:
        self._component_levels = [str(level) for level in levels]

    def getComponentLevels(self) -> list[str]:
        return list(self._component_levels)

    def hasDeviceOption(self) -> bool:
        return self._op_def.HasField("device_option")

    @property
    def device_option(self) -> caffe2_pb2.DeviceOption:
        """A copy of the OperatorDef's device option (Caffe2 refuses when there is none)."""
        _enforce(self.hasDeviceOption(), "DeviceOption was never set.  Use Caffe2Annotation::setDeviceOption.")
        copy = caffe2_pb2.DeviceOption()
        copy.CopyFrom(self._op_def.device_option)
        return copy

    @device_option.setter
    def device_option(self, value: Any) -> None:
        option = _message(value, caffe2_pb2.DeviceOption, "device_option can only be set to a DeviceOption")
        self._op_def.device_option.CopyFrom(option)

    @property
    def operator_def(self) -> caffe2_pb2.OperatorDef:
        return self._get_op_def()

    @operator_def.setter
    def operator_def(self, value: Any) -> None:
        self._set_op_def(_message(value, caffe2_pb2.OperatorDef, "operator_def can only be set to an OperatorDef"))


# ------------------------------------------------------------------------------------------------
# Graphs and nodes


class Node(_g._Node):
    """A node of a generic `Graph`."""

    __slots__ = ()


class Edge(_g._Edge):
    __slots__ = ()


class Graph(_g.Digraph):
    """A generic graph of Python objects (`nom::Graph<py::object>`)."""

    node_type = Node
    edge_type = Edge

    def createNode(self, obj: Any) -> Node:
        return self._create_node(obj)

    def createEdge(self, a: Node, b: Node) -> Edge:
        return self._create_edge(_of(a, Node, "createEdge"), _of(b, Node, "createEdge"))

    def __repr__(self) -> str:
        return _g.dot_string(self._nodes, self._edges, lambda n: {"label": str(n._data)}, id)


def _of(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        raise InputTypeError(f"{where}: expects a {kind.__name__}, got a {type(value).__name__}")
    return value


class NodeRef(_g._Node):
    """A node of a data-flow graph: an operator or a tensor."""

    __slots__ = ()

    def isOperator(self) -> bool:
        return isinstance(self._data, NeuralNetOperator)

    def isTensor(self) -> bool:
        return isinstance(self._data, NeuralNetData)

    def getType(self) -> str:
        return "Tensor" if self.isTensor() else "Operator" if self.isOperator() else "Unknown"

    def getName(self) -> str:
        return self._data.getName() if isinstance(self._data, NeuralNetOperator | NeuralNetData) else "Unknown"

    type = property(getType)
    name = property(getName)

    def getOperator(self) -> NeuralNetOperator:
        _enforce(self.isOperator(), "getOperator: the node is not a NeuralNetOperator")
        return self._data

    def getTensor(self) -> NeuralNetData:
        _enforce(self.isTensor(), "getTensor: the node is not a NeuralNetData")
        return self._data

    operator = property(getOperator)
    tensor = property(getTensor)

    def getInputs(self) -> list[NodeRef]:
        _enforce(self.isOperator(), "getInputs: the node is not a NeuralNetOperator")
        return [edge.tail for edge in self._in]

    def getOutputs(self) -> list[NodeRef]:
        _enforce(self.isOperator(), "getOutputs: the node is not a NeuralNetOperator")
        return [edge.head for edge in self._out]

    def hasProducer(self) -> bool:
        return bool(self._in)

    def getProducer(self) -> NodeRef:
        _enforce(self.isTensor(), "getProducer: the node is not a NeuralNetData")
        _enforce(bool(self._in), f"getProducer: tensor {self.getName()!r} does not have a producer")
        return self._in[0].tail

    def getConsumers(self) -> list[NodeRef]:
        _enforce(self.isTensor(), "getConsumers: the node is not a NeuralNetData")
        return [edge.head for edge in self._out]

    inputs = property(getInputs)
    outputs = property(getOutputs)
    producer = property(getProducer)
    consumers = property(getConsumers)

    def getAnnotation(self) -> Annotation:
        """The operator's annotation (the node's own: changes to it are the node's), made from the operator
        when it has none."""
        return _annotation_of(self)

    def setAnnotation(self, annotation: Annotation) -> None:
        """Gives the operator a copy of `annotation`."""
        _enforce(self.isOperator(), "setAnnotation: the node is not a NeuralNetOperator")
        self._data._annotation = _of(annotation, Annotation, "setAnnotation")._copy()

    annotation = property(getAnnotation, setAnnotation)

    def getOperatorPredecessors(self) -> list[NodeRef]:
        _enforce(self.isOperator(), "getOperatorPredecessors: the node is not a NeuralNetOperator")
        return [edge.tail._in[0].tail for edge in self._in if edge.tail._in]

    def getOperatorSuccessors(self) -> list[NodeRef]:
        _enforce(self.isOperator(), "getOperatorSuccessors: the node is not a NeuralNetOperator")
        return [consumer.head for edge in self._out for consumer in edge.head._out]


def _nn_labels(node: NodeRef) -> dict[str, str]:
    if node.isOperator():
        return {"label": node.getName(), "shape": "box"}
    if node.isTensor():
        return {"label": node.getName()}
    return {}


class NNGraph(_g.Digraph):
    """The data-flow graph of an `NNModule`: edges join an operator and a tensor."""

    node_type = NodeRef

    def createNode(self, value: Any) -> NodeRef:
        """A node for a copy of a `NeuralNetOperator` or `NeuralNetData` (by name), or for an OperatorDef
        (its inputs and outputs dropped, as Caffe2 warns)."""
        if isinstance(value, NeuralNetOperator):
            return self._create_node(NeuralNetOperator(value.getName()))
        if isinstance(value, NeuralNetData):
            return self._create_node(NeuralNetData(value.getName()))
        op = _message(value, caffe2_pb2.OperatorDef, "createNode takes either OperatorDef or ng.NeuralNetOperator")
        if op.input or op.output:
            _log.warning(
                "Input and output specifications are dropped when converting a single operator to "
                "nomnigraph. Use ng.NNModule(NetDef&) to preserve these."
            )
        return self._create_node(_operator_from_def(op))

    def createEdge(self, a: NodeRef, b: NodeRef) -> None:
        a, b = _of(a, NodeRef, "createEdge"), _of(b, NodeRef, "createEdge")
        _enforce(
            (a.isOperator() and b.isTensor()) or (b.isOperator() and a.isTensor()),
            "Edges must exist between NeuralNetOperator and NeuralNetData",
        )
        self._create_edge(a, b)

    def deleteEdge(self, a: Any, b: NodeRef | None = None) -> None:
        """Deletes the edge from `a` to `b` if there is one (or, given an edge, that edge)."""
        if b is None:
            self._delete_edge(_of(a, _g._Edge, "deleteEdge"))
            return
        edge = self._edge_if_exists(_of(a, NodeRef, "deleteEdge"), _of(b, NodeRef, "deleteEdge"))
        if edge is not None:
            self._delete_edge(edge)

    def deleteNode(self, node: NodeRef) -> None:
        self._delete_node(_of(node, NodeRef, "deleteNode"))

    def replaceNode(self, old_node: NodeRef, new_node: NodeRef) -> None:
        """Moves the old node's edges to the new node; the old node stays in the graph (deleteNode it)."""
        self._replace_node(_of(old_node, NodeRef, "replaceNode"), _of(new_node, NodeRef, "replaceNode"))

    def getMutableNodes(self) -> list[NodeRef]:
        return self._node_list()

    @property
    def nodes(self) -> list[NodeRef]:
        return self._node_list()

    @property
    def operators(self) -> list[NodeRef]:
        return [n for n in self._nodes if isinstance(n._data, NeuralNetOperator)]

    @property
    def tensors(self) -> list[NodeRef]:
        return [n for n in self._nodes if isinstance(n._data, NeuralNetData)]

    def __repr__(self) -> str:
        return _g.dot_string(self._nodes, self._edges, _nn_labels, id)


class NNSubgraph(_g.Subgraph):
    """A set of a data-flow graph's nodes and edges (what `matchSubgraph` returns)."""

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return _g.dot_string(self._nodes, self._edges, _nn_labels, id)

    def addNode(self, node: NodeRef) -> None:
        self._add_node(_of(node, NodeRef, "addNode"))

    def induceEdges(self) -> None:
        self._induce_edges()

    @property
    def nodes(self) -> list[NodeRef]:
        return list(self._nodes)

    def hasNode(self, node: NodeRef) -> bool:
        return node in self._nodes


# ------------------------------------------------------------------------------------------------
# Subgraph matching


class MatchPredicateRef(_g._Node):
    """A node of an `NNMatchGraph`."""

    __slots__ = ()


class NNMatchGraph(_g.Digraph):
    """A pattern to match: operators by name, any tensor, or any node; a non-strict node matches without
    looking further (Caffe2's `nonTerminal`)."""

    node_type = MatchPredicateRef

    def createNode(self, node: Any = None, strict: bool = False, *, tensor: Any = None) -> MatchPredicateRef:
        if tensor is not None:
            node = tensor
        if isinstance(node, bool):  # createNode(strict): any node
            node, strict = None, node
        if isinstance(node, NeuralNetOperator):
            name = node.getName()

            def criteria(n: NodeRef) -> bool:
                return isinstance(n._data, NeuralNetOperator) and n._data.getName() == name
        elif isinstance(node, NeuralNetData):

            def criteria(n: NodeRef) -> bool:
                return isinstance(n._data, NeuralNetData)
        elif node is None:

            def criteria(n: NodeRef) -> bool:
                return True
        else:
            raise InputTypeError(
                f"NNMatchGraph.createNode: a NeuralNetOperator, NeuralNetData or strict, not a {type(node).__name__}"
            )
        return self._create_node(MatchPredicate(criteria, non_terminal=not strict))

    def createEdge(self, a: MatchPredicateRef, b: MatchPredicateRef) -> None:
        self._create_edge(_of(a, MatchPredicateRef, "createEdge"), _of(b, MatchPredicateRef, "createEdge"))

    def getMutableNodes(self) -> list[MatchPredicateRef]:
        return self._node_list()


def matchSubgraph(node: NodeRef, mg: NNMatchGraph) -> NNSubgraph:
    """The subgraph matching `mg` rooted at `node` (empty when it does not match). The pattern's root is a
    node of the last strongly connected component Tarjan's algorithm finds, as in Caffe2."""
    _of(node, NodeRef, "matchSubgraph")
    sccs = _g.tarjans(_of(mg, NNMatchGraph, "matchSubgraph")._nodes, mg._edges)
    _enforce(bool(sccs), "matchSubgraph: the match graph is empty")
    subgraph = NNSubgraph()
    if is_subgraph_match(node, sccs[-1][-1], subgraph):
        return subgraph
    return NNSubgraph()


# ------------------------------------------------------------------------------------------------
# Rewiring


def replaceProducer(tensor: NodeRef, new_producer: NodeRef) -> None:
    """Makes `new_producer` produce `tensor` in place of its producer."""
    _enforce(bool(tensor._in), f"replaceProducer: tensor {tensor.getName()!r} does not have a producer")
    edge = tensor._in[0]
    edge.tail._out.remove(edge)
    edge.tail = new_producer
    new_producer._out.append(edge)


def replaceAllUsesWith(old_tensor: NodeRef, new_tensor: NodeRef) -> None:
    """Makes every consumer of `old_tensor` consume `new_tensor` instead."""
    for edge in list(old_tensor._out):
        edge.tail = new_tensor
        old_tensor._out.remove(edge)
        new_tensor._out.append(edge)


def replaceAsConsumer(old_consumer: NodeRef, new_consumer: NodeRef) -> None:
    """Makes `new_consumer` consume the inputs of `old_consumer` (which loses them)."""
    for edge in list(old_consumer._in):
        edge.head = new_consumer
        old_consumer._in.remove(edge)
        new_consumer._in.append(edge)


# ------------------------------------------------------------------------------------------------
# The module: data flow, control flow, external inputs and outputs


class _BasicBlock:
    """A basic block: an ordered list of operator nodes; a node the graph deletes leaves it."""

    def __init__(self) -> None:
        self.instructions: list[NodeRef] = []

    def _track(self, node: NodeRef) -> None:
        node._on_delete.append(self._forget)

    def _forget(self, node: _g._Node) -> None:
        self.instructions = [n for n in self.instructions if n is not node]

    def push(self, node: NodeRef) -> None:
        self.instructions.append(node)
        self._track(node)

    def insert_before(self, new: NodeRef, instr: NodeRef) -> None:
        self.instructions.insert(self.instructions.index(instr), new)
        self._track(new)

    def move_before(self, instr1: NodeRef, instr2: NodeRef) -> None:
        self.instructions.remove(instr1)
        self.instructions.insert(self.instructions.index(instr2), instr1)


class NNModule:
    """A net as nomnigraph holds it: a data-flow graph, basic blocks of operators ordering it, and the
    tensors that are the net's external inputs and outputs."""

    def __init__(self) -> None:
        self._data_flow = NNGraph()
        self._blocks: list[_BasicBlock] = []
        self._inputs: dict[NodeRef, None] = {}
        self._outputs: dict[NodeRef, None] = {}

    def dataFlow(self) -> NNGraph:
        return self._data_flow

    def createUniqueDataNode(self, prefix: str = "_unique") -> NodeRef:
        """A tensor named `prefix`, or `prefix_0`, `prefix_1`, ..., the first no node of the graph has."""
        names = {node.getName() for node in self._data_flow._nodes}
        name, i = prefix, 0
        while name in names:
            name, i = f"{prefix}_{i}", i + 1
        return self._data_flow._create_node(NeuralNetData(name))

    def convertToCaffe2Proto(self, old_net: Any) -> bytes:
        """The serialized NetDef of the module, with `old_net`'s other fields."""
        old = _message(old_net, caffe2_pb2.NetDef, "convertToCaffe2Proto takes either no args or a NetDef")
        return _to_netdef(self, old).SerializeToString()

    def getExecutionOrder(self) -> list[NodeRef]:
        """The operators in the order they run (after placing the operators added to the graph)."""
        _coalesce_inserted_data_dependencies(self)
        return [instr for block in self._blocks for instr in block.instructions]

    def replaceSubgraph(
        self, subgraph: NNSubgraph, node: NodeRef, node_inputs: Sequence[NodeRef], node_outputs: Sequence[NodeRef]
    ) -> None:
        """Replaces the subgraph by `node`, which consumes `node_inputs` and produces `node_outputs` in that
        order (an output that is also an input of the subgraph gets a new tensor instead)."""
        sg = _of(subgraph, NNSubgraph, "replaceSubgraph")._copy()
        sg_inputs = _subgraph_inputs(sg)
        for tensor in node_inputs:
            self._data_flow._create_edge(tensor, node)
            sg._remove_node(tensor)
        for tensor in node_outputs:
            if tensor in sg_inputs:
                self._data_flow._create_edge(node, self.createUniqueDataNode())
                continue
            self._data_flow._create_edge(node, tensor)
            sg._remove_node(tensor)
        self.deleteSubgraph(sg)

    def deleteSubgraph(self, subgraph: NNSubgraph) -> None:
        for node in list(_of(subgraph, NNSubgraph, "deleteSubgraph")._nodes):
            self._data_flow._delete_node(node)


def _subgraph_inputs(sg: NNSubgraph) -> set[NodeRef]:
    """The subgraph's tensors produced outside it (or not at all)."""
    return {n for n in sg._nodes if n.isTensor() and (not n._in or n._in[0].tail not in sg._nodes)}


def _coalesce_inserted_data_dependencies(m: NNModule) -> None:
    """Caffe2's `nn::coalesceInsertedDataDependencies`: puts each operator the blocks do not have yet before
    the first operator consuming its output, places the rest in a new block in data-flow order, and
    reorders each block until every operator comes after the producers of its inputs."""
    tracked: set[NodeRef] = set()
    while True:
        before = len(tracked)
        tracked = {instr for block in m._blocks for instr in block.instructions}
        for block in m._blocks:
            for instr in list(block.instructions):
                for edge in list(instr._in):
                    tensor = edge.tail
                    if not tensor._in:
                        continue
                    producer = tensor._in[0].tail
                    if producer not in tracked:
                        block.insert_before(producer, instr)
                        tracked.add(producer)
        if len(tracked) == before:
            break
    untracked = {n for n in m._data_flow._nodes if isinstance(n._data, NeuralNetOperator) and n not in tracked}
    block = _BasicBlock()
    m._blocks.append(block)
    for scc in reversed(_g.tarjans(m._data_flow._nodes, m._data_flow._edges)):
        for node in scc:
            if node in untracked:
                block.push(node)
    for block in m._blocks:
        while True:
            moved = 0
            seen: set[NodeRef] = set()
            i = 0
            while i < len(block.instructions):
                instr = block.instructions[i]
                for out_edge in list(instr._out):
                    for consumer_edge in list(out_edge.head._out):
                        if consumer_edge.head in seen:
                            block.move_before(instr, consumer_edge.head)
                            moved += 1
                seen.add(instr)
                i += 1
            if not moved:
                break


# ------------------------------------------------------------------------------------------------
# NetDef <-> NNModule (caffe2/opt/converter.cc)


def _args(op: caffe2_pb2.OperatorDef) -> dict[str, caffe2_pb2.Argument]:
    return {arg.name: arg for arg in op.arg}


def _check_converter_args(op: caffe2_pb2.OperatorDef, args: Mapping[str, caffe2_pb2.Argument]) -> None:
    """The checks Caffe2's converters make of the arguments they read."""

    def need(name: str, field: str, message: str) -> None:
        if name in args:
            _enforce(args[name].HasField(field), f"{op.type}: {message}")

    if op.type in ("Conv", "ConvTranspose", "AveragePool", "MaxPool"):
        if "kernel" in args:
            need("kernel", "i", "Invalid kernel argument")
        elif "kernels" not in args and "kernel_h" in args and "kernel_w" in args:
            need("kernel_h", "i", "Invalid kernel argument")
            need("kernel_w", "i", "Invalid kernel argument")
    if op.type in ("Conv", "ConvTranspose"):
        need("stride", "i", "Invalid stride argument")
        need("pad", "i", "Invalid pad argument")
        need("group", "i", "Invalid group argument")
    if op.type == "Conv":
        need("dilation", "i", "Invalid dilation argument")
    if op.type == "Clip":
        need("min", "f", "Invalid 'min' argument")
        need("max", "f", "Invalid 'max' argument")
    if op.type == "Concat":
        need("axis", "i", "Invalid axis argument")
        need("add_axis", "i", "Invalid add_axis argument")
    if op.type == "FC":
        need("axis", "i", "Invalid axis argument")
        need("axis_w", "i", "Invalid axis_w argument")


def _operator_from_def(op: caffe2_pb2.OperatorDef) -> NeuralNetOperator:
    """Caffe2's `convertToNeuralNetOperator`: the operator, its layout (from `order`) and an annotation
    holding the whole OperatorDef."""
    args = _args(op)
    _check_converter_args(op, args)
    if op.type in _REGISTERED_CONVERTERS or op.type in _KIND_NAMES:
        nn_op = _kind_operator(_KIND_NAMES.get(op.type, op.type))
    else:
        nn_op = NeuralNetOperator(op.type)
    if "order" in args:
        nn_op._layout = _LAYOUTS.get(args["order"].s.decode("utf-8", "replace"))
    annotation = Annotation()
    annotation._set_op_def(op)
    if op.device_option.node_name:
        annotation.setDevice(op.device_option.node_name)
    annotation.setDeviceType(op.device_option.device_type)
    nn_op._annotation = annotation
    return nn_op


def _operator_def(node: NodeRef) -> caffe2_pb2.OperatorDef:
    """Caffe2's `convertToOperatorDef`: the annotation's OperatorDef without inputs and outputs (with the
    annotation's device type, for ops without a registered converter)."""
    nn_op: NeuralNetOperator = node._data
    annotation = nn_op._annotation
    if nn_op.getName() in _REGISTERED_CONVERTERS:
        if annotation is not None:
            op = annotation._get_op_def()
        else:
            _log.warning("Cannot instantiate this OperatorDef from nomnigraph, falling back")
            op = caffe2_pb2.OperatorDef(type=nn_op.getName())
    elif annotation is None:
        op = caffe2_pb2.OperatorDef(type=nn_op.getName())
    else:
        op = annotation._get_op_def()
        op.device_option.device_type = annotation.getDeviceType()
    op.ClearField("input")
    op.ClearField("output")
    return op


def _annotation_of(node: NodeRef) -> Annotation:
    """Caffe2's `getOrAddCaffe2Annotation`."""
    _enforce(node.isOperator(), "getAnnotation: the node is not a NeuralNetOperator")
    nn_op: NeuralNetOperator = node._data
    if nn_op._annotation is None:
        annotation = Annotation()
        annotation._set_op_def(_operator_def(node))
        nn_op._annotation = annotation
    return nn_op._annotation


def _to_module(net: caffe2_pb2.NetDef) -> tuple[NNModule, list[NodeRef]]:
    """Caffe2's `convertToNNModule` (not strict): one operator node per op, a tensor node per blob version
    (each output a new one), the ops in one block, the external inputs and outputs."""
    module = NNModule()
    dfg = module._data_flow
    blobs: dict[str, NodeRef] = {}
    external_inputs = dict.fromkeys(net.external_input)
    main = _BasicBlock()
    module._blocks.append(main)
    op_nodes = []
    for op in net.op:
        op_node = dfg._create_node()
        for name in op.input:
            if name not in blobs:
                blobs[name] = dfg._create_node(NeuralNetData(name))
                if name in external_inputs:
                    module._inputs[blobs[name]] = None
                    del external_inputs[name]
            dfg._create_edge(blobs[name], op_node)
        for name in op.output:
            tensor = dfg._create_node(NeuralNetData(name))
            dfg._create_edge(op_node, tensor)
            blobs[name] = tensor
        op_node._data = _operator_from_def(op)
        op_nodes.append(op_node)
        main.push(op_node)
    for name in external_inputs:  # not read by any op: a tensor of its own, not an input of the module
        blobs[name] = dfg._create_node(NeuralNetData(name))
    for name in net.external_output:
        if name not in blobs:
            _log.error("NetDef has ill-formed external_output: %s", name)
            continue
        module._outputs[blobs[name]] = None
    return module, op_nodes


def _merge_external(current: Mapping[NodeRef, None], old: Sequence[str], dfg: NNGraph) -> list[str]:
    """The names of `current`'s tensors: those in `old` in its order, then the others."""
    names = dict.fromkeys(node.getName() for node in current if dfg._has_node(node))
    kept = []
    for name in old:
        if name in names:
            kept.append(name)
            del names[name]
    return kept + list(names)


def _to_netdef(m: NNModule, old: caffe2_pb2.NetDef) -> caffe2_pb2.NetDef:
    """Caffe2's `convertToCaffe2Proto`: `old` with the module's ops, in control-flow order, and its external
    inputs and outputs (in `old`'s order where it has them)."""
    net = caffe2_pb2.NetDef()
    net.CopyFrom(old)
    net.ClearField("op")
    _coalesce_inserted_data_dependencies(m)
    for block in m._blocks:
        for instr in block.instructions:
            op = _operator_def(instr)
            op.input.extend(edge.tail.getName() for edge in instr._in)
            op.output.extend(edge.head.getName() for edge in instr._out)
            layout = instr._data._layout
            if layout is not None:
                order = next((arg for arg in op.arg if arg.name == "order"), None)
                if order is None:
                    order = op.arg.add(name="order")
                order.s = layout.encode()
            net.op.append(op)
    inputs = _merge_external(m._inputs, list(net.external_input), m._data_flow)
    outputs = _merge_external(m._outputs, list(net.external_output), m._data_flow)
    net.ClearField("external_input")
    net.ClearField("external_output")
    net.external_input.extend(inputs)
    net.external_output.extend(outputs)
    return net


def NNModuleFromProtobuf(net_def: bytes) -> tuple[NNModule, list[NodeRef]]:
    """The module of a serialized NetDef, and its op nodes in the net's order."""
    if not isinstance(net_def, bytes):
        raise InputTypeError(f"NNModuleFromProtobuf: expects a serialized NetDef, got a {type(net_def).__name__}")
    return _to_module(parse_binary(net_def, caffe2_pb2.NetDef, "NNModuleFromProtobuf"))


def NNModuleFromProtobufDistributed(net_def: bytes, blob_to_device: Mapping[str, bytes]) -> NNModule:
    """The module of a serialized NetDef with a Declare op producing each external input and an Export op
    consuming each external output, each Declare/Export of a blob in `blob_to_device` given that (serialized)
    DeviceOption (caffe2/opt/distributed.cc). Every blob of the map must be an external input or output."""
    if not isinstance(net_def, bytes):
        raise InputTypeError(
            f"NNModuleFromProtobufDistributed: expects a serialized NetDef, got a {type(net_def).__name__}"
        )
    devices = {
        name: parse_binary(option, caffe2_pb2.DeviceOption, "NNModuleFromProtobufDistributed")
        for name, option in blob_to_device.items()
    }
    module, _ = _to_module(parse_binary(net_def, caffe2_pb2.NetDef, "NNModuleFromProtobufDistributed"))
    dfg = module._data_flow
    for tensor in module._inputs:
        dfg._create_edge(dfg._create_node(_kind_operator("Declare")), tensor)
    for tensor in module._outputs:
        dfg._create_edge(tensor, dfg._create_node(_kind_operator("Export")))
    module._inputs.clear()
    module._outputs.clear()
    seen: set[str] = set()
    for kind, tensor_of in (("Declare", lambda n: n._out[0].head), ("Export", lambda n: n._in[0].tail)):
        seen_here: set[str] = set()
        for node in [n for n in dfg._nodes if isinstance(n._data, NeuralNetOperator) and n._data._kind == kind]:
            name = tensor_of(node).getName()
            if name not in devices:
                continue
            _enforce(
                name not in seen_here,
                f"Ambiguous name->deviceOption map.  Please do this manually. Affected blob: {name}",
            )
            seen_here.add(name)
            seen.add(name)
            _annotation_of(node)._op_def.device_option.CopyFrom(devices[name])
    unused = [name for name in sorted(devices) if name not in seen]
    _enforce(not unused, "Unused names in the blob map: " + "".join(f'"{name}" ' for name in unused))
    return module


__all__ = [
    "Annotation",
    "Edge",
    "Graph",
    "MatchPredicateRef",
    "NNGraph",
    "NNMatchGraph",
    "NNModule",
    "NNModuleFromProtobuf",
    "NNModuleFromProtobufDistributed",
    "NNSubgraph",
    "NeuralNetData",
    "NeuralNetOperator",
    "Node",
    "NodeRef",
    "matchSubgraph",
    "replaceAllUsesWith",
    "replaceAsConsumer",
    "replaceProducer",
]
