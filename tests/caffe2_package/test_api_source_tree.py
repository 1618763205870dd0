"""Caffe2's own Python modules, found without being told: the order `install()`, `rnn2jax exec` and the pytest
plugin look for a Caffe2 source tree in, and `rnn2jax setup-caffe2 --source-only`, which puts one in place.

Nothing is downloaded here: the wheel is a small zip laid out as torch's is. Discovery changes the import system
and reads the environment, so it runs in subprocesses, each with its own $XDG_DATA_HOME.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from rnn2jax.caffe2 import source_tree
from rnn2jax.caffe2.source_tree import FROM_ENV, FROM_SETUP, FROM_VENV, GIVEN, extract_caffe2_sources
from rnn2jax.cli import main
from rnn2jax.errors import Rnn2JaxError

ROOT = Path(__file__).resolve().parents[2]
RNN2JAX = Path(sys.executable).with_name("rnn2jax")

# what a torch wheel holds, in small: Caffe2's Python files, and what must not land (compiled libraries, the
# serialized tests' pickled data, torch's own files, members whose paths leave the tree, a link)
WHEEL_PYTHON = {
    "caffe2/__init__.py": b"",
    "caffe2/python/__init__.py": b"",
    "caffe2/python/core.py": b"raise SystemExit('the tree core.py ran')\n",
    "caffe2/python/which.py": b"TREE = 'wheel'\n",
    "caffe2/python/serialized_test/__init__.py": b"",
    "caffe2/python/serialized_test/coverage.py": b"COVERAGE = 1\n",
}
WHEEL_OTHER = {
    "caffe2/python/caffe2_pybind11_state.cpython-39-darwin.so": b"\x7fELF...",
    "caffe2/python/serialized_test/data/operator_test/gru_test.test_gru_unit_op.zip": b"PK...",
    "caffe2/python/README.md": b"# not Python\n",
    "caffe2/python/core.pyc": b"compiled",
    "torch/__init__.py": b"import torch._C\n",
    "torch-1.10.2.dist-info/RECORD": b"",
    "caffe2/python/../../escaped.py": b"ESCAPED = True\n",
    "caffe2/python/./dotted.py": b"DOTTED = True\n",
}


def fake_wheel(path: Path, python: dict[str, bytes] = WHEEL_PYTHON, other: dict[str, bytes] = WHEEL_OTHER) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in {**python, **other}.items():
            archive.writestr(name, data)
        archive.writestr("caffe2/contrib/", b"")  # a directory member
        link = zipfile.ZipInfo("caffe2/python/linked.py")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, b"/etc/passwd")
    return path


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------------
# extraction


def test_extraction_puts_only_caffe2s_python_files_in_place(tmp_path):
    dest = tmp_path / "data" / "caffe2-source"
    package = extract_caffe2_sources(fake_wheel(tmp_path / "torch.whl"), dest)
    assert package == dest / "caffe2"
    assert files_under(dest) == WHEEL_PYTHON
    assert not (tmp_path / "escaped.py").exists() and not (tmp_path / "data" / "escaped.py").exists()
    assert os.listdir(tmp_path / "data") == ["caffe2-source"]  # no staging directory left beside it
    executable = [p for p in dest.rglob("*") if p.is_file() and p.stat().st_mode & 0o111]
    assert executable == []


def test_extraction_replaces_a_tree_whole_and_leaves_it_whole_when_it_fails(tmp_path, monkeypatch):
    dest = tmp_path / "caffe2-source"
    old = {"caffe2/python/__init__.py": b"", "caffe2/python/old.py": b"OLD = 1\n"}
    for name, data in old.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)

    # a wheel without Caffe2 is refused before anything is written
    with pytest.raises(Rnn2JaxError, match=r"no caffe2/python/core\.py: not a torch wheel with Caffe2"):
        extract_caffe2_sources(fake_wheel(tmp_path / "no-caffe2.whl", python={"caffe2/__init__.py": b""}), dest)
    assert files_under(dest) == old

    # a failure halfway through the copy leaves the old tree as it was, and no half-written one
    copied = []

    def copy_then_fail(source, out, *args):
        if len(copied) == 3:
            raise OSError("disk full")
        copied.append(out)
        out.write(source.read())

    monkeypatch.setattr(source_tree.shutil, "copyfileobj", copy_then_fail)
    with pytest.raises(OSError, match="disk full"):
        extract_caffe2_sources(fake_wheel(tmp_path / "torch.whl"), dest)
    assert files_under(dest) == old
    assert sorted(os.listdir(tmp_path)) == ["caffe2-source", "no-caffe2.whl", "torch.whl"]
    monkeypatch.undo()

    assert extract_caffe2_sources(tmp_path / "torch.whl", dest) == dest / "caffe2"
    assert files_under(dest) == WHEEL_PYTHON  # the old tree is gone, old.py with it
    assert sorted(os.listdir(tmp_path)) == ["caffe2-source", "no-caffe2.whl", "torch.whl"]


def test_an_unreadable_wheel_is_a_clear_error(tmp_path):
    bad = tmp_path / "torch.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(Rnn2JaxError, match="cannot read the wheel"):
        extract_caffe2_sources(bad, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


# --------------------------------------------------------------------------------------------------
# rnn2jax setup-caffe2 --source-only


def test_setup_caffe2_source_only_then_install_finds_it(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    wheel = fake_wheel(tmp_path / "torch-1.10.2-cp39-none-macosx_11_0_arm64.whl")
    assert main(["setup-caffe2", "--source-only", "--wheel", str(wheel)]) == 0
    out, err = capsys.readouterr()
    place = data / "rnn2jax" / "caffe2-source"
    assert out == f"{place / 'caffe2'}\n" and "without being told" in err
    assert files_under(place) == WHEEL_PYTHON

    done = run_python(
        """
        import rnn2jax.caffe2
        rnn2jax.caffe2.install()
        from caffe2.python import which, core
        import rnn2jax.caffe2.python.core as ours
        assert core is ours
        print(which.TREE, which.__file__)
        print(rnn2jax.caffe2.caffe2_source().origin)
        """,
        {"XDG_DATA_HOME": str(data)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"wheel {place / 'caffe2' / 'python' / 'which.py'}", FROM_SETUP]


def test_setup_caffe2_source_only_keeps_a_tree_already_there(tmp_path, monkeypatch, capsys):
    dest = tmp_path / "elsewhere"
    (dest / "caffe2" / "python").mkdir(parents=True)

    def no_download(directory):
        raise AssertionError("downloaded although the tree was there")

    monkeypatch.setattr(source_tree, "download_wheel", no_download)
    assert main(["setup-caffe2", "--source-only", "--dest", str(dest)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{dest / 'caffe2'}\n"
    assert f"--caffe2-source {dest / 'caffe2'}" in err and f"RNN2JAX_CAFFE2_SOURCE={dest / 'caffe2'}" in err


def test_setup_caffe2_source_only_flags_that_do_not_go_together(tmp_path, capsys):
    assert main(["setup-caffe2", "--source-only", "--venv", str(tmp_path)]) == 2
    assert "--python and --venv do not apply" in capsys.readouterr().err
    assert main(["setup-caffe2", "--dest", str(tmp_path)]) == 2
    assert "--dest and --wheel go with --source-only" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------------------------------
# the order trees are found in


def run_python(code: str, env: dict[str, str], *, argv: list[str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RNN2JAX_CAFFE2_SOURCE", "RNN2JAX_CAFFE2_PYTHON")}
    full.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", PIP_NO_INDEX="1", **env)
    command = argv or [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=full, cwd=ROOT)


def tree(package: Path, name: str) -> Path:
    """A caffe2 package directory whose `caffe2.python.which` says `name`."""
    (package / "python").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "python" / "__init__.py").write_text("")
    (package / "python" / "which.py").write_text(f"TREE = {name!r}\n")
    return package


def fake_venv(venv: Path, name: str) -> Path:
    """A venv as setup-caffe2 makes it, as far as finding its caffe2 package goes: bin/python and
    lib/python3.9/site-packages/caffe2."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    tree(venv / "lib" / "python3.9" / "site-packages" / "caffe2", name)
    return venv / "bin" / "python"


