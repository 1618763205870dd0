"""A recognised GRU step net as one function with its own VJP (the GRU counterpart of cell_vjp.py).

Caffe2's `gru_cell.GRU` builds, per step (`x_t` is the input projection, computed before the loop by
the i2h FC and scanned over, split into its reset, update and output thirds):

- `FC(h_prev, Wr, br)`, `FC(h_prev, Wu, bu)`, `Sum` of each with its third of x_t;
- `Sigmoid` of the reset gate, then (linear_before_reset=False) `Mul` by h_prev and
  `FC(r * h_prev, Wo, bo)`, or (linear_before_reset=True) `FC(h_prev, Wo, bo)` and `Mul` by r;
- `Sum` with the output third, `Concat` of the three blocks, `GRUUnit`, which reads only the update
  and output blocks: `h = u * h_prev + (1 - u) * tanh(o)` on rows inside their sequence.

Differentiating that scan, JAX's reverse loop accumulates three weight gradients per step; here the
reverse scan does only what is sequential (the elementwise backward and `dh_prev`'s matmuls), emits
the pre-activation gradients (which are `d x`: x enters the gates additively), and every `dW` is one
contraction over all steps after the loop. On CPU with float32 and the native kernels loaded, each
direction is one call of rnn2jax/native/src/gru.cc. Anything the recogniser does not cover returns
None and the caller runs the plain scan; `lower(net, plain=True)` never comes here and is the
reference tests/recurrent/test_native_gru.py checks this VJP against.

When a backward step net (Caffe2's RecurrentNetworkGradient) reads the forward step's blobs (the reset
gate, the gates' pre-activations, r * h_prev or the output FC), the function also returns, as a second
output, the step's three FC outputs written during its loop (as cell_vjp.py's LSTM returns its
pre-activations): every such blob follows from them elementwise (`_step_values`), where recomputing them
after the loop took as many GEMMs again as the recurrence. Its cotangent, when something differentiates
through those blobs, goes through the VJP like the hidden rows'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import BadArgumentError
from ...native import gemm as native_gemm
from ...native import gru as native_gru
from ...native import recurrence_eligible
from ..common import matmul_precision
from ..rnn_units import caffe2_sigmoid, gru_tanh
from .cell_vjp import _native_lengths, _zero
from .fusion import _plain_fc


@dataclass(frozen=True)
class GRUCell:
    """A step net recognised as Caffe2's GRU: the blobs and arguments the VJP needs."""

    sequence: str  # the input projection scanned over, [T, N, 3H]
    hidden: str  # the recurrent state
    weights: tuple[str, str, str]  # Wr, Wu, Wo, each [H, H]
    biases: tuple[str, str, str]  # br, bu, bo, each [H]
    lengths: str | None  # GRUUnit's seq_lengths input, None without sequence_lengths
    linear_before_reset: bool
    drop_states: bool
    blobs: Mapping[str, str]  # step blob -> the value it holds once the step has run (_step_values' keys)
    concat_dims: str | None  # Concat's split_info output


def recognise(lowering: Any) -> GRUCell | None:
    """The GRU, when `lowering` (a RecurrentLowering in the compact form) runs per step exactly the ops
    Caffe2's GRU builds (module docstring), in that order, with one recurrent state, x_t a sequence
    scanned over (window 1), every blob written once (but for each Sum's in-place write into its FC's
    output) and the weights, biases and seq_lengths the same at every step; else None."""
    try:
        return _recognise(lowering)
    except BadArgumentError:  # a malformed argument: the plain ops say what is wrong
        return None


