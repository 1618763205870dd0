"""A recognised LSTM step net as one function with its own VJP, shaped the way oneDNN trains an LSTM.

Differentiating the forward scan (forward.py) lets JAX transpose the loop: its reverse scan adds
`h_{t-1}^T dgates_t` into the weight gradient at every step (a small matmul and a `[K, 4H]` carry per
step) and keeps whatever residuals partial evaluation picks. When the step net is nothing but one
`FC -> Sum -> LSTMUnit` chain over the compact state form, the whole recurrence is a known function
of (x, h0, c0, W, b), and its VJP is written here instead:

- forward: the fused step's scan (gate blocks, as fusion.py runs it), also emitting the activated
  gates (i, f, o, g) per step, as oneDNN keeps them in its workspace: the same memory as saving the
  pre-activations, and the backward then evaluates no sigmoid but tanh(c_t) (measured against
  recomputing: equal within this machine's noise, 0.61-0.77 vs 0.58-0.80 of the plain path);
- backward: a reverse scan doing only what is sequential: per step LSTMUnit's elementwise backward
  and `dh_prev = dgates @ W`, emitting dgates; after the loop `dW` is one contraction over all
  steps, `db` a sum, and `dx = dgates` (x enters the gates additively).

The maths is LSTMUnit's (rnn_units.lstm_state_update): gate order i, f, o, g; `forget_bias` added to
f before its sigmoid; rows at or past their sequence length keep their state (or are zeroed with
`drop_states`). Anything the recogniser does not cover returns None and the caller runs the plain
scan, so an unusual net is never answered wrongly, only more slowly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from ..common import matmul_precision
from ..rnn_units import _sigmoid, _tanh
from .fusion import _plain_fc

_STATE = {"enabled": True}


@contextmanager
def disabled() -> Iterator[None]:
    """Trace with the plain differentiated scan instead (tests compare the two paths)."""
    saved = _STATE["enabled"]
    _STATE["enabled"] = False
    try:
        yield
    finally:
        _STATE["enabled"] = saved


@dataclass(frozen=True)
class LSTMCell:
    """A step net recognised as one LSTM cell: the blobs and LSTMUnit arguments the VJP needs."""

    hidden: str  # recurrent state names
    cell: str
    sequence: str  # the blob scanned over (the link's external), [T, N, 4H]
    weight: str  # FC's W [4H, H] and b [4H]
    bias: str
    lengths: str | None  # LSTMUnit's seq_lengths input, None without sequence_lengths
    forget_bias: float
    drop_states: bool
    gates: str | None  # the Sum's output when the backward step net reads it (a step_workspaces scratch)


def recognise(lowering: Any) -> LSTMCell | None:
    """The cell, when `lowering` (a RecurrentLowering in the compact form) runs exactly three ops per
    step, `FC(h_prev, W, b) -> Sum(., x_t) -> LSTMUnit(h_prev, c_prev, gates, [seq_lengths,] timestep)`,
    with h_prev and c_prev the two states' current rows, LSTMUnit writing both states' next rows, x_t
    a sequence scanned over and W, b, seq_lengths the same at every step; else None.

    This reads the step net itself rather than fusion.py's FusedLSTM: that rewrite declines Caffe2's
    in-place `Sum(gates_t, input_t) -> gates_t` whenever the backward step net reads gates_t (as every
    LSTM built with a backward step net does), while here the Sum's output is simply emitted."""
    spec = lowering.spec
    ops = spec.step_net.ops
    if len(spec.states) != 2 or len(lowering.per_step) != 3:
        return None
    fc, summed, unit = (ops[p] for p in lowering.per_step)
    if not (_plain_fc(fc) and summed.type == "Sum" and len(summed.inputs) == 2 and unit.type == "LSTMUnit"):
        return None
    if len(fc.outputs) != 1 or len(summed.outputs) != 1 or len(unit.outputs) != 2:
        return None
    if fc.outputs[0] not in summed.inputs or summed.inputs[0] == summed.inputs[1]:
        return None
    gates = summed.outputs[0]
    x_t = summed.inputs[1] if summed.inputs[0] == fc.outputs[0] else summed.inputs[0]
    reads = {lk.internal: lk.external for lk in spec.links if lk.external in spec.states and lk.offset == 0}
    writes = {lk.internal: lk.external for lk in spec.links if lk.external in spec.states and lk.offset == 1}
    hidden, cell = reads.get(fc.inputs[0]), reads.get(unit.inputs[1])
    if hidden is None or cell is None or hidden == cell or unit.inputs[:3] != (fc.inputs[0], unit.inputs[1], gates):
        return None
    if writes.get(unit.outputs[0]) != hidden or writes.get(unit.outputs[1]) != cell:
        return None
    sequence = [lk for lk in spec.links if lk.internal == x_t]
    if len(sequence) != 1 or sequence[0].external in spec.states or sequence[0].offset or sequence[0].window != 1:
        return None
    with_lengths = unit.bool("sequence_lengths", True)
    if len(unit.inputs) != (5 if with_lengths else 4) or unit.inputs[-1] != spec.timestep:
        return None
    lengths = unit.inputs[3] if with_lengths else None
    per_step = {lk.internal for lk in spec.links} | {spec.timestep} | {n for o in (fc, summed, unit) for n in o.outputs}
    if per_step & {fc.inputs[1], fc.inputs[2], lengths}:
        return None
    # the Sum's output is the only blob of a step the backward step net may read (step_workspaces)
    if not set(lowering.scratch_names) <= {gates} or (fc.outputs[0] != gates and fc.outputs[0] in unit.inputs):
        return None
    return LSTMCell(
        hidden=hidden,
        cell=cell,
        sequence=sequence[0].external,
        weight=fc.inputs[1],
        bias=fc.inputs[2],
        lengths=lengths,
        forget_bias=unit.float("forget_bias", 0.0),
        drop_states=unit.bool("drop_states", False),
        gates=gates if lowering.scratch_names else None,
    )


