"""DNNLOWP's quantization ops (rnn2jax/ops/dnnlowp.py) against real Caffe2: quantized data compared exactly, with
the scale and zero point Caffe2 chooses (from the data's min and max, or the op's static quantization).

Each case is keyed by Caffe2's operator key (`Quantize_ENGINE_DNNLOWP`): these types exist only under an engine.
uint16 Int8 inputs (the _16 engines) are made in Caffe2 by Quantize_ENGINE_DNNLOWP_16, exactly, from a
power-of-two scale (the oracle's `_uint16_fill`).
"""

from __future__ import annotations

import numpy as np
import pytest
from host_differential import check_net as host_check_net
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, make_op, run_rnn2jax, shapes
from rnn2jax.errors import InputTypeError, Rnn2JaxError, UnsupportedOpError
from rnn2jax.ir.int8 import int8_tensor

ENGINES = ("DNNLOWP", "DNNLOWP_ROWWISE", "DNNLOWP_16", "DNNLOWP_ROWWISE_16")


def rarely(data) -> bool:
    """About one draw in eight (an invalid input Caffe2 refuses, a rare argument)."""
    return data.draw(st.integers(0, 7)) == 7


def dnnlowp_op(op_type: str, engine: str, inputs, outputs, **args):
    op = make_op(op_type, inputs, outputs, **args)
    op.engine = engine
    return op


def quantization_args(data, engine: str) -> dict:
    """DNNLOWP's arguments: precision, symmetric quantization, power-of-two scales, static quantization."""
    args = {}
    if data.draw(st.booleans()):
        args["activation_precision"] = data.draw(st.sampled_from([8, 12, 16] if engine.endswith("_16") else [8, 4, 7]))
    if data.draw(st.integers(0, 3)) == 3:
        args["preserve_activation_sparsity"] = 1
    if data.draw(st.integers(0, 4)) == 4:
        args["force_scale_power_of_two"] = 1
    choice = data.draw(st.integers(0, 5))
    if choice == 0:
        args.update(
            Y_scale=data.draw(st.sampled_from([0.01, 0.037, 0.5, 2.0])), Y_zero_point=data.draw(st.integers(0, 255))
        )
    elif choice == 1:
        args["followed_by"] = data.draw(st.sampled_from(["Relu", "Tanh", "Sigmoid"]))
        if data.draw(st.booleans()):
            args.update(Y_scale=0.05, Y_zero_point=data.draw(st.integers(0, 200)))
    return args


def draw_quantize(engine: str):
    def draw(data):
        bounds = st.sampled_from([-300.0, -2.0, -1e-6, 0.0, 1e-7, 0.5, 3.0, 100.0]).map(lambda v: float(np.float32(v)))
        low, high = sorted(data.draw(st.lists(bounds, min_size=2, max_size=2)))
        x = data.draw(arrays(shapes(0, 3), np.float32, low, high))
        args = quantization_args(data, engine)
        return dnnlowp_op("Quantize", engine, ["x"], ["y"], **args), {"x": x}

    return draw


def draw_dequantize(op_type: str, engine: str):
    def draw(data):
        shape = data.draw(shapes(0, 3))
        if engine.endswith("_16"):
            values = data.draw(arrays(shape, np.uint16, 0, 65535))
            x = int8_tensor(
                values, data.draw(st.sampled_from([2.0**-12, 2.0**-5, 0.5, 1.0])), data.draw(st.integers(0, 65535))
            )
        else:
            values = data.draw(arrays(shape, np.uint8, 0, 255))
            x = int8_tensor(values, data.draw(st.sampled_from([0.01, 0.037, 0.5, 1.7])), data.draw(st.integers(0, 255)))
        return dnnlowp_op(op_type, engine, ["x"], ["y"]), {"x": x}

    return draw


def int8(data, shape, dtype=np.uint8):
    values = data.draw(arrays(shape, dtype, 0, np.iinfo(dtype).max))
    return int8_tensor(values, data.draw(st.sampled_from([0.01, 0.037, 0.5, 1.7])), data.draw(st.integers(0, 255)))


