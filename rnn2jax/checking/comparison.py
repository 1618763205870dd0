"""`rnn2jax compare`: run one net in rnn2jax and in real Caffe2 on the same parameters and inputs, and say,
blob by blob, whether they agree.

Real Caffe2 never enters this process: it runs in its own Python 3.9 interpreter behind a `Caffe2Oracle`.
Both sides get the same arrays: parameters from the init net (run by rnn2jax, then fed to Caffe2, which
runs the init net first only to make the blobs that are not tensors, such as mutexes) and from an `.npz`
file, inputs from files or drawn at random. Ops that read files or databases (`Load`, `CreateDB`,
`TensorProtosDBInput`, ...) are left out of both nets: what they would write must be given. Every blob the
net writes that both sides can fetch is compared (the external outputs first); a training net's gradients
and updated parameters are among them. Floats agree within `rtol` of the blob's own scale
(`|ours - caffe2| <= rtol * (|caffe2| + max|caffe2|)`), integers, bools and strings exactly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
import numpy as np

from ..compiler.compiled_net import CompiledNet, compile, run_init_net
from ..errors import Advice, BadArgumentError, MissingBlobError
from ..ir.budget import check_array
from ..ir.loader import load
from ..ir.netdef import Net
from ..ir.wire import read_message
from ..ops.roles import length_blobs
from ..proto import caffe2_pb2 as pb
from ..runtime.params import EXTERNAL_STORAGE_OPS
from .input_rule import filled_inputs
from .oracle.session import caffe2_refused, open_oracle
from .table import text_table

RTOL = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-10}


@dataclass(frozen=True)
class BlobComparison:
    """One blob: rnn2jax's value against Caffe2's. `max_rel` is the largest error relative to the scale of
    Caffe2's blob (its largest magnitude)."""

    blob: str
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


@dataclass
class ComparisonReport:
    net: str
    blobs: list[BlobComparison] = field(default_factory=list)
    not_compared: dict[str, str] = field(default_factory=dict)  # blob -> why
    left_out: list[str] = field(default_factory=list)  # ops that read external storage
    caffe2: dict[str, str] = field(default_factory=dict)  # versions of the Caffe2 side

    @property
    def ok(self) -> bool:
        return bool(self.blobs) and all(b.ok for b in self.blobs)

    @property
    def failed(self) -> list[BlobComparison]:
        return [b for b in self.blobs if not b.ok]

    def to_json(self) -> str:
        return json.dumps({"ok": self.ok, **asdict(self)}, indent=2)

    def __str__(self) -> str:
        rows = [("blob", "shape", "dtype", "max abs err", "max rel err", "ok")]
        for b in self.blobs:
            verdict = "ok" if b.ok else "MISMATCH" + (f" ({b.note})" if b.note else "")
            rows.append((b.blob, str(list(b.shape)), b.dtype, f"{b.max_abs:.2e}", f"{b.max_rel:.2e}", verdict))
        lines = text_table(rows, gap=" ")
        for op in self.left_out:
            lines.append(f"left out (reads external storage): {op}")
        for blob, why in self.not_compared.items():
            lines.append(f"not compared: {blob} ({why})")
        if self.caffe2:
            lines.append("real Caffe2: " + ", ".join(f"{k} {v}" for k, v in self.caffe2.items()))
        if not self.blobs:
            lines.append(f"no blob of net '{self.net}' could be fetched from both rnn2jax and real Caffe2")
        elif self.ok:
            lines.append(f"all {len(self.blobs)} blobs of net '{self.net}' agree with real Caffe2")
        else:
            names = ", ".join(b.blob for b in self.failed)
            count = f"{len(self.failed)} of {len(self.blobs)} blobs"
            lines.append(f"{count} of net '{self.net}' differ from real Caffe2: {names}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Comparing two arrays


def compare_blob(name: str, ours: Any, theirs: np.ndarray, rtol: float | None = None) -> BlobComparison:
    """rnn2jax's value of one blob against Caffe2's."""
    ours = np.asarray(ours)
    shape = tuple(int(d) for d in theirs.shape)

    def result(max_abs: float, max_rel: float, ok: bool, note: str = "") -> BlobComparison:
        return BlobComparison(name, shape, str(theirs.dtype), max_abs, max_rel, ok, note)

    if ours.shape != theirs.shape:
        return result(float("inf"), float("inf"), False, f"rnn2jax gives shape {list(ours.shape)}")
    if theirs.dtype.kind in "SUO":
        if ours.dtype.kind not in "SUO":
            return result(float("inf"), float("inf"), False, f"rnn2jax gives {ours.dtype}")
        same = bool(np.array_equal(ours.astype(bytes), theirs.astype(bytes)))
        return result(0.0 if same else float("inf"), 0.0 if same else float("inf"), same)
    if ours.dtype != theirs.dtype:
        return result(float("inf"), float("inf"), False, f"rnn2jax gives {ours.dtype}")
    if theirs.dtype.kind in "biu" or ours.size == 0:
        diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64)) if ours.size else np.zeros(0)
        max_abs = float(diff.max(initial=0.0))
        scale = float(np.abs(theirs.astype(np.float64)).max(initial=0.0))
        return result(max_abs, max_abs / scale if scale else max_abs, max_abs == 0.0)
    rtol = RTOL.get(str(theirs.dtype), 1e-5) if rtol is None else rtol
    finite = np.isfinite(theirs)
    if not np.array_equal(np.isfinite(ours), finite) or not np.array_equal(ours[~finite], theirs[~finite]):
        return result(float("inf"), float("inf"), False, "inf/nan differ")
    if not finite.any():
        return result(0.0, 0.0, True)
    want, got = theirs[finite].astype(np.float64), ours[finite].astype(np.float64)
    scale = float(np.abs(want).max())
    error = np.abs(got - want)
    bound = rtol * (np.abs(want) + scale) + np.finfo(theirs.dtype).tiny
    max_abs = float(error.max())
    return result(max_abs, max_abs / scale if scale else max_abs, bool((error <= bound).all()))


