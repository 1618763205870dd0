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
from .facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Absent, Roles
from .gradient_makers import no_gradient
from .registry import Kernel, declare_family, register

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
