"""Ops users add themselves: `register_op` for good, `custom_op` for one `compile(..., custom_ops=)` call.

A user op follows the built-in contract (ops/registry.py): `build(op)` reads and checks the op's arguments
once (`op.int("k", 1)`, `op.floats("w")`, `op.string("mode", "x")`, `op.inputs`, `op.where`) and returns a
kernel, a pure `jax.numpy` function of the op's input arrays returning one array or a tuple. Its gradient
op is another op registered the same way; the builder gradient maker (what the Caffe2 API's
`AddGradientOperators` emits for it, as Caffe2's REGISTER_GRADIENT did) is `gradient=`, the record's
`gradient` facet, as a family module attaches it to a built-in op.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import RegistrationError
from ..ops.facets import Absent
from ..ops.gradient_makers import GradientContext, GradientOps, Maker, gradient_op, unregister_gradient
from ..ops.registry import REGISTRY, UNBOUNDED, Builder, OpDef

Count = int | tuple[int, int | None]
NO_GRADIENT_GIVEN = Absent("a user op registered without gradient=")


def custom_op(
    op_type: str,
    build: Builder,
    *,
    inputs: Count = (0, None),
    outputs: Count = (1, None),
    static_inputs: tuple[int, ...] = (),
    random: bool = False,
    gradient: str | Maker | None = None,
) -> OpDef:
    """An op definition, not registered: give it to `compile(..., custom_ops=[...])`.

    `inputs`/`outputs` are a count or (min, max) with None for no limit; `static_inputs` the positions of
    inputs whose values decide output shapes (the kernel then gets them as NumPy arrays); a `random`
    kernel takes a `key=` keyword (a JAX PRNG key); `gradient` is the builder gradient maker, as for
    `register_op` (the builder sees it while the op is registered or given to the compile call)."""
    if not isinstance(op_type, str) or not op_type:
        raise RegistrationError(f"an op type must be a non-empty str, got {op_type!r}")
    if not callable(build):
        raise RegistrationError(f"op type '{op_type}': build must be a function op -> kernel, got {build!r}")
    low_in, high_in = _count(op_type, "inputs", inputs)
    low_out, high_out = _count(op_type, "outputs", outputs)
    if any(not isinstance(p, int) or not 0 <= p < high_in for p in static_inputs):
        raise RegistrationError(f"op type '{op_type}': static_inputs {static_inputs!r} are not input positions")
    return OpDef(
        op_type,
        build,
        (low_in, high_in),
        (low_out, high_out),
        random=random,
        static_inputs=tuple(static_inputs),
        user=True,
        module="user",
        gradient=NO_GRADIENT_GIVEN if gradient is None else _maker(op_type, gradient),
    )


def _count(op_type: str, what: str, count: Any) -> tuple[int, int]:
    pair = (count, count) if isinstance(count, int) else tuple(count) if isinstance(count, tuple | list) else ()
    low, high = pair if len(pair) == 2 else (None, None)
    high = UNBOUNDED if high is None and low is not None else high
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high):
        raise RegistrationError(f"op type '{op_type}': {what}={count!r} is not a count or a (min, max) pair")
    return low, high


def register_op(
    op_type: str,
    build: Builder | None = None,
    *,
    inputs: Count = (0, None),
    outputs: Count = (1, None),
    static_inputs: tuple[int, ...] = (),
    random: bool = False,
    gradient: str | Maker | None = None,
    override: bool = False,
) -> Any:
    """Register a user op for every net this process compiles, runs or inspects. Use it as a decorator
    (`@rnn2jax.register_op("MyOp", inputs=2)` on the builder) or call it with `build`.

    `gradient` gives the builder gradient maker: the type of a gradient op that takes the forward inputs
    then the output gradients and returns the input gradients (`MyOpGradient(X, W, dY) -> dX, dW`), or a
    maker function of a `GradientContext` returning gradient OperatorDefs (as the family modules of
    rnn2jax/ops/ attach to their ops; `rnn2jax.ops.gradient_makers` has the helpers). Without one, an
    override keeps the built-in op's maker, as Caffe2 kept an op's gradient when its kernel was replaced.
    A type rnn2jax already lowers (or registered earlier) is refused unless `override=True`."""
    module = sys._getframe(1).f_globals.get("__name__", "user")  # the user's module: where the op's facets are

    def decorate(fn: Builder) -> Builder:
        opdef = custom_op(
            op_type, fn, inputs=inputs, outputs=outputs, static_inputs=static_inputs, random=random, gradient=gradient
        )
        existing = REGISTRY.get(op_type)
        if existing is not None and not override:
            kind = "a user op" if existing.user else "a built-in op"
            raise RegistrationError(
                f"op type '{op_type}' is already registered ({kind}); pass override=True to replace it"
            )
        kept = existing.gradient if existing is not None and gradient is None else opdef.gradient
        host = existing.host if existing is not None else None  # a workspace still runs a host op on the host
        REGISTRY[op_type] = replace(opdef, module=module, gradient=kept, host=host)
        if gradient is not None:
            unregister_gradient(op_type)  # a maker given at run time earlier would take precedence
        return fn

    return decorate if build is None else decorate(build)


def _maker(op_type: str, gradient: str | Maker) -> Maker:
    if callable(gradient):
        return gradient
    if not isinstance(gradient, str) or not gradient:
        raise RegistrationError(f"op type '{op_type}': gradient must be an op type or a maker function")

    def maker(g: GradientContext) -> GradientOps:
        inputs = [*g.op.input, *(g.GO(i) for i in range(len(g.op.output)))]
        return [gradient_op(gradient, inputs, [g.GI(i) for i in range(len(g.op.input))])]

    return maker


def as_opdefs(custom_ops: Any) -> Mapping[str, OpDef]:
    """`compile(custom_ops=)`: OpDefs from `custom_op`, or a mapping op type -> builder (any arity)."""
    if isinstance(custom_ops, Mapping):
        items = [v if isinstance(v, OpDef) else custom_op(k, v) for k, v in custom_ops.items()]
    elif isinstance(custom_ops, list | tuple):
        items = list(custom_ops)
    else:
        raise RegistrationError(
            f"custom_ops must be a list of rnn2jax.custom_op(...) or a mapping op type -> builder, "
            f"got a {type(custom_ops).__name__}"
        )
    wrong = [item for item in items if not isinstance(item, OpDef)]
    if wrong:
        raise RegistrationError(f"custom_ops holds {wrong[0]!r}, not an op made by rnn2jax.custom_op")
    return {opdef.type: opdef for opdef in items}
