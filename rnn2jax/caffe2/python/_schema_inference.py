"""What Caffe2's `InferShapesAndTypes` answers for the ops where that is not what rnn2jax's trace of the op gives.

Caffe2 infers shapes with each op schema's TensorInferenceFunction: from its inputs' shapes and its arguments,
without constructing or running the op. For most ops that is what the op computes, and rnn2jax traces the op
itself (`checking.shape_inference.trace_shapes`). For a few it is not, and a trace cannot answer as Caffe2 does:

* IndexHash refuses `modulo` <= 0 when Caffe2 constructs it (the default is 0), so a trace refuses; the schema
  answers the input's shape and type.
* GatherRanges' output size is the total of its ranges (values only known at run time); the schema answers an
  upper bound, every element of DATA.
* TopK's indices are int64, but its schema says INT32 (so layers.Functional types them int32).
* SoftmaxWithLoss checks that labels are int32 when it runs; its schema reads only the logits' shape. Its
  gradient op has no schema function: as for every gradient op (`is_gradient_op`), Caffe2 gives an output
  named `X_grad` the shape of blob X (InferBlobShapesAndTypes' "special handling for gradient ops").

Each function below is the schema's (caffe2/operators/index_hash_ops.cc, utility_ops.cc, top_k.cc,
softmax_with_loss_op.cc), given the inputs' (shape, dtype), None where unknown, and answering the outputs'
(None where Caffe2 infers nothing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Spec = tuple[tuple[int, ...], np.dtype]
Lookup = Callable[[str], Spec | None]  # what is known of any blob so far
Inference = Callable[[object, Sequence[Spec | None], Lookup], list[Spec | None]]

_INT32 = np.dtype(np.int32)
_FLOAT = np.dtype(np.float32)


def _arg(op: object, name: str, default: int) -> int:
    for arg in op.arg:  # type: ignore[attr-defined]
        if arg.name == name:
            return int(arg.i)
    return default


def _index_hash(op: object, ins: Sequence[Spec | None], known: Lookup) -> list[Spec | None]:
    return [ins[0]]


def _gather_ranges(op: object, ins: Sequence[Spec | None], known: Lookup) -> list[Spec | None]:
    data, ranges = ins[0], ins[1]
    values = ((math.prod(data[0]),), data[1]) if data is not None else None
    lengths = ((ranges[0][0],), ranges[1]) if ranges is not None and ranges[0] else None
    return [values, lengths]


def _top_k(op: object, ins: Sequence[Spec | None], known: Lookup) -> list[Spec | None]:
    x = ins[0]
    if x is None or not x[0]:
        return [None, None, None]
    k = _arg(op, "k", -1)
    shape = (*x[0][:-1], k)
    return [(shape, x[1]), (shape, _INT32), ((math.prod(x[0][:-1]) * k,), _INT32)]


def _softmax_with_loss(op: object, ins: Sequence[Spec | None], known: Lookup) -> list[Spec | None]:
    logits = ins[0]
    if logits is None:
        return [None, ((), _FLOAT)]
    dims = logits[0]
    axis = _arg(op, "axis", 1)
    axis = axis + len(dims) if axis < 0 else axis
    return [((math.prod(dims[:axis]), math.prod(dims[axis:])), logits[1]), ((), _FLOAT)]


def _gradient_blobs(op: object, ins: Sequence[Spec | None], known: Lookup) -> list[Spec | None]:
    """No schema function: an output `X_grad` of a gradient op is like blob X (GradientMakerBase::
    MatchGradsToParams), the others unknown."""
    if not getattr(op, "is_gradient_op", False):
        return [None for _ in op.output]  # type: ignore[attr-defined]
    return [known(name[: -len("_grad")]) if name.endswith("_grad") else None for name in op.output]  # type: ignore[attr-defined]


SCHEMA_INFERENCE: dict[str, Inference] = {
    "SoftmaxWithLossGradient": _gradient_blobs,
    "IndexHash": _index_hash,
    "GatherRanges": _gather_ranges,
    "TopK": _top_k,
    "SoftmaxWithLoss": _softmax_with_loss,
}
