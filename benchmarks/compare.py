"""rnn2jax's compiled Caffe2 RNN nets against PyTorch, hand-written JAX and real Caffe2, checked equal, then timed.

    python benchmarks/compare.py [--sizes 50,32,256 ...] [--models lstm gru lstm2 attention]
        [--modes forward train_bsn train_jaxgrad] [--repeats 7] [--quick] [--no-caffe2] [--out FILE]
        [--threads 2] [--cpu-time]

What is compared, per model (benchmarks/models.py) and size T,N,H (input size D = H):

- rnn2jax: the NetDef Caffe2's front end builds (`rnn_cell.LSTM`, `gru_cell.GRU`, a 2-layer `rnn_cell.LSTM`
  (MultiRNNCell), `rnn_cell.LSTMWithAttention`), compiled by `rnn2jax.compile` and run as `jax.jit(apply)`.
  Modes: `forward` (the forward-only net, as served); `train_bsn` (the training net: forward, the loss
  `SumElements(Mul(output, cotangent))` and `get_backward_pass`'s ops, i.e. RecurrentNetworkGradient running
  the backward step net, compiled with the parameter and input gradients as outputs); `train_jaxgrad`
  (`jax.grad` of the compiled training model's forward net, to the parameters and inputs).
- torch: `torch.nn.LSTM` / `nn.GRU` with the same weights (gate blocks permuted), `no_grad` for forward, and
  for training autograd to the weights and the input with the same upstream gradient (`out.backward(cotangent)`:
  the same fixed random cotangent every framework uses). On the CPU, or with `--torch-device cuda` (the default
  when JAX runs on a GPU) on the GPU, where PyTorch runs cuDNN's RNN kernels.
- hand JAX: the best hand-written JAX for the same maths (hoisted input projection, folded biases,
  pre-transposed weights, `lax.scan` over the projected inputs), and `jax.grad` of it for training.
- caffe2: real Caffe2 (torch 1.10.2's build, the .venv-caffe2 interpreter) running the *same* NetDefs (the
  forward-only net; the training net for both training modes, as that is how Caffe2 trains), in a subprocess
  (benchmarks/caffe2_runner.py) that times `RunNet` with its own interleaving.

Where the maths differ (models.py explains): Caffe2's default GRU applies the reset gate before the matmul,
r*h @ W, and PyTorch's after, r*(h @ W + b); they are different functions. Model `gru` is therefore built with
Caffe2's `linear_before_reset=True` (its cuDNN variant), which is exactly PyTorch's maths; model
`gru_reset_first` (Caffe2's default, not in the default set) has no PyTorch column. PyTorch has no LSTM with
attention, so `attention` has no PyTorch column either. The Caffe2 nets mask by `seq_lengths` (full length
here); the hand-written JAX masks too, PyTorch does not need to.

Truthfulness rules:
- Before any timing, every form's outputs (forward) or gradients (training: every parameter with a gradient
  and the inputs `x`, and `enc` for attention) are checked against the hand-written JAX's, float32:
  |a - b| <= atol * max(1, max|b|) + rtol * |b| with rtol = 1e-4, atol = 1e-5 (the scale keeps the check
  meaningful for gradients summed over long sequences). A mismatch raises; it never becomes a row. The worst
  normalised error per form is written to the JSON (1.0 = at the tolerance).
- In-process forms are timed interleaved: each round runs every form once (starting position rotated), for
  `--repeats` rounds (at least 3, then until `--max-seconds` per case). Reported times are medians; ratios are
  medians of per-round ratios. Real Caffe2 runs in another process, so its ratio is the ratio of medians.
- Float32 matmuls in every form (`jax_default_matmul_precision=float32`, PyTorch's TF32 off): Caffe2 computes
  in float32, and on GPUs both frameworks would otherwise use TF32, whose outputs the check refuses.
- Threads: XLA (`intra_op_parallelism_threads`), rnn2jax's native kernels (`OMP_NUM_THREADS`), PyTorch
  (`torch.set_num_threads`) and Caffe2 (OMP/MKL and torch threads) all get `--threads` (2). Timed code runs
  on `jax.devices()[0]` whatever it is.
- OMP_WAIT_POLICY=PASSIVE (unless set, or `--omp-wait-policy`): PyTorch's OpenMP threads otherwise spin at
  every barrier, and on a shared machine a descheduled spinner stalls each parallel region; measured here at a
  load average of 13 on 2 cores, `nn.LSTM` at T,N,H = 5,3,8 took 150-300 ms per call spinning and 0.5 ms
  passive (50,32,256: 0.1-4 s vs 25-50 ms). It keeps the comparison from measuring the scheduler, but on a
  quiet machine passive waiting costs PyTorch's two-thread runs of small steps a lot (nn.LSTM forward at
  200,16,128: 34 ms passive, 7.8 ms spinning, 14 ms on one thread; at 100,64,512 it costs 10%): the
  two-thread ratios of small sizes are then against a slowed PyTorch, and the one-thread CPU-time pass
  (`--threads 1 --cpu-time`, where no thread waits) is the fair comparison there. The 1-minute load average
  is recorded per row.

The GEMM limit: at the start the machine's float32 GEMM rate with `--threads` is measured (the best of XLA's
and PyTorch's n = 1024 square matmul); each row of a model whose matmuls are counted (`matmul_flops`: the
input and recurrent projections, and for training their two gradient GEMMs) gets `gemm_fraction`, the rate
its matmuls reach in rnn2jax's time as a fraction of that peak: how near the row is to what GEMMs allow.

`--cpu-time` times every run (and the peak) as this process's CPU time instead of the wall clock; with
`--threads 1` that is the single-thread comparison other processes on a loaded machine do not change.
`make bench` runs it for the LSTM and the GRU beside the two-thread wall-clock run
(benchmarks/results/single_thread.json), and scripts/bench_table.py shows both.

Peak training memory (LSTM at `--memory-size`, 100,64,512): two measures, printed side by side.
1. XLA's accounting of each compiled training executable (`jit(f).lower(...).compile().memory_analysis()`):
   temp + argument + output bytes (minus aliased). PyTorch has no equivalent.
2. A high-water mark in a fresh subprocess per form (benchmarks/memory_probe.py): build everything and compile
   (XLA compiles ahead of time, so no training step has run), record VmRSS, reset the kernel's peak-RSS counter
   (`echo 5 > /proc/self/clear_refs`), run ONE training step, read VmHWM. The peak increase over the resident
   baseline (parameters and inputs already resident) is what the step itself needed, measured the same way
   for rnn2jax and PyTorch (PyTorch's first step includes its own first-call allocations, as jax's does).

Results: a table on stdout, and JSON at `--out` (benchmarks/results/latest.json): machine (platform,
os.cpu_count, jax.devices()), jax and torch versions, date, command, tolerances, and per row the medians,
ratios, repeats and check errors. `scripts/bench_table.py` renders it as Markdown.
"""

