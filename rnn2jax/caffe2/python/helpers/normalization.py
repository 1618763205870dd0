"""Caffe2's `helpers.normalization`, as far as rnn2jax's brew has it: Softmax and LayerNorm."""

from __future__ import annotations

from .. import brew
from ._direct import direct

softmax = direct(brew.softmax)
layer_norm = brew.layer_norm  # takes no **kwargs, so the arg scope never reached it in Caffe2 either

__all__ = ["layer_norm", "softmax"]
