"""Shape inference: every input's shape and dtype from --batch/--steps, the given shapes and the parameters.

The references are independent of the inference: the arrays the builder-cell tests build their inputs with
(tests/recurrent/test_builder_cells.py), the breadbread char-RNN's sizes (tests/programs/test_breadbread_e2e.py),
the input order of `rnn2jax.compile`, and a real `rnn2jax verify` run whose gradients are computed at the inferred
shapes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_breadbread_e2e import HIDDEN, INIT, PREDICT, VOCAB, WEIGHTS, write_weights
from test_builder_cells import CELLS, random_params, sizes
from test_verify import DPER, dper_shapes

import rnn2jax
from helpers import REALNETS
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.checking.shape_inference import InputSpec, infer_input_specs, infer_shapes, runnable_part
from rnn2jax.cli import main
from rnn2jax.errors import ShapeError

needs_realnets = pytest.mark.skipif(not PREDICT.exists(), reason=f"real nets folder {REALNETS} is absent")
PARAMS = {name: np.zeros(shape, np.float32) for name, shape in WEIGHTS.items()}


def _substituted(specs: dict[str, InputSpec], dims: dict[str, int]) -> dict[str, tuple]:
    return {name: (tuple(dims.get(d, d) for d in spec.shape), spec.dtype) for name, spec in specs.items()}


@pytest.mark.parametrize("cell", CELLS)
@settings(max_examples=2, deadline=None)
@given(s=sizes(min_steps=0, max_steps=4))
def test_builder_cells_need_only_batch_and_steps(cell, s):
    """Every builder cell: the shapes and dtypes the cell tests build their inputs with (initial states in
    the builders' [1, N, H] form), from the parameters and N, T alone (and the encoder outputs, whose
    length is neither). With N and T given as names, the same shapes with the names in place."""
    s = {**s, "forms": ["3-D"] * 4}
    reset_net_names()
    rng = np.random.default_rng(s["seed"])
    built = CELLS[cell](s, rng)
    net, params = built.model.net.Proto(), random_params(built.model, rng)
    want = {name: (value.shape, value.dtype.name) for name, value in built.inputs.items()}
    encoder = built.inputs.get("enc")
    given_shapes = {"enc": encoder.shape} if encoder is not None else {}
    got = infer_input_specs(net, params, given_shapes, batch=s["N"], steps=s["T"])
    assert _substituted(got, {}) == want
    assert tuple(got) == rnn2jax.compile(net, params=params).input_names

    symbolic_given = {"enc": ("L", "N", encoder.shape[2])} if encoder is not None else {}
    symbolic = infer_input_specs(net, params, symbolic_given, batch="N", steps="T")
    sequence = symbolic["dec_in" if encoder is not None else "x"]
    assert sequence.shape[:2] == ("T", "N")
    assert _substituted(symbolic, {"T": s["T"], "N": s["N"], "L": s["L"]}) == want


@needs_realnets
@settings(max_examples=3, deadline=None)
@given(batch=st.integers(1, 9), steps=st.integers(0, 9))
def test_breadbread_predict_net_inputs(batch, steps):
    got = infer_input_specs(PREDICT, PARAMS, {}, batch=batch, steps=steps)
    assert got == {
        "input_blob": InputSpec((steps, batch, VOCAB), "float32"),
        "hidden_init": InputSpec((1, batch, HIDDEN), "float32"),
        "cell_init": InputSpec((1, batch, HIDDEN), "float32"),
        "seq_lengths": InputSpec((batch,), "int32"),
    }
    # what was given wins over nothing, and the rest follows from it (here without --batch/--steps)
    given_shapes = {"input_blob": (steps, batch, VOCAB)}
    assert infer_input_specs(PREDICT, PARAMS, given_shapes) == got


@needs_realnets
def test_breadbread_symbolic_dims_stay_names():
    got = infer_input_specs(PREDICT, PARAMS, {}, batch="N", steps="T")
    assert got["input_blob"] == InputSpec(("T", "N", VOCAB), "float32")
    assert got["hidden_init"] == InputSpec((1, "N", HIDDEN), "float32")
    assert got["seq_lengths"] == InputSpec(("N",), "int32")
    found = infer_shapes(PREDICT, PARAMS, {}, batch="N", steps="T")
    assert found.blobs["LSTM/i2h"] == InputSpec(("T", "N", 4 * HIDDEN), "float32")  # computed by op #0
    assert found.blobs["softmax"] == InputSpec(("T", "N", VOCAB), "float32")


@needs_realnets
def test_missing_shapes_name_the_blob_its_reader_and_the_flag():
    """The advice in Python's words (steps=, a shapes dict) from the API, in flags where the CLI prints it."""
    with pytest.raises(ShapeError) as caught:
        infer_input_specs(PREDICT, PARAMS, {}, batch=4, flag="--input-shape")
    message = str(caught.value)
    assert message.startswith("net 'lstm_predict_net': cannot infer the shape of 1 input(s)")
    assert "'input_blob' (read by op #0 (FC))" in message
    assert "pass steps=T or give its shape: {'input_blob': (D0, D1, ...)}" in message and "--" not in message
    command_line = caught.value.for_command_line()
    assert "--steps T" in command_line and "--input-shape input_blob=" in command_line
    assert "hidden_init" not in message  # known from the step net and --batch

    without_weight = {k: v for k, v in PARAMS.items() if k != "LSTM/gates_t_w"}
    with pytest.raises(ShapeError) as caught:
        infer_input_specs(PREDICT, without_weight, {}, batch=4, steps=7)
    message = str(caught.value)
    assert "cannot infer the shape of 1 input(s): 'LSTM/gates_t_w' (read by op #1 (RecurrentNetwork))" in message
    assert "give its shape: {'LSTM/gates_t_w': (D0, D1, ...)}" in message
    assert caught.value.for_command_line().endswith("give it: --shape LSTM/gates_t_w=D0,D1,...")
    # H still follows from the step net: gates = FC(hidden, W) + input_t, and input_t is [1, N, 4H]
    assert "hidden_init" not in message