from __future__ import annotations

import argparse
import os
import sys


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["50,32,256", "100,64,512", "200,16,128", "20,128,1024"])
    parser.add_argument("--models", nargs="+", default=["lstm", "gru", "lstm2", "attention"])
    parser.add_argument("--modes", nargs="+", default=["forward", "train_bsn", "train_jaxgrad"])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds per case")
    parser.add_argument("--max-seconds", type=float, default=10.0, help="stop a case's rounds after this (>= 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 rounds, 2 s per case")
    parser.add_argument("--no-caffe2", action="store_true", help="skip real Caffe2")
    parser.add_argument("--caffe2-python", default=None, help="the real-Caffe2 interpreter")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--memory-size", default="100,64,512")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for XLA, PyTorch and Caffe2")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time each run as this process's CPU time (time.process_time) rather than wall clock: what other "
        "processes on a loaded machine do not change; meant with --threads 1",
    )
    parser.add_argument(
        "--omp-wait-policy",
        default="PASSIVE",
        help="OMP_WAIT_POLICY for PyTorch and Caffe2 (default PASSIVE; see the docstring), '' to leave it unset",
    )
    parser.add_argument(
        "--torch-device",
        default=None,
        help="where PyTorch runs: cpu, or cuda (the default when JAX's default device is a GPU and PyTorch sees one)",
    )
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/latest.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.max_seconds = 3, 2.0
    return args


ARGS = _parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    if ARGS.omp_wait_policy:
        os.environ.setdefault("OMP_WAIT_POLICY", ARGS.omp_wait_policy)
    os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={ARGS.threads}")
    # OpenMP's limit, which rnn2jax's native kernels (and PyTorch's OpenMP) keep to: --threads 1 is one thread
    os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))

