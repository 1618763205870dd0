"""The aliasing family (rnn2jax/ops/aliasing.py) against real Caffe2: AliasWithName, UnsafeCoalesce,
CopyRowsToTensor with its gradient (in place, as Caffe2's maker emits it) and AsyncNetBarrier."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, check_op, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.errors import BadArgumentError, Rnn2JaxError


def draw_alias(data):
    op = make_op("AliasWithName", ["x"], [data.draw(st.sampled_from(["x", "y"]))])
    op.arg.add(name="name", s=b"x")
    op.arg.add(name="is_backward", i=int(data.draw(st.booleans())))
    dtype = data.draw(st.sampled_from([np.float32, np.int64, np.int32]))
    return op, {"x": data.draw(arrays(shapes(0, 3), dtype, -9, 9))}


def draw_coalesce(data):
    count = data.draw(st.integers(1, 3))
    names = [f"x{i}" for i in range(count)]
    inputs = {name: data.draw(arrays(shapes(0, 3, min_side=0))) for name in names}
    outputs = names if data.draw(st.booleans()) else [f"y{i}" for i in range(count)]
    return make_op("UnsafeCoalesce", names, [*outputs, "coalesced"]), inputs


def draw_copy_rows(data):
    rows, width = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.float16]))
    x = data.draw(arrays((rows, width), dtype, -9, 9))
    indices = np.asarray(data.draw(st.lists(st.integers(0, rows - 1), max_size=4)), np.int64)
    return make_op("CopyRowsToTensor", ["x", "i", "row"], ["x"]), {
        "x": x,
        "i": indices,
        "row": data.draw(arrays((width,), dtype, -9, 9)),
    }


def draw_copy_rows_gradient(data):
    """In place, as the maker emits it (GO(0) and GI(0) are one blob)."""
    return make_op("CopyRowsToTensorGradient", ["g"], ["g"]), {"g": data.draw(arrays(shapes(1, 2)))}


def draw_barrier(data):
    count = data.draw(st.integers(1, 3))
    names = [f"x{i}" for i in range(count)]
    dtypes = [data.draw(st.sampled_from([np.float32, np.int64, np.float16])) for _ in names]
    op = make_op("AsyncNetBarrier", names, names)
    if data.draw(st.booleans()):
        op.arg.add(name="cross_device", i=data.draw(st.integers(0, 1)))
    return op, {name: data.draw(arrays(shapes(0, 3), dtype, -9, 9)) for name, dtype in zip(names, dtypes, strict=True)}


CASES = cases(
    Case("AsyncNetBarrier", draw_barrier),
    Case("AliasWithName", draw_alias),
    Case("UnsafeCoalesce", draw_coalesce),
    Case("CopyRowsToTensor", draw_copy_rows, gradient_ops=("CopyRowsToTensorGradient",)),
    Case("CopyRowsToTensorGradient", draw_copy_rows_gradient),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_refusals(caffe2):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    row = np.ones(2, np.float32)
    for op, inputs in [
        (make_op("AliasWithName", ["x"], ["y"]), {"x": x}),  # no name
        (make_op("UnsafeCoalesce", ["x", "i"], ["x", "i", "c"]), {"x": x, "i": np.ones(2, np.int32)}),
        (make_op("CopyRowsToTensor", ["x", "i", "row"], ["y"]), {"x": x, "i": np.array([1]), "row": row}),
        (
            make_op("CopyRowsToTensor", ["x", "i", "row"], ["x"]),
            {"x": x, "i": np.array([1]), "row": np.ones(3, np.float32)},
        ),
        (make_op("CopyRowsToTensor", ["x", "i", "row"], ["x"]), {"x": x, "i": np.array([1], np.int32), "row": row}),
    ]:
        assert check_op(caffe2, op, inputs) is None, op
    with pytest.raises(BadArgumentError, match="name"):
        run_rnn2jax([make_op("AliasWithName", ["x"], ["y"])], {"x": x}, ["y"])
    # Caffe2 leaves an out-of-place output unset (fetching it fails); rnn2jax refuses the op, naming the blobs
    with pytest.raises(BadArgumentError, match=r"AsyncNetBarrier.*in place.*'x'.*'y'"):
        run_rnn2jax([make_op("AsyncNetBarrier", ["x"], ["y"])], {"x": x}, ["y"])
    # Caffe2 writes out of bounds; rnn2jax refuses, naming the blob
    with pytest.raises(Rnn2JaxError, match="INDICES 'i' holds 7"):
        run_rnn2jax(
            [make_op("CopyRowsToTensor", ["x", "i", "row"], ["x"])], {"x": x, "i": np.array([7]), "row": row}, ["x"]
        )
