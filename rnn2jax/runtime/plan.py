"""Running a PlanDef's execution steps, following Caffe2's `caffe2/core/plan_executor.cc`.

What holds, as in Caffe2 (each checked against real Caffe2 in tests/test_runtime_plan*.py):
- A step either runs `network`s or `substep`s (both is an error; neither runs nothing). It repeats
  `num_iter` times (default once; 0 or less: never), or, with a `should_stop_blob`, until that blob is
  true (`num_iter` is then an error; `only_once` runs one iteration). `only_once` without a stop blob is an
  error, even `only_once: false`. The stop blob is read after every net and every substep; it must exist
  when the step starts (a net of the step may create it) and, once written, be a bool with one element.
- A step's nets are created before the step runs: every blob a net reads first must exist by then
  (earlier nets of the step, and steps already run, may create it). Nets that already exist in the
  workspace are replaced by the plan's once. Whole top-level steps are prepared one after another, so a
  later top-level step may read what an earlier one wrote.
- `criteria_network` is deprecated and ignored (Caffe2 1.10 ignores it, even when the net is missing).
- `report_net` (needs `report_interval`, in seconds) and substeps with `run_every_ms` run every interval
  while the step runs and once more when it ends. Caffe2 runs them in a background thread; here they run
  between the step's iterations, so one that is due runs after the current iteration, and a step shorter
  than the interval runs them exactly once, at its end, as Caffe2 does.
- `concurrent_substeps` (or `num_concurrent_instances` > 1, which Caffe2 also treats as concurrent): as in
  Caffe2, one thread per substep and instance, `substeps x instances` in all, thread i running substep
  i mod n, and the stop blob checked once they all finished. A substep that fails stops the others' next
  iterations (Caffe2's gotFailure), and the step raises the first failure once every thread has ended.
  So a consumer substep can wait on a queue that a producer substep fills (ops/waits.py: the step's
  own thread waits for its workers as a blocked thread, so workers that all wait on queues are a
  deadlock, reported rather than hung).
- `create_workspace` runs the step in a child workspace made afresh for every run of the step: it writes
  to blobs its parent has and drops those it created. With a `NODE_ID` blob, the child gets a
  `GLOBAL_WORKSPACE_ID` blob as in Caffe2.
- `should_continue(i)` (Caffe2's RunPlan hook) is asked before iteration i of every step.

A step whose nets are all pure, without a stop blob, runs its nets fused: one jitted function per
iteration. Ctrl-C (KeyboardInterrupt) becomes `PlanInterrupted`, which says where the plan stopped.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import jax.numpy as jnp
import numpy as np

from ..errors import PlanError
from ..ir.dtypes import caffe2_dtypes
from ..ir.netdef import ExecutionStep, Net, Plan
from ..ops.waits import blocked
from .executor import Executor, SegmentWorkspace

ShouldContinue = Callable[[int], bool]
# observer(path of step names, iterations done, the step's num_iter or None) after each iteration of a step
Observer = Callable[[tuple[str, ...], int, int | None], None]


@dataclass(frozen=True)
class StepProgress:
    """One running step and how many of its iterations are finished (`step.num_iter` says how many it runs)."""

    step: ExecutionStep
    done: int


# progress(every running step, outermost first) after each iteration of any step: where the whole plan is,
# so that a display can follow the training loop's step rather than the one-iteration steps inside it
Progress = Callable[[tuple[StepProgress, ...]], None]


class PlanWorkspace(SegmentWorkspace, Protocol):
    """What running a plan needs of a workspace (`rnn2jax.runtime.workspace.Workspace` is one, and calls
    `run_plan` from its own `run_plan`): its created nets and the executors it makes for them, whether a
    blob exists (a created net will write it), and child workspaces."""

    _nets: dict[str, Executor]

    def has_net(self, name: str) -> bool: ...

    def create_net(self, net: Any, overwrite: bool = False) -> str: ...

    def child(self) -> PlanWorkspace: ...

    def _executor(self, nets: tuple[Net, ...]) -> Executor: ...

    def _exists(self, name: str) -> bool: ...


class PlanInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a KeyboardInterrupt from a host op) stopped the plan; `where` says where."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


def _always(_: int) -> bool:
    return True


class _Runner:
    """One RunPlan: the plan's nets, which of them override nets the workspace already had, and where
    the plan is (the stack of steps and their iterations) for interruptions."""

    def __init__(
        self,
        plan: Plan,
        workspace: PlanWorkspace,
        should_continue: ShouldContinue,
        observer: Observer | None,
        progress: Progress | None = None,
    ):
        self.plan = plan
        self.should_continue = should_continue
        self.observer = observer
        self.progress = progress
        self.needs_override = {name: workspace.has_net(name) for name in plan.nets}
        self._local = threading.local()  # each thread of concurrent substeps has its own stack
        self._local.stack, self._local.running = [], ""
        self.lock = threading.RLock()  # creating nets (Caffe2's createAndGetNet) from concurrent substeps
        self.interrupt_requested = False
        self.workspace_seq = 0

    @property
    def stack(self) -> list[list[Any]]:
        """[step name, iteration under way, step] of the running steps of this thread, outermost first."""
        return self._local.stack

    @property
    def running(self) -> str:
        return self._local.running

    @running.setter
    def running(self, label: str) -> None:
        self._local.running = label

    def enter_thread(self, stack: list[list[Any]]) -> None:
        """A worker thread of concurrent substeps starts with (a copy of) its parent's stack."""
        self._local.stack, self._local.running = [list(frame) for frame in stack], ""

    def where(self) -> str:
        if not self.stack:
            return f"plan '{self.plan.name}' before its first step"
        steps = " > ".join(f"step '{name}' at iteration {it}" for name, it, _ in self.stack)
        running = f", running {self.running}" if self.running else ""
        return f"plan '{self.plan.name}': {steps}{running}"

    def check_interrupt(self) -> None:
        if self.interrupt_requested:
            raise PlanInterrupted(self.where())

    def net(self, name: str, step: ExecutionStep, workspace: PlanWorkspace) -> Net:
        """Caffe2's createAndGetNet: the plan's net, created in `workspace` unless already there."""
        net = self.plan.nets.get(name)
        if net is None:
            raise PlanError(
                f"plan '{self.plan.name}': execution step '{step.name}' uses net '{name}', which the plan does "
                f"not define; its nets are: {', '.join(self.plan.nets) or '(none)'}"
            )
        with self.lock:
            if self.needs_override.get(name) or not workspace.has_net(name):
                workspace.create_net(net, overwrite=True)
                self.needs_override[name] = False
        return net


