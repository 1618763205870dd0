"""`rnn2jax.caffe2.install()` and `rnn2jax exec`: `import caffe2` on rnn2jax, for a process.

Both change the process' import system, so every test runs in a subprocess of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RNN2JAX = Path(sys.executable).with_name("rnn2jax")


def run_python(code: str, *, pythonpath: list[Path] = (), cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-c", textwrap.dedent(code)], pythonpath=pythonpath, cwd=cwd)


def run(argv: list[str], *, pythonpath: list[Path] = (), cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in pythonpath), str(ROOT)])
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd or ROOT)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def stub_caffe2(tmp_path) -> Path:
    """A directory with a `caffe2` package in it: what a real Caffe2 install looks like to the import system."""
    write(tmp_path / "stub" / "caffe2" / "__init__.py", "REAL = 'stub'\n")
    return tmp_path / "stub"


# --------------------------------------------------------------------------------------------------
# install / uninstall


def test_import_caffe2_resolves_to_rnn2jax_after_install():
    done = run_python(
        """
        import numpy as np
        import rnn2jax.caffe2
        assert not rnn2jax.caffe2.installed()
        rnn2jax.caffe2.install()
        assert rnn2jax.caffe2.installed()
        import caffe2
        from caffe2.python import core, workspace, rnn_cell, model_helper, brew, scope
        from caffe2.proto import caffe2_pb2
        import caffe2.python.recurrent as recurrent
        import rnn2jax.caffe2.python.core as our_core
        import rnn2jax.caffe2.python.workspace as our_workspace
        import rnn2jax.caffe2.python.rnn_cell as our_rnn_cell
        import rnn2jax.caffe2.python.model_helper as our_model_helper
        import rnn2jax.caffe2.python.brew as our_brew
        import rnn2jax.caffe2.python.scope as our_scope
        import rnn2jax.caffe2.python.recurrent as our_recurrent
        import rnn2jax.caffe2.proto.caffe2_pb2 as our_pb2
        assert caffe2 is rnn2jax.caffe2
        pairs = [(core, our_core), (workspace, our_workspace), (rnn_cell, our_rnn_cell),
                 (model_helper, our_model_helper), (brew, our_brew), (scope, our_scope),
                 (recurrent, our_recurrent), (caffe2_pb2, our_pb2)]
        assert all(a is b for a, b in pairs)
        import importlib, sys
        assert importlib.import_module("caffe2.python.workspace") is our_workspace
        assert sys.modules["caffe2.python.workspace"] is our_workspace
        assert workspace.__name__ == "rnn2jax.caffe2.python.workspace"
        # one module object, so one current workspace whichever name a script uses
        workspace.FeedBlob("x", np.array([1.0, -2.0], np.float32))
        workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["y"]))
        print(our_workspace.FetchBlob("y").tolist())
        rnn2jax.caffe2.install()  # a second install is a no-op
        assert sum(type(f).__name__ == "_Caffe2Finder" for f in sys.meta_path) == 1
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1.0, 0.0]"