@pytest.fixture
def trees(tmp_path) -> dict[str, Path]:
    """One tree at each place the search looks: given, $RNN2JAX_CAFFE2_SOURCE, setup-caffe2 --source-only's
    default place (under data/), the venv of $RNN2JAX_CAFFE2_PYTHON, and the venv at setup-caffe2's default
    place (under venv-data/)."""
    return {
        "given": tree(tmp_path / "given" / "caffe2", "given"),
        "env": tree(tmp_path / "env" / "caffe2", "env"),
        "setup": tree(tmp_path / "data" / "rnn2jax" / "caffe2-source" / "caffe2", "setup"),
        "venv python": fake_venv(tmp_path / "venv", "venv"),
        "default venv": fake_venv(tmp_path / "venv-data" / "rnn2jax" / "caffe2-venv", "default venv"),
    }


FIND = """
import sys
import rnn2jax.caffe2
rnn2jax.caffe2.install(sys.argv[1] or None)
try:
    import caffe2.python.which as which
except ModuleNotFoundError as error:
    print("none", error.name)
else:
    found = rnn2jax.caffe2.caffe2_source()
    print(which.TREE, found.origin, found.path)
"""

# (which trees exist, given as argument?) -> the tree found and its origin
ORDER = [
    (("given", "env", "setup", "venv python", "default venv"), "given", GIVEN),
    (("env", "setup", "venv python", "default venv"), "env", FROM_ENV),
    (("setup", "venv python", "default venv"), "setup", FROM_SETUP),
    (("venv python", "default venv"), "venv", FROM_VENV),
    (("default venv",), "default venv", FROM_VENV),
    ((), None, None),
]


