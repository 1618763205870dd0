"""Bad plans: each case is run in real Caffe2 and in rnn2jax; both refuse it (rnn2jax with the named
error shown) or both accept it with the same blobs."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import add, caffe2_refuses, counters, net, op, plan, run_caffe2, run_ours, step

from differential import assert_blobs_equal
from rnn2jax.errors import MissingBlobError, ParseError, PlanError, Rnn2JaxError

_INC = add("c")
_READ_X = net("read", op("Add", ["x", "one"], ["y"]))
_MAKE_X = net("make", op("ConstantFill", [], ["x"], shape=[1], value=2.0))

# id -> (plan, feeds, rnn2jax's error class and words of its message, or None when both accept)
CASES = {
    "missing net": (plan([_INC], step("s", network="nope")), {}, (PlanError, "uses net 'nope'")),
    "missing net in a substep": (
        plan([_INC], step("s", substep=[step("a", network="inc_c"), step("b", network="nope")])),
        {},
        (PlanError, "uses net 'nope'"),
    ),
    "nets and substeps": (
        plan([_INC], step("s", network="inc_c", substep=[step("t", network="inc_c")])),
        {},
        (PlanError, "either substeps or networks"),
    ),
    "neither nets nor substeps": (plan([_INC], step("s", num_iter=2)), {}, None),
    "only_once without a stop blob": (
        plan([_INC], step("s", network="inc_c", only_once=True)),
        {},
        (PlanError, "only_once"),
    ),
    "only_once false without a stop blob": (
        plan([_INC], step("s", network="inc_c", only_once=False)),
        {},
        (PlanError, "only_once"),
    ),
    "stop blob that does not exist": (
        plan([_INC], step("s", network="inc_c", should_stop_blob="stop")),
        {},
        (PlanError, "'stop' does not exist"),
    ),
    "stop blob and num_iter": (
        plan([_INC], step("s", network="inc_c", should_stop_blob="stop", num_iter=2)),
        {"stop": np.array(True)},
        (PlanError, "num_iter"),
    ),
    "float stop blob": (
        plan([_INC], step("s", network="inc_c", should_stop_blob="stop")),
        {"stop": np.array(1.0, np.float32)},
        (PlanError, "bool scalar"),
    ),
    "int stop blob": (
        plan([_INC], step("s", network="inc_c", should_stop_blob="stop", only_once=True)),
        {"stop": np.array([0], np.int32)},
        (PlanError, "bool scalar"),
    ),
    "two-element stop blob": (
        plan([_INC], step("s", network="inc_c", should_stop_blob="stop", only_once=True)),
        {"stop": np.array([False, False])},
        (PlanError, "bool scalar"),
    ),
    "report net without an interval": (
        plan([_INC, add("r")], step("s", network="inc_c", report_net="inc_r")),
        {"r": np.zeros(1, np.float32)},
        (PlanError, "report_interval"),
    ),
    "missing report net": (
        plan([_INC], step("s", network="inc_c", report_net="nope", report_interval=1)),
        {},
        (PlanError, "uses net 'nope'"),
    ),
    "two nets of one name": (plan([_INC, _INC], step("s", network="inc_c")), {}, (ParseError, "two nets")),
    "a net reads a blob nothing made": (
        plan([_READ_X], step("s", network="read")),
        {},
        (MissingBlobError, "op #0 (Add): reads blob 'x'"),
    ),
    "a net reads a blob a later net makes": (
        plan([_MAKE_X, _READ_X], step("s", network=["read", "make"])),
        {},
        (MissingBlobError, "reads blob 'x'"),
    ),
    "a step reads a blob a later step makes": (
        plan([_MAKE_X, _READ_X], step("a", network="read"), step("b", network="make")),
        {},
        (MissingBlobError, "reads blob 'x'"),
    ),
    "an empty plan": (plan([_INC]), {}, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_plan_refused_as_caffe2_refuses_it(caffe2, case):
    message, feeds, expected = CASES[case]
    feeds = {**counters(c=0), **feeds}
    refused = caffe2_refuses(caffe2, message, feeds)
    if expected is None:
        assert refused is None, f"Caffe2 refuses {case}: {refused}"
        assert_blobs_equal(run_ours(message, feeds), run_caffe2(caffe2, message, feeds))
        return
    assert refused is not None, f"Caffe2 accepts {case}"
    error_class, words = expected
    with pytest.raises(error_class) as info:
        run_ours(message, feeds)
    assert isinstance(info.value, Rnn2JaxError)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_plan_errors_name_the_plan_and_the_step():
    message = plan([_INC], step("outer", substep=[step("inner", network="inc_c", only_once=True)]), name="train")
    with pytest.raises(PlanError, match="plan 'train', execution step 'inner'"):
        run_ours(message, counters(c=0))


def test_a_missing_blob_names_the_net_the_op_and_the_workspace_blobs():
    with pytest.raises(MissingBlobError) as info:
        run_ours(plan([_READ_X], step("s", network="read")), {"one": np.ones(1, np.float32)})
    text = str(info.value)
    assert "net 'read'" in text and "op #0 (Add)" in text and "'x'" in text and "blobs are: one" in text
