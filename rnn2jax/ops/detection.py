"""Detection ops of Detectron (Faster/Mask R-CNN): RoI pooling and alignment, box regression, NMS, region
proposals, FPN level assignment, keypoints and R-MAC regions (caffe2/operators/roi_align_op.cc,
roi_align_gradient_op.cc, roi_align_rotated_op.cc, roi_pool_op.cc, bbox_transform_op.cc,
box_with_nms_limit_op.cc, generate_proposals_op.cc and its utils headers,
collect_and_distribute_fpn_rpn_proposals_op.cc, heatmap_max_keypoint_op.cc, rmac_regions_op.cc,
normalize_planar_yuv_op.cc).

RoIAlign (rotated too), RoIAlignGradient, RoIPool, BBoxTransform and HeatmapMaxKeypoint are jax.numpy
gathers and scatters. NMS keeps a data-dependent number of boxes, so BoxWithNMSLimit, GenerateProposals and
the FPN ops read their inputs' values (static inputs) and run Caffe2's loops in NumPy float32; RoIAlign
reads its RoIs' values only where its sampling grid follows from their sizes (sampling_ratio <= 0). Caffe2
sorts scores with std::sort, which leaves the order of equal scores unspecified (in practice: index order up
to 16 of them, its insertion sort; not beyond); here equal scores keep their index order (a stable sort).

RoIPoolGradient and RoIAlignRotatedGradient, which Caffe2's makers emit, have no CPU kernel in Caffe2 (only
CUDA computes them), so there is nothing to match: they are left unsupported.

Rotated boxes (5 columns: centre, size, angle in degrees) are handled throughout; their NMS intersects the
rotated rectangles as Caffe2 does (edge crossings and enclosed corners, a Graham-scan hull, its area), in
Python loops: exact, but slow for thousands of proposals.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import (
    GradientContext,
    GradientError,
    GradientOps,
    gradient_op,
    should_not_do_gradient,
    single_gradient,
)
from .registry import Kernel, declare_family, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)
runtime_checked("RoIAlign", "RoIAlignGradient", "RoIAlignRotated", "RoIPool", "BBoxTransform")

_F32 = np.dtype(np.float32)
# utils::BBOX_XFORM_CLIP_DEFAULT (generate_proposals_op_util_boxes.h): log(1000 / 16), a float
_BBOX_XFORM_CLIP = np.float32(np.log(1000.0 / 16.0))
_PI = np.float32(np.pi)
_FLT_MAX = np.float32(np.finfo(np.float32).max)


# --------------------------------------------------------------------------------------------------
# Helpers


def _check_float(op: Op, x: Any, index: int) -> None:
    if np.dtype(x.dtype) != _F32:
        raise ShapeError(f"{op.where}: input '{op.inputs[index]}' has dtype {x.dtype}; {op.type} takes float tensors")


def _check_rank(op: Op, x: Any, rank: int, index: int) -> None:
    if x.ndim != rank:
        raise ShapeError(f"{op.where}: input '{op.inputs[index]}' must be {rank}-D, got shape {list(x.shape)}")


def _positive(op: Op, name: str, default: int) -> int:
    value = op.int(name, default)
    if value <= 0:
        raise BadArgumentError(f"{op.where}: argument '{name}' must be positive, got {value}")
    return value


def _nhwc(op: Op) -> bool:
    order = op.str("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise BadArgumentError(f"{op.where}: argument 'order' = {order!r} must be NCHW or NHWC")
    return order == "NHWC"


def _rois_columns(op: Op, rois: Any, index: int = 1) -> int:
    if rois.ndim != 2 or rois.shape[1] not in (4, 5):
        raise ShapeError(
            f"{op.where}: RoIs '{op.inputs[index]}' must be [R, 4] or [R, 5] (batch index, x1, y1, x2, y2), "
            f"got shape {list(rois.shape)}"
        )
    return rois.shape[1]


def _check_batch_index(op: Op, batch: Any, n: int, xp: Any = jnp) -> None:
    """RoIs' batch indices must pick an image of X (Caffe2 reads outside X otherwise)."""
    enforce(
        ~xp.any((batch < 0) | (batch >= n)),
        f"{literal(op.where)}: RoIs '{literal(op.inputs[1])}' hold a batch index outside [0, {n})",
    )


def _round_half_away(x: Any) -> Any:
    """C's round(): halves away from zero (jnp.round rounds them to even)."""
    whole = jnp.trunc(x)
    return whole + jnp.where(jnp.abs(x - whole) >= 0.5, jnp.sign(x), 0.0)


# --------------------------------------------------------------------------------------------------
# RoIAlign and its gradient (roi_align_op.cc, roi_align_gradient_op.cc)


class _Align:
    """RoIAlign's arguments: pooled size, spatial scale, sampling ratio and `aligned` (half-pixel offset)."""

    def __init__(self, op: Op):
        self.op = op
        self.scale = np.float32(op.float("spatial_scale", 1.0))
        self.pooled_h = _positive(op, "pooled_h", 1)
        self.pooled_w = _positive(op, "pooled_w", 1)
        self.sampling = op.int("sampling_ratio", -1)
        self.aligned = op.bool("aligned", False)

    def geometry(self, rois: Any, xp: Any = jnp) -> tuple[Any, ...]:
        """(batch index, y1, x1, roi height, roi width) of each RoI on the feature map, in float32."""
        cols = rois.shape[1]
        batch = rois[:, 0].astype(xp.int32) if cols == 5 else xp.zeros(rois.shape[0], xp.int32)
        box = rois[:, cols - 4 :]
        offset = np.float32(0.5 if self.aligned else 0.0)
        x1, y1 = box[:, 0] * self.scale - offset, box[:, 1] * self.scale - offset
        x2, y2 = box[:, 2] * self.scale - offset, box[:, 3] * self.scale - offset
        roi_w, roi_h = x2 - x1, y2 - y1
        if self.aligned:
            where = literal(self.op.where)
            enforce(
                xp.all((roi_w >= 0) & (roi_h >= 0)),
                f"{where}: ROIs in ROIAlign do not have non-negative size! (RoIs '{literal(self.op.inputs[1])}')",
            )
        else:  # backward compatibility: force malformed RoIs to be 1x1
            roi_w, roi_h = xp.maximum(roi_w, np.float32(1)), xp.maximum(roi_h, np.float32(1))
        return batch, y1, x1, roi_h, roi_w

    def grids(self, rois: Any) -> tuple[Any, Any, int, int]:
        """The sampling grid of each RoI's bins (rows, columns) and the largest of each: `sampling_ratio`,
        or ceil(roi size / pooled size), which needs the RoIs' values (a static input then)."""
        if self.sampling > 0:
            return self.sampling, self.sampling, self.sampling, self.sampling
        _, _, _, roi_h, roi_w = self.geometry(np.asarray(rois), np)
        grid_h = np.ceil(roi_h / np.float32(self.pooled_h)).astype(np.int64)
        grid_w = np.ceil(roi_w / np.float32(self.pooled_w)).astype(np.int64)
        most_h = int(grid_h.max(initial=1)) or 1
        most_w = int(grid_w.max(initial=1)) or 1
        return jnp.asarray(grid_h, jnp.int32), jnp.asarray(grid_w, jnp.int32), most_h, most_w


def _static_rois(op: Op) -> tuple[int, ...]:
    """With an adaptive sampling grid (sampling_ratio <= 0) the RoIs' sizes decide the grid's size."""
    return (1,) if op.int("sampling_ratio", -1) <= 0 else ()


def _axis_samples(start: Any, bin_size: Any, grid: Any, pooled: int, most: int, size: int, gradient: bool):
    """Along one axis, for RoI r, bin p, sample i: (valid, low index, high index, weight of low, weight of
    high), each [R, pooled, most]. Caffe2's forward computes the position as start + p * bin + (i + .5) *
    (bin / grid); its gradient as start + p * bin + (i + .5) * bin / grid: the roundings are kept."""
    grid_f = jnp.asarray(grid, jnp.float32)
    if jnp.ndim(grid_f):
        grid_f = grid_f[:, None, None]
    start, bin_size = start[:, None, None], bin_size[:, None, None]
    p = jnp.arange(pooled, dtype=jnp.float32)[None, :, None]
    i = jnp.arange(most, dtype=jnp.float32)[None, None, :] + np.float32(0.5)
    pos = start + p * bin_size + i * bin_size / grid_f if gradient else start + p * bin_size + i * (bin_size / grid_f)
    valid = ~((pos < -1.0) | (pos > size))
    index = jnp.arange(most)[None, None, :]
    valid = valid & (index < (jnp.asarray(grid)[:, None, None] if jnp.ndim(grid) else grid))
    pos = jnp.clip(pos, 0.0, np.float32(size - 1))
    low = jnp.floor(pos).astype(jnp.int32)
    high = jnp.minimum(low + 1, size - 1)
    frac = pos - low.astype(jnp.float32)
    return valid, low, high, np.float32(1) - frac, frac


