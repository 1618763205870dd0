"""PythonDLPack and PythonDLPackGradient (rnn2jax/caffe2/python/python_op.py) against real Caffe2.

One function's source runs in both, registered as Caffe2's `_RegisterPythonImpl` registers it, behind an op of
type PythonDLPack: it reads its inputs through DLPack (`.data`, a capsule; `._shape`) and writes its outputs.
In Caffe2's venv torch consumes the capsules and writes the output in place (`._reshape`, then `.data`; Caffe2's
`.feed` keeps a pointer into a tensor torch frees, so in-place is how it works there); rnn2jax's venv has NumPy
2, which imports a capsule read-only, so there the function hands back a capsule with `.feed`. The gradient maker
(PythonDLPackGradient, with Caffe2's inputs) is compared with Caffe2's; the gradient op runs in rnn2jax.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnn2jax
from rnn2jax.caffe2.opdef import create_net
from rnn2jax.caffe2.python import python_op
from rnn2jax.errors import BadArgumentError
from rnn2jax.ops.gradient_makers import get_gradient_for_op
from tests.differential import arrays, make_op, shapes

SOURCE = textwrap.dedent(
    """
    def twice_plus_one(inputs, outputs):
        shape = list(inputs[0]._shape)
        try:
            from torch.utils import dlpack  # Caffe2's venv: views through torch, written in place
            x = dlpack.from_dlpack(inputs[0].data).numpy()
            outputs[0]._reshape(shape)  # an unset blob: float32
            dlpack.from_dlpack(outputs[0].data).numpy()[...] = x * 2 + 1
            outputs[1]._reshape([len(shape)])
            dlpack.from_dlpack(outputs[1].data).numpy()[...] = shape
        except ImportError:  # NumPy 2: read-only views; the results go back by feed
            class Capsule:
                def __init__(self, capsule):
                    self.capsule = capsule

                def __dlpack__(self, **kwargs):
                    return self.capsule

                def __dlpack_device__(self):
                    return (1, 0)

            x = np.from_dlpack(Capsule(inputs[0].data))
            outputs[0].feed(np.ascontiguousarray(x * 2 + 1, np.float32).__dlpack__())
            outputs[1].feed(np.array(shape, np.float32).__dlpack__())
    """
)


def ours(source: str, name: str, grad_f=None) -> str:
    namespace = {"np": np}
    exec(compile(source, "<python op>", "exec"), namespace)
    return python_op.register_python_function(namespace[name], grad_f, None, None)


@pytest.fixture(scope="module")
def tokens(caffe2):
    return caffe2.python_ops({"twice_plus_one": SOURCE}), ours(SOURCE, "twice_plus_one", twice_gradient)


def twice_gradient(inputs, outputs):
    """dX = 2 dY, through DLPack: inputs are X, Y, shape, dY, dshape."""
    dy = np.from_dlpack(python_op._Capsule(inputs[3].data))
    outputs[0].feed(np.ascontiguousarray(2 * dy).__dlpack__())


@settings(max_examples=8)
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64, np.int64, np.int32]))
def test_python_dlpack_matches_caffe2(caffe2, tokens, data, dtype):
    x = data.draw(arrays(shapes(1, 3), dtype, -9, 9))
    theirs, mine = tokens
    op = make_op("PythonDLPack", ["x"], ["y", "shape"], token=theirs["twice_plus_one"])
    want = caffe2.run([("net", create_net("dlpack", [op]))], {"x": x}, ["y", "shape"])
    workspace = rnn2jax.Workspace()
    workspace.feed("x", x)
    workspace.run(create_net("dlpack", [make_op("PythonDLPack", ["x"], ["y", "shape"], token=mine)]))
    for name in ("y", "shape"):
        got = workspace.fetch(name)
        assert got.dtype == want[name].dtype and got.shape == want[name].shape, name
        np.testing.assert_array_equal(got, want[name])


def test_python_dlpack_gradient_maker_matches_caffe2(caffe2, tokens):
    _, mine = tokens
    op = make_op("PythonDLPack", ["x"], ["y", "shape"], token=mine)
    want, want_inputs = caffe2.gradient_for_op(op, ["y_grad", "shape_grad"])
    got, got_inputs = get_gradient_for_op(op, ["y_grad", "shape_grad"])
    assert [(g.type, list(g.input), list(g.output)) for g in got] == [
        (g.type, list(g.input), list(g.output)) for g in want
    ]
    assert list(got_inputs) == list(want_inputs)
    workspace = rnn2jax.Workspace()
    feeds = {"x": np.arange(3, dtype=np.float32), "y": np.zeros(3, np.float32), "shape": np.ones(1, np.float32)}
    feeds.update(y_grad=np.array([1, -2, 3], np.float32), shape_grad=np.zeros(1, np.float32))
    for name, value in feeds.items():
        workspace.feed(name, value)
    workspace.run(create_net("grad", got))
    np.testing.assert_array_equal(workspace.fetch("x_grad"), np.array([2, -4, 6], np.float32))


def test_python_dlpack_refusals():
    def feeds_a_list(inputs, outputs):
        outputs[0].feed([1, 2])

    def reads_a_scalar(inputs, outputs):
        inputs[0].data  # noqa: B018  (Caffe2: a tensor passed by DLPack needs a dim)

    workspace = rnn2jax.Workspace()
    workspace.feed("x", np.float32(3))
    for f, words in ((feeds_a_list, "Expected DLPack capsule"), (reads_a_scalar, "0-d tensor")):
        op = make_op("PythonDLPack", ["x"], ["y"], token=python_op.register_python_function(f, None, None, None))
        with pytest.raises(BadArgumentError, match=rf"blob '.': {words}|blob 'x' is a {words}"):
            workspace.run(create_net("bad", [op]))