@needs_realnets
def test_inconsistent_shapes_name_the_op():
    with pytest.raises(ShapeError, match=r"op #0 \(FC\).*'input_blob' \[7, 4, 63\]"):
        infer_input_specs(PREDICT, PARAMS, {"input_blob": (7, 4, VOCAB + 1)}, batch=4, steps=7)
    with pytest.raises(ShapeError, match=r"op #1 \(RecurrentNetwork\): initial state 'hidden_init'"):
        infer_input_specs(PREDICT, PARAMS, {"hidden_init": (1, 3, HIDDEN)}, batch=4, steps=7)


@needs_realnets
def test_batch_and_steps_replace_the_data_an_init_net_fills():
    """The init net's one-character setup: batch/steps decide the data inputs, the weights stay."""
    defaults = {
        "input_blob": np.zeros((1, 1, VOCAB), np.float32),
        "seq_lengths": np.ones(1, np.int32),
        "hidden_init": np.zeros((1, HIDDEN), np.float32),
        "cell_init": np.zeros((1, HIDDEN), np.float32),
        **PARAMS,
    }
    found = infer_shapes(PREDICT, {}, {}, batch=4, steps=7, defaults=defaults)
    assert sorted(found.replaced) == ["cell_init", "hidden_init", "input_blob", "seq_lengths"]
    assert found.blobs["LSTM/i2h"] == InputSpec((7, 4, 4 * HIDDEN), "float32")
    assert found.inputs["LSTM/gates_t_w"] == InputSpec(WEIGHTS["LSTM/gates_t_w"], "float32")
    kept = infer_shapes(PREDICT, {}, {}, defaults=defaults)
    assert kept.replaced == () and kept.blobs["LSTM/i2h"] == InputSpec((1, 1, 4 * HIDDEN), "float32")
    # a 1-D initial state is repeated over the batch: it fits any batch and stays
    one_d_state = {**defaults, "cell_init": np.zeros(HIDDEN, np.float32)}
    one_d = infer_shapes(PREDICT, {}, {}, batch=4, steps=7, defaults=one_d_state)
    assert "cell_init" not in one_d.replaced and "hidden_init" in one_d.replaced


@needs_realnets
def test_verify_breadbread_with_its_init_net_needs_only_batch_and_steps(tmp_path, capsys):
    rng = np.random.default_rng(0)
    write_weights(tmp_path / "LSTM_params", {k: rng.normal(0, 0.3, v).astype(np.float32) for k, v in WEIGHTS.items()})
    args = ["verify", str(PREDICT), "--init", str(INIT), "--db-root", str(tmp_path), "--batch", "4", "--steps", "7"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"]
    assert [c["blob"] for c in report["checks"]] == [
        "LSTM/i2h_grad",
        "LSTM/gates_t_w_grad",
        "LSTM/gates_t_b_grad",
        "hidden_init_grad",
        "cell_init_grad",
    ]
    notes = " ".join(report["notes"])
    assert "LSTM/i2h [7, 4, 400]" in notes
    assert "input_blob [1, 1, 62] -> [7, 4, 62]" in notes and "hidden_init [1, 100] -> [1, 4, 100]" in notes
    assert "parameters keep their values" in notes


@needs_realnets
def test_compare_takes_batch_and_steps(caffe2, tmp_path, capsys):
    """`rnn2jax compare` with --batch/--steps instead of four --shape: real Caffe2 runs the net on the
    inputs drawn at the inferred shapes and agrees blob by blob."""
    rng = np.random.default_rng(1)
    params = tmp_path / "params.npz"
    np.savez(params, **{k: rng.normal(0, 0.3, v).astype(np.float32) for k, v in WEIGHTS.items()})
    args = ["compare", str(PREDICT), "--params", str(params), "--batch", "3", "--steps", "6"]
    assert main([*args, "--caffe2", str(caffe2.python), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    shapes = {b["blob"]: b["shape"] for b in report["blobs"]}
    assert report["ok"] and shapes["softmax"] == [6, 3, VOCAB] and shapes["LSTM/hidden_t_last"] == [1, 3, HIDDEN]


@needs_realnets
def test_dper_lstm_pools_from_their_weights():
    """The real dper net (176 ops, sparse features, ops rnn2jax cannot lower): its two LSTM pools' inputs
    follow from --batch/--steps and their gate weights alone; the reference is test_verify's dper shapes,
    which verify accepts (the initial states there are 1-D [H]; the builders' form is [1, N, H])."""
    net = rnn2jax.load(DPER)
    rnns = [op for op in net.ops if op.type == "RecurrentNetwork"]
    weights = {name: shape for op in rnns for name, shape in dper_shapes(op).items() if name in op.inputs[3:5]}
    found = infer_shapes(runnable_part(net), {}, weights, batch=4, steps=6)
    for op in rnns:
        i2h, h0, c0, _, _, lengths = op.inputs
        want = dper_shapes(op)
        assert found.blobs[i2h] == InputSpec(want[i2h], "float32")  # computed by the net: from the step net
        assert found.blobs[lengths] == InputSpec(want[lengths], "int32")
        assert found.blobs[h0] == found.blobs[c0] == InputSpec((1, 4, *want[h0]), "float32")
    assert "float_features:lengths" in found.missing  # sparse features: their sizes depend on the data
