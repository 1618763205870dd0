"""Caffe2's transform registry (caffe2/core/transform.cc, caffe2/transforms/), behind `workspace.ApplyTransform`
and `ApplyTransformIfFaster`. The torch 1.10.2 CPU wheel registers two: `ConvToNNPack` (each CPU Conv not yet on
NNPACK gets engine NNPACK) and `CommonSubexpressionElimination` (FC and LearningRate ops reading the same inputs
from the same producers become one op writing `transform/<output>`).

A transform matches subgraphs of Caffe2's op graph (caffe2/core/graph.cc: an op's parents are the last writers
of the blobs it reads), rewrites them, and writes the ops back in the lowest topological order, so untouched
ops keep their places.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

from ...errors import BadArgumentError, Rnn2JaxError
from ..proto import caffe2_pb2


class _Node:
    __slots__ = ("active", "children", "op", "parents")

    def __init__(self, op: caffe2_pb2.OperatorDef, parents: dict[int, list[str]] | None = None):
        self.op = op
        self.active = True
        self.parents: dict[int, list[str]] = parents if parents is not None else {}
        self.children: dict[int, list[str]] = {}


class _Graph:
    """caffe2::transform::Graph: one node per op, edges from each blob's last writer to its readers."""

    def __init__(self, net: caffe2_pb2.NetDef):
        self.net = net
        self.nodes: list[_Node] = []
        writer: dict[str, int] = {}
        for i, source in enumerate(net.op):
            op = caffe2_pb2.OperatorDef()
            op.CopyFrom(source)
            node = _Node(op)
            self.nodes.append(node)
            for blob in op.input:
                if blob in writer:
                    j = writer[blob]
                    node.parents.setdefault(j, []).append(blob)
                    self.nodes[j].children.setdefault(i, []).append(blob)
            for blob in op.output:
                writer[blob] = i

    def net_def(self) -> caffe2_pb2.NetDef:
        """Graph::GetNetDef: the active ops in the lowest topological order."""
        net = caffe2_pb2.NetDef()
        net.CopyFrom(self.net)
        del net.op[:]
        unchecked = [len(n.parents) for n in self.nodes]
        visited = [False] * len(self.nodes)
        queue: list[int] = []
        for i, node in enumerate(self.nodes):
            if not node.parents and node.active:
                heapq.heappush(queue, i)
                visited[i] = True
        while queue:
            i = heapq.heappop(queue)
            if not self.nodes[i].active:
                continue
            net.op.add().CopyFrom(self.nodes[i].op)
            for child in sorted(self.nodes[i].children):
                if not visited[child] and self.nodes[child].active:
                    unchecked[child] -= 1
                    if unchecked[child] == 0:
                        heapq.heappush(queue, child)
                        visited[child] = True
        return net

    def deactivate(self, subgraph: list[int]) -> None:
        for i in subgraph:
            node = self.nodes[i]
            for parent in node.parents:
                self.nodes[parent].children.pop(i, None)
            for child in node.children:
                self.nodes[child].parents.pop(i, None)
            node.active = False


class _Transform:
    """caffe2::Transform: find matches (each a list of node indices), then replace each still-active match."""

    sorted_order = False  # SORTED_WRT_EXECUTION_ORDER, else CONNECTED_SUBGRAPH

    def pattern_rule(self, g: _Graph, subgraph: list[int], idx: int) -> bool:
        raise NotImplementedError

    def validator_rule(self, g: _Graph, subgraph: list[int]) -> bool:
        raise NotImplementedError

    def replace_rule(self, subgraph: list[int], g: _Graph) -> bool:
        raise NotImplementedError

    def _grow(self, g: _Graph, matched: list[bool], subgraph: list[int], best: list[int]) -> None:
        if self.validator_rule(g, subgraph) and len(subgraph) > len(best):
            best[:] = subgraph

        def attempt(j: int) -> None:
            if not matched[j] and self.pattern_rule(g, subgraph, j):
                subgraph.append(j)
                self._grow(g, matched, subgraph, best)
                subgraph.pop()

        if self.sorted_order:
            for j in range(subgraph[-1] + 1 if subgraph else 0, len(g.nodes)):
                attempt(j)
            return
        for x in list(subgraph):
            for neighbors in (g.nodes[x].children, g.nodes[x].parents):
                for j in sorted(neighbors):
                    if j not in subgraph:
                        attempt(j)

    def apply(self, net: caffe2_pb2.NetDef) -> caffe2_pb2.NetDef:
        g = _Graph(net)
        matched = [False] * len(g.nodes)
        matches = []
        for idx in range(len(g.nodes)):
            subgraph: list[int] = []
            best: list[int] = []
            if not matched[idx] and self.pattern_rule(g, subgraph, idx):
                subgraph.append(idx)
                self._grow(g, matched, subgraph, best)
            if best:
                matches.append(list(best))
                for x in best:
                    matched[x] = True
        for match in matches:
            if all(g.nodes[i].active for i in match) and not self.replace_rule(match, g):
                raise Rnn2JaxError("Replace failed!")
        return g.net_def()


class _SingleOpTransform(_Transform):
    def match_operator(self, op: caffe2_pb2.OperatorDef) -> bool:
        raise NotImplementedError

    def replace_operator(self, op: caffe2_pb2.OperatorDef) -> None:
        raise NotImplementedError

    def pattern_rule(self, g: _Graph, subgraph: list[int], idx: int) -> bool:
        return not subgraph and self.match_operator(g.nodes[idx].op)

    def validator_rule(self, g: _Graph, subgraph: list[int]) -> bool:
        return len(subgraph) == 1

    def replace_rule(self, subgraph: list[int], g: _Graph) -> bool:
        self.replace_operator(g.nodes[subgraph[0]].op)
        return True


