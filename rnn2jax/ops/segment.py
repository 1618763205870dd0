"""Segment reductions (caffe2/operators/segment_reduction_op.{h,cc}, reducer_functors.h) and the small ops
that convert between segment layouts (caffe2/operators/utility_ops.h).

Caffe2 builds each op from a reducer (Sum, Mean, Max, WeightedSum; LogSumExp and LogMeanExp for the
"range" ops) and a segment layout: LENGTHS (consecutive runs), sorted SEGMENT_IDS (no gaps, from 0),
unsorted SEGMENT_IDS (any order, `num_segments` or max id + 1 segments), optionally fused with a gather
of DATA rows by INDICES (the Sparse* forms) or one segment over the leading dims (ReduceFront). Here too:
every layout turns into one segment id per reduced row, and one reducer table maps (rows, ids) to the
segments (`_reduce`) and a segment gradient back to the rows (`_expand`).

Where the number of segments comes from SEGMENT_IDS values (the SortedSegment and UnsortedSegment
forward ops, the conversions) the ids are `static_inputs`: the kernel reads them with NumPy and checks
them as Caffe2 does. Everywhere else (LENGTHS, every gradient op) shapes follow from input shapes and
the values Caffe2 enforces are checked when the compiled net runs (ops/checks.py).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .common import TRACED_SHAPE_HINT, size_from_dim, size_to_dim
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import GradientContext, GradientError, GradientOps, gradient_op, should_not_do_gradient
from .registry import Kernel, declare_family, facet, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

INT32 = (np.dtype(np.int32),)
# Caffe2 registers these ops for float only; float64 is accepted too, for rnn2jax's float64 verification.
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))

# --------------------------------------------------------------------------------------------------
# Input checks


def _text(x: Any) -> str:
    return f"{np.dtype(x.dtype)}[{','.join(map(str, np.shape(x)))}]"


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _check_type(op: Op, x: Any, i: int, what: str, dtypes: tuple[np.dtype, ...]) -> None:
    """Caffe2's `data<T>()` refuses any other element type."""
    if np.dtype(x.dtype) not in dtypes:
        allowed = " or ".join(map(str, dtypes))
        raise ShapeError(f"{op.where}: {what} '{op.inputs[i]}' must be {allowed}, got {_text(x)}")


def _check_data(op: Op, x: Any, i: int = 0, what: str = "DATA") -> None:
    """Segment ops are registered for float DATA with at least one dim."""
    _check_type(op, x, i, what, FLOATS)
    if jnp.ndim(x) < 1:
        raise ShapeError(f"{op.where}: {what} '{op.inputs[i]}' must have at least 1 dim, got {_text(x)}")


def _check_vector(op: Op, x: Any, i: int, what: str, dtypes: tuple[np.dtype, ...], size: int | None = None) -> None:
    if jnp.ndim(x) != 1:
        kind = "float" if dtypes[0].kind == "f" else "integer"
        raise ShapeError(f"{op.where}: {what} '{op.inputs[i]}' must be a 1-D {kind} tensor, got {_text(x)}")
    _check_type(op, x, i, what, dtypes)
    if size is not None and x.shape[0] != size:
        raise ShapeError(f"{op.where}: {what} '{op.inputs[i]}' must have {size} elements, got {_text(x)}")


def _check_rows(op: Op, x: Any, i: int, what: str, rows: int) -> None:
    if jnp.ndim(x) < 1 or x.shape[0] != rows:
        raise ShapeError(f"{op.where}: {what} '{op.inputs[i]}' must have {rows} rows, got {_text(x)}")


def _concrete(op: Op, x: Any, i: int) -> np.ndarray:
    """The values of a static input (one whose values decide the output's shape)."""
    if _is_traced(x):
        raise ShapeError(
            f"{op.where}: {op.type}'s output shape depends on the values of input '{op.inputs[i]}', but it is "
            f"a traced array here; {TRACED_SHAPE_HINT}"
        )
    return np.asarray(x)


def _where(op: Op, i: int) -> str:
    return f"{literal(op.where)}: input '{literal(op.inputs[i])}'"


# --------------------------------------------------------------------------------------------------
# Segment layouts: one segment id per reduced row


def _lengths_ids(lengths: Any, rows: int) -> jax.Array:
    """Segment of each of `rows` rows split by `lengths` (a negative length counts as 0, as in Caffe2's
    loop); rows past the lengths get id len(lengths), which the reductions drop."""
    ends = jnp.cumsum(jnp.maximum(jnp.asarray(lengths).astype(jnp.int32), 0))
    return jnp.searchsorted(ends, jnp.arange(rows, dtype=jnp.int32), side="right").astype(jnp.int32)


def _check_lengths_total(op: Op, lengths: Any, li: int, rows: int, negatives: bool = True) -> None:
    """Caffe2 reduces exactly the rows the lengths cover (a negative length covers none). Gradient ops
    (`negatives=False`) size their output by the plain sum, so a negative length there is refused."""
    xp = jnp if _is_traced(lengths) else np
    lengths = xp.asarray(lengths)
    total = xp.sum(xp.maximum(lengths, 0) if negatives else lengths)
    ok = total == rows
    if not negatives:
        ok = ok & xp.all(lengths >= 0)
    enforce(
        ok,
        f"{_where(op, li)}: the lengths sum to {{total}} (none may be negative), but {rows} rows are reduced",
        total=total,
    )


