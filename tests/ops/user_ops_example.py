"""A user's op module, as `rnn2jax --ops tests/user_ops_example.py ...` imports it (and the tests do).

ScaledTanh(X) = tanh(alpha * X), with its gradient op ScaledTanhGradient(X, dY) -> dX and a builder
gradient maker emitting it.
"""

import jax.numpy as jnp

import rnn2jax


@rnn2jax.register_op("ScaledTanh", inputs=1, outputs=1, gradient="ScaledTanhGradient")
def scaled_tanh(op):
    alpha = op.float("alpha", 1.0)
    return lambda x: jnp.tanh(alpha * x)


@rnn2jax.register_op("ScaledTanhGradient", inputs=2, outputs=1)
def scaled_tanh_gradient(op):
    alpha = op.float("alpha", 1.0)
    return lambda x, dy: dy * alpha * (1 - jnp.tanh(alpha * x) ** 2)
