"""Sparse gradients (GradientSlice) through the builder's backward pass, against real Caffe2's.

Two lookups into one embedding table give two (indices, values) slices; Caffe2 accumulates them with two `Concat`s
and no deduplication, and the sparse optimizers take the repeated rows. The OperatorDefs must equal Caffe2's byte
for byte, and the slices computed by rnn2jax must equal Caffe2's.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnn2jax
from differential import assert_blobs_equal, assert_same_ops, run_rnn2jax
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.ops.gradient_makers import GradientError

op = create_operator


def _lookups(kind: str) -> list:
    """Two readers of table `emb`, then a loss over both."""
    if kind == "gather":
        reads = [op("Gather", ["emb", "ids_a"], ["a"]), op("Gather", ["emb", "ids_b"], ["b"])]
    elif kind == "sparse_lengths_sum":
        reads = [
            op("SparseLengthsSum", ["emb", "ids_a", "len_a"], ["a"]),
            op("SparseLengthsSum", ["emb", "ids_b", "len_b"], ["b"]),
        ]
    else:  # one of each
        reads = [op("Gather", ["emb", "ids_a"], ["a"]), op("SparseLengthsSum", ["emb", "ids_b", "len_b"], ["b"])]
    return [
        *reads,
        op("SumElements", ["a"], ["sa"]),
        op("SumElements", ["b"], ["sb"]),
        op("Add", ["sa", "sb"], ["loss"]),
    ]


def _feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "emb": rng.standard_normal((6, 3)).astype(np.float32),
        "ids_a": np.array([0, 2, 2, 5], np.int32),
        "ids_b": np.array([1, 2, 0], np.int32),
        "len_a": np.array([1, 3], np.int32),
        "len_b": np.array([2, 1], np.int32),
    }


@pytest.mark.parametrize("kind", ["gather", "sparse_lengths_sum", "mixed_lookups"])
def test_two_lookups_into_one_table_accumulate_like_caffe2(caffe2, kind):
    forward = _lookups(kind)
    ours, grad_map = get_backward_pass(forward, {"loss": None})
    theirs, their_map = caffe2.backward_pass(forward, {"loss": None})
    assert_same_ops(ours, theirs, f"backward pass of two {kind} readers")
    indices, values = grad_map["emb"]
    assert their_map["emb"] == {"indices": indices, "values": values}
    assert indices.endswith("_indices_concat") and values.endswith("_values_concat")

    feeds = _feeds(np.random.default_rng(0))
    ops = [*forward, *theirs]
    want = caffe2.run([("ops", ops)], feeds, fetch=[indices, values])
    got = run_rnn2jax(ops, feeds, [indices, values])
    assert_blobs_equal(got, want)
    # the slice is the dense gradient once repeated rows are added up
    dense = np.zeros_like(feeds["emb"])
    np.add.at(dense, want[indices], want[values])
    ids = [feeds["ids_a"], feeds["ids_b"]]
    expected = sum(np.bincount(i, minlength=6) for i in ids)[:, None] * np.ones((1, 3), np.float32)
    np.testing.assert_allclose(dense, expected)


def test_a_sparse_and_a_dense_gradient_for_one_blob_are_refused_like_caffe2(caffe2):
    forward = [
        op("Gather", ["emb", "ids"], ["a"]),
        op("MatMul", ["emb", "w"], ["b"]),
        op("SumElements", ["a"], ["sa"]),
        op("SumElements", ["b"], ["sb"]),
        op("Add", ["sa", "sb"], ["loss"]),
    ]
    with pytest.raises(Exception, match="mix of sparse and dense gradients"):
        caffe2.backward_pass(forward, {"loss": None})
    with pytest.raises(GradientError, match="mix of sparse and dense gradients"):
        get_backward_pass(forward, {"loss": None})


# --------------------------------------------------------------------------------------------------
# An embedding model trains: the slice flows from SparseLengthsSum into SparseAdagrad


def _train_net() -> tuple[list, list]:
    """Embedding bag -> FC -> logistic loss, its backward pass, and Adagrad updates (sparse for the table)."""
    forward = [
        op("SparseLengthsSum", ["emb", "ids", "lens"], ["pooled"]),
        op("FC", ["pooled", "w", "b"], ["logit"]),
        op("SigmoidCrossEntropyWithLogits", ["logit", "label"], ["xent"]),
        op("AveragedLoss", ["xent"], ["loss"]),
    ]
    backward, grads = get_backward_pass(forward, {"loss": None})
    indices, values = grads["emb"]
    updates = [
        op("SparseAdagrad", ["emb", "emb_moment", indices, values, "lr"], ["emb", "emb_moment"], epsilon=1e-6),
        op("Adagrad", ["w", "w_moment", grads["w"], "lr"], ["w", "w_moment"], epsilon=1e-6),
        op("Adagrad", ["b", "b_moment", grads["b"], "lr"], ["b", "b_moment"], epsilon=1e-6),
    ]
    return forward, [*forward, *backward, *updates]


def _batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Examples labelled 1 when they hold any id below 5 (a rule a bag of embeddings can learn)."""
    lens = rng.integers(1, 4, size=8).astype(np.int32)
    ids = rng.integers(0, 10, size=int(lens.sum())).astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    label = np.array([float((ids[s : s + n] < 5).any()) for s, n in zip(starts, lens, strict=True)], np.float32)
    return {"ids": ids, "lens": lens, "label": label[:, None]}


def _params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    emb = (rng.standard_normal((10, 4)) * 0.1).astype(np.float32)
    w = (rng.standard_normal((1, 4)) * 0.1).astype(np.float32)
    b = np.zeros(1, np.float32)
    zeros = {f"{k}_moment": np.zeros_like(v) for k, v in {"emb": emb, "w": w, "b": b}.items()}
    # Caffe2's optimizers add lr * update: its training nets step with a negative rate
    return {"emb": emb, "w": w, "b": b, **zeros, "lr": np.array([-0.1], np.float32)}


PARAMS = ["emb", "emb_moment", "w", "w_moment", "b", "b_moment"]


def test_one_training_step_of_an_embedding_model_agrees_with_caffe2(caffe2):
    _, train = _train_net()
    rng = np.random.default_rng(1)
    feeds = {**_params(rng), **_batch(rng)}
    want = caffe2.run([("ops", train)], feeds, fetch=[*PARAMS, "loss"])
    got = run_rnn2jax(train, feeds, [*PARAMS, "loss"])
    assert_blobs_equal(got, want)
    assert not np.array_equal(want["emb"], feeds["emb"])  # the looked-up rows moved


def test_an_embedding_model_trains_with_sparse_updates():
    _, train = _train_net()
    compiled = rnn2jax.compile(create_net("train", train), outputs=[*PARAMS, "loss"])
    rng = np.random.default_rng(2)
    params = {k: v for k, v in _params(rng).items()}
    lr = params.pop("lr")
    losses = []
    for _ in range(60):
        out = compiled({**params, **_batch(rng), "lr": lr})
        params = {k: np.asarray(out[k]) for k in PARAMS}
        losses.append(float(out["loss"]))
    assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:10]), losses
