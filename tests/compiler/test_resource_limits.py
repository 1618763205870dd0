"""The memory budget: fills, drawn inputs and given inputs over it are refused with a `ResourceError`
before any work starts (in milliseconds, not after a 120 TiB allocation), and XLA's RESOURCE_EXHAUSTED
becomes one too."""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.checking.comparison import draw_inputs
from rnn2jax.compiler.compiled_net import run_init_net
from rnn2jax.errors import BadArgumentError, ResourceError, Rnn2JaxError
from rnn2jax.ir import budget

HUGE = [2**40, 5]  # 20 TiB of float32


@pytest.fixture(autouse=True)
def default_budget(monkeypatch):
    """Each test starts from the default budget and leaves it there."""
    monkeypatch.delenv(budget.ENV_VAR, raising=False)
    previous = rnn2jax.set_memory_budget(None)
    yield
    rnn2jax.set_memory_budget(previous)


def fill_net(op_type: str = "ConstantFill", name: str = "n", **args) -> object:
    return create_net(name, [create_operator(op_type, [], ["x"], **args)], external_outputs=["x"])


def refused_quickly(call) -> ResourceError:
    start = time.perf_counter()
    with pytest.raises(ResourceError) as caught:
        call()
    assert time.perf_counter() - start < 2.0
    return caught.value


def test_resource_error_is_a_memory_error_and_exported():
    assert issubclass(rnn2jax.ResourceError, Rnn2JaxError)
    assert issubclass(rnn2jax.ResourceError, MemoryError)


def test_default_budget_is_half_of_physical_memory():
    assert rnn2jax.memory_budget() == budget.physical_memory() // 2
    assert budget.physical_memory() > 0


# ------------------------------------------------------------------------------------------------
# Fills


@pytest.mark.parametrize(
    "op_type, args, dtype",
    [
        ("ConstantFill", {"value": 1.0}, "float32"),
        ("ConstantFill", {"value": 1}, "int64"),  # an integer value makes an int64 fill, as in Caffe2
        ("XavierFill", {}, "float32"),
        ("GaussianFill", {}, "float32"),
        ("UniformFill", {}, "float32"),
        ("UniformIntFill", {}, "int32"),
        ("MSRAFill", {}, "float32"),
        ("RangeFill", {}, "float32"),
    ],
)
def test_huge_fill_in_an_init_net_is_refused_in_milliseconds(op_type, args, dtype):
    init = fill_net(op_type, shape=HUGE, **args)
    predict = create_net("p", [create_operator("Copy", ["x"], ["y"])], external_outputs=["y"])
    error = refused_quickly(lambda: rnn2jax.compile(predict, init_net=init))
    message = str(error)
    assert message.startswith(f"net 'n', op #0 ({op_type}): blob 'x' of shape [1099511627776, 5] {dtype} needs ")
    itemsize = np.dtype(dtype).itemsize
    assert f"{20 * itemsize // 4}.0 TiB" in message
    assert f"over the memory budget of {budget.format_bytes(rnn2jax.memory_budget())}" in message
    assert budget.ENV_VAR in message
    assert error.size == 2**40 * 5 * itemsize and error.budget == rnn2jax.memory_budget()


def test_huge_fill_in_the_net_itself_is_refused_at_compile():
    error = refused_quickly(lambda: rnn2jax.compile(fill_net(shape=HUGE)))
    assert "net 'n', op #0 (ConstantFill): blob 'x'" in str(error)


def test_huge_given_tensor_fill_shape_is_refused():
    # 2**40 values would not fit in an argument; a mismatching count is the first error, as before
    with pytest.raises(BadArgumentError, match="has 1 values"):
        rnn2jax.compile(fill_net("GivenTensorFill", shape=HUGE, values=[1.0]))


def test_input_as_shape_with_a_constant_input_is_refused():
    net = create_net(
        "n",
        [
            create_operator("GivenTensorIntFill", [], ["dims"], shape=[2], values=[2**20, 2**20]),
            create_operator("ConstantFill", ["dims"], ["x"], input_as_shape=1),
        ],
        external_outputs=["x"],
    )
    error = refused_quickly(lambda: rnn2jax.compile(net)())
    assert str(error).startswith("net 'n', op #1 (ConstantFill): blob 'x' of shape [1048576, 1048576] float32")
    assert "needs 4.0 TiB" in str(error)


def test_extra_shape_on_an_input_is_refused_before_filling():
    net = create_net("n", [create_operator("ConstantFill", ["a"], ["x"], extra_shape=[2**40])], external_outputs=["x"])
    fn = rnn2jax.compile(net)
    error = refused_quickly(lambda: fn(a=np.zeros((3,), np.float32)))
    assert "blob 'x' of shape [3, 1099511627776] float32" in str(error)


# ------------------------------------------------------------------------------------------------
# A low budget, set with the setter, then set back


