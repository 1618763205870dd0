"""Hierarchical softmax (caffe2/operators/h_softmax_op.cc): HSoftmax and its gradient, HSoftmaxSearch and
HuffmanTreeHierarchy.

The hierarchy is a serialized `HierarchyProto` (rnn2jax/proto/hsm.proto): per word, the path of nodes
from the root, each node `length` rows of the stacked weight matrix from row `index`, the path going on
through child `target`. Which rows a sample reads, and how big the intermediate output is, depend on the
labels' values: they are a static input, and the kernels gather the rows of every (sample, node) pair
at once, padded to the longest node.

HSoftmaxSearch writes node names (strings) and HuffmanTreeHierarchy a serialized tree (a string):
JAX has no strings, so both are host ops, NumPy in float32 as Caffe2's loops are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from ..proto import hsm_pb2
from .facets import (
    GRADIENT_OP,
    HOST_OP_NO_EMITTER,
    HOST_OP_NO_SHAPE_RULE,
    NO_EMITTER,
    NO_ROLES,
    NO_SHAPE_RULE,
    Absent,
    Roles,
)
from .gradient_makers import should_not_do_gradient, single_gradient
from .registry import HostWorkspace, Kernel, declare_family, host_op, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)
_LOG_THRESHOLD = np.float32(1e-20)  # kLOG_THRESHOLD: probabilities are clamped to it before the log


def _shape_text(x: Any) -> str:
    return f"{np.dtype(x.dtype)}{list(np.shape(x))}"


def _check_dtype(op: Op, index: int, x: Any, dtype: Any, what: str) -> None:
    if np.dtype(x.dtype) != np.dtype(dtype):
        raise ShapeError(f"{op.where}: {what} '{op.inputs[index]}' must be {np.dtype(dtype)}, got {_shape_text(x)}")


def _message(op: Op, name: str, message: Any) -> Any:
    """Argument `name` (a serialized proto in field s) parsed into `message`, "" being the empty message."""
    arg = op.args.get(name)
    if arg is None:
        return message
    if arg.kind != "s":
        raise BadArgumentError(f"{op.where}: argument '{name}' must be a serialized {type(message).__name__} (field s)")
    raw = arg.value.encode("utf-8") if isinstance(arg.value, str) else arg.value
    try:
        message.ParseFromString(raw)
    except Exception:
        raise BadArgumentError(f"{op.where}: argument '{name}' is not a serialized {type(message).__name__}") from None
    return message


def _fc_operands(op: Op, x: Any, w: Any, b: Any) -> tuple[int, int, int]:
    """(M, K, N): X as M rows of K (M = dim 0, or 1 for a vector), W [N, K...], b [N], as Caffe2 enforces."""
    for index, value, what in ((0, x, "X"), (1, w, "W"), (2, b, "b")):
        _check_dtype(op, index, value, _F32, what)
    rows = x.shape[0] if x.ndim > 1 else 1
    if rows == 0:
        raise ShapeError(f"{op.where}: X '{op.inputs[0]}' has no rows ({_shape_text(x)})")
    width = x.size // rows
    if w.ndim < 2 or w.shape[0] == 0 or w.size // w.shape[0] != width:
        raise ShapeError(
            f"{op.where}: W '{op.inputs[1]}' must be [N, {width}] for X {_shape_text(x)}, got {_shape_text(w)}"
        )
    if b.ndim != 1 or b.shape[0] != w.shape[0]:
        raise ShapeError(f"{op.where}: b '{op.inputs[2]}' must be [{w.shape[0]}], got {_shape_text(b)}")
    return rows, width, w.shape[0]


# --------------------------------------------------------------------------------------------------
# HSoftmax and HSoftmaxGradient


@dataclass(frozen=True)
class _Steps:
    """Every (sample, node) pair of the labels' paths, in Caffe2's order: node i of sample `sample[i]`
    reads weight rows `rows[i]` (padded to the longest node; `valid` marks the real ones) and targets
    `target[i]`. `fc` and `softmax` are each step's positions in the intermediate output."""

    sample: np.ndarray
    rows: np.ndarray
    valid: np.ndarray
    target: np.ndarray
    fc: np.ndarray  # [steps, width] flat positions (padding: the output's size, dropped)
    softmax: np.ndarray
    size: int


