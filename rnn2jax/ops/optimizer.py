"""Training-step ops: the iteration counter, the learning-rate schedules, the SGD update (WeightedSum)
and Caffe2's optimizer updates (Adam, Adagrad, momentum SGD, Adadelta, Wngrad, RmsProp, Ftrl, their
sparse row-wise forms, Lars, ClipTensorByScaling, SparseNormalize), as pure functions of their inputs.

Caffe2 updates these blobs in place (`AtomicIter(mutex, iter) -> iter`, `WeightedSum(w, ONE, g, lr)
-> w`, `SparseAdagrad(w, h, indices, g, lr) -> (w, h)`); here an in-place op simply rebinds the blob to
a new array. Mutexes do not exist in a pure function: CreateMutex makes a placeholder that AtomicIter
ignores. The counter is int64, as in Caffe2 (caffe2/sgd/iter_op.h,
learning_rate_op.h, learning_rate_functors.h, adam_op.h, adagrad_op.h, momentum_sgd_op.h, ...;
caffe2/operators/utility_ops.h for WeightedSum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import first_bad, literal, runtime_check, runtime_checked
from .common import size_from_dim
from .facets import GRADIENT_OP, NO_ROLES, NO_SHAPE_RULE, Absent
from .gradient_makers import GradientContext, GradientOps, gradient_op, no_gradient, should_not_do_gradient
from .registry import Kernel, declare_family, facet, register
from .stats import counts_events

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=NO_SHAPE_RULE,
    gradient=Absent("a parameter update: Caffe2 says SHOULD_NOT_DO_GRADIENT, the builder has no maker for it"),
    emitter=Absent("a training-step op: the generated module is for inference and jax.grad"),
)

# --------------------------------------------------------------------------------------------------
# Iteration counters


def _check_in_place(op: Op, position: int) -> None:
    """Caffe2's EnforceInplace: the counter input and the output must be the same blob."""
    if op.inputs[position] != op.outputs[0]:
        raise BadArgumentError(
            f"{op.where}: {op.type} updates its counter in place: input '{op.inputs[position]}' and "
            f"output '{op.outputs[0]}' must be the same blob"
        )


def _increment(op: Op, counter: Any) -> Any:
    """`IncrementIter`: a one-element integer counter plus one (Caffe2 also rejects a negative count)."""
    if counter.size != 1:
        raise ShapeError(
            f"{op.where}: the iteration counter '{op.outputs[0]}' must hold one element, "
            f"got shape {list(counter.shape)}"
        )
    if not jnp.issubdtype(counter.dtype, jnp.integer):
        raise ShapeError(
            f"{op.where}: the iteration counter '{op.outputs[0]}' must be an integer (int64) tensor, "
            f"got {counter.dtype}"
        )
    return counter + jnp.ones((), counter.dtype)


@register("Iter", inputs=(0, 1), scoped=True, gradient=no_gradient)
def iter_(op: Op) -> Kernel:
    """(iter) -> iter + 1. The old form without an input increments the output blob if it already
    exists, and otherwise starts a new int64 [1] counter at 0, so its first run gives 1."""
    if op.inputs:
        _check_in_place(op, 0)

    def kernel(*counter, scope):
        if counter:
            return _increment(op, counter[0])
        if op.outputs[0] in scope:
            return _increment(op, scope[op.outputs[0]])
        return jnp.ones((1,), np.int64)

    return kernel


@register("AtomicIter", inputs=2, gradient=no_gradient)
def atomic_iter(op: Op) -> Kernel:
    """(mutex, iter) -> iter + 1; the mutex only serialised Caffe2's threads."""
    _check_in_place(op, 1)
    return lambda mutex, counter: _increment(op, counter)


# Caffe2's AtomicIterOpStats: "atomic_iter/stats/<iter blob>/num_iter" counts the op's runs
counts_events("AtomicIter", lambda op: (f"atomic_iter/stats/{op.inputs[1]}/num_iter",))


@register("CreateMutex", inputs=0, gradient=should_not_do_gradient)
def create_mutex(op: Op) -> Kernel:
    """A placeholder scalar standing for the mutex blob that AtomicIter takes."""
    return lambda: jnp.zeros((), jnp.int32)


# --------------------------------------------------------------------------------------------------
# LearningRate

# policy -> (build(args) -> multiplier(iteration as a 0-d integer array) -> float32 multiplier). Composite
# sub-policies read their arguments with a prefix (`sub_policy_0_gamma`), hence `_Args`.
Schedule = Callable[[Any], Any]
_F32 = jnp.float32


class _Args:
    """An op's arguments under a prefix (Caffe2's `arg_prefix`), with the op's location for errors."""

    def __init__(self, op: Op, prefix: str = ""):
        self.op, self.prefix, self.where = op, prefix, op.where

    def int(self, name: str, default: int) -> int:
        return self.op.int(self.prefix + name, default)

    def float(self, name: str, default: float) -> Any:
        return np.float32(self.op.float(self.prefix + name, default))

    def positive(self, name: str, default: int, policy: str) -> int:
        """An int Caffe2 divides by (0 kills it with SIGFPE): refused unless > 0."""
        value = self.int(name, default)
        if value <= 0:
            raise BadArgumentError(
                f"{self.where}: policy '{policy}' needs argument '{self.prefix + name}' > 0, got {value}"
            )
        return value


def _double(x: Any) -> Any:
    """Caffe2 computes parts of some schedules in double (its `1.`, `0.5` and std::pow(float, int))."""
    return jnp.asarray(x).astype(np.float64)


def _step(a: _Args) -> Schedule:
    """gamma ^ floor(iter / stepsize)."""
    stepsize = a.positive("stepsize", 0, "step")
    gamma = a.float("gamma", 0.0)
    return lambda it: jnp.power(gamma, jax.lax.div(it, jnp.asarray(stepsize, it.dtype)).astype(_F32))


def _exp(a: _Args) -> Schedule:
    """gamma ^ iter."""
    gamma = a.float("gamma", 0.0)
    return lambda it: jnp.power(gamma, it.astype(_F32))


def _inv_of(gamma: Any, power: Any) -> Schedule:
    return lambda it: jnp.power(1 + gamma * it.astype(_F32), -power)


def _inv(a: _Args) -> Schedule:
    """(1 + gamma · iter) ^ -power."""
    return _inv_of(a.float("gamma", 0.0), a.float("power", 0.0))


def _poly(a: _Args) -> Schedule:
    """(1 - iter / max_iter) ^ power. Caffe2 stores max_iter as uint64, so the default -1 (or any
    negative value) means 2^64 - 1 + 1 + max_iter: a rate that practically never decays."""
    max_iter = a.int("max_iter", -1)
    if max_iter == 0:
        raise BadArgumentError(f"{a.where}: policy 'poly' needs argument 'max_iter' != 0")
    power = a.float("power", 0.0)
    limit = np.float32(max_iter % (1 << 64))
    return lambda it: jnp.power(1 - it.astype(_F32) / limit, power)


def _linear_warmup_of(start: Any, num_iter: int) -> Schedule:
    """start + (1 - start) · iter / num_iter before num_iter (in double), then 1."""

    def schedule(it):
        ramp = _double(start) + (1.0 - _double(start)) * _double(it.astype(_F32)) / _double(np.float32(num_iter))
        return jnp.where(it >= num_iter, jnp.ones((), _F32), ramp.astype(_F32))

    return schedule


def _linear_warmup(a: _Args) -> Schedule:
    return _linear_warmup_of(a.float("start_multiplier", 0.0), a.int("num_iter", 0))


def _constant_warmup_of(multiplier: Any, num_iter: int) -> Schedule:
    return lambda it: jnp.where(it >= num_iter, jnp.ones((), _F32), multiplier)


