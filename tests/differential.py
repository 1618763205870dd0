"""Differential testing against real Caffe2: run the same OperatorDefs in Caffe2 (through the oracle worker)
and in rnn2jax, and assert they agree.

Agreement means: the same output blobs with the same shapes and exactly Caffe2's dtypes; integer, bool and
string outputs exactly equal; float outputs within `rtol` of Caffe2's, measured against the output's own
scale (`|got - want| <= rtol * (|want| + max|want|)`, so an element that cancels to nearly zero is judged
against the magnitudes that produced it). Where Caffe2 refuses an input (an enforce failure), rnn2jax must
raise an `Rnn2JaxError` too.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rnn2jax
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.checking.oracle import Caffe2Error, Caffe2Oracle
from rnn2jax.errors import Rnn2JaxError
from rnn2jax.ir.int8 import Int8Tensor
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower
from rnn2jax.ops.gradient_makers import GradientError, get_gradient_for_op, has_gradient_maker
from rnn2jax.proto import caffe2_pb2 as pb

FLOAT32_RTOL = 1e-5
FLOAT64_RTOL = 1e-10


# ------------------------------------------------------------------------------------------------
# Running in rnn2jax


def run_rnn2jax(
    ops: Sequence[pb.OperatorDef], inputs: Mapping[str, Any], outputs: Iterable[str], *, jit: bool = True
) -> dict[str, np.ndarray]:
    """Run `ops` as one net on `inputs`: through `rnn2jax.compile` under jax.jit, as users do (with the
    run-time checks of traced values), or eagerly with the NumPy arrays themselves, so every input is a
    constant of its own dtype (int64 stays int64, as Caffe2 sees it). Inputs the net does not read are
    left out of the compiled call."""
    outputs = list(outputs)
    net = create_net("differential", list(ops))
    if jit:
        fn = rnn2jax.compile(net, outputs=outputs)
        result = fn({name: _host(inputs[name]) for name in fn.input_names if name in inputs})
    else:
        env = lower(load(net))({name: _host(value) for name, value in inputs.items()}, key=jax.random.key(0))
        result = {name: env[name] for name in outputs}
    return {name: _host(value) for name, value in result.items()}


def _host(value: Any) -> Any:
    """A blob's value as NumPy: an array, or an Int8Tensor with NumPy data."""
    if isinstance(value, Int8Tensor):
        return Int8Tensor(np.asarray(value.data), value.scale, value.zero_point)
    return np.asarray(value)


# ------------------------------------------------------------------------------------------------
# Comparing


def _tolerance(dtype: np.dtype) -> float:
    return FLOAT64_RTOL if dtype == np.float64 else FLOAT32_RTOL


def assert_blob_equal(
    name: str, got: np.ndarray, want: np.ndarray, rtol: float | None = None, atol: float = 0.0
) -> None:
    """One blob of rnn2jax (`got`) against real Caffe2 (`want`). Int8 blobs: the same scale and zero point
    (float32 and int32, as Caffe2 holds them), the data exactly."""
    if isinstance(want, Int8Tensor):
        assert isinstance(got, Int8Tensor), f"{name}: rnn2jax gives {type(got).__name__}, Caffe2 an Int8 tensor"
        assert np.float32(got.scale) == np.float32(want.scale), f"{name}: scale {got.scale}, Caffe2 {want.scale}"
        assert got.zero_point == want.zero_point, f"{name}: zero point {got.zero_point}, Caffe2 {want.zero_point}"
        got, want = np.asarray(got.data), np.asarray(want.data)
    assert got.shape == want.shape, f"{name}: shape {got.shape}, Caffe2 gives {want.shape}"
    if want.dtype.kind in "SOU":
        assert got.dtype.kind in "SOU", f"{name}: dtype {got.dtype}, Caffe2 gives strings"
        np.testing.assert_array_equal(got.astype(bytes), want.astype(bytes), err_msg=name)
        return
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, Caffe2 gives {want.dtype}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=f"{name}: differs from Caffe2")
        return
    rtol = _tolerance(want.dtype) if rtol is None else rtol
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite, err_msg=f"{name}: non-finite elements differ")
    np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=f"{name}: inf/nan differ")
    if not finite.any():
        return
    want_f, got_f = want[finite].astype(np.float64), got[finite].astype(np.float64)
    scale = np.abs(want_f).max()
    error = np.abs(got_f - want_f)
    bound = rtol * (np.abs(want_f) + scale) + max(atol, np.finfo(want.dtype).tiny)
    worst = np.argmax(error - bound)
    assert (error <= bound).all(), (
        f"{name}: max |rnn2jax - Caffe2| = {error.max():.3g} (scale {scale:.3g}, rtol {rtol:g}); "
        f"worst element: rnn2jax {got_f[worst]!r}, Caffe2 {want_f[worst]!r}"
    )