def _steps(op: Op, hierarchy: Any, labels: Any, rows: int, n: int) -> _Steps:
    _check_dtype(op, 3, labels, np.int32, "labels")
    if isinstance(labels, jax.core.Tracer):
        raise ShapeError(
            f"{op.where}: labels '{op.inputs[3]}' decide the size of the intermediate output, so their values must be "
            "known when the net is traced; feed them as a constant or a static input, not a traced value"
        )
    words = np.asarray(labels).reshape(-1)
    if words.size < rows:  # Caffe2 reads past the end of the blob
        raise ShapeError(f"{op.where}: labels '{op.inputs[3]}' has {words.size} labels for {rows} rows of X")
    paths: dict[int, Any] = {}
    for path in hierarchy.paths:  # the first path of a word is the one Caffe2 keeps
        paths.setdefault(path.word_id, path)
    missing = sorted(set(words[:rows].tolist()) - set(paths))
    if missing:
        raise ShapeError(
            f"{op.where}: labels '{op.inputs[3]}' holds label {missing[0]}, which the hierarchy has no path for"
        )
    steps = [(s, node) for s, word in enumerate(words[:rows].tolist()) for node in paths[word].path_nodes]
    for _, node in steps:
        if node.length < 1 or node.index < 0 or node.index + node.length > n or not 0 <= node.target < node.length:
            raise BadArgumentError(
                f"{op.where}: argument 'hierarchy' has a node (index {node.index}, length {node.length}, target "
                f"{node.target}) outside the {n} rows of W '{op.inputs[1]}'"
            )
    lengths = np.array([node.length for _, node in steps], np.int64)
    width = int(lengths.max()) if steps else 1
    columns = np.arange(width)
    valid = columns < lengths[:, None]
    starts = np.concatenate([[0], np.cumsum(2 * lengths)[:-1]]).astype(np.int64) if steps else np.zeros(0, np.int64)
    size = int(2 * lengths.sum())
    fc = np.where(valid, starts[:, None] + columns, size)
    return _Steps(
        sample=np.array([s for s, _ in steps], np.int64),
        rows=np.where(valid, np.array([node.index for _, node in steps], np.int64)[:, None] + columns, 0),
        valid=valid,
        target=np.array([node.target for _, node in steps], np.int64),
        fc=fc,
        softmax=np.where(valid, fc + lengths[:, None], size),
        size=size,
    )


def _forward_steps(x2: Any, w2: Any, b: Any, steps: _Steps) -> tuple[Any, Any]:
    """Each step's FC output and softmax, [steps, width] (zeros past the node's length)."""
    fc = jnp.einsum("sk,slk->sl", x2[steps.sample], w2[steps.rows]) + b[steps.rows]
    fc = jnp.where(steps.valid, fc, 0.0)
    shifted = jnp.where(steps.valid, fc - jnp.max(jnp.where(steps.valid, fc, -jnp.inf), axis=1, keepdims=True), 0.0)
    e = jnp.where(steps.valid, jnp.exp(shifted), 0.0)
    return fc, e / jnp.sum(e, axis=1, keepdims=True)


def _scatter(size: int, positions: np.ndarray, values: Any) -> Any:
    return jnp.zeros((size,), jnp.float32).at[positions].set(values, mode="drop")


