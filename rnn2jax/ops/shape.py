"""Shape and data-movement ops: copies, reshapes, transposes, concat/split, slicing, casts and gathers,
plus the gradient ops of those whose gradient is not another forward op (SliceGradient, and Gather's
dense gradients SparseToDense and BatchGatherGradient).

Most of these only rearrange data, so their kernels are static-shape `jax.numpy` code. Blobs that
describe shapes (Reshape's `old_shape`, Concat's `split_info`) are returned as NumPy constants, so that
an op reading them back later (Caffe2's gradient nets do: `Reshape(GO, old_shape)`,
`Split(GO, split_info)`) still sees concrete values under `jax.jit`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError, UnsupportedOpError
from ..ir.netdef import Op
from ..proto import caffe2_pb2 as pb
from .checks import first_bad, literal, runtime_check, runtime_checked
from .common import TRACED_SHAPE_HINT, Dims, canonical_axis, data_type_arg, size_from_dim, size_to_dim
from .emit import Call, EmitWriter, Unsupported, call, codegen_helper, only_first
from .emit import literal as source_literal
from .facets import GRADIENT_OP, NO_EMITTER, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Absent, Roles
from .gradient_makers import (
    GradientContext,
    GradientError,
    GradientOps,
    argument,
    concat_of_output_gradients,
    gradient_op,
    no_gradient,
    should_not_do_gradient,
    single_gradient,
)
from .registry import HostWorkspace, Kernel, declare_family, facet, register, register_host_op
from .shape_facts import INT32, Context, Guesses, Solver, Spec, output_like_input
from .strings import moves_strings

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, gradient=GRADIENT_OP, emitter=NO_EMITTER)

_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))

# --------------------------------------------------------------------------------------------------
# Helpers


def _identity(x: Any, *_ignored: Any) -> Any:
    return x


def _shape_constant(values: Sequence[Any], dtype: type) -> Any:
    """A shape-valued output as a concrete NumPy array in the dtype JAX would use; under `jax.export`
    with symbolic dims (shape polymorphism) it can only be a traced array of those dims."""
    if all(isinstance(v, int | np.integer) for v in values):
        return np.asarray(values, dtype=np.dtype(dtype))
    return jnp.asarray(jnp.stack([jnp.asarray(v) for v in values]), dtype=np.dtype(dtype))


def _concrete_ints(op: Op, value: Any, what: str, hint: str) -> np.ndarray:
    """The values of a 1-D integer input that decides a shape. Output shapes must be static under
    `jax.jit`, so a traced value (computed inside the jitted function) cannot be used."""
    if isinstance(value, jax.core.Tracer):
        raise ShapeError(
            f"{op.where}: input '{what}' decides the output shape, so its values must be known when "
            f"the net is traced, but it is a traced array here; {hint}"
        )
    values = np.asarray(value)
    if values.ndim != 1 or values.dtype not in _INDEX_DTYPES:
        raise ShapeError(
            f"{op.where}: input '{what}' must be a 1-D int32 or int64 tensor, "
            f"got {values.dtype}[{','.join(map(str, values.shape))}]"
        )
    return values


def _axis_from_order(op: Op) -> int:
    """Caffe2's `GetDimFromOrderString`: the channel axis of a 4-D image in `order` (default NCHW)."""
    order = op.str("order", "NCHW")
    if order in ("NCHW", "nchw"):
        return 1
    if order in ("NHWC", "nhwc"):
        return 3
    raise BadArgumentError(f"{op.where}: argument 'order' = {order!r} is not NCHW or NHWC")


def _concat_split_axis(op: Op) -> tuple[int, bool]:
    """(axis, add_axis) as Concat and Split read them: `axis` xor `order`; `add_axis` only with `axis`."""
    if op.has("axis") and op.has("order"):
        raise BadArgumentError(f"{op.where}: give either argument 'axis' or 'order', not both")
    if op.has("axis"):
        return op.int("axis"), op.bool("add_axis", False)
    return _axis_from_order(op), False


def _sorted_dims(op: Op) -> tuple[int, ...]:
    """Squeeze's and ExpandDims' `dims`: required, non-negative; sorted and deduplicated as Caffe2 does."""
    dims = op.ints("dims", ())
    if not dims:
        raise BadArgumentError(f"{op.where}: argument 'dims' must be given and non-empty")
    if min(dims) < 0:
        raise BadArgumentError(f"{op.where}: argument 'dims' = {list(dims)} has negative dims")
    return tuple(sorted(set(dims)))


# --------------------------------------------------------------------------------------------------
# Identities: on one XLA device every copy, alias or device move is the value itself.


@register("Copy", "Alias", "EnsureCPUOutput", "CopyGPUToCPU", "CopyCPUToGPU", "CopyFromCPUInput")
def copy(op: Op) -> Kernel:
    return _identity


@facet("gradient", "Alias")
def _alias_gradient_maker(g: GradientContext) -> GradientOps:
    g.set_dense(0, g.GO(0))
    return []


@facet("gradient", "Copy")
def _copy_gradient_maker(g: GradientContext) -> GradientOps:
    return [gradient_op("CopyOnDeviceLike", [g.GO(0), g.I(0)], [g.GI(0)])]


@facet("gradient", "CopyCPUToGPU", "CopyGPUToCPU")
def _device_copy_gradient_maker(g: GradientContext) -> GradientOps:
    """The copy the other way."""
    back = "CopyGPUToCPU" if g.op.type == "CopyCPUToGPU" else "CopyCPUToGPU"
    return [gradient_op(back, [g.GO(0)], [g.GI(0)])]


facet("gradient", "EnsureCPUOutput")(no_gradient)


facet("gradient", "CopyFromCPUInput")(NO_GRADIENT)


facet("shape_rule", "Copy", "Alias", "EnsureCPUOutput", "CopyGPUToCPU", "CopyCPUToGPU")(output_like_input)

# Caffe2's CPU Copy copies any tensor, strings too
register_host_op("Copy", moves_strings(copy, outputs=(0,), together=(0,)), string_inputs=(0,))


# --------------------------------------------------------------------------------------------------
# IDEEP (MKL-DNN) device copies: Caffe2's CPU wheel registers these for device_type IDEEP only, where an IDEEP
# tensor is float32; blobs have no device here, so an IDEEP tensor is a float32 array.

