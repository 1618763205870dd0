"""Blocking waits that never hang: how a host op waits, as Caffe2's threads do, for another thread.

Caffe2's queues (`caffe2/queue/blobs_queue.cc`, `rebatching_queue.cc`) wait on a condition variable until
another thread makes room, fills them or closes them, forever when nothing ever does. rnn2jax waits the same
way while something can still end the wait, and refuses the wait that nothing can end, rather than hang:

- A wait with a timeout always waits (it ends by itself) and then fails as Caffe2 does.
- A wait without one goes on while another live Python thread could still act: one that is not itself
  blocked in such a wait (or is, but may now go on). Concurrent plan steps run on threads of their own, and
  the thread that runs their step waits for them as a blocked thread that goes on once they have all ended;
  so a wait is refused when every thread of the process is blocked on another (a deadlock), or when there
  is no other thread at all (a single thread dequeuing from an open empty queue).

This is deadlock detection among the waits rnn2jax knows of. A thread blocked elsewhere (on a lock or a
`join` of its own) counts as one that could still act, so a wait can then last as long as Caffe2's would.
Waits are checked every `SLICE` seconds, so a deadlock is reported within that time.

Threads (concurrent plan steps, the caller's own) run ops at once as Caffe2's do; each op runs whole under
`OP_LOCK` (a jitted segment reads its blobs and writes its results as one step), which gives what Caffe2's
atomic ops and per-op mutexes give (AtomicIter, AtomicFetchAdd, counters, cursors, AtomicAppend never lose an
update), except the ops that wait (`runs_unlocked`: the queues, which lock their own queue) and those that
run the caller's Python, which may itself wait on another thread.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SLICE = 0.05  # seconds between checks of a wait without timeout

OP_LOCK = threading.RLock()  # held while an op (or a jitted segment of ops) runs; see the module's docstring
_UNLOCKED: set[str] = set()


def runs_unlocked(*op_types: str) -> None:
    """These op types run without `OP_LOCK`: they wait on other threads, or run arbitrary Python."""
    _UNLOCKED.update(op_types)


def needs_op_lock(op_type: str) -> bool:
    return op_type not in _UNLOCKED


# thread ident -> whether the wait that blocks the thread may now end (then it goes on: it could act)
_blocked: dict[int, Callable[[], bool]] = {}
_bystanders: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def bystander(thread: threading.Thread) -> threading.Thread:
    """Mark a thread of rnn2jax's own that never ends a wait (a progress display's ticker): it is not counted
    as a thread that could act."""
    _bystanders.add(thread)
    return thread


@contextmanager
def blocked(can_end: Callable[[], bool]) -> Iterator[None]:
    """The calling thread is blocked until `can_end()` (read without locks: a hint) while in this block."""
    me = threading.get_ident()
    _blocked[me] = can_end
    try:
        yield
    finally:
        _blocked.pop(me, None)


def others_can_act() -> bool:
    """Whether a thread other than the caller is alive and not blocked in a wait that cannot yet end."""
    me = threading.get_ident()
    for thread in threading.enumerate():
        ident = thread.ident
        if ident == me or ident is None or not thread.is_alive() or thread in _bystanders:
            continue
        can_end = _blocked.get(ident)
        if can_end is None:
            return True
        try:
            if can_end():
                return True
        except Exception:  # a predicate read mid-update: count the thread as able to act
            return True
    return False


def wait_until(
    condition: threading.Condition,
    done: Callable[[], bool],
    timeout: float | None,
    hopeless: Callable[[], BaseException],
    timed_out: Callable[[], BaseException],
) -> None:
    """With `condition` held, wait until `done()`. Raises `timed_out()` once `timeout` seconds (when given,
    > 0) have passed, and `hopeless()` when no timeout is set and no other thread can act."""
    if done():
        return
    deadline = time.monotonic() + timeout if timeout else None
    with blocked(done):
        while not done():
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise timed_out()
                condition.wait(min(left, SLICE))
                continue
            if not others_can_act():
                raise hopeless()
            condition.wait(SLICE)
