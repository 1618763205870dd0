"""Imports every op family module so that each registers its ops. Add new families here."""

from . import (  # noqa: F401
    activation,
    elementwise,
    fill,
    linear,
    norm,
    reduce,
    shape,
)