def _constant_warmup(a: _Args) -> Schedule:
    """multiplier (0.5) before num_iter, then 1."""
    return _constant_warmup_of(a.float("multiplier", 0.5), a.int("num_iter", 0))


def _gate(a: _Args) -> Schedule:
    """multiplier_1 before num_iter, then multiplier_2 (both default 1)."""
    m1, m2, num_iter = a.float("multiplier_1", 1.0), a.float("multiplier_2", 1.0), a.int("num_iter", 0)
    return lambda it: jnp.where(it >= num_iter, m2, m1)


def _slope(a: _Args) -> Schedule:
    """multiplier_1 before num_iter_1, then the line from (num_iter_1, multiplier_1) to (num_iter_2,
    multiplier_2), never below multiplier_2 (learning_rate_functors.h's SlopeLearningRate; all default 0:
    0/0 there, and std::max(multiplier_2, NaN) is multiplier_2)."""
    m1, m2 = np.float32(a.float("multiplier_1", 0.0)), np.float32(a.float("multiplier_2", 0.0))
    n1, n2 = a.int("num_iter_1", 0), a.int("num_iter_2", 0)

    def schedule(it):
        line = m1 + (it - n1).astype(jnp.float32) * (m2 - m1) / jnp.float32(n2 - n1)
        return jnp.where(it < n1, m1, jnp.where(m2 < line, line, m2))

    return schedule


def _piece_warmup(a: _Args) -> Schedule:
    """m1 before n1, m2 before n2, then m3 (m's default 0.5, n's 0)."""
    m1, m2, m3 = a.float("m1", 0.5), a.float("m2", 0.5), a.float("m3", 0.5)
    n1, n2 = a.int("n1", 0), a.int("n2", 0)
    return lambda it: jnp.where(it < n1, m1, jnp.where(it < n2, m2, m3))


def _alter(a: _Args) -> Schedule:
    """1 for active_period iterations, 0 for inactive_period (the other way round without active_first),
    repeating; C++'s truncating %."""
    active_first = a.int("active_first", 1) != 0
    active, inactive = a.int("active_period", -1), a.int("inactive_period", -1)
    if active + inactive == 0:
        raise BadArgumentError(f"{a.where}: policy 'alter' needs active_period + inactive_period != 0")
    first = active if active_first else inactive
    on, off = (1.0, 0.0) if active_first else (0.0, 1.0)

    def schedule(it):
        phase = jax.lax.rem(it, jnp.asarray(active + inactive, it.dtype))
        return jnp.where(phase < first, np.float32(on), np.float32(off))

    return schedule


def _hill(a: _Args) -> Schedule:
    """Linear warmup over num_iter from start_multiplier, then max(end_multiplier, inv(iter - num_iter))."""
    num_iter = a.int("num_iter", 0)
    warmup = _linear_warmup_of(a.float("start_multiplier", 0.0), num_iter)
    inv = _inv_of(a.float("gamma", 0.0), a.float("power", 0.0))
    end = a.float("end_multiplier", 0.0)
    return lambda it: jnp.where(it < num_iter, warmup(it), jnp.maximum(end, inv(it - num_iter)))


def _cyclical_of(base_lr: Any, max_lr: Any, stepsize: int, decay: Any) -> Schedule:
    """Triangles from 1 to |max_lr / base_lr| with period 2 · stepsize, the peak decaying by `decay` per
    cycle (arXiv 1506.01186)."""
    ratio = np.float32(abs(max_lr)) / np.float32(abs(base_lr)) if base_lr != 0 else np.float32(np.inf)

    def schedule(it):
        cycles = jax.lax.div(it, jnp.asarray(2 * stepsize, it.dtype))
        x = jnp.abs(it.astype(_F32) / np.float32(stepsize) - (2 * (cycles + 1)).astype(_F32) + 1)
        decayed = jnp.power(_double(decay), _double(cycles))
        return (1 + _double((ratio - 1) * jnp.maximum(np.float32(0), 1 - x)) * decayed).astype(_F32)

    return schedule


def _cyclical(a: _Args, base_lr: Any) -> Schedule:
    stepsize = a.positive("stepsize", 0, "cyclical")
    return _cyclical_of(base_lr, a.float("max_lr", 0.005), stepsize, a.float("decay", 1.0))


def _cosine_of(min_lr: Any, max_lr: Any, period: int, t_mult: Any, lr_shrink: Any) -> Schedule:
    """SGDR's cosine annealing (arXiv 1608.03983) from max_lr to min_lr, periods growing by t_mult, both
    ends shrinking by lr_shrink per period. Returns the rate itself (Caffe2 then multiplies by base_lr)."""

    def schedule(it):
        t = _double(it)
        if t_mult != 1:
            i = jnp.floor(jnp.log(1 - t / period * (1.0 - _double(t_mult))) / jnp.log(_double(t_mult))).astype(_F32)
            t_i = jnp.power(t_mult, i) * np.float32(period)
            t_curr = (t - (1.0 - _double(jnp.power(t_mult, i))) / (1.0 - _double(t_mult)) * period).astype(_F32)
        else:
            i = jnp.floor(t / period).astype(_F32)
            t_i = np.float32(period)
            t_curr = (t - _double(t_i) * _double(i)).astype(_F32)
        shrink = jnp.power(lr_shrink, i)
        low, high = min_lr * shrink, max_lr * shrink
        value = _double(low) + 0.5 * _double(high - low) * (1 + jnp.cos(np.pi * _double(t_curr) / _double(t_i)))
        return value.astype(_F32)

    return schedule


def _cosine(a: _Args) -> Schedule:
    period = a.positive("period", 50, "cosine")
    return _cosine_of(
        a.float("min_lr", 0.1), a.float("max_lr", 0.5), period, a.float("t_mult", 1.0), a.float("lr_shrink", 0.99)
    )


def _constant_then_linear_of(start: Any, constant_iters: int, linear_iters: int) -> Schedule:
    constant = _constant_warmup_of(start, constant_iters)
    linear = _linear_warmup_of(start, linear_iters)

    def schedule(it):
        ramp = jnp.where(it < constant_iters + linear_iters, linear(it - constant_iters), jnp.ones((), _F32))
        return jnp.where(it < constant_iters, constant(it), ramp)

    return schedule


def _warmup_args(a: _Args) -> tuple[Any, int, int]:
    return (
        a.float("start_warmup_multiplier", 0.1),
        a.int("constant_warmup_num_iter", 10000000),
        a.int("linear_warmup_num_iter", 10000000),
    )


def _constant_then_linear_warmup(a: _Args) -> Schedule:
    """start_warmup_multiplier for constant_warmup_num_iter, then a linear ramp to 1 over
    linear_warmup_num_iter, then 1."""
    return _constant_then_linear_of(*_warmup_args(a))


def _then(warmup: Schedule, iters: int, after: Schedule) -> Schedule:
    return lambda it: jnp.where(it < iters, warmup(it), after(it - iters))


def _composite_cyclical(a: _Args, base_lr: Any) -> Schedule:
    """constantThenLinearWarmup, then cyclical (cyclical_max_lr, cyclical_step_size, cyclical_decay)."""
    start, constant_iters, linear_iters = _warmup_args(a)
    stepsize = a.positive("cyclical_step_size", 1000000, "compositeCyclical")
    cyclical = _cyclical_of(base_lr, a.float("cyclical_max_lr", 0.05), stepsize, a.float("cyclical_decay", 1.0))
    warmup = _constant_then_linear_of(start, constant_iters, linear_iters)
    return _then(warmup, constant_iters + linear_iters, cyclical)


