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

from .errors import ShapeError


def default_batch_axis(value: Any) -> int | None:
    """Caffe2's layouts: sequences are [T, N, ...] (batch at axis 1), everything else [N, ...];
    scalars and 1-element tensors (timestep-like) are replicated."""
    ndim = getattr(value, "ndim", 0)
    if ndim == 0:
        return None
    return 1 if ndim >= 3 else 0


def shard_inputs(
    mesh: Mesh, inputs: Mapping[str, Any], batch_axes: Mapping[str, int | None], where: str
) -> dict[str, jax.Array]:
    """Place each input with its batch axis split over all of the mesh's axes."""
    devices = mesh.devices.size
    placed = {}
    for name, value in inputs.items():
        axis = batch_axes.get(name, default_batch_axis(value))
        if axis is None:
            placed[name] = jax.device_put(value, NamedSharding(mesh, PartitionSpec()))
            continue
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


def replicate(mesh: Mesh, params: Mapping[str, Any]) -> dict[str, jax.Array]:
    return {name: jax.device_put(value, NamedSharding(mesh, PartitionSpec())) for name, value in params.items()}