import datetime  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import harness  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RTOL, ATOL = 1e-4, 1e-5
MODES = ("forward", "train_bsn", "train_jaxgrad")
CAFFE2_INFO: dict = {}  # the real-Caffe2 interpreter and its versions, as its runs report them


class BenchmarkMismatch(AssertionError):
    """Two forms of the same model disagree: the benchmark refuses to time them."""


def check_close(what: str, got, want) -> float:
    """The worst |got - want| / (atol * max(1, max|want|) + rtol * |want|); raises when above 1."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise BenchmarkMismatch(f"{what}: shape {got.shape} != reference {want.shape}")
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    bound = ATOL * scale + RTOL * np.abs(want)
    err = float(np.max(np.abs(got - want) / bound, initial=0.0))
    if not np.isfinite(err) or err > 1.0:
        worst = np.unravel_index(int(np.argmax(np.abs(got - want) / bound)), got.shape)
        raise BenchmarkMismatch(
            f"{what}: differs from the hand-written JAX reference beyond rtol={RTOL}, atol={ATOL}*{scale:.3g} "
            f"(worst at {worst}: {got[worst]} vs {want[worst]}, {err:.2f}x the tolerance)"
        )
    return err


def check_result(what: str, got, want) -> float:
    if isinstance(want, dict):
        return max(check_close(f"{what}, gradient of {name}", got[name], want[name]) for name in want)
    return check_close(f"{what}, output", got, want)


def interleaved(runners: dict[str, harness.Runner], repeats: int, max_seconds: float) -> dict[str, list[float]]:
    """Rounds of one run per form, the starting form rotated each round; at least 3 rounds. Each run is timed
    by the wall clock, or with --cpu-time by this process's CPU time."""
    clock = time.process_time if ARGS.cpu_time else time.perf_counter
    names = list(runners)
    for name in names:
        runners[name].run()  # warm: compiled already, first-call costs out of the way
    times: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    rounds = 0
    while rounds < repeats and (rounds < 3 or time.perf_counter() - start < max_seconds):
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            begin = clock()
            runners[name].run()
            times[name].append(clock() - begin)
        rounds += 1
    return times


def _median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def _ratio(times: dict[str, list[float]], a: str, b: str) -> float | None:
    if a not in times or b not in times:
        return None
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


# ------------------------------------------------------------------------------------------------
# The GEMM limit

GATES = {"lstm": 4, "lstm2": 4, "gru": 3, "gru_reset_first": 3}  # gate blocks of each model's cell
LAYERS = {"lstm2": 2}


def matmul_flops(model: str, size: tuple[int, int, int], mode: str) -> float | None:
    """The floating-point operations of a row's matrix multiplies: per layer and step, the input projection
    (D = H) and the recurrent one, 2 * N * H * G*H each; training adds the two GEMMs of their gradients
    (inputs and weights), three times the forward's. None for the attention model, whose attention GEMMs
    this does not count."""
    if model not in GATES:
        return None
    steps, batch, hidden = size
    forward = LAYERS.get(model, 1) * steps * 2 * (2 * batch * hidden * GATES[model] * hidden)
    return float(forward if mode == "forward" else 3 * forward)


def peak_gemm() -> dict:
    """The machine's GEMM rate with these threads: the best of XLA's and PyTorch's float32 square matmul at
    n = 1024 (GFLOP/s, the best of 7 runs, timed as the rows are)."""
    import torch

    n = 1024
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    xla = jax.jit(lambda x, y: x @ y)
    xa = jax.device_put(a)
    ta = torch.from_numpy(a).to(harness.TORCH_DEVICE)
    clock = time.process_time if ARGS.cpu_time else time.perf_counter
    rates = {}

    def torch_mm():
        torch.mm(ta, ta)
        harness._finished(torch)

    for name, run in (("xla", lambda: xla(xa, xa).block_until_ready()), ("torch", torch_mm)):
        run()
        best = float("inf")
        for _ in range(7):
            begin = clock()
            run()
            best = min(best, clock() - begin)
        rates[name] = round(2 * n**3 / best / 1e9, 1)
    return {"n": n, "gflops": rates, "peak_gflops": max(rates.values())}


