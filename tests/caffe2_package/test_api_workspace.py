"""The compat `workspace` module (`rnn2jax.caffe2.python.workspace`) behaves as Caffe2's did.

Where Caffe2's behaviour was in doubt it was checked by running the same calls in the real-Caffe2 venv
(torch 1.10.2); those values are written below. Numbers are checked against NumPy written here.
Compilations are counted with JAX's own monitoring events, not with rnn2jax's bookkeeping.
"""

from __future__ import annotations

import uuid

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import count_compilations
from rnn2jax.caffe2.proto import caffe2_pb2
from rnn2jax.caffe2.python import core, model_helper, rnn_cell, workspace
from rnn2jax.errors import MissingBlobError, Rnn2JaxError, WorkspaceError


@pytest.fixture(autouse=True)
def fresh_default_workspace():
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()
    yield
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# --------------------------------------------------------------------------------------------------
# Named workspaces


def test_named_workspaces_are_isolated():
    other = unique("ws")
    assert workspace.CurrentWorkspace() == "default"
    workspace.FeedBlob("x", np.array([1.0, 2.0], np.float32))
    assert workspace.SwitchWorkspace(other, True) is None  # as Caffe2's switch_workspace
    assert workspace.CurrentWorkspace() == other
    assert {"default", other} <= set(workspace.Workspaces())
    assert not workspace.HasBlob("x") and workspace.Blobs() == []
    workspace.FeedBlob("x", np.array([7.0], np.float32))  # same name, another workspace
    workspace.SwitchWorkspace("default")
    np.testing.assert_array_equal(workspace.FetchBlob("x"), [1.0, 2.0])
    workspace.ResetWorkspace()  # resets only the current one
    assert workspace.Blobs() == []
    workspace.SwitchWorkspace(other)  # exists now: no create_if_missing needed
    np.testing.assert_array_equal(workspace.FetchBlob("x"), [7.0])


def test_workspace_guard_runs_a_block_in_another_workspace():
    """Caffe2's WorkspaceGuard (dataio's readers use it): switch, creating if missing, and switch back."""
    other = unique("guarded")
    with workspace.WorkspaceGuard(other):
        assert workspace.CurrentWorkspace() == other
        workspace.FeedBlob("y", np.array([3], np.int32))
    assert workspace.CurrentWorkspace() == "default" and not workspace.HasBlob("y")
    with pytest.raises(ValueError), workspace.WorkspaceGuard(other):
        raise ValueError("the block fails")
    assert workspace.CurrentWorkspace() == "default"


def test_switching_to_an_unknown_workspace_is_an_error_naming_it():
    name = unique("missing")
    with pytest.raises(WorkspaceError, match=name) as info:
        workspace.SwitchWorkspace(name)
    assert isinstance(info.value, RuntimeError)
    assert workspace.CurrentWorkspace() == "default"
    assert name not in workspace.Workspaces()


def test_workspace_names_may_be_bytes():
    name = unique("bytes_ws")
    workspace.SwitchWorkspace(name.encode(), True)  # hypothesis_test_util's temp_workspace passes b"temp_ws"
    assert workspace.CurrentWorkspace() == name


# --------------------------------------------------------------------------------------------------
# Feeding and fetching

_DTYPES = st.sampled_from([np.float32, np.int32, np.bool_, np.uint8])


@given(array=hnp.arrays(_DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)))
def test_feed_copies_and_fetch_returns_writable_copies(array):
    original = array.copy()
    workspace.FeedBlob("b", array)
    if array.size:
        array.flat[0] = ~array.flat[0] if array.dtype == np.bool_ else array.flat[0] + 1
    fetched = workspace.FetchBlob("b")
    assert fetched.dtype == original.dtype and fetched.shape == original.shape
    np.testing.assert_array_equal(fetched, original)  # mutating the fed array changed nothing
    assert fetched.flags.writeable
    if fetched.size:
        fetched.flat[0] = original.flat[0] + 1 if original.dtype != np.bool_ else not original.flat[0]
        np.testing.assert_array_equal(workspace.FetchBlob("b"), original)  # nor did mutating a fetch