def test_missing_caffe2_modules_are_import_errors():
    done = run_python(
        """
        import rnn2jax.caffe2
        rnn2jax.caffe2.install()
        try:
            import caffe2.python.no_such_module
        except ModuleNotFoundError as error:
            print("missing", error.name)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "missing caffe2.python.no_such_module"


def test_install_refuses_when_a_real_caffe2_is_importable(stub_caffe2):
    done = run_python(
        """
        import sys
        import rnn2jax.caffe2
        from rnn2jax.errors import Rnn2JaxError
        try:
            rnn2jax.caffe2.install()
        except Rnn2JaxError as error:
            print(error)
        assert not rnn2jax.caffe2.installed()
        import caffe2
        print(caffe2.REAL)
        """,
        pythonpath=[stub_caffe2],
    )
    assert done.returncode == 0, done.stderr
    message, real = done.stdout.strip().splitlines()
    assert "a real Caffe2 is importable" in message and str(stub_caffe2 / "caffe2" / "__init__.py") in message
    assert "will not shadow it" in message
    assert real == "stub"  # untouched


def test_install_refuses_when_a_real_caffe2_is_already_imported(stub_caffe2):
    done = run_python(
        """
        import caffe2
        import rnn2jax.caffe2
        from rnn2jax.errors import Rnn2JaxError
        try:
            rnn2jax.caffe2.install()
        except Rnn2JaxError as error:
            print(error)
        """,
        pythonpath=[stub_caffe2],
    )
    assert done.returncode == 0, done.stderr
    assert "already imported" in done.stdout and "will not shadow it" in done.stdout


def test_uninstall_forgets_the_caffe2_names():
    done = run_python(
        """
        import sys
        import rnn2jax.caffe2
        rnn2jax.caffe2.install()
        from caffe2.python import workspace
        rnn2jax.caffe2.uninstall()
        assert not rnn2jax.caffe2.installed()
        assert not [n for n in sys.modules if n == "caffe2" or n.startswith("caffe2.")]
        try:
            import caffe2
        except ModuleNotFoundError:
            print("gone")
        import rnn2jax.caffe2.python.workspace as ours
        assert ours is workspace  # rnn2jax's own modules stay
        rnn2jax.caffe2.uninstall()  # a second uninstall is a no-op
        rnn2jax.caffe2.install()
        from caffe2.python import workspace as again
        assert again is ours
        print("again")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gone", "again"]


def test_install_with_a_source_tree_loads_modules_rnn2jax_lacks_from_it(tmp_path):
    source = tmp_path / "src" / "caffe2"
    write(source / "__init__.py", "")
    write(source / "python" / "__init__.py", "")
    write(
        source / "python" / "extra_util.py",
        """
        from caffe2.python import core, workspace  # resolved to rnn2jax, not to this tree
        ORIGIN = __file__
        def relu_of(x):
            workspace.FeedBlob("in", x)
            workspace.RunOperatorOnce(core.CreateOperator("Relu", ["in"], ["out"]))
            return workspace.FetchBlob("out")
        """,
    )
    write(source / "python" / "core.py", "raise SystemExit('the source tree core.py must not be loaded')\n")
    done = run_python(
        f"""
        import numpy as np
        import rnn2jax.caffe2
        rnn2jax.caffe2.install(source={str(source)!r})
        from caffe2.python import extra_util, core
        import rnn2jax.caffe2.python.core as ours
        assert core is ours and extra_util.core is ours
        print(extra_util.ORIGIN)
        print(extra_util.relu_of(np.array([-1.0, 3.0], np.float32)).tolist())
        """
    )
    assert done.returncode == 0, done.stderr
    origin, values = done.stdout.strip().splitlines()
    assert Path(origin) == source / "python" / "extra_util.py"
    assert values == "[0.0, 3.0]"


def test_install_with_a_source_that_is_not_a_caffe2_package_is_refused(tmp_path):
    done = run_python(
        f"""
        import rnn2jax.caffe2
        from rnn2jax.errors import Rnn2JaxError
        try:
            rnn2jax.caffe2.install(source={str(tmp_path)!r})
        except Rnn2JaxError as error:
            print(error)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "not a caffe2 package directory" in done.stdout and str(tmp_path) in done.stdout


# --------------------------------------------------------------------------------------------------
# rnn2jax exec

SCRIPT = """
import sys
import numpy as np
from caffe2.python import core, workspace
import helper_module  # next to the script, as with `python script.py`

print("name", __name__)
print("argv", sys.argv[1:])
print("script", sys.argv[0].endswith("script.py"))
workspace.FeedBlob("x", np.array([-1.0, 2.0], np.float32))
workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["y"]))
print("y", workspace.FetchBlob("y").tolist(), helper_module.VALUE)
if "--fail" in sys.argv:
    sys.exit(int(sys.argv[sys.argv.index("--fail") + 1]))
if "--message" in sys.argv:
    sys.exit("stopped with a message")
if "--raise" in sys.argv:
    raise ValueError("the script failed")