@pytest.mark.parametrize(("present", "expected", "origin"), ORDER, ids=[case[1] or "none" for case in ORDER])
def test_the_source_tree_is_found_in_order(present, expected, origin, trees, tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / ("data" if "setup" in present else "empty"))}
    if "env" in present:
        env["RNN2JAX_CAFFE2_SOURCE"] = str(trees["env"])
    if "venv python" in present:
        env["RNN2JAX_CAFFE2_PYTHON"] = str(trees["venv python"])
    if "default venv" in present and "setup" not in present:
        env["XDG_DATA_HOME"] = str(tmp_path / "venv-data")
    elif "default venv" in present:  # both default places under one $XDG_DATA_HOME
        shutil.copytree(tmp_path / "venv-data" / "rnn2jax", tmp_path / "data" / "rnn2jax", dirs_exist_ok=True)
    given = str(trees["given"]) if "given" in present else ""
    done = run_python("", env, argv=[sys.executable, "-c", FIND, given])
    assert done.returncode == 0, done.stderr
    if expected is None:
        assert done.stdout.strip() == "none caffe2.python.which"
        return
    places = {
        "given": trees["given"],
        "env": trees["env"],
        "setup": trees["setup"],
        "venv": trees["venv python"].parent.parent / "lib" / "python3.9" / "site-packages" / "caffe2",
        "default venv": tmp_path / "venv-data" / "rnn2jax" / "caffe2-venv" / "lib/python3.9/site-packages/caffe2",
    }
    assert done.stdout.strip() == f"{expected} {origin} {places[expected]}"


