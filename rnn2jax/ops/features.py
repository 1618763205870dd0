"""Feature transforms of recommendation models: n-gram ids of categorical columns (NGramFromCategorical),
dense vectors as id lists (DenseVectorToIdList), rows split by key (KeySplit), and the pairwise dot
interaction of embeddings (ConcatBatchMatMulBatchGatherOp).

Sources: caffe2/operators/ngram_ops.h, dense_vector_to_id_list_op.h, key_split_ops.h, cc_bmm_bg_op.h.
Ops whose output sizes depend on their input's values read it as a static (concrete) input.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .common import matmul_precision
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Absent, Roles
from .gradient_makers import GradientContext, GradientOps, gradient_op, no_gradient
from .registry import Kernel, declare_family, register, register_host_op
from .strings import moves_strings

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)
_NO_MAKER = Absent("Caffe2 registers no gradient maker for it")


def _expect(op: Op, index: int, x: Any, dtype: Any) -> None:
    if np.dtype(x.dtype) != np.dtype(dtype):
        raise InputTypeError(f"{op.where}: input '{op.inputs[index]}' must be {np.dtype(dtype)}, got {x.dtype}")


@register("NGramFromCategorical", gradient=no_gradient)
def ngram_from_categorical(op: Op) -> Kernel:
    """One int64 id per row of float X [N, ...]: for each column `col_ids[k]`, its value rounded (half away
    from zero) is looked up among the `categorical_limits[k]` values of `vals` for it, position m giving
    m * (product of the earlier limits); unknown values count as the first. The ids of the columns add up."""
    col_ids = [int(c) for c in op.ints("col_ids", ())]
    limits = [int(n) for n in op.ints("categorical_limits", ())]
    vals = [int(v) for v in op.ints("vals", ())]
    if not col_ids:
        raise BadArgumentError(f"{op.where}: argument 'col_ids' is required (at least one column)")
    if len(limits) != len(col_ids):
        raise BadArgumentError(f"{op.where}: {len(col_ids)} col_ids but {len(limits)} categorical_limits")
    if any(n <= 0 for n in limits):
        raise BadArgumentError(f"{op.where}: categorical_limits must be positive, got {limits}")
    if sum(limits) != len(vals):
        raise BadArgumentError(f"{op.where}: categorical_limits add up to {sum(limits)} but vals has {len(vals)}")
    if any(c < 0 for c in col_ids):
        raise BadArgumentError(f"{op.where}: col_ids must not be negative, got {col_ids}")
    maps, base, start = [], 1, 0
    for n in limits:
        table: dict[int, int] = {}
        for m, value in enumerate(vals[start : start + n]):
            table[value] = m * base  # a repeated value keeps its last position, as std::map assignment does
        maps.append((np.asarray(list(table), np.int64), np.asarray(list(table.values()), np.int64)))
        base *= n
        start += n

    def kernel(x: jax.Array) -> jax.Array:
        _expect(op, 0, x, _F32)
        if x.ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must have a batch dim, got a scalar")
        rows = x.reshape(x.shape[0], -1)
        if rows.shape[1] <= max(col_ids):
            raise ShapeError(
                f"{op.where}: input '{op.inputs[0]}' has {rows.shape[1]} columns, col_ids reach {max(col_ids)}"
            )
        out = jnp.zeros(x.shape[0], jnp.int64)
        for column, (keys, ids) in zip(col_ids, maps, strict=True):
            value = rows[:, column]
            rounded = (jnp.sign(value) * jnp.floor(jnp.abs(value) + 0.5)).astype(jnp.int64)
            hits = rounded[:, None] == jnp.asarray(keys)[None, :]
            out = out + jnp.sum(jnp.where(hits, jnp.asarray(ids)[None, :], 0), axis=1)
        return out

    return kernel


@register("DenseVectorToIdList", outputs=2, static_inputs=(0,), gradient=no_gradient)
def dense_vector_to_id_list(op: Op) -> Kernel:
    """float32 [N, D] -> (int32 lengths [N], int32 column ids): the columns of each row whose value, plus 0.5
    and truncated to an int, is not 0. The ids' count depends on the values, so the input is static."""

    def kernel(x: Any) -> tuple[jax.Array, jax.Array]:
        if np.dtype(x.dtype) != _F32:
            raise InputTypeError(f"{op.where}: DenseVectorToIdList only supports 32-bit float, got {x.dtype}")
        if x.ndim != 2:
            raise ShapeError(f"{op.where}: Sample should be 2-D, got shape {list(x.shape)}")
        values = np.asarray(x)
        keep = np.trunc(values + np.float32(0.5)) != 0
        return jnp.asarray(keep.sum(axis=1), jnp.int32), jnp.asarray(np.nonzero(keep)[1], jnp.int32)

    return kernel