def _recognise(lowering: Any) -> GRUCell | None:
    spec = lowering.spec
    ops = [spec.step_net.ops[p] for p in lowering.per_step]
    if len(ops) != 11 or len(spec.states) != 1:
        return None
    (state,) = spec.states
    reads = [lk for lk in spec.links if lk.external == state and lk.offset == 0]
    writes = [lk for lk in spec.links if lk.external == state and lk.offset == 1]
    if len(reads) != 1 or len(writes) != 1:
        return None
    h_prev, h_new = reads[0].internal, writes[0].internal
    split, fc_r, fc_u, sum_r, sigmoid, fifth, sixth, sum_u, sum_o, concat, unit = ops
    lbr = fifth.type == "FC"
    fc_o, mul = (fifth, sixth) if lbr else (sixth, fifth)
    types = [o.type for o in (split, fc_r, fc_u, sum_r, sigmoid, mul, fc_o, sum_u, sum_o, concat, unit)]
    if types != ["Split", "FC", "FC", "Sum", "Sigmoid", "Mul", "FC", "Sum", "Sum", "Concat", "GRUUnit"]:
        return None
    # the input projection: split in three equal parts along the gate axis
    if len(split.inputs) != 1 or len(split.outputs) != 3 or set(split.args) != {"axis"} or split.int("axis") != 2:
        return None
    x_t = split.inputs[0]
    sequence = [lk for lk in spec.links if lk.internal == x_t]
    if len(sequence) != 1 or sequence[0].external in spec.states or sequence[0].offset or sequence[0].window != 1:
        return None
    x_r, x_u, x_o = split.outputs
    names: dict[str, str] = {x_r: "x_r", x_u: "x_u", x_o: "x_o"}
    # the recurrent FCs
    for fc in (fc_r, fc_u, fc_o):
        if not _plain_fc(fc) or len(fc.outputs) != 1:
            return None
    if fc_r.inputs[0] != h_prev or fc_u.inputs[0] != h_prev:
        return None
    r_pre = _summed(sum_r, fc_r.outputs[0], x_r)
    u_pre = _summed(sum_u, fc_u.outputs[0], x_u)
    if r_pre is None or u_pre is None:
        return None
    names |= {fc_r.outputs[0]: "r_fc", fc_u.outputs[0]: "u_fc"}  # an in-place Sum's output overrides
    names |= {r_pre: "r_pre", u_pre: "u_pre"}
    if list(sigmoid.inputs) != [r_pre] or len(sigmoid.outputs) != 1 or sigmoid.args:
        return None
    r = sigmoid.outputs[0]
    names[r] = "r"
    if len(mul.outputs) != 1 or mul.args:  # no args: NumPy broadcasting of two equal shapes
        return None
    if lbr:  # FC(h_prev) -> Mul(r, .) -> Sum(., x_o)
        if fc_o.inputs[0] != h_prev or sorted(mul.inputs) != sorted([r, fc_o.outputs[0]]):
            return None
        o_pre = _summed(sum_o, mul.outputs[0], x_o)
        names |= {fc_o.outputs[0]: "o_fc", mul.outputs[0]: "o_mul"}
    else:  # Mul(r, h_prev) -> FC(.) -> Sum(., x_o)
        if sorted(mul.inputs) != sorted([r, h_prev]) or fc_o.inputs[0] != mul.outputs[0]:
            return None
        o_pre = _summed(sum_o, fc_o.outputs[0], x_o)
        names |= {mul.outputs[0]: "rh", fc_o.outputs[0]: "o_fc"}
    if o_pre is None or r == h_prev:
        return None
    names[o_pre] = "o_pre"
    if list(concat.inputs) != [r_pre, u_pre, o_pre] or len(concat.outputs) not in (1, 2):
        return None
    if not set(concat.args) <= {"axis", "add_axis"} or concat.int("axis") != 2 or concat.bool("add_axis", False):
        return None
    gates = concat.outputs[0]
    names[gates] = "gates"
    with_lengths = unit.bool("sequence_lengths", True)
    if len(unit.outputs) != 1 or unit.outputs[0] != h_new or len(unit.inputs) != (4 if with_lengths else 3):
        return None
    if unit.inputs[0] != h_prev or unit.inputs[1] != gates or unit.inputs[-1] != spec.timestep:
        return None
    lengths = unit.inputs[2] if with_lengths else None
    # every blob written once, but for the Sums' in-place writes into their FC's output
    written = [name for o in ops for name in o.outputs]
    in_place = sum(1 for o in (sum_r, sum_u, sum_o) if o.outputs[0] in o.inputs)
    if len(set(written)) != len(written) - in_place:
        return None
    params = {*(fc.inputs[k] for fc in (fc_r, fc_u, fc_o) for k in (1, 2))} | ({lengths} if lengths else set())
    local = {lk.internal for lk in spec.links} | {spec.timestep} | set(written)
    if params & local or len(params) != 6 + bool(lengths):
        return None
    concat_dims = concat.outputs[1] if len(concat.outputs) == 2 else None
    return GRUCell(
        sequence=sequence[0].external,
        hidden=state,
        weights=(fc_r.inputs[1], fc_u.inputs[1], fc_o.inputs[1]),
        biases=(fc_r.inputs[2], fc_u.inputs[2], fc_o.inputs[2]),
        lengths=lengths,
        linear_before_reset=lbr,
        drop_states=unit.bool("drop_states", False),
        blobs=names,
        concat_dims=concat_dims,
    )


