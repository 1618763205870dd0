"""RecurrentNetwork -> one `jax.lax.scan`.

Caffe2's op keeps, for each recurrent state, a tensor of T + L rows (L initial rows, then one row
written per step). At step t its `rnn_internal_apply_link` ops make each link's internal blob a view
of rows [t + offset, t + offset + window) of the link's external tensor; an op that writes an
output-linked internal blob writes straight into the state tensor. After the loop, aliases expose
row ranges of the state tensors as the op's outputs (`_all` = rows 1.., `_last` = the final row).

The lowering reproduces that with two forms of scan:
- the common form (every state read at offset 0 and written at offset 1, window 1, one initial row)
  carries only the current row of each state and emits written rows as scan outputs, so a
  forward-only net stores nothing per step beyond its outputs;
- any other arrangement (windows, other offsets, several initial rows) carries whole state
  tensors and reads and writes them with dynamic slices, in op order, so a window read sees rows
  written earlier in the same step.
Step-net ops that depend on nothing per step are hoisted out of the loop. Blobs the step net reads
and does not define (parameters, sequence lengths, encoder outputs) resolve by name through the
enclosing scopes, as Caffe2's workspace chain resolved them.
"""

from __future__ import annotations

import base64
import json
import math
from collections import ChainMap
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.export
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import BadArgumentError, MissingBlobError, ShapeError
from ...ir.netdef import Op
from ..emit import EmitWriter, codegen_helper
from ..facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from ..gradient_makers import GradientContext, GradientError, GradientOps, gradient_op
from ..registry import LowerNet, declare_family, facet, register
from ..shape_facts import INT32, Context, Guesses, Solver, Spec, latest
from .cell_vjp import lstm_cell_rows
from .coverage import check_forward_rows, unwritten_fill
from .fusion import FusedLSTM, find_fused_lstms
from .gru_vjp import gru_cell_rows
from .peeling import timestep_shapes
from .spec import Alias, Link, check_link_rows, decode_spec, initial_rows, state_rows

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)


@jax.tree_util.register_pytree_node_class
class SharedBlobs(Mapping):
    """The loop-invariant blobs of `step_workspaces`. NumPy values among them (shape blobs such as
    Concat's split_info, which a backward Split must read concretely) travel in the pytree's static part,
    so they stay concrete when step_workspaces crosses a jit boundary: RecurrentNetworkGradient run as a
    net of its own, as Caffe2's gradient checker runs it (RunOperatorOnce, then RunOperatorsOnce)."""

    def __init__(self, blobs: Mapping[str, Any]):
        self._blobs = dict(blobs)

    def __getitem__(self, name: str) -> Any:
        return self._blobs[name]

    def __iter__(self) -> Any:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    def tree_flatten(self) -> tuple[list[Any], tuple]:
        arrays = tuple(n for n, v in self._blobs.items() if not isinstance(v, np.ndarray))
        static = tuple(
            (n, v.dtype.str, v.shape, v.tobytes()) for n, v in self._blobs.items() if isinstance(v, np.ndarray)
        )
        return [self._blobs[n] for n in arrays], (arrays, static)

    @classmethod
    def tree_unflatten(cls, aux: tuple, children: Any) -> SharedBlobs:
        arrays, static = aux
        blobs = dict(zip(arrays, children, strict=True))
        blobs.update({n: np.frombuffer(data, dtype).reshape(shape) for n, dtype, shape, data in static})
        return cls(blobs)


def _serialize_shared_aux(aux: tuple) -> bytes:
    """SharedBlobs' static part as JSON, for jax.export (an exported model is data: no pickle)."""
    arrays, static = aux
    items = [[name, dtype, list(shape), base64.b64encode(data).decode()] for name, dtype, shape, data in static]
    return json.dumps({"arrays": list(arrays), "static": items}).encode()


def _deserialize_shared_aux(data: bytes) -> tuple:
    decoded = json.loads(data)
    static = tuple((n, d, tuple(shape), base64.b64decode(b)) for n, d, shape, b in decoded["static"])
    return tuple(decoded["arrays"]), static


