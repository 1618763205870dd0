"""compile(): blob roles, init nets, outputs, and the transformations users apply to the result."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rnn2jax
from helpers import count_compilations
from rnn2jax.caffe2.opdef import create_net, create_operator


def _mlp_nets():
    predict = create_net(
        "mlp",
        [
            create_operator("FC", ["data", "w1", "b1"], "h"),
            create_operator("Relu", "h", "h"),  # in place
            create_operator("FC", ["h", "w2", "b2"], "logits"),
            create_operator("Softmax", "logits", "prob"),
        ],
        ["data", "w1", "b1", "w2", "b2"],
        ["prob"],
    )
    rng = np.random.default_rng(1)
    w1, w2 = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    init = create_net(
        "init",
        [
            create_operator("GivenTensorFill", [], "w1", shape=[5, 4], values=w1.ravel().tolist()),
            create_operator("ConstantFill", [], "b1", shape=[5], value=0.25),
            create_operator("GivenTensorFill", [], "w2", shape=[3, 5], values=w2.ravel().tolist()),
            create_operator("ConstantFill", [], "b2", shape=[3], value=-0.5),
        ],
    )
    return predict, init, (w1, np.full(5, 0.25, np.float32), w2, np.full(3, -0.5, np.float32))


def _mlp_reference(x, w1, b1, w2, b2):
    h = np.maximum(x @ w1.T + b1, 0)
    z = h @ w2.T + b2
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_compile_with_init_net_matches_numpy():
    predict, init, weights = _mlp_nets()
    fn = rnn2jax.compile(predict, init_net=init)
    assert fn.input_names == ("data",)
    assert fn.output_names == ("prob",)
    assert sorted(fn.params) == ["b1", "b2", "w1", "w2"]
    np.testing.assert_array_equal(np.asarray(fn.params["w1"]), weights[0])
    x = np.random.default_rng(2).standard_normal((6, 4)).astype(np.float32)
    out = fn(data=x)
    assert set(out) == {"prob"}
    np.testing.assert_allclose(np.asarray(out["prob"]), _mlp_reference(x, *weights), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(fn({"data": x})["prob"]), np.asarray(out["prob"]), rtol=0, atol=0)


def test_compile_without_init_net_takes_every_read_blob_as_input():
    predict, _, weights = _mlp_nets()
    fn = rnn2jax.compile(predict)
    assert fn.input_names == ("data", "w1", "b1", "w2", "b2")
    assert fn.params == {}
    x = np.ones((2, 4), np.float32)
    out = fn(data=x, w1=weights[0], b1=weights[1], w2=weights[2], b2=weights[3])
    np.testing.assert_allclose(np.asarray(out["prob"]), _mlp_reference(x, *weights), rtol=1e-5, atol=1e-6)


def test_numpy_inputs_of_a_new_shape_compile_the_net_and_nothing_else():
    # jnp.asarray of a NumPy array compiles an identity program per new shape and dtype; inputs are copied
    # to the device without one, so each new shape costs the net's own compilation only.
    compiled = rnn2jax.compile(
        create_net("n", [create_operator("Mul", ["x", "y"], ["xy"]), create_operator("Cast", ["n"], ["m"], to=10)])
    )
    for rows in (2, 3, 5):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        n = np.arange(rows, dtype=np.int64)
        with count_compilations() as total:
            out = compiled(x=x, y=x[::-1].copy(), n=n)
        assert total[0] == 1
        np.testing.assert_array_equal(np.asarray(out["xy"]), x * x[::-1])
        assert out["m"].dtype == np.int64 and np.array_equal(np.asarray(out["m"]), n)


def test_params_argument_adds_and_replaces():
    predict, init, weights = _mlp_nets()
    fn = rnn2jax.compile(predict, init_net=init, params={"b2": np.zeros(3, np.float32)})
    x = np.ones((2, 4), np.float32)
    expected = _mlp_reference(x, weights[0], weights[1], weights[2], np.zeros(3, np.float32))
    np.testing.assert_allclose(np.asarray(fn(data=x)["prob"]), expected, rtol=1e-5, atol=1e-6)


def test_outputs_default_to_blobs_no_later_op_reads():
    net = create_net(
        "n",
        [
            create_operator("Relu", "x", "a"),
            create_operator("Tanh", "a", "b"),
            create_operator("Sigmoid", "a", "c"),
            create_operator("Relu", "b", "b"),
        ],
    )
    fn = rnn2jax.compile(net)
    assert fn.output_names == ("c", "b")
    x = np.linspace(-2, 2, 7, dtype=np.float32)
    out = fn(x=x)
    np.testing.assert_allclose(np.asarray(out["b"]), np.maximum(np.tanh(np.maximum(x, 0)), 0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out["c"]), 1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-6)


def test_explicit_outputs_and_unknown_output():
    net = create_net(
        "n", [create_operator("Relu", "x", "a"), create_operator("Tanh", "a", "b")], ["x"], ["b"]
    )
    fn = rnn2jax.compile(net, outputs=["a", "b"])
    out = fn(x=np.array([-1.0, 2.0], np.float32))
    np.testing.assert_allclose(np.asarray(out["a"]), [0.0, 2.0])
    with pytest.raises(rnn2jax.MissingBlobError, match=r"output\(s\) zz are neither written"):
        rnn2jax.compile(net, outputs=["zz"])


def test_in_place_ops_rebind():
    net = create_net(
        "n",
        [
            create_operator("Scale", "x", "x", scale=2.0),
            create_operator("Add", ["x", "y"], "x"),
            create_operator("Scale", "x", "x", scale=3.0),
        ],
        ["x", "y"],
        ["x"],
    )
    fn = rnn2jax.compile(net)
    x, y = np.array([1.0, 2.0], np.float32), np.array([0.5, -1.0], np.float32)
    np.testing.assert_allclose(np.asarray(fn(x=x, y=y)["x"]), (2 * x + y) * 3)


def test_grad_vmap_and_outer_jit_of_apply():
    predict, init, weights = _mlp_nets()
    fn = rnn2jax.compile(predict, init_net=init)
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)

    def loss(params, x):
        return jnp.sum(fn.apply(params, {"data": x})["prob"][:, 0])

    grads = jax.grad(loss)(fn.params, x)
    # central finite difference on one weight, float32 tolerance
    eps = 1e-2
    p_plus = {**fn.params, "b2": fn.params["b2"].at[0].add(eps)}
    p_minus = {**fn.params, "b2": fn.params["b2"].at[0].add(-eps)}
    numeric = (loss(p_plus, x) - loss(p_minus, x)) / (2 * eps)
    np.testing.assert_allclose(float(grads["b2"][0]), float(numeric), rtol=2e-3, atol=1e-4)

    batched = jax.vmap(lambda xs: fn.apply(fn.params, {"data": xs})["prob"])(np.stack([x, 2 * x]))
    for i, scale in enumerate((1, 2)):
        np.testing.assert_allclose(
            np.asarray(batched[i]), _mlp_reference(scale * x, *weights), rtol=1e-5, atol=1e-6
        )
    jitted = jax.jit(lambda p, x: fn.apply(p, {"data": x}))(fn.params, x)
    np.testing.assert_allclose(np.asarray(jitted["prob"]), _mlp_reference(x, *weights), rtol=1e-5, atol=1e-6)


def test_random_init_is_seeded():
    init = create_net("init", [create_operator("XavierFill", [], "w", shape=[4, 3])])
    net = create_net("n", [create_operator("FC", ["x", "w", "b"], "y")])
    a = rnn2jax.compile(net, init_net=init, seed=0).params["w"]
    b = rnn2jax.compile(net, init_net=init, seed=0).params["w"]
    c = rnn2jax.compile(net, init_net=init, seed=1).params["w"]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    assert np.abs(np.asarray(a)).max() <= np.sqrt(3 / 3)


def test_init_net_that_reads_undefined_blobs():
    init = create_net("init", [create_operator("Copy", "from_db", "w")])
    with pytest.raises(rnn2jax.MissingBlobError, match="init net reads from_db"):
        rnn2jax.compile(create_net("n", [create_operator("Relu", "w", "y")]), init_net=init)
