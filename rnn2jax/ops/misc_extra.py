"""Odd ops of Caffe2 that fit no other family: Assert (caffe2/operators/assert_op.h), DataCouple (data_couple.cc),
FeedBlob (feed_blob_op.h), EstimateAllBlobSizes (estimate_all_blob_sizes_op.cc), the stylizer's image
conversions (stylizer_ops.cc) and fbgemm's float16 FC (caffe2/fb/fbgemm: FbGemmPack, FbGemmPackTranspose,
FbFCPacked).

FeedBlob writes a string blob, EstimateAllBlobSizes reads the whole workspace, and the stylizer's preprocess
keeps its noise in the workspace (blob `__CAFFE2_STYLIZER_NOISE__`, drawn once and reused by every later run,
"to maintain temporal consistency"): those three are host ops. The others are lowered.

fbgemm's packed matrix is an opaque C++ object in Caffe2; rnn2jax holds the float16 values it packs
(`rnn2jax.ir.packed.PackedFP16Matrix`). FbFCPacked multiplies float32 inputs by those float16 weights with
float32 accumulation, as fbgemm does (its summation order differs from XLA's: results agree to float32
rounding, not bit for bit).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.int8 import Int8Tensor
from ..ir.netdef import Op
from ..ir.packed import PackedFP16Matrix
from ..proto import caffe2_pb2 as pb
from .checks import enforce, first_bad, literal, runtime_checked
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_GRADIENT, NO_ROLES, NO_SHAPE_RULE, Absent
from .gradient_makers import should_not_do_gradient
from .half import float_to_half
from .registry import HostWorkspace, Kernel, declare_family, host_op, register
from .storage import blob_options

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=NO_SHAPE_RULE,
    gradient=NO_GRADIENT,
    emitter=Absent("codegen does not write these ops"),
)

_INT_OR_BOOL = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_))
_F32 = np.dtype(np.float32)


def _dtype_of(op: Op, position: int, value: Any, allowed: tuple[np.dtype, ...]) -> None:
    if isinstance(value, Int8Tensor | PackedFP16Matrix) or np.dtype(value.dtype) not in allowed:
        got = type(value).__name__ if isinstance(value, Int8Tensor | PackedFP16Matrix) else np.dtype(value.dtype)
        raise InputTypeError(
            f"{op.where}: input '{op.inputs[position]}' is {got}; {op.type} takes "
            f"{' or '.join(str(d) for d in allowed)} (Caffe2: unsupported type of tensor)"
        )


# --------------------------------------------------------------------------------------------------
# Assert and DataCouple


@register("Assert", outputs=0)
def assert_op(op: Op) -> Kernel:
    """Fails when any element of its int32, int64 or bool input is false (zero), naming the first such
    element and adding `error_msg`; no output."""
    message = op.str("error_msg", "")
    suffix = f"\nError message: {literal(message)}" if message else ""
    blob = literal(op.inputs[0])
    where = f"{literal(op.where)}: Assert failed for element {{index}} in tensor '{blob}', value: {{value}}"

    def kernel(x: jax.Array) -> tuple:
        _dtype_of(op, 0, x, _INT_OR_BOOL)
        flat = jnp.ravel(x)
        bad = flat == 0
        index = jnp.argmax(bad) if flat.size else jnp.zeros((), jnp.int32)
        enforce(~jnp.any(bad), where + suffix, index=index, value=first_bad(flat.astype(jnp.int64), bad))
        return ()

    return kernel


runtime_checked("Assert")


@register("DataCouple", inputs=(0, None), outputs=(0, None))
def data_couple(op: Op) -> Kernel:
    """Passes its first inputs through to the outputs of the same names: it only ties blobs into a data
    dependency (Caffe2's schema enforces output i in place on input i; inputs past the outputs are only read).
    Outputs past the inputs, which Caffe2 leaves holding whatever they held, are refused."""
    count = len(op.outputs)
    if count > len(op.inputs) or list(op.inputs[:count]) != list(op.outputs):
        raise BadArgumentError(
            f"{op.where}: DataCouple's outputs must be its first inputs, one to one and in place; got inputs "
            f"{list(op.inputs)}, outputs {list(op.outputs)}"
        )
    return lambda *xs: tuple(xs[:count])


# --------------------------------------------------------------------------------------------------
# The stylizer's image conversions


def _mean(op: Op, mean: Any) -> None:
    _dtype_of(op, 1, mean, (_F32,))
    if math.prod(mean.shape) != 3:
        raise ShapeError(f"{op.where}: mean '{op.inputs[1]}' has {math.prod(mean.shape)} values; needs 3 (B, G, R)")


@register("BRGNCHWCToPackedInt8BGRAStylizerDeprocess", inputs=2)
def stylizer_deprocess(op: Op) -> Kernel:
    """float32 NCHW (3 channels) plus the per-channel mean -> uint8 NHWC BGRA, alpha 255. Values are
    clamped to [0, 255] and truncated, as Caffe2's clamped_cast does."""

    def kernel(x: jax.Array, mean: jax.Array) -> jax.Array:
        _dtype_of(op, 0, x, (_F32,))
        _mean(op, mean)
        if x.ndim != 4 or x.shape[1] != 3:
            raise ShapeError(f"{op.where}: input '{op.inputs[0]}' is {list(x.shape)}; needs N x 3 x H x W")
        v = x + jnp.ravel(mean)[None, :, None, None]
        v = jnp.where(v >= 255, jnp.float32(255), jnp.where(v <= 0, jnp.float32(0), jnp.trunc(v)))
        bgr = jnp.transpose(v.astype(jnp.uint8), (0, 2, 3, 1))
        alpha = jnp.full((*bgr.shape[:3], 1), 255, jnp.uint8)
        return jnp.concatenate([bgr, alpha], axis=3)

    return kernel


NOISE_BLOB = "__CAFFE2_STYLIZER_NOISE__"


def _check_preprocess(op: Op) -> None:
    if len(op.inputs) != 2 or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: {op.type} takes 2 inputs (image, mean) and 1 output")
    if op.int("noise_size", 491) < 1:
        raise BadArgumentError(f"{op.where}: noise_size must be positive, got {op.int('noise_size')}")
    op.float("noise_std", 10.0)


@host_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", check=_check_preprocess, shape_rule=HOST_OP_NO_SHAPE_RULE,
         emitter=HOST_OP_NO_EMITTER)  # fmt: skip
