"""Caffe2's builder gradient makers (`REGISTER_GRADIENT`), as OperatorDefs: the machinery, and the maker
shapes that ops of several families share.

A maker is the `gradient` facet of an op's registry record, attached in the family module that registers
the op. It sees the forward op and the gradient blob of each output (None when it has none) and returns
gradient ops plus the gradient blob of each input. Conventions, as in Caffe2's `GradientMakerBase`:
`GO(i)` is output i's gradient (an error if it has none), `GI(i)` is `input(i) + "_grad"` and records it as
input i's gradient, `set_dense` passes an existing gradient through with no op. `get_gradient_for_op`
then marks the ops `is_gradient_op`, copies the forward device option and engine (when set) and appends
all forward arguments unless the maker builds its own (`copy_args = False`).

Makers given at run time (the Caffe2 API's `core.GradientRegistry.RegisterGradient`, the Python op's,
`register_gradient`) go to a table of their own that is consulted before the records: in Caffe2 a later
registration replaced an earlier one, and an op type rnn2jax does not lower has no record to hold one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..errors import RegistrationError
from ..proto import caffe2_pb2 as pb
from .registry import REGISTRY, record

GradientOps = list[pb.OperatorDef]


class GradientError(RuntimeError):
    """A gradient cannot be built (no maker, a maker refusing, or the backward pass's version checks).
    A RuntimeError, as Caffe2 raised it: Caffe2 scripts catch that."""


class GradientContext:
    """What a maker works with: the forward op, output gradients, and input gradients being set."""

    def __init__(self, op: pb.OperatorDef, g_output: Sequence[str | None]):
        self.op = op
        self.g_output = list(g_output)
        self.g_input: list[str | None] = [None] * len(op.input)
        self.copy_args = True
        self.as_returned = False  # a Python maker (core.GradientRegistry.RegisterGradient): ops kept as they are

    def I(self, i: int) -> str:  # noqa: E743 (Caffe2's name)
        return self.op.input[i]

    def O(self, i: int) -> str:  # noqa: E743 (Caffe2's name)
        return self.op.output[i]

    def GO(self, i: int) -> str:
        grad = self.g_output[i]
        if grad is None:
            raise GradientError(f"Gradient of output {self.op.output[i]} is not provided!")
        return grad

    def GI(self, i: int) -> str:
        self.g_input[i] = self.op.input[i] + "_grad"
        return self.g_input[i]

    def set_dense(self, i: int, grad: str) -> None:
        self.g_input[i] = grad

    def arg(self, name: str) -> pb.Argument | None:
        return next((a for a in self.op.arg if a.name == name), None)

    def flag(self, name: str, default: bool) -> bool:
        arg = self.arg(name)
        return default if arg is None else bool(arg.i)


Maker = Callable[[GradientContext], GradientOps | None]

# op type -> a maker given at run time (register_gradient); it takes precedence over the record's facet
_OVERRIDES: dict[str, Maker] = {}


def register_gradient(*op_types: str) -> Callable[[Maker], Maker]:
    """Register a maker for op types at run time, replacing any earlier one (Caffe2's registry did so)."""

    def wrap(maker: Maker) -> Maker:
        for op_type in op_types:
            _OVERRIDES[op_type] = maker
        return maker

    return wrap


def unregister_gradient(op_type: str) -> None:
    """Forget the maker `register_gradient` gave `op_type`, so that its record's own facet applies again
    (`register_op(..., gradient=)` replaces an earlier registration so)."""
    _OVERRIDES.pop(op_type, None)


def gradient_maker(op_type: str) -> Maker | None:
    """The maker `get_gradient_for_op` uses for `op_type`: one given at run time, else its record's."""
    maker = _OVERRIDES.get(op_type)
    if maker is not None:
        return maker
    opdef = record(op_type)  # a host op (Save, Python) has a maker as any op does
    return opdef.gradient if opdef is not None and opdef.gradient else None


def has_gradient_maker(op_type: str) -> bool:
    return gradient_maker(op_type) is not None


def gradient_maker_types() -> set[str]:
    """Every op type with a maker (the scoreboard's "builder maker" column)."""
    return set(_OVERRIDES) | {op_type for op_type, opdef in REGISTRY.items() if opdef.gradient}


def gradient_op(
    op_type: str, inputs: Iterable[str], outputs: Iterable[str], args: Iterable[pb.Argument] = ()
) -> pb.OperatorDef:
    """C++ `CreateOperatorDef`: name "" set, no engine, no device option."""
    op = pb.OperatorDef(type=op_type, name="")
    op.input.extend(inputs)
    op.output.extend(outputs)
    op.arg.extend(args)
    return op


def set_scalar(arg: pb.Argument, value: object) -> bool:
    """Put a scalar `value` in the field of `arg` Caffe2's `MakeArgument` chose: bool and int in `i`, float in
    `f`, str in `s`. False (and `arg` untouched) for any other value: the Caffe2 API's `make_argument` goes on
    to bytes, messages and lists."""
    if isinstance(value, bool | np.bool_ | int | np.integer):
        arg.i = int(value)
    elif isinstance(value, float | np.floating):
        arg.f = float(value)
    elif isinstance(value, str):
        arg.s = value.encode("utf-8")
    else:
        return False
    return True


def argument(name: str, value: bool | int | float | str) -> pb.Argument:
    """A maker's own scalar argument, in the field Caffe2's `MakeArgument` chose (`set_scalar`)."""
    arg = pb.Argument(name=name)
    if not set_scalar(arg, value):
        raise TypeError(f"gradient maker argument '{name}': not a bool, int, float or str: {value!r}")
    return arg


def _verify_schema(op: pb.OperatorDef) -> None:
    """GradientMakerBase's constructor enforces `schema->Verify(def_)`: a maker never sees an op whose input or
    output count its schema does not allow (`net.Mul(a, b)` is Mul reading a alone, writing b)."""
    opdef = record(op.type)
    if opdef is None:
        return
    for what, count, (low, high) in (("Input", len(op.input), opdef.inputs), ("Output", len(op.output), opdef.outputs)):
        if not low <= count <= high:
            raise GradientError(
                f"Exception when creating gradient for [{op.type}]: {what} size {count} not in range "
                f"[min={low}, max={high}]. (GradientMaker) Operator def did not pass schema checking: {op}"
            )


def get_gradient_for_op(op: pb.OperatorDef, g_output: Sequence[str | None]) -> tuple[GradientOps, list[str | None]]:
    """C++ `GetGradientForOp`: (gradient ops, gradient blob of each forward input)."""
    maker = gradient_maker(op.type)
    if maker is None:
        raise GradientError(
            f"Exception when creating gradient for [{op.type}]: Gradient maker for operator {op.type} not implemented."
        )
    _verify_schema(op)
    ctx = GradientContext(op, g_output)
    try:
        grad_ops = maker(ctx) or []
    except GradientError as error:
        raise GradientError(f"Exception when creating gradient for [{op.type}]: {error}") from None
    if ctx.as_returned:
        return list(grad_ops), ctx.g_input
    for grad_op in grad_ops:
        grad_op.is_gradient_op = True
        if op.HasField("device_option"):
            grad_op.device_option.CopyFrom(op.device_option)
        if op.HasField("engine"):
            grad_op.engine = op.engine
        if ctx.copy_args:
            grad_op.arg.extend(op.arg)
    return grad_ops, ctx.g_input


# ------------------------------------------------------------------------------------------------
# Maker shapes that ops of several families share (each family attaches them to its own ops)


def no_gradient(g: GradientContext) -> GradientOps:
    """Caffe2's NO_GRADIENT: the op has no gradient and emits no gradient ops."""
    return []


def should_not_do_gradient(g: GradientContext) -> GradientOps:
    """Caffe2's SHOULD_NOT_DO_GRADIENT: asking for the gradient is an error."""
    raise GradientError(f"One should not call gradient for operator {g.op.type}.")


def gradient_not_implemented_yet(g: GradientContext) -> GradientOps:
    """Caffe2's GradientNotImplementedYet: the op should have a gradient, and Caffe2 has none."""
    raise GradientError(f"Operator {g.op.type} should have a gradient but is not implemented yet.")


_BLOB = re.compile(r"(I|O|GO|GI)\((\d+)\)")


def _blobs(written: str) -> list[tuple[str, int]]:
    blobs = [_BLOB.fullmatch(word) for word in written.split()]
    if not all(blobs):
        raise RegistrationError(f"gradient blobs {written!r}: expected I(i), O(i), GO(i) or GI(i), spaced")
    return [(blob.group(1), int(blob.group(2))) for blob in blobs if blob]


def single_gradient(gradient_type: str, inputs: str, outputs: str = "GI(0)") -> Maker:
    """Caffe2's `SingleGradientDef`, the maker of most ops: one `gradient_type` op, its inputs and outputs
    written as in Caffe2's C++ maker, `I(i)`, `O(i)`, `GO(i)`, `GI(i)` separated by spaces
    (`single_gradient("LRNGradient", "I(0) O(0) GO(0)")`: `LRNGradient(X, Y, dY) -> dX`)."""
    reads, writes = _blobs(inputs), _blobs(outputs)

    def maker(g: GradientContext) -> GradientOps:
        ins = [getattr(g, kind)(i) for kind, i in reads]
        return [gradient_op(gradient_type, ins, [getattr(g, kind)(i) for kind, i in writes])]

    maker.__qualname__ = f"single_gradient({gradient_type!r}, {inputs!r}, {outputs!r})"
    return maker


def gradient_from_output(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(Y, dY) -> dX`."""
    return [gradient_op(g.op.type + "Gradient", [g.O(0), g.GO(0)], [g.GI(0)])]


def gradient_from_input(g: GradientContext) -> GradientOps:
    """`<Op>Gradient(X, dY) -> dX`."""
    return [gradient_op(g.op.type + "Gradient", [g.I(0), g.GO(0)], [g.GI(0)])]


def concat_of_output_gradients(g: GradientContext) -> GradientOps:
    """Caffe2's GetSplitGradient: a Concat of the output gradients there are (none: no op)."""
    grads = [g.GO(i) for i in range(len(g.op.output)) if g.g_output[i] is not None]
    if not grads:
        return []
    return [gradient_op("Concat", grads, [g.GI(0), "_" + g.GI(0) + "_dims"])]