"""


@pytest.fixture
def script(tmp_path) -> Path:
    write(tmp_path / "helper_module.py", "VALUE = 42\n")
    return write(tmp_path / "script.py", SCRIPT)


def test_exec_runs_the_script_as_main_with_its_arguments(script):
    done = run([str(RNN2JAX), "exec", str(script), "--flag", "value", "-x"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["name __main__", "argv ['--flag', 'value', '-x']", "script True", "y [0.0, 2.0] 42"]


def test_exec_returns_the_scripts_exit_status(script):
    done = run([str(RNN2JAX), "exec", str(script), "--fail", "3"])
    assert done.returncode == 3, done.stderr
    assert "y [0.0, 2.0] 42" in done.stdout
    done = run([str(RNN2JAX), "exec", str(script), "--fail", "0"])
    assert done.returncode == 0, done.stderr
    done = run([str(RNN2JAX), "exec", str(script), "--message"])
    assert done.returncode == 1 and "stopped with a message" in done.stderr


def test_exec_of_a_failing_script_shows_its_traceback(script):
    done = run([str(RNN2JAX), "exec", str(script), "--raise"])
    assert done.returncode == 1
    assert "ValueError: the script failed" in done.stderr and str(script) in done.stderr


def test_python_dash_m_rnn2jax_exec_works(script):
    done = run([sys.executable, "-m", "rnn2jax", "exec", str(script), "a b"])
    assert done.returncode == 0, done.stderr
    assert "argv ['a b']" in done.stdout and "y [0.0, 2.0] 42" in done.stdout


def test_exec_max_runs_stops_a_script_that_runs_forever(tmp_path):
    forever = write(
        tmp_path / "forever.py",
        """
        import numpy as np
        from caffe2.python import core, workspace
        net = core.Net("train")
        net.Add(["acc", "one"], "acc")
        other = core.Net("other")
        other.Scale("acc", "scaled", scale=2.0)
        workspace.FeedBlob("acc", np.zeros(1, np.float32))
        workspace.FeedBlob("one", np.ones(1, np.float32))
        workspace.CreateNet(net)
        workspace.CreateNet(other)
        runs = 0
        while True:
            try:
                workspace.RunNet(net.Name())
                workspace.RunNet(other.Name(), 3)  # not limited
            except Exception:  # a script's own handler must not swallow the stop
                print("swallowed")
                raise
            runs += 1
            print("acc", workspace.FetchBlob("acc").tolist(), flush=True)
        """,
    )
    done = run([str(RNN2JAX), "exec", "--max-runs", "train=4", str(forever)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"acc [{float(i)}]" for i in range(1, 5)]
    assert "net 'train' ran 4 times" in done.stderr and "swallowed" not in done.stdout


def test_exec_of_a_missing_script_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere.py"
    done = run([str(RNN2JAX), "exec", str(missing)])
    assert done.returncode == 2
    assert done.stderr.strip() == f"rnn2jax: error: exec: no such script: {missing}"


def test_exec_refuses_when_a_real_caffe2_is_importable(script, stub_caffe2):
    done = run([sys.executable, "-m", "rnn2jax", "exec", str(script)], pythonpath=[stub_caffe2])
    assert done.returncode == 2
    assert "rnn2jax: error: a real Caffe2 is importable" in done.stderr
    assert "name __main__" not in done.stdout  # the script did not start


def test_exec_bad_max_runs_is_a_usage_error(script):
    done = run([str(RNN2JAX), "exec", "--max-runs", "train", str(script)])
    assert done.returncode == 2 and "expected NET=N" in done.stderr
    done = run([str(RNN2JAX), "exec", "--max-runs", "train=0", str(script)])
    assert done.returncode == 2 and "expected a positive integer" in done.stderr


def test_the_pytest_plugin_starts_each_file_in_the_default_workspace(tmp_path):
    """A test file that leaves another workspace current (Caffe2's ideep/fc_op_test stays in `_device_check_`)
    does not change where the next file starts: in "default", as in a process of its own."""
    write(
        tmp_path / "test_a_leaves.py",
        """
        import numpy as np
        from caffe2.python import workspace

        def test_leaves_another_workspace_current():
            workspace.SwitchWorkspace("_device_check_", True)
            workspace.FeedBlob("x", np.ones(2, np.float32))
            assert workspace.CurrentWorkspace() == "_device_check_"
        """,
    )
    write(
        tmp_path / "test_b_starts.py",
        """
        from caffe2.python import workspace

        def test_starts_in_default():
            assert workspace.CurrentWorkspace() == "default"
            assert not workspace.HasBlob("x")
        """,
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rnn2jax.caffe2.pytest_plugin"]
    done = run([*argv, str(tmp_path)], cwd=tmp_path)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_pytest_plugin_restores_the_unittest_aliases_python_3_12_removed(monkeypatch):
    """Caffe2's test files call `assertEquals` and the like, which Python 3.12 removed from unittest."""
    import unittest

    from rnn2jax.caffe2 import pytest_plugin

    for alias in ("assertEquals", "assertAlmostEquals", "assertRaisesRegexp"):
        monkeypatch.delattr(unittest.TestCase, alias, raising=False)
    assert not hasattr(unittest.TestCase, "assertEquals")
    pytest_plugin._restore_unittest_aliases()
    assert unittest.TestCase.assertEquals is unittest.TestCase.assertEqual
    assert unittest.TestCase.assertAlmostEquals is unittest.TestCase.assertAlmostEqual
    assert unittest.TestCase.assertRaisesRegexp is unittest.TestCase.assertRaisesRegex
