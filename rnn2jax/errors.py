"""The exception hierarchy: every error rnn2jax raises on purpose is an `Rnn2JaxError`.

Messages say where the problem is (net, op index and type, blob or argument) because the nets users
bring are large, machine-written and often years old: "KeyError: 'x'" would leave them searching.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Advice:
    """What to do about an error, said once for each audience that meets it: `python` in the API's words
    (`db_root=DIR`, `shapes={...}`), `command_line` in the flags' (`--db-root DIR`, `--shape BLOB=...`).
    The same error reaches both, so it carries both; `separator` joins the advice to the message."""

    python: str
    command_line: str
    separator: str = "; "


class Rnn2JaxError(Exception):
    """Base class of every error rnn2jax raises for bad input or unsupported content.

    An error may carry `advice`: `str(error)` ends with its Python form, `for_command_line()` (what the
    `rnn2jax` command prints) with its command-line form."""

    advice: Advice | None = None

    def __init__(self, *args: object, advice: Advice | None = None):
        super().__init__(*args)
        if advice is not None:
            self.advice = advice

    def __str__(self) -> str:
        return self._said("python")

    def for_command_line(self) -> str:
        """The message with the advice in flags, for the command line's error printer."""
        return self._said("command_line")

    def _said(self, audience: str) -> str:
        text = BaseException.__str__(self)  # never KeyError's, which would repr() the message
        if self.advice is None:
            return text
        return f"{text}{self.advice.separator}{getattr(self.advice, audience)}"


class ParseError(Rnn2JaxError):
    """The bytes or text are not a readable Caffe2 NetDef/PlanDef."""


class UnsupportedOpError(Rnn2JaxError):
    """One or more op types have no lowering; `unsupported` lists (location, op type) pairs."""

    def __init__(self, message: str, unsupported: tuple[tuple[str, str], ...] = (), *, advice: Advice | None = None):
        super().__init__(message, advice=advice)
        self.unsupported = unsupported


class MissingBlobError(Rnn2JaxError, KeyError):
    """A blob is read before anything writes it, or an input the net needs was not given."""


class BadArgumentError(Rnn2JaxError, ValueError):
    """An op argument is missing, of the wrong type, or out of range."""


class ShapeError(Rnn2JaxError, ValueError):
    """Input arrays do not fit an op (ranks, sizes or dtypes)."""


class UnwrittenStateError(BadArgumentError):
    """A RecurrentNetwork would read or return recurrent-state rows that no step writes: real Caffe2 gives
    whatever that memory held (its state tensors are not zeroed past the initial rows), so the net has no
    defined answer. Names the op, the step op or output, the link or alias argument and the state."""


class InputTypeError(Rnn2JaxError, TypeError):
    """A Python value of the wrong type was passed to the API (inputs that are not a mapping of arrays,
    `params=` that is neither a mapping nor a path, blob names that are not str)."""


class ResourceError(Rnn2JaxError, MemoryError):
    """An array would take more memory than the budget (`rnn2jax.set_memory_budget`, $RNN2JAX_MEMORY_BUDGET),
    or XLA ran out of memory (RESOURCE_EXHAUSTED). `size` and `budget` are in bytes when known."""

    def __init__(self, message: str, size: int | None = None, budget: int | None = None):
        super().__init__(message)
        self.size = size
        self.budget = budget


class PlanError(Rnn2JaxError):
    """A PlanDef that Caffe2's plan executor refuses: an execution step naming a net the plan lacks, with
    both nets and substeps, a `should_stop_blob` that does not exist or is not a bool scalar, and so on."""


class StorageError(Rnn2JaxError):
    """A Caffe2 database cannot be read or written: an unknown db_type, a missing optional extra, a missing,
    corrupt or truncated DB, a blob that is absent, incomplete (missing chunks) or of a type rnn2jax cannot
    read (QTensor, other C++ blobs), or a failed write (the old DB is then left as it was)."""


class WorkspaceError(Rnn2JaxError):
    """A workspace has no net of that name, or already has one (create_net without overwrite=True)."""


class OpFailedError(WorkspaceError):
    """An op's run returned false, as Caffe2's Fail does and a closed queue's enqueue or dequeue: the net fails
    without an exception of its own, which Caffe2's `RunNet(..., allow_fail=True)` answers with False."""


class DistributedError(Rnn2JaxError):
    """The processes of a run across hosts cannot meet or work together: the rendezvous store timed out or
    holds an earlier run's keys, JAX's multi-process runtime cannot start (its backend already started, a
    process count or index that disagrees with the rendezvous), or a collective op was not given a common
    world."""


class RegistrationError(Rnn2JaxError, ValueError):
    """A user op cannot be registered: its type is taken (pass override=True), or its definition is wrong."""