def test_feed_of_a_jax_array_and_fetch_after_an_op_are_numpy_copies():
    workspace.FeedBlob("x", jax.numpy.arange(4, dtype=np.float32) - 2)
    workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["y"]))
    y = workspace.FetchBlob("y")
    assert isinstance(y, np.ndarray) and y.flags.writeable
    y[:] = -1
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [0, 0, 0, 1])


def test_strings_are_object_arrays_of_bytes():
    workspace.FeedBlob("s", np.array(["ab", "c"]))  # unicode in
    workspace.FeedBlob("b", np.array([b"x", b"yz"], dtype=object))
    workspace.FeedBlob("one", "hello")
    for name, expected in (("s", [b"ab", b"c"]), ("b", [b"x", b"yz"])):
        got = workspace.FetchBlob(name)
        assert got.dtype == object and all(type(v) is bytes for v in got)
        assert got.tolist() == expected
    assert workspace.FetchBlob("one") == b"hello"  # Caffe2: a string blob fetches as bytes


def test_tensor_proto_feeds_decode():
    proto = caffe2_pb2.TensorProto(dims=[2, 2], data_type=caffe2_pb2.TensorProto.INT32, int32_data=[1, 2, 3, 4])
    workspace.FeedBlob("t", proto)
    got = workspace.FetchBlob("t")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [[1, 2], [3, 4]])


def test_blobs_mapping_and_has_blob():
    workspace.blobs["a"] = np.arange(3, dtype=np.float32)
    assert "a" in workspace.blobs and "zz" not in workspace.blobs
    np.testing.assert_array_equal(workspace.blobs["a"], [0, 1, 2])
    assert len(workspace.blobs) == 1 and list(workspace.blobs) == ["a"] and workspace.blobs.keys() == ["a"]
    assert workspace.HasBlob("a") and workspace.HasBlob(b"a") and not workspace.HasBlob("b")
    workspace.FeedBlobs({"b": np.zeros(1, np.float32)})
    np.testing.assert_array_equal(workspace.FetchBlobs(["a", "b"])[1], [0])


def test_created_blobs_exist_before_anything_writes_them():
    # Real Caffe2: after CreateBlob("e"), HasBlob("e") and Blobs() == ['e']; after CreateNet, its outputs too.
    workspace.CreateBlob("e")
    assert workspace.HasBlob("e") and workspace.Blobs() == ["e"]
    with pytest.raises(MissingBlobError, match="'e'") as info:
        workspace.FetchBlob("e")
    assert isinstance(info.value, RuntimeError)
    workspace.FeedBlob("x", np.array([-1.0, 1.0], np.float32))
    net = core.Net(unique("created"))
    net.Relu("x", "y")
    workspace.CreateNet(net)
    assert workspace.HasBlob("y") and workspace.Blobs() == ["e", "x", "y"]
    workspace.RunNet(net)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [0, 1])


def test_fetching_a_missing_blob_is_a_runtime_error_naming_it():
    workspace.FeedBlob("present", np.zeros(1, np.float32))
    with pytest.raises(MissingBlobError, match=r"'absent'.*present") as info:
        workspace.FetchBlob("absent")
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, Rnn2JaxError)


# --------------------------------------------------------------------------------------------------
# Nets: created once, run with new shapes