def draw_table(op_type: str):
    """DNNLOWP's tanh and sigmoid tables read an Int8 blob's bytes whatever its quantization; float data is
    refused (Caffe2 fetches the input as Int8TensorCPU), as is dequantize_output (ignored: the output is Int8)."""

    def draw(data):
        args = {"dequantize_output": 1} if rarely(data) else {}
        x = data.draw(arrays(shapes(0, 3), np.float32, -4.0, 4.0)) if rarely(data) else int8(data, shapes(0, 3))
        return dnnlowp_op(op_type, "DNNLOWP", ["x"], ["y"], **args), {"x": x}

    return draw


def draw_relu(op_type: str):
    """An Int8 blob: its quantization is kept. Caffe2 crashes on float data (see test_relu_refuses_float_data)."""

    def draw(data):
        return dnnlowp_op(op_type, "DNNLOWP", ["x"], ["y"]), {"x": int8(data, shapes(0, 3))}

    return draw


def draw_channel_shuffle(op_type: str):
    """Channels (dim 1, or the last with NHWC) of an Int8 blob, N = 0 too; now and then a group that does not
    divide C, or float data (refused)."""

    def draw(data):
        order = data.draw(st.sampled_from(["NCHW", "NHWC"]))
        groups = data.draw(st.sampled_from([1, 2, 3, 4]))
        per_group = data.draw(st.integers(1, 3))
        channels = groups * per_group + (1 if rarely(data) and groups > 1 else 0)
        n = data.draw(st.integers(0, 2))
        spatial = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
        shape = (n, *spatial, channels) if order == "NHWC" else (n, channels, *spatial)
        args = {"order": order, "group": groups}
        if data.draw(st.booleans()):
            args["kernel"] = 1  # a ConvPoolOpBase argument Caffe2's suite passes; this op reads none
        if data.draw(st.integers(0, 3)) == 3:
            args.update(Y_scale=0.5, Y_zero_point=3)  # ignored: the input's quantization is kept
        x = data.draw(arrays(shape, np.float32, 0.0, 9.0)) if rarely(data) else int8(data, shape)
        return dnnlowp_op(op_type, "DNNLOWP", ["x"], ["y"], **args), {"x": x}

    return draw


def retyped(draw, op_type: str):
    """`draw`'s op as `op_type`: Caffe2 registers the same DNNLOWP class under both keys."""

    def draw_as(data):
        op, inputs = draw(data)
        op.type = op_type
        return op, inputs

    return draw_as


def draw_gather(data):
    """Int8 DATA (rows, whatever `axis`), or float DATA quantized after the float Gather."""
    shape = data.draw(shapes(1, 3))
    indices = data.draw(arrays(shapes(0, 2), data.draw(st.sampled_from([np.int32, np.int64])), 0, shape[0] - 1))
    if data.draw(st.integers(0, 7)) == 7:
        indices = indices.copy().ravel()
        if indices.size:
            indices[0] = shape[0] + data.draw(st.integers(0, 2))  # out of DATA's bounds: refused
    args = {}
    if data.draw(st.booleans()):
        x = data.draw(arrays(shape, np.float32, -4.0, 4.0))
        args = quantization_args(data, "DNNLOWP")
        args.pop("followed_by", None)  # Sigmoid and Tanh fix the quantization; see test_gather_followed_by
        if data.draw(st.integers(0, 3)) == 3:
            args["dequantize_output"] = 1
    else:
        x = int8(data, shape)
    return dnnlowp_op("Int8Gather", "DNNLOWP", ["x", "i"], ["y"], **args), {"x": x, "i": indices}


def int8_or_float(data, shape, low=-4.0, high=4.0):
    """An operand of a DNNLowPOp: an Int8 blob, or float data it quantizes from its min and max."""
    if data.draw(st.booleans()):
        return int8(data, shape)
    return data.draw(arrays(shape, np.float32, low, high))


def output_args(data) -> dict:
    """The output's quantization: static, or from the float op's output; dequantized now and then."""
    args = quantization_args(data, "DNNLOWP")
    if data.draw(st.integers(0, 4)) == 4:
        args["dequantize_output"] = 1
    return args


def draw_mul(data):
    shape = data.draw(shapes(1, 3))
    args = output_args(data)
    b_shape = shape
    if data.draw(st.booleans()):
        args["broadcast"] = 1
        start = data.draw(st.integers(0, len(shape)))
        end = data.draw(st.integers(start, len(shape)))
        b_shape = shape[start:end] or (1,)
        if start != len(shape) - len(b_shape) and b_shape != (1,):
            args["axis"] = start
    elif rarely(data):
        b_shape = (*shape, 2)
    a = int8_or_float(data, shape)
    b = int8_or_float(data, b_shape)
    return dnnlowp_op("Int8Mul", "DNNLOWP", ["a", "b"], ["y"], **args), {"a": a, "b": b}


