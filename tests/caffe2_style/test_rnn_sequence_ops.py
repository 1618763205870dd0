"""The ops around Caffe2's RNNs: LayerNorm, PackRNNSequence / UnpackRNNSequence and SequenceMask, tested
as a Caffe2 user's operator test would (hypothesis_test_util).

Run under the plugin: `pytest -p rnn2jax.caffe2.pytest_plugin --caffe2-source $C2 tests/caffe2_api`.
The references are NumPy, written here from the ops' documented semantics; they were cross-checked
against real Caffe2 by running this same file under torch 1.10.2's caffe2.
"""

from __future__ import annotations

import math

import caffe2.python.hypothesis_test_util as hu
import hypothesis.strategies as st
import numpy as np
from caffe2.python import core
from hypothesis import given

# --------------------------------------------------------------------------------------------------
# LayerNorm


def layer_norm_reference(
    x: np.ndarray, axis: int, epsilon: float, gamma: np.ndarray | None = None, beta: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows = dims before `axis`; std = sqrt(biased variance + epsilon) (epsilon inside the std output);
    mean and std keep the leading dims plus a trailing 1."""
    axis = axis % x.ndim
    rows = x.astype(np.float64).reshape(math.prod(x.shape[:axis]), -1)
    mean = rows.mean(axis=1, keepdims=True)
    std = np.sqrt(((rows - mean) ** 2).mean(axis=1, keepdims=True) + epsilon)
    y = (rows - mean) / std
    if gamma is not None:
        y = y * gamma.reshape(1, -1) + beta.reshape(1, -1)
    stat_shape = (*x.shape[:axis], 1)
    return y.reshape(x.shape), mean.reshape(stat_shape), std.reshape(stat_shape)


@st.composite
def layer_norm_case(draw: st.DrawFn, spread: bool) -> tuple[np.ndarray, int]:
    """(X, axis), axis in [-ndim, ndim). With `spread`, X is a shuffled, scaled arange (as Caffe2's
    gradient test feeds), so no row is nearly constant: central differences with stepsize 0.05 need
    a row's std well above the step."""
    shape = draw(st.lists(st.integers(1, 4), min_size=2, max_size=3))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    if spread:
        size = math.prod(shape)
        order = np.random.RandomState(draw(st.integers(0, 2**31 - 1))).permutation(size)
        scale = draw(st.floats(0.5, 2.0))
        x = ((order - size / 2) * scale).astype(np.float32).reshape(shape)
    else:
        x = draw(hu.arrays(shape, elements=hu.floats(min_value=-2.0, max_value=2.0)))
    return x, axis


class TestLayerNorm(hu.HypothesisTestCase):
    @given(
        case=layer_norm_case(spread=False),
        epsilon=st.sampled_from([1e-5, 1e-4, 1e-3, 0.1]),
        elementwise_affine=st.booleans(),
        seed=st.integers(0, 2**31 - 1),
        **hu.gcs_cpu_only,
    )
    def test_layer_norm(self, case, epsilon, elementwise_affine, seed, gc, dc):
        x, axis = case
        inputs = [x]
        if elementwise_affine:
            rng = np.random.RandomState(seed)
            row = x.shape[axis % x.ndim :]
            inputs += [rng.randn(*row).astype(np.float32), rng.randn(*row).astype(np.float32)]
        op = core.CreateOperator(
            "LayerNorm",
            ["X", "gamma", "beta"][: len(inputs)],
            ["Y", "mean", "std"],
            axis=axis,
            epsilon=epsilon,
            elementwise_affine=elementwise_affine,
        )

        def reference(x, *affine):
            return layer_norm_reference(x, axis, epsilon, *affine)

        self.assertReferenceChecks(gc, op, inputs, reference)
        self.assertDeviceChecks(dc, op, inputs, [0, 1, 2])

    @given(case=layer_norm_case(spread=True), epsilon=st.sampled_from([1e-5, 1e-3]), **hu.gcs_cpu_only)
    def test_layer_norm_grad(self, case, epsilon, gc, dc):
        """LayerNormGradient differentiates Y only (Caffe2 gives mean and std no gradient): default
        thresholds, as in Caffe2's LayerNorm tests."""
        x, axis = case
        op = core.CreateOperator("LayerNorm", ["X"], ["Y", "mean", "std"], axis=axis, epsilon=epsilon)
        self.assertGradientChecks(gc, op, [x], 0, [0])

    @given(case=layer_norm_case(spread=True), epsilon=st.sampled_from([1e-5, 1e-3]), **hu.gcs_cpu_only)
    def test_layer_norm_gradient_op(self, case, epsilon, gc, dc):
        """LayerNormGradient(dY, Y, mean, std, X) -> dX against the closed form
        dX = (dY - mean(dY) - Y * mean(dY * Y)) / std, row-wise."""
        x, axis = case
        y, mean, std = layer_norm_reference(x, axis, epsilon)
        d_y = np.random.RandomState(x.size).randn(*x.shape)
        k = axis % x.ndim
        rows = math.prod(x.shape[:k])
        dy_rows, y_rows, std_rows = d_y.reshape(rows, -1), y.reshape(rows, -1), std.reshape(rows, 1)
        expected = (
            dy_rows - dy_rows.mean(axis=1, keepdims=True) - y_rows * (dy_rows * y_rows).mean(axis=1, keepdims=True)
        ) / std_rows
        op = core.CreateOperator(
            "LayerNormGradient", ["dY", "Y", "mean", "std", "X"], ["dX"], axis=axis, epsilon=epsilon
        )
        inputs = [a.astype(np.float32) for a in (d_y, y, mean, std, x)]

        def reference(*args):
            return (expected.reshape(x.shape),)

        self.assertReferenceChecks(gc, op, inputs, reference)


# --------------------------------------------------------------------------------------------------
# PackRNNSequence / UnpackRNNSequence


def pack_reference(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray]:
    """[sum(lengths), ...] -> [max(lengths), N, ...]: column j holds segment j, zero padded."""
    n = lengths.size
    packed = np.zeros((int(lengths.max()) if n else 0, n, *values.shape[1:]), dtype=values.dtype)
    offset = 0
    for j, length in enumerate(lengths):
        packed[:length, j] = values[offset : offset + length]
        offset += length
    return (packed,)


def unpack_reference(packed: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray]:
    """[T, N, ...] -> [sum(lengths), ...]: the first lengths[j] steps of each column, concatenated."""
    segments = [packed[:length, j] for j, length in enumerate(lengths)]
    return (np.concatenate(segments, axis=0) if segments else np.zeros((0, *packed.shape[2:]), packed.dtype),)


packing_case = st.tuples(
    st.lists(st.integers(0, 4), min_size=0, max_size=4),  # lengths (zeros, and n = 0, included)
    st.lists(st.integers(1, 3), min_size=1, max_size=2),  # trailing dims
    st.integers(0, 2**31 - 1),
)


class TestPackRNNSequence(hu.HypothesisTestCase):
    @given(case=packing_case, **hu.gcs_cpu_only)
    def test_pack_rnn_sequence(self, case, gc, dc):
        lengths, dims, seed = case
        lengths = np.array(lengths, dtype=np.int32)
        values = np.random.RandomState(seed).randn(int(lengths.sum()), *dims).astype(np.float32)
        op = core.CreateOperator("PackRNNSequence", ["values", "lengths"], ["out"])
        self.assertReferenceChecks(gc, op, [values, lengths], pack_reference)
        self.assertDeviceChecks(dc, op, [values, lengths], [0])
        if values.size:
            self.assertGradientChecks(gc, op, [values, lengths], 0, [0])

    @given(case=packing_case, **hu.gcs_cpu_only)
    def test_unpack_rnn_sequence(self, case, gc, dc):
        lengths, dims, seed = case
        lengths = np.array(lengths, dtype=np.int32)
        steps = int(lengths.max()) if lengths.size else 0
        packed = np.random.RandomState(seed).randn(steps, lengths.size, *dims).astype(np.float32)
        op = core.CreateOperator("UnpackRNNSequence", ["values", "lengths"], ["out"])
        self.assertReferenceChecks(gc, op, [packed, lengths], unpack_reference)
        self.assertDeviceChecks(dc, op, [packed, lengths], [0])
        if lengths.sum():
            self.assertGradientChecks(gc, op, [packed, lengths], 0, [0])

    @given(case=packing_case, **hu.gcs_cpu_only)
    def test_pack_unpack_gradient_ops(self, case, gc, dc):
        """Each op's gradient is the other: Pack's gradient op is UnpackRNNSequence(dOut, lengths)."""
        lengths, dims, seed = case
        lengths = np.array(lengths, dtype=np.int32)
        values = np.random.RandomState(seed).randn(int(lengths.sum()), *dims).astype(np.float32)
        op = core.CreateOperator("PackRNNSequence", ["values", "lengths"], ["out"])
        grad_ops, grad_map = core.GradientRegistry.GetGradientForOp(op, ["out_grad"])
        self.assertEqual([g.type for g in grad_ops], ["UnpackRNNSequence"])
        self.assertEqual(list(grad_ops[0].input), ["out_grad", "lengths"])
        self.assertEqual([None if g is None else str(g) for g in grad_map], ["values_grad", None])

        def grad_reference(d_out, outputs, args):
            return [unpack_reference(d_out, args[1])[0], None]

        self.assertReferenceChecks(
            gc, op, [values, lengths], pack_reference, output_to_grad="out", grad_reference=grad_reference
        )


# --------------------------------------------------------------------------------------------------
# SequenceMask

TRIANGLES = {
    "upper": lambda i, j: j > i,
    "lower": lambda i, j: j < i,
    "upperdiag": lambda i, j: j >= i,
    "lowerdiag": lambda i, j: j <= i,
}


def sequence_mask_reference(
    x: np.ndarray,
    per_row: np.ndarray | None,
    mode: str,
    axis: int,
    fill_val: float,
    radius: int = 10,
    batch: int | None = None,
    repeat_from_axis: int | None = None,
) -> np.ndarray:
    """x viewed as [batches, rows, cols, repeat]: rows = dims before `axis` (after `batch`), cols = dims
    from `axis` (up to `repeat_from_axis`); element (i, j) of every batch becomes `fill_val` where the
    mode says so: sequence j >= lengths[i]; window |j - centers[i]| > radius; the triangles compare i, j."""
    shape = x.shape
    if batch is not None:
        view = (math.prod(shape[: batch + 1]), math.prod(shape[batch + 1 : axis]), math.prod(shape[axis:]), 1)
    elif repeat_from_axis is not None:
        view = (
            1,
            math.prod(shape[:axis]),
            math.prod(shape[axis:repeat_from_axis]),
            math.prod(shape[repeat_from_axis:]),
        )
    else:
        view = (1, math.prod(shape[:axis]), math.prod(shape[axis:]), 1)
    out = x.reshape(view).copy()
    for i in range(view[1]):
        for j in range(view[2]):
            if mode == "sequence":
                masked = j >= per_row[i]
            elif mode == "window":
                masked = j > per_row[i] + radius or j < per_row[i] - radius
            else:
                masked = TRIANGLES[mode](i, j)
            if masked:
                out[:, i, j, :] = fill_val
    return out.reshape(shape)


@st.composite
def sequence_mask_case(draw: st.DrawFn, mode: str, batched: bool, repeated: bool = False):
    """(x, per-row lengths/centers or None, axis, batch, repeat_from_axis, fill_val)."""
    ndim = draw(st.integers(3 if batched or repeated else 2, 4))
    shape = draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim))
    x = draw(hu.arrays(shape, elements=hu.floats(min_value=0.5, max_value=1.0)))
    batch = repeat_from = None
    if batched:
        batch = draw(st.integers(0, ndim - 2))
        axis = draw(st.integers(batch + 1, ndim - 1))
        rows, cols = math.prod(shape[batch + 1 : axis]), math.prod(shape[axis:])
    elif repeated:
        axis = draw(st.integers(0, ndim - 2))
        repeat_from = draw(st.integers(axis + 1, ndim - 1))
        rows, cols = math.prod(shape[:axis]), math.prod(shape[axis:repeat_from])
    else:
        axis = draw(st.integers(0, ndim - 1))
        rows, cols = math.prod(shape[:axis]), math.prod(shape[axis:])
    per_row = None
    if mode in ("sequence", "window") or draw(st.booleans()):  # triangles ignore a second input
        high = cols if mode == "sequence" else cols - 1
        per_row = draw(hu.arrays([rows], dtype=np.int32, elements=st.integers(0, high)))
    fill_val = draw(st.sampled_from([1e-9, -1.5, 0.0]))
    return x, per_row, axis, batch, repeat_from, fill_val


