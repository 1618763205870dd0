"""Per-iteration overhead of `Workspace.run_plan` against calling the jitted training step directly.

The plan repeats a pure training net (2-layer MLP, squared loss, its gradient ops, Iter, LearningRate and
WeightedSum SGD updates) N times in one execution step. The baseline is what a JAX user would write:
the same net lowered and jitted once, called in a Python loop that feeds its outputs back. Both wait for
the device at the end of each run; the ratio is taken run by run and its median printed (target <= 1.05).

    python benchmarks/run_plan_overhead.py [--iters 200] [--repeats 15] [--batch 64] [--hidden 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

import rnn2jax
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.lowering.interpreter import lower
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.proto import caffe2_pb2 as pb

PARAMS = ("W1", "b1", "W2", "b2")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=200, help="iterations of the training step per run")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    return parser.parse_args()


def _nets(batch: int, hidden: int, iters: int) -> tuple[pb.NetDef, pb.NetDef, pb.PlanDef]:
    op = create_operator
    rng = np.random.default_rng(0)
    sizes = {"W1": (hidden, hidden), "b1": (hidden,), "W2": (16, hidden), "b2": (16,)}
    init_ops = [
        op("GivenTensorFill", [], [name], shape=list(shape), values=(0.05 * rng.normal(size=shape)).ravel().tolist())
        for name, shape in sizes.items()
    ]
    init_ops += [
        op("GaussianFill", [], ["X"], shape=[batch, hidden]),
        op("GaussianFill", [], ["Y"], shape=[batch, 16]),
        op("ConstantFill", [], ["ONE"], shape=[1], value=1.0),
        op("ConstantFill", [], ["iter"], shape=[1], value=0, dtype=pb.TensorProto.INT64),
    ]
    forward = [
        op("FC", ["X", "W1", "b1"], ["h"]),
        op("Relu", ["h"], ["r"]),
        op("FC", ["r", "W2", "b2"], ["pred"]),
        op("SquaredL2Distance", ["pred", "Y"], ["dist"]),
        op("AveragedLoss", ["dist"], ["loss"]),
    ]
    gradients, _ = get_backward_pass(forward, {"loss": None})
    sgd = [
        op("Iter", ["iter"], ["iter"]),
        op("LearningRate", ["iter"], ["lr"], base_lr=-0.01, policy="step", stepsize=1000, gamma=0.9),
    ] + [op("WeightedSum", [p, "ONE", p + "_grad", "lr"], [p]) for p in PARAMS]
    init = create_net("init", init_ops)
    train = create_net("train", forward + gradients + sgd)
    plan = pb.PlanDef(name="overhead")
    plan.network.extend([train])
    plan.execution_step.extend([pb.ExecutionStep(name="train", network=["train"], num_iter=iters)])
    return init, train, plan


def main() -> None:
    args = _parse_args()
    init, train, plan_message = _nets(args.batch, args.hidden, args.iters)
    plan = rnn2jax.load(plan_message)

    workspace = rnn2jax.Workspace()
    workspace.run(init)

    lowered = lower(rnn2jax.load(train))
    reads = tuple(lowered.reads_before_writes())
    writes = tuple(dict.fromkeys(name for op in lowered.net.ops for name in op.outputs))

    @jax.jit
    def step(env):
        out = lowered(env)
        return {name: out[name] for name in writes}

    state = {name: workspace.get(name) for name in workspace.blobs()}

    def direct() -> None:
        for _ in range(args.iters):
            state.update(step({name: state[name] for name in reads}))
        jax.block_until_ready(state["W1"])

    def planned() -> None:
        workspace.run_plan(plan)
        jax.block_until_ready(workspace.get("W1"))

    direct()  # compile both
    planned()
    ratios, direct_times, plan_times = [], [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        direct()
        middle = time.perf_counter()
        planned()
        end = time.perf_counter()
        direct_times.append((middle - start) / args.iters)
        plan_times.append((end - middle) / args.iters)
        ratios.append(plan_times[-1] / direct_times[-1])
    print(
        f"batch {args.batch}, hidden {args.hidden}, {args.iters} iterations x {args.repeats} runs: "
        f"direct jitted step {statistics.median(direct_times) * 1e6:.1f} us/iter, "
        f"run_plan {statistics.median(plan_times) * 1e6:.1f} us/iter"
    )
    print(f"median ratio run_plan / direct: {statistics.median(ratios):.3f}x (target <= 1.05x)")


if __name__ == "__main__":
    main()
