"""Caffe2's memonger passes (caffe2/core/memonger.cc), which its `memonger.py` calls through the C extension:
blob recycling for a DAG of ops (`share_grad_blobs`, `optimize_inference_for_dag`) and for an inference net
(`optimize_inference_fast`). NetDef in, NetDef out; nothing runs.

They make the same choices as Caffe2's C++, which blob each output reuses included, with one difference:
Caffe2 numbered the shared blobs (`__m<i>_shared`) in the iteration order of a C++ hash map, which depends on
the standard library; here they are numbered in the order they first appear in the net (op by op, inputs
before outputs).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from google.protobuf import text_format

from ...errors import BadArgumentError
from ..proto import caffe2_pb2
from ._inplace import inplace_violation


def _size(blob: str, blob_shapes: Mapping[str, Sequence[int]]) -> int:
    size = 1
    for dim in blob_shapes.get(blob, (0,)):
        size *= dim
    return size


class _BlobRecycling:
    """`ComputeBlobRecyclingForDag`: walks the ops depth first from the heads; an output takes a freed blob
    whose every user the walk has passed (tracked by tokens), on the same device; with `blob_shapes`, the
    largest free blob that fits, else the smallest share count."""

    def __init__(self, net: caffe2_pb2.NetDef):
        self.net = net
        n = len(net.op)
        self.op_inputs = [0] * n
        self.op_visited_count = [0] * n
        self.op_token_deposit: list[set[int]] = [set() for _ in range(n)]
        self.op_visited = [False] * n
        self.tokens_counter = 1
        self.blob_to_ops: defaultdict[str, list[int]] = defaultdict(list)
        self.blob_input_count: defaultdict[str, int] = defaultdict(int)
        self.share_counts: defaultdict[str, int] = defaultdict(int)
        self.blob_sizes: dict[str, int] = {}
        self.req_tokens: defaultdict[str, set[int]] = defaultdict(set)
        self.optim_op_outputs: set[str] = set()
        self.mapping: dict[str, str] = {}
        self.blob_device: dict[str, caffe2_pb2.DeviceOption] = {}
        self.processed_output_blobs: set[str] = set()

    def optimize(
        self,
        heads: Sequence[str],
        op_indices: Sequence[int],
        shareable: set[str],
        namescope: str,
        dont_share: set[str],
        blob_shapes: Mapping[str, Sequence[int]],
    ) -> caffe2_pb2.NetDef:
        net = self.net
        _run_schema_check(net)  # memonger rewrites the graph: its ops must be valid first
        heads_set = set(heads)
        for index in op_indices:  # only the outputs that may be shared are optimized
            self.optim_op_outputs.update(b for b in net.op[index].output if b in shareable and b not in dont_share)
        blob_seen: defaultdict[str, int] = defaultdict(int)
        for index in op_indices:
            op = net.op[index]
            for blob in op.input:
                if blob in shareable or blob in heads_set:
                    if blob in self.optim_op_outputs:
                        if blob not in blob_seen:
                            raise BadArgumentError(f"memonger: input {blob} was not output by an op before")
                        self.op_inputs[index] += blob_seen[blob]
                    else:
                        self.share_counts[blob] = 1
                    self.blob_to_ops[blob].append(index)
            for blob in op.output:
                blob_seen[blob] += 1
                device = caffe2_pb2.DeviceOption()
                device.CopyFrom(op.device_option)
                if op.type == "CopyGPUToCPU":  # its device option is CUDA's, its outputs are on the CPU
                    device.device_type = 0
                    device.device_id = 0
                self.blob_device[blob] = device
        for head in heads:  # from root ops only, so no child op is reached before its parents
            for index in list(self.blob_to_ops[head]):
                if not self.op_visited[index] and not self.op_inputs[index]:
                    tokens = {self.tokens_counter}
                    self.tokens_counter += 1
                    self._process_op(shareable, dont_share, blob_shapes, index, [], tokens)
        names: dict[str, str] = {}
        roots = set(self.mapping.values())
        for op in net.op:
            for blob in [*op.input, *op.output]:
                root = self.mapping.get(blob, blob if blob in roots else None)
                if root is not None and root in self.optim_op_outputs and root not in names:
                    names[root] = f"{namescope}__m{len(names)}_shared"
        final = {blob: names.get(root, root) for blob, root in self.mapping.items()}
        final.update(names)
        return _renamed(net, final)

    def _mapped(self, blob: str) -> str:
        return self.mapping.get(blob, blob)

    def _device(self, blob: str) -> caffe2_pb2.DeviceOption:
        return self.blob_device.setdefault(blob, caffe2_pb2.DeviceOption())

    def _process_op(
        self,
        shareable: set[str],
        dont_share: set[str],
        blob_shapes: Mapping[str, Sequence[int]],
        index: int,
        free_blobs: list[tuple[int, str]],
        tokens: set[int],
    ) -> None:
        tokens |= self.op_token_deposit[index]
        self.op_token_deposit[index].clear()
        if self.op_visited[index]:
            raise BadArgumentError(f"memonger: op #{index} visited twice")
        self.op_visited[index] = True
        op = self.net.op[index]
        for blob in [*op.input, *op.output]:
            actual = self._mapped(blob)
            self.req_tokens[actual] |= tokens
            if actual != blob:
                self.req_tokens[blob] |= tokens
        new_free: list[tuple[int, str]] = []
        new_free_set: set[str] = set()
        for blob in op.input:
            if blob in shareable:
                self.blob_input_count[blob] += 1
                if self.blob_input_count[blob] == len(self.blob_to_ops[blob]):
                    actual = self._mapped(blob)
                    if actual not in dont_share:
                        new_free.append((-self.share_counts[actual], actual))
                        new_free_set.add(actual)
        for blob in op.output:
            if blob in shareable and blob not in self.processed_output_blobs and blob not in new_free_set:
                freed = self._free_blob(blob, blob_shapes, tokens, free_blobs, self._device(blob))
                if freed:
                    self.req_tokens[freed] |= tokens
                    self.share_counts[freed] += 1
                    self.mapping[blob] = freed
                self.processed_output_blobs.add(blob)
        free_names = {name for _, name in free_blobs}
        for entry in new_free:
            if entry[1] not in free_names:
                if blob_shapes and entry[1] not in self.blob_sizes:
                    self.blob_sizes[entry[1]] = _size(entry[1], blob_shapes)
                heapq.heappush(free_blobs, entry)  # the sift std::push_heap does, on the same array
        num_branches = sum(len(self.blob_to_ops[blob]) for blob in op.output)
        for blob in op.output:
            for user in list(self.blob_to_ops[blob]):
                self.op_visited_count[user] += 1
                if self.op_visited_count[user] == self.op_inputs[user]:
                    new_tokens = set(tokens)
                    if num_branches > 1:
                        new_tokens.add(self.tokens_counter)
                        self.tokens_counter += 1
                    self._process_op(shareable, dont_share, blob_shapes, user, free_blobs, new_tokens)
                elif not self.op_visited[user]:
                    self.op_token_deposit[user] |= tokens

    def _can_use(self, blob: str, tokens: set[int], device: caffe2_pb2.DeviceOption) -> bool:
        own = self._device(blob)
        if (device.device_type, device.device_id) != (own.device_type, own.device_id):
            return False
        return self.req_tokens[blob] <= tokens

    def _free_blob(
        self,
        blob: str,
        blob_shapes: Mapping[str, Sequence[int]],
        tokens: set[int],
        free_blobs: list[tuple[int, str]],
        device: caffe2_pb2.DeviceOption,
    ) -> str:
        if not blob_shapes:
            unusable = []
            freed = ""
            while free_blobs:
                candidate = heapq.heappop(free_blobs)
                if self._can_use(candidate[1], tokens, device):
                    freed = candidate[1]
                    break
                unusable.append(candidate)
            for candidate in unusable:
                heapq.heappush(free_blobs, candidate)
            return freed
        size = _size(blob, blob_shapes)
        best_size, best_index = -1, -1
        for i, (_, name) in enumerate(free_blobs):
            if self._can_use(name, tokens, device):
                candidate_size = self.blob_sizes[name]
                if candidate_size >= best_size and (best_size < size or best_size >= candidate_size):
                    best_size, best_index = candidate_size, i
        if best_index == -1:
            return ""
        freed = free_blobs[best_index][1]
        del free_blobs[best_index]  # as Caffe2 erased it, heap order or not
        return freed


def _run_schema_check(net: caffe2_pb2.NetDef) -> None:
    """Caffe2's `run_schema_check`: every op whose type has a schema must pass it (its input and output counts,
    and the inputs it enforces in place: `_inplace.py`)."""
    from ...ops.registry import record

    for op in net.op:
        opdef = record(op.type)
        if opdef is None:
            continue
        (low_in, high_in), (low_out, high_out) = opdef.inputs, opdef.outputs
        if not (low_in <= len(op.input) <= high_in and low_out <= len(op.output) <= high_out):
            raise BadArgumentError(f"memonger: Operator def did not pass schema checking: {op}")
        violation = inplace_violation(op.type, list(op.input), list(op.output))
        if violation is not None:
            raise BadArgumentError(f"memonger: {violation}; Operator def did not pass schema checking: {op}")


def _renamed(net: caffe2_pb2.NetDef, final: Mapping[str, str]) -> caffe2_pb2.NetDef:
    """`net` with every blob renamed by `final`; a RecurrentNetwork's step nets too, with a `<blob>.rename`
    argument for each renamed input or output."""
    optimized = caffe2_pb2.NetDef()
    optimized.CopyFrom(net)
    for op in optimized.op:
        if op.type.startswith("RecurrentNetwork"):
            _rename_recurrent(op, final)
        op.input[:] = [final.get(b, b) for b in op.input]
        op.output[:] = [final.get(b, b) for b in op.output]
    return optimized


def _rename_recurrent(op: caffe2_pb2.OperatorDef, final: Mapping[str, str]) -> None:
    for arg in op.arg:
        if arg.name not in ("step_net", "backward_step_net"):
            continue
        if arg.HasField("n"):
            arg.n.CopyFrom(_renamed(arg.n, final))
        else:
            step = text_format.Parse(arg.s.decode("utf-8"), caffe2_pb2.NetDef())
            arg.s = text_format.MessageToString(_renamed(step, final)).encode("utf-8")
    for blob in [*op.input, *op.output]:
        mapped = final.get(blob, blob)
        if mapped != blob:
            op.arg.add(name=blob + ".rename", s=mapped.encode("utf-8"))


def compute_blob_recycling_for_dag(
    net: caffe2_pb2.NetDef,
    heads: Sequence[str],
    op_indices: Sequence[int],
    shareable_blob_names: Iterable[str],
    namescope: str,
    dont_share_blob_names: Iterable[str],
    blob_shapes: Mapping[str, Sequence[int]],
) -> caffe2_pb2.NetDef:
    """`net` with the shareable blobs of the ops `op_indices` renamed onto shared `<namescope>__m<i>_shared`
    blobs wherever their lifetimes do not overlap."""
    return _BlobRecycling(net).optimize(
        list(heads), list(op_indices), set(shareable_blob_names), namescope, set(dont_share_blob_names), blob_shapes
    )


def optimize_inference_net(net: caffe2_pb2.NetDef, static_blobs: Iterable[str]) -> caffe2_pb2.NetDef:
    """`optimize_inference_net`: in a simple net run op after op, an output written first by op i takes a blob
    whose last reader ran before; `static_blobs` keep their own. Nets with a RecurrentNetwork, of another type,
    or memongered already come back unchanged."""
    static = set(static_blobs)
    if net.type not in ("", "simple") or any(op.type == "RecurrentNetwork" for op in net.op):
        return net
    all_blobs: set[str] = set()
    ranges: dict[str, list[int]] = {}
    for i, op in enumerate(net.op):
        for blob in op.input:
            if blob in ranges:
                ranges[blob][1] = i
            all_blobs.add(blob)
        for blob in op.output:
            all_blobs.add(blob)
            if blob not in static and blob not in ranges:
                ranges[blob] = [i, i]
    free_blobs: list[str] = []
    renaming: dict[str, str] = {}
    mapping: dict[str, str] = {}
    for i, op in enumerate(net.op):
        new_free: list[str] = []
        for blob in op.input:
            if blob in ranges and ranges[blob][1] == i:
                if blob not in mapping:
                    new_free.append(blob)
                    mapping[blob] = blob
                    shared = f"__m{len(renaming)}_shared"
                    if shared in all_blobs:
                        return net  # memongered already
                    renaming[blob] = shared
                elif mapping[blob] not in new_free:
                    new_free.append(mapping[blob])
        for blob in op.output:
            if free_blobs and blob in ranges and ranges[blob][0] == i:
                mapping[blob] = free_blobs.pop()
        free_blobs.extend(dict.fromkeys(new_free))
    optimized = caffe2_pb2.NetDef()
    optimized.CopyFrom(net)
    for op in optimized.op:
        op.input[:] = [renaming[mapping[b]] if b in mapping else b for b in op.input]
        op.output[:] = [renaming[mapping[b]] if b in mapping else b for b in op.output]
    return optimized
