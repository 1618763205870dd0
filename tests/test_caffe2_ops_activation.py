"""Differential tests of the activations (Relu LeakyRelu Sigmoid Tanh Softsign Softmax) and their
gradient ops against real Caffe2."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, run_case, shapes
from rnn2jax.caffe2.core import create_operator

# Caffe2's CPU kernels take float32 only. rnn2jax accepts doubles on purpose (its float64 verification
# mode, rnn2jax/verify.py), so the refused dtypes drawn are integers.
OTHER = (np.int32, np.int64)


def _invalid(data: st.DataObject) -> bool:
    return data.draw(st.integers(0, 7)) == 0


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """Subnormal floats as 0. XLA's CPU backend flushes them (FTZ/DAZ): under jit `1e-40 > 0` is false,
    so ReluGradient/LeakyReluGradient (and AbsGradient) would take the other branch than Caffe2's. A
    platform property, not rnn2jax's semantics, so such inputs are not drawn."""
    if x.dtype.kind == "f":
        x[np.abs(x) < np.finfo(x.dtype).tiny] = 0
    return x


def _input(data: st.DataObject, min_dims: int = 0, low: float = -3.0, high: float = 3.0):
    dtype = data.draw(st.sampled_from(OTHER)) if _invalid(data) else np.float32
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
    if _invalid(data):
        axis = data.draw(st.sampled_from([x.ndim, -x.ndim - 1]))
    else:
        axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    args = {"axis": axis} if axis != 1 or data.draw(st.booleans()) else {}
    return create_operator("Softmax", ["X"], ["Y"], **args), {"X": x}


CASES = cases(
    Case("Relu", _simple("Relu"), gradient_ops=("ReluGradient",)),
    Case("LeakyRelu", _simple("LeakyRelu", alpha=st.floats(-1, 2, width=32)), gradient_ops=("LeakyReluGradient",)),
    Case("Sigmoid", _simple("Sigmoid"), gradient_ops=("SigmoidGradient",)),
    Case("Tanh", _simple("Tanh"), gradient_ops=("TanhGradient",)),
    Case("Softsign", _simple("Softsign"), gradient_ops=("SoftsignGradient",)),
    Case("Softmax", draw_softmax, gradient_ops=("SoftmaxGradient",), gradient_cancels=True),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_activation(caffe2, case, data):
    with jax.enable_x64(True):  # float64 stays float64 (and is refused, as by Caffe2)
        run_case(caffe2, case, data)
