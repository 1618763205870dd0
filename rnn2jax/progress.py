"""A one-line progress display on stderr for the slow commands (`run`, `export`, `verify`).

It shows only when stderr is a terminal, so logs, pipes and test output stay clean.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
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
