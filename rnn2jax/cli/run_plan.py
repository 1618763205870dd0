"""`rnn2jax run-plan PLAN`: run a PlanDef's execution steps (training plans) in a fresh workspace, the way
Caffe2's RunPlan did, with a progress line, logged blobs and TensorBoard scalars; Ctrl-C stops it between
iterations (exit status 130)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from . import arguments

NAME = "run-plan"
HELP = "run a PlanDef (training plans) in a workspace, with a progress line; Ctrl-C stops it"
DESCRIPTION = """Run PLAN's execution steps the way Caffe2's RunPlan did, in a fresh workspace. The progress line on
stderr follows the outermost step that repeats (a training loop). Ctrl-C stops between iterations and prints where
(exit status 130)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(parser, "--db-root", dest="plan", metavar="PLAN", help="a PlanDef file (.pb or .pbtxt)")
    parser.add_argument(
        "--iters", type=arguments.positive, metavar="N", help="run every execution step at most N iterations"
    )
    parser.add_argument("--log", action="append", metavar="BLOB", help="show this blob while running and at the end")
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write each --log blob (its mean when not one value) as a TensorBoard scalar at each new value; "
        "without --log, the blobs whose name holds 'loss' (needs the tensorboard extra)",
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return run_plan(args.plan, args.db_root, args.iters, args.log or [], args.tensorboard)


def run_plan(
    path: str, db_root: str | None, iters: int | None, log: Sequence[str], tensorboard: str | None = None
) -> int:
    """Run a PlanDef in a fresh workspace with a progress line, then print the logged blobs (and with
    `tensorboard`, write them per iteration as TensorBoard scalars there). Ctrl-C stops it between
    iterations: where it stopped goes to stderr, exit status 130."""
    from ..errors import ParseError
    from ..ir.loader import load
    from ..ir.netdef import Plan
    from ..runtime.plan import PlanInterrupted
    from ..runtime.workspace import Workspace
    from .progress import IterationMeter, stage

    with stage(f"loading {path}"):
        plan = load(path)
    if not isinstance(plan, Plan):
        raise ParseError(f"{path} holds a net, not a plan: run it with `rnn2jax run`")
    workspace = Workspace(db_root=db_root)
    meter = IterationMeter(lambda: _log_text(workspace, log, "  ") if log else "")
    scalars = _scalar_logger(plan, workspace, log, tensorboard)
    should_continue = (lambda i: i < iters) if iters is not None else None
    try:
        workspace.run_plan(
            plan, should_continue=should_continue, observer=scalars, progress=meter, defer_interrupt=True
        )
    except KeyboardInterrupt as error:
        meter.close()
        where = error.where if isinstance(error, PlanInterrupted) else f"plan '{plan.name}'"
        print(f"rnn2jax: interrupted: {where}", file=sys.stderr)
        if log:
            print(_log_text(workspace, log, "\n"))
        return 130
    finally:
        if scalars is not None:
            scalars.close()  # what was logged before an error or Ctrl-C is kept
    meter.close()
    print(f"ran plan '{plan.name}'" + (f"; logged blobs:\n{_log_text(workspace, log, chr(10))}" if log else ""))
    if scalars is not None:
        written = ", ".join(f"{name} ({count})" for name, count in scalars.steps.items())
        print(f"wrote TensorBoard scalars to {tensorboard}: {written}")
    return 0


def _scalar_logger(plan: Any, workspace: Any, log: Sequence[str], logdir: str | None) -> Any:
    """`--tensorboard`'s observer, for the --log blobs or else the blobs named like a loss (said on stderr)."""
    if logdir is None:
        return None
    from ..errors import MissingBlobError
    from .tensorboard_log import ScalarLogger, loss_blobs

    names = list(log) or loss_blobs(plan)
    if not names:
        raise MissingBlobError(
            f"--tensorboard: plan '{plan.name}' writes no blob named like a loss; name the blobs to log with --log"
        )
    if not log:
        print(f"rnn2jax: --tensorboard logs {', '.join(names)} (choose others with --log)", file=sys.stderr)
    return ScalarLogger(workspace, names, logdir)


def _log_text(workspace: Any, names: Sequence[str], separator: str) -> str:
    """`name value` for each logged blob: its values when it holds a few, else a summary."""
    import numpy as np

    from .model import summarize

    parts = []
    for name in names:
        if not workspace.has_blob(name):
            parts.append(f"{name}: (not in the workspace)")
            continue
        value = workspace.fetch(name)
        if isinstance(value, np.ndarray) and value.size <= 8 and value.dtype != object:
            shown = value.item() if value.size == 1 else value.tolist()
            parts.append(f"{name}: {shown:.6g}" if isinstance(shown, float) else f"{name}: {shown}")
        elif isinstance(value, np.ndarray) and value.dtype != object:
            parts.append(summarize({name: value}))
        else:
            parts.append(f"{name}: {type(value).__name__}")
    return separator.join(parts)