def assert_blobs_equal(
    got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], rtol: float | None = None, atol: float = 0.0
):
    assert set(got) == set(want), f"blobs: rnn2jax {sorted(got)}, Caffe2 {sorted(want)}"
    for name in want:
        assert_blob_equal(name, got[name], want[name], rtol, atol)


def canonical_op(op: pb.OperatorDef) -> bytes:
    """An OperatorDef's bytes with its arguments sorted by name (Caffe2's serialized tests compare so)."""
    copy = pb.OperatorDef()
    copy.CopyFrom(op)
    args = sorted(copy.arg, key=lambda a: a.name)
    del copy.arg[:]
    copy.arg.extend(args)
    return copy.SerializeToString(deterministic=True)


def assert_same_ops(ours: Sequence[pb.OperatorDef], caffe2: Sequence[pb.OperatorDef], what: str = "ops") -> None:
    """Byte-for-byte equal OperatorDefs (arguments compared sorted by name); a text diff otherwise."""
    if [canonical_op(o) for o in ours] == [canonical_op(o) for o in caffe2]:
        return

    def text(ops):
        lines = []
        for op in ops:
            copy = pb.OperatorDef()
            copy.ParseFromString(canonical_op(op))
            lines += [*text_format.MessageToString(copy).splitlines(), "----"]
        return lines

    diff = "\n".join(difflib.unified_diff(text(caffe2), text(ours), "caffe2", "rnn2jax", lineterm="", n=2))
    pytest.fail(f"{what} differ from real Caffe2's:\n{diff}")


# ------------------------------------------------------------------------------------------------
# The checks


def check_op(
    caffe2: Caffe2Oracle,
    op: pb.OperatorDef,
    inputs: Mapping[str, Any],
    *,
    rtol: float | None = None,
    jit: bool = True,
    outputs: Sequence[str] | None = None,
    atol: float = 0.0,
) -> dict[str, np.ndarray] | None:
    """Run `op` in Caffe2 and rnn2jax and assert they agree. Returns Caffe2's outputs, or None when
    Caffe2 refused the input or left an output unset (and rnn2jax refused it too)."""
    outputs = list(op.output) if outputs is None else list(outputs)
    try:
        want = caffe2.run_op(op, inputs, fetch=outputs)
    except Caffe2Error as refusal:
        with pytest.raises(Rnn2JaxError):
            run_rnn2jax([op], inputs, outputs, jit=jit)
            pytest.fail(f"Caffe2 refuses this {op.type} ({str(refusal)[:300]}) but rnn2jax computed it")
        return None
    if set(outputs) - set(want):  # Caffe2's kernel returned early and left outputs unset: no answer to match
        with pytest.raises(Rnn2JaxError):
            run_rnn2jax([op], inputs, outputs, jit=jit)
            pytest.fail(f"Caffe2 leaves {sorted(set(outputs) - set(want))} unset but rnn2jax computed them")
        return None
    got = run_rnn2jax([op], inputs, outputs, jit=jit)
    assert_blobs_equal(got, want, rtol, atol)
    return want


