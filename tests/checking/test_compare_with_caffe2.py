"""`rnn2jax compare` (a net in rnn2jax against real Caffe2, blob by blob), `rnn2jax verify --caffe2` (real
Caffe2's RecurrentNetworkGradient as a third opinion) and `rnn2jax setup-caffe2`. The commands run
in-process through `cli.main`; Caffe2 runs in its own interpreter, as it does for users."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from helpers import BREADBREAD_WEIGHTS, REALNETS
from rnn2jax.caffe2.python import brew
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.cli import main
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.ops.registry import REGISTRY, lookup
from rnn2jax.proto import caffe2_pb2 as pb

PREDICT = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
TRAIN_PLAN = REALNETS / "breadbread_lstmdemo_train_plan.pbtxt"
needs_realnets = pytest.mark.skipif(not PREDICT.exists(), reason=f"real nets folder {REALNETS} is absent")
VOCAB = 62
PREDICT_SHAPES = ["input_blob=6,3,62", "seq_lengths=3", "hidden_init=1,3,100", "cell_init=1,3,100"]
VERIFY_SHAPES = {
    "LSTM/i2h": "5,3,16",
    "hidden_init": "1,3,4",
    "cell_init": "1,3,4",
    "LSTM/gates_t_w": "16,4",
    "LSTM/gates_t_b": "16",
    "seq_lengths": "3",
}


@pytest.fixture
def python(caffe2):
    """The interpreter of the Caffe2 venv (the `caffe2` fixture skips where there is none)."""
    return caffe2.python


@pytest.fixture
def predict_params(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "params.npz"
    np.savez(path, **{k: (rng.standard_normal(s) * 0.3).astype(np.float32) for k, s in BREADBREAD_WEIGHTS.items()})
    return path


def _predict_args(params, python) -> list[str]:
    shapes = [arg for shape in PREDICT_SHAPES for arg in ("--shape", shape)]
    return ["compare", str(PREDICT), "--params", str(params), *shapes, "--caffe2", python]


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows by blob name."""
    lines = out.splitlines()
    return {line.split()[0]: line.split() for line in lines[2:] if line and not line.startswith(("-", " "))}