def test_low_budget_refuses_a_modest_fill_and_setting_it_back_allows_it():
    net = fill_net(shape=[100, 10])  # 4000 bytes
    rnn2jax.set_memory_budget("1K")
    error = refused_quickly(lambda: rnn2jax.compile(net))
    assert "needs 3.9 KiB, over the memory budget of 1.0 KiB" in str(error)
    rnn2jax.set_memory_budget(None)
    assert rnn2jax.compile(net)()["x"].shape == (100, 10)


def test_low_budget_refuses_a_modest_input_and_setting_it_back_allows_it():
    net = create_net("n", [create_operator("Relu", ["data"], ["y"])], external_outputs=["y"])
    fn = rnn2jax.compile(net)
    x = np.ones((100, 10), np.float32)
    rnn2jax.set_memory_budget(1024)
    error = refused_quickly(lambda: fn(data=x))
    assert str(error).startswith("net 'n', op #0 (Relu): blob 'data' of shape [100, 10] float32 needs 3.9 KiB")
    rnn2jax.set_memory_budget(None)
    np.testing.assert_array_equal(fn(data=x)["y"], x)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_an_intermediate_blob_over_the_budget_is_refused_before_xla_allocates(jit):
    """An op's output shape is known at trace time: a MatMul whose [4096, 4096] output (64 MiB) exceeds a
    1 MiB budget is refused by name, though its inputs (16 KiB each) are within it."""
    net = create_net("n", [create_operator("MatMul", ["a", "b"], ["y"])], external_outputs=["y"])
    fn = rnn2jax.compile(net, jit=jit)
    a, b = np.ones((4096, 1), np.float32), np.ones((1, 4096), np.float32)
    rnn2jax.set_memory_budget("1M")
    error = refused_quickly(lambda: fn(a=a, b=b))
    assert str(error).startswith("net 'n', op #0 (MatMul): blob 'y' of shape [4096, 4096] float32 needs 64.0 MiB")
    assert error.size == 4096 * 4096 * 4 and error.budget == 2**20
    rnn2jax.set_memory_budget(None)
    np.testing.assert_array_equal(fn(a=a, b=b)["y"], a @ b)


def test_float64_inputs_count_as_float64():
    net = create_net("n", [create_operator("Relu", ["data"], ["y"])], external_outputs=["y"])
    fn = rnn2jax.compile(net)
    rnn2jax.set_memory_budget(800)
    fn(data=np.ones((100,), np.float64))  # 800 bytes: float64 stays float64
    with pytest.raises(ResourceError, match=r"'data' of shape \[101\] float64 needs 808 B"):
        fn(data=np.ones((101,), np.float64))


DTYPES = {"float32": 4, "int32": 4, "bool": 1}


@given(size=st.integers(64, 4096), dtype=st.sampled_from(sorted(DTYPES)))
def test_fills_just_below_the_budget_pass_and_just_above_are_refused(size, dtype):
    itemsize = DTYPES[dtype]
    fits = size // itemsize
    code = {"float32": 1, "int32": 2, "bool": 5}[dtype]
    rnn2jax.set_memory_budget(size)
    try:
        out = rnn2jax.compile(fill_net(shape=[fits], dtype=code, value=1.0))()["x"]
        assert out.shape == (fits,) and out.nbytes <= size
        with pytest.raises(ResourceError, match="over the memory budget") as caught:
            rnn2jax.compile(fill_net(shape=[fits + 1], dtype=code, value=1.0))
        assert (caught.value.size, caught.value.budget) == ((fits + 1) * itemsize, size)
    finally:
        rnn2jax.set_memory_budget(None)


@given(size=st.integers(64, 4096))
def test_inputs_just_below_the_budget_pass_and_just_above_are_refused(size):
    net = create_net("n", [create_operator("Relu", ["data"], ["y"])], external_outputs=["y"])
    fn = rnn2jax.compile(net, jit=False)
    fits = size // 4
    rnn2jax.set_memory_budget(size)
    try:
        assert fn(data=np.ones((fits,), np.float32))["y"].shape == (fits,)
        with pytest.raises(ResourceError):
            fn(data=np.ones((fits + 1,), np.float32))
    finally:
        rnn2jax.set_memory_budget(None)


# ------------------------------------------------------------------------------------------------
# verify and compare draw their inputs only after checking them

T, N, D, H = 2, 2, 2, 3
SHAPES = {"lstm/i2h": (T, N, 4 * H), "h0": (N, H), "c0": (N, H), "seq_lengths": (N,)}


def lstm_model() -> ModelHelper:
    reset_net_names()
    model = ModelHelper(name="limits")
    LSTM(model, "x", "seq_lengths", ("h0", "c0"), dim_in=D, dim_out=H, scope="lstm")
    return model


def test_verify_with_a_huge_shape_is_refused_in_milliseconds():
    model = lstm_model()
    shapes = {**SHAPES, "lstm/i2h": (2**40, N, 4 * H)}
    error = refused_quickly(
        lambda: rnn2jax.verify(model.net.Proto(), init_net=model.param_init_net.Proto(), shapes=shapes)
    )
    message = str(error)
    assert "(RecurrentNetwork): blob 'lstm/i2h' of shape [1099511627776, 2, 12] float32 needs 96.0 TiB" in message
    assert f"over the memory budget of {budget.format_bytes(rnn2jax.memory_budget())}" in message


