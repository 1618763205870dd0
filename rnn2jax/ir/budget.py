"""The memory budget: the most bytes one array rnn2jax is about to make (a fill's output, a drawn or given
input) may take. Arrays over it are refused with a `ResourceError` before any work starts, instead of a
`MemoryError` or XLA's RESOURCE_EXHAUSTED minutes later.

The budget is, in order: what `set_memory_budget` set; the environment variable RNN2JAX_MEMORY_BUDGET
(bytes, or a number with a binary suffix: 512K, 64M, 8G, 1.5T); half the machine's physical memory.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BadArgumentError, ResourceError

ENV_VAR = "RNN2JAX_MEMORY_BUDGET"
FRACTION = 0.5  # of physical memory
FALLBACK_PHYSICAL = 8 * 2**30  # when the OS does not say how much memory there is

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGTP]?)(?:I?B)?\s*", re.IGNORECASE)

_override: int | None = None


def parse_size(text: str, what: str = ENV_VAR) -> int:
    """'8G' -> 8 * 2**30 bytes. Suffixes K, M, G, T, P are powers of 1024 (an optional B or iB may
    follow); no suffix means bytes. The result must be at least one byte."""
    match = _SIZE.fullmatch(str(text))
    if match is None:
        raise BadArgumentError(
            f"{what}={text!r} is not a size: give bytes or a number with a suffix K, M, G or T (e.g. 8G)"
        )
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size < 1:
        raise BadArgumentError(f"{what}={text!r} is less than one byte")
    return size


def physical_memory() -> int:
    """The machine's physical memory in bytes (FALLBACK_PHYSICAL when the OS does not say)."""
    try:
        size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return FALLBACK_PHYSICAL
    return size if size > 0 else FALLBACK_PHYSICAL


def memory_budget() -> int:
    """The budget in bytes now: the setter's value, else $RNN2JAX_MEMORY_BUDGET, else half of physical memory."""
    if _override is not None:
        return _override
    text = os.environ.get(ENV_VAR, "").strip()
    if text:
        return parse_size(text)
    return int(physical_memory() * FRACTION)


def set_memory_budget(size: int | str | None) -> int | None:
    """Set the budget: bytes (int), a size such as "8G", or None to go back to the default
    ($RNN2JAX_MEMORY_BUDGET, else half of physical memory). Returns the previous setting (or None)."""
    global _override
    if size is None:
        new = None
    elif isinstance(size, str):
        new = parse_size(size, "set_memory_budget")
    elif isinstance(size, int | np.integer) and not isinstance(size, bool) and size >= 1:
        new = int(size)
    else:
        raise BadArgumentError(
            f"set_memory_budget takes a positive number of bytes, a size such as '8G', or None; got {size!r}"
        )
    previous, _override = _override, new
    return previous


def format_bytes(size: int) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def check_array(where: str, blob: str, shape: Sequence[int], dtype: Any) -> None:
    """Refuse, with a `ResourceError`, an array of `shape` and `dtype` that would take more than the budget.

    `where` locates the op ("net 'n', op #0 (ConstantFill)"); `blob` is the array's blob name."""
    if not all(isinstance(d, int | np.integer) for d in shape):
        return  # a symbolic dimension (jax.export shape polymorphism): its size is known only when called
    dtype = np.dtype(dtype)
    size = math.prod(int(d) for d in shape) * dtype.itemsize
    budget = memory_budget()
    if size > budget:
        raise ResourceError(
            f"{where}: blob '{blob}' of shape {[int(d) for d in shape]} {dtype} needs {format_bytes(size)}, "
            f"over the memory budget of {format_bytes(budget)} (set {ENV_VAR} or call "
            "rnn2jax.set_memory_budget to change it)",
            size=size,
            budget=budget,
        )


def check_value(where: str, blob: str, value: Any) -> None:
    """`check_array` for an op's output (an array or a tracer, whose shape is known before XLA allocates
    it); other values (step workspaces, PRNG keys) pass."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return
    if not all(isinstance(d, int | np.integer) for d in shape):
        return  # a symbolic dimension (jax.export shape polymorphism): its size is known only when called
    try:
        np.dtype(dtype)
    except TypeError:
        return
    check_array(where, blob, shape, dtype)
