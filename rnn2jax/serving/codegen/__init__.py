"""`rnn2jax codegen`: a net as a standalone, readable JAX module (jax and numpy only) plus its
parameters, for users leaving Caffe2 and rnn2jax behind.

`generate(net, params)` returns the module's source and the parameters it reads; `write_module` writes
both (`model.py` and `model.npz` beside it). The module's `apply(params, inputs)` gives what
`rnn2jax.compile(net, params=params)` gives, by blob name: the same maths op by op, each op written by its
`emitter` facet (rnn2jax/ops) and calling the same functions as the lowering's kernels (copied by source),
with each RecurrentNetwork as a `lax.scan` over its step net.
"""

from __future__ import annotations

import io
import os
import textwrap
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ...compiler.compiled_net import CompiledNet, as_net
from ...errors import BadArgumentError, ParseError, UnsupportedOpError
from ...ir.files import atomic_write
from ...ir.netdef import Net, Op
from ...ops.emit import HELPERS
from ...runtime.params import save_params
from .body import emit_ops, why_not_written
from .helpers import helper_source, with_dependencies
from .liveness import live_after
from .names import Names, Scope
from .recurrent import Plans
from .writer import Writer

__all__ = ["check_ops", "generate", "module_path", "write_module"]


class _Root(Scope):
    """The net function's scope: a blob first read here comes from `params` or `inputs`."""

    def __init__(self, names: Names, params: set[str], inputs: set[str]):
        super().__init__(names)
        self.sources = {**dict.fromkeys(inputs, "inputs"), **dict.fromkeys(params, "params")}
        self.bindings: list[tuple[str, str, str]] = []  # (identifier, "params" or "inputs", blob)

    def lookup(self, blob: str) -> str | None:
        found = super().lookup(blob)
        if found is None and blob in self.sources:
            found = self.bind(blob)
            self.bindings.append((found, self.sources[blob], blob))
        return found


def generate(
    net: Any, params: Mapping[str, Any], outputs: Sequence[str] | None = None
) -> tuple[str, dict[str, np.ndarray]]:
    """The module's source, and the parameters its `apply` reads (by blob name). `outputs` defaults to
    what `rnn2jax.compile` returns, less the RecurrentNetworks' step_workspaces (the forward pass kept
    for a backward step net: the module is for inference and `jax.grad`)."""
    net = as_net(net)
    check_ops(net)
    compiled = CompiledNet(net, params, outputs, jit=False)  # checks every op and argument, names the blobs
    workspaces = {op.outputs[-1] for op in net.ops if op.type == "RecurrentNetwork" and op.outputs}
    names_out = [n for n in compiled.output_names if outputs is not None or n not in workspaces]
    plans = Plans()
    after, _ = live_after(net.ops, names_out, plans.reads)
    root = _Root(Names(set(HELPERS)), set(compiled.params), set(compiled.input_names))
    writer = Writer(net, root, "    ", set(), [], write_scan=plans.write_scan)
    emit_ops(writer, net.ops, after)
    if writer.problems:
        _refuse(net, writer.problems)
    results = [(name, writer.read(name)) for name in names_out]
    source = _module(net, root, writer, results, compiled.static_inputs)
    used = {blob for _, source_, blob in root.bindings if source_ == "params"}
    return source, {name: np.asarray(compiled.params[name]) for name in compiled.params if name in used}


def check_ops(net: Net) -> None:
    """Refuse a net with ops codegen has no code for, all listed at once (run before rnn2jax's own checks,
    which stop at the ops rnn2jax cannot run)."""
    missing = [(op, why) for op in _forward_ops(net) if (why := why_not_written(op)) is not None]
    if missing:
        _refuse(net, missing)


def _forward_ops(net: Net) -> Iterator[Op]:
    """The net's ops and, inside each RecurrentNetwork, its step net's (not the backward step net's)."""
    for op in net.ops:
        yield op
        step = op.args.get("step_net") if op.type == "RecurrentNetwork" else None
        if step is not None and step.kind == "n":
            yield from _forward_ops(step.value)


def _refuse(net: Net, problems: list[tuple[Op, str]]) -> NoReturn:
    types = sorted({op.type for op, _ in problems})
    listed = "".join(f"\n  {op.where}: {why}" for op, why in problems)
    raise UnsupportedOpError(
        f"{net.where}: codegen cannot write {len(problems)} op(s) of {len(types)} type(s) ({', '.join(types)}):"
        + listed,
        tuple((op.where, op.type) for op, _ in problems),
    )


