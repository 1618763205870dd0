"""Predictor exports: what real Caffe2's `predictor_exporter.save_to_db` writes runs in `rnn2jax.load_model`
and gives what real Caffe2's predictor (`prepare_prediction_net`, then the predict net) gives; the CLI takes
an export where it takes a net; a DB that is not a complete export is a one-line error naming it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from rnn2jax.caffe2.opdef import create_operator
from rnn2jax.cli import main
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.proto import metanet_pb2
from rnn2jax.serving import load_exported
from tests.differential import assert_blobs_equal

_fresh = itertools.count()


def _random_params(caffe2, init: pb.NetDef, rng) -> dict[str, np.ndarray]:
    """The blobs the model's param-init net makes, with the same shapes but random values (biases too)."""
    made = caffe2.run([("net", init)], {}, None)
    return {name: rng.standard_normal(value.shape).astype(np.float32) for name, value in made.items()}


def mlp(caffe2, sizes: tuple[int, int, int], rng) -> tuple[pb.NetDef, dict[str, np.ndarray], list[str]]:
    """An FC/Relu/FC/Softmax model built by real Caffe2's brew, with random parameters."""
    d, h, o = sizes
    model = {"$model": "model"}
    calls = [
        {"fn": "brew.fc", "args": [model, "data", "fc1"], "kwargs": {"dim_in": d, "dim_out": h}},
        {"fn": "brew.relu", "args": [model, "fc1", "relu1"]},
        {"fn": "brew.fc", "args": [model, "relu1", "fc2"], "kwargs": {"dim_in": h, "dim_out": o}},
        {"fn": "brew.softmax", "args": [model, "fc2", "softmax"]},
    ]
    nets, _ = caffe2.build(calls, {"model": {"name": "mlp"}})
    net, init = nets["model"]
    return net, _random_params(caffe2, init, rng), ["softmax"]


def lstm(caffe2, d: int, h: int, rng) -> tuple[pb.NetDef, dict[str, np.ndarray], list[str]]:
    """A forward-only `rnn_cell.LSTM` built by real Caffe2, with random parameters."""
    call = {
        "fn": "rnn_cell.LSTM",
        "args": [{"$model": "model"}, "seq", "seq_lengths", ["h0", "c0"], d, h],
        "kwargs": {"scope": "lstm", "forward_only": True},
    }
    nets, results = caffe2.build([call], {"model": {"name": "lstm_model"}})
    net, init = nets["model"]
    hidden_all, hidden_last, _, cell_last = results[0]
    return net, _random_params(caffe2, init, rng), [hidden_all, hidden_last, cell_last]


def export_and_compare(caffe2, path, net, params, inputs, outputs) -> rnn2jax.CompiledNet:
    caffe2.save_predictor(path, net, {**params, **inputs}, list(params), list(inputs), outputs)
    want = caffe2.run_predictor(path, inputs, outputs)
    fn = rnn2jax.load_model(path)
    assert fn.input_names == tuple(inputs) and fn.output_names == tuple(outputs)
    got = fn(inputs)
    assert_blobs_equal({n: np.asarray(v) for n, v in got.items()}, want)
    return fn


@given(
    sizes=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 5)),
    batch=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_mlp_export_matches_caffe2_predictor(caffe2, tmp_path, sizes, batch, seed):
    rng = np.random.default_rng(seed)
    net, params, outputs = mlp(caffe2, sizes, rng)
    inputs = {"data": rng.standard_normal((batch, sizes[0])).astype(np.float32)}
    fn = export_and_compare(caffe2, tmp_path / f"mlp{next(_fresh)}.minidb", net, params, inputs, outputs)
    assert set(fn.params) == set(params)
    for name, value in params.items():  # the parameters come out of the DB bit for bit
        assert np.asarray(fn.params[name]).tobytes() == value.tobytes(), name