class TestSequenceMask(hu.HypothesisTestCase):
    def check_mask(self, gc, dc, mode, case, radius=None, default_fill=False):
        x, per_row, axis, batch, repeat_from, fill_val = case
        args = {"mode": mode, "axis": axis}
        if not default_fill:
            args["fill_val"] = fill_val
        if radius is not None:
            args["radius"] = radius
        if batch is not None:
            args["batch"] = batch
        if repeat_from is not None:
            args["repeat_from_axis"] = repeat_from
        inputs = [x] if per_row is None else [x, per_row]
        op = core.CreateOperator("SequenceMask", ["data", "lengths"][: len(inputs)], ["masked"], **args)

        def reference(x, per_row=None):
            fill = -np.inf if default_fill else fill_val
            kwargs = {"radius": 10 if radius is None else radius, "batch": batch, "repeat_from_axis": repeat_from}
            return (sequence_mask_reference(x, per_row, mode, axis, fill, **kwargs),)

        self.assertReferenceChecks(gc, op, inputs, reference)
        self.assertDeviceChecks(dc, op, inputs, [0])
        if not default_fill:  # a finite fill value: the masked elements have gradient 0, the others 1
            self.assertGradientChecks(gc, op, inputs, 0, [0])

    @given(case=sequence_mask_case("sequence", batched=False), default_fill=st.booleans(), **hu.gcs_cpu_only)
    def test_sequence(self, case, default_fill, gc, dc):
        self.check_mask(gc, dc, "sequence", case, default_fill=default_fill)

    @given(case=sequence_mask_case("window", batched=False), radius=st.integers(0, 2), **hu.gcs_cpu_only)
    def test_window(self, case, radius, gc, dc):
        self.check_mask(gc, dc, "window", case, radius=radius)

    @given(
        mode=st.sampled_from(sorted(TRIANGLES)),
        data=st.data(),
        **hu.gcs_cpu_only,
    )
    def test_triangles(self, mode, data, gc, dc):
        """upper masks j > i, lower j < i, *diag include the diagonal (the functors Caffe2 runs; its
        schema text describes them the other way round); a second input is accepted and ignored."""
        self.check_mask(gc, dc, mode, data.draw(sequence_mask_case(mode, batched=False)))

    @given(
        mode=st.sampled_from(["sequence", "window", *sorted(TRIANGLES)]),
        data=st.data(),
        **hu.gcs_cpu_only,
    )
    def test_batched(self, mode, data, gc, dc):
        """With `batch`, the dims up to and including it are independent batches masked alike."""
        case = data.draw(sequence_mask_case(mode, batched=True))
        self.check_mask(gc, dc, mode, case, radius=1 if mode == "window" else None)

    @given(case=sequence_mask_case("sequence", batched=False, repeated=True), **hu.gcs_cpu_only)
    def test_repeat_from_axis(self, case, gc, dc):
        """`repeat_from_axis`: the trailing block from that axis repeats each column's decision."""
        self.check_mask(gc, dc, "sequence", case)

    @given(x=hu.tensor(min_dim=2, max_dim=3), **hu.gcs_cpu_only)
    def test_sequence_needs_lengths(self, x, gc, dc):
        """mode 'sequence' without its lengths input is refused."""
        op = core.CreateOperator("SequenceMask", ["data"], ["masked"], mode="sequence", axis=1)
        self.assertRunOpRaises(gc, op, [x])
