"""Nomnigraph's subgraph matcher (`nom::matcher::MatchGraph::isSubgraphMatch`), as Caffe2's `matchSubgraph`
binding runs it: a pattern of predicates matched from a root node along out-edges, children in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._nomni_graph import Subgraph, _Node


class MatchPredicate:
    """A pattern node: a predicate on graph nodes, how many consecutive edges it matches (1), whether the
    match stops there (`nonTerminal`: its out-edges are not looked at) and whether it joins the subgraph."""

    def __init__(self, criteria: Callable[[Any], bool], non_terminal: bool = False):
        self.criteria = criteria
        self.count = 1
        self.non_terminal = non_terminal
        self.include_in_subgraph = True


STAR_COUNT = -1


def is_subgraph_match(root: _Node, pattern_root: _Node, subgraph: Subgraph) -> bool:
    """Whether the pattern rooted at `pattern_root` matches at `root`; the matched nodes and edges go into
    `subgraph`."""
    matched: dict[_Node, _Node] = {}
    return _match(matched, subgraph, root, pattern_root, pattern_root._data.include_in_subgraph)


def _match(matched: dict[_Node, _Node], subgraph: Subgraph, root: _Node, pattern: _Node, include: bool) -> bool:
    predicate: MatchPredicate = pattern._data
    if predicate.count == 1 and pattern in matched:
        return matched[pattern] is root
    if not predicate.criteria(root):
        return False
    if predicate.non_terminal:
        matched.setdefault(pattern, root)
        if include:
            subgraph._add_node(root)
        return True
    edges = root._out
    edge_index = 0
    for pattern_edge in pattern._out:
        child_pattern = pattern_edge.head
        expected = child_pattern._data.count
        star = expected == STAR_COUNT
        count = 0
        while edge_index < len(edges) and (star or count < expected):
            edge = edges[edge_index]
            include_edge = child_pattern._data.include_in_subgraph and include
            if not _match(matched, subgraph, edge.head, child_pattern, include_edge):
                if not star:
                    return False
                break
            if include_edge:
                subgraph._add_edge(edge)
            count += 1
            edge_index += 1
        if count < expected:
            return False
    if edge_index < len(edges):
        return False  # unmatched children
    matched.setdefault(pattern, root)
    if include:
        subgraph._add_node(root)
    return True
