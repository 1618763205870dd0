"""The norm family (rnn2jax/ops/norm.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: LayerNorm, Dropout and the channel-wise normalisations against NumPy
references written from Caffe2's documented semantics and kernels.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the normalisations
(LayerNorm, Dropout, SpatialBN, GroupNorm, InstanceNorm, AffineChannel, the channel statistics ops, LpNorm,
Normalize(L1), RMSNorm, BatchBoxCox) and their gradient ops against real Caffe2.

Dropout's training mode draws a random mask that cannot match Caffe2's, so training is tested with ratio 0 (every
element kept, deterministic) and the other ratios in test mode (is_test=1).

LayerNorm is drawn on rows of well-spread values and never on rows of 2 elements: LayerNormGradient's float32
rounding noise is about 1e-7·|dY|/std, not proportional to its output, and where the output cancels (nearly constant
rows, where 1/std reaches 1/sqrt(epsilon); rows of 2, which normalise to ±1 whatever X) Caffe2's own float32 result
is off by far more than 1e-5 of the output's scale. Measured against a float64 evaluation of the same formula: rows
of 2 ([[1.212, 0.2428]], axis 0, eps 1e-5): dX of scale 1.1e-5, Caffe2 error 2.7e-8 (2.4e-3 relative); a constant
row in X [2,1,3,2] (axis -2, eps 1e-5, affine): dgamma of scale 1.8, Caffe2 error 9.2e-5 (5e-5 relative; rnn2jax
4.4e-5).

Gradient ops against references and jax.vjp: LayerNormGradient and DropoutGrad against NumPy references written from
Caffe2's kernels (caffe2/operators/layer_norm_op.{h,cc}, dropout_op.{h,cc}) and against `jax.vjp` of the forward op.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, cases, check_op, dims, invalid, run_case, run_rnn2jax, shapes
from helpers import forward, run_op
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.errors import BadArgumentError, ShapeError

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_norm.py)

RTOL, ATOL = 1e-5, 1e-6
F32_EPS = float(np.finfo(np.float32).eps)


def _layer_norm(x, axis, eps, gamma=None, beta=None):
    """Rows = prod(dims[:axis]); biased variance; std = sqrt(var + eps); stats shaped dims[:axis] + [1]."""
    k = axis % x.ndim
    rows = x.astype(np.float64).reshape(int(np.prod(x.shape[:k])), -1)
    mean = rows.mean(axis=1, keepdims=True)
    std = np.sqrt(((rows - mean) ** 2).mean(axis=1, keepdims=True) + eps)
    y = (rows - mean) / std
    if gamma is not None:
        y = y * gamma.reshape(-1) + beta.reshape(-1)
    stat_shape = (*x.shape[:k], 1)
    return y.reshape(x.shape), mean.reshape(stat_shape), std.reshape(stat_shape)


def _check_layer_norm(outs, expected, x, gamma=None):
    y, mean, std = outs
    ey, emean, estd = expected
    assert y.shape == ey.shape and mean.shape == emean.shape and std.shape == estd.shape
    assert y.dtype == mean.dtype == std.dtype == np.float32
    np.testing.assert_allclose(mean, emean, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(std, estd, rtol=RTOL, atol=ATOL)
    # Y = (x - mean) / std: float32 rounding of the mean (up to n ulps of max|x| for a sum of n terms)
    # is divided by std, which can be as small as sqrt(eps) for a constant row. Bound that per row.
    rows = x.reshape(emean.size, -1)
    n = rows.shape[1]
    slack = n * F32_EPS * np.abs(rows).max(axis=1, keepdims=True) / estd.reshape(-1, 1)
    if gamma is not None:
        slack = slack * max(1.0, float(np.abs(gamma).max()))
    err = np.abs(y.reshape(rows.shape) - ey.reshape(rows.shape))
    assert np.all(err <= RTOL * np.abs(ey.reshape(rows.shape)) + ATOL + slack), err.max()


def _ln_input(min_side: int = 1):
    return hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=2, max_dims=4, min_side=min_side, max_side=4),
        elements=st.floats(-10, 10, width=32),
    )


@given(data=st.data())
def test_layer_norm(jit, data):
    x = data.draw(_ln_input(), label="x")
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    eps = data.draw(st.sampled_from([1e-5, 1e-4, 1e-2]), label="epsilon")
    outs = run_op("LayerNorm", [x], 3, jit=jit, axis=axis, epsilon=eps)
    _check_layer_norm(outs, _layer_norm(x, axis, np.float32(eps)), x)


@given(data=st.data())
def test_layer_norm_affine(jit, data):
    x = data.draw(_ln_input(), label="x")
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    block = x.shape[axis % x.ndim :]
    params = hnp.arrays(np.float32, block, elements=st.floats(-3, 3, width=32))
    gamma, beta = data.draw(params, label="gamma"), data.draw(params, label="beta")
    outs = run_op("LayerNorm", [x, gamma, beta], 3, jit=jit, axis=axis, elementwise_affine=1)
    _check_layer_norm(outs, _layer_norm(x, axis, np.float32(1e-5), gamma, beta), x, gamma)


def test_layer_norm_defaults(jit):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) ** 1.5
    outs = run_op("LayerNorm", [x], 3, jit=jit)
    assert outs[1].shape == (2, 1)
    _check_layer_norm(outs, _layer_norm(x, 1, np.float32(1e-5)), x)


def test_layer_norm_affine_flat_params_and_extra_inputs_ignored(jit):
    x = np.linspace(-2, 3, 2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    gamma = np.linspace(0.5, 2, 12, dtype=np.float32)
    beta = np.linspace(-1, 1, 12, dtype=np.float32)
    outs = run_op("LayerNorm", [x, gamma, beta], 3, jit=jit, elementwise_affine=1)
    _check_layer_norm(outs, _layer_norm(x, 1, np.float32(1e-5), gamma, beta), x, gamma)
    # Without elementwise_affine Caffe2 does not read gamma and beta.
    outs = run_op("LayerNorm", [x, gamma, beta], 3, jit=jit)
    _check_layer_norm(outs, _layer_norm(x, 1, np.float32(1e-5)), x)


def test_layer_norm_errors(jit):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="rank >= 2"):
        run_op("LayerNorm", [np.ones(3, np.float32)], 3, jit=jit)
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        run_op("LayerNorm", [x], 3, jit=jit, axis=2)
    with pytest.raises(BadArgumentError, match="elementwise_affine"):
        run_op("LayerNorm", [x], 3, jit=jit, elementwise_affine=1)
    with pytest.raises(ShapeError, match="gamma 'x1' has 2 elements"):
        run_op("LayerNorm", [x, np.ones(2, np.float32), np.ones(3, np.float32)], 3, jit=jit, elementwise_affine=1)
    with pytest.raises(BadArgumentError, match="'epsilon'"):
        run_op("LayerNorm", [x], 3, jit=jit, epsilon="small")
    with pytest.raises(BadArgumentError, match="takes 3 outputs"):
        run_op("LayerNorm", [x], 1, jit=jit)
    with pytest.raises(ShapeError, match="float input 'x0'"):
        run_op("LayerNorm", [np.ones((2, 3), np.int32)], 3, jit=jit)


# ---------------------------------------------------------------------------------------------------
# Dropout


@given(
    x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), elements=st.floats(-5, 5)),
    ratio=st.floats(0, 0.99),
)
def test_dropout_test_mode(jit, x, ratio):
    y, mask = run_op("Dropout", [x], 2, jit=jit, ratio=ratio, is_test=1)
    np.testing.assert_array_equal(y, x)
    assert y.dtype == np.float32
    assert mask.dtype == np.bool_ and mask.shape == x.shape and mask.all()


def test_dropout_test_mode_single_output(jit):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run_op("Dropout", [x], 1, jit=jit, is_test=1)
    np.testing.assert_array_equal(y, x)


LARGE = np.random.default_rng(0).standard_normal((100, 200)).astype(np.float32)


def _check_training(y, mask, x, ratio):
    """mask ~ Bernoulli(1 - ratio); Y = X * float(1 / (1 - ratio)) * mask, exactly (Caffe2's formula).
    `ratio` travels in the Argument's float32 field `f`, so the scale is computed from that value."""
    ratio = float(np.float32(ratio))
    assert mask.dtype == np.bool_ and mask.shape == x.shape and y.shape == x.shape
    # 20000 draws: the standard error of the mean is at most 0.0036; allow about 5.5 of them.
    assert abs(mask.mean() - (1 - ratio)) < 0.02
    scale = np.float32(1.0 / (1.0 - ratio))
    np.testing.assert_array_equal(y, x * scale * mask.astype(np.float32))


@settings(max_examples=6)  # each example compiles a 20000-element PRNG draw; each checks 20000 draws
@given(ratio=st.floats(0, 0.9), seed=st.integers(0, 2**31 - 1))
def test_dropout_training(jit, ratio, seed):
    y, mask = run_op("Dropout", [LARGE], 2, jit=jit, is_test=0, ratio=ratio, key=jax.random.key(seed))
    _check_training(y, mask, LARGE, ratio)


def test_dropout_training_defaults(jit):
    y, mask = run_op("Dropout", [LARGE], 2, jit=jit, is_test=0)
    _check_training(y, mask, LARGE, 0.5)


def test_dropout_key_decides_mask(jit):
    x = LARGE[:10]
    a = run_op("Dropout", [x], 2, jit=jit, is_test=0, key=jax.random.key(1))
    b = run_op("Dropout", [x], 2, jit=jit, is_test=0, key=jax.random.key(1))
    c = run_op("Dropout", [x], 2, jit=jit, is_test=0, key=jax.random.key(2))
    np.testing.assert_array_equal(a[1], b[1])
    assert (a[1] != c[1]).any()


def test_dropout_ratio_zero_keeps_everything(jit):
    y, mask = run_op("Dropout", [LARGE], 2, jit=jit, is_test=0, ratio=0.0)
    assert mask.all()
    np.testing.assert_array_equal(y, LARGE)


def test_dropout_errors(jit):
    x = np.ones((2, 2), np.float32)
    # Caffe2's DropoutOp constructor enforces 0 <= ratio < 1.
    for ratio in (1.0, 1.5, -0.1):
        with pytest.raises(BadArgumentError, match="'ratio'"):
            run_op("Dropout", [x], 2, jit=jit, is_test=0, ratio=ratio)
    with pytest.raises(BadArgumentError, match="'is_test'"):
        run_op("Dropout", [x], 2, jit=jit, is_test="yes")
    with pytest.raises(BadArgumentError, match="1 to 2 outputs"):
        run_op("Dropout", [x], 3, jit=jit, is_test=0)
    with pytest.raises(ShapeError, match="float input 'x0'"):
        run_op("Dropout", [np.ones((2, 2), np.int32)], 2, jit=jit, is_test=0)


# ---------------------------------------------------------------------------------------------------
# Channel-wise normalisations against NumPy (float64) references written from Caffe2's kernels


def _channels_last(x, nchw):
    """X as [C, N·HxW] in float64."""
    c = x.shape[1] if nchw else x.shape[-1]
    moved = np.moveaxis(x, 1 if nchw else -1, 0)
    return moved.reshape(c, -1).astype(np.float64)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_training_reference(jit, order):
    rng = np.random.default_rng(3)
    nchw = order == "NCHW"
    x = rng.standard_normal((3, 2, 4, 2) if nchw else (3, 4, 2, 2)).astype(np.float32)
    scale, bias = rng.standard_normal(2).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    running_mean, running_var = rng.standard_normal(2).astype(np.float32), np.float32([0.5, 2.0])
    fn = forward(
        "SpatialBN",
        5,
        5,
        input_names=["X", "s", "b", "rm", "rv"],
        output_names=["Y", "rm", "rv", "sm", "siv"],
        is_test=0,
        order=order,
        momentum=0.75,
        epsilon=1e-3,
    )
    y, rm, rv, sm, siv = (
        np.asarray(o) for o in (jax.jit(fn) if jit else fn)(x, scale, bias, running_mean, running_var)
    )
    cols = _channels_last(x, nchw)
    mean, var = cols.mean(axis=1), cols.var(axis=1)
    n = cols.shape[1]
    np.testing.assert_allclose(sm, mean, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(siv, 1 / np.sqrt(var + 1e-3), rtol=RTOL)
    np.testing.assert_allclose(rm, 0.75 * running_mean + 0.25 * mean, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rv, 0.75 * running_var + 0.25 * var * n / (n - 1), rtol=RTOL)
    shape = (1, 2, 1, 1) if nchw else (1, 1, 1, 2)
    expected = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-3) * scale.reshape(shape) + bias.reshape(
        shape
    )
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)


