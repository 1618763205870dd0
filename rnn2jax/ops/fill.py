"""Fillers: the ops of init nets (constants, given tensors, random initialisers) as array constructors.

All follow Caffe2's `FillerOp` (caffe2/operators/filler_op.h): the output shape is the `shape` argument,
or the first input's shape (+ `extra_shape`), or, with `input_as_shape`, the first input's values.
Random fillers take a JAX PRNG key, so they are deterministic per key but never match Caffe2's draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, ShapeError
from ..ir.budget import check_array
from ..ir.netdef import Op
from .common import TRACED_SHAPE_HINT, Dims, data_type_arg, shape_arg
from .emit import Call, EmitWriter, Raw, Unsupported, call, literal
from .facets import NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE
from .gradient_makers import no_gradient
from .registry import HostWorkspace, Kernel, declare_family, facet, register, register_host_op

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=NO_EMITTER)

Shape = tuple[int, ...]
# fill(shape, key, *inputs after the first) -> the output array
Fill = Callable[..., Any]

_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)


# --------------------------------------------------------------------------------------------------
# The output shape (FillerOp)


def _dims_arg(op: Op, name: str) -> Shape:
    return shape_arg(op, name) if op.has(name) else ()


def _concrete_dims(op: Op, x: Any) -> Shape:
    """The values of an `input_as_shape` input: they decide the output's shape, so they must be known."""
    blob = op.inputs[0]
    if isinstance(x, Dims):  # Shape's output for an input of symbolic shape: sizes >= 1 and symbols (>= 1)
        return x.values
    try:
        values = np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise ShapeError(
            f"{op.where}: input_as_shape needs the values of blob '{blob}' while tracing, but they are "
            f"traced; {TRACED_SHAPE_HINT}"
        ) from None
    if values.ndim != 1 or values.size == 0 or values.dtype.kind not in "iu":
        raise ShapeError(
            f"{op.where}: with input_as_shape, blob '{blob}' must be a non-empty 1-D integer tensor, "
            f"got {values.dtype}{list(values.shape)}"
        )
    if (values < 0).any():
        raise ShapeError(f"{op.where}: blob '{blob}' (input_as_shape) holds negative dims {values.tolist()}")
    return tuple(int(v) for v in values)


def _input_as_shape(op: Op) -> tuple[int, ...]:
    """With `input_as_shape`, the first input's values are the output's shape (registry `static_inputs`)."""
    return (0,) if op.bool("input_as_shape", False) else ()


def _shape_source(op: Op) -> Callable[[Any], Shape]:
    """Check FillerOp's shape arguments; return `first input (or None) -> output shape`."""
    shape = _dims_arg(op, "shape")
    extra = _dims_arg(op, "extra_shape")
    as_shape = op.bool("input_as_shape", False)
    if not op.inputs:
        if extra:
            raise BadArgumentError(f"{op.where}: cannot set 'extra_shape' when there is no input")
        if as_shape:
            raise BadArgumentError(f"{op.where}: 'input_as_shape' is set but the op has no input")
        return lambda _: shape
    if shape:
        raise BadArgumentError(f"{op.where}: cannot set the 'shape' argument and pass in an input at the same time")
    if as_shape:
        return lambda x: _concrete_dims(op, x) + extra
    return lambda x: tuple(x.shape) + extra


def _filler(op: Op, fill: Fill, check: Callable[[Shape], None] | None = None, dtype: np.dtype = _FLOAT32) -> Kernel:
    """The kernel of a filler: resolve the shape (checked by `check`, then against the memory budget for
    an output of `dtype`), then `fill` it.

    Without inputs the shape is known now, so it is checked before any tracing."""
    shape_of = _shape_source(op)

    def checked(shape: Shape) -> Shape:
        if check is not None:
            check(shape)
        check_array(op.where, op.outputs[0], shape, dtype)
        return shape

    static = None if op.inputs else checked(shape_of(None))

    def kernel(*inputs: Any, key: jax.Array | None = None) -> Any:
        shape = static if static is not None else checked(shape_of(inputs[0]))
        return fill(shape, key, *inputs[1:])

    kernel.dims_inputs = _input_as_shape(op)  # type: ignore[attr-defined]
    return kernel


