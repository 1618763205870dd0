"""LayerNorm, Dropout and the channel-wise normalisations against NumPy references written from Caffe2's
documented semantics and kernels."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import forward, run_op
from rnn2jax.errors import BadArgumentError, ShapeError

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