def lstm_reference(seq, h0, c0, params):
    """Caffe2's rnn_cell.LSTM: i2h FC over the whole sequence, then per step gates_t FC of h_prev and
    LSTMUnit (gates i, f, o, g; forget_bias 0)."""
    i2h = seq @ params["l/i2h_w"].T + params["l/i2h_b"]
    h, c = h0[0], c0[0]
    hs, cs = [], []
    for t in range(seq.shape[0]):
        gates = i2h[t] + h @ params["l/gates_t_w"].T + params["l/gates_t_b"]
        i, f, o, g = np.split(gates, 4, axis=-1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        hs.append(h)
        cs.append(c)
    d = h0.shape[-1]
    stack = lambda xs: np.stack(xs) if xs else np.zeros((0, h0.shape[1], d), np.float32)  # noqa: E731
    return stack(hs), h[None], stack(cs), c[None]


def test_created_lstm_net_reruns_with_new_sequence_lengths_without_recompiling():
    model = model_helper.ModelHelper(name=unique("lstm"))
    seq, h0, c0 = model.net.AddExternalInputs("seq", "h0", "c0")
    outputs = rnn_cell.LSTM(model, seq, None, (h0, c0), dim_in=3, dim_out=4, scope="l")
    assert any(op.type == "RecurrentNetwork" for op in model.net.Proto().op)
    workspace.RunNetOnce(model.param_init_net)
    rng = np.random.default_rng(0)
    params = {}
    for p in model.params:
        params[str(p)] = rng.standard_normal(workspace.FetchBlob(p).shape).astype(np.float32)
        workspace.FeedBlob(p, params[str(p)])
    n = 2
    h0_value = rng.standard_normal((1, n, 4)).astype(np.float32)
    c0_value = rng.standard_normal((1, n, 4)).astype(np.float32)
    workspace.FeedBlob("seq", np.zeros((1, n, 3), np.float32))
    workspace.FeedBlob("h0", h0_value)
    workspace.FeedBlob("c0", c0_value)
    assert workspace.CreateNet(model.net)
    compiles = []
    for t in [0, 1, 2, 3, 0, 1]:
        seq_value = rng.standard_normal((t, n, 3)).astype(np.float32)
        workspace.FeedBlob("seq", seq_value)
        with count_compilations() as count:
            workspace.RunNet(model.net.Name())
        compiles.append(count[0])
        expected = lstm_reference(seq_value, h0_value, c0_value, params)
        for blob, want in zip(outputs, expected, strict=True):
            got = workspace.FetchBlob(blob)
            assert got.shape == want.shape, (t, str(blob))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert all(c >= 1 for c in compiles[:4])  # a new sequence length is a new input signature
    assert compiles[4:] == [0, 0]  # lengths seen before: nothing compiles again, whatever ran in between


def test_created_net_runs_with_new_batch_sizes():
    net = core.Net(unique("fc"))
    net.FC(["x", "w", "b"], "y")
    net.Relu("y", "r")
    w = np.arange(6, dtype=np.float32).reshape(3, 2) / 10 - 0.2
    b = np.array([0.1, -0.3, 0.0], np.float32)
    workspace.FeedBlob("w", w)
    workspace.FeedBlob("b", b)
    workspace.FeedBlob("x", np.zeros((1, 2), np.float32))
    workspace.CreateNet(net)
    rng = np.random.default_rng(1)
    for batch in [1, 4, 0, 4, 1]:
        x = rng.standard_normal((batch, 2)).astype(np.float32)
        workspace.FeedBlob("x", x)
        workspace.RunNet(net.Name())
        np.testing.assert_allclose(workspace.FetchBlob("r"), np.maximum(x @ w.T + b, 0), rtol=1e-6, atol=1e-6)


def test_run_net_num_iter_runs_the_net_that_many_times():
    net = core.Net(unique("acc"))
    net.Add(["acc", "one"], "acc")
    net.Iter([], "it")  # Caffe2's counter, in place
    workspace.FeedBlob("acc", np.zeros(2, np.float32))
    workspace.FeedBlob("one", np.ones(2, np.float32))
    workspace.CreateNet(net)
    assert workspace.RunNet(net.Name(), 5)
    np.testing.assert_array_equal(workspace.FetchBlob("acc"), [5, 5])
    assert workspace.FetchBlob("it").tolist() == [5]  # Caffe2: shape [1]
    workspace.RunNet(net, 2)  # a core.Net names itself
    np.testing.assert_array_equal(workspace.FetchBlob("acc"), [7, 7])
    assert workspace.FetchBlob("it").tolist() == [7]


def test_create_net_name_clash_without_overwrite_is_an_error():
    workspace.FeedBlob("x", np.ones(1, np.float32))
    name = unique("clash")
    first = core.Net(name)
    first.Scale("x", "y", scale=2.0)
    workspace.CreateNet(first)
    second = core.Net(caffe2_pb2.NetDef(name=name))
    second.Proto().name = name  # the same name (core.Net would make it unique)
    second.Scale("x", "y", scale=3.0)
    with pytest.raises(WorkspaceError, match=name) as info:
        workspace.CreateNet(second)
    assert isinstance(info.value, RuntimeError)
    workspace.RunNet(name)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [2])
    workspace.CreateNet(second, overwrite=True)
    workspace.RunNet(name)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [3])