def test_the_search_waits_for_a_module_rnn2jax_lacks(trees, tmp_path):
    done = run_python(
        """
        import sys
        import rnn2jax.caffe2
        install = sys.modules["rnn2jax.caffe2.import_hook"]
        looked = []
        real = install.installed_source
        install.installed_source = lambda: looked.append(1) or real()
        rnn2jax.caffe2.install()
        from caffe2.python import core, workspace, brew
        from caffe2.proto import caffe2_pb2
        import rnn2jax.caffe2.python.rnn_cell
        print(len(looked))
        from caffe2.python import which
        import caffe2.python.which
        try:
            import caffe2.python.no_such_module
        except ModuleNotFoundError:
            pass
        print(len(looked), which.TREE)
        """,
        {"XDG_DATA_HOME": str(tmp_path / "data")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "setup"]


def test_a_tree_named_but_wrong_is_an_error_not_a_fallback(trees, tmp_path):
    missing, empty = tmp_path / "missing", tmp_path / "empty-dir"
    empty.mkdir()
    code = """
        import sys
        import rnn2jax.caffe2
        from rnn2jax.errors import Rnn2JaxError
        try:
            rnn2jax.caffe2.install(sys.argv[1] if len(sys.argv) > 1 else None)
        except Rnn2JaxError as error:
            print(error)
        print(rnn2jax.caffe2.installed())
        """
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}  # a good tree at setup-caffe2's place: not taken instead
    for argv, extra, what, path in [
        ([str(missing)], {}, "the Caffe2 source tree given", missing),
        ([str(empty)], {}, "the Caffe2 source tree given", empty),
        ([], {"RNN2JAX_CAFFE2_SOURCE": str(missing)}, "$RNN2JAX_CAFFE2_SOURCE", missing),
        ([], {"RNN2JAX_CAFFE2_SOURCE": str(empty)}, "$RNN2JAX_CAFFE2_SOURCE", empty),
    ]:
        done = run_python("", {**env, **extra}, argv=[sys.executable, "-c", textwrap.dedent(code), *argv])
        assert done.returncode == 0, done.stderr
        message, installed = done.stdout.strip().splitlines()
        assert message.startswith(f"{what} ({path.resolve()}) ")
        assert ("does not exist" if path == missing else "is not a caffe2 package directory") in message
        assert installed == "False"


def test_a_directory_holding_a_caffe2_package_names_it(trees, tmp_path):
    argv = [sys.executable, "-c", FIND, str(tmp_path / "given")]  # the directory above the caffe2 package
    done = run_python("", {"XDG_DATA_HOME": str(tmp_path / "empty")}, argv=argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"given {GIVEN} {trees['given'].resolve()}"


# --------------------------------------------------------------------------------------------------
# rnn2jax exec and the pytest plugin search the same way


def test_exec_finds_the_tree_and_caffe2_source_comes_first(trees, tmp_path):
    script = tmp_path / "script.py"
    script.write_text("from caffe2.python import which\nprint(which.TREE)\n")
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "RNN2JAX_CAFFE2_PYTHON": str(trees["venv python"])}
    done = run_python("", env, argv=[str(RNN2JAX), "exec", str(script)])
    assert (done.returncode, done.stdout) == (0, "setup\n"), done.stderr
    done = run_python("", {**env, "RNN2JAX_CAFFE2_SOURCE": str(trees["env"])}, argv=[str(RNN2JAX), "exec", str(script)])
    assert (done.returncode, done.stdout) == (0, "env\n"), done.stderr
    argv = [str(RNN2JAX), "exec", "--caffe2-source", str(trees["given"]), str(script)]
    done = run_python("", {**env, "RNN2JAX_CAFFE2_SOURCE": str(trees["env"])}, argv=argv)
    assert (done.returncode, done.stdout) == (0, "given\n"), done.stderr
    done = run_python("", env, argv=[str(RNN2JAX), "exec", "--caffe2-source", str(tmp_path / "nowhere"), str(script)])
    assert done.returncode == 2 and "rnn2jax: error: the Caffe2 source tree given" in done.stderr
    assert "does not exist" in done.stderr and done.stdout == ""


def test_the_pytest_plugin_finds_the_tree(trees, tmp_path):
    tests = tmp_path / "plugin_tests"
    tests.mkdir()
    (tests / "test_which.py").write_text(
        "from caffe2.python import which\n\ndef test_which():\n    assert which.TREE == 'setup', which.TREE\n"
    )
    (tests / "pytest.ini").write_text("[pytest]\n")
    plugin = "rnn2jax.caffe2.pytest_plugin"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", plugin, str(tests)]
    done = run_python("", {"XDG_DATA_HOME": str(tmp_path / "data")}, argv=argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