def test_spatial_bn_single_value_makes_running_var_nan(jit):
    """One value per channel: Caffe2's unbiasing factor n/(n-1) is infinite, times a variance of 0."""
    x = np.float32([[1.5, -2.0]])
    fn = forward(
        "SpatialBN",
        5,
        5,
        input_names=["X", "s", "b", "rm", "rv"],
        output_names=["Y", "rm", "rv", "sm", "siv"],
        is_test=0,
    )
    ones = np.ones(2, np.float32)
    _, rm, rv, sm, _ = (np.asarray(o) for o in (jax.jit(fn) if jit else fn)(x, ones, ones, ones, ones))
    assert np.isnan(rv).all()
    np.testing.assert_allclose(rm, 0.9 + 0.1 * x[0], rtol=RTOL)
    np.testing.assert_array_equal(sm, x[0])


def test_spatial_bn_refuses_running_stats_not_in_place():
    with pytest.raises(BadArgumentError, match="in place"):
        forward("SpatialBN", 5, 5, is_test=0)  # outputs y1, y2 are not the inputs x3, x4


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_group_norm_reference(jit, order):
    rng = np.random.default_rng(4)
    nchw = order == "NCHW"
    x = rng.standard_normal((2, 6, 3) if nchw else (2, 3, 6)).astype(np.float32)
    gamma, beta = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    y, mu, rsig = run_op("GroupNorm", [x, gamma, beta], 3, jit=jit, group=3, order=order, epsilon=1e-4)
    grouped = (x if nchw else x.transpose(0, 2, 1)).astype(np.float64).reshape(2, 3, 2 * 3)
    e_mu, e_var = grouped.mean(axis=2), grouped.var(axis=2)
    np.testing.assert_allclose(mu, e_mu, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rsig, 1 / np.sqrt(e_var + 1e-4), rtol=RTOL)
    normed = ((grouped - e_mu[..., None]) / np.sqrt(e_var[..., None] + 1e-4)).reshape(2, 6, 3)
    expected = normed * gamma[:, None] + beta[:, None]
    np.testing.assert_allclose(y, expected if nchw else expected.transpose(0, 2, 1), rtol=RTOL, atol=ATOL)


