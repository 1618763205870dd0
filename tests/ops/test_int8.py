"""The Int8 family (rnn2jax/ops/int8.py) against real Caffe2: quantized data compared exactly, as integers,
with the scale and zero point of every Int8 output.

Int8 inputs are `Int8Tensor`s; the oracle makes them in Caffe2 with Int8GivenTensorFill (Caffe2's FeedBlob
takes no Int8 tensor), and fetches Int8 outputs with FetchInt8Blob. Caffe2 checks the layout ops'
Y_scale/Y_zero_point with glog's CHECK, which kills the process, so their draws always pass the input's
quantization, and rnn2jax's refusal of a mismatch is tested on its own.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, cases, check_op, dims, invalid, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.errors import BadArgumentError, InputTypeError, Rnn2JaxError
from rnn2jax.ir.int8 import Int8Tensor, int8_tensor

SCALES = (0.5**10, 0.01, 0.037, 0.1, 0.25, 0.5, 1.0, 1.7, 2.0)


def scales() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(SCALES), st.floats(0.001, 4.0)).map(lambda s: float(np.float32(s)))


def int8(data: st.DataObject, shape, *, scale: float | None = None, zero_point: int | None = None) -> Int8Tensor:
    """An Int8 blob of `shape` (a tuple or a strategy) with drawn data, scale and zero point."""
    values = data.draw(arrays(shape, np.uint8, 0, 255))
    scale = data.draw(scales()) if scale is None else scale
    zero_point = data.draw(st.integers(0, 255)) if zero_point is None else zero_point
    return int8_tensor(values, scale, zero_point)


def keep(x: Int8Tensor) -> dict:
    """The Y_scale and Y_zero_point arguments of an op that keeps its input's quantization."""
    return {"Y_scale": x.scale, "Y_zero_point": x.zero_point}


# --------------------------------------------------------------------------------------------------
# Draws


def draw_quantize(data):
    x = data.draw(arrays(shapes(0, 3), np.float32, -300.0, 300.0))
    if data.draw(st.booleans()):
        x = x.copy()
        x.flat[: min(3, x.size)] = data.draw(st.sampled_from([np.inf, -np.inf, np.nan, 1e12, -1e12, 2.5]))
    return make_op(
        "Int8Quantize", ["x"], ["y"], Y_scale=data.draw(scales()), Y_zero_point=data.draw(st.integers(0, 255))
    ), {"x": x}


def draw_dequantize(data):
    return make_op("Int8Dequantize", ["x"], ["y"]), {"x": int8(data, shapes(0, 3))}


def draw_given_fill(data):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    values = data.draw(arrays(shape, np.uint8, 0, 255))
    args = {"values": values.tobytes(), "shape": list(shape), "Y_scale": data.draw(scales())}
    args["Y_zero_point"] = data.draw(st.integers(0, 255))
    return make_op("Int8GivenTensorFill", [], ["y"], **args), {}


def draw_given_int_fill(data):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    values = data.draw(arrays(shape, np.int32, -(2**31), 2**31 - 1))
    args = {"values": values.ravel().tolist(), "shape": list(shape), "Y_scale": data.draw(scales())}
    args["Y_zero_point"] = data.draw(st.integers(-5, 300))
    return make_op("Int8GivenIntTensorFill", [], ["y"], **args), {}


def draw_add(op_type: str, inputs: int = 2):
    def draw(data):
        shape = data.draw(shapes(1, 3))
        xs = [int8(data, shape) for _ in range(inputs)]
        if invalid(data):  # a scale ratio QNNPACK refuses
            y_scale = xs[0].scale * 1024.0
        else:
            y_scale = float(
                np.float32(max(x.scale for x in xs) * data.draw(st.sampled_from([0.3, 0.5, 1.0, 1.3, 2.0, 7.0])))
            )
        names = [f"x{i}" for i in range(inputs)]
        op = make_op(op_type, names, ["y"], Y_scale=y_scale, Y_zero_point=data.draw(st.integers(0, 254)))
        return op, dict(zip(names, xs, strict=True))

    return draw


