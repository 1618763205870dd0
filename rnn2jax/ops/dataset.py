"""Caffe2's dataset ops (`caffe2/operators/dataset_ops.cc`) and its text file reader
(`caffe2/operators/text_file_reader.cc`): the ops behind `caffe2.python.dataset` and `text_file_reader`.

A dataset is a list of field tensors under a schema named by `fields` ("a", "b:lengths", "b:values", ...):
every field "{prefix}:lengths" opens a domain "{prefix}", and the fields under that prefix hold, for each
entry of the parent domain, as many rows as its length says. A cursor (`TreeCursor`) holds one offset per
domain; the ops that read through it advance it.

Cursors, text file readers and packed records are host objects that Caffe2 keeps in blobs, and datasets
hold string fields, which JAX has no arrays for: so every op here is a host op (run in Python between the
jitted segments around it, with the workspace). Append and AtomicAppend also have a pure lowering (the
output's shape follows from the inputs' shapes), used where a net is compiled whole.

A cursor saves and loads as Caffe2's TreeCursorSerializer writes it (a blob of type
"std::unique_ptr<TreeCursor>"), so a checkpoint taken by either resumes reading in the other.
SortAndShuffle's shuffles are Caffe2's own: std::sort and std::shuffle with a freshly seeded
std::default_random_engine, as libstdc++ implements them.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, InputTypeError, Rnn2JaxError, ShapeError, StorageError
from ..ir.netdef import Op
from ..proto import caffe2_pb2 as pb
from ..proto.tensor import DATA_TYPES
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, NO_SHAPE_RULE, Absent
from .gradient_makers import no_gradient, should_not_do_gradient
from .registry import HostWorkspace, Kernel, declare_family, register, register_host_op

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=Absent("Caffe2 registers no gradient maker for it"),
    emitter=HOST_OP_NO_EMITTER,
)


# --------------------------------------------------------------------------------------------------
# The schema of fields, and walking it (Caffe2's TreeIterator)


@dataclass(frozen=True)
class TreeIterator:
    """The domains of a list of fields: `domain[i]` is the offset slot field i advances in (0: the top
    level, k: the domain opened by the (k-1)th lengths field), `length_fields` the ids of the lengths
    fields, in order."""

    fields: tuple[str, ...]
    domain: tuple[int, ...]
    length_fields: tuple[int, ...]

    @staticmethod
    def of(fields: Sequence[str]) -> TreeIterator:
        """Caffe2's TreeIterator(fields): each field belongs to the lengths field whose prefix matches the
        most of its name; a lengths field must come before every field it measures."""
        parts = [name.split(":") for name in fields]
        length_fields = tuple(i for i, p in enumerate(parts) if p and p[-1] == "lengths")
        domain = []
        for i, name_parts in enumerate(parts):
            best_level, best = 1, -1
            for j, length_id in enumerate(length_fields):
                if length_id == i:
                    continue
                prefix = parts[length_id][:-1]
                if name_parts[: len(prefix)] != prefix:
                    continue
                if len(parts[length_id]) > best_level:
                    best_level, best = len(parts[length_id]), j
            domain.append(best + 1)
        for i, d in enumerate(domain):
            if d and length_fields[d - 1] > i:
                owner = length_fields[d - 1]
                raise BadArgumentError(
                    f"Field {i} ({fields[i]}) depends on a field defined afterwards: {owner} ({fields[owner]})"
                )
        return TreeIterator(tuple(fields), tuple(domain), length_fields)

    @property
    def num_offsets(self) -> int:
        return len(self.length_fields) + 1

    def advance(
        self, lengths: Sequence[np.ndarray], offsets: Sequence[int], limits: Sequence[int], num: int
    ) -> tuple[list[int], list[int]]:
        """(new offsets, sizes) after reading `num` top-level entries from `offsets` (Caffe2's
        TreeIterator::advance); raises where Caffe2's enforces fail."""
        if len(offsets) != self.num_offsets:
            raise BadArgumentError(
                f"the cursor holds {len(offsets)} offsets; its {len(self.fields)} fields have {self.num_offsets} "
                "domains (a cursor that ReadRandomBatch has used must be reset first)"
            )
        if limits[0] < offsets[0]:
            raise BadArgumentError("Tried to advance past end of cursor.")
        sizes = [min(limits[0] - offsets[0], num)] + [0] * (self.num_offsets - 1)
        new = [offsets[0] + sizes[0]] + [0] * (self.num_offsets - 1)
        for j in range(1, self.num_offsets):
            parent = self.domain[self.length_fields[j - 1]]
            start = offsets[parent]
            values = lengths[j - 1][start : start + sizes[parent]]
            total = int(values.sum(dtype=np.int64)) if sizes[parent] else 0
            if offsets[j] + total > limits[j]:
                raise BadArgumentError(
                    f"Inconsistent field length: tried to advance past the end of field {j} "
                    f"('{self.fields[self.length_fields[j - 1]]}' asks for {offsets[j] + total} rows of a domain "
                    f"that has {limits[j]})"
                )
            sizes[j], new[j] = total, offsets[j] + total
        return new, sizes


@dataclass
class TreeCursor:
    """Caffe2's TreeCursor: the schema and one offset per domain (empty until the first read)."""

    iterator: TreeIterator
    offsets: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"TreeCursor(fields={list(self.iterator.fields)}, offsets={self.offsets})"


@dataclass(frozen=True)
class PackedRecords:
    """What PackRecords makes: Caffe2's 1-D tensor of `SharedTensorVectorPtr`, one vector of field tensors
    per record (`rows`), or, with pack_to_single_shared_ptr, a tensor of one `Shared2DTensorVectorPtr`
    holding all of them (`single`). `shape` is the Caffe2 tensor's."""

    rows: tuple[tuple[np.ndarray, ...], ...]
    single: bool = False

    @property
    def shape(self) -> tuple[int]:
        return (1,) if self.single else (len(self.rows),)

    def __repr__(self) -> str:
        kind = "Shared2DTensorVectorPtr" if self.single else "SharedTensorVectorPtr"
        return f"PackedRecords({len(self.rows)} records as {self.shape[0]} {kind})"


