"""`recurrent_net`: Caffe2's `recurrent.recurrent_net`, which wraps a step net into a RecurrentNetwork op.

It adds one op to the main net: inputs (sequence, initial states, then every other external input of
the step net, the "references"), outputs (`<state output>_all`, `_last` per state, then
`<scope>/step_workspaces`) and the arguments of section 2.3 of SEMANTICS.md. Unless `forward_only`,
it also builds the backward step net B from the step net's gradient (ops/backward_pass.py), section 2.10:
recomputed ops first, then gradient ops; B's external inputs are the forward scratches B reads, the
state-output gradients, the step net's external inputs and outputs; then the `_accum` rewrite makes
B's writes to an externally provided gradient add to it rather than overwrite it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...ops.recurrent.backward_step import State, backward_step
from ...proto import caffe2_pb2 as pb
from .core import BlobReference, CreateOperator, Net
from .scope import CurrentDeviceScope


def recurrent_net(
    net: Net,
    cell_net: Net | pb.NetDef,
    inputs: Sequence[tuple[str, str]],
    initial_cell_inputs: Sequence[tuple[str, str]],
    links: Mapping[str, str],
    timestep: str | None = None,
    scope: str | None = None,
    outputs_with_grads: Sequence[int] = (0,),
    recompute_blobs_on_backward: Iterable[str] | None = None,
    forward_only: bool = False,
) -> list[BlobReference]:
    """Add a RecurrentNetwork op running `cell_net` over `inputs` to `net`; returns its outputs
    (`<output>_all`, `<output>_last` per state) without the trailing step-workspaces blob.

    inputs: `[(input_t, sequence)]` (exactly one); initial_cell_inputs: `[(state_prev, initial)]`;
    links: state_prev -> the step-net blob holding the next value of that state; timestep: the step
    net's timestep blob; scope: prefix of the states blobs (default `<net>/recurrent`).
    `cell_net` may be a `Net` or a bare `NetDef` (its external inputs/outputs must be filled in).
    """
    if len(inputs) != 1:
        raise ValueError("Only one input blob is supported so far")
    op_name = net.NextName("recurrent")

    def s(name: str) -> str:
        return f"{op_name if scope is None else scope}/{name}"

    cell = cell_net.Proto() if isinstance(cell_net, Net) else cell_net
    known = [str(i[0]) for i in inputs] + [str(x[1]) for x in initial_cell_inputs]
    known += [str(x[0]) for x in initial_cell_inputs]
    if timestep is not None:
        known.append(str(timestep))
    references = [BlobReference(b) for b in cell.external_input if b not in known]

    all_inputs = [i[1] for i in inputs] + [x[1] for x in initial_cell_inputs] + references
    all_outputs: list[str] = []
    cell.type = "simple"
    forward_links, aliases, states = [], [], []
    for cell_input, _ in initial_cell_inputs:
        cell_input = str(cell_input)
        state = s(cell_input + "_states")
        cell_output = links[cell_input]
        forward_links += [(cell_input, state, 0), (cell_output, state, 1)]
        aliases += [(state, cell_output + "_all", 1), (state, cell_output + "_last", -1)]
        all_outputs += [cell_output + "_all", cell_output + "_last"]
        states.append(State(cell_input, str(cell_output), state))
    for input_t, input_blob in inputs:
        forward_links.append((str(input_t), str(input_blob), 0))

    backward_args: dict[str, Any] = {}
    if not forward_only:
        recompute = list(dict.fromkeys(str(b) for b in recompute_blobs_on_backward or ()))
        ((input_t, input_blob),) = inputs
        made = backward_step(
            cell, str(input_t), str(input_blob), states, [str(r) for r in references], recompute,
            CurrentDeviceScope(),
        )  # fmt: skip
        backward = Net("RecurrentBackwardStep")
        backward_args = {
            "param": [all_inputs.index(p) for p in made.params],
            "backward_link_internal": [link[0] for link in made.links],
            "backward_link_external": [link[1] for link in made.links],
            "backward_link_offset": [link[2] for link in made.links],
            "outputs_with_grads": list(outputs_with_grads),
            "recompute_blobs_on_backward": recompute,
            "param_grads": list(made.param_grads),
        }
        if made.net.op:
            backward.Proto().MergeFrom(made.net)
            backward_args["backward_step_net"] = backward.Proto()

    results = net._CreateAndAddToSelf(
        "RecurrentNetwork",
        all_inputs,
        [*all_outputs, s("step_workspaces")],
        alias_src=[a[0] for a in aliases],
        alias_dst=[str(a[1]) for a in aliases],
        alias_offset=[a[2] for a in aliases],
        recurrent_states=[state.name for state in states],
        initial_recurrent_state_ids=[all_inputs.index(str(x[1])) for x in initial_cell_inputs],
        link_internal=[str(link[0]) for link in forward_links],
        link_external=[str(link[1]) for link in forward_links],
        link_offset=[link[2] for link in forward_links],
        enable_rnn_executor=1,
        step_net=cell,
        timestep="timestep" if timestep is None else str(timestep),
        **backward_args,
    )
    return list(results[:-1])


def retrieve_step_blobs(net: Net, prefix: str = "rnn") -> list[bytes]:
    """Copy every step's blobs of each RecurrentNetwork op of `net` (run in the current workspace) into the
    workspace as `<prefix>_<blob><t>`, through the RecurrentNetworkBlobFetcher op (written `<prefix>_<k>`
    for the k-th op); returns the copied names, as bytes (Caffe2 did the same)."""
    from . import workspace

    names: list[bytes] = []
    count = 0
    for op in net.Proto().op:
        if op.type != "RecurrentNetwork":
            continue
        count += 1
        fetched = f"{prefix}_{count}"
        workspace.RunOperatorOnce(
            CreateOperator("RecurrentNetworkBlobFetcher", [op.output[-1]], [fetched], prefix=prefix)
        )
        names += workspace.FetchBlob(fetched).tolist()
    return names
