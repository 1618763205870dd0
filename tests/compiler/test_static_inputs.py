"""Inputs whose values decide shapes (lengths, sizes, starts, shape blobs) work as net inputs under jit.

`rnn2jax.compile` finds them while lowering (the ops' `static_inputs`, followed back through the ops that
computed them), reads their values on the host at each call and runs an executable specialised to them,
compiling once per distinct value. Compilations are counted with JAX's own monitoring events, not with
rnn2jax's cache, and every result is checked against NumPy.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from helpers import count_compilations
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import ShapeError
from rnn2jax.runtime.workspace import Workspace


def net(*ops, name="n"):
    return create_net(name, list(ops))


def op(op_type, inputs, outputs, **args):
    return create_operator(op_type, inputs, outputs, **args)


lengths_lists = st.lists(st.integers(0, 4), min_size=1, max_size=4)


def pack_reference(x, lengths):
    out = np.zeros((max(lengths), len(lengths), *x.shape[1:]), x.dtype)
    start = 0
    for column, n in enumerate(lengths):
        out[:n, column] = x[start : start + n]
        start += n
    return out


# --------------------------------------------------------------------------------------------------
# One executable per distinct value


def test_pack_compiles_once_per_distinct_lengths_value():
    compiled = rnn2jax.compile(net(op("PackRNNSequence", ["x", "lengths"], ["y"])))
    assert compiled.static_inputs == ("lengths",)
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    calls = [[2, 4], [3, 3], [2, 4], [3, 3], [1, 5]]
    with count_compilations(of="rnn2jax_net") as count:
        for lengths in calls:
            got = compiled({"x": x, "lengths": np.array(lengths, np.int32)})["y"]
            np.testing.assert_array_equal(np.asarray(got), pack_reference(x, lengths))
    assert count[0] == 3  # [2, 4], [3, 3], [1, 5]
    assert compiled.specialisations == 3
    assert "static_inputs=['lengths']" in repr(compiled) and "3 compiled" in repr(compiled)


def test_a_net_without_static_inputs_compiles_once_and_says_nothing_of_them():
    compiled = rnn2jax.compile(net(op("Relu", ["x"], ["y"])))
    with count_compilations(of="rnn2jax_net") as count:
        for _ in range(3):
            compiled({"x": np.ones((2, 3), np.float32)})
    assert count[0] == 1
    assert compiled.static_inputs == () and "static" not in repr(compiled)


def test_specialisations_beyond_the_limit_drop_the_oldest(monkeypatch):
    compiled = rnn2jax.compile(net(op("OneHot", ["i", "n"], ["y"])))
    monkeypatch.setattr(compiled, "MAX_SPECIALISATIONS", 2)
    for size in (3, 4, 5):
        compiled({"i": np.array([0, 2], np.int32), "n": np.array(size, np.int32)})
    assert compiled.specialisations == 2
    with count_compilations(of="rnn2jax_net") as count:  # 3 was dropped: compiled again
        compiled({"i": np.array([0, 2], np.int32), "n": np.array(3, np.int32)})
    assert count[0] == 1


# --------------------------------------------------------------------------------------------------
# The ops of issue 11, item 1, with the value fed as a net input, against NumPy


@given(lengths=lengths_lists, width=st.integers(1, 3))
def test_pack_and_unpack_rnn_sequence(lengths, width):
    x = np.random.default_rng(0).standard_normal((sum(lengths), width)).astype(np.float32)
    compiled = rnn2jax.compile(
        net(op("PackRNNSequence", ["x", "lengths"], ["packed"]), op("UnpackRNNSequence", ["packed", "lengths"], ["y"])),
        outputs=["packed", "y"],
    )
    out = compiled({"x": x, "lengths": np.array(lengths, np.int32)})
    np.testing.assert_array_equal(np.asarray(out["packed"]), pack_reference(x, lengths))
    np.testing.assert_array_equal(np.asarray(out["y"]), x)


@given(indices=st.lists(st.integers(0, 5), max_size=4), size=st.integers(6, 8))
def test_one_hot_size_fed(indices, size):
    compiled = rnn2jax.compile(net(op("OneHot", ["i", "n"], ["y"])))
    got = compiled({"i": np.array(indices, np.int64).reshape(-1), "n": np.array(size, np.int64)})["y"]
    np.testing.assert_array_equal(np.asarray(got), np.eye(size, dtype=np.float32)[indices].reshape(-1, size))


@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=2), start=st.integers(0, 3), stop=st.integers(-1, 4))
def test_slice_with_starts_and_ends_fed(shape, start, stop):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    start = min(start, shape[1])
    end = stop if stop < 0 else max(min(stop, shape[1]), start)
    compiled = rnn2jax.compile(net(op("Slice", ["x", "starts", "ends"], ["y"])))
    got = compiled({"x": x, "starts": np.array([0, start], np.int32), "ends": np.array([-1, end], np.int32)})["y"]
    stop_index = shape[1] + end + 1 if end < 0 else end
    np.testing.assert_array_equal(np.asarray(got), x[:, start:stop_index])


@given(rows=st.integers(1, 4), cols=st.integers(1, 4))
def test_reshape_with_a_shape_blob_fed(rows, cols):
    x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    compiled = rnn2jax.compile(net(op("Reshape", ["x", "shape"], ["y", "old"])))
    out = compiled({"x": x, "shape": np.array([cols, -1], np.int64)})
    np.testing.assert_array_equal(np.asarray(out["y"]), x.reshape(cols, rows))
    np.testing.assert_array_equal(np.asarray(out["old"]), [rows, cols])


@given(tiles=st.integers(0, 3), axis=st.integers(0, 1))
def test_tile_with_tiles_and_axis_fed(tiles, axis):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    compiled = rnn2jax.compile(net(op("Tile", ["x", "tiles", "axis"], ["y"])))
    assert set(compiled.static_inputs) == {"tiles", "axis"}
    got = compiled({"x": x, "tiles": np.array([tiles], np.int32), "axis": np.array([axis], np.int32)})["y"]
    np.testing.assert_array_equal(np.asarray(got), np.tile(x, (tiles, 1) if axis == 0 else (1, tiles)))


@given(sizes=st.lists(st.integers(0, 3), min_size=1, max_size=3))
def test_split_with_sizes_fed(sizes):
    x = np.arange(2 * sum(sizes), dtype=np.float32).reshape(2, sum(sizes))
    names = [f"y{i}" for i in range(len(sizes))]
    compiled = rnn2jax.compile(net(op("Split", ["x", "split"], names, axis=1)))
    out = compiled({"x": x, "split": np.array(sizes, np.int32)})
    for name, want in zip(names, np.split(x, np.cumsum(sizes)[:-1], axis=1), strict=True):
        np.testing.assert_array_equal(np.asarray(out[name]), want)


@given(dims=st.lists(st.integers(0, 3), min_size=1, max_size=3))
def test_constant_fill_input_as_shape_fed(dims):
    compiled = rnn2jax.compile(net(op("ConstantFill", ["shape"], ["y"], input_as_shape=1, value=2.5)))
    got = compiled({"shape": np.array(dims, np.int64)})["y"]
    np.testing.assert_array_equal(np.asarray(got), np.full(dims, 2.5, np.float32))


@given(lengths=lengths_lists)
def test_lengths_to_segment_ids_fed(lengths):
    compiled = rnn2jax.compile(net(op("LengthsToSegmentIds", ["lengths"], ["ids"])))
    got = compiled({"lengths": np.array(lengths, np.int32)})["ids"]
    np.testing.assert_array_equal(np.asarray(got), np.repeat(np.arange(len(lengths)), lengths))


@given(indices=st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_sparse_to_dense_first_dim_from_the_indices(indices):
    values = np.arange(len(indices), dtype=np.float32) + 1
    compiled = rnn2jax.compile(net(op("SparseToDense", ["indices", "values"], ["y"])))
    got = compiled({"indices": np.array(indices, np.int32), "values": values})["y"]
    want = np.zeros(max(indices) + 1, np.float32)
    np.add.at(want, indices, values)
    np.testing.assert_array_equal(np.asarray(got), want)


# --------------------------------------------------------------------------------------------------
# Following values back through ops, and stopping where only shapes are read


@given(lengths=lengths_lists)
def test_a_value_computed_from_a_net_input_makes_that_input_static(lengths):
    """lengths arrive as floats and are cast (and offset) inside the net: the float input is static."""
    compiled = rnn2jax.compile(
        net(
            op("Cast", ["lengths_f"], ["lengths_i"], to=2),  # INT32
            op("Add", ["lengths_i", "zero"], ["lengths"]),
            op("LengthsToSegmentIds", ["lengths"], ["ids"]),
        )
    )
    assert set(compiled.static_inputs) == {"lengths_f", "zero"}
    got = compiled({"lengths_f": np.array(lengths, np.float32), "zero": np.array(0, np.int32)})["ids"]
    np.testing.assert_array_equal(np.asarray(got), np.repeat(np.arange(len(lengths)), lengths))


def test_shape_reads_no_values_so_its_input_stays_traced():
    compiled = rnn2jax.compile(net(op("Shape", ["like"], ["s"]), op("Reshape", ["x", "s"], ["y", "old"])))
    assert compiled.static_inputs == ()
    x = np.arange(6, dtype=np.float32)
    with count_compilations(of="rnn2jax_net") as count:
        for value in (1.0, 2.0):
            got = compiled({"x": x, "like": np.full((2, 3), value, np.float32)})["y"]
            np.testing.assert_array_equal(np.asarray(got), x.reshape(2, 3))
    assert count[0] == 1  # new values of `like`, same shape: no new executable


def test_a_shape_parameter_from_the_init_net_is_static():
    init = net(op("GivenTensorInt64Fill", [], ["shape"], shape=[2], values=[3, 2]), name="init")
    compiled = rnn2jax.compile(net(op("Reshape", ["x", "shape"], ["y", "old"])), init)
    x = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(compiled({"x": x})["y"]), x.reshape(3, 2))


def test_a_fill_whose_values_decide_a_shape_is_computed_while_tracing():
    """crf.py's padding: LengthsRangeFill(Cast(Gather(Shape(x), ConstantFill([1], 0)))): the fill has no
    inputs, and its value decides the range's length (crf_viterbi_test)."""
    ops = [
        op("ConstantFill", [], ["zero"], shape=[1], value=0),
        op("Shape", ["x"], ["shape"]),
        op("Gather", ["shape", "zero"], ["length"]),
        op("Cast", ["length"], ["length32"], to=2),  # INT32
        op("LengthsRangeFill", ["length32"], ["range"]),
    ]
    compiled = rnn2jax.compile(net(*ops), outputs=["range"])
    assert compiled.static_inputs == ()
    got = compiled({"x": np.zeros((5, 3), np.float32)})["range"]
    np.testing.assert_array_equal(np.asarray(got), np.arange(5, dtype=np.int32))