def _summed(op: Any, fc_out: str, x_part: str) -> str | None:
    """The output of `Sum(fc_out, x_part)` (either order), when `op` is that Sum; else None."""
    if op.type != "Sum" or len(op.outputs) != 1 or sorted(op.inputs) != sorted([fc_out, x_part]) or op.args:
        return None
    if fc_out == x_part or op.outputs[0] == x_part:
        return None
    return op.outputs[0]


def gru_cell_rows(
    lowering: Any,
    initial: Mapping[str, jax.Array],
    outer: Mapping[str, Any],
    steps: int,
    constants: MutableMapping[str, Any] | None = None,
) -> tuple[dict, dict, dict] | None:
    """(written rows [T, N, H], final row [1, N, H], per-step scratches [T, 1, N, ...]) of the GRU's state,
    computed by the custom-VJP GRU; None when the net or the arrays are not the recognised case (the caller
    then runs the plain scan, which also raises the errors a malformed net deserves). Concat's split_info,
    when the backward step net reads it, is a constant: it goes to `constants` (None: fall back)."""
    if steps == 0:
        return None
    cell = recognise(lowering)
    if cell is None:
        return None
    scratch = set(lowering.scratch_names)
    wanted = {name: cell.blobs[name] for name in scratch if name in cell.blobs}
    unknown = scratch - set(wanted)
    if unknown - {cell.concat_dims} or (unknown and constants is None):
        return None
    try:
        x = outer[cell.sequence]
        ws = tuple(outer[name] for name in cell.weights)
        bs = tuple(outer[name] for name in cell.biases)
        lengths = outer[cell.lengths] if cell.lengths is not None else None
    except KeyError:
        return None
    h0 = initial[cell.hidden]
    if not _shapes_fit(x, h0, ws, bs, lengths, steps):
        return None
    valid = None
    if lengths is not None:
        valid = (jnp.arange(steps, dtype=jnp.int32)[:, None] < jnp.reshape(lengths, (1, -1)))[..., None]
    native = recurrence_eligible(x.shape[1] * x.shape[2] * h0.shape[-1], x.dtype)  # N · 3H · H
    kinds = set(wanted.values())
    with_fc = bool(kinds - INPUT_THIRDS)
    gru = _gru(cell.linear_before_reset, cell.drop_states, native=native, with_fc=with_fc)
    h_rows, fc = gru(x, h0[0], ws, bs, valid)
    scratches = {}
    if wanted:
        values = _step_values(x, h0[0], h_rows, fc, cell.linear_before_reset, kinds)
        scratches = {name: values[kind][:, None] for name, kind in wanted.items()}
    if unknown:
        hidden = h0.shape[-1]
        constants[cell.concat_dims] = np.array([hidden] * 3, np.int32)  # type: ignore[index]
    return {cell.hidden: h_rows}, {cell.hidden: h_rows[-1][None]}, scratches


