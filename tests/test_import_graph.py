"""The import graph runs one way: each package builds only on the packages below it, and no circle is left.

Read from the source (every `import`, lazy ones inside functions included), not from `sys.modules`, so an
import that only some code path takes is caught too. The layers, bottom to top, are the architecture that
docs/architecture.md draws.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rnn2jax"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

# Bottom to top: a module may import its own package and the ones before it, never one after it.
LAYERS = (
    "rnn2jax.errors",
    "rnn2jax.proto",
    "rnn2jax.ir",
    "rnn2jax.storage",
    "rnn2jax.native",
    "rnn2jax.ops",
    "rnn2jax.lowering",
    "rnn2jax.runtime",
    "rnn2jax.compiler",
    "rnn2jax.checking",
    "rnn2jax.serving",
    "rnn2jax.caffe2",
    "rnn2jax.cli",
)
ENTRY_POINTS = {"rnn2jax", "rnn2jax.__main__"}  # the package's front door (lazy API) and `python -m rnn2jax`
DATA_PACKAGES = {"rnn2jax.examples"}  # bundled example nets: data, no imports
# Caffe2's own Python modules import each other in circles; rnn2jax's copies of them may mirror exactly
# those imports (both ways, as real Caffe2 of torch 1.10.2 makes them), and no other import may close a circle.
MIRRORED_CIRCLES = (
    # core.py: `from caffe2.python import scope, utils, workspace`; workspace.py's RunPlan and
    # RunPlanInBackground: `import caffe2.python.core as core` ("refactor core.py/workspace.py to avoid
    # circular deps", says its TODO)
    frozenset({"rnn2jax.caffe2.python.core", "rnn2jax.caffe2.python.workspace"}),
)
# What op families may build on: the IR, the errors, the wire schema, and each other; the database host ops
# (Load, Save, ...) also read and write Caffe2's databases; the recognised recurrent cells call the native kernels.
OPS_MAY_IMPORT = ("rnn2jax.ops", "rnn2jax.errors", "rnn2jax.ir", "rnn2jax.proto", "rnn2jax.native")
OPS_ALSO_MAY_IMPORT = {"rnn2jax.ops.storage": ("rnn2jax.storage",)}


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


def _layer(module: str) -> int:
    for index, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return index
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS and docs/architecture.md")


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_is_read_from_real_imports():
    graph = _graph()
    assert "rnn2jax.ops.registry" in graph["rnn2jax.lowering.interpreter"]  # the interpreter builds on ops
    assert "rnn2jax.ops.recurrent.forward" in graph["rnn2jax.ops.recurrent"]
    assert "rnn2jax.lowering.interpreter" in _reachable(graph, "rnn2jax.compiler.compiled_net")
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_imports_only_the_layers_below_it():
    graph = _graph()
    upward = [
        f"{name} ({LAYERS[_layer(name)]}) imports {target} ({LAYERS[_layer(target)]})"
        for name, targets in sorted(graph.items())
        if name not in ENTRY_POINTS | DATA_PACKAGES
        for target in sorted(targets)
        if _layer(target) > _layer(name)
    ]
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_only_the_entry_points_import_the_command_line():
    graph = _graph()
    users = {name for name, targets in graph.items() if any(_layer(t) == LAYERS.index("rnn2jax.cli") for t in targets)}
    outside = sorted(users - ENTRY_POINTS - {n for n in users if n.startswith("rnn2jax.cli")})
    assert not outside, f"modules outside cli/ that import it: {outside}"


def _without_mirrored_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """`graph` less the imports that mirror real Caffe2's circles (`MIRRORED_CIRCLES`)."""
    return {
        name: {t for t in targets if frozenset({name, t}) not in MIRRORED_CIRCLES} for name, targets in graph.items()
    }


def test_no_circle_is_left():
    graph = _graph()
    for pair in MIRRORED_CIRCLES:  # each exemption is still needed: both imports exist
        first, second = sorted(pair)
        assert second in graph[first] and first in graph[second], f"{first} <-> {second} is no circle now"
    circles = _circles(_without_mirrored_imports(graph))
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_no_op_family_imports_anything_but_the_ir():
    graph = _graph()
    for name in sorted(n for n in graph if n.startswith("rnn2jax.ops")):
        allowed = OPS_MAY_IMPORT + OPS_ALSO_MAY_IMPORT.get(name, ())
        outside = sorted(m for m in graph[name] if not m.startswith(allowed))
        assert not outside, f"{name} imports {outside}, outside what op families build on"


def test_the_architecture_page_names_every_package_in_layer_order():
    """docs/architecture.md lists the layers, bottom to top, as `rnn2jax/<package>` entries; they must be
    LAYERS, and every package directory under rnn2jax/ must be among them (or be data)."""
    text = ARCHITECTURE.read_text()
    listed = re.findall(r"^\| *`rnn2jax/([\w]+)(?:\.py|/)` *\|", text, flags=re.MULTILINE)
    assert ["rnn2jax." + name for name in listed] == list(LAYERS)
    packages = {f"rnn2jax.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages - DATA_PACKAGES <= set(LAYERS)
    modules = {f"rnn2jax.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"} - ENTRY_POINTS
    assert modules <= set(LAYERS), f"top-level modules outside the layers: {sorted(modules - set(LAYERS))}"