def _sorted_ids_ok(ids: Any, segments: int | None = None) -> Any:
    """Caffe2's sorted segment ids: from 0, each the same as or one more than the previous (and the
    last = segments - 1 in the gradient ops)."""
    if ids.shape[0] == 0:
        return True
    xp = jnp if _is_traced(ids) else np
    steps = xp.diff(ids)
    ok = (ids[0] == 0) & xp.all((steps == 0) | (steps == 1))
    if segments is not None:
        ok = ok & (ids[-1] == segments - 1)
    return ok


def _check_sorted_ids(op: Op, ids: Any, i: int, segments: int | None = None) -> None:
    enforce(_sorted_ids_ok(ids, segments), f"{_where(op, i)}: segment ids must be sorted from 0 with no gaps")


def _check_ids_range(op: Op, ids: Any, i: int, segments: int, what: str = "segment id") -> None:
    xp = jnp if _is_traced(ids) else np
    bad = (ids < 0) | (ids >= segments)
    first = ids[xp.argmax(bad)] if ids.shape[0] else xp.zeros((), ids.dtype)
    enforce(
        ~xp.any(bad),
        f"{_where(op, i)}: {what} {{value}} is out of range [0, {segments})",
        value=first,
    )


def _gather(data: Any, indices: Any) -> jax.Array:
    """data[indices] for the Sparse* forms (out-of-range indices clamped; checked separately)."""
    if data.shape[0] == 0:
        return jnp.zeros((indices.shape[0], *data.shape[1:]), data.dtype)
    return jnp.take(data, jnp.asarray(indices), axis=0, mode="clip")


# --------------------------------------------------------------------------------------------------
# Reducers: (rows [N, ...], ids [N], weights [N] | None, K) -> [K, ...], and the gradient back


def _column(v: Any, ndim: int) -> jax.Array:
    return jnp.reshape(v, (-1,) + (1,) * (ndim - 1))


def _counts(ids: Any, k: int, dtype: Any = jnp.float32) -> jax.Array:
    """The number of rows of each segment (as `dtype`)."""
    return jax.ops.segment_sum(jnp.ones(ids.shape, dtype), jnp.asarray(ids), num_segments=k)


def _segment_max(rows: Any, ids: Any, k: int) -> jax.Array:
    """The max of each segment; 0 for an empty one (Caffe2's MaxReducer starts from zeros)."""
    top = jax.ops.segment_max(rows, ids, num_segments=k)
    return jnp.where(_column(_counts(ids, k), rows.ndim) > 0, top, jnp.zeros((), rows.dtype))


def _log_exp(rows: Any, ids: Any, k: int, mean: bool) -> jax.Array:
    """log(sum (or mean) of exp) per segment, shifted by the segment max as Caffe2 does."""
    top = jax.ops.segment_max(rows, ids, num_segments=k)
    top = jnp.where(jnp.isfinite(top), top, jnp.zeros((), rows.dtype))
    total = jax.ops.segment_sum(jnp.exp(rows - _take(top, ids)), ids, num_segments=k)
    if mean:
        total = total / _column(jnp.maximum(_counts(ids, k, rows.dtype), 1), rows.ndim)
    return jnp.log(total) + top


def _take(values: Any, ids: Any) -> jax.Array:
    """values[ids]; ids past the end (rows the lengths do not cover) read zeros."""
    return jnp.take(values, jnp.asarray(ids), axis=0, mode="fill", fill_value=0)


def _reduce(reducer: str, rows: Any, ids: Any, k: int, weights: Any = None) -> jax.Array:
    ids = jnp.asarray(ids)
    if reducer == "WeightedSum":
        rows = rows * _column(weights, rows.ndim)
    if reducer == "RangeMean":  # MeanRangeReducer adds x / n, element by element
        rows = rows / _column(_take(_counts(ids, k, rows.dtype), ids), rows.ndim)
    if reducer in ("Sum", "WeightedSum", "RangeMean"):
        return jax.ops.segment_sum(rows, ids, num_segments=k)
    if reducer == "Mean":  # MeanReducer: sum, then scaled by 1/n when n > 0
        total = jax.ops.segment_sum(rows, ids, num_segments=k)
        return total * _column(1 / jnp.maximum(_counts(ids, k, rows.dtype), 1), rows.ndim)
    if reducer == "Max":
        return _segment_max(rows, ids, k)
    return _log_exp(rows, ids, k, mean=reducer == "LogMeanExp")


