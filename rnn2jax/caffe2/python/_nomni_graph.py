"""Nomnigraph's generic directed graph (`nom::Graph`, `nom::Subgraph`), as Caffe2's nomnigraph bindings use it.

The orders Caffe2's algorithms walk are kept, since the ops a converted net gets, and their order, follow
from them: a graph's nodes and edges in creation order; a node's in-edges and out-edges in the order they
were attached to it (an edge moved to another node goes last there); Tarjan's algorithm over the nodes in
graph order, following each node's out-edges in the graph's edge order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class _Node:
    """A node: its data, its in-edges and out-edges, and what to call when the graph deletes it (a basic
    block tracking an instruction forgets it then, as Caffe2's destructor callbacks do)."""

    __slots__ = ("__weakref__", "_data", "_in", "_on_delete", "_out")

    def __init__(self, data: Any = None):
        self._data = data
        self._in: list[_Edge] = []
        self._out: list[_Edge] = []
        self._on_delete: list[Callable[[_Node], None]] = []


class _Edge:
    __slots__ = ("head", "tail")

    def __init__(self, tail: _Node, head: _Node):
        self.tail = tail
        self.head = head


class Digraph:
    """`nom::Graph`: owns its nodes and edges, in creation order."""

    node_type: type[_Node] = _Node
    edge_type: type[_Edge] = _Edge

    def __init__(self) -> None:
        self._nodes: dict[_Node, None] = {}  # an ordered set
        self._edges: dict[_Edge, None] = {}

    def _create_node(self, data: Any = None) -> Any:
        node = self.node_type(data)
        self._nodes[node] = None
        return node

    def _create_edge(self, tail: _Node, head: _Node) -> Any:
        edge = self.edge_type(tail, head)
        self._edges[edge] = None
        head._in.append(edge)
        tail._out.append(edge)
        return edge

    def _has_node(self, node: _Node) -> bool:
        return node in self._nodes

    def _edge_if_exists(self, tail: _Node, head: _Node) -> _Edge | None:
        for edge in head._in:
            if edge.tail is tail:
                return edge
        return None

    def _delete_edge(self, edge: _Edge) -> None:
        edge.tail._out.remove(edge)
        edge.head._in.remove(edge)
        self._edges.pop(edge, None)

    def _delete_node(self, node: _Node) -> None:
        """Deletes the node and its edges; a node not in the graph is left alone, as Caffe2 does."""
        if node not in self._nodes:
            return
        for edge in list(node._in):
            self._delete_edge(edge)
        for edge in list(node._out):
            self._delete_edge(edge)
        del self._nodes[node]
        callbacks, node._on_delete = node._on_delete, []
        for callback in callbacks:
            callback(node)

    def _replace_node(self, old: _Node, new: _Node) -> None:
        """Moves every in-edge and out-edge of `old` to `new` (appended to `new`'s); `old` stays in the graph."""
        for edge in list(old._in):
            edge.head = new
            old._in.remove(edge)
            new._in.append(edge)
        for edge in list(old._out):
            edge.tail = new
            old._out.remove(edge)
            new._out.append(edge)

    def _node_list(self) -> list[Any]:
        return list(self._nodes)


class Subgraph:
    """`nom::Subgraph`: a set of a graph's nodes and edges (no ownership)."""

    def __init__(self) -> None:
        self._nodes: dict[_Node, None] = {}
        self._edges: dict[_Edge, None] = {}

    def _add_node(self, node: _Node) -> None:
        self._nodes[node] = None

    def _remove_node(self, node: _Node) -> None:
        self._nodes.pop(node, None)

    def _add_edge(self, edge: _Edge) -> None:
        self._edges[edge] = None

    def _induce_edges(self) -> None:
        """Adds every edge between two of its nodes (nomnigraph's `algorithm::induceEdges`)."""
        for node in self._nodes:
            for edge in node._in:
                if edge.tail in self._nodes:
                    self._edges[edge] = None

    def _copy(self) -> Subgraph:
        copy = type(self)()
        copy._nodes = dict(self._nodes)
        copy._edges = dict(self._edges)
        return copy


def tarjans(nodes: Iterable[Any], edges: Iterable[_Edge]) -> list[list[Any]]:
    """Strongly connected components, reverse-topologically sorted, as nomnigraph's `algorithm::tarjans`
    finds them: a depth-first walk from each node in order, out-edges in the graph's edge order."""
    nodes = list(nodes)
    successors: dict[Any, list[Any]] = {node: [] for node in nodes}
    for edge in edges:
        successors[edge.tail].append(edge.head)
    index: dict[Any, int] = {}
    low: dict[Any, int] = {}
    on_stack: set[Any] = set()
    stack: list[Any] = []
    sccs: list[list[Any]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, i = work[-1]
            children = successors[node]
            if i < len(children):
                work[-1] = (node, i + 1)
                child = children[i]
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    scc.append(member)
                    if member is node:
                        break
                sccs.append(scc)
    return sccs


def dot_string(
    nodes: Iterable[_Node], edges: Iterable[_Edge], labels: Callable[[_Node], dict[str, str]], ids: Callable[[Any], int]
) -> str:
    """Graphviz text as nomnigraph's `convertToDotString` writes it: each node with its attributes, then
    each edge."""
    lines = ["digraph G {", "rankdir=LR"]
    for node in nodes:
        attributes = "".join(f'{key}="{value}",' for key, value in sorted(labels(node).items()))
        lines.append(f"{ids(node)}[{attributes}];")
    for edge in edges:
        lines.append(f"{ids(edge.tail)} -> {ids(edge.head)}[];")
    lines.append("}")
    return "\n".join(lines)
