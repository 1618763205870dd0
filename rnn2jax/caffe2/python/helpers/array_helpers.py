"""Caffe2's `helpers.array_helpers`: Concat (outputs `out` and `_<out>_concat_dims`)."""

from __future__ import annotations

from typing import Any

from .. import brew
from ..core import BlobReference
from ._direct import direct

concat = direct(brew.concat)


def depth_concat(model: Any, blobs_in: Any, blob_out: str, **kwargs: Any) -> BlobReference:
    """Deprecated in Caffe2 in favour of `concat` (whose call it got wrong: it always raised); here it is
    `concat`."""
    return concat(model, blobs_in, blob_out, **kwargs)


__all__ = ["concat", "depth_concat"]