@register("KeySplit", outputs=(1, None), static_inputs=(0,), roles=Roles(integers=(0,)), gradient=_NO_MAKER)
def key_split(op: Op) -> Kernel:
    """int64 keys in [0, `categorical_limit`) -> one int32 output per key value k: the positions holding k.
    Sizes depend on the values, so the keys are static."""
    limit = op.int("categorical_limit", 0)
    if limit <= 0:
        raise BadArgumentError(f"{op.where}: categorical_limit must be positive, got {limit}")
    if len(op.outputs) != limit:
        raise BadArgumentError(
            f"{op.where}: KeySplit writes one output per key value: categorical_limit {limit}, "
            f"got {len(op.outputs)} outputs"
        )

    def kernel(keys: Any) -> tuple[jax.Array, ...]:
        _expect(op, 0, keys, np.int64)
        flat = np.asarray(keys).ravel()
        bad = (flat < 0) | (flat >= limit)
        if bad.any():
            raise ShapeError(f"{op.where}: key {flat[bad][0]} in '{op.inputs[0]}' is outside [0, {limit})")
        return tuple(jnp.asarray(np.flatnonzero(flat == k), jnp.int32) for k in range(limit))

    return kernel


runtime_checked("ConcatBatchMatMulBatchGatherOp")


@register("ConcatBatchMatMulBatchGatherOp", inputs=(2, None), gradient=_NO_MAKER, roles=Roles(integers=(0,)))
def concat_batch_matmul_batch_gather(op: Op) -> Kernel:
    """(indices int32 [G], X1..Xn float32 [B, ...]) -> [B, G]: for each example b, the n x n matrix of dot
    products of the inputs' rows b (flattened), gathered at the flat `indices` (the pairwise interaction
    of DLRM-style models)."""

    def kernel(indices: jax.Array, *xs: jax.Array) -> jax.Array:
        _expect(op, 0, indices, np.int32)
        for i, x in enumerate(xs, 1):
            _expect(op, i, x, _F32)
            if x.shape != xs[0].shape:
                raise ShapeError(
                    f"{op.where}: input '{op.inputs[i]}' has shape {list(x.shape)}, '{op.inputs[1]}' "
                    f"{list(xs[0].shape)}: they must be equal"
                )
        if xs[0].ndim < 1:
            raise ShapeError(f"{op.where}: input '{op.inputs[1]}' must have a batch dim")
        if indices.ndim != 1:
            raise ShapeError(f"{op.where}: indices '{op.inputs[0]}' must be 1-D, got shape {list(indices.shape)}")
        n = len(xs)
        stacked = jnp.stack([x.reshape(x.shape[0], -1) for x in xs], axis=1)  # [B, n, E]
        products = jnp.einsum("bie,bje->bij", stacked, stacked, precision=matmul_precision()).reshape(-1, n * n)
        if indices.size:
            bad = (indices < 0) | (indices >= n * n)
            enforce(
                ~jnp.any(bad),
                f"{literal(op.where)}: indices '{literal(op.inputs[0])}' holds {{index}}, outside the {n * n} "
                "pairwise products",
                index=indices[jnp.argmax(bad)],
            )
        return products[:, jnp.clip(indices, 0, n * n - 1)]

    return kernel


