"""Starting a net the second time: JAX's persistent compilation cache (rnn2jax/compiler/cache.py).

    python benchmarks/cache_start.py [--repeats 3]

Each case runs as a fresh process, three ways, `--repeats` times each (medians reported):
- no cache (`--no-cache`, or RNN2JAX_CACHE_DIR empty);
- first start: an empty cache directory, which the run fills;
- second start: the cache the first start filled.
Cases: `rnn2jax run` of the breadbread LSTM predict net (random parameters and inputs, its real shapes; the
whole process is timed, Python's start and imports included), and the real dper train net (176 ops, two
LSTM pools) compiled and called once through `rnn2jax.compile`, with benchmarks/compile_time.py's stand-ins
(`compile` and the call are timed, not the drawing of its parameters by real Caffe2). Each process counts
its XLA compilations (JAX's monitoring event), so the table also shows that a second start compiles
nothing (JAX reports an executable loaded from the cache as a compile and a cache hit: those are
subtracted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REALNETS = ROOT.parent / "shared" / "realnets"
BREAD = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"

# a child process: count XLA compilations, run the case, print the count last
CHILD = """
import json, os, sys
import jax
# JAX records a backend compile for every executable it gets, compiled or loaded from the cache; a load is
# also a cache hit
compiled, loaded = [], []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, _d, **kw: compiled.append(kw.get("fun_name"))
    if event == "/jax/core/compile/backend_compile_duration" else None)
jax.monitoring.register_event_listener(
    lambda event, **kw: loaded.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
case, argv = sys.argv[1], json.loads(sys.argv[2])
if case == "run":
    from rnn2jax.cli import main
    code = main(argv)
    assert code == 0, code
else:
    sys.argv = [sys.argv[0], "--only", "dper"]
    sys.path.insert(0, argv[0])
    if os.environ["RNN2JAX_CACHE_DIR"]:
        from rnn2jax.compiler.cache import enable_compilation_cache
        enable_compilation_cache()
    import compile_time
    import numpy as np
    prepare, _ = compile_time.dper_case()
    import test_dper_net as dper
    import time
    inputs = dper.feature_inputs(np.random.default_rng(0), 5)
    start = time.perf_counter()
    jax.block_until_ready(prepare()(inputs))
    print("seconds", time.perf_counter() - start)
print("compilations", len(compiled) - len(loaded))
"""


def _bread_files(folder: Path) -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import write_breadbread_run  # the net's names and shapes, random parameters and inputs

    return write_breadbread_run(folder, steps=25, batch=1)


def _start(case: str, argv: list[str], cache: str, folder: Path) -> tuple[float, int]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", RNN2JAX_CACHE_DIR=cache)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, case, json.dumps(argv)], capture_output=True, text=True, env=env, cwd=folder
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
    said = dict(line.split() for line in done.stdout.splitlines() if line.startswith(("seconds", "compilations")))
    return float(said.get("seconds", seconds)), int(said["compilations"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not BREAD.exists():
        raise SystemExit(f"the real nets are absent ({REALNETS})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = {
            "rnn2jax run, breadbread LSTM predict net": ("run", _bread_files(folder)),
            "compile + one call, dper train net": ("dper", [str(ROOT / "benchmarks")]),
        }
        for label, (case, argv) in cases.items():
            times: dict[str, list[float]] = {"none": [], "first": [], "second": []}
            counts: dict[str, int] = {}
            for repeat in range(args.repeats):
                cache = folder / f"cache-{case}-{repeat}"
                for kind, directory in (("none", ""), ("first", str(cache)), ("second", str(cache))):
                    seconds, compiled = _start(case, argv, directory, folder)
                    times[kind].append(seconds)
                    counts[kind] = compiled
            rows.append((label, {k: statistics.median(v) for k, v in times.items()}, counts))
    print("| case | no cache s | first start s | second start s | XLA compilations (first / second) |")
    print("|---|--:|--:|--:|--:|")
    for label, median, counts in rows:
        print(
            f"| {label} | {median['none']:.2f} | {median['first']:.2f} | {median['second']:.2f} "
            f"| {counts['first']} / {counts['second']} |"
        )


if __name__ == "__main__":
    main()