class _StepWrapper:
    """Caffe2's ExecutionStepWrapper: a step prepared once, or afresh for every run when it creates
    its own workspace."""

    def __init__(self, runner: _Runner, step: ExecutionStep, workspace: PlanWorkspace, should_continue: ShouldContinue):
        self.runner, self.step, self.workspace, self.should_continue = runner, step, workspace, should_continue
        self._compiled = None if step.create_workspace else _CompiledStep(runner, step, workspace, should_continue)

    def compiled(self) -> _CompiledStep:
        if self._compiled is not None:
            return self._compiled
        with self.runner.lock:
            return _CompiledStep(self.runner, self.step, self.workspace, self.should_continue)


class _CompiledStep:
    def __init__(self, runner: _Runner, step: ExecutionStep, outer: PlanWorkspace, external: ShouldContinue):
        self.step = step
        self.label = f"plan '{runner.plan.name}', execution step '{step.name}'"
        workspace = outer.child() if step.create_workspace else outer
        if step.create_workspace:
            _inject_workspace_id(runner, workspace)
        self.workspace = workspace
        if step.substeps and step.networks:
            raise PlanError(f"{self.label}: a step has either substeps or networks, not both")
        self.recurring: list[_StepWrapper] = []
        self.reports: list[_StepWrapper] = []
        self.executors: list[Executor] = []
        self.failed = False  # Caffe2's gotFailure: a concurrent substep failed, the others stop iterating
        substep_continue = external
        if step.concurrent_substeps and len(step.substeps) > 1:
            substep_continue = lambda i: not self.failed and external(i)  # noqa: E731
        for substep in step.substeps:
            wrapper = _StepWrapper(runner, substep, workspace, substep_continue)
            (self.reports if substep.run_every_ms is not None else self.recurring).append(wrapper)
        nets = [runner.net(name, step, workspace) for name in step.networks]
        self.executors = [workspace._nets[net.name] for net in nets]
        if len(nets) > 1 and step.should_stop_blob is None and all(e.pure for e in self.executors):
            self.executors = [workspace._executor(tuple(nets))]  # one jitted function per iteration
        if step.should_stop_blob is not None and not workspace._exists(step.should_stop_blob):
            raise PlanError(f"{self.label}: should_stop_blob '{step.should_stop_blob}' does not exist")
        self.report_net: Executor | None = None
        if step.report_net is not None:
            if step.report_interval is None:
                raise PlanError(f"{self.label}: report_net '{step.report_net}' needs a report_interval")
            self.report_net = workspace._nets[runner.net(step.report_net, step, workspace).name]
        own = _continuation(step, self.label)
        self.should_continue: ShouldContinue = lambda i: external(i) and own(i)

    def should_stop(self) -> bool:
        """Caffe2's getShouldStop: false while the blob holds nothing; else it must be a bool scalar."""
        name = self.step.should_stop_blob
        if name is None or not self.workspace.has_blob(name):
            return False
        value = self.workspace.get(name)
        dtype, size = getattr(value, "dtype", None), getattr(value, "size", None)
        if dtype != np.bool_ or size != 1:
            got = f"{dtype}{list(value.shape)}" if dtype is not None else type(value).__name__
            raise PlanError(f"{self.label}: should_stop_blob '{name}' must be a bool scalar (one element), got {got}")
        return bool(np.asarray(value).reshape(-1)[0])


