"""Caffe2's `lazy`: callbacks that import op libraries only when ops are first needed.

`lazy_dyndep.RegisterOpsLibrary` registers one; `core.RefreshRegisteredOperators`, `core.GlobalInit` and
`workspace.CreateNet` trigger them, as in Caffe2, so an error while importing (handed to
`lazy_dyndep.SetErrorHandler`'s handler) surfaces there.
"""

from __future__ import annotations

from collections.abc import Callable

_import_lazy_calls: list[Callable[[], None]] = []


def RegisterLazyImport(lazy: Callable[[], None]) -> None:
    _import_lazy_calls.append(lazy)


def TriggerLazyImport() -> None:
    for lazy in list(_import_lazy_calls):
        lazy()