def _composite_cosine(a: _Args) -> Schedule:
    """constantThenLinearWarmup, then cosine (cosine_min_lr, cosine_max_lr, cosine_period, ...)."""
    start, constant_iters, linear_iters = _warmup_args(a)
    cosine = _cosine_of(
        a.float("cosine_min_lr", 0.01),
        a.float("cosine_max_lr", 0.05),
        a.positive("cosine_period", 50, "compositeCosine"),
        a.float("cosine_t_mult", 1.0),
        a.float("cosine_lr_shrink", 0.99),
    )
    return _then(_constant_then_linear_of(start, constant_iters, linear_iters), constant_iters + linear_iters, cosine)


def _composite(a: _Args, base_lr: Any) -> Schedule:
    """Sub-policies `sub_policy_{k}_policy` (arguments `sub_policy_{k}_*`, scale `sub_policy_{k}_lr_scale`)
    for `sub_policy_num_iters[k]` iterations each, all fed the global iteration. Caffe2 starts the first
    at iteration 1 and reads iteration 0 through an invalid map iterator; it lands on the first policy, as
    here."""
    counts = a.op.ints("sub_policy_num_iters", [])
    if not counts:
        raise BadArgumentError(f"{a.where}: policy 'composite' needs a non-empty 'sub_policy_num_iters'")
    starts, schedules, scales = [], [], []
    start = 1
    for k, count in enumerate(counts):
        if count <= 0:
            raise BadArgumentError(f"{a.where}: sub_policy_num_iters[{k}] = {count} must be positive")
        prefix = f"sub_policy_{k}_"
        policy = a.op.str(prefix + "policy", "")
        if policy == "composite":
            raise BadArgumentError(f"{a.where}: a composite policy cannot be a sub-policy of a composite policy")
        schedules.append(_schedule(a.op, policy, base_lr, prefix))
        scales.append(np.float32(a.op.float(prefix + "lr_scale", 1.0)))
        starts.append(start)
        start += count

    def schedule(it):
        value = schedules[0](it) * scales[0]
        for begin, sub, scale in zip(starts[1:], schedules[1:], scales[1:], strict=True):
            value = jnp.where(it >= begin, sub(it) * scale, value)
        return value

    return schedule


_POLICIES: dict[str, Callable[[_Args], Schedule]] = {
    "fixed": lambda a: lambda it: jnp.ones((), _F32),
    "step": _step,
    "exp": _exp,
    "inv": _inv,
    "poly": _poly,
    "linearWarmup": _linear_warmup,
    "constantWarmup": _constant_warmup,
    "gate": _gate,
    "slope": _slope,
    "pieceWarmup": _piece_warmup,
    "alter": _alter,
    "hill": _hill,
    "cosine": _cosine,
    "constantThenLinearWarmup": _constant_then_linear_warmup,
    "compositeCosine": _composite_cosine,
}
# Policies that read the op's base_lr (cyclical ones scale between base_lr and max_lr).
_BASE_LR_POLICIES: dict[str, Callable[[_Args, Any], Schedule]] = {
    "cyclical": _cyclical,
    "compositeCyclical": _composite_cyclical,
    "composite": _composite,
}


def _schedule(op: Op, policy: str, base_lr: Any, prefix: str = "") -> Schedule:
    args = _Args(op, prefix)
    if policy in _POLICIES:
        return _POLICIES[policy](args)
    if policy in _BASE_LR_POLICIES:
        return _BASE_LR_POLICIES[policy](args, base_lr)
    supported = ", ".join(sorted([*_POLICIES, *_BASE_LR_POLICIES]))
    raise BadArgumentError(f"{op.where}: learning rate policy {policy!r} is not supported; supported: {supported}")


@register("LearningRate", gradient=no_gradient)
def learning_rate(op: Op) -> Kernel:
    """(iter) -> 0-d float32 `base_lr · policy(iter)`, exactly as Caffe2's functors
    (caffe2/sgd/learning_rate_functors.h; float32 with Caffe2's double steps, its argument defaults).
    Policies: fixed, step, exp, inv, poly, linearWarmup, constantWarmup, gate, pieceWarmup, alter,
    hill, cyclical, cosine, constantThenLinearWarmup, compositeCyclical, compositeCosine, composite."""
    if not op.has("base_lr"):
        raise BadArgumentError(f"{op.where}: missing required argument 'base_lr'")
    # Caffe2's LearningRateOp never reads `lr_scale` (its Python optimizers fold it into base_lr), so an
    # op carrying one runs at base_lr: real Caffe2 gives 1.0 for base_lr=1, lr_scale=0 (policy fixed).
    # Composite sub-policies do apply their `sub_policy_{k}_lr_scale`.
    base_lr = np.float32(op.float("base_lr"))
    policy = op.str("policy", "")
    if not policy:
        raise BadArgumentError(f"{op.where}: missing required argument 'policy' (the learning rate policy)")
    schedule = _schedule(op, policy, base_lr)

    def kernel(counter):
        if counter.size < 1 or not jnp.issubdtype(counter.dtype, jnp.integer):
            raise ShapeError(
                f"{op.where}: the iteration counter '{op.inputs[0]}' must be a non-empty integer tensor, "
                f"got {counter.dtype}{list(counter.shape)}"
            )
        return base_lr * schedule(counter.reshape(-1)[0])

    return kernel


# --------------------------------------------------------------------------------------------------
# WeightedSum


def _weight(op: Op, w: Any, position: int, dtype: Any) -> Any:
    if w.size != 1:
        raise ShapeError(f"{op.where}: weight '{op.inputs[position]}' must hold one element, got shape {list(w.shape)}")
    return w.reshape(()).astype(dtype)


@register("WeightedSum", inputs=(2, None))
def weighted_sum(op: Op) -> Kernel:
    """(X0, w0, X1, w1, ...) -> Σ wi · Xi, shaped like X0. Each wi holds one number; each Xi has as
    many elements as X0. Only X0 may be the output blob (in-place update)."""
    if len(op.inputs) % 2:
        raise BadArgumentError(f"{op.where}: WeightedSum takes pairs (X0, w0, X1, w1, ...), got an odd count")
    for name in op.inputs[2::2]:
        if name == op.outputs[0]:
            raise BadArgumentError(
                f"{op.where}: input '{name}' is the output; only X0 (input #0) may be updated in place"
            )

    def kernel(*inputs):
        x0 = inputs[0]
        if x0.size == 0:
            raise ShapeError(f"{op.where}: X0 '{op.inputs[0]}' is empty")
        total = _weight(op, inputs[1], 1, x0.dtype) * x0
        for i in range(2, len(inputs), 2):
            x = inputs[i]
            if x.size != x0.size:
                raise ShapeError(
                    f"{op.where}: X{i // 2} '{op.inputs[i]}' {list(x.shape)} must have as many elements "
                    f"as X0 '{op.inputs[0]}' {list(x0.shape)}"
                )
            total = total + _weight(op, inputs[i + 1], i + 1, x0.dtype) * x.reshape(x0.shape).astype(x0.dtype)
        return total

    return kernel


@facet("gradient", "WeightedSum")
def _weighted_sum_gradient_maker(g: GradientContext) -> GradientOps:
    """The Xs' gradients, and with `grad_on_w` the weights' too."""
    n = len(g.op.input)
    outputs = [g.GI(i) for i in range(0, n, 2)]
    if g.flag("grad_on_w", False):
        outputs += [g.GI(i) for i in range(1, n, 2)]
    return [gradient_op("WeightedSumGradient", [g.GO(0), *g.op.input], outputs)]


