"""The verification harness: real backward step nets pass, broken ones fail and are named; the reference is
JAX's own differentiation of the plain lowering (no custom VJP), finite differences are float64."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from test_builder_cells import CELLS, random_params

import rnn2jax
from helpers import REALNETS
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.checking.verification import _OpCheck, _prepare, reference_jaxprs
from rnn2jax.cli import main
from rnn2jax.errors import BadArgumentError
from rnn2jax.lowering.interpreter import lower
from rnn2jax.proto import caffe2_pb2 as pb

DPER = REALNETS / "dper_train_net_lstm_pooling.pbtxt"
BREADBREAD = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
needs_realnets = pytest.mark.skipif(not DPER.exists(), reason=f"real nets folder {REALNETS} is absent")

BREADBREAD_SHAPES = {
    "LSTM/i2h": (5, 3, 16),
    "hidden_init": (1, 3, 4),
    "cell_init": (1, 3, 4),
    "LSTM/gates_t_w": (16, 4),
    "LSTM/gates_t_b": (16,),
    "seq_lengths": (3,),
}


def dper_shapes(op) -> dict:
    i2h, h0, c0, w, b, lengths = op.inputs
    return {i2h: (6, 4, 128), h0: (32,), c0: (32,), w: (128, 32), b: (128,), lengths: (4,)}


@needs_realnets
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_breadbread_backward_step_net_agrees_with_jax(dtype):
    report = rnn2jax.verify(BREADBREAD, shapes=BREADBREAD_SHAPES, dtype=dtype, finite_differences=dtype == "float64")
    assert report.ok, str(report)
    assert [c.blob for c in report.checks] == [
        "LSTM/i2h_grad",
        "LSTM/gates_t_w_grad",
        "LSTM/gates_t_b_grad",
        "hidden_init_grad",
        "cell_init_grad",
    ]
    bound = 1e-5 if dtype == "float32" else 1e-9
    assert all(c.max_rel <= bound for c in report.checks), str(report)


@needs_realnets
def test_both_dper_lstm_ops_pass():
    net = rnn2jax.load(DPER)
    rnns = [op for op in net.ops if op.type == "RecurrentNetwork"]
    shapes = {k: v for op in rnns for k, v in dper_shapes(op).items()}
    report = rnn2jax.verify(net, shapes=shapes)
    assert report.ok, str(report)
    assert len({c.op for c in report.checks}) == 2
    assert len(report.checks) == 10  # per op: input, 2 params, 2 initial states (1-D: summed over the batch)


@needs_realnets
def test_cli_verify_prints_table_and_json(capsys):
    args = ["verify", str(BREADBREAD)] + [f"--shape={k}={','.join(map(str, v))}" for k, v in BREADBREAD_SHAPES.items()]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "LSTM/gates_t_w_grad" in out and "all gradients agree" in out
    assert main([*args, "--json", "--dtype", "float64"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["dtype"] == "float64" and len(data["checks"]) == 5


@needs_realnets
def test_cli_verify_missing_shapes_is_exit_2(capsys):
    assert main(["verify", str(BREADBREAD)]) == 2
    err = capsys.readouterr().err
    assert "give the shapes of LSTM/i2h" in err and err.count("\n") == 1


# --------------------------------------------------------------------------------------------------
# Mutations: the ways people broke backward step nets. Each must fail, naming the wrong gradient blob.


def _breadbread_with(mutate) -> pb.NetDef:
    net = text_format.Parse(BREADBREAD.read_text(encoding="utf-8"), pb.NetDef())
    (rnn,) = [op for op in net.op if op.type == "RecurrentNetwork"]
    (arg,) = [a for a in rnn.arg if a.name == "backward_step_net"]
    backward = text_format.Parse(arg.s.decode(), pb.NetDef())
    mutate(rnn, backward)
    arg.ClearField("s")
    arg.n.CopyFrom(backward)
    return net


def _drop_split_sum(rnn, backward):
    """Forget the Sum that accumulates the hidden-prev gradient split off by FCGradient."""
    (index,) = [i for i, op in enumerate(backward.op) if op.type == "Sum"]
    del backward.op[index]


def _swap_gate_blocks(rnn, backward):
    """Swap the i and f blocks of the gates gradient before FCGradient reads it."""
    ops = list(backward.op)
    fc = next(i for i, op in enumerate(ops) if op.type == "FCGradient")
    g = ops[fc].input[2]
    swap = [
        create_operator("Split", g, ["_i", "_f", "_o", "_g"], axis=2),
        create_operator("Concat", ["_f", "_i", "_o", "_g"], [g, "_dims"], axis=2),
    ]
    backward.ClearField("op")
    backward.op.extend(ops[:fc] + swap + ops[fc:])


def _scale_fc_weight_gradient(rnn, backward):
    fc = next(op for op in backward.op if op.type == "FCGradient")
    backward.op.append(create_operator("Scale", fc.output[0], fc.output[0], scale=0.5))


def _drop_backward_link(rnn, backward):
    """Forget the link that carries the cell-state gradient back to the previous step."""
    args = {a.name: a for a in rnn.arg}
    keep = [i for i, name in enumerate(args["backward_link_internal"].strings) if name != b"LSTM/cell_t_prev_grad"]
    for field in ("backward_link_internal", "backward_link_external"):
        values = [args[field].strings[i] for i in keep]
        del args[field].strings[:]
        args[field].strings.extend(values)
    offsets = [args["backward_link_offset"].ints[i] for i in keep]
    del args["backward_link_offset"].ints[:]
    args["backward_link_offset"].ints.extend(offsets)


def _forget_param_accumulation(rnn, backward):
    """The per-step bias gradient is written under a name param_grads does not list."""
    fc = next(op for op in backward.op if op.type == "FCGradient")
    fc.output[1] = "LSTM/gates_t_b_grad_lost"


@needs_realnets
@pytest.mark.parametrize(
    ("mutate", "wrong"),
    [
        (_drop_split_sum, {"LSTM/i2h_grad", "LSTM/gates_t_w_grad", "hidden_init_grad"}),
        (_swap_gate_blocks, {"LSTM/gates_t_w_grad"}),
        (_scale_fc_weight_gradient, {"LSTM/gates_t_w_grad"}),
        (_forget_param_accumulation, {"LSTM/gates_t_b_grad"}),
    ],
    ids=[
        "drop-split-sum",
        "swap-gate-blocks",
        "scale-fc-gradient",
        "forget-param-grad",
    ],
)
def test_broken_backward_nets_are_caught(mutate, wrong):
    report = rnn2jax.verify(_breadbread_with(mutate), shapes=BREADBREAD_SHAPES)
    assert not report.ok
    failed = {c.blob for c in report.failed}
    assert wrong <= failed, str(report)
    assert "MISMATCH" in str(report)


@needs_realnets
def test_a_backward_net_that_leaves_gradient_rows_unwritten_is_reported_undefined():
    """Without the link that carries the cell-state gradient back, step t reads row t + 1 of that gradient,
    which no step wrote: Caffe2 reads uninitialised memory, so every gradient of the op is undefined."""
    report = rnn2jax.verify(_breadbread_with(_drop_backward_link), shapes=BREADBREAD_SHAPES)
    assert not report.ok and report.failed == report.checks
    assert all(c.undefined and "row" in c.undefined and "cell_t_prev_states_grad" in c.undefined for c in report.checks)
    assert "UNDEFINED" in str(report) and "MISMATCH" not in str(report)
    assert "'backward_link_internal'" in str(report) and "uninitialised" in str(report)


def _rename_in_backward_net(rnn, backward):
    """Memonger's blob sharing: the gates gradient is called `shared_blob_0` inside the backward net,
    and the op says so with a `LSTM/gates_t_grad.rename` argument (SEMANTICS.md 2.9)."""
    for op in backward.op:
        for field in (op.input, op.output):
            for i, name in enumerate(field):
                if name == "LSTM/gates_t_grad":
                    field[i] = "shared_blob_0"
    rnn.arg.add(name="LSTM/gates_t_grad.rename", s=b"shared_blob_0")


@needs_realnets
def test_rename_arguments_are_honoured():
    net = _breadbread_with(_rename_in_backward_net)
    report = rnn2jax.verify(net, shapes=BREADBREAD_SHAPES)
    assert report.ok, str(report)
    without = _breadbread_with(lambda rnn, backward: _rename_in_backward_net(rnn, backward) or rnn.arg.pop())
    assert not rnn2jax.verify(without, shapes=BREADBREAD_SHAPES).ok


@needs_realnets
def test_breadbread_train_plan_passes_verify_from_the_command_line(capsys):
    """The plan's training net holds the only real RecurrentNetworkGradient found: verify checks the
    backward step net of its RecurrentNetwork op (the net's other ops need a database to run)."""
    plan = REALNETS / "breadbread_lstmdemo_train_plan.pbtxt"
    shapes = {"LSTM/i2h": (6, 10, 400), "hidden_init": (10, 100), "cell_init": (10, 100), "seq_lengths": (10,)}
    shapes |= {"LSTM/gates_t_w": (400, 100), "LSTM/gates_t_b": (400,)}
    assert rnn2jax.verify(plan, shapes=shapes).ok
    args = ["verify", str(plan)] + [f"--shape={k}={','.join(map(str, v))}" for k, v in shapes.items()]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "net 'char_rnn' (in plan 'lstm_train_plan'), op #5 (RecurrentNetwork)" in out
    assert "all gradients agree" in out


# --------------------------------------------------------------------------------------------------
# The reference is independent: JAX's own differentiation of the plain lowering, no custom VJP in it.

TRAIN_PLAN = REALNETS / "breadbread_lstmdemo_train_plan.pbtxt"
TRAIN_SHAPES = {
    "LSTM/i2h": (6, 10, 400),
    "hidden_init": (10, 100),
    "cell_init": (10, 100),
    "seq_lengths": (10,),
    "LSTM/gates_t_w": (400, 100),
    "LSTM/gates_t_b": (400,),
}


def _builder_lstm(hidden) -> tuple[pb.NetDef, pb.NetDef]:
    """rnn_cell.LSTM for training, (net, init net): one cell (`hidden` an int) or a stack (a list:
    MultiRNNCell)."""
    reset_net_names()
    model = ModelHelper(name="verify_lstm")
    layers = 1 if isinstance(hidden, int) else len(hidden)
    states = [name for k in range(layers) for name in (f"h{k}", f"c{k}")]
    LSTM(model, "x", "seq_lengths", states, 3, hidden, scope="lstm")
    return model.net.Proto(), model.param_init_net.Proto()


def _custom_primitives(jaxpr) -> list[str]:
    """Every custom_vjp/custom_jvp call of a jaxpr, nested jaxprs (scan bodies) included."""
    found = [eqn.primitive.name for eqn in jaxpr.eqns if re.search("custom_(vjp|jvp)", eqn.primitive.name)]
    for eqn in jaxpr.eqns:
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    found += _custom_primitives(inner if hasattr(inner, "eqns") else inner.jaxpr)
    return found


def _reference_cases():
    def builder(hidden):
        net, init = _builder_lstm(hidden)
        return net, {"init_net": init, "batch": 2, "steps": 4}

    yield pytest.param(lambda: builder(5), id="lstm-cell")
    yield pytest.param(lambda: builder([5, 4]), id="two-layer-stack")
    yield pytest.param(lambda: (TRAIN_PLAN, {"shapes": TRAIN_SHAPES}), id="breadbread-train-plan", marks=needs_realnets)


@pytest.mark.parametrize("source", list(_reference_cases()))
def test_reference_has_no_custom_derivative(source):
    """What verify differentiates holds no custom_vjp/custom_jvp call; lowered as `compile` lowers it, the
    same op goes through rnn2jax's custom-VJP LSTM (so this test can fail)."""
    net, arguments = source()
    plain = reference_jaxprs(net, **arguments)
    assert plain and all(not _custom_primitives(j.jaxpr) for j in plain.values())
    compiled = reference_jaxprs(net, **arguments, plain=False)
    assert compiled.keys() == plain.keys()
    assert all("custom_vjp_call" in _custom_primitives(j.jaxpr) for j in compiled.values())


@needs_realnets
def test_lstm_blobs_show_rounding_error_against_the_plain_reference():
    """The breadbread LSTM's backward step net against the independent reference: every blob differs, at
    float32 rounding (0.0 error would mean both sides are the same computation)."""
    report = rnn2jax.verify(TRAIN_PLAN, shapes=TRAIN_SHAPES)
    assert report.ok and len(report.checks) == 5, str(report)
    assert all(c.max_abs > 0 and c.max_rel < 1e-5 for c in report.checks), str(report)
    assert report.tolerances["jax.vjp"] == {"rtol": 1e-4, "atol": 1e-5}


def _cell_case(name: str) -> dict:
    forms = ["3-D", "2-D", "1-D", "3-D"]
    return {"T": 3, "N": 2, "D": 2, "H": 3, "L": 2, "E": 2, "forms": forms, "use_lengths": True, "lengths": [3, 1],
            "seed": sum(map(ord, name))}  # fmt: skip


@pytest.mark.parametrize("cell", CELLS)
def test_verify_every_builder_cell(cell):
    """Every cell the builders make: a training cell's backward step net passes against the plain reference
    (the LSTMs with nonzero, rounding-level error), a forward-only one is refused (nothing to check)."""
    rng = np.random.default_rng(_cell_case(cell)["seed"])
    reset_net_names()
    built = CELLS[cell](_cell_case(cell), rng)
    values = {**random_params(built.model, rng), **built.inputs}
    net = built.model.net.Proto()
    if not built.trainable:
        with pytest.raises(BadArgumentError, match="verify checks RecurrentNetwork ops that have a backward_step_"):
            rnn2jax.verify(net, params=values)
        return
    fd = cell in ("lstm", "gru", "attention-regular", "multi_rnn_cell")  # attention: a zero bias gradient
    report = rnn2jax.verify(net, params=values, finite_differences=fd)
    assert report.ok and report.checks, str(report)
    if cell in ("lstm", "multi_rnn_cell", "lstm-forget_bias", "lstm-all_output_grads"):
        assert all(c.max_abs > 0 and c.max_rel < 1e-5 for c in report.checks), str(report)
    if fd:
        assert all(c.fd_rel is not None and c.fd_rel < 1e-4 for c in report.checks), str(report)


@settings(max_examples=2, deadline=None)  # each example compiles two reverse scans
@given(
    hidden=st.sampled_from([3, [3, 2]]),
    steps=st.integers(1, 4),
    batch=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_custom_vjp_agrees_with_the_plain_reference(hidden, steps, batch, seed):
    """`jax.grad` through compile's normal path (the custom-VJP LSTM stack) against `jax.grad` of the plain
    lowering, judged as verify judges a hand-built gradient (atol 1e-5 + rtol 1e-4 x the largest)."""
    net, init = _builder_lstm(hidden)
    (rnn,), values, shapes, rng, _ = _prepare(net, None, seed, "float32", init, None, None, batch, steps)
    check = _OpCheck(rnn, values, shapes, rng, "float32")
    floats = {n: jnp.asarray(check.inputs[n]) for n in check.float_names()}
    outputs = jax.eval_shape(check.forward, floats)
    weights = {n: jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for n, v in outputs.items()}
    compiled = lower(check.forward_net)

    def loss(forward, p):
        return sum(jnp.vdot(forward(p)[n], weights[n]) for n in weights)

    def normal(p):
        env = compiled({**check.inputs, **p})
        return {n: env[n] for n in weights}

    got = jax.jit(jax.grad(lambda p: loss(normal, p)))(floats)
    want = jax.jit(jax.grad(lambda p: loss(check.forward, p)))(floats)
    assert _custom_primitives(jax.make_jaxpr(normal)(floats).jaxpr)  # the custom VJP is what is checked
    for name in want:
        scale = float(jnp.max(jnp.abs(want[name])))
        assert float(jnp.max(jnp.abs(got[name] - want[name]))) <= 1e-5 + 1e-4 * scale, name


# --------------------------------------------------------------------------------------------------
# Finite differences in float64; the tolerances printed are those applied; nothing to verify is exit 2.


@needs_realnets
def test_fd_passes_in_float32_on_the_train_plan(capsys):
    """`--fd` at the default dtype: the central differences are float64, so a float32 gradient agrees to
    its own rounding (float32 differences with step 1e-3 gave 1e-3-level noise); the report prints the
    tolerances it applied, per kind of check, and the JSON has them too."""
    args = ["verify", str(TRAIN_PLAN), "--fd"] + [
        f"--shape={k}={','.join(map(str, v))}" for k, v in TRAIN_SHAPES.items()
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "all gradients agree (dtype float32)" in out
    assert "ok within atol 1e-05 + rtol 0.0001 x the gradient's largest magnitude" in out
    assert "float64 central difference (step 1e-06)" in out and "ok up to rtol 0.001" in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tolerances"]["finite differences"]["rtol"] == 1e-3
    assert all(c["fd_rel"] < 1e-5 for c in data["checks"]), data["checks"]


@needs_realnets
def test_fd_catches_a_wrong_gradient():
    """The finite differences judge the hand-built gradient on their own: a halved weight gradient fails them."""
    report = rnn2jax.verify(
        _breadbread_with(_scale_fc_weight_gradient), shapes=BREADBREAD_SHAPES, finite_differences=True
    )
    (wrong,) = [c for c in report.checks if c.blob == "LSTM/gates_t_w_grad"]
    assert wrong.fd_rel > 0.1 and not wrong.ok
    assert all(c.fd_rel < 1e-4 for c in report.checks if c is not wrong), str(report)


@needs_realnets
def test_a_net_without_a_backward_step_net_is_a_usage_error(capsys):
    init = REALNETS / "breadbread_lstmdemo_lstm_init_net.pbtxt"
    with pytest.raises(BadArgumentError, match="net 'lstm_init_net': nothing to verify") as caught:
        rnn2jax.verify(init)
    assert "it has no RecurrentNetwork op" in str(caught.value)
    assert main(["verify", str(init)]) == 2
    err = capsys.readouterr().err
    assert "verify checks RecurrentNetwork ops that have a backward_step_net" in err and "lstm_init_net" in err


def test_a_forward_only_net_is_a_usage_error(capsys, tmp_path):
    reset_net_names()
    model = ModelHelper(name="inference")
    LSTM(model, "x", "seq_lengths", ("h0", "c0"), 3, 4, scope="lstm", forward_only=True)
    path = tmp_path / "inference.pb"
    path.write_bytes(model.net.Proto().SerializeToString())
    assert main(["verify", str(path), "--batch", "2", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "net 'inference'" in err and "its 1 RecurrentNetwork op(s) have none" in err
