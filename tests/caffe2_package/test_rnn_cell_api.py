"""rnn_cell's static unrolling (`UnrolledCell`, `static_rnn_unroll_size`), stacked cells under a name scope,
and `model_helper.ExtractPredictorNet`, against real Caffe2 running the same source.

Each case runs one piece of Caffe2 Python source here (rnn2jax.caffe2) and in the real-Caffe2 venv (see
test_caffe2_api_core.py): the nets must be equal messages, the values computed from the same parameters
(drawn with NumPy's RandomState, the same stream in both venvs) close. Gradient nets are compared as
multisets of ops: Caffe2 orders its gradient-accumulation Sums by set iteration (PYTHONHASHSEED).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_api_core import parsed, real_caffe2, run_here  # noqa: F401  (real_caffe2 is a fixture)

from rnn2jax.caffe2.proto import caffe2_pb2

_IMPORTS = """
try:
    from rnn2jax.caffe2.python import model_helper, rnn_cell, scope
except ImportError:
    from caffe2.python import model_helper, rnn_cell, scope
"""

LSTM_STACK = (
    _IMPORTS
    + """
R = {}
T, N, D, DIMS, UNROLL, DROP = INPUTS
model = model_helper.ModelHelper(name="stack")
states = [model.net.AddExternalInput(f"{k}0_{i}") for i in range(len(DIMS)) for k in ("h", "c")]
with scope.NameScope("outer"):
    input_blob, lengths = model.net.AddScopedExternalInputs("input", "seq_lengths")
    outputs = rnn_cell.LSTM(
        model, input_blob, lengths, states, dim_in=D, dim_out=DIMS, scope="lstm", outputs_with_grads=(0, 1),
        drop_states=DROP, static_rnn_unroll_size=UNROLL,
    )
R["outputs"] = [str(o) for o in outputs]
R["init"] = str(model.param_init_net.Proto())
R["net"] = str(model.net.Proto())
grad_map = model.AddGradientOperators([outputs[0], outputs[1]])
R["grad_ops"] = sorted(str(op) for op in model.net.Proto().op)
rng = np.random.RandomState(7)
workspace.RunNetOnce(model.param_init_net)
values = {str(p): rng.uniform(-1, 1, workspace.FetchBlob(str(p)).shape).astype(np.float32) for p in model.GetParams()}
values[str(input_blob)] = rng.uniform(-1, 1, (T, N, D)).astype(np.float32)
values[str(lengths)] = rng.randint(1, T + 1, N).astype(np.int32)
for i, d in enumerate(DIMS):
    for k in ("h", "c"):
        values[f"{k}0_{i}"] = rng.uniform(-1, 1, (1, N, d)).astype(np.float32)
for name, value in values.items():
    workspace.FeedBlob(name, value)
workspace.RunNetOnce(model.net)
with_grads = [*states, str(input_blob), *map(str, model.GetParams())]
wanted = [str(o) for o in outputs] + [str(grad_map[b]) for b in with_grads]
R["values"] = {name: workspace.FetchBlob(name) for name in wanted}
"""
)


def _op_multiset(ops: list[str]) -> list[bytes]:
    return sorted(parsed(op, caffe2_pb2.OperatorDef).SerializeToString(deterministic=True) for op in ops)


@pytest.mark.parametrize(
    ("steps", "dims", "unroll", "drop"),
    [(3, [2, 4], 3, False), (3, [2, 4], None, True), (1, [3], 1, True), (2, [1, 2, 3], 2, False)],
)
def test_lstm_stack_statically_unrolled_or_not_matches_caffe2(real_caffe2, steps, dims, unroll, drop):  # noqa: F811
    """`static_rnn_unroll_size` (UnrolledCell: Split, per-step ops under `timestep_<t>/` with shared
    parameters, Concat, ZeroGradient) and the RecurrentNetwork form of a stacked LSTM under a name scope
    (the backward step net's `_accum` Sums must not get the scope twice)."""
    inputs = (steps, 2, 3, dims, unroll, drop)
    ours, theirs = run_here(LSTM_STACK, inputs), real_caffe2(LSTM_STACK, inputs)
    assert ours["outputs"] == theirs["outputs"]
    assert parsed(ours["init"], caffe2_pb2.NetDef) == parsed(theirs["init"], caffe2_pb2.NetDef)
    assert parsed(ours["net"], caffe2_pb2.NetDef) == parsed(theirs["net"], caffe2_pb2.NetDef)
    ours_ops = sorted(
        parsed(op, caffe2_pb2.OperatorDef).SerializeToString(deterministic=True) for op in ours["grad_ops"]
    )
    their_ops = [parsed(op, caffe2_pb2.OperatorDef).SerializeToString(deterministic=True) for op in theirs["grad_ops"]]
    assert ours_ops == sorted(their_ops)
    assert ours["values"].keys() == theirs["values"].keys()
    for name, value in theirs["values"].items():
        np.testing.assert_allclose(ours["values"][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


EXTRACT = (
    _IMPORTS
    + """
R = {}
model = model_helper.ModelHelper(name="extract")
with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
    output, _, _, _ = rnn_cell.LSTM(
        model=model, input_blob="input", seq_lengths="seqlengths",
        initial_states=("hidden_init", "cell_init", "hidden_1", "cell_1"), dim_in=4, dim_out=[3, 5],
        scope="test", drop_states=True, return_last_layer_only=True,
    )
model.net.Sigmoid("unrelated", "ignored")  # in range, but reads a blob the predictor cannot have: left out
model.net.Relu(output, "activated")
model.net.Tanh("activated", "after")  # after the last writer of an output: left out
predict_net, export_blobs = model_helper.ExtractPredictorNet(
    net_proto=model.net.Proto(), input_blobs=["input"], output_blobs=["activated"],
    device=core.DeviceOption(caffe2_pb2.CPU, 1), renames={"activated": "result"},
)
proto = predict_net.Proto()
R["inputs"] = sorted(proto.external_input)
R["outputs"] = sorted(proto.external_output)
R["export"] = sorted(export_blobs)
del proto.external_input[:]
del proto.external_output[:]
R["net"] = str(proto)
"""
)


def test_extract_predictor_net_matches_caffe2(real_caffe2):  # noqa: F811
    """Ops from the first reader of the inputs to the last writer of the outputs, moved to the device
    (step-net ops too), backward step nets emptied, blobs renamed; the step net's `seqlengths` becomes an
    input. Caffe2 collects external inputs/outputs in sets, so they are compared sorted."""
    ours, theirs = run_here(EXTRACT), real_caffe2(EXTRACT)
    assert ours["inputs"] == theirs["inputs"]
    assert "seqlengths" in ours["inputs"]
    assert ours["outputs"] == theirs["outputs"] == ["result"]
    assert ours["export"] == theirs["export"]
    assert parsed(ours["net"], caffe2_pb2.NetDef) == parsed(theirs["net"], caffe2_pb2.NetDef)
