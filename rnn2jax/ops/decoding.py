"""Sequence decoders: CTC's greedy and prefix beam search decoders, and the CRF's Viterbi path.

The CTC decoders' output sizes are the decoded lengths, which depend on the scores' values: both inputs
are static (registry `static_inputs`), and the kernels are NumPy run on the concrete arrays, in float32
step by step as Caffe2's C++ loops are (caffe2/operators/ctc_greedy_decoder_op.cc,
ctc_beam_search_decoder_op.cc). ViterbiPath and SwapBestPath (crf_viterbi_op.cc) have static shapes and
are `jax.numpy` code: a scan over the steps, then a scan back along the backpointers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import BadArgumentError, ShapeError
from ..ir.netdef import Op
from .checks import enforce, first_bad, literal, runtime_checked
from .facets import NO_EMITTER, NO_ROLES, NO_SHAPE_RULE, Roles
from .gradient_makers import no_gradient, should_not_do_gradient
from .registry import Kernel, declare_family, register

declare_family(__name__, roles=NO_ROLES, shape_rule=NO_SHAPE_RULE, emitter=NO_EMITTER)

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)


def _shape_text(x: Any) -> str:
    return f"{np.dtype(x.dtype)}{list(np.shape(x))}"


def _check_dtype(op: Op, index: int, x: Any, dtype: np.dtype, what: str) -> None:
    """Caffe2 reads these inputs with `data<float>()` / `data<int>()`, which refuse any other dtype."""
    if np.dtype(x.dtype) != dtype:
        raise ShapeError(f"{op.where}: {what} '{op.inputs[index]}' must be {dtype}, got {_shape_text(x)}")


def _concrete(op: Op, index: int, x: Any, what: str) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise ShapeError(
            f"{op.where}: {what} '{op.inputs[index]}' decides the size of the decoded output, so its values must "
            "be known when the net is traced; feed it as a constant or a static input, not a traced value"
        )
    return np.asarray(x)


# --------------------------------------------------------------------------------------------------
# CTC decoders


def _ctc_inputs(op: Op, inputs: Any, seq_len: Any | None) -> tuple[np.ndarray, np.ndarray]:
    """(INPUTS [T, B, C] float32, SEQ_LEN [B] int32, or T for every item when absent), concrete."""
    scores = _concrete(op, 0, inputs, "INPUTS")
    if scores.ndim != 3:
        raise ShapeError(
            f"{op.where}: INPUTS '{op.inputs[0]}' must be 3-D [max_time, batch, classes], got {_shape_text(scores)}"
        )
    steps, batch, classes = scores.shape
    if seq_len is None:
        lengths = np.full(batch, steps, np.int64)
    else:
        _check_dtype(op, 1, seq_len, _I32, "SEQ_LEN")
        lengths = _concrete(op, 1, seq_len, "SEQ_LEN").reshape(-1)
        if lengths.size < batch:  # Caffe2 reads past the end of the blob
            raise ShapeError(f"{op.where}: SEQ_LEN '{op.inputs[1]}' has {lengths.size} lengths for a batch of {batch}")
        lengths = lengths[:batch].astype(np.int64)
        if (lengths > steps).any():
            raise ShapeError(
                f"{op.where}: SEQ_LEN '{op.inputs[1]}' holds length {int(lengths.max())}, more than max_time {steps}"
            )
    if (lengths > 0).any():  # Caffe2 reads the scores (as float) only for a step it decodes
        _check_dtype(op, 0, inputs, _F32, "INPUTS")
        if classes == 0:
            raise ShapeError(f"{op.where}: INPUTS '{op.inputs[0]}' has no classes ({_shape_text(scores)})")
    return scores, lengths


def _first_max(rows: np.ndarray) -> np.ndarray:
    """`std::max_element` along the last axis: the first largest; a NaN first element wins, later NaNs lose."""
    cleaned = np.where(np.isnan(rows), -np.inf, rows)
    best = np.argmax(cleaned, axis=-1)
    return np.where(np.isnan(rows[..., 0]), 0, best)


@register(
    "CTCGreedyDecoder",
    inputs=(1, 2),
    outputs=2,
    static_inputs=(0, 1),
    roles=Roles(lengths=(1,)),
    gradient=should_not_do_gradient,
)
def ctc_greedy_decoder(op: Op) -> Kernel:
    """(INPUTS [T, B, C], SEQ_LEN [B]) -> (OUTPUT_LEN [B] int32, VALUES int32): per item, the best class
    of each of its steps, blanks (class 0) dropped and, with `merge_repeated` (default true), repeats of
    the previous step's class merged. A negative length decodes nothing, as Caffe2's loop does."""
    merge = op.bool("merge_repeated", True)

    def kernel(inputs, *seq_len):
        scores, lengths = _ctc_inputs(op, inputs, seq_len[0] if seq_len else None)
        out_len = np.zeros(scores.shape[1], np.int32)
        values: list[np.ndarray] = []
        for i, length in enumerate(lengths.tolist()):
            labels = _first_max(scores[: max(length, 0), i, :]) if length > 0 else np.zeros(0, np.int64)
            keep = labels != 0
            if merge:
                keep &= labels != np.concatenate([[0], labels[:-1]])
            out_len[i] = int(keep.sum())
            values.append(labels[keep])
        decoded = np.concatenate(values) if values else np.zeros(0)
        return jnp.asarray(out_len), jnp.asarray(decoded.astype(np.int32))

    return kernel


_Prefix = tuple[int, ...]


def _beam_search(ctc: np.ndarray, beam_width: int, threshold: np.float32) -> list[tuple[_Prefix, np.float32]]:
    """Caffe2's prefix beam search over one item's steps `ctc` [t, C], in its float32 arithmetic and order
    (prefixes visited in lexicographic order, classes in ascending order). Returns the last step's
    prefixes with their probabilities, best first, ties in lexicographic order (empty for no steps)."""
    zero = np.float32(0)
    prev_b: dict[_Prefix, np.float32] = {(): np.float32(1)}
    prev_nb: dict[_Prefix, np.float32] = {(): zero}
    beam: list[_Prefix] = [()]
    ranked: list[tuple[_Prefix, np.float32]] = []
    for row in ctc:
        pruned = np.flatnonzero(row > threshold)
        if pruned.size == 0:
            pruned = np.arange(row.size)
        labels = [int(c) for c in pruned if c != 0]
        has_blank = pruned.size > 0 and pruned[0] == 0
        probs = [row[c] for c in labels]
        blank = row[0]
        in_beam = set(beam)
        next_b: dict[_Prefix, np.float32] = {}
        next_nb: dict[_Prefix, np.float32] = {}
        for prefix in beam:  # sorted: std::set's order
            p_b, p_nb = prev_b.get(prefix, zero), prev_nb.get(prefix, zero)
            total = p_b + p_nb
            if has_blank:
                next_b[prefix] = next_b.get(prefix, zero) + blank * total
            last = prefix[-1] if prefix else None
            for c, p in zip(labels, probs, strict=True):
                extended = (*prefix, c)
                if c == last:
                    next_nb[extended] = next_nb.get(extended, zero) + p * p_b
                    next_nb[prefix] = next_nb.get(prefix, zero) + p * p_nb
                else:
                    next_nb[extended] = next_nb.get(extended, zero) + p * total
                if extended not in in_beam:
                    e_b, e_nb = prev_b.get(extended, zero), prev_nb.get(extended, zero)
                    next_b[extended] = next_b.get(extended, zero) + blank * (e_b + e_nb)
                    next_nb[extended] = next_nb.get(extended, zero) + p * e_nb
        merged = dict(next_b)
        for prefix, p in next_nb.items():
            merged[prefix] = merged.get(prefix, zero) + p
        keys = sorted(merged)  # std::map's order, which the multimap keeps among equal probabilities
        scores = np.array([merged[k] for k in keys], np.float32)
        order = np.argsort(-scores, kind="stable")
        ranked = [(keys[j], scores[j]) for j in order]
        beam = sorted(k for k, _ in ranked[: max(beam_width, 0)])
        prev_b, prev_nb = next_b, next_nb
    return ranked


@register(
    "CTCBeamSearchDecoder",
    inputs=(1, 2),
    outputs=(2, 3),
    static_inputs=(0, 1),
    roles=Roles(lengths=(1,)),
    gradient=should_not_do_gradient,
)
def ctc_beam_search_decoder(op: Op) -> Kernel:
    """(INPUTS [T, B, C], SEQ_LEN [B]) -> (OUTPUT_LEN [B * num_candidates] int32, VALUES int32,
    OUTPUT_PROB [B * num_candidates] float32): per item, the `num_candidates` (default 1) best prefixes
    of a prefix beam search keeping `beam_width` (10) prefixes, classes at or below `prune_threshold`
    (0.001) skipped unless all are. Missing candidates have length 0 and probability 0."""
    if len(op.outputs) < 3:  # Caffe2 1.10.2 writes OUTPUT_PROB unconditionally (an out-of-range output)
        raise BadArgumentError(
            f"{op.where}: CTCBeamSearchDecoder needs its third output OUTPUT_PROB (Caffe2 writes it always)"
        )
    beam_width = op.int("beam_width", 10)
    threshold = np.float32(op.float("prune_threshold", 0.001))
    candidates = op.int("num_candidates", 1)
    if candidates < 0:
        raise BadArgumentError(f"{op.where}: argument 'num_candidates' = {candidates} must be >= 0")

    def kernel(inputs, *seq_len):
        scores, lengths = _ctc_inputs(op, inputs, seq_len[0] if seq_len else None)
        if (lengths < 0).any():
            raise ShapeError(f"{op.where}: SEQ_LEN '{op.inputs[1]}' holds a negative length {int(lengths.min())}")
        batch = scores.shape[1]
        out_len = np.zeros(batch * candidates, np.int32)
        out_prob = np.zeros(batch * candidates, np.float32)
        values: list[int] = []
        for i, length in enumerate(lengths.tolist()):
            ranked = _beam_search(scores[:length, i, :], beam_width, threshold)
            for j, (prefix, prob) in enumerate(ranked[:candidates]):
                out_len[i * candidates + j] = len(prefix)
                out_prob[i * candidates + j] = prob
                values.extend(prefix)
        return jnp.asarray(out_len), jnp.asarray(np.array(values, np.int32)), jnp.asarray(out_prob)

    return kernel


# --------------------------------------------------------------------------------------------------
# CRF: Viterbi path


def _float_matrix(op: Op, index: int, x: Any, what: str) -> None:
    _check_dtype(op, index, x, _F32, what)
    if x.ndim != 2:
        raise ShapeError(f"{op.where}: {what} '{op.inputs[index]}' must be a 2-D matrix, got {_shape_text(x)}")


@register("ViterbiPath", inputs=2, gradient=no_gradient)
def viterbi_path(op: Op) -> Kernel:
    """(predictions [N, D], transitions [D, D]) -> viterbi_path [N] int32: the best-scoring state
    sequence, a step's score being its prediction plus the transition from the previous state; ties go
    to the lower state, as Eigen's maxCoeff gives them."""

    def kernel(predictions, transitions):
        _float_matrix(op, 0, predictions, "predictions")
        _float_matrix(op, 1, transitions, "transitions")
        steps, states = predictions.shape
        if transitions.shape != (states, states):
            raise ShapeError(
                f"{op.where}: transitions '{op.inputs[1]}' must be [{states}, {states}] for predictions "
                f"{_shape_text(predictions)}, got {_shape_text(transitions)}"
            )
        if steps == 0:
            raise ShapeError(f"{op.where}: predictions '{op.inputs[0]}' has no rows (rowIndex is out of DATA bounds)")
        if states == 0:
            raise ShapeError(f"{op.where}: predictions '{op.inputs[0]}' has no states ({_shape_text(predictions)})")

        def forward(trellis, row):
            scores = trellis[:, None] + transitions  # [from, to]
            return row + jnp.max(scores, axis=0), jnp.argmax(scores, axis=0).astype(jnp.int32)

        trellis, backpointers = lax.scan(forward, predictions[0], predictions[1:])
        last = jnp.argmax(trellis).astype(jnp.int32)

        def back(state, pointers):
            previous = pointers[state]
            return previous, previous

        _, earlier = lax.scan(back, last, backpointers, reverse=True)
        return jnp.concatenate([earlier, last[None]])

    return kernel