def _expand(reducer: str, grad: Any, ids: Any, weights: Any = None, data: Any = None, out: Any = None) -> jax.Array:
    """The gradient of each reduced row from its segment's gradient `grad` [K, ...]."""
    ids = jnp.asarray(ids)
    g = _take(grad, ids)
    if reducer in ("Mean", "RangeMean", "LogMeanExp"):
        g = g / _column(_take(jnp.maximum(_counts(ids, grad.shape[0], grad.dtype), 1), ids), g.ndim)
    if reducer == "WeightedSum":
        return g * _column(weights, g.ndim)
    if reducer == "Max":  # every row equal to the max gets the gradient (reducer_functors.h)
        return jnp.where(data == _take(out, ids), g, jnp.zeros((), g.dtype))
    if reducer in ("LogSumExp", "LogMeanExp"):
        return g * jnp.exp(data - _take(out, ids))
    return g


def _block(x: Any, rows: int, block: tuple[int, ...]) -> jax.Array:
    """x viewed as [rows, *block] (Caffe2 reads DATA/OUTPUT as flat blocks)."""
    return jnp.reshape(x, (rows, *block))


# --------------------------------------------------------------------------------------------------
# SortedSegmentRange{Sum,Mean,Max,LogSumExp,LogMeanExp}: (DATA, SEGMENT_IDS) -> [K, ...]

_RANGE = ("Sum", "Mean", "Max", "LogSumExp", "LogMeanExp")
runtime_checked(*(f"SortedSegmentRange{r}Gradient" for r in _RANGE))


def _range_reducer(name: str) -> str:
    return "RangeMean" if name == "Mean" else name


@register(*(f"SortedSegmentRange{r}" for r in _RANGE), inputs=2, static_inputs=(1,))
def sorted_segment_range(op: Op) -> Kernel:
    """Reduce DATA's rows over runs of equal, sorted SEGMENT_IDS (int32, from 0, no gaps): K = last id + 1."""
    reducer = _range_reducer(op.type.removeprefix("SortedSegmentRange"))

    def kernel(data, segment_ids):
        ids = _concrete(op, segment_ids, 1)
        _check_vector(op, ids, 1, "SEGMENT_IDS", INT32)
        _check_data(op, data)
        _check_rows(op, data, 0, "DATA", ids.shape[0])
        _check_sorted_ids(op, ids, 1)
        k = int(ids[-1]) + 1 if ids.size else 0
        return _reduce(reducer, data, ids, k)

    return kernel


@facet(
    "gradient",
    "SortedSegmentRangeSum",
    "SortedSegmentRangeMean",
    "SortedSegmentRangeMax",
    "SortedSegmentRangeLogSumExp",
    "SortedSegmentRangeLogMeanExp",
)
def _sorted_segment_range_gradient_maker(g: GradientContext) -> GradientOps:
    """AbstractSortedSegmentRangeDef: (DATA, Y, dY, SEGMENT_IDS)."""
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.O(0), g.GO(0), g.I(1)], [g.GI(0)])]


@register(*(f"SortedSegmentRange{r}Gradient" for r in _RANGE), inputs=4)
def sorted_segment_range_gradient(op: Op) -> Kernel:
    """(DATA_IN, DATA_OUT, SEGMENT_GRADS [K, ...], SEGMENT_IDS [N]) -> [N, ...]."""
    reducer = _range_reducer(op.type.removeprefix("SortedSegmentRange").removesuffix("Gradient"))
    reads_data = reducer in ("Max", "LogSumExp", "LogMeanExp")

    def kernel(data_in, data_out, grad, segment_ids):
        _check_vector(op, segment_ids, 3, "SEGMENT_IDS", INT32)
        _check_data(op, grad, 2, "SEGMENT_GRADS")
        n, k, block = segment_ids.shape[0], grad.shape[0], grad.shape[1:]
        if n == 0:
            return jnp.zeros((0, *block), grad.dtype)
        _check_sorted_ids(op, segment_ids, 3, k)
        data = out = None
        if reads_data:
            for x, i, rows in ((data_in, 0, n), (data_out, 1, k)):
                _check_data(op, x, i, "DATA_IN" if i == 0 else "DATA_OUT")
                if x.size != rows * math.prod(block):
                    raise ShapeError(
                        f"{op.where}: input '{op.inputs[i]}' {_text(x)} must hold {rows} rows of "
                        f"SEGMENT_GRADS' block {list(block)}"
                    )
            data, out = _block(data_in, n, block), _block(data_out, k, block)
        return _expand(reducer, grad, segment_ids, data=data, out=out)

    return kernel


# --------------------------------------------------------------------------------------------------
# {Sorted,Unsorted}Segment and Sparse{Sorted,Unsorted}Segment {Sum,Mean,WeightedSum}:
# (DATA, [SCALARS,] [INDICES,] SEGMENT_IDS) -> [K, ...]

_SEGMENT_REDUCERS = ("Sum", "Mean", "WeightedSum")
_SEGMENT_LAYOUTS = ("SortedSegment", "UnsortedSegment", "SparseSortedSegment", "SparseUnsortedSegment")


def _segment_forms(suffix: str = "") -> dict[str, tuple[str, str]]:
    return {f"{layout}{r}{suffix}": (layout, r) for layout in _SEGMENT_LAYOUTS for r in _SEGMENT_REDUCERS}


