"""Host ops that read and write Caffe2 databases: Load, Save, Checkpoint (and its alias Snapshot), DBExists,
CreateDB, TensorProtosDBInput, and StoreSet/StoreGet/StoreAdd/StoreWait (blobs through a store handler of
ops/distributed.py), following `caffe2/operators/load_save_op.h`, `caffe2/db/create_db_op.h` and
`caffe2/operators/tensor_protos_db_input.h`.

Paths resolve as Caffe2 resolves them against its workspace's root folder: Load, Save, Checkpoint and
DBExists read `<db_root>/<db>` unless `absolute_path` is set (the root is "." when the workspace has no
`db_root`, Caffe2's default). CreateDB takes its `db` as given in Caffe2 (relative to the current
directory); here a relative name goes under `db_root` when the workspace has one, so that one
`--db-root` serves a whole training plan.

Every op checks its arguments when its net is created (`check`), and every failure is a one-line
`Rnn2JaxError` naming the op (net, index, type), the DB and the blob. Loaded blobs keep the dtype the
DB holds (NumPy arrays; pure ops convert them on entry), so a Load-then-Save round trip is exact.

They are host ops (`register_host_op`): the workspace runs each between the jitted segments around it
and hands itself in (`HostWorkspace`), so this family builds on storage/ and the IR, never the runtime.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from google.protobuf.message import DecodeError

from ..errors import (
    Advice,
    BadArgumentError,
    DistributedError,
    InputTypeError,
    MissingBlobError,
    Rnn2JaxError,
    StorageError,
)
from ..ir.netdef import Op
from ..proto import caffe2_pb2 as pb
from ..proto.tensor import DATA_TYPES, tensor_values
from ..storage.blobs import write_blobs
from ..storage.db import DBAccessError, backend, db_type_info, describe, open_cursor
from ..storage.serialization import (
    BlobAssembler,
    BlobType,
    blob_name,
    blob_type_of,
    register_blob_type,
    serialize_blob,
)
from .containers import (
    INDEX_TYPE,
    MAP_TYPES,
    Index,
    Map,
    deserialize_index,
    deserialize_map,
    serialize_index,
    serialize_map,
)
from .counters import COUNTER_TYPE, Counter, deserialize_counter, serialize_counter
from .dataset import CURSOR_TYPE, TreeCursor, deserialize_cursor, serialize_cursor
from .distributed import StoreHandler
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, Absent
from .queues import BlobsQueue
from .registry import HostWorkspace, declare_family, register_host_op

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=HOST_OP_NO_SHAPE_RULE,
    gradient=Absent("a host op: Caffe2 says NO_GRADIENT or SHOULD_NOT_DO_GRADIENT; the builder has no maker"),
    emitter=HOST_OP_NO_EMITTER,
)

# The host objects other families keep in blobs that Caffe2 can Save (its REGISTER_BLOB_SERIALIZER)
register_blob_type(BlobType(CURSOR_TYPE, TreeCursor, serialize_cursor, deserialize_cursor))
register_blob_type(BlobType(COUNTER_TYPE, Counter, serialize_counter, deserialize_counter))
register_blob_type(BlobType(INDEX_TYPE, Index, serialize_index, deserialize_index))
for _map_type in MAP_TYPES:
    register_blob_type(BlobType(_map_type, Map, serialize_map, deserialize_map))


# --------------------------------------------------------------------------------------------------
# Paths and shared checks


def _root(workspace: HostWorkspace) -> str:
    return workspace.db_root if workspace.db_root is not None else "."


def full_db_name(workspace: HostWorkspace, db: str, absolute: bool) -> str:
    """Caffe2's `absolute_path ? db : RootFolder() + "/" + db` (an absolute `db` still goes under the root)."""
    return db if absolute else f"{_root(workspace)}/{db}"


_DB_ROOT_ADVICE = Advice(python="pass db_root=DIR", command_line="pass --db-root DIR")


def _not_found(error: StorageError, workspace: HostWorkspace, db: str, absolute: bool) -> StorageError:
    """`error` (a DB that does not exist) with where relative names are read, and how to say elsewhere."""
    if absolute:
        return error
    if os.path.isabs(db):
        return StorageError(
            f"{error} (absolute_path is not set, so Caffe2 reads even an absolute name under the root folder)"
        )
    if workspace.db_root is None:
        return StorageError(
            f"{error} (relative DB names are read under the workspace's db_root, here the current directory)",
            advice=_DB_ROOT_ADVICE,
        )
    return StorageError(f"{error} (relative DB names are read under db_root '{workspace.db_root}')")


