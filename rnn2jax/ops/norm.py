"""Normalisation and regularisation: LayerNorm (used by the LayerNorm LSTM cells), Dropout, the
channel-wise normalisations of convolutional nets (SpatialBN, GroupNorm, InstanceNorm, AffineChannel and
their statistics ops), LpNorm, Normalize(L1) and RMSNorm, with the gradient ops Caffe2's backward nets run
for them."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .common import canonical_axis, size_from_dim, size_to_dim
from .emit import Call, EmitWriter, Unsupported, call, codegen_helper
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import (
    GradientContext,
    GradientError,
    GradientOps,
    gradient_not_implemented_yet,
    gradient_op,
    should_not_do_gradient,
    single_gradient,
)
from .reduce import channel_view, require_dtype, storage_order
from .registry import Kernel, declare_family, facet, register
from .shape_facts import output_like_input

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)


# C10LayerNorm_DontUseThisOpYet: Caffe2 1.x exposed the c10 LayerNorm kernel under this name too (same op)
@register("LayerNorm", "C10LayerNorm_DontUseThisOpYet", inputs=(1, 3), outputs=3)
def layer_norm(op: Op) -> Kernel:
    """`(X[, gamma, beta]) -> (Y, mean, std)`: each row of X viewed as `size_to_dim(axis) x
    size_from_dim(axis)` is normalised with its mean and biased variance; mean and std keep the
    leading dims plus a trailing 1 (caffe2/operators/layer_norm_op.h)."""
    axis = op.int("axis", 1)
    epsilon = op.float("epsilon", float(np.float32(1e-5)))  # Caffe2's default is the float 1e-5f
    affine = op.bool("elementwise_affine", False)
    if affine and len(op.inputs) != 3:
        raise BadArgumentError(
            f"{op.where}: elementwise_affine=1 needs inputs (X, gamma, beta), got {len(op.inputs)} input(s)"
        )

    def kernel(x, gamma=None, beta=None):
        if x.ndim < 2:
            raise ShapeError(f"{op.where}: LayerNorm needs an input of rank >= 2, got shape {x.shape}")
        _require_float(op, x)
        k = canonical_axis(op, axis, x.ndim)
        if affine:
            n = size_from_dim(x.shape, k)
            gamma, beta = _affine_param(op, 1, gamma, n), _affine_param(op, 2, beta, n)
        return normalize_rows(x, gamma if affine else None, beta if affine else None, k, epsilon)

    return kernel


@codegen_helper
def normalize_rows(
    x: jax.Array,
    gamma: jax.Array | None = None,
    beta: jax.Array | None = None,
    axis: int = 1,
    epsilon: float = 9.999999747378752e-06,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Caffe2's LayerNorm -> (y, mean, std): each row of x viewed at `axis` is normalised with its mean and
    biased variance (then scaled by gamma and shifted by beta, when given); mean and std keep the dims before
    `axis` plus a 1. Empty rows have mean 0 and variance 0, as in Caffe2. epsilon's default is Caffe2's 1e-5f."""
    axis = axis % x.ndim
    n = math.prod(x.shape[axis:])
    rows = jnp.reshape(x, (math.prod(x.shape[:axis]), n))
    if n == 0:
        mean = jnp.zeros((rows.shape[0], 1), x.dtype)
        var_eps = jnp.full((rows.shape[0], 1), epsilon, x.dtype)
    else:
        mean = jnp.mean(rows, axis=1, keepdims=True)
        var_eps = jnp.mean(jnp.square(rows - mean), axis=1, keepdims=True) + jnp.asarray(epsilon, x.dtype)
    y = (rows - mean) * jax.lax.rsqrt(var_eps)
    if gamma is not None:
        y = y * jnp.reshape(gamma, (n,)) + jnp.reshape(beta, (n,))
    stat = (*x.shape[:axis], 1)
    return jnp.reshape(y, x.shape), jnp.reshape(mean, stat), jnp.reshape(jnp.sqrt(var_eps), stat)


@facet("emitter", "LayerNorm", "C10LayerNorm_DontUseThisOpYet")
def emit_layer_norm(w: EmitWriter, op: Op, xs: list[str]) -> Call | str:
    keywords = {"axis": op.int("axis", 1), "epsilon": op.float("epsilon", float(np.float32(1e-5)))}
    args = xs if op.bool("elementwise_affine", False) else xs[:1]
    value = call(w.helper(normalize_rows), *args, **keywords)
    if len(op.outputs) == 3:
        return value
    return f"{value.flat()}[0]" if len(op.outputs) == 1 else f"{value.flat()}[:2]"