@given(
    t=st.integers(1, 5),
    n=st.integers(1, 3),
    d=st.integers(1, 4),
    h=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_lstm_export_matches_caffe2_predictor(caffe2, tmp_path, t, n, d, h, seed):
    rng = np.random.default_rng(seed)
    net, params, outputs = lstm(caffe2, d, h, rng)
    inputs = {
        "seq": rng.standard_normal((t, n, d)).astype(np.float32),
        "seq_lengths": rng.integers(1, t + 1, size=n).astype(np.int32),
        "h0": rng.standard_normal((1, n, h)).astype(np.float32),
        "c0": rng.standard_normal((1, n, h)).astype(np.float32),
    }
    export_and_compare(caffe2, tmp_path / f"lstm{next(_fresh)}.minidb", net, params, inputs, outputs)


# ------------------------------------------------------------------------------------------------
# Exports written here, run by both: Load's source_blob_names, strip_prefix and add_prefix, and init ops


def _meta(global_init: pb.NetDef, predict: pb.NetDef, inputs, outputs, parameters) -> bytes:
    meta = metanet_pb2.MetaNetDef()
    # As predictor_exporter does: Caffe2's prepare_prediction_net runs the predict-init net unconditionally,
    # and creating the predict net fails unless every input blob already exists.
    fills = [create_operator("ConstantFill", [], [name], shape=[1], value=0.0) for name in (*inputs, *outputs)]
    nets = (("GLOBAL_INIT_NET_TYPE", global_init), ("PREDICT_INIT_NET_TYPE", _net("predict-init", fills)))
    for key, net in (*nets, ("PREDICT_NET_TYPE", predict)):
        meta.nets.add(key=key).value.CopyFrom(net)
    for key, blobs in (
        ("INPUTS_BLOB_TYPE", inputs),
        ("OUTPUTS_BLOB_TYPE", outputs),
        ("PARAMETERS_BLOB_TYPE", parameters),
    ):
        meta.blobs.add(key=key, value=blobs)
    return meta.SerializeToString()


def _net(name: str, ops, external_inputs=()) -> pb.NetDef:
    net = pb.NetDef(name=name)
    net.op.extend(ops)
    net.external_input.extend(external_inputs)
    return net


def renamed_export(path, rng) -> tuple[dict[str, np.ndarray], list[str]]:
    """An export whose DB keys differ from the blob names the predict net reads, and whose global init net
    computes one parameter from another. Returns the inputs and outputs."""
    reader = "!!PREDICTOR_DBREADER"
    w, b, scale = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (3,), (3,)))
    global_init = _net(
        "global-init",
        [
            create_operator("Load", [reader], ["fc_w"], source_blob_names=["stored/weights"]),
            create_operator("Load", [reader], ["model/fc_b", "model/gain"], strip_prefix="old/", add_prefix="model/"),
            create_operator("Scale", ["model/gain"], ["gain2"], scale=2.0),
        ],
        [reader],
    )
    predict = _net(
        "predict",
        [
            create_operator("FC", ["x", "fc_w", "model/fc_b"], ["y"]),
            create_operator("Mul", ["y", "gain2"], ["z"], broadcast=1),
        ],
        ["x", "fc_w", "model/fc_b", "gain2"],
    )
    meta = _meta(global_init, predict, ["x"], ["z"], ["fc_w", "model/fc_b", "gain2"])
    blobs = {"!!META_NET_DEF": meta, "stored/weights": w, "ckpt/old/fc_b": b, "old/gain": scale}
    rnn2jax.write_blobs(path, blobs)
    return {"x": rng.standard_normal((2, 4)).astype(np.float32)}, ["z"]


def test_load_renaming_and_init_ops_match_caffe2(caffe2, tmp_path):
    path = tmp_path / "renamed.minidb"
    inputs, outputs = renamed_export(path, np.random.default_rng(0))
    want = caffe2.run_predictor(path, inputs, outputs)
    got = rnn2jax.load_model(path)(inputs)
    assert_blobs_equal({n: np.asarray(v) for n, v in got.items()}, want)


# ------------------------------------------------------------------------------------------------
# The command line


@pytest.fixture(scope="module")
def mlp_export(caffe2, tmp_path_factory):
    rng = np.random.default_rng(7)
    net, params, outputs = mlp(caffe2, (4, 5, 3), rng)
    inputs = {"data": rng.standard_normal((2, 4)).astype(np.float32)}
    path = tmp_path_factory.mktemp("cli") / "mlp.minidb"
    caffe2.save_predictor(path, net, {**params, **inputs}, list(params), list(inputs), outputs)
    return path, inputs, caffe2.run_predictor(path, inputs, outputs)


def test_cli_inspect_shows_the_export(mlp_export, capsys):
    path, _, _ = mlp_export
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "!!META_NET_DEF" in out and "fc1_w" in out  # the blob table
    assert f"{path}: predictor export" in out
    assert "    PREDICT_NET_TYPE: net 'mlp_1', 4 ops" in out
    assert "    inputs: data\n    outputs: softmax\n    parameters: 4" in out


