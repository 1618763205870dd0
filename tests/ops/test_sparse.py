"""The sparse family (rnn2jax/ops/sparse.py): its lowering, gradient ops and builder makers.

The lowering against NumPy references: NumPy references for the sparse ops whose maths is more than data movement:
IndexHash's wrapping byte hash and LengthsTopK's per-segment ranking (see also tests/ops/test_sparse.py).

Differential cases against real Caffe2 (forward, gradient ops, makers): Differential tests of the sparse / gather /
packing ops against real Caffe2 (see tests/differential.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import Case, arrays, assert_same_ops, cases, invalid, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import InputTypeError, ShapeError
from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op
from tests.host_differential import check_net, run_rnn2jax_net, strings_of

# ----------------------------------------------------------------------------------------------------
# The lowering against NumPy references (was tests/ops/test_sparse.py)


def index_hash_reference(ids: np.ndarray, seed: int, modulo: int) -> np.ndarray:
    """index_hash_ops.h in Python integers: fold the little-endian signed bytes, wrapping in the type."""
    bits = ids.dtype.itemsize * 8

    def wrap(v: int) -> int:
        v &= (1 << bits) - 1
        return v - (1 << bits) if v >> (bits - 1) else v

    out = []
    for value in ids.reshape(-1).tolist():
        hashed = wrap(wrap(seed * 0xDEADBEEF) if bits == 64 else (seed * 0xDEADBEEF))
        for byte in int(value).to_bytes(bits // 8, "little", signed=True):
            hashed = wrap(hashed * 65537 + (byte - 256 if byte > 127 else byte))
        remainder = abs(hashed) % modulo * (1 if hashed >= 0 else -1)  # C++ truncating remainder
        out.append(remainder if remainder >= 0 else remainder + modulo)
    return np.asarray(out, ids.dtype).reshape(ids.shape)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@given(data=st.data())
def test_index_hash_matches_reference(dtype, data):
    info = np.iinfo(dtype)
    ids = data.draw(hnp.arrays(dtype, st.integers(0, 6), elements=st.integers(info.min, info.max)))
    seed = data.draw(st.integers(-(2**40), 2**40))
    modulo = data.draw(st.integers(1, info.max))
    op = create_operator("IndexHash", ["x"], ["y"], seed=seed, modulo=modulo)
    got = run_rnn2jax([op], {"x": ids}, ["y"], jit=False)["y"]
    np.testing.assert_array_equal(got, index_hash_reference(ids, seed, modulo))


def lengths_top_k_reference(x: np.ndarray, lengths: np.ndarray, k: int):
    values, indices = np.zeros((lengths.size, k), x.dtype), np.full((lengths.size, k), -1, np.int32)
    start = 0
    for i, n in enumerate(lengths):
        segment = x[start : start + n]
        order = sorted(range(n), key=lambda j: (-segment[j], j))[:k]  # larger first, then earlier
        values[i, : len(order)] = segment[order]
        indices[i, : len(order)] = order
        start += n
    return values, indices


@given(data=st.data())
def test_lengths_top_k_matches_reference(data):
    lengths = data.draw(hnp.arrays(np.int32, st.integers(0, 5), elements=st.integers(0, 6)))
    x = data.draw(hnp.arrays(np.float32, int(lengths.sum()), elements=st.integers(-3, 3).map(float)))
    k = data.draw(st.integers(1, 5))
    op = create_operator("LengthsTopK", ["x", "lengths"], ["values", "indices"], k=k)
    got = run_rnn2jax([op], {"x": x, "lengths": lengths}, ["values", "indices"], jit=False)
    want_values, want_indices = lengths_top_k_reference(x, lengths, k)
    np.testing.assert_array_equal(got["values"], want_values)
    np.testing.assert_array_equal(got["indices"], want_indices)


# ----------------------------------------------------------------------------------------------------
# Differential cases against real Caffe2 (forward, gradient ops, makers) (was tests/ops/test_sparse.py)

INDEX = [np.int32, np.int64]


def values(data, shape, dtype=np.float32):
    """Floats in [-1, 1], or integers in [-50, 50]."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return data.draw(arrays(shape, dtype, -50, 50))
    return data.draw(arrays(shape, dtype))


def lengths_of(data, count, high, dtype=np.int32):
    return data.draw(arrays((count,), dtype, 0, high))


def block_shape(data, max_dims=2):
    return data.draw(shapes(0, max_dims, min_side=1, max_side=3))


# --------------------------------------------------------------------------------------------------
# GatherRanges, LengthsGather


def draw_ranges(data, size, batch, count, dtype):
    pairs = []
    for _ in range(batch * count):
        start = data.draw(st.integers(0, size))
        pairs.append((start, data.draw(st.integers(0, size - start))))
    return np.asarray(pairs, dtype).reshape(batch, count, 2)


