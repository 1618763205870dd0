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

This runs the backward net as written, so a wrong backward net gives wrong gradients here, just as it
did in Caffe2: that is what `rnn2jax.verify` compares against `jax.vjp` of the forward scan.

One exception, on CPU: when the step net is a recognised LSTM stack (cell_vjp.recognise: Caffe2's
`FC -> Sum -> LSTMUnit` cells) and the op's backward step net, backward links, `param` and `param_grads`
are exactly what Caffe2's `recurrent_net` generates from that step net (regenerated here from the op's
own step net by backward_step.py and compared op by op: type, inputs, outputs, arguments), the reverse
loop runs on the native LSTM backward kernel, as the custom VJP's does, and the weight gradients are one
GEMM each after it (`native_plan`, `_native_backward`). That is safe because such a backward net is then
known to compute the stack's VJP (Caffe2's own gradient of that step net, which the tests check against
real Caffe2 and JAX for every LSTMUnit option), with the op's `_all` and `_last` output gradients as the
cotangents; it reads the same forward blobs (the states and the Sums' pre-activations the forward kept).
Any other backward net, a hand-edited one above all, is not the recognised case and runs op by op: a
wrong one keeps giving its wrong gradients. Other platforms (`lax.platform_dependent`), other dtypes,
small steps (`rnn2jax.native.recurrence_eligible`), `lower(net, plain=True)` and T = 0 run the scan too.
"""

from __future__ import annotations

import math
from collections import ChainMap, Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import BadArgumentError, MissingBlobError, ShapeError
from ...ir.netdef import Op, decode_net
from ...native import recurrence_eligible
from ..facets import GRADIENT_OP, NO_ROLES, NO_SHAPE_RULE, Absent
from ..registry import LowerNet, declare_family, register
from .backward_step import State, backward_step, expected_links, net_proto, references_of, same_net
from .cell_vjp import LSTMStack, _shapes_fit, native_stack_backward, recognise
from .coverage import check_backward_reads, check_gradient_rows, unwritten_fill
from .deferred import NOTHING_DEFERRED, find_deferred
from .forward import StateViews, rows_at
from .spec import check_link_rows, check_timestep, decode_links, decode_spec, remapped_name

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=NO_SHAPE_RULE,
    gradient=GRADIENT_OP,
    emitter=Absent("a gradient op: the generated module is differentiated with jax.grad"),
)


@dataclass(frozen=True)
class ParamGrad:
    input_index: int  # index of the parameter among the forward op's inputs
    blob: str  # the per-step gradient blob the backward step net writes (Caffe2 renamed it `*_tmpstep`)


@dataclass(frozen=True)
class CompactLinks:
    """Backward link internals of the compact form, by state-gradient tensor."""

    reads: dict[str, str]  # row t + 1, read
    writes: dict[str, str]  # row t, written
    input: str | None  # the input sequence's gradient, row t


@dataclass(frozen=True)
class NativePlan:
    """A backward step net found to be Caffe2's own for a recognised LSTM stack (`_native_plan`)."""

    stack: LSTMStack
    states: dict[str, tuple[int, str]]  # recurrent state -> (layer, "h" or "c")
    params: tuple[tuple[tuple[str, int], ...], ...]  # per ParamGrad: its (slot, layer) uses in the stack


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
        for state, index in zip(spec.states, spec.initial_ids, strict=True):
            if index >= self.num_forward_inputs:  # Caffe2 reads input(index + num_go): past the forward inputs
                raise BadArgumentError(
                    f"{op.where}: argument 'initial_recurrent_state_ids' names forward input #{index} for state "
                    f"'{state}', but the op has {self.num_forward_inputs} forward inputs (after "
                    f"{num_go} output gradients, one per 'outputs_with_grads' entry)"
                )
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
        self.workspace_inputs = (len(op.inputs) - 1,)  # the forward op's step_workspaces (lower.py checks the rest)
        self.all_grads, self.last_grads = self._output_grads()
        self.compact = self._compact_links()
        protected = {link.internal for link in (*spec.links, *self.backward_links)} | {spec.timestep}
        if getattr(self.backward, "plain", False):  # lower(..., plain=True): every op of the step as written
            self.deferred = NOTHING_DEFERRED
        else:
            self.deferred = find_deferred(spec.backward_step_net.ops, [p.blob for p in self.params], protected)
        self._terms_at = self.deferred.by_position
        self._forward_links = {link.internal: link for link in spec.links}
        per_external = Counter(link.external for link in self.backward_links)
        self._final_rows = {
            link.internal: link for link in self.backward_links if per_external[link.external] == 1 and link.window == 1
        }
        # Filled while the step is traced: each deferred operand's per-step shape, and where its rows are
        # found after the loop when they are not kept per step.
        self._operand_shapes: dict[str, tuple[int, ...]] = {}
        self._operand_sources: dict[str, tuple[str, Any]] = {}
        expected_outputs = 1 + len(self.params) + len(spec.states)
        if len(op.outputs) != expected_outputs:
            raise BadArgumentError(
                f"{op.where}: expected {expected_outputs} outputs (input gradient, {len(self.params)} "
                f"parameter gradients, {len(spec.states)} initial-state gradients), got {len(op.outputs)}"
            )
        self.native_plan = None if getattr(self.backward, "plain", False) else self._native_plan()

    def _native_plan(self) -> NativePlan | None:
        try:
            return self._find_native_plan()
        except Exception:  # a net the recogniser or Caffe2's gradient makers refuse: the scan says what is wrong
            return None

    def _find_native_plan(self) -> NativePlan | None:
        """The stack, when the step net is a recognised LSTM stack (cell_vjp.recognise) and everything that
        decides this op's gradient is what Caffe2's `recurrent_net` makes from that step net: the forward
        links and inputs in its order, no recomputed blob, no memonger renames, and the backward step net,
        backward links, `param` and `param_grads` equal to what `backward_step` regenerates from the op's
        own step net. Then the backward step net is Caffe2's gradient of the stack, whose VJP the native
        kernels compute (outputs_with_grads and `_last` gradients are the cotangents), so it runs there;
        anything else (a hand-edited backward step net above all) keeps the scan of the net as written."""
        op, spec = self.op, self.spec
        if spec.recompute or self.compact is None or any(name.endswith(".rename") for name in op.args):
            return None
        if any(link.window != 1 for link in spec.links):
            return None
        positions = tuple(range(len(spec.step_net.ops)))
        written = {name for o in spec.step_net.ops for name in o.outputs}
        backward = spec.backward_step_net
        reads = set(backward.external_inputs) | {n for o in backward.ops for n in o.inputs}
        skip = {link.internal for link in spec.links} | {spec.timestep}
        view = _StepView(spec, positions, tuple(sorted((reads & written) - skip)))
        stack = recognise(view)
        if stack is None or any(layer.gates is None for layer in stack.layers):
            return None
        states, by_state = [], {}
        for state in spec.states:
            rows = {link.offset: link.internal for link in spec.links if link.external == state}
            if set(rows) != {0, 1}:
                return None
            states.append(State(rows[0], rows[1], state))
        for k, layer in enumerate(stack.layers):
            by_state |= {layer.hidden: (k, "h"), layer.cell: (k, "c")}
        input_blob = self.forward_inputs[0]
        inputs = [link for link in spec.links if link.external not in spec.states]
        if len(inputs) != 1 or stack.sequence != input_blob:
            return None
        input_t = inputs[0].internal
        if tuple((lk.internal, lk.external, lk.offset) for lk in spec.links) != expected_links(
            states, input_t, input_blob
        ):
            return None
        initials = [self.forward_inputs[i] for i in spec.initial_ids]
        cell = net_proto(spec.step_net)
        known = [input_t, *initials, *(s.cell_input for s in states), spec.timestep]
        references = references_of(cell, known)
        if list(self.forward_inputs) != [input_blob, *initials, *references]:
            return None
        made = backward_step(cell, input_t, input_blob, states, references)
        regenerated = decode_net(made.net, "a regenerated backward step net")
        if (
            tuple((lk.internal, lk.external, lk.offset) for lk in self.backward_links) != made.links
            or op.ints("param", ()) != tuple(self.forward_inputs.index(p) for p in made.params)
            or op.strings("param_grads", ()) != made.param_grads
            or not same_net(regenerated, backward)
        ):
            return None
        slots = {}
        for k, layer in enumerate(stack.layers):
            for slot in ("weight", "bias", "input_weight", "input_bias"):
                name = getattr(layer, slot)
                if name is not None:
                    slots.setdefault(name, []).append((slot, k))
        params = tuple(tuple(slots.get(self.forward_inputs[p.input_index], ())) for p in self.params)
        if not all(params):
            return None
        return NativePlan(stack, by_state, params)

    def _compact_links(self) -> CompactLinks | None:
        """The backward links of the compact form, if they have it: each state's gradient viewed at
        offset 1 (read) and offset 0 (written), window 1, and the input's gradient at offset 0."""
        by_external: dict[str, list] = {}
        for link in self.backward_links:
            by_external.setdefault(link.external, []).append(link)
        reads, writes = {}, {}
        for s in self.spec.states:
            g = self.state_grads[s]
            links = by_external.pop(g, [])
            read = [link.internal for link in links if link.offset == 1 and link.window == 1]
            write = [link.internal for link in links if link.offset == 0 and link.window == 1]
            if len(links) != 2 or len(read) != 1 or len(write) != 1 or read == write:
                return None
            reads[g], writes[g] = read[0], write[0]
        inputs = by_external.pop(self.input_grad, [])
        if by_external or len(inputs) > 1 or any(link.offset != 0 or link.window != 1 for link in inputs):
            return None
        names = [*reads.values(), *writes.values(), *(link.internal for link in inputs)]
        if len(set(names)) != len(names):
            return None
        return CompactLinks(reads, writes, inputs[0].internal if inputs else None)

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
            k = len(self.outputs_with_grads) - 1 - self.outputs_with_grads[::-1].index(j)  # Caffe2 takes the last
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
        self._operand_shapes.clear()
        self._operand_sources.clear()
        outer = ChainMap({}, workspaces["shared"], forward, scope)
        for link in spec.links:
            if link.external not in states and link.external not in outer:
                raise MissingBlobError(
                    f"{op.where}: argument 'link_external' names '{link.external}' (for '{link.internal}'), "
                    f"which is neither a recurrent state ({', '.join(spec.states)}) nor a blob defined before the op"
                )
            check_link_rows(op, link, self._forward_source(link, states, outer).shape[0], steps)
        check_backward_reads(op, spec, spec.backward_step_net, {s: v.shape[0] for s, v in states.items()}, steps)
        self._check_gradient_rows(states, steps)
        # The gradient of each `_last` output goes to the last row of its state's gradient before the loop.
        last = {
            self.state_grads[s]: jnp.reshape(inputs[k], states[s].shape[1:]).astype(states[s].dtype)
            for s, k in self.last_grads.items()
        }
        params = [forward[self.forward_inputs[p.input_index]] for p in self.params]
        for p, value in zip(self.params, params, strict=True):
            if not isinstance(value, jax.Array | np.ndarray):
                raise ShapeError(
                    f"{op.where}: parameter '{self.forward_inputs[p.input_index]}' (argument 'param' "
                    f"#{p.input_index}) is a {type(value).__name__}, not a tensor"
                )
        scratch = workspaces["per_step"]
        self._scratch_shapes = {k: v.shape[1:] for k, v in scratch.items()}
        per_step = {
            "t": jnp.arange(steps, dtype=jnp.int32),
            # Each per-step blob as flat rows, reshaped in the step: scanning a [T, 1, N, ...] tensor makes XLA
            # copy it into another layout first.
            "scratch": {k: jnp.reshape(v, (v.shape[0], math.prod(v.shape[1:]))) for k, v in scratch.items()},
            "all_grads": {self.state_grads[s]: self._steps_of(inputs[k], k, steps) for s, k in self.all_grads.items()},
        }
        compact = self.compact is not None and all(states[s].shape[0] == steps + 1 for s in spec.states)
        scan = self._scan_rows if compact else self._scan_buffers

        def scanned() -> tuple:
            state_grads, input_grad, looped, operands = scan(
                states, outer, sequence, last, params, per_step, scratch, steps
            )
            results = [input_grad]
            for i, param in enumerate(params):
                if i in self.deferred.terms:
                    results.append(self._deferred_total(i, param, operands, steps))
                else:
                    results.append(looped[i])
            for s, index in zip(spec.states, spec.initial_ids, strict=True):
                initial = forward[self.forward_inputs[index]]
                results.append(_initial_gradient(state_grads[self.state_grads[s]], initial))
            return tuple(results)

        native = None
        if compact:
            native = self._native_backward(states, outer, forward, sequence, last, params, per_step, scratch, steps)
        if native is None:
            return scanned()
        # the CPU lowering runs the kernels; every other platform the scan of the backward step net
        return lax.platform_dependent(cpu=native, default=scanned)

    def _native_backward(self, states, outer, forward, sequence, last, params, per_step, scratch, steps):
        """The native form of this op's results (a function of nothing, for lax.platform_dependent), when
        the backward step net is Caffe2's own for a recognised stack (`native_plan`) and the arrays are the
        kernels' case (float32, the shapes the stack's FCs and LSTMUnits take, enough work a step); else None."""
        plan = self.native_plan
        if plan is None or not steps or unwritten_fill() is not None:
            return None
        layers = plan.stack.layers
        try:
            ws = tuple(outer[layer.weight] for layer in layers)
            bs = tuple(outer[layer.bias] for layer in layers)
            wis = tuple(outer[layer.input_weight] for layer in layers[1:])
            bis = tuple(outer[layer.input_bias] for layer in layers[1:])
            lengths = outer[plan.stack.lengths] if plan.stack.lengths is not None else None
            pre = tuple(scratch[layer.gates] for layer in layers)
        except KeyError:
            return None
        h0s = tuple(states[layer.hidden][:1] for layer in layers)
        c0s = tuple(states[layer.cell][:1] for layer in layers)
        if not _shapes_fit(sequence, h0s, c0s, ws, bs, wis, bis, lengths, steps):
            return None
        batch = sequence.shape[1]
        if not recurrence_eligible(sum(batch * w.shape[0] * w.shape[1] for w in (*ws, *wis)), sequence.dtype):
            return None
        gate_shapes = tuple((steps, batch, w.shape[0]) for w in ws)
        if any(
            p.dtype != sequence.dtype or p.size != math.prod(shape) for p, shape in zip(pre, gate_shapes, strict=True)
        ):
            return None
        all_rows = {s: per_step["all_grads"][self.state_grads[s]] for s in self.all_grads}
        if any(go.shape != (steps, *states[s].shape[1:]) for s, go in all_rows.items()):
            return None  # a gradient the scan broadcasts into the rows: left to it
        depth = len(layers)

        def run() -> tuple:
            cts = [[None] * depth for _ in range(5)]
            for s, (k, kind) in plan.states.items():
                at = 0 if kind == "h" else 1
                if s in all_rows:
                    cts[at][k] = all_rows[s].astype(sequence.dtype)
                if self.state_grads[s] in last:
                    cts[2 + at][k] = last[self.state_grads[s]].astype(sequence.dtype)
            valid = None
            if lengths is not None:
                valid = (jnp.arange(steps, dtype=jnp.int32)[:, None] < jnp.reshape(lengths, (1, -1)))[..., None]
            dx, dh0s, dc0s, dws, dbs, dwis, dbis = native_stack_backward(
                plan.stack,
                tuple(h[0] for h in h0s),
                tuple(c[0] for c in c0s),
                ws,
                wis,
                tuple(states[layer.hidden][1:] for layer in layers),
                tuple(states[layer.cell][1:] for layer in layers),
                tuple(jnp.reshape(p, shape) for p, shape in zip(pre, gate_shapes, strict=True)),
                valid,
                tuple(tuple(c) for c in cts),
            )
            by_slot = {"weight": dws, "bias": dbs, "input_weight": (None, *dwis), "input_bias": (None, *dbis)}
            results = [jnp.reshape(dx, sequence.shape).astype(sequence.dtype)]
            for uses, param in zip(plan.params, params, strict=True):
                total = sum(by_slot[slot][k] for slot, k in uses)
                results.append(jnp.reshape(total, param.shape).astype(param.dtype))
            for s, index in zip(self.spec.states, self.spec.initial_ids, strict=True):
                k, kind = plan.states[s]
                row = (dh0s if kind == "h" else dc0s)[k][None]
                results.append(_initial_gradient(row, forward[self.forward_inputs[index]]))
            return tuple(results)

        return run

    # -- the two forms of the reverse scan -----------------------------------------------------

    def _scan_rows(self, states, outer, sequence, last, params, per_step, scratch, steps):
        """The compact form: every state read at offset 0 and written at offset 1 with one initial row,
        so the backward links view rows t (written) and t + 1 (read) of each state's gradient. The carry
        is row t + 1 of each, and the input sequence's gradient rows are scan outputs: no [T, N, H]
        gradient tensor is carried or zero-filled."""
        compact = self.compact
        rows0 = {
            self.state_grads[s]: last.get(self.state_grads[s], jnp.zeros(states[s].shape[1:], states[s].dtype))[None]
            for s in self.spec.states
        }
        row_shape = (1, *sequence.shape[1:])

        def body(carry, xs):
            rows, looped = dict(carry[0]), dict(carry[1])
            t = xs["t"]
            for g, go in xs["all_grads"].items():  # rnn_internal_accumulate_gradient_input, offset 1
                rows[g] = rows[g] + go[None].astype(rows[g].dtype)
            kept = self._scratch_rows(xs["scratch"])
            env = self._step_env(t, kept, states, outer)
            for g, name in compact.reads.items():
                env[name] = rows[g]
            for g, name in compact.writes.items():  # row t: uninitialised in Caffe2 until the step writes it
                env[name] = _unwritten_like(rows[g])
            if compact.input is not None:
                env[compact.input] = _unwritten_like(jnp.zeros(row_shape, sequence.dtype))
            emitted = self._run_step(env, None, looped, kept)
            new = {g: self._as_rows(env[name], rows[g].shape, name, g) for g, name in compact.writes.items()}
            ys = {"operands": emitted}
            if compact.input is not None:  # emitted as [N, ...]: a [1, N, ...] row would stack in a layout
                row = self._as_rows(env[compact.input], row_shape, compact.input, self.input_grad)  # XLA copies
                ys["input"] = row[0]
            return (new, looped), ys

        looped0 = self._looped_accumulators(params)
        if not steps:
            return rows0, jnp.zeros_like(sequence), looped0, {}
        (rows, looped), ys = lax.scan(body, (rows0, looped0), per_step, reverse=True)
        input_grad = jnp.reshape(ys["input"], sequence.shape) if "input" in ys else jnp.zeros_like(sequence)
        finals = {self.input_grad: input_grad}
        operands = self._stacked_operands(ys["operands"], scratch, states, outer, finals, steps)
        return rows, input_grad, looped, operands

    def _check_gradient_rows(self, states: Mapping[str, Any], steps: Any) -> None:
        """Refuse gradient rows no backward step writes (coverage.py), unless the test-only fill is on."""
        if unwritten_fill() is not None:
            return
        gradients = {}
        for state in self.spec.states:
            rows = _initial_rows(states[state], steps)
            if rows is not None:
                gradients[self.state_grads[state]] = (rows, rows)
        gradients[self.input_grad] = (0, steps)
        accumulated = {self.state_grads[s] for s in self.all_grads}
        check_gradient_rows(self.op, self.spec.backward_step_net, self.backward_links, gradients, accumulated, steps)

    def _scan_buffers(self, states, outer, sequence, last, params, per_step, scratch, steps):
        """The general form: whole gradient tensors, read and written through Caffe2's link views."""
        op = self.op
        # One gradient tensor per state (only its last row starts at zero in Caffe2; the others are written
        # before they are read), and the input sequence's gradient.
        grads = {self.state_grads[s]: _unwritten_like(states[s], keep_last=True) for s in self.spec.states}
        grads[self.input_grad] = _unwritten_like(sequence)
        for g, row in last.items():
            grads[g] = grads[g].at[-1].add(row)
        for link in self.backward_links:
            check_link_rows(op, link, grads[link.external].shape[0], steps, "backward_")

        def body(carry, xs):
            grads, looped = dict(carry[0]), dict(carry[1])
            t = xs["t"]
            for g, go in xs["all_grads"].items():  # rnn_internal_accumulate_gradient_input, offset 1
                row = rows_at(grads[g], t + 1, 1) + go[None].astype(grads[g].dtype)
                grads[g] = lax.dynamic_update_slice_in_dim(grads[g], row, t + 1, axis=0)
            kept = self._scratch_rows(xs["scratch"])
            env = self._step_env(t, kept, states, outer)
            views = StateViews(env, grads, self.backward_links, t, op)
            emitted = self._run_step(env, views.write_back, looped, kept)
            return (views.buffers, looped), emitted

        looped0 = self._looped_accumulators(params)
        if not steps:
            return grads, grads[self.input_grad], looped0, {}
        (grads, looped), emitted = lax.scan(body, (grads, looped0), per_step, reverse=True)
        finals = {link.external: grads[link.external] for link in self.backward_links}
        operands = self._stacked_operands(emitted, scratch, states, outer, finals, steps)
        return grads, grads[self.input_grad], looped, operands

    # -- one step --------------------------------------------------------------------------------

    def _scratch_rows(self, flat: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        return {k: jnp.reshape(v, self._scratch_shapes[k]) for k, v in flat.items()}

    def _step_env(self, t, scratch, states, outer) -> ChainMap:
        """Step t's workspace: the timestep, the forward pass's per-step blobs, and the forward links'
        views of the forward tensors (h_{t-1}, h_t, x_t ...)."""
        env = ChainMap({}, {self.spec.timestep: jnp.reshape(t, (1,)), **scratch}, outer)
        for link in self.spec.links:
            env[link.internal] = rows_at(self._forward_source(link, states, outer), t + link.offset, link.window)
        return env

    def _run_step(self, env, after_op, looped: dict[int, jax.Array], scratch: Mapping[str, Any]) -> dict:
        """Run the backward step net's ops on `env`, leaving out what `deferred` sums after the loop:
        returns the operands of the deferred terms that must be kept per step (the others are read
        from tensors that exist anyway, see `_operand_source`)."""
        deferred, terms_at = self.deferred, self._terms_at
        emitted: dict[str, jax.Array] = {}
        for position in range(len(self.spec.backward_step_net.ops)):
            for term in terms_at.get(position, ()):
                for name in term.operands:
                    self._capture(position, name, env, scratch, emitted)
            if position in deferred.skipped:
                if position in terms_at:  # a matmul term: its checks run, its product is summed later
                    self.backward.abstract_outputs(position, env)
                continue
            self.backward.run(env, ops=(position,), after_op=after_op)
            for index in deferred.dropped.get(position, ()):
                env.maps[0].pop(self.spec.backward_step_net.ops[position].outputs[index], None)
        for i, p in enumerate(self.params):
            if i in looped and p.blob in env.maps[0]:
                looped[i] = looped[i] + jnp.reshape(env[p.blob], looped[i].shape)
        return emitted

    def _capture(self, position: int, name: str, env, scratch, emitted: dict) -> None:
        """Keep the value blob `name` has at op `position` for a deferred term: as a scan output, unless
        the same rows exist anyway (a forward link's tensor, a forward per-step blob, a gradient tensor
        whose rows hold it at the end)."""
        key = f"{position}:{name}"
        if name not in env:  # checked here: the op itself runs (and would say so) only after the capture
            step_op = self.spec.backward_step_net.ops[position]
            raise MissingBlobError(
                f"{step_op.where} reads '{name}', which is neither written by an earlier backward step op, nor "
                f"linked (arguments 'link_internal', 'backward_link_internal' of {self.op.where}), nor a blob of "
                "the forward step or an enclosing workspace"
            )
        value = env[name]
        self._operand_shapes[key] = value.shape
        source = self._operand_source(position, name)
        if source is None and name in scratch and name not in self._written_before(position):
            source = ("scratch", name)
        if source is None:
            emitted[key] = value
        else:
            self._operand_sources[key] = source

    def _looped_accumulators(self, params: list[jax.Array]) -> dict[int, jax.Array]:
        return {i: jnp.zeros_like(param) for i, param in enumerate(params) if i not in self.deferred.terms}

    def _as_rows(self, value: Any, shape: tuple[int, ...], blob: str, external: str) -> jax.Array:
        """What a write through a backward link stores: the values as the linked rows (any shape of that size)."""
        if getattr(value, "size", None) != math.prod(shape):
            raise ShapeError(
                f"{self.op.where}: a step writes '{blob}' with shape {list(getattr(value, 'shape', ()))} into "
                f"'{external}', whose linked rows are {list(shape)}"
            )
        return jnp.reshape(value, shape)

    # -- deferred parameter gradients -------------------------------------------------------------

    def _stacked_operands(self, emitted, scratch, states, outer, finals, steps) -> dict[str, jax.Array]:
        """Every deferred term's operands over all steps, [T, ...the per-step shape]."""
        stacked = dict(emitted)
        for key, (kind, what) in self._operand_sources.items():
            if kind == "scratch":
                array = scratch[what]
            elif kind == "forward":
                array = self._forward_source(what, states, outer)[what.offset : what.offset + steps]
            else:
                array = finals[what.external][what.offset : what.offset + steps]
            stacked[key] = array
        return {key: jnp.reshape(a, (steps, *self._operand_shapes[key])) for key, a in stacked.items()}

    def _deferred_total(self, index: int, param: jax.Array, operands: Mapping[str, jax.Array], steps: int):
        total = jnp.zeros_like(param)
        if not steps:
            return total
        for term in self.deferred.terms[index]:
            stacked = [operands[f"{term.position}:{name}"] for name in term.operands]
            total = total + term.total(stacked, param.shape).astype(param.dtype)
        return total

    def _operand_source(self, position: int, name: str) -> tuple[str, Any] | None:
        """Where the value of `name` at op `position` is found after the loop without keeping it per step."""
        if name not in self._written_before(position):
            link = self._forward_links.get(name)
            if link is not None and link.window == 1:
                return ("forward", link)
            return None
        link = self._final_rows.get(name)
        if link is not None and not any(name in o.outputs for o in self.spec.backward_step_net.ops[position:]):
            return ("backward", link)
        return None

    def _written_before(self, position: int) -> set[str]:
        return {n for o in self.spec.backward_step_net.ops[:position] for n in o.outputs}

    def _forward_source(self, link, states, outer) -> jax.Array:
        return states[link.external] if link.external in states else outer[link.external]


@dataclass(frozen=True)
class _StepView:
    """What cell_vjp.recognise reads of a forward lowering: the spec, the per-step op positions, the
    forward blobs the backward step net reads (step_workspaces scratches)."""

    spec: Any
    per_step: tuple[int, ...]
    scratch_names: tuple[str, ...]


def _initial_rows(state: Any, steps: Any) -> int | None:
    """A state tensor's rows beyond T (its L initial rows), or None when symbolic dims hide them."""
    try:
        return int(state.shape[0] - steps)
    except Exception:  # jax's symbolic dimensions raise their own error types
        return None


def _unwritten_like(array: jax.Array, keep_last: bool = False) -> jax.Array:
    """A gradient tensor as Caffe2 allocates it: uninitialised but for its zeroed last row (state gradients).
    Zeros here, or the value of `coverage.filling_unwritten` (a test-only switch) outside that row."""
    fill = unwritten_fill()
    if fill is None:
        return jnp.zeros_like(array)
    filled = jnp.full_like(array, jnp.asarray(fill).astype(array.dtype))
    return filled.at[-1].set(0) if keep_last and array.shape[0] else filled


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
