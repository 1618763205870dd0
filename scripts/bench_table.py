"""Render benchmarks/results/latest.json (written by benchmarks/compare.py) as Markdown for the README.

    .venv/bin/python scripts/bench_table.py [benchmarks/results/latest.json] [--single-thread FILE] [-o FILE]

One table of times (ms, medians) and ratios (rnn2jax time / other: below 1 means rnn2jax is faster), with the
share of the machine's measured peak GEMM rate that each row's matmuls reach; then the machine it came from,
the command, and the peak training memory when it was measured. A dash means the form does not exist for
that model (PyTorch has no LSTM with attention) or was not run. When the single-thread CPU-time run exists
(benchmarks/results/single_thread.json, `compare.py --threads 1 --cpu-time`), a second table gives its
rnn2jax / PyTorch ratios beside the first table's two-thread wall-clock ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "latest.json"
SINGLE_THREAD = ROOT / "benchmarks" / "results" / "single_thread.json"
MODES = {
    "forward": "forward",
    "train_bsn": "training, backward step net",
    "train_jaxgrad": "training, jax.grad",
}


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _percent(fraction: float | None) -> str:
    return "–" if fraction is None else f"{100 * fraction:.0f}%"


def rows_table(rows: list[dict]) -> list[str]:
    lines = [
        "| model | T, N, H | mode | rnn2jax ms | PyTorch ms | hand JAX ms | Caffe2 ms "
        "| / PyTorch | / hand JAX | / Caffe2 | GEMM peak |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        ms, ratios = r["ms"], r["ratios"]
        caffe2 = _num(ms.get("caffe2")) if "caffe2_error" not in r else "error"
        lines.append(
            f"| {r['model']} | {', '.join(map(str, r['size']))} | {MODES.get(r['mode'], r['mode'])} "
            f"| {_num(ms['rnn2jax'])} | {_num(ms.get('torch'))} | {_num(ms.get('hand_jax'))} | {caffe2} "
            f"| {_num(ratios.get('vs_torch'))} | {_num(ratios.get('vs_hand_jax'))} "
            f"| {_num(ratios.get('vs_caffe2'), 3)} | {_percent(r.get('gemm_fraction'))} |"
        )
    return lines


def single_thread_table(result: dict, wall_rows: list[dict]) -> list[str]:
    """The single-thread CPU-time run: rnn2jax and PyTorch CPU ms and their ratio, beside the wall-clock
    ratio of the same row in the main run."""
    wall = {(r["model"], tuple(r["size"]), r["mode"]): r["ratios"].get("vs_torch") for r in wall_rows}
    gemm = result.get("peak_gemm", {})
    lines = [
        f"Single thread, CPU time (`{result['command']}`; peak GEMM {gemm.get('peak_gflops', '–')} GFLOP/s):",
        "",
        "| model | T, N, H | mode | rnn2jax CPU ms | PyTorch CPU ms | / PyTorch, 1 thread CPU "
        "| / PyTorch, 2 threads wall | GEMM peak |",
        "|---|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in result["rows"]:
        key = (r["model"], tuple(r["size"]), r["mode"])
        lines.append(
            f"| {r['model']} | {', '.join(map(str, r['size']))} | {MODES.get(r['mode'], r['mode'])} "
            f"| {_num(r['ms']['rnn2jax'])} | {_num(r['ms'].get('torch'))} | {_num(r['ratios'].get('vs_torch'))} "
            f"| {_num(wall.get(key))} | {_percent(r.get('gemm_fraction'))} |"
        )
    return lines


def memory_table(memory: dict) -> list[str]:
    mib = 1 / 2**20
    names = {
        "train_bsn": "rnn2jax, backward step net",
        "train_jaxgrad": "rnn2jax, jax.grad",
        "hand_jax": "hand-written JAX",
        "torch": "PyTorch",
    }
    lines = [
        f"Peak memory of one training step, {memory['model']} at T, N, H = {', '.join(map(str, memory['size']))} "
        "(MiB): XLA's `memory_analysis()` of the compiled step (temp + arguments + outputs), and the peak RSS "
        "increase over one step in a fresh process (VmHWM after resetting it, minus VmRSS before).",
        "",
        "| form | XLA temp + args + outputs | step peak RSS over baseline |",
        "|---|--:|--:|",
    ]
    for form, label in names.items():
        stats = memory["xla_memory_analysis"].get(form)
        probe = memory["peak_rss_probe"].get(form, {})
        xla = f"{stats['total_bytes'] * mib:.1f}" if stats else "–"
        peak = f"{probe['step_peak_bytes'] * mib:.1f}" if "step_peak_bytes" in probe else "error"
        lines.append(f"| {label} | {xla} | {peak} |")
    return lines


def render(result: dict, single_thread: dict | None = None) -> str:
    machine = result["machine"]
    versions = result["versions"]
    caffe2 = result.get("caffe2")
    caffe2_text = f"torch {caffe2['torch']}'s Caffe2" if isinstance(caffe2, dict) and "torch" in caffe2 else caffe2
    lines = rows_table(result["rows"])
    lines += [
        "",
        f"Machine: {machine.get('cpu_model', machine['processor'] or machine['machine'])}, "
        f"{machine['cpu_count']} CPUs, {machine['platform']}; JAX devices {', '.join(machine['jax_devices'])}; "
        f"{machine['threads']} threads for XLA, PyTorch and Caffe2. "
        f"jax {versions['jax']}, PyTorch {versions['torch']}, real Caffe2: {caffe2_text}. "
        f"Run {result['date']}, `{result['command']}` ({result['wall_seconds']:.0f} s). Times are medians of "
        "interleaved runs; ratios against PyTorch and hand-written JAX are medians of per-run ratios. Every "
        f"output and gradient was checked equal (rtol {result['tolerance']['rtol']}, atol "
        f"{result['tolerance']['atol']} scaled by the largest value) before timing.",
    ]
    loads = [v for r in result["rows"] for v in r.get("loadavg_1min", [])]
    if loads:
        lines[-1] += f" 1-minute load average during timing: {min(loads):.1f} to {max(loads):.1f}."
    gemm = result.get("peak_gemm")
    if gemm:
        lines[-1] += (
            f" Peak GEMM (float32, n = {gemm['n']}, threads: {result['machine']['threads']}): {gemm['peak_gflops']} "
            f"GFLOP/s (XLA {gemm['gflops']['xla']}, PyTorch {gemm['gflops']['torch']})."
        )
    if single_thread is not None:
        lines += ["", *single_thread_table(single_thread, result["rows"])]
    if result.get("memory"):
        lines += ["", *memory_table(result["memory"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="?", default=str(DEFAULT))
    parser.add_argument("--single-thread", default=str(SINGLE_THREAD), help="the single-thread CPU-time run, if any")
    parser.add_argument("-o", "--output", help="write here instead of stdout")
    args = parser.parse_args()
    single = Path(args.single_thread)
    single_thread = json.loads(single.read_text()) if single.is_file() else None
    text = render(json.loads(Path(args.json).read_text()), single_thread)
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