def draw_gather_ranges(data):
    size = data.draw(st.integers(0, 6))
    dtype = data.draw(st.sampled_from([np.float32, np.int32, np.int64]))
    batch, count = data.draw(st.integers(0, 3)), data.draw(st.integers(1, 3))
    ranges = draw_ranges(data, size, batch, count, data.draw(st.sampled_from(INDEX)))
    if invalid(data) and ranges.size:
        ranges[-1, -1] = (size, 1)  # past the data
    inputs = {"data": values(data, (size,), dtype), "ranges": ranges}
    return make_op("GatherRanges", ["data", "ranges"], ["out", "lengths"]), inputs


# --------------------------------------------------------------------------------------------------
# PackSegments / UnpackSegments


def draw_pack_segments(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 3, data.draw(st.sampled_from(INDEX)))
    dtype = data.draw(st.sampled_from([np.float32, np.float32, np.int32, np.int64]))
    rows = int(lengths.sum()) + (data.draw(st.sampled_from([1, -1])) if invalid(data) and lengths.sum() else 0)
    args = {}
    # With no rows and a max_length > 0 Caffe2 returns uninitialised memory (see test_pack_segments_of_no_rows).
    if data.draw(st.booleans()):
        args["max_length"] = data.draw(st.integers(0, 4)) if rows else 0
    if data.draw(st.booleans()):
        args["pad_minf"] = int(data.draw(st.booleans()))
    outputs = ["packed"]
    if data.draw(st.booleans()):
        args["return_presence_mask"] = 1
        outputs.append("presence")
    inputs = {"lengths": lengths, "data": values(data, (rows, *block_shape(data)), dtype)}
    return make_op("PackSegments", ["lengths", "data"], outputs, **args), inputs


def draw_unpack_segments(data):
    batch, steps = data.draw(st.integers(0, 4)), data.draw(st.integers(0, 4))
    dtype = data.draw(st.sampled_from([np.float32, np.float32, np.int32, np.int64]))
    args = {}
    with_max = data.draw(st.booleans())
    lengths = lengths_of(data, batch, steps + (2 if with_max else 0), data.draw(st.sampled_from(INDEX)))
    if with_max:
        args["max_length"] = steps + (1 if invalid(data) else 0)
        if steps and not np.minimum(lengths, steps).sum() and batch:
            lengths[0] = 1  # the gradient (PackSegments of no rows to max_length > 0) is uninitialised in Caffe2
    inputs = {"lengths": lengths, "data": values(data, (batch, steps, *block_shape(data)), dtype)}
    return make_op("UnpackSegments", ["lengths", "data"], ["out"], **args), inputs


# --------------------------------------------------------------------------------------------------
# BatchGather


def draw_batch_gather(data):
    shape = data.draw(shapes(2, 3, min_side=1, max_side=3))
    args = {}
    index_shape = data.draw(shapes(0, 2, min_side=0, max_side=3))
    if data.draw(st.booleans()):
        args["match_outer"] = 1
        index_shape = (shape[0], *index_shape)
    high = shape[1] - 1 + (1 if invalid(data) else 0)
    indices = data.draw(arrays(index_shape, data.draw(st.sampled_from(INDEX)), 0, high))
    inputs = {"data": values(data, shape), "indices": indices}
    return make_op("BatchGather", ["data", "indices"], ["out"], **args), inputs


# --------------------------------------------------------------------------------------------------
# SparseToDenseMask


def draw_sparse_to_dense_mask(data):
    mask = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True))
    k = data.draw(st.integers(0, 6))
    indices = data.draw(arrays((k,), data.draw(st.sampled_from(INDEX)), -1 if data.draw(st.booleans()) else 0, 9))
    dtype = data.draw(st.sampled_from([np.float32, np.float32, np.int32]))
    block = block_shape(data, 1)
    default_shape = block if not invalid(data) else (*block, 2)
    inputs = {
        "indices": indices,
        "values": values(data, (k, *block), dtype),
        "default": values(data, default_shape, dtype),
    }
    if data.draw(st.booleans()):
        cuts = sorted(data.draw(st.lists(st.integers(0, k), min_size=0, max_size=3)))
        inputs["lengths"] = np.diff([0, *cuts]).astype(np.int32)
    args = {"mask": mask}
    if data.draw(st.booleans()):
        args["max_skipped_indices"] = data.draw(st.integers(1, 3))
    outputs = ["out"]
    if data.draw(st.booleans()):
        args["return_presence_mask"] = 1
        outputs.append("presence")
    return make_op("SparseToDenseMask", list(inputs), outputs, **args), inputs


def draw_lengths_gather(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 3)
    dtype = data.draw(st.sampled_from([np.float32, np.int32, np.int64]))
    high = max(lengths.size - 1, 0) + (1 if invalid(data) else 0)
    k = data.draw(st.integers(0, 4)) if lengths.size or high else 0
    indices = data.draw(arrays((k,), data.draw(st.sampled_from(INDEX)), 0, high))
    inputs = {
        "items": values(data, (int(lengths.sum()), *block_shape(data)), dtype),
        "lengths": lengths,
        "indices": indices,
    }
    return make_op("LengthsGather", ["items", "lengths", "indices"], ["out"]), inputs