jax.export.register_pytree_node_serialization(
    SharedBlobs,
    serialized_name="rnn2jax.SharedBlobs",
    serialize_auxdata=_serialize_shared_aux,
    deserialize_auxdata=_deserialize_shared_aux,
)


class RecurrentLowering:
    """Lowers one RecurrentNetwork op; called with the op's inputs and the enclosing scope."""

    def __init__(self, op: Op, lower: LowerNet):
        self.spec = spec = decode_spec(op)
        self.op = op
        dst = {alias.dst for alias in spec.aliases}
        for position, name in enumerate(op.outputs[:-1]):
            if name not in dst and name not in spec.states:
                raise BadArgumentError(
                    f"{op.where}: output #{position} '{name}' is neither in argument 'alias_dst' nor in "
                    "'recurrent_states' (every output but the last, step_workspaces, is an alias of a state or a "
                    "state)"
                )
        self.step = lower(spec.step_net)
        # lower(..., plain=True): the step net's ops as written, no fusion nor custom VJP (verify's reference)
        self.plain = bool(getattr(self.step, "plain", False))
        self.state_of = {link.internal: link for link in spec.links if link.external in spec.states}
        written = {name for o in spec.step_net.ops for name in o.outputs}
        self.compact_links = all(self._compact(state, written) for state in spec.states)
        self.hoisted, self.per_step = self._split_invariant_ops()
        self.scratch_names = self._scratch_names(written)
        self.scope_reads = self._scope_reads()
        local = {link.internal for link in spec.links} | {spec.timestep}
        # enclosing blobs whose values decide the step's shapes: the enclosing net makes them static too
        self.static_scope_reads = tuple(n for n in self.step.static_inputs() if n not in local)
        self.timestep_shapes = timestep_shapes(self.step, self.per_step, spec.timestep, op.where)
        if self.timestep_shapes is not None and spec.backward_step_net is not None:
            raise BadArgumentError(
                f"{op.where}: the step net's shapes depend on the timestep, and the op has a backward_step_net; "
                "rnn2jax runs the first steps of such step nets outside the loop only in forward-only ops (beam "
                "search decoders), not in a training net's"
            )
        sequences = {lk.internal for lk in spec.links if lk.external not in spec.states and lk.offset == 0}
        per_step = {lk.internal for lk in spec.links} | {spec.timestep}
        self.fused = [] if self.plain else find_fused_lstms(spec.step_net, sequences, set(self.scratch_names), per_step)

    # -- analysis ------------------------------------------------------------------------------

    def _compact(self, state: str, written: set[str]) -> bool:
        """True when the state only needs its current row carried: read at offset 0, written once at
        offset 1 by a step op, all windows 1, and no op writes the row being read."""
        links = [link for link in self.spec.links if link.external == state]
        reads = [link for link in links if link.offset == 0]
        writes = [link for link in links if link.offset == 1]
        return (
            len(writes) == 1
            and len(reads) + len(writes) == len(links)
            and all(link.window == 1 for link in links)
            and writes[0].internal in written
            and not any(link.internal in written for link in reads)
        )

    def _split_invariant_ops(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Positions of step ops that depend on nothing per step (run once, before the loop) and of
        the rest. An op stays in the loop if it reads a link, the timestep, or a blob any per-step op
        writes, if another op writes what it writes, or if it is random or carries nets."""
        ops = self.spec.step_net.ops
        writers: dict[str, int] = {}
        for o in ops:
            for name in o.outputs:
                writers[name] = writers.get(name, 0) + 1
        variant_names = {link.internal for link in self.spec.links} | {self.spec.timestep}
        hoisted, per_step = [], []
        for position, o in enumerate(ops):
            invariant = (
                not (set(o.inputs) & variant_names)
                and all(writers[name] == 1 for name in o.outputs)
                and not any(True for _ in o.nested_nets())
                and not self.step.opdefs[position].random
                and not self.step.opdefs[position].scoped
            )
            if invariant:
                hoisted.append(position)
            else:
                per_step.append(position)
                variant_names.update(o.outputs)
        return tuple(hoisted), tuple(per_step)

    def _scratch_names(self, written: set[str]) -> tuple[str, ...]:
        """Forward blobs of step t that the backward step net reads (Caffe2 kept them in step
        workspace t); recomputed blobs and linked blobs are not kept."""
        backward = self.spec.backward_step_net
        if backward is None:
            return ()
        linked = {link.internal for link in self.spec.links}
        skip = linked | set(self.spec.recompute) | {self.spec.timestep}
        per_step_written = {n for p in self.per_step for n in self.spec.step_net.ops[p].outputs}
        return tuple(sorted(n for n in self.backward_reads & written & per_step_written if n not in skip))

    @property
    def backward_reads(self) -> set[str]:
        backward = self.spec.backward_step_net
        if backward is None:
            return set()
        return set(backward.external_inputs) | {n for o in backward.ops for n in o.inputs}

    def _scope_reads(self) -> tuple[str, ...]:
        """Blobs the step net reads from enclosing scopes (by name, as Caffe2's workspaces did)."""
        local = {link.internal for link in self.spec.links} | {self.spec.timestep}
        externals = [link.external for link in self.spec.links if link.external not in self.spec.states]
        reads = [n for n in self.step.inputs if n not in local]
        return tuple(dict.fromkeys([*externals, *reads]))

    # -- running -------------------------------------------------------------------------------

    def __call__(self, *inputs: jax.Array, scope: Mapping[str, Any], key: jax.Array) -> tuple:
        spec, op = self.spec, self.op
        sequence = inputs[0]
        if sequence.ndim < 2:
            raise ShapeError(
                f"{op.where}: input sequence '{op.inputs[0]}' must be [T, N, ...], got {list(sequence.shape)}"
            )
        steps, batch = sequence.shape[0], sequence.shape[1]
        initial = {
            state: initial_rows(op, op.inputs[i], inputs[i], batch)
            for state, i in zip(spec.states, spec.initial_ids, strict=True)
        }
        if steps:
            self._check_not_empty(sequence, initial)
        for link in spec.links:
            if link.external in initial:
                check_link_rows(op, link, initial[link.external].shape[0] + steps, steps)
        outer = ChainMap({}, scope)
        self.step.run(outer, key=key, ops=self.hoisted)
        externals = self._externals(outer, steps)
        compact = self.compact_links and all(rows.shape[0] == 1 for rows in initial.values())
        scan = self._scan_rows if compact else self._scan_buffers
        constants: dict[str, Any] = {}
        peeled, settled = 0, {}
        if self.timestep_shapes is not None:
            peeled, settled = self.timestep_shapes.plan(self.step, outer, steps)
        loop = _Loop(steps, peeled, settled)
        buffers, scratches = scan(initial, self._fuse(externals, outer), outer, loop, key, constants)
        # after tracing the step, so that a step op's own refusal (a shape that does not fit) comes first
        check_forward_rows(spec, {state: rows.shape[0] for state, rows in initial.items()}, steps)
        # a state named as an output is its whole buffer, the initial rows then one per step (Caffe2 keeps the
        # state blob in the enclosing workspace)
        values = {state: self._alias(Alias(state, state, 0), buffers, scope) for state in spec.states}
        values.update({alias.dst: self._alias(alias, buffers, scope) for alias in spec.aliases})
        workspaces = self._workspaces(buffers, scratches, constants, outer) if spec.backward_step_net else {}
        results = []
        for position, name in enumerate(op.outputs):
            if name in values:
                results.append(values[name])
            elif position == len(op.outputs) - 1:
                results.append(workspaces)
            else:
                raise BadArgumentError(f"{op.where}: output '{name}' is neither an alias_dst nor step_workspaces")
        return tuple(results)

    def _check_not_empty(self, sequence: jax.Array, initial: Mapping[str, jax.Array]) -> None:
        """Caffe2's link views refuse empty tensors (`rnn_internal_apply_link` enforces
        `external.numel() > 0`), so a step never runs on an empty batch or an empty state: an empty
        batch works only with an empty sequence (T = 0). A state is its T + L rows, so an initial state of
        L = 0 rows is fine (recurrent_network_test's stateful convolution with conv_window 1)."""
        empty = [self.op.inputs[0]] if sequence.size == 0 else []
        steps = sequence.shape[0]
        empty += [s for s, rows in initial.items() if (rows.shape[0] + steps) * math.prod(rows.shape[1:]) == 0]
        if empty:
            raise ShapeError(
                f"{self.op.where}: {', '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty "
                f"(input sequence {list(sequence.shape)}); Caffe2 runs no step on an empty batch or state "
                "(its links need non-empty tensors): only T = 0 takes an empty batch"
            )

    def _per_step_scratches(self, env: Mapping[str, Any], constants: dict[str, Any]) -> dict[str, Any]:
        """The scratches of this step; those that are constants (shape blobs such as Concat's
        split_info) are the same at every step and go to `constants` instead, staying concrete."""
        traced = {}
        for name in self.scratch_names:
            value = env[name]
            if isinstance(value, jax.core.Tracer):
                traced[name] = value
            else:
                constants[name] = value
        return traced

    def _workspaces(
        self, buffers: Mapping[str, Any], scratches: dict, constants: dict, outer: ChainMap
    ) -> dict[str, Any]:
        """The `step_workspaces` output: what RecurrentNetworkGradient reads of the forward pass (Caffe2
        kept a workspace per step): every state tensor, the per-step blobs the backward step net reads
        (stacked over steps), and the loop-invariant blobs it reads. Unused under jit, XLA drops them."""
        states = {
            s: jnp.concatenate([b.initial, b.written]) if isinstance(b, _CompactBuffer) else b
            for s, b in buffers.items()
        }
        hoisted = outer.maps[0]
        shared = {n: hoisted[n] for n in self.backward_reads if n in hoisted} | constants
        return {"states": states, "per_step": scratches, "shared": SharedBlobs(shared)}

    def _externals(self, scope: Mapping[str, Any], steps: int) -> _Externals:
        """The arrays behind links that are not recurrent states (the input sequence, mostly)."""
        per_step, sliced = {}, {}
        for link in self.spec.links:
            if link.external in self.spec.states:
                continue
            try:
                array = scope[link.external]
            except KeyError:
                raise MissingBlobError(
                    f"{self.op.where}: link '{link.internal}' reads blob '{link.external}' (argument "
                    "'link_external'), which is neither "
                    f"a recurrent state ({', '.join(self.spec.states)}) nor a blob defined before the op"
                ) from None
            needed = steps - 1 + link.offset + link.window
            if link.offset == 0 and link.window == 1 and array.shape[:1] == (steps,):
                per_step[link.internal] = array  # scanned over as xs
            elif steps and array.shape[0] < needed:
                raise ShapeError(
                    f"{self.op.where}: link '{link.internal}' (arguments 'link_offset' {link.offset}, "
                    f"'link_window' {link.window}) reads rows up to {needed} of '{link.external}', which "
                    f"has {array.shape[0]}"
                )
            else:  # sliced per step; padded only so that the body traces when there are no steps
                pad = max(0, link.offset + link.window - array.shape[0])
                sliced[link] = jnp.pad(array, [(0, pad)] + [(0, 0)] * (array.ndim - 1)) if pad else array
        return _Externals(per_step, sliced)

    def _fuse(self, externals: _Externals, outer: Mapping[str, Any]) -> _Externals:
        """Apply the LSTM gate fusions whose input sequence is scanned over (see fusion.py)."""
        sequences = dict(externals.per_step)
        weights = {
            f: f.prepare(sequences, outer)
            for f in self.fused
            if f.sequence in sequences and f.weight in outer and f.bias in outer  # else the plain ops say why
        }
        return _Externals(sequences, externals.sliced, weights)

    def _run_step(
        self, env: MutableMapping, externals: _Externals, key: jax.Array, after_op=None, settled: bool = False
    ) -> None:
        """The per-step ops in order, with each fused FC -> Sum -> LSTMUnit chain run as one; with
        `settled`, the timestep's shape computations are not run: `_step_env` gave their settled values."""
        skipped = {p for f in externals.fused for p in (f.fc, f.sum)}
        if settled and self.timestep_shapes is not None:
            skipped.update(self.timestep_shapes.positions)
        fused_at = {f.unit: f for f in externals.fused}
        ops = self.spec.step_net.ops
        for position in self.per_step:
            if position in skipped:
                continue
            fused = fused_at.get(position)
            if fused is None:
                self.step.run(env, key=key, ops=(position,), after_op=after_op)
                continue
            try:
                fused.step(ops[position], env, externals.fused[fused])
            except (TypeError, ValueError) as error:
                where, text = ops[position].where, str(error)  # the unit's own error names it already
                detail = text.removeprefix(f"{where}: ")
                raise ShapeError(f"{where} (fused with op #{fused.fc} FC): {detail}") from error
            if after_op is not None:
                after_op(ops[position], env)

    def _step_env(
        self, outer: Mapping[str, Any], t: Any, xs: Mapping[str, jax.Array], loop: _Loop
    ) -> tuple[ChainMap, bool]:
        """The step's blobs: the timestep (known on a peeled step), the scanned rows, and in the loop the
        settled values of the timestep's shape computations. Also: whether those were given."""
        if isinstance(t, int):
            local = {self.spec.timestep: np.array([t], np.int32)}
        else:
            local = {self.spec.timestep: jnp.reshape(t, (1,)).astype(jnp.int32), **loop.settled}
        local.update({name: row[None] for name, row in xs.items()})
        return ChainMap({}, local, outer), not isinstance(t, int) and bool(loop.settled)

    def _read_sliced(self, env: MutableMapping, externals: _Externals, t: jax.Array) -> None:
        for link, array in externals.sliced.items():
            env[link.internal] = rows_at(array, t + link.offset, link.window)

    def _scan_rows(self, initial, externals, outer, loop, key, constants):
        """The compact form: the carry is the current row of each state."""
        spec, steps = self.spec, loop.steps
        # a recognised LSTM stack runs with its own VJP (cell_vjp.py), unless the lowering is plain
        plain = self.plain or self.timestep_shapes is not None  # the cell VJP knows no settled values
        cell = None if plain else lstm_cell_rows(self, initial, outer, steps)
        if cell is None and not plain:  # a recognised GRU likewise (gru_vjp.py)
            cell = gru_cell_rows(self, initial, outer, steps, constants)
        if cell is not None:
            written, final, scratches = cell
            return {s: _CompactBuffer(initial[s], written[s], final[s]) for s in spec.states}, scratches
        writes = {s: next(lk for lk in spec.links if lk.external == s and lk.offset == 1) for s in spec.states}

        def body(carry, xs):
            t, rows = xs
            env, settled = self._step_env(outer, t, rows, loop)
            for link in spec.links:
                if link.external in carry:
                    env[link.internal] = carry[link.external]
            self._read_sliced(env, externals, t)
            self._run_step(env, externals, jax.random.fold_in(key, t), settled=settled)
            new = {s: self._state_row(s, env[writes[s].internal], carry[s], writes[s].internal) for s in spec.states}
            return new, (new, self._per_step_scratches(env, constants))

        init = {s: initial[s] for s in spec.states}
        final, (rows, scratches) = loop.run(body, init, externals.per_step, self.op)
        buffers = {
            s: _CompactBuffer(initial[s], rows[s].reshape((steps, *initial[s].shape[1:])), final[s])
            for s in spec.states
        }
        return buffers, scratches

    def _scan_buffers(self, initial, externals, outer, loop, key, constants):
        """The general form: the carry is every state tensor, read and written through link views."""
        spec, steps = self.spec, loop.steps
        buffers0 = {
            s: _pad_rows(rows, steps) if steps else rows
            for s, rows in initial.items()
        }

        def body(buffers, xs):
            t, rows = xs
            env, settled = self._step_env(outer, t, rows, loop)
            views = StateViews(env, dict(buffers), spec.links, t, self.op)
            self._read_sliced(env, externals, t)
            self._run_step(env, externals, jax.random.fold_in(key, t), after_op=views.write_back, settled=settled)
            return views.buffers, self._per_step_scratches(env, constants)

        buffers, scratches = loop.run(body, buffers0, externals.per_step, self.op)
        return buffers, scratches

    def _state_row(self, state: str, value: Any, row: jax.Array, blob: str) -> jax.Array:
        """The row a step wrote into `state`. Caffe2's link made the blob a view of the row, so an op may
        write any shape of the same size (beam search's TopK writes scores [1, K] into rows [1, K, 1])."""
        if getattr(value, "size", None) != row.size:
            raise ShapeError(
                f"{self.op.where}: step net writes '{blob}' with shape {list(getattr(value, 'shape', ()))} "
                f"into recurrent state '{state}', whose rows are {list(row.shape)}"
            )
        return jnp.reshape(value, row.shape)

    def _alias(self, alias: Alias, buffers: Mapping[str, Any], scope: Mapping[str, Any]) -> jax.Array:
        """Rows [offset, end) of the state (or, as in Caffe2, of any blob of the op's workspace)."""
        buffer = buffers.get(alias.src)
        if buffer is None:
            buffer = scope.get(alias.src)
            if buffer is None or getattr(buffer, "ndim", 0) < 1:
                raise BadArgumentError(
                    f"{self.op.where}: argument 'alias_src' names '{alias.src}', which is neither a recurrent "
                    "state nor an array defined before the op"
                )
        if isinstance(buffer, _CompactBuffer):
            if alias.offset == 1:
                return buffer.written
            if alias.offset == -1:
                return buffer.final
            buffer = jnp.concatenate([buffer.initial, buffer.written])
        total = buffer.shape[0]
        start = alias.offset if alias.offset >= 0 else total + alias.offset
        if not 0 <= start <= total:
            raise BadArgumentError(
                f"{self.op.where}: argument 'alias_offset' is {alias.offset} for alias '{alias.dst}', outside "
                f"'{alias.src}' of {total} rows"
            )
        if start == total:  # empty; built directly (XLA CPU crashes on an empty slice of a concatenate)
            return jnp.zeros((0, *buffer.shape[1:]), buffer.dtype)
        return buffer[start:]


def _pad_rows(rows: jax.Array, steps: Any) -> jax.Array:
    """A state's initial rows followed by the T rows the steps write. Caffe2 leaves those uninitialised:
    they are zeros here, or the value of `coverage.filling_unwritten` (a test-only switch)."""
    fill = unwritten_fill()
    pad = [(0, steps)] + [(0, 0)] * (rows.ndim - 1)
    if fill is None:
        return jnp.pad(rows, pad)
    return jnp.pad(rows, pad, constant_values=jnp.asarray(fill).astype(rows.dtype))


@dataclass(frozen=True)
class _Loop:
    """The steps of one RecurrentNetwork: the first `peeled` run one by one with their timestep known,
    the rest in one `lax.scan` with the settled values of the timestep's shape computations (peeling.py)."""

    steps: int
    peeled: int = 0
    settled: Mapping[str, np.ndarray] = field(default_factory=dict)

    def run(self, body: Any, init: Any, sequences: Mapping[str, jax.Array], op: Op) -> tuple[Any, Any]:
        carry, outputs = init, []
        for t in range(self.peeled):
            carry, out = body(carry, (t, {k: v[t] for k, v in sequences.items()}))
            outputs.append(out)
        if not outputs:
            return _scan(body, carry, sequences, self.steps)
        rest = {k: v[self.peeled :] for k, v in sequences.items()}
        carry, scanned = _scan(body, carry, rest, self.steps - self.peeled, start=self.peeled)
        peeled = jax.tree.map(lambda *rows: jnp.stack(rows), *outputs)
        if jax.tree.structure(peeled) != jax.tree.structure(scanned) or any(
            a.shape[1:] != b.shape[1:] for a, b in zip(jax.tree.leaves(peeled), jax.tree.leaves(scanned), strict=True)
        ):
            raise ShapeError(
                f"{op.where}: the first {self.peeled} step(s), whose shapes depend on the timestep, write rows of "
                "other shapes than the later steps do"
            )
        return carry, jax.tree.map(lambda a, b: jnp.concatenate([a, b]), peeled, scanned)


def _scan(
    body: Any, init: Any, sequences: Mapping[str, jax.Array], steps: int, start: int = 0
) -> tuple[Any, Any]:
    """`lax.scan` over t = start..start+steps-1 and the rows of `sequences`. With no steps the body is
    only shape-evaluated (XLA need not compile a loop that never runs) and outputs are empty."""
    if steps:
        # No unrolling: unroll 2, 4 and 8 measured no faster (CPU time, within +-10% noise) for the compiled
        # GRU and 2-layer LSTM nets at (T, N, H) (200, 4, 32) to (50, 32, 256), nor for a hand-written LSTM
        # scan at the issue 13 benchmark sizes up to (20, 128, 1024).
        return lax.scan(body, init, (jnp.arange(start, start + steps, dtype=jnp.int32), sequences))
    row = (jnp.zeros((), jnp.int32), {k: jnp.zeros(v.shape[1:], v.dtype) for k, v in sequences.items()})
    _, per_step = jax.eval_shape(body, init, row)
    return init, jax.tree.map(lambda a: jnp.zeros((0, *a.shape), a.dtype), per_step)


def rows_at(array: jax.Array, start: jax.Array, window: int) -> jax.Array:
    return lax.dynamic_slice_in_dim(array, start, window, axis=0)


class StateViews:
    """Caffe2's link views of state tensors during one step. Reading a link's internal blob gives rows
    [t + offset, t + offset + window) of its tensor. Writing the blob stores the values there: Caffe2's
    internal blob shared the tensor's memory, so any shape of the same size goes (an in-place Reshape
    keeps its new shape), and every other view of the tensor sees the new values at once."""

    def __init__(self, env: MutableMapping[str, Any], buffers: dict[str, jax.Array], links, t, op: Op):
        self.env, self.buffers, self.t, self.op = env, buffers, t, op
        self.links = [link for link in links if link.external in buffers]
        self.by_internal = {link.internal: link for link in self.links}
        for external in buffers:
            self.refresh(external)

    def refresh(self, external: str, skip: str | None = None) -> None:
        for link in self.links:
            if link.external != external or link.internal == skip:
                continue
            rows = rows_at(self.buffers[external], self.t + link.offset, link.window)
            current = self.env.get(link.internal) if link.internal in self.env.maps[0] else None
            if current is not None and getattr(current, "size", -1) == rows.size:
                rows = jnp.reshape(rows, current.shape)
            self.env[link.internal] = rows

    def write_back(self, op: Op, env: MutableMapping[str, Any]) -> None:
        """The `after_op` hook: store what `op` wrote to linked blobs."""
        for name in op.outputs:
            link = self.by_internal.get(name)
            if link is not None:
                self.store(link, env[name])
                self.refresh(link.external, skip=name)

    def store(self, link: Link, value: Any) -> None:
        buffer = self.buffers[link.external]
        shape = (link.window, *buffer.shape[1:])
        if getattr(value, "size", None) != math.prod(shape):
            raise ShapeError(
                f"{self.op.where}: a step writes '{link.internal}' with shape "
                f"{list(getattr(value, 'shape', ()))} into '{link.external}', "
                f"whose linked rows are {list(shape)}"
            )
        row = jnp.reshape(value, shape).astype(buffer.dtype)
        self.buffers[link.external] = lax.dynamic_update_slice_in_dim(buffer, row, self.t + link.offset, axis=0)


@dataclass(frozen=True)
class _Externals:
    """Non-state link arrays: `per_step` are scanned over (one row per step), `sliced` are read with
    a dynamic slice at `t + offset` (other offsets and windows)."""

    per_step: dict[str, jax.Array]
    sliced: dict[Link, jax.Array]
    fused: dict[FusedLSTM, dict[str, jax.Array]] = field(default_factory=dict)  # weight blocks


@dataclass(frozen=True)
class _CompactBuffer:
    """A state tensor kept as its initial row, the rows the steps wrote, and the final row."""

    initial: jax.Array
    written: jax.Array
    final: jax.Array


@register("RecurrentNetwork", inputs=(1, None), outputs=(2, None), random=True, scoped=True, carries_nets=True)
def recurrent_network(op: Op, lower: LowerNet) -> RecurrentLowering:
    return RecurrentLowering(op, lower)


@codegen_helper
def initial_row(value: jax.Array, batch: int) -> jax.Array:
    """A recurrent state's initial value as its one initial row [1, N, D] (the scan carries one row)."""
    rows = state_rows(value, batch)
    if rows.shape[0] != 1:
        raise ValueError(f"initial state of shape {value.shape}: this module takes one initial row")
    return rows


@facet("emitter", "RecurrentNetwork")
def emit_recurrent_network(w: EmitWriter, op: Op, xs: list[str]) -> None:
    """The lowering's common form (each state read at offset 0 and written at offset 1 through links of
    window 1, one initial row) as a `lax.scan` whose body is the step net. The generator's scan writer
    writes it, statements and outputs; it reads only the blobs the step net needs (`xs` is empty)."""
    w.recurrent_network(op)


@facet("gradient", "RecurrentNetwork")
def _recurrent_network_gradient_maker(g: GradientContext) -> GradientOps:
    """One `RecurrentNetworkGradient` op carrying all forward args (section 2.7 of SEMANTICS.md)."""

    def ints(name: str) -> list[int]:
        arg = g.arg(name)
        return [] if arg is None else list(arg.ints)

    with_grads = ints("outputs_with_grads")
    if not with_grads:
        raise GradientError("RecurrentNetwork needs a non-empty outputs_with_grads")
    inputs = [g.GO(k) for k in with_grads] + list(g.op.input) + list(g.op.output)
    outputs = [g.GI(0)] + [g.GI(i) for i in ints("param")] + [g.GI(i) for i in ints("initial_recurrent_state_ids")]
    return [gradient_op("RecurrentNetworkGradient", inputs, outputs)]


@facet("shape_rule", "RecurrentNetwork")
def recurrent_network_shapes(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """RecurrentNetwork: infer its step net (batch N, one step) from what the op's inputs give, then read
    back the initial states ([1, N, H]), the input sequence ([T, N, D]) and the references it reads."""
    spec, lowered = solver.step_net(op)
    sequence = ins[0]
    steps, batch = ctx.steps, ctx.batch  # --batch/--steps decide, over what a default made of the sequence
    if steps is None and sequence is not None and sequence.shape:
        steps = sequence.shape[0]
    if batch is None and sequence is not None and len(sequence.shape) >= 2:
        batch = sequence.shape[1]
    if batch is None:
        batch = next((ins[i].shape[1] for i in spec.initial_ids if ins[i] is not None and len(ins[i].shape) == 3), None)
    if batch is None:
        return {}, {}
    known = {n: s for n, s in zip(op.inputs, ins, strict=True) if s is not None}
    initial = {state: op.inputs[i] for state, i in zip(spec.states, spec.initial_ids, strict=True)}
    fixed: dict[str, Spec] = {spec.timestep: Spec((1,), INT32)}
    for link in spec.links:
        if link.external in initial:
            start = known.get(initial[link.external])
            if start is not None and start.shape:
                fixed[link.internal] = Spec((link.window, batch, start.shape[-1]), start.dtype)
        elif link.external in known:
            outer = known[link.external]
            fixed[link.internal] = Spec((link.window, *outer.shape[1:]), outer.dtype)
    local = {link.internal for link in spec.links} | {spec.timestep}
    for name in lowered.reads_before_writes():
        if name not in local and name in known:
            fixed[name] = known[name]
    inner = solver.solve_step_net(op, lowered, fixed, batch)
    guess_in: dict[int, Spec] = {}
    for state, name in initial.items():
        position = op.inputs.index(name)
        if ins[position] is not None:
            continue
        for link in spec.links:
            found = latest(inner, link.internal) if link.external == state else None
            if found is not None and found.shape:
                guess_in[position] = Spec((1, batch, found.shape[-1]), found.dtype, state=True)
                break
    for link in spec.links:
        if link.external in initial or link.external not in op.inputs or steps is None:
            continue
        position = op.inputs.index(link.external)
        found = latest(inner, link.internal)
        if ins[position] is None and found is not None and found.shape:
            rows = steps - 1 + link.offset + link.window
            guess_in[position] = Spec((rows, *found.shape[1:]), found.dtype)
    for position, name in enumerate(op.inputs):
        if ins[position] is None and position not in guess_in and (name, -1) in inner and name not in local:
            guess_in[position] = inner[(name, -1)]
    return guess_in, {}
