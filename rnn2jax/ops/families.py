"""Imports every op family module so that each registers its ops. Add new families here."""

from .. import recurrent  # noqa: F401  (RecurrentNetwork lowers through the interpreter)
from . import (  # noqa: F401
    activation,
    compare,
    elementwise,
    fill,
    linear,
    norm,
    reduce,
    rnn_units,
    sequence,
    shape,
)