def _scalar_input(op: Op, index: int, x: Any, dtype: np.dtype) -> jax.Array:
    """An input that holds one value (ConstantFill's value, UniformFill's min and max)."""
    shape = list(np.shape(x))
    if math.prod(shape) != 1:
        raise ShapeError(f"{op.where}: input '{op.inputs[index]}' must hold exactly one value, got shape {shape}")
    return jnp.reshape(x, ()).astype(dtype)


# --------------------------------------------------------------------------------------------------
# Argument values -> arrays of the dtype JAX will use


def _convert(op: Op, name: str, values: Any, dtype: np.dtype) -> np.ndarray:
    """`values` (argument `name`: a number or a list of them) as `dtype`.

    Like Caffe2's argument readers, integers must be representable (losslessly) in the target type;
    bools are `value != 0`."""
    raw = np.asarray(values)
    if dtype == np.bool_:
        return raw != 0
    if dtype.kind in "iu":
        if raw.dtype.kind == "f" and not np.all(np.isfinite(raw) & (raw == np.trunc(raw))):
            raise BadArgumentError(f"{op.where}: argument '{name}' must hold integers for {dtype}")
        info = np.iinfo(dtype)
        if raw.size and (raw.min() < info.min or raw.max() > info.max):
            raise BadArgumentError(
                f"{op.where}: argument '{name}' has values outside the {dtype} range [{info.min}, {info.max}]"
            )
        return raw.astype(dtype)
    with np.errstate(over="ignore"):
        return raw.astype(dtype)


def _check_count(op: Op, count: int) -> Callable[[Shape], None]:
    def check(shape: Shape) -> None:
        if math.prod(shape) != count:
            raise BadArgumentError(
                f"{op.where}: argument 'values' has {count} values but the output shape {list(shape)} "
                f"needs {math.prod(shape)}"
            )

    return check


def _given(op: Op, values: np.ndarray) -> Kernel:
    """A filler whose output is `values` (a flat array) in the output shape."""
    constant = jnp.asarray(values)
    return _filler(op, lambda shape, _key: constant.reshape(shape), _check_count(op, values.size), constant.dtype)


# --------------------------------------------------------------------------------------------------
# Deterministic fillers

_STRING = 4  # TensorProto.STRING


def _is_string_dtype(op: Op) -> bool:
    arg = op.args.get("dtype")
    return arg is not None and (
        (arg.kind == "i" and arg.value == _STRING) or (arg.kind == "s" and str(arg.value).lower() == "string")
    )


def _constant_fill_dtype(op: Op) -> np.dtype:
    """`dtype` if given; else INT64 if `value` is an integer (field i), as Caffe2 infers it; else FLOAT."""
    if _is_string_dtype(op):
        raise BadArgumentError(f"{op.where}: dtype STRING is not supported (JAX has no string arrays)")
    if op.has("dtype"):
        return data_type_arg(op, "dtype")
    if op.has("value") and op.args["value"].kind == "i":
        return np.dtype(np.int64)
    return _FLOAT32


@register("ConstantFill", inputs=(0, 2), static_inputs=_input_as_shape, gradient=no_gradient)
def constant_fill(op: Op) -> Kernel:
    """Every element is `value` (default 0), or the single element of a second input."""
    arg = op.args.get("value")
    if arg is not None and arg.kind not in ("f", "i"):
        raise BadArgumentError(f"{op.where}: argument 'value' must be a number (field f or i), got field {arg.kind}")
    dtype = _constant_fill_dtype(op)
    target = np.dtype(dtype)
    value = np.zeros((), target) if arg is None else _convert(op, "value", arg.value, dtype)

    def fill(shape: Shape, _key: Any, *value_input: Any) -> jax.Array:
        fill_value = _scalar_input(op, 1, value_input[0], target) if value_input else value
        return jnp.full(shape, fill_value, dtype=target)

    return _filler(op, fill, dtype=target)


