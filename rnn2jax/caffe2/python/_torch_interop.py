"""Caffe2's PyTorch interop: `workspace.FetchTorch(name)` (`Blob.to_torch()`) and `FeedBlob(name, tensor)` make
the blob and a CPU `torch.Tensor` one tensor, so each sees the other's writes, resizes included.

rnn2jax's blobs are arrays its nets read and replace, so the sharing is kept at the API's edges: before each
workspace call the blob takes a copy of the tensor as it is now (resizes included), and after it the blob's
value, new or written in place, is copied into the tensor, resized to it. (A NumPy view of the tensor would not
do: exporting its memory to NumPy makes PyTorch refuse to resize it.) Needs the `torch` extra
(`pip install 'rnn2jax[torch]'`).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import jax
import numpy as np

from ...errors import InputTypeError, Rnn2JaxError

# workspace -> blob name -> (the tensor, the value the blob held when they last agreed)
_ALIASES: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, Any]]] = weakref.WeakKeyDictionary()


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise Rnn2JaxError(
            "workspace.FetchTorch and feeding a torch.Tensor need PyTorch: install rnn2jax's `torch` extra "
            "(pip install 'rnn2jax[torch]')"
        ) from None
    return torch


def is_torch_tensor(value: Any) -> bool:
    """Whether `value` is a torch.Tensor (without importing torch when no one has)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _share(ws: Any, name: str, tensor: Any) -> None:
    copy = tensor.detach().clone().numpy()
    ws.put(name, copy)
    _ALIASES.setdefault(ws, {})[name] = (tensor, copy)


def feed(ws: Any, name: str, tensor: Any) -> None:
    """Make blob `name` share `tensor` (a CPU tensor), as Caffe2's FeedBlob of a torch.Tensor does."""
    if tensor.device.type != "cpu":
        raise InputTypeError(f"FeedBlob('{name}'): a {tensor.device.type} tensor cannot feed a CPU blob")
    _share(ws, name, tensor)


def to_torch(ws: Any, name: str) -> Any:
    """The blob as a torch.Tensor sharing its memory (Caffe2's Blob.to_torch)."""
    torch = _torch()
    shared = _ALIASES.get(ws, {}).get(name)
    if shared is not None and ws.has_blob(name) and ws.get(name) is shared[1]:  # still one
        return shared[0]
    value = ws.fetch(name)
    if not isinstance(value, np.ndarray) or value.dtype == object:
        raise InputTypeError(f"Blob('{name}').to_torch: the blob holds a {type(value).__name__}, not a tensor")
    tensor = torch.tensor(np.array(value, copy=True))  # owns its memory, so it can be resized
    _share(ws, name, tensor)
    return tensor


def refresh() -> None:
    """Before a workspace call: each shared blob takes its tensor's value as it is now."""
    for ws, shared in list(_ALIASES.items()):
        for name, (tensor, view) in list(shared.items()):
            if ws.has_blob(name) and ws.get(name) is view:
                _share(ws, name, tensor)


def write_back() -> None:
    """After a workspace call: each shared blob's value goes into its tensor (resized to it); a blob reset,
    removed or given another type (which a torch.Tensor cannot take in place) stops sharing."""
    for ws, shared in list(_ALIASES.items()):
        for name, (tensor, _) in list(shared.items()):
            value = ws.get(name) if ws.has_blob(name) else None
            if not isinstance(value, np.ndarray | jax.Array) or value.dtype == object:
                del shared[name]
                continue
            torch = _torch()
            source = torch.tensor(np.array(value, copy=True))  # owns its memory, so it can be resized
            if source.dtype != tensor.dtype:
                del shared[name]
                continue
            with torch.no_grad():
                if tensor.shape == source.shape:
                    tensor.copy_(source)
                else:  # the tensor takes the new value's memory (resize_ is refused once NumPy viewed it)
                    tensor.set_(source)
            shared[name] = (tensor, value)


def active() -> bool:
    return any(_ALIASES.values())
