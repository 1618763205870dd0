"""A recognised LSTM step net as one function with its own VJP, shaped the way oneDNN trains an LSTM.

Differentiating the forward scan (forward.py) lets JAX transpose the loop: its reverse scan adds
`h_{t-1}^T dgates_t` into the weight gradient at every step (a small matmul and a `[K, 4H]` carry per
step) and keeps whatever residuals partial evaluation picks. When the step net is nothing but a stack
of LSTM cells over the compact state form, the whole recurrence is a known function of (x, h0, c0,
W, b per layer), and its VJP is written here instead. The stack is what Caffe2's MultiRNNCell builds:

- layer 1: `FC(h1_prev, W1, b1) -> Sum(., x_t) -> LSTMUnit` (x_t is the input projection, computed
  before the loop and scanned over);
- layer l > 1: `FC(h_{l-1,t}, Wi_l, bi_l)` (its input projection, inside the step: it reads the
  previous layer's new hidden row) and `FC(h_l_prev, W_l, b_l)`, `Sum` of the two, `LSTMUnit`.

A single cell is the stack of one layer. The VJP:

- forward: the step's scan, also emitting the activated gates (i, f, o, g) per step and layer, as
  oneDNN keeps them in its workspace: the same memory as saving the pre-activations, and the backward
  then evaluates no sigmoid but tanh(c_t) (measured against recomputing: equal within this machine's
  noise, 0.61-0.77 vs 0.58-0.80 of the plain path). It rounds as the step net does: each FC is FC's
  lowering (one `[N, K] x [K, 4H]` product, then its bias) and the Sum adds the two rounded terms, so the
  states and the pre-activations the backward step net reads are bit for bit those of the plain scan
  and of the same net unrolled. Folding the bias into x_t, one product of `[h_below, h]` with
  `[Wi | W]`, or a product per gate block each round differently (XLA's CPU dot contracts multiply-adds
  by the product's shape), and Caffe2's rnn_cell_test compares a RecurrentNetwork LSTM with its unrolled
  twin at 1e-7, where the gradients of those states amplify one ulp of them past the bound;
- backward: a reverse scan doing only what is sequential: per step, from the top layer down,
  LSTMUnit's elementwise backward, `[dh_{l-1,t}, dh_l_prev] += dgates_l @ [Wi_l | W_l]` (one matmul
  per layer), emitting dgates; after the loop every `dW` is one contraction over all steps, every
  `db` a sum, and `dx = dgates_1` (x enters layer 1's gates additively).

The maths is LSTMUnit's (rnn_units.lstm_state_update): gate order i, f, o, g; `forget_bias` added to
f before its sigmoid; rows at or past their sequence length keep their state (or are zeroed with
`drop_states`). Anything the recogniser does not cover returns None and the caller runs the plain
scan, so an unusual net is never answered wrongly, only more slowly. `rnn2jax.verify` (and
tests/recurrent/test_cell_vjp.py) check this VJP against JAX's differentiation of that plain scan
(`lower(net, plain=True)`), which never comes here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from ...native import gemm as native_gemm
from ...native import lstm as native_lstm
from ...native import recurrence_eligible
from ..common import matmul_precision
from ..rnn_units import caffe2_sigmoid as _sigmoid
from ..rnn_units import caffe2_tanh as _tanh
from .fusion import _plain_fc


@dataclass(frozen=True)
class LSTMLayer:
    """One recognised cell of the stack: the blobs and LSTMUnit arguments the VJP needs."""

    hidden: str  # recurrent state names
    cell: str
    weight: str  # the recurrent FC's W [4H, H] and b [4H]
    bias: str
    input_weight: str | None  # layers above the first: the FC of the layer below's new hidden row,
    input_bias: str | None  # W [4H, H_below] and b [4H]; None for the first layer (its input is scanned over)
    forget_bias: float
    drop_states: bool
    gates: str | None  # the Sum's output when the backward step net reads it (a step_workspaces scratch)


@dataclass(frozen=True)
class LSTMStack:
    """A step net recognised as stacked LSTM cells (one layer: a single cell)."""

    sequence: str  # the blob scanned over (the link's external), [T, N, 4H_1]: the first layer's input
    lengths: str | None  # LSTMUnit's seq_lengths input (the same for every layer), None without sequence_lengths
    layers: tuple[LSTMLayer, ...]


def recognise(lowering: Any) -> LSTMStack | None:
    """The stack, when `lowering` (a RecurrentLowering in the compact form) runs per step exactly
    `FC(h1_prev, W, b) -> Sum(., x_t) -> LSTMUnit(h1_prev, c1_prev, gates, [seq_lengths,] timestep)`
    and then, for each further layer, `FC(h_below_t, Wi, bi)`, `FC(h_prev, W, b)`, `Sum` of the two and
    `LSTMUnit`, with h_prev and c_prev two states' current rows, LSTMUnit writing both states' next
    rows, h_below_t the layer below's LSTMUnit's new hidden row, x_t a sequence scanned over, every
    state used by one layer, every blob written once (but for Caffe2's in-place Sum into its FC's
    output) and W, b, seq_lengths the same at every step; else None.

    This reads the step net itself rather than fusion.py's FusedLSTM: that rewrite declines Caffe2's
    in-place `Sum(gates_t, input_t) -> gates_t` whenever the backward step net reads gates_t (as every
    LSTM built with a backward step net does), while here the Sum's output is simply emitted."""
    spec = lowering.spec
    ops = [spec.step_net.ops[p] for p in lowering.per_step]
    reads = {lk.internal: lk.external for lk in spec.links if lk.external in spec.states and lk.offset == 0}
    writes = {lk.internal: lk.external for lk in spec.links if lk.external in spec.states and lk.offset == 1}
    if len(ops) < 3 or (len(ops) - 3) % 4 or len(spec.states) != 2 * (1 + (len(ops) - 3) // 4):
        return None
    layers, below, start, sequence, lengths = [], None, 0, None, set()
    while start < len(ops):
        size = 3 if below is None else 4
        matched = _match_layer(ops[start : start + size], below, reads, writes, spec.timestep)
        if matched is None:
            return None
        layer, x_t, with_lengths = matched
        if below is None:
            sequence = [lk for lk in spec.links if lk.internal == x_t]
            if len(sequence) != 1 or sequence[0].external in spec.states or sequence[0].offset:
                return None
            if sequence[0].window != 1:
                return None
        lengths.add(with_lengths)
        layers.append(layer)
        below = ops[start + size - 1].outputs[0]
        start += size
    if len(lengths) != 1 or len({name for lay in layers for name in (lay.hidden, lay.cell)}) != len(spec.states):
        return None
    (lengths_blob,) = lengths
    written = [name for o in ops for name in o.outputs]
    in_place = sum(1 for o in ops if o.type == "Sum" and o.outputs[0] in o.inputs)
    if len(set(written)) != len(written) - in_place:  # each blob written once, in-place Sums aside
        return None
    params = {n for lay in layers for n in (lay.weight, lay.bias, lay.input_weight, lay.input_bias) if n} | {
        lengths_blob
    }
    per_step = {lk.internal for lk in spec.links} | {spec.timestep} | set(written)
    if per_step & params:
        return None
    # the Sums' outputs are the only blobs of a step the backward step net may read (step_workspaces)
    all_gates = {ops[p].outputs[0] for p in range(len(ops)) if ops[p].type == "Sum"}
    scratch = set(lowering.scratch_names)
    if not scratch <= all_gates:
        return None
    layers = [_with_gates(lay, scratch) for lay in layers]
    return LSTMStack(sequence=sequence[0].external, lengths=lengths_blob, layers=tuple(layers))


def _match_layer(group: Sequence[Any], below: str | None, reads: dict, writes: dict, timestep: str):
    """(layer, x_t or None, seq_lengths blob or None) when `group` is one layer's ops; else None."""
    *fcs, summed, unit = group
    if not (all(_plain_fc(fc) and len(fc.outputs) == 1 for fc in fcs) and unit.type == "LSTMUnit"):
        return None
    if summed.type != "Sum" or len(summed.inputs) != 2 or summed.inputs[0] == summed.inputs[1]:
        return None
    if len(summed.outputs) != 1 or len(unit.outputs) != 2:
        return None
    gates, h_prev = summed.outputs[0], unit.inputs[0]
    hidden, cell = reads.get(h_prev), reads.get(unit.inputs[1])
    if hidden is None or cell is None or hidden == cell or tuple(unit.inputs[:3]) != (h_prev, unit.inputs[1], gates):
        return None
    if writes.get(unit.outputs[0]) != hidden or writes.get(unit.outputs[1]) != cell:
        return None
    recurrent = [fc for fc in fcs if fc.inputs[0] == h_prev]
    projection = [fc for fc in fcs if below is not None and fc.inputs[0] == below]
    if len(recurrent) != 1 or len(projection) != (0 if below is None else 1):
        return None
    fc_outputs = [fc.outputs[0] for fc in fcs]
    if recurrent[0].outputs[0] not in summed.inputs or len(set(fc_outputs)) != len(fc_outputs):
        return None
    x_t = None
    if below is None:
        x_t = summed.inputs[1] if summed.inputs[0] == fc_outputs[0] else summed.inputs[0]
    elif set(summed.inputs) != set(fc_outputs):
        return None
    with_lengths = unit.bool("sequence_lengths", True)
    if len(unit.inputs) != (5 if with_lengths else 4) or unit.inputs[-1] != timestep:
        return None
    layer = LSTMLayer(
        hidden=hidden,
        cell=cell,
        weight=recurrent[0].inputs[1],
        bias=recurrent[0].inputs[2],
        input_weight=projection[0].inputs[1] if projection else None,
        input_bias=projection[0].inputs[2] if projection else None,
        forget_bias=unit.float("forget_bias", 0.0),
        drop_states=unit.bool("drop_states", False),
        gates=gates,
    )
    return layer, x_t, unit.inputs[3] if with_lengths else None


def _with_gates(layer: LSTMLayer, scratch: set[str]) -> LSTMLayer:
    return replace(layer, gates=layer.gates if layer.gates in scratch else None)


def lstm_cell_rows(
    lowering: Any, initial: Mapping[str, jax.Array], outer: Mapping[str, Any], steps: int
) -> tuple[dict, dict, dict] | None:
    """(written rows [T, N, H], final row [1, N, H], per-step scratches) of every state, computed by the
    custom-VJP stack; None when the net or the arrays are not the recognised case (the caller then runs
    the plain scan, which also raises the errors a malformed net deserves). `lower(net, plain=True)` never calls
    it: the plain scan, differentiated by JAX, is the reference this VJP is checked against."""
    if steps == 0:
        return None
    stack = recognise(lowering)
    if stack is None:
        return None
    layers = stack.layers
    try:
        x = outer[stack.sequence]
        ws = tuple(outer[lay.weight] for lay in layers)
        bs = tuple(outer[lay.bias] for lay in layers)
        wis = tuple(outer[lay.input_weight] for lay in layers[1:])
        bis = tuple(outer[lay.input_bias] for lay in layers[1:])
        lengths = outer[stack.lengths] if stack.lengths is not None else None
    except KeyError:
        return None
    h0s = tuple(initial[lay.hidden] for lay in layers)
    c0s = tuple(initial[lay.cell] for lay in layers)
    if not _shapes_fit(x, h0s, c0s, ws, bs, wis, bis, lengths, steps):
        return None
    valid = None
    if lengths is not None:
        valid = (jnp.arange(steps, dtype=jnp.int32)[:, None] < jnp.reshape(lengths, (1, -1)))[..., None]
    cell = _lstm(
        tuple(lay.forget_bias for lay in layers),
        tuple(lay.drop_states for lay in layers),
        tuple(lay.gates is not None for lay in layers),
        native=recurrence_eligible(sum(x.shape[1] * w.shape[0] * w.shape[1] for w in (*ws, *wis)), x.dtype),
    )
    h_rows, c_rows, h_last, c_last, gates = cell(
        x, tuple(h[0] for h in h0s), tuple(c[0] for c in c0s), ws, bs, wis, bis, valid
    )
    written, final, scratches = {}, {}, {}
    for k, lay in enumerate(layers):
        written |= {lay.hidden: h_rows[k], lay.cell: c_rows[k]}
        final |= {lay.hidden: h_last[k][None], lay.cell: c_last[k][None]}
        if lay.gates is not None:
            scratches[lay.gates] = gates[k][:, None]
    return written, final, scratches


def _shapes_fit(x, h0s, c0s, ws, bs, wis, bis, lengths, steps: int) -> bool:
    arrays = (x, *h0s, *c0s, *ws, *bs, *wis, *bis)
    if not all(isinstance(a, jax.Array | np.ndarray) for a in arrays):
        return False
    dtype = x.dtype
    if not jnp.issubdtype(dtype, jnp.floating) or any(a.dtype != dtype for a in arrays):
        return False
    if x.ndim != 3 or x.shape[0] != steps or x.shape[2] % 4:
        return False
    batch, below = x.shape[1], None
    for k in range(len(h0s)):
        hidden = x.shape[2] // 4 if k == 0 else h0s[k].shape[-1]
        fits = (
            h0s[k].shape == c0s[k].shape == (1, batch, hidden)
            and ws[k].shape == (4 * hidden, hidden)
            and bs[k].shape == (4 * hidden,)
            and hidden > 0
            and batch > 0
        )
        if k and (wis[k - 1].shape != (4 * hidden, below) or bis[k - 1].shape != (4 * hidden,)):
            return False
        if not fits:
            return False
        below = hidden
    if lengths is None:
        return True
    if not isinstance(lengths, jax.Array | np.ndarray) or lengths.size != batch:
        return False
    return jnp.issubdtype(lengths.dtype, jnp.integer) or jnp.issubdtype(lengths.dtype, jnp.floating)


# -- the stack function and its VJP --------------------------------------------------------------


def _lstm(
    forget_bias: tuple[float, ...], drop_states: tuple[bool, ...], with_gates: tuple[bool, ...], native: bool = False
):
    """`(x [T,N,4H_1], h0s, c0s ([N,H_l] per layer), Ws ([4H_l,H_l]), bs ([4H_l]), Wis ([4H_l,H_{l-1}],
    layers above the first), bis, valid [T,N,1] | None) -> (h rows, c rows, h_T, c_T, gates rows)`, each
    a tuple over layers, with its custom VJP, for one combination of LSTMUnit's arguments per layer.
    `gates` are the Sums' pre-activations (the backward step net's scratches; None where not read).

    With `native` (float32, the kernels loaded), the CPU lowering runs each layer's recurrence forward and
    backward as one native call (rnn2jax/native), layer after layer; every other platform lowers the scan
    below. Both give the same outputs and residuals, so one VJP serves both."""
    precision = matmul_precision()
    depth = len(forget_bias)

    def matmul(a, b):
        return jnp.matmul(a, b, precision=precision)

    def stacked_weights(ws, wis):
        """Per layer the matrix its gates' matmul uses: W_1, then [Wi_l | W_l] (input rows [h_below, h])."""
        return [ws[0]] + [jnp.concatenate([wis[k - 1], ws[k]], axis=1) for k in range(1, depth)]

    def scan_forward(x, h0s, c0s, ws, bs, wis, bis, valid, save: bool):
        def fc(rows, w, b):  # FC's lowering (linear.fully_connected) exactly: the same dot, then the bias
            return matmul(rows, w.T) + b

        def body(carry, xs):
            x_t, valid_t = xs
            below, new, ys = None, [], {"h": [], "c": [], "gates": [], "ifog": []}
            for k, (h, c) in enumerate(carry):
                # Caffe2's rounding: Sum(FC(h_prev, W, b), x_t), above the first layer Sum(FC(h_prev, W, b),
                # FC(h_below, Wi, bi)), each FC one [N, 4H] product plus its bias (see the module docstring)
                gates = fc(h, ws[k], bs[k]) + (x_t if k == 0 else fc(below, wis[k - 1], bis[k - 1]))
                pre = jnp.split(gates, 4, axis=-1)
                x_i, x_f, x_o, x_g = pre
                i, f, o, g = _sigmoid(x_i), _sigmoid(x_f + forget_bias[k]), _sigmoid(x_o), _tanh(x_g)
                c_new = f * c + i * g
                h_new = o * _tanh(c_new)
                if valid_t is not None:
                    h_new = jnp.where(valid_t, h_new, jnp.zeros_like(h) if drop_states[k] else h)
                    c_new = jnp.where(valid_t, c_new, jnp.zeros_like(c) if drop_states[k] else c)
                new.append((h_new, c_new))
                ys["h"].append(h_new)
                ys["c"].append(c_new)
                ys["gates"].append(gates if with_gates[k] else None)
                ys["ifog"].append((i, f, o, g))
                below = h_new
            if not save:
                del ys["ifog"]
            return tuple(new), {name: tuple(v) for name, v in ys.items()}

        last, ys = lax.scan(body, tuple(zip(h0s, c0s, strict=True)), (x, valid))
        h_last, c_last = (tuple(s[0] for s in last), tuple(s[1] for s in last))
        out = (ys["h"], ys["c"], h_last, c_last, ys["gates"])
        return out, ys.get("ifog")

    def native_forward(x, h0s, c0s, ws, bs, wis, bis, valid, save: bool):
        lengths = _native_lengths(valid, x.shape[0], x.shape[1])
        hs, cs, gates, ifogs, below = [], [], [], [], None
        for k in range(depth):
            if k == 0:
                layer_x, bias = x, bs[0]
            else:  # the layer's input projection: one GEMM over all steps, as the layer below is complete
                layer_x = native_gemm.rows_times(below, wis[k - 1])
                bias = bis[k - 1] + bs[k]
            pre_activations = with_gates[k] and not save  # a backward step net's forward: the kernel writes them
            h, c, *more = native_lstm.lstm_forward(
                layer_x,
                h0s[k],
                c0s[k],
                ws[k],
                bias,
                lengths,
                forget_bias=forget_bias[k],
                drop_states=drop_states[k],
                save=save,
                pre_activations=pre_activations,
            )
            hs.append(h)
            cs.append(c)
            ifogs.append(tuple(more) if save else ())
            if pre_activations:
                gates.append(more[0])
            elif with_gates[k]:  # differentiated and read by a step net: one contraction over all steps
                h_prev = jnp.concatenate([h0s[k][None], h[:-1]])
                gates.append(layer_x + bias + native_gemm.rows_times(h_prev, ws[k]))
            else:
                gates.append(None)
            below = h
        out = (tuple(hs), tuple(cs), tuple(h[-1] for h in hs), tuple(c[-1] for c in cs), tuple(gates))
        return out, tuple(ifogs) if save else None

    def forward(*primals, save: bool):
        if not native:
            return scan_forward(*primals, save=save)
        return lax.platform_dependent(
            *primals, cpu=partial(native_forward, save=save), default=partial(scan_forward, save=save)
        )

    @jax.custom_vjp
    def lstm(x, h0s, c0s, ws, bs, wis, bis, valid):
        return forward(x, h0s, c0s, ws, bs, wis, bis, valid, save=False)[0]

    def lstm_fwd(*primals):
        primals = jax.tree.map(lambda p: p.value, primals)
        out, ifog = forward(*primals, save=True)
        _, h0s, c0s, ws, _, wis, _, valid = primals
        h_rows, c_rows = out[0], out[1]
        return out, (h0s, c0s, ws, wis, h_rows, c_rows, ifog, valid)

    def scan_backward(residuals, cts):
        h0s, c0s, ws, wis, h_rows, c_rows, ifog, valid = residuals
        d_h_rows, d_c_rows, d_h_last, d_c_last, d_gates_out = cts
        h_prev = [jnp.concatenate([h0s[k][None], h_rows[k][:-1]]) for k in range(depth)]
        c_prev = [jnp.concatenate([c0s[k][None], c_rows[k][:-1]]) for k in range(depth)]
        weights = stacked_weights(ws, wis)
        xs = {"c": c_rows, "c_prev": tuple(c_prev), "ifog": ifog, "valid": valid}
        for name, given in (("dh", d_h_rows), ("dc", d_c_rows), ("dgates", d_gates_out)):
            present = {str(k): ct for k, ct in enumerate(given) if ct is not None}
            if present:
                xs[name] = present

        def body(carry, xs):
            valid_t = xs["valid"]
            new, emitted, d_below = [None] * depth, [None] * depth, None
            for k in reversed(range(depth)):
                dh, dc = carry[k]
                dh = dh + xs["dh"][str(k)] if str(k) in xs.get("dh", {}) else dh
                dc = dc + xs["dc"][str(k)] if str(k) in xs.get("dc", {}) else dc
                if d_below is not None:
                    dh = dh + d_below
                i, f, o, g = xs["ifog"][k]
                dh_new, dc_new = dh, dc
                if valid_t is not None:
                    dh_new = jnp.where(valid_t, dh, jnp.zeros_like(dh))
                    dc_new = jnp.where(valid_t, dc, jnp.zeros_like(dc))
                tc = _tanh(xs["c"][k])  # equals tanh(c_new) on valid rows; invalid rows get zero gradients anyway
                dc_new = dc_new + dh_new * o * (1 - tc * tc)
                d_gates = jnp.concatenate(
                    [
                        dc_new * g * i * (1 - i),
                        dc_new * xs["c_prev"][k] * f * (1 - f),
                        dh_new * tc * o * (1 - o),
                        dc_new * i * (1 - g * g),
                    ],
                    axis=-1,
                )
                if str(k) in xs.get("dgates", {}):
                    d_gates = d_gates + xs["dgates"][str(k)]
                d_rows = matmul(d_gates, weights[k])
                if k:
                    split = d_rows.shape[-1] - dh.shape[-1]
                    d_below, dh_prev = d_rows[:, :split], d_rows[:, split:]
                else:
                    dh_prev = d_rows
                dc_prev = dc_new * f
                if valid_t is not None and not drop_states[k]:
                    dh_prev = dh_prev + jnp.where(valid_t, jnp.zeros_like(dh), dh)
                    dc_prev = dc_prev + jnp.where(valid_t, jnp.zeros_like(dc), dc)
                new[k], emitted[k] = (dh_prev, dc_prev), d_gates
            return tuple(new), tuple(emitted)

        init = tuple(
            (
                jnp.zeros_like(h0s[k]) if d_h_last[k] is None else d_h_last[k],
                jnp.zeros_like(c0s[k]) if d_c_last[k] is None else d_c_last[k],
            )
            for k in range(depth)
        )
        first, d_gates = lax.scan(body, init, xs, reverse=True)
        dws = tuple(jnp.einsum("tnj,tnk->jk", d_gates[k], h_prev[k], precision=precision) for k in range(depth))
        dbs = tuple(jnp.sum(d_gates[k], axis=(0, 1)) for k in range(depth))
        dwis = tuple(jnp.einsum("tnj,tnk->jk", d_gates[k], h_rows[k - 1], precision=precision) for k in range(1, depth))
        dh0s, dc0s = tuple(s[0] for s in first), tuple(s[1] for s in first)
        return d_gates[0], dh0s, dc0s, dws, dbs, dwis, dbs[1:]

    def lstm_bwd(residuals, cotangents):
        cts = jax.tree.map(lambda ct: None if _zero(ct) else ct, cotangents, is_leaf=_zero)
        if native:
            native_backward = partial(_native_backward, drop_states)
            grads = lax.platform_dependent(residuals, cts, cpu=native_backward, default=scan_backward)
        else:
            grads = scan_backward(residuals, cts)
        return (*grads, None)

    lstm.defvjp(lstm_fwd, lstm_bwd, symbolic_zeros=True)
    return lstm


def _native_backward(drop_states: tuple[bool, ...], residuals, cts):
    """The stack's VJP on the native kernels: per layer, from the top down, one `rnn2jax_lstm_backward`
    call for the recurrence, then the weight gradients as one GEMM each over all steps."""
    h0s, c0s, ws, wis, h_rows, c_rows, ifog, valid = residuals
    d_h_rows, d_c_rows, d_h_last, d_c_last, d_gates_out = cts
    depth = len(drop_states)
    lengths = _native_lengths(valid, *h_rows[0].shape[:2])
    dxs, dh0s, dc0s, dws, dbs, dwis = [None] * depth, [None] * depth, [None] * depth, [None] * depth, [], []
    d_below = None
    for k in reversed(range(depth)):
        dh = _plus(d_h_rows[k], d_below)
        dh = _plus_last(dh, d_h_last[k], h_rows[k])
        dc = _plus_last(d_c_rows[k], d_c_last[k], c_rows[k])
        dxs[k], dh0s[k], dc0s[k] = native_lstm.lstm_backward(
            ws[k], c0s[k], c_rows[k], ifog[k], lengths, dh, dc, d_gates_out[k], drop_states=drop_states[k]
        )
        h_prev = jnp.concatenate([h0s[k][None], h_rows[k][:-1]])
        dws[k] = native_gemm.rows_contraction(dxs[k], h_prev)
        if k:
            dwis.insert(0, native_gemm.rows_contraction(dxs[k], h_rows[k - 1]))
            d_below = native_gemm.rows_times(dxs[k], wis[k - 1], w_is_n_by_k=False)
    dbs = tuple(jnp.sum(dx, axis=(0, 1)) for dx in dxs)
    return dxs[0], tuple(dh0s), tuple(dc0s), tuple(dws), dbs, tuple(dwis), dbs[1:]


def native_stack_backward(
    stack: LSTMStack,
    h0s: tuple[jax.Array, ...],
    c0s: tuple[jax.Array, ...],
    ws: tuple[jax.Array, ...],
    wis: tuple[jax.Array, ...],
    h_rows: tuple[jax.Array, ...],
    c_rows: tuple[jax.Array, ...],
    gates: tuple[jax.Array, ...],
    valid: jax.Array | None,
    cts: tuple,
) -> tuple:
    """The custom VJP's native backward for a RecurrentNetworkGradient whose backward step net is
    Caffe2's own for this stack (gradient.py decides that): `(d x, d h0s, d c0s, d Ws, d bs, d Wis, d bis)`
    from the forward's rows ([N, H] initial rows, [T, N, H] rows per layer), the Sums' pre-activations
    the forward saved for the backward step net ([T, N, 4H] per layer) and the cotangents
    `(d h rows, d c rows, d h_T, d c_T, d gates)` per layer (None for zero). The kernel takes the
    activated gates: they are evaluated here from the pre-activations, elementwise, as LSTMUnitGradient
    does per step (no matmul)."""
    ifog = []
    for layer, pre in zip(stack.layers, gates, strict=True):
        x_i, x_f, x_o, x_g = jnp.split(pre, 4, axis=-1)
        ifog.append((_sigmoid(x_i), _sigmoid(x_f + layer.forget_bias), _sigmoid(x_o), _tanh(x_g)))
    drop_states = tuple(layer.drop_states for layer in stack.layers)
    residuals = (h0s, c0s, ws, wis, h_rows, c_rows, tuple(ifog), valid)
    return _native_backward(drop_states, residuals, cts)


def _native_lengths(valid: jax.Array | None, steps: int, batch: int) -> jax.Array:
    """LSTMUnit's `t < seq_lengths[n]` as the kernels take it: how many leading steps of each row are
    inside the sequence (the count of `valid`, which is exact for any seq_lengths dtype and value)."""
    if valid is None:
        return jnp.full((batch,), steps, jnp.int32)
    return jnp.sum(valid[:, :, 0], axis=0, dtype=jnp.int32)


def _plus(a: jax.Array | None, b: jax.Array | None) -> jax.Array | None:
    return b if a is None else a if b is None else a + b


def _plus_last(rows: jax.Array | None, last: jax.Array | None, like: jax.Array) -> jax.Array | None:
    """The rows' cotangent with the final state's added at step T-1 (the final state is the last row)."""
    if last is None:
        return rows
    return (jnp.zeros_like(like) if rows is None else rows).at[-1].add(last)


def _zero(ct: Any) -> bool:
    return ct is None or isinstance(ct, SymbolicZero)
