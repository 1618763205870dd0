"""`install()`: make `import caffe2` resolve to `rnn2jax.caffe2` for the rest of the process.

An import hook maps every `caffe2[.x.y]` module name to the same module object as
`rnn2jax.caffe2[.x.y]`, so state such as the current workspace is shared whichever name a script
imports it by. Modules rnn2jax does not provide (Caffe2's own pure-Python test utilities, say) are
loaded from a Caffe2 source tree: its files are run as they are, on top of this API. The tree is the one
given, else the one `source_tree.find_source` finds, looked for only when such a module is imported.

Two things the tree's files take for granted are not so here, and each module of the tree gets its own
`__builtins__` whose `__import__` makes up for them, in the views of two modules it alone gets:

* Caffe2's files were written for NumPy before 1.24, and use aliases it has since removed (`np.object`,
  `np.str`, `np.float_`, ...): their `numpy` is a proxy of NumPy that adds back those NumPy lacks.
* rnn2jax's `BlobReference` is a `str`, Caffe2's was not, and Caffe2's `schema` tells blob references from
  names with `isinstance(x, basestring)`: their `past.builtins.basestring` leaves blob references out.

NumPy, `past.builtins`, and every other module's view of them, stay as they are.
"""

from __future__ import annotations

import builtins
import collections
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import GeneratorType, ModuleType
from typing import Any

import numpy

from ..compiler.cache import enable_compilation_cache
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
                fullname,
                package,
                loader=_SourceTreeLoader(fullname, str(package)),
                submodule_search_locations=[str(package.parent)],
            )
        module = (source / relative).with_suffix(".py")
        if module.is_file():
            return importlib.util.spec_from_file_location(
                fullname, module, loader=_SourceTreeLoader(fullname, str(module))
            )
        return None


# NumPy's aliases that Caffe2's sources use and NumPy has removed, as NumPy before 1.24 defined them: the
# builtins (removed in 1.24; NumPy 2 gave `bool` and `long` back, as NumPy types, and keeps those), the
# scalar types' old names (removed in 2.0) and `asscalar` (removed in 1.23).
_REMOVED_NUMPY_NAMES: dict[str, Any] = {
    "object": object,
    "bool": bool,
    "int": int,
    "long": int,
    "float": float,
    "complex": complex,
    "str": str,
    "unicode": str,
    "float_": numpy.float64,
    "complex_": numpy.complex128,
    "string_": numpy.bytes_,
    "unicode_": numpy.str_,
    "NaN": numpy.nan,
    "Inf": numpy.inf,
    "asscalar": lambda a: a.item(),
}


