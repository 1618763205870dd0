"""Linear algebra: FC (the RNN input/recurrent projections), MatMul, BatchMatMul (attention) and
ElementwiseLinear, each with Caffe2's own rules for flattening inputs to matrices."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError
from ..ir.netdef import Op
from ..native import gemm as native_gemm
from ..proto import caffe2_pb2 as pb
from .common import broadcast_shapes, canonical_axis, is_symbolic, matmul_precision, size_from_dim, size_to_dim
from .emit import Call, EmitWriter, call, codegen_helper
from .facets import GRADIENT_OP, NO_EMITTER, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import GradientContext, GradientError, GradientOps, argument, gradient_op
from .registry import Kernel, declare_family, facet, register
from .shape_facts import Context, Guesses, Solver, Spec, output_like_input, prod

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)


def _check_float_inputs(op: Op, arrays: Sequence[jax.Array]) -> None:
    """Float inputs of one dtype. (Caffe2's CPU build registers these ops for float32 only; doubles are
    accepted here on purpose, for rnn2jax's float64 verification mode, rnn2jax/checking/verification.py.)"""
    for name, a in zip(op.inputs, arrays, strict=False):
        if getattr(a, "dtype", None) is None:
            raise ShapeError(f"{op.where}: input '{name}' is a {type(a).__name__}, not a tensor")
    dtypes = [np.dtype(a.dtype) for a in arrays]
    for name, dtype in zip(op.inputs, dtypes, strict=False):
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ShapeError(f"{op.where}: input '{name}' has dtype {dtype}; {op.type} needs a float tensor")
    if len(set(dtypes)) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in zip(op.inputs, dtypes, strict=False))
        raise ShapeError(f"{op.where}: {op.type} inputs must share one dtype, got {listed}")


def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b, precision=matmul_precision())


# --------------------------------------------------------------------------------------------------
# FC


def _fc_dims(
    op: Op, x: jax.Array, w: jax.Array, axis: int, axis_w: int, weight_n_by_k: bool
) -> tuple[int, int, int, int, int, int]:
    """(x_axis, M, K, N, rows, cols): X is `M x K` at `axis`, W `rows x cols` at `axis_w`, which
    is `N x K` (FC) or `K x N` (FCTransposed). FC and its gradient check shapes alike."""
    x_axis = canonical_axis(op, axis, x.ndim, "axis")
    w_axis = canonical_axis(op, axis_w, w.ndim, "axis_w")
    m, k = size_to_dim(x.shape, x_axis), size_from_dim(x.shape, x_axis)
    rows, cols = size_to_dim(w.shape, w_axis), size_from_dim(w.shape, w_axis)
    n, w_k = (rows, cols) if weight_n_by_k else (cols, rows)
    layout = "N x K" if weight_n_by_k else "K x N"
    if w_k != k:
        raise ShapeError(
            f"{op.where}: weight '{op.inputs[1]}' {list(w.shape)} is {rows} x {cols} at axis_w={axis_w} "
            f"({layout}), but input '{op.inputs[0]}' {list(x.shape)} has K = {k} at axis={axis}"
        )
    return x_axis, m, k, n, rows, cols


@codegen_helper
def fully_connected(
    x: jax.Array,
    w: jax.Array,
    b: jax.Array,
    axis: int = 1,
    axis_w: int = 1,
    w_is_n_by_k: bool = True,
    precision: jax.lax.Precision | None = jax.lax.Precision.HIGHEST,
) -> jax.Array:
    """Caffe2's FC: x viewed as [M, K] at `axis`, w as [N, K] at `axis_w` ([K, N], FCTransposed's, when not
    `w_is_n_by_k`); y = x @ w.T + b keeps x's dims before `axis` and gets N last. HIGHEST precision by
    default: Caffe2 multiplies in float32."""
    axis, axis_w = axis % x.ndim, axis_w % w.ndim
    w2 = jnp.reshape(w, (math.prod(w.shape[:axis_w]), math.prod(w.shape[axis_w:])))
    x2 = jnp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    y = jnp.matmul(x2, w2.T if w_is_n_by_k else w2, precision=precision) + b
    return jnp.reshape(y, (*x.shape[:axis], y.shape[-1]))