runtime_checked("SwapBestPath")


@register("SwapBestPath", inputs=2, roles=Roles(integers=(1,)), gradient=no_gradient)
def swap_best_path(op: Op) -> Kernel:
    """(predictions [N, D], bestPath [N] int32) -> new_predictions: in each row the best score swapped
    with the one at bestPath's index, so the path's entries become the rows' maxima (ties: the lower index
    is the row's best)."""

    def kernel(data, best):
        _float_matrix(op, 0, data, "predictions")
        _check_dtype(op, 1, best, _I32, "bestPath")
        if best.ndim != 1 or best.shape[0] != data.shape[0]:
            raise ShapeError(
                f"{op.where}: bestPath '{op.inputs[1]}' must be 1-D with one index per row of predictions "
                f"{_shape_text(data)}, got {_shape_text(best)}"
            )
        rows, states = data.shape
        if rows == 0 or states == 0:  # Caffe2 divides by the row count, and takes the max of empty rows
            raise ShapeError(f"{op.where}: predictions '{op.inputs[0]}' is empty ({_shape_text(data)})")
        bad = (best < 0) | (best >= states)
        enforce(
            ~jnp.any(bad),
            f"{literal(op.where)}: bestPath '{literal(op.inputs[1])}' holds index {{bad}}, outside [0, {states})",
            bad=first_bad(best, bad),
        )
        new = jnp.clip(best, 0, states - 1)
        old = jnp.argmax(data, axis=1)
        at = jnp.arange(rows)
        new_values, old_values = data[at, new], data[at, old]
        return data.at[at, new].set(old_values).at[at, old].set(new_values)

    return kernel
