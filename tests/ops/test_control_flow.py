"""The control-flow family (rnn2jax/ops/control_flow.py): If, While, Do, ONNXWhile, CreateScope, HasScope, the ops
that carry nets, against real Caffe2.

If, While and ONNXWhile run as single ops (If's and While's nets read the op's workspace by name), under jit, so
their conditions are traced (lax.cond, lax.while_loop with a data-dependent trip count; ONNXWhile's static trip
count a lax.scan), and eagerly, where a known condition picks the branch or unrolls the loop in Python. Do,
HasScope and CreateScope need a workspace stack, which only CreateScope makes (no tensor can be fed as one):
their cases run as small nets in one workspace, in Caffe2 and in rnn2jax. The gradients of If, Do and While are
the ops Caffe2's own makers (caffe2/python/control_ops_grad.py) write, run in both (While's where the forward
loop's trip count is known). tests/caffe2_package/test_api_caffe2_modules.py checks rnn2jax's Caffe2 API builds
those gradient ops as Caffe2 does.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from host_differential import check_net as host_check_net
from hypothesis import given, settings
from hypothesis import strategies as st

from differential import (
    Case,
    arrays,
    assert_blobs_equal,
    cases,
    check_op,
    invalid,
    make_op,
    run_case,
    run_rnn2jax,
    shapes,
)
from rnn2jax.caffe2.opdef import create_net
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import Rnn2JaxError
from rnn2jax.proto import caffe2_pb2 as pb

BINARY = ("Add", "Sub", "Mul")
# half the profile's examples for the tests whose every example compiles nets within nets (keeps the file fast)
FEWER_EXAMPLES = settings(max_examples=max(1, settings().max_examples // 2))


def draw_condition(data: st.DataObject, value: bool | None = None, scalar: bool = False) -> np.ndarray:
    """A bool condition of one value, shaped () or (1,) (`scalar`: ()); one draw in eight two values (Caffe2
    refuses it)."""
    flag = data.draw(st.booleans()) if value is None else value
    if invalid(data):
        return np.array([flag, flag])
    return np.array(flag).reshape(() if scalar else data.draw(st.sampled_from([(), (1,)])))


def draw_branch(data: st.DataObject, name: str) -> pb.NetDef:
    """A branch writing y from x and w, through a blob of its own (which stays in the workspace) or not."""
    ops = [make_op(data.draw(st.sampled_from(BINARY)), ["x", "w"], ["y"])]
    if data.draw(st.booleans()):
        ops += [make_op("Mul", ["x", "x"], [f"{name}_local"]), make_op("Add", ["y", f"{name}_local"], ["y"])]
    return create_net(name, ops)


def draw_if(data: st.DataObject) -> tuple[pb.OperatorDef, dict[str, np.ndarray]]:
    """If with both branches, or then_net alone (y is then set before it)."""
    shape = data.draw(shapes(1, 3))
    inputs = {"c": draw_condition(data), "x": data.draw(arrays(shape)), "w": data.draw(arrays(shape))}
    args = {"then_net": draw_branch(data, "then")}
    if data.draw(st.booleans()):
        args["else_net"] = draw_branch(data, "else")
    else:
        inputs["y"] = data.draw(arrays(shape))
    return make_op("If", list(inputs), ["y"], **args), inputs


def draw_while(data: st.DataObject) -> tuple[pb.OperatorDef, dict[str, np.ndarray]]:
    """While counting i up to n (drawn: a data-dependent trip count, 0 included), acc updated by w at each
    step; the condition from cond_net before each step, or from the loop net's last op."""
    shape = data.draw(shapes(1, 2))
    n = data.draw(st.integers(0, 4))
    loop = [
        make_op("Add", ["i", "one"], ["i"]),
        make_op(data.draw(st.sampled_from(BINARY)), ["acc", "w"], ["acc"]),
    ]
    compare = make_op("LT", ["i", "n"], ["c"])
    args = {}
    if data.draw(st.booleans()):
        args["cond_net"] = create_net("cond", [compare])
        condition = draw_condition(data, data.draw(st.booleans()))  # cond_net writes it before it is read
    else:
        loop.append(compare)
        # the loop net's LT writes a scalar: a condition fed as [1] would change shape at the first step,
        # which a loop with a traced condition cannot carry (rnn2jax refuses it, test_while_refuses_...)
        condition = draw_condition(data, n > 0, scalar=True)
    inputs = {
        "c": condition,
        "i": np.array(0, np.int32),
        "acc": data.draw(arrays(shape)),
        "one": np.array(1, np.int32),
        "n": np.array(n, np.int32),
        "w": data.draw(arrays(shape, low=0.5, high=1.5)),
    }
    op = make_op("While", list(inputs), ["i", "acc", "c"], loop_net=create_net("loop", loop), **args)
    return op, inputs


