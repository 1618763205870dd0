"""Fixed feature encodings: PiecewiseLinearTransform's calibration of predictions
(caffe2/operators/piecewise_linear_transform_op.h) and SinusoidPositionEncoding's position embeddings
(sinusoid_position_encoding_op.h). Neither has parameters to learn: Caffe2 registers no gradient for
them (PiecewiseLinearTransform refuses one).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import should_not_do_gradient
from .registry import Kernel, declare_family, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)


def _shape_text(x: Any) -> str:
    return f"{np.dtype(x.dtype)}{list(np.shape(x))}"


# --------------------------------------------------------------------------------------------------
# PiecewiseLinearTransform


def _pieces(op: Op, bounds: int, slopes: int, intercepts: int, binary: bool, error: type[Exception]) -> tuple[int, int]:
    """(groups, pieces per group) from the parameters' sizes (InferNumFunctionsPerGroup)."""
    if slopes != intercepts:
        raise error(f"{op.where}: {slopes} slopes and {intercepts} intercepts differ in number")
    groups = bounds - slopes
    if groups <= 0:
        raise error(f"{op.where}: {bounds} bounds for {slopes} slopes: each group needs one bound more than slopes")
    if binary and groups != 1:
        raise error(f"{op.where}: with binary, the parameters must make 1 group, got {groups}")
    if slopes // groups <= 0 or slopes % groups:
        raise error(f"{op.where}: {slopes} slopes do not split into {groups} groups of one or more")
    return groups, slopes // groups


def _transform(x: Any, bounds: Any, slopes: Any, intercepts: Any) -> Any:
    """Each column j of `x` through group j's pieces (bounds [G, F+1], slopes and intercepts [G, F]):
    below the first bound and above the last the end pieces' values there, else the piece whose bounds
    hold x (std::lower_bound: the first bound >= x ends it)."""
    bounds, slopes, intercepts = (jnp.asarray(v) for v in (bounds, slopes, intercepts))
    pieces = slopes.shape[1]
    low = slopes[:, 0] * bounds[:, 0] + intercepts[:, 0]
    high = slopes[:, -1] * bounds[:, -1] + intercepts[:, -1]
    index = jnp.sum(bounds[None, :, :] < x[..., None], axis=-1) - 1
    index = jnp.clip(index, 0, pieces - 1)
    columns = jnp.arange(x.shape[-1])
    inside = slopes[columns, index] * x + intercepts[columns, index]
    return jnp.where(x <= bounds[:, 0], low, jnp.where(x >= bounds[:, -1], high, inside))


