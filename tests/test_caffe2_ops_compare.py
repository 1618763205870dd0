"""Differential tests of the comparison (EQ NE LT LE GT GE) and logical (And Or Xor Not) ops against real
Caffe2, in both broadcast modes. None has a gradient (Caffe2's makers refuse; so do the builder's)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_caffe2_ops_elementwise import broadcast_shapes

from differential import Case, arrays, cases, invalid, run_case, shapes
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op

COMPARABLE = (np.bool_, np.int32, np.int64, np.float32, np.float64)
OTHER = (np.int32, np.int64, np.float32, np.float64)


def _values(data: st.DataObject, shape, dtype):
    """Few distinct values, so that equal elements are common."""
    if np.dtype(dtype) == np.bool_:
        return data.draw(arrays(shape, np.bool_))
    return data.draw(arrays(shape, np.int8, -2, 2)).astype(dtype) / (2 if np.dtype(dtype).kind == "f" else 1)


def _binary(op_type: str, dtypes):
    def draw(data: st.DataObject):
        dtype = data.draw(st.sampled_from(dtypes))
        a_shape, b_shape, args = broadcast_shapes(data)
        b_dtype = data.draw(st.sampled_from(COMPARABLE)) if invalid(data) else dtype
        op = create_operator(op_type, ["A", "B"], ["C"], **args)
        return op, {"A": _values(data, a_shape, dtype), "B": _values(data, b_shape, b_dtype)}

    return draw


def draw_not(data: st.DataObject):
    dtype = data.draw(st.sampled_from(OTHER)) if invalid(data) else np.bool_
    return create_operator("Not", ["X"], ["Y"]), {"X": _values(data, data.draw(shapes(0, 4, min_side=0)), dtype)}


LOGICAL_DTYPES = (np.bool_,) * 6 + OTHER  # mostly bool; the others are refused

CASES = cases(
    *(Case(t, _binary(t, COMPARABLE)) for t in ("EQ", "NE", "LT", "LE", "GT", "GE")),
    *(Case(t, _binary(t, LOGICAL_DTYPES)) for t in ("And", "Or", "Xor")),
    Case("Not", draw_not),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_compare(caffe2, case, data):
    run_case(caffe2, case, data)


@pytest.mark.parametrize("op_type", list(CASES))
def test_no_gradient(caffe2, op_type):
    """SHOULD_NOT_DO_GRADIENT: Caffe2's maker throws, and so does the builder's."""
    inputs = ["X"] if op_type == "Not" else ["A", "B"]
    op = create_operator(op_type, inputs, ["Y"])
    with pytest.raises(Caffe2Error, match="should not call gradient"):
        caffe2.gradient_for_op(op, ["Y_grad"])
    with pytest.raises(GradientError, match="should not call gradient"):
        get_gradient_for_op(op, ["Y_grad"])
