"""The real breadbread character LSTM end to end, from its databases: the train plan reads TensorProtos
batches from an lmdb (CreateDB + TensorProtosDBInput), trains a few hundred iterations (the loss falls),
and Saves its weights to an lmdb; the real test plan and predict net then Load that checkpoint and give
the outputs a NumPy LSTM gives with the trained weights.

The databases are written here with `lmdb` and hand-built `caffe2_pb2` messages, and the checkpoint is read
back the same way: rnn2jax's own DB code is never the reference.
"""

from __future__ import annotations

import lmdb
import numpy as np
import pytest

import rnn2jax
from helpers import BREADBREAD_WEIGHTS, REALNETS
from reference import lstm
from rnn2jax.cli import main
from rnn2jax.ir.wire import parse_message
from rnn2jax.proto import caffe2_pb2 as pb

TRAIN_PLAN = REALNETS / "breadbread_lstmdemo_train_plan.pbtxt"
TEST_PLAN = REALNETS / "breadbread_lstmdemo_test_plan.pbtxt"
PREDICT = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
INIT = REALNETS / "breadbread_lstmdemo_lstm_init_net.pbtxt"
pytestmark = pytest.mark.skipif(not TRAIN_PLAN.exists(), reason=f"real nets folder {REALNETS} is absent")

VOCAB, HIDDEN, SEQ, BATCH = 62, 100, 25, 10  # what the plan's shapes and Reshape(250) expect
WEIGHTS = BREADBREAD_WEIGHTS  # what the init net's Load names, with the shapes the plans give them
RECORDS = 30  # 3 batches: the reader wraps around every 3 iterations
ITERS = 200


# -- an independent writer and reader of the two databases -------------------------------------------


def _tensor(array: np.ndarray) -> pb.TensorProto:
    proto = pb.TensorProto(dims=array.shape)
    if array.dtype == np.float32:
        proto.data_type = pb.TensorProto.FLOAT
        proto.float_data.extend(array.ravel().tolist())
    else:
        proto.data_type = pb.TensorProto.INT32
        proto.int32_data.extend(array.ravel().astype(np.int32).tolist())
    return proto