@register("WeightedSumGradient", inputs=(3, None), outputs=(1, None), gradient=GRADIENT_OP)
def weighted_sum_gradient(op: Op) -> Kernel:
    """(dY, X0, w0, X1, w1, ...) -> (dX0, dX1, ...[, dw0, dw1, ...]): dXi = wi · dY; with `grad_on_w`
    also dwi = [Σ dY · Xi] (shape [1])."""
    grad_on_w = op.bool("grad_on_w", False)
    if len(op.inputs) % 2 == 0:
        raise BadArgumentError(f"{op.where}: WeightedSumGradient takes dY then pairs (X0, w0, ...)")
    pairs = len(op.inputs) // 2
    expected = 2 * pairs if grad_on_w else pairs
    if len(op.outputs) != expected:
        raise BadArgumentError(
            f"{op.where}: with grad_on_w={int(grad_on_w)} WeightedSumGradient has {expected} outputs for "
            f"{pairs} (X, w) pairs, got {len(op.outputs)}"
        )

    def kernel(dy, *inputs):
        xs, ws = inputs[0::2], inputs[1::2]
        dxs = [_weight(op, w, 2 * i + 2, dy.dtype) * dy for i, w in enumerate(ws)]
        if not grad_on_w:
            return tuple(dxs)
        dws = []
        for i, x in enumerate(xs):
            if x.size != dy.size:
                raise ShapeError(
                    f"{op.where}: X{i} '{op.inputs[2 * i + 1]}' {list(x.shape)} must have as many "
                    f"elements as dY '{op.inputs[0]}' {list(dy.shape)}"
                )
            dws.append(jnp.sum(dy.reshape(-1) * x.reshape(-1).astype(dy.dtype)).reshape(1))
        return (*dxs, *dws)

    return kernel


# --------------------------------------------------------------------------------------------------
# Optimizer updates (caffe2/sgd/*_op.h): each takes the parameter, its moments, the gradient and the
# learning rate and returns the new parameter and moments (Caffe2 usually runs them in place). Caffe2
# registers them for float only; float64 is accepted here for the float64 verification mode.


def _f(op: Op, x: Any, position: int) -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ShapeError(f"{op.where}: input '{op.inputs[position]}' must be a float tensor, got {x.dtype}")


def _scalar(op: Op, x: Any, position: int, what: str = "the learning rate") -> Any:
    """A one-element input (lr, alpha, ...) as a 0-d array."""
    if x.size != 1:
        raise ShapeError(f"{op.where}: {what} '{op.inputs[position]}' must hold one element, got shape {list(x.shape)}")
    return x.reshape(())


def _same_numel(op: Op, ref: Any, ref_position: int, *others: tuple[Any, int]) -> None:
    for x, position in others:
        if x.size != ref.size:
            raise ShapeError(
                f"{op.where}: '{op.inputs[position]}' {list(x.shape)} must have as many elements as "
                f"'{op.inputs[ref_position]}' {list(ref.shape)}"
            )


def _iteration(op: Op, counter: Any, position: int) -> Any:
    """The iteration counter's first value (Caffe2 reads int64 data from the CPU tensor)."""
    if counter.size < 1 or not jnp.issubdtype(counter.dtype, jnp.integer):
        raise ShapeError(
            f"{op.where}: the iteration counter '{op.inputs[position]}' must be a non-empty int64 tensor, "
            f"got {counter.dtype}{list(counter.shape)}"
        )
    return counter.reshape(-1)[0]


def _power(base: float, exponent: Any) -> Any:
    """Caffe2 computes the bias corrections with std::pow(float, int64): in double."""
    return jnp.power(_double(np.float32(base)), _double(exponent))


def _in_place(op: Op, *pairs: tuple[int, int]) -> None:
    """Caffe2's EnforceInplace: output j must be the blob of input i (the schema check refuses otherwise)."""
    for i, j in pairs:
        if j < len(op.outputs) and op.inputs[i] != op.outputs[j]:
            raise BadArgumentError(
                f"{op.where}: {op.type} updates input '{op.inputs[i]}' in place: output #{j} must be the same "
                f"blob, got '{op.outputs[j]}'"
            )


runtime_checked(
    "SparseAdam",
    "RowWiseSparseAdam",
    "SparseAdagrad",
    "RowWiseSparseAdagrad",
    "SparseMomentumSGDUpdate",
    "SparseAdadelta",
    "SparseWngrad",
    "SparseFtrl",
    "SparseNormalize",
)

# Sparse updates: only the rows named by INDICES change. Caffe2 loops over the indices in order on
# in-place blobs, so an index listed twice is updated twice, the second time from the first's result.
# Here entries are grouped into rounds by occurrence (the k-th occurrence of each row runs in round k):
# within a round the rows are distinct and updated at once; a batch without repeats is one round.


def _occurrence_rank(idx: Any) -> Any:
    """rank[i] = how many earlier entries name the same row as entry i."""
    n = idx.shape[0]
    order = jnp.argsort(idx, stable=True)
    ordered = idx[order]
    positions = jnp.arange(n)
    starts = jnp.concatenate([jnp.ones((1,), bool), ordered[1:] != ordered[:-1]])
    group_start = jax.lax.cummax(jnp.where(starts, positions, 0))
    return jnp.zeros((n,), jnp.int32).at[order].set((positions - group_start).astype(jnp.int32))


def _sequential_rows(
    tables: list[Any], idx: Any, entries: list[Any], update: Callable[[list[Any], list[Any]], tuple[list, list]]
) -> tuple[list[Any], list[Any]]:
    """Apply `update(rows, entries) -> (new rows, per-entry outputs)` (vectorised over the n entries) to
    the rows `idx` of each table in Caffe2's order. Returns the new tables and the per-entry outputs."""
    n = idx.shape[0]
    count = tables[0].shape[0]
    shapes = jax.eval_shape(update, [t[idx] for t in tables], entries)
    outs = [jnp.zeros(s.shape, s.dtype) for s in shapes[1]]
    if n == 0:
        return tables, outs
    rank = _occurrence_rank(idx)

    def round_(r, state):
        tabs, outs = state
        active = rank == r
        new_rows, new_outs = update([t[idx] for t in tabs], entries)
        target = jnp.where(active, idx, count)  # inactive entries scatter out of range: dropped
        tabs = [t.at[target].set(v.astype(t.dtype), mode="drop") for t, v in zip(tabs, new_rows, strict=True)]
        outs = [
            jnp.where(active.reshape((n,) + (1,) * (v.ndim - 1)), v, o) for v, o in zip(new_outs, outs, strict=True)
        ]
        return tabs, outs

    return jax.lax.fori_loop(0, jnp.max(rank) + 1, round_, (list(tables), outs))


def _sparse_rows(op: Op, param: Any, indices: Any, grad: Any, ip: int, gp: int, pp: int = 0) -> tuple[Any, Any, int]:
    """(indices as [n], grad as [n, block], block) for PARAM [R, ...], checked as Caffe2 does (PARAM's row
    size equals GRAD's size from INDICES' rank), with a run-time check that every index is a row."""
    _f(op, param, pp)
    _f(op, grad, gp)
    if indices.dtype not in (jnp.int32, jnp.int64):
        raise ShapeError(f"{op.where}: indices '{op.inputs[ip]}' must be int32 or int64, got {indices.dtype}")
    if param.ndim < 1:
        raise ShapeError(f"{op.where}: parameter '{op.inputs[pp]}' must have rank >= 1, got a scalar")
    block = size_from_dim(param.shape, 1)
    n = indices.size
    if indices.ndim > grad.ndim or size_from_dim(grad.shape, indices.ndim) != block or grad.size != n * block:
        raise ShapeError(
            f"{op.where}: gradient '{op.inputs[gp]}' {list(grad.shape)} must be indices' shape "
            f"{list(indices.shape)} followed by the parameter's row shape {list(param.shape[1:])}"
        )
    flat = indices.reshape(n)
    rows = param.shape[0]
    if rows == 0 and n:
        raise ShapeError(f"{op.where}: parameter '{op.inputs[pp]}' has no rows for indices '{op.inputs[ip]}'")
    bad = (flat < 0) | (flat >= rows)
    runtime_check(
        ~jnp.any(bad),
        f"{literal(op.where)}: indices '{literal(op.inputs[ip])}' hold {{bad}}, out of the range [0, {rows})",
        bad=first_bad(flat, bad),
    )
    return jnp.clip(flat, 0, max(rows - 1, 0)), grad.reshape(n, block), block


