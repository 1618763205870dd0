"""Caffe2's own Python sources: where `install()` finds them, and how `rnn2jax setup-caffe2 --source-only` gets them.

rnn2jax implements most of `caffe2.python` itself; the rest (Caffe2's test utilities such as
`hypothesis_test_util`, `gradient_checker`, `serialized_test`) are plain Python files that run unchanged on top
of it, loaded from a Caffe2 source tree: a `caffe2` package directory. It is looked for in one order:

1. the tree given (`install(source=...)`, `rnn2jax exec --caffe2-source`, the pytest plugin's `--caffe2-source`);
2. `$RNN2JAX_CAFFE2_SOURCE`;
3. the tree `rnn2jax setup-caffe2 --source-only` extracted to its default place
   ($XDG_DATA_HOME/rnn2jax/caffe2-source/caffe2, else ~/.local/share/rnn2jax/caffe2-source/caffe2);
4. the `caffe2` package of the real-Caffe2 venv `rnn2jax setup-caffe2` made ($RNN2JAX_CAFFE2_PYTHON's venv, else
   the one at its default place).

A tree given (1, 2) that is not a caffe2 package is an error; the installed ones (3, 4) are used where they are.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import Rnn2JaxError

SOURCE_ENV = "RNN2JAX_CAFFE2_SOURCE"
# The wheel whose caffe2/ Python files are extracted. torch 1.10.2 is the last release with Caffe2; its macOS
# arm64 wheel (45 MB) carries the same caffe2/**/*.py, byte for byte, as the Linux x86_64 one (880 MB), and no
# file of it is run, so the small one serves on any platform, without Python 3.9.
WHEEL_REQUIREMENT = "torch==1.10.2"
WHEEL_PLATFORM = "macosx_11_0_arm64"
WHEEL_PYTHON = "3.9"

GIVEN = "given"
FROM_ENV = f"${SOURCE_ENV}"
FROM_SETUP = "rnn2jax setup-caffe2 --source-only"
FROM_VENV = "the real-Caffe2 venv"


@dataclass(frozen=True)
class Caffe2Source:
    """A Caffe2 source tree: its `caffe2` package directory, and where the search found it (one of GIVEN,
    FROM_ENV, FROM_SETUP, FROM_VENV), so a user can tell which tree a module came from."""

    path: Path
    origin: str

    def __str__(self) -> str:
        return f"{self.path} ({self.origin})"


def default_source_place() -> Path:
    """Where `rnn2jax setup-caffe2 --source-only` extracts Caffe2's sources unless told otherwise, and where
    `install()` looks for them: $XDG_DATA_HOME/rnn2jax/caffe2-source (~/.local/share/rnn2jax/caffe2-source).
    The `caffe2` package is the `caffe2/` inside it."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "rnn2jax" / "caffe2-source"


def _package_in(path: Path) -> Path | None:
    """`path` itself when it is a caffe2 package directory, its `caffe2/` when that is one, else None."""
    for candidate in (path, path / "caffe2"):
        if (candidate / "python").is_dir():
            return candidate
    return None


def _checked(path: str | os.PathLike[str], what: str) -> Path:
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise Rnn2JaxError(f"{what} ({resolved}) does not exist")
    package = _package_in(resolved)
    if package is None:
        raise Rnn2JaxError(
            f"{what} ({resolved}) is not a caffe2 package directory: it has no python/ (nor caffe2/python/); "
            "give the caffe2 directory of Caffe2's Python sources, as `rnn2jax setup-caffe2 --source-only` makes"
        )
    return package


def given_source(source: str | os.PathLike[str] | None = None) -> Caffe2Source | None:
    """The tree named by `source`, else by $RNN2JAX_CAFFE2_SOURCE, else None. Named but wrong is an error:
    a user who names a tree means that one, and a silent fallback would load another."""
    if source is not None:
        return Caffe2Source(_checked(source, "the Caffe2 source tree given"), GIVEN)
    if os.environ.get(SOURCE_ENV):
        return Caffe2Source(_checked(os.environ[SOURCE_ENV], FROM_ENV), FROM_ENV)
    return None


