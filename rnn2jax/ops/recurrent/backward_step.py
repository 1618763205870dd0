"""The backward step net Caffe2's `recurrent.recurrent_net` builds from a step net, and its gradient arguments.

One function, `backward_step`, used twice: by the Caffe2 API's `recurrent_net` (rnn2jax/caffe2), which
writes what it returns into the RecurrentNetwork op, and by the gradient lowering (gradient.py), which
regenerates it from an op's own step net to tell whether the op's `backward_step_net` is exactly the one
Caffe2 makes (only then may a recognised LSTM stack run its backward natively: the maths is then
known, whatever the net's ops look like).

SEMANTICS.md section 2.10: the backward step net B is the recomputed forward ops, then the step net's
gradient ops (ops/backward_pass.py) for the gradients of every external output; B's external inputs
are the forward scratches B reads, the state-output gradients, the step net's external inputs and
outputs; then the `_accum` rewrite makes B's writes to an externally provided gradient add to it
rather than overwrite it. The backward links view each state's gradient at row t + 1 (the output
state's gradient) and row t (the previous state's), and the input sequence's gradient at row t.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...ir.netdef import Net, Op
from ...proto import caffe2_pb2 as pb
from ..backward_pass import get_backward_pass, get_ssa, get_undefined_blobs


@dataclass(frozen=True)
class State:
    """One recurrent state as recurrent_net links it: the step net reads `cell_input` (row t) and writes
    `cell_output` (row t + 1) of the state tensor `name`."""

    cell_input: str
    cell_output: str
    name: str


@dataclass(frozen=True)
class BackwardStep:
    """What recurrent_net adds to a RecurrentNetwork op for its gradient."""

    net: pb.NetDef  # the backward step net, unnamed (recurrent_net names it); no op: the op gets none
    links: tuple[tuple[str, str, int], ...]  # backward links: (internal, external, offset)
    params: tuple[str, ...]  # the references that get a gradient, in reference order
    param_grads: tuple[str, ...]  # the per-step gradient blob of each


def backward_step(
    cell: pb.NetDef,
    input_t: str,
    input_blob: str,
    states: Sequence[State],
    references: Sequence[str],
    recompute: Sequence[str] = (),
    sum_device: pb.DeviceOption | None = None,
) -> BackwardStep:
    """The backward step net of step net `cell` and its links, as recurrent_net builds them.

    `input_t` is the step net's view of the input sequence `input_blob`; `references` the op's other
    inputs (blobs the step net reads from the enclosing workspace); `recompute` the forward blobs B
    recomputes rather than reading them from the forward step; `sum_device` the device option of the
    `_accum` rewrite's Sums (recurrent_net built them with `CreateOperator`, under the current device
    scope). Raises GradientError (a RuntimeError) where Caffe2 could not differentiate the step net.
    """
    ys = {o: o + "_grad" for o in cell.external_output}
    backward_ops, backward_mapping = get_backward_pass(cell.op, ys)
    net = pb.NetDef()
    net.op.extend(_recompute_ops(cell.op, recompute))
    net.op.extend(backward_ops)
    backward_ssa, backward_versions = get_ssa(net)
    undefined = get_undefined_blobs(backward_ssa)
    _, versions = get_ssa(cell)
    scratches = [b for b, v in versions.items() if v > 0 and b in undefined and b not in cell.external_output]
    net.external_input.extend(scratches)
    net.type = "simple"
    links: list[tuple[str, str, int]] = []
    for state in states:
        gradient = state.name + "_grad"
        links.append((state.cell_output + "_grad", gradient, 1))
        net.external_input.append(state.cell_output + "_grad")
        # nobody writes the prev-state gradient (e.g. it only feeds a Sum): link its pass-through
        prev_grad = state.cell_input + "_grad"
        source = prev_grad if backward_versions.get(prev_grad, 0) else backward_mapping[state.cell_input]
        links.append((source, gradient, 0))
    links.append((backward_mapping[input_t], input_blob + "_grad", 0))
    net.external_input.extend(cell.external_input)
    net.external_input.extend(cell.external_output)
    _accumulate_external_gradients(net, sum_device)
    params = tuple(p for p in references if p in backward_mapping)
    return BackwardStep(net, tuple(links), params, tuple(str(backward_mapping[p]) for p in params))


def _recompute_ops(ops: Iterable[pb.OperatorDef], recompute: Sequence[str]) -> list[pb.OperatorDef]:
    """Forward ops writing a recomputed blob, in forward order; they may write nothing else."""
    selected = []
    for op in ops:
        if set(recompute).isdisjoint(op.output):
            continue
        if not set(op.output) <= set(recompute):
            raise ValueError(f"op {op.type} writes blobs besides recompute_blobs_on_backward: {list(op.output)}")
        selected.append(op)
    return selected


def _accumulate_external_gradients(proto: pb.NetDef, sum_device: pb.DeviceOption | None) -> None:
    """The `_accum` rewrite: an op output (not also an input) that is an external input of B is renamed
    `<x>_accum` and `Sum([x, x_accum]) -> x` follows, so B adds to an externally provided gradient.

    Caffe2 built these Sums with `Net.Sum`, whose table of defined blobs was filled once, at the first
    such Sum; ops re-added to the proto afterwards were not in it, so a later `<x>_accum` input counted
    as undefined and was appended to B's external inputs. That quirk is reproduced.
    """
    ops = list(proto.op)
    del proto.op[:]
    defined: set[str] | None = None
    for op in ops:
        proto.op.append(op)
        added = proto.op[-1]
        for j, output in enumerate(list(added.output)):
            if output not in proto.external_input or output in added.input:
                continue
            accum = output + "_accum"
            added.output[j] = accum
            if defined is None:
                defined = {o for o2 in proto.op for o in o2.output} | set(proto.external_input)
            for blob in (output, accum):
                if blob not in defined:
                    proto.external_input.append(blob)
                    defined.add(blob)
            total = pb.OperatorDef(type="Sum", name="", input=[output, accum], output=[output])
            if sum_device is not None:
                total.device_option.CopyFrom(sum_device)
            proto.op.append(total)
            defined.add(output)


# -- the same net, from a decoded op ---------------------------------------------------------------


def net_proto(net: Net) -> pb.NetDef:
    """A decoded step net as a NetDef again: ops (type, inputs, outputs, arguments, engine) and the
    external inputs and outputs, what the gradient makers read. Raises ValueError for an argument kind
    the makers of a recognised cell never see (tensors, nested nets)."""
    proto = pb.NetDef(name=net.name, type=net.type)
    proto.external_input.extend(net.external_inputs)
    proto.external_output.extend(net.external_outputs)
    for op in net.ops:
        encoded = proto.op.add(type=op.type, name=op.name, input=op.inputs, output=op.outputs)
        if op.engine:
            encoded.engine = op.engine
        for arg in op.args.values():
            encoded.arg.append(_argument(arg.name, arg.kind, arg.value))
    return proto


def _argument(name: str, kind: str, value: object) -> pb.Argument:
    arg = pb.Argument(name=name)
    if kind in ("f", "i"):
        setattr(arg, kind, value)
    elif kind == "s":
        arg.s = value.encode("utf-8") if isinstance(value, str) else value
    elif kind in ("floats", "ints"):
        getattr(arg, kind).extend(value)
    elif kind == "strings":
        arg.strings.extend(v.encode("utf-8") if isinstance(v, str) else v for v in value)
    elif kind != "empty":
        raise ValueError(f"argument '{name}' holds {kind}")
    return arg


def same_ops(ours: Sequence[Op], theirs: Sequence[Op]) -> bool:
    """Equal ops as the lowering reads them: type, inputs, outputs and arguments (a name -> value
    mapping). Names, engines, device options, debug info and the is_gradient_op flag change no maths.
    A run of consecutive Sums none of which reads another's output may come in any order (Caffe2
    emitted such runs in hash order)."""
    if len(ours) != len(theirs):
        return False
    keys_a, keys_b = [_op_key(o) for o in ours], [_op_key(o) for o in theirs]
    for start, end in _independent_sum_runs(ours):
        keys_a[start:end] = sorted(keys_a[start:end], key=repr)
        keys_b[start:end] = sorted(keys_b[start:end], key=repr)
    return keys_a == keys_b


def _op_key(op: Op) -> tuple:
    args = tuple(sorted(((a.name, a.kind, a.value) for a in op.args.values()), key=lambda a: a[0]))
    return (op.type, op.inputs, op.outputs, args)


def _independent_sum_runs(ops: Sequence[Op]) -> list[tuple[int, int]]:
    """(start, end) of each run of two or more consecutive Sums that read and write none of each other's
    outputs (so any order of them computes the same)."""
    runs: list[tuple[int, int]] = []
    start = 0
    while start < len(ops):
        end, written, read = start, set(), set()
        while end < len(ops) and ops[end].type == "Sum":
            inputs, outputs = set(ops[end].inputs), set(ops[end].outputs)
            if not (written.isdisjoint(inputs) and written.isdisjoint(outputs) and read.isdisjoint(outputs)):
                break
            written |= outputs
            read |= inputs
            end += 1
        if end - start > 1:
            runs.append((start, end))
        start = max(end, start + 1)
    return runs


def same_net(ours: Net, theirs: Net) -> bool:
    """`same_ops`, and the same external inputs (which decide the forward scratches kept), in any order."""
    return same_ops(ours.ops, theirs.ops) and set(ours.external_inputs) == set(theirs.external_inputs)


def expected_links(states: Sequence[State], input_t: str, input_blob: str) -> tuple[tuple[str, str, int], ...]:
    """The forward links recurrent_net gives an op: each state's (row t, row t + 1), then the input."""
    links = [link for s in states for link in ((s.cell_input, s.name, 0), (s.cell_output, s.name, 1))]
    return (*links, (input_t, input_blob, 0))


def references_of(cell: pb.NetDef, known: Iterable[str]) -> list[str]:
    """The step net's external inputs that recurrent_net makes inputs of the op (after the sequence and
    the initial states): those it does not link or name as the timestep."""
    known = set(known)
    return [b for b in cell.external_input if b not in known]


__all__ = ["BackwardStep", "State", "backward_step", "expected_links", "net_proto", "references_of", "same_net"]
