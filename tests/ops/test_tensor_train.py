"""The tensor-train family (rnn2jax/ops/tensor_train.py): TT against real Caffe2 (see tests/differential.py), and
its gradient, which neither Caffe2's maker nor its TTLinearGradient op gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, invalid, make_op, run_case


def draw_tt(data):
    d = data.draw(st.integers(1, 3))
    inp = [data.draw(st.integers(1, 3)) for _ in range(d)]
    out = [data.draw(st.integers(1, 3)) for _ in range(d)]
    ranks = [1] + [data.draw(st.integers(1, 2)) for _ in range(d - 1)] + [1]
    size = sum(inp[i] * ranks[i + 1] * ranks[i] * out[i] for i in range(d))
    batch = data.draw(st.integers(1, 3))
    width = int(np.prod(inp)) + (1 if invalid(data) else 0)
    inputs = {
        "x": data.draw(arrays((batch, width))),
        "b": data.draw(arrays((int(np.prod(out)),))),
        "cores": data.draw(arrays((size,))),
    }
    return make_op("TT", ["x", "b", "cores"], ["y"], inp_sizes=inp, out_sizes=out, tt_ranks=ranks), inputs


def draw_tt_sparse_lengths_sum(data):
    factor_i = [data.draw(st.integers(1, 3)) for _ in range(3)]
    factor_j = [data.draw(st.integers(1, 2)) for _ in range(3)]
    ranks = [1, data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), 1]
    inputs = {f"core{k}": data.draw(arrays((factor_i[k], ranks[k], factor_j[k], ranks[k + 1]))) for k in range(3)}
    lengths = data.draw(arrays((data.draw(st.integers(0, 3)),), np.int32, 0, 3))
    inputs["indices"] = data.draw(arrays((int(lengths.sum()),), np.int64, 0, int(np.prod(factor_i)) - 1))
    inputs["lengths"] = lengths
    args = {"factor_i": factor_i, "factor_j": factor_j, "ranks": ranks, "emb_size": int(np.prod(factor_j))}
    outputs = ["y", "core0_out", "core1_out", "index_out"]
    return make_op("TTSparseLengthsSum", list(inputs), outputs, **args), inputs


def draw_tt_linear_gradient(data):
    """Caffe2's TTLinearGradient fails whatever it is given: so must rnn2jax."""
    inputs = {"x": data.draw(arrays((1, 2))), "b": data.draw(arrays((2,))), "cores": data.draw(arrays((4,)))}
    return make_op("TTLinearGradient", list(inputs), ["dx"]), inputs


CASES = cases(
    Case("TT", draw_tt, rtol=1e-4, note="Caffe2's maker refuses: its gradient is not implemented"),
    Case("TTLinearGradient", draw_tt_linear_gradient, note="Caffe2's op always fails, and rnn2jax refuses it"),
    Case("TTSparseLengthsSum", draw_tt_sparse_lengths_sum, gradient_ops=("TTSparseLengthsSumGradient",), rtol=1e-4),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_tt_matches_a_dense_reference():
    """d = 1, ranks 1: the core is the weight matrix itself."""
    from differential import run_rnn2jax

    x, core, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((3, 2), np.float32), np.ones(2, np.float32)
    op = make_op("TT", ["x", "b", "cores"], ["y"], inp_sizes=[3], out_sizes=[2], tt_ranks=[1, 1])
    got = run_rnn2jax([op], {"x": x, "b": b, "cores": core.ravel()}, ["y"])["y"]
    np.testing.assert_allclose(got, x @ core + b)


def test_tt_sparse_lengths_sum_refuses_what_caffe2_reads_out_of_bounds():
    from differential import run_rnn2jax
    from rnn2jax.errors import Rnn2JaxError

    cores = {f"core{k}": np.ones((2, 1, 1, 1), np.float32) for k in range(3)}
    args = {"factor_i": [2, 2, 2], "factor_j": [1, 1, 1], "ranks": [1, 1, 1, 1], "emb_size": 1}
    op = make_op("TTSparseLengthsSum", [*cores, "indices", "lengths"], ["y", "a", "b", "c"], **args)
    for indices, lengths, match in (([8], [1], "INDICES 'indices' holds 8"), ([1], [2], "sum to the 1 indices")):
        inputs = {**cores, "indices": np.array(indices, np.int64), "lengths": np.array(lengths, np.int32)}
        for jit in (True, False):
            with pytest.raises(Rnn2JaxError, match=match):
                run_rnn2jax([op], inputs, ["y"], jit=jit)
