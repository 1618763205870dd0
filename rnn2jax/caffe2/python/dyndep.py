"""Caffe2's `dyndep`: `InitOpsLibrary` loaded a shared library of C++ operators into Caffe2.

rnn2jax runs no C++ ops, so it keeps Caffe2's behaviour where Caffe2 loaded nothing and refuses where
Caffe2 would have: a name that is not a file (Buck targets such as
`@/caffe2/caffe2/distributed:file_store_handler_ops`, which Caffe2's own scripts pass and whose ops rnn2jax
implements itself) is ignored with Caffe2's message; an existing library is an error that says to register
the ops in Python with `rnn2jax.register_op` instead.
"""

from __future__ import annotations

import os

from ...errors import Rnn2JaxError

_IMPORTED_DYNDEPS: set[str] = set()


def InitOpsLibrary(name: str, trigger_lazy: bool = True) -> None:
    if not os.path.exists(name):
        print(f"Ignoring {name} as it is not a valid file.")
        return
    raise Rnn2JaxError(
        f"dyndep.InitOpsLibrary('{name}'): rnn2jax cannot load C++ op libraries; "
        "register the ops in Python with rnn2jax.register_op"
    )


def GetImportedOpsLibraries() -> set[str]:
    """The libraries loaded so far: always none, as rnn2jax loads none."""
    return _IMPORTED_DYNDEPS
