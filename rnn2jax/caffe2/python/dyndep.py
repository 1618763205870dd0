"""Caffe2's `dyndep` loaded C++ op libraries; rnn2jax runs no C++ ops. Register Python ops with
`rnn2jax.register_op` instead."""

from __future__ import annotations

from ...errors import Rnn2JaxError


def InitOpsLibrary(name: str, trigger_lazy: bool = True) -> None:
    raise Rnn2JaxError(
        f"dyndep.InitOpsLibrary('{name}'): rnn2jax cannot load C++ op libraries; "
        "register the ops in Python with rnn2jax.register_op"
    )