IDEEP = pb.PROTO_IDEEP
_DEVICE_NAMES = {pb.PROTO_CPU: "CPU", pb.PROTO_CUDA: "CUDA", pb.PROTO_MKLDNN: "MKLDNN", pb.PROTO_HIP: "HIP"}
_DEVICE_NAMES[IDEEP] = "IDEEP"


def _ideep_only(op: Op) -> None:
    """Caffe2 cannot create these on another device. An op without a device option runs on the net's,
    which its record does not see: that one is let through."""
    if op.device is not None and op.device.device_type != IDEEP:
        device = _DEVICE_NAMES.get(op.device.device_type, str(op.device.device_type))
        raise UnsupportedOpError(
            f"{op.where}: Cannot create operator of type '{op.type}' on the device '{device}': Caffe2 has it "
            "for device_type IDEEP (5) only"
        )


@register("CopyCPUToIDEEP", gradient=NO_GRADIENT)
def copy_cpu_to_ideep(op: Op) -> Kernel:
    """The input's bytes as an IDEEP (float32) tensor of its shape, as Caffe2's `feed_from` reads them: float32
    is copied, another 4-byte type reinterpreted, an 8-byte type gives the first half of its bytes. A narrower
    type Caffe2 reads past its end (undefined: refused here), as a 0-d one IDEEP's reorder refuses."""
    _ideep_only(op)

    def kernel(x):
        x = jnp.asarray(x)
        if x.ndim == 0:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[0]}' is 0-d: IDEEP could not create a primitive descriptor for "
                "a reorder primitive"
            )
        if x.dtype == jnp.float32:
            return x
        if x.dtype.itemsize == 4:
            return jax.lax.bitcast_convert_type(x, jnp.float32)
        if x.dtype.itemsize == 8:
            words = jax.lax.bitcast_convert_type(x.reshape(-1), jnp.float32).reshape(-1)
            return words[: x.size].reshape(x.shape)
        raise InputTypeError(
            f"{op.where}: input '{op.inputs[0]}' is {x.dtype}, narrower than float32: Caffe2 reads past its end"
        )

    return kernel


