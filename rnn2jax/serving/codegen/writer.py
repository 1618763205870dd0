"""Lines of generated code: statements wrapped to the line length, comments naming the original ops,
and the blob names each statement reads and writes resolved through a `Scope`. `Writer` is what op
emitters (rnn2jax/ops, `rnn2jax.ops.emit.EmitWriter`) write through."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import MissingBlobError
from ...ir.netdef import Net, Op
from ...ops.emit import Call, Unsupported
from .helpers import helper_name
from .names import Scope

LINE_LENGTH = 120


def op_summary(op: Op) -> str:
    return f"op {op.index}: {op.type}({', '.join(op.inputs)}) -> {', '.join(op.outputs)}"


@dataclass
class Writer:
    """The body of one generated function (or scan body) at one indentation."""

    net: Net
    scope: Scope
    indent: str
    helpers: set[str]  # the helpers the module carries (shared by the whole module)
    problems: list[tuple[Op, str]]  # ops without code, with why (shared by the whole module)
    lines: list[str] = field(default_factory=list)
    live: list[bool] = field(default_factory=list)  # the current op's outputs: whether a later op reads them
    # writes a RecurrentNetwork op as a lax.scan (recurrent.py's `Plans.write_scan`), for `recurrent_network`
    write_scan: Callable[[Writer, Op], None] | None = None

    def nested(self, net: Net, scope: Scope) -> Writer:
        """A writer for a function defined inside this one (a scan body), one indentation deeper."""
        return Writer(net, scope, self.indent + "    ", self.helpers, self.problems, write_scan=self.write_scan)

    # -- what emitters ask for ----------------------------------------------------------------------

    def helper(self, fn: Callable[..., object]) -> str:
        name = helper_name(fn)
        self.helpers.add(name)
        return name

    def recurrent_network(self, op: Op) -> None:
        if self.write_scan is None:
            raise Unsupported("RecurrentNetwork needs the generator's scan writer")
        self.write_scan(self, op)

    # -- blobs ----------------------------------------------------------------------------------

    def read(self, blob: str, op: Op | None = None) -> str:
        ident = self.scope.lookup(blob)
        if ident is None:
            where = op.where if op is not None else self.net.where
            raise MissingBlobError(f"{where}: reads blob '{blob}' before anything writes it")
        return ident

    def write(self, blob: str, live: bool = True) -> str:
        return self.scope.bind(blob) if live else "_"

    # -- lines ----------------------------------------------------------------------------------

    def comment(self, text: str) -> None:
        width = LINE_LENGTH - len(self.indent) - 2
        for i, part in enumerate(textwrap.wrap(text, width=width - 2, break_on_hyphens=False) or [""]):
            self.lines.append(f"{self.indent}# {'  ' if i else ''}{part}")

    def line(self, code: str) -> None:
        self.lines.append(f"{self.indent}{code}")

    def blank(self) -> None:
        self.lines.append("")

    def assign_tuple(self, target: str, items: list[str]) -> None:
        """`target = (a, b)`, one item per line when too long."""
        flat = f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if len(self.indent) + len(target) + 3 + len(flat) <= LINE_LENGTH:
            self.line(f"{target} = {flat}")
        else:
            self.lines += [f"{self.indent}{target} = (", *(f"{self.indent}    {i}," for i in items), f"{self.indent})"]

    def unpack(self, targets: list[str], source: str) -> None:
        """`a, b = source` (`(a,) = source` for one), one target per line when too long."""
        if all(t == "_" for t in targets):
            return
        flat = f"({targets[0]},)" if len(targets) == 1 else ", ".join(targets)
        if len(self.indent) + len(flat) + 3 + len(source) <= LINE_LENGTH:
            self.line(f"{flat} = {source}")
        else:
            self.lines += [
                f"{self.indent}(",
                *(f"{self.indent}    {t}," for t in targets),
                f"{self.indent}) = {source}",
            ]

    def assign(self, targets: list[str] | str, value: Call | str) -> None:
        lhs = targets if isinstance(targets, str) else ", ".join(targets)
        pad, inner = self.indent, self.indent + "    "
        flat = value.flat() if isinstance(value, Call) else value
        if len(pad) + len(lhs) + 3 + len(flat) <= LINE_LENGTH:
            self.line(f"{lhs} = {flat}")
            return
        opener = f"{value.fn}(" if isinstance(value, Call) else "("
        head = f"{pad}{lhs} = {opener}"
        if len(head) > LINE_LENGTH and not isinstance(targets, str) and len(targets) > 1:
            self.lines += [f"{pad}(", *(f"{inner}{t}," for t in targets), f"{pad}) = {opener}"]
        else:
            self.lines.append(head)
        args = value.args if isinstance(value, Call) else (flat,)
        self.lines += [*(f"{inner}{a}{',' if isinstance(value, Call) else ''}" for a in args), f"{pad})"]
