"""Malformed arguments of RecurrentNetwork / RecurrentNetworkGradient, each decided by real Caffe2.

The net is the builder's one-layer LSTM (T = 2, N = 2, D = 2, H = 3). Each case mutates the arguments of
its RecurrentNetwork op (forward cases run that op alone) or of the RecurrentNetworkGradient op made for
it by `get_gradient_for_op` (gradient cases run the forward op and the gradient op in one Caffe2 run,
because the gradient op reads the forward op's `step_workspaces`). The same ops then run in rnn2jax.

The table records, per case, what Caffe2 does (`caffe2`) and what rnn2jax does (`rnn2jax`: the error it
raises, or None when it runs) and what the error message must name (`names`):
- ACCEPTS: rnn2jax runs and gives Caffe2's outputs.
- UNINIT: Caffe2 runs but some outputs are uninitialised memory (state rows nothing wrote): the test shows it
  by running Caffe2 twice with the state tensors' memory pre-filled with two values (Caffe2 resizes a state
  blob in place, so its unwritten rows keep what was fed), and the outputs differ. rnn2jax refuses with an
  `UnwrittenStateError` naming the link or alias and the state.
- REFUSES: Caffe2 raises (an enforce failure); rnn2jax raises the given `Rnn2JaxError`.
- UNDEFINED: Caffe2 checks nothing and reads or writes outside a tensor or list (garbage, or its worker
  dies, not always the same way); rnn2jax refuses instead.
- ALLOWED (REFUSES with `zero`): a per-step parameter gradient no backward op writes. Caffe2 refuses;
  rnn2jax runs and gives a zero gradient there (the others are the unmutated net's), so that
  `rnn2jax.verify` can report a backward step net that forgets a gradient as a mismatch.
A missing step_net is refused by rnn2jax though Caffe2 runs it (as an empty net, uninitialised rows).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest

from differential import assert_blobs_equal, run_rnn2jax
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.checking.oracle import Caffe2Error, OracleCrashedError
from rnn2jax.errors import (
    BadArgumentError,
    MissingBlobError,
    ParseError,
    Rnn2JaxError,
    ShapeError,
    UnwrittenStateError,
)
from rnn2jax.ops.gradient_makers import get_gradient_for_op
from rnn2jax.proto import caffe2_pb2 as pb

T, N, D, H = 2, 2, 2, 3
OUTPUTS = ["lstm/hidden_state_all", "lstm/hidden_state_last", "lstm/cell_state_all", "lstm/cell_state_last"]
GRADS = ["lstm/i2h_grad", "lstm/gates_t_w_grad", "lstm/gates_t_b_grad", "h0_grad", "c0_grad"]
HIDDEN, CELL = "lstm/lstm/hidden_t_prev_states", "lstm/lstm/cell_t_prev_states"

# What real Caffe2 does with a case
ACCEPTS = "accepts"
UNINIT = "accepts; some outputs are uninitialised memory"
REFUSES = "refuses (enforce failure)"
# No check: it reads or writes outside a tensor or list (undefined behaviour: in our runs it returned
# garbage, or its process died of a segfault or abort, not always the same way)
UNDEFINED = "no check, undefined behaviour"


def forward_op() -> pb.OperatorDef:
    reset_net_names()
    model = ModelHelper(name="arguments")
    LSTM(model, "x", "seq_lengths", ("h0", "c0"), dim_in=D, dim_out=H, scope="lstm")
    (op,) = [o for o in model.net.Proto().op if o.type == "RecurrentNetwork"]
    return op


def gradient_op(op: pb.OperatorDef) -> pb.OperatorDef:
    (grad,), _ = get_gradient_for_op(op, ["hall_grad", None, None, None, None])
    return grad


def feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)

    def draw(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    return {
        "lstm/i2h": draw(T, N, 4 * H),
        "h0": draw(N, H),
        "c0": draw(N, H),
        "lstm/gates_t_w": draw(4 * H, H),
        "lstm/gates_t_b": draw(4 * H),
        "seq_lengths": np.full(N, T, np.int32),
        "hall_grad": draw(T, N, H),
    }


# -- mutations -------------------------------------------------------------------------------------


def arg(op: pb.OperatorDef, name: str) -> pb.Argument:
    found = [a for a in op.arg if a.name == name]
    return found[0] if found else op.arg.add(name=name)


def drop_arg(name: str) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        kept = [a for a in op.arg if a.name != name]
        del op.arg[:]
        op.arg.extend(kept)

    return mutate


def set_strings(name: str, values: list[str]) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        arg(op, name).strings[:] = [v.encode() for v in values]

    return mutate


def set_ints(name: str, values: list[int]) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        arg(op, name).ints[:] = values

    return mutate


def set_string(name: str, value: str) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        arg(op, name).s = value.encode()

    return mutate


def edit_strings(name: str, index: int, value: str) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        arg(op, name).strings[index] = value.encode()

    return mutate


def edit_ints(name: str, index: int, value: int) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        arg(op, name).ints[index] = value

    return mutate


def shorten(name: str) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        a = arg(op, name)
        del (a.strings if a.strings else a.ints)[-1]

    return mutate


def lengthen(name: str) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        a = arg(op, name)
        if a.strings:
            a.strings.append(a.strings[-1])
        else:
            a.ints.append(a.ints[-1])

    return mutate


def as_single_string(name: str) -> Callable[[pb.OperatorDef], None]:
    """A list argument given as one string (field s), as a hand-written net might."""

    def mutate(op):
        a = arg(op, name)
        first = a.strings[0]
        a.ClearField("strings")
        a.s = first

    return mutate


def as_single_int(name: str) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        a = arg(op, name)
        first = a.ints[0]
        a.ClearField("ints")
        a.i = first

    return mutate


def step_net_ops(name: str, keep: Callable[[pb.OperatorDef], bool]) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        net = arg(op, name).n
        kept = [o for o in net.op if keep(o)]
        del net.op[:]
        net.op.extend(kept)

    return mutate


def step_net_text(text: str) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        a = arg(op, "step_net")
        a.ClearField("n")
        a.s = text.encode()

    return mutate


def step_net_as_text(op: pb.OperatorDef) -> None:
    from google.protobuf import text_format

    a = arg(op, "step_net")
    text = text_format.MessageToString(a.n)
    a.ClearField("n")
    a.s = text.encode()


def rename_in_step_net(old: str, new: str) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        for o in arg(op, "step_net").n.op:
            o.output[:] = [new if x == old else x for x in o.output]

    return mutate


def both(*mutations: Callable[[pb.OperatorDef], None]) -> Callable[[pb.OperatorDef], None]:
    def mutate(op):
        for m in mutations:
            m(op)

    return mutate


@dataclass(frozen=True)
class Case:
    """One mutation. `caffe2` is what real Caffe2 does; `rnn2jax` the error class rnn2jax raises (None:
    it runs), and `names` what that error's message must name (the argument, or the blob at fault)."""

    name: str
    mutate: Callable[[pb.OperatorDef], None]
    caffe2: str
    rnn2jax: type[Rnn2JaxError] | None = None
    names: str = ""
    gradient: bool = False  # mutate the gradient op (forward + gradient run together)
    zero: tuple[str, ...] = ()  # ALLOWED: gradients rnn2jax gives as zero (the others are the unmutated net's)