# --------------------------------------------------------------------------------------------------
# Feature maps (caffe2/operators/feature_maps_ops.h): merging per-feature tensors into one
# (lengths, keys, values...) record per example, and their gradients. Which items go where depends on the
# lengths and presence inputs, so those are static; the values are gathered (and may be traced).

_VALUE_TYPES = tuple(np.dtype(t) for t in (np.bool_, np.int32, np.int64, np.float32, np.float64))


def _static_every(stride: int, positions: tuple[int, ...], tail: int = 0) -> Any:
    """The static inputs: `positions` within each group of `stride` inputs (the last `tail` inputs apart)."""

    def static(op: Op) -> tuple[int, ...]:
        count = len(op.inputs) - tail
        return tuple(g + p for g in range(0, count, stride) for p in positions)

    return static


def _groups(op: Op, stride: int, tail: int = 0) -> int:
    count = len(op.inputs) - tail
    if count < stride or count % stride:
        raise BadArgumentError(
            f"{op.where}: {op.type} takes {stride} inputs per feature"
            + (" and the gradient" if tail else "")
            + f", got {len(op.inputs)}"
        )
    return count // stride


def _feature_ids(op: Op, count: int) -> np.ndarray:
    ids = np.asarray(op.ints("feature_ids", ()), np.int64)
    if ids.size < count:
        raise BadArgumentError(f"{op.where}: argument 'feature_ids' has {ids.size} ids for {count} features")
    return ids


def _ints(op: Op, index: int, x: Any, dtype: Any = np.int32) -> np.ndarray:
    if np.dtype(x.dtype) != np.dtype(dtype):
        raise InputTypeError(f"{op.where}: input '{op.inputs[index]}' must be {np.dtype(dtype)}, got {x.dtype}")
    return np.asarray(x).ravel()


def _values(op: Op, index: int, x: Any) -> jax.Array:
    if np.dtype(x.dtype) not in _VALUE_TYPES:
        raise InputTypeError(
            f"{op.where}: values '{op.inputs[index]}' of type {x.dtype} are not supported (numbers and bools; "
            "JAX has no strings)"
        )
    return jnp.ravel(x)


def _order(op: Op, counts: list[np.ndarray], sizes: list[int], names: list[str]) -> np.ndarray:
    """Where each output item comes from in the inputs concatenated: example by example, input by input,
    the next counts[i][e] items of input i."""
    base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cursors = [0] * len(counts)
    pieces = []
    examples = len(counts[0]) if counts else 0
    for e in range(examples):
        for i, count in enumerate(counts):
            n = int(count[e])
            if n < 0 or cursors[i] + n > sizes[i]:
                raise ShapeError(f"{op.where}: '{names[i]}' has {sizes[i]} items, fewer than its lengths take")
            pieces.append(np.arange(base[i] + cursors[i], base[i] + cursors[i] + n))
            cursors[i] += n
    return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros((0,), np.int64)


def _take(parts: list[jax.Array], order: np.ndarray) -> jax.Array:
    joined = jnp.concatenate(parts) if parts else jnp.zeros((0,), jnp.float32)
    return joined[jnp.asarray(order)] if order.size else jnp.zeros((0,), joined.dtype)


def _same_examples(op: Op, arrays: list[np.ndarray], positions: list[int]) -> int:
    examples = arrays[0].size
    for array, p in zip(arrays, positions, strict=True):
        if array.size != examples:
            raise ShapeError(
                f"{op.where}: '{op.inputs[p]}' has {array.size} examples, '{op.inputs[positions[0]]}' {examples}"
            )
    return examples


def _keys_of(ids: np.ndarray, counts: list[np.ndarray]) -> np.ndarray:
    """feature_ids[i] once for each of input i's counts[i][e] items, in output order."""
    examples = len(counts[0]) if counts else 0
    keys = [np.full(int(c[e]), ids[i], np.int64) for e in range(examples) for i, c in enumerate(counts)]
    return np.concatenate(keys) if keys else np.zeros((0,), np.int64)