@register(
    "HSoftmax",
    inputs=4,
    outputs=2,
    static_inputs=(3,),
    roles=Roles(integers=(3,)),
    gradient=single_gradient("HSoftmaxGradient", "I(0) I(1) I(2) I(3) O(1) GO(0)", "GI(0) GI(1) GI(2) GO(1)"),
)
def hsoftmax(op: Op) -> Kernel:
    """(X [M, K], W [N, K], b [N], labels [M] int32) -> (Y [M]: the negative log probability of each label
    along its path, intermediate_output: each path node's FC output then softmax, in order)."""
    hierarchy = _message(op, "hierarchy", hsm_pb2.HierarchyProto())

    def kernel(x, w, b, labels):
        rows, width, n = _fc_operands(op, x, w, b)
        steps = _steps(op, hierarchy, labels, rows, n)
        if steps.size == 0:
            return jnp.zeros((rows,), jnp.float32), jnp.zeros((0,), jnp.float32)
        fc, softmax = _forward_steps(jnp.reshape(x, (rows, width)), jnp.reshape(w, (n, width)), b, steps)
        picked = jnp.take_along_axis(softmax, steps.target[:, None], axis=1)[:, 0]
        loss = -jnp.log(jnp.maximum(picked, _LOG_THRESHOLD))
        y = jnp.zeros((rows,), jnp.float32).at[steps.sample].add(loss)
        return y, _scatter(steps.size, steps.softmax, softmax).at[steps.fc].set(fc, mode="drop")

    return kernel


@register("HSoftmaxGradient", inputs=6, outputs=4, static_inputs=(3,), roles=Roles(integers=(3,)))
def hsoftmax_gradient(op: Op) -> Kernel:
    """(X, W, b, labels, intermediate_output, dY) -> (dX, dW, db, d intermediate_output), from the
    forward's softmax outputs as stored in intermediate_output."""
    hierarchy = _message(op, "hierarchy", hsm_pb2.HierarchyProto())

    def kernel(x, w, b, labels, intermediate, dy):
        rows, width, n = _fc_operands(op, x, w, b)
        _check_dtype(op, 4, intermediate, _F32, "intermediate_output")
        _check_dtype(op, 5, dy, _F32, "dY")
        steps = _steps(op, hierarchy, labels, rows, n)
        if intermediate.size != steps.size:
            raise ShapeError(
                f"{op.where}: intermediate_output '{op.inputs[4]}' has {intermediate.size} values; the labels' "
                f"paths need {steps.size}"
            )
        if dy.size < rows:
            raise ShapeError(f"{op.where}: dY '{op.inputs[5]}' has {dy.size} values for {rows} rows of X")
        zeros = (jnp.zeros(x.shape, jnp.float32), jnp.zeros(w.shape, jnp.float32), jnp.zeros(b.shape, jnp.float32))
        if steps.size == 0:
            return (*zeros, jnp.zeros(intermediate.shape, jnp.float32))
        flat = jnp.concatenate([jnp.reshape(intermediate, (-1,)), jnp.zeros((1,), jnp.float32)])
        softmax = flat[steps.softmax]
        picked = jnp.take_along_axis(softmax, steps.target[:, None], axis=1)[:, 0]
        grad = -jnp.reshape(dy, (-1,))[steps.sample] / jnp.maximum(picked, _LOG_THRESHOLD)
        d_entropy = jnp.where(np.arange(steps.valid.shape[1]) == steps.target[:, None], grad[:, None], 0.0)
        dot = jnp.sum(softmax * d_entropy, axis=1, keepdims=True)
        d_fc = jnp.where(steps.valid, (d_entropy - dot) * softmax, 0.0)
        x2, w2 = jnp.reshape(x, (rows, width)), jnp.reshape(w, (n, width))
        rows_read = jnp.where(steps.valid, steps.rows, n)  # padding dropped
        dw = (
            jnp.zeros((n, width), jnp.float32)
            .at[rows_read]
            .add(d_fc[:, :, None] * x2[steps.sample][:, None, :], mode="drop")
        )
        db = jnp.zeros((n,), jnp.float32).at[rows_read].add(d_fc, mode="drop")
        dx = jnp.zeros((rows, width), jnp.float32).at[steps.sample].add(jnp.einsum("sl,slk->sk", d_fc, w2[steps.rows]))
        d_intermediate = _scatter(steps.size, steps.softmax, d_entropy).at[steps.fc].set(d_fc, mode="drop")
        return (
            jnp.reshape(dx, x.shape),
            jnp.reshape(dw, w.shape),
            db,
            jnp.reshape(d_intermediate, intermediate.shape),
        )

    return kernel


