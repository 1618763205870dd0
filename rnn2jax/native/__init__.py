"""Native CPU kernels under the pure lowering: Caffe2's LSTM recurrence as one XLA FFI call per layer.

Built by the package's own build (setup.py) from `src/` against oneDNN's PyPI wheel, loaded on first use,
registered for the CPU platform only; see library.py for when they run and how to turn them off.
"""

from .library import NativeStatus, available, disabled, recurrence_eligible, status

__all__ = ["NativeStatus", "available", "disabled", "recurrence_eligible", "status"]
