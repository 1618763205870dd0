"""`core.GlobalInit` with Caffe2's command-line flags, against real Caffe2 running the same calls: which
argument lists are accepted, what `GetGlobalInitArgs` keeps, and that the floating-point exception flag
makes a division by zero (and an invalid operation) fail a run, and only while it is set."""

from __future__ import annotations

import pytest
from test_api_core import real_caffe2, run_here  # noqa: F401  (real_caffe2 is a fixture)

from rnn2jax.caffe2.python import core

SOURCE = """
R = {"accepted": []}
for args in INPUTS:
    try:
        core.GlobalInit(args)
        R["accepted"].append(True)
    except Exception as e:
        R["accepted"].append(type(e).__name__ if not isinstance(e, RuntimeError) else "RuntimeError")
R["kept"] = core.GetGlobalInitArgs()[-3:]

f = np.float32
cases = [("Div", [1.0, 0.0]), ("Div", [0.0, 0.0]), ("Sqrt", [-1.0]), ("Log", [0.0]), ("Div", [1.0, 2.0])]
R["fp"] = []
for throw in ("1", "0"):
    core.GlobalInit(["caffe2", "--caffe2_operator_throw_if_fp_exceptions", throw])
    for op_type, values in cases:
        names = ["a", "b"][: len(values)]
        for name, value in zip(names, values):
            workspace.FeedBlob(name, np.array([value], f))
        try:
            workspace.RunOperatorOnce(core.CreateOperator(op_type, names, "c"))
            R["fp"].append("ok")
        except RuntimeError:
            R["fp"].append("raised")
"""

ARGS = [
    ["python", "caffe2"],
    [],
    [
        "caffe2",
        "--caffe2_log_level=0",
        "--caffe2_cpu_allocator_do_zero_fill=0",
        "--caffe2_cpu_allocator_do_junk_fill=1",
    ],
    ["caffe2", "--caffe2_print_stacktraces", "1", "--caffe2_rnn_executor=false", "not_a_flag"],
    ["caffe2", "--caffe2_no_such_flag=1"],
    ["caffe2", "--caffe2_operator_throw_if_fp_exceptions"],
    ["caffe2", "--caffe2_keep_on_shrink=yes"],
    ["caffe2", "--caffe2_tensor_chunk_size=1000000", "--v=abc"],
]


def test_global_init_matches_real_caffe2(real_caffe2) -> None:  # noqa: F811
    theirs = real_caffe2(SOURCE, ARGS)
    ours = run_here(SOURCE, ARGS)
    assert ours["accepted"] == theirs["accepted"]
    assert ours["accepted"] == [True, True, True, True, "RuntimeError", "RuntimeError", "RuntimeError", True]
    assert ours["kept"] == theirs["kept"]
    assert ours["fp"] == theirs["fp"] == ["raised"] * 4 + ["ok"] * 6


def test_a_flag_rnn2jax_cannot_honour_is_an_error_naming_it() -> None:
    core.GlobalInit(["caffe2", "--caffe2_serialize_fp16_as_bytes=0"])  # its default: fine
    with pytest.raises(RuntimeError, match="caffe2_serialize_fp16_as_bytes"):
        core.GlobalInit(["caffe2", "--caffe2_serialize_fp16_as_bytes=1"])
    with pytest.raises(RuntimeError, match="unrecognized commandline argument: --nope"):
        core.GlobalInit(["caffe2", "--nope=1"])
