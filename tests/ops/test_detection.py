"""The detection family (rnn2jax/ops/detection.py) against real Caffe2: RoIAlign (and its gradient op),
RoIPool, BBoxTransform, BoxWithNMSLimit, GenerateProposals.

Scores that NMS sorts are drawn without ties: Caffe2 sorts them with std::sort, which leaves the order of
equal scores unspecified. Values are drawn from a NumPy generator seeded by hypothesis (fast to draw, and
shrinkable through the seed).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from differential import Case, cases, check_gradient, check_op, make_op, run_case, run_rnn2jax
from rnn2jax.errors import ShapeError
from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op

# Each example compiles its kernels (the static inputs' values are part of them): half the usual examples
# keep the file near its time budget.
fewer_examples = settings(max_examples=max(1, settings().max_examples // 2))


def generator(data) -> np.random.Generator:
    return np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))


def uniform(rng, low, high, shape=()) -> np.ndarray:
    return rng.uniform(low, high, shape).astype(np.float32)


def distinct_scores(rng, shape) -> np.ndarray:
    """Scores in (0, 1) without ties (see the module docstring)."""
    size = int(np.prod(shape))
    return ((rng.permutation(size) + 1) / np.float32(size + 1)).astype(np.float32).reshape(shape)


def rois_on(rng, count, n, width, height, scale, batch_column=True, ragged=True) -> np.ndarray:
    """`count` boxes (x1, y1, x2, y2) around a width x height feature map at `scale`, with a batch index
    column in [0, n) when `batch_column`; `ragged` also draws malformed boxes (x2 < x1)."""
    x1 = uniform(rng, -2, width + 1, count) / np.float32(scale)
    y1 = uniform(rng, -2, height + 1, count) / np.float32(scale)
    low = -1.0 if ragged else 0.0
    x2 = x1 + uniform(rng, low, width + 1, count) / np.float32(scale)
    y2 = y1 + uniform(rng, low, height + 1, count) / np.float32(scale)
    boxes = np.stack([x1, y1, x2, y2], axis=1)
    if batch_column:
        boxes = np.concatenate([rng.integers(0, n, (count, 1)).astype(np.float32), boxes], axis=1)
    return boxes.astype(np.float32)


# --------------------------------------------------------------------------------------------------
# RoIAlign, RoIPool


def align_args(data, aligned=None):
    args = {
        "pooled_h": data.draw(st.integers(1, 3)),
        "pooled_w": data.draw(st.integers(1, 3)),
        "spatial_scale": data.draw(st.sampled_from([1.0, 0.5, 0.25])),
        "sampling_ratio": data.draw(st.sampled_from([-1, 0, 1, 2])),
    }
    if aligned is None:
        aligned = data.draw(st.booleans())
    if aligned:
        args["aligned"] = 1
    return args


def draw_roi_align(data, nhwc=False):
    rng = generator(data)
    args = align_args(data)
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7))
    count = data.draw(st.integers(0, 4))
    five = data.draw(st.booleans()) or n > 1
    rois = rois_on(rng, count, n, w, h, args["spatial_scale"], five, ragged=not args.get("aligned"))
    x = uniform(rng, -1, 1, (n, h, w, c) if nhwc else (n, c, h, w))
    if nhwc:
        args["order"] = "NHWC"
    return make_op("RoIAlign", ["X", "R"], ["Y"], **args), {"X": x, "R": rois}


def draw_roi_pool(data):
    rng = generator(data)
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    scale = data.draw(st.sampled_from([1.0, 0.5]))
    rois = rois_on(rng, data.draw(st.integers(0, 4)), n, w, h, scale)
    # ties on purpose (a few distinct values): the first maximum in scan order is the argmax
    x = rng.integers(-3, 4, (n, c, h, w)).astype(np.float32) / 2
    is_test = data.draw(st.booleans())
    args = {"pooled_h": data.draw(st.integers(1, 3)), "pooled_w": data.draw(st.integers(1, 3))}
    args["spatial_scale"] = scale
    outputs = ["Y"] if is_test else ["Y", "argmaxes"]
    if is_test:
        args["is_test"] = 1
    return make_op("RoIPool", ["X", "R"], outputs, **args), {"X": x, "R": rois}


# --------------------------------------------------------------------------------------------------
# BBoxTransform


def draw_bbox_transform(data):
    rng = generator(data)
    rotated = data.draw(st.booleans())
    box_dim = 5 if rotated else 4
    batch = data.draw(st.integers(1, 2))
    with_batch = batch > 1 or data.draw(st.booleans())
    counts = [data.draw(st.integers(0, 3)) for _ in range(batch)]
    m, classes = sum(counts), data.draw(st.integers(1, 3))
    if rotated:
        centre = uniform(rng, -5, 60, (m, 2))
        size = uniform(rng, 0.5, 30, (m, 2))
        angle = rng.choice([0.0, 0.5, -0.7, 30.0, -120.0, 179.0], m).astype(np.float32) + uniform(rng, -0.2, 0.2, m)
        boxes = np.concatenate([centre, size, angle[:, None]], axis=1)
    else:
        x1, y1 = uniform(rng, -5, 50, m), uniform(rng, -5, 50, m)
        boxes = np.stack([x1, y1, x1 + uniform(rng, 0, 30, m), y1 + uniform(rng, 0, 30, m)], axis=1)
    if with_batch:
        ids = np.repeat(np.arange(batch), counts).astype(np.float32)
        boxes = np.concatenate([ids[:, None], boxes], axis=1)
    deltas = uniform(rng, -1, 1, (m, classes * box_dim))
    if m and data.draw(st.booleans()):  # past the log-space clip
        deltas[0, 2] = 6.0
    info_scale = rng.choice([1.0, 0.5, 1.5, 2.0], batch).astype(np.float32)
    im_info = np.stack([uniform(rng, 20, 60, batch), uniform(rng, 20, 60, batch), info_scale], axis=1)
    args = {}
    if data.draw(st.booleans()):
        args["weights"] = [10.0, 10.0, 5.0, 5.0]
    if data.draw(st.booleans()):
        args["apply_scale"] = 0
    if data.draw(st.booleans()):
        args["legacy_plus_one"] = 0
    if rotated:
        args["rotated"] = 1
        if data.draw(st.booleans()):
            args["angle_bound_on"] = 0
        args["clip_angle_thresh"] = data.draw(st.sampled_from([1.0, -1.0, 45.0]))
    outputs = ["box_out", "splits"] if data.draw(st.booleans()) else ["box_out"]
    op = make_op("BBoxTransform", ["rois", "deltas", "im_info"], outputs, **args)
    return op, {"rois": boxes.astype(np.float32), "deltas": deltas, "im_info": im_info.astype(np.float32)}


# --------------------------------------------------------------------------------------------------
# BoxWithNMSLimit, GenerateProposals


def clustered_boxes(rng, count, columns):
    """Boxes in a few clusters, so that NMS has overlaps to suppress: [count, 4 * columns]."""
    centres = uniform(rng, 5, 40, (3, 2))
    pick = rng.integers(0, 3, (count, columns))
    ctr = centres[pick] + uniform(rng, -3, 3, (count, columns, 2))
    half = uniform(rng, 1, 8, (count, columns, 2))
    return np.concatenate([ctr - half, ctr + half], axis=2).reshape(count, 4 * columns).astype(np.float32)


def rotated_boxes(rng, count, columns):
    """Rotated boxes (ctr_x, ctr_y, w, h, angle) in a few clusters: [count, 5 * columns]."""
    centres = uniform(rng, 5, 40, (3, 2))
    pick = rng.integers(0, 3, (count, columns))
    ctr = centres[pick] + uniform(rng, -3, 3, (count, columns, 2))
    size = uniform(rng, 2, 16, (count, columns, 2))
    angle = uniform(rng, -90, 90, (count, columns, 1))
    return np.concatenate([ctr, size, angle], axis=2).reshape(count, 5 * columns).astype(np.float32)


def draw_box_with_nms_limit(data):
    rng = generator(data)
    classes = data.draw(st.integers(2, 4))
    batch = data.draw(st.integers(1, 2))
    counts = [data.draw(st.integers(0, 6)) for _ in range(batch)]
    n = sum(counts)
    args = {
        "score_thresh": data.draw(st.sampled_from([0.05, 0.3])),
        "nms": data.draw(st.sampled_from([0.3, 0.5, 0.7])),
        "detections_per_im": data.draw(st.sampled_from([100, 4, -1])),
    }
    if data.draw(st.booleans()):
        args["soft_nms_enabled"] = 1
        args["soft_nms_method"] = data.draw(st.sampled_from(["linear", "gaussian"]))
        args["soft_nms_min_score_thres"] = data.draw(st.sampled_from([0.001, 0.2]))
    if data.draw(st.booleans()):
        args["legacy_plus_one"] = 0
    agnostic = data.draw(st.booleans())
    with_bg = data.draw(st.booleans())
    if agnostic:
        args["cls_agnostic_bbox_reg"] = 1
    if not with_bg:
        args["input_boxes_include_bg_cls"] = 0
    if data.draw(st.booleans()):
        args["output_classes_include_bg_cls"] = 0
    box_classes = 1 if agnostic else (classes if with_bg else classes - 1)
    rotated = data.draw(st.booleans())
    boxes = (rotated_boxes if rotated else clustered_boxes)(rng, n, box_classes)
    if rotated:
        args["rotated"] = 1
    inputs = {"scores": distinct_scores(rng, (n, classes)), "boxes": boxes}
    names = ["scores", "boxes"]
    if batch > 1 or data.draw(st.booleans()):
        inputs["splits"] = np.array(counts, data.draw(st.sampled_from([np.float32, np.int32])))
        names.append("splits")
    outputs = ["out_scores", "out_boxes", "out_classes", "out_splits", "keeps", "keeps_size"]
    outputs = outputs[: data.draw(st.sampled_from([3, 4, 6]))]
    return make_op("BoxWithNMSLimit", names, outputs, **args), inputs


def draw_generate_proposals(data, op_type="GenerateProposals"):
    rng = generator(data)
    n, a = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    scale = data.draw(st.sampled_from([1.0 / 16, 0.25, 1.0]))
    stride = 1 / scale
    half = uniform(rng, 1, 3, (a, 2)) * np.float32(stride)
    rotated = data.draw(st.booleans())
    if rotated:  # (ctr_x, ctr_y, w, h, angle): some near upright, which clip_angle_thresh clips
        angle = rng.choice([0.0, 0.5, 30.0, -60.0], (a, 1)).astype(np.float32)
        anchors = np.concatenate([np.zeros((a, 2), np.float32), 2 * half, angle], axis=1).astype(np.float32)
    else:
        anchors = np.concatenate([-half, half], axis=1).astype(np.float32)
    dim = 5 if rotated else 4
    heights = uniform(rng, h * stride * 0.6, h * stride * 1.2, n)
    widths = uniform(rng, w * stride * 0.6, w * stride * 1.2, n)
    im_info = np.stack([heights, widths, rng.choice([1.0, 0.5, 2.0], n).astype(np.float32)], axis=1)
    args = {
        "spatial_scale": scale,
        "pre_nms_topN": data.draw(st.sampled_from([6000, 5, -1])),
        "post_nms_topN": data.draw(st.sampled_from([300, 3, -1])),
        "nms_thresh": data.draw(st.sampled_from([0.5, 0.7])),
        "min_size": data.draw(st.sampled_from([0.0, 1.0, 4.0])),
    }
    if data.draw(st.booleans()):
        args["legacy_plus_one"] = 0
    inputs = {
        "scores": distinct_scores(rng, (n, a, h, w)),
        "deltas": uniform(rng, -0.5, 0.5, (n, dim * a, h, w)),
        "im_info": im_info,
        "anchors": anchors,
    }
    return make_op(op_type, ["scores", "deltas", "im_info", "anchors"], ["rois", "probs"], **args), inputs


# --------------------------------------------------------------------------------------------------
# RoIAlignRotated, NormalizePlanarYUV, RMACRegions, HeatmapMaxKeypoint


def draw_roi_align_rotated(data, nhwc=False):
    rng = generator(data)
    args = align_args(data)
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7))
    count = data.draw(st.integers(0, 4))
    scale = np.float32(args["spatial_scale"])
    low = 0.0 if args.get("aligned") else -1.0
    ctr = np.stack([uniform(rng, -2, w + 1, count), uniform(rng, -2, h + 1, count)], axis=1) / scale
    size = np.stack([uniform(rng, low, w + 1, count), uniform(rng, low, h + 1, count)], axis=1) / scale
    angle = uniform(rng, -180, 180, (count, 1))
    rois = np.concatenate([ctr, size, angle], axis=1)
    if data.draw(st.booleans()) or n > 1:
        rois = np.concatenate([rng.integers(0, n, (count, 1)).astype(np.float32), rois], axis=1)
    x = uniform(rng, -1, 1, (n, h, w, c) if nhwc else (n, c, h, w))
    if nhwc:
        args["order"] = "NHWC"
    return make_op("RoIAlignRotated", ["X", "R"], ["Y"], **args), {"X": x, "R": rois.astype(np.float32)}


def draw_normalize_planar_yuv(data):
    rng = generator(data)
    n, c, h, w = (data.draw(st.integers(1, 3)) for _ in range(4))
    std = uniform(rng, 0.5, 2, (1, c)) * rng.choice([-1, 1], (1, c)).astype(np.float32)
    inputs = {"X": uniform(rng, -1, 1, (n, c, h, w)), "M": uniform(rng, -1, 1, (1, c)), "S": std}
    return make_op("NormalizePlanarYUV", ["X", "M", "S"], ["Z"]), inputs


def draw_rmac_regions(data):
    shape = (data.draw(st.integers(0, 2)), 1, data.draw(st.integers(1, 14)), data.draw(st.integers(1, 14)))
    args = {"scales": data.draw(st.integers(1, 4)), "overlap": data.draw(st.sampled_from([0.4, 0.2, 0.7]))}
    return make_op("RMACRegions", ["X"], ["R"], **args), {"X": np.zeros(shape, np.float32)}


def draw_heatmap_max_keypoint(data):
    rng = generator(data)
    n, k, size = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.integers(2, 6))
    heatmaps = uniform(rng, -2, 2, (n, k, size, size))
    if data.draw(st.booleans()):  # smooth peaks, whose quadratic fit is well posed
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
        centre = uniform(rng, -0.5, size - 0.5, (n, k, 2))
        heatmaps = -((yy - centre[..., :1, None]) ** 2 + (xx - centre[..., 1:, None]) ** 2).astype(np.float32)
    x1, y1 = uniform(rng, 0, 50, n), uniform(rng, 0, 50, n)
    boxes = np.stack([x1, y1, x1 + uniform(rng, 0.5, 40, n), y1 + uniform(rng, 0.5, 40, n)], axis=1)
    args = {"should_output_softmax": 1} if data.draw(st.booleans()) else {}
    op = make_op("HeatmapMaxKeypoint", ["heatmaps", "boxes"], ["keypoints"], **args)
    return op, {"heatmaps": heatmaps, "boxes": boxes.astype(np.float32)}


# --------------------------------------------------------------------------------------------------
# FPN proposals


def fpn_rois(rng, count, batch_column=True):
    """RoIs whose sizes spread over the FPN levels (sqrt(area) from 8 to 900 pixels)."""
    side = np.exp(uniform(rng, np.log(8), np.log(900), (count, 2))).astype(np.float32)
    x1, y1 = uniform(rng, 0, 100, count), uniform(rng, 0, 100, count)
    boxes = np.stack([x1, y1, x1 + side[:, 0], y1 + side[:, 1]], axis=1)
    if batch_column:
        boxes = np.concatenate([rng.integers(0, 2, (count, 1)).astype(np.float32), boxes], axis=1)
    return boxes.astype(np.float32)


def rpn_levels(data, rng):
    lo = data.draw(st.integers(2, 3))
    hi = lo + data.draw(st.integers(0, 2))
    counts = [data.draw(st.integers(0, 4)) for _ in range(hi - lo + 1)]
    scores = distinct_scores(rng, (sum(counts),))
    column = data.draw(st.booleans())
    inputs, splits = {}, np.cumsum([0, *counts])
    for i, count in enumerate(counts):
        inputs[f"rois{i}"] = fpn_rois(rng, count)
        part = scores[splits[i] : splits[i + 1]]
        inputs[f"scores{i}"] = part[:, None] if column else part
    names = [f"rois{i}" for i in range(len(counts))] + [f"scores{i}" for i in range(len(counts))]
    args = {"rpn_min_level": lo, "rpn_max_level": hi, "rpn_post_nms_topN": data.draw(st.sampled_from([2000, 3]))}
    return names, inputs, args


def roi_level_args(data):
    lo = data.draw(st.integers(2, 3))
    hi = lo + data.draw(st.integers(0, 3))
    args = {"roi_min_level": lo, "roi_max_level": hi}
    if data.draw(st.booleans()):
        args["roi_canonical_scale"] = 100
        args["roi_canonical_level"] = 3
    if data.draw(st.booleans()):
        args["legacy_plus_one"] = 0
    return args, hi - lo + 1


def draw_collect_rpn_proposals(data):
    names, inputs, args = rpn_levels(data, generator(data))
    return make_op("CollectRpnProposals", names, ["rois"], **args), inputs


def draw_distribute_fpn_proposals(data):
    rng = generator(data)
    args, levels = roi_level_args(data)
    rois = fpn_rois(rng, data.draw(st.integers(0, 8)), batch_column=data.draw(st.booleans()))
    outputs = [f"rois_fpn{i}" for i in range(levels)] + ["restore"]
    return make_op("DistributeFpnProposals", ["rois"], outputs, **args), {"rois": rois}


def draw_collect_and_distribute(data):
    rng = generator(data)
    names, inputs, args = rpn_levels(data, rng)
    level_args, levels = roi_level_args(data)
    outputs = ["rois"] + [f"rois_fpn{i}" for i in range(levels)] + ["restore"]
    op = make_op("CollectAndDistributeFpnRpnProposals", names, outputs, **args, **level_args)
    return op, inputs


CASES = cases(
    Case("RoIAlign", draw_roi_align, gradient_ops=("RoIAlignGradient",), rtol=1e-4),
    Case("RoIPool", draw_roi_pool, gradient_ops=("RoIPoolGradient",), note="RoIPoolGradient: Caffe2 has no CPU kernel"),
    Case("BBoxTransform", draw_bbox_transform, rtol=1e-4),
    Case("BoxWithNMSLimit", draw_box_with_nms_limit, note="scores without ties (std::sort)"),
    Case("GenerateProposals", draw_generate_proposals, rtol=1e-4, note="scores without ties (std::sort)"),
    Case(
        "GenerateProposalsCPP",
        lambda data: draw_generate_proposals(data, "GenerateProposalsCPP"),
        rtol=1e-4,
        note="GenerateProposals' alias",
    ),
    Case(
        "RoIAlignRotated",
        draw_roi_align_rotated,
        gradient_ops=("RoIAlignRotatedGradient",),
        rtol=1e-4,
        note="RoIAlignRotatedGradient: Caffe2 has no CPU kernel",
    ),
    Case("NormalizePlanarYUV", draw_normalize_planar_yuv),
    Case("RMACRegions", draw_rmac_regions),
    Case("HeatmapMaxKeypoint", draw_heatmap_max_keypoint, rtol=1e-4),
    Case("CollectRpnProposals", draw_collect_rpn_proposals, note="scores without ties"),
    Case("DistributeFpnProposals", draw_distribute_fpn_proposals),
    Case("CollectAndDistributeFpnRpnProposals", draw_collect_and_distribute, note="scores without ties"),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@fewer_examples
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


@settings(max_examples=max(1, settings().max_examples // 4))
@given(data=st.data())
def test_roi_align_nhwc(caffe2, data):
    """NHWC forward (Caffe2's RoIAlignGradient reads NCHW whatever the order, so only the forward op)."""
    op, inputs = draw_roi_align(data, nhwc=True)
    check_op(caffe2, op, inputs, rtol=1e-4)


def test_roi_align_gradient_ops_are_caffe2s(caffe2):
    """The maker's RoIAlignGradient against Caffe2's, and its dX on fixed RoIs at the image's edges."""
    rois = np.array([[0, -1.5, -0.5, 3.2, 2.7], [1, 2.0, 1.0, 9.0, 8.0], [0, 4.0, 4.0, 4.5, 4.2]], np.float32)
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 6)).astype(np.float32)
    op = make_op("RoIAlign", ["X", "R"], ["Y"], pooled_h=2, pooled_w=3, spatial_scale=0.5)
    grad_ops = check_gradient(caffe2, op, {"X": x, "R": rois}, rtol=1e-4)
    assert [g.type for g in grad_ops] == ["RoIAlignGradient"]


