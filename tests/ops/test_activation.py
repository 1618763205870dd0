"""The activation family (rnn2jax/ops/activation.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: Nonlinearities against NumPy references written from Caffe2's documented
semantics.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the activations (Relu
LeakyRelu Sigmoid Tanh Softsign Softmax Swish Mish HardSigmoid Elu Selu ReluN ThresholdedRelu Softplus Gelu PRelu
Glu) and their gradient ops against real Caffe2.

Gradient ops against references and jax.vjp: Gradient ops of the nonlinearities against NumPy references written
from Caffe2's kernels (caffe2/operators/{sigmoid,tanh,relu,leaky_relu,softsign,softmax}_op.cc) and against `jax.vjp`
of the forward op.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, cases, invalid, run_case, shapes
from helpers import forward, run_op
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.errors import BadArgumentError, ShapeError

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_activation.py)

RTOL, ATOL = 1e-5, 1e-6


def floats(min_dims: int = 0, max_dims: int = 3, bound: float = 20.0):
    return hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=4),
        elements=st.floats(-bound, bound, width=32),
    )


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


ELEMENTWISE = {
    "Sigmoid": _sigmoid,
    "Tanh": lambda x: np.tanh(x.astype(np.float64)),
    "Relu": lambda x: np.where(x > 0, x, 0),
    "Softsign": lambda x: x.astype(np.float64) / (1 + np.abs(x.astype(np.float64))),
}


@pytest.mark.parametrize("op_type", sorted(ELEMENTWISE))
@given(x=floats())
def test_elementwise(jit, op_type, x):
    (y,) = run_op(op_type, [x], jit=jit)
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ELEMENTWISE[op_type](x), rtol=RTOL, atol=ATOL)


@given(x=floats(), alpha=st.floats(-2, 2, width=32))
def test_leaky_relu(jit, x, alpha):
    (y,) = run_op("LeakyRelu", [x], jit=jit, alpha=alpha)
    expected = np.where(x > 0, x, np.float32(alpha) * x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)


def test_leaky_relu_default_alpha(jit):
    x = np.array([-100.0, -1.0, 0.0, 2.5], np.float32)
    (y,) = run_op("LeakyRelu", [x], jit=jit)
    np.testing.assert_allclose(y, [-1.0, -0.01, 0.0, 2.5], rtol=RTOL)


def _softmax_2d(x, axis):
    """Caffe2: X viewed as prod(dims[:axis]) x prod(dims[axis:]); softmax of each row."""
    k = axis % x.ndim
    rows = x.astype(np.float64).reshape(int(np.prod(x.shape[:k])), int(np.prod(x.shape[k:])))
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)


@given(data=st.data())
def test_softmax(jit, data):
    x = data.draw(
        hnp.arrays(
            np.float32,
            hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4),
            elements=st.floats(-50, 50, width=32),
        ),
        label="x",
    )
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    (y,) = run_op("Softmax", [x], jit=jit, axis=axis)
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, _softmax_2d(x, axis), rtol=RTOL, atol=ATOL)


def test_softmax_default_axis_flattens_trailing_dims(jit):
    x = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2) / 4
    (y,) = run_op("Softmax", [x], jit=jit)
    np.testing.assert_allclose(y, _softmax_2d(x, 1), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(y.reshape(2, -1).sum(axis=1), [1.0, 1.0], rtol=RTOL)


def test_softmax_is_stabilised(jit):
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], np.float32)
    (y,) = run_op("Softmax", [x], jit=jit)
    np.testing.assert_allclose(y, [[0.5, 0.5], [0.0, 1.0]], atol=ATOL)


def test_softmax_empty(jit):
    x = np.zeros((0, 3), np.float32)
    (y,) = run_op("Softmax", [x], jit=jit)
    assert y.shape == (0, 3)


def test_softmax_axis_out_of_range(jit):
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        run_op("Softmax", [np.zeros((2, 3), np.float32)], jit=jit, axis=2)
    with pytest.raises(ShapeError, match="axis 1 is out of range"):
        run_op("Softmax", [np.zeros((3,), np.float32)], jit=jit)


def test_bad_arguments(jit):
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(BadArgumentError, match="'alpha'"):
        run_op("LeakyRelu", [x], jit=jit, alpha="big")
    with pytest.raises(BadArgumentError, match="'axis'"):
        run_op("Softmax", [x], jit=jit, axis=1.5)
    with pytest.raises(BadArgumentError, match="Relu takes 1 inputs"):
        run_op("Relu", [x, x], jit=jit)


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_activation.py)

# Caffe2's CPU kernels take float32 only. rnn2jax accepts doubles on purpose (its float64 verification
# mode, rnn2jax/checking/verification.py), so the refused dtypes drawn are integers.
OTHER = (np.int32, np.int64)


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """Subnormal floats as 0. XLA's CPU backend flushes them (FTZ/DAZ): under jit `1e-40 > 0` is false,
    so ReluGradient/LeakyReluGradient (and AbsGradient) would take the other branch than Caffe2's. A
    platform property, not rnn2jax's semantics, so such inputs are not drawn."""
    if x.dtype.kind == "f":
        x[np.abs(x) < np.finfo(x.dtype).tiny] = 0
    return x