@pytest.mark.parametrize("db_type", [[], ["--db-type", "minidb"]], ids=["by-content", "db-type"])
def test_cli_run_an_export(mlp_export, tmp_path, db_type, capsys):
    path, inputs, want = mlp_export
    np.savez(tmp_path / "in.npz", **inputs)
    out = tmp_path / "out.npz"
    assert main(["run", str(path), *db_type, "--inputs", str(tmp_path / "in.npz"), "--output", str(out)]) == 0
    with np.load(out) as got:
        assert_blobs_equal(dict(got), want)


def test_cli_export_an_export(mlp_export, tmp_path):
    path, inputs, want = mlp_export
    out = tmp_path / "mlp.bin"
    assert main(["export", str(path), "--input-shape", "data=2,4", "-o", str(out)]) == 0
    served = load_exported(out)
    assert_blobs_equal({n: np.asarray(v) for n, v in served(inputs).items()}, want)


def test_cli_verify_an_export(mlp_export, capsys):
    path, _, _ = mlp_export
    assert main(["verify", str(path)]) == 2  # it reads the export's predict net, which has nothing to verify
    captured = capsys.readouterr()
    assert "nothing to verify" in captured.err and "it has no RecurrentNetwork op" in captured.err
    assert captured.out == ""


def test_cli_refuses_init_with_an_export(mlp_export, capsys):
    path, _, _ = mlp_export
    assert main(["run", str(path), "--init", "init.pb"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "brings its own init nets" in err


# ------------------------------------------------------------------------------------------------
# Errors


def _one_line(error: pytest.ExceptionInfo, *parts: str) -> None:
    text = str(error.value)
    assert "\n" not in text, text
    for part in parts:
        assert part in text, text


def test_not_an_export(tmp_path):
    path = tmp_path / "params.minidb"
    rnn2jax.write_blobs(path, {"w": np.ones(3, np.float32)})
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.load_model(path)
    _one_line(error, str(path), "not a predictor export", "!!META_NET_DEF")


def test_unreadable_meta_net_def(tmp_path):
    path = tmp_path / "bad.minidb"
    rnn2jax.write_blobs(path, {"!!META_NET_DEF": b"\xff\xff\xff not a proto"})
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.load_model(path)
    _one_line(error, str(path), "!!META_NET_DEF", "MetaNetDef")


def test_missing_predict_net(tmp_path):
    path = tmp_path / "nopredict.minidb"
    meta = metanet_pb2.MetaNetDef()
    meta.nets.add(key="GLOBAL_INIT_NET_TYPE").value.CopyFrom(_net("global-init", []))
    meta.nets.add(key="PREDICT_NET_TYPE_other").value.CopyFrom(_net("p", []))
    rnn2jax.write_blobs(path, {"!!META_NET_DEF": meta.SerializeToString()})
    with pytest.raises(rnn2jax.StorageError) as error:
        rnn2jax.load_model(path, name="")
    _one_line(error, str(path), "no net 'PREDICT_NET_TYPE'", "PREDICT_NET_TYPE_other")
    with pytest.raises(rnn2jax.StorageError) as error:  # and a name it does hold has no global init net
        rnn2jax.load_model(path, name="other")
    _one_line(error, str(path), "no net 'GLOBAL_INIT_NET_TYPE_other'")


def test_missing_parameter(tmp_path):
    path = tmp_path / "renamed.minidb"
    renamed_export(path, np.random.default_rng(1))
    blobs = rnn2jax.read_blobs(path)
    del blobs["old/gain"]
    rnn2jax.write_blobs(path, blobs)
    with pytest.raises(rnn2jax.MissingBlobError) as error:
        rnn2jax.load_model(path)
    _one_line(error, str(path), "'model/gain'", "Load")


def test_predict_net_reads_an_unknown_blob(tmp_path):
    path = tmp_path / "unknown.minidb"
    predict = _net("predict", [create_operator("Add", ["x", "bias"], ["y"])])
    meta = _meta(_net("global-init", []), predict, ["x"], ["y"], [])
    rnn2jax.write_blobs(path, {"!!META_NET_DEF": meta})
    with pytest.raises(rnn2jax.MissingBlobError) as error:
        rnn2jax.load_model(path)
    _one_line(error, str(path), "'bias'", "neither an input")


def test_cli_error_on_a_params_db(tmp_path, capsys):
    path = tmp_path / "params.minidb"
    rnn2jax.write_blobs(path, {"w": np.ones(3, np.float32)})
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a predictor export" in err and str(path) in err