@register(
    "RoIAlign", inputs=2, static_inputs=_static_rois, gradient=single_gradient("RoIAlignGradient", "I(0) I(1) GO(0)")
)
def roi_align(op: Op) -> Kernel:
    """(X [N, C, H, W] (or NHWC), RoIs [R, 4 or 5]) -> Y [R, C, pooled_h, pooled_w]: the average of bilinear
    samples on a grid in each bin of each RoI (Mask R-CNN)."""
    align = _Align(op)
    nhwc = _nhwc(op)

    def kernel(x, rois):
        _check_float(op, x, 0)
        _check_rank(op, x, 4, 0)
        _rois_columns(op, rois)
        _check_float(op, rois, 1)
        n_rois = rois.shape[0]
        xt = x if nhwc else jnp.transpose(x, (0, 2, 3, 1))  # [N, H, W, C]
        _, h, w, c = xt.shape
        ph, pw = align.pooled_h, align.pooled_w
        if n_rois == 0:
            return jnp.zeros((0, ph, pw, c) if nhwc else (0, c, ph, pw), jnp.float32)
        batch, y1, x1, roi_h, roi_w = align.geometry(rois)
        _check_batch_index(op, batch, xt.shape[0])
        grid_h, grid_w, most_h, most_w = align.grids(rois)
        bin_h, bin_w = roi_h / np.float32(ph), roi_w / np.float32(pw)
        vy, yl, yh, qy, py = _axis_samples(y1, bin_h, grid_h, ph, most_h, h, False)
        vx, xl, xh, qx, px = _axis_samples(x1, bin_w, grid_w, pw, most_w, w, False)
        # axes [R, ph, iy, pw, ix]
        ey = (slice(None), slice(None), slice(None), None, None)
        ex = (slice(None), None, None, slice(None), slice(None))
        b = batch[:, None, None, None, None]
        valid = (vy[ey] & vx[ex])[..., None]
        term = (
            (qy[ey] * qx[ex])[..., None] * xt[b, yl[ey], xl[ex]]
            + (qy[ey] * px[ex])[..., None] * xt[b, yl[ey], xh[ex]]
            + (py[ey] * qx[ex])[..., None] * xt[b, yh[ey], xl[ex]]
            + (py[ey] * px[ex])[..., None] * xt[b, yh[ey], xh[ex]]
        )
        total = jnp.sum(jnp.where(valid, term, np.float32(0)), axis=(2, 4))  # [R, ph, pw, C]
        count = jnp.asarray(grid_h * grid_w, jnp.float32)
        scale = np.float32(1) / count
        y = total * (scale[:, None, None, None] if jnp.ndim(scale) else scale)
        return y if nhwc else jnp.transpose(y, (0, 3, 1, 2))

    return kernel


@register("RoIAlignGradient", inputs=3, static_inputs=_static_rois)
def roi_align_gradient(op: Op) -> Kernel:
    """(X, RoIs, dY) -> dX: each sample's share of its bin's gradient, added to the four pixels it
    interpolates. Caffe2's CPU kernel reads X and dY as NCHW whatever the forward op's `order`."""
    align = _Align(op)

    def kernel(x, rois, dy):
        for i, v in enumerate((x, rois, dy)):
            _check_float(op, v, i)
        _rois_columns(op, rois)
        dx = jnp.zeros(x.shape, jnp.float32)
        if dy.size == 0:
            return dx
        _check_rank(op, x, 4, 0)
        n_rois = rois.shape[0]
        _, c, h, w = x.shape
        ph, pw = align.pooled_h, align.pooled_w
        if dy.size != n_rois * c * ph * pw:
            raise ShapeError(
                f"{op.where}: dY '{op.inputs[2]}' has {dy.size} elements; {n_rois} RoIs of {c} channels "
                f"pooled to {ph}x{pw} need {n_rois * c * ph * pw}"
            )
        grad = jnp.reshape(dy, (n_rois, c, ph, pw))
        batch, y1, x1, roi_h, roi_w = align.geometry(rois)
        _check_batch_index(op, batch, x.shape[0])
        grid_h, grid_w, most_h, most_w = align.grids(rois)
        bin_h, bin_w = roi_h / np.float32(ph), roi_w / np.float32(pw)
        vy, yl, yh, qy, py = _axis_samples(y1, bin_h, grid_h, ph, most_h, h, True)
        vx, xl, xh, qx, px = _axis_samples(x1, bin_w, grid_w, pw, most_w, w, True)
        count = jnp.asarray(grid_h * grid_w, jnp.float32)
        count = count[:, None, None, None, None, None] if jnp.ndim(count) else count
        # axes [R, C, ph, iy, pw, ix]
        ey = (slice(None), None, slice(None), slice(None), None, None)
        ex = (slice(None), None, None, None, slice(None), slice(None))
        top = grad[:, :, :, None, :, None]
        valid = vy[ey] & vx[ex]
        base = (batch[:, None, None, None, None, None] * c + jnp.arange(c)[None, :, None, None, None, None]) * (h * w)
        flat = dx.reshape(-1)
        for wy, wx, iy, ix in ((qy, qx, yl, xl), (qy, px, yl, xh), (py, qx, yh, xl), (py, px, yh, xh)):
            share = jnp.where(valid, top * (wy[ey] * wx[ex]) / count, np.float32(0))
            index = base + iy[ey] * w + ix[ex]
            flat = flat.at[jnp.broadcast_to(index, share.shape).reshape(-1)].add(share.reshape(-1))
        return flat.reshape(x.shape)

    return kernel


# --------------------------------------------------------------------------------------------------
# RoIPool (roi_pool_op.cc)


def _roi_pool_outputs(op: Op) -> None:
    is_test = op.bool("is_test", False)
    if (is_test and len(op.outputs) != 1) or (not is_test and len(op.outputs) != 2):
        raise BadArgumentError(
            f"{op.where}: RoIPool gives Y alone with is_test=1, or Y and argmaxes otherwise "
            f"(is_test={int(is_test)}, {len(op.outputs)} outputs): Output size mismatch"
        )


def _roi_pool_gradient_maker(g: GradientContext) -> GradientOps:
    """Caffe2's GetRoIPoolGradient: RoIPoolGradient(X, RoIs, argmaxes, dY) -> dX; with is_test there are no
    argmaxes (Caffe2's maker fails on the missing output)."""
    if len(g.op.output) < 2:
        raise GradientError(f"RoIPool {g.op.output[0]} has no argmaxes output (is_test) to take a gradient from")
    return [gradient_op("RoIPoolGradient", [g.I(0), g.I(1), g.O(1), g.GO(0)], [g.GI(0)])]


@register("RoIPool", inputs=2, outputs=(1, 2), gradient=_roi_pool_gradient_maker)
def roi_pool(op: Op) -> Kernel:
    """(X [N, C, H, W], RoIs [R, 5]) -> Y [R, C, pooled_h, pooled_w] (the max over each bin of each RoI,
    its corners rounded to pixels; an empty bin is 0) and, unless is_test, argmaxes (int32 index h * W + w
    of the first maximum, -1 for an empty bin). NCHW only, as Caffe2's CPU kernel."""
    _roi_pool_outputs(op)
    scale = np.float32(op.float("spatial_scale", 1.0))
    ph, pw = _positive(op, "pooled_h", 1), _positive(op, "pooled_w", 1)

    def kernel(x, rois):
        _check_float(op, x, 0)
        _check_rank(op, x, 4, 0)
        if rois.ndim != 2 or rois.shape[1] != 5:
            raise ShapeError(
                f"{op.where}: RoIs '{op.inputs[1]}' must be [R, 5] (batch index, x1, y1, x2, y2), "
                f"got shape {list(rois.shape)}"
            )
        _check_float(op, rois, 1)
        n, c, h, w = x.shape
        batch = rois[:, 0].astype(jnp.int32)
        _check_batch_index(op, batch, n)
        corners = _round_half_away(rois[:, 1:] * scale).astype(jnp.int32)
        start_w, start_h, end_w, end_h = corners[:, 0], corners[:, 1], corners[:, 2], corners[:, 3]
        roi_h = jnp.maximum(end_h - start_h + 1, 1)
        roi_w = jnp.maximum(end_w - start_w + 1, 1)

        def bins(start, size, pooled, limit):
            bin_size = size.astype(jnp.float32) / np.float32(pooled)
            p = jnp.arange(pooled, dtype=jnp.float32)
            lo = jnp.floor(p[None, :] * bin_size[:, None]).astype(jnp.int32)
            hi = jnp.ceil((p[None, :] + 1) * bin_size[:, None]).astype(jnp.int32)
            lo = jnp.clip(lo + start[:, None], 0, limit)
            hi = jnp.clip(hi + start[:, None], 0, limit)
            inside = (jnp.arange(limit)[None, None, :] >= lo[:, :, None]) & (
                jnp.arange(limit)[None, None, :] < hi[:, :, None]
            )
            return inside, hi <= lo

        in_h, empty_h = bins(start_h, roi_h, ph, h)  # [R, ph, H], [R, ph]
        in_w, empty_w = bins(start_w, roi_w, pw, w)
        xb = jnp.clip(batch, 0, max(n - 1, 0))
        data = x[xb] if n else jnp.zeros((rois.shape[0], c, h, w), jnp.float32)
        data = jnp.where(jnp.isnan(data), -jnp.inf, data)  # NaN never compares greater
        # max over w within each column bin: [R, C, H, pw]
        along_w = jnp.where(in_w[:, None, None, :, :], data[:, :, :, None, :], -jnp.inf)
        row_max = jnp.max(along_w, axis=-1, initial=-jnp.inf)
        row_arg = jnp.argmax(along_w, axis=-1) if w else jnp.zeros(row_max.shape, jnp.int32)
        # then over h within each row bin: [R, C, ph, H, pw]
        along_h = jnp.where(in_h[:, None, :, :, None], row_max[:, :, None, :, :], -jnp.inf)
        best = jnp.max(along_h, axis=3, initial=-jnp.inf)  # [R, C, ph, pw]
        best_h = jnp.argmax(along_h, axis=3) if h else jnp.zeros(best.shape, jnp.int32)
        best_w = jnp.take_along_axis(row_arg, best_h, axis=2) if h else best_h
        empty = (empty_h[:, :, None] | empty_w[:, None, :])[:, None]  # [R, 1, ph, pw]
        found = best > -_FLT_MAX
        y = jnp.where(empty, np.float32(0), jnp.where(found, best, -_FLT_MAX))
        argmax = jnp.where(empty | ~found, -1, best_h * w + best_w).astype(jnp.int32)
        return y, argmax

    return kernel


