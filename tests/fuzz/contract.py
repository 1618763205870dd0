"""The fuzz target: one input through load -> compile -> run -> verify, holding rnn2jax to its error contract.

An input is a fuzz *container*, a serialized `PlanDef` whose nets are `init` (the parameters, as fills)
and `main` (the net under test). The main net's arguments `fuzz.input.<blob>` say what to feed each input
blob: `ints` are its shape, `s` its dtype. Nothing else of the container is special: both nets reach
rnn2jax as the serialized NetDef bytes a user would hand it. Bytes that are no container (after a byte-level
mutation) go to `rnn2jax.load` as they are.

`exercise` returns the stage an input reached. Success and any `Rnn2JaxError` are fine; any other
exception escapes, which is what the fuzzers and the regression tests catch.

A *silent answer* escapes too (`SilentAnswer`): outputs that depend on memory the net never wrote, where
real Caffe2 returns whatever that memory held. A net with a recurrent op that runs is compiled and run
twice more, with the rows Caffe2 leaves uninitialised (state rows past the initial ones, gradient rows it
does not zero) filled with two different values (`rnn2jax.ops.recurrent.coverage.filling_unwritten`);
an output that differs between the two was answered where rnn2jax should have refused.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from google.protobuf.message import DecodeError

import rnn2jax
from rnn2jax.errors import Rnn2JaxError
from rnn2jax.ops.recurrent.coverage import filling_unwritten
from rnn2jax.proto import caffe2_pb2 as pb

HINT_PREFIX = "fuzz.input."
# The harness itself allocates the inputs it feeds: hints beyond this stay for `verify`, which must refuse
# an absurd shape itself (within its memory budget), but are not fed to the compiled function.
MAX_FED_ELEMENTS = 1 << 16
DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64, "bool": np.bool_}
RECURRENT = {"RecurrentNetwork", "RecurrentNetworkGradient"}
CACHE_DIR = Path(__file__).resolve().parents[2] / ".fuzz-cache"


# The two fills of the silent-answer check: a NaN and a large finite value, so that any dependence shows.
POISONS = (float("nan"), 1.5e11)


class SilentAnswer(AssertionError):
    """Outputs that changed with the value of memory the net never wrote (see the module docstring)."""


@dataclass(frozen=True)
class Hint:
    """What to feed one input blob."""

    shape: tuple[int, ...]
    dtype: str


def enable_compilation_cache(directory: Path = CACHE_DIR) -> None:
    """JAX's persistent compilation cache, for the fuzz drivers: a mutated net mostly compiles to XLA
    programs already seen, and a warm cache makes an execution about five times faster."""
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def container(init: pb.NetDef, main: pb.NetDef, hints: dict[str, Hint]) -> pb.PlanDef:
    """A fuzz container of an init net, a main net and the input hints (written onto a copy of main)."""
    plan = pb.PlanDef(name="fuzz")
    plan.network.add().CopyFrom(init)
    plan.network[0].name = "init"
    net = plan.network.add()
    net.CopyFrom(main)
    net.name = "main"
    for blob, hint in hints.items():
        net.arg.add(name=HINT_PREFIX + blob, ints=hint.shape, s=hint.dtype.encode())
    return plan


def read_container(data: bytes) -> tuple[bytes, bytes, dict[str, Hint]] | None:
    """(init bytes, main bytes, hints) of a container; None for bytes that are not one."""
    try:
        plan = pb.PlanDef.FromString(data)
    except (DecodeError, RecursionError):
        return None
    nets = {net.name: net for net in plan.network}
    if "main" not in nets or "init" not in nets:
        return None
    hints = {}
    for arg in nets["main"].arg:
        if isinstance(arg.name, str) and arg.name.startswith(HINT_PREFIX):  # bytes: a name broken by mutation
            dtype = arg.s.decode("utf-8", "replace")
            hints[arg.name[len(HINT_PREFIX) :]] = Hint(tuple(arg.ints), dtype if dtype in DTYPES else "float32")
    return nets["init"].SerializeToString(), nets["main"].SerializeToString(), hints


def _feedable(hint: Hint) -> bool:
    return all(0 <= d <= MAX_FED_ELEMENTS for d in hint.shape) and np.prod(hint.shape) <= MAX_FED_ELEMENTS


def _draw(hint: Hint, rng: np.random.Generator) -> np.ndarray:
    """Floats near N(0, 1); integers in [0, 4] (lengths, labels, indices: small, sometimes past the end)."""
    dtype = DTYPES[hint.dtype]
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(hint.shape).astype(dtype)
    if dtype is np.bool_:
        return rng.integers(0, 2, hint.shape).astype(bool)
    return rng.integers(0, 5, hint.shape).astype(dtype)


def _nets(loaded: rnn2jax.Net | rnn2jax.Plan) -> Iterator[rnn2jax.Net]:
    yield from loaded.nets.values() if isinstance(loaded, rnn2jax.Plan) else (loaded,)


def _written(net: rnn2jax.Net) -> list[str]:
    """Every blob the net's own ops write (so that `verify` gets each recurrent op's actual inputs)."""
    return list(dict.fromkeys(name for op in net.ops for name in op.outputs))


def _has_recurrent(net: rnn2jax.Net) -> bool:
    return any(op.type in RECURRENT for op in net.walk())


def exercise(data: bytes, verify: bool = True) -> str:
    """Run one fuzz input as far as it goes; return the last stage it passed ("load", "compile", "run",
    "verify") or where rnn2jax refused it ("refused at <stage>"). Anything but an `Rnn2JaxError` escapes."""
    parts = read_container(data)
    if parts is None:
        return _exercise_bytes(data)
    init_bytes, main_bytes, hints = parts
    stage = "load"
    try:
        init, net = rnn2jax.load(init_bytes), rnn2jax.load(main_bytes)
        if isinstance(init, rnn2jax.Plan) or isinstance(net, rnn2jax.Plan):
            return "load"
        stage = "compile"
        fn = rnn2jax.compile(net, init_net=init, outputs=_written(net))
        stage = "run"
        if not all(_feedable(hints[n]) for n in fn.input_names if n in hints):
            values = {}
        else:
            rng = np.random.default_rng(zlib.crc32(data))
            inputs = {name: _draw(hints[name], rng) for name in fn.input_names if name in hints}
            outputs = jax.block_until_ready(fn(inputs))
            values = {**inputs, **{k: v for k, v in outputs.items() if isinstance(v, jax.Array)}}
            if _has_recurrent(net):
                check_no_silent_answer(net, init, inputs)
        if verify and _has_recurrent(net):
            stage = "verify"
            shapes = {n: h.shape for n, h in hints.items() if n not in values}
            rnn2jax.verify(net, shapes=shapes, params=values, init_net=init)
    except Rnn2JaxError:
        return f"refused at {stage}"
    return stage


def check_no_silent_answer(net: rnn2jax.Net, init: rnn2jax.Net, inputs: dict[str, np.ndarray]) -> None:
    """Run the net under both poisons (compiled afresh under each: the fill is traced in); raise
    `SilentAnswer` naming the outputs that differ."""
    answers = []
    for poison in POISONS:
        with filling_unwritten(poison):
            fn = rnn2jax.compile(net, init_net=init, outputs=_written(net))
            outputs = jax.block_until_ready(fn(inputs))
        answers.append({k: np.asarray(v) for k, v in outputs.items() if isinstance(v, jax.Array)})
    differ = [k for k in answers[0] if not _same(answers[0][k], answers[1].get(k))]
    if differ:
        raise SilentAnswer(
            f"{net.where}: outputs {', '.join(differ)} depend on memory the net never wrote (they change with the "
            "fill of the rows Caffe2 leaves uninitialised); rnn2jax should refuse this net"
        )


def _same(a: np.ndarray, b: np.ndarray | None) -> bool:
    if b is None or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _exercise_bytes(data: bytes) -> str:
    """Bytes that are no container: load them, and compile each net found (nothing to feed)."""
    try:
        loaded = rnn2jax.load(data)
    except Rnn2JaxError:
        return "refused at load"
    for net in _nets(loaded):
        try:
            rnn2jax.compile(net)
        except Rnn2JaxError:
            continue
    return "compile"
