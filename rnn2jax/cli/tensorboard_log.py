"""`rnn2jax run-plan --tensorboard DIR`: the logged blobs as TensorBoard scalars, so a training run can be
watched as curves (written with tensorboardX, the `tensorboard` extra).

A blob is written each time it holds a new value when an iteration of an execution step ends (a plan
observer sees every iteration of every step, nested ones too, so a value is recorded once however deeply
its net runs): step k of its curve is its k-th value (k = 0, 1, ...), which for a loss the train net writes
once per iteration is the training iteration. A blob of one value is written as it is, under its name; a
larger one as its mean, under `NAME/mean`; an empty one, or one that is not numbers, is not written.
(TensorBoard tags allow letters, digits and `-_./`: tensorboardX writes any other character as `_`.)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import Rnn2JaxError
from ..ir.netdef import Plan

LOSS_NAME = re.compile("loss", re.IGNORECASE)


def loss_blobs(plan: Plan) -> list[str]:
    """What `--tensorboard` logs without `--log`: the blobs the plan's nets write whose name holds "loss"
    (any case), gradients (`..._grad`) left out, in the order the nets write them."""
    names: dict[str, None] = {}
    for net in plan.nets.values():
        for op in net.ops:
            for name in op.outputs:
                if LOSS_NAME.search(name) and not name.endswith("_grad") and "_grad_" not in name:
                    names[name] = None
    return list(names)


def tag(name: str, value: np.ndarray) -> str:
    return name if value.size == 1 else f"{name}/mean"


def scalar(value: np.ndarray) -> float:
    """One float for a blob: its only value, or its mean (in float64)."""
    return float(value.reshape(-1)[0]) if value.size == 1 else float(np.mean(value, dtype=np.float64))


class ScalarLogger:
    """A plan observer that writes each blob in `names` to a tensorboardX event file in `logdir` whenever
    it holds a new value. `close()` flushes the file."""

    def __init__(self, workspace: Any, names: Sequence[str], logdir: str):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise Rnn2JaxError(
                "--tensorboard needs the tensorboardX package: pip install 'rnn2jax[tensorboard]'"
            ) from None
        try:
            self._writer = SummaryWriter(logdir=logdir)
        except OSError as error:
            raise Rnn2JaxError(f"--tensorboard: cannot write to '{logdir}': {error.strerror or error}") from None
        self._workspace = workspace
        self._names = tuple(dict.fromkeys(names))
        self._last: dict[str, Any] = {}  # the raw value last written (held, so `is` tells a new one)
        self.steps: dict[str, int] = dict.fromkeys(self._names, 0)
        self._skipped: set[str] = set()

    def __call__(self, path: tuple[str, ...], done: int, total: int | None) -> None:
        for name in self._names:
            if not self._workspace.has_blob(name):
                continue
            raw = self._workspace.get(name)
            if raw is self._last.get(name):
                continue
            self._last[name] = raw
            value = self._workspace.fetch(name)
            if not isinstance(value, np.ndarray):
                self._skip(name, f"holds a {type(value).__name__}")
                continue
            if not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
                self._skip(name, f"holds {value.dtype} values")
                continue
            if value.size == 0:
                continue
            self._writer.add_scalar(tag(name, value), scalar(value), self.steps[name])
            self.steps[name] += 1

    def _skip(self, name: str, why: str) -> None:
        if name not in self._skipped:
            self._skipped.add(name)
            print(f"rnn2jax: --tensorboard: blob '{name}' {why}, not numbers: not logged", file=sys.stderr)

    def close(self) -> None:
        self._writer.close()
