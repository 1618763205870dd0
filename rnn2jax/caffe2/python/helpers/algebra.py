"""Caffe2's `helpers.algebra`: Transpose, Sum, ReduceSum, Sub, MatMul, ArgMin, BatchMatMul."""

from __future__ import annotations

from typing import Any

from .. import brew
from ..core import BlobReference
from ._direct import direct

transpose = direct(brew.transpose)
sum = direct(brew.sum)
batch_mat_mul = direct(brew.batch_mat_mul)


def reduce_sum(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> BlobReference:
    return model.net.ReduceSum(blob_in, blob_out, **kwargs)


def sub(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> BlobReference:
    return model.net.Sub(blob_in, blob_out, **kwargs)


def mat_mul(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> BlobReference:
    return model.net.MatMul(blob_in, blob_out, **kwargs)


def arg_min(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> BlobReference:
    return model.net.ArgMin(blob_in, blob_out, **kwargs)


__all__ = ["arg_min", "batch_mat_mul", "mat_mul", "reduce_sum", "sub", "sum", "transpose"]
