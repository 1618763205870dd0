"""One rule for what is an input (rnn2jax/checking/input_rule.py), on the real breadbread LSTM, whose init net fills
its data inputs for a one-sample setup besides Loading the weights: `export --batch N --steps T` and `codegen`
take those blobs as inputs (what docs/serving.md and docs/codegen.md say of such a net), with the values of a
NumPy LSTM written here; `run` uses the init net's values as defaults; an export that would be a constant
function while asked for symbolic dims is refused, naming the blobs. (The pages' own commands, on the small
LSTM they show, are checked where they run: tests/test_docs_commands.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import rnn2jax
from helpers import BREADBREAD_HIDDEN as HIDDEN
from helpers import BREADBREAD_VOCAB as VOCAB
from helpers import BREADBREAD_WEIGHTS, REALNETS
from rnn2jax.cli import main
from rnn2jax.serving import load_exported

lmdb = pytest.importorskip("lmdb", reason="the breadbread init net Loads its weights from an lmdb (lmdb extra)")

PREDICT = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
INIT = REALNETS / "breadbread_lstmdemo_lstm_init_net.pbtxt"
needs_realnets = pytest.mark.skipif(not PREDICT.exists(), reason=f"the real Caffe2 nets are not in {REALNETS}")
DATA = ("input_blob", "seq_lengths", "hidden_init", "cell_init")


# ------------------------------------------------------------------------------------------------
# An independent reference: breadbread's predict net in NumPy (Caffe2's LSTMUnit: gates i, f, o, g;
# rows past their sequence length keep their state; FC axis 2; Softmax over the vocabulary)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def reference(w: dict[str, np.ndarray], x: np.ndarray, lengths: np.ndarray, h0: np.ndarray, c0: np.ndarray) -> dict:
    x, h, c = (np.asarray(a, np.float64) for a in (x, h0, c0))
    h, c = h.reshape(-1, HIDDEN), c.reshape(-1, HIDDEN)
    h, c = np.broadcast_to(h, (x.shape[1], HIDDEN)), np.broadcast_to(c, (x.shape[1], HIDDEN))
    i2h = x @ w["LSTM/i2h_w"].T.astype(np.float64) + w["LSTM/i2h_b"]
    rows = []
    for t in range(x.shape[0]):
        gates = h @ w["LSTM/gates_t_w"].T.astype(np.float64) + w["LSTM/gates_t_b"] + i2h[t]
        i, f, o, g = np.split(gates, 4, axis=1)
        new_c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        new_h = _sigmoid(o) * np.tanh(new_c)
        valid = (t < lengths)[:, None]
        h, c = np.where(valid, new_h, h), np.where(valid, new_c, c)
        rows.append(h)
    hidden_all = np.stack(rows) if rows else np.zeros((0, x.shape[1], HIDDEN))
    logits = hidden_all @ w["char_rnn_blob_0_w"].T.astype(np.float64) + w["char_rnn_blob_0_b"]
    e = np.exp(logits - logits.max(axis=2, keepdims=True))
    return {"softmax": e / e.sum(axis=2, keepdims=True), "LSTM/hidden_t_last": h[None], "LSTM/cell_t_last": c[None]}


def _close(got: dict, want: dict) -> None:
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(got[name], np.float64), value, rtol=2e-5, atol=2e-6, err_msg=name)


# ------------------------------------------------------------------------------------------------
# The files breadbread's init net reads, and its weights


@pytest.fixture(scope="module")
def bread(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A folder holding models/LSTM_params (the lmdb the init net Loads, one BlobProto per blob as older
    Caffe2 wrote them) and weights.npz (the same weights)."""
    from rnn2jax.proto import caffe2_pb2 as pb

    folder = tmp_path_factory.mktemp("bread")
    rng = np.random.default_rng(22)
    weights = {k: (rng.standard_normal(s) * 0.3).astype(np.float32) for k, s in BREADBREAD_WEIGHTS.items()}
    (folder / "models").mkdir()
    env = lmdb.open(str(folder / "models" / "LSTM_params"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for name, value in weights.items():
            tensor = pb.TensorProto(dims=value.shape, data_type=pb.TensorProto.FLOAT, float_data=value.ravel())
            txn.put(name.encode(), pb.BlobProto(name=name, type="Tensor", tensor=tensor).SerializeToString())
    env.close()
    np.savez(folder / "weights.npz", **weights)
    return folder, weights


def _reference(weights: dict, inputs: dict) -> dict:
    return reference(weights, *(inputs[n] for n in ("input_blob", "seq_lengths", "hidden_init", "cell_init")))


def _sample(steps: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_blob": rng.standard_normal((steps, batch, VOCAB)).astype(np.float32),
        "seq_lengths": rng.integers(0, steps + 1, batch).astype(np.int32),
        "hidden_init": (rng.standard_normal((1, batch, HIDDEN)) * 0.5).astype(np.float32),
        "cell_init": (rng.standard_normal((1, batch, HIDDEN)) * 0.5).astype(np.float32),
    }


# The four blobs the init net fills for one sample, as inputs of any batch size N and sequence length T
SYMBOLIC_DATA = {
    "input_blob": ("float32", ["T", "N", str(VOCAB)]),
    "seq_lengths": ("int32", ["N"]),
    "hidden_init": ("float32", ["1", "N", str(HIDDEN)]),
    "cell_init": ("float32", ["1", "N", str(HIDDEN)]),
}


@needs_realnets
def test_export_with_batch_and_steps_takes_the_filled_data_blobs_as_inputs(bread, tmp_path, capsys):
    """`export --init --batch N --steps T`: the blobs the init net fills for one sample get shapes their values
    do not have, so they are the artifact's inputs and only the weights are baked in; the artifact and
    rnn2jax.compile of the same net give the NumPy LSTM's values at several (T, N)."""
    folder, weights = bread
    out = tmp_path / "lstm.bin"
    argv = ["export", str(PREDICT), "--init", str(INIT), "--db-root", str(folder / "models")]
    assert main([*argv, "--batch", "N", "--steps", "T", "-o", str(out)]) == 0
    assert "inputs (none)" not in capsys.readouterr().out
    model = load_exported(out)
    assert {n: (str(s.dtype), [str(d) for d in s.shape]) for n, s in model.inputs.items()} == SYMBOLIC_DATA
    compiled = rnn2jax.compile(PREDICT, params=weights)  # the four data inputs are its inputs too
    assert set(compiled.input_names) == set(DATA)
    for steps, batch in ((1, 1), (5, 3), (2, 4)):
        inputs = _sample(steps, batch, seed=steps * 10 + batch)
        want = _reference(weights, inputs)
        _close(model(inputs), want)
        _close(compiled(inputs), want)


@needs_realnets
def test_codegen_takes_the_filled_data_blobs_as_inputs(bread, tmp_path, capsys):
    """`codegen` with the init net (or the same weights from an .npz): the module has no fixed shapes, so the
    blobs the init net fills for one sample are its INPUTS and its .npz holds the six weights; `apply` gives
    the NumPy LSTM's values."""
    folder, weights = bread
    with_init = ["--init", str(INIT), "--db-root", str(folder / "models")]
    for index, source in enumerate((with_init, ["--params", str(folder / "weights.npz")])):
        path = tmp_path / f"lstm_{index}.py"
        assert main(["codegen", str(PREDICT), *source, "-o", str(path)]) == 0, source
        assert "(6 parameters)" in capsys.readouterr().out  # the weights; the data inputs are inputs
        spec = importlib.util.spec_from_file_location(f"bread_codegen_{index}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules.pop(spec.name, None)
        assert set(module.INPUTS) == set(DATA)
        params = module.load_params()
        assert set(params) == set(weights)
        inputs = _sample(4, 3, seed=index)
        _close(module.apply(params, inputs), _reference(weights, inputs))


@needs_realnets
def test_run_names_a_filled_blob_as_an_input_and_keeps_the_rest_as_defaults(bread, tmp_path, capsys):
    """`run --input input_blob=x.npy` with the init net: input_blob is the file's, the other data inputs
    the init net's values (fn.defaults, the one-sample setup)."""
    folder, weights = bread
    fn = rnn2jax.compile(PREDICT, INIT, db_root=folder / "models", inputs=list(DATA))
    assert fn.input_names and set(fn.input_names) == set(DATA) and set(fn.defaults) == set(DATA)
    assert np.shape(fn.defaults["input_blob"]) == (1, 1, VOCAB) and not set(DATA) & set(fn.params)
    x = np.eye(VOCAB, dtype=np.float32)[[3, 9, 4]].reshape(3, 1, VOCAB)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    base = ["run", str(PREDICT), "--init", str(INIT), "--db-root", str(folder / "models")]
    assert main([*base, "--input", f"input_blob={tmp_path / 'x.npy'}", "--output", str(out)]) == 0
    defaults = {n: np.asarray(v) for n, v in fn.defaults.items()}
    want = reference(weights, x, defaults["seq_lengths"], defaults["hidden_init"], defaults["cell_init"])
    _close(dict(np.load(out)), want)
    # without --input the init net's own one-sample input is used
    assert main([*base, "--output", str(out)]) == 0
    _close(dict(np.load(out)), _reference(weights, defaults))
    # a batch of 2 against the init net's one-sample hidden_init: the error says how to make it an input
    np.save(tmp_path / "x2.npy", np.zeros((3, 2, VOCAB), np.float32))
    capsys.readouterr()
    assert main([*base, "--input", f"input_blob={tmp_path / 'x2.npy'}"]) == 2
    err = capsys.readouterr().err
    assert "op #1 (RecurrentNetwork)" in err and "hidden_init is filled by the init net" in err and "--input" in err


@needs_realnets
def test_export_by_input_shape_alone_takes_the_named_input(bread, tmp_path, capsys):
    folder, weights = bread
    out = tmp_path / "one.bin"
    base = ["export", str(PREDICT), "--init", str(INIT), "--db-root", str(folder / "models"), "-o", str(out)]
    assert main([*base, "--input-shape", f"input_blob=T,1,{VOCAB}"]) == 0
    model = load_exported(out)
    assert list(model.inputs) == ["input_blob"]
    defaults = rnn2jax.compile(PREDICT, INIT, db_root=folder / "models", inputs=list(DATA)).defaults
    x = np.random.default_rng(3).standard_normal((4, 1, VOCAB)).astype(np.float32)
    want = reference(weights, x, *(np.asarray(defaults[n]) for n in ("seq_lengths", "hidden_init", "cell_init")))
    _close(model({"input_blob": x}), want)


def test_export_of_a_constant_function_with_symbolic_dims_is_refused(tmp_path, capsys):
    from google.protobuf import text_format

    from rnn2jax.caffe2.opdef import create_net, create_operator

    net = create_net("relu", [create_operator("Relu", ["x"], ["y"])])
    init = create_net("init", [create_operator("GivenTensorFill", [], ["x"], shape=[2], values=[-1.0, 2.0])])
    (tmp_path / "net.pbtxt").write_text(text_format.MessageToString(net))
    (tmp_path / "init.pbtxt").write_text(text_format.MessageToString(init))
    base = ["export", str(tmp_path / "net.pbtxt"), "--init", str(tmp_path / "init.pbtxt")]
    assert main([*base, "--batch", "N", "-o", str(tmp_path / "m.bin")]) == 2
    err = capsys.readouterr().err
    assert "would take no inputs" in err and "(x)" in err and "N" in err and "--shape x=" in err
    assert not (tmp_path / "m.bin").exists()
    # named, x is an input; with fixed dims a constant export stays allowed
    assert main([*base, "--input-shape", "x=N", "-o", str(tmp_path / "m.bin")]) == 0
    assert load_exported(tmp_path / "m.bin")({"x": np.array([-3.0, 0.5, 4.0], np.float32)})["y"].tolist() == [
        0.0, 0.5, 4.0,
    ]  # fmt: skip
    assert main([*base, "-o", str(tmp_path / "c.bin")]) == 0
    assert load_exported(tmp_path / "c.bin").inputs == {}


def test_compile_inputs_names_must_be_read_by_the_net():
    from rnn2jax.caffe2.opdef import create_net, create_operator

    net = create_net("relu", [create_operator("Relu", ["x"], ["y"])])
    init = create_net("init", [create_operator("GivenTensorFill", [], ["x"], shape=[2], values=[-1.0, 2.0])])
    fn = rnn2jax.compile(net, init, inputs=["x"])
    assert fn.input_names == ("x",) and np.asarray(fn()["y"]).tolist() == [0.0, 2.0]
    assert np.asarray(fn(x=np.array([5.0, -5.0], np.float32))["y"]).tolist() == [5.0, 0.0]
    with pytest.raises(rnn2jax.MissingBlobError, match=r"net 'relu'.*inputs= names y, which the net does not read"):
        rnn2jax.compile(net, init, inputs=["y"])


@needs_realnets
def test_verify_draws_a_filled_blob_given_a_shape(bread):
    """`verify --shape` for blobs the init net fills: they are inputs, drawn at the shapes given (before,
    the init net's one-sample values won and the shapes were ignored)."""
    folder, _ = bread
    shapes = {
        "input_blob": (3, 2, VOCAB),
        "hidden_init": (1, 2, HIDDEN),
        "cell_init": (1, 2, HIDDEN),
        "seq_lengths": (2,),
    }
    report = rnn2jax.verify(PREDICT, shapes, init_net=INIT, db_root=folder / "models")
    assert report.ok and len(report.checks) == 5
    notes = " ".join(report.notes)
    assert "a shape given for input_blob, hidden_init, cell_init, seq_lengths" in notes
    assert "LSTM/i2h [3, 2, 400]" in notes


def test_compare_follows_the_rule(caffe2):
    """`compare` with an init net that fills the FC's input for one sample: --batch makes it an input drawn
    at [4, 3], a given value makes it an input with that value, and otherwise the filled value is used;
    real Caffe2 runs the same arrays each time and agrees."""
    from rnn2jax.caffe2.opdef import create_net, create_operator
    from rnn2jax.checking.comparison import compare

    net = create_net("fc", [create_operator("FC", ["x", "w", "b"], ["y"])])
    fills = {"x": ([1, 3], [1.0, 2.0, 3.0]), "w": ([2, 3], [1.0, 0.0, -1.0, 2.0, 1.0, 0.0]), "b": ([2], [0.5, -0.5])}
    init = create_net(
        "init", [create_operator("GivenTensorFill", [], [n], shape=s, values=v) for n, (s, v) in fills.items()]
    )
    shapes = {}
    for kwargs in ({"batch": 4}, {"inputs": {"x": np.ones((2, 3), np.float32)}}, {}):
        report = compare(net, init_net=init, caffe2=caffe2, **kwargs)
        assert report.ok, report
        shapes[len(shapes)] = report.blobs[0].shape
    assert shapes == {0: (4, 2), 1: (2, 2), 2: (1, 2)}