# --------------------------------------------------------------------------------------------------
# Box transforms (generate_proposals_op_util_boxes.h)


def _weights(op: Op) -> tuple[np.float32, ...]:
    weights = op.floats("weights", (1.0, 1.0, 1.0, 1.0))
    if len(weights) != 4:
        raise BadArgumentError(
            f"{op.where}: argument 'weights' must hold 4 values [wx, wy, ww, wh], got {len(weights)}"
        )
    return tuple(np.float32(v) for v in weights)


def _transform_upright(xp: Any, boxes: Any, deltas: Any, weights: tuple, plus: np.float32) -> Any:
    """utils::bbox_transform_upright: [..., 4] boxes (x1, y1, x2, y2) moved by deltas (dx, dy, dw, dh)."""
    widths = boxes[..., 2] - boxes[..., 0] + plus
    heights = boxes[..., 3] - boxes[..., 1] + plus
    ctr_x = boxes[..., 0] + np.float32(0.5) * widths
    ctr_y = boxes[..., 1] + np.float32(0.5) * heights
    dx, dy = deltas[..., 0] / weights[0], deltas[..., 1] / weights[1]
    dw = xp.minimum(deltas[..., 2] / weights[2], _BBOX_XFORM_CLIP)
    dh = xp.minimum(deltas[..., 3] / weights[3], _BBOX_XFORM_CLIP)
    pred_ctr_x, pred_ctr_y = dx * widths + ctr_x, dy * heights + ctr_y
    pred_w, pred_h = xp.exp(dw) * widths, xp.exp(dh) * heights
    half_w, half_h = np.float32(0.5) * pred_w, np.float32(0.5) * pred_h
    return xp.stack(
        [pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w - plus, pred_ctr_y + half_h - plus], axis=-1
    )


def _transform_rotated(xp: Any, boxes: Any, deltas: Any, weights: tuple, bound: tuple[bool, int, int] | None) -> Any:
    """utils::bbox_transform_rotated: [..., 5] boxes (ctr_x, ctr_y, w, h, angle in degrees); the angle delta
    is in radians; with `bound` (on, lo, hi) the angle is brought into [lo, hi] by one period."""
    dx, dy = deltas[..., 0] / weights[0], deltas[..., 1] / weights[1]
    dw = xp.minimum(deltas[..., 2] / weights[2], _BBOX_XFORM_CLIP)
    dh = xp.minimum(deltas[..., 3] / weights[3], _BBOX_XFORM_CLIP)
    da = deltas[..., 4] * np.float32(180.0) / _PI
    widths, heights = boxes[..., 2], boxes[..., 3]
    angle = da + boxes[..., 4]
    if bound is not None:
        _, lo, hi = bound
        period = np.float32(hi - lo)
        angle = xp.where(angle < lo, angle + period, xp.where(angle > hi, angle - period, angle))
    return xp.stack(
        [dx * widths + boxes[..., 0], dy * heights + boxes[..., 1], xp.exp(dw) * widths, xp.exp(dh) * heights, angle],
        axis=-1,
    )


def _clip_upright(xp: Any, boxes: Any, height: Any, width: Any, plus: np.float32) -> Any:
    """utils::clip_boxes_upright: x into [0, width - 1], y into [0, height - 1] (with legacy_plus_one)."""
    top_x, top_y = width - plus, height - plus
    return xp.stack(
        [
            xp.maximum(xp.minimum(boxes[..., 0], top_x), np.float32(0)),
            xp.maximum(xp.minimum(boxes[..., 1], top_y), np.float32(0)),
            xp.maximum(xp.minimum(boxes[..., 2], top_x), np.float32(0)),
            xp.maximum(xp.minimum(boxes[..., 3], top_y), np.float32(0)),
        ],
        axis=-1,
    )


def _clip_rotated(xp: Any, boxes: Any, height: Any, width: Any, thresh: np.float32, plus: np.float32) -> Any:
    """utils::clip_boxes_rotated: only boxes within `thresh` degrees of upright are clipped, as upright ones."""
    half_w, half_h = (boxes[..., 2] - plus) / np.float32(2), (boxes[..., 3] - plus) / np.float32(2)
    corners = xp.stack(
        [boxes[..., 0] - half_w, boxes[..., 1] - half_h, boxes[..., 0] + half_w, boxes[..., 1] + half_h], axis=-1
    )
    c = _clip_upright(xp, corners, height, width, plus)
    clipped = xp.stack(
        [
            (c[..., 0] + c[..., 2]) / np.float32(2),
            (c[..., 1] + c[..., 3]) / np.float32(2),
            c[..., 2] - c[..., 0] + plus,
            c[..., 3] - c[..., 1] + plus,
            boxes[..., 4],
        ],
        axis=-1,
    )
    return xp.where((xp.abs(boxes[..., 4]) <= thresh)[..., None], clipped, boxes)


class _BoxArgs:
    """The arguments BBoxTransform and GenerateProposals share for rotated boxes and pixel conventions."""

    def __init__(self, op: Op):
        self.plus = np.float32(1 if op.bool("legacy_plus_one", True) else 0)
        self.bound_on = op.bool("angle_bound_on", True)
        self.bound_lo = op.int("angle_bound_lo", -90)
        self.bound_hi = op.int("angle_bound_hi", 90)
        self.clip_angle = np.float32(op.float("clip_angle_thresh", 1.0))
        self.where = op.where

    def bound(self) -> tuple[bool, int, int] | None:
        if not self.bound_on:
            return None
        period = self.bound_hi - self.bound_lo
        if not (period > 0 and period % 180 == 0):
            raise BadArgumentError(
                f"{self.where}: angle_bound_hi - angle_bound_lo must be a positive multiple of 180, got {period}"
            )
        return True, self.bound_lo, self.bound_hi

    def transform(self, xp: Any, boxes: Any, deltas: Any, weights: tuple) -> Any:
        if boxes.shape[-1] == 4:
            return _transform_upright(xp, boxes, deltas, weights, self.plus)
        return _transform_rotated(xp, boxes, deltas, weights, self.bound())

    def clip(self, xp: Any, boxes: Any, height: Any, width: Any) -> Any:
        if boxes.shape[-1] == 4:
            return _clip_upright(xp, boxes, height, width, self.plus)
        return _clip_rotated(xp, boxes, height, width, self.clip_angle, self.plus)


def _int_plus_half(v: Any) -> Any:
    """C++ int(v + 0.5) for a float v added to a double 0.5: exact, no float32 rounding of the sum."""
    low = jnp.floor(v)
    up = (v - low) >= np.float32(0.5)
    result = low + up.astype(jnp.float32)
    return jnp.where(result < 0, jnp.ceil(v + np.float32(0.5)), result)