def test_roi_pool_gradient_refused(caffe2):
    """Caffe2's maker gives RoIPoolGradient (X, R, argmaxes, dY); its CPU kernel is CAFFE_NOT_IMPLEMENTED, and
    rnn2jax refuses it too. With is_test there are no argmaxes to read: both makers refuse."""
    op = make_op("RoIPool", ["X", "R"], ["Y"], is_test=1)
    with pytest.raises(GradientError):
        get_gradient_for_op(op, ["Y_grad"])
    grad = make_op("RoIPoolGradient", ["X", "R", "A", "dY"], ["dX"])
    inputs = {
        "X": np.zeros((1, 1, 2, 2), np.float32),
        "R": np.zeros((1, 5), np.float32),
        "A": np.zeros((1, 1, 1, 1), np.int32),
        "dY": np.ones((1, 1, 1, 1), np.float32),
    }
    assert check_op(caffe2, grad, inputs) is None


def test_refusals_match_caffe2(caffe2):
    """Bad shapes and values Caffe2 refuses, refused by rnn2jax too (one per op)."""
    x = np.zeros((1, 2, 4, 4), np.float32)
    bad = [
        (make_op("RoIAlign", ["X", "R"], ["Y"]), {"X": x, "R": np.zeros((2, 3), np.float32)}),
        (make_op("RoIPool", ["X", "R"], ["Y", "A"]), {"X": x, "R": np.array([[1, 0, 0, 2, 2]], np.float32)}),
        (make_op("RoIPool", ["X", "R"], ["Y"]), {"X": x, "R": np.array([[0, 0, 0, 2, 2]], np.float32)}),
        (
            make_op("BBoxTransform", ["r", "d", "i"], ["b"]),
            {"r": np.zeros((2, 4), np.float32), "d": np.zeros((2, 6), np.float32), "i": np.ones((1, 3), np.float32)},
        ),
        (
            make_op("BBoxTransform", ["r", "d", "i"], ["b"]),
            {
                "r": np.array([[3, 0, 0, 1, 1]], np.float32),
                "d": np.zeros((1, 4), np.float32),
                "i": np.ones((2, 3), np.float32),
            },
        ),
        (
            make_op("BoxWithNMSLimit", ["s", "b"], ["a", "c", "d"]),
            {"s": np.zeros((2, 3), np.float32), "b": np.zeros((2, 8), np.float32)},
        ),
        (
            make_op("BoxWithNMSLimit", ["s", "b", "n"], ["a", "c", "d"]),
            {"s": np.zeros((2, 2), np.float32), "b": np.zeros((2, 8), np.float32), "n": np.array([3], np.float32)},
        ),
        (
            make_op("GenerateProposals", ["s", "d", "i", "a"], ["r", "p"]),
            {
                "s": np.zeros((1, 2, 2, 2), np.float32),
                "d": np.zeros((1, 4, 2, 2), np.float32),
                "i": np.ones((1, 3), np.float32),
                "a": np.zeros((2, 4), np.float32),
            },
        ),
    ]
    for op, inputs in bad:
        assert check_op(caffe2, op, inputs, jit=False) is None, op.type
    # aligned RoIs of negative size: Caffe2's enforce fires inside an OpenMP loop and aborts the process
    # (so the oracle cannot be asked); rnn2jax refuses them
    op = make_op("RoIAlign", ["X", "R"], ["Y"], aligned=1)
    with pytest.raises(ShapeError, match="non-negative size"):
        run_rnn2jax([op], {"X": x, "R": np.array([[0, 3, 3, 1, 1]], np.float32)}, ["Y"], jit=False)