def check_gradient(
    caffe2: Caffe2Oracle,
    op: pb.OperatorDef,
    inputs: Mapping[str, Any],
    *,
    seed: int = 0,
    rtol: float | None = None,
    jit: bool = True,
    with_grads: Sequence[int] | None = None,
    cancels: bool = False,
) -> list[pb.OperatorDef]:
    """The gradient of `op`: the builder's gradient OperatorDefs (where it has a maker for the op) must equal
    Caffe2's byte for byte, and the gradient ops Caffe2 emits must compute the same input gradients in
    rnn2jax as in Caffe2.

    Output gradients are drawn for the outputs in `with_grads` (default: every float output); the
    forward outputs are fed from Caffe2's run, so the gradient ops are checked on their own.

    `cancels`: the input gradient is a difference of nearly equal terms of size |dY| * |Y| (Softmax's
    `Y * (dY - sum(dY * Y))`), so float32 rounding is judged against that size, not the result's.
    """
    forward = caffe2.run_op(op, inputs)
    indices = range(len(op.output)) if with_grads is None else with_grads
    g_output: list[str | None] = [None] * len(op.output)
    for i in indices:
        if forward[op.output[i]].dtype.kind == "f":
            g_output[i] = f"{op.output[i]}_grad"
    try:
        c2_ops, c2_g_input = caffe2.gradient_for_op(op, g_output)
    except Caffe2Error as refusal:  # Caffe2's maker refuses (e.g. BatchMatMul broadcast=1): so must ours
        if has_gradient_maker(op.type):
            with pytest.raises(GradientError):
                get_gradient_for_op(op, g_output)
                pytest.fail(f"Caffe2 builds no gradient for this {op.type} ({str(refusal)[:300]}) but rnn2jax did")
        return []
    if has_gradient_maker(op.type):
        our_ops, our_g_input = get_gradient_for_op(op, g_output)
        assert_same_ops(our_ops, c2_ops, f"gradient ops of {op.type}")
        assert list(our_g_input) == [_gradient_name(g) for g in c2_g_input], "input gradient names differ"

    rng = np.random.default_rng(seed)
    feeds = dict(inputs)
    feeds.update(forward)
    for i, name in enumerate(g_output):
        if name is not None:
            value = forward[op.output[i]]
            feeds[name] = rng.standard_normal(value.shape).astype(value.dtype)
    produced = [name for grad_op in c2_ops for name in grad_op.output]
    try:
        want = caffe2.run([("ops", c2_ops)], feeds, fetch=produced)
    except Caffe2Error as refusal:  # e.g. a gradient op registered for fewer types than its forward op
        with pytest.raises(Rnn2JaxError):
            run_rnn2jax(c2_ops, feeds, produced, jit=jit)
            pytest.fail(f"Caffe2 refuses these gradient ops ({str(refusal)[:300]}) but rnn2jax computed them")
        return c2_ops
    got = run_rnn2jax(c2_ops, feeds, list(want), jit=jit)
    atol = 0.0
    if cancels:
        grads = [np.abs(feeds[n]).max(initial=0.0) for n in g_output if n is not None]
        outputs = [np.abs(forward[n]).max(initial=0.0) for n in op.output if forward[n].dtype.kind == "f"]
        atol = (rtol or _tolerance(np.dtype(np.float32))) * max(grads, default=0.0) * max(outputs, default=0.0)
    assert_blobs_equal(got, want, rtol, atol)
    return c2_ops


def _gradient_name(entry: Any) -> Any:
    if isinstance(entry, dict):
        return (entry["indices"], entry["values"])
    return entry


# ------------------------------------------------------------------------------------------------
# Strategies shaped like Caffe2's hypothesis_test_util


def invalid(data: st.DataObject) -> bool:
    """About one draw in eight is invalid on purpose (Caffe2 must refuse it, and so must rnn2jax)."""
    return data.draw(st.integers(0, 7)) == 0


def make_op(op_type: str, inputs: Sequence[str], outputs: Sequence[str], **args: Any) -> pb.OperatorDef:
    """An OperatorDef with no engine, as the differential cases draw them."""
    op = create_operator(op_type, inputs, outputs, **args)
    op.ClearField("engine")
    return op


