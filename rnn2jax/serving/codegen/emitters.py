"""One emitter per op type: the op as a statement of jax.numpy (or a helper call), with its arguments
as literals. Each follows rnn2jax's lowering of the op (rnn2jax/ops), whose argument checks have
already run when the generator lowered the net."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...ir.netdef import Op
from ...ops.common import data_type_arg
from ...ops.elementwise import _legacy_axis
from ...ops.fill import _constant_fill_dtype, _shape_source
from ...ops.shape import _concat_split_axis, _sorted_dims
from .writer import Call, Writer, call, literal


class Unsupported(Exception):
    """An op (or an argument of it) the generator has no code for; the message says what."""


# (writer, op, the identifiers of its inputs) -> the value of its outputs (a tuple when several)
Emitter = Callable[[Writer, Op, list[str]], Call | str]
EMITTERS: dict[str, Emitter] = {}


def emitter(*types: str) -> Callable[[Emitter], Emitter]:
    def register(fn: Emitter) -> Emitter:
        for name in types:
            EMITTERS[name] = fn
        return fn

    return register


def _first(op: Op, value: Call) -> Call | str:
    """A helper returning (y, extra) for an op that writes only y."""
    return f"{value.flat()}[0]" if len(op.outputs) == 1 else value


@emitter("FC")
def _fc(w: Writer, op: Op, xs: list[str]) -> Call:
    keywords = {k: op.int(k) for k in ("axis", "axis_w") if op.int(k, 1) != 1}
    return call(w.helper("fc"), *xs, **keywords)


@emitter("Copy", "Alias", "EnsureCPUOutput", "CopyGPUToCPU", "CopyCPUToGPU", "CopyFromCPUInput", "CopyOnDeviceLike")
def _copy(w: Writer, op: Op, xs: list[str]) -> str:
    """On one XLA device every copy, alias or device move is the value itself."""
    return xs[0]


@emitter("StopGradient")
def _stop_gradient(w: Writer, op: Op, xs: list[str]) -> Call:
    return call("lax.stop_gradient", xs[0])


@emitter("Sum")
def _sum(w: Writer, op: Op, xs: list[str]) -> Call | str:
    if len(xs) == 1:
        return call("jnp.asarray", xs[0])
    value = call("jnp.add", xs[0], xs[1])
    for x in xs[2:]:
        value = call("jnp.add", value.flat(), x)
    return value


_BINARY = {"Add": "jnp.add", "Sub": "jnp.subtract", "Mul": "jnp.multiply", "Div": "divide"}
_BINARY |= {"EQ": "jnp.equal", "NE": "jnp.not_equal", "LT": "jnp.less", "LE": "jnp.less_equal"}
_BINARY |= {"GT": "jnp.greater", "GE": "jnp.greater_equal"}


@emitter(*_BINARY)
def _binary(w: Writer, op: Op, xs: list[str]) -> Call:
    """broadcast=1 is Caffe2's legacy broadcast of B over A; otherwise NumPy broadcasting."""
    fn = w.helper("divide") if op.type == "Div" else _BINARY[op.type]
    a, b = xs
    if op.bool("broadcast", False):
        axis = _legacy_axis(op)
        b = call(w.helper("broadcast_like"), b, a, *((literal(axis),) if axis != -1 else ())).flat()
    return call(fn, a, b)


@emitter("Sigmoid")
def _sigmoid(w: Writer, op: Op, xs: list[str]) -> Call:
    return call("jax.nn.sigmoid", xs[0])


@emitter("Tanh")
def _tanh(w: Writer, op: Op, xs: list[str]) -> Call:
    return call("jnp.tanh", xs[0])


@emitter("Relu")
def _relu(w: Writer, op: Op, xs: list[str]) -> Call:
    return call("jnp.maximum", xs[0], f"jnp.zeros((), {xs[0]}.dtype)")


@emitter("Softmax")
def _softmax(w: Writer, op: Op, xs: list[str]) -> Call:
    axis = op.int("axis", 1)
    return call(w.helper("softmax"), xs[0], **({"axis": axis} if axis != 1 else {}))


@emitter("Cast")
def _cast(w: Writer, op: Op, xs: list[str]) -> str:
    to = data_type_arg(op, "to")
    if to == np.bool_:
        return f"jnp.asarray({xs[0]}) != 0"
    return f"jnp.asarray({xs[0]}).astype(jnp.{np.dtype(to).name})"


@emitter("Concat", "DepthConcat")
def _concat(w: Writer, op: Op, xs: list[str]) -> Call | str:
    axis, add_axis = _concat_split_axis(op)
    keywords: dict = {"axis": axis} | ({"add_axis": True} if add_axis else {})
    return _first(op, call(w.helper("concat"), f"[{', '.join(xs)}]", **keywords))


@emitter("Split", "DepthSplit")
def _split(w: Writer, op: Op, xs: list[str]) -> Call | str:
    axis, add_axis = _concat_split_axis(op)
    if add_axis:
        raise Unsupported("Split with add_axis=1")
    n = len(op.outputs)
    if len(xs) == 2:
        value = call(w.helper("split"), xs[0], xs[1], axis=axis)
    elif op.ints("split", ()):
        value = call(w.helper("split"), xs[0], literal(list(op.ints("split"))), axis=axis)
    else:
        value = call("jnp.split", xs[0], str(n), axis=axis)
    return f"{value.flat()}[0]" if n == 1 else value


