"""`caffe2.python.predictor.predictor_exporter` on rnn2jax against real Caffe2, both ways.

The model is an LSTM built with `rnn_cell.LSTM` (a RecurrentNetwork op whose step net is an argument),
on drawn sizes and sequence lengths.

* rnn2jax -> Caffe2: rnn2jax builds and initializes the model in its compat workspace, runs it, and
  writes the export with its `save_to_db` (minidb). Real Caffe2 loads it with
  `prepare_prediction_net` (which calls `load_from_db`) and runs it: same outputs. Real Caffe2's
  `save_to_db` of the same net and parameters writes the same MetaNetDef (net names aside: both count
  them per process) and the same parameter blobs.
* Caffe2 -> rnn2jax: real Caffe2 builds, initializes and exports the model; rnn2jax's
  `prepare_prediction_net` loads it into its workspace and runs it to Caffe2's outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnn2jax.caffe2.python import core, model_helper, rnn_cell, workspace
from rnn2jax.caffe2.python.predictor import predictor_exporter, predictor_py_utils
from rnn2jax.caffe2.python.predictor_constants import predictor_constants
from rnn2jax.errors import StorageError
from rnn2jax.proto import metanet_pb2
from rnn2jax.serving.predictor import load_model, read_meta_net_def
from rnn2jax.storage import read_blobs

INPUTS = ("x", "lengths", "h0", "c0")


@st.composite
def lstm_cases(draw: Any) -> dict[str, Any]:
    t = draw(st.integers(1, 5), "T")
    n = draw(st.integers(1, 4), "N")
    d = draw(st.integers(1, 5), "D")
    h = draw(st.integers(1, 5), "H")
    rng = np.random.default_rng(draw(st.integers(0, 2**16), "seed"))
    return {
        "dims": (t, n, d, h),
        "scope": draw(st.sampled_from(["lstm", "enc/lstm1"]), "scope"),
        "inputs": {
            "x": rng.standard_normal((t, n, d)).astype(np.float32),
            "lengths": rng.integers(0, t + 1, size=n).astype(np.int32),
            "h0": rng.standard_normal((1, n, h)).astype(np.float32),
            "c0": rng.standard_normal((1, n, h)).astype(np.float32),
        },
    }


def _fresh_workspace(name: str) -> None:
    workspace.SwitchWorkspace(name, True)
    workspace.ResetWorkspace()


def _clear_device_options(net: Any) -> None:
    for op in net.op:
        op.ClearField("device_option")
        for arg in op.arg:
            if arg.HasField("n"):
                _clear_device_options(arg.n)


def _normalized(meta: metanet_pb2.MetaNetDef) -> metanet_pb2.MetaNetDef:
    """The MetaNetDef with its nets' names cleared (Caffe2 and rnn2jax number nets per process) and no
    device options (the oracle clears them, step nets included, before Caffe2 sees a net)."""
    copy = metanet_pb2.MetaNetDef()
    copy.CopyFrom(meta)
    for entry in copy.nets:
        entry.value.ClearField("name")
        _clear_device_options(entry.value)
    return copy


@settings(max_examples=6)
@given(case=lstm_cases())
def test_rnn2jax_export_runs_in_caffe2(caffe2, tmp_path_factory, case):
    _, _, d, h = case["dims"]
    inputs = case["inputs"]
    core.reset_net_names()
    _fresh_workspace("predictor_test")
    model = model_helper.ModelHelper(name="lstm_model")
    output, hidden_last, _, cell_last = rnn_cell.LSTM(model, "x", "lengths", ("h0", "c0"), d, h, scope=case["scope"])
    outputs = [str(output), str(hidden_last), str(cell_last)]
    db_type = "minidb"  # the one DB the torch 1.10.2 wheel's Caffe2 was built with
    workspace.RunNetOnce(model.param_init_net)
    for name, value in inputs.items():
        workspace.FeedBlob(name, value)
    workspace.RunNetOnce(model.net)
    ours = {name: workspace.FetchBlob(name) for name in outputs}
    params = [str(p) for p in model.params]
    values = {p: workspace.FetchBlob(p) for p in params}

    path = tmp_path_factory.mktemp("export") / f"ours.{db_type}"
    meta = predictor_exporter.PredictorExportMeta(model.net, params, list(INPUTS), outputs)
    predictor_exporter.save_to_db(db_type, str(path), meta)

    # Real Caffe2 loads rnn2jax's export (prepare_prediction_net -> load_from_db) and runs it.
    theirs = caffe2.run_predictor(path, inputs, outputs, db_type=db_type)
    for name in outputs:
        np.testing.assert_allclose(theirs[name], ours[name], rtol=1e-5, atol=1e-6, err_msg=name)

    # Real Caffe2's save_to_db of the same net and parameters: the same MetaNetDef and parameter blobs.
    reference = tmp_path_factory.mktemp("export") / f"caffe2.{db_type}"
    caffe2.save_predictor(reference, model.net.Proto(), {**values, **inputs}, params, list(INPUTS), outputs)
    reference_meta = read_meta_net_def(reference, "minidb")
    assert _normalized(read_meta_net_def(path, db_type)) == _normalized(reference_meta)
    saved = read_blobs(path, db_type)
    assert sorted(saved) == sorted([predictor_constants.META_NET_DEF, *params])
    for name in params:
        np.testing.assert_array_equal(saved[name], values[name], err_msg=name)

    # rnn2jax's own reader of exports (`rnn2jax predictor`, load_model) runs it to the same outputs.
    fn = load_model(path, db_type)
    got = fn(inputs)
    assert sorted(got) == sorted(outputs)
    for name in outputs:
        np.testing.assert_allclose(np.asarray(got[name]), ours[name], rtol=1e-5, atol=1e-6, err_msg=name)


@settings(max_examples=6)
@given(case=lstm_cases())
def test_caffe2_export_runs_on_rnn2jax(caffe2, tmp_path_factory, case):
    _, _, d, h = case["dims"]
    inputs = case["inputs"]
    recipe = [
        {
            "fn": "rnn_cell.LSTM",
            "args": [{"$model": "model"}, "x", "lengths", ["h0", "c0"], d, h],
            "kwargs": {"scope": case["scope"]},
        }
    ]
    nets, results = caffe2.build(recipe, {"model": {"name": "lstm_model"}})
    net, init = nets["model"]
    outputs = [str(results[0][0]), str(results[0][1]), str(results[0][3])]
    params = [op.output[0] for op in init.op]
    values = caffe2.run([("net", init)], {}, params)
    path = tmp_path_factory.mktemp("export") / "caffe2.minidb"
    caffe2.save_predictor(path, net, {**values, **inputs}, params, list(INPUTS), outputs)
    theirs = caffe2.run([("net", net)], {**values, **inputs}, outputs)

    _fresh_workspace("predictor_test")
    predict_net = predictor_exporter.prepare_prediction_net(str(path), "minidb")
    assert (
        workspace.FetchBlob(predictor_constants.META_NET_DEF)
        == read_blobs(path, "minidb")[predictor_constants.META_NET_DEF]
    )
    for name in params:  # the global init net's Load put Caffe2's parameters in our workspace
        np.testing.assert_array_equal(workspace.FetchBlob(name), values[name], err_msg=name)
    for name, value in inputs.items():
        workspace.FeedBlob(name, value)
    workspace.RunNet(predict_net.Proto().name)
    for name in outputs:
        np.testing.assert_allclose(workspace.FetchBlob(name), theirs[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_export_meta_names_and_checks():
    """Key names of a named predictor, and the argument checks PredictorExportMeta makes."""
    net = core.Net("p")
    meta = predictor_exporter.PredictorExportMeta(net, ["w"], ["x"], ["y"], name="m", trainer_prefix="tr")
    assert meta.predict_net_name() == "PREDICT_NET_TYPE_m"
    assert meta.parameters_name() == "PARAMETERS_BLOB_TYPE_m"
    assert meta.train_plan_name() == "tr_TRAIN_PLAN_TYPE_m"
    assert meta.shapes == {} and meta.predict_net is net.Proto()
    with pytest.raises(AssertionError, match="disjoint"):
        predictor_exporter.PredictorExportMeta(net, ["x"], ["x"], ["y"])
    with pytest.raises(AssertionError, match="unique"):
        predictor_exporter.PredictorExportMeta(net, [], ["x", "x"], ["y"])
    meta_net_def = metanet_pb2.MetaNetDef()
    predictor_py_utils.AddBlobs(meta_net_def, "A", ["a", "b"])
    predictor_py_utils.AddBlobs(meta_net_def, "A", ["c"])
    assert list(predictor_py_utils.GetBlobs(meta_net_def, "A")) == ["a", "b", "c"]
    assert predictor_py_utils.GetNet(meta_net_def, "none") is None


def test_load_from_db_errors(tmp_path: Path):
    """A DB that is no export, or no DB at all: one-line rnn2jax errors (RuntimeErrors, as in Caffe2)."""
    _fresh_workspace("predictor_test")
    workspace.FeedBlob("w", np.ones(2, np.float32))
    workspace.RunOperatorOnce(
        core.CreateOperator("Save", ["w"], [], db=str(tmp_path / "plain.minidb"), db_type="minidb", absolute_path=1)
    )
    with pytest.raises(RuntimeError, match="META_NET_DEF") as raised:
        predictor_exporter.prepare_prediction_net(str(tmp_path / "plain.minidb"), "minidb")
    assert isinstance(raised.value, StorageError | RuntimeError)
    with pytest.raises(RuntimeError, match="does not exist"):
        predictor_exporter.load_from_db(str(tmp_path / "missing.minidb"), "minidb")
