"""Segment reductions beyond the differential tests: each gradient op agrees with `jax.vjp` of its forward
op (ties broken apart, where Caffe2's Max gradient goes to every tied row), and segment ids whose values
decide the output shape are refused when traced (caffe2/operators/segment_reduction_op.h)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import forward, run_op
from rnn2jax.errors import ShapeError

SEEDS = st.integers(0, 2**32 - 1)
# Fixed shapes (values vary with the seed): each op compiles once, eagerly and under jit.
IDS = np.array([0, 0, 1, 2, 2, 2], np.int32)
LENGTHS = np.array([2, 0, 1, 3], np.int32)


def rand(seed: int, shape) -> np.ndarray:
    """Distinct values (no ties), so that a max has one arg max."""
    rng = np.random.default_rng(seed)
    return (rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0 - 1.0).astype(np.float32)


def vjp(op_type, inputs, grad, wrt=(0,), **args):
    """The gradient of `op_type`'s output w.r.t. inputs `wrt`, by jax.vjp of its lowering."""
    fn = forward(op_type, len(inputs), **args)

    def f(*diff):
        full = list(inputs)
        for i, x in zip(wrt, diff, strict=True):
            full[i] = x
        return fn(*full)[0]

    _, back = jax.vjp(f, *(jnp.asarray(inputs[i]) for i in wrt))
    return [np.asarray(g) for g in back(jnp.asarray(grad))]


@pytest.mark.parametrize("reducer", ["Sum", "Mean", "Max", "LogSumExp", "LogMeanExp"])
@given(seed=SEEDS)
def test_sorted_segment_range_gradients_are_vjps(reducer, seed):
    ids = IDS
    x = rand(seed, (ids.size, 2))
    (y,) = run_op(f"SortedSegmentRange{reducer}", [x, ids], jit=False)
    grad = rand(seed + 1, y.shape)
    (got,) = run_op(f"SortedSegmentRange{reducer}Gradient", [x, y, grad, ids], jit=False)
    (want,) = vjp(f"SortedSegmentRange{reducer}", [x, ids], grad)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["SortedSegment", "UnsortedSegment"])
@pytest.mark.parametrize("reducer", ["Sum", "Mean", "WeightedSum"])
@given(seed=SEEDS)
def test_segment_gradients_are_vjps(layout, reducer, seed):
    ids = IDS
    if layout == "UnsortedSegment":
        ids = np.random.default_rng(seed).permutation(ids)
    x = rand(seed, (ids.size, 3))
    scalars = [rand(seed + 2, (ids.size,))] if reducer == "WeightedSum" else []
    op_type = f"{layout}{reducer}"
    (y,) = run_op(op_type, [x, *scalars, ids], jit=False)
    grad = rand(seed + 1, y.shape)
    (got,) = run_op(f"{op_type}Gradient", [*scalars, grad, ids], jit=False)
    (want,) = vjp(op_type, [x, *scalars, ids], grad)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@given(seed=SEEDS)
def test_lengths_gradients_are_vjps(seed):
    lengths = LENGTHS
    n = int(lengths.sum())
    x, w = rand(seed, (n, 2)), rand(seed + 2, (n,))
    grad = rand(seed + 1, (lengths.size, 2))
    (y,) = run_op("LengthsMax", [x, lengths], jit=False)
    (got,) = run_op("LengthsMaxWithMainInputAndForwardOutputGradient", [y, grad, lengths, x], jit=False)
    np.testing.assert_allclose(got, vjp("LengthsMax", [x, lengths], grad)[0], rtol=1e-6)
    got_x, got_w = run_op("LengthsWeightedSumWithMainInputGradient", [w, grad, lengths, x], 2, jit=False)
    want_x, want_w = vjp("LengthsWeightedSum", [x, w, lengths], grad, wrt=(0, 1))
    np.testing.assert_allclose(got_x, want_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    (plain,) = run_op("LengthsWeightedSumGradient", [w, grad, lengths], jit=False)
    np.testing.assert_array_equal(plain, got_x)


@pytest.mark.parametrize("num", [0, 1, 2, 3])
@given(seed=SEEDS)
def test_reduce_front_weighted_sum_gradient_is_a_vjp(num, seed):
    shape = (2, 3, 2)
    x, w = rand(seed, shape), rand(seed + 2, shape[:num])
    (y,) = run_op("ReduceFrontWeightedSum", [x, w], jit=False, num_reduce_dim=num)
    grad = rand(seed + 1, y.shape)
    dims = np.asarray(shape, np.int64)
    (got,) = run_op("ReduceFrontWeightedSumGradient", [w, grad, dims], jit=False, num_reduce_dim=num)
    np.testing.assert_allclose(got, vjp("ReduceFrontWeightedSum", [x, w], grad, num_reduce_dim=num)[0], rtol=1e-6)


@pytest.mark.parametrize("op_type", ["SortedSegmentRangeMax", "SortedSegmentSum", "UnsortedSegmentMean"])
def test_traced_segment_ids_are_refused(op_type):
    """The number of segments comes from the ids' values: under the user's own jax.jit they are traced."""
    x, ids = np.ones((3, 2), np.float32), np.array([0, 0, 1], np.int32)
    with pytest.raises(ShapeError, match=rf"{op_type}.*'x1'.*traced"):
        run_op(op_type, [x, ids], jit=True)
    (y,) = run_op(op_type, [x, ids], jit=False)
    assert y.shape == (2, 2)


def test_traced_lengths_are_checked_when_the_net_runs():
    """LENGTHS only decide values: under jit the lengths' total is checked by the compiled net."""
    import rnn2jax
    from rnn2jax.caffe2.opdef import create_net, create_operator

    net = create_net("n", [create_operator("LengthsMax", ["x", "lengths"], ["y"])])
    fn = rnn2jax.compile(net, outputs=["y"])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(fn({"x": x, "lengths": np.array([1, 0, 2], np.int32)})["y"], [[0, 1], [0, 0], [4, 5]])
    with pytest.raises(ShapeError, match="sum to 4"):
        fn({"x": x, "lengths": np.array([2, 0, 2], np.int32)})
