"""Gradient ops of the elementwise family: AddGradient/SubGradient/MulGradient/DivGradient in both
broadcast modes, the pre-2018 forms (SumReduceLike, Negative, Mul and the 3-input DivGradient) and
Scale as its own gradient. Checked against `jax.vjp` of the forward maths written here and NumPy
references of the reductions (SEMANTICS.md section 4; elementwise_ops.h/.cc, elementwise_ops_utils.cc,
elementwise_{add,mul,div}_op.*)."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import run_op
from rnn2jax.errors import BadArgumentError, ShapeError

TOL = {"rtol": 1e-5, "atol": 1e-5}
SEEDS = st.integers(0, 2**32 - 1)
BINARY = ["Add", "Sub", "Mul", "Div"]
FORWARD = {"Add": jnp.add, "Sub": jnp.subtract, "Mul": jnp.multiply, "Div": jnp.divide}


def normal(seed: int, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def away_from_zero(x: np.ndarray) -> np.ndarray:
    return (np.sign(x) + (x == 0) + x).astype(x.dtype)  # |x| >= 1: a tame divisor


def vjp(fn, primals, cotangent):
    """The input gradients `fn`'s reverse mode gives for output gradient `cotangent` (one compile)."""

    def pull(primals, cotangent):
        return jax.vjp(fn, *primals)[1](cotangent)

    return [np.asarray(g) for g in jax.jit(pull)(tuple(primals), cotangent)]


def gradient_inputs(op_type: str, dc, a, b, c):
    """The maker's input layout: (GO, I0, I1), and O0 last for Div."""
    return [dc, a, b, c] if op_type == "Div" else [dc, a, b]


def reduce_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """NumPy reference of the numpy-mode reduction: sum the extra leading dims, then every dim where
    `shape` has 1 and g has more."""
    g = g.astype(np.float64).sum(axis=tuple(range(g.ndim - len(shape))))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape)


def elementwise_grads(op_type: str, dc, a, b, c):
    """The elementwise derivatives, before any reduction (float64)."""
    dc, a, b = (x.astype(np.float64) for x in (dc, a, b))
    return {
        "Add": (dc, dc),
        "Sub": (dc, -dc),
        "Mul": (dc * b, dc * a),
        "Div": (dc / b, -dc * c / b),
    }[op_type]


# --------------------------------------------------------------------------------------------------
# broadcast=0: numpy broadcasting, reduced back over the broadcast dims


@st.composite
def numpy_shapes(draw):
    """Two shapes that broadcast: each dim of the shorter one is the other's dim or 1."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3))
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, base_shape=shape, max_side=3))
    return shapes.input_shapes


@given(op_type=st.sampled_from(BINARY), shapes=numpy_shapes(), seed=SEEDS)
def test_binary_gradient_numpy_broadcast(jit, op_type, shapes, seed):
    a_shape, b_shape = shapes
    c_shape = np.broadcast_shapes(a_shape, b_shape)
    a, b, dc = normal(seed, a_shape, b_shape, c_shape)
    if op_type == "Div":
        b = away_from_zero(b)
    c = np.asarray(FORWARD[op_type](a, b))
    da, db = run_op(op_type + "Gradient", gradient_inputs(op_type, dc, a, b, c), 2, jit=jit)
    assert (da.shape, db.shape) == (a.shape, b.shape)
    assert da.dtype == db.dtype == np.float32
    want = vjp(FORWARD[op_type], (a, b), dc)
    for got, expected in zip((da, db), want, strict=True):
        np.testing.assert_allclose(got, expected, **TOL)
    ga, gb = elementwise_grads(op_type, dc, a, b, c)
    np.testing.assert_allclose(da, reduce_to(np.broadcast_to(ga, c_shape), a.shape), **TOL)
    np.testing.assert_allclose(db, reduce_to(np.broadcast_to(gb, c_shape), b.shape), **TOL)


def test_binary_gradient_ignores_axis_without_broadcast(jit):
    a, b, dc = normal(2, (2, 3), (3,), (2, 3))
    da, db = run_op("MulGradient", [dc, a, b], 2, jit=jit, axis=0, axis_str="", order="NCHW")
    np.testing.assert_allclose(da, dc * b, **TOL)
    np.testing.assert_allclose(db, (dc * a).sum(axis=0), **TOL)


# --------------------------------------------------------------------------------------------------
# broadcast=1: legacy pre x n x post, dB reduced over pre and post


@st.composite
def legacy_case(draw):
    """A's shape, and B = a contiguous block of A's dims padded with size-1 dims, with its axis."""
    a_shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    first = draw(st.integers(0, len(a_shape) - 1))
    last = draw(st.integers(first, len(a_shape) - 1))
    lead = draw(st.integers(0, first))
    trail = draw(st.integers(0, len(a_shape) - 1 - last))
    b_shape = [1] * lead + a_shape[first : last + 1] + [1] * trail
    axis = first - lead
    if axis == len(a_shape) - len(b_shape) and draw(st.booleans()):
        axis = -1  # the default: B matches A's trailing dims
    return tuple(a_shape), tuple(b_shape), axis


def pre_n_post(a_shape, b_shape, axis) -> tuple[int, int, int]:
    """ComputeLegacyBroadcastSizes, written out: B's outer 1s stripped, the rest placed in A."""
    if math.prod(b_shape) == 1:
        return 1, 1, math.prod(a_shape)  # a scalar B: everything reduces to one value
    if axis == -1:
        axis = len(a_shape) - len(b_shape)
    start = next(i for i, d in enumerate(b_shape) if d != 1)
    end = len(b_shape) - next(i for i, d in enumerate(reversed(b_shape)) if d != 1)
    first = axis + start
    last = axis + end
    return math.prod(a_shape[:first]), math.prod(b_shape[start:end]), math.prod(a_shape[last:])


