"""Building small PlanDefs, and running them in rnn2jax's Workspace and in real Caffe2's RunPlan."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

import rnn2jax
from differential import assert_blobs_equal
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.proto import caffe2_pb2 as pb

op = create_operator


def net(name: str, *ops: pb.OperatorDef) -> pb.NetDef:
    return create_net(name, list(ops))


def step(name: str, **fields: Any) -> pb.ExecutionStep:
    message = pb.ExecutionStep(name=name)
    for key, value in fields.items():
        if key == "network":
            message.network.extend([value] if isinstance(value, str) else value)
        elif key == "substep":
            message.substep.extend(value)
        else:
            setattr(message, key, value)
    return message


def plan(nets: Iterable[pb.NetDef], *steps: pb.ExecutionStep, name: str = "plan") -> pb.PlanDef:
    message = pb.PlanDef(name=name)
    message.network.extend(nets)
    message.execution_step.extend(steps)
    return message


def add(blob: str, name: str | None = None, by: str = "one") -> pb.NetDef:
    """A net that adds `by` to `blob` in place."""
    return net(name or f"inc_{blob}", op("Add", [blob, by], [blob]))


def counters(**values: float) -> dict[str, np.ndarray]:
    """Feeds: `one` and the given float32 [1] counters."""
    feeds = {name: np.array([value], np.float32) for name, value in values.items()}
    return {"one": np.ones(1, np.float32), **feeds}


def run_ours(message: pb.PlanDef, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    workspace = rnn2jax.Workspace()
    for name, value in feeds.items():
        workspace.feed(name, value)
    workspace.run_plan(message)
    return {name: np.asarray(workspace.fetch(name)) for name in workspace.blobs()}


def run_caffe2(caffe2: Any, message: pb.PlanDef, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return caffe2.run([("plan", message)], dict(feeds), None)


def assert_same_as_caffe2(caffe2: Any, message: pb.PlanDef, feeds: Mapping[str, Any], rtol: float | None = None):
    """Every blob of rnn2jax's workspace after run_plan equals real Caffe2's after RunPlan; returns ours."""
    want = run_caffe2(caffe2, message, feeds)
    got = run_ours(message, feeds)
    assert_blobs_equal(got, want, rtol)
    return got


def caffe2_refuses(caffe2: Any, message: pb.PlanDef, feeds: Mapping[str, Any]) -> str | None:
    """Caffe2's error message when RunPlan refuses the plan, else None."""
    try:
        run_caffe2(caffe2, message, feeds)
    except Caffe2Error as error:
        return str(error)
    return None
