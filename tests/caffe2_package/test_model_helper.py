"""ModelHelper/Net naming rules and the RNN builders beyond the SEMANTICS.md listings."""

from __future__ import annotations

import pytest

import rnn2jax
from rnn2jax.caffe2.python.core import BlobReference, Net, reset_net_names
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.recurrent import recurrent_net
from rnn2jax.caffe2.python.rnn_cell import LSTM, BasicRNN, DropoutCell, LSTMCell, MultiRNNCell
from rnn2jax.caffe2.python.scope import CurrentNameScope as current_name_scope
from rnn2jax.caffe2.python.scope import NameScope as name_scope
from rnn2jax.errors import BadArgumentError


@pytest.fixture(autouse=True)
def _fresh_net_names():
    reset_net_names()


def rnn_op(model):
    (op,) = [o for o in model.net.Proto().op if o.type == "RecurrentNetwork"]
    return op


def args(op):
    return {a.name: a for a in op.arg}


def strings(arg):
    return [s.decode() for s in arg.strings]


def test_name_scopes_prefix_plain_names_but_not_blob_references():
    net = Net("n")
    with name_scope("a"), name_scope(None), name_scope(""), name_scope("b"):
        assert current_name_scope() == "a/b/"
        out = net.Relu(["x", BlobReference("y")], "z")
        with name_scope("r", reset=True):
            assert current_name_scope() == "r/"
    assert current_name_scope() == ""
    assert out == "a/b/z" and isinstance(out, BlobReference)
    assert list(net.Proto().op[0].input) == ["a/b/x", "y"]
    assert list(net.Proto().external_input) == ["a/b/x", "y"]  # undefined inputs become external inputs
    assert (out + "_w", "p/" + out) == ("a/b/z_w", "p/a/b/z") and isinstance(out + "_w", BlobReference)


def test_ops_get_caffe2_fields_and_arguments_in_keyword_order():
    net = Net("n")
    net.Softmax("x", "y", order="NCHW", axis=1, engine="CUDNN")
    net.Tanh("y", "z")
    softmax, tanh = net.Proto().op
    assert softmax.engine == "CUDNN" and not tanh.HasField("engine") and tanh.HasField("name")
    assert [a.name for a in softmax.arg] == ["order", "axis"]
    assert net.Relu("z") == "n/Relu" and net.Relu("z") == "n/Relu_2"  # auto-named outputs


def test_net_names_are_unique_process_wide_until_reset():
    assert [Net("a").Name(), Net("a").Name(), Net("b").Name(), Net("a").Name()] == ["a", "a_1", "b", "a_2"]
    reset_net_names()
    assert Net("a").Name() == "a"


def test_create_param_fills_once_in_the_init_net():
    model = ModelHelper("m")
    with name_scope("s"):
        w = model.create_param("w", [2, 3], ("XavierFill", {}))
        assert model.create_param("w", [2, 3], ("XavierFill", {})) == w == "s/w"
        with pytest.raises(BadArgumentError, match="shape"):
            model.create_param("w", [3, 3], ("XavierFill", {}))
    (fill,) = model.param_init_net.Proto().op
    assert (fill.type, list(fill.output), [a.name for a in fill.arg]) == ("XavierFill", ["s/w"], ["shape"])
    assert model.params == ["s/w"]


def test_lstm_without_initial_states_uses_parameters_and_default_names():
    model = ModelHelper("model")
    outputs = LSTM(model, "input", "seq_lengths", None, 2, 4)
    op = rnn_op(model)
    assert list(outputs) == ["hidden_state_all", "hidden_state_last", "cell_state_all", "cell_state_last"]
    assert list(op.input) == [
        "i2h",
        "initial_hidden_state",
        "initial_cell_state",
        "gates_t_w",
        "gates_t_b",
        "seq_lengths",
    ]
    assert op.output[-1] == "model/recurrent/step_workspaces"
    assert strings(args(op)["recurrent_states"]) == [
        "model/recurrent/hidden_t_prev_states",
        "model/recurrent/cell_t_prev_states",
    ]
    assert args(op)["step_net"].n.name == "model_1"  # the step ModelHelper is named "model" too
    fills = [(o.type, o.output[0], list(o.arg[0].ints)) for o in model.param_init_net.Proto().op]
    assert fills[:3] == [
        ("ConstantFill", "initial_hidden_state", [4]),
        ("ConstantFill", "initial_cell_state", [4]),
        ("XavierFill", "i2h_w", [16, 2]),
    ]


