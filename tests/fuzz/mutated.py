"""The hypothesis fuzzer: seed containers (every builder cell, forward and training, and the real nets) under
a few structural mutations drawn by hypothesis, each run through `contract.exercise`.

`tests/test_fuzz.py` runs it with the suite's example budget; `fuzz_mutations.py` runs it for as long as
`make fuzz` asks.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from hypothesis import strategies as st

from fuzz.contract import exercise
from fuzz.mutations import DrawChooser, mutate_container
from rnn2jax.proto import caffe2_pb2 as pb

SEED_DIR = Path(__file__).resolve().parent / "seeds"
MAX_MUTATIONS = 4


@cache
def seed_containers() -> tuple[tuple[str, bytes], ...]:
    """The committed builder seeds, then the real-net seeds (when the real nets' folder is there)."""
    from fuzz.seeds import realnet_seeds

    seeds = [(path.stem, path.read_bytes()) for path in sorted(SEED_DIR.glob("*.pb"))]
    seeds.extend((name, plan.SerializeToString()) for name, plan in realnet_seeds())
    return tuple(seeds)


@st.composite
def mutated_containers(draw: st.DrawFn) -> tuple[str, bytes]:
    """(a description, the container's bytes) of a seed under 0..MAX_MUTATIONS mutations."""
    name, data = draw(st.sampled_from(seed_containers()))
    plan = pb.PlanDef.FromString(data)
    count = draw(st.integers(0, MAX_MUTATIONS))
    mutate_container(DrawChooser(draw), plan, count)
    return f"{name} with {count} mutation(s)", plan.SerializeToString()


class Recorder:
    """Keeps the last input that escaped, so the driver can save it (hypothesis replays the shrunk
    example last)."""

    last_escape: bytes | None = None

    @classmethod
    def check(cls, data: bytes) -> str:
        try:
            return exercise(data)
        except BaseException:
            cls.last_escape = data
            raise
