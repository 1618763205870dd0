"""The float16 family (rnn2jax/ops/half.py) against real Caffe2: FloatToHalf / HalfToFloat and their
gradients, and the float16 fillers. Float16 stays float16 in both directions. Float16UniformFill draws from
its own generator, so its shape, dtype and bounds are compared (as tests/ops/test_fill.py does)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.errors import BadArgumentError, InputTypeError


def draw_float_to_half(data):
    x = data.draw(arrays(shapes(0, 3), np.float32, -7e4, 7e4))
    if data.draw(st.booleans()) and x.size:  # beyond float16's range, and the non-finite values
        x.flat[0] = data.draw(st.sampled_from([np.inf, -np.inf, np.nan, 1e6, -1e6]))
    args = {"clip": data.draw(st.booleans())} if data.draw(st.booleans()) else {}
    return make_op("FloatToHalf", ["x"], ["y"], **args), {"x": x}


def draw_half_to_float(data):
    return make_op("HalfToFloat", ["x"], ["y"]), {"x": data.draw(arrays(shapes(0, 3), np.float16, -6e4, 6e4))}


def draw_constant(data):
    args = {}
    if data.draw(st.booleans()):
        args["shape"] = data.draw(st.lists(st.integers(0, 4), max_size=3))
    if data.draw(st.booleans()):
        args["value"] = data.draw(st.floats(-1e5, 1e5, width=32, allow_subnormal=False))
    return make_op("Float16ConstantFill", [], ["y"], **args), {}


def draw_uniform(data):
    # Caffe2 dies of SIGFPE on a zero dim and refuses a scalar (test_refusals)
    args = {"shape": data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))}
    if data.draw(st.booleans()):
        low = data.draw(st.floats(-100, 100, width=16, allow_subnormal=False))
        args.update({"min": low, "max": low + data.draw(st.floats(-1, 50, width=16, allow_subnormal=False))})
    return make_op("Float16UniformFill", [], ["y"], **args), {}


CASES = cases(
    Case("FloatToHalf", draw_float_to_half, gradient_ops=("HalfToFloat",)),
    Case("HalfToFloat", draw_half_to_float, gradient_ops=("FloatToHalf",)),
    Case("Float16ConstantFill", draw_constant),
    Case("Float16UniformFill", draw_uniform, note="random: shape, dtype and bounds"),
)


def check_uniform(caffe2, op, inputs):
    """Values cannot match Caffe2's draws: shape and dtype must; both stay within [min, max] in float16."""
    args = {a.name: a for a in op.arg}
    low, high = (args["min"].f, args["max"].f) if "min" in args else (0.0, 1.0)
    if not low < high:
        check_op(caffe2, op, inputs)  # both refuse
        return
    want = caffe2.run_op(op, inputs)["y"]
    got = run_rnn2jax([op], inputs, ["y"])["y"]
    assert (got.shape, got.dtype) == (want.shape, want.dtype) == (tuple(args["shape"].ints), np.float16)
    for y in (want, got):
        assert y.size == 0 or (y.min() >= np.float16(low) and y.max() <= np.float16(high))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type == "Float16UniformFill":
        check_uniform(caffe2, *case.draw(data))
    else:
        run_case(caffe2, case, data)


def test_refusals(caffe2):
    """Caffe2 reads the input as the type it converts from; another dtype is refused, naming the blob."""
    for op_type, x in (("FloatToHalf", np.ones(2, np.float64)), ("HalfToFloat", np.ones(2, np.float32))):
        op = make_op(op_type, ["x"], ["y"])
        assert check_op(caffe2, op, {"x": x}) is None
        with pytest.raises(InputTypeError, match=f"{op_type}.*'x'"):
            run_rnn2jax([op], {"x": x}, ["y"], jit=False)
    with pytest.raises(BadArgumentError, match="bigger than min"):
        run_rnn2jax([make_op("Float16UniformFill", [], ["y"], shape=[2], min=2.0, max=1.0)], {}, ["y"])
    scalar = make_op("Float16UniformFill", [], ["y"])
    assert check_op(caffe2, scalar, {}) is None  # "dimension specified as 0 but tensor has no dimensions"
    with pytest.raises(BadArgumentError, match="'shape' of rank"):
        run_rnn2jax([scalar], {}, ["y"])