def stylizer_preprocess(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """uint8 NHWC BGRA -> float32 NCHW BGR, less the per-channel mean, plus noise: `noise_size` (491) values
    drawn once from N(0, noise_std) (10) into the workspace blob `__CAFFE2_STYLIZER_NOISE__` and reused by
    every later run, cycling over each image's (pixel, channel) values. The draw is NumPy's (seeded by the
    workspace's seed), not Caffe2's generator, so only noise_std=0 gives Caffe2's values exactly."""
    size = op.int("noise_size", 491)
    noise = workspace.get(NOISE_BLOB) if workspace.has_blob(NOISE_BLOB) else None
    if not isinstance(noise, jax.Array | np.ndarray) or noise.dtype == object:
        seed = [getattr(workspace, "seed", None) or 0, *op.outputs[0].encode()]  # as sampling.py's host ops
        rng = state.setdefault("rng", np.random.default_rng(seed))
        noise = (rng.standard_normal(size) * op.float("noise_std", 10.0)).astype(np.float32)
        workspace.feed(NOISE_BLOB, noise)
    noise = np.asarray(noise, np.float32).ravel()
    if noise.size < size:
        raise ShapeError(f"{op.where}: blob '{NOISE_BLOB}' holds {noise.size} values, fewer than noise_size {size}")
    x, mean = (workspace.get(name, op) for name in op.inputs)
    _dtype_of(op, 0, x, (np.dtype(np.uint8),))
    _mean(op, mean)
    x, mean = np.asarray(x), np.asarray(mean).ravel()
    if x.ndim != 4 or x.shape[3] != 4:
        raise ShapeError(f"{op.where}: input '{op.inputs[0]}' is {list(x.shape)}; needs N x H x W x 4 (BGRA)")
    _, h, w, _ = x.shape
    cycle = noise[np.arange(h * w * 3) % size].reshape(h, w, 3)
    y = (x[..., :3].astype(np.float32) - mean) + cycle
    workspace.feed(op.outputs[0], np.ascontiguousarray(np.transpose(y, (0, 3, 1, 2)), np.float32))


# --------------------------------------------------------------------------------------------------
# FeedBlob and EstimateAllBlobSizes


def _raw_string(op: Op, name: str) -> bytes | None:
    arg = op.args.get(name)
    if arg is None or arg.kind != "s":
        return None
    value = arg.value
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)