def draw_gather_ranges_to_dense(data):
    widths = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    size = data.draw(st.integers(0, 6))
    batch = data.draw(st.integers(0, 3))
    pairs = []
    for _ in range(batch * len(widths)):
        length = data.draw(st.sampled_from([0, 1, 2, 3]))
        length = min(length, size)
        pairs.append((data.draw(st.integers(0, size - length)), length))
    ranges = np.asarray(pairs, data.draw(st.sampled_from(INDEX))).reshape(batch, len(widths), 2)
    args = {"lengths": widths}
    if data.draw(st.booleans()):
        args["max_mismatched_ratio"] = 1.0 if data.draw(st.booleans()) else 0.5
        args["min_observation"] = data.draw(st.integers(1, 4))
    if data.draw(st.booleans()):
        args["max_empty_ratio"] = data.draw(st.sampled_from([0.5, 1.0]))
        args["min_observation"] = data.draw(st.integers(1, 4))
    inputs = {"data": values(data, (size,), data.draw(st.sampled_from([np.float32, np.int32]))), "ranges": ranges}
    if data.draw(st.booleans()):  # distinct keys: Caffe2 std::sorts by them (ties in no defined order)
        inputs["key"] = np.asarray(data.draw(st.permutations(range(size))), np.int64)
    outputs = [f"out{i}" for i in range(len(widths) + (1 if invalid(data) else 0))]
    return make_op("GatherRangesToDense", list(inputs), outputs, **args), inputs


def draw_lengths_tile(data):
    n = data.draw(st.integers(0, 4))
    lengths = lengths_of(data, n + (1 if invalid(data) else 0), 3)
    dtype = data.draw(st.sampled_from([np.float32, np.float32, np.int32]))
    inputs = {"data": values(data, (n, *block_shape(data)), dtype), "lengths": lengths}
    return make_op("LengthsTile", ["data", "lengths"], ["out"]), inputs


def draw_lengths_pad(data):
    target = data.draw(st.integers(1, 4))
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), target + (1 if invalid(data) else 0))
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.int32, np.int64]))
    args = {"target_length": target}
    if data.draw(st.booleans()):
        args["padding_value"] = data.draw(st.sampled_from([0.0, 2.0, -7.0]))
    inputs = {"data": values(data, (int(lengths.sum()), *block_shape(data)), dtype), "lengths": lengths}
    return make_op("LengthsPad", ["data", "lengths"], ["out"], **args), inputs


def draw_lengths_range_fill(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 5)), 4)
    return make_op("LengthsRangeFill", ["lengths"], ["out"]), {"lengths": lengths}


def draw_lengths_top_k(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 4)
    x = data.draw(arrays((int(lengths.sum()),), np.float32, -3, 3))
    x = np.round(x) if data.draw(st.booleans()) else x  # ties: the earlier position first
    if invalid(data):
        lengths = lengths.astype(np.int64)  # Caffe2 reads int32 lengths only (it does not check their total)
    k = data.draw(st.integers(1, 4))
    return make_op("LengthsTopK", ["x", "lengths"], ["values", "indices"], k=k), {"x": x, "lengths": lengths}


def draw_batch_sparse_to_dense(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 3)), 3, data.draw(st.sampled_from(INDEX)))
    width = data.draw(st.integers(1, 4))
    k = int(lengths.sum())
    indices = data.draw(arrays((k,), data.draw(st.sampled_from(INDEX)), 0, width - 1 + (1 if invalid(data) else 0)))
    inputs = {"lengths": lengths, "indices": indices, "values": values(data, (k,))}
    args = {}
    if data.draw(st.booleans()):
        inputs["shaper"] = np.zeros((lengths.size, width), np.float32)
        if data.draw(st.booleans()):
            args["dense_last_dim"] = width
    else:
        args["dense_last_dim"] = width
    if data.draw(st.booleans()):
        args["default_value"] = data.draw(st.sampled_from([0.0, 1.5, -2.0]))
    return make_op("BatchSparseToDense", list(inputs), ["dense"], **args), inputs


def draw_batch_dense_to_sparse(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 3)), 3, data.draw(st.sampled_from(INDEX)))
    width = data.draw(st.integers(1, 4))
    k = int(lengths.sum()) + (1 if invalid(data) else 0)
    indices = data.draw(arrays((k,), data.draw(st.sampled_from(INDEX)), 0, width - 1))
    inputs = {"lengths": lengths, "indices": indices, "dense": values(data, (lengths.size, width))}
    return make_op("BatchDenseToSparse", list(inputs), ["values"]), inputs


def draw_boolean_mask(data):
    dtype = data.draw(st.sampled_from([np.float32, np.float32, np.int32, np.int64, np.bool_]))
    # Caffe2's BooleanMaskGradient is only right for 1-D data (see test_boolean_mask_gradient_of_matrices)
    shape = (data.draw(st.integers(0, 5)),) if dtype == np.float32 else data.draw(shapes(1, 3, min_side=0, max_side=4))
    n = shape[0] + (1 if invalid(data) else 0)
    inputs = {"data": data.draw(arrays(shape, dtype, -50, 50)), "mask": data.draw(arrays((n,), np.bool_))}
    outputs = ["out", "where"][: data.draw(st.integers(1, 2))]
    return make_op("BooleanMask", ["data", "mask"], outputs), inputs


