"""Training-step ops: the iteration counter, the learning-rate schedule and the SGD update
(WeightedSum) that Caffe2 training nets end with, as pure functions of their inputs.

Caffe2 updates these blobs in place (`AtomicIter(mutex, iter) -> iter`, `WeightedSum(w, ONE, g, lr)
-> w`); here an in-place op simply rebinds the blob to a new array. Mutexes do not exist in a pure
function: CreateMutex makes a placeholder that AtomicIter ignores. The counter is int64 in Caffe2,
int32 here unless JAX's x64 mode is on (caffe2/sgd/iter_op.h, learning_rate_op.h,
learning_rate_functors.h; caffe2/operators/utility_ops.h for WeightedSum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..netdef import Op
from .common import canonical_dtype
from .registry import Kernel, register

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


@register("Iter", inputs=(0, 1), scoped=True)
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
        return jnp.ones((1,), canonical_dtype(np.int64))  # decided per call: x64 may be on or off

    return kernel


@register("AtomicIter", inputs=2)
def atomic_iter(op: Op) -> Kernel:
    """(mutex, iter) -> iter + 1; the mutex only serialised Caffe2's threads."""
    _check_in_place(op, 1)
    return lambda mutex, counter: _increment(op, counter)


@register("CreateMutex", inputs=0)
def create_mutex(op: Op) -> Kernel:
    """A placeholder scalar standing for the mutex blob that AtomicIter takes."""
    return lambda: jnp.zeros((), jnp.int32)


# --------------------------------------------------------------------------------------------------
# LearningRate

# policy -> (build(op) -> multiplier(iteration as a 0-d integer array) -> float32 multiplier)
Schedule = Callable[[Any], Any]
_F32 = jnp.float32


def _step(op: Op) -> Schedule:
    """gamma ^ floor(iter / stepsize)."""
    stepsize = op.int("stepsize", 0)
    if stepsize <= 0:
        raise BadArgumentError(f"{op.where}: policy 'step' needs argument 'stepsize' > 0, got {stepsize}")
    gamma = np.float32(op.float("gamma", 0.0))
    return lambda it: jnp.power(gamma, jax.lax.div(it, jnp.asarray(stepsize, it.dtype)).astype(_F32))


def _exp(op: Op) -> Schedule:
    """gamma ^ iter."""
    gamma = np.float32(op.float("gamma", 0.0))
    return lambda it: jnp.power(gamma, it.astype(_F32))


def _inv(op: Op) -> Schedule:
    """(1 + gamma · iter) ^ -power."""
    gamma = np.float32(op.float("gamma", 0.0))
    power = np.float32(op.float("power", 0.0))
    return lambda it: jnp.power(1 + gamma * it.astype(_F32), -power)


def _poly(op: Op) -> Schedule:
    """(1 - iter / max_iter) ^ power. Caffe2 stores max_iter as uint64, so the default -1 (or any
    negative value) means 2^64 - 1 + 1 + max_iter: a rate that practically never decays."""
    max_iter = op.int("max_iter", -1)
    if max_iter == 0:
        raise BadArgumentError(f"{op.where}: policy 'poly' needs argument 'max_iter' != 0")
    power = np.float32(op.float("power", 0.0))
    limit = np.float32(max_iter % (1 << 64))
    return lambda it: jnp.power(1 - it.astype(_F32) / limit, power)


_POLICIES: dict[str, Callable[[Op], Schedule]] = {
    "fixed": lambda op: lambda it: jnp.ones((), _F32),
    "step": _step,
    "exp": _exp,
    "inv": _inv,
    "poly": _poly,
}


@register("LearningRate")
def learning_rate(op: Op) -> Kernel:
    """(iter) -> 0-d float32 `base_lr · policy(iter)`. Policies fixed, step (stepsize,
    gamma), exp (gamma), inv (gamma, power) and poly (power, max_iter), exactly as Caffe2's
    functors (in float32, missing arguments defaulting to 0 as there)."""
    if not op.has("base_lr"):
        raise BadArgumentError(f"{op.where}: missing required argument 'base_lr'")
    # Caffe2's LearningRateOp never reads `lr_scale` (its Python optimizers fold it into base_lr), so an
    # op carrying one runs at base_lr: real Caffe2 gives 1.0 for base_lr=1, lr_scale=0 (policy fixed).
    base_lr = np.float32(op.float("base_lr"))
    policy = op.str("policy", "")
    if not policy:
        raise BadArgumentError(f"{op.where}: missing required argument 'policy' (the learning rate policy)")
    if policy not in _POLICIES:
        raise BadArgumentError(
            f"{op.where}: learning rate policy {policy!r} is not supported; "
            f"supported: {', '.join(sorted(_POLICIES))}"
        )
    schedule = _POLICIES[policy](op)

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
        raise ShapeError(
            f"{op.where}: weight '{op.inputs[position]}' must hold one element, got shape {list(w.shape)}"
        )
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


@register("WeightedSumGradient", inputs=(3, None), outputs=(1, None))
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
