"""`workspace.InferShapesAndTypes` where Caffe2's op schemas answer other than the ops run, and
`workspace.SerializeBlob`/`DeserializeBlob`: the same source here and in real Caffe2 (test_api_core's oracle).

Cases are drawn with hypothesis once, at import (seeded), and sent to Caffe2 in one process: a Caffe2 process
per example would take seconds each.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_api_core import real_caffe2, run_here  # noqa: F401  (real_caffe2: a fixture)

from rnn2jax.caffe2.proto import caffe2_pb2
from rnn2jax.caffe2.python import workspace

_dims = st.lists(st.integers(1, 4), min_size=1, max_size=4)
_concat_case = st.fixed_dictionaries(
    {
        "dims": _dims,
        "inputs": st.integers(1, 3),
        "add_axis": st.sampled_from([None, 0, 1]),
        "axis": st.one_of(st.none(), st.integers(-1, 1)),
        "order": st.sampled_from([None, "NCHW", "NHWC"]),
        "dtype": st.sampled_from([1, 2, 10]),  # FLOAT, INT32, INT64
    }
)


def _draw(strategy: st.SearchStrategy, count: int) -> list:
    """`count` examples of `strategy`, the same on every run."""
    drawn: list = []

    @seed(20261128)
    @settings(max_examples=count, database=None, suppress_health_check=list(HealthCheck), deadline=None)
    @given(strategy)
    def collect(example: object) -> None:
        drawn.append(example)

    collect()
    return drawn


def _valid_concat(case: dict) -> bool:
    dims = case["dims"]
    if case["axis"] is not None and case["order"] is not None:
        return False  # the op refuses both; Caffe2's schema reads `axis`
    axis = case["axis"] if case["axis"] is not None else (3 if case["order"] == "NHWC" else 1)
    size = len(dims) + (1 if case["add_axis"] else 0)
    return -size <= axis < size and len(dims) > (3 if case["order"] == "NHWC" and case["axis"] is None else 0)


CONCAT_CASES = [case for case in _draw(_concat_case, 40) if _valid_concat(case)]
LAST_N_CASES = [
    {"data": data, "num": num, "visited": visited}
    for data, num, visited in _draw(st.tuples(_dims, st.integers(1, 9), st.booleans()), 6)
]

SCHEMAS = """
R = {"concat": [], "lr": [], "last_n": []}
cases = INPUTS
for i, case in enumerate(cases["concat"]):
    net = core.Net("concat_%d" % i)
    names = ["in_%d" % k for k in range(case["inputs"])]
    args = {k: case[k] for k in ("add_axis", "axis", "order") if case[k] is not None}
    net.Concat(names, ["out", "split"], **args)
    dims = {name: case["dims"] for name in names}
    R["concat"].append(workspace.InferShapesAndTypes([net], dims, blob_types=dict.fromkeys(names, case["dtype"])))
for i, (dims, dtype) in enumerate(cases["lr"]):
    net = core.Net("lr_%d" % i)
    net.LearningRate(["iteration"], "lr", base_lr=0.5, policy="fixed")
    net.Mul(["w", "lr"], "scaled", broadcast=1)  # float math reading the rate, as optimizers' nets do
    net.WeightedSum(["w", "one", "g", "lr"], "w2")
    dims = {"iteration": dims, "w": [2, 3], "one": [1], "g": [2, 3]}
    types = {"iteration": dtype, "w": 1, "one": 1, "g": 1}
    R["lr"].append(workspace.InferShapesAndTypes([net], dims, blob_types=types))
for i, case in enumerate(cases["last_n"]):
    workspace.ResetWorkspace()
    net = core.Net("last_n_%d" % i)
    net.GivenTensorFill([], "data", shape=case["data"], values=[1.0] * int(np.prod(case["data"])))
    workspace.CreateBlob("window")
    workspace.FeedBlob("cursor", np.array(0, dtype=np.int32))
    outputs = ["window", "cursor"] + (["visited"] if case["visited"] else [])
    net.LastNWindowCollector(["window", "cursor", "data"], outputs, num_to_collect=case["num"])
    net.Relu("window", "after")
    R["last_n"].append(workspace.InferShapesAndTypes([net]))