def draw_boolean_mask_lengths(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 3, data.draw(st.sampled_from(INDEX)))
    n = int(lengths.sum()) + (1 if invalid(data) else 0)
    inputs = {"lengths": lengths, "mask": data.draw(arrays((n,), np.bool_))}
    return make_op("BooleanMaskLengths", ["lengths", "mask"], ["out"]), inputs


def draw_unique(data):
    dtype = data.draw(st.sampled_from(INDEX + ([np.float32] if invalid(data) else [])))
    x = data.draw(arrays(data.draw(shapes(1, 1, min_side=0, max_side=6)), dtype, -3, 3))
    outputs = ["out", "remap"][: data.draw(st.integers(1, 2))]
    return make_op("Unique", ["x"], outputs), {"x": x}


def draw_remove_data_blocks(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    dtype = data.draw(st.sampled_from([np.float32, np.int32]))
    k = data.draw(st.integers(0, 4))
    high = shape[0] - 1 + (1 if invalid(data) else 0)
    # no indices: Caffe2 copies DATA before it reads INDICES' type (float64 in a serialized golden)
    index = data.draw(st.sampled_from(INDEX + ([np.float64] if k == 0 else [])))
    indices = data.draw(arrays((k,), index, 0, high))
    return make_op("RemoveDataBlocks", ["data", "indices"], ["out"]), {
        "data": values(data, shape, dtype),
        "indices": indices,
    }


def draw_find_duplicate_elements(data):
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.int32, np.int64]))
    x = data.draw(arrays(data.draw(shapes(1, 2 if invalid(data) else 1, min_side=0, max_side=6)), dtype, -2, 2))
    if dtype in (np.float32, np.float64):
        x = np.round(x)
    return make_op("FindDuplicateElements", ["x"], ["out"]), {"x": x}


def draw_index_hash(data):
    dtype = data.draw(st.sampled_from(INDEX))
    info = np.iinfo(dtype)
    x = data.draw(hnp_arrays(dtype, data.draw(shapes(0, 2, min_side=0, max_side=5)), info.min, info.max))
    args = {"modulo": data.draw(st.sampled_from([1, 7, 1000, 2**31 - 1] + ([0] if invalid(data) else [])))}
    if data.draw(st.booleans()):
        args["seed"] = data.draw(st.sampled_from([0, 1, 3, -5, 123456789]))
    return make_op("IndexHash", ["x"], ["out"], **args), {"x": x}


def hnp_arrays(dtype, shape, low, high):
    from hypothesis.extra import numpy as hnp

    return hnp.arrays(dtype, shape, elements=st.integers(low, high))


def draw_scatter_assign(data):
    dtype = data.draw(st.sampled_from([np.float32, np.float32, np.float64, np.int32, np.int64]))
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    k = data.draw(st.integers(0, 4))
    # Caffe2 does not check the indices (it writes out of bounds): drawn in range
    indices = data.draw(arrays((k,), data.draw(st.sampled_from(INDEX)), 0, shape[0] - 1))
    slice_type = np.float16 if invalid(data) and dtype != np.float16 else dtype
    inputs = {
        "data": values(data, shape, dtype),
        "indices": indices,
        "slices": values(data, (k, *shape[1:]), slice_type),
    }
    return make_op("ScatterAssign", ["data", "indices", "slices"], ["data"]), inputs


def draw_scatter_weighted_sum(data):
    dtype = data.draw(st.sampled_from([np.float32, np.float32, np.float64]))
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    k = data.draw(st.integers(0, 4))
    indices = data.draw(arrays((k,), data.draw(st.sampled_from(INDEX)), 0, shape[0] - 1))  # unchecked by Caffe2
    weight = lambda: np.asarray([data.draw(st.sampled_from([1.0, 0.5, -2.0, 3.0]))], np.float32)  # noqa: E731
    inputs = {"x0": values(data, shape, dtype), "w0": weight(), "indices": indices}
    bad = invalid(data)
    for i in range(1, data.draw(st.integers(2, 3))):
        inputs[f"x{i}"] = values(data, (k + bad, *shape[1:]), dtype)
        inputs[f"w{i}"] = weight()
    return make_op("ScatterWeightedSum", list(inputs), ["x0"]), inputs


def draw_segment_one_hot(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 3)
    size = data.draw(st.integers(1, 5))
    k = int(lengths.sum())
    indices = data.draw(arrays((k,), np.int32 if invalid(data) else np.int64, 0, size - 1))  # range unchecked
    inputs = {"lengths": lengths, "indices": indices, "size": np.asarray(size, np.int64)}
    return make_op("SegmentOneHot", ["lengths", "indices", "size"], ["out"]), inputs


