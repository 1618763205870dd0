"""The math family (rnn2jax/ops/math.py): its lowering, gradient ops and builder makers.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the math ops (unary
functions, Logit, Pow, Mod, bitwise, Max/Min/Mean, the row-wise products and distances, the value checks) and their
gradient ops against real Caffe2.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_elementwise import broadcast_shapes, legacy_shapes

from differential import Case, arrays, cases, check_gradient, dims, invalid, run_case, shapes
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op

# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_math.py)

FLOAT32 = (np.float32,)
FLOATS = (np.float32, np.float64)
INTS = (np.int32, np.int64)
NUMERIC = (np.int32, np.int64, np.float32, np.float64)


def _values(data: st.DataObject, shape, dtype, low=-1.0, high=1.0):
    """Floats in [low, high] (subnormals flushed: XLA's CPU flushes them, see test_caffe2_ops_activation);
    integers in [-5, 5]; bools."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return data.draw(arrays(shape, np.bool_))
    if dtype.kind in "iu":
        return data.draw(arrays(shape, dtype, -5, 5))
    x = data.draw(arrays(shape, dtype, low, high))
    x[np.abs(x) < np.finfo(dtype).tiny] = 0
    return x


def _shape(data: st.DataObject, min_dims: int = 0, max_dims: int = 4, min_side: int = 0):
    return data.draw(shapes(min_dims, max_dims, min_side=min_side, max_side=4))


def _float_or_refused(data: st.DataObject, dtypes=FLOAT32, refused=INTS):
    return data.draw(st.sampled_from(refused if invalid(data) else dtypes))


# --------------------------------------------------------------------------------------------------
# Unary functions


def _unary(op_type: str, low: float = -3.0, high: float = 3.0, dtypes=FLOAT32, refused=INTS, nonzero=False):
    def draw(data: st.DataObject):
        dtype = _float_or_refused(data, dtypes, refused)
        x = _values(data, _shape(data), dtype, low, high)
        if nonzero and x.dtype.kind == "f":
            x = np.where(np.abs(x) < 0.25, 0.5, x).astype(x.dtype)
        return create_operator(op_type, ["X"], ["Y"]), {"X": x}

    return draw


def draw_logit(data: st.DataObject):
    """X around [0, 1] so both clamps are hit. At least 1-D with a nonempty last dim: Caffe2's
    LogitGradient divides by the last dim and crashes (SIGFPE / reads a 0-d tensor's missing dim)."""
    args = {}
    if data.draw(st.booleans()):
        args["eps"] = data.draw(
            st.sampled_from([0.0, -0.1, 0.5, 0.7])
            if invalid(data)
            else st.floats(2.0**-20, 0.4375, width=32, allow_subnormal=False)
        )
    x = _values(data, _shape(data, 1, 3, min_side=1), _float_or_refused(data), -0.5, 1.5)
    return create_operator("Logit", ["X"], ["Y"], **args), {"X": x}


# --------------------------------------------------------------------------------------------------
# Value checks


def _with_specials(data: st.DataObject, x: np.ndarray, specials=(np.nan, np.inf, -np.inf)) -> np.ndarray:
    if x.size and x.dtype.kind == "f" and data.draw(st.integers(0, 3)) == 0:
        x = x.copy()
        x.flat[data.draw(st.integers(0, x.size - 1))] = data.draw(st.sampled_from(specials))
    return x


def draw_replace_nan(data: st.DataObject):
    x = _values(data, _shape(data), _float_or_refused(data, FLOATS))
    x = _with_specials(data, _with_specials(data, x))
    args = {"value": data.draw(st.floats(-3, 3, width=32, allow_subnormal=False))} if data.draw(st.booleans()) else {}
    return create_operator("ReplaceNaN", ["X"], ["Y"], **args), {"X": x}


def draw_enforce_finite(data: st.DataObject):
    x = _with_specials(data, _values(data, _shape(data), _float_or_refused(data, FLOATS)))
    return create_operator("EnforceFinite", ["X"], []), {"X": x}


def draw_nan_check(data: st.DataObject):
    """Only input 0 is checked; the others (any shape) are printed by Caffe2 when the check fails."""
    n = data.draw(st.integers(1, 3))
    names = [f"X{i}" for i in range(n)]
    dtype = _float_or_refused(data)
    inputs = {name: _with_specials(data, _values(data, _shape(data), dtype)) for name in names}
    return create_operator("NanCheck", names, ["Y"]), inputs


def draw_is_nan(data: st.DataObject):
    x = _with_specials(data, _values(data, _shape(data), _float_or_refused(data, FLOATS)))
    return create_operator("IsNaN", ["X"], ["Y"]), {"X": x}


# --------------------------------------------------------------------------------------------------
# Pow


def draw_pow(data: st.DataObject):
    """The `exponent` argument, an exponent tensor of X's shape, or (broadcast=1) a scalar or legacy block.
    X positive so that the exponent's gradient (log X) is finite."""
    dtype = _float_or_refused(data)
    mode = data.draw(st.sampled_from(["argument", "same", "broadcast"]))
    if mode == "argument":
        args = {} if invalid(data) else {"exponent": data.draw(st.floats(-2, 3, width=32, allow_subnormal=False))}
        x = _values(data, _shape(data), dtype, 0.25, 2.0)
        return create_operator("Pow", ["X"], ["Y"], **args), {"X": x}
    if mode == "same":
        a_shape = _shape(data)
        b_shape = a_shape
        args = {"broadcast": 0} if data.draw(st.booleans()) else {}
        if invalid(data):
            if data.draw(st.booleans()):
                b_shape = (*a_shape, 2)
            else:
                args["axis"] = 0
    else:
        a_shape, b_shape, args = legacy_shapes(data)
        args = {"broadcast": 1, **args}
        if invalid(data) and b_shape:
            b_shape = (*b_shape[:-1], b_shape[-1] + 2)
    op = create_operator("Pow", ["X", "E"], ["Y"], **args)
    return op, {"X": _values(data, a_shape, dtype, 0.25, 2.0), "E": _values(data, b_shape, dtype, -2.0, 2.0)}


# --------------------------------------------------------------------------------------------------
# Mod, bitwise, IsMemberOf


def draw_mod(data: st.DataObject):
    dtype = data.draw(st.sampled_from(FLOAT32 if invalid(data) else INTS))
    x = data.draw(arrays(_shape(data), dtype, -20, 20))
    args = {"divisor": data.draw(st.sampled_from([0]) if invalid(data) else st.integers(-7, 7).filter(bool))}
    if data.draw(st.booleans()):
        args["sign_follow_divisor"] = data.draw(st.booleans())
    return create_operator("Mod", ["X"], ["Y"], **args), {"X": x}


def _bitwise(op_type: str):
    def draw(data: st.DataObject):
        dtype = data.draw(st.sampled_from((np.bool_, *INTS)))
        a_shape, b_shape, args = broadcast_shapes(data)
        b_dtype = data.draw(st.sampled_from((np.bool_, *INTS, np.float32))) if invalid(data) else dtype
        op = create_operator(op_type, ["A", "B"], ["C"], **args)
        return op, {"A": _values(data, a_shape, dtype), "B": _values(data, b_shape, b_dtype)}

    return draw


def draw_is_member_of(data: st.DataObject):
    """`dtype` names the type `value` is read as: another input type then matches nothing."""
    dtype = data.draw(st.sampled_from((np.float32,) if invalid(data) else (np.bool_, *INTS)))
    x = _values(data, _shape(data), dtype)
    args = {}
    if data.draw(st.integers(0, 5)):
        args["value"] = data.draw(st.lists(st.integers(0, 1) if dtype == np.bool_ else st.integers(-6, 6), max_size=5))
    if data.draw(st.booleans()):
        args["dtype"] = data.draw(st.sampled_from([1, 3]) if invalid(data) else st.sampled_from([2, 5, 10]))
    return create_operator("IsMemberOf", ["X"], ["Y"], **args), {"X": x}


# --------------------------------------------------------------------------------------------------
# n-ary


def _nary(op_type: str, dtypes=FLOAT32, refused=INTS, checks_input_1: bool = True, low=-1.0, high=1.0):
    """1-4 inputs of one shape, a few elements copied from input 0 so that ties occur. Invalid draws change
    one input's shape (Max/Min never check input 1's: Caffe2 reads past it, so theirs start at input 2)."""

    def draw(data: st.DataObject):
        n = data.draw(st.integers(1, 4))
        dtype = _float_or_refused(data, dtypes, refused)
        shape = _shape(data)
        shapes_ = [shape] * n
        first_checked = 1 if checks_input_1 else 2
        if n > first_checked and invalid(data):
            shapes_[data.draw(st.integers(first_checked, n - 1))] = (*shape, 2)
        names = [f"X{i}" for i in range(n)]
        inputs = {name: _values(data, s, dtype, low, high) for name, s in zip(names, shapes_, strict=True)}
        first = inputs["X0"]
        for name in names[1:]:
            x = inputs[name]
            if x.shape == first.shape and x.size and data.draw(st.booleans()):
                x.flat[0] = first.flat[0]
        return create_operator(op_type, names, ["Y"]), inputs

    return draw


def draw_negate_gradient(data: st.DataObject):
    dtype = data.draw(st.sampled_from((np.bool_, *NUMERIC)))
    return create_operator("NegateGradient", ["X"], ["Y"]), {"X": _values(data, _shape(data), dtype)}


def draw_zero_gradient(data: st.DataObject):
    return create_operator("ZeroGradient", ["X"], []), {"X": _values(data, _shape(data), np.float32)}


@given(data=st.data())
def test_zero_gradient_maker(caffe2, data):
    """ZeroGradient has no output, so run_case cannot reach its gradient: X's gradient is a ConstantFill
    of zeros shaped like X (builder ops compared with Caffe2's, then run in both)."""
    op, inputs = draw_zero_gradient(data)
    assert [g.type for g in check_gradient(caffe2, op, inputs)] == ["ConstantFill"]


# --------------------------------------------------------------------------------------------------
# Row-wise products and distances


def _pair(op_type: str, min_dims: int = 0, magnitudes: bool = False):
    """X and Y of one shape (an invalid draw makes Y's last dim longer). `magnitudes`: elements in
    +-[0.25, 1], so that no row is nearly zero."""

    def values(data, shape, dtype):
        if not magnitudes or np.dtype(dtype).kind != "f":
            return _values(data, shape, dtype)
        sign = np.where(data.draw(arrays(shape, np.bool_)), 1, -1).astype(dtype)
        return data.draw(arrays(shape, dtype, 0.25, 1.0)) * sign

    def draw(data: st.DataObject):
        dtype = _float_or_refused(data)
        shape = _shape(data, min_dims, 3)
        y_shape = shape
        if invalid(data):
            y_shape = (*shape[:-1], shape[-1] + 1) if shape else (1,)
        op = create_operator(op_type, ["X", "Y"], ["Z"])
        return op, {"X": values(data, shape, dtype), "Y": values(data, y_shape, dtype)}

    return draw


def draw_dot_product_with_padding(data: st.DataObject):
    """Rows of different lengths, padded or (replicate) repeated. Caffe2 divides by the shorter row's
    length with replicate=1 (crashing on an empty row), so such draws keep both rows nonempty; an empty X
    gets an empty Y (see below)."""
    dtype = _float_or_refused(data)
    replicate = data.draw(st.booleans())
    n = data.draw(dims(1 if replicate else 0, 3))
    rank = data.draw(st.integers(1, 3))
    low = 1 if replicate else 0
    x_tail = tuple(data.draw(st.lists(dims(low, 4), min_size=rank - 1, max_size=rank - 1)))
    y_tail = tuple(data.draw(st.lists(dims(low, 4), min_size=rank - 1, max_size=rank - 1)))
    if 0 in x_tail:  # Caffe2's gradient sees N = 0 for an empty X and leaves a nonempty dY unwritten
        y_tail = (0, *y_tail[1:])
    x_shape, y_shape = (n, *x_tail), (n, *y_tail)
    if invalid(data):
        y_shape = data.draw(st.sampled_from([(n + 1, *y_tail), (n, *y_tail, 1)]))
    args = {}
    if replicate or data.draw(st.booleans()):
        args["replicate"] = replicate
    if data.draw(st.booleans()):
        args["pad_value"] = data.draw(st.floats(-2, 2, width=32, allow_subnormal=False))
    op = create_operator("DotProductWithPadding", ["X", "Y"], ["Z"], **args)
    return op, {"X": _values(data, x_shape, dtype), "Y": _values(data, y_shape, dtype)}


def draw_square_root_divide(data: st.DataObject):
    """Row i of DATA over sqrt(SCALE[i]); SCALE has zeros (left alone) and, when invalid, a negative."""
    data_dtype = _float_or_refused(data)
    shape = _shape(data, 1, 3)
    scale_dtype = data.draw(st.sampled_from((np.float32, *INTS)))
    scale = data.draw(arrays((shape[0],), scale_dtype, 0, 9))
    if invalid(data):
        if scale.size and data.draw(st.booleans()):
            scale[data.draw(st.integers(0, scale.size - 1))] = -1
        else:
            scale = np.zeros((shape[0] + 1,), scale_dtype)
    op = create_operator("SquareRootDivide", ["DATA", "SCALE"], ["Y"])
    return op, {"DATA": _values(data, shape, data_dtype), "SCALE": scale}


def draw_row_mul(data: st.DataObject):
    dtype = _float_or_refused(data)
    shape = _shape(data, 1, 3)
    w_shape = data.draw(st.sampled_from([(shape[0],), (shape[0], 1)]))
    if invalid(data):
        w_shape = (shape[0] + 1,)
    op = create_operator("RowMul", ["MAT", "W"], ["Y"])
    return op, {"MAT": _values(data, shape, dtype), "W": _values(data, w_shape, dtype)}


CASES = cases(
    Case("Logit", draw_logit, gradient_ops=("LogitGradient",)),
    Case("ReplaceNaN", draw_replace_nan, note="gradient: Caffe2 refuses (SHOULD_NOT_DO_GRADIENT)"),
    Case("EnforceFinite", draw_enforce_finite, note="no output; refuses NaN/inf"),
    Case("NanCheck", draw_nan_check, gradient_ops=("NanCheck",)),
    Case("IsNaN", draw_is_nan),
    Case("Sqr", _unary("Sqr"), gradient_ops=("Scale", "Mul")),
    Case("Rsqrt", _unary("Rsqrt", 0.0625, 3.0), gradient_ops=("RsqrtGradient",)),
    Case("Reciprocal", _unary("Reciprocal", nonzero=True), gradient_ops=("ReciprocalGradient",)),
    Case("Cube", _unary("Cube", dtypes=NUMERIC, refused=(np.bool_,)), gradient_ops=("CubeGradient",)),
    Case("Cbrt", _unary("Cbrt", nonzero=True), gradient_ops=("CbrtGradient",)),
    Case("Sign", _unary("Sign", dtypes=NUMERIC, refused=(np.bool_,))),
    Case("Ceil", _unary("Ceil")),
    Case("Floor", _unary("Floor")),
    Case("Erf", _unary("Erf"), gradient_ops=("ErfGradient",)),
    Case("Sin", _unary("Sin"), gradient_ops=("SinGradient",)),
    Case("Cos", _unary("Cos"), gradient_ops=("CosGradient",)),
    Case("Tan", _unary("Tan", -1.25, 1.25), gradient_ops=("TanGradient",)),
    Case("Asin", _unary("Asin", -0.9375, 0.9375), gradient_ops=("AsinGradient",)),
    Case("Acos", _unary("Acos", -0.9375, 0.9375), gradient_ops=("AcosGradient",)),
    Case("Atan", _unary("Atan"), gradient_ops=("AtanGradient",)),
    Case("Sinh", _unary("Sinh"), gradient_ops=("SinhGradient",)),
    Case("Cosh", _unary("Cosh"), gradient_ops=("CoshGradient",)),
    Case("Log1p", _unary("Log1p", -0.875, 3.0), gradient_ops=("Log1pGradient",)),
    Case("Pow", draw_pow, gradient_ops=("Pow", "Mul", "Scale", "ConstantFill", "Sub", "Log", "SumReduceLike")),
    Case("Mod", draw_mod, note="no gradient in Caffe2"),
    Case("BitwiseAnd", _bitwise("BitwiseAnd")),
    Case("BitwiseOr", _bitwise("BitwiseOr")),
    Case("BitwiseXor", _bitwise("BitwiseXor")),
    Case("IsMemberOf", draw_is_member_of),
    Case("Max", _nary("Max", checks_input_1=False), gradient_ops=("MaxGradient",)),
    Case("Min", _nary("Min", checks_input_1=False), gradient_ops=("MinGradient",)),
    Case("Mean", _nary("Mean"), gradient_ops=("MeanGradient",)),
    Case("SumInt", _nary("SumInt", NUMERIC, (np.bool_,)), note="Caffe2 runs Sum's kernel; no gradient"),
    Case("SumRelu", _nary("SumRelu", (np.int32, np.float32, np.float64), (np.int64,)), note="no gradient"),
    Case("NegateGradient", draw_negate_gradient, gradient_ops=("Negative",)),
    Case(
        "ZeroGradient",
        draw_zero_gradient,
        gradient_ops=("ConstantFill",),
        note="no output, so run_case cannot reach the gradient: test_zero_gradient_maker checks it",
    ),
    Case("DotProduct", _pair("DotProduct"), gradient_ops=("DotProductGradient",)),
    Case("DotProductWithPadding", draw_dot_product_with_padding, gradient_ops=("DotProductWithPaddingGradient",)),
    Case(
        "CosineSimilarity",
        _pair("CosineSimilarity", magnitudes=True),
        gradient_ops=("CosineSimilarityGradient",),
        gradient_cancels=True,
        note="for parallel rows (any 1-element row, X == Y) dX = dC (Y/|X||Y| - <X,Y> X/|X|^3|Y|) cancels to "
        "rounding noise of size |dC|/|X|: judged against |dC| |cos| (rows kept away from 0)",
    ),
    Case("L1Distance", _pair("L1Distance"), gradient_ops=("L1DistanceGradient",)),
    Case("SquareRootDivide", draw_square_root_divide, gradient_ops=("SquareRootDivide",)),
    Case("RowMul", draw_row_mul, gradient_ops=("RowMul", "Mul", "ReduceTailSum")),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_math(caffe2, case, data):
    run_case(caffe2, case, data)


def test_pow_inplace_gradient_maker(caffe2):
    """In place, Pow's maker rewrites the exponent as (e - 1) / e in float32 arithmetic."""
    op = create_operator("Pow", ["X"], ["X"], exponent=2.5)
    check_gradient(caffe2, op, {"X": np.array([0.5, 1.5], np.float32)})


NO_GRADIENT = ("ReplaceNaN", "EnforceFinite", "Sign", "Ceil", "Floor", "BitwiseAnd", "IsMemberOf", "Mod", "SumInt")


@pytest.mark.parametrize("op_type", NO_GRADIENT)
def test_gradient_refused_like_caffe2(caffe2, op_type):
    """Ops Caffe2 gives no gradient (SHOULD_NOT_DO_GRADIENT, GRADIENT_NOT_IMPLEMENTED_YET, or no maker at
    all): the builder refuses too."""
    op = create_operator(op_type, ["X", "Z"] if op_type in ("BitwiseAnd", "SumInt") else ["X"], ["Y"])
    with pytest.raises(Caffe2Error):
        caffe2.gradient_for_op(op, ["Y_grad"])
    with pytest.raises(GradientError):
        get_gradient_for_op(op, ["Y_grad"])
