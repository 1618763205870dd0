"""Caffe2's `helpers.normalization`: Softmax and LayerNorm are rnn2jax's brew's; the module's other helpers
(`spatial_bn`, `lrn`, `instance_norm`, `spatial_gn`, `moments_with_running_stats`: plain Python over the
ModelHelper API) are Caffe2's own, run from the Caffe2 source tree's copy of this file when first asked for."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from ....errors import Rnn2JaxError
from .. import brew
from ._direct import direct

softmax = direct(brew.softmax)
layer_norm = brew.layer_norm  # takes no **kwargs, so the arg scope never reached it in Caffe2 either

FROM_TREE = ("lrn", "instance_norm", "spatial_bn", "spatial_gn", "moments_with_running_stats")
_TREE_MODULE = "caffe2.python.helpers._tree_normalization"

__all__ = ["layer_norm", "softmax", *FROM_TREE]


def _tree_module() -> ModuleType:
    """The source tree's helpers/normalization.py, loaded once (under a name of its own: this module is
    `caffe2.python.helpers.normalization`)."""
    if _TREE_MODULE in sys.modules:
        return sys.modules[_TREE_MODULE]
    from ...import_hook import caffe2_source, load_source_tree_file

    source = caffe2_source()
    path = source.path / "python" / "helpers" / "normalization.py" if source is not None else None
    if path is None or not path.is_file():
        raise Rnn2JaxError(
            "Caffe2's normalization helpers (spatial_bn, lrn, instance_norm, spatial_gn, "
            "moments_with_running_stats) are its own helpers/normalization.py, which rnn2jax runs from a Caffe2 "
            "source tree: none is in use (rnn2jax.caffe2.install(source=DIR), or $RNN2JAX_CAFFE2_SOURCE)"
        )
    return load_source_tree_file(_TREE_MODULE, path)


def __getattr__(name: str) -> Any:
    if name in FROM_TREE:
        return getattr(_tree_module(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
