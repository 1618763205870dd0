"""Ops whose point in Caffe2 is memory or scheduling: they alias, coalesce or overwrite blobs in place
(AliasWithName, UnsafeCoalesce, CopyRowsToTensor) or only order other ops (AsyncNetBarrier). Here blobs are
values, so each computes the values its outputs hold right after it runs; later writes through one alias do
not show through the others (see each op).
Sources: caffe2/operators/alias_with_name.h, unsafe_coalesce.h, copy_rows_to_tensor_op.h,
async_net_barrier_op.h."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, literal, runtime_checked
from .facets import NO_EMITTER, NO_ROLES, NO_SHAPE_RULE, Absent, Roles
from .gradient_makers import should_not_do_gradient, single_gradient
from .registry import Kernel, declare_family, register
from .shape_facts import output_like_input

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=NO_SHAPE_RULE,
    gradient=Absent("Caffe2 registers no gradient maker for it"),
    emitter=NO_EMITTER,
)

_F32 = np.dtype(np.float32)
_COPY_TYPES = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64))


@register("AliasWithName", shape_rule=output_like_input)
def alias_with_name(op: Op) -> Kernel:
    """The input, under the output's name; `name` (required) and `is_backward` only label the alias."""
    if not op.has("name"):
        raise BadArgumentError(f"{op.where}: You have to specify argument name")
    op.str("name")
    op.bool("is_backward", False)
    return lambda x: x


@register("AsyncNetBarrier", inputs=(1, None), outputs=(1, None), gradient=should_not_do_gradient)
def async_net_barrier(op: Op) -> Kernel:
    """Nothing: Caffe2's async scheduler runs the ops before it first, and XLA orders by data alone. It writes no
    output, so each must be its input (in place, as Caffe2's schema allows); another output would be a blob the
    op leaves unset, which Caffe2 hands on uninitialized and rnn2jax refuses."""
    op.int("cross_device", 0)  # a device-placement hint for Caffe2's scheduler
    if tuple(op.outputs) != tuple(op.inputs):
        raise BadArgumentError(
            f"{op.where}: AsyncNetBarrier writes nothing, so its outputs must be its inputs in place: inputs "
            f"{list(op.inputs)}, outputs {list(op.outputs)}"
        )
    return lambda *xs: xs


def _coalesce_counts(op: Op) -> None:
    if len(op.outputs) != len(op.inputs) + 1:
        raise BadArgumentError(
            f"{op.where}: UnsafeCoalesce writes one output per input and the coalesced blob last: "
            f"{len(op.inputs)} inputs need {len(op.inputs) + 1} outputs, got {len(op.outputs)}"
        )


@register("UnsafeCoalesce", inputs=(0, None), outputs=(1, None))
def unsafe_coalesce(op: Op) -> Kernel:
    """Output i is input i; the last output is every input flattened and concatenated (float32 only). In
    Caffe2 outputs 0..n-1 are views into the last, so a later in-place update of one shows in it; here they
    are values: a net that relies on that aliasing sees the coalesced blob as of this op."""
    _coalesce_counts(op)

    def kernel(*xs: jax.Array) -> tuple[jax.Array, ...]:
        for i, x in enumerate(xs):
            if np.dtype(x.dtype) != _F32:
                raise InputTypeError(f"{op.where}: Must only coalesce float type, error at input '{op.inputs[i]}'")
        flat = jnp.concatenate([jnp.ravel(x) for x in xs]) if xs else jnp.zeros((0,), jnp.float32)
        return (*xs, flat)

    return kernel


runtime_checked("CopyRowsToTensor")


@register(
    "CopyRowsToTensor",
    inputs=3,
    gradient=single_gradient("CopyRowsToTensorGradient", "GO(0)"),
    shape_rule=output_like_input,
    roles=Roles(integers=(1,)),
)
def copy_rows_to_tensor(op: Op) -> Kernel:
    """INPUT_TENSOR [R, W] with the rows at INDICES (int64) replaced by ROW [W]. In place: the output must
    be the input blob, as Caffe2's schema requires."""
    if op.outputs[0] != op.inputs[0]:
        raise BadArgumentError(
            f"{op.where}: Input 0 and Output 0 should be alias ('{op.inputs[0]}' and '{op.outputs[0]}' differ)"
        )

    def kernel(x: jax.Array, indices: jax.Array, row: jax.Array) -> jax.Array:
        if np.dtype(x.dtype) not in _COPY_TYPES:
            raise InputTypeError(f"{op.where}: INPUT_TENSOR '{op.inputs[0]}' of type {x.dtype} is not supported")
        if np.dtype(indices.dtype) != np.dtype(np.int64):
            raise InputTypeError(f"{op.where}: INDICES '{op.inputs[1]}' must be int64, got {indices.dtype}")
        if np.dtype(row.dtype) != np.dtype(x.dtype):
            raise InputTypeError(f"{op.where}: ROW '{op.inputs[2]}' must be {x.dtype} as the tensor, got {row.dtype}")
        for name, value, rank in ((op.inputs[0], x, 2), (op.inputs[1], indices, 1), (op.inputs[2], row, 1)):
            if value.ndim != rank:
                raise ShapeError(f"{op.where}: '{name}' should be {rank}-d, got shape {list(value.shape)}")
        if row.shape[0] != x.shape[1]:
            raise ShapeError(
                f"{op.where}: width of input tensor should match lengths of row ('{op.inputs[0]}' is "
                f"{x.shape[1]} wide, row '{op.inputs[2]}' has {row.shape[0]})"
            )
        if indices.size:
            bad = (indices < 0) | (indices >= x.shape[0])
            enforce(
                ~jnp.any(bad),
                f"{literal(op.where)}: INDICES '{literal(op.inputs[1])}' holds {{index}}, outside the "
                f"{x.shape[0]} rows of '{literal(op.inputs[0])}'",
                index=indices[jnp.argmax(bad)],
            )
        hit = jnp.zeros(x.shape[0], bool).at[jnp.clip(indices, 0, max(x.shape[0] - 1, 0))].set(True)
        return jnp.where(hit[:, None], row[None, :], x)

    return kernel


@register("CopyRowsToTensorGradient", gradient=Absent("a gradient op: Caffe2 registers no gradient for it"))
def copy_rows_to_tensor_gradient(op: Op) -> Kernel:
    """dY passed through as dX. Caffe2's kernel copies only dim 0's count of elements, which is all of them
    when it runs in place (as its maker emits it: GO(0) and GI(0) are one blob); out of place it leaves the
    rest unset, where this gives all of dY."""

    def kernel(dy: jax.Array) -> jax.Array:
        if np.dtype(dy.dtype) not in _COPY_TYPES:
            raise InputTypeError(f"{op.where}: '{op.inputs[0]}' of type {dy.dtype} is not supported")
        return dy

    return kernel
