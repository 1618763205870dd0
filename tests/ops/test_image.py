"""The image family (rnn2jax/ops/image.py): its lowering, gradient ops and builder makers.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the image-layout ops
(space/batch moves, PadImage, ChannelShuffle, resizing, LRN, Im2Col/Col2Im, BatchPermutation, IntegralImage) against
real Caffe2 (see tests/differential.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, invalid, make_op, run_case

# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_image.py)

def side(data, low=1, high=3):
    return data.draw(st.integers(low, high))


def image(data, shape, dtype=np.float32):
    return data.draw(arrays(tuple(shape), dtype))


def order_arg(data):
    """(args, nhwc): `order` given or left to its NCHW default."""
    order = data.draw(st.sampled_from([None, "NCHW", "NHWC"]))
    return ({} if order is None else {"order": order}), order == "NHWC"


def layout(shape_nchw, nhwc):
    n, c, *spatial = shape_nchw
    return (n, *spatial, c) if nhwc else (n, c, *spatial)


# --------------------------------------------------------------------------------------------------
# SpaceToBatch / BatchToSpace


def space_args(data):
    args, pad, pad_t = {}, 0, 0
    if data.draw(st.booleans()):
        pad = pad_t = data.draw(st.integers(0, 2))
        args["pad"] = pad
    if data.draw(st.booleans()):
        pad_t = data.draw(st.integers(0, 2))
        args["pad_t"] = pad_t
    block = data.draw(st.integers(1, 3))
    if block != 2 or data.draw(st.booleans()):
        args["block_size"] = block
    return args, pad_t, pad, block


def draw_space_to_batch(data):
    args, pad_t, pad, b = space_args(data)
    h = data.draw(st.integers(1, 2)) * b + (-(pad_t + pad) % b)
    w = data.draw(st.integers(1, 2)) * b + (-(2 * pad) % b)
    if invalid(data):
        h += 1
    x = image(data, (side(data, 1, 2), side(data, 1, 2), h, w))
    return make_op("SpaceToBatch", ["x"], ["y"], **args), {"x": x}


def draw_batch_to_space(data):
    args, pad_t, pad, b = space_args(data)
    h = data.draw(st.integers((pad_t + pad) // b + 1, (pad_t + pad) // b + 2))
    w = data.draw(st.integers(2 * pad // b + 1, 2 * pad // b + 2))
    shape = (side(data, 1, 2) * b * b, side(data, 1, 2), h, w)
    if invalid(data):  # a batch that is not a multiple of b * b makes Caffe2 divide by zero or scribble
        return make_op("BatchToSpace", ["x"], ["y"], **args), {"x": image(data, shape[1:])}
    return make_op("BatchToSpace", ["x"], ["y"], **args), {"x": image(data, shape)}


# --------------------------------------------------------------------------------------------------
# PadImage


def draw_pad_image(data):
    order, nhwc = order_arg(data)
    h, w = side(data, 1, 4), side(data, 1, 4)
    mode = data.draw(st.sampled_from(["constant", "reflect", "edge", None]))
    limit = (h - 1, w - 1) if mode == "reflect" else (2, 2)  # reflect reads outside the image beyond that
    pads = [data.draw(st.integers(0, limit[i % 2])) for i in range(4)]  # t, l, b, r
    style = data.draw(st.sampled_from(["pad", "sides", "pads"]))
    args = dict(order)
    if style == "pad":
        pads = [min(limit)] * 4 if data.draw(st.booleans()) else [0] * 4
        args["pad"] = pads[0]
    elif style == "sides":
        args.update(zip(("pad_t", "pad_l", "pad_b", "pad_r"), pads, strict=True))
    else:
        args["pads"] = pads
    if mode is not None:
        args["mode"] = mode
    if mode in (None, "constant") and data.draw(st.booleans()):
        args["value"] = data.draw(st.floats(-2, 2, width=32, allow_subnormal=False))
    shape = [side(data, 1, 2), side(data, 1, 2), h, w]
    if invalid(data):
        kind = data.draw(st.sampled_from(["mode", "stride", "empty"]))
        if kind == "mode":
            args["mode"] = "wrap"
        elif kind == "stride":
            args["stride"] = 2
        else:
            shape[1] = 0
    return make_op("PadImage", ["x"], ["y"], **args), {"x": image(data, layout(shape, nhwc))}


# --------------------------------------------------------------------------------------------------
# ChannelShuffle


def draw_channel_shuffle(data):
    order, nhwc = order_arg(data)
    groups = side(data, 1, 3)
    channels = groups * side(data, 1, 3) + (1 if invalid(data) and groups > 1 else 0)
    rank = data.draw(st.integers(2, 4))
    shape = [side(data, 1, 2), channels] + [side(data, 1, 2) for _ in range(rank - 2)]
    return make_op("ChannelShuffle", ["x"], ["y"], group=groups, **order), {"x": image(data, layout(shape, nhwc))}


# --------------------------------------------------------------------------------------------------
# Resizing


def scale(data):
    return data.draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 0.7, 1.3]))


def draw_resize(op_type, orders):
    def draw(data):
        order, nhwc = order_arg(data) if orders else ({}, False)
        shape = [side(data, 1, 2), side(data, 1, 2), side(data, 1, 3), side(data, 1, 3)]
        x = image(data, layout(shape, nhwc))
        height, width = scale(data), scale(data)
        if data.draw(st.booleans()):
            scales = np.array([height, width], np.float32)
            return make_op(op_type, ["x", "scales"], ["y"], **order), {"x": x, "scales": scales}
        args = dict(order)
        if height != 1.0 or data.draw(st.booleans()):
            args["height_scale"] = height
        if width != 1.0 or data.draw(st.booleans()):
            args["width_scale"] = width
        if invalid(data):
            args["width_scale"] = data.draw(st.sampled_from([0.0, -1.0]))
        return make_op(op_type, ["x"], ["y"], **args), {"x": x}

    return draw


def draw_resize_nearest_3d(data):
    shape = [side(data, 1, 2), side(data, 1, 2), side(data, 1, 2), side(data, 1, 3), side(data, 1, 3)]
    args = {"height_scale": 2.0, "width_scale": 2.0}
    temporal = data.draw(st.sampled_from([1.0, 2.0, None]))
    if temporal is not None:
        args["temporal_scale"] = temporal
    if invalid(data):
        args["height_scale"] = 3.0
    return make_op("ResizeNearest3D", ["x"], ["y"], **args), {"x": image(data, shape)}


# --------------------------------------------------------------------------------------------------
# LRN, Im2Col, Col2Im


def draw_lrn(data):
    order, nhwc = order_arg(data)
    shape = [side(data, 1, 2), side(data, 1, 5), side(data, 1, 2), side(data, 1, 2)]
    args = dict(order)
    args["size"] = data.draw(st.sampled_from([1, 3, 5]))
    args["alpha"] = data.draw(st.floats(0.0625, 1.0, width=32, allow_subnormal=False))
    args["beta"] = data.draw(st.floats(0.125, 1.0, width=32, allow_subnormal=False))
    if data.draw(st.booleans()):
        args["bias"] = data.draw(st.floats(0.5, 2.0, width=32, allow_subnormal=False))
    outputs = ["y", "scale"] if data.draw(st.booleans()) else ["y"]
    x = image(data, layout(shape, nhwc))
    if invalid(data):
        x = x.astype(np.float64)
    return make_op("LRN", ["x"], outputs, **args), {"x": x}


def im2col_args(data):
    order, nhwc = order_arg(data)
    args = dict(order)
    for name, high in (("kernel", 3), ("dilation", 2), ("stride", 2)):
        if data.draw(st.booleans()):
            args[name] = data.draw(st.integers(1, high))
        else:
            args[f"{name}_h"] = data.draw(st.integers(1, high))
            args[f"{name}_w"] = data.draw(st.integers(1, high))
    if data.draw(st.booleans()):
        args["pad"] = data.draw(st.integers(0, 1))
    return args, nhwc


def draw_im2col(data):
    args, nhwc = im2col_args(data)
    shape = [side(data, 1, 2), side(data, 1, 2), side(data, 1, 5), side(data, 1, 5)]
    return make_op("Im2Col", ["x"], ["y"], **args), {"x": image(data, layout(shape, nhwc))}


def _patch_shape(shape, args, nhwc):
    n, c, h, w = shape
    get = lambda name, axis: args.get(f"{name}_{axis}", args.get(name, 1))  # noqa: E731
    kh, kw, dh, dw = get("kernel", "h"), get("kernel", "w"), get("dilation", "h"), get("dilation", "w")
    sh, sw, pad = get("stride", "h"), get("stride", "w"), args.get("pad", 0)
    ekh, ekw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    if h < ekh or w < ekw:
        return None
    oh, ow = (h + 2 * pad - ekh) // sh + 1, (w + 2 * pad - ekw) // sw + 1
    return (n, oh, ow, kh * kw * c) if nhwc else (n, c * kh * kw, oh, ow)


def draw_col2im(data):
    args, nhwc = im2col_args(data)
    shape = [side(data, 1, 2), side(data, 1, 2), side(data, 1, 5), side(data, 1, 5)]
    patches = _patch_shape(shape, args, nhwc) or (1, 2, 3)
    cols = image(data, patches)
    if data.draw(st.booleans()):
        cols = cols.reshape(-1)
    if invalid(data):
        cols = np.concatenate([cols.reshape(-1), [0.0]]).astype(np.float32)
    z = np.zeros(layout(shape, nhwc), np.float32)
    return make_op("Col2Im", ["cols", "z"], ["y"], **args), {"cols": cols, "z": z}


# --------------------------------------------------------------------------------------------------
# BatchPermutation, IntegralImage


def draw_batch_permutation(data):
    n = side(data, 0, 4)
    x = image(data, [n] + [side(data, 1, 3) for _ in range(data.draw(st.integers(0, 2)))])
    indices = np.array(data.draw(st.permutations(list(range(n)))), np.int32)
    if invalid(data):
        indices = indices.astype(np.int64) if data.draw(st.booleans()) else np.append(indices, 0).astype(np.int32)
    return make_op("BatchPermutation", ["x", "indices"], ["y"]), {"x": x, "indices": indices}


def draw_integral_image(data):
    shape = [side(data, 1, 2), side(data, 1, 2), side(data, 1, 3), side(data, 1, 3)]  # W = 0: the gradient crashes
    if invalid(data):
        shape = shape[1:]
    return make_op("IntegralImage", ["x"], ["y"]), {"x": image(data, shape)}


CASES = cases(
    Case("SpaceToBatch", draw_space_to_batch, gradient_ops=("BatchToSpace",)),
    Case("BatchToSpace", draw_batch_to_space, gradient_ops=("SpaceToBatch",)),
    Case("PadImage", draw_pad_image, gradient_ops=("PadImageGradient",)),
    Case("ChannelShuffle", draw_channel_shuffle, gradient_ops=("ChannelShuffleGradient",)),
    Case(
        "UpsampleBilinear",
        draw_resize("UpsampleBilinear", orders=False),
        gradient_ops=("UpsampleBilinearGradient",),
    ),
    Case("ResizeNearest", draw_resize("ResizeNearest", orders=True), gradient_ops=("ResizeNearestGradient",)),
    Case("ResizeNearest3D", draw_resize_nearest_3d, gradient_ops=("ResizeNearest3DGradient",)),
    Case("LRN", draw_lrn, gradient_ops=("LRNGradient",)),
    Case("Im2Col", draw_im2col, gradient_ops=("Col2Im",)),
    Case("Col2Im", draw_col2im, gradient_ops=("Im2Col",)),
    Case("BatchPermutation", draw_batch_permutation, gradient_ops=("BatchPermutationGradient",)),
    Case("IntegralImage", draw_integral_image, gradient_ops=("IntegralImageGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_image(caffe2, case, data):
    run_case(caffe2, case, data)


@pytest.mark.parametrize("n", [0, 2])
def test_batch_permutation_reads_int64_indices_only_of_an_empty_batch(caffe2, n):
    """Caffe2 reads the indices as int32 only when the batch is nonempty: int64 indices of an empty batch
    run, of a nonempty one are refused (both sides must agree; a `make test` draw found the empty case)."""
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    inputs = {"x": x, "indices": np.arange(n, dtype=np.int64)[::-1].copy()}
    want = check_op(caffe2, make_op("BatchPermutation", ["x", "indices"], ["y"]), inputs)
    assert (want is not None) == (n == 0)