# ------------------------------------------------------------------------------------------------
# Real Caffe2


def _caffe2_python() -> Path | None:
    path = Path(ARGS.caffe2_python) if ARGS.caffe2_python else ROOT / ".venv-caffe2" / "bin" / "python"
    return path if path.exists() else None


def run_caffe2(case: harness.Case, modes: list[str], reference: dict) -> dict:
    """Run the same NetDefs in real Caffe2; check its outputs; return {label: times} or {"error": ...}."""
    python = _caffe2_python()
    if python is None:
        return {"error": "real Caffe2 venv not found"}
    labels = {}
    if "forward" in modes:
        labels["forward"] = (case.nets.forward, [case.nets.output])
    if any(m.startswith("train") for m in modes):
        labels["train"] = (case.nets.train, [case.nets.grads[b] for b in case.grad_blobs])
    with tempfile.TemporaryDirectory(prefix="rnn2jax-bench-") as tmp:
        job = {
            "nets": {},
            "fetch": {},
            "repeats": ARGS.repeats,
            "max_seconds": ARGS.max_seconds,
            "threads": ARGS.threads,
        }
        for label, (net, fetch) in labels.items():
            (Path(tmp) / f"{label}.pb").write_bytes(net.SerializeToString())
            job["nets"][label] = f"{label}.pb"
            job["fetch"][label] = fetch
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        np.savez(Path(tmp) / "blobs.npz", **case.params, **case.inputs, cotangent=case.cotangent)
        proc = subprocess.run(
            [str(python), str(HERE / "caffe2_runner.py"), tmp], capture_output=True, text=True, timeout=1800
        )
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-3:]
            return {"error": f"real Caffe2 failed (exit {proc.returncode}): {' | '.join(tail)}"}
        answer = json.loads(proc.stdout)
        CAFFE2_INFO.update(python=str(python), **answer["versions"])
        errors = {}
        for label in labels:
            fetched = dict(np.load(Path(tmp) / f"{label}.npz"))
            if label == "forward":
                got = fetched[case.nets.output]
                errors[label] = check_result("real Caffe2 forward", got, reference["forward"])
            else:
                got = {b: fetched[case.nets.grads[b]] for b in case.grad_blobs}
                errors[label] = check_result("real Caffe2 training net", got, reference["train"])
    return {"times": answer["times"], "errors": errors, "versions": answer["versions"]}


# ------------------------------------------------------------------------------------------------
# One case


def _rows_for_group(case, mode_names, times, errors, caffe2, caffe2_label) -> list[dict]:
    rows = []
    shared = [k for k in ("torch", "hand_jax") if k in times]
    for mode in mode_names:
        ms = {"rnn2jax": _median_ms(times[mode])}
        ms.update({k: _median_ms(times[k]) for k in shared})
        ratios = {
            "vs_torch": _ratio(times, mode, "torch"),
            "vs_hand_jax": _ratio(times, mode, "hand_jax"),
            "vs_caffe2": None,
        }
        row = {
            "model": case.model.name,
            "size": list(case.size),
            "mode": mode,
            "ms": ms,
            "ratios": ratios,
            "rounds": len(times[mode]),
            "check_error": {k: errors[k] for k in [mode, *shared] if k in errors},
        }
        if caffe2 is not None:
            if "error" in caffe2:
                row["caffe2_error"] = caffe2["error"]
            else:
                c2_times = caffe2["times"][caffe2_label]
                ms["caffe2"] = _median_ms(c2_times)
                ratios["vs_caffe2"] = ms["rnn2jax"] / ms["caffe2"]
                row["caffe2_rounds"] = len(c2_times)
                row["check_error"]["caffe2"] = caffe2["errors"][caffe2_label]
        rows.append(row)
    return rows