def draw_do(data: st.DataObject, for_gradient: bool = False) -> tuple[pb.OperatorDef, dict[str, np.ndarray]]:
    """Do binding x, w (inputs) and z (output) to inner names, with a local blob; one draw in eight binds one
    name too few (Caffe2 refuses: not all outer names are used). A gradient's Do is valid and reuses no
    workspace (Caffe2's gradient Do needs the stacked ones)."""
    shape = data.draw(shapes(1, 3))
    inputs = {"x": data.draw(arrays(shape)), "w": data.draw(arrays(shape))}
    inner = create_net(
        "inner",
        [
            make_op(data.draw(st.sampled_from(BINARY)), ["a", "v"], ["local"]),
            make_op(data.draw(st.sampled_from(BINARY)), ["local", "a"], ["out"]),
        ],
    )
    names, indices = ["a", "v", "out"], [0, 1, 2]
    order = data.draw(st.permutations(range(3)))
    names, indices = [names[k] for k in order], [indices[k] for k in order]
    if not for_gradient and invalid(data):
        names, indices = names[:-1], indices[:-1]
    args = {"net": inner, "inner_blobs": names, "outer_blobs_idx": indices}
    if not for_gradient and data.draw(st.booleans()):
        args["reuse_workspace"] = True
    return make_op("Do", ["x", "w", "ws"], ["z", "ws"], **args), inputs


def draw_has_scope(data: st.DataObject) -> tuple[pb.OperatorDef, dict[str, np.ndarray]]:
    return make_op("HasScope", ["ws"], ["h"]), {}


def draw_create_scope(data: st.DataObject) -> tuple[pb.OperatorDef, dict[str, np.ndarray]]:
    return make_op("CreateScope", [], ["ws"]), {}


def draw_onnx_while(data: st.DataObject, scans_with_cond: bool = False) -> tuple[pb.OperatorDef, dict[str, np.ndarray]]:
    """ONNXWhile with a drawn trip count and, drawn, a condition the body computes from the iteration number
    (bool, so that the body's LT writes the condition's type); one or two dependencies and up to two scan outputs.
    A scan output is a dependency's value with a leading axis of one (ExpandDims) or, for at most two iterations,
    as it is: over more, Caffe2 writes past the tensor it extends (see `_caffe2_scan_output`). Scan outputs come
    with a condition only for `scans_with_cond` (their length then depends on values: a workspace runs the op
    eagerly, a compiled net refuses it). The body makes its own constants: its workspace sees none of the
    enclosing blobs, unless disable_scopes. One draw in eight gives an int32 trip count (Caffe2 refuses)."""
    shape = data.draw(shapes(1, 2))
    deps = data.draw(st.integers(1, 2))
    has_cond = scans_with_cond or data.draw(st.booleans())
    dtype = np.bool_ if has_cond else data.draw(st.sampled_from([np.bool_, np.int32, np.int64]))
    names = [f"d{j}" for j in range(deps)]
    trip_count = data.draw(st.integers(0, 4))
    ops = [
        make_op("GivenTensorFill", [], ["w"], shape=list(shape), values=data.draw(arrays(shape)).ravel().tolist()),
        make_op("ConstantFill", [], ["lim"], shape=[], value=data.draw(st.integers(0, 4)), dtype=pb.TensorProto.INT64),
    ]
    ops += [make_op(data.draw(st.sampled_from(BINARY)), [name, "w"], [f"{name}_out"]) for name in names]
    ops.append(make_op("LT", ["it", "lim"], ["cond_out"]))
    scans = []
    if scans_with_cond or not has_cond:
        for k in range(data.draw(st.integers(1 if scans_with_cond else 0, 2))):
            source = f"{data.draw(st.sampled_from(names))}_out"
            if trip_count <= 2 and data.draw(st.booleans()):
                scans.append(source)
            else:
                ops.append(make_op("ExpandDims", [source], [f"scan{k}"], dims=[0]))
                scans.append(f"scan{k}")
    body = create_net("body", ops)
    body.external_input.extend(["it", "cond_in", *names])
    body.external_output.extend(["cond_out", *(f"{name}_out" for name in names), *scans])
    trips = np.array(trip_count, np.int32 if invalid(data) else np.int64)
    inputs = {"trips": trips, "cond": np.array([data.draw(st.booleans())]).astype(dtype)}
    inputs.update({name: data.draw(arrays(shape)) for name in names})
    args = {"body": body, "has_trip_count": 1, "has_cond": int(has_cond)}
    if data.draw(st.booleans()):
        args["disable_scopes"] = 1
    outputs = [f"{name}_final" for name in names] + [f"scan{k}_all" for k in range(len(scans))]
    return make_op("ONNXWhile", list(inputs), outputs, **args), inputs


