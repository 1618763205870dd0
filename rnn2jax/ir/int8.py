"""`Int8Tensor`: the value of a Caffe2 Int8TensorCPU blob (caffe2/core/tensor_int8.h): quantized data
(uint8; int32 for the biases Int8GivenIntTensorFill makes) with the `scale` and `zero_point` that give
its real values, `(data - zero_point) * scale`.

Why this shape: Caffe2's Python binding fetches such a blob as the tuple `(data, scale, zero_point)`
(`workspace.FetchInt8Blob` wraps it in a namedtuple of those fields), so a value with the same fields is
what users already handle (the Caffe2 API's FetchInt8Blob returns that namedtuple). It is not a tuple
itself: a kernel's tuple result means several outputs. It is a JAX pytree whose only leaf is `data`: the
scale and zero point are static (aux data), as they are in Caffe2, where each op reads them on the host to choose its
requantization (fixed-point multipliers, lookup tables, the clamps of a fused Relu) and refuses some
(Int8Sigmoid's output must be 1/256, 0). So a jitted net is specialised per quantization, never traces a
scale, and ops can check quantization parameters before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np


@dataclass(frozen=True)
class Int8Tensor:
    """An Int8TensorCPU blob: `data` (uint8, or int32), `scale` (float32 in Caffe2) and `zero_point` (int32)."""

    data: Any
    scale: float
    zero_point: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    def real_value(self) -> np.ndarray:
        """`workspace.FetchInt8BlobRealVal`: `(data - zero_point) * scale` as float32."""
        data = np.asarray(self.data)
        return (data.astype(np.int32) - int(self.zero_point)).astype(np.float32) * self.scale


def _flatten(t: Int8Tensor) -> tuple[tuple[Any], tuple[float, int]]:
    return (t.data,), (t.scale, t.zero_point)


def _unflatten(aux: tuple[float, int], children: tuple[Any, ...]) -> Int8Tensor:
    return Int8Tensor(children[0], *aux)


jax.tree_util.register_pytree_node(Int8Tensor, _flatten, _unflatten)


def int8_tensor(data: Any, scale: float, zero_point: int) -> Int8Tensor:
    """An Int8Tensor with Caffe2's field types: scale rounded to float32 (Caffe2 stores a float), zero point int."""
    return Int8Tensor(data, float(np.float32(scale)), int(zero_point))