_SEGMENT_OPS = _segment_forms()
_SEGMENT_GRADIENTS = _segment_forms("Gradient")
runtime_checked(*_SEGMENT_OPS, *_SEGMENT_GRADIENTS)


def _check_scalars(op: Op, scalars: Any, i: int, rows: int) -> None:
    """WeightedSum's SCALARS: a float vector, one per reduced row."""
    _check_type(op, scalars, i, "SCALARS", FLOATS)
    if jnp.ndim(scalars) < 1 or scalars.shape[0] != rows:
        raise ShapeError(f"{op.where}: SCALARS '{op.inputs[i]}' must have {rows} rows, got {_text(scalars)}")


def segment_reduce(op: Op) -> Kernel:
    """Reduce DATA's rows (or, for Sparse*, the rows INDICES pick) by int32 SEGMENT_IDS: sorted ones from 0
    without gaps give K = last id + 1 segments; unsorted ones `num_segments` (default max id + 1)."""
    layout, reducer = _SEGMENT_OPS[op.type]
    weighted = reducer == "WeightedSum"
    sparse = layout.startswith("Sparse")
    ids_at = 1 + weighted + sparse
    num_segments = op.int("num_segments", -1) if "Unsorted" in layout else -1

    def kernel(data, *rest):
        ids = _concrete(op, rest[-1], ids_at)
        _check_vector(op, ids, ids_at, "SEGMENT_IDS", INT32)
        n = ids.shape[0]
        _check_data(op, data)
        if sparse:
            indices = rest[-2]
            _check_vector(op, indices, ids_at - 1, "INDICES", INDEX_TYPES, n)
            _check_ids_range(op, indices, ids_at - 1, data.shape[0], "index")
            rows = _gather(data, indices)
        else:
            _check_rows(op, data, 0, "DATA", n)
            rows = data
        weights = None
        if weighted:
            _check_vector(op, rest[0], 1, "SCALARS", FLOATS, n)
            weights = rest[0]
        if "Unsorted" in layout:
            k = num_segments if num_segments != -1 else int(ids.max(initial=-1)) + 1
            _check_ids_range(op, ids, ids_at, k)
        else:
            _check_sorted_ids(op, ids, ids_at)
            k = int(ids[-1]) + 1 if n else 0
        return _reduce(reducer, rows, ids, k, weights)

    return kernel


def segment_reduce_gradient(op: Op) -> Kernel:
    """([SCALARS,] SEGMENT_GRADS [K, ...], SEGMENT_IDS [N]) -> [N, ...] (the Sparse* forms' gradient ops
    are the same: the rows' gradient, before the gather)."""
    layout, reducer = _SEGMENT_GRADIENTS[op.type]
    weighted = reducer == "WeightedSum"

    def kernel(*args):
        grad, segment_ids = args[-2], args[-1]
        ids_at = len(args) - 1
        _check_vector(op, segment_ids, ids_at, "SEGMENT_IDS", INT32)
        _check_data(op, grad, ids_at - 1, "SEGMENT_GRADS")
        n, k = segment_ids.shape[0], grad.shape[0]
        weights = None
        if weighted:
            _check_scalars(op, args[0], 0, n)
            weights = jnp.ravel(args[0])[:n]  # Caffe2 reads SCALARS flat
        if n == 0:
            return jnp.zeros((0, *grad.shape[1:]), grad.dtype)
        if "Unsorted" in layout:
            _check_ids_range(op, segment_ids, ids_at, k)
        else:
            _check_sorted_ids(op, segment_ids, ids_at, k)
        return _expand(reducer, grad, segment_ids, weights)

    return kernel


for _name, (_layout, _reducer) in _SEGMENT_OPS.items():
    _arity = 2 + (_reducer == "WeightedSum") + _layout.startswith("Sparse")
    register(_name, inputs=_arity, static_inputs=(_arity - 1,))(segment_reduce)


@facet(
    "gradient",
    "SortedSegmentSum",
    "SortedSegmentMean",
    "SortedSegmentWeightedSum",
    "UnsortedSegmentSum",
    "UnsortedSegmentMean",
    "UnsortedSegmentWeightedSum",
    "SparseSortedSegmentSum",
    "SparseSortedSegmentMean",
    "SparseSortedSegmentWeightedSum",
    "SparseUnsortedSegmentSum",
    "SparseUnsortedSegmentMean",
    "SparseUnsortedSegmentWeightedSum",
)
def _segment_gradient_maker(g: GradientContext) -> GradientOps:
    """SegmentOpGetGradient. The Sparse* forms' gradient is a GradientSlice (INDICES, values) from the same
    gradient op."""
    if g.flag("grad_on_weights", False) and g.op.type.endswith("WeightedSum"):
        raise GradientError("grads on aux inputs are not yet implemented for Segment operators.")
    reducer = next(r for r in _SEGMENT_REDUCERS[::-1] if g.op.type.endswith(r))
    sparse = g.op.type.startswith("Sparse")
    layout = g.op.type.removeprefix("Sparse").removesuffix(reducer)
    aux = 2 if reducer == "WeightedSum" else 1
    inputs = [g.I(1)] if reducer == "WeightedSum" else []
    inputs += [g.GO(0), g.I(aux + sparse)]
    if sparse:
        values = g.I(0) + "_grad_values"
        g.set_dense(0, (g.I(aux), values))  # type: ignore[arg-type]  (a sparse gradient: indices, values)
    else:
        values = g.GI(0)
    return [gradient_op(f"{layout}{reducer}Gradient", inputs, [values])]


