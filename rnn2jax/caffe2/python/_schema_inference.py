"""What Caffe2's `InferShapesAndTypes` answers for the ops where that is not what rnn2jax's trace of the op gives.

Caffe2 infers shapes with each op schema's TensorInferenceFunction: from its inputs' shapes and its arguments,
without constructing or running the op. For most ops that is what the op computes, and rnn2jax traces the op
itself (`checking.shape_inference.trace_shapes`). For a few it is not, and a trace cannot answer as Caffe2 does:

* IndexHash refuses `modulo` <= 0 when Caffe2 constructs it (the default is 0), so a trace refuses; the schema
  answers the input's shape and type.
* GatherRanges' output size is the total of its ranges (values only known at run time); the schema answers an
  upper bound, every element of DATA.
* TopK's indices are int64, but its schema says INT32 (so layers.Functional types them int32).
* Concat's schema adds the `add_axis` axis where `order` says; the op adds one only when given an `axis`.
* LearningRate's schema answers the iteration counter's shape and type; the op writes one float.
* LastNWindowCollector is a host op (it keeps state in its blobs), which a trace cannot lower.
* SoftmaxWithLoss checks that labels are int32 when it runs; its schema reads only the logits' shape. Its
  gradient op has no schema function: as for every gradient op (`is_gradient_op`), Caffe2 gives an output
  named `X_grad` the shape of blob X (InferBlobShapesAndTypes' "special handling for gradient ops").

Each function below is the schema's (caffe2/operators/index_hash_ops.cc, utility_ops.cc, top_k.cc,
softmax_with_loss_op.cc, concat_split_op.cc, learning_rate_op.cc, last_n_window_collector.cc), given the
inputs' (shape, dtype), None where unknown, and answering the outputs' (None where Caffe2 infers nothing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Spec = tuple[tuple[int, ...], np.dtype]
Lookup = Callable[[str], Spec | None]  # what is known of any blob so far
# None: the schema refuses, and the op's own trace reports why
Inference = Callable[[object, Sequence[Spec | None], Lookup], list[Spec | None] | None]

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


def _concat_differs(op: object) -> bool:
    """The schema honours `add_axis` at the axis `order` names; the op only with an `axis` argument (without
    one it concatenates along that axis, adding none)."""
    return bool(_arg(op, "add_axis", 0)) and not any(arg.name == "axis" for arg in op.arg)  # type: ignore[attr-defined]


def _concat(op: object, ins: Sequence[Spec | None], known: Lookup) -> list[Spec | None] | None:
    if any(spec is None for spec in ins):
        return [None for _ in op.output]  # type: ignore[attr-defined]
    first = ins[0]
    axis = _order_axis(op)
    size = len(first[0]) + 1
    axis = axis + size if axis < 0 else axis
    if not 0 <= axis < size or any(spec[0] != first[0] for spec in ins):
        return None  # Caffe2's schema refuses: the trace reports the error
    out: list[Spec | None] = [((*first[0][:axis], len(ins), *first[0][axis:]), first[1])]
    return out + [((len(ins),), _INT32)] * (len(op.output) - 1)  # type: ignore[attr-defined]


def _order_axis(op: object) -> int:
    """GetDimFromOrderString: the channel axis of `order` (NCHW: 1, NHWC: 3)."""
    for arg in op.arg:  # type: ignore[attr-defined]
        if arg.name == "order":
            order = arg.s.decode() if isinstance(arg.s, bytes) else arg.s
            return {"NCHW": 1, "NHWC": 3}.get(order.upper(), 1)
    return 1


def _learning_rate(op: object, ins: Sequence[Spec | None], known: Lookup) -> list[Spec | None]:
    """The schema answers the iteration counter's shape and type (the op writes one float)."""
    return [ins[0]]


def _last_n_window_collector(op: object, ins: Sequence[Spec | None], known: Lookup) -> list[Spec | None]:
    """`num_to_collect` rows of DATA, the cursor as given, NUM_VISITED one int64 (last_n_window_collector.cc);
    a host op, which a trace cannot lower."""
    data = ins[2] if len(ins) > 2 else None
    if data is None or not data[0]:
        return [None for _ in op.output]  # type: ignore[attr-defined]
    out: list[Spec | None] = [((_arg(op, "num_to_collect", -1), *data[0][1:]), data[1]), ins[1]]
    return out + [((1,), np.dtype(np.int64))] * (len(op.output) - 2)  # type: ignore[attr-defined]


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
    "Concat": _concat,
    "LearningRate": _learning_rate,
    "LastNWindowCollector": _last_n_window_collector,
}
# Ops whose schema's answer is reported but not traced on: LearningRate's readers (WeightedSum, Mul) are float
# math, which refuses the int64 counter that its schema answers
REPORTED_ONLY = frozenset({"LearningRate"})
# Ops whose schema answers as the op does but for some arguments: the trace answers the others
_ONLY_WHEN: dict[str, Callable[[object], bool]] = {"Concat": _concat_differs}


def schema_answers(op: object) -> bool:
    """Whether Caffe2's schema, not a trace of the op, must answer for `op`."""
    kind = op.type  # type: ignore[attr-defined]
    return kind in SCHEMA_INFERENCE and _ONLY_WHEN.get(kind, lambda _: True)(op)
