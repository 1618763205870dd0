"""Structure-aware mutations of Caffe2 NetDefs: what a careless edit, an old exporter or a hostile file
does to a net, applied to any net in the tree (the nested step nets of RecurrentNetwork ops included).

Every choice goes through a `Chooser`, so the same mutations serve atheris (a seeded `random.Random`) and
hypothesis (draws, which shrink). This replaces atheris-libprotobuf-mutator, whose build needs bazel and
network access.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

from rnn2jax.proto import caffe2_pb2 as pb

T = TypeVar("T")

INTERESTING_INTS = (0, 1, -1, 2, 3, 7, 255, 2**31 - 1, -(2**31), 2**31, 2**40, 2**63 - 1, -(2**63))
INTERESTING_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1e38, 3.5e38, float("inf"), float("-inf"), float("nan"))
STRANGE_NAMES = ("", " ", "x", "_", "a/b", "timestep", "é", "\x00", "n" * 300, "step_net", "0")
OP_TYPES = (
    "RecurrentNetwork", "RecurrentNetworkGradient", "FC", "FCGradient", "Sum", "LSTMUnit", "LSTMUnitGradient",
    "GRUUnit", "Copy", "Concat", "Split", "Reshape", "Transpose", "Gather", "Slice", "Softmax", "Tanh",
    "Sigmoid", "Mul", "Add", "Sub", "Div", "MatMul", "BatchMatMul", "ReduceSum", "SumElements",
    "GivenTensorFill", "ConstantFill", "UniformFill", "Alias", "RecurrentNetworkBlobFetcher", "NoSuchOp", "",
)  # fmt: skip


class Chooser(Protocol):
    def below(self, n: int) -> int:
        """An integer in [0, n)."""


class RandomChooser:
    """Choices from a seeded `random.Random` (atheris hands the mutator a seed)."""

    def __init__(self, seed: int):
        self.random = random.Random(seed)

    def below(self, n: int) -> int:
        return self.random.randrange(n)


class DrawChooser:
    """Choices drawn by hypothesis (`draw` of a composite strategy or of `st.data()`), so a failing
    mutation sequence shrinks."""

    def __init__(self, draw: Callable[[st.SearchStrategy[int]], int]):
        self.draw = draw

    def below(self, n: int) -> int:
        return self.draw(st.integers(0, n - 1))


def pick(chooser: Chooser, items: Sequence[T]) -> T:
    return items[chooser.below(len(items))]


# ------------------------------------------------------------------------------------------------
# Where to mutate


def nets_of(net: pb.NetDef) -> list[pb.NetDef]:
    """The net and every net nested in its ops' arguments (step nets, backward step nets), depth first."""
    found = [net]
    for op in net.op:
        for arg in op.arg:
            if arg.HasField("n"):
                found.extend(nets_of(arg.n))
            for nested in arg.nets:
                found.extend(nets_of(nested))
    return found


