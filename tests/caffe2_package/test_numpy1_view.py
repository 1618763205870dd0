"""The NumPy that Caffe2's own modules see (rnn2jax.caffe2.import_hook): NumPy 1's behaviour where Caffe2's sources
rely on it and NumPy 2 changed it. NumPy itself, as every other module sees it, stays as it is."""

from __future__ import annotations

import numpy as np
import pytest

from rnn2jax.caffe2.import_hook import _tree_view


@pytest.fixture(scope="module")
def tree_np():
    return _tree_view(np)


def test_a_one_element_array_fills_one_element(tree_np):
    """adam_test's references: `param_out[index] = ref_adam(...)` with LR of shape [1]."""
    filled = tree_np.copy(np.zeros(3, np.float32))
    filled[np.int64(1)] = np.array([0.5], np.float32)
    assert filled.tolist() == [0.0, 0.5, 0.0]
    with pytest.raises(ValueError):
        filled[0] = np.array([1.0, 2.0])  # more than one element still does not fit one
    with pytest.raises(ValueError):
        np.zeros(3, np.float32)[0] = np.array([0.5])  # NumPy's own arrays are NumPy 2's


def test_a_numpy_scalar_promotes_by_its_value(tree_np):
    """lengths_reducer_fused_8bit_rowwise_ops_test: int32 ones times an np.int64 stay int32 (NEP 50: int64)."""
    split = np.clip(5 // 2, 1, 10)  # an np.int64
    assert (tree_np.ones([3], dtype=np.int32) * split).dtype == np.int32
    assert (np.ones([3], dtype=np.int32) * split).dtype == np.int64
    assert (tree_np.zeros(2, np.float32) + np.float64(0.1)).dtype == np.float32
    assert (tree_np.zeros(2, np.float32) + np.float64(1e300)).dtype == np.float64  # does not fit float32
    assert (tree_np.ones(2, np.int32) * np.float64(0.5)).dtype == np.float64  # a higher category
    assert (tree_np.ones(2, np.int32) + np.int64(2**40)).dtype == np.int64


def test_what_is_computed_from_them_promotes_alike(tree_np):
    """tt_core.init_tt_cores: `(0.1 / glarot_style) * np.array(cores).astype(np.float32)` is float32."""
    cores = tree_np.array([1.0, 2.0]).astype(np.float32)
    assert ((0.1 / np.prod(cores) ** 0.25) * cores).dtype == np.float32
    twice = tree_np.ones([2], np.int32) * np.int64(2) * np.int64(3)
    assert twice.dtype == np.int32
    assert type(cores.sum()) is np.float32  # a reduction to one value is a scalar
    cores += 1
    assert cores.tolist() == [2.0, 3.0]
    assert type(np.array(cores)) is np.ndarray  # NumPy's own copy of one is plain


def test_int_and_float_take_a_one_element_array_of_any_rank(tree_np):
    """learning_rate_op_test: `int(np.random.randint(low, high, size=1))`, `int(np.asarray([i]))`."""
    drawn = tree_np.random.randint(low=1, high=5, size=1)
    assert 1 <= int(drawn) < 5 and float(tree_np.asarray([[2.5]])) == 2.5
    with pytest.raises(TypeError):
        int(tree_np.asarray([1, 2]))  # two elements are no scalar
    with pytest.raises(TypeError):
        int(np.asarray([1]))  # NumPy's own arrays are NumPy 2's


def test_sum_of_a_generator_is_pythons_and_getargspec_is_back(tree_np):
    """cross_entropy_ops_test sums a generator; matmul_op_test calls inspect.getargspec (gone in Python 3.11)."""
    from rnn2jax.caffe2.import_hook import _getargspec

    assert tree_np.sum(x * x for x in range(4)) == 14
    assert tree_np.sum(np.ones((2, 2)), axis=0).tolist() == [2.0, 2.0]
    spec = _getargspec(lambda a, b=1, *rest, **extra: None)
    assert (spec.args, spec.varargs, spec.keywords, spec.defaults) == (["a", "b"], "rest", "extra", (1,))