def _continuation(step: ExecutionStep, label: str) -> ShouldContinue:
    """Caffe2's getContinuationTest."""
    if step.should_stop_blob is None:
        if step.only_once is not None:
            raise PlanError(f"{label}: only_once needs a should_stop_blob (Caffe2: 'not supported')")
        iterations = step.num_iter if step.num_iter is not None else 1
        return lambda i: i < iterations
    if step.num_iter is not None:
        raise PlanError(f"{label}: a step with a should_stop_blob must not set num_iter")
    if step.only_once:
        return lambda i: i == 0
    return _always


def _inject_workspace_id(runner: _Runner, workspace: PlanWorkspace) -> None:
    if not workspace.has_blob("NODE_ID"):
        return
    node_id = int(np.asarray(workspace.get("NODE_ID")).ravel()[0])
    if runner.workspace_seq >= 1 << 16:
        raise PlanError(f"plan '{runner.plan.name}': integer overflow while calculating GLOBAL_WORKSPACE_ID")
    workspace._values["GLOBAL_WORKSPACE_ID"] = jnp.asarray(runner.workspace_seq + (node_id << 16), jnp.int32)
    runner.workspace_seq += 1


class _Reporter:
    """Report nets and `run_every_ms` substeps: run when due between iterations, and once at the end."""

    def __init__(self) -> None:
        self.jobs: list[list[Any]] = []  # [interval in seconds, callable, next due time]

    def add(self, interval: float, job: Callable[[], None]) -> None:
        self.jobs.append([interval, job, time.monotonic() + interval])

    def tick(self) -> None:
        now = time.monotonic()
        for entry in self.jobs:
            if now >= entry[2]:
                entry[1]()
                entry[2] = time.monotonic() + entry[0]

    def finish(self) -> None:
        for _, job, _ in self.jobs:
            job()


def _execute(runner: _Runner, wrapper: _StepWrapper) -> None:
    """Caffe2's ExecuteStepRecursive. Returns when the step is done or its stop blob said stop."""
    compiled = wrapper.compiled()
    step = compiled.step
    reporter = _Reporter()
    if compiled.report_net is not None:
        report_net, workspace = compiled.report_net, compiled.workspace
        reporter.add(step.report_interval or 0, lambda: report_net.run(workspace))
    for report in compiled.reports:
        reporter.add((report.step.run_every_ms or 0) / 1000, lambda report=report: _execute(runner, report))
    frame: list[Any] = [step.name, 0, step]
    runner.stack.append(frame)
    try:
        _iterate(runner, compiled, reporter, frame)
        runner.stack.pop()
    except KeyboardInterrupt as error:
        if isinstance(error, PlanInterrupted):
            raise
        raise PlanInterrupted(runner.where()) from error
    reporter.finish()