def _numpy1_array(obj: Any, dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
    """NumPy 1's `array`: a Python int outside an integer dtype's range wraps around as a C cast does (NumPy 2
    raises OverflowError; Caffe2's sparse_to_dense_mask_test feeds 2e12 as int32 on purpose)."""
    try:
        made = numpy.array(obj, dtype, *args, **kwargs)
    except OverflowError:
        if dtype is None or numpy.dtype(dtype).kind not in "iu":
            raise
        made = numpy.array(obj, numpy.int64, *args, **kwargs).astype(dtype)
    return _numpy1(made)


def _plain(x: Any) -> Any:
    return x.view(numpy.ndarray) if isinstance(x, _Numpy1Array) else x


_KINDS = "biufc"  # NumPy 1's categories, lowest first: a scalar of a category no higher than the arrays' is "weak"


def _value_based(x: Any, arrays: list[numpy.dtype]) -> Any:
    """A NumPy scalar (or 0-d array) operand as NumPy 1 promoted it against arrays of dtypes `arrays`: by its
    value, when its category is no higher than theirs and its value fits their type (then it is passed as the
    Python scalar NumPy 2 treats alike), else by its dtype."""
    if not (isinstance(x, numpy.generic) or (isinstance(x, numpy.ndarray) and x.ndim == 0)):
        return x
    kind = numpy.dtype(x.dtype).kind
    target = numpy.result_type(*arrays)
    if kind not in _KINDS or target.kind not in _KINDS or _KINDS.index(kind) > _KINDS.index(target.kind):
        return x
    if not numpy.can_cast(numpy.min_scalar_type(x), target):
        return x
    return x.item()


class _Numpy1Array(numpy.ndarray):
    """An array made by Caffe2's tree's NumPy, which behaves as NumPy 1 did where Caffe2's sources rely on it:

    * item assignment takes a one-element array for one element (`a[i] = np.array([x])`; NumPy 2 raises
      "setting an array element with a sequence"): adam_test's references fill copies so, with LR of shape [1];
    * arithmetic with a NumPy scalar promotes by the scalar's value (NumPy 2's NEP 50 by its type): int32 ones
      times an np.int64 stay int32, as lengths_reducer_fused_8bit_rowwise_ops_test's LENGTHS must;
    * `int()` and `float()` take a one-element array of any rank (NumPy 2 only a 0-d one):
      learning_rate_op_test's `int(np.random.randint(..., size=1))`.

    What is computed from such arrays is one too (a reduction to one value is a NumPy scalar, as usual)."""

    def __int__(self) -> int:
        return int(self.view(numpy.ndarray).reshape(())) if self.size == 1 else super().__int__()

    def __float__(self) -> float:
        return float(self.view(numpy.ndarray).reshape(())) if self.size == 1 else super().__float__()

    def __setitem__(self, key: Any, value: Any) -> None:
        try:
            super().__setitem__(key, value)
        except (TypeError, ValueError):
            if not (isinstance(value, numpy.ndarray) and value.ndim > 0 and value.size == 1):
                raise
            super().__setitem__(key, value.reshape(()))

    def __array_ufunc__(self, ufunc: numpy.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        inputs = tuple(_plain(x) for x in inputs)
        arrays = [x.dtype for x in inputs if isinstance(x, numpy.ndarray) and x.ndim > 0]
        if method == "__call__" and arrays:
            inputs = tuple(_value_based(x, arrays) for x in inputs)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_plain(x) for x in out)
        result = getattr(ufunc, method)(*inputs, **kwargs)
        if out is not None:  # in place: the arrays given
            return out[0] if len(out) == 1 else out
        if isinstance(result, tuple):
            return tuple(_numpy1(x) for x in result)
        return _numpy1(result)

    def __array_wrap__(self, array: Any, context: Any = None, return_scalar: bool = False) -> Any:
        result = numpy.asarray(array).view(numpy.ndarray)
        return result[()] if return_scalar else _numpy1(result)


def _numpy1(x: Any) -> Any:
    return x.view(_Numpy1Array) if type(x) is numpy.ndarray else x


def _numpy1_filled(make: Any) -> Any:
    """NumPy's `make` (copy, zeros, ...), making a `_Numpy1Array`: the arrays a reference function fills."""

    def made(*args: Any, **kwargs: Any) -> Any:
        return _numpy1(make(*args, **kwargs))

    made.__name__ = made.__qualname__ = make.__name__
    made.__doc__ = make.__doc__
    return made


def _numpy1_sum(a: Any, *args: Any, **kwargs: Any) -> Any:
    """NumPy 1's `sum`: of a generator, Python's sum (NumPy 2 raises; cross_entropy_ops_test sums one)."""
    if isinstance(a, GeneratorType):
        return builtins.sum(a)
    return numpy.sum(a, *args, **kwargs)


def _getargspec(func: Any) -> Any:
    """`inspect.getargspec`, removed in Python 3.11 (Caffe2's matmul_op_test calls it): getfullargspec's first
    four fields, under their old names."""
    spec = inspect.getfullargspec(func)
    return _ArgSpec(spec.args, spec.varargs, spec.varkw, spec.defaults)


_ArgSpec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")


# What NumPy 2 changed and Caffe2's sources rely on, as NumPy 1 did it (over NumPy 2's own)
_NUMPY1_BEHAVIOUR: dict[str, Any] = {
    "sum": _numpy1_sum,
    "array": _numpy1_array,
    **{
        name: _numpy1_filled(getattr(numpy, name))
        for name in (
            *("asarray", "copy", "zeros", "zeros_like", "empty", "empty_like"),
            *("ones", "ones_like", "full", "full_like"),
        )
    },
}


class _NotBlobReferences(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        from .python.core import BlobReference

        return isinstance(instance, bytes | str) and not isinstance(instance, BlobReference)

    def __subclasscheck__(cls, subclass: type) -> bool:
        from .python.core import BlobReference

        return issubclass(subclass, bytes | str) and not issubclass(subclass, BlobReference)


class _basestring(metaclass=_NotBlobReferences):
    """`past.builtins.basestring` as Caffe2 saw it: str and bytes, but not a BlobReference (a str here)."""


def _proxy(module: ModuleType, names: dict[str, Any]) -> ModuleType:
    """A module that is `module` plus `names`: each attribute not set here is `module`'s."""
    proxy = ModuleType(module.__name__, module.__doc__)
    proxy.__dict__.update(names)
    proxy.__getattr__ = lambda name: getattr(module, name)  # type: ignore[method-assign]  # PEP 562
    proxy.__dir__ = lambda: sorted(set(dir(module)) | set(names))  # type: ignore[method-assign]
    return proxy


def _tree_view(module: ModuleType) -> ModuleType | None:
    """The tree's view of NumPy (plus the removed aliases it lacks: looked up in its namespace, not with getattr,
    which warns about them; and NumPy 1's `array`) or of `past.builtins` (with `_basestring`); None for any other
    module."""
    if module is numpy:
        present = vars(numpy)
        random = _proxy(  # its draws are NumPy 1 arrays too (int() of a size-1 draw)
            numpy.random,
            {
                name: _numpy1_filled(value)
                for name, value in vars(numpy.random).items()
                if inspect.isroutine(value) and not name.startswith("_")
            },
        )
        return _proxy(
            numpy,
            {
                **{k: v for k, v in _REMOVED_NUMPY_NAMES.items() if k not in present},
                **_NUMPY1_BEHAVIOUR,
                "random": random,
            },
        )
    if module is inspect:
        return _proxy(inspect, {"getargspec": _getargspec})
    if module.__name__ == "past.builtins":
        return _proxy(module, {"basestring": _basestring})
    return None


_tree_views: dict[str, ModuleType | None] = {}  # made on first use: a process that loads no tree module never does


def _import_for_source_tree(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> ModuleType:
    """`__import__` for the tree's modules: `numpy`, `past.builtins` and `inspect` are their views (`_tree_view`), every
    other module is as usual."""
    module = builtins.__import__(name, globals, locals, fromlist, level)
    if module.__name__ not in ("numpy", "past.builtins", "inspect"):
        return module
    if module.__name__ not in _tree_views:
        _tree_views[module.__name__] = _tree_view(module)
    return _tree_views[module.__name__] or module


_SOURCE_TREE_BUILTINS = {**builtins.__dict__, "__import__": _import_for_source_tree}


class _SourceTreeLoader(importlib.machinery.SourceFileLoader):
    """Runs a file of the Caffe2 source tree as usual, with `_SOURCE_TREE_BUILTINS` as its builtins."""

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__builtins__"] = _SOURCE_TREE_BUILTINS
        super().exec_module(module)


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

    It also turns on JAX's persistent compilation cache (`rnn2jax.compiler.cache`: $RNN2JAX_CACHE_DIR, else
    ~/.cache/rnn2jax/jax; an empty RNN2JAX_CACHE_DIR leaves it off), so the script's next run compiles nothing.
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
    enable_compilation_cache()  # a script's nets, compiled once, load from the cache in its next run


def uninstall() -> None:
    """Undo `install()`: `caffe2` modules are forgotten (rnn2jax.caffe2 itself stays imported)."""
    finder = _finder()
    if finder is None:
        return
    sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n == "caffe2" or n.startswith("caffe2.")]:
        del sys.modules[name]


def _parent_packages(name: str) -> None:
    """Empty packages for the dotted parents of `name` that do not exist, so that `import name` finds the module
    (pickle imports a function's module by name: a test file's Python-op builder is pickled, as in Caffe2)."""
    parts = name.split(".")
    for end in range(1, len(parts)):
        parent = ".".join(parts[:end])
        if parent not in sys.modules:
            package = ModuleType(parent)
            package.__path__ = []
            sys.modules[parent] = package


def load_source_tree_file(name: str, path: str | os.PathLike[str]) -> ModuleType:
    """Run one file of Caffe2's as the module `name`, with the views its source tree's modules get (a test file of
    Caffe2's own suite, written for NumPy before 1.24, run unmodified from a copy)."""
    loader = _SourceTreeLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    _parent_packages(name)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