for _name, (_layout, _reducer) in _SEGMENT_GRADIENTS.items():
    register(_name, inputs=2 + (_reducer == "WeightedSum"))(segment_reduce_gradient)


# --------------------------------------------------------------------------------------------------
# Lengths{Sum,Mean,Max,WeightedSum}: (DATA, [SCALARS,] LENGTHS) -> [len(LENGTHS), ...]

runtime_checked(
    "LengthsSum", "LengthsMean", "LengthsMax", "LengthsWeightedSum", "LengthsIndicesInGradientSumGradient",
    "LengthsIndicesInGradientMeanGradient", "LengthsWeightedSumGradient", "LengthsWeightedSumWithMainInputGradient",
    "LengthsMaxWithMainInputAndForwardOutputGradient", "LengthsToShape",
)  # fmt: skip


@register("LengthsSum", "LengthsMean", "LengthsMax", inputs=2)
@register("LengthsWeightedSum", inputs=3)
def lengths_reduce(op: Op) -> Kernel:
    """Reduce consecutive runs of DATA's rows, LENGTHS (int32) rows each; an empty run gives 0."""
    reducer = op.type.removeprefix("Lengths")

    def kernel(data, *rest):
        lengths = rest[-1]
        li = len(op.inputs) - 1
        _check_data(op, data)
        _check_vector(op, lengths, li, "LENGTHS", INT32)
        weights = None
        if reducer == "WeightedSum":
            _check_vector(op, rest[0], 1, "SCALARS", FLOATS, data.shape[0])
            weights = rest[0]
        _check_lengths_total(op, lengths, li, data.shape[0])
        return _reduce(reducer, data, _lengths_ids(lengths, data.shape[0]), lengths.shape[0], weights)

    return kernel


@facet("gradient", "LengthsSum", "LengthsMean")
def _lengths_reduce_gradient_maker(g: GradientContext) -> GradientOps:
    """LengthsOpGetGradient: `LengthsIndicesInGradient<Reducer>Gradient(dY, LENGTHS, DATA)`."""
    kind = g.op.type.removeprefix("Lengths")
    return [gradient_op(f"LengthsIndicesInGradient{kind}Gradient", [g.GO(0), g.I(1), g.I(0)], [g.GI(0)])]


@facet("gradient", "LengthsMax")
def _lengths_max_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.O(0), g.GO(0), g.I(1), g.I(0)]
    return [gradient_op("LengthsMaxWithMainInputAndForwardOutputGradient", inputs, [g.GI(0)])]


@facet("gradient", "LengthsWeightedSum")
def _lengths_weighted_sum_gradient_maker(g: GradientContext) -> GradientOps:
    """With `grad_on_weights` the gradient op also reads DATA and gives SCALARS' gradient."""
    if g.flag("grad_on_weights", False):
        inputs, outputs = [g.I(1), g.GO(0), g.I(2), g.I(0)], [g.GI(0), g.GI(1)]
        return [gradient_op("LengthsWeightedSumWithMainInputGradient", inputs, outputs)]
    return [gradient_op("LengthsWeightedSumGradient", [g.I(1), g.GO(0), g.I(2)], [g.GI(0)])]


facet("roles", "LengthsSum")(Roles(integers=slice(1, None)))  # LENGTHS


def _lengths_grad_rows(op: Op, grad: Any, gi: int, lengths: Any, li: int) -> None:
    if jnp.ndim(lengths) == 1 and (jnp.ndim(grad) < 1 or grad.shape[0] != lengths.shape[0]):
        raise ShapeError(
            f"{op.where}: input '{op.inputs[gi]}' of shape {tuple(grad.shape)} needs one row per "
            f"length in '{op.inputs[li]}' ({lengths.shape[0]})"
        )
    _check_vector(op, lengths, li, "LENGTHS", INT32)
    _check_data(op, grad, gi, "SEGMENT_GRADS")


@register("LengthsSumGradient", "LengthsMeanGradient", inputs=2, static_inputs=(1,))
def lengths_gradient(op: Op) -> Kernel:
    """(SEGMENT_GRADS [S, ...], LENGTHS [S]) -> [sum(LENGTHS), ...]: the LENGTHS values decide the rows."""
    reducer = op.type.removeprefix("Lengths").removesuffix("Gradient")

    def kernel(grad, lengths):
        lens = _concrete(op, lengths, 1)
        _lengths_grad_rows(op, grad, 0, lens, 1)
        if (lens < 0).any():
            raise ShapeError(f"{op.where}: input '{op.inputs[1]}' has negative lengths {lens.tolist()}")
        rows = int(lens.astype(np.int64).sum())
        return _expand(reducer, grad, _lengths_ids(lens, rows))

    return kernel


