"""`get_backward_pass`: Caffe2's Python gradient IR (`core.IR`, `GradientRegistry.GetBackwardPass`), on which the
Caffe2 API's `AddGradientOperators` and `GetBackwardPass` build.

Forward ops are "played" to give every blob write a version; then ops are visited in reverse and each
op whose outputs have gradients gets its maker's gradient ops (`gradient_makers.get_gradient_for_op`: the
`gradient` facet of the op's record). When a blob version is read by several ops, each consumer's gradient
contribution is collected ("generators") and, at its first reader, summed: the first generator keeps its
name, later ones are renamed `_<name>_autosplit_<k>`, and a `Sum` writes the total (pass-through
contributions add their blob). A gradient op may only read a forward blob that still has the version the
forward op saw; in-place chains that break this raise GradientError (a RuntimeError), as core.py did
(section 3.3 of SEMANTICS.md).

A sparse gradient (Caffe2's GradientSlice) is an `(indices, values)` pair; several of them for one blob
(two lookups into one embedding table) are accumulated as Caffe2 did, by two `Concat`s (indices, values)
with no deduplication. A mix of sparse and dense gradients for one blob is refused, as in core.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from ..proto import caffe2_pb2 as pb
from .gradient_makers import GradientError, get_gradient_for_op

__all__ = ["get_backward_pass", "get_ssa", "get_undefined_blobs", "version_checks"]

AUTO_GEN_SUM_TAG = "is_auto_gen_sum_ops:1"
ONLY_KEEP_TAG = "only_keep_is_auto_gen_sum_ops_tag:1"
AUTOGEN_GRAD_SUFFIX = "_autogen_grad"

_checks = {"versions": True}


@contextmanager
def version_checks(enabled: bool) -> Iterator[None]:
    """Turn core.py's blob-version checks off (or on) inside the block.

    Off, configurations Caffe2 refused to differentiate (BasicRNN with sequence lengths and
    drop_states=False; the older, in-place SoftCoverage attention) still build, showing what their
    backward step net would have been; the result reads overwritten blobs.
    """
    old = _checks["versions"]
    _checks["versions"] = enabled
    try:
        yield
    finally:
        _checks["versions"] = old


class _OpSSA(NamedTuple):
    op: pb.OperatorDef
    in_versions: dict[str, int]
    out_versions: dict[str, int]


class _Generator(NamedTuple):
    """One contribution to an input's gradient: output `idx` of `grad_op`, or a passed-through blob."""

    grad_op: pb.OperatorDef | None
    idx: int
    gradient: str
    device_option: pb.DeviceOption


class _SparseGenerator(NamedTuple):
    """A GradientSlice contribution: which gradient ops write its indices and its values (None: passed
    through from the forward op, as Gather passes its INDICES)."""

    op_i: pb.OperatorDef | None
    idx_i: int
    op_v: pb.OperatorDef | None
    idx_v: int
    gradient: tuple[str, str]
    device_option: pb.DeviceOption


Generator = _Generator | _SparseGenerator


def _sparse(grad: object) -> bool:
    return isinstance(grad, tuple)


