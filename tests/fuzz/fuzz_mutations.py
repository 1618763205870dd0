"""Run the hypothesis fuzzer (`mutated.py`) for a given time: rounds of fresh random examples until the time
is up. An escape stops it, is shrunk by hypothesis, and its input is saved under `tests/fuzz/crashes/`.

    python tests/fuzz/fuzz_mutations.py --seconds 1800 [--crash-dir tests/fuzz/crashes]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import jax
from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.contract import enable_compilation_cache
from fuzz.mutated import Recorder, mutated_containers, seed_containers

ROUND = 50  # examples per hypothesis run; a new random seed each round


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--crash-dir", type=Path, default=Path(__file__).resolve().parent / "crashes")
    args = parser.parse_args()
    enable_compilation_cache()
    stages: dict[str, int] = {}

    @settings(max_examples=ROUND, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(mutated_containers())
    def fuzz(case: tuple[str, bytes]) -> None:
        stage = Recorder.check(case[1])
        stages[stage] = stages.get(stage, 0) + 1

    print(f"fuzz_mutations: {len(seed_containers())} seeds, {args.seconds:.0f} s")
    start = time.monotonic()
    rounds = 0
    try:
        while time.monotonic() - start < args.seconds:
            seed(int(time.time_ns() % 2**32))(fuzz)()
            rounds += 1
            jax.clear_caches()  # JAX's in-memory caches grow with every new net (see fuzz_nets.py)
    except Exception:
        data = Recorder.last_escape or b""
        args.crash_dir.mkdir(parents=True, exist_ok=True)
        path = args.crash_dir / f"hypothesis-{hashlib.sha1(data).hexdigest()[:16]}.pb"
        path.write_bytes(data)
        print(f"fuzz_mutations: escape saved to {path}", file=sys.stderr)
        raise
    finally:
        total = sum(stages.values())
        elapsed = time.monotonic() - start
        print(f"fuzz_mutations: {total} executions in {elapsed:.0f} s ({rounds} rounds); stages reached:")
        for stage, count in sorted(stages.items(), key=lambda item: -item[1]):
            print(f"  {stage:20s} {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