CURSOR_TYPE = "std::unique_ptr<TreeCursor>"


def serialize_cursor(name: str, cursor: TreeCursor) -> pb.BlobProto:
    """Caffe2's TreeCursorSerializer: the offsets as an int64 tensor (none before the first read), the field
    names in `content`, each followed by a space. (ops/storage.py registers it with the blob serializers.)"""
    proto = pb.BlobProto(name=name, type=CURSOR_TYPE, content="".join(f"{f} " for f in cursor.iterator.fields).encode())
    if cursor.offsets:
        tensor = proto.tensor
        tensor.dims.append(len(cursor.offsets))
        tensor.data_type = pb.TensorProto.INT64
        tensor.device_detail.device_type = 0
        tensor.int64_data.extend(cursor.offsets)
        tensor.segment.begin, tensor.segment.end = 0, len(cursor.offsets)
    return proto


def deserialize_cursor(proto: pb.BlobProto) -> TreeCursor:
    """Caffe2's TreeCursorDeserializer; ValueError for a proto that is no cursor."""
    fields = proto.content.decode("utf-8", errors="replace").split()
    try:
        iterator = TreeIterator.of(fields)
    except BadArgumentError as error:
        raise ValueError(f"is a cursor over fields that are no schema: {error}") from None
    offsets = [int(v) for v in proto.tensor.int64_data] if proto.HasField("tensor") else []
    if offsets and len(offsets) not in (1, iterator.num_offsets):
        raise ValueError(f"is a cursor with {len(offsets)} offsets for {iterator.num_offsets} domains")
    return TreeCursor(iterator, offsets)


# --------------------------------------------------------------------------------------------------
# Shared checks


def _located(op: Op, error: Rnn2JaxError) -> Rnn2JaxError:
    text = str(error)
    located = type(error)(text if text.startswith(op.where) else f"{op.where}: {text}")
    located.advice = error.advice
    return located


def _tensor(workspace: HostWorkspace, op: Op, index: int) -> np.ndarray:
    """Input `index` as a NumPy array (strings as object arrays of bytes)."""
    name = op.inputs[index]
    value = workspace.get(name, op)
    if isinstance(value, jax.Array | np.ndarray | np.generic):
        return np.asarray(value)
    if isinstance(value, bytes):
        return np.array(value, dtype=object)
    raise InputTypeError(f"{op.where}: blob '{name}' holds a {type(value).__name__}, not a tensor")


def _field_tensors(workspace: HostWorkspace, op: Op, first: int) -> list[np.ndarray]:
    tensors = [_tensor(workspace, op, i) for i in range(first, len(op.inputs))]
    for i, tensor in enumerate(tensors):
        if tensor.ndim == 0:
            raise ShapeError(
                f"{op.where}: field blob '{op.inputs[first + i]}' is a scalar; a field has rows (ndim >= 1)"
            )
    return tensors


def _lengths(op: Op, it: TreeIterator, tensors: Sequence[np.ndarray], first: int) -> list[np.ndarray]:
    """The lengths fields' values (Caffe2 reads them as int32)."""
    lengths = []
    for field_id in it.length_fields:
        tensor = tensors[field_id]
        if tensor.size and tensor.dtype != np.int32:
            raise InputTypeError(
                f"{op.where}: lengths field '{it.fields[field_id]}' (blob '{op.inputs[first + field_id]}') is "
                f"{tensor.dtype}; Caffe2 reads lengths as int32"
            )
        values = tensor.reshape(-1).astype(np.int64)
        if (values < 0).any():
            raise BadArgumentError(
                f"{op.where}: lengths field '{it.fields[field_id]}' (blob '{op.inputs[first + field_id]}') has a "
                "negative length"
            )
        lengths.append(values)
    return lengths


def _limits(it: TreeIterator, tensors: Sequence[np.ndarray]) -> list[int]:
    """Each domain's number of rows: the fewest rows of the fields in it (unbounded for none)."""
    limits = [np.iinfo(np.int64).max] * it.num_offsets
    for i, tensor in enumerate(tensors):
        limits[it.domain[i]] = min(limits[it.domain[i]], tensor.shape[0])
    return limits


def _cursor(workspace: HostWorkspace, op: Op) -> TreeCursor:
    value = workspace.get(op.inputs[0], op)
    if not isinstance(value, TreeCursor):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[0]}' holds a {type(value).__name__}, not a cursor (make one with "
            "CreateTreeCursor)"
        )
    return value


def _check_field_count(op: Op, it: TreeIterator, given: int) -> None:
    if given != len(it.fields):
        raise BadArgumentError(
            f"{op.where}: {op.type} has {given} field blobs for a schema of {len(it.fields)} fields "
            f"({', '.join(it.fields) or 'none'})"
        )


def _iterator(op: Op) -> TreeIterator:
    try:
        return TreeIterator.of(op.strings("fields", ()))
    except BadArgumentError as error:
        raise _located(op, error) from None


def _check_counts(op: Op, inputs: tuple[int, int], outputs: tuple[int, int]) -> None:
    for what, count, (low, high) in (("inputs", len(op.inputs), inputs), ("outputs", len(op.outputs), outputs)):
        if not low <= count <= high:
            wanted = str(low) if low == high else f"{low} or more" if high >= 1 << 30 else f"{low} to {high}"
            raise BadArgumentError(f"{op.where}: {op.type} takes {wanted} {what}, got {count}")


_MANY = 1 << 30


# --------------------------------------------------------------------------------------------------
# Cursors


def _check_create_tree_cursor(op: Op) -> None:
    _check_counts(op, (0, 0), (1, 1))
    _iterator(op)