"""


def test_schemas_answer_as_caffe2s(real_caffe2) -> None:  # noqa: F811
    """Concat's schema adds the `add_axis` axis even where the op (no `axis` argument) does not; LearningRate's
    answers the iteration counter's shape and type (its float readers are traced on the rate it writes);
    LastNWindowCollector's, a host op's, needs no trace."""
    cases = {
        "concat": CONCAT_CASES,
        "lr": [([1], 10), ([1], 2)],
        "last_n": LAST_N_CASES,
    }
    assert len(CONCAT_CASES) > 10
    assert run_here(SCHEMAS, cases) == real_caffe2(SCHEMAS, cases)


FROM_WORKSPACE = """
workspace.FeedBlob("x", np.ones((17, 5, 13), np.float32))
workspace.FeedBlob("empty", np.ones((0, 2, 3), np.float64))
workspace.FeedBlob("unread", np.ones((4,), np.int64))
workspace.FeedBlob("flag", np.ones((2, 2), np.bool_))
workspace.FeedBlob("words", np.array([b"ab", b"c"], dtype=object))  # a STRING tensor
workspace.FeedBlob("halves", np.ones((3,), np.float16))
workspace.FeedBlob("note", "a string blob, not a tensor")
workspace.CreateBlob("created_only")
net = core.Net("flatten")
net.FlattenToVec("x", "flat")
net.Flatten("empty", "empty_flat", axis=2)
R = [workspace.InferShapesAndTypes([net])]
workspace.RunNetOnce(net)
other = core.Net("other")
other.Relu("x", "relu")
R.append(workspace.InferShapesAndTypes([other]))  # flat and empty_flat, written by the run, are listed too
R.append(workspace.InferShapesAndTypes([other], {"x": [2, 3]}))  # with dimensions given, the workspace is not
"""


def test_from_the_workspace_every_tensor_blob_is_listed(real_caffe2) -> None:  # noqa: F811
    """Caffe2 starts from every tensor in the workspace, read by the nets or not (not from a blob that holds
    nothing); with `blob_dimensions` from those alone (shape_inference_test compares every blob after a run)."""
    assert run_here(FROM_WORKSPACE) == real_caffe2(FROM_WORKSPACE)


SERIALIZE = """
R = []
for i, value in enumerate(INPUTS):
    workspace.FeedBlob("v%d" % i, value)
    data = workspace.SerializeBlob("v%d" % i)
    proto = caffe2_pb2.BlobProto()
    proto.ParseFromString(data)
    workspace.DeserializeBlob("copy%d" % i, data)
    copy = workspace.FetchBlob("copy%d" % i)
    R.append((proto.name, proto.type, proto.tensor.data_type, list(proto.tensor.dims), copy.dtype.str, copy.tolist()))
"""


def test_serialize_blob_and_deserialize_blob_match_caffe2(real_caffe2) -> None:  # noqa: F811
    """workspace.SerializeBlob/DeserializeBlob are Caffe2's C.serialize_blob/deserialize_blob: one BlobProto
    named after the blob (load_save_test's testLoadSave reads it back)."""
    rng = np.random.default_rng(0)
    values = [
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.integers(-9, 9, (5,)).astype(np.int64),
        rng.integers(0, 200, (2, 2)).astype(np.uint8),
        np.zeros((0, 3), np.float64),
    ]
    assert run_here(SERIALIZE, values) == real_caffe2(SERIALIZE, values)


def test_serialize_blob_is_the_c_modules_and_names_a_missing_blob() -> None:
    from rnn2jax.caffe2.python import caffe2_pybind11_state as C

    assert workspace.SerializeBlob is C.serialize_blob and workspace.DeserializeBlob is C.deserialize_blob
    workspace.FeedBlob("present", np.arange(3, dtype=np.int32))
    proto = caffe2_pb2.BlobProto()
    proto.ParseFromString(workspace.SerializeBlob("present"))
    assert proto.name == "present"
    try:
        workspace.SerializeBlob("nobody_wrote_this")
    except RuntimeError as error:
        assert "nobody_wrote_this" in str(error)
    else:
        raise AssertionError("SerializeBlob of a missing blob did not fail")
