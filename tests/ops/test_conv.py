"""The conv family (rnn2jax/ops/conv.py): its lowering, gradient ops and builder makers.

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the convolutions (Conv
and its 1D/2D/3D aliases, ConvRelu, ConvTranspose) and their gradient ops against real Caffe2.

Shapes stay tiny (batch <= 2, channels <= 4, sides <= 5): every distinct shape costs a compilation. The window
arguments are drawn in every form Caffe2 reads (kernels / kernel / kernel_h+kernel_w, pads / pad /
pad_t+pad_l+pad_b+pad_r, ...) and with every legacy_pad mode; `window_args` is shared with the pooling tests. Caffe2
registers these ops for float only; invalid draws feed integers, mismatched channels or a wrong bias. Never drawn:
NHWC with 3 spatial dims where a gradient is checked (Caffe2's ConvGradient computes a wrong dX there and corrupts
its heap); a filter with 0 output channels (Caffe2's Conv then kills its process); a kernel whose rank differs from
the input's (Caffe2 reads past its argument vectors).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, invalid, run_case
from rnn2jax.caffe2.opdef import create_operator

# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_conv.py)

NOTSET, VALID, SAME, CAFFE_LEGACY_POOLING = 0, 1, 2, 3


def _values(data: st.DataObject, shape, dtype=np.float32) -> np.ndarray:
    x = data.draw(arrays(tuple(shape), dtype, -1, 1) if np.dtype(dtype).kind == "f" else arrays(tuple(shape), dtype))
    if x.dtype.kind == "f":
        x[np.abs(x) < np.finfo(x.dtype).tiny] = 0  # XLA's CPU flushes subnormals
    return x


def _per_dim(data: st.DataObject, args: dict, name: str, values: list[int], default: int) -> None:
    """`values` as `name + 's'`, or (2-D) as `name` when equal or `name_h`/`name_w`; left out (sometimes)
    when every value is the default."""
    if all(v == default for v in values) and data.draw(st.booleans()):
        return
    form = data.draw(st.sampled_from(["list", "single"])) if len(values) == 2 else "list"
    if form == "list":
        args[f"{name}s"] = values
    elif values[0] == values[1] and data.draw(st.booleans()):
        args[name] = values[0]
    else:
        args[f"{name}_h"], args[f"{name}_w"] = values


def window_args(
    data: st.DataObject, spatial: list[int], *, pooling: bool = False, legacy: bool = True, max_kernel: int = 3
) -> dict:
    """Kernel, strides, dilations (not for pooling), pads and legacy_pad of a window over the `spatial`
    dims. Pooling pads stay below the kernel (PoolOp refuses others); SAME comes without dilation.
    VALID and CAFFE_LEGACY_POOLING can make a negative output size, which crashes Caffe2's process:
    with them `spatial` is grown in place to the (dilated) kernel."""
    nd = len(spatial)
    kernel = [data.draw(st.integers(1, max_kernel)) for _ in range(nd)]
    strides = [data.draw(st.integers(1, 3 if pooling else 2)) for _ in range(nd)]
    mode = data.draw(st.sampled_from([NOTSET] * 5 + [VALID, SAME, CAFFE_LEGACY_POOLING])) if legacy else NOTSET
    # Caffe2's CAFFE_LEGACY_POOLING sizes the output with the undilated kernel: with dilations its
    # windows run past the input and ConvGradient reads uninitialised memory (dW ~1e20 for X = 0).
    undilated = pooling or mode in (SAME, CAFFE_LEGACY_POOLING)
    dilations = [1] * nd if undilated else [data.draw(st.integers(1, 2)) for _ in range(nd)]
    if mode in (VALID, CAFFE_LEGACY_POOLING):
        for i in range(nd):
            spatial[i] = max(spatial[i], dilations[i] * (kernel[i] - 1) + 1)
    args: dict = {}
    _per_dim(data, args, "kernel", kernel, -1)
    _per_dim(data, args, "stride", strides, 1)
    if not pooling:
        _per_dim(data, args, "dilation", dilations, 1)
    if mode != NOTSET:
        args["legacy_pad"] = mode
    if mode in (VALID, SAME):
        return args
    # Pooling pads stay below the kernel; so do CAFFE_LEGACY_POOLING's (a larger head fails an enforce
    # that, on an empty batch, aborts Caffe2's process).
    below = pooling or mode == CAFFE_LEGACY_POOLING
    pads = [data.draw(st.integers(0, min(2, k - 1) if below else 2)) for k in kernel * 2]
    if pooling and mode == CAFFE_LEGACY_POOLING:
        # Caffe's ceil adds a last window wholly past the image when there is no head pad to clip it;
        # Caffe2's pooling kernels then read an empty range (undefined: X values or garbage come out).
        for i in range(nd):
            while pads[i] == 0 and (spatial[i] - kernel[i]) % strides[i]:
                spatial[i] += 1
    if all(p == 0 for p in pads) and data.draw(st.booleans()):
        return args
    if nd == 2 and data.draw(st.booleans()):
        if len(set(pads)) == 1 and data.draw(st.booleans()):
            args["pad"] = pads[0]
        else:
            args.update(zip(("pad_t", "pad_l", "pad_b", "pad_r"), pads, strict=True))
    else:
        args["pads"] = pads
    return args


def _kernel_of(args: dict, nd: int) -> list[int]:
    if "kernels" in args:
        return args["kernels"]
    if "kernel" in args:
        return [args["kernel"]] * nd
    return [args["kernel_h"], args["kernel_w"]]


def _image(n: int, channels: int, spatial: list[int], nhwc: bool) -> tuple[int, ...]:
    return (n, *spatial, channels) if nhwc else (n, channels, *spatial)


# --------------------------------------------------------------------------------------------------
# Conv, Conv1D/2D/3D, ConvRelu


def _conv(op_type: str, ranks: tuple[int, ...], nhwc_3d: bool = False):
    """`nhwc_3d`: also draw NHWC with 3 spatial dims (only for ops without a gradient: Caffe2's
    ConvGradient there returns a wrong dX and corrupts its heap)."""

    def draw(data: st.DataObject):
        nd = data.draw(st.sampled_from(ranks))
        nhwc = data.draw(st.booleans()) and (nd < 3 or nhwc_3d)
        groups = data.draw(st.sampled_from([1, 1, 2]))
        per_group_in, per_group_out = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
        n = data.draw(st.sampled_from([0, 1, 1, 2]))
        spatial = [data.draw(st.integers(1, 5 if nd < 3 else 3)) for _ in range(nd)]
        args = window_args(data, spatial)
        kernel = _kernel_of(args, nd)
        channels, out = per_group_in * groups, per_group_out * groups
        w_shape = (out, *kernel, per_group_in) if nhwc else (out, per_group_in, *kernel)
        with_bias = data.draw(st.booleans())
        b_shape = [out]
        dtype = np.float32
        if invalid(data):
            problem = data.draw(st.sampled_from(["channels", "bias", "dtype", "kernel"]))
            if problem == "channels":
                channels += 1
            elif problem == "bias":
                with_bias, b_shape = True, [out + 1]
            elif problem == "dtype":  # (Caffe2 returns an empty batch before it reads the type)
                dtype, n = np.int32, max(n, 1)
            else:
                w_shape = (*w_shape[:-1], w_shape[-1] + 1)
        if nhwc:
            args["order"] = "NHWC"
        elif data.draw(st.booleans()):
            args["order"] = "NCHW"
        if groups > 1:
            args["group"] = groups
        if data.draw(st.integers(0, 4)) == 0:
            args["no_gradient_to_input"] = 1
        inputs = {"X": _values(data, _image(n, channels, spatial, nhwc), dtype), "W": _values(data, w_shape, dtype)}
        if with_bias:
            inputs["b"] = _values(data, b_shape, dtype)
        return create_operator(op_type, list(inputs), ["Y"], **args), inputs

    return draw


# --------------------------------------------------------------------------------------------------
# ConvTranspose


def draw_conv_transpose(data: st.DataObject):
    """2-D only (ConvTransposeUnpoolBase); adj below the stride (Caffe2 accepts adj == stride but then
    returns uninitialised memory, ~1e22, for X and W all ones), pads small enough that the output is not
    negative, legacy_pad NOTSET/VALID/SAME (CAFFE_LEGACY_POOLING aborts Caffe2's process)."""
    nhwc = data.draw(st.booleans())
    groups = data.draw(st.sampled_from([1, 1, 2]))
    per_group_in, per_group_out = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    n = data.draw(st.sampled_from([0, 1, 2]))
    spatial = [data.draw(st.integers(1, 4)) for _ in range(2)]
    kernel = [data.draw(st.integers(1, 3)) for _ in range(2)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(2)]
    adjs = [data.draw(st.integers(0, s - 1)) for s in strides]
    args: dict = {}
    _per_dim(data, args, "kernel", kernel, -1)
    _per_dim(data, args, "stride", strides, 1)
    _per_dim(data, args, "adj", adjs, 0)
    legacy = data.draw(st.sampled_from([NOTSET] * 4 + [VALID, SAME]))
    if legacy != NOTSET:
        args["legacy_pad"] = legacy
    else:
        full = [(spatial[i] - 1) * strides[i] + kernel[i] + adjs[i] for i in range(2)]
        pads = [data.draw(st.integers(0, min(2, full[i % 2] // 2))) for i in range(4)]
        if any(pads) or data.draw(st.booleans()):
            if data.draw(st.booleans()):
                args["pads"] = pads
            else:
                args.update(zip(("pad_t", "pad_l", "pad_b", "pad_r"), pads, strict=True))
    in_channels, channels = per_group_in * groups, per_group_out * groups
    w_shape = (in_channels, *kernel, per_group_out) if nhwc else (in_channels, per_group_out, *kernel)
    with_bias = data.draw(st.booleans())
    b_shape = [channels]
    dtype = np.float32
    if invalid(data):
        problem = data.draw(st.sampled_from(["channels", "bias", "dtype", "adj"]))
        if problem == "channels":
            w_shape = (w_shape[0] + 1, *w_shape[1:])
        elif problem == "bias":
            with_bias, b_shape = True, [channels + 1]
        elif problem == "dtype":
            dtype, n = np.int32, max(n, 1)
        else:
            args.pop("adj", None), args.pop("adj_h", None), args.pop("adj_w", None)
            args["adjs"] = [strides[0] + 1, 0]
    if nhwc:
        args["order"] = "NHWC"
    if groups > 1:
        args["group"] = groups
    if data.draw(st.integers(0, 4)) == 0:
        args["no_gradient_to_input"] = 1
    inputs = {"X": _values(data, _image(n, in_channels, spatial, nhwc), dtype), "W": _values(data, w_shape, dtype)}
    if with_bias:
        inputs["b"] = _values(data, b_shape, dtype)
    return create_operator("ConvTranspose", list(inputs), ["Y"], **args), inputs


CASES = cases(
    Case("Conv", _conv("Conv", (1, 2, 3)), gradient_ops=("ConvGradient",)),
    Case("Conv1D", _conv("Conv1D", (1,)), gradient_ops=("Conv1DGradient",)),
    Case("Conv2D", _conv("Conv2D", (2,)), gradient_ops=("Conv2DGradient",)),
    Case("Conv3D", _conv("Conv3D", (3,)), gradient_ops=("Conv3DGradient",)),
    Case("ConvRelu", _conv("ConvRelu", (1, 2, 3), nhwc_3d=True), note="Caffe2 has no gradient maker for ConvRelu"),
    Case("ConvTranspose", draw_conv_transpose, gradient_ops=("ConvTransposeGradient",)),
)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
@given(data=st.data())
def test_caffe2_conv(caffe2, case, data):
    run_case(caffe2, case, data)