def test_create_net_reading_a_missing_blob_names_op_and_blob():
    net = core.Net(unique("missing"))
    net.Relu("nothere", "y")
    with pytest.raises(MissingBlobError, match=r"op #0 \(Relu\).*'nothere'") as info:
        workspace.CreateNet(net)
    assert isinstance(info.value, RuntimeError)
    workspace.CreateNet(net, input_blobs=["nothere"])  # Caffe2's input_blobs: created empty
    with pytest.raises(MissingBlobError, match="'nothere'"):
        workspace.RunNet(net)


def test_running_an_unknown_net_is_an_error_naming_it():
    with pytest.raises(WorkspaceError, match="no_such_net") as info:
        workspace.RunNet("no_such_net")
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(WorkspaceError, match="no_such_net"):  # as in Caffe2, whatever allow_fail says
        workspace.RunNet("no_such_net", allow_fail=True)


# --------------------------------------------------------------------------------------------------
# Running ops: compiled once per op and shapes, in whichever workspace


def test_feeding_arrays_of_new_shapes_compiles_nothing():
    with count_compilations() as count:
        for rows in range(1, 6):
            for dtype in (np.float32, np.float64, np.int32, np.int64, np.bool_, np.float16):
                value = (np.arange(rows * 3) % 2).reshape(rows, 3).astype(dtype)
                workspace.FeedBlob("fed", value)
                got = workspace.FetchBlob("fed")
                assert got.dtype == value.dtype and np.array_equal(got, value)
    assert count[0] == 0


def test_repeated_run_operator_once_compiles_nothing_again():
    op = core.CreateOperator("Tanh", ["x"], ["y"])
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    workspace.FeedBlob("x", x)
    with count_compilations() as first:
        workspace.RunOperatorOnce(op)
    assert first[0] >= 1
    with count_compilations() as again:
        for _ in range(5):
            workspace.FeedBlob("x", x * 2)
            workspace.RunOperatorOnce(op)
    assert again[0] == 0
    np.testing.assert_allclose(workspace.FetchBlob("y"), np.tanh(x * 2), rtol=1e-6)
    # A new copy of the same op (equal proto) is the same op: Caffe2's gradient checker rebuilds them.
    copy = caffe2_pb2.OperatorDef()
    copy.CopyFrom(op)
    with count_compilations() as same:
        workspace.RunOperatorOnce(copy)
        workspace.RunOperatorOnce(op.SerializeToString())
    assert same[0] == 0
    workspace.FeedBlob("x", np.ones((3, 3), np.float32))  # a new shape compiles once
    with count_compilations() as new_shape:
        workspace.RunOperatorOnce(op)
        workspace.RunOperatorOnce(op)
    assert new_shape[0] >= 1
    np.testing.assert_allclose(workspace.FetchBlob("y"), np.tanh(np.ones((3, 3))), rtol=1e-6)


