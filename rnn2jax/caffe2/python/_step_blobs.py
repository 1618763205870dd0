"""`RecurrentNetworkBlobFetcher`: the blobs of each step of a RecurrentNetwork, as Caffe2's step workspaces
held them, copied into the current workspace (what `recurrent.retrieve_step_blobs` calls).

Caffe2 kept a workspace per step; rnn2jax's scan keeps only what the backward pass needs. So the fetcher
recomputes step t: it runs the op's step net on the link views of step t (rows of the recurrent states
kept in `step_workspaces`, or of the op's input blobs), the timestep and the blobs of the workspace, and
writes `<prefix>_<blob><t>` for every link blob, step-net output and the timestep blob. Its output is the
1-D string tensor of those names. The op is found among the nets created in the workspace (the one whose
RecurrentNetwork writes the step_workspaces blob); random ops in the step net draw new values.
Caffe2 named the timestep blob `timestep_rnnexec_t<t>` when its RNN executor ran; here it is the op's
`timestep` name, as in Caffe2 without the executor. Names are in step order, not Caffe2's hash order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ...errors import BadArgumentError, ShapeError
from ...ir.netdef import Op
from ...lowering.interpreter import LoweredNet
from ...ops.facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, Absent
from ...ops.recurrent.spec import decode_spec
from ...ops.registry import declare_family, find_host, register_host_op

if TYPE_CHECKING:
    from ...runtime.workspace import Workspace


def _producer(workspace: Workspace, blob: str) -> Op | None:
    """The RecurrentNetwork op of a net created in `workspace` (or a parent) whose last output is `blob`."""
    ws: Any = workspace
    while ws is not None:
        for executor in ws._nets.values():
            for op in executor.ops:
                if op.type == "RecurrentNetwork" and op.outputs and op.outputs[-1] == blob:
                    return op
        ws = getattr(ws, "_parent", None)
    return None


def _fetch_step_blobs(workspace: Workspace, op: Op, state: dict[str, Any]) -> None:
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: RecurrentNetworkBlobFetcher takes one input and one output")
    prefix = op.str("prefix", "rnn")
    blob = op.inputs[0]
    workspaces = workspace.get(blob, op)
    if not isinstance(workspaces, Mapping) or "states" not in workspaces:
        raise ShapeError(f"{op.where}: input '{blob}' is not the step_workspaces of a RecurrentNetwork op")
    rnn = _producer(workspace, blob)
    if rnn is None:
        raise BadArgumentError(
            f"{op.where}: no RecurrentNetwork op writing '{blob}' in a net created in this workspace "
            "(rnn2jax recomputes the steps from the op: create the net with CreateNet, then run it)"
        )
    spec = decode_spec(rnn)
    states = workspaces["states"]
    step = LoweredNet(spec.step_net)
    steps = int(np.shape(workspace.get(rnn.inputs[0], rnn))[0])
    written = [name for o in spec.step_net.ops for name in o.outputs]
    names: list[str] = []
    for t in range(steps):
        env: dict[str, Any] = {spec.timestep: np.array([t], np.int32)}
        for link in spec.links:
            source = states[link.external] if link.external in states else workspace.get(link.external, rnn)
            env[link.internal] = source[t + link.offset : t + link.offset + link.window]
        for name in step.reads_before_writes():
            if name not in env:
                env[name] = workspaces["shared"][name] if name in workspaces["shared"] else workspace.get(name, rnn)
        env = step(env, key=jax.random.key(t))
        for name in dict.fromkeys([*written, *(link.internal for link in spec.links), spec.timestep]):
            target = f"{prefix}_{name}{t}"
            workspace.put(target, np.array(env[name]))
            names.append(target)
    workspace.put(op.outputs[0], np.array([n.encode() for n in names], dtype=object))


declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=Absent("no builder gradient maker"),
    emitter=HOST_OP_NO_EMITTER,
)
if find_host("RecurrentNetworkBlobFetcher") is None:
    register_host_op("RecurrentNetworkBlobFetcher", _fetch_step_blobs)