CASES = cases(
    Case(
        "If",
        draw_if,
        gradient_ops=("If",),
        note="then and else nets; a traced condition is lax.cond; gradient: test_if_gradient",
    ),
    Case(
        "While",
        draw_while,
        gradient_ops=("While", "HasScope"),
        note="data-dependent trip count: lax.while_loop under jit, unrolled eagerly; gradient: "
        "test_while_gradient_when_the_trip_count_is_known",
    ),
    Case(
        "ONNXWhile",
        draw_onnx_while,
        note="trip count static: lax.scan, or lax.while_loop with has_cond; scan outputs with has_cond: "
        "test_onnx_while_scan_outputs_of_a_condition",
    ),
    Case(
        "Do", draw_do, gradient_ops=("Do",), note="run after CreateScope, in one workspace; gradient: test_do_gradient"
    ),
    Case("HasScope", draw_has_scope, note="after CreateScope and, drawn, a Do"),
    Case("CreateScope", draw_create_scope, note="its stack read back by HasScope"),
)

SCOPED = {"Do", "HasScope", "CreateScope"}


def scoped_net(data: st.DataObject, case: Case) -> tuple[list[pb.OperatorDef], dict[str, np.ndarray], list[str]]:
    """The ops a workspace-stack case runs (CreateScope first), its inputs and the blobs it fetches."""
    op, inputs = case.draw(data)
    create = make_op("CreateScope", [], ["ws"])
    has = make_op("HasScope", ["ws"], ["h"])
    if op.type == "CreateScope":
        return [op, has], inputs, ["h"]
    if op.type == "HasScope":
        ops = [create, op]
        if data.draw(st.booleans()):
            do, inputs = draw_do(data)
            ops = [create, do, op]
        return ops, inputs, ["h"]
    twice = data.draw(st.booleans())
    return [create, op, *([op] if twice else []), has], inputs, ["z", "h"]


def check_net(caffe2, ops: list[pb.OperatorDef], inputs: dict[str, np.ndarray], fetch: list[str], jit: bool) -> None:
    try:
        want = caffe2.run([("ops", ops)], inputs, fetch=fetch)
    except Caffe2Error:
        with pytest.raises(Rnn2JaxError):
            run_rnn2jax(ops, inputs, fetch, jit=jit)
            pytest.fail("Caffe2 refuses this net but rnn2jax ran it")
        return
    assert_blobs_equal(run_rnn2jax(ops, inputs, fetch, jit=jit), want)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type in SCOPED:
        ops, inputs, fetch = scoped_net(data, case)
        check_net(caffe2, ops, inputs, fetch, jit=True)
    elif case.gradient_ops:  # If, While: their gradients are tested below (Caffe2's makers want nets of Do ops)
        op, inputs = case.draw(data)
        check_op(caffe2, op, inputs)
    else:
        run_case(caffe2, case, data)


@pytest.mark.parametrize("op_type", ["If", "While", "ONNXWhile"])
@FEWER_EXAMPLES
@given(data=st.data())
def test_known_condition_matches_caffe2(caffe2, op_type, data):
    """Run eagerly, the condition is known: If runs one branch, While unrolls (each step traced once)."""
    op, inputs = CASES[op_type].draw(data)
    check_net(caffe2, [op], inputs, list(op.output), jit=False)


@FEWER_EXAMPLES
@given(data=st.data())
def test_onnx_while_scan_outputs_of_a_condition(caffe2, data):
    """Scan outputs whose length the body's condition decides: a workspace runs the op eagerly (registry `eager`),
    with every blob as Caffe2 leaves it; a compiled net, where the condition is traced, refuses the op."""
    op, inputs = draw_onnx_while(data, scans_with_cond=True)
    body = next(arg.n for arg in op.arg if arg.name == "body")
    blobs = {*op.input, *op.output, *body.external_input, *(name for inner in body.op for name in inner.output)}
    # with disable_scopes and no iteration, Caffe2 creates the condition output without a value: its shape only
    _, want = host_check_net(caffe2, [op], inputs, values_of=blobs - {"cond_out"})
    if want is not None and inputs["trips"].dtype == np.int64 and int(inputs["trips"]) > 0 and inputs["cond"].all():
        with pytest.raises(Rnn2JaxError, match="data-dependent length"):
            run_rnn2jax([op], inputs, list(op.output))