def _table(x: Any, rows: int) -> Any:
    return x.reshape(rows, -1)


# --- Adam ----------------------------------------------------------------------------------------


def _adam_args(op: Op) -> tuple[float, float, Any]:
    return op.float("beta1", 0.9), op.float("beta2", 0.999), np.float32(op.float("epsilon", 1e-5))


def _radam_terms(beta1: float, beta2: float, it: Any) -> tuple[Any, Any, Any]:
    """SparseAdam's RAdam (enableRAdam): (rectified, scale of the Adam step, scale of the plain momentum step):
    with ρ∞ = 2/(1-β2) - 1 and ρt = ρ∞ - 2t·β2^t/(1-β2^t), the step is r_t·c·m/(√v + ε) where ρt >= 5, with
    r_t = √((ρt-4)(ρt-2)/ρt) · √(ρ∞/((ρ∞-4)(ρ∞-2))) and c Adam's correction, else m/(1-β1^t)."""
    b2 = np.float32(beta2)
    t = it.astype(jnp.int64) + 1
    p1, p2 = _power(beta1, t), _power(beta2, t)
    rho_inf = np.float32(2) / (np.float32(1) - b2) - np.float32(1)
    rho_t = _double(rho_inf) - _double(np.float32(2) * t.astype(jnp.float32)) * p2 / (1 - p2)
    r_correction = np.float32(np.sqrt(rho_inf / ((rho_inf - 4) * (rho_inf - 2)))) if rho_inf > 4 else np.float32(0)
    safe = jnp.where(rho_t > 0, rho_t, 1.0)
    r_t = (jnp.sqrt(jnp.abs((rho_t - 4) * (rho_t - 2) / safe)) * r_correction).astype(jnp.float32)
    correction = (jnp.sqrt(1 - p2) / (1 - p1)).astype(jnp.float32)
    return rho_t >= 5, r_t * correction, (1 / (1 - p1)).astype(jnp.float32)


def _adam_correction(beta1: float, beta2: float, it: Any, dtype: Any) -> Any:
    t = it.astype(jnp.int64) + 1
    return (jnp.sqrt(1 - _power(beta2, t)) / (1 - _power(beta1, t))).astype(dtype)


def _adam_step(w, g, m, v, lr, beta1, beta2, eps, correction):
    """(new w, new m, new v, the step without lr) of adam_compute(_output_grad)."""
    b1, b2 = np.float32(beta1), np.float32(beta2)
    nm = m * b1 + g * (1 - b1)
    nv = v * b2 + g * g * (1 - b2)
    return nm, nv, correction, jnp.sqrt(nv) + eps


@register("Adam", inputs=6, outputs=(3, 4))
def adam(op: Op) -> Kernel:
    """(param, m1, m2, grad, lr, iter) -> (param, m1, m2[, grad_out]): m1 = β1·m1 + (1-β1)·g,
    m2 = β2·m2 + (1-β2)·g², param += lr · c · m1 / (√m2 + ε) with c = √(1-β2^t) / (1-β1^t), t = iter + 1;
    grad_out is the step without lr."""
    beta1, beta2, eps = _adam_args(op)

    def kernel(w, m, v, g, lr, it):
        _f(op, w, 0)
        _same_numel(op, g, 3, (w, 0), (m, 1), (v, 2))
        lr = _scalar(op, lr, 4)
        c = _adam_correction(beta1, beta2, _iteration(op, it, 5), w.dtype)
        nm, nv, c, den = _adam_step(
            w, g.reshape(w.shape), m.reshape(w.shape), v.reshape(w.shape), lr, beta1, beta2, eps, c
        )
        if len(op.outputs) == 3:
            nw = w + lr * c * nm / den
            return nw, nm.reshape(m.shape), nv.reshape(v.shape)
        ng = c * nm / den
        return w + lr * ng, nm.reshape(m.shape), nv.reshape(v.shape), ng.reshape(g.shape)

    return kernel


@register("SparseAdam", inputs=7, outputs=(3, 4))
def sparse_adam(op: Op) -> Kernel:
    """(param, m1, m2, indices, grad, lr, iter) -> Adam on the rows of param, m1, m2 named by indices
    (in place); grad_out per gradient row. With enableRAdam, the rectified step of RAdam."""
    beta1, beta2, eps = _adam_args(op)
    radam = op.bool("enableRAdam", False)
    _in_place(op, (0, 0), (1, 1), (2, 2))

    def kernel(w, m, v, indices, g, lr, it):
        _same_numel(op, w, 0, (m, 1), (v, 2))
        idx, rows_g, _ = _sparse_rows(op, w, indices, g, 3, 4)
        lr = _scalar(op, lr, 5)
        step = _iteration(op, it, 6)
        c = _adam_correction(beta1, beta2, step, w.dtype)
        if radam:
            rectified, rect_scale, momentum_scale = _radam_terms(beta1, beta2, step)
        r = w.shape[0]

        def update(rows, entries):
            rw, rm, rv = rows
            nm, nv, cc, den = _adam_step(rw, entries[0], rm, rv, lr, beta1, beta2, eps, c)
            if not radam and len(op.outputs) == 3:
                return [rw + lr * cc * nm / den, nm, nv], []
            ng = jnp.where(rectified, rect_scale * nm / den, momentum_scale * nm) if radam else cc * nm / den
            if len(op.outputs) == 3:
                return [rw + lr * ng, nm, nv], []
            return [rw + lr * ng, nm, nv], [ng]

        (nw, nm, nv), outs = _sequential_rows([_table(w, r), _table(m, r), _table(v, r)], idx, [rows_g], update)
        result = (nw.reshape(w.shape), nm.reshape(m.shape), nv.reshape(v.shape))
        return result if len(op.outputs) == 3 else (*result, outs[0].reshape(g.shape))

    return kernel


@register("RowWiseSparseAdam", inputs=7, outputs=(3, 4))
def row_wise_sparse_adam(op: Op) -> Kernel:
    """SparseAdam with one second moment per row (m2 [R]): m2 = β2·m2 + (1-β2)·mean(g²) over the row."""
    beta1, beta2, eps = _adam_args(op)
    _in_place(op, (0, 0), (1, 1), (2, 2))

    def kernel(w, m, v, indices, g, lr, it):
        _same_numel(op, w, 0, (m, 1))
        if w.ndim < 1 or v.size != w.shape[0]:
            raise ShapeError(f"{op.where}: moment_2 '{op.inputs[2]}' must hold one value per row of the parameter")
        idx, rows_g, block = _sparse_rows(op, w, indices, g, 3, 4)
        lr = _scalar(op, lr, 5)
        c = _adam_correction(beta1, beta2, _iteration(op, it, 6), w.dtype)
        b1, b2 = np.float32(beta1), np.float32(beta2)
        r = w.shape[0]

        def update(rows, entries):
            rw, rm, rv = rows
            gr = entries[0]
            nv = rv * b2 + (jnp.sum(gr * gr, axis=1) / np.float32(block)) * (1 - b2)
            nm = rm * b1 + gr * (1 - b1)
            den = jnp.sqrt(nv)[:, None] + eps
            if len(op.outputs) == 3:
                return [rw + lr * c * nm / den, nm, nv], []
            ng = c * nm / den
            return [rw + lr * ng, nm, nv], [ng]

        (nw, nm, nv), outs = _sequential_rows([_table(w, r), _table(m, r), v.reshape(r)], idx, [rows_g], update)
        result = (nw.reshape(w.shape), nm.reshape(m.shape), nv.reshape(v.shape))
        return result if len(op.outputs) == 3 else (*result, outs[0].reshape(g.shape))

    return kernel