def test_box_with_nms_limit_under_jit_reads_static_inputs():
    """The compiled net makes the scores and boxes static inputs: the kernel reads their values."""
    rng = np.random.default_rng(1)
    inputs = {"scores": distinct_scores(rng, (5, 3)), "boxes": clustered_boxes(rng, 5, 3)}
    op = make_op("BoxWithNMSLimit", ["scores", "boxes"], ["s", "b", "c"], score_thresh=0.1)
    jitted = run_rnn2jax([op], inputs, ["s", "b", "c"])
    eager = run_rnn2jax([op], inputs, ["s", "b", "c"], jit=False)
    for name in jitted:
        np.testing.assert_array_equal(jitted[name], eager[name])


def test_roi_pool_refuses_rank_3_input():
    with pytest.raises(ShapeError):
        run_rnn2jax(
            [make_op("RoIPool", ["X", "R"], ["Y", "A"])],
            {"X": np.zeros((1, 1, 2), np.float32), "R": np.zeros((1, 5), np.float32)},
            ["Y"],
        )


@pytest.mark.parametrize("jit", [True, False])
def test_batch_index_outside_x_is_refused(jit):
    """Caffe2's RoIAlign reads outside X for a batch index past its images (no check); rnn2jax refuses it,
    at the op when the RoIs are known, after the compiled call when they are traced (sampling_ratio > 0)."""
    x = np.zeros((1, 1, 4, 4), np.float32)
    rois = np.array([[2, 0, 0, 2, 2]], np.float32)
    for op_type in ("RoIAlign", "RoIAlignRotated") if not jit else ("RoIAlign",):
        r = rois if op_type == "RoIAlign" else np.array([[2, 1, 1, 2, 2, 0]], np.float32)
        op = make_op(op_type, ["X", "R"], ["Y"], sampling_ratio=2)
        with pytest.raises(ShapeError, match="batch index"):
            run_rnn2jax([op], {"X": x, "R": r}, ["Y"], jit=jit)