@pytest.mark.parametrize(
    ("shape", "trips", "refusal"),
    [
        ((), 2, "scalar per iteration"),
        ((2,), 3, "writing past its memory"),
        ((3, 2), 4, "writing past its memory"),
        ((2,), 2, None),
    ],
)
def test_onnx_while_refuses_scan_outputs_caffe2_cannot_extend(caffe2, shape, trips, refusal):
    """Caffe2 extends a scan output by one row per iteration but copies a whole step: a scalar step cannot be
    extended (Caffe2 refuses: asked here), and over three iterations steps of more than one row are written past
    the tensor's memory (undefined in Caffe2, not asked), which rnn2jax refuses; two iterations are defined."""
    body = create_net("body", [make_op("Add", ["x", "x"], ["y"])])
    body.external_input.extend(["i", "c", "x"])
    body.external_output.extend(["c", "y", "y"])
    op = make_op("ONNXWhile", ["trips", "cond", "x0"], ["x_final", "scan"], body=body, has_trip_count=1)
    inputs = {
        "trips": np.array(trips, np.int64),
        "cond": np.array(True),
        "x0": np.arange(1, 1 + int(np.prod(shape)), dtype=np.float32).reshape(shape),
    }
    if refusal is None or refusal.startswith("scalar"):
        check_net(caffe2, [op], inputs, ["x_final", "scan"], jit=True)
    with pytest.raises(Rnn2JaxError, match=refusal) if refusal else contextlib.nullcontext():
        run_rnn2jax([op], inputs, ["scan"])


def test_if_writes_its_branch_blobs_and_leaves_the_others(caffe2):
    """The branch's own blobs stay in the workspace (Caffe2 runs it in the If's), whichever way it is run."""
    then = create_net("then", [make_op("Mul", ["x", "x"], ["t"]), make_op("Add", ["t", "x"], ["y"])])
    otherwise = create_net("else", [make_op("Sub", ["x", "x"], ["y"]), make_op("Mul", ["y", "x"], ["t"])])
    op = make_op("If", ["c", "x"], ["y"], then_net=then, else_net=otherwise)
    after = make_op("Add", ["t", "y"], ["u"])
    for flag in (True, False):
        inputs = {"c": np.array(flag), "x": np.array([1.5, -2.0], np.float32)}
        for jit in (True, False):
            check_net(caffe2, [op, after], inputs, ["y", "t", "u"], jit)


def test_traced_if_refuses_branches_of_different_shapes():
    then = create_net("then", [make_op("Add", ["x", "x"], ["y"])])
    otherwise = create_net("else", [make_op("Concat", ["x", "x"], ["y", "split"], axis=0)])
    op = make_op("If", ["c", "x"], ["y"], then_net=then, else_net=otherwise)
    inputs = {"c": np.array(True), "x": np.ones(2, np.float32)}
    with pytest.raises(Rnn2JaxError, match="one shape and dtype"):
        run_rnn2jax([op], inputs, ["y"])
    assert run_rnn2jax([op], inputs, ["y"], jit=False)["y"].shape == (2,)  # a known condition: one branch


def test_do_refuses_bad_bindings(caffe2):
    inner = create_net("inner", [make_op("Add", ["a", "a"], ["b"])])
    create = make_op("CreateScope", [], ["ws"])
    bad = [
        dict(inner_blobs=["a", "b"], outer_blobs_idx=[0, 5]),  # out of bounds
        dict(inner_blobs=["a", "b"], outer_blobs_idx=[0, 0]),  # reusage of an outer name
        dict(inner_blobs=["a", "a"], outer_blobs_idx=[0, 1]),  # redefinition of an inner blob
        dict(inner_blobs=["a"], outer_blobs_idx=[0, 1]),  # different lengths
    ]
    for args in bad:
        do = make_op("Do", ["x", "ws"], ["y", "ws"], net=inner, **args)
        check_net(caffe2, [create, do], {"x": np.ones(2, np.float32)}, ["y"], jit=True)
    popping = make_op("Do", ["x", "ws"], ["y", "ws"], net=inner, inner_blobs=["a", "b"], outer_blobs_idx=[0, 1])
    popping.is_gradient_op = True  # a gradient Do pops a forward workspace; a fresh stack has none
    check_net(caffe2, [create, popping], {"x": np.ones(2, np.float32)}, ["y"], jit=True)
    other = make_op("Do", ["x", "ws"], ["y", "ws2"], net=inner, inner_blobs=["a", "b"], outer_blobs_idx=[0, 1])
    check_net(caffe2, [create, make_op("CreateScope", [], ["ws2"]), other], {"x": np.ones(2, np.float32)}, ["y"], True)


