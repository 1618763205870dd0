"""The locally connected family (rnn2jax/ops/locally_connected.py): LC, LC1D/2D/3D and their gradients against
real Caffe2 (see tests/differential.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, invalid, make_op, run_case, run_rnn2jax
from rnn2jax.errors import BadArgumentError, ShapeError


def draw_lc(op_type: str, ranks: tuple[int, ...]):
    def draw(data):
        nd = data.draw(st.sampled_from(ranks))
        nhwc = nd == 2 and data.draw(st.booleans())
        groups = 1  # Caffe2 aborts for more (test_refusals)
        per_in, per_out = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
        kernel = [data.draw(st.integers(1, 3)) for _ in range(nd)]
        strides = [data.draw(st.integers(1, 2)) for _ in range(nd)]
        dilations = [data.draw(st.integers(1, 2)) for _ in range(nd)]
        pads = [data.draw(st.integers(0, 1)) for _ in range(2 * nd)]
        spatial, out = [], []
        for i in range(nd):
            reach = dilations[i] * (kernel[i] - 1) + 1
            size = max(data.draw(st.integers(1, 5 if nd < 3 else 3)), reach - pads[i] - pads[i + nd])
            spatial.append(size)
            out.append((size + pads[i] + pads[i + nd] - reach) // strides[i] + 1)
        channels, m = per_in * groups, per_out * groups
        n = data.draw(st.integers(1, 2))
        x_shape = (n, *spatial, channels) if nhwc else (n, channels, *spatial)
        w_shape = (*out, m, *kernel, channels) if nhwc else (*out, m, per_in, *kernel)
        b_shape = (*out, m)
        if invalid(data):
            if data.draw(st.booleans()):
                b_shape = (*out, m + 1)
            else:
                w_shape = (*w_shape[:-1], w_shape[-1] + 1)
        args = {"kernels": kernel, "strides": strides, "dilations": dilations, "pads": pads}
        if nhwc:
            args["order"] = "NHWC"
        if groups > 1:
            args["group"] = groups
        if data.draw(st.integers(0, 4)) == 0:
            args["no_gradient_to_input"] = 1
        inputs = {"X": data.draw(arrays(x_shape)), "W": data.draw(arrays(w_shape))}
        if data.draw(st.booleans()):
            inputs["b"] = data.draw(arrays(b_shape))
        return make_op(op_type, list(inputs), ["Y"], **args), inputs

    return draw


CASES = cases(
    Case("LC", draw_lc("LC", (1, 2, 3)), gradient_ops=("LCGradient",)),
    Case("LC1D", draw_lc("LC1D", (1,)), gradient_ops=("LC1DGradient",)),
    Case("LC2D", draw_lc("LC2D", (2,)), gradient_ops=("LC2DGradient",)),
    Case("LC3D", draw_lc("LC3D", (3,)), gradient_ops=("LC3DGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@settings(max_examples=max(1, settings().max_examples // 2))  # each example compiles a forward and a gradient
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_refusals(caffe2):
    x = np.ones((1, 2, 3, 3), np.float32)
    w = np.ones((2, 2, 1, 2, 2, 2), np.float32)
    op = make_op("LC2D", ["X", "W"], ["Y"], kernel=2)
    assert check_op(caffe2, op, {"X": x, "W": w})["Y"].shape == (1, 1, 2, 2)
    for bad in (w[:1], w[:, :, :, :1], w[..., :1], w[0]):  # output size, channels, kernel, rank
        assert check_op(caffe2, op, {"X": x, "W": bad}) is None
    with pytest.raises(BadArgumentError, match="group = 2"):
        run_rnn2jax([make_op("LC2D", ["X", "W"], ["Y"], kernel=2, group=2)], {"X": x, "W": w}, ["Y"])
    with pytest.raises(ShapeError, match="NHWC"):
        run_rnn2jax([make_op("LC", ["X", "W"], ["Y"], kernel=2, order="NHWC")], {"X": x[0], "W": w[0]}, ["Y"])