class _IR:
    def __init__(self, ops: Iterable[pb.OperatorDef]):
        self.ssa: list[_OpSSA] = []
        self.input_usages: defaultdict[str, defaultdict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.frontier: defaultdict[str, int] = defaultdict(int)
        self.gradient_frontier: dict[str, int] = {}
        self.generators: defaultdict[str, defaultdict[int, list[Generator]]] = defaultdict(lambda: defaultdict(list))
        for op in ops:
            self._play(op)
        for op in ops:
            if op.type == "StopGradient" and op.output[0] not in self.input_usages:
                raise ValueError(f"StopGradient's output '{op.output[0]}' is orphan.")

    def _play(self, op: pb.OperatorDef) -> None:
        in_versions = {}
        for name in op.input:
            in_versions[name] = self.frontier[name]
            self.input_usages[name][self.frontier[name]].append(len(self.ssa))
        out_versions = {}
        for name in op.output:
            if name in self.frontier:
                self.frontier[name] += 1
            out_versions[name] = self.frontier[name]
        self.ssa.append(_OpSSA(op, in_versions, out_versions))

    # -- checks ------------------------------------------------------------------------------------

    def _check_input(self, name: str, g_output: list[str | None], index: int, local: list[str]) -> None:
        """core.py `CheckGradientOperatorInput`: a gradient op reads only current versions."""
        forward, in_versions, out_versions = self.ssa[index]
        check = _checks["versions"]
        if name in g_output:
            original = forward.output[g_output.index(name)]
            if check and out_versions[original] != self.gradient_frontier[original]:
                raise GradientError(
                    f'Gradient name "{name}" is expected to correspond to version '
                    f'{out_versions[original]} of "{original}", but currently we have version '
                    f"{self.gradient_frontier[original]}."
                )
        elif name in out_versions:
            if check and self.frontier[name] != out_versions[name]:
                raise GradientError(
                    f'Gradient operator {forward.type} needs output "{name}" at version '
                    f"{out_versions[name]}, but currently we have version {self.frontier[name]}."
                )
        elif name in in_versions:
            if check and self.frontier[name] != in_versions[name]:
                raise GradientError(
                    f'Gradient operator {forward.type} needs input "{name}" at version '
                    f"{in_versions[name]}, but currently we have version {self.frontier[name]}."
                )
        elif name not in local:
            raise GradientError(
                f'Blob name "{name}" not in the scope of operator {forward.type} and is not generated '
                "by any of the local gradient operators."
            )

    # -- generators --------------------------------------------------------------------------------

    def _build_generators(
        self,
        index: int,
        grad_ops: list[pb.OperatorDef],
        g_output: list[str | None],
        g_input: list[str | None],
    ) -> None:
        forward, in_versions, _ = self.ssa[index]
        local: list[str] = []
        sparse: dict[str, _SparseGenerator] = {}  # core.py's AppendSparseGenerators: indices and values merged
        for grad_op in grad_ops:
            for name in grad_op.input:
                self._check_input(name, g_output, index, local)
            local.extend(grad_op.output)
            for i, output in enumerate(grad_op.output):
                position = next((k for k, g in enumerate(g_input) if g == output or (_sparse(g) and output in g)), None)
                if position is None:
                    continue
                input_name, grad = forward.input[position], g_input[position]
                if not _sparse(grad):
                    self.generators[input_name][in_versions[input_name]].append(
                        _Generator(grad_op, i, output, grad_op.device_option)
                    )
                    continue
                part = sparse.get(input_name) or _SparseGenerator(None, 0, None, 0, grad, grad_op.device_option)
                if output == grad[0]:
                    part = part._replace(op_i=grad_op, idx_i=i)
                else:
                    part = part._replace(op_v=grad_op, idx_v=i)
                sparse[input_name] = part
        for input_name, part in sparse.items():
            self.generators[input_name][in_versions[input_name]].append(part)
        for input_name, grad in zip(forward.input, g_input, strict=True):
            passed = grad and (all(n not in local for n in grad) if _sparse(grad) else grad not in local)
            if passed:  # passed through, not computed
                make = _SparseGenerator(None, 0, None, 0, grad, forward.device_option) if _sparse(grad) else None
                self.generators[input_name][in_versions[input_name]].append(
                    make or _Generator(None, 0, grad, forward.device_option)
                )
        for input_name, grad in zip(forward.input, g_input, strict=True):
            if grad is not None:
                self.gradient_frontier[input_name] = in_versions[input_name]

    def _make_sparse_sum(
        self, generators: list[_SparseGenerator], input_name: str
    ) -> tuple[list[pb.OperatorDef], tuple[str, str]]:
        """core.py `_MakeSparseSumOps`: every computed part is autosplit, then indices and values are
        concatenated (no deduplication: the optimizers take repeated rows)."""
        base = input_name + "_grad"
        for g in generators:
            if g.op_i is not None:
                base = g.op_i.output[g.idx_i].removesuffix("_indices")
                break
            if g.op_v is not None:
                base = g.op_v.output[g.idx_v].removesuffix("_values")
                break
        parts: tuple[list[str], list[str]] = ([], [])
        counts = [0, 0]
        for g in generators:
            for k, (op, idx) in enumerate(((g.op_i, g.idx_i), (g.op_v, g.idx_v))):
                if op is None:
                    if g.gradient[k] == base:
                        raise GradientError(
                            "The gradient output of empty gradient op can not be the same as the normal "
                            "name of the current input gradient."
                        )
                    parts[k].append(g.gradient[k])
                else:
                    _rename_output(op, idx, f"_{op.output[idx]}_autosplit_{counts[k]}")
                    counts[k] += 1
                    parts[k].append(op.output[idx])
        ops = []
        for names, what in zip(parts, ("indices", "values"), strict=True):
            op = pb.OperatorDef(type="Concat", name="")
            op.input.extend(names)
            op.output.extend([f"{base}_{what}_concat", f"{base}_{what}_concat_split"])
            op.arg.add(name="axis", i=0)
            ops.append(op)
        self._tag_sum_ops(ops, generators)
        return ops, (ops[0].output[0], ops[1].output[0])

    @staticmethod
    def _tag_sum_ops(ops: list[pb.OperatorDef], generators: Sequence[Generator]) -> None:
        """core.py `_SetSumOpsDeviceOption`: the first generator's device, tagged as an auto-generated sum."""
        keep_tag_only = any(ONLY_KEEP_TAG in g.device_option.extra_info for g in generators)
        for op in ops:
            if not keep_tag_only:
                op.device_option.CopyFrom(generators[0].device_option)
            op.device_option.extra_info.append(AUTO_GEN_SUM_TAG)

    def _make_sum(self, generators: list[_Generator], input_name: str) -> tuple[pb.OperatorDef, str]:
        """The accumulation Sum: first computed gradient keeps its name, the others are autosplit."""
        out = next((g.grad_op.output[g.idx] for g in generators if g.grad_op), input_name + "_grad")
        inputs: list[str] = []
        count = 0
        first = True
        for gen in generators:
            if gen.grad_op is None:
                if gen.gradient == out:
                    raise GradientError(
                        "The gradient output of empty gradient op can not be the same as the normal "
                        "name of the current input gradient."
                    )
                inputs.append(gen.gradient)
            elif first:
                first = False
                inputs.append(gen.grad_op.output[gen.idx])
            else:
                renamed = f"_{gen.grad_op.output[gen.idx]}_autosplit_{count}"
                _rename_output(gen.grad_op, gen.idx, renamed)
                count += 1
                inputs.append(renamed)
        if out in inputs:  # in-place Sum only works on its first input
            k = inputs.index(out)
            inputs[0], inputs[k] = inputs[k], inputs[0]
        op = pb.OperatorDef(type="Sum", name="")
        op.input.extend(inputs)
        op.output.append(out)
        self._tag_sum_ops([op], generators)
        return op, out

    def _accumulate(self, index: int) -> tuple[list[pb.OperatorDef], dict[str, str | tuple[str, str]]]:
        """Sums for inputs of op `index` read by several ops, emitted at their first reader.

        Caffe2 iterated `set(op.input)` here (hash order); this uses first-appearance order.
        """
        forward, in_versions, _ = self.ssa[index]
        sums: list[pb.OperatorDef] = []
        grad_map: dict[str, str | tuple[str, str]] = {}
        for input_name in dict.fromkeys(forward.input):
            version = in_versions[input_name]
            usage = self.input_usages[input_name][version]
            if len(usage) <= 1 or index != usage[0]:
                continue
            generators = self.generators[input_name][version]
            kinds = {type(g) for g in generators}
            if len(kinds) > 1:
                raise GradientError("Automatic aggregation of a mix of sparse and dense gradients is not supported yet")
            if len(generators) < 2:
                continue
            if kinds == {_SparseGenerator}:
                ops, grad_map[input_name] = self._make_sparse_sum(generators, input_name)
                sums.extend(ops)
            else:
                op, grad_map[input_name] = self._make_sum(generators, input_name)
                sums.append(op)
        return sums, grad_map

    # -- the reverse sweep -------------------------------------------------------------------------

    def _gradients_for_op(
        self, index: int, input_to_grad: dict[str, str | None]
    ) -> tuple[dict[str, str | None], list[pb.OperatorDef]]:
        forward = self.ssa[index].op
        g_output = [input_to_grad.get(name) for name in forward.output]
        if all(g is None for g in g_output) and forward.type != "ZeroGradient":
            return {}, []
        grad_ops, g_input = get_gradient_for_op(forward, g_output)
        self._build_generators(index, grad_ops, g_output, g_input)
        new: dict[str, str | None] = {}
        for name, grad in zip(forward.input, g_input, strict=True):
            # keep an existing gradient unless this op also overwrote the blob
            if grad is not None or name not in input_to_grad or name in forward.output:
                new[name] = grad
        return new, grad_ops

    def backward_pass(self, ys: Mapping[str, str | None]) -> tuple[list[pb.OperatorDef], dict[str, str]]:
        for y in ys:
            self.gradient_frontier[y] = self.frontier[y]
            self.input_usages[y][self.frontier[y]].append(len(self.ssa))
        input_to_grad: dict[str, str | None] = {}
        all_ops: list[pb.OperatorDef] = []
        for y, grad in ys.items():
            if grad is None:  # autogenerated all-ones gradient
                fill = pb.OperatorDef(type="ConstantFill", name="", input=[y], output=[y + AUTOGEN_GRAD_SUFFIX])
                fill.arg.add(name="value", f=1.0)
                all_ops.append(fill)
                grad = fill.output[0]
                self.generators[y][self.frontier[y]].append(_Generator(fill, 0, grad, fill.device_option))
            input_to_grad[y] = grad
        for index in reversed(range(len(self.ssa))):
            new, grad_ops = self._gradients_for_op(index, input_to_grad)
            input_to_grad.update(new)
            all_ops.extend(grad_ops)
            sums, grad_map = self._accumulate(index)
            input_to_grad.update(grad_map)
            all_ops.extend(sums)
        return all_ops, {k: v for k, v in input_to_grad.items() if v is not None}


def get_backward_pass(
    ops: Iterable[pb.OperatorDef], ys: Mapping[str, str | None] | Sequence[str]
) -> tuple[list[pb.OperatorDef], dict[str, str]]:
    """Caffe2's `GradientRegistry.GetBackwardPass(ops, ys)`.

    `ys` maps each blob to differentiate to its given gradient blob (None: an autogenerated
    `<y>_autogen_grad` filled with ones; a list means all None). Returns the gradient ops in order and
    the map from every forward blob that received a gradient to its gradient blob.
    Raises GradientError (a RuntimeError) where core.py raised.
    """
    if not isinstance(ys, Mapping):
        ys = dict.fromkeys(ys)
    return _IR(list(ops)).backward_pass({str(k): v for k, v in ys.items()})


def get_ssa(
    net: pb.NetDef,
) -> tuple[list[tuple[list[tuple[str, int]], list[tuple[str, int]]]], dict[str, int]]:
    """core.py `get_ssa`: per op (versioned inputs, versioned outputs), and the final blob versions.

    Versions start at 0 for external inputs (or for every input when the net declares none); each
    write adds one, so a blob written once by an op has version 1.
    """
    versions: dict[str, int] = dict.fromkeys(net.external_input, 0)
    ssa = []
    for op in net.op:
        if not net.external_input:
            for name in op.input:
                versions.setdefault(name, 0)
        inputs = [(name, versions.get(name, 0)) for name in op.input]
        for name in op.output:
            versions[name] = versions.get(name, 0) + 1
        ssa.append((inputs, [(name, versions[name]) for name in op.output]))
    return ssa, versions


def get_undefined_blobs(ssa: Iterable[tuple[list[tuple[str, int]], list[tuple[str, int]]]]) -> set[str]:
    """Blobs read before any op of the net wrote them (inputs at version 0)."""
    return {name for inputs, _ in ssa for name, version in inputs if version == 0}


def _rename_output(grad_op: pb.OperatorDef, idx: int, new: str) -> None:
    """core.py `_DisambiguateGradOpOutput`: a gradient If also renames the blob in its branches' ops
    (control_ops_grad's `disambiguate_grad_if_op_output`), which write it in the If's workspace."""
    old = grad_op.output[idx]
    if grad_op.type == "If":
        for arg in grad_op.arg:
            if arg.name in ("then_net", "else_net") and arg.HasField("n"):
                for op in arg.n.op:
                    for i, out in enumerate(op.output):
                        if out == old:
                            op.output[i] = new
    grad_op.output[idx] = new
