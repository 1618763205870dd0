"""Data parallelism: the batch split over 4 CPU devices gives the single-device results.

The devices are forced with XLA_FLAGS in a subprocess: JAX fixes its device count when it starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import rnn2jax
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.proto import caffe2_pb2 as pb

SCRIPT = textwrap.dedent(
    """
    import sys
    import jax
    import numpy as np
    from jax.sharding import Mesh
    import rnn2jax
    from rnn2jax.caffe2.python.rnn_cell import LSTM
    from rnn2jax.caffe2.python.model_helper import ModelHelper

    assert len(jax.devices()) == 4, jax.devices()
    model = ModelHelper(name="sharded")
    outs = LSTM(model, "x", "seq_lengths", ("h0", "c0"), 3, 5, scope="lstm")
    names = [str(o) for o in outs]
    single = rnn2jax.compile(model.net.Proto(), init_net=model.param_init_net.Proto(), outputs=names, seed=3)
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    init = model.param_init_net.Proto()
    sharded = rnn2jax.compile(model.net.Proto(), init_net=init, outputs=names, seed=3, mesh=mesh)
    rng = np.random.default_rng(0)
    inputs = {
        "x": rng.standard_normal((6, 8, 3)).astype(np.float32),
        "h0": rng.standard_normal((1, 8, 5)).astype(np.float32),
        "c0": rng.standard_normal((8, 5)).astype(np.float32),
        "seq_lengths": rng.integers(0, 7, size=8).astype(np.int32),
    }
    a, b = single(inputs), sharded(inputs)
    assert len(b[names[0]].sharding.device_set) == 4, b[names[0]].sharding
    for name in names:
        np.testing.assert_allclose(np.asarray(b[name]), np.asarray(a[name]), rtol=1e-6, atol=1e-6)
    try:
        sharded({**inputs, "x": inputs["x"][:, :6], "h0": inputs["h0"][:, :6], "c0": inputs["c0"][:6],
                 "seq_lengths": inputs["seq_lengths"][:6]})
    except rnn2jax.ShapeError as error:
        assert "batch size 6" in str(error) and "4 devices" in str(error), error
    else:
        raise AssertionError("a batch of 6 over 4 devices must be refused")
    print("sharded ok")
    """
)


def test_four_device_batch_equals_single_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sharded ok" in result.stdout


def test_one_device_mesh_is_the_plain_net():
    import jax
    from jax.sharding import Mesh

    model = ModelHelper(name="mesh1")
    outs = LSTM(model, "x", None, ("h0", "c0"), 2, 3, scope="lstm")
    names = [str(o) for o in outs]
    mesh = Mesh(np.array(jax.devices()[:1]), ("batch",))
    plain = rnn2jax.compile(model.net.Proto(), init_net=model.param_init_net.Proto(), outputs=names)
    meshed = rnn2jax.compile(model.net.Proto(), init_net=model.param_init_net.Proto(), outputs=names, mesh=mesh)
    x = np.ones((4, 2, 2), np.float32)
    h = np.zeros((2, 3), np.float32)
    a, b = plain(x=x, h0=h, c0=h), meshed(x=x, h0=h, c0=h)
    for name in names:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


@pytest.mark.parametrize(("shape", "axis"), [((), None), ((5,), 0), ((4, 3), 0), ((7, 4, 3), 1)])
def test_default_batch_axis(shape, axis):
    from rnn2jax.compiler.sharding import default_batch_axis

    assert default_batch_axis(np.zeros(shape)) == axis


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"mesh": "cpu"}, rnn2jax.InputTypeError, "mesh= must be a jax.sharding.Mesh, got str"),
        ({"mesh": [0]}, rnn2jax.InputTypeError, "got list"),
        ({"batch_axes": "x"}, rnn2jax.InputTypeError, "batch_axes= must be a mapping"),
        ({"batch_axes": {"x": "a"}}, rnn2jax.InputTypeError, "maps 'x' to 'a'"),
        ({"batch_axes": {"x": 5}, "mesh": True}, rnn2jax.ShapeError, "axis 5, but it has 2 dimensions"),
    ],
)
def test_bad_mesh_and_batch_axes_are_named_errors(kwargs, error, words):
    """Fuzzing found AttributeErrors from sharding.py for a mesh that is not a Mesh; each is a named error now."""
    if kwargs.get("mesh") is True:
        kwargs = {**kwargs, "mesh": jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))}
    net = pb.NetDef(name="n")
    net.op.add(type="Relu", input=["x"], output=["y"])
    with pytest.raises(error, match=words) as caught:
        rnn2jax.compile(net.SerializeToString(), **kwargs)({"x": np.ones((2, 3), np.float32)})
    assert "net 'n'" in str(caught.value)