B, M, S, P, U = BadArgumentError, MissingBlobError, ShapeError, ParseError, UnwrittenStateError

CASES = [
    # lists of unequal length
    Case("link_internal shorter than link_external", shorten("link_internal"), REFUSES, B, "link_internal"),
    Case("link_external longer than link_internal", lengthen("link_external"), REFUSES, B, "link_external"),
    Case("link_offset shorter than the links", shorten("link_offset"), REFUSES, B, "link_offset"),
    Case("link_window of 3 for 5 links", set_ints("link_window", [1, 1, 1]), REFUSES, B, "link_window"),
    Case("alias_src shorter than alias_dst", shorten("alias_src"), REFUSES, B, "alias_src"),
    Case("alias_offset longer than alias_dst", lengthen("alias_offset"), REFUSES, B, "alias_offset"),
    Case("alias_dst shorter than alias_src", shorten("alias_dst"), REFUSES, B, "alias_dst"),
    Case("recurrent_states longer than ids", lengthen("recurrent_states"), REFUSES, B, "recurrent_states"),
    Case(
        "initial_recurrent_state_ids shorter than states",
        shorten("initial_recurrent_state_ids"),
        REFUSES,
        B,
        "initial_recurrent_state_ids",
    ),
    # out-of-range indices and offsets
    Case(
        "initial_recurrent_state_ids past the inputs",
        edit_ints("initial_recurrent_state_ids", 1, 9),
        UNDEFINED,
        B,
        "initial_recurrent_state_ids",
    ),
    Case(
        "initial_recurrent_state_ids negative",
        edit_ints("initial_recurrent_state_ids", 0, -1),
        UNDEFINED,
        B,
        "initial_recurrent_state_ids",
    ),
    Case(
        "initial state id naming the input sequence",
        edit_ints("initial_recurrent_state_ids", 0, 0),
        REFUSES,
        S,
        "lstm/hidden_t_prev",
    ),
    Case("state write link_offset past the state", edit_ints("link_offset", 1, 5), UNDEFINED, B, "link_offset"),
    Case("input link_offset past the sequence", edit_ints("link_offset", 4, 2), UNDEFINED, S, "link_offset"),
    Case("link_offset negative", edit_ints("link_offset", 0, -1), REFUSES, B, "link_offset"),
    Case("link_window negative", set_ints("link_window", [1, 1, 1, 1, -1]), REFUSES, B, "link_window"),
    Case("link_window 2 on a state read", set_ints("link_window", [2, 1, 1, 1, 1]), REFUSES, S, "input_t"),
    Case("alias_offset past T + L", edit_ints("alias_offset", 0, 5), REFUSES, B, "alias_offset"),
    Case("alias_offset negative past T + L", edit_ints("alias_offset", 1, -5), UNDEFINED, B, "alias_offset"),
    Case("alias_offset T + L (empty output)", edit_ints("alias_offset", 0, T + 1), ACCEPTS),
    Case("alias_offset 0 (initial row too)", edit_ints("alias_offset", 0, 0), ACCEPTS),
    Case("param past the inputs (forward op)", set_ints("param", [3, 40]), ACCEPTS),
    Case("outputs_with_grads past the outputs (forward op)", set_ints("outputs_with_grads", [7]), ACCEPTS),
    # missing or unused blobs
    Case(
        "link_internal renamed away from what the step net reads",
        edit_strings("link_internal", 0, "unused_blob"),
        REFUSES,
        M,
        "lstm/hidden_t_prev",
    ),
    Case(
        "link_external neither input nor state",
        edit_strings("link_external", 4, "nowhere"),
        REFUSES,
        M,
        "link_external",
    ),
    Case("alias_src an input, not a state", edit_strings("alias_src", 0, "lstm/i2h"), ACCEPTS),
    Case("alias_src naming no blob", edit_strings("alias_src", 0, "nowhere"), REFUSES, B, "alias_src"),
    Case("output not in alias_dst", edit_strings("alias_dst", 0, "elsewhere"), UNDEFINED, B, "alias_dst"),
    Case(
        "recurrent state no link writes",
        edit_strings("link_external", 3, HIDDEN),
        UNINIT,
        U,
        CELL,
    ),
    Case(
        "step net does not write a state",
        rename_in_step_net("lstm/cell_state", "cell_elsewhere"),
        UNINIT,
        U,
        CELL,
    ),
    Case(
        "duplicate recurrent state", set_strings("recurrent_states", [HIDDEN, HIDDEN]), REFUSES, B, "recurrent_states"
    ),
    # step_net and timestep
    Case("step_net missing (Caffe2: an empty net)", drop_arg("step_net"), UNINIT, B, "step_net"),
    Case("step_net empty", step_net_ops("step_net", lambda o: False), UNINIT, U, "alias_offset"),
    Case("step_net as text", step_net_as_text, ACCEPTS),
    Case("step_net unparseable text", step_net_text("op { type: "), REFUSES, P, "step_net"),
    Case("timestep missing (default 'timestep')", drop_arg("timestep"), ACCEPTS),
    Case("timestep named like a step-net output", set_string("timestep", "lstm/gates_t"), REFUSES, B, "timestep"),
    Case("timestep named like a link internal", set_string("timestep", "input_t"), REFUSES, B, "timestep"),
    Case("timestep renamed, step net reads 'timestep'", set_string("timestep", "t"), REFUSES, M, "timestep"),
    # the wrong field
    Case(
        "timestep as a list", both(drop_arg("timestep"), set_strings("timestep", ["timestep"])), REFUSES, B, "timestep"
    ),
    Case("link_internal as one string", as_single_string("link_internal"), REFUSES, B, "link_internal"),
    Case("recurrent_states as one string", as_single_string("recurrent_states"), REFUSES, B, "recurrent_states"),
    Case("alias_offset as one int", as_single_int("alias_offset"), REFUSES, B, "alias_offset"),
]

