"""What is an input: one rule for `run`, `export`, `codegen`, `compare`, `verify` and `rnn2jax.compile`.

In a Caffe2 workspace a blob is whatever was last fed or written, so an init net may fill the data inputs
too (breadbread's fills `input_blob`, `seq_lengths` and the initial states for a one-sample setup). A
blob the net reads before writing it is therefore an input when nothing fills it, and also when something
fills it (the init net, `params=`) but the user says it is an input:

- the user names it: `--input`/`--inputs` (a value), `--input-shape`/`--shape`/`--input-dtype` (a shape or
  dtype), `compile(..., inputs=[...])`;
- `--batch`/`--steps` decide its shape: shape inference, with the filled values as defaults, finds a
  shape for it that its value does not have (the one-sample `[1, 1, 62]` against `[T, N, 62]`).
  Parameters never change shape this way (no shape rule guesses a parameter's).

The filled value is then the input's default: `run` uses it where no `--input` gives the blob, `compare`
and `verify` draw the input at random only where a shape was given or inferred for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir.netdef import Net

if TYPE_CHECKING:
    from .shape_inference import ShapeInference

Dim = int | str


def filled_inputs(
    net: Net,
    filled: Mapping[str, Any],
    *,
    named: Iterable[str] = (),
    shapes: Mapping[str, Sequence[Dim]] | None = None,
    batch: Dim | None = None,
    steps: Dim | None = None,
) -> tuple[str, ...]:
    """The blobs of `filled` (an init net's values, params) that are inputs of `net` all the same, in the
    order the net first reads them: those `named` or given a shape in `shapes`, and those whose shape
    `batch`/`steps` decide (see the module's docstring). Shape inference errors (shapes that do not fit
    an op) are raised, naming the op."""
    from ..lowering.interpreter import lower

    reads = lower(net).reads_before_writes()
    chosen = {n for n in named_inputs(filled, (*named, *(shapes or {}))) if n in reads}
    if batch is not None or steps is not None:
        rest = {n: v for n, v in filled.items() if n in reads and n not in chosen}
        chosen.update(infer_with_defaults(net, rest, shapes or {}, batch=batch, steps=steps).replaced)
    return tuple(n for n in reads if n in chosen)


def named_inputs(filled: Mapping[str, Any], named: Iterable[str]) -> tuple[str, ...]:
    """The filled blobs the user names as inputs (a value, a shape or a dtype given for them)."""
    return tuple(n for n in dict.fromkeys(named) if n in filled)


def infer_with_defaults(
    net: Net,
    filled: Mapping[str, Any],
    shapes: Mapping[str, Sequence[Dim]],
    *,
    batch: Dim | None,
    steps: Dim | None,
) -> ShapeInference:
    """Shape inference with the filled values as defaults: its `replaced` are the filled blobs whose
    shape `batch`/`steps` decide otherwise than their values (the data inputs); parameters keep theirs.
    Ops rnn2jax cannot lower (a training net's readers) are left out, their outputs inferred as inputs."""
    from .shape_inference import infer_shapes, runnable_part

    defaults = {n: v for n, v in filled.items() if n not in shapes and _numeric(v)}
    return infer_shapes(runnable_part(net), {}, dict(shapes), batch=batch, steps=steps, defaults=defaults)


def _numeric(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and np.dtype(dtype).kind in "biuf"
