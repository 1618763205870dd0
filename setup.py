"""Builds rnn2jax's native CPU kernels (rnn2jax/native/src) when rnn2jax is installed.

Everything else about the package is in pyproject.toml. The kernels are compiled for Linux on x86-64 with
the machine's C++ compiler, against oneDNN from PyPI (the onednn-devel-cpu-gomp wheel, a build requirement);
the XLA FFI headers are vendored (rnn2jax/native/third_party). The extension is optional: where it cannot be
built, the install still succeeds and rnn2jax runs its pure lowering, saying why (`rnn2jax --version`).
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
NATIVE = Path("rnn2jax") / "native"


def onednn_paths() -> tuple[str, str] | None:
    """(include dir, lib dir) of the oneDNN wheels in the build environment, or None without them."""
    try:
        headers = importlib.metadata.files("onednn-devel-cpu-gomp") or []
        library = importlib.metadata.files("onednn-cpu-gomp") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    hpp = next((f for f in headers if f.name == "dnnl.h" and f.parent.name == "dnnl"), None)
    so = next((f for f in library if f.name == "libdnnl.so.3"), None)
    if hpp is None or so is None:
        return None
    include = Path(hpp.locate()).resolve().parents[2]  # <prefix>/include/oneapi/dnnl/dnnl.h
    return str(include), str(Path(so.locate()).resolve().parent)


def not_built(why: object) -> None:
    print(f"rnn2jax: native CPU kernels not built ({why}); rnn2jax will run its pure lowering", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """A kernel that cannot be built is reported, not fatal: rnn2jax then runs the pure lowering."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # a missing compiler surfaces here, before any extension is tried
            not_built(error)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:
            not_built(error)


def extensions() -> list[Extension]:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return []
    paths = onednn_paths()
    if paths is None:
        not_built("onednn-devel-cpu-gomp is not installed")
        return []
    include, lib = paths
    return [
        Extension(
            "rnn2jax.native._kernels",
            sources=[str(NATIVE / "src" / name) for name in ("lstm.cc", "gru.cc", "gemm.cc")],
            include_dirs=[include],
            # -isystem: the vendored XLA headers' own warnings are not ours
            extra_compile_args=[
                "-std=c++20",
                "-O3",
                "-march=x86-64-v3",  # AVX2 + FMA, checked at load; oneDNN dispatches its own ISA at run time
                "-fno-trapping-math",  # lets GCC vectorise the clamped exp in the gate loops
                "-fopenmp",
                "-fvisibility=hidden",
                "-Wall",
                "-isystem",
                str(NATIVE / "third_party"),
            ],
            # No rpath: rnn2jax/native/library.py loads libdnnl.so.3 from the onednn-cpu-gomp wheel first.
            library_dirs=[lib],
            libraries=[":libdnnl.so.3"],
            extra_link_args=["-fopenmp"],
            depends=[str(p) for p in (NATIVE / "src").glob("*.h")],
            optional=True,
        )
    ]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
