"""The linear family (rnn2jax/ops/linear.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: FC, FCTransposed, MatMul, BatchMatMul and ElementwiseLinear against NumPy
references written from Caffe2's semantics (SEMANTICS.md section 4; fully_connected_op.h, matmul_op.h,
batch_matmul_op.h).

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the linear ops (FC,
FCTransposed, MatMul, BatchMatMul, ElementwiseLinear) and their gradients against real Caffe2.

Gradient ops against references and jax.vjp: Gradient ops of the linear family: FCGradient/FCTransposedGradient,
ElementwiseLinearGradient, and MatMul/BatchMatMul used as their own gradients (Caffe2's makers emit forward ops).
Each is checked against `jax.vjp` of the forward maths written here and, where it adds something, a NumPy reference
(SEMANTICS.md section 4; fully_connected_op.h, elementwise_linear_op.cc, matmul_op.cc).
"""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, assert_same_ops, cases, check_op, dims, invalid, run_case, run_rnn2jax
from helpers import run_op
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ops.gradient_makers import get_gradient_for_op

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_linear.py)

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


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_linear.py)

# Caffe2 refuses doubles here; rnn2jax accepts them on purpose (its float64 verification mode,
# rnn2jax/checking/verification.py), so they are not drawn: ints stand for the dtypes both refuse.
FLOATS = (np.float32,)


def _split(n: int, parts: int, data: st.DataObject) -> tuple[int, ...]:
    """Dims whose product is n: n itself and size-1 dims around it."""
    position = data.draw(st.integers(0, parts - 1))
    return tuple(n if i == position else 1 for i in range(parts))


# --------------------------------------------------------------------------------------------------
# FC / FCTransposed


def _fc(op_type: str):
    def draw(data: st.DataObject):
        dtype = data.draw(st.sampled_from((*FLOATS, np.int32) if invalid(data) else FLOATS))
        m, k, n = dims(0, 4), dims(1, 4), dims(1, 4)
        m, k, n = data.draw(m), data.draw(k), data.draw(n)
        if dtype != np.float32:  # an empty X skips Caffe2's type check (Y is float32 for any input type)
            m = max(m, 1)
        # X = [M as 1-2 dims] + [K as 1-2 dims], split at `axis` (positive or negative).
        x_lead = _split(m, data.draw(st.integers(1, 2)), data)
        x_tail = _split(k, data.draw(st.integers(1, 2)), data)
        x_shape = x_lead + x_tail
        axis = len(x_lead) - (len(x_shape) if data.draw(st.booleans()) else 0)
        w_n = _split(n, data.draw(st.integers(1, 2)), data)
        w_k = _split(k, data.draw(st.integers(1, 2)), data)
        w_shape, axis_w = (w_n + w_k, len(w_n)) if op_type == "FC" else (w_k + w_n, len(w_k))
        b_shape = (n,)
        if invalid(data):
            which = data.draw(st.sampled_from(["w", "b"]))
            if which == "w":
                w_shape = (*w_shape[:-1], w_shape[-1] + 1)
            else:
                b_shape = (n + 1,)
        args = {}
        if axis != 1 or data.draw(st.booleans()):
            args["axis"] = axis
        if axis_w != 1 or data.draw(st.booleans()):
            args["axis_w"] = axis_w
        op = create_operator(op_type, ["X", "W", "b"], ["Y"], **args)
        return op, {
            "X": data.draw(arrays(x_shape, dtype)),
            "W": data.draw(arrays(w_shape, dtype)),
            "b": data.draw(arrays(b_shape, dtype)),
        }

    return draw


# --------------------------------------------------------------------------------------------------
# MatMul


def _matmul_operand(data: st.DataObject, rows: int, cols: int, trans: bool, axis_one: bool):
    """A matrix `rows x cols` (`cols x rows` with trans) as an N-D array and its flattening axis."""
    r, c = (cols, rows) if trans else (rows, cols)
    lead = (r,) if axis_one else _split(r, data.draw(st.integers(1, 2)), data)
    tail = _split(c, data.draw(st.integers(1, 2)), data)
    shape = lead + tail
    axis = len(lead) - (len(shape) if data.draw(st.booleans()) and len(lead) == 1 and len(shape) == 2 else 0)
    return shape, axis


