"""Caffe2's container blobs as host ops: tensor vectors (`caffe2/operators/dataset_ops.cc`: CreateTensorVector,
TensorVectorSize, ConcatTensorVector, CollectTensor), indices (`index_ops.cc`: IntIndexCreate, LongIndexCreate,
StringIndexCreate, IndexGet, IndexFreeze, IndexLoad, IndexStore, IndexSize) and maps (`map_ops.h`: CreateMap,
KeyValueToMap, MapToKeyValue).

Each container is a Python object in its blob, mutated in place by the ops that read it, as Caffe2's are.
Caffe2's maps are hash maps and MapToKeyValue lists them in hash order; rnn2jax lists them sorted by key.
CollectTensor's reservoir sampling, once more tensors came than it keeps, draws with the workspace-independent
generator of the op (Caffe2's draws differ; the sizes agree).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from ..errors import BadArgumentError, InputTypeError, ShapeError
from ..ir.netdef import Op
from ..proto import caffe2_pb2 as pb
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, Absent
from .registry import HostWorkspace, declare_family, host_op

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=Absent("a host op: Caffe2 says SHOULD_NOT_DO_GRADIENT, NO_GRADIENT or registers none"),
    emitter=HOST_OP_NO_EMITTER,
)


def _counts(op: Op, inputs: int, outputs: int) -> None:
    if len(op.inputs) != inputs or len(op.outputs) != outputs:
        raise BadArgumentError(f"{op.where}: {op.type} takes {inputs} input(s) and {outputs} output(s)")


def _in_place(op: Op, pairs: list[tuple[int, int]]) -> None:
    for i, o in pairs:
        if op.inputs[i] != op.outputs[o]:
            raise BadArgumentError(
                f"{op.where}: input {i} ('{op.inputs[i]}') and output {o} ('{op.outputs[o]}') must be the same blob: "
                f"{op.type} works in place"
            )


def _object(workspace: HostWorkspace, op: Op, position: int, kind: type, what: str, maker: str) -> Any:
    value = workspace.get(op.inputs[position], op)
    if not isinstance(value, kind):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[position]}' holds a {type(value).__name__}, not {what} (make one with "
            f"{maker})"
        )
    return value


def _tensor(workspace: HostWorkspace, op: Op, position: int) -> np.ndarray:
    value = workspace.get(op.inputs[position], op)
    if not isinstance(value, jax.Array | np.ndarray):
        raise InputTypeError(f"{op.where}: blob '{op.inputs[position]}' holds a {type(value).__name__}, not a tensor")
    return np.asarray(value)


# --------------------------------------------------------------------------------------------------
# Tensor vectors


class TensorVector(list):
    """Caffe2's std::vector<Tensor> blob."""

    def __repr__(self) -> str:
        return f"TensorVector({len(self)} tensors)"


def _vector(workspace: HostWorkspace, op: Op, position: int = 0) -> TensorVector:
    return _object(workspace, op, position, TensorVector, "a tensor vector", "CreateTensorVector")


