"""Data parallelism: the batch dimension of every input split over the devices of a `jax.sharding.Mesh`,
parameters replicated. XLA then runs the same program on every device (or host, with
`jax.distributed`), each on its slice of the batch; RNN steps never mix batch rows, so no device
waits for another inside the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..errors import InputTypeError, ShapeError


def default_batch_axis(value: Any) -> int | None:
    """Caffe2's layouts: sequences are [T, N, ...] (batch at axis 1), everything else [N, ...];
    scalars and 1-element tensors (timestep-like) are replicated."""
    ndim = getattr(value, "ndim", 0)
    if ndim == 0:
        return None
    return 1 if ndim >= 3 else 0


def check_mesh(mesh: Any, where: str) -> Mesh:
    """`mesh=` must be a `jax.sharding.Mesh` (not a device list or a name)."""
    if not isinstance(mesh, Mesh):
        raise InputTypeError(f"{where}: mesh= must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    return mesh


def check_batch_axes(batch_axes: Any, where: str) -> dict[str, int | None]:
    """`batch_axes=` maps input names to an axis (an int) or None (replicated)."""
    if batch_axes is None:
        return {}
    if not isinstance(batch_axes, Mapping):
        raise InputTypeError(f"{where}: batch_axes= must be a mapping of input name to axis, got "
                             f"{type(batch_axes).__name__}")  # fmt: skip
    for name, axis in batch_axes.items():
        if not isinstance(name, str) or not (axis is None or (isinstance(axis, int) and not isinstance(axis, bool))):
            raise InputTypeError(f"{where}: batch_axes= maps {name!r} to {axis!r}; expected a blob name and an "
                                 "int axis or None")  # fmt: skip
    return dict(batch_axes)


def shard_inputs(
    mesh: Mesh, inputs: Mapping[str, Any], batch_axes: Mapping[str, int | None], where: str
) -> dict[str, jax.Array]:
    """Place each input with its batch axis split over all of the mesh's axes."""
    devices = check_mesh(mesh, where).devices.size
    batch_axes = check_batch_axes(batch_axes, where)
    placed = {}
    for name, value in inputs.items():
        axis = batch_axes.get(name, default_batch_axis(value))
        if axis is None:
            placed[name] = jax.device_put(value, NamedSharding(mesh, PartitionSpec()))
            continue
        ndim = getattr(value, "ndim", 0)
        if not -ndim <= axis < ndim:
            raise ShapeError(
                f"{where}: batch_axes= gives input '{name}' axis {axis}, but it has {ndim} dimensions "
                f"(shape {list(getattr(value, 'shape', ()))})"
            )
        size = value.shape[axis]
        if size % devices:
            raise ShapeError(
                f"{where}: input '{name}' has batch size {size} (axis {axis}), which {devices} devices cannot "
                f"split evenly; pad the batch, or give batch_axes={{'{name}': None}} to replicate it"
            )
        spec = [None] * value.ndim
        spec[axis] = mesh.axis_names
        placed[name] = jax.device_put(value, NamedSharding(mesh, PartitionSpec(*spec)))
    return placed


def replicate(mesh: Mesh, params: Mapping[str, Any], where: str = "compile") -> dict[str, jax.Array]:
    check_mesh(mesh, where)
    return {name: jax.device_put(value, NamedSharding(mesh, PartitionSpec())) for name, value in params.items()}
