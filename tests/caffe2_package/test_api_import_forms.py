"""Every way of importing a `caffe2` module gives one module object, and no module file runs twice.

rnn2jax's `caffe2` modules are reached by two names (`caffe2.python.core` and `rnn2jax.caffe2.python.core`),
and a Caffe2 source tree adds modules under the `caffe2` name only. Each configuration (no source tree, a
small tree with relative imports, the real Caffe2 tree of the real-Caffe2 venv; rnn2jax's names imported
first, or Caffe2's) is one subprocess that imports every module rnn2jax provides, and every module of the
tree it tries, by every import statement there is, and reports what it got. An audit hook counts how often
each module file's code ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rnn2jax" / "caffe2"
API_PAGE = ROOT / "docs" / "caffe2-api.md"
DOC_LIST = "<!-- rnn2jax's own modules, listed from the package -->"


def provided_modules() -> list[str]:
    """Every module of rnn2jax's `caffe2` package, relative to it ("python.core", "proto.caffe2_pb2"), read from
    the files (importing them would be the thing under test)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts:
            names.append(".".join(parts))
    return names


def real_source_tree() -> Path | None:
    """The `caffe2` package of the real-Caffe2 venv ($RNN2JAX_CAFFE2_PYTHON, else .venv-caffe2), if any."""
    python = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python"))
    found = sorted(python.parent.parent.glob("lib/python3*/site-packages/caffe2/python/__init__.py"))
    return found[-1].parent.parent if found else None


