"""A brew helper called as Caffe2's plain helper function: without the model's `arg_scope`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from . import arg_scope


def direct(helper: Callable[..., Any]) -> Callable[..., Any]:
    """`helper` (one of rnn2jax's brew functions, which merge `model.arg_scope` and `brew.arg_scope`
    themselves) run with both empty, so only the caller's keywords reach the op, as when Caffe2's
    helper module function was called directly rather than through `brew`."""

    @functools.wraps(helper)
    def plain(model: Any, *args: Any, **kwargs: Any) -> Any:
        saved_model_scope = model._arg_scope
        saved_helper_scope = arg_scope.get_current_scope()
        model._arg_scope = {}
        arg_scope._threadlocal_scope.current_scope = {}
        try:
            return helper(model, *args, **kwargs)
        finally:
            model._arg_scope = saved_model_scope
            arg_scope._threadlocal_scope.current_scope = saved_helper_scope

    return plain