def _string_constant_fill(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """ConstantFill of dtype STRING, run on the host (JAX has no string arrays): every element is the
    string `value` (default ""), or the single string of a second input; strings are bytes, as in Caffe2."""
    arg = op.args.get("value")
    if arg is not None and arg.kind != "s":
        raise BadArgumentError(f"{op.where}: argument 'value' of a STRING fill must be a string (field s)")
    shape_of = _shape_source(op)
    first = np.asarray(workspace.get(op.inputs[0], op)) if op.inputs else None
    shape = shape_of(first)
    check_array(op.where, op.outputs[0], shape, np.dtype(object))
    value = b"" if arg is None else arg.value
    value = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(op.inputs) > 1:
        given = np.asarray(workspace.get(op.inputs[1], op))
        if given.size != 1 or given.dtype != object:
            raise ShapeError(f"{op.where}: input '{op.inputs[1]}' must hold exactly one string")
        value = given.reshape(-1)[0]
    out = np.empty(shape, dtype=object)
    out.fill(value)
    workspace.put(op.outputs[0], out)


register_host_op("ConstantFill", _string_constant_fill, check=_shape_source, applies=_is_string_dtype)


@facet("emitter", "ConstantFill")
def emit_constant_fill(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    """The kernel's jnp.full, its shape from the arguments, the input's shape or (input_as_shape) its values."""
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
    return call("jnp.full", shape, value, dtype=Raw(dtype))


_GIVEN_DTYPES = {
    "GivenTensorFill": np.dtype(np.float32),
    "GivenTensorDoubleFill": np.dtype(np.float64),
    "GivenTensorBoolFill": np.dtype(np.bool_),
    "GivenTensorInt16Fill": np.dtype(np.int16),
    "GivenTensorIntFill": np.dtype(np.int32),
    "GivenTensorInt64Fill": np.dtype(np.int64),
}
# GivenTensorFill alone honours `dtype` (given_tensor_fill_op.h), and only these.
_GIVEN_FILL_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.bool_, np.int32, np.int64))


@register(*_GIVEN_DTYPES, inputs=(0, 1), static_inputs=_input_as_shape)
def given_tensor_fill(op: Op) -> Kernel:
    """The output is `values` (float lists for float types, int lists otherwise) in the output shape."""
    dtype = _GIVEN_DTYPES[op.type]
    if op.type == "GivenTensorFill" and op.has("dtype"):
        if _is_string_dtype(op):
            raise BadArgumentError(f"{op.where}: dtype STRING is not supported (JAX has no string arrays)")
        dtype = data_type_arg(op, "dtype")
        if dtype not in _GIVEN_FILL_DTYPES:
            raise BadArgumentError(f"{op.where}: GivenTensorFill does not support dtype {dtype}")
    values = op.floats("values") if dtype.kind == "f" else op.ints("values")
    return _given(op, _convert(op, "values", values, dtype))


facet(
    "gradient",
    "GivenTensorFill",
    "GivenTensorDoubleFill",
    "GivenTensorBoolFill",
    "GivenTensorInt16Fill",
    "GivenTensorIntFill",
    "GivenTensorInt64Fill",
)(no_gradient)


@register("GivenTensorStringFill", inputs=(0, 1), gradient=no_gradient)
def given_tensor_string_fill(op: Op) -> Kernel:
    """Inside jitted code (a step net, a compiled net): refused, JAX has no string arrays; a workspace runs
    the host op below."""
    raise BadArgumentError(f"{op.where}: GivenTensorStringFill is not supported (JAX has no string arrays)")


