"""The functions a generated module carries: the `@codegen_helper` functions its ops' emitters asked for,
and those they call, copied by source from the op families (rnn2jax/ops), where the lowering's kernels
call the same functions. Each is checked to read nothing the generated module lacks: only jax, jnp, lax,
np, math, builtins and other helpers."""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import inspect
import math
import textwrap
import types
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from ...errors import RegistrationError
from ...ops.emit import HELPERS

# The generated module's imports, by the names helpers must use for them.
MODULES = {"jax": jax, "jnp": jnp, "lax": jax.lax, "np": np, "math": math}


def helper_name(fn: Callable[..., object]) -> str:
    """The name `fn` has in generated modules; it must be a `@codegen_helper`."""
    if HELPERS.get(getattr(fn, "__name__", "")) is not fn:
        raise RegistrationError(f"{fn!r} is not a @codegen_helper function: generated modules cannot carry it")
    return fn.__name__


def with_dependencies(names: Iterable[str]) -> list[str]:
    """The helpers `names` and those they call, in the order they were registered."""
    todo, found = list(names), set()
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(_calls(HELPERS[name]))
    return [name for name in HELPERS if name in found]


def helper_source(name: str) -> str:
    """The helper's definition as the module carries it: its source, without the decorator."""
    lines = textwrap.dedent(inspect.getsource(HELPERS[name])).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def "))
    return "\n".join(lines[start:]).rstrip()


@functools.cache
def _calls(fn: types.FunctionType) -> tuple[str, ...]:
    """The helpers `fn` calls. Any other global it reads (in its body, defaults or annotations) must be one
    of the generated module's imports or a builtin: else a `RegistrationError` names it."""
    calls = []
    for name in sorted(_global_names(fn)):
        value = fn.__globals__.get(name, _BUILTIN)
        if value is _BUILTIN and hasattr(builtins, name):
            continue
        if MODULES.get(name, _BUILTIN) is value:
            continue
        if HELPERS.get(name) is value:
            calls.append(name)
            continue
        raise RegistrationError(
            f"codegen helper {fn.__module__}.{fn.__name__} reads '{name}', which generated modules do not have "
            f"(they have {', '.join(MODULES)}, builtins and the other @codegen_helper functions)"
        )
    return tuple(calls)


_BUILTIN = object()


def _global_names(fn: types.FunctionType) -> set[str]:
    """The global names `fn` reads: those its code loads (nested code included) and those its signature's
    defaults and annotations name."""
    if fn.__code__.co_freevars:
        raise RegistrationError(f"codegen helper {fn.__module__}.{fn.__name__} is a closure; helpers are module-level")
    names: set[str] = set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME"))
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    (definition,) = ast.parse(helper_source(fn.__name__)).body
    assert isinstance(definition, ast.FunctionDef)
    arguments = definition.args
    signature = [
        *arguments.defaults,
        *(d for d in arguments.kw_defaults if d is not None),
        *(a.annotation for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs) if a.annotation),
        *(a.annotation for a in (arguments.vararg, arguments.kwarg) if a is not None and a.annotation),
        *([definition.returns] if definition.returns else []),
    ]
    names.update(node.id for part in signature for node in ast.walk(part) if isinstance(node, ast.Name))
    return names