def run_case(model_name: str, size: tuple[int, int, int], modes: list[str]) -> list[dict]:
    case = harness.prepare(model_name, *size)
    rows: list[dict] = []
    reference: dict = {}
    groups = []
    if "forward" in modes:
        runners = {"forward": harness.rnn2jax_forward(case), "hand_jax": harness.hand_forward(case)}
        torch_runner = harness.torch_forward(case)
        if torch_runner is not None:
            runners["torch"] = torch_runner
        groups.append((["forward"], runners, "forward"))
    train_modes = [m for m in modes if m.startswith("train")]
    if train_modes:
        builders = {"train_bsn": harness.rnn2jax_backward_step_net, "train_jaxgrad": harness.rnn2jax_jax_grad}
        runners = {m: builders[m](case) for m in train_modes}
        runners["hand_jax"] = harness.hand_training(case)
        torch_runner = harness.torch_training(case)
        if torch_runner is not None:
            runners["torch"] = torch_runner
        groups.append((train_modes, runners, "train"))

    checked = []
    for _, runners, label in groups:
        want = runners["hand_jax"].result()
        reference[label] = jax.tree.map(np.asarray, want)
        errors = {}
        for name, runner in runners.items():
            if name != "hand_jax":
                errors[name] = check_result(f"{model_name} {size} {name}", runner.result(), reference[label])
        errors["hand_jax"] = 0.0
        checked.append(errors)

    caffe2 = None if ARGS.no_caffe2 else run_caffe2(case, modes, reference)
    for (mode_names, runners, label), errors in zip(groups, checked, strict=True):
        load = os.getloadavg()[0]
        times = interleaved(runners, ARGS.repeats, ARGS.max_seconds)
        for row in _rows_for_group(case, mode_names, times, errors, caffe2, label):
            row["loadavg_1min"] = [round(load, 2), round(os.getloadavg()[0], 2)]  # before, after timing
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------
# Memory


def measure_memory(size: tuple[int, int, int]) -> dict:
    """XLA's memory_analysis of both rnn2jax training executables (and the hand-written one), and each form's
    peak RSS increase over one training step in a fresh subprocess (benchmarks/memory_probe.py)."""
    case = harness.prepare("lstm", *size)
    analysis = {
        "train_bsn": harness.memory_analysis(harness.rnn2jax_backward_step_net(case)),
        "train_jaxgrad": harness.memory_analysis(harness.rnn2jax_jax_grad(case)),
        "hand_jax": harness.memory_analysis(harness.hand_training(case)),
    }
    probes = {}
    for form in ("train_bsn", "train_jaxgrad", "hand_jax", "torch"):
        cmd = [sys.executable, str(HERE / "memory_probe.py"), form, ",".join(map(str, size)), str(ARGS.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            probes[form] = {"error": " | ".join(proc.stderr.strip().splitlines()[-3:])}
        else:
            probes[form] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"model": "lstm", "size": list(size), "xla_memory_analysis": analysis, "peak_rss_probe": probes}


def print_memory(memory: dict) -> None:
    mib = 1 / 2**20
    print(f"\nPeak training memory, LSTM {','.join(map(str, memory['size']))} (MiB)")
    print(f"{'form':>14} {'XLA temp+arg+out':>17} {'probe: step peak over baseline':>31}")
    for form in ("train_bsn", "train_jaxgrad", "hand_jax", "torch"):
        stats = memory["xla_memory_analysis"].get(form)
        xla = f"{stats['total_bytes'] * mib:17.1f}" if stats else f"{'-':>17}"
        probe = memory["peak_rss_probe"][form]
        peak = f"{probe['step_peak_bytes'] * mib:31.1f}" if "step_peak_bytes" in probe else f"{'error':>31}"
        print(f"{form:>14} {xla} {peak}")


# ------------------------------------------------------------------------------------------------
# Output


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "jax_devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "jax_backend": jax.default_backend(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "threads": ARGS.threads,
        "loadavg_at_start": [round(v, 2) for v in os.getloadavg()],
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'-':>{width}}"


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'model':>10} {'T,N,H':>12} {'mode':>14} {'rnn2jax ms':>10} {'torch ms':>9} {'hand ms':>9} "
        f"{'caffe2 ms':>10} {'/torch':>7} {'/hand':>7} {'/caffe2':>8} {'GEMM%':>6}"
    )
    print(head)
    for r in rows:
        ms, ratios = r["ms"], r["ratios"]
        print(
            f"{r['model']:>10} {','.join(map(str, r['size'])):>12} {r['mode']:>14} {ms['rnn2jax']:10.2f} "
            f"{_fmt(ms.get('torch'), '.2f', 9)} {_fmt(ms.get('hand_jax'), '.2f', 9)} "
            f"{_fmt(ms.get('caffe2'), '.2f', 10)} {_fmt(ratios['vs_torch'], '.2f', 7)} "
            f"{_fmt(ratios['vs_hand_jax'], '.2f', 7)} {_fmt(ratios['vs_caffe2'], '.3f', 8)} "
            f"{_fmt(None if r.get('gemm_fraction') is None else 100 * r['gemm_fraction'], '.0f', 6)}"
        )
        if "caffe2_error" in r:
            print(f"{'':>12} caffe2: {r['caffe2_error']}")
    print("ratios: rnn2jax time / other; /torch and /hand are medians of per-round ratios, /caffe2 of medians")
    load = max(max(r["loadavg_1min"]) for r in rows) if rows else 0.0
    if load > (os.cpu_count() or 1):
        print(
            f"WARNING: the 1-minute load average reached {load:.1f} on {os.cpu_count()} CPUs during timing: other "
            "processes competed for the cores, and multi-threaded runtimes (PyTorch's OpenMP above all) suffer "
            "from that more than single-threaded ones; rerun on a quiet machine before trusting the ratios"
        )