def draw_elementwise_linear(data):
    shape = data.draw(shapes(1, 3))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = int(np.prod(shape[axis % len(shape) :]))
    args = {"axis": axis, **output_args(data)}
    if data.draw(st.integers(0, 4)) == 4:
        args["preserve_weight_sparsity"] = 1
    x = int8_or_float(data, shape)
    a = data.draw(arrays((d if not rarely(data) else d + 1,), np.float32, -2.0, 2.0))
    b = data.draw(arrays((d,), np.float32, -3.0, 3.0))
    return dnnlowp_op("Int8ElementwiseLinear", "DNNLOWP", ["x", "a", "b"], ["y"], **args), {"x": x, "a": a, "b": b}


def exact_operand(data, shape):
    """An operand whose float products and sums are exact in any order (a power-of-two scale, values on a grid
    of eighths), so the float op's output, which picks the output's parameters, is the same in rnn2jax."""
    if data.draw(st.booleans()):
        values = data.draw(arrays(shape, np.uint8, 0, 255))
        return int8_tensor(values, data.draw(st.sampled_from([2.0**-6, 2.0**-3, 0.5])), data.draw(st.integers(0, 255)))
    return data.draw(arrays(shape, np.int32, -32, 32)).astype(np.float32) / 8


def draw_batch_matmul(data):
    """Batches of matrices, B without A's batch dims, or 1-D operands (broadcast=1). Caffe2's float
    BatchMatMul, which picks the output's parameters, reads past a 1-D operand paired with batched or empty
    matrices (a garbage scale, or SIGFPE): those are not drawn."""
    kind = data.draw(st.sampled_from(["batches", "batches", "b_batch", "a_vector", "b_vector", "vectors"]))
    vector = kind in ("a_vector", "b_vector", "vectors")
    m, k, n = data.draw(st.integers(int(vector), 3)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    trans_a, trans_b = data.draw(st.booleans()), data.draw(st.booleans())
    trans_a = trans_a and kind not in ("b_vector", "vectors")  # a garbage scale from Caffe2 too
    batch = () if vector else tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    a_shape = (*batch, *((k, m) if trans_a else (m, k)))
    b_shape = (*batch, *((n, k) if trans_b else (k, n)))
    args = {"trans_a": int(trans_a), "trans_b": int(trans_b), **output_args(data)}
    if kind != "batches":
        args["broadcast"] = 1
    if kind == "b_batch":
        b_shape = b_shape[len(batch) :]
    if kind in ("a_vector", "vectors"):
        a_shape = (k,)
    if kind in ("b_vector", "vectors"):
        b_shape = (k,)
    if rarely(data):
        b_shape = (*b_shape[:-1], b_shape[-1] + 1)
    a, b = exact_operand(data, a_shape), exact_operand(data, b_shape)
    return dnnlowp_op("Int8BatchMatMul", "DNNLOWP", ["a", "b"], ["y"], **args), {"a": a, "b": b}


def draw_spatial_bn(op_type: str):
    """At most 3 channels: Caffe2's Eigen computes 1/sqrt(var + epsilon) exactly only on its scalar path."""

    def draw(data):
        order = data.draw(st.sampled_from(["NCHW", "NHWC"]))
        c = data.draw(st.integers(1, 3))
        spatial = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
        n = data.draw(st.integers(1, 2))  # N = 0: Caffe2 leaves an Int8 blob the oracle cannot fetch
        shape = (n, *spatial, c) if order == "NHWC" else (n, c, *spatial)
        args = {"order": order, "is_test": 1, **output_args(data)}
        if data.draw(st.booleans()):
            args["epsilon"] = data.draw(st.sampled_from([1e-3, 0.1]))
        if rarely(data):
            args["is_test"] = 0
        x = int8_or_float(data, shape)
        params = {
            "scale": data.draw(arrays((c,), np.float32, -2.0, 2.0)),
            "bias": data.draw(arrays((c,), np.float32, -1.0, 1.0)),
            "mean": data.draw(arrays((c,), np.float32, -1.0, 1.0)),
            "var": data.draw(arrays((c,), np.float32, 0.0, 2.0)),
        }
        names = ["x", *params]
        return dnnlowp_op(op_type, "DNNLOWP", names, ["y"], **args), {"x": x, **params}

    return draw


def draw_lstm_unit(data, op_type: str = "Int8LSTMUnit"):
    """Static output parameters: dynamic ones come from Caffe2's float LSTMUnit (expf), whose last bits rnn2jax's
    exp need not share, and a symmetric range's zero point (127.5) then rounds either way. Caffe2 runs the same
    op for LSTMUnit under engine DNNLOWP."""
    n, d = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    args = {
        "Y_scale": data.draw(st.sampled_from([0.004, 0.01, 0.03])),
        "Y_zero_point": data.draw(st.integers(0, 255)),
        "Y2_scale": data.draw(st.sampled_from([0.01, 0.02, 0.05])),
        "Y2_zero_point": data.draw(st.integers(0, 255)),
    }
    if data.draw(st.booleans()):
        args["forget_bias"] = data.draw(st.sampled_from([0.5, 1.0, -0.7]))
    if data.draw(st.booleans()):
        args["drop_states"] = 1
    if data.draw(st.integers(0, 4)) == 4:
        args["dequantize_output"] = 1
    inputs = {
        "h": int8_or_float(data, (1, n, d), -1.0, 1.0),
        "c": int8_or_float(data, (1, n, d), -2.0, 2.0),
        "g": int8_or_float(data, (1, n, 4 * d), -5.0, 5.0),
        "lengths": data.draw(arrays((n,), np.int32, 0, 3)),
        "t": np.array([data.draw(st.integers(0, 3))], np.int32),
    }
    op = dnnlowp_op(op_type, "DNNLOWP", list(inputs), ["h_out", "c_out"], **args)
    return op, inputs


CASES = cases(
    *(Case(f"Quantize_ENGINE_{e}", draw_quantize(e)) for e in ENGINES),
    *(Case(f"Dequantize_ENGINE_{e}", draw_dequantize("Dequantize", e)) for e in ENGINES),
    Case("Int8DequantizeRowWise_ENGINE_DNNLOWP", draw_dequantize("Int8DequantizeRowWise", "DNNLOWP")),
    *(Case(f"Int8Quantize_ENGINE_{e}", retyped(draw_quantize(e), "Int8Quantize")) for e in ENGINES[:2]),
    *(Case(f"Int8Dequantize_ENGINE_{e}", draw_dequantize("Int8Dequantize", e)) for e in ENGINES[:2]),
    Case("Int8Tanh_ENGINE_DNNLOWP", draw_table("Int8Tanh")),
    Case("Tanh_ENGINE_DNNLOWP", draw_table("Tanh")),
    Case("Int8Sigmoid_ENGINE_DNNLOWP", draw_table("Int8Sigmoid")),
    Case("Sigmoid_ENGINE_DNNLOWP", draw_table("Sigmoid")),
    Case("Int8Relu_ENGINE_DNNLOWP", draw_relu("Int8Relu")),
    Case("Relu_ENGINE_DNNLOWP", draw_relu("Relu")),
    Case("Int8ChannelShuffle_ENGINE_DNNLOWP", draw_channel_shuffle("Int8ChannelShuffle")),
    Case("ChannelShuffle_ENGINE_DNNLOWP", draw_channel_shuffle("ChannelShuffle")),
    Case("Int8Gather_ENGINE_DNNLOWP", draw_gather, jit=False),
    Case("Gather_ENGINE_DNNLOWP", retyped(draw_gather, "Gather"), jit=False),
    Case("Int8Mul_ENGINE_DNNLOWP", draw_mul, jit=False),
    Case("Mul_ENGINE_DNNLOWP", retyped(draw_mul, "Mul"), jit=False),
    Case("Int8ElementwiseLinear_ENGINE_DNNLOWP", draw_elementwise_linear, jit=False),
    Case("ElementwiseLinear_ENGINE_DNNLOWP", retyped(draw_elementwise_linear, "ElementwiseLinear"), jit=False),
    Case("Int8BatchMatMul_ENGINE_DNNLOWP", draw_batch_matmul, jit=False),
    Case("BatchMatMul_ENGINE_DNNLOWP", retyped(draw_batch_matmul, "BatchMatMul"), jit=False),
    Case("Int8SpatialBN_ENGINE_DNNLOWP", draw_spatial_bn("Int8SpatialBN"), jit=False),
    Case("SpatialBN_ENGINE_DNNLOWP", draw_spatial_bn("SpatialBN"), jit=False),
    Case("Int8SpatialBNRelu_ENGINE_DNNLOWP", draw_spatial_bn("Int8SpatialBNRelu"), jit=False),
    Case("Int8LSTMUnit_ENGINE_DNNLOWP", draw_lstm_unit, jit=False),
    Case("LSTMUnit_ENGINE_DNNLOWP", lambda data: draw_lstm_unit(data, "LSTMUnit"), jit=False),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    from differential import run_case

    run_case(caffe2, case, data)


# --------------------------------------------------------------------------------------------------
# Refusals


def test_an_engine_only_type_needs_its_engine(caffe2):
    """Caffe2 registers Quantize only under the DNNLOWP engines: without one it cannot create the op."""
    x = np.array([1.0, -2.0], np.float32)
    for engine in ("", "CUDNN"):
        op = dnnlowp_op("Quantize", engine, ["x"], ["y"])
        assert check_op(caffe2, op, {"x": x}) is None
        with pytest.raises(UnsupportedOpError, match="cannot create operator of type 'Quantize'"):
            run_rnn2jax([op], {"x": x}, ["y"])


def test_refusals_match_caffe2(caffe2):
    x = np.array([1.0, -2.0, 0.5], np.float32)
    q = int8_tensor(np.array([1, 2, 3], np.uint8), 0.5, 3)
    refused = [
        (dnnlowp_op("Quantize", "DNNLOWP", ["x", "s"], ["y"]), {"x": x, "s": np.ones(1, np.float32)}),
        (dnnlowp_op("Quantize", "DNNLOWP", ["x"], ["y"]), {"x": x.astype(np.float64)}),
        (
            dnnlowp_op("Quantize", "DNNLOWP", ["x", "s", "z"], ["y"]),
            {"x": x, "s": np.ones(1, np.float32), "z": np.zeros(1, np.int32)},
        ),
        (dnnlowp_op("Dequantize", "DNNLOWP", ["x"], ["y"]), {"x": x}),
        (dnnlowp_op("Dequantize", "DNNLOWP_16", ["q"], ["y"]), {"q": q}),
    ]
    for op, inputs in refused:
        assert check_op(caffe2, op, inputs) is None
    with pytest.raises(InputTypeError, match="must be an Int8 tensor"):
        run_rnn2jax([dnnlowp_op("Dequantize", "DNNLOWP", ["x"], ["y"])], {"x": x}, ["y"])
    # A histogram-based choice of the weight's parameters (KL divergence, ...) is not ported: refused, not guessed.
    a, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    linear = dnnlowp_op("Int8ElementwiseLinear", "DNNLOWP", ["x", "a", "b"], ["y"], weight_quantization_kind="kl")
    with pytest.raises(Rnn2JaxError, match="weight_quantization_kind 'kl'"):
        run_rnn2jax([linear], {"x": x.reshape(1, 3), "a": a, "b": b}, ["y"], jit=False)


def test_the_activation_kind_plays_no_part(caffe2):
    """Caffe2 chooses activations' parameters from their min and max whatever activation_quantization_kind says."""
    x = np.array([1.0, -2.0, 3.5, 0.3, 7.1], np.float32)
    assert check_op(
        caffe2, dnnlowp_op("Quantize", "DNNLOWP", ["x"], ["y"], activation_quantization_kind="kl"), {"x": x}
    )


def test_dynamic_quantization_needs_the_values(caffe2):
    """A float operand DNNLOWP quantizes from its min and max cannot be traced: rnn2jax names the op and blob
    (Quantize's own input is made static by compile, so it runs jitted)."""
    a = np.array([[1.0, -2.0]], np.float32)
    with pytest.raises(Rnn2JaxError, match=r"Int8Mul.*input 'a' is traced"):
        run_rnn2jax([dnnlowp_op("Int8Mul", "DNNLOWP", ["a", "b"], ["y"])], {"a": a, "b": a}, ["y"])
    assert check_op(caffe2, dnnlowp_op("Quantize", "DNNLOWP", ["a"], ["y"]), {"a": a}) is not None


@given(data=st.data())
def test_a_workspace_runs_dynamic_quantization_eagerly(caffe2, data):
    """Where DNNLOWP chooses parameters from float operands and from the float result (no Y_scale), a workspace
    runs the op outside jitted code (registry `eager`), in a net with jitted ops around it, as Caffe2 computes."""
    n = data.draw(st.integers(1, 4))
    a, b = (data.draw(arrays((1, n), np.float32, -3.0, 3.0)) for _ in range(2))
    ops = [
        make_op("Relu", ["a"], ["ra"]),
        dnnlowp_op("Int8Mul", "DNNLOWP", ["ra", "b"], ["y"]),
        dnnlowp_op("Dequantize", "DNNLOWP", ["y"], ["z"]),
        make_op("Scale", ["z"], ["out"], scale=2.0),
    ]
    host_check_net(caffe2, ops, {"a": a, "b": b}, values_of=["a", "b", "ra", "y", "z", "out"])


def test_an_engine_class_beside_a_plain_type(caffe2):
    """Int8Sigmoid is QNNPACK's op without an engine and DNNLOWP's table under DNNLOWP: two records, each
    matching its Caffe2 class on the same input."""
    x = int8_tensor(np.arange(0, 256, 17, dtype=np.uint8), 0.05, 128)
    plain = make_op("Int8Sigmoid", ["x"], ["y"], Y_scale=1.0 / 256, Y_zero_point=0)
    table = dnnlowp_op("Int8Sigmoid", "DNNLOWP", ["x"], ["y"])
    assert check_op(caffe2, plain, {"x": x}) is not None
    assert check_op(caffe2, table, {"x": x}) is not None
    got = [run_rnn2jax([op], {"x": x}, ["y"])["y"] for op in (plain, table)]
    assert got[0].scale != got[1].scale  # 1/256 against dnnlowp::Sigmoid's 0.5/127


def test_refusals_where_caffe2_breaks():
    """Relu under DNNLOWP crashes Caffe2 on float data (it quantizes, then writes through a tensor it replaced);
    ChannelShuffle's dequantize_output leaves an Int8 blob of no data type. rnn2jax refuses both."""
    x = np.array([[-1.0, 2.0]], np.float32)
    for op_type in ("Relu", "Int8Relu"):
        with pytest.raises(InputTypeError, match="ReluDNNLowPOp crashes on float data"):
            run_rnn2jax([dnnlowp_op(op_type, "DNNLOWP", ["x"], ["y"])], {"x": x}, ["y"])
    q = int8_tensor(np.array([[1, 2]], np.uint8), 0.5, 3)
    shuffle = dnnlowp_op("ChannelShuffle", "DNNLOWP", ["q"], ["y"], group=2, dequantize_output=1)
    with pytest.raises(Rnn2JaxError, match="dequantize_output"):
        run_rnn2jax([shuffle], {"q": q}, ["y"])


def test_an_engine_variant_has_its_records_facets():
    """Roles and codegen read the record that runs the op: LSTMUnit under DNNLOWP reads sequence lengths as
    Int8LSTMUnit does; codegen, which has no DNNLOWP code, refuses Mul under DNNLOWP instead of writing a float
    multiply."""
    from rnn2jax.caffe2.opdef import create_net
    from rnn2jax.ir.netdef import decode_net
    from rnn2jax.ops.roles import integer_blobs, length_blobs
    from rnn2jax.serving.codegen import generate

    ops = [
        dnnlowp_op("LSTMUnit", "DNNLOWP", ["h", "c", "g", "lengths", "t"], ["h2", "c2"]),
        dnnlowp_op("Gather", "DNNLOWP", ["x", "i"], ["y"]),
    ]
    net = decode_net(create_net("n", ops))
    assert length_blobs(net) == {"lengths"} and integer_blobs(net) == {"lengths", "i"}
    mul = create_net("m", [dnnlowp_op("Mul", "DNNLOWP", ["a", "b"], ["y"])], ["a", "b"], ["y"])
    with pytest.raises(UnsupportedOpError, match="no emitter for Mul under engine DNNLOWP"):
        generate(mul, {})