def _input(data: st.DataObject, min_dims: int = 0, low: float = -3.0, high: float = 3.0):
    dtype = data.draw(st.sampled_from(OTHER)) if invalid(data) else np.float32
    return flush_subnormals(data.draw(arrays(shapes(min_dims, 4, min_side=0), dtype, low, high)))


def _simple(op_type: str, **arg_strategies):
    def draw(data: st.DataObject):
        args = {name: data.draw(s) for name, s in arg_strategies.items() if data.draw(st.booleans())}
        x = _input(data)
        if op_type == "Relu" and x.size and data.draw(st.booleans()):
            x.flat[0] = 0  # Y == 0: no gradient
        return create_operator(op_type, ["X"], ["Y"], **args), {"X": x}

    return draw


def draw_softmax(data: st.DataObject):
    x = _input(data, min_dims=1, low=-10, high=10)
    if invalid(data):
        axis = data.draw(st.sampled_from([x.ndim, -x.ndim - 1]))
    else:
        axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    args = {"axis": axis} if axis != 1 or data.draw(st.booleans()) else {}
    return create_operator("Softmax", ["X"], ["Y"], **args), {"X": x}


def _with_args(op_type: str, low: float = -3.0, high: float = 3.0, **arg_strategies):
    """X in [low, high]; each argument drawn (or left to its default) from its strategy, which gets the
    invalid flag: `arg_strategies[name](invalid)`."""

    def draw(data: st.DataObject):
        args = {}
        for name, strategy in arg_strategies.items():
            if data.draw(st.booleans()):
                args[name] = data.draw(strategy(invalid(data)))
        x = _input(data, low=low, high=high)
        return create_operator(op_type, ["X"], ["Y"], **args), {"X": x}

    return draw


def _floats(low: float, high: float, bad=None):
    """A float32 argument in [low, high]; when invalid, one of `bad` (values Caffe2 refuses)."""
    # no subnormal arguments: XLA flushes them (an alpha of 5e-40 is 0 there, not in Caffe2)
    finite = st.floats(low, high, width=32, allow_subnormal=False)
    return lambda invalid: st.sampled_from(bad) if invalid and bad else finite


def draw_prelu(data: st.DataObject):
    """One slope per channel (dim 1 in NCHW, the last in NHWC) or one shared; invalid: a wrong count."""
    order = data.draw(st.sampled_from([None, "NCHW", "NHWC"]))
    x = _input(data, min_dims=1 if order == "NHWC" else 2)
    if order == "NHWC" and x.shape[-1] == 0:  # Caffe2 divides by C in NHWC: SIGFPE with no channels
        x = np.zeros((*x.shape[:-1], 1), x.dtype)
    channels = x.shape[-1] if order == "NHWC" else x.shape[1]
    count = data.draw(st.sampled_from([1, channels]))
    if invalid(data):
        count = channels + 2
    w_shape = data.draw(st.sampled_from([(count,), (1, count)]))
    w = data.draw(arrays(w_shape, np.float32, -1, 1))
    args = {"order": order} if order else {}
    return create_operator("PRelu", ["X", "W"], ["Y"], **args), {"X": x, "W": w}