def _text(value: str | bytes) -> str:
    """A string field's value as str (proto2 hands out bytes for a field that is not UTF-8)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def blob_names(net: pb.NetDef) -> list[str]:
    names = {*net.external_input, *net.external_output}
    for op in net.op:
        names.update(op.input)
        names.update(op.output)
    return sorted(map(_text, names)) or ["x"]


def _name(chooser: Chooser, net: pb.NetDef) -> str:
    """A blob name of the net (often) or a strange one."""
    if chooser.below(4):
        return pick(chooser, blob_names(net))
    return pick(chooser, STRANGE_NAMES)


def _int(chooser: Chooser, current: int = 0) -> int:
    choice = chooser.below(4)
    if choice == 0:
        return current + pick(chooser, (-1, 1, -2, 2))
    return pick(chooser, INTERESTING_INTS)


# ------------------------------------------------------------------------------------------------
# The mutations: each changes `net` in place


def delete_op(chooser: Chooser, net: pb.NetDef) -> None:
    if net.op:
        del net.op[chooser.below(len(net.op))]


def _set_ops(net: pb.NetDef, ops: list[pb.OperatorDef]) -> None:
    copies = [pb.OperatorDef.FromString(op.SerializeToString()) for op in ops]
    del net.op[:]
    net.op.extend(copies)


def duplicate_op(chooser: Chooser, net: pb.NetDef) -> None:
    if net.op:
        ops = list(net.op)
        ops.insert(chooser.below(len(ops) + 1), ops[chooser.below(len(ops))])
        _set_ops(net, ops)


def move_op(chooser: Chooser, net: pb.NetDef) -> None:
    if len(net.op) > 1:
        ops = list(net.op)
        op = ops.pop(chooser.below(len(ops)))
        ops.insert(chooser.below(len(ops) + 1), op)
        _set_ops(net, ops)


def retype_op(chooser: Chooser, net: pb.NetDef) -> None:
    if net.op:
        net.op[chooser.below(len(net.op))].type = pick(chooser, OP_TYPES)


def rename_blob(chooser: Chooser, net: pb.NetDef) -> None:
    """One input or output of one op, or one external input/output, renamed."""
    fields: list[Any] = [net.external_input, net.external_output]
    for op in net.op:
        fields.extend((op.input, op.output))
    fields = [f for f in fields if len(f)]
    if fields:
        field = pick(chooser, fields)
        field[chooser.below(len(field))] = _name(chooser, net)


def add_or_remove_blob(chooser: Chooser, net: pb.NetDef) -> None:
    if not net.op:
        return
    op = net.op[chooser.below(len(net.op))]
    field = op.input if chooser.below(2) else op.output
    if len(field) and chooser.below(2):
        del field[chooser.below(len(field))]
    else:
        field.append(_name(chooser, net))


def mutate_argument(chooser: Chooser, net: pb.NetDef) -> None:
    """One argument of one op: a value changed, a list grown or cut, the argument dropped or doubled."""
    ops = [op for op in net.op if op.arg]
    if not ops:
        return
    op = pick(chooser, ops)
    index = chooser.below(len(op.arg))
    arg = op.arg[index]
    action = chooser.below(9)
    if action == 0:
        del op.arg[index]
    elif action == 1:
        op.arg.add().CopyFrom(arg)
    elif action == 2:
        arg.i = _int(chooser, arg.i)
    elif action == 3:
        arg.f = pick(chooser, INTERESTING_FLOATS)
    elif action == 4 and len(arg.ints):
        position = chooser.below(len(arg.ints))
        arg.ints[position] = _int(chooser, arg.ints[position])
    elif action == 5 and len(arg.ints):
        del arg.ints[chooser.below(len(arg.ints))]
    elif action == 6:
        arg.ints.append(_int(chooser))
    elif action == 7 and len(arg.strings):
        arg.strings[chooser.below(len(arg.strings))] = _name(chooser, net).encode("utf-8", "surrogatepass")
    elif action == 8:
        arg.name = pick(chooser, [_text(a.name) for o in net.op for a in o.arg] + list(STRANGE_NAMES))
    else:
        arg.s = _name(chooser, net).encode()


def drop_nested_net(chooser: Chooser, net: pb.NetDef) -> None:
    """A nested net emptied, or swapped with another (the step net where the backward step net was)."""
    holders = [arg for op in net.op for arg in op.arg if arg.HasField("n")]
    if not holders:
        return
    arg = pick(chooser, holders)
    if chooser.below(2):
        del arg.n.op[:]
    else:
        other = pick(chooser, holders)
        arg.n.CopyFrom(pb.NetDef.FromString(other.n.SerializeToString()))


def mutate_hint(chooser: Chooser, net: pb.NetDef) -> None:
    """The fed shape or dtype of an input (the harness's `fuzz.input.*` arguments), as a caller gets it wrong."""
    hints = [arg for arg in net.arg if arg.name.startswith("fuzz.input.")]
    if not hints:
        return
    arg = pick(chooser, hints)
    action = chooser.below(4)
    if action == 0 and len(arg.ints):
        position = chooser.below(len(arg.ints))
        arg.ints[position] = pick(chooser, (0, 1, 2, arg.ints[position] + 1, -1, 2**40))
    elif action == 1:
        arg.ints.append(pick(chooser, (1, 2)))
    elif action == 2 and len(arg.ints):
        del arg.ints[-1]
    else:
        arg.s = pick(chooser, (b"float32", b"float64", b"int32", b"int64", b"bool"))


def mutate_external(chooser: Chooser, net: pb.NetDef) -> None:
    """external_input/external_output: one added or removed."""
    field = net.external_input if chooser.below(2) else net.external_output
    if len(field) and chooser.below(2):
        del field[chooser.below(len(field))]
    else:
        field.append(_name(chooser, net))


MUTATIONS: tuple[Callable[[Chooser, pb.NetDef], None], ...] = (
    delete_op, duplicate_op, move_op, retype_op, rename_blob, add_or_remove_blob, mutate_argument,
    mutate_argument, mutate_argument, drop_nested_net, mutate_hint, mutate_external,
)  # fmt: skip


def mutate_net(chooser: Chooser, root: pb.NetDef) -> None:
    """One mutation, in place, at a net of the tree chosen at random."""
    pick(chooser, MUTATIONS)(chooser, pick(chooser, nets_of(root)))


def mutate_container(chooser: Chooser, plan: pb.PlanDef, count: int = 1) -> None:
    """`count` mutations, each in the init or (mostly) the main net of a fuzz container."""
    for _ in range(count):
        nets = list(plan.network)
        if not nets:
            return
        net = nets[-1] if len(nets) == 1 or chooser.below(4) else pick(chooser, nets)
        mutate_net(chooser, net)
