"""Gradient ops of the linear family: FCGradient/FCTransposedGradient, ElementwiseLinearGradient, and
MatMul/BatchMatMul used as their own gradients (Caffe2's makers emit forward ops). Each is checked
against `jax.vjp` of the forward maths written here and, where it adds something, a NumPy reference
(SEMANTICS.md section 4; fully_connected_op.h, elementwise_linear_op.cc, matmul_op.cc)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError

# Sums of ~10 float32 products, compared with float64 NumPy or with XLA's own summation order.
TOL = {"rtol": 1e-5, "atol": 1e-5}
SEEDS = st.integers(0, 2**32 - 1)
SIDES = st.integers(1, 3)
HIGHEST = jax.lax.Precision.HIGHEST


def normal(seed: int, *shapes):
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
def fc_case(draw, transposed: bool):
    """X, W shapes and axes for FC (W `N x K`) or FCTransposed (W `K x N`); K may be split over dims."""
    x_shape = tuple(draw(st.lists(SIDES, min_size=1, max_size=4)))
    axis = draw(st.integers(0, len(x_shape) - 1))
    k = math.prod(x_shape[axis:])
    k_dims = draw(st.sampled_from([x_shape[axis:], (k,)]))
    n = draw(SIDES)
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
@given(data=st.data(), seed=SEEDS)
def test_fc_gradient(jit, op_type, data, seed):
    transposed = op_type == "FCTransposed"
    x_shape, w_shape, axis, axis_w, n = data.draw(fc_case(transposed))
    x, w, b = normal(seed, x_shape, w_shape, (n,))
    y_shape = (*x_shape[: axis % len(x_shape)], n)
    (dy,) = normal(seed + 1, y_shape)
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
    x, w, b, dy = normal(3, (2, 3, 2), (6, 4) if transposed else (4, 6), (4,), (2, 4))
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
    arrays = normal(0, *shapes)
    with pytest.raises(ShapeError, match=match):
        run_op(op_type, arrays, 3, jit=jit, input_names=["x", "w", "dy"], **args)


def test_fc_gradient_rejects_int_and_bad_argument(jit):
    x, w, dy = normal(0, (2, 3), (4, 3), (2, 4))
    with pytest.raises(ShapeError, match="FCGradient needs a float tensor"):
        run_op("FCGradient", [x.astype(np.int32), w, dy], 3, jit=jit)
    with pytest.raises(BadArgumentError, match="'axis' must be an integer"):
        run_op("FCGradient", [x, w, dy], 3, jit=jit, axis=1.5)


def test_fc_gradient_takes_two_or_three_outputs(jit):
    x, w, dy = normal(0, (2, 3), (4, 3), (2, 4))
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
    m=SIDES,
    k=st.sampled_from([(1,), (3,), (2, 2)]),
    n=SIDES,
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    like=st.booleans(),
    seed=SEEDS,
)
def test_matmul_as_its_own_gradient(jit, m, k, n, trans_a, trans_b, like, seed):
    """K is split over dims, so with the third input the result must be reshaped back to A/B."""
    a_shape = (math.prod(k), m) if trans_a else (m, *k)
    b_shape = (n, *k) if trans_b else (math.prod(k), n)
    if not like:  # the older maker gives 2-D results: use 2-D operands
        a_shape = (a_shape[0], math.prod(a_shape[1:]))
        b_shape = (b_shape[0], math.prod(b_shape[1:]))
    a, b, g = normal(seed, a_shape, b_shape, (m, n))
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
    batch=st.lists(SIDES, max_size=2),
    m=SIDES,
    k=SIDES,
    n=SIDES,
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    seed=SEEDS,
)
def test_batch_matmul_as_its_own_gradient(jit, batch, m, k, n, trans_a, trans_b, seed):
    a_shape = (*batch, *((k, m) if trans_a else (m, k)))
    b_shape = (*batch, *((n, k) if trans_b else (k, n)))
    a, b, g = normal(seed, a_shape, b_shape, (*batch, m, n))

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


@given(shape=st.lists(SIDES, min_size=1, max_size=4), data=st.data(), seed=SEEDS)
def test_elementwise_linear_gradient(jit, shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = math.prod(shape[axis % len(shape) :])
    x, a, b, dy = normal(seed, shape, (d,), (d,), shape)
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
    x, a, dy = normal(5, (2, 3, 2), (6,), (2, 3, 2))
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
    dy, x, a = normal(0, *shapes)
    names = ["dy", "x", "a"]
    if match is None:
        dx, _, _ = run_op("ElementwiseLinearGradient", [dy, x, a], 3, jit=jit, input_names=names, **args)
        np.testing.assert_allclose(dx, dy.reshape(x.shape) * a, **TOL)
        return
    with pytest.raises(ShapeError, match=match):
        run_op("ElementwiseLinearGradient", [dy, x, a], 3, jit=jit, input_names=names, **args)