# ------------------------------------------------------------------------------------------------
# Nets as messages (what Caffe2 gets) and as rnn2jax's IR


def pick_net(message: pb.NetDef | pb.PlanDef, net_name: str | None, what: str = "net") -> pb.NetDef:
    """The NetDef itself, or the plan's net named `net_name`."""
    if isinstance(message, pb.NetDef):
        if net_name is not None and net_name != message.name:
            raise BadArgumentError(
                f"no net '{net_name}' to pick: the {what} is a NetDef ('{message.name}'), not a plan"
            )
        return message
    names = [n.name for n in message.network]
    if net_name is None:
        raise BadArgumentError(
            f"plan '{message.name}' holds several nets",
            advice=Advice(
                f"pick one with net_name=NAME (one of: {', '.join(names)}); Workspace.run_plan runs whole plans",
                f"pick one with --net NAME (one of: {', '.join(names)}); `rnn2jax run-plan` runs whole plans",
            ),
        )
    for net in message.network:
        if net.name == net_name:
            return net
    raise BadArgumentError(f"plan '{message.name}' has no net '{net_name}'; its nets are: {', '.join(names)}")


def without_storage_ops(net: pb.NetDef) -> tuple[pb.NetDef, list[str]]:
    """The net less the ops that read files or databases (their outputs become inputs), and those ops."""
    kept = [op for op in net.op if op.type not in EXTERNAL_STORAGE_OPS]
    if len(kept) == len(net.op):
        return net, []
    copy = pb.NetDef()
    copy.CopyFrom(net)
    del copy.op[:]
    copy.op.extend(kept)
    dropped = []
    for index, op in enumerate(net.op):
        if op.type in EXTERNAL_STORAGE_OPS:
            dropped.append(f"net '{net.name}' op #{index} ({op.type}) -> {', '.join(op.output) or '(nothing)'}")
    return copy, dropped


def _ir_without_storage_ops(net: pb.NetDef) -> Net:
    loaded = load(net)
    assert isinstance(loaded, Net)
    ops = tuple(op for op in loaded.ops if op.type not in EXTERNAL_STORAGE_OPS)
    return Net(loaded.name, ops, loaded.external_inputs, loaded.external_outputs, where=loaded.where)


def _declare_inputs(net: pb.NetDef, names: Sequence[str]) -> pb.NetDef:
    """A copy that lists `names` among its external inputs (Caffe2 refuses to read undeclared blobs)."""
    copy = pb.NetDef()
    copy.CopyFrom(net)
    copy.external_input.extend(n for n in names if n not in copy.external_input)
    return copy


# ------------------------------------------------------------------------------------------------
# Inputs