def draw_bucketize(data):
    boundaries = sorted(data.draw(st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0]), max_size=4)))
    if invalid(data) and len(set(boundaries)) > 1:
        boundaries = boundaries[::-1]
    x = values(data, data.draw(shapes(1, 3, min_side=0, max_side=4)))
    x = np.round(x * 4) / 4 if data.draw(st.booleans()) else x  # values on the boundaries
    return make_op("Bucketize", ["x"], ["y"], boundaries=boundaries), {"x": x}


def draw_lengths_split(data):
    lengths = data.draw(arrays((data.draw(st.integers(0, 4)),), np.int32, 0, 9))
    n_split = data.draw(st.integers(0 if invalid(data) else 1, 4))
    if data.draw(st.booleans()):
        inputs = {"lengths": lengths, "n_split": np.asarray([n_split], np.int32)}
        return make_op("LengthsSplit", ["lengths", "n_split"], ["y"]), inputs
    return make_op("LengthsSplit", ["lengths"], ["y"], n_split=n_split), {"lengths": lengths}


def draw_split_by_lengths(data):
    k = data.draw(st.integers(1, 3))
    lengths = lengths_of(data, k * data.draw(st.integers(1, 2)), 2)
    shape = list(data.draw(shapes(1, 3, min_side=1, max_side=3)))
    axis = data.draw(st.integers(0, len(shape) - 1))
    args = {"axis": axis if data.draw(st.booleans()) else axis - len(shape)}
    if axis == 1 and data.draw(st.booleans()):
        args = {}  # NCHW: the channel axis 1
    total = int(lengths.sum())
    if data.draw(st.booleans()) and total:
        args["use_scaling_lengths"] = 1
        total *= data.draw(st.integers(1, 2))
    shape[axis] = total + (1 if invalid(data) else 0)
    inputs = {"x": values(data, tuple(shape)), "lengths": lengths}
    return make_op("SplitByLengths", ["x", "lengths"], [f"y{i}" for i in range(k)], **args), inputs


def draw_merge_id_lists(data):
    batch = data.draw(st.integers(0, 3))
    dtype = data.draw(st.sampled_from(INDEX))
    inputs = {}
    for i in range(data.draw(st.integers(1, 3))):
        lengths = lengths_of(data, batch + (1 if i and invalid(data) else 0), 3)
        inputs[f"lengths{i}"] = lengths
        inputs[f"values{i}"] = data.draw(arrays((int(lengths.sum()),), dtype, -3, 5))
    return make_op("MergeIdLists", list(inputs), ["lengths", "values"]), inputs


def draw_partition(data):
    parts = data.draw(st.integers(1, 3))
    keys = data.draw(arrays(data.draw(shapes(1, 2, min_side=0, max_side=4)), data.draw(st.sampled_from(INDEX)), -9, 9))
    inputs = {"keys": keys}
    for i in range(data.draw(st.integers(0, 2))):
        inputs[f"x{i}"] = values(
            data, (*keys.shape, *block_shape(data, 1)), data.draw(st.sampled_from([np.float32, np.int32]))
        )
    outputs = [f"{name}_{j}" for j in range(parts) for name in inputs]
    if invalid(data):
        outputs.append("extra")
    args = {"pack_first_input": 1} if data.draw(st.booleans()) else {}
    return make_op("Partition", list(inputs), outputs, **args), inputs


def draw_gather_by_key(data):
    parts = data.draw(st.integers(1, 3))
    keys = data.draw(arrays((data.draw(st.integers(0, 6)),), data.draw(st.sampled_from(INDEX)), -9, 9))
    counts = [int(np.sum(np.mod(keys, parts) == j)) for j in range(parts)]
    if invalid(data) and keys.size:
        counts[0] += 1
    block = block_shape(data, 1)
    dtype = data.draw(st.sampled_from([np.float32, np.float32, np.int32]))
    inputs = {"keys": keys, **{f"shard{j}": values(data, (c, *block), dtype) for j, c in enumerate(counts)}}
    return make_op("GatherByKey", list(inputs), ["y"]), inputs


def draw_batch_bucket_one_hot(data):
    n, d = data.draw(st.integers(0, 3)), data.draw(st.integers(1, 3))
    lens = data.draw(arrays((d,), np.int32, 0 if invalid(data) else 1, 3))
    grid = [-1.0, -0.5, 0.0, 0.5, 1.0]
    edges = [sorted(data.draw(st.lists(st.sampled_from(grid), min_size=n, max_size=n))) for n in lens.tolist()]
    boundaries = np.concatenate([np.asarray(e, np.float32) for e in edges])
    x = data.draw(arrays((n, d), np.float32))
    x = np.round(x * 2) / 2 if data.draw(st.booleans()) else x  # on the boundaries
    inputs = {"x": x, "lens": lens, "boundaries": boundaries.astype(np.float32)}
    return make_op("BatchBucketOneHot", ["x", "lens", "boundaries"], ["y"]), inputs