def _given_strings(op: Op) -> list[bytes]:
    return [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in op.byte_strings("values")]


def _check_given_strings(op: Op) -> None:
    _shape_source(op)
    _given_strings(op)


def _given_tensor_string_fill(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """`values` (bytes, as Caffe2's std::strings) in the output shape, whose size must be their count."""
    values = _given_strings(op)
    first = np.asarray(workspace.get(op.inputs[0], op)) if op.inputs else None
    shape = _shape_source(op)(first)
    if math.prod(shape) != len(values):
        raise ShapeError(
            f"{op.where}: argument 'values' has {len(values)} values but the output shape {list(shape)} "
            f"needs {math.prod(shape)}"
        )
    out = np.empty(len(values), dtype=object)
    out[:] = values
    workspace.put(op.outputs[0], out.reshape(shape))


register_host_op("GivenTensorStringFill", _given_tensor_string_fill, check=_check_given_strings)


@register("GivenTensorByteStringToUInt8Fill", inputs=(0, 1), gradient=no_gradient)
def given_tensor_byte_string_to_uint8_fill(op: Op) -> Kernel:
    """`values` holds one byte string; its bytes are the uint8 output."""
    if op.has("dtype") and not _is_string_dtype(op):
        raise BadArgumentError(f"{op.where}: argument 'dtype' must be STRING (4) if given")
    strings = op.byte_strings("values")
    if len(strings) != 1:
        raise BadArgumentError(f"{op.where}: argument 'values' must hold exactly one string, got {len(strings)}")
    data = strings[0].encode("utf-8") if isinstance(strings[0], str) else strings[0]
    return _given(op, np.frombuffer(data, dtype=np.uint8))


@register("RangeFill", inputs=(0, 1), static_inputs=_input_as_shape, gradient=no_gradient)
def range_fill(op: Op) -> Kernel:
    """float32 0, 1, 2, ... in row-major order (Caffe2 uses it to debug reshapes)."""
    return _filler(op, lambda shape, _key: jnp.arange(math.prod(shape), dtype=jnp.float32).reshape(shape))


# --------------------------------------------------------------------------------------------------
# Random fillers (float32 unless stated)


def _flat(shape: Shape) -> Shape:
    """Random bits are drawn 1-D and reshaped: XLA compiles threefry over a rank-3 shape ~10x slower."""
    return (math.prod(shape),)


def _range_inputs(op: Op, names: tuple[str, str]) -> bool:
    """Whether min and max come from inputs 1 and 2 (UniformFill's 3-input form)."""
    if len(op.inputs) == 2:
        raise BadArgumentError(f"{op.where}: {op.type} takes 0, 1 or 3 inputs, got 2")
    if len(op.inputs) != 3:
        return False
    for name in names:
        if op.has(name):
            raise BadArgumentError(f"{op.where}: cannot set both the '{name}' argument and the {name} input blob")
    return True


def _bound_inputs(op: Op, bounds: tuple[Any, Any], dtype: np.dtype) -> tuple[jax.Array, jax.Array]:
    return _scalar_input(op, 1, bounds[0], dtype), _scalar_input(op, 2, bounds[1], dtype)


@register("UniformFill", inputs=(0, 3), random=True, static_inputs=_input_as_shape, gradient=no_gradient)
def uniform_fill(op: Op) -> Kernel:
    """U[min, max) with `min` (0.0) and `max` (1.0), or with the scalars of inputs 1 and 2.

    Caffe2 empties dim 0 when input min > input max; a traced shape cannot do that, so it is not emulated."""
    from_inputs = _range_inputs(op, ("min", "max"))
    low, high = op.float("min", 0.0), op.float("max", 1.0)
    if not from_inputs and not low < high:
        raise BadArgumentError(f"{op.where}: 'max' ({high}) must be bigger than 'min' ({low})")

    def fill(shape: Shape, key: jax.Array, *bounds: Any) -> jax.Array:
        lo, hi = _bound_inputs(op, bounds, _FLOAT32) if bounds else (low, high)
        return jax.random.uniform(key, _flat(shape), jnp.float32, lo, hi).reshape(shape)

    return _filler(op, fill)


def _randint_inclusive(key: jax.Array, shape: Shape, low: int, high: int) -> jax.Array:
    """int32 uniform on [low, high] even when high + 1 does not fit int32."""
    info = np.iinfo(np.int32)
    if high < info.max:
        return jax.random.randint(key, shape, low, high + 1, jnp.int32)
    if low > info.min:
        return jax.random.randint(key, shape, low - 1, high, jnp.int32) + 1
    return jax.lax.bitcast_convert_type(jax.random.bits(key, shape, jnp.uint32), jnp.int32)


@register("UniformIntFill", inputs=(0, 3), random=True, static_inputs=_input_as_shape, gradient=no_gradient)
def uniform_int_fill(op: Op) -> Kernel:
    """int32 uniform on [min, max], both inclusive (`min` 0, `max` 1), or from the scalars of inputs 1, 2."""
    from_inputs = _range_inputs(op, ("min", "max"))
    low, high = op.int("min", 0), op.int("max", 1)
    _convert(op, "min/max", [low, high], _INT32)
    if not from_inputs and not low < high:
        raise BadArgumentError(f"{op.where}: 'max' ({high}) must be bigger than 'min' ({low})")

    def fill(shape: Shape, key: jax.Array, *bounds: Any) -> jax.Array:
        if not bounds:
            return _randint_inclusive(key, _flat(shape), low, high).reshape(shape)
        lo, hi = _bound_inputs(op, bounds, _INT32)
        return jax.random.randint(key, _flat(shape), lo, hi + 1, jnp.int32).reshape(shape)

    return _filler(op, fill, dtype=_INT32)


@register("GaussianFill", inputs=(0, 1), random=True, static_inputs=_input_as_shape, gradient=no_gradient)
def gaussian_fill(op: Op) -> Kernel:
    """Normal with `mean` (0.0) and `std` (1.0)."""
    mean, std = op.float("mean", 0.0), op.float("std", 1.0)
    if std < 0:
        raise BadArgumentError(f"{op.where}: argument 'std' must not be negative, got {std}")
    return _filler(op, lambda shape, key: _normal(key, shape, mean, std))


def _normal(key: jax.Array, shape: Shape, mean: float, std: float | np.floating) -> jax.Array:
    sample = jax.random.normal(key, _flat(shape), jnp.float32).reshape(shape)
    return sample * jnp.float32(std) + jnp.float32(mean)


def _needs_rank(op: Op, rank: int) -> Callable[[Shape], None]:
    def check(shape: Shape) -> None:
        if len(shape) < rank:
            raise ShapeError(f"{op.where}: {op.type} needs an output of rank >= {rank}, got shape {list(shape)}")

    return check


@register("XavierFill", inputs=(0, 1), random=True, static_inputs=_input_as_shape, gradient=no_gradient)
def xavier_fill(op: Op) -> Kernel:
    """U[-s, s) with s = sqrt(3 / fan_in), fan_in = numel / dim 0 (a [out, in] weight's input size)."""

    def fill(shape: Shape, key: jax.Array) -> jax.Array:
        numel = math.prod(shape)
        if numel == 0:
            return jnp.zeros(shape, jnp.float32)
        scale = np.sqrt(np.float32(3) / np.float32(numel // shape[0]))
        return jax.random.uniform(key, _flat(shape), jnp.float32, -scale, scale).reshape(shape)

    return _filler(op, fill, _needs_rank(op, 1))


@register("MSRAFill", inputs=(0, 1), random=True, static_inputs=_input_as_shape, gradient=no_gradient)
def msra_fill(op: Op) -> Kernel:
    """Normal(0, s) with s = sqrt(2 / fan_out), fan_out = numel / dim 1: current Caffe2's MSRAFillOp
    (filler_op.h; 2017 versions drew U[-sqrt(2 / fan_in), ...) instead)."""

    def fill(shape: Shape, key: jax.Array) -> jax.Array:
        numel = math.prod(shape)
        if numel == 0:
            return jnp.zeros(shape, jnp.float32)
        return _normal(key, shape, 0.0, np.sqrt(np.float32(2) / np.float32(numel // shape[1])))

    return _filler(op, fill, _needs_rank(op, 2))


_UNIQUE_DTYPES = {2: np.dtype(np.int32), 10: np.dtype(np.int64)}  # TensorProto INT32, INT64


def _unique_dtype(op: Op) -> np.dtype:
    code = op.int("dtype", 2) if op.has("dtype") and op.args["dtype"].kind == "i" else None
    if code is None and op.has("dtype"):
        dtype = data_type_arg(op, "dtype")
        code = {np.dtype(np.int32): 2, np.dtype(np.int64): 10}.get(np.dtype(dtype), -1)
    dtype = _UNIQUE_DTYPES.get(2 if code is None else code)
    if dtype is None:
        raise BadArgumentError(f"{op.where}: Unexpected 'dtype' argument value: {code} (INT32 or INT64)")
    return dtype


@register("UniqueUniformFill", inputs=(0, 2), random=True, static_inputs=_input_as_shape, gradient=no_gradient)
def unique_uniform_fill(op: Op) -> Kernel:
    """Distinct integers drawn uniformly from [min, max] (both required, int arguments), none of them in the
    second input (`avoid`), int32 or (`dtype` INT64) int64, in the output shape; as many as asked must fit in
    the range, or Caffe2 refuses ("Cannot satisfy the unique requirement"). Drawn one at a time, redrawing a
    value already taken, as Caffe2's RandUniformUnique does."""
    dtype = _unique_dtype(op)
    for name in ("min", "max"):
        if not op.has(name) or op.args[name].kind != "i":
            raise BadArgumentError(f"{op.where}: UniqueUniformFill needs an integer '{name}' argument")
    low, high = op.int("min"), op.int("max")
    _convert(op, "min/max", [low, high], dtype)
    if not low < high:
        raise BadArgumentError(f"{op.where}: Max value should be bigger than min value ({low} vs {high})")

    def fill(shape: Shape, key: jax.Array, *avoid: Any) -> jax.Array:
        count = math.prod(shape)
        avoided = jnp.ravel(avoid[0]).astype(dtype) if avoid else jnp.zeros((0,), dtype)
        if avoid and np.dtype(avoid[0].dtype) != dtype:
            raise ShapeError(f"{op.where}: avoid '{op.inputs[1]}' must be {dtype}, got {avoid[0].dtype}")
        if count > high - low - avoided.size + 1:
            raise ShapeError(
                f"{op.where}: Cannot satisfy the unique requirement: {count} values from [{low}, {high}] "
                f"avoiding {avoided.size}"
            )
        if count == 0:
            return jnp.zeros(shape, dtype)
        slots = jnp.arange(count)

        def draw(carry: tuple) -> tuple:
            taken, out, key = carry
            key, sub = jax.random.split(key)
            if dtype == np.int32:
                value = _randint_inclusive(sub, (), low, high)
            else:
                value = jax.random.randint(sub, (), low, high + 1, jnp.int64)
            seen = jnp.any((out == value) & (slots < taken)) | jnp.any(avoided == value)
            out = jnp.where(seen, out, out.at[taken].set(value))
            return taken + jnp.where(seen, 0, 1), out, key

        start = (jnp.int32(0), jnp.zeros(count, dtype), key)
        _, out, _ = jax.lax.while_loop(lambda carry: carry[0] < count, draw, start)
        return out.reshape(shape)

    return _filler(op, fill, dtype=dtype)
