"""`PackedFP16Matrix`: the value of the blob Caffe2's FbGemmPack and FbGemmPackTranspose write
(caffe2/fb/fbgemm: a `fbgemm::PackedGemmMatrixFP16`), which FbFCPacked reads as its weights.

Why this shape: in Caffe2 the blob is an opaque C++ object (fbgemm's blocked float16 layout), which the Python
binding cannot fetch. What FbFCPacked computes from it depends only on the float16 values of the gemm's B
matrix (K rows, N columns), so rnn2jax keeps exactly those: `b`, a float16 array of shape (K, N). It is a JAX
pytree whose only leaf is `b`, so it flows through jitted nets as Int8Tensor does, and a kernel can tell a
packed blob from a plain tensor (Caffe2 refuses a tensor where it wants the packed matrix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np


@dataclass(frozen=True)
class PackedFP16Matrix:
    """fbgemm's PackedGemmMatrixFP16: the gemm's B matrix `b` (K x N, float16)."""

    b: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.b.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.b.dtype)

    def num_rows(self) -> int:
        """K (fbgemm's numRows)."""
        return int(self.b.shape[0])

    def num_cols(self) -> int:
        """N (fbgemm's numCols)."""
        return int(self.b.shape[1])


jax.tree_util.register_pytree_node(
    PackedFP16Matrix, lambda p: ((p.b,), None), lambda _, children: PackedFP16Matrix(children[0])
)
