"""A one-line progress display on stderr for the slow commands (`run`, `export`, `verify`, `run-plan`).

A stage shows only when stderr is a terminal, so logs, pipes and test output stay clean; `run-plan`'s
iteration line, which a long training run is watched by, becomes a plain line every few seconds there.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

from ..ops.waits import bystander

if TYPE_CHECKING:
    from ..ir.netdef import ExecutionStep
    from ..runtime.plan import StepProgress


def _stream() -> TextIO | None:
    stream = sys.stderr
    isatty = getattr(stream, "isatty", None)
    return stream if isatty is not None and isatty() else None


@contextmanager
def stage(text: str) -> Iterator[None]:
    """Show `rnn2jax: text... 1.2s` while the block runs (updated twice a second), then clear it."""
    stream = _stream()
    if stream is None:
        yield
        return
    start, done = time.monotonic(), threading.Event()

    def show() -> None:
        stream.write(f"\r\033[Krnn2jax: {text}... {time.monotonic() - start:.1f}s")
        stream.flush()

    def tick() -> None:
        while not done.wait(0.5):
            show()

    show()
    thread = bystander(threading.Thread(target=tick, daemon=True))  # it never fills or empties a queue
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        stream.write("\r\033[K")
        stream.flush()


class IterationMeter:
    """`rnn2jax: step 'train' 120/1000  85 it/s  loss 0.31` for `run-plan`: the outermost running step that
    repeats (a training loop, not the one-iteration steps inside it; the innermost step when none repeats)
    and its iterations out of num_iter. An unnamed step is named by the nets it runs. On a terminal the line
    is redrawn at most `rate` times a second (at most 10: reading the logged blobs waits for the device);
    elsewhere (a log file, a pipe) a plain line is written every `every` seconds. Call it as the plan's
    progress hook (`rnn2jax.runtime.plan.Progress`) with the running steps, outermost first."""

    def __init__(
        self,
        describe: Callable[[], str] | None = None,
        rate: float = 4.0,
        stream: TextIO | None = None,
        every: float = 5.0,
    ):
        self._stream = stream if stream is not None else sys.stderr
        isatty = getattr(self._stream, "isatty", None)
        self._terminal = bool(isatty is not None and isatty())
        self._describe = describe
        self._period = 1.0 / min(rate, 10.0) if self._terminal else every
        self._last = time.monotonic() if not self._terminal else 0.0  # a plain line only after `every`
        self._counting: tuple[int, int, float] | None = None  # (id of the shown step, its done, when) first seen
        self.shown = False

    def __call__(self, frames: Sequence[StepProgress]) -> None:
        if not frames:
            return
        shown = next((f for f in frames if _repeats(f.step)), frames[-1])
        now = time.monotonic()
        if self._counting is None or self._counting[0] != id(shown.step):
            self._counting = (id(shown.step), shown.done, now)
        total = shown.step.num_iter
        if now - self._last < self._period and not (self._terminal and shown.done == total):
            return
        self._last = now
        _, first, since = self._counting
        speed = (shown.done - first) / (now - since) if now > since else 0.0
        count = f"{shown.done}/{total}" if total is not None else str(shown.done)
        extra = f"  {self._describe()}" if self._describe is not None else ""
        line = f"rnn2jax: {step_label(shown.step)} {count}  {speed:.0f} it/s{extra}"
        if self._terminal:
            self._stream.write(f"\r\033[K{line}")
            self.shown = True
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._terminal and self.shown:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self.shown = False


def _repeats(step: ExecutionStep) -> bool:
    """Whether a step runs more than once: num_iter above 1, or until its stop blob says stop."""
    return step.num_iter > 1 if step.num_iter is not None else step.should_stop_blob is not None and not step.only_once


def step_label(step: ExecutionStep, shown: int = 3) -> str:
    """`step 'train'`, or for an unnamed step the nets it runs: `step (char_rnn_loop, char_rnn)`."""
    if step.name:
        return f"step '{step.name}'"
    nets: list[str] = []
    todo = [step]
    while todo:
        current = todo.pop(0)
        nets.extend(n for n in current.networks if n not in nets)
        todo.extend(current.substeps)
    more = ", ..." if len(nets) > shown else ""
    return f"step ({', '.join(nets[:shown])}{more})" if nets else "step ''"
