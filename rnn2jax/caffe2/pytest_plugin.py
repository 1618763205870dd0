"""A pytest plugin that runs Caffe2-style tests (Caffe2's own, or a user's) on rnn2jax, unchanged.

`pytest -p rnn2jax.caffe2.pytest_plugin [--caffe2-source DIR] tests...` installs rnn2jax as `caffe2`
(`rnn2jax.caffe2.install`) before collection. The test utilities rnn2jax does not provide
(`hypothesis_test_util`, `gradient_checker`, `serialized_test.serialized_test_util`, ...) are loaded from a
`caffe2` package directory of Caffe2's Python sources: DIR, else the one `install()` finds
($RNN2JAX_CAFFE2_SOURCE, the tree of `rnn2jax setup-caffe2 --source-only`, the real-Caffe2 venv's).

Caffe2's hypothesis profiles set no deadline, and compiling a new shape takes longer than hypothesis'
default 200 ms, so this plugin registers a profile `rnn2jax` (Caffe2's `dev` profile without a
deadline) and selects it through $CAFFE2_HYPOTHESIS_PROFILE unless that is set already (and loads it, for
the test files that do not import Caffe2's hypothesis_test_util).

With `--caffe2-own-tests`, unittest's aliases that Python 3.12 removed (`assertEquals`, ...) are restored, as
Caffe2's test files call them. Each test file starts in workspace "default", as it would in a process of its
own: Caffe2's test files assume it, and some leave another workspace current (ideep/fc_op_test switches to
`_device_check_` and stays there, so a later file's device checks would reset the workspace its test feeds).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PROFILE = "rnn2jax"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--caffe2-source",
        metavar="DIR",
        default=None,
        help="a caffe2 package directory of Caffe2's Python sources (its test utilities are loaded from it; "
        "default: $RNN2JAX_CAFFE2_SOURCE, else found as rnn2jax.caffe2.install finds it)",
    )
    parser.addoption(
        "--caffe2-examples",
        type=int,
        default=int(os.environ.get("RNN2JAX_CAFFE2_EXAMPLES", "10")),
        help="hypothesis examples per test in the rnn2jax profile (Caffe2's dev profile ran 10)",
    )
    parser.addoption(
        "--caffe2-own-tests",
        metavar="DIR",
        default=None,
        help="the test files under DIR are Caffe2's own: they see NumPy and past.builtins as the modules of Caffe2's "
        "source tree do (NumPy's aliases removed in 1.24, such as np.float, added back), instead of as they are",
    )


def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import HealthCheck, Verbosity, settings

    from .import_hook import install

    settings.register_profile(
        PROFILE,
        max_examples=config.getoption("--caffe2-examples"),
        deadline=None,
        database=None,
        # differing_executors (newer than Caffe2's hypothesis): Caffe2 tests call one @given helper from
        # several test methods (rnn_cell_test's lstm_base); harmless without an example database
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
        verbosity=Verbosity.normal,
        # rnn2jax's CI profile draws the same examples on every run
        derandomize=os.environ.get("RNN2JAX_HYPOTHESIS_PROFILE") == "ci",
    )
    os.environ.setdefault("CAFFE2_HYPOTHESIS_PROFILE", PROFILE)
    if os.environ["CAFFE2_HYPOTHESIS_PROFILE"] == PROFILE:
        # Caffe2's hypothesis_test_util loads it when imported; a file of @given tests on plain
        # test_util.TestCase (nomnigraph_transformations_test) imports no such thing, and hypothesis' default
        # 200 ms deadline fails the example whose run compiles the net
        settings.load_profile(PROFILE)
    install(config.getoption("--caffe2-source"))
    if config.getoption("--caffe2-own-tests"):
        _restore_unittest_aliases()


# unittest's deprecated aliases, which Python 3.12 removed and Caffe2's test files (written for 3.6-3.9) still call
_UNITTEST_ALIASES = {
    "assertEquals": "assertEqual",
    "assertNotEquals": "assertNotEqual",
    "assertAlmostEquals": "assertAlmostEqual",
    "assertNotAlmostEquals": "assertNotAlmostEqual",
    "assert_": "assertTrue",
    "failUnless": "assertTrue",
    "failIf": "assertFalse",
    "failUnlessEqual": "assertEqual",
    "failIfEqual": "assertNotEqual",
    "failUnlessAlmostEqual": "assertAlmostEqual",
    "failIfAlmostEqual": "assertNotAlmostEqual",
    "failUnlessRaises": "assertRaises",
    "assertRegexpMatches": "assertRegex",
    "assertNotRegexpMatches": "assertNotRegex",
    "assertRaisesRegexp": "assertRaisesRegex",
}


def _restore_unittest_aliases() -> None:
    """Caffe2's own test files see the unittest they were written for: the aliases Python 3.12 removed."""
    import unittest

    for alias, name in _UNITTEST_ALIASES.items():
        if not hasattr(unittest.TestCase, alias):
            setattr(unittest.TestCase, alias, getattr(unittest.TestCase, name))


class _Caffe2TestModule(pytest.Module):
    """A test file of Caffe2's own, run with the views its source tree's modules get (`--caffe2-own-tests`)."""

    def _getobj(self) -> object:
        from .import_hook import load_source_tree_file

        if self.config.getoption("importmode") == "importlib":
            relative = self.path.relative_to(self.config.rootpath).with_suffix("")
            name = "caffe2_own_tests." + ".".join(relative.parts)
        else:
            name = self.path.stem
            if str(self.path.parent) not in sys.path:
                sys.path.insert(0, str(self.path.parent))  # as pytest's prepend mode: its siblings import
        try:
            return load_source_tree_file(name, self.path)
        except pytest.skip.Exception:
            raise
        except BaseException as error:
            raise self.CollectError(f"{type(error).__name__}: {error}") from error


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    own = parent.config.getoption("--caffe2-own-tests")
    if own and module_path.resolve().is_relative_to(Path(own).resolve()):
        return _Caffe2TestModule.from_parent(parent, path=module_path)
    return None


_last_file: list[Path | None] = [None]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The first test of each file (module docstring) runs in workspace "default"."""
    if item.path == _last_file[0]:
        return
    _last_file[0] = item.path
    workspace = sys.modules.get(f"{__package__}.python.workspace")  # the state behind every view of the module
    if workspace is not None:
        workspace.SwitchWorkspace("default", True)