@register("BBoxTransform", inputs=3, outputs=(1, 2), gradient=should_not_do_gradient)
def bbox_transform(op: Op) -> Kernel:
    """(rois [M, 4 or 5] (optional batch index first), deltas [M, 4K], im_info [B, 3]) -> boxes [M, 4K]
    (each class's deltas applied to each RoI, clipped to its image, in the scaled image's pixels) and
    roi_batch_splits (float32 RoIs per image). With rotated=1, boxes are 5 wide (centre, size, angle).
    The RoIs of each image follow each other in image order: a RoI takes the image of its place."""
    weights = _weights(op)
    apply_scale = op.bool("apply_scale", True)
    box_dim = 5 if op.bool("rotated", False) else 4
    args = _BoxArgs(op)
    if box_dim == 5:
        args.bound()

    def kernel(rois, deltas, im_info):
        for i, v in enumerate((rois, deltas, im_info)):
            _check_float(op, v, i)
        m = rois.shape[0] if rois.ndim else 0
        if rois.ndim != 2 or rois.shape[1] not in (box_dim, box_dim + 1):
            raise ShapeError(
                f"{op.where}: rois '{op.inputs[0]}' must be [M, {box_dim}] or [M, {box_dim + 1}], "
                f"got {list(rois.shape)}"
            )
        if deltas.ndim != 2 or deltas.shape[0] != m or deltas.shape[1] % box_dim:
            raise ShapeError(
                f"{op.where}: deltas '{op.inputs[1]}' must be [{m}, {box_dim} * classes], got {list(deltas.shape)}"
            )
        if im_info.ndim != 2 or im_info.shape[1] != 3:
            raise ShapeError(f"{op.where}: im_info '{op.inputs[2]}' must be [batch, 3], got {list(im_info.shape)}")
        batch_size = im_info.shape[0]
        if rois.shape[1] == box_dim:
            if batch_size != 1:
                raise ShapeError(
                    f"{op.where}: rois '{op.inputs[0]}' have no batch index, so im_info must have one row, "
                    f"got {batch_size}"
                )
            counts = jnp.full((1,), m, jnp.int32)
            image = jnp.zeros(m, jnp.int32)
        else:
            ids = rois[:, 0].astype(jnp.int32)
            enforce(
                ~jnp.any((ids < 0) | (ids >= batch_size)),
                f"{literal(op.where)}: rois '{literal(op.inputs[0])}' hold a batch index outside [0, {batch_size})",
            )
            counts = jnp.sum(ids[:, None] == jnp.arange(batch_size)[None, :], axis=0).astype(jnp.int32)
            image = jnp.searchsorted(jnp.cumsum(counts), jnp.arange(m), side="right")
            image = jnp.minimum(image, batch_size - 1)
        info = im_info[image] if m else jnp.zeros((0, 3), jnp.float32)
        scale_before = info[:, 2]
        scale_after = scale_before if apply_scale else jnp.ones_like(scale_before)
        img_h = _int_plus_half(info[:, 0] / scale_before)
        img_w = _int_plus_half(info[:, 1] / scale_before)
        boxes = rois[:, rois.shape[1] - box_dim :]
        boxes = jnp.concatenate([boxes[:, :4] / scale_before[:, None], boxes[:, 4:]], axis=1)
        classes = deltas.shape[1] // box_dim
        d = deltas.reshape(m, classes, box_dim)
        moved = args.transform(jnp, jnp.broadcast_to(boxes[:, None, :], d.shape), d, weights)
        clipped = args.clip(jnp, moved, img_h[:, None], img_w[:, None])
        out = jnp.concatenate([clipped[..., :4] * scale_after[:, None, None], clipped[..., 4:]], axis=-1)
        return out.reshape(m, classes * box_dim), counts.astype(jnp.float32)

    return kernel


# --------------------------------------------------------------------------------------------------
# NMS (generate_proposals_op_util_nms.h), in NumPy float32 on known values


def _by_score(scores: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """`indices` sorted by score, highest first; equal scores in index order (Caffe2's std::sort leaves
    their order unspecified)."""
    return indices[np.argsort(-scores[indices], kind="stable")]


def _overlaps(boxes: np.ndarray, areas: np.ndarray, i: int, rest: np.ndarray, plus: np.float32) -> np.ndarray:
    """IoU of box i with the boxes `rest`, in float32 as Caffe2 computes it: upright [x1, y1, x2, y2] boxes, or
    rotated [ctr_x, ctr_y, w, h, angle] ones (their intersection polygon's area)."""
    if boxes.shape[1] == 5:
        inter = np.array([_rotated_intersection(boxes[i], boxes[j]) for j in rest], np.float32).reshape(-1)
        return _iou(inter, areas[i] + areas[rest] - inter)
    xx1 = np.maximum(boxes[rest, 0], boxes[i, 0])
    yy1 = np.maximum(boxes[rest, 1], boxes[i, 1])
    xx2 = np.minimum(boxes[rest, 2], boxes[i, 2])
    yy2 = np.minimum(boxes[rest, 3], boxes[i, 3])
    w = np.maximum(xx2 - xx1 + plus, np.float32(0))
    h = np.maximum(yy2 - yy1 + plus, np.float32(0))
    inter = w * h
    return _iou(inter, areas[i] + areas[rest] - inter)


def _iou(inter: np.ndarray, union: np.ndarray) -> np.ndarray:
    """inter / union; two empty boxes give NaN, which no threshold keeps (as in Caffe2)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return inter / union


def _areas(boxes: np.ndarray, plus: np.float32) -> np.ndarray:
    if boxes.shape[1] == 5:
        return boxes[:, 2] * boxes[:, 3]
    return (boxes[:, 2] - boxes[:, 0] + plus) * (boxes[:, 3] - boxes[:, 1] + plus)


# Rotated rectangles' intersection (generate_proposals_op_util_nms.h: rotated_rect_intersection_pts, a
# replacement for OpenCV's rotatedRectangleIntersection, convex_hull_graham and polygon_area), in float32.

_F = np.float32


def _cross(a: tuple, b: tuple) -> np.float32:
    return a[0] * b[1] - b[0] * a[1]


def _sub(a: tuple, b: tuple) -> tuple:
    return (a[0] - b[0], a[1] - b[1])


def _dot(a: tuple, b: tuple) -> np.float32:
    return a[0] * b[0] + a[1] * b[1]


def _vertices(box: np.ndarray) -> list[tuple]:
    """RotatedRect::get_vertices of a [ctr_x, ctr_y, w, h, angle] box (counter-clockwise degrees; the
    rectangle takes -angle, OpenCV's clockwise convention)."""
    cx, cy, w, h = (_F(v) for v in box[:4])
    angle = float(-box[4]) * 0.01745329251
    b, a = _F(np.cos(angle)) * _F(0.5), _F(np.sin(angle)) * _F(0.5)
    p0 = (cx - a * h - b * w, cy + b * h - a * w)
    p1 = (cx + a * h - b * w, cy - b * h - a * w)
    return [p0, p1, (_F(2) * cx - p0[0], _F(2) * cy - p0[1]), (_F(2) * cx - p1[0], _F(2) * cy - p1[1])]


def _intersection_points(pts1: list[tuple], pts2: list[tuple]) -> tuple[list[tuple], bool]:
    """The points of two rectangles' intersection (edge crossings and vertices inside the other), and
    whether the rectangles are the same."""
    if all(abs(p[0] - q[0]) <= _F(1e-5) and abs(p[1] - q[1]) <= _F(1e-5) for p, q in zip(pts1, pts2, strict=True)):
        return list(pts1), True
    vec1 = [_sub(pts1[(i + 1) % 4], pts1[i]) for i in range(4)]
    vec2 = [_sub(pts2[(i + 1) % 4], pts2[i]) for i in range(4)]
    found = []
    for i in range(4):
        for j in range(4):
            det = _cross(vec2[j], vec1[i])
            if abs(det) <= 1e-14:
                continue
            vec12 = _sub(pts2[j], pts1[i])
            t1 = _cross(vec2[j], vec12) / det
            t2 = _cross(vec1[i], vec12) / det
            if _F(0) <= t1 <= _F(1) and _F(0) <= t2 <= _F(1):
                found.append((pts1[i][0] + t1 * vec1[i][0], pts1[i][1] + t1 * vec1[i][1]))
    for inner, outer, vec in ((pts1, pts2, vec2), (pts2, pts1, vec1)):
        ab, da = vec[0], vec[3]
        ab_ab, ad_ad = _dot(ab, ab), _dot(da, da)
        for p in inner:
            ap = _sub(p, outer[0])
            ap_ab, ap_ad = _dot(ap, ab), -_dot(ap, da)
            if ap_ab >= 0 and ap_ad >= 0 and ap_ab <= ab_ab and ap_ad <= ad_ad:
                found.append(p)
    return found, False


def _angle_order(a: tuple, b: tuple) -> int:
    """convex_hull_graham's comparator: by angle about the lowest point, nearer first when collinear."""
    temp = _cross(a, b)
    if abs(temp) < 1e-6:
        na, nb = _dot(a, a), _dot(b, b)
        return -1 if na < nb else (1 if nb < na else 0)
    return -1 if temp > 0 else 1


def _hull_area(points: list[tuple]) -> float:
    """convex_hull_graham (points shifted to the lowest one) then polygon_area (a double sum)."""
    t = 0
    for i in range(1, len(points)):
        if points[i][1] < points[t][1] or (points[i][1] == points[t][1] and points[i][0] < points[t][0]):
            t = i
    start = points[t]
    q = [_sub(p, start) for p in points]
    q[0], q[t] = q[t], q[0]
    q[1:] = sorted(q[1:], key=functools.cmp_to_key(_angle_order))
    k = next((k for k in range(1, len(q)) if _dot(q[k], q[k]) > 1e-8), len(q))
    if k == len(q):
        return 0.0
    q[1] = q[k]
    m = 2
    for i in range(k + 1, len(q)):
        while m > 1 and _cross(_sub(q[i], q[m - 2]), _sub(q[m - 1], q[m - 2])) >= 0:
            m -= 1
        q[m] = q[i]
        m += 1
    if m <= 2:
        return 0.0
    area = 0.0
    for i in range(1, m - 1):
        area += abs(float(_cross(_sub(q[i], q[0]), _sub(q[i + 1], q[0]))))
    return area / 2.0


def _rotated_intersection(box1: np.ndarray, box2: np.ndarray) -> np.float32:
    """rotated_rect_intersection: the area two rotated boxes share."""
    points, same = _intersection_points(_vertices(box1), _vertices(box2))
    if len(points) <= 2:
        return _F(0)
    if same:
        return min(_F(box1[2]) * _F(box1[3]), _F(box2[2]) * _F(box2[3]))
    return _F(_hull_area(points))


def nms(boxes: np.ndarray, order: np.ndarray, thresh: np.float32, top_n: int, plus: np.float32) -> list[int]:
    """utils::nms_cpu_upright: greedy NMS over `order` (indices sorted by score); at most `top_n` (< 0: all)."""
    areas = _areas(boxes, plus)
    keep: list[int] = []
    order = np.asarray(order, np.int64)
    while order.size:
        if 0 <= top_n <= len(keep):
            break
        i, rest = int(order[0]), order[1:]
        keep.append(i)
        order = rest[_overlaps(boxes, areas, i, rest, plus) <= thresh]
    return keep


def soft_nms(
    scores: np.ndarray,
    boxes: np.ndarray,
    indices: np.ndarray,
    sigma: np.float32,
    thresh: np.float32,
    min_score: np.float32,
    method: int,
    plus: np.float32,
) -> tuple[list[int], np.ndarray]:
    """utils::soft_nms_cpu_upright: (kept indices, rescored scores). Each step keeps the best pending box and
    scales the others' scores by 1 - IoU above `thresh` (linear) or exp(-IoU^2 / sigma) (gaussian)."""
    out = scores.astype(np.float32).copy()
    areas = _areas(boxes, plus)
    keep: list[int] = []
    pending = np.asarray(indices, np.int64).copy()
    while pending.size:
        best = int(np.argmax(out[pending]))
        i = int(pending[best])
        keep.append(i)
        pending[0], pending[best] = pending[best], pending[0]
        rest = pending[1:]
        ovr = _overlaps(boxes, areas, i, rest, plus).astype(np.float64)
        weight = np.where(ovr > thresh, 1.0 - ovr, 1.0) if method == 1 else np.exp(-1.0 * ovr * ovr / np.float64(sigma))
        out[rest] *= weight.astype(np.float32)
        pending = rest[out[rest] >= min_score]
    return keep, out


def _known(x: Any) -> np.ndarray:
    """An input the registry makes static: its values, here while the net is built."""
    return np.asarray(x)


# --------------------------------------------------------------------------------------------------
# BoxWithNMSLimit (box_with_nms_limit_op.cc)


def _rank2(op: Op, x: np.ndarray, index: int) -> np.ndarray:
    if x.ndim == 4:
        if x.shape[2] != 1 or x.shape[3] != 1:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[index]}' of rank 4 must be [N, K, 1, 1], got {list(x.shape)}"
            )
        return x.reshape(x.shape[:2])
    if x.ndim != 2:
        raise ShapeError(f"{op.where}: input '{op.inputs[index]}' must be 2-D, got shape {list(x.shape)}")
    return x