def _fc(op: Op, weight_n_by_k: bool) -> Kernel:
    """X is flattened to `M x K` at `axis`, W to `N x K` (FC) or `K x N` (FCTransposed) at `axis_w`;
    Y keeps X's dims before `axis` and gets N as its last dim."""
    axis = op.int("axis", 1)
    axis_w = op.int("axis_w", 1)
    op.bool("float16_compute", False)  # only changes the GEMM's compute type on GPU

    def kernel(x, w, b):
        _check_float_inputs(op, (x, w, b))
        x_axis, m, k, n, _, _ = _fc_dims(op, x, w, axis, axis_w, weight_n_by_k)
        if b.ndim != 1 or b.shape[0] != n:
            raise ShapeError(f"{op.where}: bias '{op.inputs[2]}' must be 1-D [{n}], got {list(b.shape)}")
        if native_gemm.eligible(m, k, n, x, w, b):  # a large float32 FC: one oneDNN GEMM on CPU
            w2 = jnp.reshape(w, (size_to_dim(w.shape, axis_w % w.ndim), -1))
            y = native_gemm.fully_connected(jnp.reshape(x, (m, k)), w2, b, weight_n_by_k, matmul_precision())
            return jnp.reshape(y, (*x.shape[:x_axis], n))
        return fully_connected(x, w, b, x_axis, axis_w, weight_n_by_k, matmul_precision())

    return kernel


@register("FC", inputs=3)
def fc(op: Op) -> Kernel:
    """`Y = X·Wᵀ + b` with W `[dim_out, dim_in]` (caffe2/operators/fully_connected_op.h)."""
    return _fc(op, weight_n_by_k=True)


