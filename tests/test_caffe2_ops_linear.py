"""Differential tests of the linear ops (FC, FCTransposed, MatMul, BatchMatMul, ElementwiseLinear) and
their gradients against real Caffe2."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, assert_same_ops, cases, check_op, dims, invalid, run_case, run_rnn2jax
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.ops.gradient_makers import get_gradient_for_op

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
