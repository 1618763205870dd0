"""Host ops for training across processes: Caffe2's store handlers (`caffe2/distributed`:
FileStoreHandlerCreate, RedisStoreHandlerCreate) and its Gloo collectives (`caffe2/contrib/gloo`:
CreateCommonWorld, CloneCommonWorld, DestroyCommonWorld, Allreduce, Broadcast, Barrier, Allgather,
ReduceScatter), on JAX's multi-process runtime. (Caffe2's Reduce has no implementation in its CPU build: it
registers no engine for it, and its default refuses to run, so rnn2jax has none either.)

A store handler is a key/value store every process of a run reaches: a folder they share, or a Redis
server. Caffe2's Gloo published each process's address there; rnn2jax publishes one, the address of JAX's
coordinator, which process 0 (rank 0) starts, and every process then joins JAX's runtime
(`jax.distributed.initialize`, with Gloo as the CPU collectives; GPUs use NCCL). JAX must start that
runtime before its backend, so the first common world (or `data_parallel_model.Parallelize` given a
rendezvous, which joins at once) must come before anything computes in the process. A run that called
`jax.distributed.initialize` itself (or runs where JAX finds its cluster: MPI, SLURM) needs no store.

A common world is every process of the run (a world of size 1 is the process alone). Its collectives make
one global array of each process's value, over a mesh of one device per process
(`jax.make_array_from_process_local_data`), and run a jitted sum (Allreduce) or selection (Broadcast)
replicated back to every process: XLA does the exchange. As in Caffe2 they work in place, and Allreduce
also sums the op's several local inputs (one per device copy) into the one total.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..errors import BadArgumentError, DistributedError, ShapeError
from ..ir.netdef import Op
from .facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_GRADIENT, NO_ROLES
from .registry import UNBOUNDED, HostWorkspace, declare_family, register_host_op

declare_family(
    __name__, roles=NO_ROLES, shape_rule=HOST_OP_NO_SHAPE_RULE, gradient=NO_GRADIENT, emitter=HOST_OP_NO_EMITTER
)

DEFAULT_TIMEOUT_S = 30.0  # Caffe2's StoreHandler::kDefaultTimeout, and its common worlds' default
COORDINATOR_KEY = "rnn2jax/jax_coordinator"
_POLL_S = 0.01
_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of a network interface


# --------------------------------------------------------------------------------------------------
# Store handlers


class StoreHandler:
    """Caffe2's StoreHandler: `set` a key once, `get` it (waiting for it), `check` and `wait` for keys.
    Values are bytes. A key set again must get the same value (Caffe2's contract): a store that holds an
    earlier run's different value is refused, since the processes would meet the wrong run."""

    where: str

    def _read(self, name: str) -> bytes | None:
        raise NotImplementedError

    def _create(self, name: str, data: bytes) -> bool:
        """Store `data` under `name` unless the key exists (atomically); False when it did."""
        raise NotImplementedError

    def set(self, name: str, data: bytes | str) -> None:
        data = data.encode() if isinstance(data, str) else bytes(data)
        if not self._create(name, data) and self._read(name) != data:
            raise DistributedError(
                f"{self.where}: key '{name}' already holds another value, left by an earlier run: give each run an "
                "empty store (a new folder or prefix)"
            )

    def get(self, name: str, timeout: float = DEFAULT_TIMEOUT_S) -> bytes:
        self.wait([name], timeout)
        value = self._read(name)
        assert value is not None
        return value

    def check(self, names: Sequence[str]) -> bool:
        return all(self._read(name) is not None for name in names)

    def wait(self, names: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait until every key of `names` is set; `timeout` seconds at most (0: no limit, as Caffe2's kNoTimeout)."""
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while not self.check(names):
            if deadline is not None and time.monotonic() > deadline:
                missing = [n for n in names if self._read(n) is None]
                raise DistributedError(
                    f"{self.where}: key(s) {', '.join(missing)} did not appear within {timeout:g} s (did every "
                    "process start, with the same store?)"
                )
            time.sleep(_POLL_S)


class FileStoreHandler(StoreHandler):
    """Caffe2's FileStoreHandler: one file per key in `path` (a folder every process sees, such as NFS) or
    in its sub-folder `prefix`. Keys are written whole (a temporary file linked into place)."""

    def __init__(self, path: str, prefix: str = ""):
        if not os.path.isdir(path):
            raise DistributedError(f"FileStoreHandler: path '{path}' is not an existing folder")
        base = os.path.realpath(path)
        if prefix:
            base = os.path.join(base, _encode(prefix))
            os.makedirs(base, exist_ok=True)
        self.path, self.prefix, self.base = path, prefix, base
        self.where = f"file store {base}"

    def _file(self, name: str) -> str:
        return os.path.join(self.base, _encode(name))

    def _read(self, name: str) -> bytes | None:
        try:
            with open(self._file(name), "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None

    def _create(self, name: str, data: bytes) -> bool:
        final = self._file(name)
        temporary = f"{final}.tmp.{os.getpid()}.{time.monotonic_ns()}"
        with open(temporary, "wb") as file:
            file.write(data)
        try:
            os.link(temporary, final)  # fails if the key exists: set-if-absent, never a half-written value
            return True
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: Caffe2's own way, an atomic rename
            if os.path.exists(final):
                return False
            os.replace(temporary, final)
            return True
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)

    def __repr__(self) -> str:
        return f"FileStoreHandler({self.base!r})"


class RedisStoreHandler(StoreHandler):
    """Caffe2's RedisStoreHandler: keys `<prefix>/<name>` on a Redis server (needs the `redis` package)."""

    def __init__(self, host: str, port: int, prefix: str = "", client: Any = None):
        if client is None:
            try:
                import redis
            except ImportError:
                raise DistributedError(
                    "RedisStoreHandler needs the Python package 'redis', which is not installed: pip install redis "
                    "(or use FileStoreHandlerCreate with a folder every process sees)"
                ) from None
            client = redis.Redis(host=host, port=port)
        self.host, self.port, self.prefix, self.client = host, port, prefix, client
        self.where = f"redis store {host}:{port}/{prefix}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _read(self, name: str) -> bytes | None:
        value = self.client.get(self._key(name))
        return None if value is None else bytes(value)

    def _create(self, name: str, data: bytes) -> bool:
        return bool(self.client.set(self._key(name), data, nx=True))

    def __repr__(self) -> str:
        return f"RedisStoreHandler({self.host!r}, {self.port})"


def _encode(name: str) -> str:
    """A key as one file name (Caffe2's keys may hold '/')."""
    return urllib.parse.quote(name, safe="") or "%"


# --------------------------------------------------------------------------------------------------
# JAX's multi-process runtime


class ProcessGroup:
    """The processes of JAX's runtime, with the collectives between them: a mesh of one device per process
    (the lowest-numbered of each), and jitted reductions over it, replicated back to every process."""

    def __init__(self) -> None:
        self.size, self.rank = jax.process_count(), jax.process_index()
        firsts: dict[int, Any] = {}
        for device in sorted(jax.devices(), key=lambda d: d.id):
            firsts.setdefault(device.process_index, device)
        self.mesh = Mesh(np.array([firsts[p] for p in range(self.size)]), ("processes",))
        self._rows = NamedSharding(self.mesh, PartitionSpec("processes"))
        self._whole = NamedSharding(self.mesh, PartitionSpec())
        self._sum = jax.jit(lambda x: jnp.sum(x, axis=0, dtype=x.dtype), out_shardings=self._whole)
        self._pick: dict[int, Callable[[jax.Array], jax.Array]] = {}
        self._all: Callable[[jax.Array], jax.Array] | None = None

    def _gather(self, value: Any) -> jax.Array:
        value = jnp.asarray(value)
        return jax.make_array_from_process_local_data(self._rows, value[None], (self.size, *value.shape))

    def allreduce(self, value: Any) -> jax.Array:
        """The sum of every process's `value` (same shape and dtype everywhere)."""
        return self._sum(self._gather(value)).addressable_data(0)

    def allgather(self, value: Any) -> jax.Array:
        """Every process's `value` (same shape and dtype everywhere), stacked in rank order, on every process."""
        if self._all is None:
            self._all = jax.jit(lambda x: x, out_shardings=self._whole)
        return self._all(self._gather(value)).addressable_data(0)

    def broadcast(self, value: Any, root: int) -> jax.Array:
        """Process `root`'s `value`, on every process."""
        pick = self._pick.get(root)
        if pick is None:
            pick = self._pick[root] = jax.jit(lambda x: x[root], out_shardings=self._whole)
        return pick(self._gather(value)).addressable_data(0)


_GROUP: ProcessGroup | None = None


def process_group() -> ProcessGroup:
    global _GROUP
    if _GROUP is None:
        _GROUP = ProcessGroup()
    return _GROUP


def _backend_started() -> bool:
    started = getattr(getattr(getattr(jax, "_src", None), "xla_bridge", None), "backends_are_initialized", None)
    return bool(started()) if started is not None else False


def join(
    store: StoreHandler | None,
    size: int,
    rank: int,
    *,
    where: str,
    interface: str = "",
    timeout: float = DEFAULT_TIMEOUT_S,
) -> ProcessGroup | None:
    """Make this process rank `rank` of the `size` processes of JAX's runtime, starting the runtime when
    it is not running (rank 0 publishes its coordinator's address in `store`, the others read it; without a
    store, JAX finds its cluster itself). None for a world of one process, which needs no runtime.
    `interface` names the network interface whose address rank 0 publishes (default: its host name)."""
    if size < 1 or not 0 <= rank < size:
        raise BadArgumentError(f"{where}: rank {rank} of size {size}: need size >= 1 and 0 <= rank < size")
    if size == 1:
        return None
    if jax.distributed.is_initialized():
        if (jax.process_count(), jax.process_index()) != (size, rank):
            raise DistributedError(
                f"{where}: asks to be process {rank} of {size}, but JAX's multi-process runtime already runs "
                f"this process as {jax.process_index()} of {jax.process_count()}"
            )
        return process_group()
    if _backend_started():
        raise DistributedError(
            f"{where}: process {rank} of {size} must start JAX's multi-process runtime, and JAX starts it only "
            "before its backend, which something in this process already started (a net ran, a blob was fed, "
            "jax.devices() was called): create the store handler and the common world (or call "
            "data_parallel_model.Parallelize) before anything computes, or call jax.distributed.initialize first"
        )
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs: dict[str, Any] = {"num_processes": size, "process_id": rank, "initialization_timeout": max(1, int(timeout))}
    address = "found by JAX from its cluster environment"
    if store is not None:
        if rank == 0:
            host = _interface_address(interface, where) if interface else socket.gethostname()
            address = f"{host}:{_free_port(host if interface else '')}"
            if interface:
                kwargs["coordinator_bind_address"] = address
            store.set(COORDINATOR_KEY, address)
        else:
            address = store.get(COORDINATOR_KEY, timeout).decode()
        kwargs["coordinator_address"] = address
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as error:  # JAX raises RuntimeError, ValueError or its own runtime errors here
        raise DistributedError(
            f"{where}: process {rank} of {size} could not join JAX's multi-process runtime (coordinator "
            f"{address}): {error}"
        ) from error
    return process_group()


def _interface_address(interface: str, where: str) -> str:
    """The IPv4 address of network interface `interface` (Linux)."""
    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except (ImportError, OSError):
        names = ", ".join(name for _, name in socket.if_nameindex())
        raise DistributedError(
            f"{where}: network interface '{interface}' has no IPv4 address here; this machine's interfaces: {names}"
        ) from None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


# --------------------------------------------------------------------------------------------------
# The ops


@dataclasses.dataclass(frozen=True)
class CommonWorld:
    """Caffe2's common world: the `size` processes a collective op spans, this one being `rank`; `group`
    is JAX's runtime (None for a world of one process)."""

    size: int
    rank: int
    group: ProcessGroup | None

    def allreduce(self, value: Any) -> Any:
        return value if self.group is None else self.group.allreduce(value)

    def broadcast(self, value: Any, root: int) -> Any:
        return value if self.group is None else self.group.broadcast(value, root)

    def allgather(self, value: Any) -> Any:
        return jnp.asarray(value)[None] if self.group is None else self.group.allgather(value)


def _check_counts(op: Op, inputs: tuple[int, int], outputs: tuple[int, int], what: str) -> None:
    if not (inputs[0] <= len(op.inputs) <= inputs[1] and outputs[0] <= len(op.outputs) <= outputs[1]):
        raise BadArgumentError(f"{op.where}: {op.type} takes {what}")


def _check_file_store(op: Op) -> None:
    _check_counts(op, (0, 0), (1, 1), "no inputs and 1 output (the store handler)")
    if not op.str("path", ""):
        raise BadArgumentError(f"{op.where}: path is a required argument (the folder the processes share)")


def file_store_handler_create(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    try:
        handler = FileStoreHandler(op.str("path"), op.str("prefix", ""))
    except DistributedError as error:
        raise DistributedError(f"{op.where}: {error}") from None
    workspace.put(op.outputs[0], handler)


def _check_redis_store(op: Op) -> None:
    _check_counts(op, (0, 0), (1, 1), "no inputs and 1 output (the store handler)")
    if not op.str("host", ""):
        raise BadArgumentError(f"{op.where}: host is a required argument (the Redis server)")
    if not op.int("port", 0):
        raise BadArgumentError(f"{op.where}: port is a required argument (the Redis server's)")


def redis_store_handler_create(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    try:
        handler = RedisStoreHandler(op.str("host"), op.int("port"), op.str("prefix", ""))
    except DistributedError as error:
        raise DistributedError(f"{op.where}: {error}") from None
    workspace.put(op.outputs[0], handler)


_ENGINES = ("", "GLOO")


def _check_engine(op: Op) -> None:
    if op.engine.upper() not in _ENGINES:
        raise BadArgumentError(
            f"{op.where}: engine '{op.engine}' is not supported: rnn2jax runs collectives on JAX's runtime (Gloo "
            "between CPUs, NCCL between GPUs); give engine GLOO"
        )


def _check_create_world(op: Op) -> None:
    _check_counts(op, (0, 1), (1, 1), "an optional store handler and 1 output (the common world)")
    _check_engine(op)
    size, rank = op.int("size", 0), op.int("rank", 0)
    if size < 1 or not 0 <= rank < size:
        raise BadArgumentError(f"{op.where}: rank {rank} of size {size}: need size >= 1 and 0 <= rank < size")


def create_common_world(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Join the `size` processes of the run as `rank` (starting JAX's runtime at the first world)."""
    store = None
    if op.inputs:
        store = workspace.get(op.inputs[0], op)
        if not isinstance(store, StoreHandler):
            raise DistributedError(
                f"{op.where}: blob '{op.inputs[0]}' is not a store handler (make one with FileStoreHandlerCreate)"
            )
    size, rank = op.int("size"), op.int("rank", 0)
    timeout_ms = op.int("timeout_ms", -1)
    timeout = timeout_ms / 1000 if timeout_ms > 0 else DEFAULT_TIMEOUT_S
    group = join(store, size, rank, where=op.where, interface=op.str("interface", ""), timeout=timeout)
    workspace.put(op.outputs[0], CommonWorld(size, rank, group))


def _world(workspace: HostWorkspace, op: Op) -> CommonWorld:
    world = workspace.get(op.inputs[0], op)
    if not isinstance(world, CommonWorld):
        raise DistributedError(
            f"{op.where}: blob '{op.inputs[0]}' is not a common world (make one with CreateCommonWorld)"
        )
    return world


def _check_clone_world(op: Op) -> None:
    _check_counts(op, (1, 1), (1, 1), "1 input (an existing common world) and 1 output")


def clone_common_world(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    workspace.put(op.outputs[0], _world(workspace, op))


def _check_destroy_world(op: Op) -> None:
    _check_counts(op, (1, 1), (0, 1), "1 input (the common world)")


def destroy_common_world(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Nothing to close: JAX's runtime serves the whole process, and stops when it exits."""
    _world(workspace, op)


def _check_collective(op: Op) -> None:
    _check_engine(op)
    if len(op.inputs) < 2 or list(op.outputs) != list(op.inputs[1:]):
        raise BadArgumentError(
            f"{op.where}: {op.type} takes a common world and 1 or more blobs, and works in place (its outputs must "
            f"be its inputs after the common world); got inputs {list(op.inputs)}, outputs {list(op.outputs)}"
        )


def _tensors(workspace: HostWorkspace, op: Op) -> list[jax.Array]:
    values = []
    for name in op.inputs[1:]:
        value = workspace.get(name, op)
        if not isinstance(value, jax.Array | np.ndarray) or value.dtype == object:
            raise DistributedError(f"{op.where}: blob '{name}' holds no numeric tensor ({type(value).__name__})")
        values.append(jnp.asarray(value))
    first = values[0]
    for name, value in zip(op.inputs[2:], values[1:], strict=True):
        if value.shape != first.shape or value.dtype != first.dtype:
            raise ShapeError(
                f"{op.where}: blob '{name}' is {value.dtype} {list(value.shape)}, blob '{op.inputs[1]}' "
                f"{first.dtype} {list(first.shape)}; {op.type} needs one shape and dtype"
            )
    return values


def allreduce(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Every blob becomes the sum of all of them on every process (Caffe2's Gloo allreduce: Sum)."""
    world = _world(workspace, op)
    values = _tensors(workspace, op)
    total = values[0]
    for value in values[1:]:
        total = total + value
    total = world.allreduce(total)
    for name in op.outputs:
        workspace.put(name, total)


def _check_broadcast(op: Op) -> None:
    _check_collective(op)
    if op.int("root", 0) < 0:
        raise BadArgumentError(f"{op.where}: root {op.int('root', 0)} is not a process")


def broadcast(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Every blob becomes process `root`'s first blob (Caffe2's Gloo broadcast)."""
    world = _world(workspace, op)
    root = op.int("root", 0)
    if root >= world.size:
        raise BadArgumentError(f"{op.where}: root {root} is not a process of a common world of size {world.size}")
    value = world.broadcast(_tensors(workspace, op)[0], root)
    for name in op.outputs:
        workspace.put(name, value)


def _check_barrier(op: Op) -> None:
    _check_counts(op, (1, 1), (0, 0), "1 input (the common world) and no outputs")
    _check_engine(op)


def barrier(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Return once every process of the world has reached its barrier."""
    _world(workspace, op).allreduce(jnp.zeros((), jnp.int32)).block_until_ready()


_ALLGATHER_TYPES = tuple(np.dtype(t) for t in (np.float32, np.int64, np.int32, np.float16))
_REDUCE_SCATTER_TYPES = tuple(np.dtype(t) for t in (np.float32, np.float16))


def _same_size_and_type(op: Op, values: Sequence[Any], names: Sequence[str], types: tuple[np.dtype, ...]) -> None:
    """Caffe2's Gloo ops: every tensor of one element count and one dtype, a dtype Gloo's algorithm takes."""
    first = values[0]
    for name, value in zip(names, values, strict=True):
        if not isinstance(value, jax.Array | np.ndarray) or value.dtype == object:
            raise DistributedError(f"{op.where}: blob '{name}' holds no numeric tensor ({type(value).__name__})")
        if value.size != first.size:
            raise ShapeError(f"{op.where}: blob '{name}' has {value.size} elements, blob '{names[0]}' {first.size}")
        if value.dtype != first.dtype:
            raise ShapeError(f"{op.where}: blob '{name}' is {value.dtype}, blob '{names[0]}' {first.dtype}")
    if np.dtype(first.dtype) not in types:
        raise DistributedError(
            f"{op.where}: {op.type} takes {', '.join(str(t) for t in types)} tensors; blob '{names[0]}' is "
            f"{first.dtype} (Caffe2: Unhandled type)"
        )


def _check_allgather(op: Op) -> None:
    _check_counts(op, (2, UNBOUNDED), (1, 1), "a common world, 1 or more blobs and 1 output")
    _check_engine(op)


def allgather(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """Every process's blobs, flattened and concatenated: process 0's blobs in order, then process 1's, ...
    (Caffe2's Gloo allgather ring), as one 1-D tensor on every process."""
    world = _world(workspace, op)
    names = op.inputs[1:]
    values = [workspace.get(name, op) for name in names]
    _same_size_and_type(op, values, names, _ALLGATHER_TYPES)
    local = jnp.concatenate([jnp.ravel(jnp.asarray(value)) for value in values])
    workspace.put(op.outputs[0], jnp.ravel(world.allgather(local)))


def _check_reduce_scatter(op: Op) -> None:
    _check_engine(op)
    if len(op.inputs) < 3 or list(op.outputs) != list(op.inputs[1:]):
        raise BadArgumentError(
            f"{op.where}: ReduceScatter takes a common world, 1 or more blobs and the receive counts, and works in "
            f"place (its outputs must be its inputs after the common world); got inputs {list(op.inputs)}, "
            f"outputs {list(op.outputs)}"
        )


def reduce_scatter(workspace: HostWorkspace, op: Op, state: dict[str, Any]) -> None:
    """The sum of every blob on every process, scattered: process r gets `recv_counts[r]` elements (the
    last input: int32, one count per process), those after the first `recv_counts[0] + ... +
    recv_counts[r-1]` of the flattened sum, at the start of each of its blobs (Caffe2's Gloo halving-doubling
    reduce-scatter). Caffe2 leaves the rest of the blobs holding the algorithm's partial sums; rnn2jax
    leaves the sum there."""
    world = _world(workspace, op)
    names, counts_name = op.inputs[1:-1], op.inputs[-1]
    values = [workspace.get(name, op) for name in names]
    _same_size_and_type(op, values, names, _REDUCE_SCATTER_TYPES)
    counts = workspace.get(counts_name, op)
    if not isinstance(counts, jax.Array | np.ndarray) or counts.dtype != np.int32 or counts.size != world.size:
        raise ShapeError(
            f"{op.where}: receive counts '{counts_name}' must be int32 with one count per process ({world.size}); "
            f"got {getattr(counts, 'dtype', type(counts).__name__)} {list(getattr(counts, 'shape', ()))}"
        )
    counts = np.asarray(counts).ravel().astype(np.int64)
    size = int(values[0].size)
    if np.any(counts < 0) or counts.sum() > size:
        raise ShapeError(
            f"{op.where}: receive counts '{counts_name}' {counts.tolist()} must be >= 0 and add up to at most the "
            f"{size} elements of blob '{names[0]}'"
        )
    total = jnp.ravel(jnp.asarray(values[0]))
    for value in values[1:]:
        total = total + jnp.ravel(jnp.asarray(value))
    total = jnp.ravel(world.allreduce(total))
    start, count = int(counts[: world.rank].sum()), int(counts[world.rank])
    mine = total.at[:count].set(total[start : start + count])
    for name, value in zip(names, values, strict=True):
        workspace.put(name, mine.reshape(value.shape))


register_host_op("FileStoreHandlerCreate", file_store_handler_create, check=_check_file_store)
register_host_op("RedisStoreHandlerCreate", redis_store_handler_create, check=_check_redis_store)
register_host_op("CreateCommonWorld", create_common_world, check=_check_create_world)
register_host_op("CloneCommonWorld", clone_common_world, check=_check_clone_world)
register_host_op("DestroyCommonWorld", destroy_common_world, check=_check_destroy_world)
register_host_op("Allreduce", allreduce, check=_check_collective)
register_host_op("Broadcast", broadcast, check=_check_broadcast)
register_host_op("Barrier", barrier, check=_check_barrier)
register_host_op("Allgather", allgather, check=_check_allgather)
register_host_op("ReduceScatter", reduce_scatter, check=_check_reduce_scatter)
