"""`load()`: any form a user may hold a Caffe2 net in, to a `Net` (or a `Plan` of nets).

Loading never executes anything: it parses protobuf and decodes values, nothing more.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import ParseError
from ..proto import caffe2_pb2 as pb
from .netdef import Net, Plan, decode_net, decode_plan
from .wire import parse_message

_PATH_SUFFIXES = (".pb", ".pbtxt", ".prototxt", ".txt", ".bin", ".netdef")


def load(source: Any) -> Net | Plan:
    """Load a Caffe2 net.

    `source` may be a path (binary or text format, told apart by content), `bytes`, a text-format
    `str`, a `Net`/`Plan`, one of rnn2jax's `caffe2_pb2` messages, or any protobuf NetDef/PlanDef
    message (for example an old `caffe2.proto.caffe2_pb2.NetDef`): it is re-read from its bytes.
    A PlanDef gives a `Plan`, whose nets are reachable by name.
    """
    if isinstance(source, Net | Plan):
        return source
    if isinstance(source, pb.NetDef):
        return decode_net(source)
    if isinstance(source, pb.PlanDef):
        return decode_plan(source)
    if hasattr(source, "SerializeToString") and hasattr(source, "DESCRIPTOR"):
        return _from_foreign_message(source)
    if isinstance(source, bytes | bytearray | memoryview):
        return from_bytes(bytes(source), "bytes")
    if isinstance(source, os.PathLike):
        return _from_path(Path(source))
    if isinstance(source, str):
        if _is_path(source):
            return _from_path(Path(source))
        return from_bytes(source.encode("utf-8"), "text")
    raise ParseError(
        f"cannot load a {type(source).__name__}: give a path, bytes, text, or a NetDef/PlanDef message"
    )


def from_bytes(data: bytes, where: str) -> Net | Plan:
    message = parse_message(data, where)
    if isinstance(message, pb.PlanDef):
        return decode_plan(message)
    return decode_net(message)


def _is_path(text: str) -> bool:
    """A str names a file when it exists, or when it is one line ending in a net file suffix
    (so a mistyped path says "no such file" rather than "invalid text format")."""
    if "\n" in text or "{" in text or len(text) > 4096:
        return False
    return os.path.exists(text) or text.endswith(_PATH_SUFFIXES)


def _from_path(path: Path) -> Net | Plan:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ParseError(f"cannot read net file '{path}': {error.strerror or error}") from None
    return from_bytes(data, f"file '{path}'")


def _from_foreign_message(message: Any) -> Net | Plan:
    kind = message.DESCRIPTOR.name
    if kind not in ("NetDef", "PlanDef"):
        raise ParseError(
            f"cannot load a protobuf {message.DESCRIPTOR.full_name}: expected a NetDef or PlanDef"
        )
    target = pb.NetDef() if kind == "NetDef" else pb.PlanDef()
    try:
        target.ParseFromString(message.SerializeToString())
    except Exception as error:  # a foreign message's own serializer may raise anything
        raise ParseError(
            f"cannot re-read {message.DESCRIPTOR.full_name} as a Caffe2 {kind}: {error}"
        ) from None
    return load(target)
