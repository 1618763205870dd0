"""Checks on values that are only known when the compiled net runs (traced indices, traced lengths).

Caffe2 refused such inputs at the op (CAFFE_ENFORCE); under `jax.jit` a kernel sees tracers and cannot
raise. A kernel states the condition with `runtime_check`; `CompiledNet` runs nets holding such ops under
`jax.experimental.checkify` (`checked_call`) and raises the first failed check as a `ShapeError` naming
the op and the blob, after the computation. Outside `checked_call` (`apply` under the user's own
`jax.grad` or `jit`, `verify`) the checks are skipped and the kernels' fallbacks (clamped indices) apply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import jax
import numpy as np
from jax.experimental import checkify

from ..errors import ShapeError

_ENABLED: ContextVar[bool] = ContextVar("rnn2jax_runtime_checks", default=False)

# Op types whose kernels call `runtime_check` (declared beside them): only nets holding one pay for checkify.
CHECKED_OP_TYPES: set[str] = set()

_SUFFIX = " (`check` failed)"


def runtime_checked(*op_types: str) -> None:
    """Declare that these ops' kernels call `runtime_check`."""
    CHECKED_OP_TYPES.update(op_types)


def runtime_check(ok: Any, message: str, **values: Any) -> None:
    """Require `ok` (a traced bool) to hold when the net runs. `message` may name `values` as `{name}`
    (arrays computed from the inputs, e.g. the first bad index)."""
    if _ENABLED.get():
        checkify.check(ok, message, **values)


@contextmanager
def _enabled() -> Iterator[None]:
    token = _ENABLED.set(True)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def checked_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a pure function to be jitted) returning `(error, result)`: the first failed runtime check,
    or None, and fn's result. Raise the error on the host with `raise_failed`."""

    def traced(*args: Any) -> Any:
        with _enabled():
            return fn(*args)

    return checkify.checkify(traced, errors=checkify.user_checks)


def raise_failed(error: checkify.Error) -> None:
    """Raise the first failed check as a ShapeError (this waits for the computation)."""
    message = error.get()
    if message is not None:
        raise ShapeError(message.removesuffix(_SUFFIX))


def enforce(ok: Any, message: str, **values: Any) -> None:
    """Caffe2's CAFFE_ENFORCE on input VALUES: refused at once (a `ShapeError`) when they are known (an
    eager run, a static input), checked when the compiled net runs when they are traced. `message` is a
    check format string over `values`, its names passed through `literal`."""
    if any(isinstance(v, jax.core.Tracer) for v in (ok, *values.values())):
        runtime_check(ok, message, **values)
    elif not bool(np.asarray(ok)):
        shown = {k: np.asarray(v).item() if np.size(v) == 1 else np.asarray(v) for k, v in values.items()}
        raise ShapeError(message.format(**shown))


def literal(text: str) -> str:
    """`text` (an op's location, a blob name) safe inside a check's format string."""
    return text.replace("{", "{{").replace("}", "}}")


def first_bad(values: jax.Array, bad: jax.Array) -> jax.Array:
    """The first element of `values` where `bad` holds (0 when none does), for a check's message."""
    flat_bad = bad.ravel()
    return values.ravel()[jax.numpy.argmax(flat_bad)] if flat_bad.size else jax.numpy.zeros((), values.dtype)
