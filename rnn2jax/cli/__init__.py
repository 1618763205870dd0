"""The command line: `rnn2jax COMMAND ...` (the parser in app.py, one module per command family)."""

from .app import main

__all__ = ["main"]