def lstm_cell_rows(
    lowering: Any, initial: Mapping[str, jax.Array], outer: Mapping[str, Any], steps: int
) -> tuple[dict, dict, dict] | None:
    """(written rows [T, N, H], final row [1, N, H], per-step scratches) of both states, computed by the
    custom-VJP cell; None when the net or the arrays are not the recognised case (the caller then runs
    the plain scan, which also raises the errors a malformed net deserves)."""
    if not _STATE["enabled"] or steps == 0:
        return None
    cell = recognise(lowering)
    if cell is None:
        return None
    try:
        x, w, b = outer[cell.sequence], outer[cell.weight], outer[cell.bias]
        lengths = outer[cell.lengths] if cell.lengths is not None else None
    except KeyError:
        return None
    h0, c0 = initial[cell.hidden], initial[cell.cell]
    if not _shapes_fit(x, h0, c0, w, b, lengths, steps):
        return None
    valid = None
    if lengths is not None:
        valid = (jnp.arange(steps, dtype=jnp.int32)[:, None] < jnp.reshape(lengths, (1, -1)))[..., None]
    h_rows, c_rows, h_last, c_last, gates = _lstm(cell.forget_bias, cell.drop_states, cell.gates is not None)(
        x, h0[0], c0[0], w, b, valid
    )
    written = {cell.hidden: h_rows, cell.cell: c_rows}
    final = {cell.hidden: h_last[None], cell.cell: c_last[None]}
    scratches = {cell.gates: gates[:, None]} if cell.gates is not None else {}
    return written, final, scratches


def _shapes_fit(x, h0, c0, w, b, lengths, steps: int) -> bool:
    arrays = (x, h0, c0, w, b)
    if not all(isinstance(a, jax.Array | np.ndarray) for a in arrays):
        return False
    dtype = x.dtype
    if not jnp.issubdtype(dtype, jnp.floating) or any(a.dtype != dtype for a in arrays):
        return False
    if x.ndim != 3 or x.shape[0] != steps or x.shape[2] % 4:
        return False
    batch, hidden = x.shape[1], x.shape[2] // 4
    fits = (
        h0.shape == c0.shape == (1, batch, hidden)
        and w.shape == (4 * hidden, hidden)
        and b.shape == (4 * hidden,)
        and hidden > 0
        and batch > 0
    )
    if lengths is None:
        return fits
    if not isinstance(lengths, jax.Array | np.ndarray) or lengths.size != batch:
        return False
    return fits and (jnp.issubdtype(lengths.dtype, jnp.integer) or jnp.issubdtype(lengths.dtype, jnp.floating))


# -- the cell function and its VJP ---------------------------------------------------------------