def dims(min_value: int = 1, max_value: int = 5) -> st.SearchStrategy[int]:
    return st.integers(min_value=min_value, max_value=max_value)


def shapes(min_dims: int = 1, max_dims: int = 4, min_side: int = 1, max_side: int = 5):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def arrays(shape, dtype=np.float32, low: float = -1.0, high: float = 1.0, **kwargs: Any):
    """Arrays of `shape` (a tuple or a strategy) with elements in [low, high] (Caffe2's default is [-1, 1])."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        # No subnormals, nor values whose products are: XLA's CPU backend flushes them to zero
        # (docs/caffe2-differences.md, Numerics). |x| < 2**-40 is drawn as 0, so a product of three stays normal.
        elements = st.floats(
            low, high, width=dtype.itemsize * 8, allow_nan=False, allow_infinity=False, allow_subnormal=False
        ).map(lambda v: v if abs(v) >= 2.0**-40 else 0.0)
    elif dtype.kind == "b":
        elements = st.booleans()
    else:
        elements = st.integers(int(low), int(high))
    return hnp.arrays(dtype, shape, elements=elements, **kwargs)


def tensor(min_dims: int = 1, max_dims: int = 4, dtype=np.float32, **kwargs: Any):
    return arrays(shapes(min_dims, max_dims), dtype, **kwargs)


# ------------------------------------------------------------------------------------------------
# Cases: one per op type, read by the family tests and by the scoreboard (docs/ops.md)


@dataclass(frozen=True)
class Case:
    """The differential test of one op type: `draw(data)` returns the OperatorDef and its input arrays.

    `gradient_ops` lists the gradient op types Caffe2's maker emits for it (the test asserts that list, and
    checks those ops against Caffe2 too); empty means the forward op only. `jit=False` runs rnn2jax eagerly,
    for ops whose output shape depends on an input's values."""

    op_type: str
    draw: Callable[[st.DataObject], tuple[pb.OperatorDef, dict[str, np.ndarray]]]
    gradient_ops: tuple[str, ...] = ()
    jit: bool = True
    rtol: float | None = None
    note: str = ""
    gradient_cancels: bool = False  # see check_gradient's `cancels`
    # The output is a sum of terms that may cancel (ReduceSum/Mean of mixed signs): float32 rounding is
    # judged against the inputs' magnitude, as for gradient_cancels.
    forward_cancels: bool = False


def cases(*items: Case) -> dict[str, Case]:
    table = {}
    for case in items:
        assert case.op_type not in table, f"two cases for {case.op_type}"
        table[case.op_type] = case
    return table


def run_case(caffe2: Caffe2Oracle, case: Case, data: st.DataObject, seed: int = 0) -> None:
    """Forward against Caffe2 and, for cases with gradient ops, the gradient too."""
    op, inputs = case.draw(data)
    # a type Caffe2 has only under an engine is keyed by its operator key (Quantize_ENGINE_DNNLOWP)
    assert case.op_type in (op.type, f"{op.type}_ENGINE_{op.engine}"), (op.type, op.engine, case.op_type)
    atol = 0.0
    if case.forward_cancels:
        floats = [np.abs(v).max(initial=0.0) for v in inputs.values() if np.asarray(v).dtype.kind == "f"]
        atol = (case.rtol or FLOAT32_RTOL) * max(floats, default=0.0)
    want = check_op(caffe2, op, inputs, rtol=case.rtol, jit=case.jit, atol=atol)
    # Gradients need a float output to flow back from (Caffe2's makers refuse an op without any).
    if case.gradient_ops and want is not None and any(v.dtype.kind == "f" for v in want.values()):
        grad_ops = check_gradient(
            caffe2, op, inputs, seed=seed, rtol=case.rtol, jit=case.jit, cancels=case.gradient_cancels
        )
        emitted = {g.type for g in grad_ops}
        assert emitted <= set(case.gradient_ops), f"Caffe2 emits {sorted(emitted)} for {op.type}"