def test_batch_box_cox_reference(jit):
    x = np.float32([[0.5, 2.0, 3.0, -1.0], [1.5, 0.25, 4.0, -2.0]])
    lambda1, lambda2 = np.float32([0.0, 0.5, 2.0, 1.0]), np.float32([0.0, 0.5, 0.0, 0.5])
    (y,) = run_op("BatchBoxCox", [x, lambda1, lambda2], jit=jit)
    t = np.maximum(x.astype(np.float64) + lambda2, 1e-6)
    safe = np.where(lambda1 == 0, 1, lambda1)
    expected = np.where(lambda1 == 0, np.log(t), (t**safe - 1) / safe)
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)


def test_rms_norm_reads_eps_not_epsilon(jit):
    """The C++ reads `eps` (default 0); the schema's documented `epsilon` is ignored."""
    x = np.float32([[3.0, 4.0]])
    ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
    _, rrms = run_op("RMSNorm", [x, ones, zeros], 2, jit=jit, epsilon=100.0)
    np.testing.assert_allclose(rrms, [1 / np.sqrt(12.5)], rtol=RTOL)
    _, rrms = run_op("RMSNorm", [x, ones, zeros], 2, jit=jit, eps=87.5)
    np.testing.assert_allclose(rrms, [0.1], rtol=RTOL)