@register("BoxWithNMSLimit", inputs=(2, 3), outputs=(3, 6), static_inputs=(0, 1, 2), gradient=should_not_do_gradient)
def box_with_nms_limit(op: Op) -> Kernel:
    """(scores [N, K], boxes [N, 4K][, batch_splits]) -> (scores, boxes, classes[, batch_splits, keeps,
    keeps_size]): per image and foreground class, the boxes scoring above score_thresh after NMS (or
    Soft-NMS), then the best detections_per_im over all classes; class by class in the output."""
    score_thresh = np.float32(op.float("score_thresh", 0.05))
    nms_thresh = np.float32(op.float("nms", 0.3))
    per_image = op.int("detections_per_im", 100)
    soft = op.bool("soft_nms_enabled", False)
    method_name = op.str("soft_nms_method", "linear")
    if method_name not in ("linear", "gaussian"):
        raise BadArgumentError(f"{op.where}: Unexpected soft_nms_method {method_name!r} (linear or gaussian)")
    method = 1 if method_name == "linear" else 2
    sigma = np.float32(op.float("soft_nms_sigma", 0.5))
    min_score = np.float32(op.float("soft_nms_min_score_thres", 0.001))
    dim = 5 if op.bool("rotated", False) else 4
    agnostic = op.bool("cls_agnostic_bbox_reg", False)
    boxes_with_bg = op.bool("input_boxes_include_bg_cls", True)
    classes_with_bg = op.bool("output_classes_include_bg_cls", True)
    plus = np.float32(1 if op.bool("legacy_plus_one", True) else 0)
    first_score = int(boxes_with_bg)

    def box_col(j: int) -> int:
        return 0 if agnostic else (j if boxes_with_bg else j - 1)

    def kernel(scores_in, boxes_in, *splits_in):
        scores = _rank2(op, _known(scores_in), 0)
        boxes = _rank2(op, _known(boxes_in), 1)
        for i, v in enumerate((scores, boxes)):
            _check_float(op, v, i)
        n, classes = scores.shape
        if boxes.shape[0] != n or (box_col(classes - 1) + 1) * dim != boxes.shape[1]:
            raise ShapeError(
                f"{op.where}: boxes '{op.inputs[1]}' {list(boxes.shape)} do not match scores '{op.inputs[0]}' "
                f"{list(scores.shape)} ({n} rows of {dim} per box class)"
            )
        if splits_in:
            splits = _known(splits_in[0])
            if splits.dtype not in (np.int32, np.float32):
                raise ShapeError(
                    f"{op.where}: batch_splits '{op.inputs[2]}' must be int32 or float, got {splits.dtype}"
                )
            if splits.ndim != 1:
                raise ShapeError(f"{op.where}: batch_splits '{op.inputs[2]}' must be 1-D, got {list(splits.shape)}")
        else:
            splits = np.array([n], np.float32)
        if splits.sum() != n:
            raise ShapeError(f"{op.where}: batch_splits '{op.inputs[2]}' sum to {splits.sum()}, not the {n} boxes")
        out_scores, out_boxes, out_classes, out_keeps = [], [], [], []
        keeps_size = np.zeros((len(splits), classes), np.int32)
        per_batch = []
        offset = 0
        for b, count in enumerate(splits.astype(np.int64)):
            s = scores[offset : offset + count]
            bx = boxes[offset : offset + count]
            rescored = s.copy()
            keeps: list[list[int]] = [[] for _ in range(classes)]
            for j in range(1, classes):
                col = j - 1 + first_score
                cur = s[:, col]
                cur_boxes = bx[:, box_col(j) * dim : box_col(j) * dim + dim]
                inds = np.nonzero(cur > score_thresh)[0]
                if soft:
                    keeps[j], rescored[:, col] = soft_nms(
                        cur, cur_boxes, inds, sigma, nms_thresh, min_score, method, plus
                    )
                else:
                    keeps[j] = nms(
                        cur_boxes, _by_score(cur, inds), nms_thresh, per_image if per_image > 0 else -1, plus
                    )
            total = sum(len(k) for k in keeps)
            if 0 < per_image < total:
                pairs = [(j, i) for j in range(1, classes) for i in keeps[j]]
                values = np.array([rescored[i, j - 1 + first_score] for j, i in pairs], np.float32)
                best = np.argsort(-values, kind="stable")[:per_image]
                keeps = [[] for _ in range(classes)]
                for p in best:
                    j, i = pairs[p]
                    keeps[j].append(i)
                total = per_image
            per_batch.append(total)
            for j in range(1, classes):
                rows = np.asarray(keeps[j], np.int64)
                out_scores.append(rescored[rows, j - 1 + first_score])
                out_boxes.append(bx[rows][:, box_col(j) * dim : box_col(j) * dim + dim])
                out_classes.append(np.full(len(rows), j - (not classes_with_bg), np.float32))
            for j in range(classes):
                out_keeps.append(np.asarray(keeps[j], np.int32))
                keeps_size[b, j] = len(keeps[j])
            offset += count
        results = (
            np.concatenate(out_scores).astype(np.float32) if out_scores else np.zeros(0, np.float32),
            np.concatenate(out_boxes).astype(np.float32).reshape(-1, dim)
            if out_boxes
            else np.zeros((0, dim), np.float32),
            np.concatenate(out_classes) if out_classes else np.zeros(0, np.float32),
            np.array(per_batch, np.float32),
            np.concatenate(out_keeps) if out_keeps else np.zeros(0, np.int32),
            keeps_size,
        )
        return tuple(jnp.asarray(r) for r in results[: len(op.outputs)])

    return kernel


# --------------------------------------------------------------------------------------------------
# GenerateProposals (generate_proposals_op.cc)