def _check_db_type(op: Op, db_type: str, what: str = "db_type") -> None:
    if not db_type:
        raise BadArgumentError(f"{op.where}: {op.type} needs a {what} (Caffe2: 'Must specify a db type.')")
    try:
        db_type_info(db_type, "?")
    except StorageError as error:
        detail = str(error).split(": ", 1)[1]
        raise BadArgumentError(f"{op.where}: {detail}") from None


def _reraise(op: Op, error: Rnn2JaxError) -> Rnn2JaxError:
    """The same error class with the op in front (storage errors name the DB and blob already)."""
    text = BaseException.__str__(error)  # the message without its advice, which the new error keeps
    located = type(error)(text if text.startswith(op.where) else f"{op.where}: {text}")
    located.advice = error.advice
    return located


def _array(workspace: HostWorkspace, name: str, op: Op) -> Any:
    value = workspace.get(name, op)
    if isinstance(value, jax.Array):
        return np.asarray(value)
    return value


# --------------------------------------------------------------------------------------------------
# Load


@dataclass(frozen=True)
class _LoadSpec:
    dbs: tuple[str, ...]
    db_type: str
    absolute: bool
    add_prefix: str
    strip_prefix: str
    load_all: bool
    allow_incomplete: bool
    source_names: tuple[str, ...]  # what each output is called in the DB (empty with load_all)


def _load_spec(op: Op) -> _LoadSpec:
    db, dbs = op.str("db", ""), op.strings("dbs", ())
    db_type = op.str("db_type", "")
    sources = op.strings("source_blob_names", ())
    strip, add = op.str("strip_prefix", ""), op.str("add_prefix", "")
    load_all = op.bool("load_all", False)
    op.bool("keep_device", False)  # every blob lands on the host: keep_device means nothing here
    if len(op.inputs) > 1:
        raise BadArgumentError(f"{op.where}: Load takes at most one input (a DB reader made by CreateDB)")
    if not op.inputs:
        _check_db_type(op, db_type)
        if not dbs and not db:
            raise BadArgumentError(f"{op.where}: Load needs a db or dbs argument (Caffe2: 'Must specify a db name.')")
        if dbs and db:
            raise BadArgumentError(f"{op.where}: Load takes db or dbs, not both")
        if dbs:
            empty = [i for i, name in enumerate(dbs) if not name]
            if empty:
                raise BadArgumentError(f"{op.where}: dbs item {empty[0]} is empty")
            repeated = sorted({n for n in dbs if dbs.count(n) > 1})
            if repeated:
                raise BadArgumentError(f"{op.where}: dbs names '{repeated[0]}' twice (Caffe2: 'Duplicated db name')")
    if sources and len(sources) != len(op.outputs):
        raise BadArgumentError(
            f"{op.where}: {len(sources)} source_blob_names for {len(op.outputs)} outputs; give one per output"
        )
    if sources and strip:
        raise BadArgumentError(f"{op.where}: strip_prefix and source_blob_names are mutually exclusive")
    if sources and load_all:
        raise BadArgumentError(f"{op.where}: load_all cannot be used with source_blob_names")
    names = () if load_all else (sources or op.outputs)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BadArgumentError(f"{op.where}: Load names source blob '{repeated[0]}' twice")
    return _LoadSpec(
        dbs=dbs or ((db,) if db else ()),
        db_type=db_type,
        absolute=op.bool("absolute_path", False),
        add_prefix=add,
        strip_prefix=strip,
        load_all=load_all,
        allow_incomplete=op.bool("allow_incomplete", False),
        source_names=tuple(names),
    )


def db_key_name(key: bytes, strip_prefix: str, add_prefix: str) -> bytes:
    """The key with its blob name renamed as Caffe2's buildBlobNameFromDbKey does: strip everything up to
    and including the first occurrence of `strip_prefix` (anywhere in the name), then prepend `add_prefix`.
    The chunk suffix ("#%<id>") is kept."""
    name = blob_name(key)
    suffix = key[len(name.encode("utf-8", errors="surrogateescape")) :]
    if strip_prefix:
        position = name.find(strip_prefix)
        if position >= 0:
            name = name[position + len(strip_prefix) :]
    return (add_prefix + name).encode("utf-8", errors="surrogateescape") + suffix


def _assemble(
    records: Iterator[tuple[bytes, bytes]], where: str, spec: _LoadSpec, wanted: frozenset[str] | None
) -> tuple[dict[str, Any], set[str]]:
    """The wanted blobs of one DB's records (renamed), and every renamed blob name the DB holds."""
    assembler = BlobAssembler(where, wanted)
    seen: set[str] = set()
    key: bytes | None = None
    try:
        for original, value in records:
            key = original
            renamed = db_key_name(original, spec.strip_prefix, spec.add_prefix)
            seen.add(blob_name(renamed))
            if assembler.wants(renamed):
                assembler.add(renamed, value)
        key = None
    except DBAccessError as error:
        raise StorageError(f"{where}: {_key_label(error.key)}{error.detail}") from None
    except ValueError as error:
        raise StorageError(f"{where}: {_key_label(key)}{error}") from None
    blobs, problems = assembler.finish()
    for name, problem in problems.items():
        raise StorageError(f"{where}: blob '{name}' is incomplete: {problem}")
    return blobs, seen