@facet("gradient", "FC")
def _fc_gradient_maker(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(X, W, dY) -> dW, db, dX`."""
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(1), g.GI(2), g.GI(0)])]


@facet("emitter", "FC")
def emit_fc(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    keywords = {k: op.int(k) for k in ("axis", "axis_w") if op.int(k, 1) != 1}
    return call(w.helper(fully_connected), *xs, **keywords)


@register("FCTransposed", inputs=3, gradient=_fc_gradient_maker)
def fc_transposed(op: Op) -> Kernel:
    """`Y = X·W + b` with W `[dim_in, dim_out]`."""
    return _fc(op, weight_n_by_k=False)


@facet("shape_rule", "FC", "FCTransposed")
def fc_shapes(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """FC(X, W, b): X is [N, K] (axis 1) or [T, N, K] (axis 2), K from W and axis_w."""
    if len(ins) < 2 or ins[1] is None:
        return {}, {}
    axis, axis_w, weight = op.int("axis", 1), op.int("axis_w", 1), ins[1].shape
    if op.type == "FCTransposed":
        size, units = prod(weight[:axis_w]), prod(weight[axis_w:])
    else:
        units, size = prod(weight[:axis_w]), prod(weight[axis_w:])
    x, y = ins[0], outs[0] if outs else None
    if x is None:
        lead = ctx.leading(axis, y.shape[:axis] if y is not None and len(y.shape) == axis + 1 else None)
        return ({0: Spec((*lead, size), ins[1].dtype)} if lead is not None else {}), {}
    if y is None and len(x.shape) >= axis and axis >= 0:
        return {}, {0: Spec((*x.shape[:axis], units), x.dtype)}
    return {}, {}


def _fc_gradient(op: Op, weight_n_by_k: bool) -> Kernel:
    """`(X, W, dY) -> (dW, db[, dX])` (FullyConnectedGradientOp): X and W flattened as in the
    forward op, dY read as `M x N`. An empty X gives dW = db = 0 (even if dY is not empty)."""
    axis = op.int("axis", 1)
    axis_w = op.int("axis_w", 1)
    op.bool("float16_compute", False)

    def kernel(x, w, dy):
        _check_float_inputs(op, (x, w, dy))
        _, m, k, n, rows, cols = _fc_dims(op, x, w, axis, axis_w, weight_n_by_k)
        if dy.size != m * n:
            raise ShapeError(
                f"{op.where}: output gradient '{op.inputs[2]}' {list(dy.shape)} must hold M x N = "
                f"{m} x {n} values (M from '{op.inputs[0]}', N from '{op.inputs[1]}')"
            )
        x2, dy2, w2 = jnp.reshape(x, (m, k)), jnp.reshape(dy, (m, n)), jnp.reshape(w, (rows, cols))
        db = jnp.sum(dy2, axis=0) if x.size else jnp.zeros((n,), dy.dtype)
        if native_gemm.eligible(m, k, n, x, w, dy):  # a large float32 FC: two oneDNN GEMMs on CPU
            dx, dw = native_gemm.fully_connected_gradients(x2, w2, dy2, weight_n_by_k, matmul_precision())
            return jnp.reshape(dw, w.shape), db, jnp.reshape(dx, x.shape)
        dw = _matmul(dy2.T, x2) if weight_n_by_k else _matmul(x2.T, dy2)
        dx = _matmul(dy2, w2 if weight_n_by_k else w2.T)
        return jnp.reshape(dw, w.shape), db, jnp.reshape(dx, x.shape)

    return kernel


@register("FCGradient", inputs=3, outputs=(2, 3))
def fc_gradient(op: Op) -> Kernel:
    """`dW = dYᵀ·X`, `db = Σ_rows dY`, `dX = dY·W`; outputs in the maker's order dW, db, dX."""
    return _fc_gradient(op, weight_n_by_k=True)


@register("FCTransposedGradient", inputs=3, outputs=(2, 3))
def fc_transposed_gradient(op: Op) -> Kernel:
    """`dW = Xᵀ·dY`, `db = Σ_rows dY`, `dX = dY·Wᵀ`."""
    return _fc_gradient(op, weight_n_by_k=False)


# --------------------------------------------------------------------------------------------------
# MatMul


@register("MatMul", inputs=(2, 3))
def matmul(op: Op) -> Kernel:
    """caffe2/operators/matmul_op.h: A and B are flattened to matrices at `axis_a`/`axis_b`, then
    optionally transposed; Y is always 2-D `M x N`. The optional third input (used by the gradient
    ops) only gives Y its shape."""
    axis_a = op.int("axis_a", 1)
    axis_b = op.int("axis_b", 1)
    trans_a = op.bool("trans_a", False)
    trans_b = op.bool("trans_b", False)

    def as_matrix(x, axis: int, trans: bool, what: str):
        k = canonical_axis(op, axis, x.ndim, what)
        m = jnp.reshape(x, (size_to_dim(x.shape, k), size_from_dim(x.shape, k)))
        return m.T if trans else m

    def kernel(a, b, like=None):
        _check_float_inputs(op, (a, b))
        a2 = as_matrix(a, axis_a, trans_a, "axis_a")
        b2 = as_matrix(b, axis_b, trans_b, "axis_b")
        if a2.shape[1] != b2.shape[0]:
            raise ShapeError(
                f"{op.where}: dimension mismatch: {'trans(A)' if trans_a else 'A'} '{op.inputs[0]}' is "
                f"{a2.shape[0]} x {a2.shape[1]}, {'trans(B)' if trans_b else 'B'} '{op.inputs[1]}' is "
                f"{b2.shape[0]} x {b2.shape[1]}"
            )
        y = _matmul(a2, b2)
        if like is None:
            return y
        if math.prod(like.shape) != y.size:
            raise ShapeError(
                f"{op.where}: shape input '{op.inputs[2]}' {list(like.shape)} does not hold the "
                f"{y.shape[0]} x {y.shape[1]} product"
            )
        return jnp.reshape(y, like.shape)

    return kernel


@facet("gradient", "MatMul")
def _mat_mul_gradient_maker(g: GradientContext) -> GradientOps:
    """GetMatMulGradient: its own args only. Caffe2 reads `axis_a`/`axis_b` into C++ `bool`s, so the
    gradient ops get axis 1 for any nonzero forward axis (0 stays 0); reproduced as emitted."""
    g.copy_args = False
    a, b, go = g.I(0), g.I(1), g.GO(0)
    trans_a, trans_b = g.flag("trans_a", False), g.flag("trans_b", False)
    axis_a, axis_b = int(g.flag("axis_a", True)), int(g.flag("axis_b", True))

    def mm(inputs: list[str], output: str, **args: int) -> pb.OperatorDef:
        return gradient_op("MatMul", inputs, [output], [argument(k, v) for k, v in args.items()])

    if trans_a and trans_b:
        return [
            mm([b, go, a], g.GI(0), trans_a=1, trans_b=1, axis_a=axis_b),
            mm([go, a, b], g.GI(1), trans_a=1, trans_b=1, axis_b=axis_a),
        ]
    if trans_a:
        return [mm([b, go, a], g.GI(0), trans_b=1, axis_a=axis_b), mm([a, go, b], g.GI(1), axis_a=axis_a)]
    if trans_b:
        return [mm([go, b, a], g.GI(0), axis_b=axis_b), mm([go, a, b], g.GI(1), trans_a=1, axis_b=axis_a)]
    return [mm([go, b, a], g.GI(0), trans_b=1, axis_b=axis_b), mm([a, go, b], g.GI(1), trans_a=1, axis_a=axis_a)]


# --------------------------------------------------------------------------------------------------
# BatchMatMul


def _op_shape(x: jax.Array, trans: bool) -> tuple[int, ...]:
    """The shape of op(X): its last two dims swapped when `trans` (a 1-D operand is a vector, not transposed)."""
    shape = tuple(x.shape)
    return (*shape[:-2], shape[-1], shape[-2]) if trans and x.ndim > 1 else shape


@codegen_helper
def batched_matmul(
    a: jax.Array,
    b: jax.Array,
    trans_a: bool = False,
    trans_b: bool = False,
    precision: jax.lax.Precision | None = jax.lax.Precision.HIGHEST,
) -> jax.Array:
    """Caffe2's BatchMatMul: numpy.matmul of op(a) and op(b), op swapping the last two dims when asked (a
    1-D operand is a vector and its flag is ignored); vector times vector has shape [1]."""
    if a.ndim == 1 and b.ndim == 1:
        return jnp.reshape(jnp.matmul(a, b, precision=precision), (1,))
    if trans_a and a.ndim > 1:
        a = jnp.swapaxes(a, -1, -2)
    if trans_b and b.ndim > 1:
        b = jnp.swapaxes(b, -1, -2)
    return jnp.matmul(a, b, precision=precision)


def _batch_shape(op: Op, a_batch: tuple[int, ...], b_batch: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting of the batch dims (right-aligned; equal or 1)."""
    try:
        return broadcast_shapes(a_batch, b_batch)
    except ValueError:
        every = " for every size of their symbolic dims" if is_symbolic((*a_batch, *b_batch)) else ""
        raise ShapeError(
            f"{op.where}: batch dims {list(a_batch)} of '{op.inputs[0]}' and {list(b_batch)} of "
            f"'{op.inputs[1]}' do not broadcast{every}"
        ) from None


@register("BatchMatMul", inputs=2)
def batch_matmul(op: Op) -> Kernel:
    """caffe2/operators/batch_matmul_op.h: `op(A)·op(B)` over the last two dims, where op transposes
    them when `trans_a`/`trans_b`. broadcast=0 needs equal ranks >= 2 and equal batch dims;
    broadcast=1 is numpy.matmul (batch dims broadcast, a 1-D operand is a vector and its flag is
    ignored), except that vector·vector gives shape [1] as in Caffe2."""
    trans_a = op.bool("trans_a", False)
    trans_b = op.bool("trans_b", False)
    broadcast = op.bool("broadcast", False)

    def mismatch(k_a: int, k_b: int) -> ShapeError:
        return ShapeError(
            f"{op.where}: inner dims differ: '{op.inputs[0]}' gives K = {k_a}, '{op.inputs[1]}' gives "
            f"K = {k_b} (trans_a={int(trans_a)}, trans_b={int(trans_b)})"
        )

    def kernel(a, b):
        _check_float_inputs(op, (a, b))
        if not broadcast and (a.ndim != b.ndim or a.ndim < 2 or a.shape[:-2] != b.shape[:-2]):
            raise ShapeError(
                f"{op.where}: with broadcast=0 both inputs need the same rank >= 2 and the same batch "
                f"dims, got '{op.inputs[0]}' {list(a.shape)} and '{op.inputs[1]}' {list(b.shape)}; "
                "did you forget broadcast=1?"
            )
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"{op.where}: BatchMatMul inputs must have rank >= 1")
        if a.ndim == 1 and b.ndim == 1:
            if a.shape != b.shape:
                raise mismatch(a.shape[0], b.shape[0])
            return batched_matmul(a, b, precision=matmul_precision())
        a_shape, b_shape = _op_shape(a, trans_a), _op_shape(b, trans_b)
        k_b = b_shape[0] if b.ndim == 1 else b_shape[-2]
        if a_shape[-1] != k_b:
            raise mismatch(a_shape[-1], k_b)
        _batch_shape(op, a_shape[:-2], b_shape[:-2])
        return batched_matmul(a, b, trans_a, trans_b, matmul_precision())

    return kernel


@facet("gradient", "BatchMatMul")
def _batch_mat_mul_gradient_maker(g: GradientContext) -> GradientOps:
    """dA, dB from BatchMatMuls of G, A, B chosen by trans_a/trans_b; the maker's own args only."""
    g.copy_args = False
    if g.flag("broadcast", False):
        raise GradientError("Gradient is currently not supported with broadcast=1 for BatchMatMul.")
    a, b, go = g.I(0), g.I(1), g.GO(0)
    trans_a, trans_b = g.flag("trans_a", False), g.flag("trans_b", False)
    if trans_a and trans_b:
        da, db, args_a, args_b = [b, go], [go, a], ("trans_a", "trans_b"), ("trans_a", "trans_b")
    elif trans_a:
        da, db, args_a, args_b = [b, go], [a, go], ("trans_b",), ()
    elif trans_b:
        da, db, args_a, args_b = [go, b], [go, a], (), ("trans_a",)
    else:
        da, db, args_a, args_b = [go, b], [a, go], ("trans_b",), ("trans_a",)
    return [
        gradient_op("BatchMatMul", da, [g.GI(0)], [argument(n, 1) for n in args_a]),
        gradient_op("BatchMatMul", db, [g.GI(1)], [argument(n, 1) for n in args_b]),
    ]


@facet("emitter", "BatchMatMul")
def emit_batch_matmul(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    keywords = {k: True for k in ("trans_a", "trans_b") if op.bool(k, False)}
    return call(w.helper(batched_matmul), *xs, **keywords)


# --------------------------------------------------------------------------------------------------
# ElementwiseLinear


@register("ElementwiseLinear", inputs=3, shape_rule=output_like_input)
def elementwise_linear(op: Op) -> Kernel:
    """caffe2/operators/elementwise_linear_op.cc: X viewed `N x D` at `axis`, `Y = X·a + b` with a
    and b 1-D `[D]` scaling each column."""
    axis = op.int("axis", 1)

    def kernel(x, a, b):
        _check_float_inputs(op, (x, a, b))
        k = canonical_axis(op, axis, x.ndim)
        d = size_from_dim(x.shape, k)
        for name, v in zip(op.inputs[1:], (a, b), strict=True):
            if v.ndim != 1 or v.shape[0] != d:
                raise ShapeError(
                    f"{op.where}: '{name}' must be 1-D [{d}] (the size of '{op.inputs[0]}' "
                    f"{list(x.shape)} from axis {axis}), got {list(v.shape)}"
                )
        return columnwise_linear(x, a, b, k)

    return kernel


@facet("gradient", "ElementwiseLinear")
def _elementwise_linear_gradient_maker(g: GradientContext) -> GradientOps:
    inputs, outputs = [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1), g.GI(2)]
    return [gradient_op("ElementwiseLinearGradient", inputs, outputs)]


@codegen_helper
def columnwise_linear(x: jax.Array, a: jax.Array, b: jax.Array, axis: int = 1) -> jax.Array:
    """Caffe2's ElementwiseLinear: x viewed as [N, D] at `axis`; y = x * a + b, a and b ([D]) scaling and
    shifting each column."""
    axis = axis % x.ndim
    rows = jnp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return jnp.reshape(rows * a + b, x.shape)


@facet("emitter", "ElementwiseLinear")
def emit_elementwise_linear(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    axis = op.int("axis", 1)
    return call(w.helper(columnwise_linear), *xs, **({"axis": axis} if axis != 1 else {}))


@register("ElementwiseLinearGradient", inputs=3, outputs=3)
def elementwise_linear_gradient(op: Op) -> Kernel:
    """`(dY, X, a) -> (dX, da, db)` with X viewed `N x D` at `axis`: `dX = dY·a`,
    `da = Σ_n dY·X`, `db = Σ_n dY` (elementwise_linear_op.cc)."""
    axis = op.int("axis", 1)

    def kernel(dy, x, a):
        _check_float_inputs(op, (dy, x, a))
        k = canonical_axis(op, axis, x.ndim)
        n, d = size_to_dim(x.shape, k), size_from_dim(x.shape, k)
        if a.ndim != 1 or a.shape[0] != d:
            raise ShapeError(
                f"{op.where}: '{op.inputs[2]}' must be 1-D [{d}] (the size of '{op.inputs[1]}' "
                f"{list(x.shape)} from axis {axis}), got {list(a.shape)}"
            )
        if dy.size != x.size:
            raise ShapeError(
                f"{op.where}: output gradient '{op.inputs[0]}' {list(dy.shape)} must have the size of "
                f"'{op.inputs[1]}' {list(x.shape)}"
            )
        dy2, x2 = jnp.reshape(dy, (n, d)), jnp.reshape(x, (n, d))
        return jnp.reshape(dy2 * a, x.shape), jnp.sum(dy2 * x2, axis=0), jnp.sum(dy2, axis=0)

    return kernel