GRADIENT_CASES = [
    Case("backward_link_internal shorter", shorten("backward_link_internal"), REFUSES, B, "backward_link_internal"),
    Case("backward_link_offset longer", lengthen("backward_link_offset"), REFUSES, B, "backward_link_offset"),
    Case("backward_link_offset negative", edit_ints("backward_link_offset", 1, -1), REFUSES, B, "backward_link_offset"),
    Case(
        "backward_link_offset past the state",
        edit_ints("backward_link_offset", 0, 5),
        UNDEFINED,
        B,
        "backward_link_offset",
    ),
    Case(
        "backward_link_internal renamed away from what the backward net reads",
        edit_strings("backward_link_internal", 0, "unused_grad"),
        REFUSES,
        M,
        "lstm/hidden_state_grad",
    ),
    Case(
        "backward_link_external as one string",
        as_single_string("backward_link_external"),
        REFUSES,
        B,
        "backward_link_external",
    ),
    Case("param past the inputs", set_ints("param", [3, 40]), UNDEFINED, B, "param"),
    Case("param negative", set_ints("param", [-1, 4]), REFUSES, B, "param"),
    Case("param_grads shorter than param", shorten("param_grads"), REFUSES, B, "param_grads"),
    Case(
        "param_grads naming a blob the backward net never writes",
        edit_strings("param_grads", 1, "never_written"),
        REFUSES,
        zero=("lstm/gates_t_b_grad",),
    ),
    Case("backward_step_net missing", drop_arg("backward_step_net"), REFUSES, B, "backward_step_net"),
    Case("backward_step_net empty", step_net_ops("backward_step_net", lambda o: False), REFUSES, U, "backward_link"),
    Case("outputs_with_grads negative (gradient op)", set_ints("outputs_with_grads", [-1]), ACCEPTS),
    Case(
        "initial_recurrent_state_ids past the forward inputs (gradient op)",
        edit_ints("initial_recurrent_state_ids", 1, 6),
        UNDEFINED,
        B,
        "initial_recurrent_state_ids",
    ),
    Case(
        "recurrent_states longer than ids (gradient op)", lengthen("recurrent_states"), REFUSES, B, "recurrent_states"
    ),
    Case("alias_offset 2 on an output with a gradient", edit_ints("alias_offset", 0, 2), REFUSES, B, "alias_offset"),
    Case(
        "timestep named like a backward-net output",
        set_string("timestep", "lstm/gates_t_grad"),
        REFUSES,
        B,
        "timestep",
    ),
]
GRADIENT_CASES = [replace(c, gradient=True) for c in GRADIENT_CASES]
ALL_CASES = CASES + GRADIENT_CASES


