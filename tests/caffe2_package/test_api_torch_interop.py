"""`workspace.FetchTorch` and feeding a torch.Tensor: the blob and the tensor are one, as in Caffe2 (its
workspace_test's testTorchInterop): writes and resizes on either side show on the other."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rnn2jax.caffe2.python import core, workspace
from rnn2jax.errors import Rnn2JaxError

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def test_fetched_tensor_and_blob_share_writes_and_resizes() -> None:
    workspace.RunOperatorOnce(core.CreateOperator("ConstantFill", [], "foo", shape=(4,), value=2, dtype=10))
    t = workspace.FetchTorch("foo")
    assert t.dtype == torch.int64
    t.resize_(5)
    t[4] = t[2] = 777
    np.testing.assert_array_equal(workspace.FetchBlob("foo"), [2, 2, 777, 2, 777])
    assert t.numpy().shape == (5,)  # NumPy's view makes PyTorch refuse resize_: the next resize is still followed
    workspace.RunOperatorOnce(core.CreateOperator("ConstantFill", [], "foo", shape=(3,), value=9, dtype=10))
    np.testing.assert_array_equal(t.numpy(), [9, 9, 9])  # an op wrote the blob anew: the tensor follows


def test_fed_tensor_follows_the_ops_that_write_its_blob() -> None:
    z = torch.ones((4,), dtype=torch.int64)
    workspace.FeedBlob("bar", z)
    workspace.RunOperatorOnce(core.CreateOperator("Reshape", ["bar"], ["bar", "_"], shape=(2, 2)))
    assert z.shape == (2, 2)  # the op resized the tensor itself
    z[0, 1] = 123
    np.testing.assert_array_equal(workspace.FetchBlob("bar"), [[1, 123], [1, 1]])
    np.testing.assert_array_equal(workspace.C.Workspace.current.blobs["bar"].fetch(), [[1, 123], [1, 1]])


def test_a_blob_given_another_type_stops_sharing() -> None:
    z = torch.zeros((3,), dtype=torch.float32)
    workspace.FeedBlob("x", z)
    workspace.RunOperatorOnce(core.CreateOperator("Cast", ["x"], ["x"], to=core.DataType.INT32))
    z[0] = 5.0
    assert workspace.FetchBlob("x").dtype == np.int32
    np.testing.assert_array_equal(workspace.FetchBlob("x"), [0, 0, 0])


def test_a_blob_that_is_no_tensor_has_no_torch_view() -> None:
    workspace.FeedBlob("s", "text")
    with pytest.raises(RuntimeError, match="not a tensor"):
        workspace.FetchTorch("s")


def test_without_torch_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    workspace.FeedBlob("y", np.ones(2, np.float32))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails, as where it is not installed
    with pytest.raises(Rnn2JaxError, match=r"rnn2jax\[torch\]"):
        workspace.FetchTorch("y")