def test_forward_only_lstm_has_no_backward_arguments_and_unique_step_net_names():
    model = ModelHelper("model")
    LSTM(model, "x", "len", ["h0", "c0"], 2, 4, scope="lstm", forward_only=True)
    LSTM(model, "x", "len", ["h0", "c0"], 2, 4, scope="lstm")
    first, second = [o for o in model.net.Proto().op if o.type == "RecurrentNetwork"]
    assert "backward_step_net" not in args(first) and "param" not in args(first)
    assert args(first)["step_net"].n.name == "lstm" and args(second)["step_net"].n.name == "lstm_1"
    assert args(second)["backward_step_net"].n.name == "RecurrentBackwardStep"


def test_return_params_and_all_layers():
    model = ModelHelper("model")
    *outputs, params = LSTM(model, "x", "len", ["h0", "c0"], 2, 4, scope="lstm", return_params=True)
    assert params == {
        "input": {"weights": "lstm/i2h_w", "biases": "lstm/i2h_b"},
        "recurrent": {"weights": "lstm/gates_t_w", "biases": "lstm/gates_t_b"},
    }
    outputs = LSTM(model, "x", "len", list("abcd"), 2, [4, 4], scope="deep", return_last_layer_only=False)
    assert len(outputs) == 8 and outputs[4] == "deep/layer_1/hidden_state_all"


def test_third_layer_accum_blob_becomes_an_external_input():
    """Caffe2's stale blob table: from the second `_accum` Sum on, the accum blob counts as undefined."""
    model = ModelHelper("model")
    LSTM(model, "x", "len", list("abcdef"), 2, [4, 4, 4], scope="lstm")
    backward = args(rnn_op(model))["backward_step_net"].n
    accum_sums = [list(o.input) for o in backward.op if o.type == "Sum" and o.input[1].endswith("_accum")]
    assert accum_sums == [
        ["lstm/layer_1/hidden_state_grad", "lstm/layer_1/hidden_state_grad_accum"],
        ["lstm/layer_0/hidden_state_grad", "lstm/layer_0/hidden_state_grad_accum"],
    ]
    assert backward.external_input[-1] == "lstm/layer_0/hidden_state_grad_accum"
    assert "lstm/layer_1/hidden_state_grad_accum" not in backward.external_input


def test_dropout_cell_between_layers():
    model = ModelHelper("model")
    lower = LSTMCell(input_size=2, hidden_size=4, forget_bias=0.0, memory_optimization=False)
    upper = LSTMCell(input_size=4, hidden_size=4, forget_bias=0.0, memory_optimization=False)
    cell = MultiRNNCell([DropoutCell(lower, dropout_ratio=0.5, is_test=0), upper], name="lstm")
    cell.apply_over_sequence(model, "x", "len", list("abcd"))
    op_args = args(rnn_op(model))
    (dropout,) = [o for o in op_args["step_net"].n.op if o.type == "Dropout"]
    masked = "lstm/layer_0/lstm/layer_0/hidden_state_with_dropout_mask0"  # Caffe2 scopes it twice
    assert list(dropout.output) == [masked, "lstm/layer_0/_lstm/layer_0/hidden_state_with_dropout_mask0_mask"]
    assert dropout.engine == "DEFAULT" and [a.name for a in dropout.arg] == [
        "order",
        "cudnn_exhaustive_search",
        "ratio",
        "is_test",
    ]
    backward = op_args["backward_step_net"].n
    (grad,) = [o for o in backward.op if o.type == "DropoutGrad"]
    assert list(grad.input) == [masked + "_grad", dropout.output[1]]
    assert dropout.output[1] in backward.external_input  # a scratch read back from step workspace t
    with pytest.raises(ValueError, match="is_test"):
        DropoutCell(lower, dropout_ratio=0.5)


