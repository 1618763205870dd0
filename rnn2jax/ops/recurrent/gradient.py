"""RecurrentNetworkGradient -> a reverse `jax.lax.scan` over the hand-built backward step net.

Caffe2's gradient op (SEMANTICS.md 2.7-2.9) runs `backward_step_net` once per step, from T-1 down to 0,
in step t's forward workspace. Before it runs, link ops make each forward link's internal blob a view of
the forward state tensors (so the backward net reads h_{t-1}, h_t, x_t ...) and each backward link's
internal blob a view of the matching state-gradient tensor `S_grad` (rows t and t+1), and the gradient of
every `_all` output at step t is added into `S_grad[t+1]`. What the backward net writes through those
views lands in `S_grad` (and, for the input link, in the input sequence's gradient). Per-step parameter
gradients (`param_grads`) are summed over steps. The gradient of the `_last` output is added to the last
row of `S_grad` before the loop; initial-state gradients are its first rows afterwards (summed over the
batch for a 1-D initial state).

This runs the backward net exactly as written, so a wrong backward net gives wrong gradients here, just
as it did in Caffe2: that is what `rnn2jax.verify` compares against `jax.vjp` of the forward scan.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ...errors import BadArgumentError, MissingBlobError, ShapeError
from ...netdef import Op
from ..registry import LowerNet, register
from .forward import StateViews, rows_at
from .spec import check_link_rows, check_timestep, decode_links, decode_spec, remapped_name


@dataclass(frozen=True)
class ParamGrad:
    input_index: int  # index of the parameter among the forward op's inputs
    blob: str  # the per-step gradient blob the backward step net writes (Caffe2 renamed it `*_tmpstep`)


class RecurrentGradientLowering:
    """Lowers one RecurrentNetworkGradient op (whose arguments are the forward op's, plus its own)."""

    def __init__(self, op: Op, lower: LowerNet):
        self.op = op
        self.spec = spec = decode_spec(op)
        if spec.backward_step_net is None:
            raise BadArgumentError(f"{op.where}: RecurrentNetworkGradient needs a backward_step_net argument")
        self.backward = lower(spec.backward_step_net)
        self.outputs_with_grads = op.ints("outputs_with_grads")
        num_go = len(self.outputs_with_grads)
        num_forward_outputs = len(spec.aliases) + 1  # the aliases, then step_workspaces
        self.num_forward_inputs = len(op.inputs) - num_go - num_forward_outputs
        if self.num_forward_inputs < 1:
            raise BadArgumentError(
                f"{op.where}: expected {num_go} output gradients, the forward inputs and "
                f"{num_forward_outputs} forward outputs as inputs, got {len(op.inputs)} inputs"
            )
        self.forward_inputs = op.inputs[num_go : num_go + self.num_forward_inputs]
        self.backward_links = decode_links(op, "backward_")
        self.state_grads = {s: remapped_name(op, s + "_grad") for s in spec.states}
        self.input_grad = remapped_name(op, self.forward_inputs[0] + "_grad")
        known = {*self.state_grads.values(), self.input_grad}
        for link in self.backward_links:
            if link.external not in known:
                raise BadArgumentError(
                    f"{op.where}: argument 'backward_link_external' names '{link.external}' (for "
                    f"'{link.internal}'), which is not a gradient the op makes: {', '.join(sorted(known))}"
                )
        check_timestep(op, spec.timestep, spec.backward_step_net, self.backward_links, "backward_step_net")
        self.params = self._params()
        # Blobs the backward step net reads from enclosing scopes; what the forward step wrote comes
        # from step_workspaces instead.
        local = {link.internal for link in (*spec.links, *self.backward_links)} | {spec.timestep}
        local |= {name for o in spec.step_net.ops for name in o.outputs}
        self.scope_reads = tuple(n for n in self.backward.inputs if n not in local)
        self.all_grads, self.last_grads = self._output_grads()
        expected_outputs = 1 + len(self.params) + len(spec.states)
        if len(op.outputs) != expected_outputs:
            raise BadArgumentError(
                f"{op.where}: expected {expected_outputs} outputs (input gradient, {len(self.params)} "
                f"parameter gradients, {len(spec.states)} initial-state gradients), got {len(op.outputs)}"
            )

    def _params(self) -> tuple[ParamGrad, ...]:
        op = self.op
        indices = op.ints("param", ())
        names = op.strings("param_grads", ()) or op.outputs[1 : 1 + len(indices)]
        if len(names) != len(indices):
            raise BadArgumentError(
                f"{op.where}: arguments 'param' ({len(indices)}) and 'param_grads' ({len(names)}) must have "
                "equal lengths"
            )
        for index in indices:
            if not 0 <= index < self.num_forward_inputs:
                raise BadArgumentError(
                    f"{op.where}: argument 'param' names forward input #{index}, but the op has "
                    f"{self.num_forward_inputs} forward inputs"
                )
        # A per-step gradient no backward op writes: Caffe2 refuses ("non-existing input blob:
        # ..._tmpstep"); rnn2jax gives a zero gradient, so that `verify` reports the forgotten gradient.
        return tuple(ParamGrad(i, remapped_name(op, n)) for i, n in zip(indices, names, strict=True))

    def _output_grads(self) -> tuple[dict[str, int], dict[str, int]]:
        """Which op input holds the gradient of each state's `_all` (offset 1) and `_last` (offset -1)."""
        all_grads: dict[str, int] = {}
        last_grads: dict[str, int] = {}
        for j, alias in enumerate(self.spec.aliases):
            if j not in self.outputs_with_grads:
                continue
            k = self.outputs_with_grads.index(j)
            if alias.src not in self.spec.states or alias.offset not in (1, -1):
                raise BadArgumentError(
                    f"{self.op.where}: output #{j} ('{alias.dst}') gets a gradient, but only aliases of a "
                    f"recurrent state at offset 1 or -1 can (arguments 'alias_src' '{alias.src}', "
                    f"'alias_offset' {alias.offset})"
                )
            (all_grads if alias.offset == 1 else last_grads)[alias.src] = k
        return all_grads, last_grads

    # -- running -------------------------------------------------------------------------------

    def _steps_of(self, go: jax.Array, k: int, steps: int) -> jax.Array:
        """The rows of an `_all` output's gradient that step t adds into `S_grad[t + 1]`: rows [0, T).
        Caffe2's accumulate op reads row t of the gradient for t < T only, so when the `_all` output
        has more rows (an initial state of L > 1 rows makes it T + L - 1 long) the rest is ignored;
        fewer rows than T is its "source address out of bounds" refusal."""
        if go.ndim < 1 or go.shape[0] < steps:
            raise ShapeError(
                f"{self.op.where}: gradient '{self.op.inputs[k]}' {list(go.shape)} has fewer than the "
                f"{steps} steps of the sequence"
            )
        return go[:steps]

    def __call__(self, *inputs: Any, scope: Mapping[str, Any]) -> tuple:
        op, spec = self.op, self.spec
        num_go = len(self.outputs_with_grads)
        forward = dict(zip(self.forward_inputs, inputs[num_go : num_go + self.num_forward_inputs], strict=True))
        workspaces = inputs[-1]
        if not isinstance(workspaces, Mapping) or "states" not in workspaces:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[-1]}' is not the step_workspaces of a RecurrentNetwork op "
                "that has a backward_step_net"
            )
        sequence = forward[self.forward_inputs[0]]
        steps = sequence.shape[0]
        states = workspaces["states"]
        # Gradient tensors the backward links view: one per state (only its last row starts at zero in
        # Caffe2; the others are written before they are read), and the input sequence's gradient.
        grads = {self.state_grads[s]: jnp.zeros_like(states[s]) for s in spec.states}
        grads[self.input_grad] = jnp.zeros_like(sequence)
        for s, k in self.last_grads.items():
            g = self.state_grads[s]
            grads[g] = grads[g].at[-1].add(jnp.reshape(inputs[k], grads[g].shape[1:]))
        outer = ChainMap({}, workspaces["shared"], forward, scope)
        for link in spec.links:
            if link.external not in states and link.external not in outer:
                raise MissingBlobError(
                    f"{op.where}: argument 'link_external' names '{link.external}' (for '{link.internal}'), "
                    f"which is neither a recurrent state ({', '.join(spec.states)}) nor a blob defined before the op"
                )
            source = states[link.external] if link.external in states else outer[link.external]
            check_link_rows(op, link, source.shape[0], steps)
        for link in self.backward_links:
            check_link_rows(op, link, grads[link.external].shape[0], steps, "backward_")
        accumulators = [jnp.zeros_like(forward[self.forward_inputs[p.input_index]]) for p in self.params]
        per_step = {
            "t": jnp.arange(steps, dtype=jnp.int32),
            "scratch": workspaces["per_step"],
            "all_grads": {self.state_grads[s]: self._steps_of(inputs[k], k, steps) for s, k in self.all_grads.items()},
        }

        def body(carry, xs):
            grads, accumulators = dict(carry[0]), list(carry[1])
            t = xs["t"]
            for g, go in xs["all_grads"].items():  # rnn_internal_accumulate_gradient_input, offset 1
                row = rows_at(grads[g], t + 1, 1) + go[None].astype(grads[g].dtype)
                grads[g] = lax.dynamic_update_slice_in_dim(grads[g], row, t + 1, axis=0)
            env = ChainMap({}, {spec.timestep: jnp.reshape(t, (1,)), **xs["scratch"]}, outer)
            for link in spec.links:  # forward links: views of the forward pass's tensors
                source = states[link.external] if link.external in states else outer[link.external]
                env[link.internal] = rows_at(source, t + link.offset, link.window)
            views = StateViews(env, grads, self.backward_links, t, self.op)
            self.backward.run(env, after_op=views.write_back)
            for i, p in enumerate(self.params):
                if p.blob in env.maps[0]:
                    accumulators[i] = accumulators[i] + jnp.reshape(env[p.blob], accumulators[i].shape)
            return (views.buffers, accumulators), None

        if steps:
            (grads, accumulators), _ = lax.scan(body, (grads, accumulators), per_step, reverse=True)
        input_grad = grads[self.input_grad]
        results = [input_grad, *accumulators]
        for s, index in zip(spec.states, spec.initial_ids, strict=True):
            results.append(_initial_gradient(grads[self.state_grads[s]], forward[self.forward_inputs[index]]))
        return tuple(results)


def _initial_gradient(state_grad: jax.Array, initial: jax.Array) -> jax.Array:
    """Rows [0, L) of the state gradient shaped like the initial state; a 1-D initial state (copied to
    every batch row) gets the sum over the batch."""
    if initial.ndim == 1:
        return state_grad[0].sum(axis=0)
    rows = initial.shape[0] if initial.ndim == 3 else 1
    return jnp.reshape(state_grad[:rows], initial.shape)


@register("RecurrentNetworkGradient", inputs=(1, None), outputs=(1, None), scoped=True, carries_nets=True)
def recurrent_network_gradient(op: Op, lower: LowerNet) -> RecurrentGradientLowering:
    return RecurrentGradientLowering(op, lower)