def draw_boolean_unmask(data):
    size = data.draw(st.integers(1, 5))
    count = data.draw(st.integers(1, 3))
    dtype = data.draw(st.sampled_from([np.float32, np.int32, np.int64]))
    masks = [data.draw(arrays((size,), np.bool_)) for _ in range(count)]
    if not invalid(data):
        masks[-1] = masks[-1] | ~np.any(masks, axis=0)  # every position covered
    inputs = {}
    taken = np.zeros(size, bool)
    for i, mask in enumerate(masks):
        first = mask & ~taken
        taken |= mask
        inputs[f"mask{i}"] = mask
        inputs[f"values{i}"] = values(data, (int(first.sum()),), dtype)
    return make_op("BooleanUnmask", list(inputs), ["y"]), inputs


def draw_lengths_partition(data):
    parts = data.draw(st.integers(1, 3))
    lengths = lengths_of(data, data.draw(st.integers(0, 3)), 3)
    n = int(lengths.sum()) + (1 if parts > 1 and invalid(data) else 0)
    keys = data.draw(arrays((n,), data.draw(st.sampled_from(INDEX)), -9, 9))
    inputs = {"lengths": lengths, "keys": keys}
    for i in range(data.draw(st.integers(0, 2))):
        inputs[f"x{i}"] = values(data, (n, *block_shape(data, 1)), data.draw(st.sampled_from([np.float32, np.int32])))
    outputs = [f"{name}_{j}" for j in range(parts) for name in inputs]
    args = {"pack_first_input": 1} if data.draw(st.booleans()) else {}
    return make_op("LengthsPartition", list(inputs), outputs, **args), inputs


def draw_scatter(data):
    shape = data.draw(shapes(1, 3, min_side=1, max_side=4))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    # Caffe2 segfaults on empty INDICES (it reads INDICES.shape[axis] entries of a null buffer): sides >= 1
    index_shape = tuple(data.draw(st.integers(1, d)) for d in shape)
    dim = shape[axis]
    # Caffe2 checks only the first INDICES.shape[axis] indices (others write out of bounds): drawn in range
    indices = data.draw(arrays(index_shape, data.draw(st.sampled_from(INDEX)), 0, dim - 1))
    if invalid(data):
        axis = len(shape)
    dtype = data.draw(st.sampled_from([np.float32, np.int32]))
    inputs = {"data": values(data, shape, dtype), "indices": indices, "updates": values(data, index_shape, dtype)}
    args = {} if axis == 1 and data.draw(st.booleans()) else {"axis": axis}
    return make_op("Scatter", ["data", "indices", "updates"], ["out"], **args), inputs


def draw_batch_bucketize(data):
    n, d = data.draw(st.integers(0, 3)), data.draw(st.integers(1, 4))
    m = data.draw(st.integers(0, d))
    indices = np.asarray(data.draw(st.permutations(range(d)))[:m], np.int32)
    lengths = lengths_of(data, m, 3)
    boundaries = data.draw(arrays((int(lengths.sum()) + (1 if invalid(data) else 0),), np.float32))
    boundaries = np.round(boundaries * 2) / 2  # ties with the features
    feature = np.round(data.draw(arrays((n, d), np.float32)) * 4) / 4
    inputs = {"feature": feature, "indices": indices, "boundaries": boundaries, "lengths": lengths}
    return make_op("BatchBucketize", list(inputs), ["y"]), inputs


def draw_pad_empty_samples(data):
    lengths = lengths_of(data, data.draw(st.integers(0, 4)), 2)
    inputs = {"lengths": lengths}
    for k in range(data.draw(st.integers(0, 2))):
        rows = int(lengths.sum()) + (1 if invalid(data) else 0)
        dtype = data.draw(st.sampled_from([np.float32, np.int32, np.int64]))
        inputs[f"f{k}"] = values(data, (rows, *block_shape(data, 1)), dtype)
    outputs = ["lengths_out"] + [f"out{k}" for k in range(len(inputs) - 1)]
    return make_op("PadEmptySamples", list(inputs), outputs), inputs