@register(
    "MergeDenseFeatureTensors",
    inputs=2,
    outputs=3,
    static_inputs=(1,),
    gradient=_NO_MAKER,
)
def merge_dense_feature_tensors(op: Op) -> Kernel:
    """(data [N, F], presence bool [N, F]) -> (lengths int32 [N], keys int64, values): the present entries of
    each row, keyed by `feature_ids` of their column."""

    def kernel(data: jax.Array, presence: Any) -> tuple[jax.Array, ...]:
        present = np.asarray(presence).astype(bool)
        if np.dtype(presence.dtype) != np.bool_ or data.ndim != 2 or present.shape != data.shape:
            raise ShapeError(
                f"{op.where}: data '{op.inputs[0]}' must be [N, F] and presence '{op.inputs[1]}' bool of that shape, "
                f"got {list(data.shape)} and {presence.dtype}{list(present.shape)}"
            )
        ids = _feature_ids(op, data.shape[1])
        rows, cols = np.nonzero(present)
        flat = rows * data.shape[1] + cols
        values = _values(op, 0, data)
        return (
            jnp.asarray(present.sum(axis=1), jnp.int32),
            jnp.asarray(ids[cols], jnp.int64),
            values[jnp.asarray(flat)] if flat.size else jnp.zeros((0,), values.dtype),
        )

    return kernel


