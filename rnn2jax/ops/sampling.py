"""Sampling and random dropout of sparse features: WeightedSample, WeightedMultiSampling,
SparseItemwiseDropoutWithReplacement and SparseDropoutWithReplacement.

Random ops draw from the net's JAX PRNG key (per op), so their draws never match Caffe2's; what they must
match is the shape, dtype and the properties that hold of every draw (an index of positive weight, a value
from the sampled column, an example kept whole or replaced). SparseDropoutWithReplacement's output length
depends on its draws, which jitted code cannot have, so it is a host op drawing from NumPy, seeded from the
workspace's seed. Sources: caffe2/operators/weighted_sample_op.cc, weighted_multi_sampling_op.cc,
sparse_dropout_with_replacement_op.cc, sparse_itemwise_dropout_with_replacement_op.cc.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .facets import (
    HOST_OP_NO_EMITTER,
    HOST_OP_NO_SHAPE_RULE,
    NO_EMITTER,
    NO_GRADIENT,
    NO_ROLES,
    NO_SHAPE_RULE,
    Absent,
    Roles,
)
from .gradient_makers import no_gradient, should_not_do_gradient
from .registry import HostWorkspace, Kernel, declare_family, host_op, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)
_I64 = np.dtype(np.int64)


def _expect(op: Op, index: int, x: Any, dtype: np.dtype) -> None:
    if np.dtype(x.dtype) != dtype:
        raise InputTypeError(f"{op.where}: input '{op.inputs[index]}' must be {dtype}, got {x.dtype}")


@register("WeightedSample", inputs=(1, 2), outputs=(1, 2), random=True, gradient=should_not_do_gradient)
def weighted_sample(op: Op) -> Kernel:
    """For each row of non-negative weights [B, D], an index drawn with probability proportional to its
    weight (int32 [B, 1]); with sampling values [B, D], also the value at it (float32 [B, 1]). Caffe2 draws
    r in [0, total) and takes the first index whose cumulative weight reaches r (the last one raised by
    0.01 against rounding); a row of zero weights gives index 0."""
    if len(op.inputs) != len(op.outputs):
        raise BadArgumentError(
            f"{op.where}: The number of tensors of the input and the output must be the same "
            f"({len(op.inputs)} vs {len(op.outputs)})"
        )

    def kernel(weights: jax.Array, *values: jax.Array, key: jax.Array) -> Any:
        _expect(op, 0, weights, _F32)
        if weights.ndim != 2:
            raise ShapeError(f"{op.where}: sampling_weights '{op.inputs[0]}' must be 2-D, got {list(weights.shape)}")
        if values:
            _expect(op, 1, values[0], _F32)
            if values[0].shape != weights.shape:
                raise ShapeError(
                    f"{op.where}: The sampling weights tensor and the sampling values tensor must have the same "
                    f"dimensions ({list(weights.shape)} vs {list(values[0].shape)})"
                )
        batch, width = weights.shape
        if batch == 0 or width == 0:
            empty = jnp.zeros((0,), jnp.int32)
            return (empty, jnp.zeros((0,), jnp.float32)) if values else empty
        cumulative = jnp.cumsum(weights, axis=1)
        total = cumulative[:, -1]
        r = jax.random.uniform(key, (batch,), jnp.float32) * total
        cumulative = cumulative.at[:, -1].add(jnp.float32(0.01))
        index = jnp.sum(cumulative < r[:, None], axis=1).astype(jnp.int32)  # std::lower_bound
        index = jnp.minimum(index, width - 1)[:, None]
        if not values:
            return index
        return index, jnp.take_along_axis(values[0], index, axis=1)

    return kernel


def _num_samples(op: Op) -> int | None:
    if len(op.inputs) == 2:
        if op.has("num_samples"):
            raise BadArgumentError(
                f"{op.where}: New shape is specified by the input blob, do not pass in the argument `num_samples`."
            )
        return None
    count = op.int("num_samples", 0)
    if count < 0:
        raise BadArgumentError(f"{op.where}: num_samples must not be negative, got {count}")
    return count


@register(
    "WeightedMultiSampling",
    inputs=(1, 2),
    random=True,
    gradient=Absent("Caffe2 registers no gradient maker for it (its SHOULD_NOT_DO_GRADIENT names WeightedMultiSample)"),
)
def weighted_multi_sampling(op: Op) -> Kernel:
    """Indices drawn from a sorted cumulative distribution [D] (its last value the total), `num_samples` of
    them (1-D) or the shape of input 1: int32, the first index whose cumulative value reaches a uniform draw
    in [0, total). An empty distribution gives an empty output."""
    count = _num_samples(op)

    def kernel(cdf: jax.Array, *shape_like: jax.Array, key: jax.Array) -> jax.Array:
        _expect(op, 0, cdf, _F32)
        if cdf.ndim != 1:
            raise ShapeError(f"{op.where}: Input should be 1-D vector, got shape {list(cdf.shape)}")
        shape = tuple(shape_like[0].shape) if shape_like else (count,)
        if cdf.shape[0] == 0:
            return jnp.zeros((0,), jnp.int32)
        r = jax.random.uniform(key, shape, jnp.float32) * cdf[-1]
        index = jnp.sum(cdf < r[..., None], axis=-1)
        return jnp.minimum(index, cdf.shape[0] - 1).astype(jnp.int32)

    return kernel


def _ratio(op: Op) -> float:
    ratio = op.float("ratio", 0.0)
    if not 0.0 <= ratio <= 1.0:
        raise BadArgumentError(f"{op.where}: ratio must be in [0, 1], got {ratio}")
    return ratio


def _check_lengths(op: Op, x: Any, lengths: Any, eager: bool) -> None:
    _expect(op, 0, x, _I64)
    _expect(op, 1, lengths, _I32)
    if x.ndim != 1:
        raise ShapeError(f"{op.where}: Input tensor should be 1-D, got shape {list(x.shape)}")
    if lengths.ndim != 1:
        raise ShapeError(f"{op.where}: Lengths tensor should be 1-D, got shape {list(lengths.shape)}")
    message = (
        f"{literal(op.where)}: Inconsistent input data. Number of elements ({x.shape[0]}) should match total "
        "length ({total})"
    )
    total = np.sum(np.asarray(lengths)) if eager else jnp.sum(lengths)
    enforce(total == x.shape[0], message, total=total)


runtime_checked("SparseItemwiseDropoutWithReplacement")


@register(
    "SparseItemwiseDropoutWithReplacement",
    inputs=2,
    outputs=2,
    random=True,
    gradient=no_gradient,
    roles=Roles(integers=(0, 1)),
)
def sparse_itemwise_dropout(op: Op) -> Kernel:
    """(X int64 [N], lengths int32) -> (Y, lengths): each value of X kept with probability 1 - `ratio` (0),
    else `replacement_value` (0); the lengths are unchanged."""
    ratio = _ratio(op)
    replacement = op.int("replacement_value", 0)

    def kernel(x: jax.Array, lengths: jax.Array, *, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        _check_lengths(op, x, lengths, eager=False)
        keep = jax.random.bernoulli(key, 1.0 - ratio, x.shape)
        return jnp.where(keep, x, jnp.int64(replacement)), lengths

    return kernel


def _check_dropout(op: Op) -> None:
    if len(op.inputs) != 2 or len(op.outputs) != 2:
        raise BadArgumentError(f"{op.where}: SparseDropoutWithReplacement takes 2 inputs and 2 outputs")
    _ratio(op)
    op.int("replacement_value", 0)


@host_op(
    "SparseDropoutWithReplacement",
    check=_check_dropout,
    gradient=no_gradient,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    emitter=HOST_OP_NO_EMITTER,
    roles=Roles(integers=(0, 1)),
)
def sparse_dropout(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """(X int64 [N], lengths int32 [B]) -> (Y, output lengths): each example kept whole with probability
    1 - `ratio` (0), else replaced by the single `replacement_value` (0), even an empty one."""
    x = np.asarray(workspace.get(op.inputs[0], op))
    lengths = np.asarray(workspace.get(op.inputs[1], op))
    _check_lengths(op, x, lengths, eager=True)
    if "rng" not in state:
        state["rng"] = np.random.default_rng([getattr(workspace, "seed", None) or 0, *op.outputs[0].encode()])
    keep = state["rng"].random(lengths.size) < 1.0 - _ratio(op)
    replacement = np.asarray([op.int("replacement_value", 0)], np.int64)
    pieces, starts = [], np.concatenate([[0], np.cumsum(lengths)])
    for i, kept in enumerate(keep):
        pieces.append(x[starts[i] : starts[i + 1]] if kept else replacement)
    out = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros((0,), np.int64)
    workspace.feed(op.outputs[0], out)
    workspace.feed(op.outputs[1], np.where(keep, lengths, 1).astype(np.int32))