def _key_label(key: bytes | None) -> str:
    if key is None:
        return ""
    text = key.decode("utf-8", errors="replace")
    name = blob_name(key)
    return f"blob '{name}' " if text == name else f"blob '{name}' (key '{text}') "


def _check_load(op: Op) -> None:
    _load_spec(op)


def load(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Read the op's outputs (or, with load_all, every blob) from one or more DBs, or from a DB reader."""
    spec = _load_spec(op)
    wanted = None if spec.load_all else frozenset(spec.source_names)
    found: dict[str, tuple[Any, str]] = {}  # blob -> (value, the DB it came from)
    held: set[str] = set()
    try:
        if op.inputs:
            reader = workspace.get(op.inputs[0], op)
            if not isinstance(reader, DBReader):
                raise StorageError(f"blob '{op.inputs[0]}' is not a DB reader (make one with CreateDB)")
            sources = [(reader.where, reader.remaining)]
        else:
            sources = []
            for db in spec.dbs:
                path = full_db_name(workspace, db, spec.absolute)
                sources.append((describe(path, spec.db_type), _opener(workspace, path, spec, db)))
        for where, open_records in sources:
            with open_records() as records:
                blobs, seen = _assemble(records, where, spec, wanted)
            held.update(seen)
            for name, value in blobs.items():
                if name in found:
                    raise StorageError(f"{where}: blob '{name}' is also in {found[name][1]} (Caffe2: 'Duplicate Key')")
                found[name] = (value, where)
    except StorageError as error:
        raise _reraise(op, error) from None
    if spec.load_all:
        absent = [name for name in op.outputs if name not in found]
        if absent:  # Caffe2 1.10: "Output blob name ... does not exist in the db(s)", allow_incomplete or not
            dbs = ", ".join(where for where, _ in sources)
            raise MissingBlobError(f"{op.where}: load_all: output blob '{absent[0]}' is not in {dbs}")
        for name, (value, _) in found.items():
            workspace.put(name, value)
        return
    missing = [s for s in spec.source_names if s not in found]
    if missing and not spec.allow_incomplete:
        dbs = ", ".join(where for where, _ in sources)
        listed = ", ".join(sorted(held)[:8]) + (f", ... ({len(held)} in all)" if len(held) > 8 else "")
        raise MissingBlobError(
            f"{op.where}: blob '{missing[0]}' is not in {dbs}"
            + (f" (nor {', '.join(repr(m) for m in missing[1:])})" if len(missing) > 1 else "")
            + f"; loaded {len(found)} of {len(spec.source_names)} blobs; the DB holds {listed or 'no blobs'}"
            + (" (allow_incomplete=1 loads what is there)" if found else "")
        )
    for output, source in zip(op.outputs, spec.source_names, strict=True):
        if source in found:
            workspace.put(output, found[source][0])


def _opener(workspace: HostWorkspace, path: str, spec: _LoadSpec, db: str) -> Any:
    @contextlib.contextmanager
    def open_records() -> Iterator[Iterator[tuple[bytes, bytes]]]:
        try:
            with open_cursor(path, spec.db_type) as records:
                yield records
        except StorageError as error:
            if "does not exist" in str(error):
                raise _not_found(error, workspace, db, spec.absolute) from None
            raise

    return open_records


register_host_op("Load", load, check=_check_load)


# --------------------------------------------------------------------------------------------------
# Save and Checkpoint


def _save_names(op: Op, inputs: tuple[str, ...]) -> tuple[str, ...]:
    """The DB names of the inputs: blob_name_overrides, or the input names with strip_prefix applied."""
    overrides = op.strings("blob_name_overrides", ())
    strip = op.str("strip_prefix", "")
    if overrides and len(overrides) != len(inputs):
        raise BadArgumentError(
            f"{op.where}: {len(overrides)} blob_name_overrides for {len(inputs)} inputs; give one per input"
        )
    if overrides and strip:
        raise BadArgumentError(f"{op.where}: strip_prefix and blob_name_overrides are mutually exclusive")
    names = list(overrides)
    if not names:
        for name in inputs:
            position = name.find(strip) if strip else -1
            names.append(name[position + len(strip) :] if position >= 0 else name)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BadArgumentError(f"{op.where}: two inputs would be saved as '{repeated[0]}' (Caffe2: 'Duplicated input')")
    empty = [inputs[i] for i, n in enumerate(names) if not n]
    if empty:
        raise BadArgumentError(f"{op.where}: input '{empty[0]}' would be saved under an empty name")
    return tuple(names)


def _chunk_size(op: Op) -> int:
    size = op.int("chunk_size", -1)
    if size < -1:
        raise BadArgumentError(f"{op.where}: chunk_size {size}: give a number of elements, 0 (no chunks) or -1")
    return size


def blob_options(name: str, options: pb.SerializationOptions) -> pb.BlobSerializationOptions:
    """The first of `options` whose `blob_name_regex` matches `name` whole (an empty one matches any), else the
    defaults: Caffe2's GetBlobOptions."""
    for entry in options.options:
        if not entry.blob_name_regex or re.fullmatch(entry.blob_name_regex, name):
            return entry
    return pb.BlobSerializationOptions()


def _serialization_options(op: Op) -> pb.SerializationOptions:
    """Save's `options` (a serialized SerializationOptions), and after them, as the last default, its older
    `chunk_size` argument when given (load_save_op.cc: its -1 and 0 swapped into the options' 0 and -1)."""
    options = pb.SerializationOptions()
    arg = op.args.get("options")
    if arg is not None and arg.kind == "s" and arg.value:
        raw = arg.value.encode("utf-8", "surrogateescape") if isinstance(arg.value, str) else bytes(arg.value)
        try:
            options.ParseFromString(raw)
        except DecodeError as error:
            raise BadArgumentError(f"{op.where}: unable to parse serialization options: {error}") from None
    for entry in options.options:
        if entry.chunk_size < -1:
            raise BadArgumentError(
                f"{op.where}: options for '{entry.blob_name_regex}': chunk_size {entry.chunk_size}: give a number "
                "of elements, 0 (the default) or -1 (no chunks)"
            )
    if "chunk_size" in op.args:
        options.options.add(chunk_size={-1: 0, 0: -1}.get(_chunk_size(op), _chunk_size(op)))
    return options


def _blob_writing(name: str, options: pb.SerializationOptions) -> tuple[int | None, bool]:
    """What `serialize_blob` takes for blob `name`: its chunk size (None: the default; 0: one chunk) and
    whether its float32 values go as bfloat16."""
    entry = blob_options(name, options)
    chunks = {0: None, -1: 0}.get(entry.chunk_size, entry.chunk_size)
    return chunks, entry.float_format == pb.BlobSerializationOptions.FLOAT_BFLOAT16


def _check_save(op: Op) -> None:
    if op.outputs:
        raise BadArgumentError(f"{op.where}: {op.type} writes a DB, not blobs: it takes no outputs")
    _check_db_type(op, op.str("db_type", ""))
    if not op.str("db", ""):
        raise BadArgumentError(f"{op.where}: {op.type} needs a db argument (Caffe2: 'Must specify a db name.')")
    op.bool("absolute_path", False)
    _save_names(op, op.inputs)
    _serialization_options(op)


def save_blobs(workspace: HostWorkspace, op: Op, db: str) -> str:
    """Write the op's inputs to a new DB `db` (atomically: a failure leaves the old DB and no partial one);
    returns the path written."""
    names = _save_names(op, op.inputs)
    db_type = op.str("db_type")
    path = full_db_name(workspace, db, op.bool("absolute_path", False))
    blobs: dict[str, Any] = {}
    for source, name in zip(op.inputs, names, strict=True):
        value = _array(workspace, source, op)
        if not isinstance(value, np.ndarray | bytes) and blob_type_of(value) is None:
            raise StorageError(
                f"{op.where}: {describe(path, db_type)}: blob '{source}' holds a {type(value).__name__}, "
                "which cannot be saved (Save writes tensors and strings)"
            )
        blobs[name] = value
    try:
        options = _serialization_options(op)
        write_blobs(path, blobs, db_type, per_blob={name: _blob_writing(name, options) for name in blobs})
    except StorageError as error:
        raise _reraise(op, error) from None
    return path


def save(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Caffe2's Save: every input, by name (or override), into a new DB that replaces any old one."""
    save_blobs(workspace, op, op.str("db"))


register_host_op("Save", save, check=_check_save)


# printf conversions: %% or one integer conversion (snprintf of an int64 iteration)
_CONVERSION = re.compile(r"%(%|[-+ 0#]*\d*(?:\.\d+)?(?:hh|h|ll|l|j|z|t|q)?([a-zA-Z]))")


def checkpoint_name(pattern: str, iteration: int) -> str:
    """Caffe2's FormatString(db, iteration): snprintf with the iteration as its one argument. Only integer
    conversions make sense (%d, %05d, %ld); text without one is used as it is."""

    def convert(match: re.Match[str]) -> str:
        if match.group(1) == "%":
            return "%"
        spec = match.group(0)
        kind = match.group(2)
        flags = re.sub(r"(hh|h|ll|l|j|z|t|q)(?=[a-zA-Z]$)", "", spec[:-1])
        value = iteration
        if kind in "di" and "l" not in spec and "j" not in spec and "q" not in spec:
            value = (iteration + 2**31) % 2**32 - 2**31  # %d reads the low 32 bits of the int64
        return (flags + ("d" if kind in "diu" else kind)) % value

    return _CONVERSION.sub(convert, pattern)


def _check_checkpoint(op: Op) -> None:
    if not op.inputs:
        raise BadArgumentError(f"{op.where}: Checkpoint needs the iteration blob as its first input")
    pattern = op.str("db", "")
    if not pattern:
        raise BadArgumentError(
            f"{op.where}: Checkpoint needs a db argument (Caffe2: 'Must specify a checkpoint file pattern.')"
        )
    conversions = [m for m in _CONVERSION.finditer(pattern) if m.group(1) != "%"]
    if len(conversions) > 1 or any(m.group(2) not in "diuxXo" for m in conversions):
        raise BadArgumentError(
            f"{op.where}: Checkpoint's db '{pattern}' may hold one integer conversion (%d) for the iteration, "
            "nothing else"
        )
    if op.int("every", 1) < 1:
        raise BadArgumentError(f"{op.where}: Checkpoint's every must be positive, got {op.int('every', 1)}")
    _check_save(op)


def checkpoint(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Caffe2's Checkpoint: every `every` iterations (the int64 first input), Save every input (the
    iteration blob too) to the DB named by `db` with %d replaced by the iteration."""
    value = _array(workspace, op.inputs[0], op)
    if not isinstance(value, np.ndarray) or value.size < 1 or value.dtype.kind not in "iu":
        raise BadArgumentError(f"{op.where}: blob '{op.inputs[0]}' must hold the integer iteration count")
    iteration = int(value.reshape(-1)[0])
    if iteration % op.int("every", 1) == 0:
        save_blobs(workspace, op, checkpoint_name(op.str("db"), iteration))


register_host_op("Checkpoint", checkpoint, check=_check_checkpoint)
register_host_op("Snapshot", checkpoint, check=_check_checkpoint)  # Caffe2 registers CheckpointOp under both names


# --------------------------------------------------------------------------------------------------
# DBExists


def _check_db_exists(op: Op) -> None:
    if op.inputs or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: DBExists takes no inputs and 1 output")
    _check_db_type(op, op.str("db_type", ""))
    if not op.str("db_name", ""):
        raise BadArgumentError(f"{op.where}: DBExists needs a db_name argument (its name is db_name, not db)")
    op.bool("absolute_path", False)


def db_exists(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A bool scalar: whether the DB opens for reading (Caffe2's DBExists tries to open it)."""
    db_type = op.str("db_type")
    path = full_db_name(workspace, op.str("db_name"), op.bool("absolute_path", False))
    try:
        backend(db_type, path)  # a missing extra is an error, not "does not exist"
    except StorageError as error:
        raise _reraise(op, error) from None
    try:
        with open_cursor(path, db_type):
            exists = True
    except (StorageError, DBAccessError):
        exists = False
    workspace.put(op.outputs[0], np.array(exists))


register_host_op("DBExists", db_exists, check=_check_db_exists)


# --------------------------------------------------------------------------------------------------
# CreateDB and the reader it makes


class DBReader:
    """Caffe2's db::DBReader: a cursor over a DB's records that `read()` advances, wrapping to the first
    record at the end; with shards, it reads records shard_id, shard_id + num_shards, ..."""

    def __init__(self, path: str, db_type: str, num_shards: int = 1, shard_id: int = 0):
        self.path, self.db_type = path, db_type
        self.num_shards, self.shard_id = num_shards, shard_id
        self.where = describe(path, db_type)
        self._stack: contextlib.ExitStack | None = None
        self._records: Iterator[tuple[bytes, bytes]] | None = None
        self._current: tuple[bytes, bytes] | None = None
        self._rewind()

    def _next(self) -> tuple[bytes, bytes] | None:
        assert self._records is not None
        try:
            return next(self._records, None)
        except DBAccessError as error:
            raise StorageError(f"{self.where}: {_key_label(error.key)}{error.detail}") from None

    def _rewind(self) -> None:
        self.close()
        self._stack = contextlib.ExitStack()
        try:
            self._records = self._stack.enter_context(open_cursor(self.path, self.db_type))
        except DBAccessError as error:
            self.close()
            raise StorageError(f"{self.where}: {error.detail}") from None
        self._current = self._next()
        if self._current is None:
            raise StorageError(f"{self.where} holds no records to read")
        for _ in range(self.shard_id):
            self._current = self._next()
            if self._current is None:
                raise StorageError(f"{self.where} has fewer records than shard_id {self.shard_id}")

    def read(self) -> tuple[bytes, bytes]:
        """The current record; then move num_shards records on, back to the start at the end."""
        record = self._current
        assert record is not None
        for _ in range(self.num_shards):
            self._current = self._next()
            if self._current is None:
                self._rewind()
                break
        return record

    @contextlib.contextmanager
    def remaining(self) -> Iterator[Iterator[tuple[bytes, bytes]]]:
        """The records from the current one to the end (what Load reads from a reader); the reader then
        starts again from the first record."""

        def records() -> Iterator[tuple[bytes, bytes]]:
            while self._current is not None:
                yield self._current
                self._current = self._next()

        try:
            yield records()
        finally:
            self._rewind()

    def close(self) -> None:
        if self._stack is not None:
            if self._records is not None and hasattr(self._records, "close"):
                self._records.close()  # type: ignore[union-attr]
            self._stack.close()
        self._stack = self._records = self._current = None

    def __repr__(self) -> str:
        return f"DBReader({self.where})"


def _check_create_db(op: Op) -> None:
    if op.inputs or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: CreateDB takes no inputs and 1 output (the reader)")
    _check_db_type(op, op.str("db_type", "leveldb"))
    if not op.str("db", ""):
        raise BadArgumentError(f"{op.where}: CreateDB needs a db argument (Caffe2: 'Must specify a db name.')")
    shards, shard = op.int("num_shards", 1), op.int("shard_id", 0)
    if shards < 1 or not 0 <= shard < shards:
        raise BadArgumentError(f"{op.where}: shard_id {shard} of num_shards {shards}: need 0 <= shard_id < num_shards")


def create_db(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A DBReader over `db` (of `db_type`, Caffe2's default leveldb) in the op's output blob."""
    db = op.str("db")
    path = db if os.path.isabs(db) or workspace.db_root is None else os.path.join(workspace.db_root, db)
    try:
        reader = DBReader(path, op.str("db_type", "leveldb"), op.int("num_shards", 1), op.int("shard_id", 0))
    except StorageError as error:
        found = _not_found(error, workspace, db, False) if "does not exist" in str(error) else error
        raise _reraise(op, found) from None
    workspace.put(op.outputs[0], reader)


register_host_op("CreateDB", create_db, check=_check_create_db)


# --------------------------------------------------------------------------------------------------
# TensorProtosDBInput


def _check_tensor_protos_input(op: Op) -> None:
    if len(op.inputs) != 1 or not op.outputs:
        raise BadArgumentError(f"{op.where}: TensorProtosDBInput takes 1 input (a DB reader) and 1 or more outputs")
    if op.int("batch_size", 0) < 0:
        raise BadArgumentError(f"{op.where}: batch_size must not be negative")


def _record_tensors(where: str, key: bytes, value: bytes, count: int) -> list[np.ndarray]:
    label = f"{where}: record '{key.decode('utf-8', errors='replace')}'"
    protos = pb.TensorProtos()
    try:
        protos.ParseFromString(value)
    except DecodeError:
        raise StorageError(f"{label} is not a serialized TensorProtos (the DB is corrupt)") from None
    if len(protos.protos) != count:
        raise StorageError(f"{label} holds {len(protos.protos)} tensors; the op has {count} outputs, one per tensor")
    tensors = []
    for index, proto in enumerate(protos.protos):
        try:
            values = tensor_values(proto)
        except ValueError as error:
            raise StorageError(f"{label}, tensor #{index}: {error}") from None
        dims = tuple(int(d) for d in proto.dims)
        if any(d < 0 for d in dims) or values.size != math.prod(dims):
            raise StorageError(f"{label}, tensor #{index} has dims {list(dims)} but {values.size} values")
        dtype = np.dtype(object) if proto.data_type == pb.TensorProto.STRING else DATA_TYPES[proto.data_type]
        tensors.append(values.astype(dtype, copy=False).reshape(dims))
    return tensors


def tensor_protos_db_input(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Read `batch_size` records of TensorProtos (one tensor per output) and stack each output's tensors
    into a batch [batch_size, ...]; with batch_size 0, one record's tensors as they are."""
    reader = workspace.get(op.inputs[0], op)
    if not isinstance(reader, DBReader):
        raise StorageError(f"{op.where}: blob '{op.inputs[0]}' is not a DB reader (make one with CreateDB)")
    count, batch = len(op.outputs), op.int("batch_size", 0)
    try:
        items = [_record_tensors(reader.where, *reader.read(), count) for _ in range(max(batch, 1))]
    except StorageError as error:
        raise _reraise(op, error) from None
    for index, name in enumerate(op.outputs):
        first = items[0][index]
        if batch == 0:
            workspace.put(name, first)
            continue
        for item in items[1:]:
            if item[index].shape != first.shape or item[index].dtype != first.dtype:
                raise StorageError(
                    f"{op.where}: {reader.where}: tensor #{index} (blob '{name}') is {first.dtype} "
                    f"{list(first.shape)} in one record and {item[index].dtype} {list(item[index].shape)} "
                    "in another; a batch needs one shape"
                )
        workspace.put(name, np.stack([item[index] for item in items]))


register_host_op("TensorProtosDBInput", tensor_protos_db_input, check=_check_tensor_protos_input)


def loaded_values(workspace: HostWorkspace) -> dict[str, Any]:
    """The workspace's array blobs (host objects such as DB readers left out): what an init net made."""
    values = {}
    for name in workspace.blobs():
        value = workspace.get(name)
        if isinstance(value, jax.Array | np.ndarray):
            values[name] = value
    return values


# --------------------------------------------------------------------------------------------------
# StoreSet, StoreGet, StoreAdd, StoreWait (caffe2/distributed/store_ops.cc): blobs through a store handler


def _store(workspace: HostWorkspace, op: Op) -> StoreHandler:
    handler = workspace.get(op.inputs[0], op)
    if not isinstance(handler, StoreHandler):
        raise InputTypeError(
            f"{op.where}: blob '{op.inputs[0]}' holds a {type(handler).__name__}, not a store handler (make one with "
            "FileStoreHandlerCreate or RedisStoreHandlerCreate)"
        )
    return handler


def _check_store_set(op: Op) -> None:
    if len(op.inputs) != 2 or op.outputs:
        raise BadArgumentError(f"{op.where}: StoreSet takes 2 inputs (the handler, the blob) and no outputs")
    op.str("blob_name", "")


def store_set(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Store the blob, serialized as Caffe2's SerializeBlob does, under blob_name (default: its name). A key
    already set must get the same value here (rnn2jax's stores are set-once; Caffe2's file store overwrites)."""
    name = op.str("blob_name", "") or op.inputs[1]
    value = _array(workspace, op.inputs[1], op)
    if not isinstance(value, np.ndarray | bytes) and blob_type_of(value) is None:
        raise StorageError(
            f"{op.where}: blob '{op.inputs[1]}' holds a {type(value).__name__}, which cannot be serialized"
        )
    try:
        ((_, data),) = serialize_blob(name, value, chunk_size=0)
    except ValueError as error:
        raise StorageError(f"{op.where}: blob '{op.inputs[1]}': {error}") from None
    try:
        _store(workspace, op).set(name, data)
    except DistributedError as error:
        raise _reraise(op, error) from None


def _check_store_get(op: Op) -> None:
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: StoreGet takes 1 input (the handler) and 1 output")
    op.str("blob_name", "")


def store_get(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Read the blob stored under blob_name (default: the output's name), waiting for it as Caffe2 does."""
    name = op.str("blob_name", "") or op.outputs[0]
    handler = _store(workspace, op)
    try:
        data = handler.get(name)
    except DistributedError as error:
        raise _reraise(op, error) from None
    assembler = BlobAssembler(handler.where)
    try:
        assembler.add(name.encode("utf-8"), data)
    except ValueError as error:
        raise StorageError(f"{op.where}: {handler.where}: key '{name}' {error}") from None
    blobs, problems = assembler.finish()
    if problems or name not in blobs:
        raise StorageError(f"{op.where}: {handler.where}: key '{name}' holds an incomplete blob")
    workspace.put(op.outputs[0], blobs[name])


def _check_store_add(op: Op) -> None:
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: StoreAdd takes 1 input (the handler) and 1 output")
    if not op.str("blob_name", ""):
        raise BadArgumentError(f"{op.where}: StoreAdd needs a blob_name argument (the counter's key)")
    op.int("add_value", 1)


def store_add(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Add add_value to the integer counter at blob_name; the new value (int64). The file store has no
    counters (Caffe2 aborts: 'add not implemented for FileStoreHandler'), nor does rnn2jax's Redis store yet."""
    handler = _store(workspace, op)
    add = getattr(handler, "add", None)
    if add is None:
        raise DistributedError(
            f"{op.where}: {handler.where} has no counters: StoreAdd is not implemented for {type(handler).__name__} "
            "(Caffe2's FileStoreHandler aborts the process here)"
        )
    workspace.put(op.outputs[0], np.array(int(add(op.str("blob_name"), op.int("add_value", 1))), np.int64))


def _check_store_wait(op: Op) -> None:
    if not op.inputs or op.outputs:
        raise BadArgumentError(
            f"{op.where}: StoreWait takes the handler (and blobs whose names to wait for), no outputs"
        )
    if len(op.inputs) == 1 and not op.strings("blob_names", ()):
        raise BadArgumentError(f"{op.where}: StoreWait needs blob_names, or the blobs as inputs after the handler")


def store_wait(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Wait until every key is set: blob_names, or the names of the inputs after the handler."""
    names = list(op.strings("blob_names", ())) if len(op.inputs) == 1 else list(op.inputs[1:])
    try:
        _store(workspace, op).wait(names)
    except DistributedError as error:
        raise _reraise(op, error) from None


register_host_op("StoreSet", store_set, check=_check_store_set)
register_host_op("StoreGet", store_get, check=_check_store_get)
register_host_op("StoreAdd", store_add, check=_check_store_add)
register_host_op("StoreWait", store_wait, check=_check_store_wait)


# --------------------------------------------------------------------------------------------------
# CreateBlobsQueueDB (caffe2/queue/blobs_queue_db.h): a DB reader whose records a blobs queue holds


class BlobsQueueReader(DBReader):
    """Caffe2's BlobsQueueDB cursor: each read dequeues one record of the queue, whose blob at
    value_blob_index (a string, or a string tensor's first element) is the record's value and, with
    key_blob_index >= 0, the blob there its key. It cannot seek, so Load cannot read it."""

    def __init__(self, workspace: HostWorkspace, queue: BlobsQueue, key_index: int, value_index: int, op: Op):
        self.workspace, self.queue, self.key_index, self.value_index, self.op = (
            workspace,
            queue,
            key_index,
            value_index,
            op,
        )
        self.where = f"blobs queue DB over queue '{queue.name}'"
        self._stack = self._records = self._current = None

    def _string(self, value: Any, index: int) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, np.ndarray) and value.dtype == object and value.size:
            return bytes(value.reshape(-1)[0])
        raise StorageError(f"{self.where}: the record's blob #{index} holds a {type(value).__name__}, not a string")

    def read(self) -> tuple[bytes, bytes]:
        queue = self.queue
        if not queue.can_read():
            if queue.closed:
                raise StorageError(f"{self.where}: the queue is closed and empty (Caffe2: 'it is closed')")
            raise StorageError(
                f"{self.where}: the queue is empty and open: Caffe2 would wait for another thread to fill it, and "
                "nothing runs beside a host op here"
            )
        with queue.cond:  # a writer waiting on the full queue wakes
            row = queue.slots[queue.reader % len(queue.slots)]
            values = [self.workspace.get(slot) if self.workspace.has_blob(slot) else None for slot in row]
            for slot in row[:1]:  # Caffe2 swaps the first blob out with an empty one
                self.workspace.reset(slot)
            queue.reader += 1
            queue.cond.notify_all()
        key = self._string(values[self.key_index], self.key_index) if self.key_index >= 0 else b""
        return key, self._string(values[self.value_index], self.value_index)

    @contextlib.contextmanager
    def remaining(self) -> Iterator[Iterator[tuple[bytes, bytes]]]:
        raise StorageError(f"{self.where} cannot seek: read it with TensorProtosDBInput, not Load")
        yield iter(())

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"BlobsQueueReader({self.queue.name!r})"


def _check_create_blobs_queue_db(op: Op) -> None:
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        raise BadArgumentError(f"{op.where}: CreateBlobsQueueDB takes 1 input (the queue) and 1 output (the reader)")
    if op.int("value_blob_index", 0) < 0:
        raise BadArgumentError(f"{op.where}: value_blob_index must not be negative")
    op.int("key_blob_index", -1)
    op.float("timeout_secs", 0.0)


def create_blobs_queue_db(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """A DB reader over the queue's records (TensorProtosDBInput reads it)."""
    queue = workspace.get(op.inputs[0], op)
    if not isinstance(queue, BlobsQueue):
        raise InputTypeError(f"{op.where}: blob '{op.inputs[0]}' holds a {type(queue).__name__}, not a blobs queue")
    key, value = op.int("key_blob_index", -1), op.int("value_blob_index", 0)
    if max(key, value) >= queue.num_blobs:
        raise BadArgumentError(
            f"{op.where}: queue '{queue.name}' has {queue.num_blobs} blobs a record; index {max(key, value)}"
        )
    workspace.put(op.outputs[0], BlobsQueueReader(workspace, queue, key, value, op))


register_host_op("CreateBlobsQueueDB", create_blobs_queue_db, check=_check_create_blobs_queue_db)