def _lstm(forget_bias: float, drop_states: bool, with_gates: bool):
    """`(x [T,N,4H], h0 [N,H], c0 [N,H], W [4H,H], b [4H], valid [T,N,1] | None) -> (h rows, c rows,
    h_T, c_T, gates rows [T,N,4H] | None)` with its custom VJP, for one combination of LSTMUnit's
    arguments. `gates` are the Sum's pre-activations (the backward step net's scratch)."""
    precision = matmul_precision()

    def forward(x, h0, c0, w, b, valid, save: bool):
        blocks = jnp.split(x + b, 4, axis=-1)
        weights = [block.T for block in jnp.split(w, 4, axis=0)]

        def body(carry, xs):
            h, c = carry
            x_t, valid_t = xs
            pre = [x_t[k] + jnp.matmul(h, weights[k], precision=precision) for k in range(4)]
            x_i, x_f, x_o, x_g = pre
            i, f, o, g = _sigmoid(x_i), _sigmoid(x_f + forget_bias), _sigmoid(x_o), _tanh(x_g)
            c_new = f * c + i * g
            h_new = o * _tanh(c_new)
            if valid_t is not None:
                h_new = jnp.where(valid_t, h_new, jnp.zeros_like(h) if drop_states else h)
                c_new = jnp.where(valid_t, c_new, jnp.zeros_like(c) if drop_states else c)
            ys = {"h": h_new, "c": c_new}
            if with_gates:
                ys["gates"] = jnp.concatenate(pre, axis=-1)
            if save:
                ys["ifog"] = (i, f, o, g)
            return (h_new, c_new), ys

        (h_last, c_last), ys = lax.scan(body, (h0, c0), (blocks, valid))
        out = (ys["h"], ys["c"], h_last, c_last, ys.get("gates"))
        return out, ys.get("ifog")

    @jax.custom_vjp
    def lstm(x, h0, c0, w, b, valid):
        return forward(x, h0, c0, w, b, valid, save=False)[0]

    def lstm_fwd(x, h0, c0, w, b, valid):
        x, h0, c0, w, b = (p.value for p in (x, h0, c0, w, b))
        valid = jax.tree.map(lambda p: p.value, valid)
        out, ifog = forward(x, h0, c0, w, b, valid, save=True)
        h_rows, c_rows = out[0], out[1]
        return out, (h0, c0, w, h_rows, c_rows, ifog, valid)

    def lstm_bwd(residuals, cotangents):
        h0, c0, w, h_rows, c_rows, (i, f, o, g), valid = residuals
        d_h_rows, d_c_rows, d_h_last, d_c_last, d_gates_out = cotangents
        c_prev = jnp.concatenate([c0[None], c_rows[:-1]])
        h_prev = jnp.concatenate([h0[None], h_rows[:-1]])
        xs = {"c": c_rows, "c_prev": c_prev, "ifog": (i, f, o, g), "valid": valid}
        for name, ct in (("dh", d_h_rows), ("dc", d_c_rows), ("dgates", d_gates_out)):
            if not _zero(ct):
                xs[name] = ct

        def body(carry, xs):
            dh, dc = carry
            dh = dh + xs["dh"] if "dh" in xs else dh
            dc = dc + xs["dc"] if "dc" in xs else dc
            i, f, o, g = xs["ifog"]
            valid_t = xs["valid"]
            dh_new, dc_new = dh, dc
            if valid_t is not None:
                dh_new = jnp.where(valid_t, dh, jnp.zeros_like(dh))
                dc_new = jnp.where(valid_t, dc, jnp.zeros_like(dc))
            tc = _tanh(xs["c"])  # equals tanh(c_new) on valid rows; invalid rows get zero gradients anyway
            dc_new = dc_new + dh_new * o * (1 - tc * tc)
            d_gates = jnp.concatenate(
                [
                    dc_new * g * i * (1 - i),
                    dc_new * xs["c_prev"] * f * (1 - f),
                    dh_new * tc * o * (1 - o),
                    dc_new * i * (1 - g * g),
                ],
                axis=-1,
            )
            if "dgates" in xs:
                d_gates = d_gates + xs["dgates"]
            dh_prev = jnp.matmul(d_gates, w, precision=precision)
            dc_prev = dc_new * f
            if valid_t is not None and not drop_states:
                dh_prev = dh_prev + jnp.where(valid_t, jnp.zeros_like(dh), dh)
                dc_prev = dc_prev + jnp.where(valid_t, jnp.zeros_like(dc), dc)
            return (dh_prev, dc_prev), d_gates

        init = (_value_or_zeros(d_h_last, h0), _value_or_zeros(d_c_last, c0))
        (dh0, dc0), d_gates = lax.scan(body, init, xs, reverse=True)
        dw = jnp.einsum("tnj,tnk->jk", d_gates, h_prev, precision=precision)
        db = jnp.sum(d_gates, axis=(0, 1))
        return d_gates, dh0, dc0, dw, db, None

    lstm.defvjp(lstm_fwd, lstm_bwd, symbolic_zeros=True)
    return lstm


def _zero(ct: Any) -> bool:
    return ct is None or isinstance(ct, SymbolicZero)


def _value_or_zeros(ct: Any, like: jax.Array) -> jax.Array:
    return jnp.zeros_like(like) if _zero(ct) else ct