def _shapes_fit(x, h0, ws, bs, lengths, steps: int) -> bool:
    arrays = (x, h0, *ws, *bs)
    if not all(isinstance(a, jax.Array | np.ndarray) for a in arrays):
        return False
    dtype = x.dtype
    if not jnp.issubdtype(dtype, jnp.floating) or any(a.dtype != dtype for a in arrays):
        return False
    if x.ndim != 3 or x.shape[0] != steps or x.shape[2] % 3 or x.shape[1] == 0 or x.shape[2] == 0:
        return False
    batch, hidden = x.shape[1], x.shape[2] // 3
    if h0.shape != (1, batch, hidden):
        return False
    if any(w.shape != (hidden, hidden) for w in ws) or any(b.shape != (hidden,) for b in bs):
        return False
    if lengths is None:
        return True
    if not isinstance(lengths, jax.Array | np.ndarray) or lengths.size != batch:
        return False
    return jnp.issubdtype(lengths.dtype, jnp.integer) or jnp.issubdtype(lengths.dtype, jnp.floating)


# the step blobs that are the input projection's thirds, which need none of the step's FC outputs
INPUT_THIRDS = frozenset({"x_r", "x_u", "x_o"})


def _step_values(x, h0, h_rows, fc, lbr: bool, kinds: set[str]) -> dict[str, jax.Array]:
    """The step blobs the backward step net reads, for all steps at once, elementwise from the input
    projection, the hidden rows and the step's FC outputs `fc` [T, N, 3H] (the GRU function's second output,
    written during its loop; None when only x's thirds are read), in the step net's order (FC, then Sum).
    Plain JAX outside the custom VJP: they differentiate through x, the hidden rows and fc, whose cotangent
    the VJP takes (and XLA drops the ones nothing uses)."""
    x_r, x_u, x_o = jnp.split(x, 3, axis=-1)
    values = {"x_r": x_r, "x_u": x_u, "x_o": x_o}
    if fc is None:
        return values
    r_fc, u_fc, o_fc = jnp.split(fc, 3, axis=-1)
    r_pre, u_pre = r_fc + x_r, u_fc + x_u
    r = caffe2_sigmoid(r_pre)
    values |= {"r_fc": r_fc, "u_fc": u_fc, "o_fc": o_fc, "r_pre": r_pre, "u_pre": u_pre, "r": r}
    if lbr:
        values["o_mul"] = r * o_fc
        values["o_pre"] = values["o_mul"] + x_o
    else:
        values["rh"] = r * _previous(h0, h_rows)
        values["o_pre"] = o_fc + x_o
    if "gates" in kinds:
        values["gates"] = jnp.concatenate([r_pre, u_pre, values["o_pre"]], axis=-1)
    return values


def _step_fcs(x, h0, h_rows, ws, bs, lbr: bool) -> jax.Array:
    """The step's FC outputs [T, N, 3H] for all steps from the hidden rows, with GEMMs over all steps: the
    same values the fc kernel form and the scan write during the loop, as plain JAX. For the training forward
    (where the kernel keeps its residuals instead; XLA drops these when nothing reads them) and for their
    cotangent in the VJP, as jax.vjp of this function."""
    precision = matmul_precision()
    h_prev = _previous(h0, h_rows)

    def fc(rows, w, b):
        if native_gemm.eligible(math.prod(rows.shape[:-1]), w.shape[1], w.shape[0], rows, w, b):  # as linear.py
            flat = native_gemm.fully_connected(jnp.reshape(rows, (-1, rows.shape[-1])), w, b, True, precision)
            return jnp.reshape(flat, (*rows.shape[:-1], -1))
        return jnp.einsum("tnk,jk->tnj", rows, w, precision=precision) + b

    if lbr:  # every block is an FC of h_prev: one GEMM
        return fc(h_prev, jnp.concatenate(ws), jnp.concatenate(bs))
    r_u = fc(h_prev, jnp.concatenate(ws[:2]), jnp.concatenate(bs[:2]))
    r = caffe2_sigmoid(r_u[..., : h0.shape[-1]] + x[..., : h0.shape[-1]])
    return jnp.concatenate([r_u, fc(r * h_prev, ws[2], bs[2])], axis=-1)


def _previous(h0, h_rows):
    """Each step's h_prev [T, N, H]: the initial row, then the rows the steps before wrote."""
    return jnp.concatenate([h0[None], h_rows[:-1]])


# -- the GRU function and its VJP ------------------------------------------------------------------


