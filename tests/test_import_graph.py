"""The import graph runs one way: op families sit below the interpreter, never above it.

Read from the source (every `import`, lazy ones inside functions included), not from `sys.modules`, so an
import that only some code path takes is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rnn2jax"

# What op families may build on: the IR, the errors, the wire schema, and each other.
OPS_MAY_IMPORT = ("rnn2jax.ops", "rnn2jax.errors", "rnn2jax.netdef", "rnn2jax.proto", "rnn2jax.budget")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every rnn2jax module `path` imports, relative imports resolved. `from pkg import name` imports
    the module `pkg.name` where there is one, else `pkg` (a package's own `__init__` runs for any of
    its submodules, so it is not counted as an import of its own)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(submodules)  # `from . import family`
            if len(submodules) < len(node.names):
                found.add(base)
    return {m for m in found if m == "rnn2jax" or m.startswith("rnn2jax.")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path, set(modules)) if m in modules} for name, path in modules.items()}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_graph_is_read_from_real_imports():
    graph = _graph()
    assert "rnn2jax.ops.registry" in graph["rnn2jax.lower"]  # the interpreter builds on the registry
    assert "rnn2jax.ops.recurrent.forward" in graph["rnn2jax.ops.recurrent"]
    assert "rnn2jax.lower" in _reachable(graph, "rnn2jax.compile")


def test_no_op_family_imports_the_interpreter_or_anything_above_it():
    graph = _graph()
    above = {"rnn2jax.lower", "rnn2jax.compile"}
    above |= {name for name in graph if _reachable(graph, name) & above}
    for name in sorted(n for n in graph if n.startswith("rnn2jax.ops")):
        reached = _reachable(graph, name)
        assert not reached & above, f"{name} imports {sorted(reached & above)}"
        outside = sorted(m for m in graph[name] if not m.startswith(OPS_MAY_IMPORT))
        assert not outside, f"{name} imports {outside}, outside what op families build on"
