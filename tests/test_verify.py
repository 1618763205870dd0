"""The verification harness: real backward step nets pass, broken ones fail and are named."""

from __future__ import annotations

import json

import pytest
from google.protobuf import text_format

import rnn2jax
from helpers import REALNETS
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.cli import main
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
    report = rnn2jax.verify(
        BREADBREAD, shapes=BREADBREAD_SHAPES, dtype=dtype, finite_differences=dtype == "float64"
    )
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
    args = ["verify", str(BREADBREAD)] + [
        f"--shape={k}={','.join(map(str, v))}" for k, v in BREADBREAD_SHAPES.items()
    ]
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
    keep = [
        i for i, name in enumerate(args["backward_link_internal"].strings) if name != b"LSTM/cell_t_prev_grad"
    ]
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
        (_drop_backward_link, {"cell_init_grad"}),
        (_forget_param_accumulation, {"LSTM/gates_t_b_grad"}),
    ],
    ids=[
        "drop-split-sum",
        "swap-gate-blocks",
        "scale-fc-gradient",
        "drop-backward-link",
        "forget-param-grad",
    ],
)
def test_broken_backward_nets_are_caught(mutate, wrong):
    report = rnn2jax.verify(_breadbread_with(mutate), shapes=BREADBREAD_SHAPES)
    assert not report.ok
    failed = {c.blob for c in report.failed}
    assert wrong <= failed, str(report)
    assert "MISMATCH" in str(report)


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
