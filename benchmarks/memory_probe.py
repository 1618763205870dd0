"""Peak memory of ONE LSTM training step, in a fresh process: compare.py runs this once per form.

    python benchmarks/memory_probe.py {train_bsn|train_jaxgrad|hand_jax|torch} T,N,H [threads]

Everything is built first: nets, parameters and inputs (resident on the device), and for the JAX forms the
executable compiled ahead of time (`fn.lower(*args).compile()`), so no training step has run yet. Then the
resident set (VmRSS) is read, the kernel's peak counter is reset (`5` written to /proc/self/clear_refs), one
training step runs to completion, and VmHWM is read. `step_peak_bytes` = VmHWM - VmRSS before: the memory the
step needed beyond what was already resident (its temporaries and outputs), measured the same way for every
framework. Where clear_refs cannot be written the peak includes set-up (`hwm_reset: false` says so).
Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

FORM, SIZE = sys.argv[1], tuple(int(v) for v in sys.argv[2].split(","))
THREADS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as compare.py
os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={THREADS}")

import harness  # noqa: E402
import torch  # noqa: E402


def _status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def main() -> None:
    torch.set_num_threads(THREADS)
    case = harness.prepare("lstm", *SIZE)
    builders = {
        "train_bsn": harness.rnn2jax_backward_step_net,
        "train_jaxgrad": harness.rnn2jax_jax_grad,
        "hand_jax": harness.hand_training,
        "torch": harness.torch_training,
    }
    runner = builders[FORM](case)
    step = runner.run
    if runner.fn is not None:
        executable = runner.fn.lower(*runner.args).compile()
        import jax

        def step():
            jax.block_until_ready(executable(*runner.args))

    before = _status()
    reset = _reset_peak()
    step()
    after = _status()
    print(
        json.dumps(
            {
                "form": FORM,
                "size": list(SIZE),
                "rss_before_bytes": before["VmRSS"],
                "hwm_bytes": after["VmHWM"],
                "step_peak_bytes": after["VmHWM"] - before["VmRSS"],
                "hwm_reset": reset,
            }
        )
    )


if __name__ == "__main__":
    main()