@register(
    "GenerateProposals",
    "GenerateProposalsCPP",
    inputs=4,
    outputs=2,
    static_inputs=(0, 1, 2, 3),
    gradient=should_not_do_gradient,
)
def generate_proposals(op: Op) -> Kernel:
    """(scores [N, A, H, W], bbox_deltas [N, 4A, H, W], im_info [N, 3], anchors [A, 4]) -> (rois [R, 5]
    (image index, x1, y1, x2, y2), probs [R]): per image, the pre_nms_topN best-scoring anchors moved by
    their deltas, clipped, those smaller than min_size (or centred outside the image) dropped, then NMS
    keeping post_nms_topN (RPN of Faster R-CNN)."""
    spatial_scale = np.float32(op.float("spatial_scale", 1.0 / 16))
    feat_stride = np.float32(1.0 / np.float64(spatial_scale))
    pre_top = op.int("pre_nms_topN", 6000)
    post_top = op.int("post_nms_topN", 300)
    nms_thresh = np.float32(op.float("nms_thresh", 0.7))
    min_size = np.float32(op.float("min_size", 16))
    args = _BoxArgs(op)
    plus = args.plus

    def kernel(scores_in, deltas_in, im_info_in, anchors_in):
        scores, deltas, im_info, anchors = (_known(v) for v in (scores_in, deltas_in, im_info_in, anchors_in))
        _check_rank(op, scores, 4, 0)
        _check_float(op, scores, 0)
        n, a, h, w = scores.shape
        box_dim = anchors.shape[1] if anchors.ndim == 2 else 0
        if box_dim not in (4, 5):
            raise ShapeError(
                f"{op.where}: anchors '{op.inputs[3]}' must be [A, 4] or [A, 5], got {list(anchors.shape)}"
            )
        if deltas.shape != (n, box_dim * a, h, w):
            raise ShapeError(
                f"{op.where}: bbox_deltas '{op.inputs[1]}' must be {[n, box_dim * a, h, w]}, got {list(deltas.shape)}"
            )
        if im_info.shape != (n, 3):
            raise ShapeError(f"{op.where}: im_info '{op.inputs[2]}' must be {[n, 3]}, got {list(im_info.shape)}")
        if anchors.shape != (a, box_dim):
            raise ShapeError(f"{op.where}: anchors '{op.inputs[3]}' must be {[a, box_dim]}, got {list(anchors.shape)}")
        for i, v in enumerate((scores, deltas, im_info, anchors)):
            _check_float(op, v, i)
        k = h * w
        all_rois, all_probs = [], []
        for image in range(n):
            flat = scores[image].reshape(-1)
            order = _by_score(flat, np.arange(flat.size))
            if 0 < pre_top < flat.size:
                order = order[:pre_top]
            scores_sorted = flat[order]
            d = deltas[image].reshape(a, box_dim, k).transpose(1, 0, 2).reshape(box_dim, a * k)
            deltas_sorted = d[:, order].T
            order_ah, order_w = order // w, order % w
            order_a, order_h = order_ah // h, order_ah % h
            shift_x = order_w.astype(np.float32) * feat_stride
            shift_y = order_h.astype(np.float32) * feat_stride
            zero = np.zeros_like(shift_x)
            shifts = [shift_x, shift_y, shift_x, shift_y] if box_dim == 4 else [shift_x, shift_y, zero, zero, zero]
            anchors_sorted = anchors[order_a] + np.stack(shifts, axis=1)
            proposals = args.transform(np, anchors_sorted, deltas_sorted, (np.float32(1),) * 4)
            info = im_info[image]
            proposals = args.clip(np, proposals, np.float32(int(info[0])), np.float32(int(info[1])))
            least = np.float64(min_size) * np.float64(info[2])
            if box_dim == 4:
                ws = proposals[:, 2] - proposals[:, 0] + plus
                hs = proposals[:, 3] - proposals[:, 1] + plus
                x_ctr, y_ctr = proposals[:, 0] + ws / np.float32(2), proposals[:, 1] + hs / np.float32(2)
            else:
                ws, hs, x_ctr, y_ctr = proposals[:, 2], proposals[:, 3], proposals[:, 0], proposals[:, 1]
            keep = np.nonzero((ws >= least) & (hs >= least) & (x_ctr < info[1]) & (y_ctr < info[0]))[0]
            top = post_top if 0 < post_top < keep.size else -1
            kept = np.asarray(nms(proposals, keep, nms_thresh, top, plus), np.int64)
            boxes = proposals[kept].reshape(-1, box_dim)
            all_rois.append(np.concatenate([np.full((len(kept), 1), image, np.float32), boxes], axis=1))
            all_probs.append(scores_sorted[kept])
        rois = np.concatenate(all_rois).astype(np.float32) if all_rois else np.zeros((0, box_dim + 1), np.float32)
        probs = np.concatenate(all_probs).astype(np.float32) if all_probs else np.zeros(0, np.float32)
        return jnp.asarray(rois), jnp.asarray(probs)

    return kernel


# --------------------------------------------------------------------------------------------------
# RoIAlignRotated (roi_align_rotated_op.cc)


@register(
    "RoIAlignRotated",
    inputs=2,
    static_inputs=_static_rois,
    gradient=single_gradient("RoIAlignRotatedGradient", "I(0) I(1) GO(0)"),
)
def roi_align_rotated(op: Op) -> Kernel:
    """(X [N, C, H, W] (or NHWC), RoIs [R, 5 or 6] (batch index, ctr_x, ctr_y, w, h, angle in degrees)) ->
    Y [R, C, pooled_h, pooled_w]: RoIAlign over boxes rotated counter-clockwise about their centres."""
    align = _Align(op)
    nhwc = _nhwc(op)

    def kernel(x, rois):
        _check_float(op, x, 0)
        _check_rank(op, x, 4, 0)
        xt = x if nhwc else jnp.transpose(x, (0, 2, 3, 1))  # [N, H, W, C]
        _, h, w, c = xt.shape
        ph, pw = align.pooled_h, align.pooled_w
        if rois.size == 0:
            return jnp.zeros((0, ph, pw, c) if nhwc else (0, c, ph, pw), jnp.float32)
        if rois.ndim != 2 or rois.shape[1] not in (5, 6):
            raise ShapeError(
                f"{op.where}: RoIs '{op.inputs[1]}' must be [R, 5] or [R, 6] (batch index, ctr_x, ctr_y, w, h, "
                f"angle), got shape {list(rois.shape)}"
            )
        _check_float(op, rois, 1)
        batch, ctr_h, ctr_w, roi_h, roi_w, theta = _rotated_geometry(align, rois, jnp)
        _check_batch_index(op, batch, xt.shape[0])
        if align.sampling > 0:
            grid_h = grid_w = most_h = most_w = align.sampling
        else:
            known = _rotated_geometry(align, np.asarray(rois), np)
            grid_h = np.ceil(known[3] / np.float32(ph)).astype(np.int64)
            grid_w = np.ceil(known[4] / np.float32(pw)).astype(np.int64)
            most_h, most_w = int(grid_h.max(initial=1)) or 1, int(grid_w.max(initial=1)) or 1
            grid_h, grid_w = jnp.asarray(grid_h, jnp.int32), jnp.asarray(grid_w, jnp.int32)
        bin_h, bin_w = roi_h / np.float32(ph), roi_w / np.float32(pw)

        def offsets(start, bin_size, grid, pooled, most):
            """[R, pooled, most]: start + p * bin + (i + .5) * bin / grid, and whether i < grid."""
            g = jnp.asarray(grid)
            gf = g.astype(jnp.float32)[:, None, None] if g.ndim else g.astype(jnp.float32)
            p = jnp.arange(pooled, dtype=jnp.float32)[None, :, None]
            i = jnp.arange(most, dtype=jnp.float32)[None, None, :] + np.float32(0.5)
            pos = (start[:, None, None] + p * bin_size[:, None, None]) + i * bin_size[:, None, None] / gf
            used = jnp.arange(most)[None, None, :] < (g[:, None, None] if g.ndim else g)
            return pos, used

        yy, used_y = offsets(-roi_h / np.float32(2), bin_h, grid_h, ph, most_h)
        xx, used_x = offsets(-roi_w / np.float32(2), bin_w, grid_w, pw, most_w)
        ey = (slice(None), slice(None), slice(None), None, None)
        ex = (slice(None), None, None, slice(None), slice(None))
        cos, sin = jnp.cos(theta)[:, None, None, None, None], jnp.sin(theta)[:, None, None, None, None]
        yy5, xx5 = yy[ey], xx[ex]
        sx = (xx5 * cos + yy5 * sin) + ctr_w[:, None, None, None, None]
        sy = (yy5 * cos - xx5 * sin) + ctr_h[:, None, None, None, None]
        valid = ~((sy < -1.0) | (sy > h) | (sx < -1.0) | (sx > w)) & used_y[ey] & used_x[ex]
        sy, sx = jnp.maximum(sy, np.float32(0)), jnp.maximum(sx, np.float32(0))
        yl, xl = sy.astype(jnp.int32), sx.astype(jnp.int32)
        top_y, top_x = yl >= h - 1, xl >= w - 1
        yl, xl = jnp.where(top_y, h - 1, yl), jnp.where(top_x, w - 1, xl)
        sy, sx = jnp.where(top_y, yl.astype(jnp.float32), sy), jnp.where(top_x, xl.astype(jnp.float32), sx)
        yh, xh = jnp.where(top_y, yl, yl + 1), jnp.where(top_x, xl, xl + 1)
        ly, lx = sy - yl.astype(jnp.float32), sx - xl.astype(jnp.float32)
        hy, hx = np.float32(1) - ly, np.float32(1) - lx
        b = batch[:, None, None, None, None]
        term = (
            (hy * hx)[..., None] * xt[b, yl, xl]
            + (hy * lx)[..., None] * xt[b, yl, xh]
            + (ly * hx)[..., None] * xt[b, yh, xl]
            + (ly * lx)[..., None] * xt[b, yh, xh]
        )
        total = jnp.sum(jnp.where(valid[..., None], term, np.float32(0)), axis=(2, 4))  # [R, ph, pw, C]
        count = jnp.asarray(grid_h * grid_w, jnp.float32)
        y = total / (count[:, None, None, None] if count.ndim else count)
        return y if nhwc else jnp.transpose(y, (0, 3, 1, 2))

    return kernel


