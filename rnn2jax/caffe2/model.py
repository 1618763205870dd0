"""`Net` and `ModelHelper`: the parts of Caffe2's `core.Net`, `scope` and `model_helper` that decide names.

The blob names Caffe2's RNN builders produced depend on three mechanisms reproduced here:

* name scopes: a plain `str` blob name is prefixed with the current `NameScope` when an op is created,
  while a `BlobReference` (a name that was already resolved) is used as is;
* nets auto-register every op input that no earlier op produced as an external input, which is how a
  step net's parameters, sequence lengths etc. become "references" of the RecurrentNetwork op;
* net names are made unique by a process-wide counter (`lstm`, `lstm_1`, ...), exactly as
  `core.Net._get_next_net_name` did; `reset_net_names()` restarts it (tests, reproducible builds).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ..proto import caffe2_pb2 as pb
from .core import create_operator

SEPARATOR = "/"


class BlobReference(str):
    """A blob name that is already resolved: ops use it verbatim, never re-prefixed by a name scope.

    Concatenating a string keeps it a `BlobReference`, as Caffe2's `BlobReference.__add__` did.
    """

    def __add__(self, other: str) -> BlobReference:
        return BlobReference(str.__add__(self, other))

    def __radd__(self, other: str) -> BlobReference:
        return BlobReference(other + str(self))

    def __repr__(self) -> str:
        return f"BlobReference({str.__repr__(self)})"


# ------------------------------------------------------------------------------------------------
# Name scopes (caffe2.python.scope.NameScope)

_scope = threading.local()


def current_name_scope() -> str:
    """The current name-scope prefix, '' or ending with '/'."""
    return getattr(_scope, "prefix", "")


@contextmanager
def name_scope(prefix: str | None, reset: bool = False) -> Iterator[None]:
    """Caffe2's `NameScope`: nest `prefix + '/'` (nothing for None or ''), or replace it with `reset`."""
    old = current_name_scope()
    prefix = prefix + SEPARATOR if prefix else ""
    _scope.prefix = prefix if reset else old + prefix
    try:
        yield
    finally:
        _scope.prefix = old


def scoped(name: str) -> BlobReference:
    """`core.ScopedBlobReference`: the name with the current scope prefixed."""
    return BlobReference(current_name_scope() + name)


def rectify(blobs: str | Iterable[str]) -> list[BlobReference]:
    """`core._RectifyInputOutput`: plain strings get the current scope, references stay as they are."""
    if isinstance(blobs, str):
        blobs = [blobs]
    return [b if isinstance(b, BlobReference) else scoped(b) for b in blobs]


# ------------------------------------------------------------------------------------------------
# Net names

_net_names_used: set[str] = set()


def unique_net_name(basename: str) -> str:
    """`core.Net._get_next_net_name`: `basename` if unused, else the first unused of `basename_1`,
    `basename_2`, ... (process-wide, like Caffe2; a name such as `lstm_1` taken by a net of that
    name pushes the second `lstm` on to `lstm_2`)."""
    name, index = basename, 1
    while name in _net_names_used:
        name = f"{basename}_{index}"
        index += 1
    _net_names_used.add(name)
    return name


def reset_net_names() -> None:
    """Forget the names handed out so far (Caffe2's `Net._reset_used_names`)."""
    _net_names_used.clear()


# ------------------------------------------------------------------------------------------------
# Net


class Net:
    """A `NetDef` under construction, with Caffe2's bookkeeping of external inputs.

    `net.FC([...], "out", axis=2)` adds an op like Caffe2's `net.FC(...)` did (any attribute starting
    with an upper-case letter is an op type); `net.add_op` is the explicit form.
    """

    def __init__(self, name_or_proto: str | pb.NetDef):
        if isinstance(name_or_proto, pb.NetDef):
            self.proto = pb.NetDef()
            self.proto.CopyFrom(name_or_proto)
            name = self.proto.name
        else:
            self.proto = pb.NetDef()
            name = name_or_proto
        self.proto.name = unique_net_name(name)
        self._next_blob_ids: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self.proto.name

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Net({self.name!r}, {len(self.proto.op)} ops)"

    def blob_is_defined(self, blob: str) -> bool:
        """True when an op of this net outputs `blob` or it is an external input."""
        name = str(blob)
        return name in self.proto.external_input or any(name in op.output for op in self.proto.op)

    def add_external_inputs(self, *blobs: str) -> list[BlobReference]:
        """`Net.AddExternalInput`: register names verbatim (no scoping); duplicates are an error."""
        names = [str(b) for b in blobs]
        for i, name in enumerate(names):
            if name in self.proto.external_input or name in names[:i]:
                raise ValueError(f"net '{self.name}' already contains an input named {name}")
        self.proto.external_input.extend(names)
        return [BlobReference(n) for n in names]

    def add_scoped_external_inputs(self, *names: str) -> list[BlobReference]:
        return self.add_external_inputs(*(scoped(n) for n in names))

    def add_external_outputs(self, *blobs: str) -> None:
        """`Net.AddExternalOutput`: every blob must be produced here or be an input; no deduplication."""
        for blob in blobs:
            if not self.blob_is_defined(blob):
                raise ValueError(f"{blob} is not defined in net '{self.name}'")
        self.proto.external_output.extend(str(b) for b in blobs)

    def next_name(self, prefix: str | None = None, output_id: int | None = None) -> str:
        """`Net.NextName`: `<net>/<prefix>` (or with `_2`, `_3`... if taken) for ops given no output."""
        if not prefix:
            index = self._next_blob_ids.get("", 0)
            self._next_blob_ids[""] = index + 1
            return f"{self.name}_blob_{index}"
        base = f"{self.name}/{prefix}"
        suffix = "" if output_id is None else f":{output_id}"
        name = base + suffix
        index = self._next_blob_ids.get(name, 2)
        key = name
        while self.blob_is_defined(scoped(name)):
            name = f"{base}_{index}{suffix}"
            index += 1
            self._next_blob_ids[key] = index
        return name

    def add_op(
        self,
        op_type: str,
        inputs: str | Iterable[str],
        outputs: str | Iterable[str] | int | None = None,
        **kwargs: Any,
    ) -> BlobReference | tuple[BlobReference, ...] | None:
        """`Net._CreateAndAddToSelf`: undefined inputs become external inputs, then the op is added.

        Returns the output reference (one output), a tuple of them (several), or None (no output).
        `engine` and `device_option` are op fields, every other keyword is an argument (in order).
        """
        inputs = rectify(inputs)
        for blob in inputs:
            if not self.blob_is_defined(blob):
                self.add_external_inputs(blob)
        if outputs is None:
            outputs = self.next_name(op_type)
        elif isinstance(outputs, int):
            outputs = [self.next_name(op_type, i) for i in range(outputs)]
        outputs = rectify(outputs)
        self.proto.op.append(make_op(op_type, inputs, outputs, **kwargs))
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __getattr__(self, op_type: str) -> Any:
        if not op_type[:1].isupper():
            raise AttributeError(op_type)
        return lambda inputs, outputs=None, **kwargs: self.add_op(op_type, inputs, outputs, **kwargs)


