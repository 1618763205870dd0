"""Caffe2's dtypes in JAX: rnn2jax traces and runs with 64-bit types enabled in its own scope.

Caffe2 keeps int64 (sparse ids, `Iter`, TopK's indices) and float64 exactly. JAX narrows both to 32 bits unless
its x64 mode is on, and that mode is a global setting the user owns. So every entry point of rnn2jax that makes,
traces or runs arrays enters `caffe2_dtypes()` (JAX's own thread-local `enable_x64` context), and every array
rnn2jax creates is given the dtype Caffe2 would give it, so float32 work stays float32 inside the scope.

Arrays made in the scope keep their dtype outside it. What JAX itself narrows outside the scope (an int64
argument of the user's own `jax.jit` without x64) is refused where rnn2jax can see it (`check_not_narrowed`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputTypeError

F = TypeVar("F", bound=Callable[..., Any])

WIDE = frozenset(np.dtype(t) for t in (np.int64, np.uint64, np.float64, np.complex128))


@contextmanager
def caffe2_dtypes() -> Iterator[None]:
    """JAX with 64-bit types on, for this thread, until the block ends (nesting is free)."""
    if jax.config.jax_enable_x64:
        yield
        return
    with jax.enable_x64(True):
        yield


def in_caffe2_dtypes(function: F) -> F:
    """`function` run inside `caffe2_dtypes()`: for rnn2jax's entry points."""

    @functools.wraps(function)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        with caffe2_dtypes():
            return function(*args, **kwargs)

    return scoped  # type: ignore[return-value]


def is_wide(dtype: Any) -> bool:
    """Whether JAX narrows `dtype` when x64 is off (int64, uint64, float64, complex128)."""
    try:
        return np.dtype(dtype) in WIDE
    except TypeError:
        return False


def check_not_narrowed(where: str, name: str, expected: Any, got: Any) -> None:
    """Refuse a value that reached a traced function 32-bit where rnn2jax holds it 64-bit: JAX narrowed it at
    the boundary of a `jax.jit` (or grad, vmap) running with x64 off, wrapping large values silently."""
    if is_wide(expected) and not is_wide(got) and np.dtype(got).kind == np.dtype(expected).kind:
        raise InputTypeError(
            f"{where}: '{name}' is {np.dtype(expected)} but arrived as {np.dtype(got)}: JAX narrowed it because "
            "jax_enable_x64 is off around this call (your own jax.jit, jax.grad or jax.vmap), which would wrap or "
            "round its values silently; wrap the call in `with jax.enable_x64(True):`, or call the CompiledNet "
            "itself, which keeps 64-bit values"
        )


def device_array(value: Any) -> jax.Array:
    """`value` as a JAX array of its own dtype. A NumPy array is copied to the device with `jax.device_put`:
    `jnp.asarray` of one compiles (and caches) an identity program for each new shape and dtype, about 20 ms
    on a CPU, which a net fed arrays of many shapes (a Caffe2 script's FeedBlob, a CompiledNet's first calls)
    pays again and again. Anything else (Python scalars and lists, JAX arrays) goes through `jnp.asarray`."""
    if isinstance(value, np.ndarray | np.generic) and np.dtype(value.dtype).kind in "biufc":
        return jax.device_put(value)
    return jnp.asarray(value)
