"""Run a model that `rnn2jax export` wrote, with nothing but jax and numpy.

The file is exactly `jax.export.Exported.serialize()`: any JAX program runs it with
`jax.export.deserialize(bytearray(data)).call(inputs)` (or `.call(params, inputs)` for an export with
`--params-as-input`), inputs and outputs being dicts keyed by blob name. `load_exported` is a convenience
over that: it checks the inputs by name (dtype, rank, sizes, symbolic dims) before the call, so a wrong
array is named instead of failing inside XLA. Files written before (first line `rnn2jax-exported 1`, a
JSON header, then an Exported taking positional inputs) still load.

This module must not import rnn2jax's Caffe2 importer (protobuf, netdef, ops): a serving process loads
only this.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..errors import InputTypeError, MissingBlobError, ParseError, ShapeError
from ..ir.dtypes import caffe2_dtypes

LEGACY_MAGIC = b"rnn2jax-exported 1\n"
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class ExportedNet:
    """A loaded export: call it with inputs by name (a mapping, or keyword arguments for names that are
    identifiers), get a dict of outputs by name. An export with `--params-as-input` takes the parameters
    first: `model(params, inputs)`.

    `inputs` and `params` (None when the parameters are baked in) map names to abstract arrays, whose
    dims are ints or symbols (`T`, `N`): a symbol is any size >= 1, the same wherever it appears."""

    def __init__(self, exported: jax.export.Exported, where: str, legacy: Mapping[str, Any] | None = None):
        self.exported = exported
        self.where = where
        self.legacy = legacy is not None
        self.platforms: tuple[str, ...] = tuple(exported.platforms)
        self.params: dict[str, Any] | None
        if legacy is not None:
            names = [spec["name"] for spec in legacy["inputs"]]
            self.params, self.inputs = None, dict(zip(names, exported.in_avals, strict=True))
            self.output_names: tuple[str, ...] = tuple(legacy["outputs"])
        else:
            args = _named_args(exported, where)
            self.params, self.inputs = (None, args[0]) if len(args) == 1 else args
            outputs = jax.tree_util.tree_unflatten(exported.out_tree, exported.out_avals)
            if not _is_named(outputs):
                raise ParseError(f"{where}: its function does not return a dict of named outputs")
            self.output_names = tuple(outputs)
        self.input_names: tuple[str, ...] = tuple(self.inputs)

    def __call__(self, *args: Any, **named: Any) -> dict[str, jax.Array]:
        with caffe2_dtypes():  # an export's int64/float64 arguments and results keep their dtypes
            return self._call(args, named)

    def _call(self, args: tuple[Any, ...], named: dict[str, Any]) -> dict[str, jax.Array]:
        takes = 2 if self.params is not None else 1
        if len(args) > takes or (self.params is not None and not args):
            usage = "model(params, inputs)" if self.params is not None else "model(inputs) or model(**inputs)"
            raise InputTypeError(f"{self.where}: call it as {usage}; got {len(args)} positional argument(s)")
        inputs = args[takes - 1] if len(args) == takes else None
        if inputs is not None and not isinstance(inputs, Mapping):
            raise InputTypeError(
                f"{self.where}: inputs must be a mapping of blob name -> array, got a {type(inputs).__name__}"
            )
        sizes: dict[str, tuple[int, str]] = {}  # symbol -> (size, the blob it was read from)
        given = self._checked("input", self.inputs, {**(inputs or {}), **named}, sizes)
        try:
            if self.legacy:
                results = self.exported.call(*(given[n] for n in self.input_names))
                return dict(zip(self.output_names, results, strict=True))
            if self.params is None:
                return dict(self.exported.call(given))
            params = self._checked("parameter", self.params, args[0], sizes)
            return dict(self.exported.call(params, given))
        except ValueError as error:  # jax's own check of shapes (dims that are expressions of symbols)
            raise ShapeError(f"{self.where}: {str(error).strip().splitlines()[0]}") from None

    def _checked(
        self, kind: str, specs: Mapping[str, Any], given: Any, sizes: dict[str, tuple[int, str]]
    ) -> dict[str, Any]:
        """`given` as the arrays the export takes, or an error naming the blob that does not fit."""
        if not isinstance(given, Mapping):
            raise InputTypeError(
                f"{self.where}: {kind}s must be a mapping of blob name -> array, got a {type(given).__name__}"
            )
        unknown = [n for n in given if n not in specs]
        missing = [n for n in specs if n not in given]
        if unknown or missing:
            raise MissingBlobError(
                f"{self.where} takes {kind}s {', '.join(specs) or '(none)'}; "
                f"unknown: {', '.join(map(str, unknown)) or '-'}; missing: {', '.join(missing) or '-'}"
            )
        return {name: self._fit(kind, name, spec, given[name], sizes) for name, spec in specs.items()}

    def _fit(self, kind: str, name: str, spec: Any, value: Any, sizes: dict[str, tuple[int, str]]) -> Any:
        want = np.dtype(spec.dtype)
        if not isinstance(value, jax.Array):
            try:
                value = np.asarray(value)
            except (TypeError, ValueError) as error:
                raise InputTypeError(f"{self.where}: {kind} '{name}' must be an array of {want}: {error}") from None
        if value.dtype != want:
            value = self._converted(kind, name, value, want)
        expected = "[" + ", ".join(str(d) for d in spec.shape) + "]"
        if value.ndim != len(spec.shape):
            raise ShapeError(
                f"{self.where}: {kind} '{name}' has shape {list(value.shape)}; the export expects {expected}"
            )
        for axis, (dim, size) in enumerate(zip(spec.shape, value.shape, strict=True)):
            if isinstance(dim, int):
                if dim != size:
                    raise ShapeError(
                        f"{self.where}: {kind} '{name}' has shape {list(value.shape)}; the export expects {expected}"
                    )
                continue
            symbol = str(dim)
            if not _SYMBOL.match(symbol):
                continue  # an expression of symbols: jax checks it when called
            if size < 1:
                raise ShapeError(
                    f"{self.where}: {kind} '{name}' has {symbol} = {size} (dim {axis}); a symbolic dim is at "
                    f"least 1. For {symbol} = 0, use an export with that dim fixed to 0 (see docs/serving.md)"
                )
            seen = sizes.setdefault(symbol, (size, name))
            if seen[0] != size:
                raise ShapeError(
                    f"{self.where}: {kind} '{name}' has {symbol} = {size} (dim {axis}), but '{seen[1]}' has "
                    f"{symbol} = {seen[0]}; the export expects {expected}"
                )
        return value

    def _converted(self, kind: str, name: str, value: Any, want: np.dtype) -> Any:
        """`value` as `want` when every element keeps its value exactly (int32 data for an int64 input, say);
        otherwise an error: a narrowing conversion (float64 to float32, a large int64) would lose values."""
        refusal = InputTypeError(f"{self.where}: {kind} '{name}' must be an array of {want}, got {value.dtype}")
        if not np.can_cast(value.dtype, want, casting="same_kind"):
            raise refusal
        converted = np.asarray(value).astype(want)
        with np.errstate(invalid="ignore"):
            exact = np.array_equal(converted.astype(value.dtype), np.asarray(value), equal_nan=value.dtype.kind == "f")
        if not exact:
            raise InputTypeError(
                f"{refusal}, whose values {want} cannot all hold exactly; convert it yourself if the loss is meant"
            )
        return converted

    def __repr__(self) -> str:
        params = "" if self.params is None else f"params={len(self.params)}, "
        return (
            f"ExportedNet({params}inputs={list(self.input_names)}, outputs={list(self.output_names)}, "
            f"platforms={list(self.platforms)})"
        )


def _is_named(tree: Any) -> bool:
    return isinstance(tree, dict) and all(isinstance(k, str) for k in tree)


def _named_args(exported: jax.export.Exported, where: str) -> tuple[dict[str, Any], ...]:
    """The exported function's arguments as dicts of blob name -> abstract array: (inputs,) or
    (params, inputs)."""
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, exported.in_avals)
    if kwargs or len(args) not in (1, 2) or not all(_is_named(a) for a in args):
        raise ParseError(
            f"{where}: its function does not take a dict of named inputs (or params and inputs); "
            "call it with jax.export directly"
        )
    return tuple(args)


def load_exported(path: str | os.PathLike) -> ExportedNet:
    """Read a file written by `rnn2jax export` (either format)."""
    where = f"export '{os.fspath(path)}'"
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise ParseError(f"cannot read {where}: {error.strerror or error}") from None
    legacy = None
    if data.startswith(LEGACY_MAGIC):
        header_line, _, data = data[len(LEGACY_MAGIC) :].partition(b"\n")
        try:
            legacy = json.loads(header_line)
        except (ValueError, UnicodeDecodeError) as error:
            raise ParseError(f"{where}: its header is not JSON: {error}") from None
    try:
        exported = jax.export.deserialize(bytearray(data))
        return ExportedNet(exported, where, legacy)
    except ImportError:
        raise
    except ParseError:
        raise
    except Exception as error:  # flatbuffers and jax raise many kinds on damaged bytes
        raise ParseError(
            f"{where}: not a serialized jax.export artifact, or damaged ({type(error).__name__}: {error})"
        ) from None