def _gru(linear_before_reset: bool, drop_states: bool, native: bool = False, with_fc: bool = False):
    """`(x [T,N,3H], h0 [N,H], (Wr, Wu, Wo) [H,H], (br, bu, bo) [H], valid [T,N,1] | None) -> (h rows
    [T,N,H], fc)` with its custom VJP, for one combination of the GRU's arguments. x is the i2h projection;
    each step adds the recurrent FCs' biases as the step net does (FC, then Sum). With `with_fc`, fc is the
    step's three FC outputs [T,N,3H] (h_prev Wr^T + br, h_prev Wu^T + bu, and h_prev Wo^T + bo or, without
    linear_before_reset, (r * h_prev) Wo^T + bo), on every row, for the backward step net's blobs; else None.

    With `native` (float32, the kernels loaded), the CPU lowering runs the recurrence forward and backward
    as one native call each; every other platform lowers the scans below. Both give the same outputs and
    residuals (the activated gates r, u, o, and for linear_before_reset the output FC's value), so one VJP
    serves both."""
    precision = matmul_precision()
    lbr = linear_before_reset

    def matmul(a, b):
        return jnp.matmul(a, b, precision=precision)

    def scan_forward(x, h0, ws, bs, valid, save: bool):
        x_r, x_u, x_o = jnp.split(x, 3, axis=-1)
        wr_t, wu_t, wo_t = (w.T for w in ws)
        br, bu, bo = bs

        def body(h, xs):
            xr_t, xu_t, xo_t, valid_t = xs
            r_fc, u_fc = matmul(h, wr_t) + br, matmul(h, wu_t) + bu
            r, u = caffe2_sigmoid(r_fc + xr_t), caffe2_sigmoid(u_fc + xu_t)
            if lbr:
                o_fc = matmul(h, wo_t) + bo
                o = gru_tanh(r * o_fc + xo_t)
            else:
                o_fc = matmul(r * h, wo_t) + bo
                o = gru_tanh(o_fc + xo_t)
            h_new = u * h + (1 - u) * o
            if valid_t is not None:
                h_new = jnp.where(valid_t, h_new, jnp.zeros_like(h) if drop_states else h)
            fc = jnp.concatenate([r_fc, u_fc, o_fc], axis=-1) if with_fc else None
            saved = (r, u, o, o_fc if lbr else None) if save else None
            return h_new, (h_new, fc, saved)

        _, (h_rows, fc, saved) = lax.scan(body, h0, (x_r, x_u, x_o, valid))
        return h_rows, fc, saved

    def native_forward(x, h0, ws, bs, valid, save: bool):
        lengths = _native_lengths(valid, x.shape[0], x.shape[1])
        fc_form = with_fc and not save  # a backward step net's forward: the kernel writes the FC outputs
        h_rows, *more = native_gru.gru_forward(
            x,
            h0,
            jnp.concatenate(ws),
            jnp.concatenate(bs),
            lengths,
            linear_before_reset=lbr,
            drop_states=drop_states,
            save=save,
            fc=fc_form,
        )
        if not save:
            return h_rows, more[0] if fc_form else None, None
        # differentiated and read by a backward step net: GEMMs over all steps, which XLA drops when unread
        fc = _step_fcs(x, h0, h_rows, ws, bs, lbr) if with_fc else None
        return h_rows, fc, (*more, *(() if lbr else (None,)))

    def forward(*primals, save: bool):
        if not native:
            return scan_forward(*primals, save=save)
        return lax.platform_dependent(
            *primals, cpu=partial(native_forward, save=save), default=partial(scan_forward, save=save)
        )

    @jax.custom_vjp
    def gru(x, h0, ws, bs, valid):
        h_rows, fc, _ = forward(x, h0, ws, bs, valid, save=False)
        return h_rows, fc

    def gru_fwd(*primals):
        primals = jax.tree.map(lambda p: p.value, primals)
        h_rows, fc, saved = forward(*primals, save=True)
        x, h0, ws, bs, valid = primals
        fc_inputs = (x, bs) if with_fc else None  # what the cotangent of fc needs besides the rows
        return (h_rows, fc), (h0, ws, h_rows, saved, valid, fc_inputs)

    def scan_backward(residuals, d_h_rows):
        h0, ws, h_rows, saved, valid, _ = residuals
        wr, wu, wo = ws
        h_prev = _previous(h0, h_rows)

        def body(carry, xs):
            dh = carry + xs["dh"]
            r, u, o, o_fc = xs["saved"]
            hp, valid_t = xs["h_prev"], xs["valid"]
            dh_valid = dh if valid_t is None else jnp.where(valid_t, dh, jnp.zeros_like(dh))
            du = dh_valid * (hp - o) * u * (1 - u)
            do = dh_valid * (1 - u) * (1 - o * o)
            dh_prev = dh_valid * u
            if lbr:
                dr = do * o_fc * r * (1 - r)
                dh_prev = dh_prev + matmul(do * r, wo)
            else:
                d_rh = matmul(do, wo)
                dr = d_rh * hp * r * (1 - r)
                dh_prev = dh_prev + d_rh * r
            dh_prev = dh_prev + matmul(dr, wr) + matmul(du, wu)
            if valid_t is not None and not drop_states:
                dh_prev = dh_prev + jnp.where(valid_t, jnp.zeros_like(dh), dh)
            return dh_prev, jnp.concatenate([dr, du, do], axis=-1)

        xs = {"dh": d_h_rows, "saved": saved, "h_prev": h_prev, "valid": valid}
        dh0, dx = lax.scan(body, jnp.zeros_like(h0), xs, reverse=True)
        return dx, dh0

    def native_backward(residuals, d_h_rows):
        h0, ws, h_rows, saved, valid, _ = residuals
        lengths = _native_lengths(valid, *h_rows.shape[:2])
        return native_gru.gru_backward(
            jnp.concatenate(ws),
            h0,
            h_rows,
            saved[: 4 if lbr else 3],
            lengths,
            d_h_rows,
            linear_before_reset=lbr,
            drop_states=drop_states,
        )

    def fc_cotangent(residuals, d_fc):
        """The cotangent of the FC outputs on (x, h0, h rows, ws, bs): each step's FCs are a function of that
        step's h_prev (and, without linear_before_reset, of x_r through r), which jax.vjp of `_step_fcs`
        differentiates; its part on the hidden rows then goes through the recurrence with theirs."""
        h0, ws, h_rows, _, _, (x, bs) = residuals
        return jax.vjp(partial(_step_fcs, lbr=lbr), x, h0, h_rows, ws, bs)[1](d_fc)

    def gru_bwd(residuals, cotangents):
        h0, _, h_rows, saved, _, _ = residuals
        d_h_rows, d_fc = (None if _zero(ct) else ct for ct in cotangents)
        through_fc = fc_cotangent(residuals, d_fc) if d_fc is not None else None
        if through_fc is not None:
            d_h_rows = through_fc[2] if d_h_rows is None else d_h_rows + through_fc[2]
        if d_h_rows is None:
            d_h_rows = jnp.zeros_like(h_rows)
        if native:
            dx, dh0 = lax.platform_dependent(residuals, d_h_rows, cpu=native_backward, default=scan_backward)
        else:
            dx, dh0 = scan_backward(residuals, d_h_rows)
        dr, du, do = jnp.split(dx, 3, axis=-1)
        r = saved[0]
        h_prev = _previous(h0, h_rows)
        # the output FC's input and output gradient: r * h_prev and do, or h_prev and do * r (lbr)
        o_rows, d_o_fc = (h_prev, do * r) if lbr else (r * h_prev, do)
        dws = tuple(
            native_gemm.contraction(d, rows, precision, native)
            for d, rows in ((dr, h_prev), (du, h_prev), (d_o_fc, o_rows))
        )
        dbs = tuple(jnp.sum(d, axis=(0, 1)) for d in (dr, du, d_o_fc))
        if through_fc is None:
            return dx, dh0, dws, dbs, None
        d_x, d_h0, _, d_ws, d_bs = through_fc
        return dx + d_x, dh0 + d_h0, jax.tree.map(jnp.add, dws, d_ws), jax.tree.map(jnp.add, dbs, d_bs), None

    gru.defvjp(gru_fwd, gru_bwd, symbolic_zeros=True)
    return gru