def draw_matmul(data: st.DataObject, axis_one: bool = True):
    """`axis_one`: the flattening axes are 1 (or -1 on matrices), the only ones whose gradient Caffe2's
    maker gets right (see test_matmul_gradient_other_axes)."""
    dtype = data.draw(st.sampled_from(FLOATS))
    m, k, n = data.draw(dims(0, 4)), data.draw(dims(1, 4)), data.draw(dims(1, 4))
    trans_a, trans_b = data.draw(st.booleans()), data.draw(st.booleans())
    a_shape, axis_a = _matmul_operand(data, m, k, trans_a, axis_one)
    b_shape, axis_b = _matmul_operand(data, k, n, trans_b, axis_one)
    if invalid(data):
        b_shape = (*b_shape[:-1], b_shape[-1] + 1) if trans_b else (b_shape[0] + 1, *b_shape[1:])
    args = {}
    for name, value, default in (
        ("trans_a", trans_a, 0),
        ("trans_b", trans_b, 0),
        ("axis_a", axis_a, 1),
        ("axis_b", axis_b, 1),
    ):
        if value != default or data.draw(st.booleans()):
            args[name] = int(value)
    op = create_operator("MatMul", ["A", "B"], ["Y"], **args)
    return op, {"A": data.draw(arrays(a_shape, dtype)), "B": data.draw(arrays(b_shape, dtype))}


@given(data=st.data())
def test_matmul_gradient_other_axes(caffe2, data):
    """Caffe2's MatMul maker reads `axis_a`/`axis_b` into C++ bools, so its gradient ops flatten at
    axis 1 whatever the forward axes were (matmul_op.cc GetMatMulGradient): with other axes they
    refuse the shapes or compute something else. The builder emits the same ops (compared byte for
    byte), and rnn2jax runs each of them as Caffe2 does."""
    op, inputs = draw_matmul(data, axis_one=False)
    want = check_op(caffe2, op, inputs)
    if want is None:
        return
    g_out = {"Y_grad": np.random.default_rng(0).standard_normal(want["Y"].shape).astype(want["Y"].dtype)}
    c2_ops, _ = caffe2.gradient_for_op(op, ["Y_grad"])
    assert_same_ops(get_gradient_for_op(op, ["Y_grad"])[0], c2_ops)
    for grad_op in c2_ops:
        check_op(caffe2, grad_op, {**inputs, **g_out})


# --------------------------------------------------------------------------------------------------
# BatchMatMul


def draw_batch_matmul(data: st.DataObject):
    dtype = data.draw(st.sampled_from(FLOATS))
    broadcast = data.draw(st.booleans())
    trans_a, trans_b = data.draw(st.booleans()), data.draw(st.booleans())
    m, k, n = data.draw(dims(0, 3)), data.draw(dims(1, 3)), data.draw(dims(1, 3))
    batch = tuple(data.draw(st.lists(dims(0, 3), max_size=2)))
    a_mat = (k, m) if trans_a else (m, k)
    b_mat = (n, k) if trans_b else (k, n)
    if broadcast:
        # numpy.matmul: batch dims broadcast (some 1 or missing), and 1-D operands are vectors
        a_batch = tuple(d if data.draw(st.booleans()) else 1 for d in batch)[data.draw(st.integers(0, len(batch))) :]
        b_batch = tuple(d if data.draw(st.booleans()) else 1 for d in batch)[data.draw(st.integers(0, len(batch))) :]
        a_shape = (k,) if data.draw(st.integers(0, 4)) == 0 else a_batch + a_mat
        b_shape = (k,) if data.draw(st.integers(0, 4)) == 0 else b_batch + b_mat
        if (len(a_shape) == 1 or len(b_shape) == 1) and 0 in a_shape + b_shape:
            a_shape, b_shape = (k,), (k,)  # Caffe2 crashes there: test_batch_matmul_empty_times_vector
        if trans_a and len(b_shape) == 1 and len(a_shape) > 1:
            trans_a = False  # Caffe2 sizes Y wrongly there: test_batch_matmul_transposed_matrix_times_vector
            a_shape = (*a_shape[:-2], a_shape[-1], a_shape[-2])
    else:
        a_shape, b_shape = batch + a_mat, batch + b_mat
    if invalid(data):
        if data.draw(st.booleans()) or len(b_shape) < 3:
            b_shape = (
                (*b_shape[:-1], b_shape[-1] + 1)
                if trans_b or len(b_shape) == 1
                else (*b_shape[:-2], b_shape[-2] + 1, b_shape[-1])
            )
        else:
            b_shape = (b_shape[0] + 2, *b_shape[1:])
    args = {}
    for name, value in (("trans_a", trans_a), ("trans_b", trans_b), ("broadcast", broadcast)):
        if value or data.draw(st.booleans()):
            args[name] = int(value)
    op = create_operator("BatchMatMul", ["A", "B"], ["Y"], **args)
    return op, {"A": data.draw(arrays(a_shape, dtype)), "B": data.draw(arrays(b_shape, dtype))}


