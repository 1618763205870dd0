"""The vocabulary of codegen emitters (`rnn2jax codegen`), importable by op families: an op's `emitter`
facet writes the op as one expression of the generated module, from its arguments and the identifiers of
its inputs, through an `EmitWriter` (serving/codegen/writer.py implements it; ops never import serving).

An expression that needs more than one jax.numpy call calls a function the generated module carries. Such a
function is a plain function of the family module, marked `@codegen_helper`: the generator copies its source
(`inspect.getsource`), so the module runs the same maths as the lowering's kernel, which calls the same
function. Its body may use only jax, jnp, lax, np, math, builtins and other `@codegen_helper` functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..errors import RegistrationError
from ..ir.netdef import Op


class Unsupported(Exception):
    """An op (or an argument of it) codegen has no code for; the message says what. The generator lists it
    with the op, and with every other such op, in one `UnsupportedOpError`."""


@dataclass(frozen=True)
class Call:
    """`fn(arg, ...)`: rendered on one line, or one argument per line when too long."""

    fn: str
    args: tuple[str, ...]

    def flat(self) -> str:
        return f"{self.fn}({', '.join(self.args)})"


def literal(value: object) -> str:
    """A Python expression for an argument value (inf and nan as jnp constants)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "jnp.nan" if math.isnan(value) else ("jnp.inf" if value > 0 else "-jnp.inf")
    return repr(value)


def call(fn: str, *args: str, **keywords: object) -> Call:
    """A call; keyword values are Python literals (defaults are the caller's business)."""
    return Call(fn, (*args, *(f"{k}={literal(v)}" for k, v in keywords.items())))


class Raw(str):
    """A keyword value of `call` written as is (an expression such as `jnp.float32`), not as a literal."""

    def __repr__(self) -> str:
        return str(self)


def only_first(op: Op, value: Call) -> Call | str:
    """The call of a function returning (y, extra) for an op that writes only y."""
    return f"{value.flat()}[0]" if len(op.outputs) == 1 else value


class EmitWriter(Protocol):
    """What an emitter may ask of the generator."""

    live: Sequence[bool]  # for each output of the op being written, whether anything reads it later

    def helper(self, fn: Callable[..., Any]) -> str:
        """Make the module carry `fn` (a `@codegen_helper` function, with those it calls); its name."""
        ...

    def recurrent_network(self, op: Op) -> None:
        """Write a RecurrentNetwork op as a `lax.scan` over its step net, outputs included."""
        ...


# (writer, op, the identifiers of its inputs) -> the value of its outputs (a tuple when several); None when
# the emitter wrote the op's statements itself (RecurrentNetwork). Raises `Unsupported` for what it cannot write.
Emitter = Callable[[EmitWriter, Op, list[str]], Call | str | None]

# name -> function, in registration order: what a generated module may carry (copied by source, by this name)
HELPERS: dict[str, Callable[..., Any]] = {}

_Function = TypeVar("_Function", bound=Callable[..., Any])


def codegen_helper(fn: _Function) -> _Function:
    """Mark `fn` as a function generated modules carry by source: keep its body plain jax.numpy (see the
    module docstring); its name is reserved in every generated module."""
    taken = HELPERS.get(fn.__name__)
    if taken is not None and (taken.__module__, taken.__qualname__) != (fn.__module__, fn.__qualname__):
        raise RegistrationError(
            f"{fn.__module__}: codegen helper '{fn.__name__}' is already {taken.__module__}'s; "
            "generated modules name helpers by their function name"
        )
    HELPERS[fn.__name__] = fn
    return fn
