"""Step nets whose shapes depend on the timestep: the first steps run outside the loop.

A `lax.scan` body is traced once, so every step must have the same shapes. Caffe2's step nets may
compute a shape from the timestep: beam search (`caffe2.python.models.seq2seq.beam_search`) slices
`Conditional(timestep == 0, BEAM_SIZE, -1)` scores, because its beam holds one hypothesis at the first
step and `beam_size` after it. Such values depend only on the timestep and on blobs known when the net
is compiled (the walk of `LoweredNet.static_inputs` finds them), so the lowering computes them for
every step t < T before tracing anything. The steps before the values settle for good run one by one
with their timestep known (peeled out of the loop, at most `MAX_PEELED_STEPS`); the loop runs the rest
with the settled values as constants. Shapes that keep changing later are refused, naming the step.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ...errors import MissingBlobError, ShapeError
from ...ir.netdef import Op

# The most first steps run outside the loop: each is traced and compiled on its own.
MAX_PEELED_STEPS = 16


@dataclass(frozen=True)
class TimestepShapes:
    """The per-step ops (positions in the step net) whose values decide shapes and follow the timestep."""

    positions: tuple[int, ...]
    timestep: str
    where: str  # the RecurrentNetwork op, for messages

    def values_at(self, step: Any, outer: Mapping[str, Any], t: int) -> dict[str, np.ndarray]:
        """What those ops write at step `t`, computed now (`step` is the lowered step net)."""
        env = ChainMap({self.timestep: np.array([t], np.int32)}, outer)
        ops = step.net.ops
        try:
            with jax.ensure_compile_time_eval():
                step.run(env, ops=self.positions)
        except MissingBlobError as error:
            raise ShapeError(
                f"{self.where}: the step net computes a shape from the timestep and from a blob that is only "
                f"known inside the step ({error})"
            ) from None
        values = {}
        for position in self.positions:
            for name in ops[position].outputs:
                value = env.maps[0][name]
                if isinstance(value, jax.core.Tracer):
                    traced = [n for n in ops[position].inputs if isinstance(env.get(n), jax.core.Tracer)]
                    raise ShapeError(
                        f"{self.where}: {ops[position].where} computes '{name}' from the timestep and "
                        f"{', '.join(repr(n) for n in traced) or 'traced inputs'}; its values decide a shape, so "
                        "they must be known when the net is compiled, but they are traced here (pass them as "
                        "NumPy arrays, or let rnn2jax.compile make them static)"
                    )
                values[name] = np.asarray(value)
        return values

    def plan(self, step: Any, outer: Mapping[str, Any], steps: int) -> tuple[int, dict[str, np.ndarray]]:
        """(the number of first steps to run outside the loop, the values every later step has)."""
        per_step = [self.values_at(step, outer, t) for t in range(max(steps, 1))]
        keys = [_key(values) for values in per_step]
        first_steady = len(keys) - 1
        while first_steady > 0 and keys[first_steady - 1] == keys[-1]:
            first_steady -= 1
        if first_steady > MAX_PEELED_STEPS:
            self._refuse(step.net.ops, per_step, first_steady)
        return min(first_steady, steps), per_step[first_steady]

    def _refuse(self, ops: Sequence[Op], per_step: list[dict[str, np.ndarray]], first_steady: int) -> None:
        before, after = per_step[first_steady - 1], per_step[first_steady]
        name = next(n for n in after if _key({n: after[n]}) != _key({n: before[n]}))
        writer = next(ops[p] for p in self.positions if name in ops[p].outputs)
        raise ShapeError(
            f"{self.where}: {writer.where} writes '{name}' = {before[name].tolist()} at step {first_steady - 1} "
            f"and {after[name].tolist()} at step {first_steady}, and its values decide a shape: the step net's "
            f"shapes still change after its first {MAX_PEELED_STEPS} steps. rnn2jax runs the first steps whose "
            f"shapes differ outside the loop (at most {MAX_PEELED_STEPS}), then one loop over steps that all "
            "have the same shapes"
        )


def timestep_shapes(lowered_step: Any, per_step: Sequence[int], timestep: str, where: str) -> TimestepShapes | None:
    """The step net's timestep-dependent shape computations, or None when its shapes never depend on it. Other
    shape computations (from a per-step blob's Shape, say) run in every step, the loop's too, as usual."""
    if timestep not in lowered_step.static_inputs():
        return None
    in_loop, ops = set(per_step), lowered_step.net.ops
    positions, follows = [], {timestep}
    for position in lowered_step.static_ops():  # in order: those that read the timestep, or what such ops wrote
        if position in in_loop and follows & set(ops[position].inputs):
            positions.append(position)
            follows.update(ops[position].outputs)
    return TimestepShapes(tuple(positions), timestep, where)


def _key(values: Mapping[str, np.ndarray]) -> tuple:
    return tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in values.items())
