"""NumPy references for the sparse ops whose maths is more than data movement: IndexHash's wrapping
byte hash and LengthsTopK's per-segment ranking (see also tests/test_caffe2_ops_sparse.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from differential import run_rnn2jax
from rnn2jax.caffe2.opdef import create_operator


def index_hash_reference(ids: np.ndarray, seed: int, modulo: int) -> np.ndarray:
    """index_hash_ops.h in Python integers: fold the little-endian signed bytes, wrapping in the type."""
    bits = ids.dtype.itemsize * 8

    def wrap(v: int) -> int:
        v &= (1 << bits) - 1
        return v - (1 << bits) if v >> (bits - 1) else v

    out = []
    for value in ids.reshape(-1).tolist():
        hashed = wrap(wrap(seed * 0xDEADBEEF) if bits == 64 else (seed * 0xDEADBEEF))
        for byte in int(value).to_bytes(bits // 8, "little", signed=True):
            hashed = wrap(hashed * 65537 + (byte - 256 if byte > 127 else byte))
        remainder = abs(hashed) % modulo * (1 if hashed >= 0 else -1)  # C++ truncating remainder
        out.append(remainder if remainder >= 0 else remainder + modulo)
    return np.asarray(out, ids.dtype).reshape(ids.shape)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@given(data=st.data())
def test_index_hash_matches_reference(dtype, data):
    info = np.iinfo(dtype)
    ids = data.draw(hnp.arrays(dtype, st.integers(0, 6), elements=st.integers(info.min, info.max)))
    seed = data.draw(st.integers(-(2**40), 2**40))
    modulo = data.draw(st.integers(1, info.max))
    op = create_operator("IndexHash", ["x"], ["y"], seed=seed, modulo=modulo)
    got = run_rnn2jax([op], {"x": ids}, ["y"], jit=False)["y"]
    np.testing.assert_array_equal(got, index_hash_reference(ids, seed, modulo))


def lengths_top_k_reference(x: np.ndarray, lengths: np.ndarray, k: int):
    values, indices = np.zeros((lengths.size, k), x.dtype), np.full((lengths.size, k), -1, np.int32)
    start = 0
    for i, n in enumerate(lengths):
        segment = x[start : start + n]
        order = sorted(range(n), key=lambda j: (-segment[j], j))[:k]  # larger first, then earlier
        values[i, : len(order)] = segment[order]
        indices[i, : len(order)] = order
        start += n
    return values, indices


@given(data=st.data())
def test_lengths_top_k_matches_reference(data):
    lengths = data.draw(hnp.arrays(np.int32, st.integers(0, 5), elements=st.integers(0, 6)))
    x = data.draw(hnp.arrays(np.float32, int(lengths.sum()), elements=st.integers(-3, 3).map(float)))
    k = data.draw(st.integers(1, 5))
    op = create_operator("LengthsTopK", ["x", "lengths"], ["values", "indices"], k=k)
    got = run_rnn2jax([op], {"x": x, "lengths": lengths}, ["values", "indices"], jit=False)
    want_values, want_indices = lengths_top_k_reference(x, lengths, k)
    np.testing.assert_array_equal(got["values"], want_values)
    np.testing.assert_array_equal(got["indices"], want_indices)
