"""The command line: `rnn2jax COMMAND ...` (the top-level parser and `main` in app.py, one module per
command, the flags commands share in arguments.py)."""

from .app import main

__all__ = ["main"]
