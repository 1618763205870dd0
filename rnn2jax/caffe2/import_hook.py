"""`install()`: make `import caffe2` resolve to `rnn2jax.caffe2` for the rest of the process.

An import hook maps every `caffe2[.x.y]` module name to the same module object as
`rnn2jax.caffe2[.x.y]`, so state such as the current workspace is shared whichever name a script
imports it by. Modules rnn2jax does not provide (Caffe2's own pure-Python test utilities, say) are
loaded from a Caffe2 source tree: its files are run as they are, on top of this API. The tree is the one
given, else the one `source_tree.find_source` finds, looked for only when such a module is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import Rnn2JaxError
from .source_tree import Caffe2Source, given_source, installed_source

_PACKAGE = __name__.rpartition(".")[0]  # "rnn2jax.caffe2"


class _AliasLoader(importlib.abc.Loader):
    """Loads `caffe2.x` as the already-imported `rnn2jax.caffe2.x` (one module object, two names)."""

    def __init__(self, real: ModuleType):
        self.real = real
        self.real_spec = real.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.real

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.real_spec  # the import system set the alias spec; keep the real one


class _Caffe2Finder(importlib.abc.MetaPathFinder):
    def __init__(self, source: Caffe2Source | None):
        self._found = source
        self._looked = source is not None

    def found(self) -> Caffe2Source | None:
        """The tree given, else the installed one, looked for on first need: a process that imports only
        rnn2jax's modules never looks."""
        if not self._looked:
            self._found = installed_source()
            self._looked = True
        return self._found

    def use(self, source: Caffe2Source | None) -> None:
        self._found, self._looked = source, True

    @property
    def source(self) -> Path | None:
        found = self.found()
        return found.path if found is not None else None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(_PACKAGE + "."):
            return self._source_alias(fullname, path)
        if fullname != "caffe2" and not fullname.startswith("caffe2."):
            return None
        real = _ours(_PACKAGE + fullname[len("caffe2") :])
        if real is not None:
            return importlib.util.spec_from_loader(fullname, _AliasLoader(real), is_package=hasattr(real, "__path__"))
        return self._from_source(fullname)

    def _source_alias(self, fullname: str, path: Any) -> importlib.machinery.ModuleSpec | None:
        """`from caffe2.python import device_checker` imports `rnn2jax.caffe2.python.device_checker`
        (the package's real name): when rnn2jax has no such module, it is `caffe2.python.device_checker`
        from `source`, under both names."""
        parent = sys.modules.get(fullname.rpartition(".")[0])
        parent_is_ours = parent is None or parent.__name__.startswith(_PACKAGE)
        if parent_is_ours and importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
            return None  # rnn2jax's own module: the normal import loads it
        if self.source is None:
            return None
        alias = "caffe2" + fullname[len(_PACKAGE) :]
        if self._from_source(alias) is None:
            return None
        module = importlib.import_module(alias)
        return importlib.util.spec_from_loader(fullname, _AliasLoader(module), is_package=hasattr(module, "__path__"))

    def _from_source(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        source = self.source
        if source is None:
            return None
        relative = Path(*fullname.split(".")[1:])
        package = source / relative / "__init__.py"
        if package.is_file():
            return importlib.util.spec_from_file_location(
                fullname, package, submodule_search_locations=[str(package.parent)]
            )
        module = (source / relative).with_suffix(".py")
        if module.is_file():
            return importlib.util.spec_from_file_location(fullname, module)
        return None


def _ours(real_name: str) -> ModuleType | None:
    """rnn2jax's own module `real_name` (imported), or None when rnn2jax has no such module."""
    if real_name in sys.modules:
        module = sys.modules[real_name]
        # rnn2jax's own, possibly under another rnn2jax name (caffe2_pb2 is rnn2jax.proto.caffe2_pb2), and
        # not a module of the source tree aliased under rnn2jax's name by `_source_alias`
        return module if module.__name__.startswith("rnn2jax.") else None
    parent_name = real_name.rpartition(".")[0]
    parent = _ours(parent_name) if parent_name != _PACKAGE else importlib.import_module(_PACKAGE)
    if parent is None or not hasattr(parent, "__path__"):
        return None
    if importlib.machinery.PathFinder.find_spec(real_name, parent.__path__) is None:
        return None
    return importlib.import_module(real_name)


def _finder() -> _Caffe2Finder | None:
    return next((f for f in sys.meta_path if isinstance(f, _Caffe2Finder)), None)


def installed() -> bool:
    """True when `import caffe2` resolves to rnn2jax in this process."""
    return _finder() is not None


def caffe2_source() -> Caffe2Source | None:
    """The Caffe2 source tree this process loads the modules rnn2jax lacks from, and where it was found
    (looking for it now if no such module was imported yet); None when not installed or there is none."""
    finder = _finder()
    return finder.found() if finder is not None else None


def install(source: str | os.PathLike[str] | None = None) -> None:
    """Make `import caffe2` (and `caffe2.python...`, `caffe2.proto...`) resolve to `rnn2jax.caffe2`.

    Modules rnn2jax does not provide (test utilities such as `caffe2.python.hypothesis_test_util`) are loaded
    from a Caffe2 source tree: `source` (a `caffe2` package directory of Caffe2's Python sources), else
    $RNN2JAX_CAFFE2_SOURCE (both checked now), else the tree `rnn2jax setup-caffe2 --source-only` extracted,
    else the caffe2 package of the real-Caffe2 venv `rnn2jax setup-caffe2` made; those two are looked for
    only when a module rnn2jax lacks is imported. Refuses when a real Caffe2 is importable (or imported),
    rather than shadowing it.
    """
    finder = _finder()
    if finder is not None:  # installed already: only a tree given now changes the one it uses
        if source is not None:
            finder.use(given_source(source))
        return
    given = given_source(source)
    loaded = sys.modules.get("caffe2")
    if loaded is not None and not loaded.__name__.startswith(_PACKAGE):
        raise Rnn2JaxError(
            f"a real Caffe2 is already imported in this process ({getattr(loaded, '__file__', '?')}); "
            "rnn2jax.caffe2.install() will not shadow it"
        )
    real = importlib.machinery.PathFinder.find_spec("caffe2")
    if real is not None:
        raise Rnn2JaxError(
            f"a real Caffe2 is importable in this environment ({real.origin}); rnn2jax.caffe2.install() "
            "will not shadow it: run the script with the real Caffe2, or in an environment without it"
        )
    sys.meta_path.insert(0, _Caffe2Finder(given))


def uninstall() -> None:
    """Undo `install()`: `caffe2` modules are forgotten (rnn2jax.caffe2 itself stays imported)."""
    finder = _finder()
    if finder is None:
        return
    sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n == "caffe2" or n.startswith("caffe2.")]:
        del sys.modules[name]