def _check_feed_blob(op: Op) -> None:
    if op.inputs or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: FeedBlob takes no inputs and 1 output")
    if _raw_string(op, "value") is None:
        raise BadArgumentError(f"{op.where}: value argument must exist and be passed as a string")


@host_op("FeedBlob", check=_check_feed_blob, gradient=should_not_do_gradient, shape_rule=HOST_OP_NO_SHAPE_RULE,
         emitter=HOST_OP_NO_EMITTER)  # fmt: skip
def feed_blob(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Write the `value` argument into the output as a string blob (Caffe2's std::string)."""
    workspace.put(op.outputs[0], _raw_string(op, "value"))


_DEFAULT_CHUNK = 1_000_000  # Caffe2's --caffe2_tensor_chunk_size
_PER_ELEMENT = {  # EstimatePerElementSize: protobuf's varints make small integer types cost more
    "float32": 4, "int32": 4, "int64": 8, "bool": 1, "uint8": 2, "int8": 2,
    "uint16": 3, "int16": 3, "float16": 3, "float64": 8, "object": 50,
}  # fmt: skip


def tensor_size_estimate(name: str, dtype: np.dtype, numel: int, options: pb.BlobSerializationOptions) -> int:
    """Caffe2's TensorSerializer::EstimateSerializedBlobSize: per chunk, the name and 50 bytes of protobuf;
    per element, a guess by type (strings 50 bytes, whatever their length)."""
    chunk = options.chunk_size
    chunk = numel + 1 if chunk == -1 else (_DEFAULT_CHUNK if chunk == 0 else chunk)
    per_element = _PER_ELEMENT.get(np.dtype(dtype).name, np.dtype(dtype).itemsize)
    if np.dtype(dtype) == _F32 and options.float_format == pb.BlobSerializationOptions.FLOAT_BFLOAT16:
        per_element = 2
    chunks = -(-numel // chunk)
    return chunks * (len(name.encode()) + 50) + numel * per_element


def blob_size_estimate(name: str, value: Any, options: pb.BlobSerializationOptions) -> int:
    """Caffe2's EstimateSerializedBlobSize of one blob: tensors and strings; 0 for anything else (Caffe2's
    serializers of other types do not estimate)."""
    if isinstance(value, bytes | str):
        data = value.encode("utf-8") if isinstance(value, str) else value
        return len(name.encode()) + len(data) + 20
    if isinstance(value, jax.Array | np.ndarray):
        return tensor_size_estimate(name, value.dtype, int(np.prod(value.shape)), options)
    return 0


def _options(op: Op) -> pb.SerializationOptions:
    options = pb.SerializationOptions()
    raw = _raw_string(op, "options")
    if raw:
        try:
            options.ParseFromString(raw)
        except Exception as error:  # protobuf's DecodeError
            raise BadArgumentError(f"{op.where}: argument 'options' is not a SerializationOptions: {error}") from None
    return options


def _check_estimate(op: Op) -> None:
    if op.inputs or len(op.outputs) != 2:
        raise BadArgumentError(f"{op.where}: EstimateAllBlobSizes takes no inputs and 2 outputs (names, sizes)")
    _options(op)
    op.bool("include_shared", True)


@host_op("EstimateAllBlobSizes", check=_check_estimate, shape_rule=HOST_OP_NO_SHAPE_RULE, emitter=HOST_OP_NO_EMITTER)
def estimate_all_blob_sizes(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The name of every blob (with include_shared, the parent workspace's too) and an estimate of its
    serialized size in bytes (int64), Caffe2's own estimate: tensors by element type and chunking (the
    SerializationOptions `options` may set chunk sizes and bfloat16 floats per blob name), strings by length,
    other blobs 0. The two outputs count as already written: each is estimated at its new size."""
    options = _options(op)
    names_out, sizes_out = op.outputs
    names = sorted({*workspace.all_blobs(op.bool("include_shared", True)), names_out, sizes_out})
    names_out_count = len(names)
    sizes = []
    for name in names:
        entry = blob_options(name, options)
        if name == names_out:
            sizes.append(tensor_size_estimate(name, np.dtype(object), names_out_count, entry))
        elif name == sizes_out:
            sizes.append(tensor_size_estimate(name, np.dtype(np.int64), names_out_count, entry))
        else:
            value = workspace.get(name) if workspace.has_blob(name) else None
            sizes.append(blob_size_estimate(name, value, entry))
    strings = np.empty(len(names), dtype=object)
    strings[:] = [name.encode("utf-8", "surrogateescape") for name in names]
    workspace.put(names_out, strings)
    workspace.put(sizes_out, jnp.asarray(np.asarray(sizes, np.int64)))


# --------------------------------------------------------------------------------------------------
# fbgemm's float16 FC


def _size_split(op: Op, shape: tuple[int, ...], axis: int, what: str) -> tuple[int, int]:
    if not -len(shape) <= axis < len(shape):
        raise BadArgumentError(f"{op.where}: {what} {axis} is out of range for input of rank {len(shape)}")
    axis %= len(shape)
    return math.prod(shape[:axis]), math.prod(shape[axis:])


def _pack(op: Op, transposed: bool) -> Kernel:
    axis = op.int("axis_w", 1)
    op.int("no_packing", 0)

    def kernel(w: jax.Array) -> PackedFP16Matrix:
        _dtype_of(op, 0, w, (_F32,))
        rows, cols = _size_split(op, tuple(w.shape), axis, "axis_w")
        matrix = w.reshape(rows, cols)
        return PackedFP16Matrix(float_to_half(matrix if transposed else matrix.T, clip=True))

    return kernel


@register("FbGemmPack")
def fbgemm_pack(op: Op) -> Kernel:
    """FC weights W (N x K: dims before `axis_w` (1) x dims from it, float32) -> fbgemm's packed float16
    B = W^T (K x N), rounded to nearest even and saturated at float16's largest magnitude."""
    return _pack(op, transposed=False)


@register("FbGemmPackTranspose")
def fbgemm_pack_transpose(op: Op) -> Kernel:
    """Weights already transposed (K x N, split at `axis_w`) -> fbgemm's packed float16 B as they are."""
    return _pack(op, transposed=True)


@register("FbFCPacked", inputs=3)
def fb_fc_packed(op: Op) -> Kernel:
    """Y = X W + b with X float32 (M x K: dims before `axis` (1) x dims from it), W a packed float16 matrix
    (K x N) and b float32 (N): float32 products and sums; Y is X's dims before `axis` then N."""
    axis = op.int("axis", 1)
    op.int("axis_w", 1)

    def kernel(x: jax.Array, packed: Any, bias: jax.Array) -> jax.Array:
        _dtype_of(op, 0, x, (_F32,))
        _dtype_of(op, 2, bias, (_F32,))
        if not isinstance(packed, PackedFP16Matrix):
            raise InputTypeError(
                f"{op.where}: input '{op.inputs[1]}' is not a packed float16 matrix (make one with FbGemmPack); "
                f"got {type(packed).__name__}"
            )
        if bias.ndim != 1:
            raise ShapeError(f"{op.where}: bias '{op.inputs[2]}' must be 1-D, got {list(bias.shape)}")
        m, k = _size_split(op, tuple(x.shape), axis, "axis")
        n = int(bias.shape[0])
        if k != packed.num_rows() or n != packed.num_cols():
            raise ShapeError(
                f"{op.where}: Dimension mismatch: X: {list(x.shape)}, W: {packed.num_rows()} {packed.num_cols()}, "
                f"b: {list(bias.shape)}, axis: {axis}, M: {m}, N: {n}, K: {packed.num_rows()}"
            )
        canonical = axis % x.ndim
        y = jnp.matmul(x.reshape(m, k), packed.b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
        return (y + bias).reshape(*x.shape[:canonical], n)

    return kernel