def test_verify_with_a_low_budget_is_refused_and_passes_when_set_back():
    model = lstm_model()
    params = run_init_net(model.param_init_net.Proto())
    rnn2jax.set_memory_budget(100)
    with pytest.raises(ResourceError, match=r"blob 'lstm/i2h' of shape \[2, 2, 12\] float32 needs 192 B"):
        rnn2jax.verify(model.net.Proto(), params=params, shapes=SHAPES)
    rnn2jax.set_memory_budget(None)
    assert rnn2jax.verify(model.net.Proto(), params=params, shapes=SHAPES).ok


def test_compare_draw_inputs_refuses_a_huge_shape():
    net = create_net("n", [create_operator("Relu", ["data"], ["y"])], external_outputs=["y"])
    fn = rnn2jax.compile(net)
    rng = np.random.default_rng(0)
    error = refused_quickly(lambda: draw_inputs(fn, {}, {"data": (2**40, 5)}, rng))
    assert str(error).startswith(
        "net 'n', op #0 (Relu): blob 'data' of shape [1099511627776, 5] float32 needs 20.0 TiB"
    )
    assert draw_inputs(fn, {}, {"data": (2, 5)}, rng)["data"].shape == (2, 5)


# ------------------------------------------------------------------------------------------------
# XLA's RESOURCE_EXHAUSTED


def test_xla_resource_exhausted_becomes_a_resource_error(monkeypatch):
    net = create_net("n", [create_operator("Relu", ["data"], ["y"])], external_outputs=["y"])
    fn = rnn2jax.compile(net)

    def out_of_memory(*_):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 bytes.")

    monkeypatch.setattr(fn, "_executable", lambda _static: out_of_memory)
    with pytest.raises(ResourceError, match=r"^net 'n': XLA ran out of memory running the net") as caught:
        fn(data=np.ones(2, np.float32))
    assert isinstance(caught.value.__cause__, jax.errors.JaxRuntimeError)


def test_other_xla_errors_pass_through(monkeypatch):
    net = create_net("n", [create_operator("Relu", ["data"], ["y"])], external_outputs=["y"])
    fn = rnn2jax.compile(net)

    def broken(*_):
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    monkeypatch.setattr(fn, "_executable", lambda _static: broken)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        fn(data=np.ones(2, np.float32))


# ------------------------------------------------------------------------------------------------
# The environment variable and the setter


@pytest.mark.parametrize(
    "text, size",
    [
        ("1024", 1024),
        ("512K", 512 * 2**10),
        ("64m", 64 * 2**20),
        ("8G", 8 * 2**30),
        ("8GiB", 8 * 2**30),
        ("8GB", 8 * 2**30),
        ("1.5T", int(1.5 * 2**40)),
        (" 2 G ", 2 * 2**30),
    ],
)
def test_env_var_sizes(monkeypatch, text, size):
    monkeypatch.setenv(budget.ENV_VAR, text)
    assert rnn2jax.memory_budget() == size


@pytest.mark.parametrize("text", ["lots", "8X", "-1G", "G", "0", "1e9", "8 G B extra"])
def test_bad_env_var_is_a_clear_error(monkeypatch, text):
    monkeypatch.setenv(budget.ENV_VAR, text)
    with pytest.raises(BadArgumentError, match=budget.ENV_VAR) as caught:
        rnn2jax.memory_budget()
    assert repr(text) in str(caught.value)
    with pytest.raises(BadArgumentError, match=budget.ENV_VAR):
        rnn2jax.compile(fill_net(shape=[2]))


def test_env_var_sets_the_budget_of_fills(monkeypatch):
    monkeypatch.setenv(budget.ENV_VAR, "1K")
    with pytest.raises(ResourceError, match=r"over the memory budget of 1\.0 KiB"):
        rnn2jax.compile(fill_net(shape=[100, 10]))
    monkeypatch.setenv(budget.ENV_VAR, "1M")
    assert rnn2jax.compile(fill_net(shape=[100, 10]))()["x"].shape == (100, 10)


def test_setter_overrides_the_env_var_and_none_goes_back_to_it(monkeypatch):
    monkeypatch.setenv(budget.ENV_VAR, "1M")
    assert rnn2jax.set_memory_budget("2K") is None
    assert rnn2jax.memory_budget() == 2048
    assert rnn2jax.set_memory_budget(None) == 2048
    assert rnn2jax.memory_budget() == 2**20


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "nope", [1]])
def test_setter_refuses_bad_values(value):
    with pytest.raises(BadArgumentError, match="set_memory_budget"):
        rnn2jax.set_memory_budget(value)
    assert rnn2jax.memory_budget() == budget.physical_memory() // 2


def test_physical_memory_falls_back_when_the_os_does_not_say(monkeypatch):
    def unknown(name):
        raise ValueError(name)

    monkeypatch.setattr(budget.os, "sysconf", unknown)
    assert budget.physical_memory() == budget.FALLBACK_PHYSICAL
    assert rnn2jax.memory_budget() == budget.FALLBACK_PHYSICAL // 2
