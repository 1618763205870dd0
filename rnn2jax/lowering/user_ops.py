"""Ops users add themselves: `register_op` for good, `custom_op` for one `compile(..., custom_ops=)` call.

A user op follows the built-in contract (ops/registry.py): `build(op)` reads and checks the op's arguments
once (`op.int("k", 1)`, `op.floats("w")`, `op.string("mode", "x")`, `op.inputs`, `op.where`) and returns a
kernel, a pure `jax.numpy` function of the op's input arrays returning one array or a tuple. Its gradient
op is another op registered the same way; the builder gradient maker (what `rnn2jax.caffe2`'s
`get_gradient_for_op` emits for it, as Caffe2's REGISTER_GRADIENT did) is `gradient=`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..caffe2.grad_makers import GradientContext, gradient_op, register_gradient
from ..errors import RegistrationError
from ..ops.registry import REGISTRY, UNBOUNDED, Builder, OpDef

Count = int | tuple[int, int | None]
Maker = Callable[[GradientContext], list]


def custom_op(
    op_type: str,
    build: Builder,
    *,
    inputs: Count = (0, None),
    outputs: Count = (1, None),
    static_inputs: tuple[int, ...] = (),
    random: bool = False,
) -> OpDef:
    """An op definition, not registered: give it to `compile(..., custom_ops=[...])`.

    `inputs`/`outputs` are a count or (min, max) with None for no limit; `static_inputs` the positions of
    inputs whose values decide output shapes (the kernel then gets them as NumPy arrays); a `random`
    kernel takes a `key=` keyword (a JAX PRNG key)."""
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
    maker function of a `GradientContext` returning gradient OperatorDefs (as in rnn2jax.caffe2.grad_makers).
    A type rnn2jax already lowers (or registered earlier) is refused unless `override=True`."""

    def decorate(fn: Builder) -> Builder:
        opdef = custom_op(op_type, fn, inputs=inputs, outputs=outputs, static_inputs=static_inputs, random=random)
        maker = _maker(op_type, gradient) if gradient is not None else None
        existing = REGISTRY.get(op_type)
        if existing is not None and not override:
            kind = "a user op" if existing.user else "a built-in op"
            raise RegistrationError(
                f"op type '{op_type}' is already registered ({kind}); pass override=True to replace it"
            )
        REGISTRY[op_type] = opdef
        if maker is not None:
            register_gradient(op_type)(maker)
        return fn

    return decorate if build is None else decorate(build)


def _maker(op_type: str, gradient: str | Maker) -> Maker:
    if callable(gradient):
        return gradient
    if not isinstance(gradient, str) or not gradient:
        raise RegistrationError(f"op type '{op_type}': gradient must be an op type or a maker function")

    def maker(g: GradientContext) -> list:
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
