"""Writing files so that nothing a user saved is lost or half-written: write beside, then rename.

A crash, a full disk or an error half-way leaves the old file (if any) as it was and no partial new one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A binary file object that becomes `path` when the block ends without an error (and is removed
    when it raises). The temporary file sits in the same directory, so the rename is atomic."""
    target = Path(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent or ".")
    try:
        os.chmod(temporary, _mode_for(target))
        with os.fdopen(descriptor, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _mode_for(target: Path) -> int:
    """The permissions a plain `open(path, "w")` would give: the old file's, else 0666 less the umask
    (mkstemp's 0600 would make a saved model unreadable to the serving process's user)."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask
