"""Differential tests of the normalisations (LayerNorm, Dropout, SpatialBN, GroupNorm, InstanceNorm,
AffineChannel, the channel statistics ops, LpNorm, Normalize(L1), RMSNorm, BatchBoxCox) and their gradient
ops against real Caffe2.

Dropout's training mode draws a random mask that cannot match Caffe2's, so training is tested with
ratio 0 (every element kept, deterministic) and the other ratios in test mode (is_test=1).

LayerNorm is drawn on rows of well-spread values and never on rows of 2 elements: LayerNormGradient's
float32 rounding noise is about 1e-7·|dY|/std, not proportional to its output, and where the output
cancels (nearly constant rows, where 1/std reaches 1/sqrt(epsilon); rows of 2, which normalise to ±1
whatever X) Caffe2's own float32 result is off by far more than 1e-5 of the output's scale. Measured
against a float64 evaluation of the same formula: rows of 2 ([[1.212, 0.2428]], axis 0, eps 1e-5):
dX of scale 1.1e-5, Caffe2 error 2.7e-8 (2.4e-3 relative); a constant row in X [2,1,3,2] (axis -2,
eps 1e-5, affine): dgamma of scale 1.8, Caffe2 error 9.2e-5 (5e-5 relative; rnn2jax 4.4e-5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, dims, invalid, run_case, run_rnn2jax, shapes
from rnn2jax.caffe2.opdef import create_operator

# --------------------------------------------------------------------------------------------------
# Dropout


def draw_dropout(data: st.DataObject):
    """is_test=1 with any ratio and the output Y alone (Caffe2 leaves a mask output unwritten, see
    test_dropout_test_mode_leaves_mask_unwritten); is_test=0 with ratio 0 and (Y, mask). Invalid draws:
    no is_test (Caffe2's schema requires it), a ratio outside [0, 1), training without the mask
    output, a double input."""
    dtype = np.int32 if invalid(data) else np.float32  # doubles: see test_layer_norm_double
    x = data.draw(arrays(shapes(0, 4, min_side=0), dtype))
    is_test = data.draw(st.booleans())
    args: dict = {"is_test": int(is_test)}
    outputs = ["Y"] if is_test else ["Y", "mask"]
    if is_test:
        if data.draw(st.booleans()):
            args["ratio"] = data.draw(st.floats(0, 0.9375, width=32, allow_subnormal=False))
    else:
        args["ratio"] = 0.0
    if invalid(data):
        problem = data.draw(st.sampled_from(["no is_test", "ratio", "no mask"]))
        if problem == "no is_test":
            del args["is_test"]
        elif problem == "ratio":
            args["ratio"] = data.draw(st.sampled_from([1.0, 1.5, -0.25]))
        elif not is_test:
            outputs = ["Y"]
    return create_operator("Dropout", ["X"], outputs, **args), {"X": x}


def test_dropout_test_mode_leaves_mask_unwritten(caffe2):
    """With is_test=1 Caffe2 does not write the mask output ("If is_test is nonzero, this output is not
    filled"): the blob exists but holds no tensor. rnn2jax gives an all-true mask there (documented in
    rnn2jax/ops/norm.py); Y agrees."""
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    op = create_operator("Dropout", ["X"], ["Y", "mask"], is_test=1, ratio=0.5)
    assert set(caffe2.run_op(op, {"X": x})) == {"Y"}
    check_op(caffe2, op, {"X": x}, outputs=["Y"])
    assert run_rnn2jax([op], {"X": x}, ["mask"])["mask"].all()


# --------------------------------------------------------------------------------------------------
# LayerNorm


def draw_layer_norm(data: st.DataObject):
    dtype = np.int32 if invalid(data) else np.float32  # doubles: see test_layer_norm_double
    shape = tuple(data.draw(st.lists(dims(0, 4), min_size=2 if not invalid(data) else 1, max_size=4)))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = math.prod(shape[axis:])
    if n == 2:  # see the module docstring
        shape, axis = (*shape, 3), axis - 1 if axis < 0 else axis
        n = 6
    # Rows of well-spread values: `i·0.75` for element i of a row, plus noise in [-0.25, 0.25]
    spread = (np.arange(math.prod(shape)) % max(n, 1)).reshape(shape) * 0.75
    x = (data.draw(arrays(shape, dtype, -0.25, 0.25)) + spread).astype(dtype)
    args: dict = {}
    if axis != 1 or data.draw(st.booleans()):
        args["axis"] = axis
    if data.draw(st.booleans()):
        args["epsilon"] = data.draw(st.sampled_from([1e-5, 1e-4, 1e-3, 0.0625]))
    # Rows of 1 normalise to 0: dgamma is exactly 0, Caffe2's has float32 noise (~3e-8, all of its scale)
    affine = data.draw(st.booleans()) and n != 1
    if affine or data.draw(st.booleans()):
        args["elementwise_affine"] = int(affine)
    inputs = {"X": x}
    if affine:
        param_shape = data.draw(st.sampled_from([shape[axis:], (n,)]))
        if invalid(data) and x.size:  # Caffe2 checks gamma/beta only when X is not empty
            param_shape = (n + 1,)
        inputs["gamma"] = data.draw(arrays(param_shape, dtype, -2, 2))
        inputs["beta"] = data.draw(arrays(param_shape, dtype, -2, 2))
    op = create_operator("LayerNorm", list(inputs), ["Y", "mean", "std"], **args)
    return op, inputs


def draw_c10_layer_norm(data: st.DataObject):
    """Caffe2 1.x registered the c10 LayerNorm kernel under this name as well (schemaless, no gradient)."""
    op, inputs = draw_layer_norm(data)
    op.type = "C10LayerNorm_DontUseThisOpYet"
    return op, inputs


@given(data=st.data())
def test_layer_norm_double(caffe2, data):
    """LayerNorm runs in double in Caffe2 (LayerNormGradient and Dropout do not; rnn2jax accepts doubles
    there on purpose, for its float64 verification mode, rnn2jax/checking/verification.py)."""
    op, inputs = draw_layer_norm(data)
    check_op(caffe2, op, {name: value.astype(np.float64) for name, value in inputs.items()})


# --------------------------------------------------------------------------------------------------
# Channel-wise normalisations. Values are spread within every normalised group (the golden-ratio
# sequence over the flat index, plus noise): Caffe2's math::Moments is one-pass (E[x²] - mean²) for
# several layouts, rnn2jax's two-pass, and the two agree only where a group's variance is not tiny
# against its mean square. Groups hold at least 3 values: on groups of 1 or 2 the input gradient is 0
# (or cancels) and Caffe2's fused float32 formula leaves rounding noise of the size of 1/sqrt(epsilon).


def flushed(x: np.ndarray) -> np.ndarray:
    """`x` with values whose squares or products would be subnormal set to 0: XLA flushes subnormal
    results to 0 (Caffe2 does not), so `sqrt(Σx²)` of values near 1e-38 differs by a factor of 1e19."""
    if x.dtype.kind == "f":
        x[np.abs(x) < np.sqrt(np.finfo(x.dtype).tiny)] = 0
    return x


def spread(data: st.DataObject, shape, dtype=np.float32, scale: float = 1.0):
    index = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    base = (np.modf(index * 0.6180339887498949)[0] * 2 - 1) * scale
    return (base + data.draw(arrays(tuple(shape), np.float64, -0.05, 0.05))).astype(dtype)


def _layout(data: st.DataObject, n: int, c: int, spatial: list[int]):
    """(order args, NCHW?, X shape) for N, C and spatial dims, in a drawn order."""
    order = data.draw(st.sampled_from([None, "NCHW", "NHWC"]))
    args = {} if order is None else {"order": order}
    nchw = order != "NHWC"
    return args, nchw, (n, c, *spatial) if nchw else (n, *spatial, c)


def _bad_dtype(data: st.DataObject):
    return np.float64 if invalid(data) else np.float32


def draw_spatial_bn(data: st.DataObject):
    """Test mode (is_test=1, Y only) or training (the running statistics in place, the saved ones as
    outputs 3 and 4), NCHW or NHWC, sometimes `num_batches` > 1 with consistent batch sums. Invalid
    draws: no is_test, a double X, scale of the wrong size, epsilon 0, momentum outside [0, 1], running
    statistics not in place."""
    n, c = data.draw(dims(0, 3)), data.draw(dims(1, 3))
    spatial = [data.draw(dims(1, 3)) for _ in range(data.draw(st.integers(0, 2)))]
    if n * math.prod(spatial) < 3 and n:  # see above: at least 3 values per channel
        n = 3
    args, _nchw, shape = _layout(data, n, c, spatial)
    is_test = data.draw(st.booleans())
    args["is_test"] = int(is_test)
    if data.draw(st.booleans()):
        args["epsilon"] = data.draw(st.sampled_from([1e-5, 1e-3, 0.25]))
    if data.draw(st.booleans()):
        args["momentum"] = data.draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    inputs = {
        "X": spread(data, shape, _bad_dtype(data)),
        "scale": flushed(data.draw(arrays((c + (1 if invalid(data) else 0),), np.float32, -2, 2))),
        "bias": flushed(data.draw(arrays((c,), np.float32, -2, 2))),
        "mean": data.draw(arrays((c,), np.float32, -1, 1)),
        "var": data.draw(arrays((c,), np.float32, 0.125, 2)),
    }
    outputs = ["Y"] if is_test else ["Y", "mean", "var", "saved_mean", "saved_inv_std"]
    if not is_test and data.draw(st.integers(0, 5)) == 0:  # the deprecated restart of the running stats
        inputs["mean"] = np.zeros((c + 1,), np.float32)
    if not is_test and data.draw(st.integers(0, 3)) == 0:
        args["num_batches"] = data.draw(st.integers(2, 3))
        count = args["num_batches"] * max(n * math.prod(spatial), 1)
        batch_mean = data.draw(arrays((c,), np.float32, -1, 1))
        inputs["mean_sum"] = (batch_mean * count).astype(np.float32)
        inputs["var_sum"] = ((data.draw(arrays((c,), np.float32, 0.25, 1)) + batch_mean**2) * count).astype(np.float32)
    if invalid(data):
        problem = data.draw(st.sampled_from(["is_test", "epsilon", "momentum", "inplace"]))
        if problem == "is_test":
            del args["is_test"]
        elif problem == "epsilon":
            args["epsilon"] = 0.0
        elif problem == "momentum":
            args["momentum"] = 1.5
        elif not is_test:
            outputs[1] = "new_mean"
    return create_operator("SpatialBN", list(inputs), outputs, **args), inputs


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_gradient_multi_batch(caffe2, order):
    """With num_batches > 1 the maker feeds the gradient sums back in as inputs 5 and 6 (GI(1), GI(2)),
    which do not exist in a single differential run: the 7-input SpatialBNGradient is checked on its own."""
    rng = np.random.default_rng(5)
    shape = (3, 2, 4) if order == "NCHW" else (3, 4, 2)
    inputs = {
        "X": rng.standard_normal(shape).astype(np.float32),
        "scale": rng.standard_normal(2).astype(np.float32),
        "dY": rng.standard_normal(shape).astype(np.float32),
        "mean": rng.standard_normal(2).astype(np.float32),
        "rstd": (rng.random(2) + 0.5).astype(np.float32),
        "dscale_sum": rng.standard_normal(2).astype(np.float32),
        "dbias_sum": rng.standard_normal(2).astype(np.float32),
    }
    op = create_operator(
        "SpatialBNGradient", list(inputs), ["dX", "dscale", "dbias"], num_batches=3, order=order, is_test=0
    )
    assert check_op(caffe2, op, inputs) is not None


def _group_shape(data: st.DataObject, groups: int, per_group: int):
    """N, C = groups·per_group and spatial dims with at least 3 values per normalised group."""
    n = data.draw(dims(1, 2))
    spatial = [data.draw(dims(1, 3)) for _ in range(data.draw(st.integers(0, 2)))]
    while per_group * math.prod(spatial) < 3:
        spatial.append(3)
    return n, groups * per_group, spatial


def draw_group_norm(data: st.DataObject):
    """Y alone (is_test=1, the default) or (Y, mu, rsig). Invalid draws: a group count that does not
    divide C (or the default 32), gamma of the wrong size, a double X, is_test=0 with Y alone."""
    groups, k = data.draw(dims(1, 3)), data.draw(dims(1, 3))
    n, c, spatial = _group_shape(data, groups, k)
    args, _nchw, shape = _layout(data, n, c, spatial)
    args["group"] = groups
    if invalid(data):
        args["group"] = data.draw(st.sampled_from([c + 1, 32]))
        if args["group"] == 32:
            del args["group"]
    if data.draw(st.booleans()):
        args["epsilon"] = data.draw(st.sampled_from([1e-5, 1e-3, 0.25]))
    outputs = data.draw(st.sampled_from([["Y"], ["Y", "mu", "rsig"]]))
    if data.draw(st.booleans()):
        args["is_test"] = int(len(outputs) == 1 or data.draw(st.booleans()))
        if invalid(data):
            args["is_test"], outputs = 0, ["Y"]
    inputs = {
        "X": spread(data, shape, _bad_dtype(data)),
        "gamma": flushed(data.draw(arrays((c + (1 if invalid(data) else 0),), np.float32, -2, 2))),
        "beta": flushed(data.draw(arrays((c,), np.float32, -2, 2))),
    }
    return create_operator("GroupNorm", list(inputs), outputs, **args), inputs


def draw_instance_norm(data: st.DataObject):
    """Y with 0 to 2 of the statistics outputs. Invalid draws: scale of the wrong size, a double X,
    a negative epsilon."""
    n, c, spatial = _group_shape(data, data.draw(dims(1, 3)), 1)
    args, _nchw, shape = _layout(data, n, c, spatial)
    if data.draw(st.booleans()):
        args["epsilon"] = data.draw(st.sampled_from([1e-5, 1e-3, 0.25]))
    if invalid(data):
        args["epsilon"] = -1.0
    outputs = ["Y", "mean", "rstd"][: data.draw(st.integers(1, 3))]
    inputs = {
        "X": spread(data, shape, _bad_dtype(data)),
        "scale": flushed(data.draw(arrays((c + (1 if invalid(data) else 0),), np.float32, -2, 2))),
        "bias": flushed(data.draw(arrays((c,), np.float32, -2, 2))),
    }
    return create_operator("InstanceNorm", list(inputs), outputs, **args), inputs


def _channels_shape(data: st.DataObject, min_spatial: int = 0, max_spatial: int = 2, min_side: int = 0):
    n, c = data.draw(dims(1, 3)), data.draw(dims(1, 3))
    spatial = [data.draw(dims(min_side, 3)) for _ in range(data.draw(st.integers(min_spatial, max_spatial)))]
    return n, c, spatial


def draw_affine_channel(data: st.DataObject):
    """Any values (no statistics); N and C of at least 1 (Caffe2 divides by N·C); scale and bias of C
    values (Caffe2 reads past short ones). Invalid draws: a double X, an unknown order."""
    args, nchw, shape = _layout(data, *_channels_shape(data))
    if data.draw(st.booleans()):
        args["is_learnable"] = int(data.draw(st.booleans()))
    if invalid(data):
        args["order"] = "HWCN"
    c = shape[1] if nchw else shape[-1]
    inputs = {
        "X": flushed(data.draw(arrays(shape, _bad_dtype(data)))),
        "scale": flushed(data.draw(arrays((c,), np.float32, -2, 2))),
        "bias": flushed(data.draw(arrays((c,), np.float32, -2, 2))),
    }
    return create_operator("AffineChannel", list(inputs), ["Y"], **args), inputs


def draw_channel_stats(data: st.DataObject):
    """Spatial sides of at least 1: Caffe2 crashes (SIGSEGV) on NHWC X without spatial positions."""
    args, _nchw, shape = _layout(data, *_channels_shape(data, min_side=1))
    return create_operator("ChannelStats", ["X"], ["sum", "sumsq"], **args), {
        "X": flushed(data.draw(arrays(shape, _bad_dtype(data))))
    }


def draw_channel_backprop_stats(data: st.DataObject):
    """NCHW X of rank 3 to 5 (rank 2 is an invalid draw), mean and inv_std of C values, dY like X
    (Caffe2 checks none of these sizes and reads past short ones, so they are never drawn wrong)."""
    n, c, spatial = _channels_shape(data, 1, 3)
    if invalid(data):
        spatial = []
    shape = (n, c, *spatial)
    inputs = {
        "X": flushed(data.draw(arrays(shape, _bad_dtype(data)))),
        "mean": data.draw(arrays((c,), np.float32)),
        "inv_std": data.draw(arrays((c,), np.float32, 0.5, 2)),
        "dY": flushed(data.draw(arrays(shape, np.float32))),
    }
    return create_operator("ChannelBackpropStats", list(inputs), ["dscale", "dbias"]), inputs


def draw_lp_norm(data: st.DataObject):
    """p 1 or 2, average or not. Invalid draws: p = 3, a double X, average of an empty X."""
    args = {}
    if data.draw(st.booleans()):
        args["p"] = 3 if invalid(data) else data.draw(st.sampled_from([1, 2]))
    if data.draw(st.booleans()):
        args["average"] = int(data.draw(st.booleans()))
    shape = data.draw(shapes(0, 3, min_side=0 if invalid(data) else 1, max_side=4))
    return create_operator("LpNorm", ["X"], ["Y"], **args), {"X": flushed(data.draw(arrays(shape, _bad_dtype(data))))}


def draw_normalize(op_type):
    """Any axis with at least two elements along it (Caffe2 divides by that size; see the comment for
    why not one). NormalizeL1's values
    stay away from 0 (an all-zero slice leaves Caffe2's output unwritten). Invalid draws: an axis out of
    range, a double X."""

    def draw(data: st.DataObject):
        shape = list(data.draw(shapes(1, 4, min_side=1, max_side=4)))
        args = {}
        axis = -1
        if data.draw(st.booleans()):
            axis = args["axis"] = data.draw(st.integers(-len(shape), len(shape) - 1))
        shape[axis] = max(shape[axis], 2)  # slices of 1 normalise to ±1: dX is 0 up to Caffe2's rounding
        shape = tuple(shape)
        if invalid(data):
            args["axis"] = len(shape)
        x = flushed(data.draw(arrays(shape, _bad_dtype(data))))
        if op_type == "NormalizeL1":
            x = (np.where(x < 0, -1, 1) * (np.abs(x) + 0.125)).astype(x.dtype)
        return create_operator(op_type, ["X"], ["Y"], **args), {"X": x}

    return draw


def draw_rms_norm(data: st.DataObject):
    """Rank >= 2, rows of at least 2 nonzero spread values, float or double; `eps` (the argument the
    C++ reads) or `epsilon` (documented, ignored). Invalid draws: rank 1, gamma of the wrong size."""
    shape = [data.draw(dims(0, 3)) for _ in range(data.draw(st.integers(1 if invalid(data) else 2, 4)))]
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = axis % len(shape)
    if math.prod(shape[k:]) < 2:
        shape[k:] = [max(d, 1) for d in shape[k:]]
        shape[-1] = max(shape[-1], 2)
    n = math.prod(shape[k:])
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    args = {}
    if axis != 1 or data.draw(st.booleans()):
        args["axis"] = axis
    if data.draw(st.booleans()):
        args[data.draw(st.sampled_from(["eps", "epsilon"]))] = data.draw(st.sampled_from([0.0, 1e-5, 0.25]))
    param_shape = data.draw(st.sampled_from([tuple(shape[k:]), (n,)]))
    if invalid(data):
        param_shape = (n + 1,)
    inputs = {
        "X": spread(data, tuple(shape), dtype),
        "gamma": flushed(data.draw(arrays(param_shape, dtype, -2, 2))),
        "beta": flushed(data.draw(arrays(param_shape, dtype, -2, 2))),
    }
    return create_operator("RMSNorm", list(inputs), ["Y", "rrms"], **args), inputs


def draw_batch_box_cox(data: st.DataObject):
    """Float or double data of rank >= 1, lambda1 from {0, ±0.5, 1, 2} per column, lambda2 in [0, 0.5];
    `x + lambda2` stays away from 1, where `(t^lambda1 - 1)/lambda1` cancels and float32 pow's last
    bit decides the result. Invalid draws: lambdas of the wrong size or type."""
    shape = data.draw(shapes(1, 3, min_side=0, max_side=4))
    d = math.prod(shape[1:])
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    lambda2 = data.draw(arrays((d,), dtype, 0, 0.5))
    t = data.draw(arrays(shape, dtype, 1.5, 4)) * np.where(data.draw(arrays(shape, np.bool_)), 1, 0.125)
    inputs = {
        "data": (t.reshape(-1, d) - lambda2).reshape(shape).astype(dtype) if d else t,
        "lambda1": np.asarray(
            data.draw(st.lists(st.sampled_from([0, 0.5, -0.5, 1, 2]), min_size=d, max_size=d)), dtype
        ),
        "lambda2": lambda2,
    }
    if invalid(data):
        name = data.draw(st.sampled_from(["lambda1", "lambda2"]))
        inputs[name] = data.draw(st.sampled_from([np.append(inputs[name], 1), inputs[name].astype(np.int32)]))
    return create_operator("BatchBoxCox", list(inputs), ["Y"]), inputs


CASES = cases(
    Case("Dropout", draw_dropout, gradient_ops=("DropoutGrad",)),
    Case("LayerNorm", draw_layer_norm, gradient_ops=("LayerNormGradient",)),
    Case("C10LayerNorm_DontUseThisOpYet", draw_c10_layer_norm),
    Case("SpatialBN", draw_spatial_bn, gradient_ops=("SpatialBNGradient",)),
    Case("GroupNorm", draw_group_norm, gradient_ops=("GroupNormGradient",)),
    Case("InstanceNorm", draw_instance_norm, gradient_ops=("InstanceNormGradient",)),
    Case("AffineChannel", draw_affine_channel, gradient_ops=("AffineChannelGradient",)),
    Case("ChannelStats", draw_channel_stats),
    Case("ChannelBackpropStats", draw_channel_backprop_stats),
    Case("LpNorm", draw_lp_norm, gradient_ops=("LpNormGradient",)),
    Case("Normalize", draw_normalize("Normalize"), gradient_ops=("NormalizeGradient",)),
    Case("NormalizeL1", draw_normalize("NormalizeL1")),
    Case("RMSNorm", draw_rms_norm, gradient_ops=("RMSNormGradient",)),
    Case("BatchBoxCox", draw_batch_box_cox),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_norm(caffe2, case, data):
    run_case(caffe2, case, data)