@facet("shape_rule", "CopyCPUToIDEEP")
def _ideep_tensor_shape(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """The input's shape, in float32."""
    if ins and ins[0] is not None and outs and outs[0] is None:
        return {}, {0: Spec(ins[0].shape, np.dtype(np.float32))}
    return {}, {}


@register("CopyIDEEPToCPU", gradient=NO_GRADIENT)
def copy_ideep_to_cpu(op: Op) -> Kernel:
    """An IDEEP (float32) tensor, or a CPU tensor of any type, copied to the CPU: the value itself."""
    _ideep_only(op)
    return _identity


facet("shape_rule", "CopyIDEEPToCPU")(output_like_input)


@register("CopyOnDeviceLike", inputs=2, gradient=NO_GRADIENT)
def copy_on_device_like(op: Op) -> Kernel:
    """Copies input 0 to input 1's device: on one device, input 0 itself."""
    return _identity


@facet(
    "emitter", "Copy", "Alias", "EnsureCPUOutput", "CopyGPUToCPU", "CopyCPUToGPU", "CopyFromCPUInput", "CopyIDEEPToCPU"
)
@facet("emitter", "CopyOnDeviceLike")
def emit_copy(w: EmitWriter, op: Op, xs: list[str]) -> str:
    """On one XLA device every copy, alias or device move is the value itself."""
    return xs[0]


@register(
    "ResizeLike",
    inputs=2,
    gradient=Absent("Caffe2 says SHOULD_NOT_DO_GRADIENT; the builder has no maker for it"),
)
def resize_like(op: Op) -> Kernel:
    """(X, like) -> X reshaped to like's shape (Flatten's gradient); the element counts must match."""

    def kernel(x, like):
        if x.size != like.size:
            raise ShapeError(
                f"{op.where}: input '{op.inputs[0]}' {list(x.shape)} and '{op.inputs[1]}' {list(like.shape)} "
                "have different sizes"
            )
        return jnp.reshape(x, like.shape)

    return kernel


@register("StopGradient", shape_rule=output_like_input, gradient=no_gradient)
def stop_gradient(op: Op) -> Kernel:
    return jax.lax.stop_gradient


@facet("emitter", "StopGradient")
def emit_stop_gradient(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    return call("lax.stop_gradient", xs[0])


# --------------------------------------------------------------------------------------------------
# Reshape


def _check_new_shape(op: Op, dims: Sequence[int], source: str) -> None:
    bad = [d for d in dims if d < -1]
    if bad:
        raise BadArgumentError(f"{op.where}: {source} has invalid dims {bad} (only -1 and dims >= 0 allowed)")
    if list(dims).count(-1) > 1:
        raise BadArgumentError(f"{op.where}: {source} = {list(dims)} has more than one -1 (inferred) dim")


def _resolve_shape(op: Op, old: Sequence[int], new: Sequence[int], source: str) -> tuple[int, ...]:
    """Caffe2's rules (reshape_op.h): a 0 copies the input dim at that index, but only when the input
    is non-empty; a single -1 takes what is left (0 for an empty input). Caffe2 gives an empty input
    any non-empty shape asked for, filled with uninitialised memory: that is refused here."""
    total = math.prod(old)
    resolved = []
    for i, d in enumerate(new):
        if d == 0 and total != 0:
            if i >= len(old):
                raise ShapeError(
                    f"{op.where}: {source} = {list(new)} copies input dim {i} (a 0), "
                    f"but the input has only {len(old)} dims {list(old)}"
                )
            d = old[i]
        resolved.append(int(d) if isinstance(d, int | np.integer) else d)  # a symbolic dim stays one
    known = math.prod(d for d in resolved if d != -1)
    if total == 0:
        resolved = [0 if d == -1 else d for d in resolved]
        if math.prod(resolved) != 0:
            raise ShapeError(
                f"{op.where}: {source} = {list(new)} asks for {math.prod(resolved)} elements from an empty "
                f"input of shape {list(old)} (Caffe2 would fill them with uninitialised memory)"
            )
    elif -1 in resolved:
        if known == 0 or total % known:
            symbolic = not isinstance(total, int | np.integer)
            raise ShapeError(
                f"{op.where}: {source} = {list(new)} does not fit an input of shape {list(old)}"
                + (" for every size of its symbolic dims; export with sizes for them" if symbolic else "")
            )
        resolved[resolved.index(-1)] = total // known
    elif known != total:
        raise ShapeError(
            f"{op.where}: {source} = {list(new)} ({known} elements) does not fit an input of shape "
            f"{list(old)} ({total} elements)"
        )
    return tuple(resolved)


@register("Reshape", inputs=(1, 2), outputs=(1, 2), static_inputs=(1,), shape_outputs=(1,))
def reshape(op: Op) -> Kernel:
    """(data[, new_shape]) -> (reshaped, old_shape); the shape comes from argument `shape` xor input 1."""
    from_input = len(op.inputs) == 2
    if from_input and op.has("shape"):
        raise BadArgumentError(
            f"{op.where}: the new shape is given by input '{op.inputs[1]}'; do not also pass argument 'shape'"
        )
    if not from_input and not op.has("shape"):
        raise BadArgumentError(f"{op.where}: missing argument 'shape' (or a second input with the new shape)")
    arg_shape = () if from_input else op.ints("shape")
    _check_new_shape(op, arg_shape, "argument 'shape'")

    def kernel(x, new_shape=None):
        old_dtype = np.int64  # Caffe2 writes old_shape in the shape input's type, int64 by default
        if from_input:
            hint = f"use the argument 'shape' instead; {TRACED_SHAPE_HINT}"
            array = _concrete_ints(op, new_shape, op.inputs[1], hint)
            values, source, old_dtype = tuple(array.tolist()), f"input '{op.inputs[1]}'", array.dtype.type
            _check_new_shape(op, values, source)
        else:
            values, source = arg_shape, "argument 'shape'"
        out = jnp.reshape(x, _resolve_shape(op, x.shape, values, source))
        return out, _shape_constant(x.shape, old_dtype)

    return kernel


@facet("gradient", "Reshape")
def _reshape_gradient_maker(g: GradientContext) -> GradientOps:
    """Back to the old shape the forward op gave out."""
    g.copy_args = False
    return [gradient_op("Reshape", [g.GO(0), g.O(1)], [g.GI(0), "_" + g.GI(0) + "_dims"])]


@codegen_helper
def reshape_with_old_shape(x: jax.Array, shape: list[int]) -> tuple[jax.Array, np.ndarray]:
    """Caffe2's Reshape -> (reshaped, old shape as int64): a 0 copies the input's dim (input not empty), one
    -1 takes what is left. (The lowering's kernel resolves the shape in `_resolve_shape`, with Caffe2's
    checks and symbolic dims; this is its arithmetic for a net already checked.)"""
    total = math.prod(x.shape)
    dims = [x.shape[i] if d == 0 and total else int(d) for i, d in enumerate(shape)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = total // known if known else 0
    return jnp.reshape(x, dims), np.asarray(x.shape, np.int64)


@facet("emitter", "Reshape")
def emit_reshape(w: EmitWriter, op: Op, xs: list[str]) -> Call | str:
    shape = f"np.asarray({xs[1]}).tolist()" if len(xs) == 2 else source_literal(list(op.ints("shape")))
    return only_first(op, call(w.helper(reshape_with_old_shape), xs[0], shape))


# --------------------------------------------------------------------------------------------------
# Transpose, Squeeze, ExpandDims, Flatten


@register("Shape", shape_only=True, gradient=should_not_do_gradient)
def shape(op: Op) -> Kernel:
    """The input's dims as an int64 1-D tensor (optionally only `axes`), as a constant: shapes are
    static under jit, so what nets compute from them (initial coverage sizes...) stays concrete."""
    axes = op.ints("axes", ())
    if any(a < 0 for a in axes):
        raise BadArgumentError(f"{op.where}: argument 'axes' = {list(axes)} has negative entries (Caffe2 refuses)")

    def kernel(x):
        dims = [x.shape[canonical_axis(op, a, x.ndim, "axes entry")] for a in axes] if axes else list(x.shape)
        return Dims.of(dims, np.int64)  # symbolic dims stay dims for the Slice and fills that read them

    return kernel


@codegen_helper
def shape_of(x: jax.Array, axes: tuple[int, ...] = ()) -> np.ndarray:
    """Caffe2's Shape: the dims (or those at `axes`) as an int64 NumPy array, known while tracing. (The
    lowering's kernel keeps symbolic dims as `Dims`; with concrete shapes it gives this.)"""
    dims = [x.shape[a] for a in axes] if axes else list(x.shape)
    return np.asarray(dims, np.int64)


@facet("emitter", "Shape")
def emit_shape(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    axes = op.ints("axes", ())
    return call(w.helper(shape_of), xs[0], *((source_literal(tuple(axes)),) if axes else ()))


@register("Transpose")
def transpose(op: Op) -> Kernel:
    """Argument `axes` (a permutation of 0..ndim-1); by default the dims are reversed."""
    axes = op.ints("axes", ())
    if sorted(axes) != list(range(len(axes))):
        raise BadArgumentError(f"{op.where}: argument 'axes' = {list(axes)} is not a permutation of 0..n-1")

    def kernel(x):
        if not axes:
            return jnp.transpose(x)
        if len(axes) != x.ndim:
            raise ShapeError(f"{op.where}: argument 'axes' = {list(axes)} does not fit an input of rank {x.ndim}")
        return jnp.transpose(x, axes)

    return kernel


@facet("gradient", "Transpose")
def _transpose_gradient_maker(g: GradientContext) -> GradientOps:
    """Forward args copied in place, `axes` replaced by the inverse permutation."""
    g.copy_args = False
    op = gradient_op("Transpose", [g.GO(0)], [g.GI(0)], g.op.arg)
    for arg in op.arg:
        if arg.name == "axes":
            inverse = [0] * len(arg.ints)
            for i, axis in enumerate(arg.ints):
                inverse[axis] = i
            arg.ClearField("ints")
            arg.ints.extend(inverse)
    return [op]


@facet("emitter", "Transpose")
def emit_transpose(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    axes = op.ints("axes", ())
    return call("jnp.transpose", xs[0], *((source_literal(tuple(axes)),) if axes else ()))


@register("Squeeze", gradient=single_gradient("ExpandDims", "GO(0)"))
def squeeze(op: Op) -> Kernel:
    dims = _sorted_dims(op)

    def kernel(x):
        if dims[-1] >= x.ndim:
            raise ShapeError(f"{op.where}: argument 'dims' = {list(dims)} needs a rank > {dims[-1]}, got {x.ndim}")
        wrong = [d for d in dims if x.shape[d] != 1]
        if wrong:
            raise ShapeError(
                f"{op.where}: can only squeeze dims of size 1, but dims {wrong} of the input {list(x.shape)} are not 1"
            )
        return jnp.squeeze(x, dims)

    return kernel


@facet("emitter", "Squeeze")
def emit_squeeze(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    return call("jnp.squeeze", xs[0], source_literal(_sorted_dims(op)))


@register("ExpandDims", gradient=single_gradient("Squeeze", "GO(0)"))
def expand_dims(op: Op) -> Kernel:
    """Argument `dims`: where the new size-1 dims are in the output."""
    dims = _sorted_dims(op)

    def kernel(x):
        if dims[-1] >= x.ndim + len(dims):
            raise ShapeError(
                f"{op.where}: argument 'dims' = {list(dims)} needs an input of rank >= "
                f"{dims[-1] + 1 - len(dims)}, got {x.ndim}"
            )
        return jnp.expand_dims(x, dims)

    return kernel


@facet("emitter", "ExpandDims")
def emit_expand_dims(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    return call("jnp.expand_dims", xs[0], source_literal(_sorted_dims(op)))


@register("Flatten", gradient=single_gradient("ResizeLike", "GO(0) I(0)"))
def flatten(op: Op) -> Kernel:
    """To 2-D: [size_to_dim(axis), size_from_dim(axis)]."""
    axis = op.int("axis", 1)
    if axis < 0:
        raise BadArgumentError(f"{op.where}: argument 'axis' = {axis} must be >= 0")

    def kernel(x):
        if x.ndim < axis:
            raise ShapeError(f"{op.where}: argument 'axis' = {axis} needs an input of rank >= {axis}, got {x.ndim}")
        return jnp.reshape(x, (size_to_dim(x.shape, axis), size_from_dim(x.shape, axis)))

    return kernel


# --------------------------------------------------------------------------------------------------
# Concat / Split


@register("Concat", "DepthConcat", inputs=(1, None), outputs=(1, 2), shape_outputs=(1,))
def concat(op: Op) -> Kernel:
    """(x0, x1, ...) -> (y, split_info); `add_axis` stacks along a new axis instead."""
    axis, add_axis = _concat_split_axis(op)

    def kernel(*xs):
        first = xs[0]
        for name, x in zip(op.inputs[1:], xs[1:], strict=True):
            if x.dtype != first.dtype:
                raise ShapeError(
                    f"{op.where}: all inputs must have one dtype: '{op.inputs[0]}' is {first.dtype}, "
                    f"'{name}' is {x.dtype}"
                )
            if x.ndim != first.ndim:
                raise ShapeError(
                    f"{op.where}: inputs '{op.inputs[0]}' {list(first.shape)} and '{name}' {list(x.shape)} "
                    "have different ranks"
                )
        ax = canonical_axis(op, axis, first.ndim + add_axis)
        # With add_axis every dim must match; otherwise all but the concat axis.
        kept = [i for i in range(first.ndim) if add_axis or i != ax]
        for name, x in zip(op.inputs[1:], xs[1:], strict=True):
            if any(x.shape[i] != first.shape[i] for i in kept):
                need = "equal shapes (add_axis=1)" if add_axis else f"equal dims except along axis {ax}"
                raise ShapeError(
                    f"{op.where}: inputs need {need}, but '{op.inputs[0]}' is {list(first.shape)} "
                    f"and '{name}' is {list(x.shape)}"
                )
        if add_axis:
            return jnp.stack(xs, axis=ax), _shape_constant([1] * len(xs), np.int32)
        return jnp.concatenate(xs, axis=ax), _shape_constant([x.shape[ax] for x in xs], np.int32)

    return kernel


@facet("gradient", "Concat")
def _concat_gradient_maker(g: GradientContext) -> GradientOps:
    """A Split of dY by the forward's split_info (no op when the output has no gradient)."""
    if g.g_output[0] is None:
        return []
    return [gradient_op("Split", [g.GO(0), g.O(1)], [g.GI(i) for i in range(len(g.op.input))])]


@facet("gradient", "DepthConcat")
def _depth_concat_gradient_maker(g: GradientContext) -> GradientOps:
    return [gradient_op("Split", [g.GO(0), g.O(1)], [g.GI(i) for i in range(len(g.op.input))])]


# Caffe2's CPU Concat concatenates tensors of any type, strings too
register_host_op("Concat", moves_strings(concat, outputs=(0,)), string_inputs="all")


@codegen_helper
def concat_with_split_info(xs: list[jax.Array], axis: int = 1, add_axis: bool = False) -> tuple[jax.Array, np.ndarray]:
    """Caffe2's Concat -> (the concatenation, the sizes along the axis as int32 split_info); add_axis stacks
    along a new axis. (The lowering's kernel checks dtypes, ranks and dims first and keeps symbolic sizes in
    split_info; its maths is this.)"""
    axis = axis % (xs[0].ndim + add_axis)
    if add_axis:
        return jnp.stack(xs, axis=axis), np.ones(len(xs), np.int32)
    return jnp.concatenate(xs, axis=axis), np.array([x.shape[axis] for x in xs], np.int32)


@facet("emitter", "Concat", "DepthConcat")
def emit_concat(w: EmitWriter, op: Op, xs: list[str]) -> Call | str:
    axis, add_axis = _concat_split_axis(op)
    keywords: dict = {"axis": axis} | ({"add_axis": True} if add_axis else {})
    return only_first(op, call(w.helper(concat_with_split_info), f"[{', '.join(xs)}]", **keywords))


@facet("shape_rule", "Concat")
def concat_shapes(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """Concat: the one input not known is what the output has beyond the others along the axis."""
    if op.int("add_axis", 0) or op.has("order") or not outs or outs[0] is None:
        return {}, {}
    missing = [i for i, s in enumerate(ins) if s is None]
    out = outs[0].shape
    if len(missing) != 1 or any(len(s.shape) != len(out) for s in ins if s is not None):
        return {}, {}
    axis = op.int("axis", 1) % len(out)
    rest = out[axis] - sum(s.shape[axis] for s in ins if s is not None)
    return {missing[0]: Spec((*out[:axis], rest, *out[axis + 1 :]), outs[0].dtype)}, {}


@register(
    "Split",
    "DepthSplit",
    inputs=(1, 2),
    outputs=(1, None),
    static_inputs=(1,),
    gradient=concat_of_output_gradients,
)
def split(op: Op) -> Kernel:
    """(input[, split]) -> (out0, ...): sizes from input 1 xor argument `split` xor an equal split."""
    axis, add_axis = _concat_split_axis(op)
    n = len(op.outputs)
    from_input = len(op.inputs) == 2
    arg_split = op.ints("split", ())
    if from_input and arg_split:
        raise BadArgumentError(
            f"{op.where}: the split sizes come from input '{op.inputs[1]}'; do not also pass argument 'split'"
        )
    if arg_split and len(arg_split) != n:
        raise BadArgumentError(
            f"{op.where}: argument 'split' = {list(arg_split)} has {len(arg_split)} sizes for {n} outputs"
        )
    if any(s < 0 for s in arg_split):
        raise BadArgumentError(f"{op.where}: argument 'split' = {list(arg_split)} has negative sizes")

    def sizes_from_input(split_blob: Any, dim: int) -> tuple[int, ...]:
        if np.dtype(split_blob.dtype) != np.int32:  # Caffe2 reads it as int and refuses int64
            raise ShapeError(
                f"{op.where}: input '{op.inputs[1]}' (the split sizes) must be int32, got {split_blob.dtype}"
            )
        if n == 1 and isinstance(split_blob, jax.core.Tracer):
            return (dim,)  # one output takes the whole dim, whatever the values say
        hint = f"use the argument 'split' instead; {TRACED_SHAPE_HINT}"
        values = _concrete_ints(op, split_blob, op.inputs[1], hint)
        if values.size != n:
            raise ShapeError(f"{op.where}: input '{op.inputs[1]}' has {values.size} sizes for {n} outputs")
        return tuple(int(v) for v in values)

    def kernel(x, split_blob=None):
        ax = canonical_axis(op, axis, x.ndim)
        dim = x.shape[ax]
        if add_axis:  # one output per index along the axis, which is removed; sizes do not matter
            if n != dim:
                raise ShapeError(f"{op.where}: add_axis=1 needs one output per index of dim {ax} (size {dim}), got {n}")
            return tuple(jnp.squeeze(part, ax) for part in jnp.split(x, n, axis=ax))
        if from_input:
            sizes = sizes_from_input(split_blob, dim)
        elif arg_split:
            sizes = arg_split
        else:
            if dim % n:
                raise ShapeError(f"{op.where}: cannot split dim {ax} of size {dim} into {n} equal parts")
            sizes = (dim // n,) * n
        if sum(sizes) != dim or min(sizes) < 0:
            raise ShapeError(f"{op.where}: split sizes {list(sizes)} do not add up to dim {ax} of size {dim}")
        return split_by_sizes(x, sizes, ax)

    return kernel


@codegen_helper
def split_by_sizes(x: jax.Array, sizes: list[int] | tuple[int, ...], axis: int = 1) -> tuple[jax.Array, ...]:
    """Caffe2's Split: consecutive parts of x along `axis`, of the given sizes."""
    return tuple(jnp.split(x, np.cumsum(np.asarray(sizes))[:-1].tolist(), axis=axis % x.ndim))


@facet("emitter", "Split", "DepthSplit")
def emit_split(w: EmitWriter, op: Op, xs: list[str]) -> Call | str:
    axis, add_axis = _concat_split_axis(op)
    if add_axis:
        raise Unsupported("Split with add_axis=1")
    n = len(op.outputs)
    if len(xs) == 2:
        value = call(w.helper(split_by_sizes), xs[0], f"np.asarray({xs[1]}).tolist()", axis=axis)
    elif op.ints("split", ()):
        value = call(w.helper(split_by_sizes), xs[0], source_literal(list(op.ints("split"))), axis=axis)
    else:
        value = call("jnp.split", xs[0], str(n), axis=axis)
    return f"{value.flat()}[0]" if n == 1 else value


# --------------------------------------------------------------------------------------------------
# Slice


def _slice_limits(
    op: Op, shape: Sequence[int], starts: Sequence[int], ends: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Caffe2's `SliceImpl`: a negative index i means dim + 1 + i (so end -1 is through the last
    element), indices past the dim are clamped to it, and dims after len(starts) are kept whole."""
    if len(starts) != len(ends):
        raise ShapeError(f"{op.where}: {len(starts)} starts but {len(ends)} ends")
    if len(starts) > len(shape):
        raise ShapeError(f"{op.where}: {len(starts)} starts/ends for an input of rank {len(shape)}")
    lo, hi = [], []
    sliced = None
    for i, dim in enumerate(shape):
        if i >= len(starts) or dim == 0:
            lo.append(0)
            hi.append(dim)
            continue
        start, end = (int(v) + dim + 1 if v < 0 else int(v) for v in (starts[i], ends[i]))
        start, end = min(start, dim), min(end, dim)
        if start < 0 or end < start:
            raise ShapeError(
                f"{op.where}: slice [{starts[i]}, {ends[i]}) of dim {i} (size {dim}) gives "
                f"[{start}, {end}), which is not a valid range"
            )
        if (start, end) != (0, dim) and 0 not in shape:  # Caffe2 returns before this check when empty
            if sliced is not None:
                raise ShapeError(
                    f"{op.where}: starts {list(starts)} / ends {list(ends)} slice dims {sliced} and {i}; "
                    "Caffe2 can only slice in one dimension"
                )
            sliced = i
        lo.append(start)
        hi.append(end)
    return lo, hi


def _slice_arguments(op: Op, from_inputs: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The `starts`/`ends` arguments (empty when the bounds come as inputs: Caffe2 then ignores them)."""
    if from_inputs:
        return (), ()
    starts, ends = op.ints("starts"), op.ints("ends")
    if len(starts) != len(ends):
        raise BadArgumentError(f"{op.where}: arguments 'starts' ({len(starts)} values) and 'ends' ({len(ends)}) differ")
    return starts, ends


def _slice_bounds(
    op: Op, shape: Sequence[int], arguments: tuple[Sequence[int], Sequence[int]], blobs: tuple[Any, ...]
) -> tuple[list[int], list[int]]:
    """[lo, hi) per dim, from the `starts`/`ends` blobs (inputs 1 and 2) if given, else the arguments."""
    if not blobs:
        return _slice_limits(op, shape, *arguments)
    hint = f"use the arguments 'starts'/'ends' instead; {TRACED_SHAPE_HINT}"
    names = op.inputs[1:3]
    starts, ends = (_concrete_ints(op, b, n, hint).tolist() for b, n in zip(blobs, names, strict=True))
    return _slice_limits(op, shape, starts, ends)


@register("Slice", inputs=(1, 3), static_inputs=(1, 2))
def slice_(op: Op) -> Kernel:
    """(data[, starts, ends]) -> out; bounds from arguments `starts`/`ends` or from inputs 1 and 2.
    As in Caffe2 (slice_op.h), at most one dim may be sliced (the others must be kept whole)."""
    if len(op.inputs) == 2:
        raise BadArgumentError(f"{op.where}: Slice takes 1 input (with arguments) or 3 (data, starts, ends)")
    arguments = _slice_arguments(op, len(op.inputs) == 3)

    def kernel(x, *bound_blobs):
        lo, hi = _slice_bounds(op, x.shape, arguments, bound_blobs)
        if isinstance(x, Dims):  # a 1-D blob of symbolic dims (Shape's): slice the dims themselves
            return Dims.of(x.values[lo[0] : hi[0]], x.dtype)
        return jax.lax.slice(x, lo, hi)

    kernel.dims_inputs = (0,)  # type: ignore[attr-defined]
    return kernel


@facet("gradient", "Slice")
def _slice_gradient_maker(g: GradientContext) -> GradientOps:
    inputs = [g.I(i) for i in range(len(g.op.input))] + [g.GO(0)]
    return [gradient_op("SliceGradient", inputs, [g.GI(0)])]


@codegen_helper
def slice_dims(x: jax.Array, starts: list[int], ends: list[int]) -> jax.Array:
    """Caffe2's Slice: a negative index i means dim + 1 + i; indices clamp to the dim; dims after
    len(starts) are kept whole. (The lowering's `_slice_limits` computes these bounds with Caffe2's checks:
    valid ranges, one sliced dim.)"""
    bounds = []
    for i, dim in enumerate(x.shape):
        if i >= len(starts) or dim == 0:
            bounds.append(slice(0, dim))
            continue
        start, end = (int(v) + dim + 1 if v < 0 else int(v) for v in (starts[i], ends[i]))
        bounds.append(slice(min(start, dim), min(end, dim)))
    return x[tuple(bounds)]


@facet("emitter", "Slice")
def emit_slice(w: EmitWriter, op: Op, xs: list[str]) -> Call:
    if len(xs) == 3:
        bounds = [f"np.asarray({xs[1]}).tolist()", f"np.asarray({xs[2]}).tolist()"]
    else:
        bounds = [source_literal(list(op.ints("starts"))), source_literal(list(op.ints("ends")))]
    return call(w.helper(slice_dims), xs[0], *bounds)


@register("SliceGradient", inputs=(2, 4), static_inputs=lambda op: (1, 2) if len(op.inputs) == 4 else ())
def slice_gradient(op: Op) -> Kernel:
    """(data[, starts, ends], dY) -> dX: zeros shaped like data (in dY's dtype) with dY written where
    the forward Slice read (caffe2/operators/slice_op.h, `SliceImpl` backward). Bounds as in Slice."""
    if len(op.inputs) == 3:
        raise BadArgumentError(
            f"{op.where}: SliceGradient takes 2 inputs (data, dY; with arguments) or 4 (data, starts, ends, dY)"
        )
    arguments = _slice_arguments(op, len(op.inputs) == 4)

    def kernel(data, *rest):
        *bound_blobs, dy = rest
        lo, hi = _slice_bounds(op, data.shape, arguments, tuple(bound_blobs))
        sliced = tuple(h - low for low, h in zip(lo, hi, strict=True))
        if tuple(dy.shape) != sliced:
            raise ShapeError(
                f"{op.where}: dY '{op.inputs[-1]}' has shape {list(dy.shape)}, but the slice of data "
                f"'{op.inputs[0]}' {list(data.shape)} has shape {list(sliced)}"
            )
        padding = [(low, dim - h, 0) for low, h, dim in zip(lo, hi, data.shape, strict=True)]
        return jax.lax.pad(dy, jnp.zeros((), dy.dtype), padding)

    return kernel


# --------------------------------------------------------------------------------------------------
# Cast


@register("Cast")
def cast(op: Op) -> Kernel:
    """Argument `to` (a TensorProto.DataType or its name). Float to int truncates toward zero (C++
    static_cast); to bool is x != 0."""
    to = data_type_arg(op, "to")
    if to is None:
        raise BadArgumentError(f"{op.where}: missing required argument 'to' (the data type to cast to)")
    if _is_byte(op):
        raise BadArgumentError(f"{op.where}: Cast to BYTE is not supported (Caffe2's Cast aborts on it)")
    if to == np.bool_:
        return lambda x: jnp.asarray(x) != 0
    dtype = np.dtype(to)
    return lambda x: jnp.asarray(x).astype(dtype)


def _to_string(op: Op) -> bool:
    """`to` is TensorProto.STRING (4, or "string")."""
    arg = op.args.get("to")
    return arg is not None and (
        (arg.kind == "i" and arg.value == pb.TensorProto.STRING)
        or (arg.kind == "s" and str(arg.value).lower() == "string")
    )


def _string_of(dtype: np.dtype) -> Callable[[Any], bytes] | None:
    """C++ std::to_string of an element (floats as "%f"), which Caffe2's Cast to STRING writes; None for the
    types it refuses (float16, strings)."""
    if dtype.kind in "iu":
        return lambda v: str(int(v)).encode()
    if dtype == np.bool_:
        return lambda v: b"1" if v else b"0"
    if dtype in (np.float32, np.float64):
        return lambda v: (b"-nan" if np.signbit(v) else b"nan") if np.isnan(v) else f"{float(v):f}".encode()
    return None


def _cast_to_string(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Cast with `to` STRING, on the host (JAX has no strings): each element as std::to_string writes it."""
    name = op.inputs[0]
    value = workspace.get(name, op)
    array = value if isinstance(value, np.ndarray) and value.dtype == object else np.asarray(value)
    text = _string_of(array.dtype)
    if text is None:
        kind = "strings" if array.dtype == object else str(array.dtype)
        raise InputTypeError(f"{op.where}: Cast to STRING does not support input '{name}' of type {kind}")
    out = np.empty(array.shape, dtype=object)
    for index, item in np.ndenumerate(array):
        out[index] = text(item)
    workspace.put(op.outputs[0], out)


def _check_cast_to_string(op: Op) -> None:
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: Cast takes 1 input and 1 output")


register_host_op("Cast", _cast_to_string, check=_check_cast_to_string, applies=_to_string)


def _cast_data_type(arg: pb.Argument | None) -> int:
    """`cast::GetCastDataType`: an int, or a type name such as "float" / "INT32"."""
    if arg is None:
        return pb.TensorProto.FLOAT
    if arg.HasField("i"):
        return arg.i
    return pb.TensorProto.DataType.Value(arg.s.decode().upper())


@facet("gradient", "Cast")
def _cast_gradient_maker(g: GradientContext) -> GradientOps:
    """`Cast(GO) -> GI` with `to` and `from_type` swapped; the forward op must name its `from_type`."""
    g.copy_args = False
    to, from_type = g.arg("to"), g.arg("from_type")
    if from_type is None:
        raise GradientError("Argument 'from_type' of type int or string is required to get the gradient of CastOp")
    args = [argument("to", _cast_data_type(from_type)), argument("from_type", _cast_data_type(to))]
    return [gradient_op("Cast", [g.GO(0)], [g.GI(0)], args)]


def _is_byte(op: Op) -> bool:
    arg = op.args["to"]
    return str(arg.value).lower() == "byte" if arg.kind == "s" else op.int("to") == 3  # TensorProto.BYTE


@facet("emitter", "Cast")
def emit_cast(w: EmitWriter, op: Op, xs: list[str]) -> str:
    """The kernel's expression, written out."""
    to = data_type_arg(op, "to")
    if to == np.bool_:
        return f"jnp.asarray({xs[0]}) != 0"
    return f"jnp.asarray({xs[0]}).astype(jnp.{np.dtype(to).name})"


# --------------------------------------------------------------------------------------------------
# Gather


def _check_indices(op: Op, indices: Any, position: int = 1) -> None:
    """INDICES (input `position`) must be int32 or int64."""
    if indices.dtype not in _INDEX_DTYPES:
        raise ShapeError(f"{op.where}: INDICES '{op.inputs[position]}' must be int32 or int64, got {indices.dtype}")


def _check_range(op: Op, indices: Any, dim: int, wrap: bool) -> None:
    """Caffe2 refuses indices outside [0, dim) ([-dim, dim) when wrapping): known values are refused
    now, traced ones when the compiled net runs (see ops/checks.py)."""
    if not np.size(indices):
        return
    low = -dim if wrap else 0
    message = (
        f"{literal(op.where)}: INDICES '{literal(op.inputs[1])}' has {{bad}}, out of the range [{low}, {dim}) "
        "of DATA's indexed dim"
    )
    if isinstance(indices, jax.core.Tracer):
        bad = (indices < low) | (indices >= dim)
        runtime_check(~jnp.any(bad), message, bad=first_bad(indices, bad))
        return
    values = np.asarray(indices)
    bad = values[(values < low) | (values >= dim)]
    if bad.size:
        raise ShapeError(message.format(bad=int(bad[0])))


runtime_checked("Gather", "BatchGatherGradient")


@register("Gather", inputs=2, roles=Roles(integers=slice(1, None)))
def gather(op: Op) -> Kernel:
    """(DATA, INDICES) -> OUT = DATA.shape[:axis] + INDICES.shape + DATA.shape[axis+1:].

    Negative indices wrap when `wrap_indices` (default: true for axis 0 only). Caffe2 raises on
    indices out of range; values are not known when tracing, so here they are clamped to the range.
    With `match_outer`, INDICES' first `axis` dims are batch dims shared with DATA."""
    axis = op.int("axis", 0)
    wrap = op.bool("wrap_indices", axis == 0)
    match_outer = op.bool("match_outer", False)
    if match_outer and axis == 0:
        raise BadArgumentError(f"{op.where}: match_outer=1 needs argument 'axis' >= 1")

    def take(data, indices, ax):
        _check_range(op, indices, data.shape[ax], wrap)
        if wrap:
            indices = jnp.where(indices < 0, indices + data.shape[ax], indices)
        return jnp.take(data, indices, axis=ax, mode="clip")  # clamp what is still out of range

    def kernel(data, indices):
        _check_indices(op, indices)
        ax = canonical_axis(op, axis, data.ndim)
        if data.shape[ax] == 0:  # Caffe2 keeps DATA's (empty) shape
            return data
        if not match_outer:
            return take(data, indices, ax)
        if ax == 0:
            raise ShapeError(f"{op.where}: match_outer=1 needs an axis >= 1, got {axis} for rank {data.ndim}")
        outer = data.shape[:ax]
        if indices.shape[:ax] != outer:
            raise ShapeError(
                f"{op.where}: with match_outer=1 INDICES {list(indices.shape)} must start with DATA's "
                f"outer dims {list(outer)}"
            )
        batch = size_to_dim(data.shape, ax)
        flat = jnp.reshape(data, (batch, *data.shape[ax:]))
        flat_indices = jnp.reshape(indices, (batch, *indices.shape[ax:]))
        out = jax.vmap(lambda d, i: take(d, i, 0))(flat, flat_indices)
        return jnp.reshape(out, (*outer, *out.shape[1:]))

    return kernel


@facet("gradient", "Gather")
def _gather_gradient_maker(g: GradientContext) -> GradientOps:
    """axis 0: a GradientSlice (indices, GO), or SparseToDense with `dense_gradient`; else
    BatchGatherGradient with the maker's own `axis` ahead of the copied forward args."""
    axis_arg = g.arg("axis")
    axis = axis_arg.i if axis_arg is not None else 0
    if axis == 0:
        if g.flag("dense_gradient", False):
            return [gradient_op("SparseToDense", [g.I(1), g.GO(0), g.I(0)], [g.GI(0)])]
        g.set_dense(0, (g.I(1), g.GO(0)))  # type: ignore[arg-type]  (a sparse gradient: indices, values)
        return []
    inputs = [g.I(0), g.I(1), g.GO(0)]
    return [gradient_op("BatchGatherGradient", inputs, [g.GI(0)], [argument("axis", axis)])]


@facet("shape_rule", "Gather")
def gather_shapes(op: Op, ins: list, outs: list, ctx: Context, solver: Solver) -> Guesses:
    """Gather(DATA, INDICES): int32 indices whose shape is the output's leading dims, else [T, N] ([N])."""
    if len(ins) < 2 or ins[1] is not None or ins[0] is None:
        return {}, {}
    rank = len(ins[0].shape) - 1
    if outs and outs[0] is not None and len(outs[0].shape) > rank:
        return {1: Spec(outs[0].shape[: len(outs[0].shape) - rank], INT32)}, {}
    lead = ctx.leading(2) or ctx.leading(1)
    return ({1: Spec(lead, INT32)} if lead else {}), {}


# --------------------------------------------------------------------------------------------------
# Gather's dense gradients: scatter-adds back into DATA's shape


def _in_range(indices: Any, dim: int) -> Any:
    """Indices as Gather reads them: negative ones wrap once; what is still out of range (Caffe2
    raises, but values are unknown while tracing) is clamped, like Gather's forward."""
    indices = jnp.where(indices < 0, indices + dim, indices)
    return jnp.clip(indices, 0, max(dim - 1, 0))


@register(
    "SparseToDense",
    inputs=(2, 3),
    static_inputs=lambda op: (0,) if len(op.inputs) == 2 else (),
)
def sparse_to_dense(op: Op) -> Kernel:
    """(INDICES [K], VALUES [K, ...][, DATA_TO_INFER_DIM]) -> OUT [first_dim, ...] with
    `OUT[INDICES[k]] += VALUES[k]` (duplicates add up): Gather's gradient with `dense_gradient`.
    first_dim is argument `output_first_dim` (only with 2 inputs), else DATA_TO_INFER_DIM's dim 0,
    else max(INDICES) + 1, which must then be known when tracing (caffe2/operators/sparse_to_dense_op.h)."""
    first_dim_arg = op.int("output_first_dim", 0)
    if first_dim_arg > 0 and len(op.inputs) == 3:
        raise BadArgumentError(
            f"{op.where}: argument 'output_first_dim' cannot be used together with input '{op.inputs[2]}'"
        )

    def first_dim(indices, data):
        if first_dim_arg > 0:
            return first_dim_arg
        if data is not None:
            if data.ndim < 1:
                raise ShapeError(f"{op.where}: DATA_TO_INFER_DIM '{op.inputs[2]}' must have rank >= 1")
            return data.shape[0]
        hint = f"pass DATA_TO_INFER_DIM or argument 'output_first_dim' instead; {TRACED_SHAPE_HINT}"
        values = _concrete_ints(op, indices, op.inputs[0], hint)
        return int(values.max()) + 1 if values.size else 0

    def kernel(indices, values, data=None):
        _check_indices(op, indices, 0)
        if indices.ndim != 1:
            raise ShapeError(f"{op.where}: INDICES '{op.inputs[0]}' must be 1-D, got shape {list(indices.shape)}")
        if values.ndim < 1 or values.shape[0] != indices.shape[0]:
            raise ShapeError(
                f"{op.where}: VALUES '{op.inputs[1]}' {list(values.shape)} must have one row per index "
                f"({indices.shape[0]} in '{op.inputs[0]}')"
            )
        n = first_dim(indices, data)
        out = jnp.zeros((n, *values.shape[1:]), values.dtype)
        if n == 0 or values.size == 0:
            return out
        return out.at[_in_range(indices, n)].add(values)

    return kernel


@facet("gradient", "SparseToDense")
def _sparse_to_dense_gradient_maker(g: GradientContext) -> GradientOps:
    """GetSparseToDenseGradient: VALUES' gradient gathers dOUT's rows at INDICES (none for INDICES and
    DATA_TO_INFER_DIM)."""
    return [gradient_op("Gather", [g.GO(0), g.I(0)], [g.GI(1)])]


@register("BatchGatherGradient", inputs=3)
def batch_gather_gradient(op: Op) -> Kernel:
    """(DATA, INDICES, dOUT) -> dDATA: Gather's gradient for `axis` > 0 (argument `axis`, default 1):
    zeros like DATA with each slice of dOUT added at its index along the axis (duplicates add up);
    with `match_outer` each batch of the outer dims uses its own indices (caffe2/operators/
    batch_gather_ops.h). Caffe2 refuses negative indices here even where the forward Gather wrapped
    them (`wrap_indices`); rnn2jax wraps them as the forward did."""
    axis = op.int("axis", 1)
    match_outer = op.bool("match_outer", False)
    wrap = op.bool("wrap_indices", False)

    def kernel(data, indices, grad):
        _check_indices(op, indices, 1)
        if data.ndim < 2:
            raise ShapeError(f"{op.where}: DATA '{op.inputs[0]}' must have rank >= 2, got {data.ndim}")
        ax = canonical_axis(op, axis, data.ndim)
        index_dims = indices.shape[ax:] if match_outer else indices.shape
        if match_outer and indices.shape[:ax] != data.shape[:ax]:
            raise ShapeError(
                f"{op.where}: with match_outer=1 INDICES {list(indices.shape)} must start with DATA's "
                f"outer dims {list(data.shape[:ax])}"
            )
        expected = (*data.shape[:ax], *index_dims, *data.shape[ax + 1 :])
        if tuple(grad.shape) != expected:
            raise ShapeError(
                f"{op.where}: dOUT '{op.inputs[2]}' has shape {list(grad.shape)}, but gathering INDICES "
                f"{list(indices.shape)} from DATA {list(data.shape)} along axis {ax} gives {list(expected)}"
            )
        _check_range(op, indices, data.shape[ax], wrap)
        out = jnp.zeros(data.shape, data.dtype)
        if data.size == 0 or grad.size == 0:
            return out
        batch, count, dim = size_to_dim(data.shape, ax), math.prod(index_dims), data.shape[ax]
        block = data.shape[ax + 1 :]
        flat_out = out.reshape(batch, dim, *block)
        rows = grad.reshape(batch, count, *block).astype(data.dtype)
        flat = _in_range(indices.reshape(batch if match_outer else 1, count), dim)
        flat = jnp.broadcast_to(flat, (batch, count))
        added = jax.vmap(lambda o, i, r: o.at[i].add(r))(flat_out, flat, rows)
        return added.reshape(data.shape)

    return kernel