def _default_torch_device(torch) -> str:
    """PyTorch runs where JAX does: on the GPU when JAX's default device is one (and PyTorch sees one)."""
    return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def main() -> None:
    import torch

    torch.set_num_threads(ARGS.threads)
    # Float32 matmuls everywhere, as Caffe2 computes: on GPUs JAX's default precision and PyTorch's cuDNN and
    # cuBLAS paths use TF32 (a 10-bit mantissa), which the outputs check would rightly refuse.
    jax.config.update("jax_default_matmul_precision", "float32")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    harness.TORCH_DEVICE = ARGS.torch_device or _default_torch_device(torch)
    unknown = [m for m in ARGS.modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s) {unknown}; choose from {MODES}")
    sizes = [tuple(int(v) for v in s.split(",")) for s in ARGS.sizes]
    started = time.perf_counter()
    rows: list[dict] = []
    for size in sizes:
        for model in ARGS.models:
            t0 = time.perf_counter()
            case_rows = run_case(model, size, ARGS.modes)
            rows += case_rows
            print(f"# {model} {size}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            for r in case_rows:  # as each case ends: a run stopped part-way still leaves its figures
                times = ", ".join(f"{k} {v:.2f}" for k, v in r["ms"].items() if v is not None)
                print(f"#   {r['mode']}: {times} ms", file=sys.stderr, flush=True)
    memory = None if ARGS.no_memory else measure_memory(tuple(int(v) for v in ARGS.memory_size.split(",")))
    gemm = peak_gemm()
    for row in rows:
        flops = matmul_flops(row["model"], tuple(row["size"]), row["mode"])
        seconds = row["ms"]["rnn2jax"] / 1e3
        row["gemm_fraction"] = None if flops is None else flops / seconds / (gemm["peak_gflops"] * 1e9)
    clock = "CPU time" if ARGS.cpu_time else "wall clock"
    print(
        f"jax {jax.__version__} on {jax.devices()[0]}, torch {torch.__version__} on {harness.TORCH_DEVICE}, "
        f"{ARGS.threads} threads, {clock}"
    )
    print(f"peak GEMM: {gemm['peak_gflops']} GFLOP/s (XLA {gemm['gflops']['xla']}, PyTorch {gemm['gflops']['torch']})")
    print_table(rows)
    if memory is not None:
        print_memory(memory)
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/compare.py", *sys.argv[1:]]),
        "machine": machine_info(),
        "versions": {
            "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib"),
            "torch": torch.__version__,
        },
        "torch_device": harness.TORCH_DEVICE,
        "caffe2": "skipped" if ARGS.no_caffe2 else (CAFFE2_INFO or "unavailable"),
        "tolerance": {"rtol": RTOL, "atol": ATOL, "atol_scaled_by": "max(1, max|reference|)"},
        "reference": "hand-written JAX (every other form is checked against it before timing)",
        "clock": "cpu" if ARGS.cpu_time else "wall",
        "peak_gemm": gemm,
        "repeats": ARGS.repeats,
        "max_seconds": ARGS.max_seconds,
        "rows": rows,
        "memory": memory,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    out = Path(ARGS.out) if ARGS.out else HERE / "results" / "latest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
