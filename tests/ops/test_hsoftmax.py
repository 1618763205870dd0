"""The hierarchical softmax family (rnn2jax/ops/hsoftmax.py) against real Caffe2: HSoftmax and its gradient
(see tests/differential.py), and the host ops HSoftmaxSearch and HuffmanTreeHierarchy run as nets in both."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from differential import Case, arrays, assert_blobs_equal, cases, check_op, invalid, make_op, run_case, run_rnn2jax
from rnn2jax.caffe2.opdef import create_net
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ops.hsoftmax import huffman_tree
from rnn2jax.proto import hsm_pb2


def draw_tree(data, words: list[int], depth: int = 0) -> hsm_pb2.NodeProto:
    """A random tree over `words`: each node has some words as leaves and the rest split among children."""
    node = hsm_pb2.NodeProto(name=f"node{data.draw(st.integers(0, 10**6))}")
    split = data.draw(st.integers(0, 3)) if depth < 2 and len(words) > 2 else 0
    leaves = words if split == 0 else words[: data.draw(st.integers(0, len(words) - split))]
    rest = words[len(leaves) :]
    for i in range(split):
        part = rest[i * len(rest) // split : (i + 1) * len(rest) // split]
        if part:
            node.children.add().CopyFrom(draw_tree(data, part, depth + 1))
    node.word_ids.extend(leaves)
    if not node.children and not node.word_ids:
        node.word_ids.append(words[0])
    return node


def hierarchy_of(tree: hsm_pb2.TreeProto) -> tuple[hsm_pb2.HierarchyProto, int]:
    """Each word's path (the rows, children and target of each node on it), as Caffe2's
    hsm_util.create_hierarchy writes it; numbers the nodes' `offset`s on the way. Returns it and the rows."""
    hierarchy = hsm_pb2.HierarchyProto()
    rows = 0

    def visit(node, path):
        nonlocal rows
        node.offset = rows
        width = len(node.children) + len(node.word_ids)
        rows += width
        for target, child in enumerate(node.children):
            visit(child, [*path, (node.offset, width, target)])
        for target, word in enumerate(node.word_ids):
            entry = hierarchy.paths.add(word_id=word)
            for index, length, at in [*path, (node.offset, width, len(node.children) + target)]:
                entry.path_nodes.add(index=index, length=length, target=at)

    visit(tree.root_node, [])
    hierarchy.size = rows
    return hierarchy, rows


def draw_hsoftmax(data):
    words = data.draw(st.integers(1, 8))
    tree = hsm_pb2.TreeProto()
    tree.root_node.CopyFrom(draw_tree(data, list(range(words))))
    hierarchy, rows = hierarchy_of(tree)
    batch, width = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    x = data.draw(arrays((batch, width), np.float32, -2, 2))
    w = data.draw(arrays((rows + (1 if invalid(data) else 0), width), np.float32, -2, 2))
    b = data.draw(arrays((rows,), np.float32, -1, 1))
    labels = data.draw(arrays((batch,), np.int32, 0, words - (0 if invalid(data) else 1)))  # words: no path
    op = make_op("HSoftmax", ["x", "w", "b", "labels"], ["y", "io"], hierarchy=hierarchy.SerializeToString())
    return op, {"x": x, "w": w, "b": b, "labels": labels}


CASES = cases(Case("HSoftmax", draw_hsoftmax, gradient_ops=("HSoftmaxGradient",), rtol=1e-4))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_refusals(caffe2):
    tree = hsm_pb2.TreeProto()
    tree.root_node.word_ids.extend([0, 1])
    hierarchy, _ = hierarchy_of(tree)
    op = make_op("HSoftmax", ["x", "w", "b", "l"], ["y", "io"], hierarchy=hierarchy.SerializeToString())
    x, w, b = np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.ones(2, np.float32)
    labels = np.array([0, 1], np.int32)
    for inputs in (
        {"x": x, "w": w[:, :2], "b": b, "l": labels},  # K differs
        {"x": x, "w": w, "b": b[:1], "l": labels},
        {"x": x, "w": w[0], "b": b, "l": labels},
    ):
        assert check_op(caffe2, op, inputs) is None
    # a node past W's rows: Caffe2 reads out of bounds; rnn2jax refuses
    with pytest.raises(BadArgumentError, match=r"hierarchy.*outside the 1 rows of W 'w'"):
        run_rnn2jax([op], {"x": x, "w": w[:1], "b": b[:1], "l": labels}, ["y"], jit=False)
    with pytest.raises(ShapeError, match="labels 'l' must be int32"):
        run_rnn2jax([op], {"x": x, "w": w, "b": b, "l": labels.astype(np.int64)}, ["y"], jit=False)
    with pytest.raises(BadArgumentError, match="not a serialized HierarchyProto"):
        run_rnn2jax([make_op("HSoftmax", ["x", "w", "b", "l"], ["y", "io"], hierarchy=b"\xff\xff")], {}, ["y"])


