"""Build recipes (the JSON language of `Caffe2Oracle.build`) run on rnn2jax's Caffe2 API.

A recipe is a list of calls, `{"fn": "rnn_cell.LSTM", "args": [...], "kwargs": {...}, "scope": ...}`, whose
values may name a model (`$model`), a blob (`$blob`), an earlier result (`$ref`), a nested call (`$call`),
a tuple (`$tuple`), an API object (`$get`) or an array handed to the recipe (`$array`). The oracle's worker
runs the same recipe on real Caffe2, so the two builds can be compared.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rnn2jax.caffe2.python.core import BlobReference
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.scope import NameScope


def api(path: str) -> Any:
    """`rnn_cell.LSTM` -> rnn2jax.caffe2.python.rnn_cell.LSTM: the recipe names Caffe2's API, which rnn2jax's is."""
    module, *attributes = path.split(".")
    value: Any = importlib.import_module(f"rnn2jax.caffe2.python.{module}")
    for attribute in attributes:
        value = getattr(value, attribute)
    return value


class Recipe:
    """Runs recipe calls, keeping their results (for `$ref`) and the models they made (for `$model`)."""

    def __init__(self, arrays: Sequence[np.ndarray] = ()):
        self.arrays = arrays
        self.models: dict[str, ModelHelper] = {}
        self.results: list[Any] = []

    def value(self, spec: Any) -> Any:
        if isinstance(spec, list):
            return [self.value(v) for v in spec]
        if not isinstance(spec, dict):
            return spec
        if len(spec) == 1:
            ((key, arg),) = spec.items()
            if key == "$model":
                return self.models[arg]
            if key == "$blob":
                return BlobReference(arg)
            if key == "$ref":
                value = self.results[arg[0]]
                for part in arg[1:]:
                    value = getattr(value, part) if isinstance(part, str) else value[part]
                return value
            if key == "$call":
                return self.call(arg)
            if key == "$tuple":
                return tuple(self.value(v) for v in arg)
            if key == "$get":
                return api(arg)
            if key == "$array":
                return self.arrays[arg]
        return {k: self.value(v) for k, v in spec.items()}

    def call(self, spec: Mapping[str, Any]) -> Any:
        target = spec["fn"]
        fn = api(target) if isinstance(target, str) else self.value(target)
        if "method" in spec:
            fn = getattr(fn, spec["method"])
        args, kwargs = self.value(spec.get("args", [])), self.value(spec.get("kwargs", {}))
        with NameScope(spec.get("scope") or None):
            return fn(*args, **kwargs)

    def run(self, calls: Sequence[Mapping[str, Any]]) -> list[Any]:
        for spec in calls:
            self.results.append(self.call(spec))
        return self.results
