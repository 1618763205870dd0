"""Imports every op family module so that each registers its ops. Add new families here."""

from .. import recurrent, recurrent_grad  # noqa: F401  (RecurrentNetwork[Gradient] lower through the interpreter)
from . import (  # noqa: F401
    activation,
    compare,
    elementwise,
    fill,
    linear,
    loss,
    norm,
    optimizer,
    reduce,
    rnn_units,
    sequence,
    sequence_packing,
    shape,
)