# --- Adagrad -------------------------------------------------------------------------------------


@register("Adagrad", inputs=4, outputs=(2, 4))
def adagrad(op: Op) -> Kernel:
    """(param, moment, grad, lr) -> (param, moment[, effective_lr[, update]]): g' = g + weight_decay·w,
    moment = decay·moment + g'², param += lr · g' / (√moment + ε)."""
    eps = np.float32(op.float("epsilon", 1e-5))
    decay = np.float32(op.float("decay", 1.0))
    weight_decay = np.float32(op.float("weight_decay", 0.0))

    def kernel(w, h, g, lr):
        _f(op, w, 0)
        _same_numel(op, g, 2, (h, 1), (w, 0))
        lr = _scalar(op, lr, 3)
        gi = weight_decay * w + g.reshape(w.shape)
        nh = decay * h.reshape(w.shape) + gi * gi
        if len(op.outputs) == 2:
            return w + lr * gi / (jnp.sqrt(nh) + eps), nh.reshape(h.shape)
        effective = lr / (jnp.sqrt(nh) + eps)
        step = effective * gi
        outs = (w + step, nh.reshape(h.shape), effective.reshape(g.shape))
        return outs if len(op.outputs) == 3 else (*outs, step.reshape(g.shape))

    return kernel


def _sparse_adagrad_args(op: Op) -> tuple[Any, Any]:
    return np.float32(op.float("epsilon", 1e-5)), np.float32(op.float("weight_decay", 0.0))


@register("SparseAdagrad", inputs=5, outputs=2)
def sparse_adagrad(op: Op) -> Kernel:
    """(param, moment, indices, grad, lr) -> Adagrad on the rows named by indices (in place; no decay)."""
    eps, weight_decay = _sparse_adagrad_args(op)
    if op.float("decay", 1.0) != 1.0:
        raise BadArgumentError(f"{op.where}: SparseAdagrad does not support 'decay' (it must be 1)")
    _in_place(op, (0, 0), (1, 1))

    def kernel(w, h, indices, g, lr):
        _same_numel(op, w, 0, (h, 1))
        idx, rows_g, _ = _sparse_rows(op, w, indices, g, 2, 3)
        lr = _scalar(op, lr, 4)
        r = w.shape[0]

        def update(rows, entries):
            rw, rh = rows
            gi = weight_decay * rw + entries[0]
            nh = rh + gi * gi
            return [rw + lr * gi / (jnp.sqrt(nh) + eps), nh], []

        (nw, nh), _ = _sequential_rows([_table(w, r), _table(h, r)], idx, [rows_g], update)
        return nw.reshape(w.shape), nh.reshape(h.shape)

    return kernel


@register("RowWiseSparseAdagrad", inputs=(5, 6), outputs=2)
def row_wise_sparse_adagrad(op: Op) -> Kernel:
    """(param, moment [R], indices, grad, lr[, counter [R]]): one moment per row, moment += mean(g'²) over the
    row. With the counter (RowWiseCounter's, double) and counter_halflife > 0, a row's weight decay is scaled by
    counter_halflife / counter[row] where its counter is positive."""
    eps, weight_decay = _sparse_adagrad_args(op)
    halflife = op.int("counter_halflife", -1)
    _in_place(op, (0, 0), (1, 1))

    def kernel(w, h, indices, g, lr, *counter):
        if w.ndim < 1 or h.size != w.shape[0]:
            raise ShapeError(f"{op.where}: moment '{op.inputs[1]}' must hold one value per row of the parameter")
        idx, rows_g, block = _sparse_rows(op, w, indices, g, 2, 3)
        lr = _scalar(op, lr, 4)
        r = w.shape[0]
        decay = jnp.full((idx.shape[0], 1), weight_decay, jnp.float32)
        if counter and halflife > 0:
            if counter[0].size < r:
                raise ShapeError(f"{op.where}: counter '{op.inputs[5]}' must hold one value per row of the parameter")
            count = counter[0].reshape(-1)[idx].astype(jnp.float64)
            safe = jnp.where(count > 0, count, 1.0)
            scale = jnp.where(count > 0, (np.float64(halflife) / safe).astype(jnp.float32), np.float32(1))
            decay = decay * scale[:, None]

        def update(rows, entries):
            rw, rh = rows
            gi = entries[1] * rw + entries[0]
            nh = rh + jnp.sum(gi * gi, axis=1) / np.float32(max(block, 1))
            return [rw + (lr / (jnp.sqrt(nh) + eps))[:, None] * gi, nh], []

        (nw, nh), _ = _sequential_rows([_table(w, r), h.reshape(r)], idx, [rows_g, decay], update)
        return nw.reshape(w.shape), nh.reshape(h.shape)

    return kernel


@register("DecayAdagrad", inputs=6, outputs=3)
def decay_adagrad(op: Op) -> Kernel:
    """(param, m1, m2, grad, lr, iter): m1 = β1·m1 + (1-β1)·g, m2 += g², param += lr · (m1 / c / (√m2 + ε)
    + weight_decay · param), c = 1 - β1^t (1 without bias_correction_first)."""
    beta1 = op.float("beta1", 0.9)
    eps = np.float32(op.float("epsilon", 1e-5))
    weight_decay = np.float32(op.float("weight_decay", 0.0))
    first = op.bool("bias_correction_first", True)

    def kernel(w, m, v, g, lr, it):
        _f(op, w, 0)
        _same_numel(op, g, 3, (w, 0), (m, 1), (v, 2))
        lr = _scalar(op, lr, 4)
        t = _iteration(op, it, 5) + 1
        c = (1 - _power(beta1, t)).astype(w.dtype) if first else jnp.ones((), w.dtype)
        g = g.reshape(w.shape)
        b1 = np.float32(beta1)
        nm = m.reshape(w.shape) * b1 + g * (1 - b1)
        nv = v.reshape(w.shape) + g * g
        nw = w + lr * (nm / c / (jnp.sqrt(nv) + eps) + weight_decay * w)
        return nw, nm.reshape(m.shape), nv.reshape(v.shape)

    return kernel


# --- Momentum SGD --------------------------------------------------------------------------------


def _momentum_step(g, m, lr, momentum, nesterov):
    """(new grad, new moment) of momentum_sgd_update."""
    if not nesterov:
        adjusted = lr * g + momentum * m
        return adjusted, adjusted
    nm = momentum * m + lr * g
    return (1 + momentum) * nm - momentum * m, nm


def _momentum_args(op: Op) -> tuple[Any, bool]:
    return np.float32(op.float("momentum", 0.0)), op.bool("nesterov", False)


@register("MomentumSGD", inputs=3, outputs=2)
def momentum_sgd(op: Op) -> Kernel:
    """(grad, moment, lr) -> (grad, moment): moment = lr·g + μ·moment and grad = moment (Nesterov:
    moment = μ·moment + lr·g, grad = (1+μ)·moment' - μ·moment)."""
    momentum, nesterov = _momentum_args(op)

    def kernel(g, m, lr):
        _f(op, g, 0)
        _same_numel(op, g, 0, (m, 1))
        ng, nm = _momentum_step(g, m.reshape(g.shape), _scalar(op, lr, 2), momentum, nesterov)
        return ng, nm.reshape(m.shape)

    return kernel