def test_the_op_cache_survives_reset_workspace_and_is_shared_by_named_workspaces():
    op = core.CreateOperator("Sigmoid", ["x"], ["y"])
    x = np.array([[0.5, -1.5, 3.0]], np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(op)
    with count_compilations() as count:
        workspace.ResetWorkspace()
        workspace.FeedBlob("x", x)
        workspace.RunOperatorOnce(op)
        np.testing.assert_allclose(workspace.FetchBlob("y"), sigmoid(x), rtol=1e-6)
        workspace.SwitchWorkspace(unique("shared_cache"), True)
        workspace.FeedBlob("x", -x)
        workspace.RunOperatorOnce(op)
        np.testing.assert_allclose(workspace.FetchBlob("y"), sigmoid(-x), rtol=1e-6)
        ws = workspace.C.Workspace()
        ws.create_blob("x").feed(x)
        ws.run(op)
    assert count[0] == 0
    np.testing.assert_allclose(ws.blobs["y"].fetch(), sigmoid(x), rtol=1e-6)


def test_run_operators_once_runs_them_in_order():
    ops = [
        core.CreateOperator("Scale", ["x"], ["a"], scale=3.0),
        core.CreateOperator("Add", ["a", "x"], ["b"]),
        core.CreateOperator("Mul", ["b", "b"], ["x"]),  # writes an input of the first op back
    ]
    x = np.array([1.0, -2.0], np.float32)
    workspace.FeedBlob("x", x)
    assert workspace.RunOperatorsOnce(ops)
    np.testing.assert_array_equal(workspace.FetchBlob("b"), 4 * x)
    np.testing.assert_array_equal(workspace.FetchBlob("x"), (4 * x) ** 2)
    assert workspace.RunOperatorsOnce([])


def test_run_operator_once_error_names_the_op_and_blob():
    with pytest.raises(MissingBlobError, match=r"\(Relu\).*'nope'") as info:
        workspace.RunOperatorOnce(core.CreateOperator("Relu", ["nope"], ["y"]))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, Rnn2JaxError)


def test_run_net_once_and_plans():
    net = core.Net(unique("once"))
    net.ConstantFill([], "c", shape=[2], value=1.5)
    net.Add(["c", "c"], "d")
    assert workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("d"), [3, 3])
    assert net.Name() not in workspace.Nets()  # RunNetOnce keeps no net
    step_net = core.Net(unique("step"))
    step_net.Add(["d", "c"], "d")
    workspace.RunPlan(core.Plan(core.execution_step("s", step_net, num_iter=4)))
    np.testing.assert_array_equal(workspace.FetchBlob("d"), [9, 9])


# --------------------------------------------------------------------------------------------------
# Shape inference: the values real Caffe2's InferShapesAndTypes gave for these nets

FLOAT, INT32, INT64 = caffe2_pb2.TensorProto.FLOAT, caffe2_pb2.TensorProto.INT32, caffe2_pb2.TensorProto.INT64


def test_infer_shapes_and_types_from_workspace_blobs_matches_caffe2():
    net = core.Net(unique("infer"))
    net.FC(["x", "w", "b"], "fc")
    net.Relu("fc", "r")
    net.Concat(["r", "r"], ["cat", "split"], axis=1)
    net.Shape("cat", "shp")
    net.Cast("r", "ri", to=core.DataType.INT32)
    net.ReduceSum("x", "rs", axes=[1], keepdims=0)
    net.Transpose("x", "xt", axes=[1, 0])
    workspace.FeedBlob("x", np.zeros((5, 3), np.float32))
    workspace.FeedBlob("w", np.zeros((4, 3), np.float32))
    workspace.FeedBlob("b", np.zeros((4,), np.float32))
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes == {
        "b": [4], "cat": [5, 8], "fc": [5, 4], "r": [5, 4], "ri": [5, 4], "rs": [5],
        "shp": [2], "split": [2], "w": [4, 3], "x": [5, 3], "xt": [3, 5],
    }  # fmt: skip
    caffe2_types = {
        "b": FLOAT, "cat": FLOAT, "fc": FLOAT, "r": FLOAT, "ri": INT32, "rs": FLOAT,
        "shp": INT64, "split": INT32, "w": FLOAT, "x": FLOAT, "xt": FLOAT,
    }  # fmt: skip
    assert types == caffe2_types
    assert workspace.Blobs() == ["b", "w", "x"]  # nothing ran