def run_case(case: Case, runner) -> dict[str, np.ndarray]:
    op = forward_op()
    if case.gradient:
        grad = gradient_op(op)
        case.mutate(grad)
        return runner([op, grad], GRADS)
    case.mutate(op)
    return runner([op], OUTPUTS)


def in_caffe2(caffe2):
    def runner(ops, fetch):
        return caffe2.run([("op", o) for o in ops], feeds(), fetch)

    return runner


def in_rnn2jax(ops, fetch):
    return run_rnn2jax(ops, feeds(), fetch)


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.name for c in ALL_CASES])
def test_argument(caffe2, case):
    if case.caffe2 == REFUSES:
        with pytest.raises(Caffe2Error):
            run_case(case, in_caffe2(caffe2))
    elif case.caffe2 == UNINIT:  # Caffe2's answer is whatever the state tensors' memory held
        assert_depends_on_memory(case, caffe2)
    elif case.caffe2 == UNDEFINED:  # undefined: garbage, a crash, or an incidental refusal
        with contextlib.suppress(OracleCrashedError, Caffe2Error):
            run_case(case, in_caffe2(caffe2))
    else:
        want = run_case(case, in_caffe2(caffe2))
    if case.caffe2 == REFUSES and case.rnn2jax is None:  # allowed: a gradient no backward op writes
        want = run_case(replace(case, mutate=lambda op: None), in_caffe2(caffe2))
        got = run_case(case, in_rnn2jax)
        assert_blobs_equal(
            {n: v for n, v in got.items() if n not in case.zero}, {n: v for n, v in want.items() if n not in case.zero}
        )
        assert not any(got[n].any() for n in case.zero)
        return
    if case.rnn2jax is not None:
        with pytest.raises(case.rnn2jax) as caught:
            run_case(case, in_rnn2jax)
        message = str(caught.value)
        assert case.names in message and "RecurrentNetwork" in message, message
        return
    assert case.caffe2 == ACCEPTS
    assert_blobs_equal(run_case(case, in_rnn2jax), want)


