"""Gradients of the shape ops: SliceGradient, Gather's dense gradients, and the forward ops Caffe2's
gradient makers emit as gradients (Reshape, Transpose, Squeeze/ExpandDims, Split/Concat,
CopyOnDeviceLike, Cast), each checked against `jax.vjp` of the forward op and a NumPy reference."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import run_op
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import BadArgumentError, ShapeError
from rnn2jax.ir.dtypes import caffe2_dtypes
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower
from rnn2jax.proto import caffe2_pb2 as pb

# Half the examples for the slowest tests (each new shape compiles anew, eagerly too).
fewer_examples = settings(max_examples=max(1, settings().max_examples // 2))

small_shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)


def floats(shape) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, shape, elements=st.floats(-10, 10, width=32, allow_subnormal=False))


def forward(op_type: str, n_inputs: int, n_outputs: int = 1, **args):
    """The forward op as a JAX function of its inputs (for `jax.vjp`), returning its outputs."""
    ins, outs = [f"x{i}" for i in range(n_inputs)], [f"y{i}" for i in range(n_outputs)]
    lowered = lower(load(create_net("f", [create_operator(op_type, ins, outs, **args)])))
    return lambda *arrays: tuple(lowered(dict(zip(ins, arrays, strict=True)))[n] for n in outs)


def vjp(fn, primals, cotangents):
    """The gradients of `fn` (one output or a tuple of them) at `primals`, fed `cotangents`."""

    def outputs(*args):
        out = fn(*args)
        return out if isinstance(out, tuple) else (out,)

    def grads(primals, cotangents):
        return jax.vjp(outputs, *primals)[1](tuple(cotangents))

    with caffe2_dtypes():  # as rnn2jax runs: a float64 cotangent stays float64 at the jit's boundary
        return [np.asarray(g) for g in jax.jit(grads)(primals, cotangents)]


def check_vjp(jit: bool, got, fn, primals, cotangents, tolerance: float = 0.0) -> None:
    """`got` (the gradient op's outputs) must equal `jax.vjp` of the forward `fn`. The reference does
    not depend on how the gradient op ran, so it is computed once per example, in the jit run."""
    if not jit:
        return
    for g, r in zip(got, vjp(fn, primals, cotangents), strict=True):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=tolerance, atol=tolerance)


def run_net(ops, inputs: dict, outputs: list[str], jit: bool) -> list[np.ndarray]:
    """Run a forward op and its gradient op as one net (the gradient reads the forward's blobs)."""
    lowered = lower(load(create_net("t", ops)))

    def fn(env):
        out = lowered(env)
        return [out[n] for n in outputs]

    return [np.asarray(o) for o in (jax.jit(fn) if jit else fn)(inputs)]


# --------------------------------------------------------------------------------------------------
# SliceGradient


def slice_index(shape, starts, ends):
    """Caffe2's slice bounds as a NumPy index (None when Caffe2 would reject them)."""
    index = []
    for i, dim in enumerate(shape):
        if i >= len(starts) or dim == 0:
            index.append(slice(None))
            continue
        start, end = (v + dim + 1 if v < 0 else v for v in (starts[i], ends[i]))
        start, end = min(start, dim), min(end, dim)
        if start < 0 or end < start:
            return None
        kept = zip(index, shape[: len(index)], strict=True)
        whole = [i == slice(None) or (i.start, i.stop) == (0, d) for i, d in kept]
        if (start, end) != (0, dim) and not all(whole):  # real Caffe2 slices one dim at most
            return None
        index.append(slice(start, end))
    return tuple(index)


@st.composite
def slice_gradient_cases(draw):
    x = draw(floats(small_shapes))
    k = draw(st.integers(0, x.ndim))
    starts = [draw(st.integers(-5, 5)) for _ in range(k)]
    ends = [draw(st.integers(-5, 5)) for _ in range(k)]
    index = slice_index(x.shape, starts, ends)
    assume(index is not None)
    dy = draw(floats(x[index].shape))
    expected = np.zeros_like(x)
    expected[index] = dy
    return x, starts, ends, dy, expected


@given(case=slice_gradient_cases())
def test_slice_gradient_with_arguments(jit, case):
    x, starts, ends, dy, expected = case
    (dx,) = run_op("SliceGradient", [x, dy], jit=jit, starts=starts, ends=ends)
    assert dx.dtype == np.float32
    np.testing.assert_array_equal(dx, expected)
    check_vjp(jit, [dx], forward("Slice", 1, starts=starts, ends=ends), [x], [dy])


@given(case=slice_gradient_cases(), index_dtype=st.sampled_from([np.int32, np.int64]))
def test_slice_gradient_with_bound_inputs(jit, case, index_dtype):
    """The maker's 4-input form SliceGradient(I0, I1, I2, GO): the bounds must be concrete."""
    x, starts, ends, dy, expected = case
    inputs = [x, np.array(starts, index_dtype), np.array(ends, index_dtype), dy]
    if jit:
        with pytest.raises(ShapeError, match="traced"):
            run_op("SliceGradient", inputs, jit=jit)
        return
    (dx,) = run_op("SliceGradient", inputs, jit=jit)
    np.testing.assert_array_equal(dx, expected)


def test_slice_gradient_after_slice_in_one_net(jit):
    """Forward Slice and its gradient in one net, the data fed (under jit: traced)."""
    ops = [
        create_operator("Slice", ["x"], ["y"], starts=[0, 1], ends=[-1, -2]),
        create_operator("SliceGradient", ["x", "dy"], ["dx"], starts=[0, 1], ends=[-1, -2]),
    ]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    dy = np.ones((3, 2), np.float32)
    y, dx = run_net(ops, {"x": x, "dy": dy}, ["y", "dx"], jit)
    np.testing.assert_array_equal(y, x[:, 1:3])
    np.testing.assert_array_equal(dx, [[0, 1, 1, 0]] * 3)
    # Bounds as blobs written by fill ops stay concrete under jit: the maker's 4-input form works.
    ops = [
        create_operator("GivenTensorIntFill", [], ["s"], shape=[2], values=[0, 1]),
        create_operator("GivenTensorIntFill", [], ["e"], shape=[2], values=[-1, -2]),
        create_operator("Slice", ["x", "s", "e"], ["y"]),
        create_operator("SliceGradient", ["x", "s", "e", "dy"], ["dx"], is_gradient_op=True),
    ]
    y, dx = run_net(ops, {"x": x, "dy": dy}, ["y", "dx"], jit)
    np.testing.assert_array_equal(y, x[:, 1:3])
    np.testing.assert_array_equal(dx, [[0, 1, 1, 0]] * 3)


def test_slice_gradient_keeps_dy_dtype_and_empty_data(jit):
    x = np.zeros((2, 5), np.float32)
    (dx,) = run_op("SliceGradient", [x, np.full((2, 2), 3, np.int32)], jit=jit, starts=[0, 2], ends=[-1, 4])
    assert dx.dtype == np.int32
    np.testing.assert_array_equal(dx, [[0, 0, 3, 3, 0]] * 2)
    (dx,) = run_op("SliceGradient", [np.zeros((0, 3), np.float32), np.zeros((0, 1), np.float32)], jit=jit,
                   starts=[0, 1], ends=[-1, 2])  # fmt: skip
    assert dx.shape == (0, 3)


@pytest.mark.parametrize(
    ("n_inputs", "args", "dy_shape", "error", "match"),
    [
        (2, {"starts": [0, 1], "ends": [-1, 3]}, (3, 3), ShapeError, r"dY 'x1' has shape \[3, 3\].*\[3, 2\]"),
        (3, {}, (3, 2), BadArgumentError, "2 inputs .* or 4"),
        (2, {"starts": [0]}, (3, 4), BadArgumentError, "missing required argument 'ends'"),
        (2, {"starts": [0, 0], "ends": [1]}, (3, 4), BadArgumentError, "differ"),
        (2, {"starts": [2], "ends": [1]}, (0, 4), ShapeError, "not a valid range"),
    ],
)
def test_slice_gradient_errors(jit, n_inputs, args, dy_shape, error, match):
    x = np.zeros((3, 4), np.float32)
    bounds = [np.array([0, 1], np.int32), np.array([-1, 3], np.int32)]
    inputs = [x, *bounds[: n_inputs - 2], np.zeros(dy_shape, np.float32)]
    with pytest.raises(error, match=match):
        run_op("SliceGradient", inputs, jit=jit, **args)


# --------------------------------------------------------------------------------------------------
# Reshape(GO, old_shape) -> (GI0, "_GI0_dims")


@st.composite
def reshapes(draw):
    """(x, the `shape` argument, the target shape): a regrouping of x's dims, maybe with a -1."""
    old = draw(small_shapes)
    new: list[int] = []
    for d in old:
        if new and draw(st.booleans()):
            new[-1] *= d
        else:
            new.append(d)
    if draw(st.booleans()):
        new.insert(draw(st.integers(0, len(new))), 1)
    spelled = list(new)
    if draw(st.booleans()):
        spelled[draw(st.integers(0, len(new) - 1))] = -1
    return draw(floats(old)), spelled, tuple(new)


@given(case=reshapes(), data=st.data())
def test_reshape_is_its_own_gradient(jit, case, data):
    x, spelled, target = case
    dy = data.draw(floats(target))
    ops = [
        create_operator("Reshape", ["x"], ["y", "x_old_shape"], shape=spelled),
        create_operator("Reshape", ["dy", "x_old_shape"], ["dx", "_dx_dims"], is_gradient_op=True),
    ]
    dx, dims = run_net(ops, {"x": x, "dy": dy}, ["dx", "_dx_dims"], jit)
    np.testing.assert_array_equal(dx, dy.reshape(x.shape))
    np.testing.assert_array_equal(dims, target)
    check_vjp(jit, [dx], lambda a: forward("Reshape", 1, 2, shape=spelled)(a)[0], [x], [dy])


# --------------------------------------------------------------------------------------------------
# Transpose, Squeeze <-> ExpandDims, CopyOnDeviceLike


@given(data=st.data())
def test_transpose_with_inverse_axes_is_the_gradient(jit, data):
    x = data.draw(floats(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3)))
    axes = data.draw(st.none() | st.permutations(range(x.ndim)))
    args = {} if axes is None else {"axes": list(axes)}
    # The maker copies the forward args, replacing `axes` by its inverse (none stays none: reversal).
    grad_args = {} if axes is None else {"axes": np.argsort(axes).tolist()}
    y_shape = np.transpose(x, axes).shape
    dy = data.draw(floats(y_shape))
    (dx,) = run_op("Transpose", [dy], jit=jit, **grad_args)
    np.testing.assert_array_equal(dx, np.transpose(dy, np.argsort(axes) if axes else None))
    check_vjp(jit, [dx], forward("Transpose", 1, **args), [x], [dy])


@given(data=st.data())
def test_expand_dims_is_squeeze_gradient_and_back(jit, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    ones = [i for i, d in enumerate(shape) if d == 1]
    assume(ones)
    dims = sorted(data.draw(st.sets(st.sampled_from(ones), min_size=1)))
    x = data.draw(floats(shape))
    squeezed = np.squeeze(x, tuple(dims)).shape
    # Squeeze's gradient: ExpandDims(GO) with the same dims.
    dy = data.draw(floats(squeezed))
    (dx,) = run_op("ExpandDims", [dy], jit=jit, dims=dims)
    np.testing.assert_array_equal(dx, dy.reshape(shape))
    check_vjp(jit, [dx], forward("Squeeze", 1, dims=dims), [x], [dy])
    # ExpandDims' gradient: Squeeze(GO) with the same dims.
    z = data.draw(floats(squeezed))
    dz = data.draw(floats(shape))
    (dzx,) = run_op("Squeeze", [dz], jit=jit, dims=dims)
    np.testing.assert_array_equal(dzx, dz.reshape(squeezed))
    check_vjp(jit, [dzx], forward("ExpandDims", 1, dims=dims), [z], [dz])


@given(x=floats(small_shapes), data=st.data())
def test_copy_on_device_like_is_copy_gradient(jit, x, data):
    dy = data.draw(floats(x.shape))
    (dx,) = run_op("CopyOnDeviceLike", [dy, x], jit=jit)
    np.testing.assert_array_equal(dx, dy)
    check_vjp(jit, [dx], forward("Copy", 1), [x], [dy])


# --------------------------------------------------------------------------------------------------
# Concat <-> Split


@st.composite
def concat_cases(draw):
    """(inputs, forward args): inputs to Concat along an axis given by `axis` (maybe with add_axis)
    or by `order`."""
    shape = list(draw(small_shapes))
    n = draw(st.integers(1, 3))
    style = draw(st.sampled_from(["axis", "add_axis", "order"]))
    if style == "order":
        shape = [*shape, 1, 1, 1][:4]
        axis = 1
        args: dict = {"order": "NCHW"}
    else:
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        args = {"axis": axis}
    if style == "add_axis":
        args["add_axis"] = 1
        xs = [draw(floats(tuple(shape))) for _ in range(n)]
    else:
        xs = []
        for _ in range(n):
            shape[axis] = draw(st.integers(0, 3))
            xs.append(draw(floats(tuple(shape))))
    return xs, args, axis


@given(case=concat_cases(), data=st.data())
def test_split_with_split_info_is_concat_gradient(jit, case, data):
    """GetConcatGradient: Split(GO, split_info) -> (GI0, GI1, ...) with the forward args."""
    xs, args, axis = case
    names = [f"x{i}" for i in range(len(xs))]
    grads = [f"{n}_grad" for n in names]
    fwd = forward("Concat", len(xs), 2, **args)
    y_shape = fwd(*xs)[0].shape
    dy = data.draw(floats(y_shape))
    ops = [
        create_operator("Concat", names, ["y", "split_info"], **args),
        create_operator("Split", ["dy", "split_info"], grads, is_gradient_op=True, **args),
    ]
    got = run_net(ops, {**dict(zip(names, xs, strict=True)), "dy": dy}, grads, jit)
    if "add_axis" in args:
        expected = [np.take(dy, i, axis=axis) for i in range(len(xs))]
    else:
        expected = np.split(dy, np.cumsum([x.shape[axis] for x in xs])[:-1], axis=axis)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)
    check_vjp(jit, got, lambda *a: fwd(*a)[0], xs, [dy])


@given(case=concat_cases(), data=st.data())
def test_concat_is_split_gradient(jit, case, data):
    """GetSplitGradient: Concat(GO_0, GO_1, ...) -> (GI0, "_GI0_dims") with the forward args."""
    parts, concat_args, axis = case
    x = np.asarray(forward("Concat", len(parts), 2, **concat_args)(*parts)[0])
    args = dict(concat_args)
    if "add_axis" not in args:
        args["split"] = [p.shape[axis] for p in parts]  # the forward Split's own sizes
    fwd = forward("Split", 1, len(parts), **args)
    dys = [data.draw(floats(np.shape(p))) for p in fwd(x)]
    (dx, dims) = run_op("Concat", dys, 2, jit=jit, output_names=["x_grad", "_x_grad_dims"], **args)
    join = np.stack if "add_axis" in args else np.concatenate
    np.testing.assert_array_equal(dx, join(dys, axis=axis))
    assert dims.size == len(parts)
    check_vjp(jit, [dx], fwd, [x], dys)


# --------------------------------------------------------------------------------------------------
# Cast with `to` and `from_type` swapped


@pytest.mark.parametrize(
    ("to", "from_type"),
    [(pb.TensorProto.FLOAT16, pb.TensorProto.FLOAT), (pb.TensorProto.DOUBLE, pb.TensorProto.FLOAT)],
)
@fewer_examples
@given(x=floats(small_shapes), data=st.data())
def test_cast_with_swapped_types_is_the_gradient(jit, to, from_type, x, data):
    fwd = forward("Cast", 1, to=to, from_type=from_type)
    y = np.asarray(fwd(x)[0])
    dy = data.draw(floats(y.shape)).astype(y.dtype)
    (dx,) = run_op("Cast", [dy], jit=jit, to=from_type, from_type=to)
    assert dx.dtype == np.float32
    np.testing.assert_array_equal(dx, dy.astype(np.float32))
    check_vjp(jit, [dx], fwd, [x], [dy])


# --------------------------------------------------------------------------------------------------
# Gather's dense gradients: SparseToDense (axis 0), BatchGatherGradient (axis > 0)


@st.composite
def gather_cases(draw, axis: int):
    data = draw(floats(hnp.array_shapes(min_dims=max(axis + 1, 1), max_dims=3, min_side=1, max_side=4)))
    index_shape = (draw(st.integers(0, 5)),) if axis == 0 else draw(hnp.array_shapes(min_dims=0, max_dims=2))
    indices = draw(hnp.arrays(np.int32, index_shape, elements=st.integers(0, data.shape[axis] - 1)))
    out_shape = data.shape[:axis] + indices.shape + data.shape[axis + 1 :]
    return data, indices, draw(floats(out_shape))


def scatter_add_reference(data, indices, grad, axis):
    """dDATA: grad's slices added back at their indices along `axis` (NumPy, duplicates add up)."""
    out = np.zeros(np.moveaxis(data, axis, 0).shape, np.float64)
    if indices.size:
        rows = grad.reshape(*data.shape[:axis], indices.size, *data.shape[axis + 1 :])
        np.add.at(out, indices.reshape(-1), np.moveaxis(rows, axis, 0))
    return np.moveaxis(out, 0, axis).astype(np.float32)


@fewer_examples
@given(case=gather_cases(axis=0))
def test_sparse_to_dense_is_gather_dense_gradient(jit, case):
    """GetGatherGradient with dense_gradient: SparseToDense(I1, GO, I0) -> GI0."""
    data, indices, grad = case
    (dx,) = run_op("SparseToDense", [indices, grad, data], jit=jit)
    np.testing.assert_allclose(dx, scatter_add_reference(data, indices, grad, 0), rtol=1e-5, atol=1e-5)
    gather = forward("Gather", 2, dense_gradient=1)
    check_vjp(jit, [dx], lambda d: gather(d, indices), [data], [grad], 1e-5)


def test_sparse_to_dense_first_dim_from_argument_or_indices(jit):
    indices = np.array([3, 1, 3], np.int64)
    values = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    (out,) = run_op("SparseToDense", [indices, values], jit=jit, output_first_dim=5)
    np.testing.assert_array_equal(out, [[0, 0], [3, 4], [0, 0], [6, 8], [0, 0]])
    assert out.dtype == np.int32
    if jit:  # max(indices) + 1 decides the shape: the indices must be concrete
        with pytest.raises(ShapeError, match="traced"):
            run_op("SparseToDense", [indices, values], jit=jit)
        return
    (out,) = run_op("SparseToDense", [indices, values], jit=jit)
    np.testing.assert_array_equal(out, [[0, 0], [3, 4], [0, 0], [6, 8]])
    (out,) = run_op("SparseToDense", [np.zeros((0,), np.int32), np.zeros((0, 2), np.float32)], jit=jit)
    assert out.shape == (0, 2)


@pytest.mark.parametrize(
    ("inputs", "args", "error", "match"),
    [
        ([np.zeros((2, 1), np.int32), np.zeros((2, 3)), np.zeros((4, 3))], {}, ShapeError, "must be 1-D"),
        ([np.zeros((2,), np.int32), np.zeros((3, 3)), np.zeros((4, 3))], {}, ShapeError, "one row per index"),
        ([np.zeros((2,), np.float32), np.zeros((2, 3)), np.zeros((4, 3))], {}, ShapeError, "int32 or int64"),
        (
            [np.zeros((2,), np.int32), np.zeros((2, 3)), np.zeros((4, 3))],
            {"output_first_dim": 4},
            BadArgumentError,
            "output_first_dim",
        ),
    ],
)
def test_sparse_to_dense_errors(jit, inputs, args, error, match):
    inputs = [a.astype(np.float32) if a.dtype == np.float64 else a for a in inputs]
    with pytest.raises(error, match=match):
        run_op("SparseToDense", inputs, jit=jit, **args)


@fewer_examples
@given(axis=st.integers(1, 2), data=st.data())
def test_batch_gather_gradient_is_gather_gradient_for_axis_above_0(jit, axis, data):
    """GetGatherGradient for axis > 0: BatchGatherGradient(I0, I1, GO) -> GI0 with {axis}."""
    x, indices, grad = data.draw(gather_cases(axis=axis))
    negative = data.draw(st.booleans())
    arg_axis = axis - x.ndim if negative else axis
    (dx,) = run_op("BatchGatherGradient", [x, indices, grad], jit=jit, axis=arg_axis)
    np.testing.assert_allclose(dx, scatter_add_reference(x, indices, grad, axis), rtol=1e-5, atol=1e-5)
    gather = forward("Gather", 2, axis=axis)
    check_vjp(jit, [dx], lambda d: gather(d, indices), [x], [grad], 1e-5)


def test_batch_gather_gradient_default_axis_and_errors(jit):
    x = np.zeros((2, 3), np.float32)
    indices = np.array([2, 2], np.int64)
    grad = np.array([[1, 2], [3, 4]], np.float32)
    (dx,) = run_op("BatchGatherGradient", [x, indices, grad], jit=jit)  # axis defaults to 1
    np.testing.assert_array_equal(dx, [[0, 0, 3], [0, 0, 7]])
    with pytest.raises(ShapeError, match=r"dOUT 'x2' has shape \[2, 3\]"):
        run_op("BatchGatherGradient", [x, indices, np.zeros((2, 3), np.float32)], jit=jit)
    with pytest.raises(ShapeError, match="rank >= 2"):
        run_op("BatchGatherGradient", [np.zeros(3, np.float32), indices, np.zeros(2, np.float32)], jit=jit)