# --------------------------------------------------------------------------------------------------
# The workspace runtime does the same; traced values that cannot be made static get a named error


def test_workspace_runs_a_net_with_fed_lengths_at_several_values():
    workspace = Workspace()
    pack = net(op("PackRNNSequence", ["x", "lengths"], ["y"]), name="pack")
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    workspace.feed("x", x)
    workspace.feed("lengths", np.array([2, 3], np.int32))
    workspace.create_net(pack)
    for lengths in ([2, 3], [5], [1, 1, 3]):
        workspace.feed("lengths", np.array(lengths, np.int32))
        workspace.run_net("pack")
        np.testing.assert_array_equal(workspace.fetch("y"), pack_reference(x, lengths))


def test_apply_under_the_users_own_jit_names_the_op_and_blob():
    compiled = rnn2jax.compile(net(op("OneHot", ["i", "n"], ["y"])))
    with pytest.raises(ShapeError, match=r"op #0 \(OneHot\).*'n'.*traced"):
        jax.jit(compiled.apply)({}, {"i": np.array([1], np.int32), "n": np.array(3, np.int32)})
    got = compiled.apply({}, {"i": np.array([1], np.int32), "n": np.array(3, np.int32)})["y"]  # NumPy: fine
    np.testing.assert_array_equal(np.asarray(got), [[0, 1, 0]])


def test_shape_blobs_of_training_nets_do_not_make_the_data_static():
    """Gradient nets read back Reshape's old_shape and Concat's split_info: both come from shapes alone,
    so the parameters and data feeding the forward ops stay traced (one executable for every step)."""
    compiled = rnn2jax.compile(
        net(
            op("Reshape", ["x"], ["flat", "old_shape"], shape=[-1]),
            op("Concat", ["flat", "w"], ["joined", "split_info"], axis=0),
            op("Split", ["joined", "split_info"], ["dflat", "dw"], axis=0),
            op("Reshape", ["dflat", "old_shape"], ["dx", "unused"]),
        ),
        outputs=["dx", "dw"],
    )
    assert compiled.static_inputs == ()
    with count_compilations(of="rnn2jax_net") as count:
        for seed in range(3):
            x = np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)
            out = compiled({"x": x, "w": np.full(4, seed, np.float32)})
            np.testing.assert_array_equal(np.asarray(out["dx"]), x)
            np.testing.assert_array_equal(np.asarray(out["dw"]), np.full(4, seed, np.float32))
    assert count[0] == 1
