"""Differential tests of LayerNorm and Dropout (and their gradient ops) against real Caffe2.

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

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, dims, run_case, run_rnn2jax, shapes
from rnn2jax.caffe2.core import create_operator


def _invalid(data: st.DataObject) -> bool:
    return data.draw(st.integers(0, 7)) == 0


# --------------------------------------------------------------------------------------------------
# Dropout


def draw_dropout(data: st.DataObject):
    """is_test=1 with any ratio and the output Y alone (Caffe2 leaves a mask output unwritten, see
    test_dropout_test_mode_leaves_mask_unwritten); is_test=0 with ratio 0 and (Y, mask). Invalid draws:
    no is_test (Caffe2's schema requires it), a ratio outside [0, 1), training without the mask
    output, a double input."""
    dtype = np.int32 if _invalid(data) else np.float32  # doubles: see test_layer_norm_double
    x = data.draw(arrays(shapes(0, 4, min_side=0), dtype))
    is_test = data.draw(st.booleans())
    args: dict = {"is_test": int(is_test)}
    outputs = ["Y"] if is_test else ["Y", "mask"]
    if is_test:
        if data.draw(st.booleans()):
            args["ratio"] = data.draw(st.floats(0, 0.9375, width=32))
    else:
        args["ratio"] = 0.0
    if _invalid(data):
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
    dtype = np.int32 if _invalid(data) else np.float32  # doubles: see test_layer_norm_double
    shape = tuple(data.draw(st.lists(dims(0, 4), min_size=2 if not _invalid(data) else 1, max_size=4)))
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
        if _invalid(data) and x.size:  # Caffe2 checks gamma/beta only when X is not empty
            param_shape = (n + 1,)
        inputs["gamma"] = data.draw(arrays(param_shape, dtype, -2, 2))
        inputs["beta"] = data.draw(arrays(param_shape, dtype, -2, 2))
    op = create_operator("LayerNorm", list(inputs), ["Y", "mean", "std"], **args)
    return op, inputs


@given(data=st.data())
def test_layer_norm_double(caffe2, data):
    """LayerNorm runs in double in Caffe2 (LayerNormGradient and Dropout do not; rnn2jax accepts doubles
    there on purpose, for its float64 verification mode, rnn2jax/verify.py)."""
    op, inputs = draw_layer_norm(data)
    with jax.enable_x64(True):
        check_op(caffe2, op, {name: value.astype(np.float64) for name, value in inputs.items()})


CASES = cases(
    Case("Dropout", draw_dropout, gradient_ops=("DropoutGrad",)),
    Case("LayerNorm", draw_layer_norm, gradient_ops=("LayerNormGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_norm(caffe2, case, data):
    with jax.enable_x64(True):  # float64 stays float64, as in Caffe2
        run_case(caffe2, case, data)