CASES = cases(
    Case("GatherRanges", draw_gather_ranges),
    Case("PackSegments", draw_pack_segments, gradient_ops=("UnpackSegments",)),
    Case("UnpackSegments", draw_unpack_segments, gradient_ops=("PackSegments",)),
    Case("BatchGather", draw_batch_gather, gradient_ops=("BatchGatherGradient",)),
    Case("SparseToDenseMask", draw_sparse_to_dense_mask, gradient_ops=("SparseToDenseMaskGradient",)),
    Case("LengthsGather", draw_lengths_gather),
    Case("GatherRangesToDense", draw_gather_ranges_to_dense),
    Case("LengthsTile", draw_lengths_tile, gradient_ops=("LengthsSum",)),
    Case("LengthsPad", draw_lengths_pad),
    Case("LengthsRangeFill", draw_lengths_range_fill),
    Case("LengthsTopK", draw_lengths_top_k, gradient_ops=("LengthsTopKGradient",)),
    Case("BatchSparseToDense", draw_batch_sparse_to_dense, gradient_ops=("BatchDenseToSparse",)),
    Case("BatchDenseToSparse", draw_batch_dense_to_sparse, gradient_ops=("BatchSparseToDense",)),
    Case("BooleanMask", draw_boolean_mask, gradient_ops=("BooleanMaskGradient",)),
    Case("BooleanMaskLengths", draw_boolean_mask_lengths),
    Case("Unique", draw_unique),
    Case("RemoveDataBlocks", draw_remove_data_blocks),
    Case("FindDuplicateElements", draw_find_duplicate_elements),
    Case("IndexHash", draw_index_hash),
    Case("ScatterAssign", draw_scatter_assign),
    Case("ScatterWeightedSum", draw_scatter_weighted_sum),
    Case("Scatter", draw_scatter),
    Case("SegmentOneHot", draw_segment_one_hot),
    Case("Bucketize", draw_bucketize),
    Case("LengthsSplit", draw_lengths_split),
    Case("SplitByLengths", draw_split_by_lengths, gradient_ops=("Concat",)),
    Case("MergeIdLists", draw_merge_id_lists),
    Case("Partition", draw_partition),
    Case("LengthsPartition", draw_lengths_partition),
    Case("GatherByKey", draw_gather_by_key, gradient_ops=("Partition",)),
    Case("BatchBucketOneHot", draw_batch_bucket_one_hot),
    Case("BooleanUnmask", draw_boolean_unmask),
    Case("BatchBucketize", draw_batch_bucketize),
    Case("PadEmptySamples", draw_pad_empty_samples),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


# --------------------------------------------------------------------------------------------------
# Gradient makers that emit no ops (not run by run_case) or refuse, and Caffe2's broken cases


@pytest.mark.parametrize(
    "op",
    [
        make_op("GatherRangesToDense", ["d", "r"], ["y"], lengths=[2]),
        make_op("LengthsPad", ["d", "l"], ["y"], target_length=2),
        make_op("LengthsRangeFill", ["l"], ["y"]),
        make_op("BooleanMaskLengths", ["l", "m"], ["y"]),
        make_op("BooleanUnmask", ["m", "v"], ["y"]),
        make_op("MergeIdLists", ["l", "v"], ["ol", "ov"]),
        make_op("Partition", ["k", "x"], ["k0", "x0"]),
        make_op("LengthsPartition", ["l", "k"], ["l0", "k0", "l1", "k1"]),
        make_op("LengthsSplit", ["l"], ["y"], n_split=2),
        make_op("Bucketize", ["x"], ["y"], boundaries=[0.0]),
        make_op("BatchBucketize", ["f", "i", "b", "l"], ["y"]),
        make_op("PadEmptySamples", ["l", "f"], ["y", "g"]),
        make_op("BatchBucketOneHot", ["x", "l", "b"], ["y"]),
        make_op("GatherRanges", ["d", "r"], ["y", "l"]),
        make_op("SegmentOneHot", ["l", "i", "s"], ["y"]),
        make_op("LengthsGather", ["x", "l", "i"], ["y"]),
        make_op("ScatterAssign", ["d", "i", "s"], ["d"]),
        make_op("ScatterWeightedSum", ["d", "w", "i", "x", "v"], ["d"]),
        make_op("Scatter", ["d", "i", "u"], ["y"]),
        make_op("Unique", ["x"], ["y"]),
        make_op("RemoveDataBlocks", ["x", "i"], ["y"]),
        make_op("FindDuplicateElements", ["x"], ["y"]),
        make_op("IndexHash", ["x"], ["y"], modulo=3),
        make_op("SparseToDenseMask", ["i", "v", "d", "l"], ["y"], mask=[1, 2]),
        make_op("PackSegments", ["l", "d"], ["y"], max_length=3, pad_minf=1),
    ],
    ids=lambda op: op.type,
)
def test_gradient_makers_without_forward_run(caffe2, op):
    g_output = ["y_grad"]
    try:
        c2_ops, c2_g = caffe2.gradient_for_op(op, g_output)
    except Caffe2Error:
        with pytest.raises(GradientError):
            get_gradient_for_op(op, g_output)
        return
    ours, our_g = get_gradient_for_op(op, g_output)
    assert_same_ops(ours, c2_ops)
    assert list(c2_g) == list(our_g)


@pytest.mark.parametrize("words", [[b"a", b"b", b"a", b"", b"b", b""], [b"x"], []], ids=["duplicates", "one", "empty"])
def test_find_duplicate_elements_of_strings(caffe2, words):
    """Caffe2's FindDuplicateElements takes strings too (serialized golden test_find_duplicate_elements
    feeds an empty one); compiled nets take numbers only, so eagerly."""
    op = make_op("FindDuplicateElements", ["x"], ["y"])
    x = np.array(words, dtype=object)
    want = caffe2.run_op(op, {"x": x})["y"]
    got = run_rnn2jax([op], {"x": x}, ["y"], jit=False)["y"]
    assert got.dtype == want.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_boolean_mask_gradient_of_matrices(caffe2):
    """Caffe2 is broken here: BooleanMaskGradient returns a 1-D [N] tensor made of dY's first elements
    whatever dY's rank (boolean_mask_ops.cc, "TODO: we should support any type"), so the gradient of a
    BooleanMask of a matrix is wrong. rnn2jax gives dY's rows back where the mask holds."""
    mask, grad = np.array([True, False, True]), np.arange(4, dtype=np.float32).reshape(2, 2)
    op = make_op("BooleanMaskGradient", ["mask", "grad"], ["dx"])
    want = caffe2.run_op(op, {"mask": mask, "grad": grad})["dx"]
    np.testing.assert_array_equal(want, [0.0, 0.0, 1.0])
    got = run_rnn2jax([op], {"mask": mask, "grad": grad}, ["dx"], jit=False)["dx"]
    np.testing.assert_array_equal(got, [[0.0, 1.0], [0.0, 0.0], [2.0, 3.0]])


def test_unchecked_reads_are_refused(caffe2):
    """Caffe2 reads past its inputs here (no enforce): UnpackSegments with a length beyond the packed
    rows reads the next row; GatherRanges with a negative start reads before the data. rnn2jax refuses."""
    unpack = make_op("UnpackSegments", ["lengths", "data"], ["out"])
    inputs = {"lengths": np.array([3, 1], np.int32), "data": np.arange(4, dtype=np.float32).reshape(2, 2)}
    np.testing.assert_array_equal(caffe2.run_op(unpack, inputs)["out"], [0.0, 1.0, 2.0, 2.0])
    with pytest.raises(ShapeError, match="longer than the packed rows"):
        run_rnn2jax([unpack], inputs, ["out"], jit=False)
    gather = make_op("GatherRanges", ["data", "ranges"], ["out", "lengths"])
    inputs = {"data": np.arange(3, dtype=np.float32), "ranges": np.array([[[-1, 2]]], np.int32)}
    with pytest.raises(ShapeError, match="outside DATA"):
        run_rnn2jax([gather], inputs, ["out", "lengths"], jit=False)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_sparse_to_dense_mask_lengths_past_the_indices_are_refused(jit):
    """Caffe2 reads past INDICES when LENGTHS sum to more; rnn2jax refuses (when the net runs under jit)."""
    op = make_op("SparseToDenseMask", ["i", "v", "d", "l"], ["y"], mask=[0, 1])
    inputs = {
        "i": np.array([0, 1], np.int32),
        "v": np.ones(2, np.float32),
        "d": np.zeros((), np.float32),
        "l": np.array([2, 1], np.int32),
    }
    with pytest.raises(ShapeError, match="sum to 3"):
        run_rnn2jax([op], inputs, ["y"], jit=jit)


# --------------------------------------------------------------------------------------------------
# The same ops on strings (host ops: Caffe2's CPU kernels are templated on the data type, std::string among them)


@pytest.mark.parametrize(
    "draw, string_inputs",
    [
        (draw_pack_segments, ("data",)),
        (draw_unpack_segments, ("data",)),
        (draw_sparse_to_dense_mask, ("values", "default")),
    ],
    ids=["PackSegments", "UnpackSegments", "SparseToDenseMask"],
)
@given(data=st.data())
def test_of_strings_matches_caffe2(caffe2, draw, string_inputs, data):
    """The numeric cases with their data as strings, run as a net in both (padding is b"", Caffe2's default
    std::string); what Caffe2 refuses, rnn2jax refuses."""
    op, inputs = draw(data)
    feeds = {name: strings_of(value) if name in string_inputs else value for name, value in inputs.items()}
    check_net(caffe2, [op], feeds)


def test_strings_with_numbers_refused(caffe2):
    """SparseToDenseMask's values and default have one type: strings with floats is refused, naming both."""
    op = make_op("SparseToDenseMask", ["i", "v", "d"], ["o"], mask=[1, 2])
    feeds = {"i": np.array([1], np.int32), "v": np.array([b"a"], dtype=object), "d": np.array(1.0, np.float32)}
    check_net(caffe2, [op], feeds, fails=True)
    with pytest.raises(InputTypeError, match="'v', 'd' must all hold strings"):
        raise run_rnn2jax_net([op], feeds)


def test_pack_unpack_strings_round_trip_in_one_net(caffe2):
    """Caffe2's pack_ops_test (test_pack_ops_str): PackSegments then UnpackSegments of strings in one net, the
    packed blob written by the host op and read by the next (the executor's plan follows strings through)."""
    feeds = {
        "l": np.array([1, 2, 3], np.int64),
        "d": strings_of(np.array([["a", "a"], ["b", "b"], ["bb", "bb"], ["c", "c"], ["cc", "cc"], ["ccc", "ccc"]])),
    }
    ops = [make_op("PackSegments", ["l", "d"], ["t"]), make_op("UnpackSegments", ["l", "t"], ["newd"])]
    workspace, _ = check_net(caffe2, ops, feeds)
    np.testing.assert_array_equal(workspace.fetch("newd"), feeds["d"])
