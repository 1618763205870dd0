"""A one-line progress display on stderr for the slow commands (`run`, `export`, `verify`).

It shows only when stderr is a terminal, so logs, pipes and test output stay clean.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


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
    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        stream.write("\r\033[K")
        stream.flush()


class IterationMeter:
    """`rnn2jax: step 'train' 120/1000  85 it/s  loss 0.31` for `run-plan`, redrawn at most `rate`
    times a second (reading the logged blobs waits for the device, so not every iteration), on a terminal
    only. Call it as a plan observer: `meter(step path, iterations done, num_iter or None)`."""

    def __init__(self, describe: Callable[[], str] | None = None, rate: float = 4.0, stream: TextIO | None = None):
        self._stream = stream if stream is not None else _stream()
        self._describe = describe
        self._period = 1.0 / rate
        self._last = 0.0
        self._start = time.monotonic()
        self._done = 0
        self.shown = False

    def __call__(self, path: tuple[str, ...], done: int, total: int | None) -> None:
        self._done += 1
        if self._stream is None:
            return
        now = time.monotonic()
        if now - self._last < self._period and done != total:
            return
        self._last = now
        count = f"{done}/{total}" if total is not None else str(done)
        speed = self._done / max(now - self._start, 1e-9)
        extra = f"  {self._describe()}" if self._describe is not None else ""
        self._stream.write(f"\r\033[Krnn2jax: step '{path[-1]}' {count}  {speed:.0f} it/s{extra}")
        self._stream.flush()
        self.shown = True

    def close(self) -> None:
        if self._stream is not None and self.shown:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self.shown = False
