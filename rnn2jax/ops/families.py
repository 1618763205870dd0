"""Imports every op family module so that each registers its ops. Add new families here."""

from .. import recurrent, recurrent_grad  # noqa: F401  (RecurrentNetwork[Gradient] lower through the interpreter)
from . import (  # noqa: F401
    activation,
    array,
    compare,
    conv,
    elementwise,
    fill,
    image,
    linear,
    loss,
    math,
    norm,
    optimizer,
    pool,
    reduce,
    rnn_units,
    segment,
    sequence,
    sequence_packing,
    shape,
    sparse,
)