def installed_source() -> Caffe2Source | None:
    """The tree `rnn2jax setup-caffe2 --source-only` extracted at its default place, else the caffe2 package of
    the real-Caffe2 venv (`find_caffe2_python`), else None."""
    package = _package_in(default_source_place())
    if package is not None:
        return Caffe2Source(package, FROM_SETUP)
    from ..checking.oracle.session import find_caffe2_python

    python = find_caffe2_python()
    if python is None:
        return None
    venv = Path(python).parent.parent  # VENV/bin/python, not resolved: it links to the base interpreter
    found = sorted(venv.glob("lib/python3*/site-packages/caffe2/python/__init__.py"))
    return Caffe2Source(found[-1].parent.parent, FROM_VENV) if found else None


def find_source(source: str | os.PathLike[str] | None = None) -> Caffe2Source | None:
    """The Caffe2 source tree, in the order of this module's docstring, or None where there is none."""
    return given_source(source) or installed_source()


# --------------------------------------------------------------------------------------------------
# rnn2jax setup-caffe2 --source-only


def _is_python_source(info: zipfile.ZipInfo) -> bool:
    """A regular `caffe2/**/*.py` member with a plain relative path: nothing else of the wheel (compiled
    libraries, the serialized tests' pickled data) lands, and no member can write outside the tree."""
    name = info.filename
    parts = name.split("/")
    mode = info.external_attr >> 16
    return (
        parts[0] == "caffe2"
        and name.endswith(".py")
        and not info.is_dir()
        and "\\" not in name
        and all(part not in ("", ".", "..") for part in parts)
        and stat.S_IFMT(mode) in (0, stat.S_IFREG)  # no type recorded, or a regular file: not a link
    )


def extract_caffe2_sources(wheel: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Put the `caffe2/**/*.py` files of a torch wheel in `dest/caffe2` and return that package directory.

    Written into a temporary directory beside `dest`, then renamed into place, so `install()` never sees half
    a tree; an existing `dest` is replaced."""
    dest = Path(dest).expanduser().absolute()
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as error:
        raise Rnn2JaxError(f"cannot read the wheel {wheel}: {error}") from None
    with archive:
        members = [info for info in archive.infolist() if _is_python_source(info)]
        if not any(info.filename == "caffe2/python/core.py" for info in members):
            raise Rnn2JaxError(
                f"{wheel} has no caffe2/python/core.py: not a torch wheel with Caffe2 ({WHEEL_REQUIREMENT} is the last)"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        try:
            for info in members:
                target = staging.joinpath(*info.filename.split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
            staging.chmod(0o755)
            _replace(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return dest / "caffe2"


def _replace(new: Path, dest: Path) -> None:
    """Rename `new` to `dest`, moving an existing `dest` aside first and deleting it after."""
    if not dest.exists():
        new.rename(dest)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}-old-", dir=dest.parent))
    old.rmdir()
    dest.rename(old)
    new.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def download_wheel(directory: str | os.PathLike[str]) -> Path:
    """Download torch 1.10.2's macOS arm64 wheel with pip into `directory` and return its path (see
    WHEEL_PLATFORM for why that wheel, whatever this machine is)."""
    command = [
        sys.executable, "-m", "pip", "download", WHEEL_REQUIREMENT, "--no-deps", "--only-binary=:all:",
        "--python-version", WHEEL_PYTHON, "--platform", WHEEL_PLATFORM, "--disable-pip-version-check",
        "-d", str(directory),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise Rnn2JaxError(f"cannot run pip to download {WHEEL_REQUIREMENT}: {error}") from None
    wheels = sorted(Path(directory).glob("torch-*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip()[-800:]
        raise Rnn2JaxError(
            f"pip could not download {WHEEL_REQUIREMENT} ({WHEEL_PLATFORM}): {tail}; download it elsewhere and "
            "pass it with --wheel"
        )
    return wheels[-1]


def setup_source(dest: str | os.PathLike[str] | None = None, wheel: str | os.PathLike[str] | None = None) -> Path:
    """Caffe2's Python sources at `dest` (default: `default_source_place()`), from `wheel` or downloaded; returns
    the caffe2 package directory. A tree already at `dest` is replaced only when a wheel is given."""
    place = Path(dest).expanduser().absolute() if dest is not None else default_source_place()
    if wheel is None and (place / "caffe2" / "python").is_dir():
        return place / "caffe2"
    if wheel is not None:
        return extract_caffe2_sources(wheel, place)
    print(f"downloading {WHEEL_REQUIREMENT} ({WHEEL_PLATFORM}, about 45 MB) for its Caffe2 sources", file=sys.stderr)
    with tempfile.TemporaryDirectory() as directory:
        return extract_caffe2_sources(download_wheel(directory), place)