def make_op(
    op_type: str,
    inputs: Iterable[str],
    outputs: Iterable[str],
    *,
    engine: str | None = None,
    device_option: pb.DeviceOption | None = None,
    **kwargs: Any,
) -> pb.OperatorDef:
    """`core.CreateOperator`: like `create_operator`, but `engine` is only set when one is given (Caffe2
    left the field absent), and the current device scope is not modelled (CPU nets)."""
    op = create_operator(
        op_type, [str(i) for i in inputs], [str(o) for o in outputs], device_option=device_option, **kwargs
    )
    if engine is None:
        op.ClearField("engine")
    else:
        op.engine = engine
    return op


# ------------------------------------------------------------------------------------------------
# ModelHelper

Initializer = tuple[str, Mapping[str, Any]]  # (filler op type, its arguments besides `shape`)

WEIGHT, BIAS, COMPUTED_PARAM = "WEIGHT", "BIAS", "COMPUTED_PARAM"


class ModelHelper:
    """`model_helper.ModelHelper`: a `net`, a `param_init_net` and the parameter lists.

    A step model is created with `param_model=<main model>`: it then shares the main model's
    `param_init_net` and parameter records, so step-net parameters are filled by the main init net.
    `arg_scope` holds the arguments every brew helper with `**kwargs` passes on (order, use_cudnn,
    cudnn_exhaustive_search), which is why they appear on FC/Sum/Concat ops of Caffe2 RNN nets.
    """

    def __init__(
        self,
        name: str | None = None,
        param_model: ModelHelper | None = None,
        arg_scope: Mapping[str, Any] | None = None,
        init_params: bool = True,
    ):
        self.name = name or "model"
        self.net = Net(self.name)
        self.init_params = init_params
        if param_model is not None:
            self.param_init_net = param_model.param_init_net
            self.params = param_model.params
            self.computed_params = param_model.computed_params
            self._param_shapes = param_model._param_shapes
        else:
            self.param_init_net = Net(self.name + "_init")
            self.params: list[BlobReference] = []
            self.computed_params: list[BlobReference] = []
            self._param_shapes: dict[str, list[int]] = {}
        self.weights: list[BlobReference] = []
        self.biases: list[BlobReference] = []
        self.arg_scope: dict[str, Any] = {
            "order": "NCHW",
            "use_cudnn": True,
            "cudnn_exhaustive_search": False,
        }
        self.arg_scope.update(arg_scope or {})

    def create_param(
        self, param_name: str, shape: Sequence[int], initializer: Initializer, tags: Iterable[str] = ()
    ) -> BlobReference:
        """A parameter blob filled by `initializer` in `param_init_net` (once per name).

        A plain-string name is put in the current name scope; a `BlobReference` is used as is.
        Creating an existing parameter again returns it (its shape must agree).
        """
        name = str(param_name) if isinstance(param_name, BlobReference) else scoped(param_name)
        if name in self._param_shapes:
            if self._param_shapes[name] != list(shape):
                raise ValueError(f"parameter {name} exists with shape {self._param_shapes[name]}")
            return BlobReference(name)
        blob = BlobReference(name)
        if self.init_params:
            op_type, args = initializer
            self.param_init_net.add_op(op_type, [], blob, shape=list(shape), **dict(args))
        self._param_shapes[name] = list(shape)
        tags = set(tags)
        (self.computed_params if COMPUTED_PARAM in tags else self.params).append(blob)
        if WEIGHT in tags:
            self.weights.append(blob)
        if BIAS in tags:
            self.biases.append(blob)
        return blob

    def __getattr__(self, op_type: str) -> Any:
        """`model.Copy(...)` etc.: ops without parameters go straight to `net`."""
        if not op_type[:1].isupper():
            raise AttributeError(op_type)
        return getattr(self.net, op_type)
