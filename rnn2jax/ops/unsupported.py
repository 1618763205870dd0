"""Why rnn2jax runs neither a lowering nor a host op for some of the op types real Caffe2 registers.

Each reason is what a user meeting the op needs to know: where Caffe2 itself runs it (most are CUDA-only, so
the CPU wheel that is rnn2jax's reference cannot run them either) or what service it needs that a JAX program
does not have. `registry.lookup` and `check_supported` add the reason to their error; docs/ops.md lists every
such op type with it, and tests/ops/test_scoreboard.py fails when an op type real Caffe2 registers is neither run
nor explained here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

_CUDA_ONLY = (
    "CUDA-only in Caffe2 (its CPU build cannot create the op), so there is no CPU reference to check a lowering "
    "against; a net using it was built for GPUs"
)
_NCCL = "NCCL collectives across the GPUs of one process: CUDA-only in Caffe2; rnn2jax's JAX runtime does this itself"
_CUDNN_RNN = (
    "cuDNN's fused RNN (engine CUDNN), CUDA-only in Caffe2; its weights are one opaque cuDNN buffer. Build the "
    "RNN with rnn_cell (RecurrentNetwork), which rnn2jax lowers"
)

_DNNLOWP = (
    "not lowered yet: under this engine Caffe2 runs DNNLOWP's quantized kernel (fbgemm; Int8 or float in, a "
    "quantized output whose parameters it may choose from the data), not the kernel rnn2jax runs for the op "
    "without the engine (float, or QNNPACK's Int8 arithmetic), so rnn2jax refuses it rather than compute "
    "something else"
)
_DNNLOWP_16 = (
    "not lowered yet: under this engine Caffe2 runs DNNLOWP's 16-bit quantized kernel (uint16 Int8 blobs), not "
    "the kernel rnn2jax runs for the op without the engine, so rnn2jax refuses it rather than compute something else"
)

WHY_UNSUPPORTED: Mapping[str, str] = MappingProxyType(
    {
        **dict.fromkeys(
            (
                "DeformConv",
                "DeformConvGradient",
                "FP16MomentumSGDUpdate",
                "FP32MomentumSGDUpdate",
                "MaxPoolWithIndex",
                "MaxPoolWithIndexGradient",
                "RoIAlignRotatedGradient",
                "SparseLengthsMax",
            ),
            _CUDA_ONLY,
        ),
        "GetGPUMemoryUsage": "reports the CUDA caching allocator's use per GPU: CUDA-only in Caffe2",
        **dict.fromkeys(("NCCLAllGather", "NCCLAllreduce", "NCCLBroadcast", "NCCLReduce", "NCCLReduceScatter"), _NCCL),
        **dict.fromkeys(("Recurrent_ENGINE_CUDNN", "RecurrentGradient_ENGINE_CUDNN"), _CUDNN_RNN),
        **dict.fromkeys(
            ("RecurrentParamGet_ENGINE_CUDNN", "RecurrentParamSet_ENGINE_CUDNN"),
            "reads or writes one weight inside cuDNN's opaque RNN buffer (engine CUDNN): CUDA-only in Caffe2",
        ),
        "Reduce": (
            "Caffe2 registers no implementation of it for CPU: it has no default engine and Gloo none either "
            "('does not have a default engine implementation'); Allreduce, which rnn2jax runs, sums onto every process"
        ),
        **dict.fromkeys(
            ("Int8FCRelu_ENGINE_DNNLOWP", "Int8FCRelu_ENGINE_DNNLOWP_ROWWISE"),
            "not lowered yet: DNNLOWP's int8 FC runs fbgemm's packed int8 GEMM, whose pairwise int16 saturation shows "
            "in Caffe2's outputs and has to be reproduced exactly",
        ),
        **dict.fromkeys(
            (
                *(f"{t}_ENGINE_DNNLOWP" for t in ("Add", "AveragePool", "Concat", "Conv", "ConvRelu", "FC")),
                *(f"{t}_ENGINE_DNNLOWP" for t in ("GroupNorm", "MaxPool", "Sum", "SumRelu")),
                *(f"{t}_ENGINE_DNNLOWP" for t in ("Int8Add", "Int8AveragePool", "Int8Concat", "Int8Conv")),
                *(f"{t}_ENGINE_DNNLOWP" for t in ("Int8ConvRelu", "Int8FC", "Int8MaxPool", "Int8Sum", "Int8SumRelu")),
                *(f"{t}_ENGINE_DNNLOWP_ACC16" for t in ("Conv", "ConvRelu", "FC")),
                *(f"{t}_ENGINE_DNNLOWP_ACC16" for t in ("Int8Conv", "Int8ConvRelu", "Int8FC")),
                "FC_ENGINE_DNNLOWP_ROWWISE",
                "Int8FC_ENGINE_DNNLOWP_ROWWISE",
            ),
            _DNNLOWP,
        ),
        **dict.fromkeys(
            (
                *(f"{t}_ENGINE_DNNLOWP_16" for t in ("AveragePool", "BatchMatMul", "ChannelShuffle", "Conv")),
                *(f"{t}_ENGINE_DNNLOWP_16" for t in ("ConvRelu", "FC", "MaxPool", "Relu", "Sum", "SumRelu")),
                "FC_ENGINE_DNNLOWP_ROWWISE_16",
            ),
            _DNNLOWP_16,
        ),
        "Int8GroupNorm_ENGINE_DNNLOWP": (
            "not lowered yet: DNNLOWP's int8 GroupNorm computes its moments in AVX2 integer code and requantizes "
            "the fused parameters in fixed point, which has to be reproduced exactly"
        ),
        "Int8GenQuantParams": (
            "its quantization-scheme input is made only by a Python binding of Caffe2's (dnnlowp_pybind11."
            "CreateInt8QuantSchemeBlob), which no op and no saved net can produce"
        ),
        **dict.fromkeys(
            ("Int8FCPackWeight", "Int8ConvPackWeight_ENGINE_DNNLOWP", "Int8ConvPackWeight_ENGINE_DNNLOWP_ACC16"),
            "makes fbgemm's opaque packed int8 matrix, which only DNNLOWP's Int8FC and Int8Conv engines read and "
            "which cannot be fetched; rnn2jax does not run those engines (the plain Int8FC and Int8Conv it does)",
        ),
        "RoIPoolGradient": "Caffe2 has no CPU kernel for it (roi_pool_op.h: 'Not Implemented' on CPU)",
        "SendTensor": (
            "point-to-point Gloo transfer between processes of a Caffe2 common world; rnn2jax's collectives run on "
            "JAX's runtime, which has no point-to-point send"
        ),
        "ReceiveTensor": (
            "point-to-point Gloo transfer between processes of a Caffe2 common world; rnn2jax's collectives run on "
            "JAX's runtime, which has no point-to-point receive"
        ),
        "Onnxifi": (
            "hands a subgraph to an ONNXIFI backend library (a vendor's accelerator runtime); Caffe2 itself fails "
            "without one ('Cannot load onnxifi lib'). Run the ONNX model with an ONNX runtime instead"
        ),
        "ATen": (
            "calls any PyTorch (ATen) operator by name; rnn2jax would need PyTorch's whole operator set. Replace it by "
            "the Caffe2 op it stands for"
        ),
    }
)


def why_unsupported(op_type: str) -> str:
    """The reason rnn2jax does not run `op_type`, as a clause for an error message ('' if it has none)."""
    reason = WHY_UNSUPPORTED.get(op_type)
    return f": {reason}" if reason else ""
