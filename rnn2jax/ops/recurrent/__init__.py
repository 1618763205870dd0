"""RecurrentNetwork and RecurrentNetworkGradient: the op family that carries whole nets.

`spec` decodes the op's arguments, `forward` lowers RecurrentNetwork to one `lax.scan`, `gradient` lowers
RecurrentNetworkGradient to a reverse scan over the backward step net (`backward_step` regenerates the one
Caffe2 makes, to recognise it), and `fusion` rewrites LSTM step nets for speed. The step nets are lowered by
the interpreter's function, handed to the builders as `lower=` (registry's `carries_nets`), so nothing here
imports the interpreter.
"""

from . import forward, gradient  # noqa: F401  (each registers its op)
