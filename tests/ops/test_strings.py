"""The string family (rnn2jax/ops/strings.py) against real Caffe2. These are host ops: each case runs its op
in real Caffe2 and in an rnn2jax Workspace (where strings are object arrays of bytes) and compares, strings
as strings. Inside jitted code they are refused clearly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from differential import Case, arrays, assert_blobs_equal, cases, make_op, shapes
from rnn2jax.caffe2.opdef import create_net
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import Rnn2JaxError, UnsupportedOpError

ALPHABET = b"ab\xff"  # few letters, so prefixes and equalities hit; a non-UTF-8 byte, since strings are bytes
words = st.binary(max_size=5).map(lambda b: bytes(ALPHABET[c % len(ALPHABET)] for c in b))


def string_tensor(data, min_dims=0, max_dims=3, min_side=0):
    shape = data.draw(shapes(min_dims, max_dims, min_side=min_side, max_side=4))
    flat = data.draw(st.lists(words, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def draw_affix(op_type):
    def draw(data):
        args = {"length": data.draw(st.integers(0, 6))} if data.draw(st.booleans()) else {}
        return make_op(op_type, ["x"], ["y"], **args), {"x": string_tensor(data)}

    return draw


def draw_test(op_type, arg):
    def draw(data):
        args = {arg: data.draw(words)} if data.draw(st.booleans()) else {}
        return make_op(op_type, ["x"], ["y"], **args), {"x": string_tensor(data)}

    return draw


def draw_join(data):
    kind = data.draw(st.sampled_from(["string", "float32", "float64", "int32", "int64", "int16", "bool"]))
    rank = data.draw(st.integers(1, 2))
    if kind == "string":
        x = string_tensor(data, rank, rank, min_side=1)
    else:
        x = data.draw(arrays(shapes(rank, rank), np.dtype(kind), -1000, 1000))
    args = {}
    if data.draw(st.booleans()):
        args["axis"] = data.draw(st.integers(0, 1)) if rank == 2 else 0
    if data.draw(st.booleans()):
        args["delimiter"] = data.draw(st.sampled_from(["", "|", " - "]))
    return make_op("StringJoin", ["x"], ["y"], **args), {"x": x}


CASES = cases(
    Case("StringPrefix", draw_affix("StringPrefix"), jit=False, note="host op"),
    Case("StringSuffix", draw_affix("StringSuffix"), jit=False, note="host op"),
    Case("StringStartsWith", draw_test("StringStartsWith", "prefix"), jit=False, note="host op"),
    Case("StringEndsWith", draw_test("StringEndsWith", "suffix"), jit=False, note="host op"),
    Case("StringEquals", draw_test("StringEquals", "text"), jit=False, note="host op"),
    Case("StringJoin", draw_join, jit=False, note="host op"),
)


def run_workspace(op, inputs):
    workspace = rnn2jax.Workspace()
    for name, value in inputs.items():
        workspace.feed(name, value)
    workspace.run(create_net("strings", [op]))
    return {name: np.asarray(workspace.fetch(name)) for name in op.output}


def check_host_op(caffe2, op, inputs):
    try:
        want = caffe2.run_op(op, inputs)
    except Caffe2Error as refusal:
        with pytest.raises(Rnn2JaxError):
            run_workspace(op, inputs)
            pytest.fail(f"Caffe2 refuses this {op.type} ({str(refusal)[:300]}) but rnn2jax computed it")
        return
    assert_blobs_equal(run_workspace(op, inputs), want)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    check_host_op(caffe2, *case.draw(data))


def test_refusals(caffe2):
    """What Caffe2 refuses, rnn2jax refuses too, naming the op: a non-string input, an empty or 3-D join, a
    bad axis, a negative length. And no string op runs inside jitted code."""
    floats = {"x": np.ones(2, np.float32)}
    strings = {"x": np.array([b"abc"], dtype=object)}
    for op, inputs in [
        (make_op("StringPrefix", ["x"], ["y"]), floats),
        (make_op("StringEquals", ["x"], ["y"], text="a"), floats),
        (make_op("StringJoin", ["x"], ["y"]), {"x": np.zeros(0, np.float32)}),
        (make_op("StringJoin", ["x"], ["y"]), {"x": np.zeros((1, 1, 1), np.float32)}),
        (make_op("StringJoin", ["x"], ["y"]), {"x": np.ones(2, np.float16)}),
        (make_op("StringJoin", ["x"], ["y"], axis=2), floats),
        (make_op("StringJoin", ["x"], ["y"], axis=1), floats),
        (make_op("StringPrefix", ["x"], ["y"], length=-1), strings),
    ]:
        with pytest.raises(Caffe2Error):
            caffe2.run_op(op, inputs)
        with pytest.raises(Rnn2JaxError, match=op.type):
            run_workspace(op, inputs)
    with pytest.raises(UnsupportedOpError, match="StringPrefix: host op"):
        rnn2jax.compile(create_net("n", [make_op("StringPrefix", ["x"], ["y"])]), outputs=["y"])