# --------------------------------------------------------------------------------------------------
# ElementwiseLinear


def draw_elementwise_linear(data: st.DataObject):
    dtype = data.draw(st.sampled_from(FLOATS))
    shape = tuple(data.draw(st.lists(dims(0, 4), min_size=1, max_size=4)))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = math.prod(shape[axis:])
    a_shape, b_shape = (d,), (d,)
    if invalid(data):
        a_shape = (d + 1,) if data.draw(st.booleans()) else (1, d)
    args = {"axis": axis} if axis != 1 or data.draw(st.booleans()) else {}
    op = create_operator("ElementwiseLinear", ["X", "a", "b"], ["Y"], **args)
    return op, {
        "X": data.draw(arrays(shape, dtype)),
        "a": data.draw(arrays(a_shape, dtype)),
        "b": data.draw(arrays(b_shape, dtype)),
    }


@pytest.mark.parametrize(("a_shape", "b_shape", "args"), [((2, 0), (2,), {"trans_a": 1}), ((2,), (2, 0), {})])
def test_batch_matmul_empty_times_vector(a_shape, b_shape, args):
    """broadcast=1 with a vector and an empty matrix kills Caffe2's worker with SIGFPE (exit status -8)
    for A [2, 0] (trans_a=1) · B [2] and A [2] · B [2, 0] (while A [0, 2] · B [2] gives [0]). rnn2jax
    keeps numpy.matmul's meaning: an empty result."""
    op = create_operator("BatchMatMul", ["A", "B"], ["Y"], broadcast=1, **args)
    a, b = np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)
    want = np.matmul(a.T if args else a, b)
    got = run_rnn2jax([op], {"A": a, "B": b}, ["Y"])["Y"]
    assert got.shape == want.shape == (0,)


@pytest.mark.parametrize("a_shape", [(2, 1), (3, 2), (2, 3), (4, 3, 2)])
def test_batch_matmul_transposed_matrix_times_vector(caffe2, a_shape):
    """broadcast=1, trans_a=1, A [..., K, M] times a vector B [K]: Caffe2 sizes Y by K instead of M, so Y
    holds uninitialised memory past M (or is cut short). rnn2jax keeps numpy.matmul's meaning."""
    op = create_operator("BatchMatMul", ["A", "B"], ["Y"], broadcast=1, trans_a=1)
    a = np.arange(math.prod(a_shape), dtype=np.float32).reshape(a_shape)
    b = np.ones(a_shape[-2], np.float32)
    want = np.matmul(np.swapaxes(a, -1, -2), b)
    caffe2_y = caffe2.run_op(op, {"A": a, "B": b})["Y"]
    assert caffe2_y.shape[-1] == a_shape[-2] != want.shape[-1]  # the Caffe2 bug this pins
    np.testing.assert_allclose(run_rnn2jax([op], {"A": a, "B": b}, ["Y"])["Y"], want, rtol=1e-6)


