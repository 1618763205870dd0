"""Run a model that `rnn2jax export` wrote, with nothing but jax and numpy.

The file is a first line `rnn2jax-exported 1`, a one-line JSON header (input names, shapes and dtypes,
output names), then the bytes of a serialized `jax.export.Exported` (StableHLO). The parameters are
baked into the StableHLO as constants, so the model needs only its inputs. This module must not import
rnn2jax's Caffe2 importer (protobuf, netdef, ops): a serving process loads only this.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .errors import InputTypeError, MissingBlobError, ParseError, ShapeError
from .files import atomic_write

MAGIC = b"rnn2jax-exported 1\n"


def write_exported(path: str | os.PathLike, header: Mapping[str, Any], serialized: bytes) -> None:
    """Write the file format above (used by `rnn2jax export`), all or nothing."""
    with atomic_write(path) as file:
        file.write(MAGIC)
        file.write(json.dumps(header, ensure_ascii=True).encode("ascii") + b"\n")
        file.write(serialized)


class ExportedNet:
    """A loaded export: call it with inputs by name, get a dict of outputs by name."""

    def __init__(self, header: Mapping[str, Any], exported: jax.export.Exported, where: str = "exported net"):
        self.header = dict(header)
        self.inputs: tuple[dict[str, Any], ...] = tuple(header["inputs"])
        self.input_names: tuple[str, ...] = tuple(spec["name"] for spec in self.inputs)
        self.output_names: tuple[str, ...] = tuple(header["outputs"])
        self.exported = exported
        self.where = where

    def __call__(self, inputs: Mapping[str, Any] | None = None, /, **named: Any) -> dict[str, jax.Array]:
        if inputs is not None and not isinstance(inputs, Mapping):
            raise InputTypeError(
                f"{self.where}: inputs must be a mapping of blob name -> array, got a {type(inputs).__name__}"
            )
        given = {**(inputs or {}), **named}
        unknown = [n for n in given if n not in self.input_names]
        missing = [n for n in self.input_names if n not in given]
        if unknown or missing:
            raise MissingBlobError(
                f"{self.where} takes inputs {', '.join(self.input_names) or '(none)'}; "
                f"unknown: {', '.join(map(str, unknown)) or '-'}; missing: {', '.join(missing) or '-'}"
            )
        args = []
        for spec in self.inputs:
            name = spec["name"]
            try:
                value = np.asarray(given[name]).astype(spec["dtype"], copy=False)
            except (TypeError, ValueError) as error:
                raise InputTypeError(
                    f"{self.where}: input '{name}' must be an array of {spec['dtype']}: {error}"
                ) from None
            if tuple(value.shape) != tuple(spec["shape"]):
                raise ShapeError(
                    f"{self.where}: input '{name}' has shape {list(value.shape)}; the export expects {spec['shape']}"
                )
            args.append(value)
        results = self.exported.call(*args)
        return dict(zip(self.output_names, results, strict=True))

    def __repr__(self) -> str:
        return f"ExportedNet(inputs={list(self.input_names)}, outputs={list(self.output_names)})"


def load_exported(path: str | os.PathLike) -> ExportedNet:
    """Read a file written by `rnn2jax export`."""
    where = f"export '{os.fspath(path)}'"
    try:
        with open(path, "rb") as file:
            magic = file.readline()
            if magic != MAGIC:
                raise ParseError(f"{where} is not an rnn2jax export (first line {magic[:40]!r})")
            header = json.loads(file.readline())
            body = file.read()
    except OSError as error:
        raise ParseError(f"cannot read {where}: {error.strerror or error}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ParseError(f"{where}: its header is not JSON: {error}") from None
    try:
        exported = jax.export.deserialize(bytearray(body))
        return ExportedNet(header, exported, where)
    except ImportError:
        raise
    except Exception as error:  # flatbuffers and jax raise many kinds on a damaged body
        raise ParseError(f"{where}: damaged ({type(error).__name__}: {error})") from None