def legacy_forward(op_type: str, a_shape, b_shape, axis):
    """The forward op in legacy mode: B, seen as n, repeated over A's pre and post."""
    pre, n, post = pre_n_post(a_shape, b_shape, axis)

    def forward(a, b):
        c = FORWARD[op_type](a.reshape(pre, n, post), b.reshape(1, n, 1) if n > 1 else b.reshape(()))
        return c.reshape(a.shape)

    return forward


@given(op_type=st.sampled_from(BINARY), case=legacy_case(), seed=SEEDS)
def test_binary_gradient_legacy_broadcast(jit, op_type, case, seed):
    a_shape, b_shape, axis = case
    a, b, dc = normal(seed, a_shape, b_shape, a_shape)
    if op_type == "Div":
        b = away_from_zero(b)
    forward = legacy_forward(op_type, a_shape, b_shape, axis)
    c = np.asarray(forward(a, b))
    args = {"broadcast": 1} | ({} if axis == -1 else {"axis": axis})
    da, db = run_op(op_type + "Gradient", gradient_inputs(op_type, dc, a, b, c), 2, jit=jit, **args)
    assert (da.shape, db.shape) == (a.shape, b.shape)
    want = vjp(forward, (a, b), dc)
    for got, expected in zip((da, db), want, strict=True):
        np.testing.assert_allclose(got, expected, **TOL)
    pre, n, post = pre_n_post(a_shape, b_shape, axis)
    b_block = b.reshape(1, n, 1) if n > 1 else b.reshape(())
    ga, gb = elementwise_grads(
        op_type, dc.reshape(pre, n, post), a.reshape(pre, n, post), b_block, c.reshape(pre, n, post)
    )
    np.testing.assert_allclose(
        db, np.broadcast_to(gb, (pre, n, post)).sum(axis=(0, 2)).reshape(b.shape), **TOL
    )
    np.testing.assert_allclose(da, np.broadcast_to(ga, (pre, n, post)).reshape(a.shape), **TOL)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "args", "reduce"),
    [
        ((3, 2, 4), (2, 4), {}, (0,)),  # (L,B,E)+(B,E)
        ((1, 2, 3), (2,), {"axis": 1}, (0, 2)),  # (1,B,H)·(B,)
        ((3, 2, 4), (3, 2), {"axis": 0}, (2,)),  # (L,B,E)·(L,B)
        ((1, 2, 8), (8,), {"axis": -1}, (0, 1)),  # (1,N,4H)·(4H,)
        ((2, 3, 4, 5), (3,), {"axis_str": "C"}, (0, 2, 3)),
        ((2, 4, 5, 3), (3,), {"axis_str": "C", "order": "NHWC"}, (0, 1, 2)),
        ((2, 3, 4), (1, 3, 1), {"axis": 0}, (0, 2)),
        ((2, 3), (1, 1), {}, (0, 1)),  # one element: a scalar
    ],
)
def test_mul_gradient_legacy_rnn_shapes(jit, a_shape, b_shape, args, reduce):
    a, b, dc = normal(4, a_shape, b_shape, a_shape)
    da, db = run_op("MulGradient", [dc, a, b], 2, jit=jit, broadcast=1, **args)
    b_view = b.reshape([1 if i in reduce else a_shape[i] for i in range(len(a_shape))])
    np.testing.assert_allclose(da, dc * b_view, **TOL)
    np.testing.assert_allclose(db, (dc * a).astype(np.float64).sum(axis=reduce).reshape(b.shape), **TOL)


# --------------------------------------------------------------------------------------------------
# int types, the old DivGradient layout, errors