class ConvToNNPack(_SingleOpTransform):
    def match_operator(self, op: caffe2_pb2.OperatorDef) -> bool:
        return op.type == "Conv" and op.device_option.device_type == caffe2_pb2.CPU and op.engine != "NNPACK"

    def replace_operator(self, op: caffe2_pb2.OperatorDef) -> None:
        op.engine = "NNPACK"


def _match_strings(pattern: str, s: str) -> bool:
    return pattern == "*" or s in pattern.split("|")


def _match_arguments(p_op: caffe2_pb2.OperatorDef, g_op: caffe2_pb2.OperatorDef) -> bool:
    """caffe2::MatchArguments: every named argument of `p_op` is in `g_op` with the same values."""
    for p in p_op.arg:
        if not p.HasField("name"):
            continue
        found = False
        for g in g_op.arg:
            if p.name != g.name:
                continue
            found = True
            for field in ("f", "i"):
                if p.HasField(field) and (not g.HasField(field) or getattr(p, field) != getattr(g, field)):
                    return False
            if p.HasField("s") and (not g.HasField("s") or not _match_strings(p.s.decode(), g.s.decode())):
                return False
            if list(p.floats) != list(g.floats) or list(p.ints) != list(g.ints):
                return False
            if len(p.strings) != len(g.strings) or not all(
                _match_strings(a.decode(), b.decode()) for a, b in zip(p.strings, g.strings, strict=True)
            ):
                return False
        if not found:
            return False
    return True


class CommonSubexpressionElimination(_Transform):
    sorted_order = True
    allowed_ops = frozenset({"LearningRate", "FC"})

    def _common(self, g: _Graph, model_idx: int, candidate_idx: int) -> bool:
        model, candidate = g.nodes[model_idx], g.nodes[candidate_idx]
        return (
            model.op.type == candidate.op.type
            and _match_arguments(model.op, candidate.op)
            and list(model.op.input) == list(candidate.op.input)
            and sorted(model.parents.items()) == sorted(candidate.parents.items())
            and len(model.op.output) == len(candidate.op.output)
        )

    def pattern_rule(self, g: _Graph, subgraph: list[int], idx: int) -> bool:
        if not subgraph:
            return g.nodes[idx].op.type in self.allowed_ops
        return self._common(g, subgraph[0], idx)

    def validator_rule(self, g: _Graph, subgraph: list[int]) -> bool:
        return len(subgraph) >= 2

    def replace_rule(self, subgraph: list[int], g: _Graph) -> bool:
        new_idx = len(g.nodes)
        first = g.nodes[subgraph[0]]
        new_op = caffe2_pb2.OperatorDef()
        new_op.CopyFrom(first.op)
        del new_op.output[:]
        new_op.output.extend("transform/" + blob for blob in first.op.output)
        parents = {k: list(v) for k, v in first.parents.items()}
        for parent in parents:
            children = g.nodes[parent].children
            children[new_idx] = parents[parent]
            for x in subgraph:
                children.pop(x, None)
        g.nodes.append(_Node(new_op, parents))
        for x in subgraph:
            renamed = dict(zip(g.nodes[x].op.output, new_op.output, strict=True))
            for child, blobs in list(g.nodes[x].children.items()):
                new_blobs = [renamed[b] for b in blobs]
                g.nodes[new_idx].children[child] = new_blobs
                g.nodes[child].parents[new_idx] = new_blobs
                g.nodes[child].parents.pop(x, None)
                op = g.nodes[child].op
                for i, blob in enumerate(op.input):
                    if blob in renamed:
                        op.input[i] = renamed[blob]
        g.deactivate(subgraph)
        return True


TRANSFORMS: dict[str, Callable[[], _Transform]] = {
    "ConvToNNPack": ConvToNNPack,
    "CommonSubexpressionElimination": CommonSubexpressionElimination,
}


def apply_transform(key: str, net: caffe2_pb2.NetDef) -> caffe2_pb2.NetDef:
    """caffe2::ApplyTransform: the transform registered as `key` applied to `net`."""
    if key not in TRANSFORMS:
        raise BadArgumentError(f"Transform not found in registry: {key}")
    return TRANSFORMS[key]().apply(net)


def _run_duration(
    new_workspace: Callable[[], Any], net: caffe2_pb2.NetDef, init_net: caffe2_pb2.NetDef, warmup: int, main: int
) -> float:
    """caffe2's average_net_run_duration: the time of `main` runs of `net` (after `warmup` runs) in a fresh
    workspace set up by `init_net` (or, with no init ops, the net's external inputs created empty)."""
    ws = new_workspace()
    if init_net.op:
        ws.run(init_net)
    if warmup < 0:
        raise BadArgumentError(f"Number of warm up runs should be non negative, provided {warmup}.")
    name = ws.create_net(net, overwrite=True)
    for _ in range(warmup):
        ws.run_net(name)
    if main <= 0:
        raise BadArgumentError(f"Number of main runs should be positive, provided {main}.")
    start = time.perf_counter()
    ws.run_net(name, main)
    return (time.perf_counter() - start) * 1000.0


def apply_transform_if_faster(
    key: str,
    net: caffe2_pb2.NetDef,
    init_net: caffe2_pb2.NetDef,
    warmup_runs: int,
    main_runs: int,
    improvement_threshold: float,
    new_workspace: Callable[[], Any],
) -> caffe2_pb2.NetDef:
    """caffe2::ApplyTransformIfFaster: the transformed net if it runs `improvement_threshold` times faster."""
    transformed = apply_transform(key, net)
    original_time = _run_duration(new_workspace, net, init_net, warmup_runs, main_runs)
    new_time = _run_duration(new_workspace, transformed, init_net, warmup_runs, main_runs)
    return transformed if original_time > improvement_threshold * new_time else net