def create_tree_cursor(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A new cursor over the schema `fields`, at the start."""
    workspace.put(op.outputs[0], TreeCursor(_iterator(op)))


register_host_op(
    "CreateTreeCursor", create_tree_cursor, check=_check_create_tree_cursor, gradient=should_not_do_gradient
)


def _check_reset_cursor(op: Op) -> None:
    _check_counts(op, (1, 1), (0, 0))


def reset_cursor(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Back to the start: the offsets are cleared."""
    _cursor(workspace, op).offsets = []


register_host_op("ResetCursor", reset_cursor, check=_check_reset_cursor, gradient=should_not_do_gradient)


def _check_get_cursor_offset(op: Op) -> None:
    _check_counts(op, (1, 1), (1, 1))


def get_cursor_offset(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The cursor's offsets as int32 (empty before the first read)."""
    workspace.put(op.outputs[0], np.array(_cursor(workspace, op).offsets, dtype=np.int32))


register_host_op("GetCursorOffset", get_cursor_offset, check=_check_get_cursor_offset)


def _check_read_next_batch(op: Op) -> None:
    _check_counts(op, (1, _MANY), (1, _MANY))
    if op.int("batch_size", 1) < 0:
        raise BadArgumentError(f"{op.where}: batch_size must not be negative")
    op.bool("enforce_batch_size", False)


def _slice_fields(
    op: Op, it: TreeIterator, tensors: Sequence[np.ndarray], offsets: Sequence[int], sizes: Sequence[int]
) -> Iterator[tuple[str, np.ndarray]]:
    """(output, its rows) for each field: `sizes[d]` rows from `offsets[d]` of the field's domain d."""
    for i, tensor in enumerate(tensors):
        start = offsets[it.domain[i]]
        yield op.outputs[i], tensor[start : start + sizes[it.domain[i]]].copy()


def read_next_batch(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The next `batch_size` top-level entries of every field; empty fields at the end of the data (and,
    with enforce_batch_size, for a last batch that would be short)."""
    cursor = _cursor(workspace, op)
    it = cursor.iterator
    try:
        _check_field_count(op, it, len(op.inputs) - 1)
        if len(op.outputs) != len(it.fields):
            raise BadArgumentError(
                f"{op.where}: ReadNextBatch has {len(op.outputs)} outputs for {len(it.fields)} fields"
            )
        tensors = _field_tensors(workspace, op, 1)
        lengths = _lengths(op, it, tensors, 1)
        limits = _limits(it, tensors)
        offsets = cursor.offsets or [0] * it.num_offsets
        batch = op.int("batch_size", 1)
        new, sizes = it.advance(lengths, offsets, limits, batch)
    except Rnn2JaxError as error:
        raise _located(op, error) from None
    cursor.offsets = new
    if op.bool("enforce_batch_size", False) and sizes[0] < batch:
        sizes = [0] * len(sizes)
    for name, value in _slice_fields(op, it, tensors, offsets, sizes):
        workspace.put(name, value)


register_host_op("ReadNextBatch", read_next_batch, check=_check_read_next_batch, gradient=should_not_do_gradient)


def _check_compute_offset(op: Op) -> None:
    _check_counts(op, (1, _MANY), (1, 1))


def compute_offset(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The int64 matrix [entries + 1, domains] of the cursor's offsets before each top-level entry (and at
    the end), walking from where the cursor is; the cursor is then at the start again."""
    cursor = _cursor(workspace, op)
    it = cursor.iterator
    try:
        _check_field_count(op, it, len(op.inputs) - 1)
        if not it.fields:
            raise BadArgumentError("the cursor has no fields: there are no entries to compute offsets of")
        tensors = _field_tensors(workspace, op, 1)
        lengths = _lengths(op, it, tensors, 1)
        limits = _limits(it, tensors)
        offsets = cursor.offsets or [0] * it.num_offsets
        rows = []
        for _ in range(limits[0] + 1):
            rows.append(offsets)
            offsets, _sizes = it.advance(lengths, offsets, limits, 1)
    except Rnn2JaxError as error:
        raise _located(op, error) from None
    cursor.offsets = [0] * it.num_offsets
    workspace.put(op.outputs[0], np.array(rows, dtype=np.int64).reshape(len(rows), it.num_offsets))


register_host_op("ComputeOffset", compute_offset, check=_check_compute_offset, gradient=should_not_do_gradient)


# std::default_random_engine (minstd_rand0, seed 1) and libstdc++'s std::shuffle, which SortAndShuffle
# uses with a fresh engine for every call: its permutations are the same on every run.
class _MinstdRand0:
    MIN, MAX = 1, 2147483646

    def __init__(self) -> None:
        self.state = 1

    def __call__(self) -> int:
        self.state = self.state * 16807 % 2147483647
        return self.state


def _uniform_int(engine: _MinstdRand0, low: int, high: int) -> int:
    """libstdc++'s uniform_int_distribution<unsigned long>(low, high)(engine), for high - low below the
    engine's range (downscaling by rejection)."""
    engine_range = engine.MAX - engine.MIN
    span = high - low
    if span == engine_range:
        return engine() - engine.MIN + low
    assert span < engine_range
    extent = span + 1
    scaling = engine_range // extent
    past = extent * scaling
    while True:
        value = engine() - engine.MIN
        if value < past:
            return value // scaling + low


def _shuffle(values: list[int]) -> None:
    """libstdc++'s std::shuffle(first, last, std::default_random_engine()), in place: with a range this small
    it draws two swap positions from one number."""
    n = len(values)
    if n == 0:
        return
    engine = _MinstdRand0()
    engine_range = engine.MAX - engine.MIN
    if engine_range // n >= n:
        i = 1
        if n % 2 == 0:
            j = _uniform_int(engine, 0, 1)
            values[i], values[j] = values[j], values[i]
            i += 1
        while i != n:
            swap_range = i + 1
            x = _uniform_int(engine, 0, swap_range * (swap_range + 1) - 1)
            first, second = x // (swap_range + 1), x % (swap_range + 1)
            values[i], values[first] = values[first], values[i]
            i += 1
            values[i], values[second] = values[second], values[i]
            i += 1
        return
    for i in range(1, n):
        j = _uniform_int(engine, 0, i)
        values[i], values[j] = values[j], values[i]


def _check_sort_and_shuffle(op: Op) -> None:
    _check_counts(op, (1, _MANY), (1, 1))
    if op.int("sort_by_field_idx", 1) < -1:
        raise BadArgumentError(f"{op.where}: sort_by_field_idx must be -1 (no sort) or a field's index")
    batch, shuffle = op.int("batch_size", 1), op.int("shuffle_size", 1)
    if batch <= 0 or shuffle <= 0:
        raise BadArgumentError(f"{op.where}: batch_size ({batch}) and shuffle_size ({shuffle}) must be positive")


def sort_and_shuffle(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """int64 indices of the top-level entries: sorted by a root-level int32 field (unless
    sort_by_field_idx is -1), shuffled within chunks of batch_size * shuffle_size, then whole batches
    shuffled; Caffe2's engine is seeded the same on every call, and so is this one."""
    cursor = _cursor(workspace, op)
    it = cursor.iterator
    by, batch, shuffle = op.int("sort_by_field_idx", 1), op.int("batch_size", 1), op.int("shuffle_size", 1)
    try:
        _check_field_count(op, it, len(op.inputs) - 1)
        if by >= len(it.fields) or not it.fields:
            raise BadArgumentError(f"sort_by_field_idx {by} is not a field's index ({len(it.fields)} fields)")
        source = _tensor(workspace, op, (by if by != -1 else 0) + 1)
        if source.ndim == 0:
            raise ShapeError(f"blob '{op.inputs[(by if by != -1 else 0) + 1]}' is a scalar; a field has rows")
        size = source.shape[0]
        indices = list(range(size))
        if by != -1:
            if it.domain[by] != 0:
                raise BadArgumentError(f"field '{it.fields[by]}' is not at the root level; sort by a root-level field")
            if source.dtype != np.int32:
                raise InputTypeError(f"blob '{op.inputs[by + 1]}' is {source.dtype}; Caffe2 sorts by an int32 field")
            if source.size < size:
                raise ShapeError(f"blob '{op.inputs[by + 1]}' has rows without values to sort by")
            indices = _std_sort(indices, source.reshape(-1)[:size])  # Caffe2 reads the first `size` values
    except Rnn2JaxError as error:
        raise _located(op, error) from None
    if batch * shuffle > size:
        shuffle = size // batch
    chunk = batch * shuffle
    if chunk > 1:
        offset = 0
        while offset + chunk < size:
            part = indices[offset : offset + chunk]
            _shuffle(part)
            indices[offset : offset + chunk] = part
            offset += chunk
    batches = list(range(size // batch))
    _shuffle(batches)
    out = [index for b in batches for index in indices[b * batch : (b + 1) * batch]]
    out += indices[len(batches) * batch :]
    workspace.put(op.outputs[0], np.array(out, dtype=np.int64))


def _std_sort(indices: list[int], keys: np.ndarray) -> list[int]:
    """libstdc++'s std::sort of `indices` by `keys` (introsort: unstable where keys tie, as Caffe2's is)."""
    values = list(indices)
    key = [int(k) for k in keys]

    def less(a: int, b: int) -> bool:
        return key[a] < key[b]

    def insertion(first: int, last: int) -> None:
        for i in range(first + 1, last):
            value = values[i]
            if less(value, values[first]):
                values[first + 1 : i + 1] = values[first:i]
                values[first] = value
            else:
                j = i
                while less(value, values[j - 1]):
                    values[j] = values[j - 1]
                    j -= 1
                values[j] = value

    def unguarded_insertion(first: int, last: int) -> None:
        for i in range(first, last):
            value = values[i]
            j = i
            while less(value, values[j - 1]):
                values[j] = values[j - 1]
                j -= 1
            values[j] = value

    def move_median_to_first(result: int, a: int, b: int, c: int) -> None:
        va, vb, vc = values[a], values[b], values[c]
        if less(va, vb):
            if less(vb, vc):
                pick = b
            elif less(va, vc):
                pick = c
            else:
                pick = a
        elif less(va, vc):
            pick = a
        elif less(vb, vc):
            pick = c
        else:
            pick = b
        values[result], values[pick] = values[pick], values[result]

    def unguarded_partition(first: int, last: int, pivot: int) -> int:
        while True:
            while less(values[first], values[pivot]):
                first += 1
            last -= 1
            while less(values[pivot], values[last]):
                last -= 1
            if not first < last:
                return first
            values[first], values[last] = values[last], values[first]
            first += 1

    def heap_sort(first: int, last: int) -> None:
        part = values[first:last]
        part.sort(key=lambda v: key[v])  # depth limit reached: heapsort's order of ties is not reproduced
        values[first:last] = part

    def introsort(first: int, last: int, depth: int) -> None:
        while last - first > 16:
            if depth == 0:
                heap_sort(first, last)
                return
            depth -= 1
            mid = first + (last - first) // 2
            move_median_to_first(first, first + 1, mid, last - 1)
            cut = unguarded_partition(first + 1, last, first)
            introsort(cut, last, depth)
            last = cut

    n = len(values)
    if n > 1:
        introsort(0, n, 2 * (n.bit_length() - 1))
        if n > 16:
            insertion(0, 16)
            unguarded_insertion(16, n)
        else:
            insertion(0, n)
    return values


register_host_op("SortAndShuffle", sort_and_shuffle, check=_check_sort_and_shuffle)


def _check_read_random_batch(op: Op) -> None:
    _check_counts(op, (1, _MANY), (1, _MANY))
    if op.int("batch_size", 1) < 0:
        raise BadArgumentError(f"{op.where}: batch_size must not be negative")
    op.bool("enforce_batch_size", False)
    op.bool("loop_over", False)


def read_random_batch(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The next `batch_size` entries in the order of the int64 index blob (input 1), each read through the
    offsets matrix that ComputeOffset made (input 2); with loop_over, from the first index again at the end."""
    cursor = _cursor(workspace, op)
    it = cursor.iterator
    batch = op.int("batch_size", 1)
    try:
        _check_field_count(op, it, len(op.inputs) - 3)
        if len(op.outputs) != len(it.fields):
            raise BadArgumentError(f"ReadRandomBatch has {len(op.outputs)} outputs for {len(it.fields)} fields")
        order = _tensor(workspace, op, 1)
        if order.dtype != np.int64:
            raise InputTypeError(f"index blob '{op.inputs[1]}' is {order.dtype}; Caffe2 reads it as int64")
        matrix = _tensor(workspace, op, 2)
        if matrix.dtype != np.int64 or matrix.ndim != 2:
            raise InputTypeError(
                f"offsets blob '{op.inputs[2]}' is {matrix.dtype} {list(matrix.shape)}; ComputeOffset makes an "
                "int64 matrix"
            )
        tensors = _field_tensors(workspace, op, 3)
    except Rnn2JaxError as error:
        raise _located(op, error) from None
    order = order.reshape(-1)
    offsets = (cursor.offsets or [0])[:1]
    start = offsets[0]
    if op.bool("enforce_batch_size", False) and start + batch > order.size:
        start = order.size
    if op.bool("loop_over", False) and start >= order.size:
        offsets[0] = start = 0
    cursor.offsets = [offsets[0] + batch]
    picked = [int(i) for i in order[start : start + batch]] if start < order.size else []
    columns, flat = matrix.shape[1], matrix.reshape(-1)  # Caffe2 reads the matrix as flat memory
    for field_id, tensor in enumerate(tensors):
        d = it.domain[field_id]
        parts = []
        for index in picked:
            if not (index + 1) * columns + d < matrix.size or index < 0:
                raise BadArgumentError(
                    f"{op.where}: Out of bound when trying to get elem from offsetsmat (index {index}, domain {d}, "
                    f"offsets {list(matrix.shape)})"
                )
            begin, end = int(flat[index * columns + d]), int(flat[(index + 1) * columns + d])
            if not 0 <= begin <= end <= tensor.shape[0]:
                raise BadArgumentError(
                    f"{op.where}: offsets [{begin}, {end}) of entry {index} are outside field "
                    f"'{it.fields[field_id]}' ({tensor.shape[0]} rows)"
                )
            parts.append(tensor[begin:end])
        out = np.concatenate(parts) if parts else tensor[:0]
        workspace.put(op.outputs[field_id], out.copy())


register_host_op("ReadRandomBatch", read_random_batch, check=_check_read_random_batch, gradient=should_not_do_gradient)


# --------------------------------------------------------------------------------------------------
# Whole datasets: consistency, trimming, packing


def _check_fields_op(op: Op) -> None:
    _iterator(op)


def _walk(op: Op, it: TreeIterator, tensors: Sequence[np.ndarray], first: int, count: int | None = None):
    """The first `count` top-level records (default: all): (offsets before each, its sizes), as Caffe2's
    TreeWalker visits them (it checks the lengths only of the records it visits)."""
    lengths = _lengths(op, it, tensors, first)
    limits = _limits(it, tensors)
    offsets = [0] * it.num_offsets
    records = []
    for _ in range(limits[0] if count is None else min(count, limits[0])):
        new, sizes = it.advance(lengths, offsets, limits, 1)
        records.append((offsets, sizes))
        offsets = new
    return records, offsets


def _check_check_dataset_consistency(op: Op) -> None:
    _check_counts(op, (1, _MANY), (0, 0))
    _check_field_count(op, _iterator(op), len(op.inputs))


def check_dataset_consistency(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Refuse fields that are not one consistent dataset: fields of one domain with different numbers of
    rows, or lengths that do not add up to the rows of the domain they open."""
    it = _iterator(op)
    try:
        tensors = _field_tensors(workspace, op, 0)
        lengths = _lengths(op, it, tensors, 0)
        limits: list[int | None] = [None] * it.num_offsets
        for i, tensor in enumerate(tensors):
            d = it.domain[i]
            if limits[d] is not None and limits[d] != tensor.shape[0]:
                raise ShapeError(
                    f"Inconsistent sizes for fields belonging to same domain. Field: {i} ({it.fields[i]}); "
                    f"Length field index: {d}; Previous size: {limits[d]}; New size: {tensor.shape[0]}"
                )
            limits[d] = tensor.shape[0]
        bounded = [np.iinfo(np.int64).max if limit is None else limit for limit in limits]
        offsets, _sizes = it.advance(lengths, [0] * it.num_offsets, bounded, bounded[0])
        for d, (limit, offset) in enumerate(zip(bounded, offsets, strict=True)):
            if limit != offset:
                what = "the top level" if d == 0 else f"domain '{it.fields[it.length_fields[d - 1]]}'"
                raise ShapeError(f"the lengths account for {offset} rows of {what}, which has {limit}")
    except Rnn2JaxError as error:
        raise _located(op, error) from None


register_host_op(
    "CheckDatasetConsistency",
    check_dataset_consistency,
    check=_check_check_dataset_consistency,
    gradient=should_not_do_gradient,
)


def _check_trim_dataset(op: Op) -> None:
    _check_counts(op, (1, _MANY), (1, _MANY))
    if list(op.inputs) != list(op.outputs):
        raise BadArgumentError(f"{op.where}: TrimDataset runs in place: its outputs must be its inputs")
    if op.int("multiple_of", 1) < 1:
        raise BadArgumentError(f"{op.where}: multiple_of must be at least 1")
    _check_field_count(op, _iterator(op), len(op.inputs))


def trim_dataset(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Keep the largest number of top-level records that is a multiple of `multiple_of`, in place."""
    it = _iterator(op)
    try:
        tensors = _field_tensors(workspace, op, 0)
        rows = _limits(it, tensors)[0]
        multiple = op.int("multiple_of", 1)
        kept = rows // multiple * multiple
        records, _end = _walk(op, it, tensors, 0, kept + 1 if kept < rows else 1)
    except Rnn2JaxError as error:
        raise _located(op, error) from None
    if kept == rows:
        return
    offsets = records[kept][0]
    for i, tensor in enumerate(tensors):
        workspace.put(op.outputs[i], tensor[: offsets[it.domain[i]]].copy())


register_host_op("TrimDataset", trim_dataset, check=_check_trim_dataset)


def _check_pack_records(op: Op) -> None:
    _check_counts(op, (1, _MANY), (1, 1))
    _check_field_count(op, _iterator(op), len(op.inputs))
    op.int("pack_to_single_shared_ptr", 0)


def pack_records(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """One vector of field tensors per top-level record (a batch of one)."""
    it = _iterator(op)
    try:
        tensors = _field_tensors(workspace, op, 0)
        records, _end = _walk(op, it, tensors, 0)
    except Rnn2JaxError as error:
        raise _located(op, error) from None
    rows = tuple(
        tuple(
            tensor[offsets[it.domain[i]] : offsets[it.domain[i]] + sizes[it.domain[i]]].copy()
            for i, tensor in enumerate(tensors)
        )
        for offsets, sizes in records
    )
    workspace.put(op.outputs[0], PackedRecords(rows, bool(op.int("pack_to_single_shared_ptr", 0))))


register_host_op("PackRecords", pack_records, check=_check_pack_records, gradient=should_not_do_gradient)


def _check_unpack_records(op: Op) -> None:
    _check_counts(op, (1, _MANY), (1, _MANY))
    op.strings("fields", ())


def unpack_records(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Each field's tensors of every record, concatenated; the optional inputs after the packed one are
    prototypes giving each output's inner shape and dtype (needed to unpack no records)."""
    packed = workspace.get(op.inputs[0], op)
    fields = op.strings("fields", ())
    if not isinstance(packed, PackedRecords):
        if len(op.inputs) != 1 or len(op.outputs) != 1:
            raise BadArgumentError(
                f"{op.where}: blob '{op.inputs[0]}' is not packed records (PackRecords makes them); a plain "
                "tensor is copied only by an UnPackRecords of 1 input and 1 output"
            )
        workspace.put(op.outputs[0], _tensor(workspace, op, 0).copy())
        return
    rows = packed.rows
    count = len(op.outputs)
    if not rows and len(op.inputs) == 1:
        raise BadArgumentError(
            f"{op.where}: Unpacking empty record without shape will leave output blobs in undefined state "
            "(give prototype blobs after the packed one)"
        )
    if len(op.inputs) == 1:
        prototypes = list(rows[0])
        if len(prototypes) != len(fields) or len(prototypes) != count:
            raise BadArgumentError(
                f"{op.where}: the records hold {len(prototypes)} tensors; the op has {len(fields)} fields and "
                f"{count} outputs"
            )
    else:
        if len(fields) != len(op.inputs) - 1 or len(fields) != count:
            raise BadArgumentError(
                f"{op.where}: {len(op.inputs) - 1} prototype blobs, {len(fields)} fields and {count} outputs; "
                "give as many of each"
            )
        prototypes = [_tensor(workspace, op, i) for i in range(1, len(op.inputs))]
    for j, prototype in enumerate(prototypes):
        if prototype.ndim == 0:
            raise ShapeError(f"{op.where}: the prototype of output '{op.outputs[j]}' is a scalar; it needs rows")
    for r, row in enumerate(rows):
        if len(row) < count:
            raise BadArgumentError(f"{op.where}: record {r} holds {len(row)} tensors; the op has {count} outputs")
        for j, (tensor, prototype) in enumerate(zip(row, prototypes, strict=False)):
            if (
                tensor.ndim != prototype.ndim
                or tensor.dtype != prototype.dtype
                or tensor.shape[1:] != prototype.shape[1:]
            ):
                raise ShapeError(
                    f"{op.where}: record {r}'s tensor {j} is {tensor.dtype} {list(tensor.shape)}; output "
                    f"'{op.outputs[j]}' takes {prototype.dtype} [N, {', '.join(map(str, prototype.shape[1:]))}]"
                )
    for j, name in enumerate(op.outputs):
        parts = [row[j] for row in rows]
        out = np.concatenate(parts) if parts else prototypes[j][:0]
        workspace.put(name, out.copy())


register_host_op("UnPackRecords", unpack_records, check=_check_unpack_records, gradient=should_not_do_gradient)


# --------------------------------------------------------------------------------------------------
# Append and AtomicAppend: a host op (any dtype, strings too) and a pure lowering for compiled nets


def _append_one(op: Op, a: np.ndarray, b: np.ndarray, a_name: str, b_name: str) -> np.ndarray:
    """B after A's rows; A with no rows is replaced by B (its dtype and shape)."""
    if b.ndim < 1:
        raise ShapeError(f"{op.where}: blob '{b_name}' is a scalar; Append appends rows (ndim >= 1)")
    if a.ndim > 0 and a.shape[0] == 0:
        return b.copy()
    if a.ndim == 0:
        raise ShapeError(f"{op.where}: blob '{a_name}' is a scalar; Append appends rows (ndim >= 1)")
    if a.ndim != b.ndim or a.shape[1:] != b.shape[1:]:
        raise ShapeError(
            f"{op.where}: cannot append '{b_name}' {list(b.shape)} to '{a_name}' {list(a.shape)}: all but the "
            "first dimension must match"
        )
    if a.dtype != b.dtype and not (a.dtype == object and b.dtype == object):
        raise InputTypeError(
            f"{op.where}: cannot append '{b_name}' ({b.dtype}) to '{a_name}' ({a.dtype}): dtypes differ"
        )
    return np.concatenate([a, b])


def _check_append(op: Op) -> None:
    _check_counts(op, (2, 2), (1, 1))
    if op.outputs[0] != op.inputs[0]:
        raise BadArgumentError(
            f"{op.where}: Append runs in place: its output must be its first input '{op.inputs[0]}' (Caffe2: "
            "'Input index 0 and output idx 0 are not in-place but should be')"
        )


def append(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Append B's rows to A, in place."""
    a, b = _tensor(workspace, op, 0), _tensor(workspace, op, 1)
    workspace.put(op.outputs[0], _append_one(op, a, b, op.inputs[0], op.inputs[1]))


def _check_atomic_append(op: Op) -> None:
    _check_counts(op, (3, _MANY), (1, _MANY))
    if (len(op.inputs) - 1) // 2 != len(op.outputs) or len(op.inputs) % 2 == 0:
        raise BadArgumentError(
            f"{op.where}: AtomicAppend takes a mutex, then N datasets fields and N fields to append, and gives "
            f"N outputs; got {len(op.inputs)} inputs and {len(op.outputs)} outputs"
        )


def atomic_append(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Append each of the second half of the fields to the first half, in place; every field is checked
    before any is written. The mutex (input 0) only serialised Caffe2's threads."""
    count = len(op.outputs)
    results = []
    for i in range(count):
        a, b = _tensor(workspace, op, 1 + i), _tensor(workspace, op, 1 + count + i)
        if a.size and op.inputs[1 + i] != op.outputs[i]:
            raise BadArgumentError(
                f"{op.where}: Appended-to arguments must be in-place: output '{op.outputs[i]}' is not input "
                f"'{op.inputs[1 + i]}'"
            )
        results.append(_append_one(op, a, b, op.inputs[1 + i], op.inputs[1 + count + i]))
    for name, value in zip(op.outputs, results, strict=True):
        workspace.put(name, value)


def _append_kernel(op: Op, a: Any, b: Any, a_name: str, b_name: str) -> Any:
    if b.ndim < 1:
        raise ShapeError(f"{op.where}: blob '{b_name}' is a scalar; Append appends rows (ndim >= 1)")
    if a.ndim > 0 and a.shape[0] == 0:
        return b
    if a.ndim != b.ndim or a.shape[1:] != b.shape[1:]:
        raise ShapeError(
            f"{op.where}: cannot append '{b_name}' {list(b.shape)} to '{a_name}' {list(a.shape)}: all but the "
            "first dimension must match"
        )
    if a.dtype != b.dtype:
        raise InputTypeError(
            f"{op.where}: cannot append '{b_name}' ({b.dtype}) to '{a_name}' ({a.dtype}): dtypes differ"
        )
    return jnp.concatenate([a, b])


_PURE_APPEND = {
    "gradient": should_not_do_gradient,
    "shape_rule": NO_SHAPE_RULE,
    "emitter": Absent("codegen does not write dataset ops"),
}


@register("Append", inputs=2, outputs=1, **_PURE_APPEND)
def append_lowering(op: Op) -> Kernel:
    """In a compiled net: A's rows then B's (A empty of rows: B)."""
    _check_append(op)
    return lambda a, b: _append_kernel(op, a, b, op.inputs[0], op.inputs[1])


@register("AtomicAppend", inputs=(3, _MANY), outputs=(1, _MANY), **_PURE_APPEND)
def atomic_append_lowering(op: Op) -> Kernel:
    """In a compiled net: each appended field (the mutex is CreateMutex's placeholder)."""
    _check_atomic_append(op)
    count = len(op.outputs)

    def kernel(mutex: Any, *fields: Any) -> tuple:
        out = []
        for i in range(count):
            a, b = fields[i], fields[count + i]
            if math.prod(a.shape) and op.inputs[1 + i] != op.outputs[i]:
                raise BadArgumentError(
                    f"{op.where}: Appended-to arguments must be in-place: output '{op.outputs[i]}' is not input "
                    f"'{op.inputs[1 + i]}'"
                )
            out.append(_append_kernel(op, a, b, op.inputs[1 + i], op.inputs[1 + count + i]))
        return tuple(out)

    return kernel


register_host_op("Append", append, check=_check_append)  # the workspace's: strings too
register_host_op("AtomicAppend", atomic_append, check=_check_atomic_append)


# --------------------------------------------------------------------------------------------------
# The text file reader


class TextFileReader:
    """Caffe2's TextFileReaderInstance: rows of tab-separated fields, one row a line, read `passes` times
    over. Fields are split as Caffe2's Tokenizer splits them: a token ends at a newline or a tab, text after
    the last newline of the file is not read, and a NUL byte escapes the byte after it."""

    def __init__(self, path: str, passes: int, field_types: Sequence[int]):
        self.path, self.passes, self.field_types = path, passes, tuple(field_types)
        self.rows_read = 0
        self._pass = 0
        self._tokens: list[tuple[int, bytes]] = []
        self._next = 0
        with open(path, "rb"):  # Caffe2 opens the file when the reader is made
            pass

    def _tokenize(self) -> list[tuple[int, bytes]]:
        with open(self.path, "rb") as stream:
            data = stream.read()
        tokens, start_delim, current, i = [], 0, bytearray(), 0
        while i < len(data):
            byte = data[i]
            if byte == 0:  # the escape: the next byte is taken as it is
                if i + 1 < len(data):
                    current.append(data[i + 1])
                i += 2
                continue
            if byte in (10, 9):
                tokens.append((start_delim, bytes(current)))
                current = bytearray()
                start_delim = 0 if byte == 10 else 1
            else:
                current.append(byte)
            i += 1
        return tokens

    def token(self) -> tuple[int, bytes] | None:
        """The next token as (the delimiter before it: 0 newline or start, 1 tab; its bytes), or None at
        the end of the last pass."""
        while self._next >= len(self._tokens):
            if self._pass >= self.passes:
                return None
            self._tokens, self._next = self._tokenize(), 0
            self._pass += 1
        token = self._tokens[self._next]
        self._next += 1
        return token

    def __repr__(self) -> str:
        return f"TextFileReader({self.path!r}, {self.rows_read} rows read)"


def _check_create_text_file_reader(op: Op) -> None:
    _check_counts(op, (0, 0), (1, 1))
    if not op.ints("field_types", ()):
        raise BadArgumentError(f"{op.where}: field_types arg must be non-empty")
    op.str("filename", "")
    op.int("num_passes", 1)


def create_text_file_reader(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A reader of `filename` (relative names from the current directory, as in Caffe2)."""
    path = op.str("filename", "")
    for code in op.ints("field_types"):
        try:
            _field_dtype(code)
        except BadArgumentError as error:
            raise _located(op, error) from None
    try:
        reader = TextFileReader(path, op.int("num_passes", 1), op.ints("field_types"))
    except OSError as error:
        raise StorageError(
            f"{op.where}: Error opening file for reading: {error.strerror or error} Path={path}"
            + ("" if os.path.isabs(path) else f" (relative to {os.getcwd()})")
        ) from None
    workspace.put(op.outputs[0], reader)


register_host_op(
    "CreateTextFileReader", create_text_file_reader, check=_check_create_text_file_reader, gradient=no_gradient
)

# strtof's prefix: optional space and sign, then a decimal or hexadecimal number, inf/infinity or nan
_FLOAT = re.compile(
    rb"[ \t\n\v\f\r]*([+-]?(?:inf(?:inity)?|nan(?:\([0-9a-z_]*\))?"
    rb"|0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?[0-9]+)?"
    rb"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?))",
    re.IGNORECASE,
)


def strtof(text: bytes) -> np.float32 | None:
    """C's strtof of the longest number at the start of `text` (None where there is none)."""
    match = _FLOAT.match(text)
    if match is None:
        return None
    number = match.group(1).decode("ascii").lower()
    body = number.lstrip("+-")
    if body.startswith("0x"):
        mantissa, _, exponent = body[2:].partition("p")
        value = float.fromhex("0x" + (mantissa if mantissa != "." else "0") + "p" + (exponent or "0"))
        value = -value if number.startswith("-") else value
    elif body.startswith("nan"):
        value = float("-nan" if number.startswith("-") else "nan")
    else:
        value = float(number)
    with np.errstate(over="ignore"):
        return np.float32(value)


_TEXT_TYPES = {pb.TensorProto.STRING: np.dtype(object), pb.TensorProto.FLOAT: np.dtype(np.float32)}


def _field_dtype(code: int) -> np.dtype:
    if code in _TEXT_TYPES:
        return _TEXT_TYPES[code]
    if code in DATA_TYPES:
        return np.dtype(DATA_TYPES[code])
    raise BadArgumentError(f"field type {code} is not a Caffe2 data type")


def _check_text_file_reader_read(op: Op) -> None:
    _check_counts(op, (1, 1), (1, _MANY))
    if op.int("batch_size", 1) < 0:
        raise BadArgumentError(f"{op.where}: batch_size must not be negative")


def text_file_reader_read(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Up to `batch_size` rows, one 1-D output per field (strings as bytes, floats as float32); empty
    outputs at the end of the last pass."""
    reader = workspace.get(op.inputs[0], op)
    if not isinstance(reader, TextFileReader):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[0]}' holds a {type(reader).__name__}, not a text file reader (make one "
            "with CreateTextFileReader)"
        )
    count = len(op.outputs)
    if len(reader.field_types) != count:
        raise BadArgumentError(f"{op.where}: Invalid number of outputs. Expected {len(reader.field_types)} got {count}")
    try:
        dtypes = [_field_dtype(code) for code in reader.field_types]
    except BadArgumentError as error:
        raise _located(op, error) from None
    columns: list[list[Any]] = [[] for _ in range(count)]
    rows = 0
    batch = op.int("batch_size", 1)
    finished = False
    while not finished and rows < batch:
        for index in range(count):
            token = reader.token()
            if token is None:
                finished = True
                if index != 0:
                    raise StorageError(
                        f"{op.where}: {reader.path}: Invalid number of fields at end of file (the last row has "
                        f"{index} of {count})"
                    )
                break
            delimiter, text = token
            if delimiter != (0 if index == 0 else 1):
                raise StorageError(
                    f"{op.where}: {reader.path}: Invalid number of columns at row {reader.rows_read + rows + 1} "
                    f"(a row has {count} tab-separated fields)"
                )
            code = reader.field_types[index]
            if code == pb.TensorProto.STRING:
                columns[index].append(text)
            elif code == pb.TensorProto.FLOAT:
                value = strtof(text)
                if value is None:
                    raise StorageError(f"{op.where}: {reader.path}: Invalid float: {text.decode('utf-8', 'replace')}")
                columns[index].append(value)
            else:
                raise BadArgumentError(
                    f"{op.where}: field type {code} is Unsupported type. (the reader converts STRING and FLOAT)"
                )
        if not finished:
            rows += 1
    reader.rows_read += rows
    for name, values, dtype in zip(op.outputs, columns, dtypes, strict=True):
        out = np.empty(len(values), dtype=dtype)
        out[:] = values
        workspace.put(name, out)


register_host_op("TextFileReaderRead", text_file_reader_read, check=_check_text_file_reader_read, gradient=no_gradient)
