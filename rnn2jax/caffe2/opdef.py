"""`make_argument` and `create_operator`: Caffe2's `utils.MakeArgument` and `core.CreateOperator`.

Arguments are encoded exactly as Caffe2's Python front end encoded them (section 1 of SEMANTICS.md):
float -> f, int/bool -> i, str/bytes -> s, NetDef -> n, other messages -> s (binary), NumPy
float arrays and float iterables -> floats, int/bool iterables -> ints, str iterables -> strings,
NetDef iterables -> nets, and an empty iterable -> an Argument with only its name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..ir.netdef import DATA_TYPES
from ..ops.gradient_makers import set_scalar
from ..proto import caffe2_pb2 as pb

_DTYPE_TO_DATA_TYPE = {np.dtype(v): k for k, v in DATA_TYPES.items() if k != pb.TensorProto.BYTE}


def make_tensor(array: Any, name: str = "") -> pb.TensorProto:
    """A NumPy array as a `TensorProto`, in the data field Caffe2 uses for its dtype."""
    array = np.asarray(array)
    proto = pb.TensorProto(name=name, dims=list(array.shape))
    if array.dtype.kind in "OSU":
        proto.data_type = pb.TensorProto.STRING
        proto.string_data.extend(v if isinstance(v, bytes) else str(v).encode() for v in array.ravel())
        return proto
    proto.data_type = _DTYPE_TO_DATA_TYPE[array.dtype]
    flat = array.ravel()
    if array.dtype == np.float32:
        proto.float_data.extend(flat.tolist())
    elif array.dtype == np.float64:
        proto.double_data.extend(flat.tolist())
    elif array.dtype == np.int64:
        proto.int64_data.extend(flat.tolist())
    elif array.dtype == np.float16:
        proto.int32_data.extend(flat.view(np.uint16).astype(np.int32).tolist())
    else:
        proto.int32_data.extend(flat.astype(np.int32).tolist())
    return proto


def make_argument(name: str, value: Any) -> pb.Argument:
    """One `Argument`, field chosen as Caffe2's `utils.MakeArgument` chose it."""
    arg = pb.Argument(name=name)
    if set_scalar(arg, value):  # bool, int, float, str: as the gradient makers encode their own arguments
        return arg
    if isinstance(value, bytes):
        arg.s = value
    elif isinstance(value, pb.NetDef):
        arg.n.CopyFrom(value)
    elif isinstance(value, pb.TensorProto):
        arg.t.CopyFrom(value)
    elif hasattr(value, "SerializeToString"):
        arg.s = value.SerializeToString()
    elif isinstance(value, np.ndarray):  # flattened, whatever its rank, as Caffe2's MakeArgument
        _fill_repeated(arg, value.flatten().tolist())
    elif isinstance(value, Iterable):
        _fill_repeated(arg, list(value))
    else:
        raise TypeError(f"argument '{name}': cannot encode a {type(value).__name__}")
    return arg


def _fill_repeated(arg: pb.Argument, values: list[Any]) -> None:
    if not values or all(isinstance(v, float | np.floating) for v in values):
        arg.floats.extend(float(v) for v in values)
    elif all(isinstance(v, bool | int | np.bool_ | np.integer) for v in values):
        arg.ints.extend(int(v) for v in values)
    elif all(isinstance(v, float | int | np.floating | np.integer) for v in values):
        arg.floats.extend(float(v) for v in values)
    elif all(isinstance(v, str | bytes) for v in values):
        arg.strings.extend(v.encode("utf-8") if isinstance(v, str) else v for v in values)
    elif all(isinstance(v, pb.NetDef) for v in values):
        arg.nets.extend(values)
    elif all(hasattr(v, "SerializeToString") for v in values):
        arg.strings.extend(v.SerializeToString() for v in values)
    else:
        raise TypeError(f"argument '{arg.name}': cannot encode a list of mixed types")


def create_operator(
    op_type: str,
    inputs: str | Iterable[str],
    outputs: str | Iterable[str],
    *,
    name: str = "",
    engine: str = "",
    device_option: pb.DeviceOption | None = None,
    control_input: Iterable[str] = (),
    is_gradient_op: bool = False,
    **kwargs: Any,
) -> pb.OperatorDef:
    """An `OperatorDef`, arguments in keyword order (as Caffe2's CreateOperator emitted them)."""
    op = pb.OperatorDef(type=op_type, name=name)
    if engine:  # Caffe2 left the field unset unless an engine was asked for
        op.engine = engine
    op.input.extend([inputs] if isinstance(inputs, str) else inputs)
    op.output.extend([outputs] if isinstance(outputs, str) else outputs)
    op.control_input.extend(control_input)
    if device_option is not None:
        op.device_option.CopyFrom(device_option)
    if is_gradient_op:
        op.is_gradient_op = True
    op.arg.extend(make_argument(k, v) for k, v in kwargs.items() if v is not None)
    return op


def create_net(
    name: str,
    ops: Iterable[pb.OperatorDef],
    external_inputs: Iterable[str] = (),
    external_outputs: Iterable[str] = (),
    net_type: str = "",
    args: Mapping[str, Any] | None = None,
) -> pb.NetDef:
    net = pb.NetDef(name=name, type=net_type)
    net.op.extend(ops)
    net.external_input.extend(external_inputs)
    net.external_output.extend(external_outputs)
    net.arg.extend(make_argument(k, v) for k, v in (args or {}).items())
    return net
