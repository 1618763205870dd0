"""More of Caffe2's optimizer updates (caffe2/sgd/, caffe2/operators/): Storm, GFtrl, SmartDecaySparseAdam,
the twelve Adagrad updates fused with the gradient of SparseLengths{Sum,Mean,WeightedSum}, LearningRateAdaption,
YellowFin, RowWiseCounter, SparseLpRegularizer, Float16SparseNormalize and EnsureClipped.

The optimizer family continues here because rnn2jax/ops/optimizer.py is already over 1,200 lines; the
conventions are that module's (and its helpers are shared): an in-place update rebinds the blob to a new
array, and a sparse update applies the rows named by INDICES in Caffe2's order, an index listed twice
updated twice, the second time from the first's result (`_sequential_rows`).

FP16MomentumSGDUpdate and FP32MomentumSGDUpdate are not here: Caffe2 1.10 registers them for CUDA only.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import first_bad, literal, runtime_check, runtime_checked
from .common import size_from_dim
from .facets import NO_ROLES, NO_SHAPE_RULE, Absent
from .optimizer import (
    _f,
    _in_place,
    _iteration,
    _same_numel,
    _scalar,
    _sequential_rows,
    _sparse_rows,
    _table,
)
from .registry import Kernel, declare_family, register

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=NO_SHAPE_RULE,
    gradient=Absent("a parameter update: Caffe2 says SHOULD_NOT_DO_GRADIENT, the builder has no maker for it"),
    emitter=Absent("a training-step op: the generated module is for inference and jax.grad"),
)

runtime_checked(
    "SparseStorm",
    "SmartDecaySparseAdam",
    "RowWiseCounter",
    "SparseLpRegularizer",
    "Float16SparseNormalize",
    "EnsureClipped",
    "YellowFin",
)

_F64 = jnp.float64
# Caffe2 registers no gradient at all (not even SHOULD_NOT_DO_GRADIENT) for these updates.
_NO_MAKER = Absent("a parameter update: Caffe2 registers no gradient maker for it")


def _rows(op: Op, rows: int, indices: Any, position: int, what: str) -> Any:
    """INDICES (int32/int64, any shape) as a flat vector, with a run-time check that each names one of `rows`."""
    if indices.dtype not in (jnp.int32, jnp.int64):
        raise ShapeError(f"{op.where}: indices '{op.inputs[position]}' must be int32 or int64, got {indices.dtype}")
    flat = indices.reshape(-1)
    if rows == 0 and flat.size:
        raise ShapeError(f"{op.where}: '{what}' has no rows for indices '{op.inputs[position]}'")
    bad = (flat < 0) | (flat >= rows)
    runtime_check(
        ~jnp.any(bad),
        f"{literal(op.where)}: indices '{literal(op.inputs[position])}' hold {{bad}}, out of the range [0, {rows})",
        bad=first_bad(flat, bad),
    )
    return jnp.clip(flat, 0, max(rows - 1, 0))


# --- Storm ---------------------------------------------------------------------------------------


def _storm_args(op: Op) -> tuple[Any, Any]:
    return np.float32(op.float("momentum", 10.0)), np.float32(op.float("beta", 0.1))


def _storm_rates(lr: Any, gss: Any, momentum: Any, beta: Any) -> tuple[Any, Any]:
    """(nlr, alpha): nlr = lr · (β + Σg²)^(-1/3) (std::pow in double), alpha = momentum · nlr²."""
    nlr = (lr.astype(_F64) * jnp.power((beta + gss).astype(_F64), -1.0 / 3.0)).astype(jnp.float32)
    return nlr, momentum * nlr * nlr


@register("Storm", inputs=5, outputs=3)
def storm(op: Op) -> Kernel:
    """(param, moment, grad_sq_sum, grad, lr) -> (param, moment, grad_sq_sum): grad_sq_sum += ‖g‖²,
    nlr = lr / (β + grad_sq_sum)^⅓, moment = g + (1 - momentum·nlr²)·(moment - g), param += nlr · moment."""
    momentum, beta = _storm_args(op)

    def kernel(w, m, gss, g, lr):
        _f(op, w, 0)
        _same_numel(op, g, 3, (w, 0), (m, 1))
        s = _scalar(op, gss, 2, "grad_sq_sum")
        lr = _scalar(op, lr, 4)
        ns = s + jnp.sum(g * g)
        nlr, alpha = _storm_rates(lr, ns, momentum, beta)
        gs = g.reshape(w.shape)
        nm = gs + (1 - alpha) * (m.reshape(w.shape) - gs)
        return w + nlr * nm, nm.reshape(m.shape), ns.reshape(gss.shape)

    return kernel


@register("SparseStorm", inputs=6, outputs=3)
def sparse_storm(op: Op) -> Kernel:
    """(param, moment, grad_sq_sum, grad, indices, lr): Storm on the rows named by indices (in place);
    the step size comes from the whole gradient. No indices: nothing changes."""
    momentum, beta = _storm_args(op)
    _in_place(op, (0, 0), (1, 1), (2, 2))

    def kernel(w, m, gss, g, indices, lr):
        _same_numel(op, w, 0, (m, 1))
        s = _scalar(op, gss, 2, "grad_sq_sum")
        lr = _scalar(op, lr, 5)
        idx, rows_g, _ = _sparse_rows(op, w, indices, g, 4, 3)
        if idx.size == 0:
            return w, m, gss
        ns = s + jnp.sum(g * g)
        nlr, alpha = _storm_rates(lr, ns, momentum, beta)
        r = w.shape[0]

        def update(rows, entries):
            rw, rm = rows
            gi = entries[0]
            nm = gi + (1 - alpha) * (rm - gi)
            return [rw + nlr * nm, nm], []

        (nw, nm), _ = _sequential_rows([_table(w, r), _table(m, r)], idx, [rows_g], update)
        return nw.reshape(w.shape), nm.reshape(m.shape), ns.reshape(gss.shape)

    return kernel


# --- GFtrl ---------------------------------------------------------------------------------------


@register("GFtrl", inputs=(3, 4), outputs=2)
def gftrl(op: Op) -> Kernel:
    """(var, n_z, grad[, alpha]) -> (var, n_z): group-lasso FTRL. GRAD [O, ...] is O outputs by I inputs; each
    input column j is a group: with z_j the column of new z values, w = z · (λ1·√O / ‖z_j‖ - 1) /
    ((β + √n)/α + λ2) when ‖z_j‖ > λ1·√O, else 0."""
    if op.has("alpha") and len(op.inputs) > 3:
        raise BadArgumentError(f"{op.where}: cannot specify alpha by both input and argument")
    alpha_inv = np.float32(1.0 / np.float32(op.float("alpha", 0.005)))
    beta = np.float32(op.float("beta", 1.0))
    lambda1 = np.float32(op.float("lambda1", 0.001))
    lambda2 = np.float32(op.float("lambda2", 0.001))

    def kernel(w, nz, g, *alpha):
        _f(op, w, 0)
        ainv = alpha_inv
        if alpha:
            ainv = (1.0 / _scalar(op, alpha[0], 3, "alpha").astype(_F64)).astype(jnp.float32)
        _same_numel(op, g, 2, (w, 0))
        if nz.size != 2 * g.size:
            raise ShapeError(f"{op.where}: n_z '{op.inputs[1]}' must hold two values per gradient element")
        if g.ndim < 1 or g.shape[0] == 0:
            raise ShapeError(f"{op.where}: gradient '{op.inputs[2]}' must have a non-empty first dimension")
        outputs = g.shape[0]
        gw, gg = w.reshape(outputs, -1), g.reshape(outputs, -1)
        pairs = nz.reshape(outputs, -1, 2)
        n, z = pairs[..., 0], pairs[..., 1]
        new_n = n + gg * gg
        sigma = (jnp.sqrt(new_n) - jnp.sqrt(n)) * ainv
        new_z = z + gg - sigma * gw
        z_norm = jnp.sqrt(jnp.sum(new_z * new_z, axis=0, keepdims=True))
        threshold = (lambda1.astype(_F64) * np.sqrt(outputs)).astype(jnp.float32)
        safe = jnp.where(z_norm > threshold, z_norm, jnp.ones((), z_norm.dtype))
        nw = new_z * (threshold / safe - 1) / ((beta + jnp.sqrt(new_n)) * ainv + lambda2)
        nw = jnp.where(z_norm > threshold, nw, jnp.zeros((), w.dtype))
        return nw.reshape(w.shape), jnp.stack([new_n, new_z], axis=-1).reshape(nz.shape)

    return kernel


# --- SmartDecaySparseAdam --------------------------------------------------------------------------


@register("SmartDecaySparseAdam", inputs=8, outputs=4, gradient=_NO_MAKER)
def smart_decay_sparse_adam(op: Op) -> Kernel:
    """(param, m1, m2, last_seen, indices, grad, lr, iter) -> (param, m1, m2, last_seen): sparse Adam whose
    moments decay by β^k, k = t - last_seen[row] the steps since the row was last updated (t = iter + 1), with
    the first moment's missed decay steps caught up: param += lr · (m1 + catchup) / (√m2 + ε); no bias
    correction. last_seen[row] = t."""
    beta1 = np.float32(op.float("beta1", 0.9))
    beta2 = np.float32(op.float("beta2", 0.999))
    eps = np.float32(op.float("epsilon", 1e-5))
    _in_place(op, (0, 0), (1, 1), (2, 2), (3, 3))

    def kernel(w, m, v, last, indices, g, lr, it):
        _same_numel(op, w, 0, (m, 1), (v, 2))
        if w.ndim < 1 or last.size != w.shape[0]:
            raise ShapeError(f"{op.where}: last_seen '{op.inputs[3]}' must hold one value per row of the parameter")
        if last.dtype != jnp.int64:
            raise ShapeError(f"{op.where}: last_seen '{op.inputs[3]}' must be int64, got {last.dtype}")
        lr = _scalar(op, lr, 6)
        t = _iteration(op, it, 7).astype(jnp.int64) + 1
        idx, rows_g, _ = _sparse_rows(op, w, indices, g, 4, 5)
        r = w.shape[0]

        def update(rows, entries):
            rw, rm, rv, rl = rows
            gi = entries[0]
            k = (t - rl).astype(jnp.float32)
            catchup = jnp.where(k > 1, rm * beta1 * (1 - jnp.power(beta1, k - 1)) / (1 - beta1), 0)
            nm = rm * jnp.power(beta1, k) + gi * (1 - beta1)
            nv = rv * jnp.power(beta2, k) + gi * gi * (1 - beta2)
            nw = rw + (lr * (nm + catchup)) / (jnp.sqrt(nv) + eps)
            return [nw, nm, nv, jnp.broadcast_to(t, rl.shape)], []

        tables = [_table(w, r), _table(m, r), _table(v, r), last.reshape(r, 1)]
        (nw, nm, nv, nl), _ = _sequential_rows(tables, idx, [rows_g], update)
        return nw.reshape(w.shape), nm.reshape(m.shape), nv.reshape(v.shape), nl.reshape(last.shape)

    return kernel


# --- Adagrad fused with the gradient of SparseLengths{Sum,Mean,WeightedSum} ------------------------
#
# (param, moment[, aux_param], indices, grad, lr, lengths): GRAD holds one gradient row per segment; each
# index of segment r is updated with that row (divided by the length for Mean, times aux_param[position in
# the segment] for WeightedSum), in order. WeightedSum also returns aux_grad, per index the dot product of
# its segment's gradient row and the parameter row: the parameter before the whole update, or, for the
# WeightedSum...Approx ops, the row as it is when that index is reached (earlier repeats already applied).
# The other Approx ops compute what the exact ones do.

_FUSED = {
    f"{prefix}SparseAdagradFusedWithSparseLengths{kind}Gradient{approx}": (
        prefix == "RowWise",
        kind,
        approx == "Approx",
    )
    for prefix in ("", "RowWise")
    for kind in ("Sum", "Mean", "WeightedSum")
    for approx in ("", "Approx")
}


def _segments(op: Op, lengths: Any, n: int, position: int) -> tuple[Any, Any, Any]:
    """(segment of each of the n indices, its position in the segment, each segment's length): Caffe2's loop
    takes a negative length as 0, and requires the lengths to cover the indices exactly."""
    if lengths.ndim != 1:
        raise ShapeError(
            f"{op.where}: LENGTHS '{op.inputs[position]}' must be a vector, got shape {list(lengths.shape)}"
        )
    if lengths.dtype != jnp.int32:
        raise ShapeError(f"{op.where}: LENGTHS '{op.inputs[position]}' must be int32, got {lengths.dtype}")
    eff = jnp.maximum(lengths, 0)
    ends = jnp.cumsum(eff)
    total = ends[-1] if lengths.size else jnp.zeros((), jnp.int32)
    runtime_check(
        total == n,
        f"{literal(op.where)}: LENGTHS '{literal(op.inputs[position])}' sum to {{total}}, but there are {n} indices",
        total=total,
    )
    entry = jnp.arange(n, dtype=jnp.int32)
    seg = jnp.clip(jnp.searchsorted(ends, entry, side="right"), 0, max(lengths.size - 1, 0))
    pos = entry - (ends - eff)[seg]
    return seg, pos, eff


def _fused_adagrad(op: Op, row_wise: bool, kind: str, approx: bool) -> Kernel:
    eps = np.float32(op.float("epsilon", 1e-5))
    weight_decay = np.float32(op.float("weight_decay", 0.0))
    if not (row_wise and kind == "WeightedSum" and not approx) and op.float("decay", 1.0) != 1.0:
        raise BadArgumentError(f"{op.where}: Decay is not supported for SparseSimdAdagradOp (decay must be 1)")
    _in_place(op, (0, 0), (1, 1))
    weighted = kind == "WeightedSum"
    base = 3 if weighted else 2  # position of INDICES

    def kernel(w, h, *rest):
        aux = rest[0] if weighted else None
        indices, g, lr, lengths = rest[-4:]
        _f(op, w, 0)
        _f(op, g, base + 1)
        if indices.ndim != 1:
            raise ShapeError(f"{op.where}: indices '{op.inputs[base]}' must be a vector, got {list(indices.shape)}")
        if g.ndim < 1:
            raise ShapeError(f"{op.where}: gradient '{op.inputs[base + 1]}' must have rank >= 1")
        if lengths.ndim == 1 and lengths.shape[0] != g.shape[0]:
            raise ShapeError(
                f"{op.where}: gradient '{op.inputs[base + 1]}' must have one row per segment of LENGTHS "
                f"'{op.inputs[base + 3]}' ({lengths.shape[0]}), got {g.shape[0]}"
            )
        if w.ndim < 1:
            raise ShapeError(f"{op.where}: parameter '{op.inputs[0]}' must have rank >= 1, got a scalar")
        rows = w.shape[0]
        block = size_from_dim(w.shape, 1)
        if row_wise:
            if h.size != rows:
                raise ShapeError(f"{op.where}: moment '{op.inputs[1]}' must hold one value per row of the parameter")
        elif h.size != w.size:
            raise ShapeError(f"{op.where}: moment '{op.inputs[1]}' must have as many elements as '{op.inputs[0]}'")
        lr = _scalar(op, lr, base + 2)
        n = indices.size
        seg, pos, eff = _segments(op, lengths, n, base + 3)
        if lengths.size == 0:  # Caffe2 returns before looking at the indices
            out = (w, h)
            return (*out, jnp.zeros((n,), g.dtype)) if weighted else out
        if size_from_dim(g.shape, 1) != block:
            raise ShapeError(
                f"{op.where}: gradient '{op.inputs[base + 1]}' {list(g.shape)} must have rows of the parameter's "
                f"row size {block}"
            )
        idx = _rows(op, rows, indices, base, op.inputs[0])
        seg_rows = g.reshape(g.shape[0], block)[seg]
        scaled = seg_rows
        if kind == "Mean":
            length = eff[seg].astype(g.dtype)[:, None]
            scaled = jnp.where(length > 0, seg_rows / jnp.maximum(length, 1), seg_rows)
        if weighted:
            if aux.ndim < 1:
                raise ShapeError(f"{op.where}: aux_param '{op.inputs[2]}' must be a vector")
            flat_aux = aux.reshape(-1)
            runtime_check(
                jnp.all(pos < flat_aux.size),
                f"{literal(op.where)}: aux_param '{literal(op.inputs[2])}' has {flat_aux.size} weights, fewer than "
                "the longest segment of LENGTHS",
            )
            scaled = seg_rows * flat_aux[jnp.clip(pos, 0, max(flat_aux.size - 1, 0))][:, None]
        table_w = _table(w, rows)

        def update(tables, entries):
            rw, rh = tables
            gi = entries[0] + weight_decay * rw
            if row_wise:
                nh = rh + jnp.sum(gi * gi, axis=1) / np.float32(max(block, 1))
                nw = rw + (lr / (jnp.sqrt(nh) + eps))[:, None] * gi
            else:
                nh = rh + gi * gi
                nw = rw + lr * gi / (jnp.sqrt(nh) + eps)
            outs = [jnp.sum(entries[1] * rw, axis=1)] if weighted and approx else []
            return [nw, nh], outs

        h_table = h.reshape(rows) if row_wise else _table(h, rows)
        (nw, nh), outs = _sequential_rows([table_w, h_table], idx, [scaled, seg_rows], update)
        result = (nw.reshape(w.shape), nh.reshape(h.shape))
        if not weighted:
            return result
        aux_grad = outs[0] if approx else jnp.sum(seg_rows * table_w[idx], axis=1)
        return (*result, aux_grad.astype(g.dtype))

    return kernel


def _register_fused(op_type: str, row_wise: bool, kind: str, approx: bool) -> None:
    weighted = kind == "WeightedSum"

    @register(op_type, inputs=7 if weighted else 6, outputs=3 if weighted else 2, gradient=_NO_MAKER)
    def build(op: Op) -> Kernel:
        return _fused_adagrad(op, row_wise, kind, approx)

    build.__doc__ = (
        f"{'Row-wise ' if row_wise else ''}Adagrad fused with SparseLengths{kind}'s gradient"
        f"{' (Approx: the aux gradient sees earlier repeats)' if weighted and approx else ''}."
    )


for _type, (_row_wise, _kind, _approx) in _FUSED.items():
    _register_fused(_type, _row_wise, _kind, _approx)
runtime_checked(*_FUSED)


# --- LearningRateAdaption ------------------------------------------------------------------------


@register("LearningRateAdaption", inputs=3, gradient=Absent("Caffe2 says NO_GRADIENT"))
def learning_rate_adaption(op: Op) -> Kernel:
    """(lr, grad, effgrad) -> lr': with normalized_lr_adaption (default) lr · (1 - α · cos(grad, effgrad)),
    the norms at least 1e-12; else lr - α · (grad · effgrad). α is lr_alpha (0.01)."""
    alpha = np.float32(op.float("lr_alpha", 0.01))
    normalized = op.bool("normalized_lr_adaption", True)

    def kernel(lr, g, e):
        _f(op, g, 1)
        lr0 = _scalar(op, lr, 0)
        _same_numel(op, g, 1, (e, 2))
        x = jnp.sum(g * e.reshape(g.shape))
        if normalized:
            y = jnp.maximum(jnp.sqrt(jnp.sum(g * g)), np.float32(1e-12))
            z = jnp.maximum(jnp.sqrt(jnp.sum(e * e)), np.float32(1e-12))
            out = lr0 * (1 - alpha * x / (y * z))
        else:
            out = lr0 - alpha * x
        return out.reshape(lr.shape).astype(lr.dtype)

    return kernel


# --- YellowFin -----------------------------------------------------------------------------------


@register("YellowFin", inputs=10, outputs=8)
def yellow_fin(op: Op) -> Kernel:
    """(param, moment, lr, mu, curv_win, g_avg, g2_avg, scalars_memory, grad, iter) -> the first eight,
    updated: a momentum-SGD step with the running lr and mu, then the moving averages (β) of the gradient,
    its square, norms, curvature range over the last curv_win_width steps and distance to the optimum, from
    which (after the first step) new lr and mu are tuned. Caffe2 reads the lr and mu it steps with from the
    output blobs: they are run in place, as its optimizer builder does, and so here from the inputs."""
    width = op.int("curv_win_width", 20)
    nesterov = op.bool("nesterov", False)
    zero_debias = op.bool("zero_debias", True)
    eps = np.float32(op.float("epsilon", 1e-6))
    beta = np.float32(op.float("beta", 0.999))
    if width <= 0:
        raise BadArgumentError(f"{op.where}: argument 'curv_win_width' = {width} must be > 0")

    def kernel(w, m, lr_avg, mu_avg, curv, g_avg, g2_avg, mem, g, it):
        _f(op, w, 0)
        for x, i in ((m, 1), (g_avg, 5), (g2_avg, 6), (g, 8)):
            if x.shape != w.shape:
                raise ShapeError(
                    f"{op.where}: '{op.inputs[i]}' {list(x.shape)} must have the shape of '{op.inputs[0]}' "
                    f"{list(w.shape)}"
                )
        lr0, mu0 = _scalar(op, lr_avg, 2), _scalar(op, mu_avg, 3, "mu")
        if curv.size < width:
            raise ShapeError(f"{op.where}: curv_win '{op.inputs[4]}' must hold curv_win_width = {width} values")
        if mem.size < 5:
            raise ShapeError(f"{op.where}: scalars_memory '{op.inputs[7]}' must hold 5 values")
        it32 = _iteration(op, it, 9).astype(jnp.int32)  # Caffe2 keeps the iteration as int
        runtime_check(
            it32 >= 1,
            f"{literal(op.where)}: iteration '{literal(op.inputs[9])}' is {{it}}; YellowFin counts from 1",
            it=it32,
        )
        one = np.float32(1)
        debias = (
            one / (one - jnp.power(beta.astype(_F64), it32.astype(_F64)).astype(jnp.float32)) if zero_debias else one
        )

        def avg(x, old):
            return beta * old + (one - beta) * x

        # the momentum SGD step
        nm = mu0 * m + lr0 * g
        nw = w - (1 + mu0) * nm + mu0 * m if nesterov else w - nm
        # AfterApply
        ng_avg = avg(g, g_avg)
        g_deb = debias * ng_avg
        ng2_avg = avg(g * g, g2_avg)
        flat_mem = mem.reshape(-1)
        g_norm2 = jnp.maximum(eps, jnp.sum(g * g))
        g_norm2_avg = avg(g_norm2, flat_mem[1])
        g_norm2_deb = debias * g_norm2_avg
        g_norm = jnp.sqrt(g_norm2)
        g_norm_avg = avg(g_norm, flat_mem[0])
        flat_curv = curv.reshape(-1)
        slot = jnp.remainder(it32 - 1, width)
        new_curv = flat_curv.at[slot].set(jnp.log(g_norm2))
        valid = jnp.arange(flat_curv.size) < jnp.minimum(width, it32)
        window = new_curv[:width] if flat_curv.size > width else new_curv
        valid = valid[:width]
        big = jnp.asarray(np.finfo(np.float32).max, jnp.float32)
        g_norm2_min = jnp.min(jnp.where(valid, window, big))
        g_norm2_max = jnp.max(jnp.where(valid, window, -big))
        g_norm2_min_avg = avg(g_norm2_min, flat_mem[2])
        g_norm2_max_avg = avg(g_norm2_max, flat_mem[3])
        g_norm2_min_deb = jnp.maximum(eps, jnp.exp(debias * g_norm2_min_avg))
        g_norm2_max_deb = jnp.maximum(eps, jnp.exp(debias * g_norm2_max_avg))
        variance = jnp.maximum(eps, g_norm2_deb - jnp.sum(g_deb * g_deb))
        distance = g_norm_avg / g_norm2_avg
        distance_avg = avg(distance, flat_mem[4])
        distance_deb = debias * distance_avg
        # GetLrMu, from the second step on
        curv_ratio = jnp.sqrt(g_norm2_max_deb / g_norm2_min_deb)
        mu_limit = (curv_ratio - one) / (curv_ratio + one)
        pre_p = distance_deb * g_norm2_min_deb
        p = (pre_p * pre_p) / (np.float32(2) * variance)
        w3 = (-jnp.sqrt(p * p + np.float32(4.0 / 27.0) * p * p * p) - p) / np.float32(2)
        cube = jnp.where(w3 > 0, one, -one) * jnp.power(jnp.abs(w3), np.float32(1.0 / 3.0))
        root = cube - p / np.float32(3) / cube + one
        mu = jnp.maximum(root * root, mu_limit * mu_limit)
        lr = jnp.square(one - jnp.sqrt(mu)) / g_norm2_min_deb
        tune = it32 > 1
        new_mu = jnp.where(tune, avg(mu, mu0), mu0)
        new_lr = jnp.where(tune, avg(lr, lr0), lr0)
        new_mem = flat_mem.at[:5].set(
            jnp.stack([g_norm_avg, g_norm2_avg, g_norm2_min_avg, g_norm2_max_avg, distance_avg])
        )
        return (
            nw,
            nm,
            new_lr.reshape(lr_avg.shape),
            new_mu.reshape(mu_avg.shape),
            new_curv.reshape(curv.shape),
            ng_avg,
            ng2_avg,
            new_mem.reshape(mem.shape),
        )

    return kernel


# --- RowWiseCounter ------------------------------------------------------------------------------


@register("RowWiseCounter", inputs=4, outputs=2)
def row_wise_counter(op: Op) -> Kernel:
    """(prev_iter, counter, indices, iter) -> (prev_iter, counter), in place: for each index in order,
    counter = 1 + exp(-Δ · ln 2 / counter_halflife) · counter with Δ = max(0, iter - prev_iter), and
    prev_iter = max(iter, prev_iter). Nothing changes without a positive counter_halflife."""
    halflife = op.int("counter_halflife", -1)
    rho = np.log(2.0) / halflife if halflife > 0 else 0.0
    _in_place(op, (0, 0), (1, 1))

    def kernel(prev, counter, indices, it):
        if prev.dtype != jnp.int64:
            raise ShapeError(f"{op.where}: prev_iter '{op.inputs[0]}' must be int64, got {prev.dtype}")
        if counter.dtype != _F64:
            raise ShapeError(f"{op.where}: counter '{op.inputs[1]}' must be double (float64), got {counter.dtype}")
        if prev.size != counter.size:
            raise ShapeError(f"{op.where}: prev_iter and counter must have as many elements")
        if it.size != 1:
            raise ShapeError(f"{op.where}: iter '{op.inputs[3]}' must hold one element")
        current = _iteration(op, it, 3).astype(jnp.int64)
        if indices.dtype not in (jnp.int32, jnp.int64):
            raise ShapeError(f"{op.where}: indices '{op.inputs[2]}' must be int32 or int64, got {indices.dtype}")
        if halflife <= 0 or indices.size == 0:
            return prev, counter
        r = counter.size
        idx = _rows(op, r, indices, 2, op.inputs[1])

        def update(rows, entries):
            rp, rc = rows
            delta = jnp.maximum(0, current - rp)
            return [jnp.maximum(current, rp), 1.0 + jnp.exp(-delta.astype(_F64) * rho) * rc], []

        (np_, nc), _ = _sequential_rows([prev.reshape(r, 1), counter.reshape(r, 1)], idx, [], update)
        return np_.reshape(prev.shape), nc.reshape(counter.shape)

    return kernel


# --- SparseLpRegularizer, Float16SparseNormalize, EnsureClipped ----------------------------------


@register("SparseLpRegularizer", inputs=(2, 3), gradient=_NO_MAKER)
def sparse_lp_regularizer(op: Op) -> Kernel:
    """(param, indices[, grad]) -> param, in place: each row named by indices (each time it is named) is
    scaled by 1 - reg_lambda (p = 2, the default) or shrunk toward 0 by reg_lambda (p = 1). grad is unused."""
    p = op.float("p", 2.0)
    lam = np.float32(op.float("reg_lambda", 1e-5))
    if p not in (1.0, 2.0):
        raise BadArgumentError(f"{op.where}: Sparse Lp regularizer only implemented for p=1 or p=2, got p={p}")
    _in_place(op, (0, 0))

    def kernel(w, indices, *grad):
        _f(op, w, 0)
        if w.ndim < 1:
            raise ShapeError(f"{op.where}: parameter '{op.inputs[0]}' must have rank >= 1, got a scalar")
        r = w.shape[0]
        idx = _rows(op, r, indices, 1, op.inputs[0])

        def update(rows, entries):
            x = rows[0]
            if p == 2.0:
                return [x * (1 - lam)], []
            shrunk = jnp.where(x < -lam, x + lam, jnp.where(x > lam, x - lam, jnp.zeros((), x.dtype)))
            return [shrunk], []

        (nw,), _ = _sequential_rows([_table(w, r)], idx, [], update)
        return nw.reshape(w.shape)

    return kernel


@register("Float16SparseNormalize", inputs=(2, 3))
def float16_sparse_normalize(op: Op) -> Kernel:
    """SparseNormalize of a float16 parameter: (param, indices[, grad]) -> param with each row named by
    indices scaled to L2 norm `norm` (the norm in float, the factor rounded to half); with use_max_norm
    (default) only rows whose norm exceeds it."""
    norm = np.float32(op.float("norm", 1.0))
    use_max = op.bool("use_max_norm", True)
    _in_place(op, (0, 0))

    def kernel(w, indices, *grad):
        if w.dtype != jnp.float16:
            raise ShapeError(f"{op.where}: parameter '{op.inputs[0]}' must be float16, got {w.dtype}")
        if w.ndim < 1:
            raise ShapeError(f"{op.where}: parameter '{op.inputs[0]}' must have rank >= 1, got a scalar")
        r = w.shape[0]
        idx = _rows(op, r, indices, 1, op.inputs[0])

        def update(rows, entries):
            row = rows[0]
            wide = row.astype(jnp.float32)
            current = jnp.sqrt(jnp.sum(wide * wide, axis=1, keepdims=True))
            # Caffe2 multiplies the half row by the factor rounded to half (a zero row's 1e12 becomes inf)
            factor = (norm / (current + np.float32(1e-12))).astype(jnp.float16).astype(jnp.float32)
            scaled = (wide * factor).astype(jnp.float16)
            return [jnp.where(current <= norm, row, scaled) if use_max else scaled], []

        (nw,), _ = _sequential_rows([_table(w, r)], idx, [], update)
        return nw.reshape(w.shape)

    return kernel


@register("EnsureClipped", inputs=(1, 3))
def ensure_clipped(op: Op) -> Kernel:
    """(param[, indices, grad]) -> param clipped to [min, max] (each defaults to float's whole range); with
    indices, only the rows they name, in place."""
    low = np.float32(op.float("min", 0.0)) if op.has("min") else np.float32(np.finfo(np.float32).min)
    high = np.float32(op.float("max", 0.0)) if op.has("max") else np.float32(np.finfo(np.float32).max)
    if len(op.inputs) == 2:
        raise BadArgumentError(f"{op.where}: EnsureClipped takes (param) or (param, indices, grad), got 2 inputs")
    if len(op.inputs) == 3:
        _in_place(op, (0, 0))

    def kernel(w, *sparse):
        if w.dtype != jnp.float32:
            raise ShapeError(f"{op.where}: parameter '{op.inputs[0]}' must be float, got {w.dtype}")
        if not sparse:
            return jnp.minimum(jnp.maximum(w, low), high)
        indices, g = sparse
        idx, _, _ = _sparse_rows(op, w, indices, g, 1, 2)
        r = w.shape[0]
        table = _table(w, r)
        clipped = jnp.minimum(jnp.maximum(table[idx], low), high)
        return table.at[idx].set(clipped).reshape(w.shape)

    return kernel