def draw_glu(data: st.DataObject):
    """X split in halves along `dim` (-1, the last), which must be even."""
    x = _input(data, min_dims=1)
    axis = data.draw(st.integers(0, x.ndim - 1))
    if x.shape[axis] % 2 and not invalid(data):
        x = np.concatenate([x, x], axis=axis)
    args = {}
    if axis != x.ndim - 1 or data.draw(st.booleans()):
        args["dim"] = axis if axis != x.ndim - 1 or data.draw(st.booleans()) else -1
    return create_operator("Glu", ["X"], ["Y"], **args), {"X": x}


CASES = cases(
    Case("Relu", _simple("Relu"), gradient_ops=("ReluGradient",)),
    Case(
        "LeakyRelu",
        _simple("LeakyRelu", alpha=st.floats(-1, 2, width=32, allow_subnormal=False)),
        gradient_ops=("LeakyReluGradient",),
    ),
    Case("Sigmoid", _simple("Sigmoid"), gradient_ops=("SigmoidGradient",)),
    Case("Tanh", _simple("Tanh"), gradient_ops=("TanhGradient",)),
    Case("Softsign", _simple("Softsign"), gradient_ops=("SoftsignGradient",)),
    Case("Softmax", draw_softmax, gradient_ops=("SoftmaxGradient",), gradient_cancels=True),
    Case("Swish", _with_args("Swish", -5, 5), gradient_ops=("SwishGradient",)),
    Case("Mish", _with_args("Mish", -5, 5), gradient_ops=("MishGradient",)),
    Case(
        "HardSigmoid",
        _with_args("HardSigmoid", alpha=_floats(-1, 1), beta=_floats(-1, 1)),
        gradient_ops=("HardSigmoidGradient",),
    ),
    Case("Elu", _with_args("Elu", alpha=_floats(-1, 2)), gradient_ops=("EluGradient",)),
    Case(
        "Selu",
        _with_args("Selu", alpha=_floats(0, 2), scale=_floats(1.0625, 2, bad=[1.0, 0.5, -1.0])),
        gradient_ops=("SeluGradient",),
    ),
    Case("ReluN", _with_args("ReluN", n=_floats(0.125, 4, bad=[0.0, -1.0])), gradient_ops=("ReluNGradient",)),
    Case(
        "ThresholdedRelu",
        _with_args("ThresholdedRelu", alpha=_floats(-1, 2)),
        gradient_ops=("ThresholdedReluGradient",),
        note="gradient dY * sign(Y) as in Caffe2, wrong for outputs in (alpha, 0) when alpha < 0",
    ),
    Case("Softplus", _with_args("Softplus", -5, 5), gradient_ops=("SoftplusGradient",)),
    Case("Gelu", _with_args("Gelu", fast_gelu=lambda invalid: st.booleans()), gradient_ops=("GeluGradient",)),
    Case("PRelu", draw_prelu, gradient_ops=("PReluGradient",)),
    Case("Glu", draw_glu, note="no gradient in Caffe2"),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_activation(caffe2, case, data):
    run_case(caffe2, case, data)


# ----------------------------------------------------------------------------------------------------
# Gradient ops against references and jax.vjp (was tests/ops/test_activation.py)

RTOL_GRAD, ATOL_GRAD = 1e-5, 1e-6


def vjp_of(op_type: str, x: np.ndarray, dy: np.ndarray, **args) -> tuple[np.ndarray, np.ndarray]:
    """(Y, dX) of the forward op at x for the output gradient dy."""
    fn = forward(op_type, 1, **args)
    y, pullback = jax.vjp(lambda a: fn(a)[0], x)
    return np.asarray(y), np.asarray(pullback(dy)[0])


def pair(min_dims: int = 0, max_dims: int = 3, bound: float = 6.0):
    """(x, dy) of one small shape."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=3).flatmap(
        lambda shape: st.tuples(
            hnp.arrays(np.float32, shape, elements=st.floats(-bound, bound, width=32, allow_subnormal=False)),
            hnp.arrays(np.float32, shape, elements=st.floats(-5, 5, width=32, allow_subnormal=False)),
        )
    )


def close(actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL_GRAD, atol: float = ATOL_GRAD) -> None:
    assert actual.shape == np.shape(expected) and actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------------
# Sigmoid, Tanh, Relu, LeakyRelu, Softsign


@given(xs=pair())
def test_sigmoid_gradient(jit, xs):
    x, dy = xs
    y, vjp = vjp_of("Sigmoid", x, dy)
    (dx,) = run_op("SigmoidGradient", [y, dy], jit=jit)
    y64 = y.astype(np.float64)
    close(dx, dy * y64 * (1 - y64))
    close(dx, vjp)


@given(xs=pair())
def test_tanh_gradient(jit, xs):
    x, dy = xs
    y, vjp = vjp_of("Tanh", x, dy)
    (dx,) = run_op("TanhGradient", [y, dy], jit=jit)
    close(dx, dy * (1 - y.astype(np.float64) ** 2))
    close(dx, vjp)


@given(xs=pair())
def test_relu_gradient(jit, xs):
    x, dy = xs
    y, vjp = vjp_of("Relu", x, dy)
    (dx,) = run_op("ReluGradient", [y, dy], jit=jit)
    np.testing.assert_array_equal(dx, np.where(y > 0, dy, 0))
    # jnp.maximum splits the gradient at a tie (x == 0); Caffe2's kernel gives 0 there.
    np.testing.assert_array_equal(dx[x != 0], vjp[x != 0])


def test_relu_gradient_at_zero(jit):
    """The test is Y > 0: where Y is 0 (the input was <= 0) the gradient is 0."""
    y = np.array([0.0, -0.0, 1e-30, 2.0], np.float32)
    dy = np.array([3.0, 3.0, 3.0, 3.0], np.float32)
    (dx,) = run_op("ReluGradient", [y, dy], jit=jit)
    np.testing.assert_array_equal(dx, [0.0, 0.0, 3.0, 3.0])


def _leaky_relu_grad(y: np.ndarray, dy: np.ndarray, alpha: float) -> np.ndarray:
    """leaky_relu_op.cc: gtZero = (Y >= 0); dX = dY*gtZero - dY*(gtZero - 1)*alpha."""
    gt = (y >= 0).astype(np.float32)
    return dy * gt - dy * (gt - 1) * np.float32(alpha)


@given(xs=pair(), alpha=st.sampled_from([0.01, 0.2, 1.5]))
def test_leaky_relu_gradient(jit, xs, alpha):
    x, dy = xs
    y, vjp = vjp_of("LeakyRelu", x, dy, alpha=alpha)
    (dx,) = run_op("LeakyReluGradient", [y, dy], jit=jit, alpha=alpha)
    close(dx, _leaky_relu_grad(y, dy, alpha))
    # Away from Y == 0 (where the forward's max/min split the gradient) this is the vjp.
    close(dx[y != 0], vjp[y != 0])


@given(xs=pair(), alpha=st.sampled_from([0.0, -0.5]))
def test_leaky_relu_gradient_tests_y(jit, xs, alpha):
    """The branch is chosen on Y, not X: with alpha <= 0 a negative input gives Y >= 0 and so the
    gradient dY, unlike the true derivative alpha (Caffe2's behaviour, kept)."""
    x, dy = xs
    (y,) = run_op("LeakyRelu", [x], jit=jit, alpha=alpha)
    (dx,) = run_op("LeakyReluGradient", [y, dy], jit=jit, alpha=alpha)
    close(dx, _leaky_relu_grad(y, dy, alpha))


def test_leaky_relu_gradient_default_alpha_and_size(jit):
    """alpha defaults to 0.01; Caffe2 only needs Y and dY to have one size, dX takes Y's shape."""
    y = np.array([[-1.0, 0.0], [2.0, -3.0]], np.float32)
    dy = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    (dx,) = run_op("LeakyReluGradient", [y, dy], jit=jit)
    np.testing.assert_allclose(dx, np.array([[0.01, 2.0], [3.0, 0.04]], np.float32), rtol=1e-7)
    with pytest.raises(ShapeError, match=r"LeakyReluGradient.*one size"):
        run_op("LeakyReluGradient", [y, dy[:3]], jit=jit)


@given(xs=pair())
def test_softsign_gradient(jit, xs):
    """The maker passes the forward INPUT X: dX = dY / (1 + |X|)^2."""
    x, dy = xs
    _, vjp = vjp_of("Softsign", x, dy)
    (dx,) = run_op("SoftsignGradient", [x, dy], jit=jit)
    close(dx, dy / (1 + np.abs(x.astype(np.float64))) ** 2)
    close(dx, vjp)


@pytest.mark.parametrize("op_type", ["SigmoidGradient", "TanhGradient", "ReluGradient", "SoftsignGradient"])
def test_elementwise_gradient_bad_inputs(jit, op_type):
    y = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match=rf"{op_type}.*'Y' and 'dY' of one shape"):
        run_op(op_type, [y, np.zeros((3, 2), np.float32)], jit=jit, input_names=["Y", "dY"])
    with pytest.raises(ShapeError, match=rf"{op_type} takes float inputs, 'Y' is int32"):
        run_op(op_type, [y.astype(np.int32), y], jit=jit, input_names=["Y", "dY"])


# ---------------------------------------------------------------------------------------------------
# Softmax


@given(data=st.data())
def test_softmax_gradient(jit, data):
    x, dy = data.draw(pair(min_dims=1, max_dims=4), label="x, dy")
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    y, vjp = vjp_of("Softmax", x, dy, axis=axis)
    (dx,) = run_op("SoftmaxGradient", [y, dy], jit=jit, axis=axis)
    # Rows are the 2-D view size_to_dim(axis) x size_from_dim(axis), as in the forward.
    k = axis % x.ndim
    shape = (int(np.prod(x.shape[:k])), int(np.prod(x.shape[k:])))
    rows, drows = y.astype(np.float64).reshape(shape), dy.astype(np.float64).reshape(shape)
    expected = rows * (drows - (rows * drows).sum(axis=1, keepdims=True))
    # dY - sum(dY*Y) cancels when dY is nearly constant along a row: absolute error ~ ulp(max|dY|).
    atol = ATOL_GRAD * max(1.0, float(np.abs(dy).max(initial=0)))
    close(dx, expected.reshape(x.shape), atol=atol)
    close(dx, vjp, atol=atol)


def test_softmax_gradient_default_axis(jit):
    """axis defaults to 1: on a 3-D input the sum runs over the last two dims together."""
    y = np.full((2, 2, 3), 1 / 6, np.float32)
    dy = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    (dx,) = run_op("SoftmaxGradient", [y, dy], jit=jit)
    block = dy.reshape(2, 6)
    expected = (block - block.mean(axis=1, keepdims=True)) / 6
    np.testing.assert_allclose(dx, expected.reshape(2, 2, 3), rtol=RTOL_GRAD, atol=ATOL_GRAD)


def test_softmax_gradient_bad_inputs(jit):
    y = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"SoftmaxGradient.*axis 2 is out of range"):
        run_op("SoftmaxGradient", [y, y], jit=jit, axis=2)
    with pytest.raises(ShapeError, match=r"SoftmaxGradient.*'Y' and 'dY' of one shape"):
        run_op("SoftmaxGradient", [y, y.T], jit=jit, input_names=["Y", "dY"])
