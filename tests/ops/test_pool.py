"""The pool family (rnn2jax/ops/pool.py): its lowering, gradient ops and builder makers.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the pooling ops
(MaxPool, AveragePool and their 1D/2D/3D aliases, LpPool) and their gradient ops against real Caffe2.

Shapes stay tiny (batch <= 2, channels <= 3, sides <= 5). Window arguments come from the convolution tests'
`window_args` (every argument form, every legacy_pad mode, pads below the kernel), with global_pooling and
count_include_pad drawn too. Values are drawn from a few levels so that windows often hold ties: MaxPoolGradient
gives dY to every element equal to the maximum. Invalid draws: integers, a dilation, a pad as large as the kernel, a
4-D image.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_conv import window_args

from differential import Case, arrays, cases, invalid, run_case, run_rnn2jax
from rnn2jax.caffe2.opdef import create_operator

# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_pool.py)

def _values(data: st.DataObject, shape, dtype, ties: bool) -> np.ndarray:
    if np.dtype(dtype).kind != "f":
        return data.draw(arrays(tuple(shape), dtype))
    if ties:
        levels = np.array([-1.0, -0.5, 0.25, 0.75], dtype)
        return levels[data.draw(arrays(tuple(shape), np.int32, 0, 3))]
    x = data.draw(arrays(tuple(shape), dtype, -1, 1))
    x[np.abs(x) < np.finfo(dtype).tiny] = 0  # XLA's CPU flushes subnormals
    return x


def _pool(op_type: str, ranks: tuple[int, ...], average: bool = False, lp: bool = False):
    def draw(data: st.DataObject):
        nd = data.draw(st.sampled_from(ranks))
        nhwc = data.draw(st.booleans())
        n, channels = data.draw(st.sampled_from([0, 1, 2])), data.draw(st.integers(1, 3))
        spatial = [data.draw(st.integers(1, 5 if nd < 3 else 3)) for _ in range(nd)]
        args = window_args(data, spatial, pooling=True)
        if data.draw(st.integers(0, 5)) == 0:
            args = {"global_pooling": 1}
        dtype = np.float32
        if average and data.draw(st.booleans()):
            args["count_include_pad"] = int(data.draw(st.booleans()))
        if lp and data.draw(st.booleans()):
            args["p"] = data.draw(st.sampled_from([1.0, 2.0, 3.0, 2.5]))
        if invalid(data):
            problem = data.draw(st.sampled_from(["dtype", "dilation", "pad", "rank"]))
            if problem == "dtype":
                dtype, n = np.int32, max(n, 1)  # (an empty batch returns before its type is read)
            elif problem == "dilation":
                args["dilations"] = [2] * nd
            elif problem == "pad" and "kernels" in args:
                args.pop("pads", None)
                args.pop("legacy_pad", None)
                args["pads"] = args["kernels"] * 2
            elif problem == "rank" and not args.get("global_pooling"):
                spatial = [*spatial, 2]
        if nhwc:
            args["order"] = "NHWC"
        shape = (n, *spatial, channels) if nhwc else (n, channels, *spatial)
        ties = not lp and data.draw(st.booleans())
        x = _values(data, shape, dtype, ties)
        if lp and dtype == np.float32:
            # LpPoolGradient divides by |x| (p < 2) and by Y (a window of zeros): Caffe2 then sums infs
            # and NaNs in its own order. Zeros are kept out of the draws.
            x = np.where(np.abs(x) < 0.125, 0.5, x).astype(dtype)
        return create_operator(op_type, ["X"], ["Y"], **args), {"X": x}

    return draw


def _cases(kind: str, average: bool = False) -> list[Case]:
    ranks = {"": (1, 2, 3), "1D": (1,), "2D": (2,), "3D": (3,)}
    return [
        Case(f"{kind}{suffix}", _pool(f"{kind}{suffix}", r, average), gradient_ops=(f"{kind}{suffix}Gradient",))
        for suffix, r in ranks.items()
    ]


CASES = cases(
    *_cases("MaxPool"),
    *_cases("AveragePool", average=True),
    Case("LpPool", _pool("LpPool", (2,), lp=True), gradient_ops=("LpPoolGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_pool(caffe2, case, data):
    run_case(caffe2, case, data)


# --------------------------------------------------------------------------------------------------
# A NumPy reference of Caffe2's CPU loops (pool_op.cc, pool_gradient_op.cc), without Caffe2: windows
# clipped to the image, the whole kernel with count_include_pad, dY to every tied maximum.


def _reference(x, dy, kernel, stride, pads, include_pad):
    n, c, height, width = x.shape
    out_h = (height + pads[0] + pads[2] - kernel[0]) // stride[0] + 1
    out_w = (width + pads[1] + pads[3] - kernel[1]) // stride[1] + 1
    y_max, y_avg = np.zeros((n, c, out_h, out_w)), np.zeros((n, c, out_h, out_w))
    dx_max, dx_avg = np.zeros_like(x), np.zeros_like(x)
    for i, j in np.ndindex(out_h, out_w):
        t, left = i * stride[0] - pads[0], j * stride[1] - pads[1]
        rows = slice(max(t, 0), min(t + kernel[0], height))
        cols = slice(max(left, 0), min(left + kernel[1], width))
        window = x[:, :, rows, cols]
        count = kernel[0] * kernel[1] if include_pad else window[0, 0].size
        y_max[:, :, i, j] = window.max(axis=(2, 3))
        y_avg[:, :, i, j] = window.sum(axis=(2, 3)) / count
        tied = window == y_max[:, :, i, j][:, :, None, None]
        dx_max[:, :, rows, cols] += tied * dy[:, :, i, j][:, :, None, None]
        dx_avg[:, :, rows, cols] += dy[:, :, i, j][:, :, None, None] / count
    return y_max, y_avg, dx_max, dx_avg


@pytest.mark.parametrize("include_pad", [False, True])
def test_pooling_matches_a_numpy_reference(include_pad):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 3, (2, 2, 5, 4)).astype(np.float64)  # few levels: many tied maxima
    args = {"kernels": [3, 2], "strides": [2, 1], "pads": [1, 0, 2, 1], "count_include_pad": int(include_pad)}
    dy = rng.standard_normal((2, 2, 3, 4))  # H: (5 + 1 + 2 - 3) // 2 + 1, W: (4 + 0 + 1 - 2) + 1
    y_max, y_avg, dx_max, dx_avg = _reference(x, dy, [3, 2], [2, 1], [1, 0, 2, 1], include_pad)
    ops = [
        create_operator("MaxPool", ["X"], ["Ymax"], **args),
        create_operator("AveragePool", ["X"], ["Yavg"], **args),
        create_operator("MaxPoolGradient", ["X", "Ymax", "dY"], ["dXmax"], **args),
        create_operator("AveragePoolGradient", ["X", "Yavg", "dY"], ["dXavg"], **args),
    ]
    got = run_rnn2jax(ops, {"X": x, "dY": dy}, ["Ymax", "Yavg", "dXmax", "dXavg"])
    for name, want in (("Ymax", y_max), ("Yavg", y_avg), ("dXmax", dx_max), ("dXavg", dx_avg)):
        np.testing.assert_allclose(got[name], want, rtol=1e-12, err_msg=name)