def test_int_gradients(jit):
    """Integers stay integers; Div's gradient truncates toward zero at each element, as in C++."""
    a = np.array([[7, -7, 5], [3, 0, -9]], np.int32)
    b = np.array([2, -3, 4], np.int32)
    dc = np.array([[5, 1, -3], [2, -6, 7]], np.int32)
    da, db = run_op("MulGradient", [dc, a, b], 2, jit=jit)
    assert da.dtype == db.dtype == np.int32
    np.testing.assert_array_equal(da, dc * b)
    np.testing.assert_array_equal(db, (dc * a).sum(axis=0))
    c = np.trunc(a / b).astype(np.int32)
    da, db = run_op("DivGradient", [dc, a, b, c], 2, jit=jit)
    np.testing.assert_array_equal(da, np.trunc(dc / b).astype(np.int32))
    np.testing.assert_array_equal(db, np.trunc(-dc * c / b).astype(np.int32).sum(axis=0))
    da, db = run_op("SubGradient", [dc, a, b], 2, jit=jit, broadcast=1)
    np.testing.assert_array_equal(db, -dc.sum(axis=0))


@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), seed=SEEDS)
def test_old_div_gradient_layout(jit, shape, seed):
    """Pre-2018 maker: DivGradient(B, C, dC) -> (dA, dB), same shapes (no broadcast)."""
    a, b, dc = normal(seed, shape, shape, shape)
    b = away_from_zero(b)
    c = a / b
    da, db = run_op("DivGradient", [b, c, dc], 2, jit=jit)
    want_da, want_db = vjp(jnp.divide, (a, b), dc)
    np.testing.assert_allclose(da, want_da, **TOL)
    np.testing.assert_allclose(db, want_db, **TOL)


def test_old_div_gradient_layout_broadcast(jit):
    """The 3-input form honours broadcast args too, with A's shape taken from C."""
    a, b, dc = normal(6, (2, 3, 4), (3,), (2, 3, 4))
    b = away_from_zero(b)
    c = a / b[:, None]
    da, db = run_op("DivGradient", [b, c, dc], 2, jit=jit, broadcast=1, axis=1)
    np.testing.assert_allclose(da, dc / b[:, None], **TOL)
    np.testing.assert_allclose(db, (-dc * c / b[:, None]).sum(axis=(0, 2)), **TOL)


@pytest.mark.parametrize(
    ("op_type", "shapes", "args", "match"),
    [
        ("AddGradient", [(2, 3), (2, 3), (2,)], {}, "'a' \\[2, 3\\] and 'b' \\[2\\] do not broadcast"),
        ("MulGradient", [(2, 3), (2, 3), (2,)], {"broadcast": 1}, "'b' \\[2\\] does not match 'a'"),
        ("SubGradient", [(2, 4), (2, 3), (3,)], {}, "output gradient 'dc'"),
        ("MulGradient", [(3,), (2, 3), (3,)], {"broadcast": 1}, "output gradient 'dc'"),
        ("DivGradient", [(2, 3), (2, 3), (3,), (3,)], {}, "output 'c'"),
    ],
)
def test_binary_gradient_bad_shapes(jit, op_type, shapes, args, match):
    arrays = normal(0, *shapes)
    names = ["dc", "a", "b", "c"][: len(arrays)]
    with pytest.raises(ShapeError, match=match):
        run_op(op_type, arrays, 2, jit=jit, input_names=names, **args)


def test_old_div_gradient_bad_shapes(jit):
    b, c, dc = normal(0, (3,), (2, 3), (2, 2))
    with pytest.raises(ShapeError, match="output gradient 'dc'"):
        run_op("DivGradient", [b, c, dc], 2, jit=jit, input_names=["b", "c", "dc"])


def test_binary_gradient_bad_dtypes_and_arguments(jit):
    a, b, dc = normal(0, (2, 3), (3,), (2, 3))
    with pytest.raises(ShapeError, match="inputs must share one dtype"):
        run_op("AddGradient", [dc, a.astype(np.int32), b], 2, jit=jit)
    with pytest.raises(ShapeError, match="dtype bool"):
        run_op("MulGradient", [dc > 0, a > 0, b > 0], 2, jit=jit)
    with pytest.raises(BadArgumentError, match="cannot be used together"):
        run_op("AddGradient", [dc, a, b], 2, jit=jit, broadcast=1, axis=1, axis_str="C")
    with pytest.raises(BadArgumentError, match="takes 3 inputs"):
        run_op("MulGradient", [dc, a, b, dc], 2, jit=jit)


# --------------------------------------------------------------------------------------------------
# Pre-2018 forms: SumReduceLike, Negative + SumReduceLike, Mul with broadcast


