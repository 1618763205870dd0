"""Caffe2's `helpers.arg_scope`: keyword defaults for chosen brew helpers, per thread.

`with brew.arg_scope([brew.fc], axis=2): ...` makes every `brew.fc` inside the block get `axis=2`
unless the call gives its own; scopes nest, and the inner value wins.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_threadlocal_scope = threading.local()


def get_current_scope() -> dict[str, dict[str, Any]]:
    """The keyword defaults in force, keyed by helper name."""
    if not hasattr(_threadlocal_scope, "current_scope"):
        _threadlocal_scope.current_scope = {}
    return _threadlocal_scope.current_scope


@contextlib.contextmanager
def arg_scope(single_helper_or_list: Callable | Sequence[Callable], **kwargs: Any) -> Iterator[None]:
    """Give `kwargs` as defaults to the helpers named (functions, keyed by `__name__`) inside the block."""
    helpers = single_helper_or_list if isinstance(single_helper_or_list, list) else [single_helper_or_list]
    if not all(callable(h) for h in helpers):
        raise TypeError("arg_scope takes a helper function or a list of helper functions")
    old_scope = copy.deepcopy(get_current_scope())
    current = get_current_scope()
    for helper in helpers:
        current.setdefault(helper.__name__, {}).update(kwargs)
    try:
        yield
    finally:
        _threadlocal_scope.current_scope = old_scope