def draw_relu(data):
    x = int8(data, shapes(0, 3))
    return make_op("Int8Relu", ["x"], ["y"], **keep(x)), {"x": x}


def draw_sigmoid(data):
    x = int8(data, shapes(1, 3))
    return make_op("Int8Sigmoid", ["x"], ["y"], Y_scale=1.0 / 256, Y_zero_point=0), {"x": x}


def draw_softmax(data):
    x = int8(data, shapes(1, 3))
    return make_op("Int8Softmax", ["x"], ["y"], Y_scale=1.0 / 256, Y_zero_point=0), {"x": x}


def draw_leaky_relu(data):
    x = int8(data, shapes(1, 3))
    y_scale = float(np.float32(x.scale * data.draw(st.sampled_from([0.25, 0.5, 1.0, 1.5, 3.0]))))
    args = {"alpha": data.draw(st.sampled_from([0.01, 0.1, 0.3, 1.0])), "Y_scale": y_scale}
    args["Y_zero_point"] = data.draw(st.integers(0, 255))
    return make_op("Int8LeakyRelu", ["x"], ["y"], **args), {"x": x}


def draw_reshape(data):
    x = int8(data, shapes(1, 3))
    shape = data.draw(st.sampled_from([[-1], [1, -1], list(reversed(x.shape)), [*x.shape, 1]]))
    return make_op("Int8Reshape", ["x"], ["y", "old"], shape=shape, **keep(x)), {"x": x}


def draw_flatten(data):
    x = int8(data, shapes(1, 4))
    axis = data.draw(st.integers(0, len(x.shape)))
    return make_op("Int8Flatten", ["x"], ["y"], axis=axis, **keep(x)), {"x": x}


def draw_transpose(data):
    x = int8(data, shapes(1, 4))
    axes = data.draw(st.permutations(range(len(x.shape))))
    return make_op("Int8Transpose", ["x"], ["y"], axes=list(axes), **keep(x)), {"x": x}


def draw_slice(data):
    x = int8(data, shapes(1, 3))
    starts = [data.draw(st.integers(0, d)) for d in x.shape]
    ends = [
        data.draw(st.sampled_from([-1, d])) if data.draw(st.booleans()) else data.draw(st.integers(s, d))
        for s, d in zip(starts, x.shape, strict=True)
    ]
    return make_op("Int8Slice", ["x"], ["y"], starts=starts, ends=ends, **keep(x)), {"x": x}


def draw_concat(data):
    shape = data.draw(shapes(1, 4))
    order = data.draw(st.sampled_from(["", "NHWC", "NCHW"])) if len(shape) == 4 else ""
    axis = data.draw(st.integers(0, len(shape) - 1))
    first = int8(data, shape)
    xs = [first]
    for _ in range(data.draw(st.integers(0, 2))):
        other = list(shape)
        other[axis] = data.draw(st.integers(1, 3))
        xs.append(int8(data, tuple(other), scale=first.scale, zero_point=first.zero_point))
    names = [f"x{i}" for i in range(len(xs))]
    args = {"axis": axis, **({"order": order} if order else {}), **keep(first)}
    return make_op("Int8Concat", names, ["y"], **args), dict(zip(names, xs, strict=True))


def draw_channel_shuffle(data):
    groups = data.draw(st.integers(1, 3))
    shape = (*data.draw(shapes(3, 3, max_side=3)), groups * data.draw(st.integers(1, 3)))
    x = int8(data, shape)
    kernel = {} if invalid(data) else {"kernel": 1}  # Caffe2's ConvPoolOpBase refuses an op without a kernel
    return make_op("Int8ChannelShuffle", ["x"], ["y"], group=groups, order="NHWC", **kernel, **keep(x)), {"x": x}


def draw_resize_nearest(data):
    x = int8(data, shapes(4, 4, max_side=4))
    args = {n: data.draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])) for n in ("width_scale", "height_scale")}
    return make_op("Int8ResizeNearest", ["x"], ["y"], **args, **keep(x)), {"x": x}