@register("LengthsIndicesInGradientSumGradient", "LengthsIndicesInGradientMeanGradient", inputs=3)
@register("LengthsWeightedSumGradient", inputs=3)
def lengths_gradient_sized(op: Op) -> Kernel:
    """The gradient ops whose other input has the rows: (SEGMENT_GRADS, LENGTHS, DATA) for Sum/Mean
    (DATA only gives the row count) and (SCALARS, SEGMENT_GRADS, LENGTHS) for WeightedSum."""
    reducer = op.type.removeprefix("Lengths").removeprefix("IndicesInGradient").removesuffix("Gradient")
    weighted = reducer == "WeightedSum"

    def kernel(a, b, c):
        (scalars, grad, lengths), li = ((a, b, c), 2) if weighted else ((c, a, b), 1)
        gi = 1 if weighted else 0
        _lengths_grad_rows(op, grad, gi, lengths, li)
        si = 0 if weighted else 2
        if jnp.ndim(scalars) < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[si]}' must have at least 1 dim")
        rows = scalars.shape[0]
        weights = None
        if weighted:
            _check_scalars(op, scalars, 0, rows)
            weights = jnp.ravel(scalars)[:rows]
        _check_lengths_total(op, lengths, li, rows, negatives=False)
        return _expand(reducer, grad, _lengths_ids(lengths, rows), weights)

    return kernel


@register("LengthsWeightedSumWithMainInputGradient", inputs=4, outputs=(1, 2))
def lengths_weighted_sum_with_main_input_gradient(op: Op) -> Kernel:
    """(SCALARS, SEGMENT_GRADS, LENGTHS, DATA) -> (DATA's gradient, SCALARS' gradient: each row's dot
    product with its segment's gradient). Caffe2 needs both outputs (with one it writes the SCALARS
    gradient through an unset pointer)."""

    def kernel(scalars, grad, lengths, data):
        _lengths_grad_rows(op, grad, 1, lengths, 2)
        _check_data(op, data, 3)
        rows = data.shape[0]
        _check_scalars(op, scalars, 0, rows)
        if data.shape[1:] != grad.shape[1:]:
            raise ShapeError(f"{op.where}: DATA {_text(data)} and SEGMENT_GRADS {_text(grad)} rows differ")
        _check_lengths_total(op, lengths, 2, rows, negatives=False)
        ids = _lengths_ids(lengths, rows)
        weights = jnp.ravel(scalars)[:rows]
        g = _take(grad, ids)
        d_scalars = jnp.sum(jnp.reshape(g * data, (rows, size_from_dim(data.shape, 1))), axis=1)
        return g * _column(weights, g.ndim), jnp.reshape(d_scalars, scalars.shape)

    return kernel


@register("LengthsMaxWithMainInputAndForwardOutputGradient", inputs=4)
def lengths_max_gradient(op: Op) -> Kernel:
    """(OUTPUT [S, ...], SEGMENT_GRADS [S, ...], LENGTHS [S], DATA [N, ...]) -> [N, ...]: the gradient goes
    to every row equal to its segment's max."""

    def kernel(out, grad, lengths, data):
        _lengths_grad_rows(op, grad, 1, lengths, 2)
        _check_data(op, data, 3)
        _check_data(op, out, 0, "OUTPUT")
        if out.shape != grad.shape or data.shape[1:] != grad.shape[1:]:
            raise ShapeError(
                f"{op.where}: OUTPUT {_text(out)}, SEGMENT_GRADS {_text(grad)} and DATA {_text(data)} do not fit"
            )
        _check_lengths_total(op, lengths, 2, data.shape[0], negatives=False)
        return _expand("Max", grad, _lengths_ids(lengths, data.shape[0]), data=data, out=out)

    return kernel


# --------------------------------------------------------------------------------------------------
# ReduceFrontWeightedSum: (DATA, SCALARS) -> DATA's leading `num_reduce_dim` dims summed, weighted


def _num_reduce_dim(op: Op) -> int:
    num = op.int("num_reduce_dim", 1)
    if num < 0:
        raise BadArgumentError(f"{op.where}: argument 'num_reduce_dim' = {num} must not be negative")
    return num


@register("ReduceFrontWeightedSum", inputs=2)
def reduce_front_weighted_sum(op: Op) -> Kernel:
    """SCALARS has `num_reduce_dim` dims and one weight per reduced block of DATA."""
    num = _num_reduce_dim(op)

    def kernel(data, scalars):
        _check_type(op, data, 0, "DATA", FLOATS)
        _check_type(op, scalars, 1, "SCALARS", FLOATS)
        if num > data.ndim:
            raise ShapeError(f"{op.where}: num_reduce_dim {num} is more than DATA's {data.ndim} dims")
        blocks = size_to_dim(data.shape, num)
        if scalars.ndim != num or scalars.size != blocks:
            raise ShapeError(
                f"{op.where}: SCALARS '{op.inputs[1]}' {_text(scalars)} must have {num} dims and {blocks} "
                "elements, one per reduced block of DATA"
            )
        rows = jnp.reshape(data, (blocks, size_from_dim(data.shape, num)))
        return jnp.reshape(jnp.ravel(scalars) @ rows, data.shape[num:]).astype(data.dtype)

    return kernel