@facet("gradient", "LayerNorm")
def _layer_norm_gradient_maker(g: GradientContext) -> GradientOps:
    """Gamma and beta get gradients too with `elementwise_affine`."""
    affine = g.arg("elementwise_affine")
    if affine is not None and affine.i:
        inputs = [g.GO(0), g.O(0), g.O(1), g.O(2), g.I(0), g.I(1)]
        return [gradient_op("LayerNormGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])]
    return [gradient_op("LayerNormGradient", [g.GO(0), g.O(0), g.O(1), g.O(2), g.I(0)], [g.GI(0)])]


facet("gradient", "C10LayerNorm_DontUseThisOpYet")(NO_GRADIENT)


facet("shape_rule", "LayerNorm")(output_like_input)


def _affine_param(op: Op, index: int, value: jax.Array, n: int, what: str = "") -> jax.Array:
    """gamma (input 1) or beta (input 2): any shape with one value per element of a normalised row."""
    if value.size != n:
        what = what or ("gamma", "beta")[index - 1]
        raise ShapeError(
            f"{op.where}: {what} '{op.inputs[index]}' has {value.size} elements but each normalised row has {n}"
        )
    return value.reshape(n)


def _require_float(op: Op, x: jax.Array) -> None:
    """Caffe2 runs these ops on float data only; on integers the arithmetic here would truncate."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ShapeError(f"{op.where}: {op.type} takes a float input '{op.inputs[0]}', got {x.dtype}")


@register("Dropout", outputs=(1, 2), random=True, shape_rule=output_like_input)
def dropout(op: Op) -> Kernel:
    """`X -> (Y, mask)`, X a float tensor. Training keeps each element with probability `1 - ratio` and
    scales kept ones by `1/(1 - ratio)`; test mode is the identity (mask all true, which Caffe2 leaves
    unwritten). Caffe2's constructor enforces `0 <= ratio < 1` (caffe2/operators/dropout_op.h), its
    schema requires the `is_test` argument (ArgIsTest), and training writes the mask output, so
    Caffe2 fails (std::out_of_range) without one: refused here with a clear error."""
    if not op.has("is_test"):
        raise BadArgumentError(f"{op.where}: Dropout requires the argument 'is_test' (0 to train, 1 for inference)")
    ratio, is_test, scale = _dropout_args(op)
    if not is_test and len(op.outputs) != 2:
        raise BadArgumentError(f"{op.where}: Dropout with is_test=0 writes (Y, mask): it needs the mask output")

    def kernel(x, *, key: jax.Array | None = None):
        _require_float(op, x)  # Caffe2: float32 only; doubles kept for rnn2jax's float64 mode
        if is_test:
            return x, jnp.ones(x.shape, jnp.bool_)
        if key is None:
            raise BadArgumentError(f"{op.where}: Dropout in training mode needs a PRNG key")
        mask = jax.random.bernoulli(key, 1.0 - ratio, x.shape)
        return x * jnp.asarray(scale, x.dtype) * mask.astype(x.dtype), mask

    return kernel


@facet("gradient", "Dropout")
def _dropout_gradient_maker(g: GradientContext) -> GradientOps:
    """In test mode there is no mask to read."""
    inputs = [g.GO(0)] if g.flag("is_test", False) else [g.GO(0), g.O(1)]
    return [gradient_op("DropoutGrad", inputs, [g.GI(0)])]


@facet("emitter", "Dropout")
def emit_dropout(w: EmitWriter, op: Op, xs: list[str]) -> str:
    """Test mode only (the identity, mask all true), as the kernel computes it."""
    if op.int("is_test", 0) == 0:
        raise Unsupported("Dropout in training mode (is_test=0) is random; the module is for inference")
    return xs[0] if len(op.outputs) == 1 else f"{xs[0]}, jnp.ones(jnp.shape({xs[0]}), jnp.bool_)"


def _dropout_args(op: Op) -> tuple[float, bool, np.float32]:
    """(ratio, is_test, 1/(1 - ratio)); Dropout and DropoutGrad both enforce `0 <= ratio < 1`."""
    ratio = op.float("ratio", 0.5)
    is_test = op.int("is_test", 0) != 0
    if not 0.0 <= ratio < 1.0:
        raise BadArgumentError(f"{op.where}: argument 'ratio' = {ratio} must be in [0, 1)")
    return ratio, is_test, np.float32(1.0 / (1.0 - ratio))  # computed in double, stored as float


@register("DropoutGrad", inputs=(1, 2))
def dropout_grad(op: Op) -> Kernel:
    """`(dY[, mask]) -> dX`: `dY * mask / (1 - ratio)` in training; with `is_test` a copy of dY (the
    maker then passes no mask, and a given one is not read), caffe2/operators/dropout_op.cc."""
    _, is_test, scale = _dropout_args(op)
    if not is_test and len(op.inputs) != 2:
        raise BadArgumentError(f"{op.where}: DropoutGrad with is_test=0 takes (dY, mask), got only dY")

    def kernel(dy, mask=None):
        _require_float(op, dy)
        if is_test:
            return dy
        if mask.dtype != jnp.bool_ or mask.size != dy.size:
            raise ShapeError(
                f"{op.where}: mask '{op.inputs[1]}' must be a bool tensor of {dy.size} elements (like dY), "
                f"got {mask.dtype}{list(mask.shape)}"
            )
        return dy * mask.reshape(dy.shape).astype(dy.dtype) * jnp.asarray(scale, dy.dtype)

    return kernel


@register("LayerNormGradient", inputs=(5, 6), outputs=(1, 3))
def layer_norm_gradient(op: Op) -> Kernel:
    """`(dY, Y, mean, std, X[, gamma]) -> dX[, dgamma, dbeta]`, the exact backward of LayerNorm given its
    saved statistics (Y and `epsilon` are not read: std already includes epsilon). Like Caffe2
    (caffe2/operators/layer_norm_op.{h,cc}), `elementwise_affine` decides whether gamma is read and
    dgamma/dbeta are written; both are shaped like gamma."""
    axis = op.int("axis", 1)
    op.float("epsilon", 1e-5)
    affine = op.bool("elementwise_affine", False)
    if affine and len(op.inputs) != 6:
        raise BadArgumentError(
            f"{op.where}: elementwise_affine=1 needs inputs (dY, Y, mean, std, X, gamma), got {len(op.inputs)} input(s)"
        )
    if not affine and len(op.outputs) > 1:
        raise BadArgumentError(f"{op.where}: LayerNormGradient writes dgamma and dbeta only with elementwise_affine=1")

    def kernel(dy, y, mean, std, x, gamma=None):
        _require_float(op, dy)  # Caffe2: float32 only (LayerNorm also double); doubles kept for float64 mode
        k = canonical_axis(op, axis, x.ndim)
        m, n = size_to_dim(x.shape, k), size_from_dim(x.shape, k)
        if dy.shape != x.shape:
            raise ShapeError(
                f"{op.where}: dY '{op.inputs[0]}' has shape {list(dy.shape)}, X '{op.inputs[4]}' has {list(x.shape)}"
            )
        for index, stat in ((2, mean), (3, std)):
            if stat.size != m:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' has {stat.size} elements, expected {m} (one per row)"
                )
        g = _affine_param(op, 5, gamma, n, "gamma") if affine else None
        dx, dgamma, dbeta = _layer_norm_backward(
            dy.reshape(m, n), x.reshape(m, n), mean.reshape(m, 1), std.reshape(m, 1), g
        )
        if not affine:
            return dx.reshape(x.shape)
        return dx.reshape(x.shape), dgamma.reshape(gamma.shape), dbeta.reshape(gamma.shape)

    return kernel


def _layer_norm_backward(
    dy: jax.Array, x: jax.Array, mean: jax.Array, std: jax.Array, gamma: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """On `[M, N]` rows, with `r = 1/std`, `xhat = (X - mean)*r` and `g = gamma*dY` (or dY):
    `dX = r*(g - mean(g) - xhat*mean(g*xhat))`, `dgamma = sum_rows dY*xhat`, `dbeta = sum_rows dY`.
    This is Caffe2's fused `dX = g*r + X*a + b` (`a = (db*mean - ds)*r^3/N`, `b = -a*mean - db*r/N`,
    `ds = sum(g*X)`, `db = sum(g)`) rearranged, for any given mean and std, so that X - mean is formed
    first: Caffe2's form cancels large terms, which on nearly constant rows (r up to 1/sqrt(eps))
    leaves rounding noise where the gradient is 0."""
    m, n = x.shape
    if m == 0 or n == 0:
        return jnp.zeros_like(x), jnp.zeros((n,), x.dtype), jnp.zeros((n,), x.dtype)
    rstd = 1 / std
    xhat = (x - mean) * rstd
    g = dy if gamma is None else dy * gamma
    dx = rstd * (g - jnp.mean(g, axis=1, keepdims=True) - xhat * jnp.mean(g * xhat, axis=1, keepdims=True))
    return dx, jnp.sum(dy * xhat, axis=0), jnp.sum(dy, axis=0)


# ---------------------------------------------------------------------------------------------------
# Channel-wise normalisations: SpatialBN, GroupNorm, InstanceNorm, AffineChannel, ChannelStats,
# ChannelBackpropStats. X is viewed as [N, C, HxW] (NCHW) or [N, HxW, C] (NHWC); statistics are
# computed two-pass (mean first), where Caffe2's math::Moments is one-pass (E[x²] - mean²) for some
# layouts: the results agree except where a group's variance is tiny against its mean square.


def _channel_param(op: Op, index: int, value: jax.Array, c: int) -> jax.Array:
    if value.size != c:
        raise ShapeError(f"{op.where}: '{op.inputs[index]}' has {value.size} elements, expected {c} (one per channel)")
    return value.reshape(c)


def _per_channel(v: jax.Array, nchw: bool) -> jax.Array:
    """A [C] vector broadcast against a [N, C, HxW] (NCHW) or [N, HxW, C] (NHWC) view."""
    return v.reshape((1, -1, 1) if nchw else (1, 1, -1))


def _stat_axes(nchw: bool) -> tuple[int, int]:
    return (0, 2) if nchw else (0, 1)


@register("SpatialBN", inputs=(5, 7), outputs=(1, 5))
def spatial_bn(op: Op) -> Kernel:
    """`(X, scale, bias, mean, var[, mean_sum, var_sum]) -> Y` (is_test=1) or `(Y, running_mean,
    running_var, saved_mean, saved_inv_std)` (training), per channel, float only
    (caffe2/operators/spatial_batch_norm_op.h). Test mode: `Y = scale·(X - mean)/sqrt(var + eps) + bias`.
    Training normalises with the batch's mean and biased variance, updates the running statistics in
    place (`r = momentum·r + (1 - momentum)·stat`, the variance unbiased by n/(n-1), which is infinite
    for n = 1, so that running variance becomes NaN as in Caffe2), and saves `1/sqrt(var + eps)`.
    A running statistic of the wrong size restarts from zeros (Caffe2's deprecated path); with
    `num_batches > 1` the batch moments come from the sums in inputs 5 and 6."""
    if not op.has("is_test"):
        raise BadArgumentError(f"{op.where}: SpatialBN requires the argument 'is_test'")
    is_test = op.int("is_test", 0) != 0
    epsilon = op.float("epsilon", 1e-5)
    momentum = op.float("momentum", 0.9)
    nchw = storage_order(op)
    num_batches = op.int("num_batches", 1)
    if not epsilon > 0:
        raise BadArgumentError(f"{op.where}: argument 'epsilon' = {epsilon} must be positive")
    if not 0 <= momentum <= 1:
        raise BadArgumentError(f"{op.where}: argument 'momentum' = {momentum} must be in [0, 1]")
    if len(op.inputs) == 6:
        raise BadArgumentError(f"{op.where}: SpatialBN takes 5 or 7 inputs, got 6")
    if len(op.outputs) != (1 if is_test else 5):
        raise BadArgumentError(
            f"{op.where}: SpatialBN writes {'Y only with is_test=1' if is_test else '5 outputs in training'}, "
            f"got {len(op.outputs)} output(s)"
        )
    if not is_test:
        if op.outputs[1] != op.inputs[3] or op.outputs[2] != op.inputs[4]:
            raise BadArgumentError(
                f"{op.where}: in training the running mean and variance are updated in place: outputs 1 and 2 "
                f"must be inputs 3 and 4 ('{op.inputs[3]}', '{op.inputs[4]}')"
            )
        if num_batches > 1 and len(op.inputs) != 7:
            raise BadArgumentError(f"{op.where}: num_batches > 1 needs the batch sums as inputs 5 and 6")
    eps = np.float32(epsilon)

    def kernel(x, scale, bias, mean, var, mean_sum=None, var_sum=None):
        require_dtype(op, x, ("float32",))
        view, n, c, hxw = _bn_view(op, x, nchw, 2)
        s, b = _channel_param(op, 1, scale, c), _channel_param(op, 2, bias, c)
        if is_test:
            if n == 0:
                return x
            m, v = _channel_param(op, 3, mean, c), _channel_param(op, 4, var, c)
            alpha = s * jax.lax.rsqrt(v + eps)
            return _affine(view, alpha, b - alpha * m, nchw).reshape(x.shape)
        running_mean = mean.reshape(c) if mean.size == c else jnp.zeros((c,), x.dtype)
        running_var = var.reshape(c) if var.size == c else jnp.zeros((c,), x.dtype)
        if n == 0:
            zeros = jnp.zeros((c,), x.dtype)
            return x, running_mean, running_var, zeros, zeros
        if num_batches > 1:
            inv = np.float32(1) / np.float32(num_batches * n * hxw)
            batch_mean = _channel_param(op, 5, mean_sum, c) * inv
            batch_var = _channel_param(op, 6, var_sum, c) * inv - jnp.square(batch_mean)
        elif hxw == 0:
            batch_mean = batch_var = jnp.zeros((c,), x.dtype)
        else:
            batch_mean = jnp.mean(view, axis=_stat_axes(nchw))
            batch_var = jnp.mean(jnp.square(view - _per_channel(batch_mean, nchw)), axis=_stat_axes(nchw))
        size = num_batches * n * hxw
        unbias = np.float32(np.inf) if size == 1 else np.float32(size) / np.float32(size - 1)
        keep = np.float32(1) - np.float32(momentum)
        new_mean = keep * batch_mean + np.float32(momentum) * running_mean
        new_var = (keep * unbias) * batch_var + np.float32(momentum) * running_var
        rstd = 1 / jnp.sqrt(batch_var + eps)
        alpha = s * rstd
        y = _affine(view, alpha, b - alpha * batch_mean, nchw).reshape(x.shape)
        return y, new_mean, new_var, batch_mean, rstd

    return kernel


def _enforce_for_gradient(ok: bool, message: str) -> None:
    """A maker's CAFFE_ENFORCE."""
    if not ok:
        raise GradientError(message)


@facet("gradient", "SpatialBN")
def _spatial_bn_gradient_maker(g: GradientContext) -> GradientOps:
    """Test mode hands the running mean and variance over as the saved mean and inverse std."""
    is_test = g.arg("is_test")
    num_batches = g.arg("num_batches")
    outputs = [g.GI(0), g.GI(1), g.GI(2)]
    n_in, n_out = len(g.op.input), len(g.op.output)
    if is_test is not None and is_test.i:
        _enforce_for_gradient(n_in == 5 and n_out == 1, "SpatialBN in test mode has 5 inputs and 1 output")
        inputs = [g.I(0), g.I(1), g.GO(0), g.I(3), g.I(4)]
    elif num_batches is not None and num_batches.i > 1:
        _enforce_for_gradient(n_in == 7 and n_out == 5, "SpatialBN with num_batches > 1 has 7 inputs and 5 outputs")
        inputs = [g.I(0), g.I(1), g.GO(0), g.O(3), g.O(4), g.GI(1), g.GI(2)]
    else:
        _enforce_for_gradient(n_in == 5 and n_out == 5, "SpatialBN in training mode has 5 inputs and 5 outputs")
        inputs = [g.I(0), g.I(1), g.GO(0), g.O(3), g.O(4)]
    return [gradient_op("SpatialBNGradient", inputs, outputs)]


def _bn_view(op: Op, x: jax.Array, nchw: bool, min_ndim: int) -> tuple[jax.Array, int, int, int]:
    """X as [N, C, HxW] / [N, HxW, C]: C must not be 0 (Caffe2 divides by it); N may be."""
    if x.ndim < min_ndim:
        raise ShapeError(f"{op.where}: {op.type} needs an input of rank >= {min_ndim}, got shape {list(x.shape)}")
    n, c = x.shape[0], (x.shape[1] if nchw else x.shape[-1])
    if c == 0:
        raise ShapeError(f"{op.where}: {op.type} needs at least one channel, got shape {list(x.shape)}")
    hxw = math.prod(x.shape[1:]) // c
    return (x.reshape(n, c, hxw) if nchw else x.reshape(n, hxw, c)), n, c, hxw


def _affine(view: jax.Array, alpha: jax.Array, beta: jax.Array, nchw: bool) -> jax.Array:
    return view * _per_channel(alpha, nchw) + _per_channel(beta, nchw)


@register("SpatialBNGradient", inputs=(5, 7), outputs=3)
def spatial_bn_gradient(op: Op) -> Kernel:
    """`(X, scale, dY, saved_mean, saved_inv_std[, dscale_sum, dbias_sum]) -> (dX, dscale, dbias)`:
    `dscale = Σ dY·(X - mean)·rstd`, `dbias = Σ dY` per channel (or the given sums / num_batches), and
    `dX = scale·rstd·(dY - (dbias + (X - mean)·rstd·dscale)/(N·HxW))`. X must have rank >= 3 (Caffe2's
    gradient enforces it, unlike the forward). In test mode the maker passes the running variance as
    `saved_inv_std`, and it is used as such."""
    op.float("epsilon", 1e-5)
    nchw = storage_order(op)
    num_batches = op.int("num_batches", 1)
    if len(op.inputs) == 6:
        raise BadArgumentError(f"{op.where}: SpatialBNGradient takes 5 or 7 inputs, got 6")
    if num_batches > 1 and len(op.inputs) != 7:
        raise BadArgumentError(f"{op.where}: num_batches > 1 needs the gradient sums as inputs 5 and 6")

    def kernel(x, scale, dy, mean, rstd, dscale_sum=None, dbias_sum=None):
        require_dtype(op, x, ("float32",))
        view, n, c, hxw = _bn_view(op, x, nchw, 3)
        s, m, r = (_channel_param(op, i, v, c) for i, v in ((1, scale), (3, mean), (4, rstd)))
        if dy.shape != x.shape:
            raise ShapeError(f"{op.where}: dY '{op.inputs[2]}' has shape {list(dy.shape)}, X has {list(x.shape)}")
        shapes = (dscale_sum.shape, dbias_sum.shape) if num_batches > 1 else (scale.shape, scale.shape)
        if n == 0:
            return x, jnp.zeros(shapes[0], x.dtype), jnp.zeros(shapes[1], x.dtype)
        g = dy.reshape(view.shape)
        centred = view - _per_channel(m, nchw)
        if num_batches > 1:
            inv = np.float32(1) / np.float32(num_batches)
            dscale, dbias = _channel_param(op, 5, dscale_sum, c) * inv, _channel_param(op, 6, dbias_sum, c) * inv
        else:
            axes = _stat_axes(nchw)
            dscale = jnp.sum(g * centred, axis=axes) * r
            dbias = jnp.sum(g, axis=axes)
        inner = _per_channel(dbias, nchw) + centred * _per_channel(r * dscale, nchw)
        dx = _per_channel(s * r, nchw) * (g - inner * np.float32(1) / np.float32(n * hxw))
        return dx.reshape(x.shape), dscale.reshape(shapes[0]), dbias.reshape(shapes[1])

    return kernel


def _groups(op: Op, x: jax.Array, nchw: bool, g: int) -> tuple[jax.Array, int, int, int, int]:
    """X as [N, G, K, HxW] (NCHW) or [N, HxW, G, K] (NHWC), with (N, C, HxW, K)."""
    view, n, c, hxw = channel_view(op, x, nchw)
    if c % g:
        raise ShapeError(f"{op.where}: {c} channels do not split into {g} groups")
    k = c // g
    return (view.reshape(n, g, k, hxw) if nchw else view.reshape(n, hxw, g, k)), n, c, hxw, k


def _group_axes(nchw: bool) -> tuple[int, int]:
    return (2, 3) if nchw else (1, 3)


def _group_stat(v: jax.Array, nchw: bool) -> jax.Array:
    """An [N, G] statistic broadcast against the grouped view."""
    n, g = v.shape
    return v.reshape((n, g, 1, 1) if nchw else (n, 1, g, 1))


def _group_param(v: jax.Array, g: int, k: int, nchw: bool) -> jax.Array:
    """A [C] parameter broadcast against the grouped view."""
    return v.reshape((1, g, k, 1) if nchw else (1, 1, g, k))


def _group_count(op: Op) -> int:
    group = op.int("group", 32)
    if group <= 0:
        raise BadArgumentError(f"{op.where}: argument 'group' = {group} must be positive")
    return group


@register("GroupNorm", inputs=3, outputs=(1, 3))
def group_norm(op: Op) -> Kernel:
    """`(X, gamma, beta) -> Y[, mu, rsig]`: each sample's channels split into `group` groups (default
    32), normalised by the group's mean and `rsig = 1/sqrt(var + epsilon)`, then scaled and shifted per
    channel (caffe2/operators/group_norm_op.{h,cc}). `is_test=0` (the default is 1) requires the
    statistics outputs. With no samples Caffe2 leaves mu and rsig unwritten; here they are empty."""
    group = _group_count(op)
    epsilon = np.float32(op.float("epsilon", 1e-5))
    nchw = storage_order(op)
    if len(op.outputs) == 2:
        raise BadArgumentError(f"{op.where}: GroupNorm writes Y or (Y, mu, rsig), got 2 outputs")
    if not op.bool("is_test", True) and len(op.outputs) != 3:
        raise BadArgumentError(f"{op.where}: GroupNorm with is_test=0 writes (Y, mu, rsig)")

    def kernel(x, gamma, beta):
        require_dtype(op, x, ("float32",))
        view, n, c, hxw, k = _groups(op, x, nchw, group)
        gm, bt = _channel_param(op, 1, gamma, c), _channel_param(op, 2, beta, c)
        if k * hxw == 0:
            mu = jnp.zeros((n, group), x.dtype)
            var = jnp.zeros((n, group), x.dtype)
        else:
            axes = _group_axes(nchw)
            mu = jnp.mean(view, axis=axes)
            var = jnp.mean(jnp.square(view - _group_stat(mu, nchw)), axis=axes)
        rsig = 1 / jnp.sqrt(var + epsilon)
        scale = _group_stat(rsig, nchw) * _group_param(gm, group, k, nchw)
        bias = _group_param(bt, group, k, nchw) - scale * _group_stat(mu, nchw)
        return (view * scale + bias).reshape(x.shape), mu, rsig

    return kernel


@facet("gradient", "GroupNorm")
def _group_norm_gradient_maker(g: GradientContext) -> GradientOps:
    _enforce_for_gradient(
        len(g.op.output) == 3, "(i >= 0) && (i < def_.output().size()): GroupNorm's gradient reads mu and rsig"
    )
    inputs = [g.GO(0), g.I(0), g.I(1), g.I(2), g.O(1), g.O(2)]
    return [gradient_op("GroupNormGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])]


def _norm_backward(
    dy: jax.Array, x: jax.Array, mu: jax.Array, rsig: jax.Array, gamma: jax.Array, axes: tuple[int, ...]
) -> jax.Array:
    """dX of `gamma·(X - mu)·rsig + beta` normalised over `axes`, given mu and rsig (broadcastable):
    `rsig·(g - mean(g) - xhat·mean(g·xhat))` with `g = gamma·dY`, `xhat = (X - mu)·rsig`."""
    xhat = (x - mu) * rsig
    g = gamma * dy
    return rsig * (g - jnp.mean(g, axis=axes, keepdims=True) - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))


@register("GroupNormGradient", inputs=6, outputs=3)
def group_norm_gradient(op: Op) -> Kernel:
    """`(dY, X, gamma, beta, mu, rsig) -> (dX, dgamma, dbeta)`, the exact backward of GroupNorm given
    its saved statistics: `dgamma = Σ dY·(X - mu)·rsig`, `dbeta = Σ dY` per channel."""
    group = _group_count(op)
    nchw = storage_order(op)

    def kernel(dy, x, gamma, beta, mu, rsig):
        require_dtype(op, dy, ("float32",))
        view, n, c, hxw, k = _groups(op, x, nchw, group)
        gm = _channel_param(op, 2, gamma, c)
        _channel_param(op, 3, beta, c)
        if dy.shape != x.shape:
            raise ShapeError(f"{op.where}: dY '{op.inputs[0]}' has shape {list(dy.shape)}, X has {list(x.shape)}")
        for index, stat in ((4, mu), (5, rsig)):
            if stat.size != n * group:
                raise ShapeError(f"{op.where}: '{op.inputs[index]}' has {stat.size} elements, expected {n * group}")
        g = dy.reshape(view.shape)
        m, r = _group_stat(mu.reshape(n, group), nchw), _group_stat(rsig.reshape(n, group), nchw)
        sums = (0, 3) if nchw else (0, 1)
        dgamma = jnp.sum(g * (view - m) * r, axis=sums).reshape(gamma.shape)
        dbeta = jnp.sum(g, axis=sums).reshape(beta.shape)
        if k * hxw == 0:
            return jnp.zeros(x.shape, dy.dtype), dgamma, dbeta
        dx = _norm_backward(g, view, m, r, _group_param(gm, group, k, nchw), _group_axes(nchw))
        return dx.reshape(x.shape), dgamma, dbeta

    return kernel


def _instance_epsilon(op: Op) -> np.float32:
    epsilon = op.float("epsilon", 1e-5)
    if epsilon < 0:
        raise BadArgumentError(f"{op.where}: argument 'epsilon' = {epsilon} must not be negative")
    return np.float32(epsilon)


def _instance_view(op: Op, x: jax.Array, nchw: bool) -> tuple[jax.Array, int, int, int]:
    view, n, c, hxw = channel_view(op, x, nchw)
    if hxw == 0:  # Caffe2 crashes on it (instance_norm_op.cc)
        raise ShapeError(f"{op.where}: {op.type} needs spatial positions, got shape {list(x.shape)}")
    return view, n, c, hxw


def _instance_moments(view: jax.Array, nchw: bool, epsilon: np.float32) -> tuple[jax.Array, jax.Array]:
    """[N, C] mean and `1/sqrt(var + epsilon)` over each sample's channel."""
    axis = 2 if nchw else 1
    mean = jnp.mean(view, axis=axis)
    var = jnp.mean(jnp.square(view - jnp.expand_dims(mean, axis)), axis=axis)
    return mean, 1 / jnp.sqrt(var + epsilon)


@register("InstanceNorm", inputs=3, outputs=(1, 3))
def instance_norm(op: Op) -> Kernel:
    """`(X, scale, bias) -> Y[, mean, rstd]`: each sample's channel normalised over its spatial
    positions, then scaled and shifted per channel; mean and rstd are [N, C]
    (caffe2/operators/instance_norm_op.{h,cc})."""
    epsilon = _instance_epsilon(op)
    nchw = storage_order(op)

    def kernel(x, scale, bias):
        require_dtype(op, x, ("float32",))
        view, _n, c, _ = _instance_view(op, x, nchw)
        s, b = _channel_param(op, 1, scale, c), _channel_param(op, 2, bias, c)
        mean, rstd = _instance_moments(view, nchw, epsilon)
        axis = 2 if nchw else 1
        alpha = rstd * s
        y = view * jnp.expand_dims(alpha, axis) + jnp.expand_dims(b - alpha * mean, axis)
        return y.reshape(x.shape), mean, rstd

    return kernel


@facet("gradient", "InstanceNorm")
def _instance_norm_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.I(0), g.I(1), g.I(2), g.GO(0)] + [g.O(i) for i in range(1, len(g.op.output))]
    return [gradient_op("InstanceNormGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])]


@register("InstanceNormGradient", inputs=(4, 6), outputs=3)
def instance_norm_gradient(op: Op) -> Kernel:
    """`(X, scale, bias, dY[, mean, rstd]) -> (dX, dscale, dbias)`; without both statistics (4 or 5
    inputs) they are recomputed from X with `epsilon`."""
    epsilon = _instance_epsilon(op)
    nchw = storage_order(op)

    def kernel(x, scale, bias, dy, mean=None, rstd=None):
        require_dtype(op, x, ("float32",))
        view, n, c, _ = _instance_view(op, x, nchw)
        s = _channel_param(op, 1, scale, c)
        if dy.shape != x.shape:
            raise ShapeError(f"{op.where}: dY '{op.inputs[3]}' has shape {list(dy.shape)}, X has {list(x.shape)}")
        if rstd is None:
            mean, rstd = _instance_moments(view, nchw, epsilon)
        else:
            for index, stat in ((4, mean), (5, rstd)):
                if stat.size != n * c:
                    raise ShapeError(f"{op.where}: '{op.inputs[index]}' has {stat.size} elements, expected {n * c}")
        axis = 2 if nchw else 1
        m, r = jnp.expand_dims(mean.reshape(n, c), axis), jnp.expand_dims(rstd.reshape(n, c), axis)
        g = dy.reshape(view.shape)
        sums = _stat_axes(nchw)
        dscale = jnp.sum(g * (view - m) * r, axis=sums).reshape(scale.shape)
        dbias = jnp.sum(g, axis=sums).reshape(scale.shape)
        dx = _norm_backward(g, view, m, r, _per_channel(s, nchw), (axis,))
        return dx.reshape(x.shape), dscale, dbias

    return kernel


@register("AffineChannel", inputs=3)
def affine_channel(op: Op) -> Kernel:
    """`Y = X·scale[c] + bias[c]` per channel, float only (caffe2/operators/affine_channel_op.h).
    Caffe2 reads scale and bias without checking their sizes: refused here unless they hold C values."""
    nchw = storage_order(op)
    if op.bool("is_learnable", False) and op.outputs[0] == op.inputs[0]:
        raise BadArgumentError(f"{op.where}: AffineChannel in place is not supported with is_learnable=1")

    def kernel(x, scale, bias):
        require_dtype(op, x, ("float32",))
        view, _, c, _ = channel_view(op, x, nchw)
        s, b = _channel_param(op, 1, scale, c), _channel_param(op, 2, bias, c)
        return _affine(view, s, b, nchw).reshape(x.shape)

    return kernel


@facet("gradient", "AffineChannel")
def _affine_channel_gradient_maker(g: GradientContext) -> GradientOps:
    if g.flag("is_learnable", False):
        return [gradient_op("AffineChannelGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1), g.GI(2)])]
    return [gradient_op("AffineChannelGradient", [g.GO(0), g.I(1)], [g.GI(0)])]


@register("AffineChannelGradient", inputs=(2, 3), outputs=(1, 3))
def affine_channel_gradient(op: Op) -> Kernel:
    """`(dY, scale) -> dX = dY·scale[c]`, or with `is_learnable` `(dY, X, scale) -> (dX, dscale, dbias)`,
    `dscale = Σ dY·X`, `dbias = Σ dY` per channel."""
    nchw = storage_order(op)
    learnable = op.bool("is_learnable", False)
    if len(op.inputs) != (3 if learnable else 2) or len(op.outputs) != (3 if learnable else 1):
        raise BadArgumentError(
            f"{op.where}: AffineChannelGradient takes (dY, X, scale) -> (dX, dscale, dbias) with is_learnable=1, "
            "else (dY, scale) -> dX"
        )

    def kernel(dy, *rest):
        require_dtype(op, dy, ("float32",))
        scale = rest[-1]
        view, _, c, _ = channel_view(op, dy, nchw)
        s = _channel_param(op, len(op.inputs) - 1, scale, c)
        dx = (view * _per_channel(s, nchw)).reshape(dy.shape)
        if not learnable:
            return dx
        x = rest[0]
        if x.shape != dy.shape:
            raise ShapeError(f"{op.where}: X '{op.inputs[1]}' has shape {list(x.shape)}, dY has {list(dy.shape)}")
        axes = _stat_axes(nchw)
        dscale = jnp.sum(view * x.reshape(view.shape).astype(dy.dtype), axis=axes).reshape(scale.shape)
        return dx, dscale, jnp.sum(view, axis=axes).reshape(scale.shape)

    return kernel


@register("ChannelStats", outputs=2, gradient=should_not_do_gradient)
def channel_stats(op: Op) -> Kernel:
    """`X -> (sum, sumsq)` per channel over N and the spatial positions, float only
    (caffe2/operators/channel_stats_op.cc)."""
    nchw = storage_order(op)

    def kernel(x):
        require_dtype(op, x, ("float32",))
        view, *_ = channel_view(op, x, nchw)
        axes = _stat_axes(nchw)
        return jnp.sum(view, axis=axes), jnp.sum(jnp.square(view), axis=axes)

    return kernel


@register("ChannelBackpropStats", inputs=4, outputs=2, gradient=should_not_do_gradient)
def channel_backprop_stats(op: Op) -> Kernel:
    """`(X, mean, inv_std, dY) -> (dscale, dbias)`: SpatialBNGradient's per-channel sums for NCHW X of
    rank 3 to 5 (caffe2/operators/channel_backprop_stats_op.cc, which checks no other size)."""

    def kernel(x, mean, inv_std, dy):
        require_dtype(op, x, ("float32",))
        if not 3 <= x.ndim <= 5:
            raise ShapeError(f"{op.where}: ChannelBackpropStats takes X of rank 3 to 5, got {list(x.shape)}")
        view, _, c, _ = channel_view(op, x, True)
        m, r = _channel_param(op, 1, mean, c), _channel_param(op, 2, inv_std, c)
        if dy.shape != x.shape:
            raise ShapeError(f"{op.where}: dY '{op.inputs[3]}' has shape {list(dy.shape)}, X has {list(x.shape)}")
        g = dy.reshape(view.shape).astype(x.dtype)
        dscale = jnp.sum((view - _per_channel(m, True)) * _per_channel(r, True) * g, axis=(0, 2))
        return dscale, jnp.sum(g, axis=(0, 2))

    return kernel


# ---------------------------------------------------------------------------------------------------
# LpNorm, Normalize, NormalizeL1, RMSNorm


def _lp_args(op: Op) -> tuple[int, bool]:
    p = op.int("p", 2)
    if p not in (1, 2):
        raise BadArgumentError(f"{op.where}: argument 'p' = {p} must be 1 or 2")
    return p, op.bool("average", False)


@register("LpNorm")
def lp_norm(op: Op) -> Kernel:
    """`X -> [Σ|x|]` (p=1) or `[Σx²]` (p=2, no square root), divided by numel with `average` (which
    Caffe2 refuses on an empty X); a 1-element vector, float only (caffe2/operators/lpnorm_op.cc)."""
    p, average = _lp_args(op)

    def kernel(x):
        require_dtype(op, x, ("float32",))
        if average and x.size == 0:
            raise ShapeError(f"{op.where}: LpNorm with average=1 of an empty '{op.inputs[0]}'")
        total = jnp.sum(jnp.abs(x) if p == 1 else jnp.square(x))
        size = np.float32(x.size if average else 1)
        return (total / size).reshape(1)

    return kernel


@facet("gradient", "LpNorm")
def _lp_norm_normalize_gradient_maker(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(X, dY)`; Normalize's maker enforces its one input."""
    if g.op.type == "Normalize":
        _enforce_for_gradient(len(g.op.input) == 1, "Normalize has one input")
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.GO(0)], [g.GI(0)])]


@register("LpNormGradient", inputs=2)
def lp_norm_gradient(op: Op) -> Kernel:
    """`(X, dnorm) -> dX`: `sign(X)·dnorm/size` (|x| <= 1e-12 counting as 0) or `2·X·dnorm/size`;
    dnorm must be a 1-element vector."""
    p, average = _lp_args(op)

    def kernel(x, dnorm):
        require_dtype(op, x, ("float32",))
        if dnorm.shape != (1,):
            raise ShapeError(f"{op.where}: dnorm '{op.inputs[1]}' must have shape [1], got {list(dnorm.shape)}")
        factor = dnorm.reshape(()).astype(x.dtype) / np.float32(x.size if average else 1)
        if p == 2:
            return x * np.float32(2) * factor
        eps = np.float32(1e-12)
        sign = jnp.where(x < -eps, np.float32(-1), jnp.where(x > eps, np.float32(1), np.float32(0)))
        return sign * factor

    return kernel


def _normalize_view(op: Op, x: jax.Array) -> tuple[jax.Array, int]:
    """X as [outer, m, inner] around `axis` (default -1); Caffe2 divides by m, so m = 0 is refused."""
    axis = canonical_axis(op, op.int("axis", -1), x.ndim)
    m = x.shape[axis]
    if m == 0:
        raise ShapeError(f"{op.where}: {op.type} along an empty axis of '{op.inputs[0]}' ({list(x.shape)})")
    return x.reshape(size_to_dim(x.shape, axis), m, size_from_dim(x.shape, axis + 1)), axis


@register("Normalize", gradient=_lp_norm_normalize_gradient_maker)
def normalize(op: Op) -> Kernel:
    """`Y = X / max(‖X‖₂, 1e-12)` along `axis` (caffe2/operators/normalize_op.h), float only."""
    op.int("axis", -1)

    def kernel(x):
        require_dtype(op, x, ("float32",))
        view, _ = _normalize_view(op, x)
        norm = jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(view), axis=1, keepdims=True)), np.float32(1e-12))
        return (view / norm).reshape(x.shape)

    return kernel


@register("NormalizeGradient", inputs=2)
def normalize_gradient(op: Op) -> Kernel:
    """`(X, dY) -> dX = dY/n - X·Σ(X·dY)/n³`, `n = max(‖X‖₂, 1e-12)` along `axis`."""
    op.int("axis", -1)

    def kernel(x, dy):
        require_dtype(op, x, ("float32",))
        view, _ = _normalize_view(op, x)
        if dy.shape != x.shape:
            raise ShapeError(f"{op.where}: dY '{op.inputs[1]}' has shape {list(dy.shape)}, X has {list(x.shape)}")
        g = dy.reshape(view.shape).astype(x.dtype)
        norm = jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(view), axis=1, keepdims=True)), np.float32(1e-12))
        dot = jnp.sum(view * g, axis=1, keepdims=True)
        return (g / norm - view / norm**3 * dot).reshape(x.shape)

    return kernel


@register("NormalizeL1", gradient=NO_GRADIENT)
def normalize_l1(op: Op) -> Kernel:
    """`Y = X / Σ|X|` along `axis` (caffe2/operators/normalize_l1_op.cc), float only. Where the sum is
    0 Caffe2 leaves Y unwritten (whatever memory held); here it is 0."""
    op.int("axis", -1)

    def kernel(x):
        require_dtype(op, x, ("float32",))
        view, _ = _normalize_view(op, x)
        norm = jnp.sum(jnp.abs(view), axis=1, keepdims=True)
        zero = norm == 0
        return jnp.where(zero, np.float32(0), view / jnp.where(zero, np.float32(1), norm)).reshape(x.shape)

    return kernel


@register(
    "RMSNorm",
    inputs=3,
    outputs=2,
    gradient=single_gradient("RMSNormGradient", "GO(0) I(0) I(1) O(1)", "GI(0) GI(1) GI(2)"),
)
def rms_norm(op: Op) -> Kernel:
    """`(X, gamma, beta) -> (Y, rrms)`: rows `size_to_dim(axis) x size_from_dim(axis)`, `rrms =
    1/sqrt(mean(x²) + eps)` shaped like X's dims before `axis`, `Y = X·rrms·gamma + beta`
    (caffe2/operators/rms_norm_op.cc). The C++ reads the argument `eps` (default 0), not the schema's
    documented `epsilon` (default 0.001), which it ignores; float or double, rank >= 2."""
    axis = op.int("axis", 1)
    eps = op.float("eps", 0.0)

    def kernel(x, gamma, beta):
        require_dtype(op, x, ("float32", "float64"))
        if x.ndim < 2:
            raise ShapeError(f"{op.where}: RMSNorm requires an input of rank >= 2, got {list(x.shape)}")
        k = canonical_axis(op, axis, x.ndim)
        m, n = size_to_dim(x.shape, k), size_from_dim(x.shape, k)
        g, b = _affine_param(op, 1, gamma, n), _affine_param(op, 2, beta, n)
        rows = x.reshape(m, n)
        rrms = 1 / jnp.sqrt(jnp.mean(jnp.square(rows), axis=1, keepdims=True) + jnp.asarray(eps, x.dtype))
        y = rrms * rows * g + b
        return y.reshape(x.shape), rrms.reshape(x.shape[:k])

    return kernel


@register("RMSNormGradient", inputs=4, outputs=3)
def rms_norm_gradient(op: Op) -> Kernel:
    """`(dY, X, gamma, rrms) -> (dX, dgamma, dbeta)`: `dX = rrms·gamma·dY - X·rrms³·Σ(dY·X·gamma)/N`
    per row, `dgamma = Σ_rows dY·X·rrms`, `dbeta = Σ_rows dY` (both shaped like gamma)."""
    axis = op.int("axis", 1)

    def kernel(dy, x, gamma, rrms):
        require_dtype(op, dy, ("float32", "float64"))
        k = canonical_axis(op, axis, x.ndim)
        m, n = size_to_dim(x.shape, k), size_from_dim(x.shape, k)
        g = _affine_param(op, 2, gamma, n, "gamma")
        if dy.shape != x.shape:
            raise ShapeError(f"{op.where}: dY '{op.inputs[0]}' has shape {list(dy.shape)}, X has {list(x.shape)}")
        if rrms.size != m:
            raise ShapeError(f"{op.where}: rrms '{op.inputs[3]}' has {rrms.size} elements, expected {m}")
        d, rows, r = dy.reshape(m, n), x.reshape(m, n), rrms.reshape(m, 1)
        if m == 0:
            zeros = jnp.zeros(gamma.shape, dy.dtype)
            return jnp.zeros(x.shape, dy.dtype), zeros, zeros
        ds = jnp.sum(d * rows * g, axis=1, keepdims=True)
        dx = r * d * g - (ds * r**3 / jnp.asarray(n, dy.dtype)) * rows
        return (
            dx.reshape(x.shape),
            jnp.sum(d * rows * r, axis=0).reshape(gamma.shape),
            jnp.sum(d, axis=0).reshape(gamma.shape),
        )

    return kernel


@register("BatchBoxCox", inputs=3, gradient=gradient_not_implemented_yet)
def batch_box_cox(op: Op) -> Kernel:
    """`(data[N, D...], lambda1[D], lambda2[D]) -> Y`: with `t = max(x + lambda2, 1e-6)`, `log(t)` where
    lambda1 is 0, else `(t^lambda1 - 1)/lambda1`, per column; float or double
    (caffe2/operators/batch_box_cox_op.cc). An empty input is returned before the lambdas are checked."""
    op.int("min_block_size", 256)

    def kernel(x, lambda1, lambda2):
        require_dtype(op, x, ("float32", "float64"))
        if x.ndim < 1:
            raise ShapeError(f"{op.where}: BatchBoxCox needs data of rank >= 1, got a scalar")
        if x.size == 0:
            return x
        d = size_from_dim(x.shape, 1)
        for index, value in ((1, lambda1), (2, lambda2)):
            if value.dtype != x.dtype or value.size != d:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[index]}' must hold {d} {x.dtype} values (one per column), got "
                    f"{value.dtype}{list(value.shape)}"
                )
        rows = x.reshape(x.shape[0], d)
        l1, l2 = lambda1.reshape(d), lambda2.reshape(d)
        t = jnp.maximum(rows + l2, jnp.asarray(1e-6, x.dtype))
        zero = l1 == 0
        safe = jnp.where(zero, jnp.ones((), x.dtype), l1)
        y = jnp.where(zero, jnp.log(t), (jnp.power(t, safe) - 1) / safe)
        return y.reshape(x.shape)

    return kernel