# --------------------------------------------------------------------------------------------------
# HSoftmaxSearch (host op: its names are strings)


def _node_scores(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, offset: int, length: int, parent: np.float32
) -> np.ndarray:
    """A node's children's scores: -log(softmax(W x + b)) + the parent's score, in float32."""
    fc = (w[offset : offset + length] @ x).astype(np.float32) + b[offset : offset + length]
    e = np.exp(fc - fc.max(), dtype=np.float32)
    p = e / e.sum(dtype=np.float32)
    return (-np.log(np.maximum(p, _LOG_THRESHOLD)) + parent).astype(np.float32)


def _search(
    op: Op,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    node: Any,
    parent: np.float32,
    beam: np.float32,
    info: list[tuple[bytes, np.float32]],
) -> list[tuple[bytes, np.float32]]:
    """Caffe2's `pruning` then `extractNodes`: this node's kept children and words (score below the parent's
    plus `beam`), then, recursively, its kept children's."""
    length = len(node.children) + len(node.word_ids)
    if length == 0 or node.offset < 0 or node.offset + length > w.shape[0]:
        raise BadArgumentError(
            f"{op.where}: argument 'tree' has node '{node.name}' (offset {node.offset}, {length} children) outside "
            f"the {w.shape[0]} rows of W '{op.inputs[1]}'"
        )
    scores = _node_scores(x, w, b, node.offset, length, parent)
    kept_children = []
    for i, child in enumerate(node.children):
        if scores[i] < parent + beam:
            if not child.HasField("offset") or not child.HasField("name"):
                raise BadArgumentError(f"{op.where}: HSM Search require the field offset and name in NodeProto")
            info.append((child.name.encode(), scores[i]))
            kept_children.append((child, scores[i]))
    for j, word in enumerate(node.word_ids):
        score = scores[len(node.children) + j]
        if score < parent + beam:
            info.append((str(word).encode(), score))
    for child, score in kept_children:
        _search(op, x, w, b, child, score, beam, info)
    return info


def _check_search(op: Op) -> None:
    tree = _message(op, "tree", hsm_pb2.TreeProto())
    if op.int("topN", 5) < 0:
        raise BadArgumentError(f"{op.where}: argument 'topN' must be >= 0")
    root = tree.root_node
    if not root.HasField("offset") or not root.HasField("name"):
        raise BadArgumentError(f"{op.where}: HSM Search require the field offset and name in NodeProto (the root's)")
    op.float("beam", 0.01)


