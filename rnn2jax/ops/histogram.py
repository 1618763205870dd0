"""Binning, percentiles and calibration: histograms of values (Histogram, SelfBinningHistogram,
AccumulateHistogram), quantiles and percentile maps (Quantile, Percentile, BisectPercentile), and the
calibration transforms of ranking models (PiecewiseLinearTransform, StumpFunc, StumpFuncIndex).

Sources: caffe2/operators/histogram_op.h, self_binning_histogram_op.h, utility_ops.h (AccumulateHistogram),
quantile_op.h, percentile_op.cc, bisect_percentile_op.h, piecewise_linear_transform_op.h, stump_func_op.cc.
Each follows Caffe2's arithmetic in Caffe2's types (float32 constants where Caffe2 holds floats), so that
values on a bin edge land in the same bin. AccumulateHistogram keeps its running histogram in the op, as
Caffe2 does, so it is a host op whose state lives as long as its net.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import no_gradient, should_not_do_gradient
from .registry import HostWorkspace, Kernel, declare_family, host_op, register
from .shape_facts import output_like_input

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _expect(op: Op, position: int, x: Any, dtypes: Sequence[np.dtype]) -> np.dtype:
    """Caffe2 reads input `position` as one of `dtypes` (`data<T>()`, or DispatchHelper's types)."""
    dtype = np.dtype(x.dtype)
    if dtype not in dtypes:
        wanted = " or ".join(str(d) for d in dtypes)
        raise InputTypeError(f"{op.where}: input '{op.inputs[position]}' must be {wanted}, got {dtype}")
    return dtype


def _same_dtype(op: Op, xs: Sequence[Any]) -> np.dtype:
    """Input 0 float or double, and every other input of its type ("All inputs must have the same type")."""
    dtype = _expect(op, 0, xs[0], _FLOATS)
    for i, x in enumerate(xs[1:], 1):
        if np.dtype(x.dtype) != dtype:
            raise InputTypeError(
                f"{op.where}: all inputs must have the same type; expected {dtype} but got {np.dtype(x.dtype)} "
                f"for input '{op.inputs[i]}'"
            )
    return dtype


def _flat_all(xs: Sequence[Any]) -> jax.Array:
    return jnp.concatenate([jnp.ravel(x) for x in xs]) if xs else jnp.zeros((0,))


_SMALL = 64  # up to this many bins, compare with every bin: XLA compiles that faster than a search or scatter


def _bincount(bucket: jax.Array, size: int) -> jax.Array:
    """int64 counts of each bucket in [0, size) (others, -1, not counted)."""
    if size <= _SMALL:
        return jnp.sum(bucket[:, None] == jnp.arange(size)[None, :], axis=0, dtype=jnp.int64)
    inside = (bucket >= 0) & (bucket < size)
    return jnp.zeros(size, jnp.int64).at[jnp.where(inside, bucket, 0)].add(inside.astype(jnp.int64))


def _search(edges: jax.Array, values: jax.Array, side: str) -> jax.Array:
    """jnp.searchsorted, comparing with every edge for few edges and bisecting for many."""
    method = "compare_all" if edges.shape[0] <= _SMALL else "scan"
    return jnp.searchsorted(edges, values, side=side, method=method)


# --------------------------------------------------------------------------------------------------
# Histograms


@register("Histogram", inputs=(1, None), gradient=should_not_do_gradient)
def histogram(op: Op) -> Kernel:
    """int64 counts of the values of every input in the bins [edge i, edge i+1) of `bin_edges` (strictly
    increasing, at least 2); values outside them are not counted."""
    edges = np.asarray(op.floats("bin_edges", ()), _F32)
    if edges.size < 2:
        raise BadArgumentError(f"{op.where}: Number of bin edges must be greater than or equal to 2.")
    if not np.all(edges[1:] > edges[:-1]):
        raise BadArgumentError(f"{op.where}: bin_edges must be a strictly increasing sequence of values.")

    def kernel(*xs: jax.Array) -> jax.Array:
        dtype = _same_dtype(op, xs)
        values = _flat_all(xs).astype(dtype)
        index = _search(jnp.asarray(edges, dtype), values, "right")  # std::upper_bound
        inside = (index > 0) & (index < edges.size)
        return _bincount(jnp.where(inside, index - 1, -1), edges.size - 1)

    return kernel


@register("SelfBinningHistogram", inputs=(1, None), outputs=2, gradient=should_not_do_gradient)
def self_binning_histogram(op: Op) -> Kernel:
    """`num_bins` bins spanning the inputs' own range (scaled by 1.0001 so the maximum falls inside),
    spaced "linear"ly or "logarithmic"ally from `logspace_start` (1e-24); `abs` takes |x|. Outputs the
    num_bins + 1 edges (the inputs' type) and int64 counts (the last always 0)."""
    bins = op.int("num_bins", 0)
    spacing = op.str("bin_spacing", "linear")
    start = np.float32(op.float("logspace_start", 1e-24))
    take_abs = op.bool("abs", False)
    if bins < 1:
        raise BadArgumentError(f"{op.where}: Number of bins must be greater than or equal to 1.")
    if spacing not in ("linear", "logarithmic"):
        raise BadArgumentError(f"{op.where}: Bin spacing can be one of 'linear' or 'logarithmic', got {spacing!r}")
    if not start > 0:
        raise BadArgumentError(f"{op.where}: logspace_start must be greater than 0, got {start}")

    def kernel(*xs: jax.Array) -> tuple[jax.Array, jax.Array]:
        dtype = _same_dtype(op, xs)
        values = _flat_all(xs).astype(dtype)
        edges_n = bins + 1
        if values.size == 0:
            return jnp.zeros(edges_n, dtype), jnp.zeros(edges_n, jnp.int64)
        if take_abs:
            values = jnp.abs(values)
        low, high = jnp.min(values), jnp.max(values)
        scaling = jnp.asarray(1.0001, dtype)
        ratio = jnp.asarray(np.arange(edges_n, dtype=dtype) / dtype.type(bins))  # T(i) / num_bins
        if spacing == "linear":
            scaled_max = low + (high - low) * scaling
            edges = low + ratio * (scaled_max - low)
        else:
            floor = jnp.asarray(start, dtype)
            low, high = jnp.where(low < floor, floor, low), jnp.where(high < floor, floor, high)
            scaled_max = low + (high - low) * scaling
            edges = low * jnp.exp((jnp.log(scaled_max) - jnp.log(low)) * ratio)
        degenerate = edges[-1] <= high  # min == max (or underflow): every value counts in bin 0
        index = _search(edges, values, "right")
        bucket = jnp.where(index == 0, 0, index - 1)
        counts = _bincount(jnp.where(index < edges_n, bucket, -1), edges_n)
        everything = jnp.zeros(edges_n, jnp.int64).at[0].set(values.size)
        return jnp.where(degenerate, edges.at[-1].set(scaled_max), edges), jnp.where(degenerate, everything, counts)

    return kernel


def _check_accumulate(op: Op) -> None:
    if len(op.inputs) != 1 or len(op.outputs) != 2:
        raise BadArgumentError(f"{op.where}: AccumulateHistogram takes 1 input and 2 outputs")
    if op.int("num_buckets", 1) <= 0:
        raise BadArgumentError(f"{op.where}: num_buckets must be greater than 0, got {op.int('num_buckets', 1)}")
    op.float("lower_bound", 0.0)
    op.float("upper_bound", 1.0)


@host_op(
    "AccumulateHistogram",
    check=_check_accumulate,
    gradient=should_not_do_gradient,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    emitter=HOST_OP_NO_EMITTER,
)
def accumulate_histogram(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The int64 histogram of the float input in `num_buckets` (1) equal buckets of [lower_bound (0),
    upper_bound (1)), plus one bucket below and one at or above: this run's, and the sum over every run of
    the op (kept with the net, as Caffe2 keeps it in the op)."""
    name = op.inputs[0]
    x = np.asarray(workspace.get(name, op))
    if x.dtype != _F32:
        raise InputTypeError(f"{op.where}: input '{name}' must be float32, got {x.dtype}")
    low, high = np.float32(op.float("lower_bound", 0.0)), np.float32(op.float("upper_bound", 1.0))
    buckets = op.int("num_buckets", 1)
    segment = np.float32((high - low) / np.float32(buckets))
    values = x.ravel()
    if np.isnan(values).any():
        raise BadArgumentError(f"{op.where}: input '{name}' holds NaN, which falls in no bucket")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inner = np.trunc((values - low) / segment)
    index = np.where(values < low, 0, np.where(values >= high, buckets + 1, np.nan_to_num(inner) + 1)).astype(np.int64)
    current = np.bincount(np.clip(index, 0, buckets + 1), minlength=buckets + 2).astype(np.int64)
    state["total"] = state.get("total", np.zeros(buckets + 2, np.int64)) + current
    workspace.feed(op.outputs[0], current)
    workspace.feed(op.outputs[1], state["total"].copy())


# --------------------------------------------------------------------------------------------------
# Quantile and percentiles


@register("Quantile", inputs=(1, None), gradient=should_not_do_gradient)
def quantile(op: Op) -> Kernel:
    """The `quantile` of every input's values (|x| with `abs`, the default), by Caffe2's bisection: the
    value with ceil(n * quantile) values at or below it, to within `tol` (1e-3) relative. Shape [1]."""
    q = np.float32(op.float("quantile", -1.0))
    take_abs = op.bool("abs", True)
    tol = np.float32(op.float("tol", 1e-3))
    if not 0 <= q <= 1:
        raise BadArgumentError(f"{op.where}: input quantile should be in [0, 1], got {q}")
    if not tol > 0:
        raise BadArgumentError(f"{op.where}: tolerance should be greater than 0, got {tol}")

    def kernel(*xs: jax.Array) -> jax.Array:
        dtype = _same_dtype(op, xs)
        values = _flat_all(xs).astype(dtype)
        n = values.size
        if n == 0:
            raise ShapeError(f"{op.where}: number of total element in input tensor should be larger than 0, got 0")
        if take_abs:
            values = jnp.abs(values)
        target = math.ceil(np.float32(n) * q)
        low, high = jnp.min(values), jnp.max(values)
        if target == 0:
            return low.reshape(1)
        if target == n:
            return high.reshape(1)
        t = jnp.asarray(tol, dtype)

        def count(threshold: jax.Array) -> jax.Array:
            return jnp.sum(values <= threshold)

        def cond(carry: tuple) -> jax.Array:
            lo, hi, done, _, stuck = carry
            return ~done & ~stuck & (jnp.abs(hi - lo) > t * (jnp.abs(hi) + jnp.abs(lo)))

        def body(carry: tuple) -> tuple:
            lo, hi, _, _, _ = carry
            mid = (lo.astype(jnp.float64) + (hi - lo).astype(jnp.float64) / 2.0).astype(dtype)
            c = count(mid)
            stuck = ((c > target) & (hi == mid)) | ((c < target) & (lo == mid))
            return jnp.where(c < target, mid, lo), jnp.where(c > target, mid, hi), c == target, mid, stuck

        start = (low, high, count(low) >= target, low, jnp.bool_(False))
        _, hi, done, mid, stuck = jax.lax.while_loop(cond, body, start)
        enforce(
            ~stuck,
            f"{literal(op.where)}: numeric precision at limit, unable to continue bisect (tol {literal(str(tol))})",
        )
        first = count(low) >= target
        return jnp.where(first, low, jnp.where(done, mid, hi)).reshape(1)

    return kernel


runtime_checked("Quantile", "Percentile")


@register("Percentile", inputs=3, shape_rule=output_like_input, roles=Roles(integers=(2,)))
def percentile(op: Op) -> Kernel:
    """The percentile of each value of X [N, M] in its column's distribution: value_to_pct [V, 2] holds
    sorted (value, percentile) samples, `lengths` [M] how many belong to each column. An exact sample gives
    its percentile; between two, linear interpolation; below all 0, above all 1."""

    def kernel(x: jax.Array, pairs: jax.Array, lengths: jax.Array) -> jax.Array:
        _expect(op, 0, x, (_F32,))
        _expect(op, 1, pairs, (_F32,))
        _expect(op, 2, lengths, (np.dtype(np.int32),))
        if x.ndim != 2:
            raise ShapeError(f"{op.where}: original_values '{op.inputs[0]}' must be 2-D, got shape {list(x.shape)}")
        if pairs.ndim != 2 or pairs.shape[1] != 2:
            raise ShapeError(f"{op.where}: value_to_pct '{op.inputs[1]}' must be [V, 2], got shape {list(pairs.shape)}")
        if lengths.size != x.shape[1]:
            raise ShapeError(
                f"{op.where}: lengths '{op.inputs[2]}' has {lengths.size} values for {x.shape[1]} features"
            )
        lengths = jnp.ravel(lengths)
        count = pairs.shape[0]
        enforce(
            jnp.sum(lengths) == count,
            f"{literal(op.where)}: Sum of lengths should be equal to the total number of samples ({count}), "
            "got {total}",
            total=jnp.sum(lengths),
        )
        if count == 0:
            return jnp.ones_like(x)
        values, pcts = pairs[:, 0], pairs[:, 1]
        ends = jnp.cumsum(lengths)
        starts = ends - lengths
        segment = jnp.searchsorted(
            ends, jnp.arange(count), side="right", method="compare_all"
        )  # the column of each sample
        mine = segment[None, None, :] == jnp.arange(x.shape[1])[None, :, None]  # [1, M, V]
        below = jnp.sum(mine & (values[None, None, :] < x[:, :, None]), axis=-1)
        bound = starts[None, :] + below  # std::lower_bound in the column's samples
        at = jnp.clip(bound, 0, count - 1)
        before = jnp.clip(bound - 1, 0, count - 1)
        fraction = (x - values[before]) / (values[at] - values[before])
        between = pcts[before] + fraction * (pcts[at] - pcts[before])
        out = jnp.where(bound == starts[None, :], jnp.float32(0), between)
        out = jnp.where(x == values[at], pcts[at], out)
        return jnp.where(bound == (ends[None, :]), jnp.float32(1), out).astype(jnp.float32)

    return kernel


@register("BisectPercentile", shape_rule=output_like_input)
def bisect_percentile(op: Op) -> Kernel:
    """The percentile of each value of raw [N, F] from per-feature maps given as arguments: `lengths` [F]
    splits `percentile_raw` (sorted values), `percentile_mapping`, `percentile_lower` and
    `percentile_upper` among the features. Between two raw values, interpolates from the upper percentile
    of the one below to the lower of the one above, by Caffe2's own binary search."""
    raw = np.asarray(op.floats("percentile_raw", ()), _F32)
    names = ("percentile_mapping", "percentile_lower", "percentile_upper")
    mapping, lower, upper = (np.asarray(op.floats(name, ()), _F32) for name in names)
    lengths = [int(n) for n in op.ints("lengths", ())]
    for name, values in zip(names, (mapping, lower, upper), strict=True):
        if values.size != raw.size:
            raise BadArgumentError(
                f"{op.where}: argument '{name}' has {values.size} values, percentile_raw {raw.size}: they should match"
            )
    if sum(lengths) != raw.size:
        raise BadArgumentError(
            f"{op.where}: Sum of lengths ({sum(lengths)}) should be equal to the total number of percentile "
            f"mapping data samples ({raw.size})"
        )
    if any(n <= 0 for n in lengths):
        raise BadArgumentError(f"{op.where}: every feature needs at least one percentile sample, lengths {lengths}")
    # each feature's samples in a row, padded to the longest (the search never reads past a feature's own)
    features, longest = len(lengths), max(lengths, default=1)
    starts = np.cumsum([0, *lengths])
    table = np.zeros((4, features, longest), _F32)
    for j, n in enumerate(lengths):
        for row, values in enumerate((raw, mapping, lower, upper)):
            table[row, j, :n] = values[starts[j] : starts[j + 1]]
    sizes = np.asarray(lengths, np.int32)

    def kernel(x: jax.Array) -> jax.Array:
        _expect(op, 0, x, (_F32,))
        if x.ndim != 2 or x.shape[1] != features:
            raise ShapeError(
                f"{op.where}: raw '{op.inputs[0]}' must be [N, {features}] (one column per length), "
                f"got shape {list(x.shape)}"
            )
        data, maps, lows, ups = (jnp.asarray(t) for t in table)
        size = jnp.asarray(sizes)[None, :]

        def at(values: jax.Array, index: jax.Array) -> jax.Array:
            """values[feature, index] for each [N, F] index, by comparison (XLA compiles a gather slowly)."""
            picked = index[..., None] == jnp.arange(longest)
            return jnp.sum(jnp.where(picked, values[None], jnp.float32(0)), axis=-1)

        def step(_: int, carry: tuple) -> tuple:  # Caffe2's binary_search, one halving for every value
            lo, hi, found = carry
            active = ~found & (lo < hi)
            mid = lo + (hi - lo) // 2
            low_ok = at(data, mid) <= x
            high_ok = x < at(data, jnp.minimum(mid + 1, size - 1))
            hit = active & low_ok & high_ok
            lo = jnp.where(hit, mid, jnp.where(active & low_ok & ~high_ok, mid + 1, lo))
            return lo, jnp.where(active & ~low_ok, mid - 1, hi), found | hit

        start = (jnp.zeros(x.shape, jnp.int32), jnp.broadcast_to(size - 1, x.shape), jnp.zeros(x.shape, bool))
        lo, _, _ = jax.lax.fori_loop(0, longest.bit_length() + 1, step, start)
        k = jnp.clip(lo, 0, size - 1)
        after = jnp.minimum(k + 1, size - 1)
        w = (x - at(data, k)) / (at(data, after) - at(data, k) + jnp.float32(1e-10))
        value = (1 - w) * at(ups, k) + w * at(lows, after)
        value = jnp.where(at(data, k) == x, at(maps, k), value)
        value = jnp.where(x > at(data, size - 1), jnp.float32(1), value)
        return jnp.where(x < data[:, 0][None, :], jnp.float32(0), value)

    return kernel


# --------------------------------------------------------------------------------------------------
# Calibration transforms


def _piecewise(x: jax.Array, bounds: jax.Array, slopes: jax.Array, intercepts: jax.Array) -> jax.Array:
    """One group's transform: below the first bound, the first piece at that bound; above the last, the
    last piece at that bound; else the piece whose [bound i, bound i+1) holds x (std::lower_bound - 1)."""
    pieces = slopes.shape[0]
    index = jnp.clip(_search(bounds, x, "left") - 1, 0, pieces - 1)
    y = slopes[index] * x + intercepts[index]
    y = jnp.where(x >= bounds[pieces], slopes[pieces - 1] * bounds[pieces] + intercepts[pieces - 1], y)
    return jnp.where(x <= bounds[0], slopes[0] * bounds[0] + intercepts[0], y)


def _groups(op: Op, bounds: int, slopes: int, intercepts: int, binary: bool) -> tuple[int, int]:
    """(pieces per group, groups) from the parameters' sizes: each group has one more bound than slopes."""
    if slopes != intercepts:
        raise BadArgumentError(f"{op.where}: {slopes} slopes but {intercepts} intercepts: they must match")
    groups = bounds - slopes
    if groups <= 0 or (binary and groups != 1):
        raise BadArgumentError(
            f"{op.where}: {bounds} bounds and {slopes} slopes make {groups} groups"
            + (" (binary needs exactly 1)" if binary else "")
        )
    pieces = slopes // groups
    if pieces <= 0 or slopes % groups:
        raise BadArgumentError(f"{op.where}: {slopes} slopes do not split into {groups} groups")
    return pieces, groups


@register("PiecewiseLinearTransform", inputs=(1, 4), gradient=should_not_do_gradient, shape_rule=output_like_input)
def piecewise_linear_transform(op: Op) -> Kernel:
    """Column j of X [N, M] through group j of piecewise linear functions (`bounds`, `slopes`,
    `intercepts`, as arguments or inputs 1-3). With `binary`, X is [N] or [N, 1] (one group), or [N, 2]
    whose column 1 is transformed and column 0 is 1 minus it."""
    binary = op.bool("binary", False)
    given = [np.asarray(op.floats(name, ()), _F32) for name in ("bounds", "slopes", "intercepts")]
    set_count = sum(v.size > 0 for v in given)
    if set_count not in (0, 3):
        raise BadArgumentError(f"{op.where}: bounds, slopes, intercepts must be all set or all not set")
    from_args = set_count == 3
    if from_args:
        pieces, groups = _groups(op, *(v.size for v in given), binary)
        for g in range(groups):
            group = given[0][g * (pieces + 1) : (g + 1) * (pieces + 1)]
            if not np.all(group[1:] >= group[:-1]):
                raise BadArgumentError(f"{op.where}: bounds must be sorted for each group")
        if len(op.inputs) != 1:
            raise BadArgumentError(f"{op.where}: with the parameters as arguments, takes 1 input, got {len(op.inputs)}")
    elif len(op.inputs) != 4:
        raise BadArgumentError(
            f"{op.where}: takes 4 inputs (predictions, bounds, slopes, intercepts) without the parameters as "
            f"arguments, got {len(op.inputs)}"
        )

    def kernel(x: jax.Array, *params: jax.Array) -> jax.Array:
        for i, value in enumerate((x, *params)):
            _expect(op, i, value, (_F32,))
        bounds, slopes, intercepts = (jnp.ravel(p) for p in params) if params else (jnp.asarray(v) for v in given)
        pieces, groups = _groups(op, bounds.size, slopes.size, intercepts.size, binary)
        if binary:
            columns = x.shape[1] if x.ndim == 2 else 1
            if x.ndim not in (1, 2) or columns not in (1, 2):
                raise ShapeError(f"{op.where}: If binary is set to true, the input must be Nx2 or Nx1 tensor")
            if columns == 1:
                return _piecewise(x, bounds, slopes, intercepts)
            positive = _piecewise(x[:, 1], bounds, slopes, intercepts)
            return jnp.stack([1.0 - positive, positive], axis=1)
        if x.ndim != 2 or x.shape[1] != groups:
            raise ShapeError(
                f"{op.where}: X '{op.inputs[0]}' must be [N, {groups}] (a column per group), got shape {list(x.shape)}"
            )
        columns = jax.vmap(_piecewise, in_axes=(1, 0, 0, 0), out_axes=1)
        return columns(
            x, bounds.reshape(groups, pieces + 1), slopes.reshape(groups, pieces), intercepts.reshape(groups, pieces)
        )

    return kernel


@register("StumpFunc", gradient=no_gradient, shape_rule=output_like_input)
def stump_func(op: Op) -> Kernel:
    """`low_value` where x <= `threshold`, else `high_value` (all 0 by default); float32."""
    threshold, low, high = (np.float32(op.float(name, 0.0)) for name in ("threshold", "low_value", "high_value"))

    def kernel(x: jax.Array) -> jax.Array:
        _expect(op, 0, x, (_F32,))
        return jnp.where(x <= threshold, low, high)

    return kernel


@register("StumpFuncIndex", outputs=2, static_inputs=(0,), gradient=no_gradient)
def stump_func_index(op: Op) -> Kernel:
    """The int64 flat indices of the values <= `threshold` (0), and of the others. Their counts depend on
    the values, so the input is static (concrete) here."""
    threshold = np.float32(op.float("threshold", 0.0))

    def kernel(x: Any) -> tuple[jax.Array, jax.Array]:
        _expect(op, 0, x, (_F32,))
        flat = np.asarray(x).ravel()
        low = flat <= threshold
        return jnp.asarray(np.flatnonzero(low), jnp.int64), jnp.asarray(np.flatnonzero(~low), jnp.int64)

    return kernel