def _module(net: Net, root: _Root, writer: Writer, results: list, static: Sequence[str]) -> str:
    inputs = [blob for _, source, blob in root.bindings if source == "inputs"]
    bindings = [f"    {ident} = {source}[{blob!r}]" for ident, source, blob in root.bindings]
    returned = [
        f"        {name!r}: {ident},"
        if len(name) + len(ident) < 100
        else f"        {name!r}: (\n            {ident}\n        ),"
        for name, ident in results
    ]
    note = ""
    if static:
        text = f"{', '.join(static)} decide shapes: pass them as NumPy arrays (not traced under jax.jit)."
        note = "\n\n" + "\n".join(textwrap.wrap(text, width=112, initial_indent="    ", subsequent_indent="    "))
    apply = [
        "def apply(params, inputs):",
        f'    """Net {net.name!r}: the parameters and INPUTS by blob name -> OUTPUTS by blob name.{note}"""',
        "    with jax.enable_x64(True):  # Caffe2's int64 and float64 stay 64-bit; every array has its dtype",
        "        return _net(params, inputs)",
        "",
        "",
        "def _net(params, inputs):",
        *bindings,
        *writer.lines,
        "    return {",
        *returned,
        "    }",
    ]
    helpers = [helper_source(name) for name in with_dependencies(writer.helpers)]
    body = "\n\n\n".join([*helpers, _LOAD_PARAMS, "\n".join(apply)])
    header = [
        f'"""Caffe2 net {net.name!r} as JAX, written by `rnn2jax codegen`: it needs only jax and numpy.',
        "",
        "`load_params()` reads the parameters saved beside this file; `apply(params, inputs)` runs the net on",
        "arrays given by Caffe2 blob name and returns its outputs by blob name. Each RecurrentNetwork's step net",
        "is a `lax.scan` body; comments name the original ops (op index: type(inputs) -> outputs).",
        '"""',
        "",
        *_imports(body),
        "",
        f"INPUTS = {_tuple_literal(inputs)}",
        f"OUTPUTS = {_tuple_literal([name for name, _ in results])}",
    ]
    header = [line for i, line in enumerate(header) if line or header[i - 1]]  # no double blank lines
    return "\n".join(header) + "\n\n\n" + body + "\n"


_LOAD_PARAMS = '''def load_params():
    """The parameters saved beside this module (its name with .npz), by blob name."""
    with np.load(Path(__file__).with_suffix(".npz")) as archive:
        return {name: archive[name] for name in archive.files}'''


def _imports(body: str) -> list[str]:
    """The imports `body` uses: a module is used where its name starts an attribute access in code (not in a
    docstring or comment, and `jax.lax.x` does not use `lax`)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(body).readline) if t.type != tokenize.COMMENT]
    accessed = {
        token.string
        for before, token, after in zip([None, *tokens[:-1]], tokens, [*tokens[1:], None], strict=True)
        if token.type == tokenize.NAME and after is not None and after.string == "."
        and (before is None or before.string != ".")
    }

    def used(module: str) -> bool:
        return module in accessed

    stdlib = ["import math"] if used("math") else []
    third = ["import jax"] if used("jax") else []
    third += ["import jax.numpy as jnp"] if used("jnp") else []
    third += ["import numpy as np"]
    third += ["from jax import lax"] if used("lax") else []
    return [*stdlib, "from pathlib import Path", "", *third]


def _tuple_literal(items: list[str]) -> str:
    if not items:
        return "()"
    flat = f"({items[0]!r},)" if len(items) == 1 else f"({', '.join(repr(i) for i in items)})"
    if len(flat) <= 100:
        return flat
    return "(\n" + "".join(f"    {item!r},\n" for item in items) + ")"


def module_path(path: str | os.PathLike) -> Path:
    """The module's path, which must end in .py (the parameters go beside it, with .npz)."""
    if Path(path).suffix != ".py":
        raise BadArgumentError(f"codegen output '{os.fspath(path)}' must be a .py file (the module)")
    return Path(path)


def write_module(path: str | os.PathLike, source: str, params: Mapping[str, np.ndarray]) -> Path:
    """Write `source` to `path` (a .py file) and `params` to the .npz beside it, each all-or-nothing."""
    target = module_path(path)
    save_params(params, target.with_suffix(".npz"))
    try:
        with atomic_write(target) as file:
            file.write(source.encode())
    except OSError as error:
        raise ParseError(f"cannot write '{os.fspath(path)}': {error.strerror or error}") from None
    return target