def test_residual_layers_sum_outputs_in_the_main_net():
    model = ModelHelper("model")
    cells = [
        LSTMCell(input_size=4, hidden_size=4, forget_bias=0.0, memory_optimization=False) for _ in range(2)
    ]
    output, _ = MultiRNNCell(cells, residual_output_layers=[1], name="lstm").apply_over_sequence(
        model, "x", "len", list("abcd")
    )
    summed = model.net.Proto().op[-1]
    assert output == "lstm/residual_output_sequence"
    assert (summed.type, list(summed.input)) == (
        "Sum",
        ["lstm/layer_0/hidden_state_all", "lstm/layer_1/hidden_state_all"],
    )


def test_gru_without_sequence_lengths():
    model = ModelHelper("model")
    assert list(GRU(model, "x", None, ["h0"], 2, 4, scope="gru")) == ["gru/hidden_t_all", "gru/hidden_t_last"]
    op_args = args(rnn_op(model))
    (unit,) = [o for o in op_args["step_net"].n.op if o.type == "GRUUnit"]
    (grad,) = [o for o in op_args["backward_step_net"].n.op if o.type == "GRUUnitGradient"]
    assert list(unit.input) == ["gru/hidden_t_prev", "gru/gates_t", "timestep"]
    assert list(grad.input) == [
        "gru/hidden_t_prev",
        "gru/gates_t",
        "timestep",
        "gru/hidden_t",
        "gru/hidden_t_grad",
    ]


def test_basic_rnn_configurations_that_cannot_be_differentiated():
    with pytest.raises(RuntimeError, match="from_type"):
        BasicRNN(ModelHelper("m"), "x", "len", ["h0"], 2, 4, scope="r", activation="tanh", drop_states=True)
    with pytest.raises(ValueError, match="unknown activation"):
        BasicRNN(ModelHelper("m"), "x", None, ["h0"], 2, 4, scope="r", activation="sigmoid")
    model = ModelHelper("m")
    BasicRNN(model, "x", None, ["h0"], 2, 4, scope="r", activation="relu")
    assert "ReluGradient" in [o.type for o in args(rnn_op(model))["backward_step_net"].n.op]


def test_recurrent_net_on_a_hand_built_cell_whose_state_only_feeds_a_sum():
    """Nobody writes h_prev's gradient (Sum passes it through): the backward link uses the mapped name,
    and with no gradient ops the backward_step_net argument is left out."""
    main = Net("main")
    cell = Net("cell")
    cell.AddExternalInputs("input_t", "timestep", "h_prev")
    cell.Sum(["h_prev", "input_t"], "h")
    cell.AddExternalOutputs("h")
    outputs = recurrent_net(
        main,
        cell,
        [("input_t", "seq")],
        [("h_prev", "h0")],
        {"h_prev": "h"},
        timestep="timestep",
        scope="acc",
    )
    op = main.Proto().op[0]
    assert outputs == ["h_all", "h_last"] and list(op.input) == ["seq", "h0"]
    assert strings(args(op)["backward_link_internal"]) == ["h_grad", "h_grad", "h_grad"]
    assert strings(args(op)["backward_link_external"]) == [
        "acc/h_prev_states_grad",
        "acc/h_prev_states_grad",
        "seq_grad",
    ]
    assert "backward_step_net" not in args(op) and list(args(op)["param"].ints) == []
    assert isinstance(rnn2jax.load(main.Proto()), rnn2jax.Net)
    with pytest.raises(ValueError, match="Only one input"):
        recurrent_net(main, cell, [("a", "b"), ("c", "d")], [], {})