def _pool_args(data, x: Int8Tensor) -> dict:
    """A window that fits (1x1 is drawn now and then: QNNPACK refuses it), or global pooling."""
    if data.draw(st.integers(0, 5)) == 0:
        return {"global_pooling": 1, "order": "NHWC"}
    kernel = data.draw(st.integers(1, min(3, x.shape[1] + 1, x.shape[2] + 1)))
    pad = data.draw(st.integers(0, kernel - 1))
    return {"kernel": kernel, "stride": data.draw(st.integers(1, 2)), "pad": pad, "order": "NHWC"}


def draw_max_pool(op_type: str):
    def draw(data):
        x = int8(data, shapes(4, 4, max_side=5))
        return make_op(op_type, ["x"], ["y"], **_pool_args(data, x), **keep(x)), {"x": x}

    return draw


def draw_average_pool(op_type: str):
    def draw(data):
        x = int8(data, shapes(4, 4, max_side=5))
        y_scale = float(np.float32(x.scale * data.draw(st.sampled_from([0.3, 1.0, 1.0, 2.5]))))
        args = {"Y_scale": y_scale, "Y_zero_point": data.draw(st.integers(0, 255))}
        return make_op(op_type, ["x"], ["y"], **_pool_args(data, x), **args), {"x": x}

    return draw


def draw_fc(data):
    m, k, n = data.draw(dims(1, 4)), data.draw(dims(1, 9)), data.draw(dims(1, 5))
    x = int8(data, (m, k))
    w = int8(data, (n, k), scale=data.draw(st.sampled_from([0.003, 0.02, 0.1])))
    b = int8_tensor(data.draw(arrays((n,), np.int32, -5000, 5000)), x.scale * w.scale, 0)
    y_scale = float(np.float32(x.scale * w.scale * data.draw(st.sampled_from([1.5, 4.0, 30.0, 200.0]))))
    if invalid(data):  # requantization scale >= 1: QNNPACK refuses
        y_scale = float(np.float32(x.scale * w.scale / 2))
    op = make_op("Int8FC", ["x", "w", "b"], ["y"], Y_scale=y_scale, Y_zero_point=data.draw(st.integers(0, 255)))
    return op, {"x": x, "w": w, "b": b}