@facet("gradient", "ReduceFrontWeightedSum")
def _reduce_front_weighted_sum_gradient_maker(g: GradientContext) -> GradientOps:
    """DATA's shape through a Shape op; both ops get the forward arguments."""
    dims = "_" + g.O(0) + "_dims"
    return [
        gradient_op("Shape", [g.I(0)], [dims]),
        gradient_op("ReduceFrontWeightedSumGradient", [g.I(1), g.GO(0), dims], [g.GI(0)]),
    ]


@register("ReduceFrontWeightedSumGradient", inputs=3, static_inputs=(2,))
def reduce_front_weighted_sum_gradient(op: Op) -> Kernel:
    """(SCALARS, dY, SHAPE of DATA (int64, from a Shape op)) -> dDATA: each block is its weight * dY."""
    num = _num_reduce_dim(op)

    def kernel(scalars, grad, shape):
        dims = _concrete(op, shape, 2)
        _check_type(op, dims, 2, "SOURCE_SHAPE", INDEX_TYPES)
        _check_type(op, scalars, 0, "SCALARS", FLOATS)
        _check_type(op, grad, 1, "dY", FLOATS)
        dims = tuple(int(d) for d in dims.ravel())
        if num > len(dims) or min(dims, default=0) < 0:
            raise ShapeError(f"{op.where}: SOURCE_SHAPE {list(dims)} does not fit num_reduce_dim {num}")
        blocks, block = size_to_dim(dims, num), size_from_dim(dims, num)
        if grad.size != block or (block and scalars.size < blocks):
            raise ShapeError(
                f"{op.where}: dY {_text(grad)} and SCALARS {_text(scalars)} do not fit a DATA of shape {list(dims)}"
            )
        if block == 0:
            return jnp.zeros(dims, grad.dtype)
        out = jnp.ravel(scalars)[:blocks, None] * jnp.ravel(grad)[None, :]
        return jnp.reshape(out, dims)

    return kernel


@register("ReduceTailSum", gradient=NO_GRADIENT)
def reduce_tail_sum(op: Op) -> Kernel:
    """[N, ...] -> [N]: the sum of each row (caffe2/operators/rowmul_op.h)."""

    def kernel(x):
        _check_data(op, x)
        return jnp.sum(jnp.reshape(x, (x.shape[0], size_from_dim(x.shape, 1))), axis=1)

    return kernel


# --------------------------------------------------------------------------------------------------
# Conversions between lengths, offsets, ranges and segment ids (caffe2/operators/utility_ops.h)


@register("LengthsToRanges", gradient=NO_GRADIENT)
def lengths_to_ranges(op: Op) -> Kernel:
    """LENGTHS [N] int32 -> int32 [N, 2] of (offset, length)."""

    def kernel(lengths):
        _check_vector(op, lengths, 0, "LENGTHS", INT32)
        lengths = jnp.asarray(lengths)
        return jnp.stack([jnp.cumsum(lengths, dtype=jnp.int32) - lengths, lengths], axis=1)

    return kernel


@register("LengthsToOffsets", gradient=NO_GRADIENT)
def lengths_to_offsets(op: Op) -> Kernel:
    """LENGTHS [N] int32 -> int32 [N] of offsets, [N + 1] with `include_last_offset` (the total last)."""
    last = op.bool("include_last_offset", False)

    def kernel(lengths):
        _check_vector(op, lengths, 0, "LENGTHS", INT32)
        lengths = jnp.asarray(lengths)
        ends = jnp.cumsum(lengths, dtype=jnp.int32)
        return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends]) if last else ends - lengths

    return kernel


@register("LengthsToShape", gradient=should_not_do_gradient)
def lengths_to_shape(op: Op) -> Kernel:
    """LENGTHS [N] int32, all equal -> int32 [N, LENGTHS[0]] (a shape for Reshape)."""

    def kernel(lengths):
        _check_vector(op, lengths, 0, "LENGTHS", INT32)
        if lengths.shape[0] == 0:  # Caffe2 reads LENGTHS[0] of an empty tensor
            raise ShapeError(f"{op.where}: LENGTHS '{op.inputs[0]}' is empty")
        lengths = jnp.asarray(lengths) if _is_traced(lengths) else np.asarray(lengths)
        enforce((lengths == lengths[0]).all(), f"{_where(op, 0)}: all elements of LENGTHS must be the same")
        return jnp.stack([jnp.asarray(lengths.shape[0], jnp.int32), jnp.asarray(lengths[0], jnp.int32)])

    return kernel


