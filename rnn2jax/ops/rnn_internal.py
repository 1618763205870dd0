"""RecurrentNetwork's internal ops (caffe2/operators/rnn/recurrent_network_op.h). Caffe2's RNN executor adds
them to step nets: `rnn_internal_apply_link` makes a link's window of an external blob at timestep t, and
`rnn_internal_accumulate_gradient_input` adds a timestep's output gradient into an input's gradient. rnn2jax
lowers RecurrentNetwork itself as a scan and never emits them, but a net saved with them (a step net dumped
from Caffe2's executor) runs: each is the same arithmetic on values, its in-place output the updated blob."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .facets import NO_EMITTER, NO_SHAPE_RULE, Absent, Roles
from .registry import Kernel, declare_family, register

declare_family(
    __name__,
    roles=Roles(integers=(0,)),  # the timestep
    shape_rule=NO_SHAPE_RULE,
    gradient=Absent("Caffe2 registers no gradient maker for it (an internal op of RecurrentNetwork)"),
    emitter=NO_EMITTER,
)

_F32 = np.dtype(np.float32)

runtime_checked("rnn_internal_accumulate_gradient_input", "rnn_internal_apply_link")


def _offset(op: Op, name: str) -> int:
    value = op.int(name, -1)
    if value < 0:
        raise BadArgumentError(f"{op.where}: {name} not set")
    return value


def _in_place(op: Op, output: int, input_: int) -> None:
    if op.outputs[output] != op.inputs[input_]:
        raise BadArgumentError(
            f"{op.where}: output {output} must be input '{op.inputs[input_]}' (Caffe2 updates it in place), "
            f"got '{op.outputs[output]}'"
        )


def _timestep(op: Op, t: jax.Array) -> jax.Array:
    if np.dtype(t.dtype) != np.dtype(np.int32) or t.size < 1:
        raise InputTypeError(
            f"{op.where}: timestep '{op.inputs[0]}' must be an int32 scalar, got {t.dtype}{list(t.shape)}"
        )
    return jnp.ravel(t)[0]


def _float(op: Op, index: int, x: jax.Array) -> None:
    if np.dtype(x.dtype) != _F32:
        raise InputTypeError(f"{op.where}: '{op.inputs[index]}' must be float32, got {x.dtype}")


@register("rnn_internal_accumulate_gradient_input", inputs=3, outputs=(1, None))
def accumulate_gradient_input(op: Op) -> Kernel:
    """(t, og, g) -> g with row t + `offset` (a timestep: g's elements over its dim 0) plus og's row t."""
    offset = _offset(op, "offset")
    _in_place(op, 0, 2)

    def kernel(t: jax.Array, og: jax.Array, g: jax.Array) -> jax.Array:
        step = _timestep(op, t)
        _float(op, 1, og)
        _float(op, 2, g)
        if g.ndim == 0 or g.shape[0] == 0:
            raise ShapeError(f"{op.where}: gradient '{op.inputs[2]}' has no timesteps (shape {list(g.shape)})")
        size = g.size // g.shape[0]
        enforce(
            ((step + offset) * size + size <= g.size) & (step * size + size <= og.size) & (step >= 0),
            f"{literal(op.where)}: Accumulation address out of bounds at timestep {{t}}",
            t=step,
        )
        source = jax.lax.dynamic_slice(jnp.ravel(og), (step * size,), (size,))
        flat = jnp.ravel(g)
        target = (step + offset) * size
        updated = jax.lax.dynamic_update_slice(
            flat, jax.lax.dynamic_slice(flat, (target,), (size,)) + source, (target,)
        )
        return updated.reshape(g.shape)

    return kernel


@register("rnn_internal_apply_link", inputs=2, outputs=2)
def apply_link(op: Op) -> Kernel:
    """(t, external) -> (internal, external): internal is `window` timesteps of external from t + `offset`
    (a view in Caffe2, a copy here); external passes through (Caffe2 lists it as an output to order the
    ops)."""
    offset, window = _offset(op, "offset"), _offset(op, "window")
    _in_place(op, 1, 1)

    def kernel(t: jax.Array, external: jax.Array) -> tuple[jax.Array, jax.Array]:
        step = _timestep(op, t)
        _float(op, 1, external)
        if external.size == 0:
            raise ShapeError(f"{op.where}: external '{op.inputs[1]}' is empty")
        enforce(
            (step >= 0) & (step + offset + window <= external.shape[0]),
            f"{literal(op.where)}: the window of {window} at timestep {{t}} + {offset} passes the end of "
            f"'{literal(op.inputs[1])}' ({external.shape[0]} timesteps)",
            t=step,
        )
        start = (step + offset, *(jnp.int32(0) for _ in external.shape[1:]))
        return jax.lax.dynamic_slice(external, start, (window, *external.shape[1:])), external

    return kernel
