"""Caffe2's `predictor.serde`: protobuf messages to bytes and back."""

from __future__ import annotations

from typing import Any

from ....ir.wire import parse_binary


def serialize_protobuf_struct(protobuf_struct: Any) -> bytes:
    return protobuf_struct.SerializeToString()


def deserialize_protobuf_struct(serialized_protobuf: bytes, struct_type: type) -> Any:
    return parse_binary(serialized_protobuf, struct_type, "deserialize_protobuf_struct")