def _iterate(runner: _Runner, compiled: _CompiledStep, reporter: _Reporter, frame: list[Any]) -> None:
    step, workspace = compiled.step, compiled.workspace
    should_continue, should_stop = compiled.should_continue, compiled.should_stop
    observer, path = runner.observer, tuple(name for name, _, _ in runner.stack)
    check_stop = step.should_stop_blob is not None
    instances = step.num_concurrent_instances or 1
    sequential = (not step.concurrent_substeps or len(step.substeps) <= 1) and instances <= 1
    iteration = 0
    while should_continue(iteration):
        frame[1] = iteration
        runner.check_interrupt()
        if step.substeps:
            if sequential:
                for substep in compiled.recurring:
                    _execute(runner, substep)
                    if check_stop and should_stop():
                        return
            else:
                _run_concurrently(runner, compiled, instances)
                if check_stop and should_stop():
                    return
        else:
            for executor in compiled.executors:
                runner.running = executor.label
                executor.run(workspace)
                runner.running = ""
                if check_stop and should_stop():
                    return
        iteration += 1
        if reporter.jobs:
            reporter.tick()
        if observer is not None:
            observer(path, iteration, step.num_iter)
        if runner.progress is not None:
            # the outer steps have finished as many iterations as the index of the one under way
            outer = tuple(StepProgress(running, under_way) for _, under_way, running in runner.stack[:-1])
            runner.progress((*outer, StepProgress(step, iteration)))


def _run_concurrently(runner: _Runner, compiled: _CompiledStep, instances: int) -> None:
    """One iteration of concurrent substeps (Caffe2's worker threads): `substeps x instances` threads,
    thread i running substep i mod n; the first failure is raised once every thread has ended."""
    substeps = compiled.recurring
    if not substeps:
        return
    failures: list[BaseException] = []
    finished = threading.Condition()
    done = [0]
    parent = [list(frame) for frame in runner.stack]

    def worker(index: int) -> None:
        runner.enter_thread(parent)
        try:
            if not compiled.failed:
                with caffe2_dtypes():  # JAX's x64 switch is per thread: int64 blobs stay int64 here too
                    _execute(runner, substeps[index % len(substeps)])
        except BaseException as error:  # handed to the step's thread, which raises it
            with finished:
                failures.append(error)
                compiled.failed = True
        finally:
            with finished:
                done[0] += 1
                finished.notify_all()

    count = len(substeps) * instances
    threads = [
        threading.Thread(target=worker, args=(i,), name=f"{compiled.step.name}:{i}", daemon=True) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    try:
        with finished, blocked(lambda: done[0] == count):
            while done[0] < count:
                finished.wait(0.1)
    except KeyboardInterrupt:
        runner.interrupt_requested = True  # the workers stop between iterations
        raise
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def run_plan(
    workspace: PlanWorkspace,
    plan: Plan,
    *,
    should_continue: ShouldContinue | None = None,
    observer: Observer | None = None,
    progress: Progress | None = None,
    defer_interrupt: bool = False,
) -> None:
    """Run `plan` on `workspace` (Caffe2's RunPlanOnWorkspace). `observer` hears of each iteration of each
    step; `progress` of the same, with every running step. With `defer_interrupt` (in the main thread), a
    first Ctrl-C stops the plan between iterations; a second one stops it at once."""
    runner = _Runner(plan, workspace, should_continue or _always, observer, progress)
    if not (defer_interrupt and threading.current_thread() is threading.main_thread()):
        _run_steps(runner, workspace)
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if runner.interrupt_requested:
            raise PlanInterrupted(runner.where())
        runner.interrupt_requested = True

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        _run_steps(runner, workspace)
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_steps(runner: _Runner, workspace: PlanWorkspace) -> None:
    for step in runner.plan.steps:
        _execute(runner, _StepWrapper(runner, step, workspace, runner.should_continue))