def gradient_check(caffe2, forward: list[pb.OperatorDef], op: pb.OperatorDef, inputs, outputs, seed: int = 0):
    """Caffe2's gradient ops of `op` (the last forward op), after the forward ops in one workspace, in both."""
    c2_ops, g_input = caffe2.gradient_for_op(op, [f"{n}_grad" if n in outputs else None for n in op.output])
    assert c2_ops, "Caffe2 writes no gradient ops"
    rng = np.random.default_rng(seed)
    feeds = dict(inputs)
    shapes_of = caffe2.run([("ops", forward)], inputs, fetch=outputs)
    for name in outputs:
        feeds[f"{name}_grad"] = rng.standard_normal(shapes_of[name].shape).astype(shapes_of[name].dtype)
    fetch = [g for g in g_input if g is not None]
    want = caffe2.run([("ops", forward), ("ops", c2_ops)], feeds, fetch=fetch)
    got = run_rnn2jax([*forward, *c2_ops], feeds, fetch)
    assert_blobs_equal(got, want)
    return c2_ops


def scoped_branch(data: st.DataObject, name: str) -> tuple[pb.NetDef, str]:
    """A branch as caffe2/python/control_ops_util.add_if_op writes it: its ops in a Do of their own, x, w and
    y bound under their own names, its workspace blob created before the If."""
    inner = draw_branch(data, name)
    ws = f"ws_{name}"
    do = make_op("Do", ["x", "w", ws], ["y", ws], net=inner, inner_blobs=["x", "w", "y"], outer_blobs_idx=[0, 1, 2])
    return create_net(f"do_{name}_net", [do]), ws


@FEWER_EXAMPLES
@given(data=st.data())
def test_if_gradient(caffe2, data):
    """If's gradient is an If over the branches' gradient nets (control_ops_grad.gen_if_gradient), here of
    branches written as net_builder writes them (each a Do), whose gradient Do reads the forward Do's locals
    from the workspace stack: with the condition traced, the branch that ran pushed the frame."""
    shape = data.draw(shapes(1, 3))
    inputs = {"c": np.array(data.draw(st.booleans())), "x": data.draw(arrays(shape)), "w": data.draw(arrays(shape))}
    then, ws_then = scoped_branch(data, "then")
    otherwise, ws_else = scoped_branch(data, "else")
    creates = [make_op("CreateScope", [], [ws_then]), make_op("CreateScope", [], [ws_else])]
    op = make_op("If", ["c", "x", "w", ws_then, ws_else], ["y", ws_then, ws_else], then_net=then, else_net=otherwise)
    grad_ops = gradient_check(caffe2, [*creates, op], op, inputs, ["y"])
    assert [g.type for g in grad_ops] == ["If"]


@FEWER_EXAMPLES
@given(data=st.data())
def test_do_gradient(caffe2, data):
    """Do's gradient is a gradient Do reading the forward Do's workspace from the stack (gen_do_gradient)."""
    op, inputs = draw_do(data, for_gradient=True)
    grad_ops = gradient_check(caffe2, [make_op("CreateScope", [], ["ws"]), op], op, inputs, ["z"])
    assert [g.type for g in grad_ops] == ["Do"]


def test_while_refuses_a_carried_blob_that_changes_shape():
    """Caffe2 lets a loop's blobs change shape from step to step; a traced trip count (lax.while_loop) cannot,
    and says which blob; a known one (eager) unrolls the loop and can."""
    loop = create_net("loop", [make_op("Add", ["i", "one"], ["i"]), make_op("LT", ["i", "n"], ["c"])])
    op = make_op("While", ["c", "i", "one", "n"], ["i", "c"], loop_net=loop)
    inputs = {
        "c": np.array([True]),
        "i": np.array(0, np.int32),
        "one": np.array(1, np.int32),
        "n": np.array(3, np.int32),
    }
    with pytest.raises(Rnn2JaxError, match="blob 'c' is bool\\[1\\] before a step and bool\\[\\] after it"):
        run_rnn2jax([op], inputs, ["i"])
    assert run_rnn2jax([op], inputs, ["i"], jit=False)["i"] == 3