@register("MomentumSGDUpdate", inputs=4, outputs=3)
def momentum_sgd_update(op: Op) -> Kernel:
    """(grad, moment, lr, param) -> (grad, moment, param - grad), param updated in place."""
    momentum, nesterov = _momentum_args(op)
    _in_place(op, (3, 2))

    def kernel(g, m, lr, w):
        _f(op, g, 0)
        _same_numel(op, g, 0, (m, 1))
        _same_numel(op, g, 0, (w, 3))
        ng, nm = _momentum_step(g, m.reshape(g.shape), _scalar(op, lr, 2), momentum, nesterov)
        return ng, nm.reshape(m.shape), w - ng.reshape(w.shape)

    return kernel


@register("SparseMomentumSGDUpdate", inputs=5, outputs=3)
def sparse_momentum_sgd_update(op: Op) -> Kernel:
    """(grad, moment, lr, param, indices) -> MomentumSGDUpdate on the rows named by indices; grad_out
    is the adjusted gradient of each gradient row."""
    momentum, nesterov = _momentum_args(op)
    _in_place(op, (1, 1), (3, 2))

    def kernel(g, m, lr, w, indices):
        _same_numel(op, w, 3, (m, 1))
        if w.ndim < 1:
            raise ShapeError(f"{op.where}: parameter '{op.inputs[3]}' must have rank >= 1, got a scalar")
        _f(op, w, 3)
        idx, rows_g, _ = _sparse_rows(op, w, indices, g, 4, 0, pp=3)
        lr = _scalar(op, lr, 2)
        r = w.shape[0]

        def update(rows, entries):
            rm, rw = rows
            ng, nm = _momentum_step(entries[0], rm, lr, momentum, nesterov)
            return [nm, rw - ng], [ng]

        (nm, nw), (ng,) = _sequential_rows([_table(m, r), _table(w, r)], idx, [rows_g], update)
        return ng.reshape(g.shape), nm.reshape(m.shape), nw.reshape(w.shape)

    return kernel


# --- Adadelta ------------------------------------------------------------------------------------


def _adadelta_args(op: Op) -> tuple[Any, Any]:
    eps, decay = op.float("epsilon", 1e-5), op.float("decay", 0.95)
    if eps < 0:
        raise BadArgumentError(f"{op.where}: argument 'epsilon' = {eps} must be >= 0")
    if not 0 < decay < 1:
        raise BadArgumentError(f"{op.where}: argument 'decay' = {decay} must be in (0, 1)")
    return np.float32(eps), np.float32(decay)


def _adadelta_step(w, g, h, d, lr, eps, decay):
    nh = decay * h + (1 - decay) * g * g
    ng = (jnp.sqrt(d + eps) / jnp.sqrt(nh + eps)) * g
    return w + lr * ng, nh, decay * d + (1 - decay) * ng * ng


@register("Adadelta", inputs=5, outputs=3)
def adadelta(op: Op) -> Kernel:
    """(param, moment, moment_delta, grad, lr): h = ρ·h + (1-ρ)·g², step = √(d + ε) / √(h + ε) · g,
    param += lr · step, d = ρ·d + (1-ρ)·step²."""
    eps, decay = _adadelta_args(op)

    def kernel(w, h, d, g, lr):
        _f(op, w, 0)
        _same_numel(op, g, 3, (h, 1), (d, 2), (w, 0))
        s = w.shape
        nw, nh, nd = _adadelta_step(w, g.reshape(s), h.reshape(s), d.reshape(s), _scalar(op, lr, 4), eps, decay)
        return nw, nh.reshape(h.shape), nd.reshape(d.shape)

    return kernel


@register("SparseAdadelta", inputs=6, outputs=3)
def sparse_adadelta(op: Op) -> Kernel:
    """Adadelta on the rows named by indices (param, moment, moment_delta, indices, grad, lr)."""
    eps, decay = _adadelta_args(op)
    _in_place(op, (0, 0), (1, 1), (2, 2))

    def kernel(w, h, d, indices, g, lr):
        _same_numel(op, w, 0, (h, 1), (d, 2))
        idx, rows_g, _ = _sparse_rows(op, w, indices, g, 3, 4)
        lr = _scalar(op, lr, 5)
        r = w.shape[0]

        def update(rows, entries):
            return list(_adadelta_step(rows[0], entries[0], rows[1], rows[2], lr, eps, decay)), []

        (nw, nh, nd), _ = _sequential_rows([_table(w, r), _table(h, r), _table(d, r)], idx, [rows_g], update)
        return nw.reshape(w.shape), nh.reshape(h.shape), nd.reshape(d.shape)

    return kernel


# --- Wngrad --------------------------------------------------------------------------------------


@register("Wngrad", inputs=4, outputs=(2, 4))
def wngrad(op: Op) -> Kernel:
    """(param, seq_b, grad, lr) -> (param, seq_b[, effective_lr[, update]]): param += lr · g / (b + ε),
    b += Σ g² / (b + ε)."""
    eps = np.float32(op.float("epsilon", 1e-5))

    def kernel(w, b, g, lr):
        _f(op, w, 0)
        _same_numel(op, g, 2, (w, 0))
        lr = _scalar(op, lr, 3)
        b0 = _scalar(op, b, 1, "seq_b")
        gs = g.reshape(w.shape)
        nb = (b0 + jnp.sum(g * g) / (b0 + eps)).reshape(b.shape)
        if len(op.outputs) == 2:
            return w + lr * gs / (b0 + eps), nb
        effective = lr / (b0 + eps)
        step = effective * gs
        outs = (w + step, nb, effective.reshape(b.shape))
        return outs if len(op.outputs) == 3 else (*outs, step.reshape(g.shape))

    return kernel


@register("SparseWngrad", inputs=5, outputs=2)
def sparse_wngrad(op: Op) -> Kernel:
    """(param, seq_b, indices, grad, lr): the rows named by indices += lr · g / (b + ε); b += Σ g² / b
    (Caffe2 divides by b without ε here)."""
    eps = np.float32(op.float("epsilon", 1e-5))
    _in_place(op, (0, 0), (1, 1))

    def kernel(w, b, indices, g, lr):
        b0 = _scalar(op, b, 1, "seq_b")
        idx, rows_g, _ = _sparse_rows(op, w, indices, g, 2, 3)
        lr = _scalar(op, lr, 4)
        r = w.shape[0]

        def update(rows, entries):
            return [rows[0] + lr * entries[0] / (b0 + eps)], []

        (nw,), _ = _sequential_rows([_table(w, r)], idx, [rows_g], update)
        nb = (jnp.sum(g * g) / b0 + b0).reshape(b.shape)
        return nw.reshape(w.shape), nb

    return kernel


# --- RmsProp -------------------------------------------------------------------------------------


@register("RmsProp", inputs=4, outputs=3)
def rms_prop(op: Op) -> Kernel:
    """(grad, mean_squares, mom, lr) -> (grad_o, ms_o, mom_o): ms += (1 - decay) · (g² - ms),
    mom = momentum · mom + lr · g / √(ε + ms), grad_o = mom."""
    decay = np.float32(op.float("decay", 0.9))
    momentum = np.float32(op.float("momentum", 0.0))
    eps = np.float32(op.float("epsilon", 1e-5))

    def kernel(g, ms, mom, lr):
        _f(op, g, 0)
        _same_numel(op, g, 0, (ms, 1), (mom, 2))
        lr = _scalar(op, lr, 3)
        nms = ms.reshape(g.shape) + (1 - decay) * (g * g - ms.reshape(g.shape))
        nmom = mom.reshape(g.shape) * momentum + lr * g / jnp.sqrt(eps + nms)
        return nmom, nms.reshape(ms.shape), nmom.reshape(mom.shape)

    return kernel


