"""Bad input gets an rnn2jax error that says what is wrong and where, never a bare Python error."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st

import rnn2jax
from helpers import REALNETS
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.ir.netdef import Net, Plan
from rnn2jax.proto import caffe2_pb2 as pb

REAL_NET = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
needs_realnets = pytest.mark.skipif(not REAL_NET.exists(), reason=f"real nets folder {REALNETS} is absent")


def _real_bytes() -> bytes:
    return text_format.Parse(REAL_NET.read_text(encoding="utf-8"), pb.NetDef()).SerializeToString()


def _load_or_rnn2jax_error(data: bytes) -> None:
    try:
        loaded = rnn2jax.load(data)
    except rnn2jax.Rnn2JaxError as error:
        assert str(error)
    else:
        assert isinstance(loaded, Net | Plan)


@needs_realnets
@settings(max_examples=150)
@given(data=st.data())
def test_mutated_real_net_bytes(data):
    original = _real_bytes()
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 8), label="mutations")):
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(mutated) - 1, 0)))
        if kind == "flip" and mutated:
            mutated[pos] = data.draw(st.integers(0, 255))
        elif kind == "truncate":
            del mutated[pos:]
        elif kind == "insert":
            mutated[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif mutated:
            del mutated[pos : pos + data.draw(st.integers(1, 16))]
    _load_or_rnn2jax_error(bytes(mutated))


@settings(max_examples=200)
@given(st.binary(max_size=512))
def test_random_bytes(data):
    _load_or_rnn2jax_error(data)


@settings(max_examples=100)
@given(st.text(max_size=200))
def test_random_text(text):
    try:
        loaded = rnn2jax.load(text)
    except rnn2jax.Rnn2JaxError:
        return
    assert isinstance(loaded, Net | Plan)


@needs_realnets
def test_truncated_real_net_names_the_problem():
    data = _real_bytes()
    with pytest.raises(rnn2jax.ParseError, match="not a binary NetDef"):
        rnn2jax.load(data[: len(data) // 2 + 1])


def test_text_syntax_error_names_line():
    with pytest.raises(rnn2jax.ParseError, match=r"invalid text-format NetDef: 3:"):
        rnn2jax.load('name: "n"\nop {\n  type: Relu"\n}\n')


def test_bad_nested_step_net_names_its_place():
    op = create_operator("RecurrentNetwork", ["x"], ["y", "z"], step_net="op { type: ")
    with pytest.raises(
        rnn2jax.ParseError, match=r"net 'outer', op #0 \(RecurrentNetwork\), argument 'step_net'"
    ):
        rnn2jax.load(create_net("outer", [op]))


def test_missing_file():
    with pytest.raises(rnn2jax.ParseError, match=r"cannot read net file 'nope/net\.pb'"):
        rnn2jax.load("nope/net.pb")


def test_wrong_object():
    with pytest.raises(rnn2jax.ParseError, match="cannot load a int"):
        rnn2jax.load(3)
    with pytest.raises(rnn2jax.ParseError, match="expected a NetDef or PlanDef"):
        rnn2jax.load(pb.OperatorDef())


def test_missing_required_argument():
    net = create_net("n", [create_operator("ExpandDims", "x", "y")])
    with pytest.raises(
        rnn2jax.BadArgumentError, match=r"net 'n', op #0 \(ExpandDims\): .*argument 'dims' must be given"
    ):
        rnn2jax.compile(net)


def test_argument_of_wrong_type():
    net = create_net("n", [create_operator("Softmax", "x", "y", axis=1.5)])
    with pytest.raises(
        rnn2jax.BadArgumentError, match=r"op #0 \(Softmax\): argument 'axis' must be an integer.*f = 1.5"
    ):
        rnn2jax.compile(net)


def test_wrong_number_of_inputs():
    net = create_net("n", [create_operator("FC", ["x", "w"], "y")])
    with pytest.raises(rnn2jax.BadArgumentError, match=r"op #0 \(FC\): FC takes 3 inputs, got 2 \(x, w\)"):
        rnn2jax.compile(net)


def test_all_unsupported_ops_reported_at_once():
    step = create_net("step", [create_operator("NoSuchCell", "a", "b")])
    ops = [
        create_operator("Relu", "x", "y"),
        create_operator("Frobnicate", "y", "z"),
        create_operator("RecurrentThing", "z", "w", step_net=step),
        create_operator("Frobnicate", "w", "v"),
    ]
    with pytest.raises(rnn2jax.UnsupportedOpError) as info:
        rnn2jax.compile(create_net("n", ops))
    types = [t for _, t in info.value.unsupported]
    assert sorted(types) == ["Frobnicate", "Frobnicate", "NoSuchCell", "RecurrentThing"]
    message = str(info.value)
    assert "net 'n', op #1 (Frobnicate)" in message and "net 'n', op #3 (Frobnicate)" in message
    assert (
        "net 'step' (in net 'n', op #2 (RecurrentThing), argument 'step_net'), op #0 (NoSuchCell)" in message
    )


def test_blob_read_before_written_names_op_and_inputs():
    lowered = rnn2jax.lower(
        rnn2jax.load(create_net("n", [create_operator("Relu", "x", "y"), create_operator("Tanh", "q", "z")]))
    )
    with pytest.raises(
        rnn2jax.MissingBlobError, match=r"net 'n', op #1 \(Tanh\): reads blob 'q'.*inputs are: x, q"
    ):
        lowered({"x": np.ones(3, np.float32)})


def test_missing_and_unknown_inputs_of_compiled_net():
    fn = rnn2jax.compile(create_net("n", [create_operator("Relu", "x", "y")]))
    with pytest.raises(
        rnn2jax.MissingBlobError, match=r"missing input\(s\) x \('x' is read by net 'n', op #0 \(Relu\)\)"
    ):
        fn()
    with pytest.raises(rnn2jax.MissingBlobError, match=r"unknown input\(s\) w; the net's inputs are: x"):
        fn(x=np.ones(2), w=np.ones(2))


def test_shape_error_names_op_and_blobs():
    net = create_net("n", [create_operator("FC", ["x", "w", "b"], "y")])
    fn = rnn2jax.compile(net)
    with pytest.raises(
        rnn2jax.ShapeError, match=r"net 'n', op #0 \(FC\): weight 'w' \[4, 5\].*input 'x' \[2, 3\] has K = 3"
    ):
        fn(x=np.ones((2, 3), np.float32), w=np.ones((4, 5), np.float32), b=np.ones(4, np.float32))


def test_plan_given_to_compile():
    plan = pb.PlanDef(name="p", network=[create_net("a", [create_operator("Relu", "x", "y")])])
    with pytest.raises(rnn2jax.ParseError, match=r"plan 'p' holding nets a; pick one"):
        rnn2jax.compile(plan)


def test_errors_share_one_base():
    for error in (
        rnn2jax.ParseError,
        rnn2jax.UnsupportedOpError,
        rnn2jax.MissingBlobError,
        rnn2jax.BadArgumentError,
        rnn2jax.ShapeError,
    ):
        assert issubclass(error, rnn2jax.Rnn2JaxError)
