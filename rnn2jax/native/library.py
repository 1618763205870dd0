"""rnn2jax's native CPU kernels: finding the library the package's build made, loading it, registering
its handlers with XLA, and saying whether they are in use and why not.

The kernels are an optimisation, never a requirement: the lowering asks `available()` while tracing, and
where the answer is no it runs the pure `lax.scan` lowering (which is also what GPUs and TPUs run, and the
reference the kernels are tested against). Where a kernel was expected (Linux x86-64) but cannot be used,
rnn2jax says why once, as a warning; `rnn2jax --version` always says.

Each handler is registered under a name that carries a digest of the library file: JAX's persistent
compilation cache keys an executable on its program, which names the handler, not on the code behind the
name, so a rebuilt kernel must not reuse an executable compiled against the old one.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import hashlib
import importlib.machinery
import importlib.metadata
import os
import platform
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np

ENV = "RNN2JAX_NATIVE"  # "0": never use the native kernels (the pure lowering everywhere)
LIBRARY_STEM = "_kernels"  # rnn2jax/native/_kernels<EXT_SUFFIX>, built by setup.py
ONEDNN_DISTRIBUTION = "onednn-cpu-gomp"
HANDLERS = (
    "rnn2jax_lstm_forward",
    "rnn2jax_lstm_forward_gates",
    "rnn2jax_lstm_forward_train",
    "rnn2jax_lstm_backward",
    "rnn2jax_gemm",
    "rnn2jax_gru_forward",
    "rnn2jax_gru_forward_fc",
    "rnn2jax_gru_forward_train",
    "rnn2jax_gru_backward",
)


@dataclass(frozen=True)
class NativeStatus:
    """Whether the native kernels run on CPU in this process, the library, and the reason when not."""

    in_use: bool
    reason: str  # why not, or "" when in use
    library: Path | None = None
    targets: dict[str, str] = field(default_factory=dict)  # handler symbol -> registered XLA FFI target

    def describe(self) -> str:
        if self.in_use:
            return f"native CPU kernels: in use ({self.library})"
        return f"native CPU kernels: not in use ({self.reason})"


_lock = threading.Lock()
_status: NativeStatus | None = None
_warned = False
_disabled: contextvars.ContextVar[bool] = contextvars.ContextVar("rnn2jax_native_disabled", default=False)


def status() -> NativeStatus:
    """Load and register the kernels on the first call; the same answer after that."""
    global _status
    with _lock:
        if _status is None:
            _status = _load()
        return _status


def available() -> bool:
    """Whether a lowering traced now may put the native kernels under its CPU branch: loaded, not turned
    off by RNN2JAX_NATIVE=0 nor by `disabled()` (what `rnn2jax export` uses: a serialized model must not
    name a handler of this library)."""
    if _disabled.get():
        return False
    found = status()
    if not found.in_use:
        _warn_once(found)
    return found.in_use


# A recurrence runs natively only where a step has this many multiply-adds (N·G·H summed over layers,
# G the gate width): below it XLA's scan is as fast (measured, jax.grad of one LSTM layer: 45 against 65 us
# at N, H = 2, 3 (72); 225 against 255 us at 8, 32 (32768); 1650 against 1451 us at 16, 64).
MIN_STEP_MACS = 1 << 16


def recurrence_eligible(step_macs: int, dtype: object) -> bool:
    """Whether a recognised LSTM stack or GRU with this much work per step runs on the native kernels (never
    with a symbolic dim: jax.export's shape polymorphism, which serializes the pure lowering anyway)."""
    if not isinstance(step_macs, int):
        return False
    return step_macs >= MIN_STEP_MACS and dtype == np.float32 and available()


def target(handler: str) -> str:
    """The XLA FFI target name `handler` is registered under (call only when `available()`)."""
    return status().targets[handler]


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Trace with the pure lowering only, in this thread (and the tasks it starts)."""
    token = _disabled.set(True)
    try:
        yield
    finally:
        _disabled.reset(token)


def expected() -> bool:
    """Whether the package builds the kernels for this machine (Linux on x86-64)."""
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def _warn_once(found: NativeStatus) -> None:
    global _warned
    if _warned or not expected() or os.environ.get(ENV, "1") == "0":
        return
    _warned = True
    warnings.warn(f"rnn2jax runs the pure lax.scan lowering on CPU: {found.reason}", RuntimeWarning, stacklevel=3)


def _load() -> NativeStatus:
    if os.environ.get(ENV, "1") == "0":
        return NativeStatus(False, f"turned off by {ENV}=0")
    if not expected():
        return NativeStatus(False, f"no native kernels are built for {sys.platform} on {platform.machine()}")
    library = _library_file()
    if library is None:
        return NativeStatus(
            False,
            "the package's build did not make them (it needs g++ and the onednn-devel-cpu-gomp wheel; "
            "reinstall rnn2jax and read the build's output)",
        )
    missing = _missing_cpu_features()
    if missing:
        return NativeStatus(False, f"this CPU lacks {', '.join(missing)}, which the kernels are compiled for", library)
    try:
        _preload_onednn()
        handle = ctypes.CDLL(str(library))
    except (OSError, StopIteration, importlib.metadata.PackageNotFoundError) as error:
        return NativeStatus(False, f"cannot load {library.name} or oneDNN ({error})", library)
    digest = hashlib.sha256(library.read_bytes()).hexdigest()[:12]
    targets = {}
    try:
        for handler in HANDLERS:
            name = f"{handler}_{digest}"
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(handle, handler)), "cpu")
            targets[handler] = name
    except (AttributeError, ValueError, RuntimeError) as error:
        return NativeStatus(False, f"{library.name} does not provide its handlers ({error})", library)
    found = NativeStatus(True, "", library, targets)
    problem = _smoke_test(found)
    if problem:
        return NativeStatus(False, problem, library)
    return found


def _library_file() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"{LIBRARY_STEM}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def _missing_cpu_features() -> list[str]:
    """The kernels' own loops are compiled for x86-64-v3 (AVX2, FMA); oneDNN picks its ISA at run time."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [name.upper() for name in ("avx2", "fma", "bmi2") if name not in flags]


def _preload_onednn() -> None:
    """libdnnl.so.3 lives in the onednn-cpu-gomp wheel's <prefix>/lib, which is on no search path: load it
    first, so that the kernels' NEEDED entry resolves by its soname. Spinning OpenMP workers would take the
    cores XLA runs on after each call, so they wait passively unless the user chose otherwise."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    files = importlib.metadata.files(ONEDNN_DISTRIBUTION) or []
    dnnl = next(f for f in files if f.name == "libdnnl.so.3")
    ctypes.CDLL(str(Path(dnnl.locate()).resolve()), mode=ctypes.RTLD_GLOBAL)


def _smoke_test(found: NativeStatus) -> str:
    """One step of a 1-unit LSTM through the forward kernel, against NumPy: catches a library built for
    another XLA FFI version before any user's net depends on it. Returns the problem, or ""."""
    x = np.array([[[0.5, -0.25, 1.0, 0.75]]], np.float32)
    h0, c0 = np.array([[0.1]], np.float32), np.array([[-0.2]], np.float32)
    w = np.array([[0.3], [-0.6], [0.9], [0.2]], np.float32)
    row = jax.ShapeDtypeStruct((1, 1, 1), np.float32)
    call = jax.ffi.ffi_call(found.targets["rnn2jax_lstm_forward"], (row, row))
    b = np.array([0.25, 0.0, -0.5, 0.125], np.float32)
    try:
        with jax.ensure_compile_time_eval():
            h, c = jax.jit(lambda *a: call(*a, forget_bias=np.float32(1.0), drop_states=np.int32(0)))(
                x, h0, c0, w, b, np.array([1], np.int32)
            )
        h, c = np.asarray(h), np.asarray(c)
    except Exception as error:  # any failure of the call means: do not use the kernels
        return f"the kernels fail a one-step test ({type(error).__name__}: {str(error).splitlines()[0]})"
    pre = x[0, 0] + (h0 @ w.T)[0] + b + np.array([0, 1, 0, 0], np.float32)
    sig = 1 / (1 + np.exp(-pre))
    expect_c = sig[1] * c0[0, 0] + sig[0] * np.tanh(pre[3])
    expect_h = sig[2] * np.tanh(expect_c)
    if not (np.allclose(c, expect_c, rtol=1e-5, atol=1e-6) and np.allclose(h, expect_h, rtol=1e-5, atol=1e-6)):
        return f"the kernels give a wrong one-step answer (h {h.ravel()}, expected {expect_h})"
    return ""
