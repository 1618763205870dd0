"""Builder gradient makers, one module per op family (each registers its makers on import).

`rnn2jax.caffe2` imports this package, so every maker is registered before any gradient is built.
The base machinery (`GradientContext`, `register_gradient`, `gradient_op`) is in `..grad_makers`.
"""

from . import (  # noqa: F401
    activation,
    array,
    conv,
    embedding,
    loss,
    math,
    reduce,
    segment,
    sparse,
)
