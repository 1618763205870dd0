"""The printing family (rnn2jax/ops/printing.py): Print's lowering, which runs where its host op cannot (a
nested net, a compiled net), against real Caffe2.

Print has no output: the case checks that rnn2jax runs it where Caffe2 does and refuses it where Caffe2 does
(every_n below 1). What it prints, and the host op at the top level of a Workspace's net, are tested in
tests/runtime/test_runtime_workspace.py.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from differential import Case, arrays, cases, invalid, make_op, run_case, run_rnn2jax, shapes


def draw_print(data: st.DataObject):
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.bool_]))
    x = data.draw(arrays(data.draw(shapes(0, 3, min_side=0, max_side=4)), dtype, -3, 3))
    args = {}
    if data.draw(st.booleans()):
        args["limit"] = data.draw(st.integers(0, 5))
    if invalid(data):
        args["every_n"] = data.draw(st.integers(-1, 0))  # Caffe2: every_n_ >= 1
    elif data.draw(st.booleans()):
        args["every_n"] = data.draw(st.integers(1, 3))
    return make_op("Print", ["x"], [], **args), {"x": x}


CASES = cases(Case("Print", draw_print, note="no output; refuses every_n < 1"))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    run_case(caffe2, case, data)


def test_print_compiled_prints_caffe2s_format(capsys):
    """Compiled (no Workspace to run the host op), Print prints from the compiled code, as the host op would."""
    op = make_op("Print", ["x"], [], limit=2)
    run_rnn2jax([op], {"x": np.array([1.5, 2.0, 3.0], np.float32)}, [])
    jax.effects_barrier()
    assert capsys.readouterr().out == "Tensor x of type float. Dims: (3,): 1.5,2\n"
