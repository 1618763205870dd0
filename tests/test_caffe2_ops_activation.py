"""Differential tests of the activations (Relu LeakyRelu Sigmoid Tanh Softsign Softmax Swish Mish HardSigmoid
Elu Selu ReluN ThresholdedRelu Softplus Gelu PRelu Glu) and their gradient ops against real Caffe2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, invalid, run_case, shapes
from rnn2jax.caffe2.opdef import create_operator

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
