"""Bytes and text to protobuf messages: format detection and parsing, with errors that say where.

Caffe2 wrote nets both as binary protobuf and as text format, under any file name, so the format is
decided by content. Text written by hand carries `#` comments, tabs and UTF-8 (the protobuf text
parser takes all three); old text nets name DeviceOption's field 2 `cuda_gpu_id`, its name before
Caffe2 renamed it `device_id` (same number), so that spelling is accepted too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from google.protobuf import message as _message
from google.protobuf import text_format

from ..errors import ParseError
from ..proto import caffe2_pb2 as pb

_PLAN_FIELD = re.compile(r"(?m)^\s*(?:execution_step|network)\s*\{")
_OLD_DEVICE_ID = re.compile(r"\bcuda_gpu_id\b")

# Step nets may nest (a RecurrentNetwork inside a step net), but no real net nests deeply: deeper than
# this is refused with a ParseError before the recursive parsers run (deep enough text would otherwise
# exhaust Python's stack). Each level of step net is three levels of messages (op { arg { n { ... }}}).
MAX_NET_NESTING = 64
_MAX_MESSAGE_DEPTH = 3 * MAX_NET_NESTING + 4  # plus the innermost op's own messages (args, tensors)
_TEXT_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*|[{}<>]')


def check_text_depth(text: str, where: str) -> None:
    """Refuse text format whose messages nest deeper than step nets nested MAX_NET_NESTING deep."""
    depth = deepest = 0
    for match in _TEXT_TOKENS.finditer(text):
        token = match.group()
        if token in "{<":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "}>":
            depth -= 1
    if deepest > _MAX_MESSAGE_DEPTH:
        raise ParseError(
            f"{where}: messages nest {deepest} deep; rnn2jax reads step nets nested at most "
            f"{MAX_NET_NESTING} deep ({_MAX_MESSAGE_DEPTH} levels of messages)"
        )


def looks_like_text(data: bytes) -> bool:
    """True for UTF-8 without control characters other than white space; binary protobuf always
    holds tag and length bytes below 0x20."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ch >= " " or ch in "\t\n\r\f\v" for ch in text)


def parse_text(data: bytes | str, kind: type[_message.Message], where: str) -> _message.Message:
    """Parse text format into a message of type `kind`; a syntax error becomes a `ParseError`
    naming `where` and the line and column protobuf reports."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ParseError(f"{where}: text-format {kind.__name__} is not valid UTF-8: {error}") from None
    data = _OLD_DEVICE_ID.sub("device_id", data)
    check_text_depth(data, where)
    message = kind()
    try:
        text_format.Parse(data, message, allow_unknown_extension=False)
    except (text_format.ParseError, UnicodeDecodeError, ValueError, TypeError) as error:
        raise ParseError(f"{where}: invalid text-format {kind.__name__}: {error}") from None
    return message


def parse_binary(data: bytes, kind: type[_message.Message], where: str) -> _message.Message:
    message = kind()
    try:
        message.ParseFromString(data)
    except (_message.DecodeError, RuntimeError, ValueError, TypeError) as error:
        raise ParseError(f"{where}: not a binary {kind.__name__} ({len(data)} bytes): {error}") from None
    return message


def _ops_typed(net: pb.NetDef) -> bool:
    return all(op.type for op in net.op)


def parse_message(data: bytes, where: str) -> pb.NetDef | pb.PlanDef:
    """A NetDef or PlanDef from bytes in either format, deciding both the format and the message."""
    if looks_like_text(data):
        text = data.decode("utf-8")
        order = (pb.PlanDef, pb.NetDef) if _PLAN_FIELD.search(text) else (pb.NetDef, pb.PlanDef)
        first_error: ParseError | None = None
        for kind in order:
            try:
                return parse_text(text, kind, where)
            except ParseError as error:
                first_error = first_error or error
        # Text that is neither may still be a (rare) all-printable binary message.
        try:
            return _parse_binary_either(data, where)
        except ParseError:
            raise first_error from None
    return _parse_binary_either(data, where)


def _parse_binary_either(data: bytes, where: str) -> pb.NetDef | pb.PlanDef:
    """Binary NetDef and PlanDef share field numbers 1 and 2, so both parse; a PlanDef read as a NetDef
    has "ops" without types (they are really nets), which tells them apart."""
    errors = []
    try:
        net = parse_binary(data, pb.NetDef, where)
        if _ops_typed(net):
            return net
    except ParseError as error:
        errors.append(error)
        net = None
    try:
        plan = parse_binary(data, pb.PlanDef, where)
        if (plan.network or plan.execution_step) and all(_ops_typed(n) for n in plan.network):
            return plan
    except ParseError as error:
        errors.append(error)
    if net is not None:
        return net  # a NetDef with an untyped op: let the checker name that op
    raise errors[0]


def read_message(source: Any, what: str = "net") -> pb.NetDef | pb.PlanDef:
    """A NetDef or PlanDef message from a path, bytes, text or a message."""
    if isinstance(source, pb.NetDef | pb.PlanDef):
        return source
    if hasattr(source, "SerializeToString") and hasattr(source, "DESCRIPTOR"):
        return parse_message(source.SerializeToString(), f"{what} message")
    if isinstance(source, bytes | bytearray):
        return parse_message(bytes(source), what)
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if isinstance(source, str) and ("\n" in source or "{" in source):
            return parse_message(source.encode("utf-8"), f"{what} text")
        try:
            data = path.read_bytes()
        except OSError as error:
            raise ParseError(f"cannot read {what} file '{path}': {error.strerror or error}") from None
        return parse_message(data, f"file '{path}'")
    raise ParseError(f"cannot read a {what} from a {type(source).__name__}: give a path, bytes or a message")