@needs_realnets
def test_compare_breadbread_predict_net(python, predict_params, capsys):
    assert main(_predict_args(predict_params, python)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["blob", "shape", "dtype", "max", "abs", "err", "max", "rel", "err", "ok"]
    rows = _rows(out)
    # external outputs first, then every other blob the net writes
    assert [line.split()[0] for line in lines[2:5]] == ["softmax", "LSTM/hidden_t_last", "LSTM/cell_t_last"]
    for blob in ("LSTM/i2h", "LSTM/hidden_t_all", "char_rnn_blob_0", "input_blob", "hidden_init", "cell_init"):
        assert rows[blob][-1] == "ok", out
    assert rows["softmax"][1:4] == ["[6,", "3,", "62]"] and rows["softmax"][4] == "float32"
    assert "not compared: LSTM/step_workspaces" in out
    assert "all 10 blobs of net 'lstm_predict_net' agree with real Caffe2" in out

    assert main([*_predict_args(predict_params, python), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["blobs"]) == 10
    assert all(b["max_rel"] <= 1e-5 for b in report["blobs"])


def _training_net(tmp_path):
    """A corpus-style training net built as Caffe2 users built one: LSTM, FC, softmax loss, GetBackwardPass."""
    model = ModelHelper(name="char_train")
    hidden_all, *_ = LSTM(model, "x", "seq_lengths", ("h0", "c0"), 5, 8, scope="lstm")
    logits = brew.fc(model, hidden_all, "logits", dim_in=8, dim_out=7, axis=2)
    flat, _ = model.net.Reshape([logits], ["logits_flat", "logits_old_shape"], shape=[-1, 7])
    model.net.SoftmaxWithLoss([flat, "labels"], ["probs", "loss"])
    proto = pb.NetDef()
    proto.CopyFrom(model.net.Proto())
    backward, grad_map = get_backward_pass(list(proto.op), {"loss": None})
    proto.op.extend(backward)
    net, init = tmp_path / "train_net.pb", tmp_path / "init_net.pbtxt"
    net.write_bytes(proto.SerializeToString())
    init.write_text(str(model.param_init_net.Proto()))
    labels = tmp_path / "labels.npy"
    np.save(labels, np.random.default_rng(3).integers(0, 7, size=4 * 3).astype(np.int32))
    return net, init, labels, grad_map


def test_compare_builder_training_net(python, tmp_path, capsys):
    net, init, labels, grad_map = _training_net(tmp_path)
    args = ["compare", str(net), "--init", str(init), "--input", f"labels={labels}", "--caffe2", python]
    args += ["--shape", "x=4,3,5", "--shape", "seq_lengths=3", "--shape", "h0=1,3,8", "--shape", "c0=1,3,8"]
    assert main(args) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    rows = _rows(out)
    for weight in ("lstm/i2h_w", "lstm/gates_t_w", "lstm/gates_t_b", "logits_w", "logits_b"):
        assert rows[grad_map[weight]][-1] == "ok", out  # the gradients are compared
    assert rows["loss"][-1] == "ok" and rows["probs"][-1] == "ok"
    assert "agree with real Caffe2" in out


@needs_realnets
def test_compare_finds_a_broken_kernel(python, predict_params, capsys, monkeypatch):
    """A Softmax kernel that is 1% off: the blobs that depend on it differ, and are named."""
    (softmax,) = [op for op in _ops_of(PREDICT) if op.type == "Softmax"]
    original = lookup(softmax)

    def broken(op):
        kernel = original.build(op)
        return lambda *arrays: kernel(*arrays) * 1.01

    monkeypatch.setitem(REGISTRY, "Softmax", dataclasses.replace(original, build=broken))
    assert main(_predict_args(predict_params, python)) == 1
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows["softmax"][-1] == "MISMATCH" and rows["input_blob"][-1] == "MISMATCH"
    assert rows["LSTM/hidden_t_all"][-1] == "ok"
    assert "2 of 10 blobs of net 'lstm_predict_net' differ from real Caffe2: softmax, input_blob" in out


def _ops_of(path):
    import rnn2jax

    return rnn2jax.load(path).ops


@needs_realnets
def test_compare_plan_net_one_iteration(python, tmp_path, capsys):
    """breadbread's train plan: its training net, once, after its init net (less the database)."""
    labels = tmp_path / "labels.npy"
    np.save(labels, np.random.default_rng(1).integers(0, VOCAB, size=(10, 25)).astype(np.int32))
    args = ["compare", str(TRAIN_PLAN), "--net", "char_rnn", "--init", "char_rnn_init", "--caffe2", python]
    args += ["--input", f"label_int32={labels}", "--shape", "data_float=10,25,62"]
    args += ["--shape", "hidden_init=10,100", "--shape", "cell_init=10,100"]
    assert main(args) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    rows = _rows(out)
    for blob in ("loss", "LSTM/gates_t_w_grad", "LSTM/i2h_w_grad", "optimizer_iteration", "lr", "LSTM/gates_t_w"):
        assert rows[blob][-1] == "ok", out
    assert "left out (reads external storage): net 'char_rnn' op #0 (TensorProtosDBInput)" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["compare", "missing.pbtxt", "--caffe2", "PY"], "cannot read net file 'missing.pbtxt'"),
        (["compare", str(TRAIN_PLAN), "--caffe2", "PY"], "pick one with --net NAME"),
        (["compare", str(TRAIN_PLAN), "--net", "nope", "--caffe2", "PY"], "has no net 'nope'"),
        (["compare", str(PREDICT), "--caffe2", "PY"], "no value for input(s) input_blob"),
        (["compare", str(PREDICT), "--shape", "bogus=3", "--caffe2", "PY"], "bogus are not inputs of the net"),
    ],
)
def test_compare_bad_input_is_exit_2(args, message, python, capsys):
    args = [python if a == "PY" else a for a in args]
    if not PREDICT.exists() and "missing" not in args[1]:
        pytest.skip(f"real nets folder {REALNETS} is absent")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("rnn2jax: error: ") and message in err and err.count("\n") == 1, err


def test_compare_without_caffe2_says_how_to_get_it(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("RNN2JAX_CAFFE2_PYTHON", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # no venv at setup-caffe2's default place
    assert main(["compare", str(tmp_path / "net.pb")]) == 2
    err = capsys.readouterr().err
    assert "rnn2jax setup-caffe2" in err and "--caffe2" in err and err.count("\n") == 1
    assert main(["compare", str(tmp_path / "net.pb"), "--caffe2", str(tmp_path / "python")]) == 2
    assert "setup-caffe2" in capsys.readouterr().err


@needs_realnets
def test_verify_with_caffe2_adds_a_column(python, capsys):
    args = ["verify", str(PREDICT), *[f"--shape={k}={v}" for k, v in VERIFY_SHAPES.items()], "--caffe2", python]
    assert main(args) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "max rel err" in header and "caffe2 rel err" in header
    assert "LSTM/gates_t_w_grad" in out and "all gradients agree" in out
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["checks"]) == 5
    assert all(c["caffe2_rel"] is not None and c["caffe2_rel"] < 1e-5 for c in report["checks"])


@needs_realnets
def test_verify_without_caffe2_has_no_column(capsys):
    assert main(["verify", str(PREDICT), *[f"--shape={k}={v}" for k, v in VERIFY_SHAPES.items()]]) == 0
    assert "caffe2" not in capsys.readouterr().out


def test_setup_caffe2_prints_the_interpreter(python, capsys):
    """On an existing Caffe2 venv, setup-caffe2 checks it and prints its Python (nothing is installed)."""
    from pathlib import Path

    venv = Path(python).parent.parent
    assert main(["setup-caffe2", "--venv", str(venv)]) == 0
    assert capsys.readouterr().out.strip() == str(venv / "bin" / "python")


def test_setup_caffe2_without_python39_is_exit_2(tmp_path, capsys):
    assert main(["setup-caffe2", "--venv", str(tmp_path / "v"), "--python", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no Python 3.9 interpreter found" in err and err.count("\n") == 1
