"""Caffe2 blob names as Python identifiers: sanitised, unique within a generated function, and
scoped the way Caffe2's workspaces are (a step net reads what it does not define from its parent)."""

from __future__ import annotations

import builtins
import keyword
import re

# Names the generated module defines or uses besides blobs: never given to a blob.
MODULE_NAMES = frozenset(
    {"jax", "jnp", "np", "lax", "math", "Path", "INPUTS", "OUTPUTS", "load_params", "apply"}
    | {"params", "inputs", "carry", "xs", "t", "new_carry", "rows"}
)
_AMBIGUOUS = frozenset({"l", "I", "O"})  # ruff E741


def sanitise(blob: str) -> str:
    """`LSTM/i2h_w` -> `LSTM_i2h_w`: every character that cannot be in an identifier becomes `_`."""
    ident = re.sub(r"[^0-9A-Za-z_]", "_", blob)
    if not ident or ident[0].isdigit():
        ident = f"b_{ident}"
    if keyword.iskeyword(ident) or keyword.issoftkeyword(ident) or ident in _AMBIGUOUS or ident == "_":
        ident = f"{ident}_"
    return ident


class Names:
    """The identifiers taken in one generated function (nested scan bodies included), so that a
    body's own blobs never shadow the blobs it reads from the enclosing function."""

    def __init__(self, reserved: set[str]):
        self.taken = set(reserved) | MODULE_NAMES | set(dir(builtins))

    def fresh(self, base: str) -> str:
        ident, n = base, 2
        while ident in self.taken:
            ident, n = f"{base}_{n}", n + 1
        self.taken.add(ident)
        return ident


class Scope:
    """Blob name -> identifier in one function or scan body. `lookup` falls through to the
    enclosing scope; `bind` gives the blob a local identifier (kept for later writes: in-place ops
    rebind it)."""

    def __init__(self, names: Names, parent: Scope | None = None):
        self.names = names
        self.parent = parent
        self.local: dict[str, str] = {}

    def lookup(self, blob: str) -> str | None:
        if blob in self.local:
            return self.local[blob]
        return self.parent.lookup(blob) if self.parent is not None else None

    def bind(self, blob: str) -> str:
        if blob not in self.local:
            self.local[blob] = self.names.fresh(sanitise(blob))
        return self.local[blob]