@register("PiecewiseLinearTransform", inputs=(1, 4), gradient=should_not_do_gradient)
def piecewise_linear_transform(op: Op) -> Kernel:
    """(predictions [N, M][, bounds, slopes, intercepts]) -> the predictions, column j through the j-th
    group of linear pieces (from the `bounds`, `slopes`, `intercepts` arguments, or from inputs). With
    `binary`, predictions are [N], [N, 1] or [N, 2] and one group transforms the last column (column 0
    of [N, 2] becomes 1 - column 1)."""
    binary = op.bool("binary", False)
    given = [op.floats(name, ()) for name in ("bounds", "slopes", "intercepts")]
    from_args = sum(len(v) > 0 for v in given)
    if from_args not in (0, 3):
        raise BadArgumentError(f"{op.where}: bounds, slopes, intercepts must be all set or all not set")
    params = None
    if from_args == 3:
        groups, pieces = _pieces(op, *map(len, given), binary, BadArgumentError)
        bounds = np.asarray(given[0], np.float32).reshape(groups, pieces + 1)
        if (np.diff(bounds, axis=1) < 0).any():
            raise BadArgumentError(f"{op.where}: bounds must be sorted for each group")
        params = (
            bounds,
            np.asarray(given[1], np.float32).reshape(groups, pieces),
            np.asarray(given[2], np.float32).reshape(groups, pieces),
        )
        if len(op.inputs) != 1:
            raise BadArgumentError(f"{op.where}: with the parameters as arguments, the op takes 1 input")
    elif len(op.inputs) != 4:
        raise BadArgumentError(f"{op.where}: without the parameters as arguments, the op takes 4 inputs")

    def kernel(x, *inputs):
        for i, value in enumerate((x, *inputs)):
            if np.dtype(value.dtype) != _F32:
                raise ShapeError(f"{op.where}: input '{op.inputs[i]}' must be float32, got {_shape_text(value)}")
        if binary:
            if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[1] not in (1, 2)):
                raise ShapeError(
                    f"{op.where}: If binary is set to true, the input must be Nx2 or Nx1 tensor, got {_shape_text(x)}"
                )
        elif x.ndim != 2:
            raise ShapeError(f"{op.where}: predictions '{op.inputs[0]}' must be 2-D, got {_shape_text(x)}")
        if params is not None:
            bounds, slopes, intercepts = params
        else:
            sizes = [math.prod(v.shape) for v in inputs]
            groups, pieces = _pieces(op, *sizes, binary, ShapeError)
            bounds = jnp.reshape(inputs[0], (groups, pieces + 1))
            slopes, intercepts = (jnp.reshape(v, (groups, pieces)) for v in inputs[1:])
        groups = bounds.shape[0]
        if binary:
            column = x if x.ndim == 1 else x[:, -1]
            y = _transform(column[:, None], bounds, slopes, intercepts)[:, 0]
            if x.ndim == 1 or x.shape[1] == 1:
                return jnp.reshape(y, x.shape)
            return jnp.stack([1.0 - y, y], axis=1)
        if groups != x.shape[1]:
            raise ShapeError(
                f"{op.where}: {groups} groups of pieces for predictions '{op.inputs[0]}' of {x.shape[1]} columns"
            )
        return _transform(x, bounds, slopes, intercepts)

    return kernel


# --------------------------------------------------------------------------------------------------
# SinusoidPositionEncoding


def _linspaced(low: Any, high: Any, size: int) -> Any:
    """Eigen's setLinSpaced for floats, per row of `low`/`high` [rows, 1]: low + i * step, counted back
    from `high` when |high| < |low|, ending exactly at `high` (a single value is `high`)."""
    if size == 1:
        return high
    step = (high - low) / np.float32(size - 1)
    i = jnp.arange(size, dtype=jnp.float32)[None, :]
    forward = jnp.where(i == size - 1, high, low + i * step)
    backward = jnp.where(i == 0, low, high - (np.float32(size - 1) - i) * step)
    return jnp.where(jnp.abs(high) < jnp.abs(low), backward, forward)


@register("SinusoidPositionEncoding", roles=Roles(integers=(0,)))
def sinusoid_position_encoding(op: Op) -> Kernel:
    """POSITIONS [M, K] int32/int64 -> [M, K, embedding_size] float32: row i (its first position p, copied
    to all K) is amplitude * sin(p / alpha^(k / size)), odd k shifted by pi/2 to a cosine."""
    size = op.int("embedding_size", 100)
    alpha = np.float32(op.float("alpha", 10000))
    amplitude = np.float32(op.float("amplitude", 1))
    if size < 1:
        raise BadArgumentError(f"{op.where}: argument 'embedding_size' = {size} must be >= 1")
    log_alpha = np.log(alpha, dtype=np.float32)
    top = np.float32((np.float32(size) - np.float32(1)) / np.float32(size))
    shift = np.where(np.arange(size) % 2 == 1, np.float32(np.pi / 2), np.float32(0)).astype(np.float32)

    def kernel(positions):
        if np.dtype(positions.dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ShapeError(
                f"{op.where}: POSITIONS '{op.inputs[0]}' must be int32 or int64, got {_shape_text(positions)}"
            )
        if positions.ndim != 2:
            raise ShapeError(f"{op.where}: POSITIONS should be a 2-D tensor, got {_shape_text(positions)}")
        rows, k = positions.shape
        if rows == 0 or k == 0:
            return jnp.zeros((rows, k, size), jnp.float32)
        low = jnp.log(positions[:, :1].astype(jnp.float32))
        encoded = amplitude * jnp.sin(jnp.exp(_linspaced(low, low - log_alpha * top, size)) + shift)
        return jnp.broadcast_to(encoded[:, None, :], (rows, k, size))

    return kernel