def test_infer_shapes_and_types_from_given_dimensions_matches_caffe2():
    first = core.Net(unique("mm"))
    first.MatMul(["a", "bb"], "mm")
    first.Sigmoid("mm", "sg")
    first.Sum(["sg", "sg"], "sm")
    first.Softmax("sm", "sf")
    shapes, types = workspace.InferShapesAndTypes([first], {"a": [2, 3], "bb": [3, 6]})
    assert shapes == {"a": [2, 3], "bb": [3, 6], "mm": [2, 6], "sf": [2, 6], "sg": [2, 6], "sm": [2, 6]}
    assert types == dict.fromkeys(shapes, FLOAT)
    second = core.Net(unique("chained"))
    second.Mul(["sf", "sf"], "sq")
    second.Add(["sq", "sf"], "ad")
    shapes, types = workspace.InferShapesAndTypes([first, second], {"a": [4, 3], "bb": [3, 2]})
    assert shapes == {
        "a": [4, 3], "ad": [4, 2], "bb": [3, 2], "mm": [4, 2], "sf": [4, 2], "sg": [4, 2], "sm": [4, 2],
        "sq": [4, 2],
    }  # fmt: skip
    assert types == dict.fromkeys(shapes, FLOAT)
    int_net = core.Net(unique("ints"))
    int_net.Add(["i", "i"], "j")
    _, types = workspace.InferShapesAndTypes([int_net], {"i": [3]}, blob_types={"i": INT32})
    assert types == {"i": INT32, "j": INT32}


def test_infer_shapes_answers_as_caffe2s_schemas_where_they_differ_from_the_op():
    """Caffe2 infers from the op schemas without constructing or running the ops: IndexHash's default modulo 0
    (refused by the op) infers, GatherRanges' output is DATA's size (an upper bound), TopK's indices INT32 (the
    op writes int64), SoftmaxWithLoss reads no label type and flattens at `axis` (index_hash_ops_test's,
    gather_ranges_op_test's test_shape_and_type_inference; layers_test's testFunctionalLayerWithOutputNames)."""
    net = core.Net(unique("schemas"))
    net.ConstantFill([], "values", shape=[4, 3], dtype=core.DataType.INT64)
    net.ConstantFill([], "ranges", shape=[5, 2, 2], dtype=core.DataType.INT32)
    net.IndexHash(["values"], ["hashed"])
    net.GatherRanges(["hashed", "ranges"], ["gathered", "lengths"])
    net.TopK(["x"], ["top", "indices", "flat"], k=2)
    net.SoftmaxWithLoss(["l3", "label"], ["prob", "loss"], axis=2)
    net.Relu("prob", "after")  # traced from what the schema answered
    shapes, types = workspace.InferShapesAndTypes([net], {"x": [3, 4, 5], "l3": [4, 3, 10], "label": [4]})
    assert shapes == {
        "values": [4, 3], "ranges": [5, 2, 2], "hashed": [4, 3], "gathered": [12], "lengths": [5],
        "x": [3, 4, 5], "top": [3, 4, 2], "indices": [3, 4, 2], "flat": [24], "l3": [4, 3, 10], "label": [4],
        "prob": [12, 10], "loss": [], "after": [12, 10],
    }  # fmt: skip
    assert types == {
        "values": INT64, "ranges": INT32, "hashed": INT64, "gathered": INT64, "lengths": INT32, "x": FLOAT,
        "top": FLOAT, "indices": INT32, "flat": INT32, "l3": FLOAT, "label": FLOAT, "prob": FLOAT, "loss": FLOAT,
        "after": FLOAT,
    }  # fmt: skip


def test_infer_shapes_without_known_inputs_raises_runtime_error():
    net = core.Net(unique("unknown"))
    net.Relu("nobody_fed_this", "y")
    with pytest.raises(RuntimeError, match="nobody_fed_this"):
        workspace.InferShapesAndTypes([net])


# --------------------------------------------------------------------------------------------------
# C.Workspace objects


