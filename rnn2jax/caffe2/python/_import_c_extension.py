"""Caffe2's `caffe2.python._import_c_extension`, which its modules import as `C`: the C extension
(`caffe2_pybind11_state`, rnn2jax's module of that name) and whether there are GPUs.

`has_cuda_support` and `has_gpu_support` are `workspace`'s, computed when first read: asking JAX for its
devices starts its backend, which a script training across hosts must not do before its rendezvous.
"""

from __future__ import annotations

import sys
from typing import Any

from . import workspace as _workspace
from .caffe2_pybind11_state import *  # noqa: F403  (Caffe2's module is exactly that, plus the flags below)
from .caffe2_pybind11_state import __all__ as _c_names

has_hip_support = False
_workspace.C = sys.modules[__name__]  # Caffe2's `workspace.C` is this module (which builds on workspace)

__all__ = [*_c_names, "has_cuda_support", "has_gpu_support"]  # noqa: F405  (the two: __getattr__ below)


def __getattr__(name: str) -> Any:
    if name in ("has_cuda_support", "has_gpu_support"):
        return getattr(_workspace, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