# --- Ftrl ----------------------------------------------------------------------------------------


def _ftrl_args(op: Op, alpha_position: int) -> tuple[Any, Any, Any, Any]:
    if op.has("alpha") and len(op.inputs) > alpha_position:
        raise BadArgumentError(f"{op.where}: cannot specify alpha by both input and argument")
    return (
        np.float32(1.0 / np.float32(op.float("alpha", 0.005))),
        np.float32(op.float("beta", 1.0)),
        np.float32(op.float("lambda1", 0.001)),
        np.float32(op.float("lambda2", 0.001)),
    )


def _ftrl_step(w, n, z, g, alpha_inv, beta, lambda1, lambda2):
    """ftrl_compute: (new w, new n, new z)."""
    new_n = n + g * g
    sigma = (jnp.sqrt(new_n) - jnp.sqrt(n)) * alpha_inv
    nz = z + g - sigma * w
    nw = (lambda1 * jnp.sign(nz) - nz) / ((beta + jnp.sqrt(new_n)) * alpha_inv + lambda2)
    return jnp.where(jnp.abs(nz) > lambda1, nw, jnp.zeros((), w.dtype)), new_n, nz


def _alpha_inv(op: Op, alpha_inv: Any, extra: tuple[Any, ...], position: int) -> Any:
    if not extra:
        return alpha_inv
    return (1.0 / _double(_scalar(op, extra[0], position, "alpha"))).astype(jnp.float32)


@register("Ftrl", inputs=(3, 4), outputs=2)
def ftrl(op: Op) -> Kernel:
    """(var, n_z, grad[, alpha]) -> (var, n_z): FTRL-proximal; n_z holds (n, z) pairs per element; args
    alpha (0.005, or the 4th input), beta (1), lambda1 and lambda2 (0.001)."""
    alpha_inv, beta, lambda1, lambda2 = _ftrl_args(op, 3)

    def kernel(w, nz, g, *alpha):
        _f(op, w, 0)
        ainv = _alpha_inv(op, alpha_inv, alpha, 3)
        _same_numel(op, g, 2, (w, 0))
        if nz.size != 2 * g.size:
            raise ShapeError(f"{op.where}: n_z '{op.inputs[1]}' must hold two values per gradient element")
        pairs = nz.reshape(-1, 2)
        nw, nn, nzz = _ftrl_step(w.reshape(-1), pairs[:, 0], pairs[:, 1], g.reshape(-1), ainv, beta, lambda1, lambda2)
        return nw.reshape(w.shape), jnp.stack([nn, nzz], axis=1).reshape(nz.shape)

    return kernel


@register("SparseFtrl", inputs=(4, 5), outputs=2)
def sparse_ftrl(op: Op) -> Kernel:
    """(var, n_z, indices, grad[, alpha]): Ftrl on the rows of var (and their n_z pairs) named by indices."""
    alpha_inv, beta, lambda1, lambda2 = _ftrl_args(op, 4)
    _in_place(op, (0, 0), (1, 1))

    def kernel(w, nz, indices, g, *alpha):
        ainv = _alpha_inv(op, alpha_inv, alpha, 4)
        if nz.size != 2 * w.size:
            raise ShapeError(f"{op.where}: n_z '{op.inputs[1]}' must hold two values per element of '{op.inputs[0]}'")
        idx, rows_g, block = _sparse_rows(op, w, indices, g, 2, 3)
        r = w.shape[0]

        def update(rows, entries):
            rw, rnz = rows
            pairs = rnz.reshape(rnz.shape[0], block, 2)
            nw, nn, nzz = _ftrl_step(rw, pairs[..., 0], pairs[..., 1], entries[0], ainv, beta, lambda1, lambda2)
            return [nw, jnp.stack([nn, nzz], axis=-1).reshape(rnz.shape)], []

        (nw, nnz), _ = _sequential_rows([_table(w, r), nz.reshape(r, -1)], idx, [rows_g], update)
        return nw.reshape(w.shape), nnz.reshape(nz.shape)

    return kernel


# --- Lars, ClipTensorByScaling, SparseNormalize --------------------------------------------------


@register("Lars", inputs=5)
def lars(op: Op) -> Kernel:
    """(X, dX, wd, trust, lr_max) -> [1] = clip(trust / (‖dX‖ / ‖X‖ + wd + offset), lr_min, lr_max); the
    quotient is 1 (trust unused) when ‖X‖ is 0, as real Caffe2 1.10 answers."""
    offset, lr_min = op.float("offset", 0.5), op.float("lr_min", 0.02)
    if offset < 0 or lr_min < 0:
        raise BadArgumentError(f"{op.where}: arguments 'offset' and 'lr_min' must be >= 0")

    def kernel(x, dx, wd, trust, lr_max):
        _f(op, x, 0)
        _same_numel(op, x, 0, (dx, 1))
        wd, trust, lr_max = (_scalar(op, v, i, "input") for v, i in ((wd, 2), (trust, 3), (lr_max, 4)))
        x_norm = jnp.sqrt(jnp.sum(x * x))
        dx_norm = jnp.sqrt(jnp.sum(dx * dx))
        safe = jnp.where(x_norm > 0, x_norm, jnp.ones((), x.dtype))
        value = jnp.where(x_norm > 0, trust / (dx_norm / safe + wd + np.float32(offset)), jnp.ones((), x.dtype))
        return jnp.maximum(jnp.minimum(value, lr_max), np.float32(lr_min)).reshape(1).astype(x.dtype)

    return kernel


@register("ClipTensorByScaling", inputs=(2, 3))
def clip_tensor_by_scaling(op: Op) -> Kernel:
    """(X, val[, additional_threshold]) -> X · threshold / val when val > threshold (threshold times the
    optional input), else X. (Caffe2 multiplies its stored threshold by the 3rd input on every run, so a
    second run of the same operator uses threshold · t²; one run is modelled.)"""
    threshold = op.float("threshold", 0.0)
    if threshold <= 0:
        raise BadArgumentError(f"{op.where}: argument 'threshold' = {threshold} must be > 0")

    def kernel(x, val, *extra):
        _f(op, x, 0)
        if x.size == 0:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' is empty")
        v = _scalar(op, val, 1, "val")
        t = jnp.asarray(threshold, jnp.float32)
        if extra:
            t = t * _scalar(op, extra[0], 2, "additional_threshold")
        return jnp.where(v > t, x * (t / v), x)

    return kernel


@register("SparseNormalize", inputs=(2, 3))
def sparse_normalize(op: Op) -> Kernel:
    """(param, indices[, grad]) -> param with each row named by indices scaled to L2 norm `norm` (1.0);
    with `use_max_norm` (default true) only rows whose norm exceeds it."""
    norm = np.float32(op.float("norm", 1.0))
    use_max = op.bool("use_max_norm", True)
    _in_place(op, (0, 0))

    def kernel(w, indices, *grad):
        g = grad[0] if grad else jnp.zeros((indices.size, *w.shape[1:]), w.dtype)
        idx, _, _ = _sparse_rows(op, w, indices, g, 1, 2)
        r = w.shape[0]

        def update(rows, entries):
            row = rows[0]
            current = jnp.sqrt(jnp.sum(row * row, axis=1, keepdims=True)) + np.float32(1e-12)
            scaled = row * (norm / current)
            return [jnp.where(current < norm, row, scaled) if use_max else scaled], []

        (nw,), _ = _sequential_rows([_table(w, r)], idx, [], update)
        return nw.reshape(w.shape)

    return kernel
