"""InferenceLSTM (caffe2/operators/inference_lstm_op.cc): a stacked, optionally bidirectional LSTM in one
op, with PyTorch's parameter layout (w_ih [4H, I], w_hh [4H, H], b_ih, b_hh per layer and direction;
gates i, f, g, o). Each layer and direction is one `lax.scan` over the steps.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import ShapeError
from ..ir.netdef import Op
from .common import matmul_precision
from .facets import NO_EMITTER, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import no_gradient
from .registry import Kernel, declare_family, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=no_gradient, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)


def _shape_text(x: Any) -> str:
    return f"{np.dtype(x.dtype)}{list(np.shape(x))}"


def _linear(x: jax.Array, w: jax.Array, b: jax.Array | None) -> jax.Array:
    y = jnp.matmul(x, w.T, precision=matmul_precision())
    return y if b is None else y + b


def _direction(xs: jax.Array, h: jax.Array, c: jax.Array, params: tuple[Any, ...], reverse: bool):
    """One layer in one direction over xs [T, B, I]: (outputs [T, B, H], final h, final c)."""
    w_ih, w_hh, *biases = params
    b_ih, b_hh = biases if biases else (None, None)
    projected = _linear(xs, w_ih, b_ih)  # every step's input projection at once

    def step(carry, x_proj):
        h, c = carry
        gates = x_proj + _linear(h, w_hh, b_hh)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h, c), outputs = lax.scan(step, (h, c), projected, reverse=reverse)
    return outputs, h, c


@register("InferenceLSTM", inputs=(1, None), outputs=3)
def inference_lstm(op: Op) -> Kernel:
    """(input [T, B, I] (batch_first: [B, T, I]), hx, cx [layers * directions, B, H], parameters...) ->
    (output [T, B, directions * H], hy, cy): `num_layers` (1) layers, `bidirectional` (false) ones
    concatenating the forward and the reversed pass, `has_biases` (true) saying whether each cell's
    parameters are (w_ih, w_hh, b_ih, b_hh) or (w_ih, w_hh)."""
    layers = op.int("num_layers", 1)
    bidirectional = op.bool("bidirectional", False)
    has_biases = op.bool("has_biases", True)
    batch_first = op.bool("batch_first", False)
    per_cell = 4 if has_biases else 2
    directions = 2 if bidirectional else 1

    def kernel(x, hx=None, cx=None, *params):
        if hx is None or cx is None:
            raise ShapeError(f"{op.where}: InferenceLSTM needs the input, hidden and cell state inputs")
        for i, value in enumerate((x, hx, cx, *params)):
            if np.dtype(value.dtype) != _F32:
                raise ShapeError(f"{op.where}: input '{op.inputs[i]}' must be float32, got {_shape_text(value)}")
        if len(params) % per_cell:
            raise ShapeError(f"{op.where}: got an incorrect number of LSTM parameters ({len(params)})")
        cells = [params[i : i + per_cell] for i in range(0, len(params), per_cell)]
        if len(cells) != layers * directions or hx.ndim != 3 or hx.shape[0] != layers * directions:
            raise ShapeError(
                f"{op.where}: {layers} layer(s){' x 2 directions' if bidirectional else ''} need as many parameter "
                f"sets and states, got {len(cells)} and {_shape_text(hx)}"
            )
        if cx.shape != hx.shape:
            raise ShapeError(f"{op.where}: cell state {_shape_text(cx)} differs from hidden state {_shape_text(hx)}")
        if x.ndim != 3:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' must be 3-D, got {_shape_text(x)}")
        xs = jnp.swapaxes(x, 0, 1) if batch_first else x
        hidden = hx.shape[2]
        for index, cell in enumerate(cells):
            expected = (4 * hidden, None), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,)
            for j, (value, shape) in enumerate(zip(cell, expected, strict=False)):
                if value.ndim != len(shape) or any(
                    s is not None and d != s for d, s in zip(value.shape, shape, strict=True)
                ):
                    name = op.inputs[3 + index * per_cell + j]
                    raise ShapeError(f"{op.where}: LSTM parameter '{name}' has shape {_shape_text(value)}")
        hy, cy = [], []
        for layer in range(layers):
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                if cells[k][0].shape[1] != xs.shape[-1]:
                    raise ShapeError(
                        f"{op.where}: w_ih '{op.inputs[3 + k * per_cell]}' {_shape_text(cells[k][0])} for inputs of "
                        f"{xs.shape[-1]} features"
                    )
                out, h, c = _direction(xs, hx[k], cx[k], cells[k], reverse=direction == 1)
                outputs.append(out)
                hy.append(h)
                cy.append(c)
            xs = jnp.concatenate(outputs, axis=-1) if bidirectional else outputs[0]
        output = jnp.swapaxes(xs, 0, 1) if batch_first else xs
        return output, jnp.stack(hy), jnp.stack(cy)

    return kernel
