"""`workspace.InferShapesAndTypes`: every blob's shape and type, by tracing the nets with `jax.eval_shape`.

Nothing runs: the nets are traced on the shapes and dtypes of the blobs they read (taken from the
workspace, or given). Blobs whose values decide shapes are read from the workspace. A net that cannot
be traced this way (a host op, a blob with no known shape) raises, which Caffe2 callers expect as
"no inference".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ...errors import MissingBlobError, Rnn2JaxError, ShapeError
from ...ir.dtypes import in_caffe2_dtypes
from ...ir.loader import load
from ...ir.netdef import DATA_TYPES
from ...lowering.interpreter import LoweredNet
from ...runtime.workspace import Workspace


@in_caffe2_dtypes
def infer_shapes_and_types(
    workspace: Workspace,
    nets: Sequence[Any],
    blob_dimensions: Mapping[str, Sequence[int]],
    blob_types: Mapping[str, int],
    enum_of_dtype: Mapping[np.dtype, int],
) -> tuple[dict[str, list[int]], dict[str, int]]:
    specs: dict[str, Any] = {}
    shapes: dict[str, list[int]] = {}
    types: dict[str, int] = {}
    for proto in nets:
        net = load(proto)
        lowered = LoweredNet(net)
        static = set(lowered.static_inputs())
        env: dict[str, Any] = {}
        concrete: dict[str, Any] = {}
        for name, reader in lowered.reads_before_writes().items():
            if name in specs:
                env[name] = specs[name]
            elif name in blob_dimensions:
                dtype = DATA_TYPES.get(blob_types.get(name, 1), np.float32)
                env[name] = jax.ShapeDtypeStruct(tuple(blob_dimensions[name]), dtype)
            elif workspace._has_value(name):
                value = workspace.get(name, reader)
                if not hasattr(value, "shape"):
                    raise ShapeError(f"{reader.where}: blob '{name}' is not a tensor")
                if name in static:
                    concrete[name] = np.asarray(value)
                else:
                    env[name] = jax.ShapeDtypeStruct(value.shape, value.dtype)
            else:
                raise MissingBlobError(f"{reader.where}: no shape known for blob '{name}'")
        try:
            out = jax.eval_shape(lambda e, c=concrete, f=lowered: f({**e, **c}, key=jax.random.key(0)), env)
        except Rnn2JaxError:
            raise
        except Exception as error:
            raise ShapeError(f"net '{net.name}': shapes cannot be inferred: {error}") from None
        out.update({k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in concrete.items()})
        specs.update(out)
    for name, spec in specs.items():
        if not isinstance(spec, jax.ShapeDtypeStruct):
            continue  # not a tensor (RecurrentNetwork's step_workspaces): Caffe2 infers nothing for it
        shapes[name] = [int(d) for d in spec.shape]
        enum = enum_of_dtype.get(np.dtype(spec.dtype))
        if enum is not None:
            types[name] = enum
    return shapes, types
