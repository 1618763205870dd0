"""Run the hypothesis fuzzer (`mutated.py`) for a given time: rounds of fresh random examples until the time
is up. Round r uses hypothesis seed `seed + r`, so a run is repeated by giving the same `--seed` (or
$FUZZ_SEED; without either a random one is drawn and printed). Every escape and every silent answer
(`contract.SilentAnswer`) is counted and its input saved under `tests/fuzz/crashes/` (which the suite
replays); the run goes on. It prints executions, escapes, silent answers, crashes and hangs at the end.

    python tests/fuzz/fuzz_mutations.py --seconds 1800 [--seed 7] [--crash-dir tests/fuzz/crashes]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time
from pathlib import Path

import jax
from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.contract import SilentAnswer, enable_compilation_cache
from fuzz.mutated import Recorder, mutated_containers, seed_containers

ROUND = 50  # examples per hypothesis run; a new random seed each round


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED") or random.randrange(2**31)))
    parser.add_argument("--crash-dir", type=Path, default=Path(__file__).resolve().parent / "crashes")
    args = parser.parse_args()
    enable_compilation_cache()
    stages: dict[str, int] = {}
    counts = {"escapes": 0, "silent answers": 0}

    def save(data: bytes, error: BaseException) -> None:
        args.crash_dir.mkdir(parents=True, exist_ok=True)
        path = args.crash_dir / f"hypothesis-{hashlib.sha1(data).hexdigest()[:16]}.pb"
        path.write_bytes(data)
        print(f"fuzz_mutations: {type(error).__name__}: {str(error)[:300]} -> saved to {path}", file=sys.stderr)

    @settings(max_examples=ROUND, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(mutated_containers())
    def fuzz(case: tuple[str, bytes]) -> None:
        try:
            stage = Recorder.check(case[1])
        except SilentAnswer as error:
            stage = "silent answer"
            counts["silent answers"] += 1
            save(case[1], error)
        except Exception as error:  # an escape: counted and saved, and the run goes on
            stage = "escape"
            counts["escapes"] += 1
            save(case[1], error)
        stages[stage] = stages.get(stage, 0) + 1

    print(f"fuzz_mutations: {len(seed_containers())} seeds, {args.seconds:.0f} s, --seed {args.seed}")
    start = time.monotonic()
    rounds = 0
    try:
        while time.monotonic() - start < args.seconds:
            seed((args.seed + rounds) % 2**32)(fuzz)()
            rounds += 1
            jax.clear_caches()  # JAX's in-memory caches grow with every new net (see fuzz_nets.py)
    finally:
        total = sum(stages.values())
        elapsed = time.monotonic() - start
        print(f"fuzz_mutations: {total} executions in {elapsed:.0f} s ({rounds} rounds, --seed {args.seed}); "
              f"escapes {counts['escapes']}, silent answers {counts['silent answers']}, crashes 0, hangs 0 "
              "(a crash or hang would have ended this process)")  # fmt: skip
        print("stages reached:")
        for stage, count in sorted(stages.items(), key=lambda item: -item[1]):
            print(f"  {stage:20s} {count}")
    return 1 if counts["escapes"] or counts["silent answers"] else 0


if __name__ == "__main__":
    sys.exit(main())