@emitter("Transpose")
def _transpose(w: Writer, op: Op, xs: list[str]) -> Call:
    axes = op.ints("axes", ())
    return call("jnp.transpose", xs[0], *((literal(tuple(axes)),) if axes else ()))


@emitter("Reshape")
def _reshape(w: Writer, op: Op, xs: list[str]) -> Call | str:
    shape = f"np.asarray({xs[1]}).tolist()" if len(xs) == 2 else literal(list(op.ints("shape")))
    return _first(op, call(w.helper("reshape"), xs[0], shape))


@emitter("Squeeze")
def _squeeze(w: Writer, op: Op, xs: list[str]) -> Call:
    return call("jnp.squeeze", xs[0], literal(_sorted_dims(op)))


@emitter("ExpandDims")
def _expand_dims(w: Writer, op: Op, xs: list[str]) -> Call:
    return call("jnp.expand_dims", xs[0], literal(_sorted_dims(op)))


@emitter("BatchMatMul")
def _batch_matmul(w: Writer, op: Op, xs: list[str]) -> Call:
    keywords = {k: True for k in ("trans_a", "trans_b") if op.bool(k, False)}
    return call(w.helper("batch_matmul"), *xs, **keywords)


@emitter("ElementwiseLinear")
def _elementwise_linear(w: Writer, op: Op, xs: list[str]) -> Call:
    axis = op.int("axis", 1)
    return call(w.helper("elementwise_linear"), *xs, **({"axis": axis} if axis != 1 else {}))


@emitter("LayerNorm", "C10LayerNorm_DontUseThisOpYet")
def _layer_norm(w: Writer, op: Op, xs: list[str]) -> Call | str:
    keywords = {"axis": op.int("axis", 1), "epsilon": op.float("epsilon", float(np.float32(1e-5)))}
    args = xs if op.bool("elementwise_affine", False) else xs[:1]
    value = call(w.helper("layer_norm"), *args, **keywords)
    if len(op.outputs) == 3:
        return value
    return f"{value.flat()}[0]" if len(op.outputs) == 1 else f"{value.flat()}[:2]"


@emitter("Dropout")
def _dropout(w: Writer, op: Op, xs: list[str]) -> str:
    if op.int("is_test", 0) == 0:
        raise Unsupported("Dropout in training mode (is_test=0) is random; the module is for inference")
    return xs[0] if len(op.outputs) == 1 else f"{xs[0]}, jnp.ones(jnp.shape({xs[0]}), jnp.bool_)"


@emitter("SequenceMask")
def _sequence_mask(w: Writer, op: Op, xs: list[str]) -> Call:
    if op.str("mode") != "sequence" or op.has("batch") or op.has("repeat_from_axis") or len(xs) != 2:
        raise Unsupported("SequenceMask other than mode 'sequence' with lengths (no batch, repeat_from_axis)")
    fill = 0.0 if op.bool("grad", False) else op.float("fill_val", float("-inf"))
    keywords: dict = {"axis": op.int("axis", 1)} | ({"fill": fill} if fill != float("-inf") else {})
    return call(w.helper("sequence_mask"), *xs, **keywords)


@emitter("LSTMUnit")
def _lstm_unit(w: Writer, op: Op, xs: list[str]) -> Call:
    lengths = op.bool("sequence_lengths", True)
    args = [*xs[:3], xs[3] if lengths else "None", xs[4] if lengths else xs[3]]
    keywords: dict = {}
    if op.float("forget_bias", 0.0):
        keywords["forget_bias"] = op.float("forget_bias")
    if op.bool("drop_states", False):
        keywords["drop_states"] = True
    return call(w.helper("lstm_unit"), *args, **keywords)


@emitter("GRUUnit")
def _gru_unit(w: Writer, op: Op, xs: list[str]) -> Call:
    lengths = op.bool("sequence_lengths", True)
    args = [*xs[:2], xs[2] if lengths else "None", xs[3] if lengths else xs[2]]
    keywords = {"drop_states": True} if op.bool("drop_states", False) else {}
    return call(w.helper("gru_unit"), *args, **keywords)


@emitter("Shape")
def _shape(w: Writer, op: Op, xs: list[str]) -> Call:
    axes = op.ints("axes", ())
    return call(w.helper("shape_of"), xs[0], *((literal(tuple(axes)),) if axes else ()))


@emitter("Slice")
def _slice(w: Writer, op: Op, xs: list[str]) -> Call:
    if len(xs) == 3:
        return call(w.helper("slice_dims"), xs[0], f"np.asarray({xs[1]}).tolist()", f"np.asarray({xs[2]}).tolist()")
    return call(w.helper("slice_dims"), xs[0], literal(list(op.ints("starts"))), literal(list(op.ints("ends"))))


@emitter("ConstantFill")
def _constant_fill(w: Writer, op: Op, xs: list[str]) -> Call:
    dtype = f"jnp.{np.dtype(_constant_fill_dtype(op)).name}"
    arg = op.args.get("value")
    value = literal(0 if arg is None else arg.value)
    if len(xs) > 1 or (xs and op.ints("extra_shape", ())):
        raise Unsupported("ConstantFill with a value input or extra_shape")
    if not xs:
        shape = literal(tuple(int(d) for d in _shape_source(op)(None)))
    elif op.bool("input_as_shape", False):
        shape = f"tuple(np.asarray({xs[0]}).tolist())"
    else:
        shape = f"jnp.shape({xs[0]})"
    return call("jnp.full", shape, value, dtype=_Raw(dtype))


class _Raw(str):
    """A keyword value written as is (not as a literal)."""

    def __repr__(self) -> str:
        return str(self)