def test_normalize_l1_zero_slice_is_zero(jit):
    """Caffe2 leaves the output of an all-zero slice unwritten; rnn2jax gives 0 there."""
    x = np.float32([[0.0, 0.0], [1.0, -3.0]])
    (y,) = run_op("NormalizeL1", [x], jit=jit)
    np.testing.assert_allclose(y, [[0, 0], [0.25, -0.75]], rtol=RTOL)


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_norm.py)

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


# ----------------------------------------------------------------------------------------------------
# Gradient ops against references and jax.vjp (was tests/ops/test_norm.py)

RTOL_GRAD, ATOL_GRAD = 1e-5, 1e-6


def floats(shape, bound: float):
    return hnp.arrays(np.float32, shape, elements=st.floats(-bound, bound, width=32, allow_subnormal=False))


# ---------------------------------------------------------------------------------------------------
# LayerNormGradient


@st.composite
def layer_norm_case(draw, affine: bool):
    """(x, axis, dy[, gamma, beta]). Each row gets a ramp 0, 3, 6, ... plus noise in [-1, 1], so no
    row is nearly constant: there 1/std reaches 1/sqrt(eps) and any float32 formula is noise-bound."""
    shape = draw(hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=3), label="shape")
    axis = draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    k = axis % len(shape)
    m, n = int(np.prod(shape[:k])), int(np.prod(shape[k:]))
    noise = draw(floats((m, n), 1.0), label="noise")
    x = (noise + 3 * np.arange(n, dtype=np.float32)).reshape(shape)
    dy = draw(floats(shape, 5.0), label="dy")
    if not affine:
        return x, axis, dy
    gamma = draw(floats(shape[k:], 3.0), label="gamma")
    beta = draw(floats(shape[k:], 3.0), label="beta")
    return x, axis, dy, gamma, beta