CASES = cases(
    Case("FC", _fc("FC"), gradient_ops=("FCGradient",)),
    Case("FCTransposed", _fc("FCTransposed"), gradient_ops=("FCTransposedGradient",)),
    Case("MatMul", draw_matmul, gradient_ops=("MatMul",)),
    Case("BatchMatMul", draw_batch_matmul, gradient_ops=("BatchMatMul",)),
    Case("ElementwiseLinear", draw_elementwise_linear, gradient_ops=("ElementwiseLinearGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_linear(caffe2, case, data):
    run_case(caffe2, case, data)


# ----------------------------------------------------------------------------------------------------
# Gradient ops against references and jax.vjp (was tests/ops/test_linear.py)

# Sums of ~10 float32 products, compared with float64 NumPy or with XLA's own summation order.
TOL = {"rtol": 1e-5, "atol": 1e-5}
SEEDS_GRAD = st.integers(0, 2**32 - 1)
SIDES_GRAD = st.integers(1, 3)
HIGHEST = jax.lax.Precision.HIGHEST


def normal_grad(seed: int, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def vjp(fn, primals, cotangent):
    """The input gradients `fn`'s reverse mode gives for output gradient `cotangent`."""

    def pull(primals, cotangent):
        return jax.vjp(fn, *primals)[1](cotangent)

    return [np.asarray(g) for g in jax.jit(pull)(tuple(primals), cotangent)]


# --------------------------------------------------------------------------------------------------
# FCGradient / FCTransposedGradient


@st.composite
def fc_case_grad(draw, transposed: bool):
    """X, W shapes and axes for FC (W `N x K`) or FCTransposed (W `K x N`); K may be split over dims."""
    x_shape = tuple(draw(st.lists(SIDES_GRAD, min_size=1, max_size=4)))
    axis = draw(st.integers(0, len(x_shape) - 1))
    k = math.prod(x_shape[axis:])
    k_dims = draw(st.sampled_from([x_shape[axis:], (k,)]))
    n = draw(SIDES_GRAD)
    n_dims = draw(st.sampled_from([(n,), (1, n), (n, 1)]))
    w_shape = (*k_dims, *n_dims) if transposed else (*n_dims, *k_dims)
    axis_w = len(k_dims) if transposed else len(n_dims)
    if draw(st.booleans()):
        axis -= len(x_shape)
    if draw(st.booleans()):
        axis_w -= len(w_shape)
    return x_shape, w_shape, axis, axis_w, n


def fc_forward(axis: int, axis_w: int, transposed: bool):
    """FC's maths in jnp: X flattened `M x K` at axis, W `N x K` (or `K x N`) at axis_w."""

    def forward(x, w, b):
        ax, ax_w = axis % x.ndim, axis_w % w.ndim
        x2 = x.reshape(math.prod(x.shape[:ax]), -1)
        w2 = w.reshape(math.prod(w.shape[:ax_w]), -1)
        y = jnp.matmul(x2, w2 if transposed else w2.T, precision=HIGHEST) + b
        return y.reshape(*x.shape[:ax], b.shape[0])

    return forward


def fc_grad_reference(x, w, dy, axis, transposed):
    """dW = dYᵀX (XᵀdY transposed), db = Σ_rows dY, dX = dY·W (dY·Wᵀ), in float64."""
    axis %= x.ndim
    m = math.prod(x.shape[:axis])
    x2, dy2 = x.astype(np.float64).reshape(m, -1), dy.astype(np.float64).reshape(m, -1)
    w2 = w.astype(np.float64).reshape((-1, x2.shape[1]) if not transposed else (x2.shape[1], -1))
    dw = x2.T @ dy2 if transposed else dy2.T @ x2
    dx = dy2 @ (w2.T if transposed else w2)
    return dw.reshape(w.shape), dy2.sum(axis=0), dx.reshape(x.shape)


@pytest.mark.parametrize("op_type", ["FC", "FCTransposed"])
@given(data=st.data(), seed=SEEDS_GRAD)
def test_fc_gradient(jit, op_type, data, seed):
    transposed = op_type == "FCTransposed"
    x_shape, w_shape, axis, axis_w, n = data.draw(fc_case_grad(transposed))
    x, w, b = normal_grad(seed, x_shape, w_shape, (n,))
    y_shape = (*x_shape[: axis % len(x_shape)], n)
    (dy,) = normal_grad(seed + 1, y_shape)
    # The third output's name is whatever the gradient builder chose (often an _autosplit_ name).
    dw, db, dx = run_op(
        op_type + "Gradient",
        [x, w, dy],
        3,
        jit=jit,
        input_names=["x", "w", "y_grad"],
        output_names=["w_grad", "b_grad", "x_grad_autosplit_0"],
        axis=axis,
        axis_w=axis_w,
    )
    assert (dw.shape, db.shape, dx.shape) == (w.shape, b.shape, x.shape)
    assert dw.dtype == db.dtype == dx.dtype == np.float32
    vx, vw, vb = vjp(fc_forward(axis, axis_w, transposed), (x, w, b), dy)
    for got, want in ((dw, vw), (db, vb), (dx, vx)):
        np.testing.assert_allclose(got, want, **TOL)
    for got, want in zip((dw, db, dx), fc_grad_reference(x, w, dy, axis, transposed), strict=True):
        np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("op_type", ["FCGradient", "FCTransposedGradient"])
def test_fc_gradient_two_outputs_and_defaults(jit, op_type):
    """dX is optional (NumOutputs(2, 3)); axis and axis_w default to 1 (X [2,3,2] is 2 x 6)."""
    transposed = op_type == "FCTransposedGradient"
    x, w, b, dy = normal_grad(3, (2, 3, 2), (6, 4) if transposed else (4, 6), (4,), (2, 4))
    dw, db = run_op(op_type, [x, w, dy], 2, jit=jit)
    want_dx, want_dw, want_db = vjp(fc_forward(1, 1, transposed), (x, w, b), dy)
    np.testing.assert_allclose(dw, want_dw, **TOL)
    np.testing.assert_allclose(db, want_db, **TOL)
    (dx,) = run_op(op_type, [x, w, dy], 3, jit=jit, output_names=["a", "b", "dx"])[2:]
    np.testing.assert_allclose(dx, want_dx, **TOL)


@pytest.mark.parametrize("op_type", ["FCGradient", "FCTransposedGradient"])
@pytest.mark.parametrize(("x_shape", "n"), [((0, 3), 4), ((0, 2, 3), 2), ((3, 0), 2)])
def test_fc_gradient_empty_input_gives_zeros(jit, op_type, x_shape, n):
    """An empty X makes dW and db zero, even with K = 0 and a non-empty dY (Caffe2 skips the GEMMs)."""
    transposed = op_type == "FCTransposedGradient"
    k = math.prod(x_shape[1:])
    x, dy = np.zeros(x_shape, np.float32), np.ones((x_shape[0], n), np.float32)
    w = np.ones((k, n) if transposed else (n, k), np.float32)
    dw, db, dx = run_op(op_type, [x, w, dy], 3, jit=jit)
    np.testing.assert_array_equal(dw, np.zeros(w.shape, np.float32))
    np.testing.assert_array_equal(db, np.zeros((n,), np.float32))
    assert dx.shape == x_shape


@pytest.mark.parametrize(
    ("op_type", "shapes", "args", "match"),
    [
        ("FCGradient", [(2, 3), (4, 5), (2, 4)], {}, "weight 'w'.*K = 3"),
        ("FCTransposedGradient", [(2, 3), (4, 3), (2, 3)], {}, "weight 'w'"),
        ("FCGradient", [(2, 3), (4, 3), (2, 5)], {}, "output gradient 'dy'"),
        ("FCGradient", [(2, 3), (4, 3), (3, 4)], {}, "output gradient 'dy'"),
        ("FCGradient", [(2, 3), (4, 3), (2, 4)], {"axis": 2}, "axis 2 is out of range"),
        ("FCGradient", [(2, 3), (4, 3), (2, 4)], {"axis_w": -3}, "axis_w -3 is out of range"),
    ],
)
def test_fc_gradient_bad_shapes(jit, op_type, shapes, args, match):
    arrays = normal_grad(0, *shapes)
    with pytest.raises(ShapeError, match=match):
        run_op(op_type, arrays, 3, jit=jit, input_names=["x", "w", "dy"], **args)


def test_fc_gradient_rejects_int_and_bad_argument(jit):
    x, w, dy = normal_grad(0, (2, 3), (4, 3), (2, 4))
    with pytest.raises(ShapeError, match="FCGradient needs a float tensor"):
        run_op("FCGradient", [x.astype(np.int32), w, dy], 3, jit=jit)
    with pytest.raises(BadArgumentError, match="'axis' must be an integer"):
        run_op("FCGradient", [x, w, dy], 3, jit=jit, axis=1.5)


def test_fc_gradient_takes_two_or_three_outputs(jit):
    x, w, dy = normal_grad(0, (2, 3), (4, 3), (2, 4))
    with pytest.raises(BadArgumentError, match="2 to 3 outputs"):
        run_op("FCGradient", [x, w, dy], 1, jit=jit)


# --------------------------------------------------------------------------------------------------
# MatMul: its gradient maker emits MatMul ops (there is no MatMulGradient op in Caffe2)


def matmul_forward(trans_a: bool, trans_b: bool):
    """MatMul's maths: A and B flattened at axis 1, optionally transposed, multiplied."""

    def forward(a, b):
        a2, b2 = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
        return jnp.matmul(a2.T if trans_a else a2, b2.T if trans_b else b2, precision=HIGHEST)

    return forward


# GetMatMulGradient: (inputs of the dA op, its args), (inputs of the dB op, its args); G is the
# output gradient. Newer makers add the input itself as a third input ("resize like").
MATMUL_MAKER = {
    (False, False): ((("G", "B"), {"trans_b": 1}), (("A", "G"), {"trans_a": 1})),
    (False, True): ((("G", "B"), {}), (("G", "A"), {"trans_a": 1})),
    (True, False): ((("B", "G"), {"trans_b": 1}), (("A", "G"), {})),
    (True, True): ((("B", "G"), {"trans_a": 1, "trans_b": 1}), (("G", "A"), {"trans_a": 1, "trans_b": 1})),
}


@given(
    m=SIDES_GRAD,
    k=st.sampled_from([(1,), (3,), (2, 2)]),
    n=SIDES_GRAD,
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    like=st.booleans(),
    seed=SEEDS_GRAD,
)
def test_matmul_as_its_own_gradient(jit, m, k, n, trans_a, trans_b, like, seed):
    """K is split over dims, so with the third input the result must be reshaped back to A/B."""
    a_shape = (math.prod(k), m) if trans_a else (m, *k)
    b_shape = (n, *k) if trans_b else (math.prod(k), n)
    if not like:  # the older maker gives 2-D results: use 2-D operands
        a_shape = (a_shape[0], math.prod(a_shape[1:]))
        b_shape = (b_shape[0], math.prod(b_shape[1:]))
    a, b, g = normal_grad(seed, a_shape, b_shape, (m, n))
    blobs = {"A": a, "B": b, "G": g}
    want = vjp(matmul_forward(trans_a, trans_b), (a, b), g)
    for (names, args), target, expected in zip(MATMUL_MAKER[trans_a, trans_b], (a, b), want, strict=True):
        inputs = [blobs[name] for name in names] + ([target] if like else [])
        (got,) = run_op("MatMul", inputs, jit=jit, **args)
        assert got.shape == target.shape
        np.testing.assert_allclose(got, expected, **TOL)


# --------------------------------------------------------------------------------------------------
# BatchMatMul: its gradient maker emits BatchMatMul ops (broadcast=0 only)

BMM_MAKER = {
    (False, False): ((("G", "B"), {"trans_b": 1}), (("A", "G"), {"trans_a": 1})),
    (True, False): ((("B", "G"), {"trans_b": 1}), (("A", "G"), {})),
    (False, True): ((("G", "B"), {}), (("G", "A"), {"trans_a": 1})),
    (True, True): ((("B", "G"), {"trans_a": 1, "trans_b": 1}), (("G", "A"), {"trans_a": 1, "trans_b": 1})),
}


@given(
    batch=st.lists(SIDES_GRAD, max_size=2),
    m=SIDES_GRAD,
    k=SIDES_GRAD,
    n=SIDES_GRAD,
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    seed=SEEDS_GRAD,
)
def test_batch_matmul_as_its_own_gradient(jit, batch, m, k, n, trans_a, trans_b, seed):
    a_shape = (*batch, *((k, m) if trans_a else (m, k)))
    b_shape = (*batch, *((n, k) if trans_b else (k, n)))
    a, b, g = normal_grad(seed, a_shape, b_shape, (*batch, m, n))

    def forward(a, b):
        a_op = jnp.swapaxes(a, -1, -2) if trans_a else a
        b_op = jnp.swapaxes(b, -1, -2) if trans_b else b
        return jnp.matmul(a_op, b_op, precision=HIGHEST)

    blobs = {"A": a, "B": b, "G": g}
    want = vjp(forward, (a, b), g)
    for (names, args), target, expected in zip(BMM_MAKER[trans_a, trans_b], (a, b), want, strict=True):
        (got,) = run_op("BatchMatMul", [blobs[name] for name in names], jit=jit, **args)
        assert got.shape == target.shape
        np.testing.assert_allclose(got, expected, **TOL)


# --------------------------------------------------------------------------------------------------
# ElementwiseLinearGradient


@given(shape=st.lists(SIDES_GRAD, min_size=1, max_size=4), data=st.data(), seed=SEEDS_GRAD)
def test_elementwise_linear_gradient(jit, shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = math.prod(shape[axis % len(shape) :])
    x, a, b, dy = normal_grad(seed, shape, (d,), (d,), shape)
    dx, da, db = run_op("ElementwiseLinearGradient", [dy, x, a], 3, jit=jit, axis=axis)
    assert (dx.shape, da.shape, db.shape) == (x.shape, (d,), (d,))

    def forward(x, a, b):
        return (x.reshape(-1, d) * a + b).reshape(x.shape)

    want = vjp(forward, (x, a, b), dy)
    for got, expected in zip((dx, da, db), want, strict=True):
        np.testing.assert_allclose(got, expected, **TOL)
    x2, dy2 = x.astype(np.float64).reshape(-1, d), dy.astype(np.float64).reshape(-1, d)
    np.testing.assert_allclose(dx, (dy2 * a).reshape(shape), **TOL)
    np.testing.assert_allclose(da, (dy2 * x2).sum(axis=0), **TOL)
    np.testing.assert_allclose(db, dy2.sum(axis=0), **TOL)


def test_elementwise_linear_gradient_default_axis(jit):
    x, a, dy = normal_grad(5, (2, 3, 2), (6,), (2, 3, 2))
    dx, da, db = run_op("ElementwiseLinearGradient", [dy, x, a], 3, jit=jit)
    dy2, x2 = dy.reshape(2, 6), x.reshape(2, 6)
    np.testing.assert_allclose(dx, (dy2 * a).reshape(x.shape), **TOL)
    np.testing.assert_allclose(da, (dy2 * x2).sum(axis=0), **TOL)
    np.testing.assert_allclose(db, dy2.sum(axis=0), **TOL)


@pytest.mark.parametrize(
    ("shapes", "args", "match"),
    [
        ([(2, 3), (2, 3), (2,)], {}, "'a' must be 1-D \\[3\\]"),
        ([(2, 3), (2, 3), (1, 3)], {}, "'a' must be 1-D"),
        ([(3, 2), (2, 3), (3,)], {"axis": 1}, None),  # same size: read as flat N x D, like Caffe2
        ([(2, 4), (2, 3), (3,)], {}, "output gradient 'dy'"),
        ([(2, 3), (2, 3), (3,)], {"axis": 2}, "axis 2 is out of range"),
    ],
)
def test_elementwise_linear_gradient_shapes(jit, shapes, args, match):
    dy, x, a = normal_grad(0, *shapes)
    names = ["dy", "x", "a"]
    if match is None:
        dx, _, _ = run_op("ElementwiseLinearGradient", [dy, x, a], 3, jit=jit, input_names=names, **args)
        np.testing.assert_allclose(dx, dy.reshape(x.shape) * a, **TOL)
        return
    with pytest.raises(ShapeError, match=match):
        run_op("ElementwiseLinearGradient", [dy, x, a], 3, jit=jit, input_names=names, **args)
