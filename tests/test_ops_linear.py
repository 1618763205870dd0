"""FC, FCTransposed, MatMul, BatchMatMul and ElementwiseLinear against NumPy references written from
Caffe2's semantics (SEMANTICS.md section 4; fully_connected_op.h, matmul_op.h, batch_matmul_op.h)."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError

# Products sum up to ~12 float32 terms: the summation order differs from NumPy's, so allow a few ulps
# of the largest term rather than of the (possibly cancelled) result.
MATMUL = {"rtol": 1e-5, "atol": 1e-5}
SEEDS = st.integers(0, 2**32 - 1)
SIDES = st.integers(1, 3)


def normal(seed: int, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@st.composite
def split_dims(draw, size: int) -> tuple[int, ...]:
    """Dims whose product is `size`, with optional size-1 dims around it (a flattened block)."""
    return draw(st.sampled_from([(size,), (1, size), (size, 1)]))


def f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


# --------------------------------------------------------------------------------------------------
# FC / FCTransposed


@st.composite
def fc_case(draw, transposed: bool):
    x_shape = tuple(draw(st.lists(SIDES, min_size=1, max_size=4)))
    axis = draw(st.integers(0, len(x_shape) - 1))
    k = math.prod(x_shape[axis:])
    k_dims = draw(st.sampled_from([x_shape[axis:], (k,)]))
    n_dims = draw(split_dims(draw(SIDES)))
    w_shape = (*k_dims, *n_dims) if transposed else (*n_dims, *k_dims)
    axis_w = len(k_dims) if transposed else len(n_dims)
    if draw(st.booleans()):
        axis -= len(x_shape)
    if draw(st.booleans()):
        axis_w -= len(w_shape)
    return x_shape, w_shape, axis, axis_w, math.prod(n_dims)


def fc_reference(x, w, b, axis, axis_w, transposed):
    axis %= x.ndim
    axis_w %= w.ndim
    m, k = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    rows, cols = math.prod(w.shape[:axis_w]), math.prod(w.shape[axis_w:])
    w2 = f64(w).reshape(rows, cols)
    y = f64(x).reshape(m, k) @ (w2 if transposed else w2.T) + b
    return y.reshape(*x.shape[:axis], b.shape[0])


@pytest.mark.parametrize("op_type", ["FC", "FCTransposed"])
@given(data=st.data(), seed=SEEDS)
def test_fc(jit, op_type, data, seed):
    transposed = op_type == "FCTransposed"
    x_shape, w_shape, axis, axis_w, n = data.draw(fc_case(transposed))
    x, w, b = normal(seed, x_shape, w_shape, (n,))
    (y,) = run_op(op_type, [x, w, b], jit=jit, axis=axis, axis_w=axis_w)
    assert y.dtype == np.float32
    expected = fc_reference(x, w, b, axis, axis_w, transposed)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, **MATMUL)


def test_fc_defaults_flatten_trailing_dims(jit):
    x, w, b = normal(0, (2, 3, 4), (5, 12), (5,))
    (y,) = run_op("FC", [x, w, b], jit=jit)
    assert y.shape == (2, 5)
    np.testing.assert_allclose(y, f64(x).reshape(2, 12) @ f64(w).T + b, **MATMUL)


def test_fc_rnn_input_projection(jit):
    # The RNN cells project [T, B, D] inputs with axis=2: Y is [T, B, N].
    x, w, b = normal(1, (3, 2, 4), (8, 4), (8,))
    (y,) = run_op("FC", [x, w, b], jit=jit, axis=2)
    assert y.shape == (3, 2, 8)
    np.testing.assert_allclose(y, f64(x) @ f64(w).T + b, **MATMUL)


def test_fc_transposed_default(jit):
    x, w, b = normal(2, (2, 4), (4, 3), (3,))
    (y,) = run_op("FCTransposed", [x, w, b], jit=jit)
    np.testing.assert_allclose(y, f64(x) @ f64(w) + b, **MATMUL)


def test_fc_empty_batch(jit):
    x, w, b = normal(3, (0, 4), (3, 4), (3,))
    (y,) = run_op("FC", [x, w, b], jit=jit)
    assert y.shape == (0, 3)


@pytest.mark.parametrize(
    ("op_type", "shapes", "args", "match"),
    [
        ("FC", [(2, 4), (3, 5), (3,)], {}, "K = 4"),
        ("FCTransposed", [(2, 4), (3, 5), (5,)], {}, "K = 4"),
        ("FC", [(2, 4), (3, 4), (4,)], {}, r"must be 1-D \[3\]"),
        ("FC", [(2, 4), (3, 4), (1, 3)], {}, r"must be 1-D \[3\]"),
        ("FC", [(2, 4), (3, 4), (3,)], {"axis": 2}, "axis 2 is out of range"),
        ("FC", [(2, 4), (3, 4), (3,)], {"axis_w": -3}, "axis_w -3 is out of range"),
    ],
)
def test_fc_bad_shapes(jit, op_type, shapes, args, match):
    with pytest.raises(ShapeError, match=match):
        run_op(op_type, normal(0, *shapes), jit=jit, **args)


def test_fc_rejects_int_input(jit):
    x = np.ones((2, 4), np.int32)
    w, b = normal(0, (3, 4), (3,))
    with pytest.raises(ShapeError, match="needs a float tensor"):
        run_op("FC", [x, w, b], jit=jit)


def test_fc_bad_argument(jit):
    with pytest.raises(BadArgumentError, match="'axis' must be an integer"):
        run_op("FC", normal(0, (2, 4), (3, 4), (3,)), jit=jit, axis=1.5)


# --------------------------------------------------------------------------------------------------
# MatMul


@given(data=st.data(), m=SIDES, k=SIDES, n=SIDES, trans_a=st.booleans(), trans_b=st.booleans(), seed=SEEDS)
def test_matmul(jit, data, m, k, n, trans_a, trans_b, seed):
    a_rows, a_cols = (k, m) if trans_a else (m, k)
    b_rows, b_cols = (n, k) if trans_b else (k, n)
    a_dims = (data.draw(split_dims(a_rows)), data.draw(split_dims(a_cols)))
    b_dims = (data.draw(split_dims(b_rows)), data.draw(split_dims(b_cols)))
    a, b = normal(seed, (*a_dims[0], *a_dims[1]), (*b_dims[0], *b_dims[1]))
    axis_a, axis_b = len(a_dims[0]), len(b_dims[0])
    if data.draw(st.booleans()):
        axis_a -= a.ndim
    args = {"axis_a": axis_a, "axis_b": axis_b, "trans_a": int(trans_a), "trans_b": int(trans_b)}
    (y,) = run_op("MatMul", [a, b], jit=jit, **args)
    a2 = f64(a).reshape(a_rows, a_cols)
    b2 = f64(b).reshape(b_rows, b_cols)
    expected = (a2.T if trans_a else a2) @ (b2.T if trans_b else b2)
    assert y.shape == (m, n)
    np.testing.assert_allclose(y, expected, **MATMUL)


def test_matmul_defaults_flatten_at_axis_1(jit):
    a, b = normal(0, (2, 3, 4), (12, 5))
    (y,) = run_op("MatMul", [a, b], jit=jit)
    np.testing.assert_allclose(y, f64(a).reshape(2, 12) @ b, **MATMUL)


def test_matmul_third_input_gives_shape(jit):
    a, b, like = normal(0, (2, 3), (3, 4), (4, 2))
    (y,) = run_op("MatMul", [a, b, like], jit=jit)
    np.testing.assert_allclose(y, (f64(a) @ b).reshape(4, 2), **MATMUL)


@pytest.mark.parametrize(
    ("shapes", "args", "match"),
    [
        ([(2, 3), (4, 5)], {}, "A '.*' is 2 x 3, B '.*' is 4 x 5"),
        ([(2, 3), (2, 5)], {"trans_b": 1}, r"trans\(B\)"),
        ([(2, 3), (3, 5), (7,)], {}, "does not hold"),
        ([(2, 3), (3, 5)], {"axis_a": 2}, "axis_a 2 is out of range"),
    ],
)
def test_matmul_bad_shapes(jit, shapes, args, match):
    with pytest.raises(ShapeError, match=match):
        run_op("MatMul", normal(0, *shapes), jit=jit, **args)


# --------------------------------------------------------------------------------------------------
# BatchMatMul


def bmm_reference(a, b, trans_a, trans_b):
    a, b = f64(a), f64(b)
    if a.ndim == 1 and b.ndim == 1:
        return np.array([a @ b])
    if a.ndim > 1 and trans_a:
        a = np.swapaxes(a, -1, -2)
    if b.ndim > 1 and trans_b:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def bmm_operands(batch_a, batch_b, m, k, n, trans_a, trans_b):
    a_shape = (*batch_a, *((k, m) if trans_a else (m, k)))
    b_shape = (*batch_b, *((n, k) if trans_b else (k, n)))
    return a_shape, b_shape


@given(
    batch=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
    m=SIDES,
    k=SIDES,
    n=SIDES,
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    seed=SEEDS,
)
def test_batch_matmul(jit, batch, m, k, n, trans_a, trans_b, seed):
    a, b = normal(seed, *bmm_operands(batch, batch, m, k, n, trans_a, trans_b))
    (y,) = run_op("BatchMatMul", [a, b], jit=jit, trans_a=int(trans_a), trans_b=int(trans_b))
    assert y.shape == (*batch, m, n)
    np.testing.assert_allclose(y, bmm_reference(a, b, trans_a, trans_b), **MATMUL)


@given(
    batches=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3),
    m=SIDES,
    k=SIDES,
    n=SIDES,
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    seed=SEEDS,
)
def test_batch_matmul_broadcast(jit, batches, m, k, n, trans_a, trans_b, seed):
    a, b = normal(seed, *bmm_operands(*batches.input_shapes, m, k, n, trans_a, trans_b))
    args = {"trans_a": int(trans_a), "trans_b": int(trans_b), "broadcast": 1}
    (y,) = run_op("BatchMatMul", [a, b], jit=jit, **args)
    assert y.shape == (*batches.result_shape, m, n)
    np.testing.assert_allclose(y, bmm_reference(a, b, trans_a, trans_b), **MATMUL)


@given(
    batch=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
    vector_side=st.sampled_from(["a", "b", "both"]),
    k=SIDES,
    other=SIDES,
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    seed=SEEDS,
)
def test_batch_matmul_broadcast_vectors(jit, batch, vector_side, k, other, trans_a, trans_b, seed):
    """A 1-D operand is a vector (its trans flag ignored); vector·vector has shape [1]."""
    a_shape, b_shape = bmm_operands(batch, batch, other, k, other, trans_a, trans_b)
    if vector_side in ("a", "both"):
        a_shape = (k,)
    if vector_side in ("b", "both"):
        b_shape = (k,)
    a, b = normal(seed, a_shape, b_shape)
    args = {"trans_a": int(trans_a), "trans_b": int(trans_b), "broadcast": 1}
    (y,) = run_op("BatchMatMul", [a, b], jit=jit, **args)
    expected = bmm_reference(a, b, trans_a, trans_b)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, **MATMUL)


def test_batch_matmul_dot_attention_shapes(jit):
    # Dot attention: [B, 1, H] · [B, H, L] -> [B, 1, L]; and [B, T, H] with trans_b.
    q, keys = normal(0, (2, 1, 4), (2, 5, 4))
    (y,) = run_op("BatchMatMul", [q, keys], jit=jit, trans_b=1)
    np.testing.assert_allclose(y, f64(q) @ np.swapaxes(f64(keys), 1, 2), **MATMUL)


@pytest.mark.parametrize(
    ("shapes", "args", "match"),
    [
        ([(2, 3, 4), (4, 5)], {}, "forget broadcast=1"),
        ([(3,), (3,)], {}, "forget broadcast=1"),
        ([(2, 3, 4), (3, 4, 5)], {}, "forget broadcast=1"),
        ([(2, 3, 4), (2, 5, 6)], {}, "K = 4.*K = 5"),
        ([(2, 3, 4), (2, 5, 4)], {"trans_b": 0}, "K = 4.*K = 5"),
        ([(3,), (4,)], {"broadcast": 1}, "K = 3.*K = 4"),
        ([(2, 3, 4), (3, 4, 5)], {"broadcast": 1}, "do not broadcast"),
        ([(), (3,)], {"broadcast": 1}, "rank >= 1"),
    ],
)
def test_batch_matmul_bad_shapes(jit, shapes, args, match):
    with pytest.raises(ShapeError, match=match):
        run_op("BatchMatMul", normal(0, *shapes), jit=jit, **args)


# --------------------------------------------------------------------------------------------------
# ElementwiseLinear


@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=3), data=st.data(), seed=SEEDS)
def test_elementwise_linear(jit, shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = math.prod(shape[axis % len(shape) :])
    x, a, b = normal(seed, shape, (d,), (d,))
    (y,) = run_op("ElementwiseLinear", [x, a, b], jit=jit, axis=axis)
    expected = (x.reshape(-1, d) * a + b).reshape(shape)
    np.testing.assert_allclose(y, expected, **MATMUL)


def test_elementwise_linear_default_axis(jit):
    x, a, b = normal(0, (2, 3, 2), (6,), (6,))
    (y,) = run_op("ElementwiseLinear", [x, a, b], jit=jit)
    np.testing.assert_allclose(y, (x.reshape(2, 6) * a + b).reshape(2, 3, 2), **MATMUL)


@pytest.mark.parametrize(
    ("shapes", "match"),
    [([(2, 3), (2,), (3,)], r"must be 1-D \[3\]"), ([(2, 3), (3,), (1, 3)], r"must be 1-D \[3\]")],
)
def test_elementwise_linear_bad_shapes(jit, shapes, match):
    with pytest.raises(ShapeError, match=match):
        run_op("ElementwiseLinear", normal(0, *shapes), jit=jit)


@pytest.mark.parametrize("op_type", ["FC", "MatMul", "BatchMatMul"])
def test_matmul_precision_is_float32_unless_the_user_sets_jax_default_matmul_precision(op_type):
    """Caffe2 multiplies in float32: HIGHEST (no TF32/bf16 passes on accelerators), unless the user chose
    `jax_default_matmul_precision`, which then rules."""
    import jax

    from rnn2jax.ir.netdef import Op
    from rnn2jax.ops.registry import lookup

    inputs = {"FC": ((2, 3), (4, 3), (4,)), "MatMul": ((2, 3), (3, 4)), "BatchMatMul": ((2, 2, 3), (2, 3, 4))}[op_type]
    names = tuple(f"in{i}" for i in range(len(inputs)))
    op = Op(op_type, names, ("y",), {}, 0, f"op #0 ({op_type})")
    kernel = lookup(op).build(op)
    args = [np.ones(shape, np.float32) for shape in inputs]

    def precisions() -> set[str]:
        jaxpr = jax.make_jaxpr(kernel)(*args)
        return {str(e.params["precision"]) for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"}

    highest = str((jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST))
    assert precisions() == {highest}
    with jax.default_matmul_precision("tensorfloat32"):
        chosen = precisions()
    assert chosen and highest not in chosen, chosen
