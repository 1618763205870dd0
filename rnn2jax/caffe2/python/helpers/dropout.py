"""Caffe2's `helpers.dropout`: Dropout (outputs `out` and `_<out>_mask`; `is_test` is required)."""

from __future__ import annotations

from .. import brew
from ._direct import direct

dropout = direct(brew.dropout)

__all__ = ["dropout"]