def sequence_length_blobs(net: Net) -> set[str]:
    """Blobs the net (step nets included) uses as sequence lengths: int32 in [0, T]; a RecurrentNetwork's
    inputs named like lengths too (the ops that read them may sit in its step net under another name)."""
    names = length_blobs(net)
    for op in net.walk():
        if op.type == "RecurrentNetwork":
            names.update(n for n in op.inputs if "seq_len" in n or n.endswith("lengths"))
    return names


def draw_inputs(
    fn: CompiledNet,
    given: Mapping[str, Any],
    shapes: Mapping[str, Sequence[int]],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The net's inputs: given ones as they are, the rest drawn with their `shapes` (floats from a normal
    distribution; sequence lengths in [0, T], T being the first dimension of the first 3-D input)."""
    unknown = [n for n in (*given, *shapes) if n not in fn.input_names and n not in fn.params]
    if unknown:
        raise MissingBlobError(
            f"{fn.net.where}: {', '.join(dict.fromkeys(unknown))} are not inputs of the net; "
            f"its inputs are: {', '.join(fn.input_names) or '(none)'}"
        )
    missing = [n for n in fn.input_names if n not in given and n not in shapes]
    if missing:
        readers = "; ".join(f"'{n}' is read by {fn.first_reader[n].where}" for n in missing)
        shapes = ", ".join(f"{n!r}: (D0, D1, ...)" for n in missing)
        flags = " ".join(f"--shape {n}=D0,D1,..." for n in missing)
        raise MissingBlobError(
            f"{fn.net.where}: no value for input(s) {', '.join(missing)} ({readers})",
            advice=Advice(
                f"give them with inputs= or their shapes with shapes={{{shapes}}}",
                f"give them with --input/--inputs or their shapes with {flags}",
            ),
        )
    lengths = sequence_length_blobs(fn.net)
    dims = [tuple(np.shape(given[n])) if n in given else tuple(shapes[n]) for n in fn.input_names]
    steps = next((d[0] for d in dims if len(d) >= 3), 1)
    for name in fn.input_names:
        if name not in given:
            dtype = np.int32 if name in lengths else np.float32
            check_array(fn.first_reader[name].where, name, tuple(shapes[name]), dtype)
    inputs: dict[str, np.ndarray] = {}
    for name in fn.input_names:
        if name in given:
            inputs[name] = np.asarray(given[name])
        elif name in lengths:
            inputs[name] = rng.integers(0, steps + 1, size=tuple(shapes[name])).astype(np.int32)
        else:
            inputs[name] = (rng.standard_normal(tuple(shapes[name])) * 0.5).astype(np.float32)
    return inputs


# ------------------------------------------------------------------------------------------------
# The oracle


# ------------------------------------------------------------------------------------------------
# The comparison


def _is_array(value: Any) -> bool:
    return isinstance(value, jax.Array | np.ndarray | np.generic)


def compare(
    net: Any,
    *,
    init_net: Any = None,
    params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    net_name: str | None = None,
    caffe2: Any = None,
    rtol: float | None = None,
    batch: int | None = None,
    steps: int | None = None,
    db_root: str | os.PathLike | None = None,
) -> ComparisonReport:
    """Run `net` in rnn2jax and in real Caffe2 on the same parameters and inputs; compare every blob it writes.

    `net` is a path, bytes, text or message (NetDef, or PlanDef with `net_name`); `init_net` is one too, or
    the name of another net of the same plan. `params` and `inputs` map blob names to arrays; inputs not
    given are drawn from `shapes`; with `batch` (N) and/or `steps` (T), the shapes not given are inferred
    (`rnn2jax.checking.shape_inference`). `caffe2` is a `Caffe2Oracle`, the Python 3.9 interpreter of a Caffe2 venv,
    or None for $RNN2JAX_CAFFE2_PYTHON (else the venv `rnn2jax setup-caffe2` made at its default place).
    Ops that read files or databases are left out of both runs, and what they write must be given; with
    `db_root`, the init net's readers (Load) run in rnn2jax, reading their databases under it, and what they
    load is given to Caffe2 too.
    """
    from .oracle import Caffe2Error, OracleCrashedError

    message = read_message(net)
    full = pick_net(message, net_name)
    netdef, left_out = without_storage_ops(full)
    init_def = None
    if init_net is not None:
        if (
            isinstance(message, pb.PlanDef)
            and isinstance(init_net, str)
            and init_net in {n.name for n in message.network}
        ):
            init_def = pick_net(message, init_net, "plan")
        else:
            init_def = pick_net(read_message(init_net, "init net"), None, "init net")
        init_ir = load(init_def) if db_root is not None else _ir_without_storage_ops(init_def)
        init_def, dropped = without_storage_ops(init_def)
        left_out += dropped
    ir = _ir_without_storage_ops(full)  # ops keep their index in the file, for messages

    values: dict[str, Any] = dict(run_init_net(init_ir, seed, db_root)) if init_def is not None else {}
    values.update({k: np.asarray(v) for k, v in (params or {}).items()})
    skip = {op.outputs[-1] for op in ir.ops if op.type == "RecurrentNetwork"}  # step workspaces: not tensors
    written = [n for n in dict.fromkeys(n for op in ir.ops for n in op.outputs) if n not in skip]
    order = [n for n in ir.external_outputs if n in written] + [n for n in written if n not in ir.external_outputs]
    named = filled_inputs(ir, values, named=inputs or {}, shapes=shapes, batch=batch, steps=steps) if values else ()
    fn = compile(ir, params=values, outputs=order, inputs=named)
    mutexes = [n for n in fn.input_names if fn.first_reader[n].type == "AtomicIter" and n not in (inputs or {})]
    if mutexes:  # a training net without the init net that made its mutex: make one on both sides
        made = pb.NetDef(name="mutexes", op=[pb.OperatorDef(type="CreateMutex", name="", output=[m]) for m in mutexes])
        values.update(run_init_net(load(made), seed))
        init_def = made if init_def is None else _merged(init_def, made)
        fn = compile(ir, params=values, outputs=order, inputs=named)
    shapes = dict(shapes or {})
    drawn = set(shapes)  # inputs drawn at random: the shapes given, and those batch/steps decide
    if batch is not None or steps is not None:
        from .shape_inference import infer_shapes

        given = {n: np.asarray(v) for n, v in (inputs or {}).items() if n in fn.input_names}
        found = infer_shapes(
            fn.net,
            fn.params,
            {**{n: v.shape for n, v in given.items()}, **shapes},
            batch=batch,
            steps=steps,
            dtypes={n: v.dtype.name for n, v in given.items()},  # a given input keeps its dtype (int32 labels)
            defaults=fn.defaults,
        )
        found.require_all()
        drawn.update(found.replaced)
        shapes = {**{n: s.shape for n, s in found.inputs.items()}, **shapes}
    # an input the init net filled keeps that value unless it is drawn, or given (--input)
    defaults = {n: v for n, v in fn.defaults.items() if n not in drawn}
    feeds = draw_inputs(fn, {**defaults, **(inputs or {})}, shapes, np.random.default_rng(seed))

    oracle, owned = open_oracle(caffe2)
    try:
        report = ComparisonReport(netdef.name or "(unnamed)", left_out=left_out, caffe2=oracle.catalog().versions)
        try:
            made_by_caffe2: dict[str, np.ndarray] = {}
            if init_def is not None:
                made_by_caffe2 = oracle.run([("net", init_def)], {}, None, workspace="compare")
            opaque = {name for op in init_def.op for name in op.output} - set(made_by_caffe2) if init_def else set()
            fed = {}
            for name, value in {**values, **feeds}.items():
                if name in opaque or not _is_array(value):
                    continue  # a mutex: Caffe2 keeps the one its init net made
                value = np.asarray(value)
                fed[name] = value
            reads = list(fn.first_reader)
            theirs = oracle.run(
                [("net", _declare_inputs(netdef, reads))],
                fed,
                order,
                workspace="compare",
                reset=init_def is None,
            )
        except Caffe2Error as error:
            raise caffe2_refused(error, f"net '{netdef.name}'") from None
        except OracleCrashedError as error:
            raise caffe2_refused(error, f"net '{netdef.name}' (the Caffe2 worker crashed)") from None
    finally:
        if owned:
            oracle.close()

    ours = fn(feeds)
    for name in order:
        mine = ours.get(name)
        if name not in theirs:
            report.not_compared[name] = "Caffe2 cannot fetch it (not a tensor)"
        elif not _is_array(mine):
            report.not_compared[name] = "not an array in rnn2jax"
        else:
            report.blobs.append(compare_blob(name, mine, theirs[name], rtol))
    for name in skip:
        report.not_compared[name] = "a RecurrentNetwork's step workspaces, not a tensor"
    return report


def _merged(first: pb.NetDef, second: pb.NetDef) -> pb.NetDef:
    merged = pb.NetDef()
    merged.CopyFrom(first)
    merged.op.extend(second.op)
    return merged
