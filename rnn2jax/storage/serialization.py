"""Blob serialization as Caffe2 does it (`caffe2/core/blob_serialization.cc`, `load_save_op_util.cc`).

A tensor blob is written as one `BlobProto` (type "Tensor") per chunk of at most `chunk_size` elements,
under the DB key "name#%<chunk id>"; each chunk's `TensorProto` carries the whole tensor's dims, its data
type and the `segment` [begin, end) of the flat values it holds. A string blob (a Python `bytes`/`str`)
is one `BlobProto` of type "std::string" with the bytes in `content`, under the key "name".

Reading undoes that: the blob name is the key up to "#%", chunks may come in any order (Caffe2 writes
them from several threads), and a blob is complete only when its segments cover the tensor exactly once.
Errors are `ValueError`s describing the record; the blob layer names the DB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from ..ir.budget import check_array
from ..proto import caffe2_pb2 as pb
from ..proto.tensor import DATA_TYPE_OF, DATA_TYPES, data_type_name, tensor_values

TENSOR_TYPE = "Tensor"  # kTensorBlobType
STRING_TYPE = "std::string"
CHUNK_SEPARATOR = "#%"  # kChunkIdSeparator
DEFAULT_CHUNK_SIZE = 1_000_000  # --caffe2_tensor_chunk_size, what Save uses unless told otherwise

Blob = Any  # an array, bytes (a string blob) or a host object of a registered blob type


@dataclass(frozen=True)
class BlobType:
    """A blob type other than tensors and strings that Caffe2 serializes (its REGISTER_BLOB_SERIALIZER), kept
    in a blob as a host object of class `cls`: `serialize(name, value)` makes its one BlobProto (of type
    `type_name`), `deserialize(proto)` the object again (ValueError when the proto is not one)."""

    type_name: str
    cls: type
    serialize: Callable[[str, Any], pb.BlobProto]
    deserialize: Callable[[pb.BlobProto], Any]


BLOB_TYPES: dict[str, BlobType] = {}  # BlobProto type -> its serializer, registered by the op families


def register_blob_type(blob_type: BlobType) -> None:
    """Let Save write, and Load read, blobs of `blob_type` (a TreeCursor, say)."""
    BLOB_TYPES[blob_type.type_name] = blob_type


def blob_type_of(value: Any) -> BlobType | None:
    """The registered blob type of a host object, or None."""
    for blob_type in BLOB_TYPES.values():
        if isinstance(value, blob_type.cls):
            return blob_type
    return None


def blob_name(key: bytes) -> str:
    """The blob a DB key belongs to: the key up to its "#%" chunk suffix (Caffe2's buildBlobNameFromDbKey)."""
    text = key.decode("utf-8", errors="surrogateescape")
    return text.split(CHUNK_SEPARATOR, 1)[0]


# ------------------------------------------------------------------------------------------------
# Writing


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint(field_number << 3 | 2) + _varint(len(payload)) + payload


_FLOAT_DATA = pb.TensorProto.DESCRIPTOR.fields_by_name["float_data"].number
_DOUBLE_DATA = pb.TensorProto.DESCRIPTOR.fields_by_name["double_data"].number
_BLOB_TENSOR = pb.BlobProto.DESCRIPTOR.fields_by_name["tensor"].number


def _as_tensor(value: Any) -> np.ndarray:
    """A blob value as an array Caffe2 can hold: numeric dtypes it knows, or an object array of bytes."""
    array = np.asarray(value)
    if array.dtype.kind in "SUO":
        flat = [v.encode("utf-8") if isinstance(v, str) else v for v in array.reshape(-1).tolist()]
        if not all(isinstance(v, bytes) for v in flat):
            bad = next(type(v).__name__ for v in flat if not isinstance(v, bytes))
            raise ValueError(f"holds a {bad} among its strings; Caffe2 string tensors hold bytes or str")
        strings = np.empty(len(flat), dtype=object)
        strings[:] = flat
        return strings.reshape(array.shape)
    dtype = array.dtype.newbyteorder("=")
    if dtype not in DATA_TYPE_OF:
        known = ", ".join(sorted(str(d) for d in DATA_TYPE_OF))
        raise ValueError(f"has dtype {array.dtype}, which Caffe2 tensors cannot hold ({known}, strings)")
    return np.ascontiguousarray(array, dtype=dtype).reshape(array.shape)  # ascontiguousarray makes 0-d 1-d


def to_bfloat16(values: np.ndarray) -> bytes:
    """float32 values as little-endian bfloat16, rounded half up as fbgemm's FloatToBfloat16 does (its +2^15
    wraps in uint32, as fbgemm's does)."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    return ((bits + np.uint32(1 << 15)) >> np.uint32(16)).astype("<u2").tobytes()


def _chunk_proto(name: str, array: np.ndarray, flat: np.ndarray, begin: int, end: int, bfloat16: bool = False) -> bytes:
    tensor = pb.TensorProto(name=name, dims=array.shape)
    tensor.segment.begin = begin
    tensor.segment.end = end
    tensor.device_detail.device_type = 0  # CPU, as StoreDeviceDetail records it
    values = flat[begin:end]
    packed = b""
    if array.dtype == object:
        tensor.data_type = pb.TensorProto.STRING
        tensor.string_data.extend(values.tolist())
    else:
        tensor.data_type = DATA_TYPE_OF[array.dtype]
        if array.dtype == np.float32 and bfloat16:  # FLOAT_BFLOAT16: two bytes an element, in raw_data
            tensor.data_format = pb.TensorProto.FMT_BFLOAT16
            tensor.raw_data = to_bfloat16(values)
        elif array.dtype == np.float32:  # packed fixed-width fields: the bytes themselves, without a loop
            tensor.data_format = pb.TensorProto.FMT_PROTOBUF
            packed = _length_delimited(_FLOAT_DATA, values.astype("<f4").tobytes()) if values.size else b""
        elif array.dtype == np.float64:
            packed = _length_delimited(_DOUBLE_DATA, values.astype("<f8").tobytes()) if values.size else b""
        elif array.dtype == np.int64:
            tensor.int64_data.extend(values.tolist())
        elif array.dtype == np.float16:  # bit patterns, one per int32
            tensor.int32_data.extend(values.view(np.uint16).tolist())
        else:
            tensor.int32_data.extend(values.astype(np.int32).tolist())
    blob = pb.BlobProto(name=name, type=TENSOR_TYPE).SerializeToString()
    # Concatenated serializations merge: the tensor field is the tensor's fields plus the packed data.
    return blob + _length_delimited(_BLOB_TENSOR, tensor.SerializeToString() + packed)


def serialize_blob(
    name: str, value: Any, chunk_size: int | None = None, bfloat16: bool = False
) -> Iterator[tuple[bytes, bytes]]:
    """The (key, serialized BlobProto) records of one blob, as Caffe2's Save writes them.

    `chunk_size` counts elements per chunk, as Save's argument does: None or -1 is Caffe2's default
    (1,000,000), 0 one chunk for the whole tensor. `bfloat16` writes float32 tensors as bfloat16 (Caffe2's
    FLOAT_BFLOAT16 option, with fbgemm). Raises ValueError for a value Caffe2 cannot hold."""
    if isinstance(value, bytes | str):
        content = value.encode("utf-8") if isinstance(value, str) else value
        yield name.encode("utf-8"), pb.BlobProto(name=name, type=STRING_TYPE, content=content).SerializeToString()
        return
    blob_type = blob_type_of(value)
    if blob_type is not None:
        yield name.encode("utf-8"), blob_type.serialize(name, value).SerializeToString()
        return
    array = _as_tensor(value)
    flat = array.reshape(-1)
    if chunk_size is None or chunk_size == -1:
        step = DEFAULT_CHUNK_SIZE
    elif chunk_size == 0:
        step = flat.size + 1  # kNoChunking: one chunk, even for an empty tensor
    elif isinstance(chunk_size, int) and chunk_size > 0:
        step = chunk_size
    else:
        raise ValueError(f"chunk_size {chunk_size!r}: give a positive number of elements, 0 or -1")
    for chunk_id, begin in enumerate(range(0, max(flat.size, 1), step)):
        end = min(begin + step, flat.size)
        yield f"{name}{CHUNK_SEPARATOR}{chunk_id}".encode(), _chunk_proto(name, array, flat, begin, end, bfloat16)


# ------------------------------------------------------------------------------------------------
# Reading


def _read_varint(buffer: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7


def _field_spans(buffer: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each field in buffer[start:end]; for varints and fixed
    fields the span is the value's bytes. The buffer has already parsed as a message, so it is well formed."""
    position = start
    while position < end:
        tag, position = _read_varint(buffer, position)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, after = _read_varint(buffer, position)
        elif wire_type == 1:
            after = position + 8
        elif wire_type == 2:
            length, position = _read_varint(buffer, position)
            after = position + length
        elif wire_type == 5:
            after = position + 4
        else:  # groups: not in caffe2.proto
            raise ValueError(f"uses protobuf wire type {wire_type}, which caffe2.proto never writes")
        yield number, wire_type, position, after
        position = after


_PACKED = {pb.TensorProto.FLOAT: (_FLOAT_DATA, "<f4"), pb.TensorProto.DOUBLE: (_DOUBLE_DATA, "<f8")}


def packed_values(value: bytes, tensor: pb.TensorProto) -> np.ndarray | None:
    """The float or double values of a serialized BlobProto straight from their packed bytes: faster than
    converting protobuf's repeated field, and NaN payloads stay bit for bit. None when the tensor is of
    another type, or its values are not (only) in a packed field."""
    if tensor.data_type not in _PACKED or tensor.data_format != pb.TensorProto.FMT_PROTOBUF or tensor.raw_data:
        return None
    number, code = _PACKED[tensor.data_type]
    dtype = np.dtype(code)
    parts = []
    for field_number, wire_type, start, end in _field_spans(value, 0, len(value)):
        if field_number != _BLOB_TENSOR or wire_type != 2:
            continue
        for inner, inner_type, begin, stop in _field_spans(value, start, end):
            if inner != number:
                continue
            if inner_type != 2 or (stop - begin) % dtype.itemsize:  # unpacked values: leave them to protobuf
                return None
            parts.append(np.frombuffer(value, dtype=dtype, count=(stop - begin) // dtype.itemsize, offset=begin))
    native = dtype.newbyteorder("=")
    if not parts:
        return np.zeros(0, native)
    # a copy: the result must be writeable and must not keep the record's bytes alive
    return np.concatenate(parts).astype(native, copy=False) if len(parts) > 1 else parts[0].astype(native)


def parse_blob(value: bytes) -> pb.BlobProto:
    proto = pb.BlobProto()
    try:
        proto.ParseFromString(value)
    except DecodeError:
        raise ValueError("is not a serialized BlobProto (the DB is corrupt)") from None
    return proto


def _unreadable(proto: pb.BlobProto) -> str | None:
    """Why a blob cannot be read, or None."""
    if proto.type == STRING_TYPE or proto.type in BLOB_TYPES:
        return None
    if proto.type != TENSOR_TYPE:
        kind = proto.type or ("QTensor" if proto.HasField("qtensor") else "untyped")
        return f"is a {kind} blob; rnn2jax reads Tensor and std::string blobs only"
    if proto.HasField("content_num_chunks"):
        return "is a Tensor blob split by content_num_chunks, which Caffe2's own tensor serializer never writes"
    tensor = proto.tensor
    if not tensor.HasField("data_type"):
        return "has a tensor of a data type this version of caffe2.proto does not know"
    if tensor.data_type not in DATA_TYPES and tensor.data_type not in (pb.TensorProto.STRING, pb.TensorProto.UNDEFINED):
        return f"has a tensor of data_type {data_type_name(tensor.data_type)}, which rnn2jax cannot read"
    return None


def tensor_header(proto: pb.BlobProto) -> tuple[tuple[int, ...], np.dtype, int, int]:
    """dims, dtype and the segment [begin, end) of a Tensor chunk, checked; ValueError when unreadable."""
    reason = _unreadable(proto)
    if reason:
        raise ValueError(reason)
    tensor = proto.tensor
    dims = tuple(int(d) for d in tensor.dims)
    if any(d < 0 for d in dims):
        raise ValueError(f"has negative dims {list(dims)}")
    numel = math.prod(dims)
    if tensor.data_type == pb.TensorProto.UNDEFINED:
        if numel:
            raise ValueError("has a tensor of data_type UNDEFINED with values")
        # Caffe2 reads an empty tensor of no type as float, shape (0,) (TensorDeserializer::Deserialize)
        return (0,), np.dtype(np.float32), 0, 0
    dtype = np.dtype(object) if tensor.data_type == pb.TensorProto.STRING else DATA_TYPES[tensor.data_type]
    begin, end = (tensor.segment.begin, tensor.segment.end) if tensor.HasField("segment") else (0, numel)
    if not 0 <= begin <= end <= numel:
        raise ValueError(f"has segment [{begin}, {end}) outside its {numel} elements (dims {list(dims)})")
    return dims, dtype, begin, end


@dataclass
class _Partial:
    """A tensor being assembled from its chunks."""

    array: np.ndarray  # flat
    dims: tuple[int, ...]
    segments: list[tuple[int, int, str]] = field(default_factory=list)  # begin, end, key

    def missing(self) -> str | None:
        """What is wrong with the coverage of the segments, or None when they cover the tensor once."""
        position = 0
        for begin, end, key in sorted(self.segments):
            if begin < position:
                return f"chunk '{key}' [{begin}, {end}) overlaps another chunk"
            if begin > position:
                return f"elements [{position}, {begin}) of {self.array.size} are in no chunk (missing chunks)"
            position = end
        if position < self.array.size:
            return f"elements [{position}, {self.array.size}) of {self.array.size} are in no chunk (missing chunks)"
        return None


class BlobAssembler:
    """Collects the records of a DB into whole blobs, one record at a time, keeping only the blobs in
    `names` (every blob when None). `where` names the DB in messages (budget refusals)."""

    def __init__(self, where: str, names: frozenset[str] | None = None):
        self.where = where
        self.names = names
        self.blobs: dict[str, Blob] = {}
        self.partial: dict[str, _Partial] = {}
        self.keys: set[bytes] = set()
        self.order: dict[str, None] = {}  # blob names in the order the DB first shows them

    def wants(self, key: bytes) -> bool:
        return self.names is None or blob_name(key) in self.names

    def add(self, key: bytes, value: bytes) -> None:
        """Take one record. Raises ValueError (saying what is wrong with it) for what cannot be read."""
        if key in self.keys:
            raise ValueError("appears twice in the DB")
        self.keys.add(key)
        name = blob_name(key)
        self.order.setdefault(name)
        proto = parse_blob(value)
        if proto.type == STRING_TYPE and not proto.HasField("content_num_chunks"):
            if name in self.blobs or name in self.partial:
                raise ValueError("is a second record for the same blob")
            self.blobs[name] = bytes(proto.content)
            return
        if proto.type in BLOB_TYPES:
            if name in self.blobs or name in self.partial:
                raise ValueError("is a second record for the same blob")
            self.blobs[name] = BLOB_TYPES[proto.type].deserialize(proto)
            return
        dims, dtype, begin, end = tensor_header(proto)
        undefined = proto.tensor.data_type == pb.TensorProto.UNDEFINED
        values = np.zeros(0, dtype) if undefined else packed_values(value, proto.tensor)
        if values is None:
            values = tensor_values(proto.tensor)
        if values.size != end - begin:
            raise ValueError(f"holds {values.size} values for its segment [{begin}, {end})")
        values = values.astype(dtype, copy=False)
        if name in self.blobs:
            raise ValueError("is a second record for a blob already complete")
        partial = self.partial.get(name)
        if partial is None:
            if begin == 0 and end == math.prod(dims):  # a whole tensor: no copy
                self.blobs[name] = values.reshape(dims)
                return
            check_array(self.where, name, dims, dtype)
            partial = self.partial[name] = _Partial(np.empty(math.prod(dims), dtype=dtype), dims)
        elif partial.dims != dims or partial.array.dtype != dtype:
            raise ValueError(
                f"is a chunk of dims {list(dims)} {dtype}, but an earlier chunk of this blob has "
                f"{list(partial.dims)} {partial.array.dtype}"
            )
        partial.array[begin:end] = values
        partial.segments.append((begin, end, key.decode("utf-8", errors="replace")))

    def finish(self) -> tuple[dict[str, Blob], dict[str, str]]:
        """The complete blobs, and for each incomplete one why (missing or overlapping chunks)."""
        problems = {}
        for name, partial in self.partial.items():
            problem = partial.missing()
            if problem:
                problems[name] = problem
            else:
                self.blobs[name] = partial.array.reshape(partial.dims)
        self.partial.clear()
        return {n: self.blobs[n] for n in self.order if n in self.blobs}, problems


@dataclass(frozen=True)
class BlobInfo:
    """What `rnn2jax inspect` shows of a blob: its type, shape, dtype, number of records and bytes."""

    name: str
    kind: str  # "Tensor", "std::string", or the C++ type of a blob rnn2jax cannot read
    shape: tuple[int, ...] | None
    dtype: str | None
    chunks: int
    nbytes: int  # serialized size in the DB


def describe_record(key: bytes, value: bytes) -> BlobInfo:
    """A record's blob name, type, shape and dtype, without decoding its values."""
    proto = parse_blob(value)
    name = blob_name(key)
    if proto.type == STRING_TYPE:
        return BlobInfo(name, STRING_TYPE, None, None, 1, len(value))
    if proto.type in BLOB_TYPES or _unreadable(proto):
        return BlobInfo(name, proto.type or "untyped", None, None, 1, len(value))
    dims, dtype, _, _ = tensor_header(proto)
    kind = "string" if dtype.kind == "O" else str(dtype)
    return BlobInfo(name, TENSOR_TYPE, dims, kind, 1, len(value))