def assert_depends_on_memory(case: Case, caffe2) -> None:
    """Caffe2 runs the case, and its outputs change with what the state tensors' memory held before: the
    state blobs are fed first, filled with 1.5e11 or -7 (Caffe2 resizes them in place, keeping that memory)."""
    answers = []
    for value in (1.5e11, -7.0):
        memory = {state: np.full((T + 1, N, H), value, np.float32) for state in (HIDDEN, CELL)}

        def runner(ops, fetch, memory=memory):
            return caffe2.run([("op", o) for o in ops], {**feeds(), **memory}, fetch)

        answers.append(run_case(case, runner))
    assert any(not np.array_equal(answers[0][n], answers[1][n]) for n in OUTPUTS), "Caffe2's answer is defined"


def test_the_table_has_30_distinct_cases():
    assert len({c.name for c in ALL_CASES}) == len(ALL_CASES) >= 30
    assert all(c.rnn2jax is not None for c in ALL_CASES if c.caffe2 in (REFUSES, UNDEFINED) and not c.zero)


def _drop_cell_gradient_link(op: pb.OperatorDef) -> None:
    """The backward link that writes row t of the cell state's gradient (`lstm/cell_t_prev_grad`, offset 0)
    is gone: step t still reads row t + 1 of it (`lstm/cell_state_grad`, offset 1), which no step writes."""
    keep = [i for i, name in enumerate(arg(op, "backward_link_internal").strings) if name != b"lstm/cell_t_prev_grad"]
    for name in ("backward_link_internal", "backward_link_external", "backward_link_offset"):
        a = arg(op, name)
        values = [(a.strings or a.ints)[i] for i in keep]
        del (a.strings if a.strings else a.ints)[:]
        (a.strings if name != "backward_link_offset" else a.ints).extend(values)


def test_gradient_rows_no_backward_step_writes_are_refused_where_caffe2_reads_memory(caffe2):
    """Caffe2 zeroes only the last row of a state's gradient: with the link that writes the cell gradient's
    rows gone, its gradients are whatever the gradient tensor's memory held (fed first, 1.5e11 or -7: Caffe2
    resizes the blob in place). rnn2jax refuses, naming the row, the gradient and the link argument."""
    answers = []
    for value in (1.5e11, -7.0):
        memory = {f"{CELL}_grad": np.full((T + 1, N, H), value, np.float32)}
        op = forward_op()
        grad = gradient_op(op)
        _drop_cell_gradient_link(grad)
        answers.append(caffe2.run([("op", op), ("op", grad)], {**feeds(), **memory}, GRADS))
    assert any(not np.array_equal(answers[0][n], answers[1][n]) for n in GRADS), "Caffe2's answer is defined"
    op = forward_op()
    grad = gradient_op(op)
    _drop_cell_gradient_link(grad)
    refusal = r"row 1 of gradient 'lstm/lstm/cell_t_prev_states_grad'.*'lstm/cell_state_grad' \(argument 'backward_link"
    with pytest.raises(UnwrittenStateError, match=refusal + r".*uninitialised"):
        in_rnn2jax([op, grad], GRADS)


def test_a_recurrent_state_named_as_an_output_is_its_whole_buffer(caffe2):
    """An output may be a recurrent state itself rather than an alias of one: Caffe2 keeps the state blob in the
    enclosing workspace, the initial row then one per step (hypothesis_test's test_elman_recurrent_network)."""
    op = forward_op()
    states = next(a.strings for a in op.arg if a.name == "recurrent_states")
    state = states[0].decode()
    op.output.insert(len(op.output) - 1, state)
    (grad,), _ = get_gradient_for_op(op, ["hall_grad", None, None, None, None, None])
    fetch = [*OUTPUTS, state, *GRADS]
    want = caffe2.run([("op", op), ("op", grad)], feeds(), fetch)
    assert want[state].shape == (T + 1, N, H)
    assert_blobs_equal(run_rnn2jax([op, grad], feeds(), fetch), want)