def run_both(caffe2, ops, inputs, outputs):
    net = create_net("hsm", ops)
    want = caffe2.run_net(net, inputs, outputs)
    workspace = rnn2jax.Workspace()
    for name, value in inputs.items():
        workspace.feed(name, value)
    workspace.run(net)
    return {name: np.asarray(workspace.fetch(name)) for name in outputs}, want


@given(data=st.data())
def test_huffman_tree_hierarchy_matches_caffe2(caffe2, data):
    classes = data.draw(st.integers(1, 9))
    labels = data.draw(arrays((data.draw(st.integers(0, 20)),), np.int64, 0, classes - 1))
    op = make_op("HuffmanTreeHierarchy", ["labels"], ["tree"], num_classes=classes)
    got, want = run_both(caffe2, [op], {"labels": labels}, ["tree"])
    assert got["tree"].shape == want["tree"].shape == (1,)
    # the oracle hands strings over as NumPy bytes, which drop trailing NULs (a last `offset: 0`)
    assert bytes(got["tree"][0]).rstrip(b"\0") == bytes(want["tree"][0])


def test_huffman_tree_refusals(caffe2):
    op = make_op("HuffmanTreeHierarchy", ["labels"], ["tree"], num_classes=3)
    with pytest.raises(Exception, match="not in range"):
        caffe2.run_op(op, {"labels": np.array([3], np.int64)})
    workspace = rnn2jax.Workspace()
    workspace.feed("labels", np.array([3], np.int64))
    with pytest.raises(ShapeError, match=r"HuffmanTreeHierarchy.*label 3 not in range"):
        workspace.run(create_net("hsm", [op]))


@given(data=st.data())
def test_hsoftmax_search_matches_caffe2(caffe2, data):
    """The search's names and scores, on the tree HuffmanTreeHierarchy builds (named here)."""
    classes = data.draw(st.integers(2, 6))
    tree = hsm_pb2.TreeProto()
    tree.ParseFromString(huffman_tree(data.draw(st.lists(st.integers(0, 5), min_size=classes, max_size=classes))))
    _, rows = hierarchy_of(tree)  # renumbers the offsets densely

    def name(node, prefix):
        node.name = prefix
        for i, child in enumerate(node.children):
            name(child, f"{prefix}.{i}")

    name(tree.root_node, "root")
    width, batch = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    inputs = {
        "x": data.draw(arrays((batch, width), np.float32, -1, 1)),
        "w": data.draw(arrays((rows, width), np.float32, -1, 1)),
        "b": data.draw(arrays((rows,), np.float32, -1, 1)),
    }
    args = {"tree": tree.SerializeToString(), "topN": data.draw(st.integers(1, 6))}
    args["beam"] = data.draw(st.sampled_from([0.5, 2.0, 20.0]))
    op = make_op("HSoftmaxSearch", ["x", "w", "b"], ["names", "scores"], **args)
    got, want = run_both(caffe2, [op], inputs, ["names", "scores"])
    assert_blobs_equal(got, want, rtol=1e-4)


def test_gradient_makers_match_caffe2(caffe2):
    """HSoftmaxSearch refuses a gradient; HuffmanTreeHierarchy has no maker at all (Caffe2's
    SHOULD_NOT_DO_GRADIENT names another type)."""
    from rnn2jax.checking.oracle import Caffe2Error
    from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op, has_gradient_maker

    search = make_op("HSoftmaxSearch", ["x", "w", "b"], ["names", "scores"])
    with pytest.raises(Caffe2Error, match="should not call gradient"):
        caffe2.gradient_for_op(search, ["names_grad", "scores_grad"])
    with pytest.raises(GradientError, match="should not call gradient"):
        get_gradient_for_op(search, ["names_grad", "scores_grad"])
    with pytest.raises(Caffe2Error, match="GradientRegistry"):
        caffe2.gradient_for_op(make_op("HuffmanTreeHierarchy", ["labels"], ["tree"]), ["tree_grad"])
    assert not has_gradient_maker("HuffmanTreeHierarchy")
