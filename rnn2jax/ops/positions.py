"""Sequence positions: the sinusoid encoding of positions (SinusoidPositionEncoding, "Attention is all you
need") and the zero padding past each sequence's end (VariableLengthSequencePadding, PyTorch's
pad_packed_sequence). Sources: caffe2/operators/sinusoid_position_encoding_op.h,
variable_length_sequence_padding.h."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .facets import NO_EMITTER, NO_ROLES, NO_SHAPE_RULE, Absent, Roles
from .registry import Kernel, declare_family, register

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=NO_SHAPE_RULE,
    gradient=Absent("Caffe2 registers no gradient maker for it"),
    emitter=NO_EMITTER,
)

_INT32 = np.dtype(np.int32)


def _linspaced(low: jax.Array, high: jax.Array, count: int) -> jax.Array:
    """Eigen's `setLinSpaced(count, low, high)` for floats, per row: stepping from the end of smaller
    magnitude (Eigen's `flip`), the far end exact."""
    if count == 1:
        return low[:, None]
    last = count - 1
    step = (high - low) / jnp.float32(last)
    i = jnp.arange(count, dtype=jnp.float32)[None, :]
    forward = jnp.where(i == last, high[:, None], low[:, None] + i * step[:, None])
    backward = jnp.where(i == 0, low[:, None], high[:, None] - (jnp.float32(last) - i) * step[:, None])
    return jnp.where((jnp.abs(high) < jnp.abs(low))[:, None], backward, forward)


@register("SinusoidPositionEncoding", roles=Roles(integers=(0,)))
def sinusoid_position_encoding(op: Op) -> Kernel:
    """POSITIONS [M, K] (int32/int64; row m's first value is its position) -> float32 [M, K, E]:
    amplitude * sin(pos / alpha^(i/E)) for even i, cos for odd i (`embedding_size` E 100, `alpha` 10000,
    `amplitude` 1), computed as Caffe2 does: exp of a linear space of logs, odd ones shifted by pi/2.
    Position 0 gives NaN in all but the last column, as in Caffe2 (log 0)."""
    size = op.int("embedding_size", 100)
    alpha, amplitude = np.float32(op.float("alpha", 10000.0)), np.float32(op.float("amplitude", 1.0))
    if size < 1:
        raise BadArgumentError(f"{op.where}: embedding_size must be at least 1, got {size}")
    log_alpha = np.float32(np.log(alpha))
    max_pow = np.float32((np.float32(size) - np.float32(1)) / np.float32(size))
    shift = np.where(np.arange(size) % 2 == 1, np.float32(math.pi / 2), np.float32(0)).astype(np.float32)

    def kernel(positions: jax.Array) -> jax.Array:
        if np.dtype(positions.dtype) not in (_INT32, np.dtype(np.int64)):
            raise InputTypeError(
                f"{op.where}: POSITIONS '{op.inputs[0]}' must be int32 or int64, got {positions.dtype}"
            )
        if positions.ndim != 2:
            raise ShapeError(
                f"{op.where}: POSITIONS '{op.inputs[0]}' should be a 2-D tensor, got shape {list(positions.shape)}"
            )
        rows, batch = positions.shape
        if batch == 0:
            return jnp.zeros((rows, 0, size), jnp.float32)
        log_pos = jnp.log(positions[:, 0].astype(jnp.float32))
        row = jnp.exp(_linspaced(log_pos, log_pos - log_alpha * max_pow, size)) + shift
        row = amplitude * jnp.sin(row)
        return jnp.broadcast_to(row[:, None, :], (rows, batch, size))

    return kernel


@register("VariableLengthSequencePadding", inputs=2, roles=Roles(lengths=(1,)))
def variable_length_sequence_padding(op: Op) -> Kernel:
    """INPUT [N, B, M] with element (i, j, k) set to 0 where i >= LENS[j] (LENS int32 [B]). Caffe2 pads in
    place, so the output must be the input blob (another one would be left unallocated); float32 only."""
    if op.outputs[0] != op.inputs[0]:
        raise BadArgumentError(
            f"{op.where}: Caffe2 pads INPUT '{op.inputs[0]}' in place: the output must be that blob, "
            f"got '{op.outputs[0]}'"
        )

    def kernel(x: jax.Array, lengths: jax.Array) -> jax.Array:
        if np.dtype(x.dtype) != np.dtype(np.float32):
            raise InputTypeError(f"{op.where}: INPUT '{op.inputs[0]}' must be float32, got {x.dtype}")
        if x.ndim != 3:
            raise ShapeError(f"{op.where}: INPUT '{op.inputs[0]}' must be [N, B, M], got shape {list(x.shape)}")
        if np.dtype(lengths.dtype) != _INT32:
            raise InputTypeError(f"{op.where}: LENS '{op.inputs[1]}' must be int32, got {lengths.dtype}")
        if lengths.size != x.shape[1]:
            raise ShapeError(
                f"{op.where}: LENS '{op.inputs[1]}' has {lengths.size} lengths for a batch of {x.shape[1]}"
            )
        past = jnp.arange(x.shape[0])[:, None] >= jnp.ravel(lengths)[None, :]
        return jnp.where(past[:, :, None], jnp.zeros((), x.dtype), x)

    return kernel