def test_c_workspace_objects():
    ws = workspace.C.Workspace()
    blob = ws.create_blob("x")
    assert list(ws.blobs) == ["x"]  # Caffe2: a created blob is listed before it is fed
    blob.feed(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(ws.blobs["x"].fetch(), [0, 1, 2, 3])
    net = core.Net(unique("cws"))
    net.Relu("x", "y")
    net.Scale("y", "z", scale=2.0)
    handle = ws.create_net(net)
    ws.feed_blob("x", np.array([-1, 2, -3], np.float32))
    handle.run()
    np.testing.assert_array_equal(ws.blobs["z"].fetch(), [0, 4, 0])
    np.testing.assert_array_equal(ws.fetch_blob("z"), [0, 4, 0])
    ws.run(core.CreateOperator("Scale", ["z"], ["w"], scale=0.5))
    np.testing.assert_array_equal(ws.blobs["w"].fetch(), [0, 2, 0])
    assert sorted(ws.nets) == [net.Name()] and sorted(ws.blobs) == ["w", "x", "y", "z"]
    fetched = ws.blobs["z"].fetch()
    fetched[0] = 99
    np.testing.assert_array_equal(ws.blobs["z"].fetch(), [0, 4, 0])
    assert not workspace.HasBlob("x")  # apart from the current workspace
    with pytest.raises(WorkspaceError, match=net.Name()) as info:
        ws.create_net(net)
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(MissingBlobError, match="'nope'") as info:
        ws.run(core.CreateOperator("Relu", ["nope"], ["q"]))
    assert isinstance(info.value, RuntimeError)


def test_c_workspace_current_is_the_current_workspace():
    workspace.FeedBlob("here", np.array([3], np.int32))
    current = workspace.C.Workspace.current  # a property in Caffe2, not a method
    np.testing.assert_array_equal(current.blobs["here"].fetch(), [3])
    current.create_blob("there").feed(np.array([4], np.int32))
    np.testing.assert_array_equal(workspace.FetchBlob("there"), [4])


# --------------------------------------------------------------------------------------------------
# Flags


def test_global_init_accepts_caffe2_flags():
    # What caffe2's test_util.TestCase.setUpClass passes; Caffe2's C.global_init returns None.
    assert None is workspace.GlobalInit(
        [
            "caffe2",
            "--caffe2_log_level=0",
            "--caffe2_cpu_allocator_do_zero_fill=0",
            "--caffe2_cpu_allocator_do_junk_fill=1",
        ]
    )
    workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("Scale", ["x"], ["y"], scale=4.0))
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [4, 4])


def test_device_flags_describe_jax_devices():
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    assert workspace.NumCudaDevices() == workspace.NumGpuDevices() == len(gpus)
    assert workspace.has_gpu_support == workspace.has_cuda_support == bool(gpus)
    assert workspace.has_hip_support is False and workspace.NumHipDevices() == 0
    assert workspace.IsImmediate() is False
    assert workspace.GpuDeviceType == caffe2_pb2.CUDA
    # A CPU device option on feeds and ops is accepted (hypothesis_test_util passes one everywhere).
    cpu = core.DeviceOption(caffe2_pb2.CPU)
    workspace.FeedBlob("x", np.array([-1.0, 2.0], np.float32), device_option=cpu)
    workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["y"], device_option=cpu))
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [0, 2])


def test_undecodable_operator_and_net_bytes_are_parse_errors():
    """Serialized ops and nets that are not protobuf give rnn2jax's ParseError (a RuntimeError too), not
    protobuf's DecodeError."""
    from rnn2jax.caffe2.python.predictor import serde
    from rnn2jax.errors import ParseError

    with pytest.raises(ParseError, match="RunOperatorOnce: not a binary OperatorDef") as raised:
        workspace.RunOperatorOnce(b"\xff\xff\x01garbage")
    assert isinstance(raised.value, RuntimeError)
    with pytest.raises(ParseError, match="not a binary NetDef"):
        workspace.C.Workspace()._run_net(b"\x0a\xff")
    with pytest.raises(ParseError, match="not a binary NetDef"):
        serde.deserialize_protobuf_struct(b"\xff\xff", caffe2_pb2.NetDef)