def write_dataset(path, rng) -> list[tuple[np.ndarray, np.ndarray]]:
    """RECORDS samples of a learnable text (each character is followed by the next one in the alphabet):
    one-hot [SEQ, VOCAB] float inputs and [SEQ] int32 next-character labels, a TensorProtos per record."""
    samples = []
    env = lmdb.open(str(path), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for index in range(RECORDS):
            chars = (rng.integers(VOCAB) + np.arange(SEQ + 1)) % VOCAB
            x = np.eye(VOCAB, dtype=np.float32)[chars[:SEQ]]
            y = chars[1:].astype(np.int32)
            message = pb.TensorProtos(protos=[_tensor(x), _tensor(y)])
            txn.put(f"{index:08d}".encode(), message.SerializeToString())
            samples.append((x, y))
    env.close()
    return samples


def write_weights(path, weights: dict[str, np.ndarray]) -> None:
    """One BlobProto per blob under its plain name (no chunk suffix), as older Caffe2 wrote them."""
    env = lmdb.open(str(path), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for name, value in weights.items():
            blob = pb.BlobProto(name=name, type="Tensor", tensor=_tensor(value))
            txn.put(name.encode(), blob.SerializeToString())
    env.close()


def read_checkpoint(path) -> dict[str, np.ndarray]:
    """Every tensor blob of an lmdb of BlobProtos, chunks ("name#%i") put together by their segments."""
    parts: dict[str, list[pb.TensorProto]] = {}
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        for key, value in txn.cursor():
            blob = pb.BlobProto.FromString(value)
            assert blob.type == "Tensor"
            parts.setdefault(key.decode().split("#%")[0], []).append(blob.tensor)
    env.close()
    out = {}
    for name, chunks in parts.items():
        dims = tuple(chunks[0].dims)
        flat = np.full(int(np.prod(dims)), np.nan, np.float32)
        for chunk in chunks:
            assert chunk.data_type == pb.TensorProto.FLOAT
            end = chunk.segment.end if chunk.HasField("segment") else flat.size
            begin = chunk.segment.begin if chunk.HasField("segment") else 0
            flat[begin:end] = np.asarray(chunk.float_data, np.float32)
        assert not np.isnan(flat).any(), name
        out[name] = flat.reshape(dims)
    return out


# -- NumPy references -------------------------------------------------------------------------------


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def predict_reference(w: dict[str, np.ndarray], x, h0, c0):
    """The predict net: FC(axis 2) -> LSTM -> FC(axis 2) -> Softmax(axis 2), in float64."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    x_proj = np.asarray(x, np.float64) @ w["LSTM/i2h_w"].T + w["LSTM/i2h_b"]
    hidden_all, h, _, c = lstm(x_proj, h0, c0, w["LSTM/gates_t_w"], w["LSTM/gates_t_b"])
    return softmax(hidden_all @ w["char_rnn_blob_0_w"].T + w["char_rnn_blob_0_b"]), h, c


def loss_reference(w, samples, h0, c0) -> float:
    """The train net's loss on one batch: mean cross-entropy of the next character."""
    x = np.stack([s[0] for s in samples]).transpose(1, 0, 2)  # [SEQ, BATCH, VOCAB]
    y = np.stack([s[1] for s in samples]).T
    probs, _, _ = predict_reference(w, x, h0, c0)
    picked = np.take_along_axis(probs, y[..., None], axis=-1)
    return float(-np.log(picked).mean())


# -- the tests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The train plan run for ITERS iterations in a Workspace whose db_root holds the dataset, with the
    loss of every iteration."""
    root = tmp_path_factory.mktemp("train")
    samples = write_dataset(root / "dataset", np.random.default_rng(0))
    workspace = rnn2jax.Workspace(db_root=root)
    losses, initial = [], {}

    def observe(path, iteration, num_iter):
        if not initial and workspace.has_blob("LSTM/i2h_w"):
            initial.update({name: workspace.fetch(name) for name in WEIGHTS})
        # one loss per training iteration: each run of the train net advances its AtomicIter counter
        if workspace.has_blob("loss") and int(workspace.fetch("optimizer_iteration")[0]) > len(losses):
            losses.append(float(workspace.fetch("loss")))

    workspace.run_plan(TRAIN_PLAN, should_continue=lambda i: i < ITERS, observer=observe)
    return root, samples, workspace, losses, initial


def test_train_plan_reads_its_batches_and_the_loss_falls(trained):
    _, samples, workspace, losses, initial = trained
    assert len(losses) == ITERS
    # the first batch is records 0-9 in the DB's order, stacked [BATCH, SEQ, ...] by TensorProtosDBInput
    zeros = np.zeros((BATCH, HIDDEN))
    assert losses[0] == pytest.approx(loss_reference(initial, samples[:BATCH], zeros, zeros), rel=1e-4)
    assert np.mean(losses[-10:]) < 0.25 * np.mean(losses[:10]), (losses[:10], losses[-10:])
    # after ITERS batches the reader wrapped around: the last batch read is ITERS % 3
    last = (ITERS - 1) % (RECORDS // BATCH)
    data = workspace.fetch("data_float")
    expected = np.stack([s[0] for s in samples[last * BATCH : (last + 1) * BATCH]])
    np.testing.assert_array_equal(data, expected)
    np.testing.assert_array_equal(workspace.fetch("label_int32")[0], samples[last * BATCH][1])


def test_save_writes_the_trained_weights_as_an_lmdb(trained):
    root, _, workspace, _, initial = trained
    checkpoint = read_checkpoint(root / "LSTM_params")
    assert sorted(checkpoint) == sorted(WEIGHTS)
    for name, shape in WEIGHTS.items():
        assert checkpoint[name].shape == shape
        np.testing.assert_array_equal(checkpoint[name], workspace.fetch(name), err_msg=name)
        assert not np.array_equal(checkpoint[name], initial[name]), f"{name} was not trained"


def test_run_plan_command_trains_to_the_same_checkpoint(trained, tmp_path, capsys):
    root, _, _, losses, _ = trained
    (tmp_path / "dataset").symlink_to(root / "dataset")
    code = main(["run-plan", str(TRAIN_PLAN), "--db-root", str(tmp_path), "--iters", str(ITERS), "--log", "loss"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"loss: {losses[-1]:g}" in out
    ours, theirs = read_checkpoint(tmp_path / "LSTM_params"), read_checkpoint(root / "LSTM_params")
    for name in WEIGHTS:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def test_test_plan_serves_the_checkpoint(trained):
    root, _, _, _, _ = trained
    weights = read_checkpoint(root / "LSTM_params")
    workspace = rnn2jax.Workspace(db_root=root, seed=3)
    start: dict[str, np.ndarray] = {}

    def observe(path, iteration, num_iter):
        if not start:  # after the init net: the random first character and states, and the loaded weights
            start.update({name: workspace.fetch(name) for name in ("input_blob", "hidden_init", "cell_init")})
            for name in WEIGHTS:
                np.testing.assert_array_equal(workspace.fetch(name), weights[name], err_msg=name)

    workspace.run_plan(TEST_PLAN, observer=observe)
    x, h, c = start["input_blob"], start["hidden_init"], start["cell_init"]
    assert x.shape == (1, 1, VOCAB) and x.sum() == 1  # a one-hot character
    for _ in range(20):  # lstm_predict_net, then lstm_loop_net feeding the softmax back
        probs, h, c = predict_reference(weights, x, h, c)
        x = probs
    np.testing.assert_allclose(workspace.fetch("softmax"), probs, rtol=2e-4, atol=1e-6)
    # the RNN's last states are [1, N, D]; the loop net copies them into the next step's states
    np.testing.assert_allclose(workspace.fetch("hidden_init"), h[None], rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(workspace.fetch("cell_init"), c[None], rtol=2e-4, atol=1e-6)


def test_compile_loads_the_checkpoint_with_db_root(trained):
    root, _, _, _, _ = trained
    weights = read_checkpoint(root / "LSTM_params")
    fn = rnn2jax.compile(PREDICT, init_net=INIT, db_root=root)
    assert fn.input_names == ()  # the init net makes the first character and the states too
    for name in WEIGHTS:
        np.testing.assert_array_equal(np.asarray(fn.params[name]), weights[name], err_msg=name)
    result = fn()
    p = {name: np.asarray(value) for name, value in fn.params.items()}
    probs, h, c = predict_reference(weights, p["input_blob"], p["hidden_init"], p["cell_init"])
    np.testing.assert_allclose(np.asarray(result["softmax"]), probs, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(result["LSTM/hidden_t_last"]), h[None], rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(result["LSTM/cell_t_last"]), c[None], rtol=2e-4, atol=1e-6)


def test_compile_loads_weights_from_an_independently_written_lmdb(tmp_path):
    rng = np.random.default_rng(5)
    weights = {name: (0.2 * rng.standard_normal(shape)).astype(np.float32) for name, shape in WEIGHTS.items()}
    write_weights(tmp_path / "LSTM_params", weights)
    fn = rnn2jax.compile(PREDICT, init_net=INIT, db_root=tmp_path)
    for name, value in weights.items():
        np.testing.assert_array_equal(np.asarray(fn.params[name]), value, err_msg=name)
    p = {name: np.asarray(value) for name, value in fn.params.items()}
    probs, _, _ = predict_reference(weights, p["input_blob"], p["hidden_init"], p["cell_init"])
    np.testing.assert_allclose(np.asarray(fn()["softmax"]), probs, rtol=2e-4, atol=1e-6)


def test_init_net_without_db_root_names_the_db_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(rnn2jax.Rnn2JaxError) as info:
        rnn2jax.compile(PREDICT, init_net=INIT)
    message = str(info.value)
    assert "\n" not in message
    assert "(Load)" in message and "LSTM_params" in message and "lmdb" in message
    # Python advice from the Python API, the flag from the command line (the same error, worded for its reader)
    assert "does not exist" in message and "db_root=DIR" in message and "--db-root" not in message
    assert "--db-root DIR" in info.value.for_command_line() and "db_root=" not in info.value.for_command_line()


def test_train_plan_is_what_this_test_expects():
    plan = parse_message(TRAIN_PLAN.read_bytes(), "train plan")
    ops = {op.type: op for net in plan.network for op in net.op}
    create = {a.name: a.s.decode() for a in ops["CreateDB"].arg}
    save = {a.name: a.s.decode() for a in ops["Save"].arg}
    assert create == {"db_type": "lmdb", "db": "dataset"}
    assert save == {"db": "LSTM_params", "db_type": "lmdb"}
    assert list(ops["Save"].input) == list(WEIGHTS)


def test_run_command_loads_the_checkpoint_with_db_root(trained, tmp_path, capsys):
    root, _, _, _, _ = trained
    weights = read_checkpoint(root / "LSTM_params")
    out = tmp_path / "out.npz"
    assert main(["run", str(PREDICT), "--init", str(INIT), "--db-root", str(root), "--output", str(out)]) == 0
    fn = rnn2jax.compile(PREDICT, init_net=INIT, db_root=root)  # the same seed: the same first character
    p = {name: np.asarray(value) for name, value in fn.params.items()}
    probs, _, _ = predict_reference(weights, p["input_blob"], p["hidden_init"], p["cell_init"])
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["softmax"], probs, rtol=2e-4, atol=1e-6)