def test_proposals_feed_roi_align_in_one_compiled_net(caffe2):
    """GenerateProposals -> BBoxTransform -> BoxWithNMSLimit -> RoIAlign as one net, compiled: the proposals'
    values decide the next ops' shapes, so the compiler computes them from the static net inputs."""
    rng = np.random.default_rng(3)
    inputs = {
        "scores": distinct_scores(rng, (1, 2, 3, 3)),
        "deltas": uniform(rng, -0.3, 0.3, (1, 8, 3, 3)),
        "im_info": np.array([[40, 40, 1]], np.float32),
        "anchors": np.array([[-8, -8, 8, 8], [-12, -6, 12, 6]], np.float32),
        "cls_deltas": uniform(rng, -0.2, 0.2, (50, 12)),
        "cls_scores": distinct_scores(rng, (50, 3)),
        "X": uniform(rng, -1, 1, (1, 2, 10, 10)),
    }
    ops = [
        make_op("GenerateProposals", ["scores", "deltas", "im_info", "anchors"], ["rois", "probs"], spatial_scale=0.25),
        make_op("BBoxTransform", ["rois", "d_rows", "im_info"], ["boxes"]),
        make_op("BoxWithNMSLimit", ["s_rows", "boxes"], ["det_scores", "det_boxes", "det_classes"], score_thresh=0.2),
        make_op("RoIAlign", ["X", "det_boxes"], ["feat"], spatial_scale=0.25, pooled_h=2, pooled_w=2),
    ]
    # the class deltas and scores of as many rows as there are proposals
    want = caffe2.run([("ops", ops[:1])], inputs, fetch=["rois"])
    count = want["rois"].shape[0]
    inputs["d_rows"] = inputs["cls_deltas"][:count]
    inputs["s_rows"] = inputs["cls_scores"][:count]
    outputs = ["rois", "boxes", "det_scores", "det_boxes", "det_classes", "feat"]
    want = caffe2.run([("ops", ops)], inputs, fetch=outputs)
    got = run_rnn2jax(ops, inputs, outputs)
    from differential import assert_blobs_equal

    assert_blobs_equal(got, want, rtol=1e-4)
    assert want["det_boxes"].shape[0] > 0
