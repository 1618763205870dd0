"""`TensorProto` data fields <-> NumPy, shared by the net importer (tensor arguments) and the storage layer
(serialized blobs), so that both read every data type the way Caffe2's `blob_serialization.cc` does.

Errors are plain `ValueError`s saying what is wrong with the tensor; each caller names the place (an op
argument, a DB and blob) and raises its own `Rnn2JaxError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from . import caffe2_pb2 as pb

# TensorProto.DataType -> NumPy dtype (STRING is an object array of bytes, handled apart).
DATA_TYPES: Mapping[int, np.dtype] = MappingProxyType(
    {
        pb.TensorProto.FLOAT: np.dtype(np.float32),
        pb.TensorProto.INT32: np.dtype(np.int32),
        pb.TensorProto.BYTE: np.dtype(np.uint8),
        pb.TensorProto.BOOL: np.dtype(np.bool_),
        pb.TensorProto.UINT8: np.dtype(np.uint8),
        pb.TensorProto.INT8: np.dtype(np.int8),
        pb.TensorProto.UINT16: np.dtype(np.uint16),
        pb.TensorProto.INT16: np.dtype(np.int16),
        pb.TensorProto.INT64: np.dtype(np.int64),
        pb.TensorProto.FLOAT16: np.dtype(np.float16),
        pb.TensorProto.DOUBLE: np.dtype(np.float64),
    }
)

# NumPy dtype -> the DataType Caffe2 writes for it (uint8 is UINT8: BYTE is legacy, read only).
DATA_TYPE_OF: Mapping[np.dtype, int] = MappingProxyType(
    {dtype: code for code, dtype in DATA_TYPES.items() if code != pb.TensorProto.BYTE}
)

# Types Caffe2 stores in int32_data (one value per int32), or in byte_data when its
# --caffe2_serialize_using_bytes_as_holder / --caffe2_serialize_fp16_as_bytes flags are on.
_INT32_HELD = frozenset(
    {
        pb.TensorProto.BOOL,
        pb.TensorProto.UINT8,
        pb.TensorProto.INT8,
        pb.TensorProto.UINT16,
        pb.TensorProto.INT16,
        pb.TensorProto.FLOAT16,
    }
)

_REPEATED = {
    pb.TensorProto.FLOAT: "float_data",
    pb.TensorProto.DOUBLE: "double_data",
    pb.TensorProto.INT32: "int32_data",
    pb.TensorProto.INT64: "int64_data",
}


def data_type_name(data_type: int) -> str:
    """FLOAT for 1; the number itself when the enum does not know it."""
    if data_type in pb.TensorProto.DataType.values():
        return pb.TensorProto.DataType.Name(data_type)
    return str(data_type)


def _field(values, dtype: np.dtype) -> np.ndarray:
    return np.fromiter(values, dtype=dtype, count=len(values))


def tensor_values(proto: pb.TensorProto) -> np.ndarray:
    """The flat values of `proto`, from whichever field its data type and data format use.

    The count is not checked here: a whole tensor holds prod(dims) values, a chunk `segment.end -
    segment.begin`. Raises ValueError for a data type or format that holds no readable values."""
    data_type = proto.data_type
    if data_type == pb.TensorProto.STRING:
        return np.array(list(proto.string_data), dtype=object)
    if data_type not in DATA_TYPES:
        raise ValueError(f"has unsupported data_type {data_type_name(data_type)}")
    dtype = DATA_TYPES[data_type]
    if proto.data_format == pb.TensorProto.FMT_BFLOAT16:
        if data_type != pb.TensorProto.FLOAT:
            raise ValueError(f"has data_format FMT_BFLOAT16 for data_type {data_type_name(data_type)}")
        if len(proto.raw_data) % 2:
            raise ValueError(f"has {len(proto.raw_data)} bytes of bfloat16 raw_data, an odd number")
        high = np.frombuffer(proto.raw_data, dtype="<u2").astype(np.uint32) << 16
        return high.view(np.float32)
    if proto.data_format != pb.TensorProto.FMT_PROTOBUF:
        raise ValueError(f"has unsupported data_format {proto.data_format}")
    if proto.raw_data:
        raw = proto.raw_data
    elif (data_type in _INT32_HELD or data_type == pb.TensorProto.BYTE) and proto.HasField("byte_data"):
        raw = proto.byte_data
    else:
        raw = None
    if raw is not None:
        if len(raw) % dtype.itemsize:
            raise ValueError(f"has {len(raw)} data bytes, not a whole number of {dtype} values")
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
    if data_type in _REPEATED:
        return _field(getattr(proto, _REPEATED[data_type]), dtype)
    held = _field(proto.int32_data, np.dtype(np.int32))
    if data_type == pb.TensorProto.FLOAT16:  # uint16 bit patterns
        return held.astype(np.uint16).view(np.float16)
    if data_type == pb.TensorProto.BOOL:
        return held != 0
    return held.astype(dtype)
