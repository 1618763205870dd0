#!/usr/bin/env python
"""The atheris fuzzer: coverage-guided, structure-aware mutation of fuzz containers (see `contract.py`).

    python tests/fuzz/fuzz_nets.py [libFuzzer flags] CORPUS_DIR [SEED_DIR ...]

`make fuzz` runs it with the corpus in `tests/fuzz/corpus/` and crash inputs written to
`tests/fuzz/crashes/` (every file there is replayed by `tests/test_fuzz.py`). Escapes and silent answers
(`contract.SilentAnswer`) are counted, saved there as `escape-<sha1>`/`silent-<sha1>`, and the run goes on;
the counts are printed every 500 executions and after each find (libFuzzer ends the process without
Python's exit handlers, so `make fuzz` adds up the final counts from the log). Crashes and hangs
(timeouts, out of memory) end the run as libFuzzer's own artifacts. A run is repeated with `-seed=N`.
One time in four a mutation is libFuzzer's own byte-level one, so the wire parser sees broken bytes
too; the rest are structural (`mutations.py`) on the decoded container. rnn2jax's modules are
instrumented for coverage; JAX is not.
"""

from __future__ import annotations

import hashlib
import pkgutil
import sys
import zlib
from pathlib import Path

import atheris
import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

with atheris.instrument_imports(include=["rnn2jax"]):
    import rnn2jax

    for module in pkgutil.walk_packages(rnn2jax.__path__, "rnn2jax."):
        # the worker runs under Caffe2's interpreter; _kernels is the native library (ctypes loads it)
        if module.name not in ("rnn2jax.__main__", "rnn2jax.checking.oracle.worker", "rnn2jax.native._kernels"):
            __import__(module.name)

from google.protobuf.message import DecodeError

from fuzz.contract import SilentAnswer, enable_compilation_cache, exercise
from fuzz.mutations import RandomChooser, mutate_container
from rnn2jax.proto import caffe2_pb2 as pb

# `verify` costs a forward and a backward trace and compile per recurrent op: run it for one input in four
# (decided by the input's bytes, so a crash input replays the same way).
VERIFY_ONE_IN = 4


# JAX keeps every traced and compiled function in in-memory caches, which grow with each new net; clearing
# them now and then holds the fuzzer's memory flat (the persistent cache on disk keeps recompiling cheap).
CLEAR_CACHES_EVERY = 500
_executions = 0


_counts = {"escapes": 0, "silent answers": 0}
CRASH_DIR = Path(__file__).resolve().parent / "crashes"


def _print_counts() -> None:
    counts = f"escapes {_counts['escapes']}, silent answers {_counts['silent answers']}"
    print(f"fuzz_nets: {_executions} executions; {counts}", file=sys.stderr, flush=True)


def test_one_input(data: bytes) -> None:
    global _executions
    _executions += 1
    if _executions % CLEAR_CACHES_EVERY == 0:
        jax.clear_caches()
        _print_counts()
    try:
        exercise(data, verify=zlib.crc32(data) % VERIFY_ONE_IN == 0)
    except Exception as error:  # counted and saved; the run goes on
        kind = "silent" if isinstance(error, SilentAnswer) else "escape"
        _counts["silent answers" if kind == "silent" else "escapes"] += 1
        CRASH_DIR.mkdir(parents=True, exist_ok=True)
        path = CRASH_DIR / f"{kind}-{hashlib.sha1(data).hexdigest()}"
        path.write_bytes(data)
        print(f"fuzz_nets: {type(error).__name__}: {str(error)[:300]} -> saved to {path}", file=sys.stderr)
        _print_counts()


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    chooser = RandomChooser(seed)
    if chooser.below(4) == 0:
        return atheris.Mutate(data, max_size)
    try:
        plan = pb.PlanDef.FromString(data)
    except (DecodeError, RecursionError):
        return atheris.Mutate(data, max_size)
    try:
        mutate_container(chooser, plan, count=1 + chooser.below(3))
    except (ValueError, TypeError):  # a value protobuf will not store (libFuzzer's bytes broke a field)
        return atheris.Mutate(data, max_size)
    mutated = plan.SerializeToString()
    return mutated if len(mutated) <= max_size else atheris.Mutate(data, max_size)


def main() -> None:
    enable_compilation_cache()
    atheris.Setup(sys.argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