@host_op(
    "HSoftmaxSearch",
    check=_check_search,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=should_not_do_gradient,
    emitter=HOST_OP_NO_EMITTER,
)
def hsoftmax_search(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """(X, W, b) -> (Y_names [M, topN] strings, Y_scores [M, topN]): per sample, the topN best-scoring
    (lowest negative log probability) nodes and words of a search of the tree that follows only children
    scoring below their parent's score plus `beam` (0.01); missing entries are "" and 0."""
    _check_search(op)
    tree = _message(op, "tree", hsm_pb2.TreeProto())
    top_n, beam = op.int("topN", 5), np.float32(op.float("beam", 0.01))
    x, w, b = (np.asarray(workspace.get(name, op)) for name in op.inputs)
    rows, width, _ = _fc_operands(op, x, w, b)
    x2, w2 = x.reshape(rows, width), w.reshape(w.shape[0], width)
    names = np.full((rows, top_n), b"", dtype=object)
    scores = np.zeros((rows, top_n), np.float32)
    for sample in range(rows):
        info = _search(op, x2[sample], w2, b, tree.root_node, np.float32(0), beam, [])
        order = sorted(range(len(info)), key=lambda i: info[i][1])[:top_n]
        for j, i in enumerate(order):
            names[sample, j], scores[sample, j] = info[i]
    workspace.put(op.outputs[0], names)
    workspace.feed(op.outputs[1], scores)


# --------------------------------------------------------------------------------------------------
# HuffmanTreeHierarchy (host op: its output is a serialized TreeProto)


class _Heap:
    """std::priority_queue over libstdc++'s push_heap/pop_heap, with HuffmanTreeHierarchy's comparator
    (a node of higher count ranks lower): its order among equal counts is what decides the tree."""

    def __init__(self) -> None:
        self.items: list[list[int]] = []  # [label, count, left, right]

    @staticmethod
    def _less(a: list[int], b: list[int]) -> bool:
        return a[1] > b[1]

    def _push_up(self, hole: int, top: int, value: list[int]) -> None:
        items = self.items
        parent = (hole - 1) // 2
        while hole > top and self._less(items[parent], value):
            items[hole] = items[parent]
            hole = parent
            parent = (hole - 1) // 2
        items[hole] = value

    def push(self, value: list[int]) -> None:
        self.items.append(value)
        self._push_up(len(self.items) - 1, 0, value)

    def pop(self) -> list[int]:
        items = self.items
        top = items[0]
        value = items.pop()
        length = len(items)
        if length == 0:
            return top
        hole, child = 0, 0
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if self._less(items[child], items[child - 1]):
                child -= 1
            items[hole] = items[child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            items[hole] = items[child - 1]
            hole = child - 1
        self._push_up(hole, 0, value)
        return top


def huffman_tree(counts: list[int]) -> bytes:
    """The serialized TreeProto HuffmanTreeHierarchy builds from the label counts (h_softmax_op.cc)."""
    heap = _Heap()
    for label, count in enumerate(counts):
        heap.push([label, count, -1, -1])
    tree: list[list[int]] = []
    while heap.items:
        left = heap.pop()
        tree.append(left)
        if heap.items:
            right = heap.pop()
            tree.append(right)
            heap.push([-1, left[1] + right[1], len(tree) - 2, len(tree) - 1])
    offset = 0

    def leaf(i: int) -> bool:
        return tree[i][2] == -1 and tree[i][3] == -1

    def build(i: int, node: Any) -> None:
        nonlocal offset
        if i == -1 or leaf(i):
            return
        for side, child in ((0, tree[i][2]), (1, tree[i][3])):
            if child == -1:
                continue
            if leaf(child):
                node.word_ids.append(tree[child][0])
                offset += side  # Caffe2 counts a right leaf only
            else:
                inner = node.children.add()
                inner.offset = offset
                offset += 2
                build(child, inner)

    message = hsm_pb2.TreeProto()
    root = message.root_node
    root.offset = offset
    offset += 2
    build(len(tree) - 1, root)
    return message.SerializeToString()


# Caffe2's SHOULD_NOT_DO_GRADIENT for it names HuffmanTreeHierarchyOp, a type that does not exist
_NO_MAKER = Absent("Caffe2 registers no gradient maker for it (its SHOULD_NOT_DO_GRADIENT names another type)")


def _check_huffman(op: Op) -> None:
    if op.int("num_classes", -1) < 1:
        raise BadArgumentError(f"{op.where}: argument 'num_classes' must be >= 1")


@host_op(
    "HuffmanTreeHierarchy",
    check=_check_huffman,
    roles=Roles(integers=(0,)),
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=_NO_MAKER,
    emitter=HOST_OP_NO_EMITTER,
)
def huffman_tree_hierarchy(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Labels [n] int64 -> a one-string tensor: the serialized TreeProto of a Huffman tree over the
    `num_classes` classes' counts in Labels."""
    _check_huffman(op)
    classes = op.int("num_classes", -1)
    labels = np.asarray(workspace.get(op.inputs[0], op))
    if labels.dtype != np.int64:
        raise ShapeError(f"{op.where}: Labels '{op.inputs[0]}' must be int64, got {_shape_text(labels)}")
    if labels.ndim != 1:
        raise ShapeError(f"{op.where}: Input labels must be a vector, got {_shape_text(labels)}")
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        bad = labels[(labels < 0) | (labels >= classes)][0]
        raise ShapeError(f"{op.where}: Found an input label {bad} not in range [0,{classes}]")
    counts = np.bincount(labels, minlength=classes).tolist()
    out = np.empty((1,), dtype=object)
    out[0] = huffman_tree(counts)
    workspace.put(op.outputs[0], out)