def _rotated_geometry(align: _Align, rois: Any, xp: Any) -> tuple[Any, ...]:
    """(batch index, centre y, centre x, height, width, angle in radians) of rotated RoIs on the feature map."""
    cols = rois.shape[1]
    batch = rois[:, 0].astype(xp.int32) if cols == 6 else xp.zeros(rois.shape[0], xp.int32)
    box = rois[:, cols - 5 :]
    offset = np.float32(0.5 if align.aligned else 0.0)
    ctr_w, ctr_h = box[:, 0] * align.scale - offset, box[:, 1] * align.scale - offset
    roi_w, roi_h = box[:, 2] * align.scale, box[:, 3] * align.scale
    theta = (box[:, 4].astype(xp.float64) * np.pi / 180.0).astype(xp.float32)
    if align.aligned:
        enforce(
            xp.all((roi_w >= 0) & (roi_h >= 0)),
            f"{literal(align.op.where)}: ROIs in ROIAlign do not have non-negative size!",
        )
    else:
        roi_w, roi_h = xp.maximum(roi_w, np.float32(1)), xp.maximum(roi_h, np.float32(1))
    return batch, ctr_h, ctr_w, roi_h, roi_w, theta


# --------------------------------------------------------------------------------------------------
# NormalizePlanarYUV, RMACRegions, HeatmapMaxKeypoint


@register("NormalizePlanarYUV", inputs=3, gradient=NO_GRADIENT)
def normalize_planar_yuv(op: Op) -> Kernel:
    """(X [N, C, H, W], mean [1, C], std [1, C]) -> (X - mean) / std per channel."""

    def kernel(x, mean, std):
        for i, v in enumerate((x, mean, std)):
            _check_float(op, v, i)
        _check_rank(op, x, 4, 0)
        c = x.shape[1]
        for i, v in ((1, mean), (2, std)):
            if v.ndim < 2 or v.shape[1] != c or v.size < c:
                raise ShapeError(
                    f"{op.where}: input '{op.inputs[i]}' must be [1, {c}] (one value per channel), got {list(v.shape)}"
                )
        m = jnp.reshape(mean, (-1,))[:c][None, :, None, None]
        s = jnp.reshape(std, (-1,))[:c][None, :, None, None]
        return (x - m) / s

    return kernel


@register("RMACRegions", inputs=1, shape_only=True, gradient=should_not_do_gradient)
def rmac_regions(op: Op) -> Kernel:
    """X [N, C, H, W] -> RoIs [N * regions, 5] (batch index, x1, y1, x2, y2): the square regions of R-MAC
    (Tolias et al.) at `scales` scales overlapping by about `overlap`; they follow from X's shape alone."""
    scales = op.int("scales", 3)
    overlap = np.float32(op.float("overlap", 0.4))

    def kernel(x):
        if x.size == 0:
            return jnp.zeros((0, 5), jnp.float32)
        _check_rank(op, x, 4, 0)
        return jnp.asarray(_rmac(x.shape[0], x.shape[2], x.shape[3], scales, overlap))

    return kernel


def _rmac(batch: int, h: int, w: int, scales: int, overlap: np.float32) -> np.ndarray:
    least = min(h, w)
    step = 0
    if w != h:
        best = np.float32(np.finfo(np.float32).max)
        for idx in range(1, 7):
            b = np.float32((max(h, w) - least) / (1.0 * idx))
            val = np.float32(abs(np.float32((least * least - least * b) / np.float32(least * least)) - overlap))
            if val < best:
                step, best = idx, val
    wd, hd = (step if w > h else 0), (step if h > w else 0)
    rows = []
    for level in range(1, scales + 1):
        size = 2 * least // (level + 1)
        if size == 0:
            break
        bw = np.float32((w - size) / (1.0 * (level + wd - 1))) if level + wd - 1 > 0 else np.float32(0)
        bh = np.float32((h - size) / (1.0 * (level + hd - 1))) if level + hd - 1 > 0 else np.float32(0)
        for i in range(level + wd):
            for j in range(level + hd):
                x1, y1 = int(bw * np.float32(i)), int(bh * np.float32(j))
                x1 -= max(x1 + size - w, 0)
                y1 -= max(y1 + size - h, 0)
                rows.append((0, x1, y1, x1 + size - 1, y1 + size - 1))
    regions = np.array(rows, np.float32).reshape(-1, 5)
    out = np.tile(regions, (batch, 1))
    out[:, 0] = np.repeat(np.arange(batch, dtype=np.float32), len(regions))
    return out


@register("HeatmapMaxKeypoint", inputs=2, gradient=should_not_do_gradient)
def heatmap_max_keypoint(op: Op) -> Kernel:
    """(heatmaps [N, K, S, S], boxes [N, >= 4]) -> keypoints [N, 4, K]: x, y, score (and the softmax
    probability with should_output_softmax) of each heatmap's maximum, refined by a quadratic fit of its
    3x3 neighbourhood (Taylor expansion, solved as Eigen's LDLT does) and mapped into its box."""
    softmax = op.bool("should_output_softmax", False)

    def kernel(heatmaps, boxes):
        _check_float(op, heatmaps, 0)
        _check_float(op, boxes, 1)
        _check_rank(op, heatmaps, 4, 0)
        n, k, size, other = heatmaps.shape
        if size < 2 or other != size:
            raise ShapeError(
                f"{op.where}: heatmaps '{op.inputs[0]}' must be square and at least 2x2, got {list(heatmaps.shape)}"
            )
        if boxes.ndim != 2 or boxes.shape[0] != n or boxes.shape[1] < 4:
            raise ShapeError(f"{op.where}: bboxes '{op.inputs[1]}' must be [{n}, >= 4], got {list(boxes.shape)}")
        flat = heatmaps.reshape(n * k, size * size)
        best = jnp.argmax(flat, axis=1)  # the first maximum, as Caffe2's scan for it
        score = jnp.max(flat, axis=1)
        my, mx = best // size, best % size
        # the 3x3 neighbourhood, mirrored about the maximum where it leaves the heatmap: one gather
        d = jnp.array([-1, 0, 1])[None, :]
        ry, rx = my[:, None], mx[:, None]
        yy = d - 2 * (d + ry >= size) + 2 * (d + ry < 0) + ry  # [N * K, 3]
        xx = d - 2 * (d + rx >= size) + 2 * (d + rx < 0) + rx
        index = (yy[:, :, None] * size + xx[:, None, :]).reshape(n * k, 9)
        near = jnp.take_along_axis(flat, index, axis=1)
        f = [[near[:, 3 * y + x] for x in range(3)] for y in range(3)]  # f[y + 1][x + 1]
        two = np.float32(2)
        b0, b1 = -(f[1][2] - f[1][0]) / two, -(f[2][1] - f[0][1]) / two
        a00 = f[1][0] - two * f[1][1] + f[1][2]
        a01 = (f[2][2] - f[2][0] - f[0][2] + f[0][0]) / np.float32(4)
        a11 = f[0][1] - two * f[1][1] + f[2][1]
        det = _lu_determinant(a00, a01, a11)
        d0, d1 = _ldlt_solve(a00, a01, a11, b0, b1)
        larger = jnp.maximum(jnp.abs(d0), jnp.abs(d1))
        limit = np.float32(1.5)
        clip = larger > limit
        d0 = jnp.where(clip, d0 / larger * limit, d0)
        d1 = jnp.where(clip, d1 / larger * limit, d1)
        quad = (d0 * a00 + d1 * a01) * d0 + (d0 * a01 + d1 * a11) * d1
        refined = f[1][1] - (b0 * d0 + b1 * d1) + np.float32(0.5) * quad
        flat_det = jnp.abs(det) < np.float32(1e-4)
        d0, d1 = jnp.where(flat_det, 0, d0), jnp.where(flat_det, 0, d1)
        refined = jnp.where(flat_det, score, refined)
        x0 = jnp.repeat(boxes[:, 0], k)
        y0 = jnp.repeat(boxes[:, 1], k)
        x_len = jnp.repeat(jnp.maximum(boxes[:, 2] - boxes[:, 0], np.float32(1)), k)
        y_len = jnp.repeat(jnp.maximum(boxes[:, 3] - boxes[:, 1], np.float32(1)), k)
        wide = jax.dtypes.canonicalize_dtype(jnp.float64)  # C++ computes these in double
        kx = (x0.astype(wide) + (0.5 + mx + d0.astype(wide)) * x_len.astype(wide) / size).astype(jnp.float32)
        ky = (y0.astype(wide) + (0.5 + my + d1.astype(wide)) * y_len.astype(wide) / size).astype(jnp.float32)
        if softmax:
            e = jnp.exp(flat)
            prob = jnp.take_along_axis(e, best[:, None], axis=1)[:, 0] / jnp.sum(e, axis=1)
        else:
            prob = jnp.zeros(n * k, jnp.float32)
        out = jnp.stack([kx, ky, refined, prob], axis=0).reshape(4, n, k)
        return jnp.transpose(out, (1, 0, 2))

    return kernel


