"""`atomic_write`: a saved file gets the permissions a plain `open(path, "wb")` gives, so another user (a
serving process) can read a model the exporting user wrote; a rewrite keeps the old file's mode."""

from __future__ import annotations

import os
import stat

import pytest

from rnn2jax.ir.files import atomic_write


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_new_file_gets_the_mode_open_would_give(tmp_path, umask):
    old = os.umask(umask)
    try:
        with open(tmp_path / "plain.bin", "wb") as file:  # the reference: what open() does under this umask
            file.write(b"x")
        with atomic_write(tmp_path / "atomic.bin") as file:
            file.write(b"x")
    finally:
        os.umask(old)
    plain = stat.S_IMODE((tmp_path / "plain.bin").stat().st_mode)
    assert stat.S_IMODE((tmp_path / "atomic.bin").stat().st_mode) == plain
    assert (tmp_path / "atomic.bin").read_bytes() == b"x"


def test_rewrite_keeps_the_old_mode(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    with atomic_write(target) as file:
        file.write(b"new")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.read_bytes() == b"new"