def _merge_maker(stride: int, reads: tuple[int, ...], grad_of: int, writes: int, gradient_type: str) -> Any:
    """Caffe2's makers of the feature-map merges: `gradient_type`(the inputs at `reads` of each feature,
    GO(grad_of)) -> GI(writes) of each feature, the forward op's arguments copied."""

    def maker(g: GradientContext) -> GradientOps:
        groups = range(len(g.op.input) // stride)
        ins = [g.I(stride * i + r) for i in groups for r in reads]
        return [gradient_op(gradient_type, [*ins, g.GO(grad_of)], [g.GI(stride * i + writes) for i in groups])]

    return maker


@register(
    "MergeSingleScalarFeatureTensors",
    inputs=(2, None),
    outputs=3,
    static_inputs=_static_every(2, (1,)),
    gradient=_merge_maker(2, (1,), 2, 0, "MergeSingleScalarFeatureTensorsGradient"),
)
def merge_single_scalar(op: Op) -> Kernel:
    """(values [N], presence bool [N]) per feature -> (lengths int32 [N], keys int64, values): for each
    example, the present features' values keyed by `feature_ids`."""
    count = _groups(op, 2)
    ids = _feature_ids(op, count)

    def kernel(*xs: Any) -> tuple[jax.Array, ...]:
        presence = [_ints(op, 2 * i + 1, xs[2 * i + 1], np.bool_).astype(np.int64) for i in range(count)]
        examples = _same_examples(op, presence, [2 * i + 1 for i in range(count)])
        values = [_values(op, 2 * i, xs[2 * i]) for i in range(count)]
        for i, v in enumerate(values):
            if v.size != examples:
                raise ShapeError(f"{op.where}: values '{op.inputs[2 * i]}' have {v.size} items for {examples} examples")
        order = np.asarray(
            [i * examples + e for e in range(examples) for i in range(count) if presence[i][e]], np.int64
        )
        return (
            jnp.asarray(np.sum(presence, axis=0), jnp.int32),
            jnp.asarray(_keys_of(ids, presence)),
            _take(values, order),
        )

    return kernel


@register(
    "MergeSingleScalarFeatureTensorsGradient",
    inputs=(2, None),
    outputs=(1, None),
    static_inputs=lambda op: tuple(range(len(op.inputs) - 1)),
    gradient=GRADIENT_OP,
)
def merge_single_scalar_gradient(op: Op) -> Kernel:
    """(presence per feature..., values_grad) -> each feature's values gradient [N]: its items' gradients
    where present, 0 elsewhere."""
    count = len(op.inputs) - 1
    if len(op.outputs) != count:
        raise BadArgumentError(f"{op.where}: {count} presence inputs need {count} outputs, got {len(op.outputs)}")

    def kernel(*xs: Any) -> tuple[jax.Array, ...]:
        presence = [_ints(op, i, xs[i], np.bool_) for i in range(count)]
        examples = _same_examples(op, presence, list(range(count)))
        grad = _values(op, count, xs[count])
        order = np.asarray(
            [i * examples + e for e in range(examples) for i in range(count) if presence[i][e]], np.int64
        )
        if grad.size != order.size:
            raise ShapeError(
                f"{op.where}: values_grad '{op.inputs[count]}' has {grad.size} items for {order.size} present"
            )
        flat = (
            jnp.zeros(count * examples, grad.dtype).at[jnp.asarray(order)].set(grad)
            if order.size
            else jnp.zeros(count * examples, grad.dtype)
        )
        return tuple(flat[i * examples : (i + 1) * examples].reshape(xs[i].shape) for i in range(count))

    return kernel


# Caffe2's CPU op moves values_grad items of any type, strings too (absent items: "")
register_host_op(
    "MergeSingleScalarFeatureTensorsGradient",
    moves_strings(merge_single_scalar_gradient, together=(-1,)),
    string_inputs=(-1,),
)


def _merge_lists(op: Op, stride: int, has_keys: bool) -> Kernel:
    """MergeSingleList (stride 3: lengths, values, presence) and MergeSingleMap (stride 4: lengths, keys,
    values, presence) per feature -> (lengths [N], keys, values lengths, [values keys,] values values)."""
    count = _groups(op, stride)
    ids = _feature_ids(op, count)

    def kernel(*xs: Any) -> tuple[jax.Array, ...]:
        lengths = [_ints(op, stride * i, xs[stride * i]) for i in range(count)]
        presence = [_ints(op, stride * i + stride - 1, xs[stride * i + stride - 1], np.bool_) for i in range(count)]
        examples = _same_examples(
            op, lengths + presence, [stride * i for i in range(count)] + [stride * i + stride - 1 for i in range(count)]
        )
        taken = [np.where(p, n, 0) for n, p in zip(lengths, presence, strict=True)]
        present = [p.astype(np.int64) for p in presence]
        columns = range(1, stride - 1)  # values (lists), or keys then values (maps)
        outs = []
        for c in columns:
            parts = [_values(op, stride * i + c, xs[stride * i + c]) for i in range(count)]
            order = _order(op, taken, [v.size for v in parts], [op.inputs[stride * i + c] for i in range(count)])
            outs.append(_take(parts, order))
        value_lengths = [int(taken[i][e]) for e in range(examples) for i in range(count) if presence[i][e]]
        return (
            jnp.asarray(np.sum(present, axis=0) if count else np.zeros(examples), jnp.int32),
            jnp.asarray(_keys_of(ids, present)),
            jnp.asarray(np.asarray(value_lengths, np.int32)),
            *outs,
        )

    return kernel


@register(
    "MergeSingleListFeatureTensors",
    inputs=(3, None),
    outputs=4,
    static_inputs=_static_every(3, (0, 2)),
    gradient=_merge_maker(3, (0, 2), 3, 1, "MergeSingleListFeatureTensorsGradient"),
)
def merge_single_list(op: Op) -> Kernel:
    """(lengths [N], values, presence [N]) per feature -> (lengths, keys, values lengths, values): each
    example's present lists, keyed by `feature_ids`."""
    return _merge_lists(op, 3, False)


@register(
    "MergeSingleMapFeatureTensors",
    inputs=(4, None),
    outputs=5,
    static_inputs=_static_every(4, (0, 3)),
    gradient=_merge_maker(4, (0, 3), 4, 2, "MergeSingleMapFeatureTensorsGradient"),
)
def merge_single_map(op: Op) -> Kernel:
    """(lengths [N], keys, values, presence [N]) per feature -> (lengths, keys, values lengths, values keys,
    values values): each example's present maps, keyed by `feature_ids`."""
    return _merge_lists(op, 4, True)


@register(
    "MergeSingleListFeatureTensorsGradient",
    "MergeSingleMapFeatureTensorsGradient",
    inputs=(3, None),
    outputs=(1, None),
    static_inputs=lambda op: tuple(range(len(op.inputs) - 1)),
    gradient=GRADIENT_OP,
)
def merge_single_list_gradient(op: Op) -> Kernel:
    """(lengths, presence per feature..., values_grad) -> each feature's values gradient: the gradient of
    its present lists, taken back from the merged order."""
    count = _groups(op, 2, tail=1)
    if len(op.outputs) != count:
        raise BadArgumentError(f"{op.where}: {count} features need {count} outputs, got {len(op.outputs)}")

    def kernel(*xs: Any) -> tuple[jax.Array, ...]:
        lengths = [_ints(op, 2 * i, xs[2 * i]) for i in range(count)]
        presence = [_ints(op, 2 * i + 1, xs[2 * i + 1], np.bool_) for i in range(count)]
        taken = [np.where(p, n, 0) for n, p in zip(lengths, presence, strict=True)]
        return _scatter_back(op, taken, xs[-1], count)

    return kernel


def _scatter_back(op: Op, taken: list[np.ndarray], grad_blob: Any, count: int) -> tuple[jax.Array, ...]:
    """The inverse of a merge: output i gets, in order, the gradient items the merge took from input i."""
    grad = _values(op, len(op.inputs) - 1, grad_blob)
    sizes = [int(np.sum(t)) for t in taken]
    order = _order(op, taken, sizes, [op.outputs[i] for i in range(count)])
    if grad.size != order.size:
        raise ShapeError(f"{op.where}: the gradient '{op.inputs[-1]}' has {grad.size} items, the merge {order.size}")
    flat = jnp.zeros(sum(sizes), grad.dtype)
    if order.size:
        flat = flat.at[jnp.asarray(order)].set(grad)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return tuple(flat[starts[i] : starts[i + 1]] for i in range(count))


def _merge_multi(op: Op, stride: int) -> Kernel:
    """MergeMulti{Scalar (3: lengths, keys, values), List (4: lengths, keys, values lengths, values values),
    Map (5: ..., values keys, values values)} per input -> the merged record of each example."""
    count = _groups(op, stride)

    def kernel(*xs: Any) -> tuple[jax.Array, ...]:
        lengths = [_ints(op, stride * i, xs[stride * i]) for i in range(count)]
        examples = _same_examples(op, lengths, [stride * i for i in range(count)])
        keys = []
        for i in range(count):
            if np.dtype(xs[stride * i + 1].dtype) != np.dtype(np.int64):
                raise InputTypeError(f"{op.where}: keys '{op.inputs[stride * i + 1]}' must be int64")
            keys.append(jnp.ravel(xs[stride * i + 1]))
        key_order = _order(op, lengths, [k.size for k in keys], [op.inputs[stride * i + 1] for i in range(count)])
        out = [jnp.asarray(np.sum(lengths, axis=0) if count else np.zeros(examples), jnp.int32), _take(keys, key_order)]
        if stride == 3:
            parts = [_values(op, 3 * i + 2, xs[3 * i + 2]) for i in range(count)]
            return (*out, _take(parts, key_order))
        value_lengths = [_ints(op, stride * i + 2, xs[stride * i + 2]) for i in range(count)]
        for i in range(count):
            if value_lengths[i].size != keys[i].size:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[stride * i + 2]}' has {value_lengths[i].size} lengths for "
                    f"{keys[i].size} keys"
                )
        per_example = _per_example(lengths, value_lengths)
        merged_lengths = np.concatenate(value_lengths)[key_order] if key_order.size else np.zeros((0,), np.int32)
        out.append(jnp.asarray(merged_lengths.astype(np.int32)))
        for c in range(3, stride):
            parts = [_values(op, stride * i + c, xs[stride * i + c]) for i in range(count)]
            order = _order(op, per_example, [v.size for v in parts], [op.inputs[stride * i + c] for i in range(count)])
            out.append(_take(parts, order))
        return tuple(out)

    return kernel


def _per_example(lengths: list[np.ndarray], value_lengths: list[np.ndarray]) -> list[np.ndarray]:
    """For each input, how many values each example holds: the sum of its features' value lengths."""
    out = []
    for n, vl in zip(lengths, value_lengths, strict=True):
        ends = np.cumsum(n)
        starts = ends - n
        sums = np.concatenate([[0], np.cumsum(vl)])
        ok = ends <= vl.size
        out.append(np.where(ok, sums[np.minimum(ends, vl.size)] - sums[np.minimum(starts, vl.size)], 0))
    return out


@register(
    "MergeMultiScalarFeatureTensors",
    inputs=(3, None),
    outputs=3,
    static_inputs=_static_every(3, (0,)),
    gradient=_merge_maker(3, (0,), 2, 2, "MergeMultiScalarFeatureTensorsGradient"),
)
def merge_multi_scalar(op: Op) -> Kernel:
    """(lengths [N], keys int64, values) per input -> (lengths, keys, values): each example's features from
    every input, input by input."""
    return _merge_multi(op, 3)


@register(
    "MergeMultiListFeatureTensors",
    inputs=(4, None),
    outputs=4,
    static_inputs=_static_every(4, (0, 2)),
    gradient=_merge_maker(4, (0, 2), 3, 3, "MergeMultiListFeatureTensorsGradient"),
)
def merge_multi_list(op: Op) -> Kernel:
    """(lengths [N], keys, values lengths, values) per input -> the merged list features of each example."""
    return _merge_multi(op, 4)