@register("LengthsToSegmentIds", static_inputs=(0,), gradient=should_not_do_gradient)
def lengths_to_segment_ids(op: Op) -> Kernel:
    """LENGTHS [S] int32 -> int32 [sum(LENGTHS)]: each row's segment index."""

    def kernel(lengths):
        lens = _concrete(op, lengths, 0)
        _check_vector(op, lens, 0, "LENGTHS", INT32)
        _non_negative(op, lens, 0)
        return np.repeat(np.arange(lens.size, dtype=np.int32), lens)

    return kernel


def _non_negative(op: Op, lengths: np.ndarray, i: int) -> None:
    if (lengths < 0).any():
        raise ShapeError(f"{op.where}: input '{op.inputs[i]}' has negative lengths {lengths.tolist()}")


@register("LengthsToWeights", static_inputs=(0,), gradient=NO_GRADIENT)
def lengths_to_weights(op: Op) -> Kernel:
    """LENGTHS [S] (int32/int64) -> float32 [sum(LENGTHS)]: each row weighted 1 / length ** `power`
    (default 0.5)."""
    power = op.float("power", 0.5)

    def kernel(lengths):
        lens = _concrete(op, lengths, 0)
        _check_vector(op, lens, 0, "LENGTHS", INDEX_TYPES)
        _non_negative(op, lens, 0)
        with np.errstate(divide="ignore"):
            lens64 = lens.astype(np.float64)
            root = np.sqrt(lens64) if power == 0.5 else np.power(lens64, np.float64(np.float32(power)))
            weights = 1.0 / root
        return np.repeat(weights, lens).astype(np.float32)

    return kernel


def _segment_count(op: Op, ids: np.ndarray, sizes: Any) -> int:
    """Caffe2's number of segments: last id + 1, or the rows of the optional second input (which must
    not be fewer)."""
    count = int(ids[-1]) + 1 if ids.size else 0
    if sizes is not None:
        if jnp.ndim(sizes) < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[1]}' must have at least 1 dim")
        if count > sizes.shape[0]:
            raise ShapeError(
                f"{op.where}: segment ids in '{op.inputs[0]}' need {count} segments, more than the "
                f"{sizes.shape[0]} rows of '{op.inputs[1]}'"
            )
        count = sizes.shape[0]
    if count < 0:
        raise ShapeError(f"{op.where}: segment ids in '{op.inputs[0]}' must be in 0..K-1")
    return count


def _segment_ids_input(op: Op, segment_ids: Any, matrix_ok: bool) -> np.ndarray:
    ids = _concrete(op, segment_ids, 0)
    _check_type(op, ids, 0, "SEGMENT_IDS", INDEX_TYPES)
    vector = ids.ndim == 1 or (matrix_ok and ids.ndim == 2 and 1 in ids.shape)
    if not vector:
        raise ShapeError(f"{op.where}: SEGMENT_IDS '{op.inputs[0]}' must be a vector, got {_text(ids)}")
    return ids.ravel().astype(np.int64)


def _check_sorted_from_zero(op: Op, ids: np.ndarray, first: int = 0) -> None:
    if ids.size and (ids[0] < first or (np.diff(ids) < 0).any()):
        raise ShapeError(f"{op.where}: segment ids in '{op.inputs[0]}' must be sorted and not negative")


@register("SegmentIdsToLengths", inputs=(1, 2), static_inputs=(0,), gradient=should_not_do_gradient)
def segment_ids_to_lengths(op: Op) -> Kernel:
    """SEGMENT_IDS [N] (sorted, int32/int64; [1, N] or [N, 1] too) -> int32 [K]: each segment's length."""

    def kernel(segment_ids, sizes=None):
        ids = _segment_ids_input(op, segment_ids, matrix_ok=True)
        count = _segment_count(op, ids, sizes)
        if count == 0:  # Caffe2 returns before looking at the ids
            return np.zeros((0,), np.int32)
        _check_sorted_from_zero(op, ids)
        return np.bincount(ids, minlength=count).astype(np.int32)

    return kernel


@register("SegmentIdsToRanges", inputs=(1, 2), static_inputs=(0,), gradient=should_not_do_gradient)
def segment_ids_to_ranges(op: Op) -> Kernel:
    """SEGMENT_IDS [N] (sorted, int32/int64) -> int32 [K, 2] of (offset, length); a segment with no ids
    starts where the next present one does (segments before the first id start at 0)."""

    def kernel(segment_ids, sizes=None):
        ids = _segment_ids_input(op, segment_ids, matrix_ok=False)
        count = _segment_count(op, ids, sizes)
        if count == 0 or ids.size == 0:
            return np.zeros((count, 2), np.int32)
        # Caffe2 starts from the first id, so a negative one writes before the output: refused here
        _check_sorted_from_zero(op, ids)
        segments = np.arange(count)
        # a segment after the last id is never reached by Caffe2's walk: it keeps offset 0
        starts = np.where(segments <= ids[-1], np.searchsorted(ids, segments, side="left"), 0)
        return np.stack([starts, np.bincount(ids, minlength=count)], axis=1).astype(np.int32)

    return kernel