@FEWER_EXAMPLES
@given(data=st.data())
def test_while_gradient_when_the_trip_count_is_known(caffe2, data):
    """While's gradient (control_ops_grad.gen_while_gradient) is a While that runs the gradient of its loop body's
    Do while the forward Do's workspaces last (HasScope), each step popping one. It needs the forward loop's
    steps, which a loop with a known condition has (run eagerly here: it unrolls, and so does its gradient).
    The body writes y from x and w (Caffe2's maker refuses a body that updates a blob in place: "Reusage of
    outer blob name" of its gradient); at least one step, or the loop leaves no y to take a gradient of."""
    shape = data.draw(shapes(1, 2))
    n = data.draw(st.integers(1, 3))
    body = create_net(
        "body",
        [make_op("Add", ["i", "one"], ["i"]), make_op(data.draw(st.sampled_from(BINARY)), ["x", "w"], ["y"])],
    )
    names = ["i", "x", "one", "w", "y"]
    do = make_op(
        "Do",
        ["i", "x", "one", "w", "ws"],
        ["i", "y", "ws"],
        net=body,
        inner_blobs=names,
        outer_blobs_idx=[0, 1, 2, 3, 5],
    )
    op = make_op(
        "While",
        ["c", "i", "x", "one", "n", "w", "ws"],
        ["i", "y", "ws"],
        loop_net=create_net("loop", [do]),
        cond_net=create_net("cond", [make_op("LT", ["i", "n"], ["c"])]),
    )
    inputs = {
        "c": np.array(False),
        "i": np.array(0, np.int32),
        "x": data.draw(arrays(shape)),
        "one": np.array(1, np.int32),
        "n": np.array(n, np.int32),
        "w": data.draw(arrays(shape)),
    }
    c2_ops, g_input = caffe2.gradient_for_op(op, [None, "y_grad", None])
    assert {g.type for g in c2_ops} <= {"While", "HasScope", "Copy"}
    forward = [make_op("CreateScope", [], ["ws"]), op]
    feeds = {**inputs, "y_grad": np.random.default_rng(n).standard_normal(shape).astype(np.float32)}
    fetch = [g for g in g_input if g is not None]
    assert fetch
    want = caffe2.run([("ops", forward), ("ops", c2_ops)], feeds, fetch=fetch)
    assert_blobs_equal(run_rnn2jax([*forward, *c2_ops], feeds, fetch, jit=False), want)


def test_jax_grad_flows_through_if_and_a_while_with_a_known_trip_count():
    """lax.cond differentiates; a While whose counter and bound are known (constants, not traced) unrolls, so
    jax.grad goes through it too (lax.while_loop, for a traced bound, has no reverse-mode gradient)."""
    import jax

    from rnn2jax.ir.loader import load
    from rnn2jax.lowering.interpreter import lower

    then = create_net("then", [make_op("Mul", ["x", "x"], ["y"])])
    otherwise = create_net("else", [make_op("Mul", ["x", "w"], ["y"])])
    if_net = lower(load(create_net("n", [make_op("If", ["c", "x", "w"], ["y"], then_net=then, else_net=otherwise)])))
    x, w = np.array([1.5, -2.0], np.float32), np.array([3.0, 0.5], np.float32)

    def if_loss(x, c):
        return if_net({"c": c, "x": x, "w": w})["y"].sum()

    grad = jax.jit(jax.grad(if_loss))
    np.testing.assert_allclose(grad(x, np.array(True)), 2 * x)
    np.testing.assert_allclose(grad(x, np.array(False)), w)

    loop = create_net("loop", [make_op("Add", ["i", "one"], ["i"]), make_op("Mul", ["acc", "w"], ["acc"])])
    cond = create_net("cond", [make_op("LT", ["i", "n"], ["c"])])
    op = make_op("While", ["c", "i", "acc", "one", "n", "w"], ["i", "acc"], loop_net=loop, cond_net=cond)
    while_net = lower(load(create_net("m", [op])))
    counters = {"c": np.array(False), "i": np.array(0, np.int32), "one": np.array(1, np.int32)}
    counters["n"] = np.array(3, np.int32)

    def while_loss(acc):
        return while_net({**counters, "acc": acc, "w": w})["acc"].sum()

    np.testing.assert_allclose(jax.jit(jax.grad(while_loss))(x), w**3, rtol=1e-6)