@host_op("CreateTensorVector", check=lambda op: _counts(op, 0, 1))
def create_tensor_vector(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    workspace.put(op.outputs[0], TensorVector())


@host_op("TensorVectorSize", check=lambda op: _counts(op, 1, 1))
def tensor_vector_size(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The number of tensors in the vector (int32, 0-d)."""
    workspace.put(op.outputs[0], np.array(len(_vector(workspace, op)), np.int32))


@host_op("ConcatTensorVector", check=lambda op: _counts(op, 1, 1))
def concat_tensor_vector(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The vector's tensors concatenated along their first dimension (one dtype, the same other dims)."""
    vector = _vector(workspace, op)
    if not vector:
        raise ShapeError(f"{op.where}: tensor vector '{op.inputs[0]}' is empty: there is nothing to concatenate")
    first = vector[0]
    if first.ndim == 0:
        raise ShapeError(
            f"{op.where}: tensor vector '{op.inputs[0]}' holds a 0-d tensor; concatenating needs rank >= 1"
        )
    for i, tensor in enumerate(vector[1:], 1):
        if tensor.dtype != first.dtype or tensor.shape[1:] != first.shape[1:]:
            raise ShapeError(
                f"{op.where}: tensor #{i} of vector '{op.inputs[0]}' is {tensor.dtype} {list(tensor.shape)}, tensor #0 "
                f"{first.dtype} {list(first.shape)}: they must differ only in their first dimension"
            )
    workspace.put(op.outputs[0], np.concatenate(list(vector)))


def _check_collect(op: Op) -> None:
    if not op.outputs or len(op.inputs) != 2 * len(op.outputs):
        raise BadArgumentError(
            f"{op.where}: CollectTensor takes n tensor vectors and n tensors, and outputs the vectors"
        )
    _in_place(op, [(i, i) for i in range(len(op.outputs))])
    if op.int("num_to_collect", -1) <= 0:
        raise BadArgumentError(f"{op.where}: num_to_collect must be positive, got {op.int('num_to_collect', -1)}")


@host_op("CollectTensor", check=_check_collect)
def collect_tensor(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Reservoir sampling of at most num_to_collect tensors into each vector, all at the same position: the
    op's first num_to_collect runs (its own count, as in Caffe2) append or overwrite in order; later runs
    replace a uniformly drawn position or discard."""
    keep, visited = op.int("num_to_collect"), state.get("visited", 0)
    if visited < keep:
        position = visited
    else:
        rng = state.setdefault("rng", random.Random(0))
        position = rng.randint(0, visited)
        position = -1 if position >= keep else position
    count = len(op.outputs)
    for i in range(count):
        vector = _vector(workspace, op, i)
        if visited >= keep and len(vector) != keep:
            raise ShapeError(
                f"{op.where}: tensor vector '{op.inputs[i]}' holds {len(vector)} tensors, not num_to_collect {keep}"
            )
        tensor = _tensor(workspace, op, count + i).copy()
        if position < 0:
            continue
        if position >= len(vector):
            vector.append(tensor)
        else:
            vector[position] = tensor
    state["visited"] = visited + 1


# --------------------------------------------------------------------------------------------------
# Indices


@dataclass
class Index:
    """Caffe2's Index<T>: keys to consecutive ids from 1 (0 is unknown keys'), at most max_elements ids
    counting the 0, and `frozen` (unknown keys then get 0)."""

    kind: str  # "int32", "int64" or "string"
    max_elements: int
    ids: dict[Any, int] = field(default_factory=dict)
    frozen: bool = False

    @property
    def next_id(self) -> int:
        return len(self.ids) + 1

    def __repr__(self) -> str:
        return f"Index({self.kind}, {len(self.ids)} keys{', frozen' if self.frozen else ''})"


_INDEX_KINDS = {"IntIndexCreate": "int32", "LongIndexCreate": "int64", "StringIndexCreate": "string"}


def _key_kind(array: np.ndarray) -> str | None:
    if array.dtype == object:
        return "string"
    return str(array.dtype) if str(array.dtype) in ("int32", "int64") else None


def _check_index_create(op: Op) -> None:
    _counts(op, 0, 1)
    op.int("max_elements", 2**31 - 1)


def index_create(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """An empty index of the op's key type, max_elements (default 2^31 - 1) ids counting the 0."""
    workspace.put(op.outputs[0], Index(_INDEX_KINDS[op.type], op.int("max_elements", 2**31 - 1)))


for _type in _INDEX_KINDS:
    host_op(_type, check=_check_index_create)(index_create)


def _index(workspace: HostWorkspace, op: Op) -> Index:
    return _object(workspace, op, 0, Index, "an index", "IntIndexCreate, LongIndexCreate or StringIndexCreate")


def _keys(workspace: HostWorkspace, op: Op, index: Index) -> np.ndarray:
    keys = _tensor(workspace, op, 1)
    kind = _key_kind(keys)
    if kind is None:
        raise InputTypeError(
            f"{op.where}: keys '{op.inputs[1]}' are {keys.dtype}; an index holds int32, int64 or strings"
        )
    if kind != index.kind:
        raise InputTypeError(
            f"{op.where}: Wrong dictionary type given input keys: index '{op.inputs[0]}' holds {index.kind} keys, "
            f"'{op.inputs[1]}' is {keys.dtype if kind != 'string' else 'strings'}"
        )
    return keys


def _key(value: Any) -> Any:
    return value if isinstance(value, bytes) else int(value)


@host_op("IndexGet", check=lambda op: _counts(op, 2, 1))
def index_get(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The id of each key (int64, the keys' shape); an unfrozen index gives a new key the next id, and fails
    once that would reach max_elements; a frozen one gives it 0."""
    index = _index(workspace, op)
    keys = _keys(workspace, op, index)
    ids = np.zeros(keys.shape, np.int64)
    flat = ids.reshape(-1)
    for i, value in enumerate(keys.reshape(-1)):
        key = _key(value)
        found = index.ids.get(key)
        if found is None and not index.frozen:
            if index.next_id >= index.max_elements:
                raise BadArgumentError(
                    f"{op.where}: Dict max size reached: index '{op.inputs[0]}' has max_elements "
                    f"{index.max_elements} (counting the 0 of unknown keys)"
                )
            found = index.ids[key] = index.next_id
        flat[i] = found or 0
    workspace.put(op.outputs[0], ids)


def _check_in_place_handle(op: Op) -> None:
    _in_place(op, [(0, 0)])


@host_op("IndexFreeze", check=lambda op: (_counts(op, 1, 1), _check_in_place_handle(op)))
def index_freeze(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Freeze the index: IndexGet then gives unknown keys 0."""
    _index(workspace, op).frozen = True


@host_op(
    "IndexLoad", check=lambda op: (_counts(op, 2, 1), _check_in_place_handle(op), op.bool("skip_first_entry", False))
)
def index_load(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Replace the index's keys by the items, ids 1, 2, ... in order (skipping the first item with
    skip_first_entry); repeated items fail."""
    index = _index(workspace, op)
    items = _keys(workspace, op, index).reshape(-1)
    if op.bool("skip_first_entry", False):
        if items.size == 0:
            raise ShapeError(f"{op.where}: skip_first_entry needs at least one item in '{op.inputs[1]}'")
        items = items[1:]
    if items.size > index.max_elements:
        raise BadArgumentError(f"{op.where}: Cannot load index: Tensor is larger than max_elements.")
    ids: dict[Any, int] = {}
    for i, value in enumerate(items):
        key = _key(value)
        if key in ids:
            raise BadArgumentError(
                f"{op.where}: Repeated elements found: cannot load into dictionary ('{op.inputs[1]}' repeats {key!r})"
            )
        ids[key] = i + 1
    index.ids = ids


@host_op("IndexStore", check=lambda op: _counts(op, 1, 1))
def index_store(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The index's keys in id order (a 1-D tensor of its key type): the item of id 1 first."""
    index = _index(workspace, op)
    keys = list(index.ids)  # dicts keep insertion order, which is id order
    if index.kind == "string":
        out = np.empty(len(keys), dtype=object)
        out[:] = keys
    else:
        out = np.array(keys, dtype=index.kind)
    workspace.put(op.outputs[0], out)


@host_op("IndexSize", check=lambda op: _counts(op, 1, 1))
def index_size(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The index's next id, its number of keys plus the 0 (int64, 0-d)."""
    workspace.put(op.outputs[0], np.array(_index(workspace, op).next_id, np.int64))


# --------------------------------------------------------------------------------------------------
# Maps


@dataclass
class Map:
    """Caffe2's std::unordered_map<K, V> blob, K and V each int32 or int64."""

    key_dtype: str
    value_dtype: str
    items: dict[int, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Map({self.key_dtype} -> {self.value_dtype}, {len(self.items)} items)"


_MAP_TYPES = {pb.TensorProto.INT32: "int32", pb.TensorProto.INT64: "int64"}


def _check_create_map(op: Op) -> None:
    _counts(op, 0, 1)
    for arg in ("key_dtype", "value_dtype"):
        if op.int(arg, pb.TensorProto.INT32) not in _MAP_TYPES:
            raise BadArgumentError(f"{op.where}: {arg} must be INT32 or INT64 (a TensorProto data type)")


@host_op("CreateMap", check=_check_create_map)
def create_map(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """An empty map of key_dtype to value_dtype (both default INT32)."""
    key_type = _MAP_TYPES[op.int("key_dtype", pb.TensorProto.INT32)]
    workspace.put(op.outputs[0], Map(key_type, _MAP_TYPES[op.int("value_dtype", pb.TensorProto.INT32)]))


@host_op("KeyValueToMap", check=lambda op: _counts(op, 2, 1))
def key_value_to_map(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A map of the keys to the values (int32 or int64 each; a repeated key keeps its first value)."""
    keys, values = _tensor(workspace, op, 0), _tensor(workspace, op, 1)
    for name, array in ((op.inputs[0], keys), (op.inputs[1], values)):
        if str(array.dtype) not in ("int32", "int64"):
            raise InputTypeError(f"{op.where}: '{name}' is {array.dtype}; a map holds int32 or int64 keys and values")
    if keys.size != values.size:
        raise ShapeError(f"{op.where}: {keys.size} keys and {values.size} values; give one value per key")
    items: dict[int, int] = {}
    for key, value in zip(keys.reshape(-1).tolist(), values.reshape(-1).tolist(), strict=True):
        items.setdefault(key, value)
    workspace.put(op.outputs[0], Map(str(keys.dtype), str(values.dtype), items))


@host_op("MapToKeyValue", check=lambda op: _counts(op, 1, 2))
def map_to_key_value(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The map's keys and values, 1-D tensors of its types, sorted by key (Caffe2: hash order)."""
    mapping = _object(workspace, op, 0, Map, "a map", "CreateMap or KeyValueToMap")
    keys = sorted(mapping.items)
    workspace.put(op.outputs[0], np.array(keys, dtype=mapping.key_dtype))
    workspace.put(op.outputs[1], np.array([mapping.items[k] for k in keys], dtype=mapping.value_dtype))


# --------------------------------------------------------------------------------------------------
# Saving and loading indices and maps (Caffe2's IndexSerializer and MapSerializer; ops/storage.py registers these)

INDEX_TYPE = "std::unique_ptr<caffe2::IndexBase>"
_C_TYPES = {"int32": "int32_t", "int64": "int64_t"}
MAP_TYPES = tuple(f"(std::unordered_map<{_C_TYPES[k]}, {_C_TYPES[v]}>)" for k in _C_TYPES for v in _C_TYPES)


def _keys_tensor(tensor: pb.TensorProto, kind: str, keys: list[Any]) -> None:
    tensor.dims.append(len(keys))
    if kind == "string":
        tensor.data_type = pb.TensorProto.STRING
        tensor.string_data.extend(keys)
    elif kind == "int64":
        tensor.data_type = pb.TensorProto.INT64
        tensor.int64_data.extend(keys)
    else:
        tensor.data_type = pb.TensorProto.INT32
        tensor.int32_data.extend(keys)
    tensor.device_detail.device_type = 0
    tensor.segment.begin, tensor.segment.end = 0, len(keys)


def _tensor_keys(tensor: pb.TensorProto) -> tuple[str, list[Any]]:
    if tensor.data_type == pb.TensorProto.STRING:
        return "string", [bytes(k) for k in tensor.string_data]
    if tensor.data_type == pb.TensorProto.INT64:
        return "int64", [int(k) for k in tensor.int64_data]
    if tensor.data_type == pb.TensorProto.INT32:
        return "int32", [int(k) for k in tensor.int32_data]
    raise ValueError("holds keys of a type an index cannot (int32, int64 or strings)")


def serialize_index(name: str, index: Index) -> pb.BlobProto:
    """The keys in id order as a tensor; `content` is "<max_elements> <frozen>"."""
    proto = pb.BlobProto(name=name, type=INDEX_TYPE, content=f"{index.max_elements} {int(index.frozen)}".encode())
    _keys_tensor(proto.tensor, index.kind, list(index.ids))
    return proto


def deserialize_index(proto: pb.BlobProto) -> Index:
    kind, keys = _tensor_keys(proto.tensor)
    try:
        max_elements, frozen = (int(word) for word in proto.content.decode().split())
    except ValueError:
        raise ValueError(f"is an index blob whose content {proto.content!r} is not '<max_elements> <frozen>'") from None
    if len(keys) > max_elements or len(set(keys)) != len(keys):
        raise ValueError("is an index blob with repeated keys or more than max_elements")
    return Index(kind, max_elements, {key: i + 1 for i, key in enumerate(keys)}, bool(frozen))


def serialize_map(name: str, mapping: Map) -> pb.BlobProto:
    """`content` is a TensorProtos of the keys and the values (sorted by key here, hash order in Caffe2)."""
    kind = f"(std::unordered_map<{_C_TYPES[mapping.key_dtype]}, {_C_TYPES[mapping.value_dtype]}>)"
    protos = pb.TensorProtos()
    keys = sorted(mapping.items)
    _keys_tensor(protos.protos.add(), mapping.key_dtype, keys)
    _keys_tensor(protos.protos.add(), mapping.value_dtype, [mapping.items[k] for k in keys])
    return pb.BlobProto(name=name, type=kind, content=protos.SerializeToString())


def deserialize_map(proto: pb.BlobProto) -> Map:
    protos = pb.TensorProtos()
    try:
        protos.ParseFromString(proto.content)
    except Exception:
        raise ValueError("is a map blob whose content is not a TensorProtos") from None
    if len(protos.protos) != 2:
        raise ValueError("is a map blob without its keys and values")
    (key_kind, keys), (value_kind, values) = (_tensor_keys(t) for t in protos.protos)
    if key_kind == "string" or value_kind == "string" or len(keys) != len(values):
        raise ValueError("is a map blob whose keys and values do not pair up")
    return Map(key_kind, value_kind, dict(zip(keys, values, strict=True)))