@given(case=legacy_case(), seed=SEEDS, as_str=st.booleans())
def test_sum_reduce_like(jit, case, seed, as_str):
    a_shape, b_shape, axis = case
    a, b = normal(seed, a_shape, b_shape)
    args = {} if axis == -1 else {"axis": axis}
    if as_str and 0 <= axis < 4:  # the same axis given semantically, as axis_str + order
        args = {"axis_str": "NCHW"[axis], "order": "NCHW"}
    (y,) = run_op("SumReduceLike", [a, b], jit=jit, **args)
    assert y.shape == b.shape and y.dtype == np.float32
    pre, n, post = pre_n_post(a_shape, b_shape, axis)
    want = a.astype(np.float64).reshape(pre, n, post).sum(axis=(0, 2)).reshape(b.shape)
    np.testing.assert_allclose(y, want, **TOL)


def test_sum_reduce_like_examples(jit):
    """The schema's examples; B's values and dtype are not read, only its shape; `broadcast` (copied
    from the forward op by old makers) is ignored."""
    (a,) = normal(7, (2, 3, 4, 5))
    cases = [
        ((4, 5), {}, (0, 1)),
        ((1,), {}, (0, 1, 2, 3)),
        ((3, 4), {"axis": 1}, (0, 3)),
        ((2,), {"axis": 0}, (1, 2, 3)),
    ]
    for b_shape, args, axes in cases:
        b = np.zeros(b_shape, np.int32)
        (y,) = run_op("SumReduceLike", [a, b], jit=jit, broadcast=1, **args)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, a.sum(axis=axes).reshape(b_shape), **TOL)


@pytest.mark.parametrize(
    ("shapes", "args", "error", "match"),
    [
        ([(2, 3), (2,)], {}, ShapeError, "mismatch"),
        ([(2, 3), (3,)], {"axis": 2}, ShapeError, "outside"),
        ([(2, 3), (2, 2, 3)], {}, ShapeError, "more dims"),
        ([(2, 3), (3,)], {"axis": 1, "axis_str": "C"}, BadArgumentError, "cannot be used together"),
        ([(2, 3), (3,)], {"axis_str": "Q"}, BadArgumentError, "axis_str"),
    ],
)
def test_sum_reduce_like_bad(jit, shapes, args, error, match):
    a, b = normal(0, *shapes)
    with pytest.raises(error, match=match):
        run_op("SumReduceLike", [a, b], jit=jit, **args)


def test_sum_reduce_like_rejects_ints(jit):
    a = np.ones((2, 3), np.int32)
    with pytest.raises(ShapeError, match="float and double"):
        run_op("SumReduceLike", [a, a[0]], jit=jit)


@given(case=legacy_case(), seed=SEEDS)
def test_old_broadcast_gradient_nets(jit, case, seed):
    """The pre-2018 Mul maker's ops give the forward op's gradients: Mul(GO, B) {broadcast=1, axis,
    axis_str="", order} -> dA, Mul(GO, A) -> pre_red, SumReduceLike(pre_red, B) {axis, axis_str,
    order} -> dB. (The maker spells out axis_str and order even when the forward op had none.)"""
    a_shape, b_shape, axis = case
    a, b, go = normal(seed, a_shape, b_shape, a_shape)
    reduce_args = {"axis": axis, "axis_str": "", "order": "NCHW"}
    (da,) = run_op("Mul", [go, b], jit=jit, broadcast=1, **reduce_args)
    (pre_red,) = run_op("Mul", [go, a], jit=jit)
    (db,) = run_op("SumReduceLike", [pre_red, b], jit=jit, **reduce_args)
    want_da, want_db = vjp(legacy_forward("Mul", a_shape, b_shape, axis), (a, b), go)
    np.testing.assert_allclose(da, want_da, **TOL)
    np.testing.assert_allclose(db, want_db, **TOL)


def test_old_sub_gradient_net(jit):
    """Sub with broadcast: Negative(GO) -> pre_red, SumReduceLike(pre_red, B) {axis, ...} -> dB;
    Add is the same without the Negative."""
    a, b, go = normal(8, (3, 2, 4), (3, 2), (3, 2, 4))
    (pre_red,) = run_op("Negative", [go], jit=jit)
    (db,) = run_op("SumReduceLike", [pre_red, b], jit=jit, axis=0, axis_str="", order="NCHW")
    (want,) = vjp(lambda b: jnp.subtract(a, b[:, :, None]), (b,), go)
    np.testing.assert_allclose(db, want, **TOL)


# --------------------------------------------------------------------------------------------------
# Scale is its own gradient


@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), factor=st.floats(-4, 4, width=32), seed=SEEDS
)
def test_scale_as_its_own_gradient(jit, shape, factor, seed):
    """Scale(GO) -> GI with the forward `scale` (given once here: see the report on duplicates)."""
    x, go = normal(seed, shape, shape)
    (gi,) = run_op("Scale", [go], jit=jit, scale=factor)
    (want,) = vjp(lambda x: x * np.float32(factor), (x,), go)
    np.testing.assert_allclose(gi, want, rtol=1e-6, atol=0)