def _layer_norm_grad(x, dy, axis, mean, std, gamma=None):
    """The textbook LN backward in float64, from the saved mean/std: xhat = (x - mean)/std, g = dY*gamma,
    dX = (g - mean(g) - xhat*mean(g*xhat))/std, dgamma = sum_rows dY*xhat, dbeta = sum_rows dY."""
    k = axis % x.ndim
    m = int(np.prod(x.shape[:k]))
    x64, dy64 = x.astype(np.float64).reshape(m, -1), dy.astype(np.float64).reshape(m, -1)
    mean, std = mean.astype(np.float64).reshape(m, 1), std.astype(np.float64).reshape(m, 1)
    xhat = (x64 - mean) / std
    g = dy64 if gamma is None else dy64 * gamma.astype(np.float64).reshape(-1)
    dx = (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True)) / std
    return dx.reshape(x.shape), (dy64 * xhat).sum(axis=0), dy64.sum(axis=0)


def _ln_close(actual, expected, dy, gamma=None):
    """dX cancels terms of size |g|/std (std >= ~0.5 here): absolute error scales with max|g|."""
    scale = float(np.abs(dy).max()) * (1.0 if gamma is None else max(1.0, float(np.abs(gamma).max())))
    assert actual.shape == np.shape(expected) and actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=RTOL_GRAD, atol=ATOL_GRAD * max(1.0, scale) * 10)


@given(case=layer_norm_case(affine=False), eps=st.sampled_from([1e-5, 1e-3]))
def test_layer_norm_gradient(jit, case, eps):
    x, axis, dy = case
    fn = forward("LayerNorm", 1, 3, axis=axis, epsilon=eps)
    (y, mean, std), pullback = jax.vjp(lambda a: fn(a), x)
    (vjp_dx,) = pullback((dy, jnp.zeros_like(mean), jnp.zeros_like(std)))
    y, mean, std = np.asarray(y), np.asarray(mean), np.asarray(std)
    (dx,) = run_op("LayerNormGradient", [dy, y, mean, std, x], jit=jit, axis=axis, epsilon=eps)
    _ln_close(dx, _layer_norm_grad(x, dy, axis, mean, std)[0], dy)
    _ln_close(dx, vjp_dx, dy)


