"""JAX's persistent compilation cache, so a net compiled once is not compiled again in the next process.

`rnn2jax run`, `export`, `exec` and the other commands, and `rnn2jax.caffe2.install()`, turn it on at a
user cache directory: $RNN2JAX_CACHE_DIR, else $XDG_CACHE_HOME/rnn2jax/jax (~/.cache/rnn2jax/jax).
`RNN2JAX_CACHE_DIR=` (empty) or the command line's `--no-cache` leaves it off; `rnn2jax.compile(...,
cache_dir=DIR)` turns it on at DIR. JAX keeps one cache per process, so the first directory set is the one
used; a directory the user already gave JAX (`jax_compilation_cache_dir`) is kept. As JAX warns, the cache
holds executables: keep it where only its owner can write.

Every executable is cached, however fast it compiled (JAX's default skips those under a second, which is
most of a Caffe2 net's): the second start of a command then compiles nothing. JAX keys each entry on the
program, the devices, the XLA flags and the jax/jaxlib versions, so a stale entry is never used.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

from ..errors import Rnn2JaxError

CACHE_ENV = "RNN2JAX_CACHE_DIR"


def default_cache_dir() -> Path | None:
    """$RNN2JAX_CACHE_DIR (None when set empty: no cache), else $XDG_CACHE_HOME/rnn2jax/jax, else
    ~/.cache/rnn2jax/jax."""
    given = os.environ.get(CACHE_ENV)
    if given is not None:
        return Path(given).expanduser() if given else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rnn2jax" / "jax"


def enable_compilation_cache(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """Turn JAX's persistent compilation cache on at `directory` (default: `default_cache_dir()`), for this
    process, and return the directory in use (None when the cache stays off). A directory JAX already has
    (set by the user, or by an earlier call) is kept."""
    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    target = Path(directory).expanduser() if directory is not None else default_cache_dir()
    if target is None:
        return None
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise Rnn2JaxError(
            f"compilation cache: cannot create {target} ({error.strerror}); set {CACHE_ENV} to another directory, "
            f"or to nothing to compile without a cache"
        ) from None
    compilation_cache.set_cache_dir(str(target))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # JAX reads the directory once, at its first compile: maybe done already
    return target