def draw_conv(op_type: str):
    def draw(data):
        groups = data.draw(st.integers(1, 3))
        c, m = groups * data.draw(dims(1, 3)), groups * data.draw(dims(1, 2))
        k, dilation = data.draw(dims(1, 3)), data.draw(dims(1, 2))
        pad = data.draw(st.integers(0, k - 1))
        side = data.draw(st.integers(max(1, dilation * (k - 1) + 1 - 2 * pad), 5))
        x = int8(data, (data.draw(dims(1, 2)), side, data.draw(st.integers(side, 5)), c))
        w = int8(data, (m, k, k, c // groups), scale=data.draw(st.sampled_from([0.003, 0.02, 0.1])))
        b = int8_tensor(data.draw(arrays((m,), np.int32, -5000, 5000)), x.scale * w.scale, 0)
        y_scale = float(np.float32(x.scale * w.scale * data.draw(st.sampled_from([1.5, 4.0, 30.0, 200.0]))))
        args = {"kernel": k, "pad": pad, "stride": data.draw(dims(1, 2)), "dilation": dilation, "group": groups}
        args.update(order="NHWC", Y_scale=y_scale, Y_zero_point=data.draw(st.integers(0, 255)))
        return make_op(op_type, ["x", "w", "b"], ["y"], **args), {"x": x, "w": w, "b": b}

    return draw


def draw_conv_transpose(data):
    ic, oc, k = data.draw(dims(1, 4)), data.draw(dims(1, 4)), data.draw(dims(1, 3))
    stride = data.draw(dims(1, 2))
    x = int8(data, (data.draw(dims(1, 2)), data.draw(dims(1, 4)), data.draw(dims(1, 4)), ic))
    w = int8(data, (ic, k, k, oc), scale=data.draw(st.sampled_from([0.003, 0.02, 0.1])))
    b = int8_tensor(data.draw(arrays((oc,), np.int32, -5000, 5000)), x.scale * w.scale, 0)
    y_scale = float(np.float32(x.scale * w.scale * data.draw(st.sampled_from([1.5, 4.0, 30.0, 200.0]))))
    args = {
        "kernel": k,
        "stride": stride,
        "pad": data.draw(st.integers(0, k - 1)),
        "adj": data.draw(st.integers(0, stride - 1)),
    }
    args.update(order="NHWC", Y_scale=y_scale, Y_zero_point=data.draw(st.integers(0, 255)))
    return make_op("Int8ConvTranspose", ["x", "w", "b"], ["y"], **args), {"x": x, "w": w, "b": b}


def draw_roi_align(data):
    x = int8(data, (data.draw(dims(1, 2)), data.draw(dims(1, 6)), data.draw(dims(1, 6)), data.draw(dims(1, 3))))
    count = data.draw(dims(0, 3))
    corners = data.draw(arrays((count, 4), np.float32, -2.0, 8.0))
    if data.draw(st.booleans()):
        batch = data.draw(arrays((count, 1), np.int64, 0, x.shape[0] - 1)).astype(np.float32)
        corners = np.concatenate([batch, corners], axis=1)
    args = {"pooled_h": data.draw(dims(1, 3)), "pooled_w": data.draw(dims(1, 3)), "order": "NHWC"}
    args.update(
        sampling_ratio=data.draw(st.sampled_from([-1, 0, 1, 2])), spatial_scale=data.draw(st.sampled_from([0.5, 1.0]))
    )
    args.update(Y_scale=float(np.float32(x.scale * data.draw(st.sampled_from([0.05, 0.3, 1.0])))))
    args.update(Y_zero_point=data.draw(st.integers(0, 255)))
    return make_op("Int8RoIAlign", ["x", "rois"], ["y"], **args), {"x": x, "rois": corners}


CASES = cases(
    Case("Int8Quantize", draw_quantize),
    Case("Int8Dequantize", draw_dequantize),
    Case("Int8GivenTensorFill", draw_given_fill),
    Case("Int8GivenIntTensorFill", draw_given_int_fill),
    Case("Int8Add", draw_add("Int8Add")),
    Case("Int8AddRelu", draw_add("Int8AddRelu")),
    Case("Int8Sum", draw_add("Int8Sum")),
    Case("Int8SumRelu", draw_add("Int8SumRelu")),
    Case("Int8Relu", draw_relu),
    Case("Int8Sigmoid", draw_sigmoid),
    Case("Int8LeakyRelu", draw_leaky_relu),
    Case("Int8Softmax", draw_softmax),
    Case("Int8Reshape", draw_reshape),
    Case("Int8Flatten", draw_flatten),
    Case("Int8Transpose", draw_transpose),
    Case("Int8Slice", draw_slice),
    Case("Int8Concat", draw_concat),
    Case("Int8ChannelShuffle", draw_channel_shuffle),
    Case("Int8ResizeNearest", draw_resize_nearest),
    Case("Int8MaxPool", draw_max_pool("Int8MaxPool")),
    Case("Int8MaxPoolRelu", draw_max_pool("Int8MaxPoolRelu")),
    Case("Int8AveragePool", draw_average_pool("Int8AveragePool")),
    Case("Int8AveragePoolRelu", draw_average_pool("Int8AveragePoolRelu")),
    Case("Int8FC", draw_fc),
    Case("Int8Conv", draw_conv("Int8Conv")),
    Case("Int8ConvRelu", draw_conv("Int8ConvRelu")),
    Case("Int8ConvTranspose", draw_conv_transpose),
    Case("Int8RoIAlign", draw_roi_align),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


# --------------------------------------------------------------------------------------------------
# Refusals, and the blob value itself


def test_add_refusals_match_caffe2(caffe2):
    """Inputs of different shapes, and three inputs to Int8Sum (Caffe2 runs Int8AddOp for it)."""
    a = int8_tensor(np.arange(6, dtype=np.uint8).reshape(2, 3), 0.5, 3)
    b = int8_tensor(np.arange(3, dtype=np.uint8), 0.5, 3)
    assert check_op(caffe2, make_op("Int8Add", ["a", "b"], ["y"], Y_scale=1.0), {"a": a, "b": b}) is None
    three = make_op("Int8Sum", ["a", "c", "d"], ["y"], Y_scale=1.0)
    assert check_op(caffe2, three, {"a": a, "c": a, "d": a}) is None


def test_int8_ops_refuse_float_blobs(caffe2):
    x = np.zeros((2, 3), np.float32)
    assert check_op(caffe2, make_op("Int8Dequantize", ["x"], ["y"]), {"x": x}) is None
    with pytest.raises(InputTypeError, match=r"Int8Relu.*'x' must be an Int8 tensor"):
        run_rnn2jax([make_op("Int8Relu", ["x"], ["y"])], {"x": x}, ["y"])


def test_layout_ops_refuse_a_requantization():
    """Caffe2 CHECKs (and aborts the process) where Y_scale/Y_zero_point differ from the input's."""
    x = int8_tensor(np.arange(6, dtype=np.uint8).reshape(2, 3), 0.5, 3)
    for op in (
        make_op("Int8Relu", ["x"], ["y"]),
        make_op("Int8Flatten", ["x"], ["y"], Y_scale=0.5, Y_zero_point=4),
        make_op("Int8Transpose", ["x"], ["y"], Y_scale=0.25, Y_zero_point=3),
    ):
        with pytest.raises(BadArgumentError, match="must equal input 'x''s scale"):
            run_rnn2jax([op], {"x": x}, ["y"])


def test_sigmoid_and_softmax_output_quantization_is_fixed():
    """Caffe2 CHECKs (and aborts) that Int8Sigmoid's and Int8Softmax's output is 1/256, 0; rnn2jax refuses."""
    x = int8_tensor(np.arange(6, dtype=np.uint8), 0.5, 3)
    for op_type in ("Int8Sigmoid", "Int8Softmax"):
        with pytest.raises(BadArgumentError, match="1/256"):
            run_rnn2jax([make_op(op_type, ["x"], ["y"], Y_scale=0.5)], {"x": x}, ["y"])


def test_quantize_dequantize_through_the_workspace_and_caffe2_api():
    """An Int8 blob in the Caffe2 API: FetchBlob refuses it (as Caffe2 does), FetchInt8Blob returns Caffe2's
    namedtuple, FetchInt8BlobRealVal its real values."""
    from rnn2jax.caffe2.python import core, workspace

    workspace.ResetWorkspace()
    workspace.FeedBlob("x", np.array([0.1, -0.3, 2.5, 1e10], np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("Int8Quantize", ["x"], ["q"], Y_scale=0.5, Y_zero_point=10))
    with pytest.raises(TypeError, match="FetchInt8Blob"):
        workspace.FetchBlob("q")
    q = workspace.FetchInt8Blob("q")
    assert type(q).__name__ == "Int8Tensor" and q._fields == ("data", "scale", "zero_point")
    np.testing.assert_array_equal(q.data, np.array([10, 9, 15, 0], np.uint8))
    assert (q.scale, q.zero_point) == (0.5, 10)
    np.testing.assert_array_equal(workspace.FetchInt8BlobRealVal("q"), np.array([0, -0.5, 2.5, -5], np.float32))
    workspace.ResetWorkspace()


def test_compile_takes_and_returns_int8_tensors():
    import rnn2jax
    from rnn2jax.caffe2.opdef import create_net

    net = create_net("n", [make_op("Int8Relu", ["x"], ["y"], Y_scale=0.5, Y_zero_point=3)])
    fn = rnn2jax.compile(net, outputs=["y"])
    y = fn({"x": int8_tensor(np.array([1, 3, 7], np.uint8), 0.5, 3)})["y"]
    assert isinstance(y, Int8Tensor) and (y.scale, y.zero_point) == (0.5, 3)
    np.testing.assert_array_equal(np.asarray(y.data), [3, 3, 7])
    with pytest.raises(Rnn2JaxError):
        fn({"x": int8_tensor(np.array([1, 3, 7], np.uint8), 0.25, 3)})