@given(case=layer_norm_case(affine=True))
def test_layer_norm_gradient_affine(jit, case):
    x, axis, dy, gamma, beta = case
    fn = forward("LayerNorm", 3, 3, axis=axis, elementwise_affine=1)
    (y, mean, std), pullback = jax.vjp(lambda *a: fn(*a), x, gamma, beta)
    vjp = pullback((dy, jnp.zeros_like(mean), jnp.zeros_like(std)))
    y, mean, std = np.asarray(y), np.asarray(mean), np.asarray(std)
    outs = run_op(
        "LayerNormGradient", [dy, y, mean, std, x, gamma], 3, jit=jit, axis=axis, elementwise_affine=1
    )
    expected = _layer_norm_grad(x, dy, axis, mean, std, gamma)
    for got, ref, want in zip(outs, expected, vjp, strict=True):
        _ln_close(got, ref.reshape(got.shape), dy, gamma)
        _ln_close(got, np.asarray(want), dy, gamma)
    assert outs[1].shape == outs[2].shape == gamma.shape


def test_layer_norm_gradient_defaults(jit):
    """axis defaults to 1 (here the last two dims form a row); without elementwise_affine one output."""
    x = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) ** 1.5).astype(np.float32)
    dy = np.cos(np.arange(24, dtype=np.float32)).reshape(2, 3, 4)
    y, mean, std = run_op("LayerNorm", [x], 3, jit=jit)
    assert mean.shape == (2, 1)
    (dx,) = run_op("LayerNormGradient", [dy, y, mean, std, x], jit=jit)
    _ln_close(dx, _layer_norm_grad(x, dy, 1, mean, std)[0], dy)


def test_layer_norm_gradient_ignores_y_and_epsilon(jit):
    """Only dY, mean, std and X are read: std already holds epsilon."""
    x = np.array([[1.0, 2.0, 4.0], [0.0, -1.0, 5.0]], np.float32)
    dy = np.array([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]], np.float32)
    y, mean, std = run_op("LayerNorm", [x], 3, jit=jit, epsilon=0.5)
    (a,) = run_op("LayerNormGradient", [dy, y, mean, std, x], jit=jit, epsilon=0.5)
    (b,) = run_op("LayerNormGradient", [dy, np.zeros_like(y), mean, std, x], jit=jit, epsilon=1e-5)
    np.testing.assert_array_equal(a, b)


def test_layer_norm_gradient_empty_rows(jit):
    """No rows: dX is empty and dgamma/dbeta are zeros (Caffe2 sets them to 0)."""
    x = np.zeros((0, 3), np.float32)
    gamma = np.ones((3,), np.float32)
    stats = np.zeros((0, 1), np.float32)
    dx, dgamma, dbeta = run_op(
        "LayerNormGradient", [x, x, stats, stats, x, gamma], 3, jit=jit, elementwise_affine=1
    )
    assert dx.shape == (0, 3)
    np.testing.assert_array_equal(dgamma, np.zeros(3, np.float32))
    np.testing.assert_array_equal(dbeta, np.zeros(3, np.float32))