@register(
    "MergeMultiMapFeatureTensors",
    inputs=(5, None),
    outputs=5,
    static_inputs=_static_every(5, (0, 2)),
    gradient=_merge_maker(5, (0, 2), 4, 4, "MergeMultiMapFeatureTensorsGradient"),
)
def merge_multi_map(op: Op) -> Kernel:
    """(lengths [N], keys, values lengths, values keys, values values) per input -> the merged map features."""
    return _merge_multi(op, 5)


@register(
    "MergeMultiScalarFeatureTensorsGradient",
    inputs=(2, None),
    outputs=(1, None),
    static_inputs=lambda op: tuple(range(len(op.inputs) - 1)),
    gradient=GRADIENT_OP,
)
def merge_multi_scalar_gradient(op: Op) -> Kernel:
    """(lengths per input..., values_grad) -> each input's values gradient."""
    count = len(op.inputs) - 1
    if len(op.outputs) != count:
        raise BadArgumentError(f"{op.where}: {count} inputs' lengths need {count} outputs, got {len(op.outputs)}")

    def kernel(*xs: Any) -> tuple[jax.Array, ...]:
        return _scatter_back(op, [_ints(op, i, xs[i]) for i in range(count)], xs[-1], count)

    return kernel


@register(
    "MergeMultiListFeatureTensorsGradient",
    "MergeMultiMapFeatureTensorsGradient",
    inputs=(3, None),
    outputs=(1, None),
    static_inputs=lambda op: tuple(range(len(op.inputs) - 1)),
    gradient=GRADIENT_OP,
)
def merge_multi_list_gradient(op: Op) -> Kernel:
    """(lengths, values lengths per input..., values_grad) -> each input's values gradient."""
    count = _groups(op, 2, tail=1)
    if len(op.outputs) != count:
        raise BadArgumentError(f"{op.where}: {count} inputs need {count} outputs, got {len(op.outputs)}")

    def kernel(*xs: Any) -> tuple[jax.Array, ...]:
        lengths = [_ints(op, 2 * i, xs[2 * i]) for i in range(count)]
        value_lengths = [_ints(op, 2 * i + 1, xs[2 * i + 1]) for i in range(count)]
        return _scatter_back(op, _per_example(lengths, value_lengths), xs[-1], count)

    return kernel
