"""Ops users add: `rnn2jax.register_op` (with a gradient op and a builder gradient maker), `custom_op` and
`compile(..., custom_ops=)` for one call, `rnn2jax --ops MODULE`, and the errors of each.

Each test restores the registries afterwards, so user ops never leak into other tests (the scoreboard checks that
every registered op is a Caffe2 op).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rnn2jax
from rnn2jax import cli
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.errors import RegistrationError, ShapeError, UnsupportedOpError
from rnn2jax.ops.gradient_makers import _OVERRIDES, get_gradient_for_op
from rnn2jax.ops.registry import REGISTRY, supported
from rnn2jax.proto import caffe2_pb2 as pb

HERE = Path(__file__).resolve().parent
PLUGIN = HERE / "user_ops_example.py"

floats = hnp.arrays(
    np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), elements=st.floats(-2, 2, width=32)
)


@pytest.fixture
def registries():
    """Snapshot and restore the op registry (the gradient makers are its records' facets) and the gradient
    makers registered at run time."""
    ops, makers = dict(REGISTRY), dict(_OVERRIDES)
    yield
    REGISTRY.clear()
    REGISTRY.update(ops)
    _OVERRIDES.clear()
    _OVERRIDES.update(makers)
    sys.modules.pop("user_ops_example", None)


@pytest.fixture
def scaled_tanh(registries):
    sys.path.insert(0, str(HERE))
    try:
        importlib.import_module("user_ops_example")
    finally:
        sys.path.remove(str(HERE))


def forward_net(alpha: float) -> pb.NetDef:
    return create_net("user", [create_operator("ScaledTanh", ["x"], ["y"], alpha=alpha)])


# --------------------------------------------------------------------------------------------------
# A registered op and its gradient


@given(x=floats, alpha=st.floats(0.25, 2.0))
def test_a_user_op_compiles_and_differentiates(scaled_tanh, x, alpha):
    compiled = rnn2jax.compile(forward_net(alpha))
    np.testing.assert_allclose(np.asarray(compiled(x=x)["y"]), np.tanh(np.float32(alpha) * x), rtol=1e-6, atol=1e-6)

    # jax.grad through the compiled net, against the derivative written in NumPy
    grad = jax.grad(lambda v: jnp.sum(compiled.apply({}, {"x": v})["y"]))(x)
    t = np.tanh(np.float32(alpha) * x)
    np.testing.assert_allclose(np.asarray(grad), alpha * (1 - t * t), rtol=1e-5, atol=1e-6)


@given(x=floats, alpha=st.floats(0.25, 2.0))
def test_the_builder_emits_the_user_gradient_op_and_it_agrees_with_jax_grad(scaled_tanh, x, alpha):
    op = forward_net(alpha).op[0]
    grad_ops, g_input = get_gradient_for_op(op, ["y_grad"])
    assert [(g.type, list(g.input), list(g.output)) for g in grad_ops] == [
        ("ScaledTanhGradient", ["x", "y_grad"], ["x_grad"])
    ]
    assert g_input == ["x_grad"]
    assert [a.name for a in grad_ops[0].arg] == ["alpha"]  # forward arguments copied, as Caffe2 does
    dy = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    backward = rnn2jax.compile(create_net("backward", grad_ops))
    got = backward(x=x, y_grad=dy)["x_grad"]
    compiled = rnn2jax.compile(forward_net(alpha))
    _, vjp = jax.vjp(lambda v: compiled.apply({}, {"x": v})["y"], x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(vjp(dy)[0]), rtol=1e-5, atol=1e-6)


def test_a_maker_function_can_be_the_gradient(registries):
    def maker(g):
        return [pb.OperatorDef(type="Scale", input=[g.GO(0)], output=[g.GI(0)])]

    rnn2jax.register_op("Twice", lambda op: lambda x: 2 * x, inputs=1, outputs=1, gradient=maker)
    grad_ops, g_input = get_gradient_for_op(create_operator("Twice", ["x"], ["y"]), ["y_grad"])
    assert [g.type for g in grad_ops] == ["Scale"] and g_input == ["x_grad"]


# --------------------------------------------------------------------------------------------------
# Duplicates, overrides, bad definitions


def test_registering_a_built_in_type_is_refused_unless_override(registries):
    with pytest.raises(RegistrationError, match=r"'Relu' is already registered \(a built-in op\).*override=True"):
        rnn2jax.register_op("Relu", lambda op: lambda x: x)
    rnn2jax.register_op("Relu", lambda op: lambda x: x * 0 + 7, override=True)
    out = rnn2jax.compile(create_net("r", [create_operator("Relu", ["x"], ["y"])]))(x=np.ones(2, np.float32))
    np.testing.assert_array_equal(np.asarray(out["y"]), [7, 7])


def test_registering_a_user_op_twice_is_refused(scaled_tanh):
    with pytest.raises(RegistrationError, match=r"'ScaledTanh' is already registered \(a user op\)"):
        rnn2jax.register_op("ScaledTanh", lambda op: lambda x: x)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"op_type": ""}, "non-empty str"),
        ({"build": 3}, "build must be a function"),
        ({"inputs": (2, 1)}, "inputs=.*not a count"),
        ({"outputs": "many"}, "outputs=.*not a count"),
        ({"inputs": 1, "static_inputs": (1,)}, "not input positions"),
        ({"gradient": 5}, "gradient must be an op type or a maker"),
    ],
)
def test_bad_definitions_are_named_errors(registries, kwargs, message):
    args = {"op_type": "Bad", "build": lambda op: lambda x: x, **kwargs}
    with pytest.raises(RegistrationError, match=message):
        rnn2jax.register_op(args.pop("op_type"), args.pop("build"), **args)
    assert not supported("Bad")


def test_a_kernel_that_fails_is_reported_with_the_op(registries):
    rnn2jax.register_op("Broken", lambda op: lambda x: jnp.reshape(x, (7, 7)))
    net = create_net("b", [create_operator("Broken", ["x"], ["y"])])
    with pytest.raises(ShapeError, match=r"op #0 \(Broken\).*inputs: x: float32\[3\]"):
        rnn2jax.compile(net)(x=np.ones(3, np.float32))


# --------------------------------------------------------------------------------------------------
# One-off ops for one compile call; value-dependent shapes in user ops


def _repeat(op):
    """Repeat(X, COUNTS): X[i] repeated COUNTS[i] times (the counts decide the shape: a static input)."""
    return lambda x, counts: jnp.repeat(x, np.asarray(counts), axis=0)


@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_custom_ops_for_one_compile_call(counts):
    net = create_net("one_off", [create_operator("Repeat", ["x", "counts"], ["y"])])
    op = rnn2jax.custom_op("Repeat", _repeat, inputs=2, outputs=1, static_inputs=(1,))
    compiled = rnn2jax.compile(net, custom_ops=[op])
    x = np.arange(len(counts), dtype=np.float32)
    got = compiled(x=x, counts=np.array(counts, np.int32))["y"]
    np.testing.assert_array_equal(np.asarray(got), np.repeat(x, counts))
    assert compiled.static_inputs == ("counts",)
    assert not supported("Repeat")  # only for that call
    with pytest.raises(UnsupportedOpError, match="Repeat"):
        rnn2jax.compile(net)


def test_custom_ops_as_a_mapping_and_bad_custom_ops():
    net = create_net("m", [create_operator("Plus1", ["x"], ["y"])])
    out = rnn2jax.compile(net, custom_ops={"Plus1": lambda op: lambda x: x + 1})(x=np.zeros(2, np.float32))
    np.testing.assert_array_equal(np.asarray(out["y"]), [1, 1])
    with pytest.raises(RegistrationError, match="custom_ops must be"):
        rnn2jax.compile(net, custom_ops="Plus1")
    with pytest.raises(RegistrationError, match=r"not an op made by rnn2jax\.custom_op"):
        rnn2jax.compile(net, custom_ops=[lambda op: None])


# --------------------------------------------------------------------------------------------------
# The command line: --ops MODULE, and inspect naming the user ops


def test_inspect_lists_user_ops_loaded_with_dash_dash_ops(registries, tmp_path, capsys):
    path = tmp_path / "net.pbtxt"
    path.write_text(str(forward_net(0.5)))
    assert cli.main(["--ops", str(PLUGIN), "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "user ops: ScaledTanh x1" in out and "unsupported: none" in out


def test_dash_dash_ops_errors_are_named(registries, tmp_path, capsys):
    assert cli.main(["--ops", str(tmp_path / "missing.py"), "inspect", str(PLUGIN)]) == 2
    assert "--ops" in capsys.readouterr().err
    bad = tmp_path / "bad_ops.py"
    bad.write_text("import rnn2jax\nrnn2jax.register_op('Relu', lambda op: None)\n")
    assert cli.main(["--ops", str(bad), "inspect", str(PLUGIN)]) == 2
    assert "'Relu' is already registered" in capsys.readouterr().err