# The child: installs rnn2jax as `caffe2`, imports every module by every form, prints a JSON report.
CHILD = r"""
import functools, importlib, json, os, sys
config = json.loads(sys.argv[1])
runs = {}


def count(event, args):
    if event == "exec" and getattr(args[0], "co_name", None) == "<module>":
        name = os.path.realpath(args[0].co_filename)
        runs[name] = runs.get(name, 0) + 1


sys.addaudithook(count)
import rnn2jax.caffe2
rnn2jax.caffe2.install(config["source"])


def forms(name):
    # form -> a function that imports `name` that way and returns what the statement binds
    parent, _, leaf = name.rpartition(".")

    def statement(text):
        def run():
            scope = {}
            exec(text, scope)
            return scope["z"]
        return run

    return {
        "import as": statement(f"import {name} as z"),
        "import, then attribute": statement(f"import {name}\nz = {name}"),
        "from import": statement(f"from {parent} import {leaf} as z"),
        "importlib.import_module": lambda: importlib.import_module(name),
        "__import__, then attributes": lambda: functools.reduce(getattr, name.split(".")[1:], __import__(name)),
        "__import__ with a fromlist": lambda: __import__(name, fromlist=["__name__"]),
    }


def import_all(prefix, modules):
    # every module by every form; module i is first imported by form i (mod the number of forms), so each
    # form does some of the first imports
    results = {}
    for index, module in enumerate(modules):
        each = forms(f"{prefix}.{module}")
        order = list(each)[index % len(each):] + list(each)[: index % len(each)]
        results[module] = {form: each[form]() for form in order}
    return results


ours, tree = config["ours"], config["tree"]
names = {"rnn2jax": "rnn2jax.caffe2", "caffe2": "caffe2"}
first, second = config["first"], "rnn2jax" if config["first"] == "caffe2" else "caffe2"
order = list(reversed(ours + tree)) if first == "caffe2" else ours + tree  # children before parents, or after
got = {first: import_all(names[first], order)}
got[second] = import_all(names[second], order)

report = {"differ": [], "files": {}, "runs": {}, "origin": {}, "relative": None}
import caffe2
if caffe2 is not rnn2jax.caffe2 or importlib.import_module("caffe2") is not rnn2jax.caffe2:
    report["differ"].append(["caffe2", "import caffe2"])
for module in ours + tree:
    expected = sys.modules[f"rnn2jax.caffe2.{module}"]
    report["origin"][module] = [expected.__name__, os.path.realpath(expected.__file__)]
    if sys.modules[f"caffe2.{module}"] is not expected:
        report["differ"].append([module, "sys.modules['caffe2...']"])
    for prefix in (first, second):
        for form, value in got[prefix][module].items():
            if value is not expected:
                report["differ"].append([module, f"{prefix}: {form}", getattr(value, "__name__", repr(value))])
    parent, _, leaf = f"rnn2jax.caffe2.{module}".rpartition(".")
    if getattr(sys.modules[parent], leaf) is not expected:  # every name binds the same module on its package
        report["differ"].append([module, f"{parent}.{leaf} after the imports"])
by_file = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path:
        by_file.setdefault(os.path.realpath(path), {})[id(module)] = name
report["files"] = {path: sorted(objects.values()) for path, objects in by_file.items()}
report["runs"] = {path: n for path, n in runs.items() if os.path.isfile(path)}  # not the statements run here
if config.get("relative"):
    import caffe2.python.rel_user as rel
    import rnn2jax.caffe2.python.core as our_core
    import rnn2jax.caffe2.python.workspace as our_workspace
    from rnn2jax.proto import caffe2_pb2 as our_pb2
    report["relative"] = {
        "from . import core": rel.core is our_core,
        "from .core import Net": rel.Net is our_core.Net,
        "from ..proto import caffe2_pb2": rel.caffe2_pb2 is our_pb2,
        "from . import tree_only": rel.tree_only is sys.modules["caffe2.python.tree_only"],
        "from .tree_only import VALUE": rel.VALUE == 7,
        "from .sub import leaf": rel.leaf is sys.modules["caffe2.python.sub.leaf"],
        "leaf: from .. import workspace": rel.leaf.workspace is our_workspace,
        "leaf: from ...python import core": rel.leaf.core is our_core,
        "leaf: from ...proto.caffe2_pb2 import NetDef": rel.leaf.NetDef is our_pb2.NetDef,
    }
print(json.dumps(report))
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def relative_tree(root: Path) -> Path:
    """A Caffe2 source tree whose modules import each other, and rnn2jax's modules, by relative imports; its
    own `core.py` and `proto/caffe2_pb2.py` must never run (rnn2jax provides those)."""
    source = root / "caffe2"
    write(source / "__init__.py", "")
    write(source / "python" / "__init__.py", "")
    write(source / "python" / "core.py", "raise SystemExit('the tree core.py ran')\n")
    write(source / "proto" / "__init__.py", "")
    write(source / "proto" / "caffe2_pb2.py", "raise SystemExit('the tree caffe2_pb2.py ran')\n")
    write(source / "python" / "tree_only.py", "VALUE = 7\n")
    write(source / "python" / "sub" / "__init__.py", "")
    write(
        source / "python" / "sub" / "leaf.py",
        """
        from .. import workspace
        from ...python import core
        from ...proto.caffe2_pb2 import NetDef
        """,
    )
    write(
        source / "python" / "rel_user.py",
        """
        from . import core
        from .core import Net
        from ..proto import caffe2_pb2
        from . import tree_only
        from .tree_only import VALUE
        from .sub import leaf
        """,
    )
    return source


# modules of the real tree that rnn2jax lacks: Caffe2's test utilities, and a package of the tree's own
REAL_TREE_MODULES = [
    "python.test_util",
    "python.hypothesis_test_util",
    "python.gradient_checker",
    "python.device_checker",
    "python.serialized_test",
    "python.serialized_test.coverage",
    "python.serialized_test.serialized_test_util",
]
RELATIVE_TREE_MODULES = ["python.tree_only", "python.sub", "python.sub.leaf", "python.rel_user"]


def run_child(config: dict, tmp_path: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env["JAX_PLATFORMS"] = "cpu"
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # nothing at setup-caffe2's places: no tree is found
    for name in ("RNN2JAX_CAFFE2_SOURCE", "RNN2JAX_CAFFE2_PYTHON"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(config)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("first", ["rnn2jax", "caffe2"], ids=["rnn2jax-names-first", "caffe2-names-first"])
@pytest.mark.parametrize("tree", ["none", "relative", "real"], ids=["no-tree", "relative-tree", "real-tree"])
def test_every_import_form_gives_one_module_object_and_runs_each_file_once(first, tree, tmp_path):
    ours = provided_modules()
    assert {"python.core", "proto.caffe2_pb2", "proto.metanet_pb2", "python.helpers.fc"} <= set(ours)
    assert {"python.modeling.initializers", "python.predictor.predictor_exporter", "python"} <= set(ours)
    if tree == "real":
        source = real_source_tree()
        if source is None:
            pytest.skip("no real-Caffe2 venv ($RNN2JAX_CAFFE2_PYTHON or .venv-caffe2): its caffe2 tree is the source")
        tree_modules = REAL_TREE_MODULES
    elif tree == "relative":
        source, tree_modules = relative_tree(tmp_path / "src"), RELATIVE_TREE_MODULES
    else:
        source, tree_modules = None, []
    config = {
        "source": None if source is None else str(source),
        "ours": ours,
        "tree": tree_modules,
        "first": first,
        "relative": tree == "relative",
    }
    report = run_child(config, tmp_path)
    assert report["differ"] == []

    # rnn2jax's module is the one each name gives: its own file, under its rnn2jax name; the schemas are
    # rnn2jax.proto's; the tree's modules come from the tree, under their caffe2 name
    for module in ours:
        name, path = report["origin"][module]
        if module in ("proto.caffe2_pb2", "proto.hsm_pb2", "proto.metanet_pb2"):
            leaf = module.rpartition(".")[2]
            assert (name, path) == (f"rnn2jax.proto.{leaf}", str((ROOT / "rnn2jax" / "proto" / f"{leaf}.py").resolve()))
        else:
            relative = Path(*module.split("."))
            expected = (
                PACKAGE / relative / "__init__.py" if (PACKAGE / relative).is_dir() else PACKAGE / f"{relative}.py"
            )
            assert (name, path) == (f"rnn2jax.caffe2.{module}", str(expected.resolve()))
    for module in tree_modules:
        name, path = report["origin"][module]
        relative = Path(*module.split("."))
        expected = source / relative / "__init__.py" if (source / relative).is_dir() else source / f"{relative}.py"
        assert (name, path) == (f"caffe2.{module}", str(expected.resolve()))

    # one module object per file, and each file's code ran once
    ran_twice = {path: n for path, n in report["runs"].items() if n > 1}
    assert ran_twice == {}
    shared = {path: names for path, names in report["files"].items() if len(names) > 1}
    assert shared == {}
    ours_ran = {p for p in report["runs"] if p.startswith(str(PACKAGE.resolve()))}
    assert ours_ran == {str(p.resolve()) for p in PACKAGE.rglob("*.py")}  # every file of the package ran, once
    if source is not None:
        tree_ran = {p for p in report["runs"] if p.startswith(str(source.resolve()))}
        assert str((source / "python" / "core.py").resolve()) not in tree_ran  # rnn2jax's core, not the tree's
        assert str((source / "proto" / "caffe2_pb2.py").resolve()) not in tree_ran
    if tree == "relative":
        assert report["relative"] == dict.fromkeys(report["relative"], True)
        assert len(report["relative"]) == 9


# --------------------------------------------------------------------------------------------------
# docs/caffe2-api.md lists the modules rnn2jax implements: the package's


def documented_modules() -> set[str]:
    """The modules of the page's list: each item `- `caffe2.pkg`: `a`, `b`` names caffe2.pkg, caffe2.pkg.a, ..."""
    lines = API_PAGE.read_text().splitlines()
    start = lines.index(DOC_LIST) + 1
    items: list[str] = []
    for line in lines[start:]:
        if not line.strip():
            break
        if line.startswith("- "):
            items.append(line[2:])
        else:
            items[-1] += " " + line.strip()  # a continued item
    names = set()
    for item in items:
        package, _, leaves = item.partition(":")
        package = package.strip(" `")
        names.add(package)
        names.update(f"{package}.{leaf.strip(' `')}" for leaf in leaves.split(","))
    return names


def test_the_api_page_lists_every_caffe2_module_rnn2jax_implements():
    public = {
        f"caffe2.{m}" for m in provided_modules() if m.split(".")[0] in ("python", "proto") and "._" not in f".{m}"
    }
    assert {"caffe2.python.core", "caffe2.proto.caffe2_pb2", "caffe2.python.helpers.fc"} <= public
    listed = documented_modules()
    by_package: dict[str, list[str]] = {}
    for name in sorted(public):
        parent, _, leaf = name.rpartition(".")
        if name not in ("caffe2.python", "caffe2.proto") and not (PACKAGE / Path(*name.split(".")[1:])).is_dir():
            by_package.setdefault(parent, []).append(f"`{leaf}`")
    expected_list = "\n".join(f"- `{package}`: {', '.join(leaves)}" for package, leaves in by_package.items())
    assert listed == public, f"docs/caffe2-api.md's list is out of date; it should read:\n{expected_list}"
