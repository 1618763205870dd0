"""Start several processes at once (the shards of a run across hosts, on this machine), bounded in time.

Each process is started in its own session, and when the time is up every one still running is killed with
its children, so a rendezvous that never completes fails its test instead of hanging the suite.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_together(
    commands: Sequence[Sequence[str]],
    timeout: float,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """Run `commands` at the same time; their results once all have exited. Past `timeout` seconds, kill
    every process left (and its children) and raise AssertionError with what each printed."""
    with ExitStack() as stack:
        # Output goes to files, not pipes: a process blocked on a full pipe would stall the others' collectives.
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        files = [
            (stack.enter_context(open(folder / f"{i}.out", "w+")), stack.enter_context(open(folder / f"{i}.err", "w+")))
            for i in range(len(commands))
        ]
        procs = []
        for command, (out, err) in zip(commands, files, strict=True):
            procs.append(
                subprocess.Popen(
                    list(command),
                    cwd=cwd,
                    env=dict(env) if env is not None else None,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout
        try:
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
        finally:
            late = [proc for proc in procs if proc.poll() is None]
            for proc in late:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        results = []
        for proc, (out, err) in zip(procs, files, strict=True):
            out.seek(0)
            err.seek(0)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()))
    if late:
        report = "\n".join(f"{r.args}:\nstdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-2000:]}" for r in results)
        raise AssertionError(f"{len(late)} process(es) did not finish within {timeout:g} s, killed:\n{report}")
    return results