def test_layer_norm_gradient_bad(jit):
    x = np.ones((2, 3), np.float32)
    stats = np.ones((2, 1), np.float32)
    names = ["dY", "Y", "mean", "std", "X", "gamma"]
    with pytest.raises(BadArgumentError, match="elementwise_affine=1 needs inputs"):
        run_op("LayerNormGradient", [x, x, stats, stats, x], 3, jit=jit, elementwise_affine=1)
    with pytest.raises(BadArgumentError, match="dgamma and dbeta only with elementwise_affine=1"):
        run_op("LayerNormGradient", [x, x, stats, stats, x], 3, jit=jit)
    with pytest.raises(ShapeError, match=r"LayerNormGradient.*dY 'dY' has shape \[3, 2\]"):
        run_op("LayerNormGradient", [x.T, x, stats, stats, x], jit=jit, input_names=names[:5])
    with pytest.raises(ShapeError, match=r"LayerNormGradient.*'std' has 3 elements, expected 2"):
        run_op("LayerNormGradient", [x, x, stats, np.ones(3, np.float32), x], jit=jit, input_names=names[:5])
    with pytest.raises(ShapeError, match=r"LayerNormGradient.*gamma 'gamma' has 2 elements"):
        run_op(
            "LayerNormGradient",
            [x, x, stats, stats, x, np.ones(2, np.float32)],
            3,
            jit=jit,
            input_names=names,
            elementwise_affine=1,
        )
    with pytest.raises(ShapeError, match=r"LayerNormGradient.*axis 2 is out of range"):
        run_op("LayerNormGradient", [x, x, stats, stats, x], jit=jit, axis=2)


# ---------------------------------------------------------------------------------------------------
# DropoutGrad


@given(
    x=hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=3), elements=st.floats(-5, 5, width=32)),
    ratio=st.sampled_from([0.0, 0.25, 0.5, 0.9]),
    seed=st.integers(0, 2**16),
)
def test_dropout_grad(jit, x, ratio, seed):
    """dX = dY * mask / (1 - ratio), with the scale computed in double and stored as float."""
    dy = np.cos(np.arange(x.size, dtype=np.float32)).reshape(x.shape) * 3
    fn = forward("Dropout", 1, 2, ratio=ratio, is_test=0)
    key = jax.random.key(seed)
    mask = np.asarray(fn(x, key=key)[1])
    _, pullback = jax.vjp(lambda a: fn(a, key=key)[0], x)
    (vjp_dx,) = pullback(dy)
    (dx,) = run_op("DropoutGrad", [dy, mask], jit=jit, ratio=ratio)
    expected = dy * mask * np.float32(1.0 / (1.0 - ratio))
    np.testing.assert_allclose(dx, expected, rtol=1e-6, atol=0)
    np.testing.assert_allclose(dx, np.asarray(vjp_dx), rtol=1e-6, atol=0)


def test_dropout_grad_defaults_and_test_mode(jit):
    """ratio defaults to 0.5; with is_test the gradient is a copy of dY (a given mask is not read)."""
    dy = np.array([1.0, -2.0, 3.0], np.float32)
    mask = np.array([True, False, True])
    (dx,) = run_op("DropoutGrad", [dy, mask], jit=jit)
    np.testing.assert_array_equal(dx, [2.0, 0.0, 6.0])
    (dx,) = run_op("DropoutGrad", [dy], jit=jit, is_test=1)
    np.testing.assert_array_equal(dx, dy)
    (dx,) = run_op("DropoutGrad", [dy, mask], jit=jit, is_test=1, ratio=0.3)
    np.testing.assert_array_equal(dx, dy)


def test_dropout_grad_bad(jit):
    dy = np.ones((2, 3), np.float32)
    mask = np.ones((2, 3), bool)
    with pytest.raises(BadArgumentError, match=r"'ratio' = 1\.0 must be in"):
        run_op("DropoutGrad", [dy, mask], jit=jit, ratio=1.0)
    with pytest.raises(BadArgumentError, match=r"is_test=0 takes \(dY, mask\)"):
        run_op("DropoutGrad", [dy], jit=jit)
    with pytest.raises(ShapeError, match=r"DropoutGrad.*mask 'm' must be a bool tensor of 6 elements"):
        run_op("DropoutGrad", [dy, mask[:1]], jit=jit, input_names=["dy", "m"])
    with pytest.raises(ShapeError, match=r"mask 'm' must be a bool tensor.*float32"):
        run_op("DropoutGrad", [dy, dy], jit=jit, input_names=["dy", "m"])