def _lu_determinant(a00: Any, a01: Any, a11: Any) -> Any:
    """The determinant of the symmetric [[a00, a01], [a01, a11]] as Eigen computes it for a dynamic-size
    matrix: from its partial-pivoting LU."""
    swap = jnp.abs(a01) > jnp.abs(a00)
    p0, q0 = jnp.where(swap, a01, a00), jnp.where(swap, a00, a01)  # pivot row (col 0), other row (col 0)
    p1, q1 = jnp.where(swap, a11, a01), jnp.where(swap, a01, a11)  # their col 1
    u11 = q1 - (q0 / p0) * p1
    det = p0 * u11
    return jnp.where(swap, -det, det)


def _ldlt_solve(a00: Any, a01: Any, a11: Any, b0: Any, b1: Any) -> tuple[Any, Any]:
    """x with A x = b for the symmetric 2x2 A, as Eigen's LDLT (diagonal pivoting) solves it."""
    swap = jnp.abs(a11) > jnp.abs(a00)
    d1 = jnp.where(swap, a11, a00)
    other = jnp.where(swap, a00, a11)
    c0, c1 = jnp.where(swap, b1, b0), jnp.where(swap, b0, b1)
    tiny = np.float32(np.finfo(np.float32).tiny)
    ok = jnp.abs(d1) > 0  # Eigen divides by any non-zero pivot, and solves with FLT_MIN as its tolerance
    lower = jnp.where(ok, a01 / jnp.where(ok, d1, 1), a01)
    d2 = other - lower * (d1 * lower)
    c1 = c1 - lower * c0
    c0 = jnp.where(jnp.abs(d1) > tiny, c0 / d1, 0)
    c1 = jnp.where(jnp.abs(d2) > tiny, c1 / d2, 0)
    c0 = c0 - lower * c1
    return jnp.where(swap, c1, c0), jnp.where(swap, c0, c1)


# --------------------------------------------------------------------------------------------------
# FPN proposals (collect_and_distribute_fpn_rpn_proposals_op.cc)


def _levels(op: Op, low: str, high: str, low_default: int, high_default: int) -> tuple[int, int]:
    lo, hi = op.int(low, low_default), op.int(high, high_default)
    if hi < lo:
        raise BadArgumentError(f"{op.where}: {high} {hi} must be greater than or equal to {low} {lo}.")
    return lo, hi


def _collect(op: Op, levels: int, top_n: int, inputs: tuple[Any, ...]) -> np.ndarray:
    """utils::SortAndLimitRoIsByScores over every level's RoIs: the top_n best-scoring (ties by position)."""
    if len(inputs) != 2 * levels:
        raise BadArgumentError(f"{op.where}: {op.type} takes {2 * levels} inputs (RoIs and scores of {levels} levels)")
    rois, scores = [], []
    for i in range(levels):
        r, s = _known(inputs[i]), _known(inputs[levels + i])
        for index, v in ((i, r), (levels + i, s)):
            _check_float(op, v, index)
        if r.ndim != 2 or r.shape[1] != 5:
            raise ShapeError(f"{op.where}: RoIs '{op.inputs[i]}' must be [R, 5], got shape {list(r.shape)}")
        if s.ndim < 1 or s.shape[0] != r.shape[0] or s.size != r.shape[0]:
            raise ShapeError(
                f"{op.where}: scores '{op.inputs[levels + i]}' must hold one score per RoI of '{op.inputs[i]}' "
                f"({r.shape[0]}), got shape {list(s.shape)}"
            )
        rois.append(r)
        scores.append(s.reshape(-1))
    all_rois, all_scores = np.concatenate(rois), np.concatenate(scores)
    order = np.argsort(-all_scores, kind="stable")
    if 0 < top_n < len(order):
        order = order[:top_n]
    return all_rois[order].reshape(-1, 5)


def _distribute(op: Op, rois: np.ndarray, args: tuple[int, int, int, int, np.float32]) -> list[np.ndarray]:
    """The RoIs of each FPN level (rows in order), then rois_idx_restore (int32): where each RoI went."""
    lo, hi, canon_scale, canon_level, plus = args
    boxes = rois[:, 1:5]
    areas = (boxes[:, 2] - boxes[:, 0] + plus) * (boxes[:, 3] - boxes[:, 1] + plus)
    if not np.all(areas >= 0):
        raise ShapeError(f"{op.where}: Negative areas founds: RoIs '{op.inputs[0]}' have boxes of negative area")
    s = np.sqrt(areas)
    target = np.floor(
        np.float32(canon_level) + np.log(s / np.float32(canon_scale) + np.float32(1e-6)) / np.float32(np.log(2))
    )
    target = np.maximum(np.minimum(target, np.float32(hi)), np.float32(lo))
    outputs, order = [], []
    for level in range(lo, hi + 1):
        rows = np.nonzero(target == level)[0]
        outputs.append(rois[rows].reshape(-1, rois.shape[1]))
        order.append(rows)
    restore = np.argsort(np.concatenate(order) if order else np.zeros(0, np.int64), kind="stable")
    return [*outputs, restore.astype(np.int32)]


def _distribute_args(op: Op) -> tuple[int, int, int, int, np.float32]:
    lo, hi = _levels(op, "roi_min_level", "roi_max_level", 2, 5)
    plus = np.float32(1 if op.bool("legacy_plus_one", True) else 0)
    return lo, hi, op.int("roi_canonical_scale", 224), op.int("roi_canonical_level", 4), plus


@register(
    "CollectRpnProposals",
    inputs=(2, None),
    static_inputs=lambda op: tuple(range(len(op.inputs))),
    gradient=should_not_do_gradient,
)
def collect_rpn_proposals(op: Op) -> Kernel:
    """(RoIs of levels rpn_min_level..rpn_max_level, then their scores) -> the rpn_post_nms_topN RoIs
    with the highest scores, best first (FPN)."""
    lo, hi = _levels(op, "rpn_min_level", "rpn_max_level", 2, 6)
    top_n = op.int("rpn_post_nms_topN", 2000)

    def kernel(*inputs):
        return jnp.asarray(_collect(op, hi - lo + 1, top_n, inputs))

    return kernel


@register(
    "DistributeFpnProposals",
    inputs=1,
    outputs=(2, None),
    static_inputs=(0,),
    gradient=should_not_do_gradient,
)
def distribute_fpn_proposals(op: Op) -> Kernel:
    """RoIs [R, 4 or 5] -> the RoIs of each level roi_min_level..roi_max_level (by Eqn. 1 of the FPN paper,
    as [*, 5] with a zero batch index where none was given) and rois_idx_restore (int32)."""
    args = _distribute_args(op)
    if len(op.outputs) != args[1] - args[0] + 2:
        raise BadArgumentError(
            f"{op.where}: DistributeFpnProposals gives {args[1] - args[0] + 2} outputs (one per level and "
            f"rois_idx_restore), got {len(op.outputs)}"
        )

    def kernel(rois_in):
        rois = _known(rois_in)
        _check_float(op, rois, 0)
        if rois.ndim != 2 or rois.shape[1] not in (4, 5):
            raise ShapeError(f"{op.where}: RoIs '{op.inputs[0]}' must be [R, 4] or [R, 5], got {list(rois.shape)}")
        full = np.zeros((rois.shape[0], 5), np.float32)
        full[:, 5 - rois.shape[1] :] = rois
        return tuple(jnp.asarray(v) for v in _distribute(op, full, args))

    return kernel


@register(
    "CollectAndDistributeFpnRpnProposals",
    inputs=(2, None),
    outputs=(3, None),
    static_inputs=lambda op: tuple(range(len(op.inputs))),
    gradient=should_not_do_gradient,
)
def collect_and_distribute_fpn_rpn_proposals(op: Op) -> Kernel:
    """CollectRpnProposals then DistributeFpnProposals: (the collected RoIs, each level's RoIs,
    rois_idx_restore)."""
    lo, hi = _levels(op, "rpn_min_level", "rpn_max_level", 2, 6)
    top_n = op.int("rpn_post_nms_topN", 2000)
    args = _distribute_args(op)
    if len(op.outputs) != args[1] - args[0] + 3:
        raise BadArgumentError(
            f"{op.where}: CollectAndDistributeFpnRpnProposals gives {args[1] - args[0] + 3} outputs, "
            f"got {len(op.outputs)}"
        )

    def kernel(*inputs):
        rois = _collect(op, hi - lo + 1, top_n, inputs)
        return (jnp.asarray(rois), *(jnp.asarray(v) for v in _distribute(op, rois, args)))

    return kernel
