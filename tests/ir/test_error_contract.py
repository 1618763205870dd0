"""The error contract: escapes a fuzzing session found, each now a named `Rnn2JaxError` (message naming
the net, op and argument or blob) or, where real Caffe2 accepts the case, Caffe2's answer.

The nets are the builder's LSTM, mutated; real Caffe2 is asked in each test whether it refuses.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import rnn2jax
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import (
    BadArgumentError,
    InputTypeError,
    MissingBlobError,
    ParseError,
    Rnn2JaxError,
    ShapeError,
    UnwrittenStateError,
)
from rnn2jax.ops.backward_pass import get_backward_pass
from rnn2jax.proto import caffe2_pb2 as pb

T, N, D, H = 2, 2, 2, 3
OUTPUTS = ["lstm/hidden_state_all", "lstm/hidden_state_last", "lstm/cell_state_all", "lstm/cell_state_last"]
GRADS = ["lstm/i2h_grad", "lstm/gates_t_w_grad", "lstm/gates_t_b_grad", "h0_grad", "c0_grad", "x_grad"]
SHAPES = {"lstm/i2h": (T, N, 4 * H), "h0": (N, H), "c0": (N, H), "seq_lengths": (N,)}


def lstm_model() -> ModelHelper:
    reset_net_names()
    model = ModelHelper(name="contract")
    LSTM(model, "x", "seq_lengths", ("h0", "c0"), dim_in=D, dim_out=H, scope="lstm")
    return model


def op_of(net: pb.NetDef, kind: str = "RecurrentNetwork") -> pb.OperatorDef:
    (op,) = [o for o in net.op if o.type == kind]
    return op


def arg_of(op: pb.OperatorDef, name: str) -> pb.Argument:
    (arg,) = [a for a in op.arg if a.name == name]
    return arg


def training_net(model: ModelHelper) -> pb.NetDef:
    """The net plus its gradient ops for a gradient of `hidden_state_all` (fed as `hall_grad`)."""
    grad_ops, _ = get_backward_pass(model.net.Proto().op, {"lstm/hidden_state_all": "hall_grad"})
    train = pb.NetDef()
    train.CopyFrom(model.net.Proto())
    train.external_input.append("hall_grad")
    train.op.extend(grad_ops)
    return train


def params(model: ModelHelper) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        op.output[0]: (rng.standard_normal(list(arg_of(op, "shape").ints)) * 0.5).astype(np.float32)
        for op in model.param_init_net.Proto().op
    }


def inputs(steps: int = T, batch: int = N, train: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((steps, batch, D)).astype(np.float32),
        "h0": rng.standard_normal((batch, H)).astype(np.float32),
        "c0": rng.standard_normal((batch, H)).astype(np.float32),
        "seq_lengths": np.full(batch, steps, np.int32),
    }
    if train:
        feeds["hall_grad"] = rng.standard_normal((steps, batch, H)).astype(np.float32)
    return feeds


def in_caffe2(caffe2, model: ModelHelper, net: pb.NetDef, feeds, fetch) -> dict[str, np.ndarray]:
    caffe2.run([("net", model.param_init_net.Proto())], fetch=[])
    return caffe2.run([("net", net)], {**feeds, **params(model)}, fetch=list(fetch), reset=False)


def in_rnn2jax(model: ModelHelper, net: pb.NetDef, feeds, fetch) -> dict[str, np.ndarray]:
    fn = rnn2jax.compile(net, init_net=model.param_init_net.Proto(), params=params(model), outputs=list(fetch))
    return {name: np.asarray(value) for name, value in fn(feeds).items()}


def assert_close(got, want, names) -> None:
    for name in names:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


# 1. an empty batch --------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, 2])
def test_empty_batch(caffe2, steps):
    """N = 0: Caffe2 refuses any step (its links need non-empty tensors) and computes T = 0."""
    model = lstm_model()
    feeds = inputs(steps=steps, batch=0)
    if steps:
        with pytest.raises(Caffe2Error):
            in_caffe2(caffe2, model, model.net.Proto(), feeds, OUTPUTS)
        with pytest.raises(ShapeError, match=r"op #1 \(RecurrentNetwork\).*empty batch"):
            in_rnn2jax(model, model.net.Proto(), feeds, OUTPUTS)
    else:
        want = in_caffe2(caffe2, model, model.net.Proto(), feeds, OUTPUTS)
        assert_close(in_rnn2jax(model, model.net.Proto(), feeds, OUTPUTS), want, OUTPUTS)


# 2. verify: param / outputs_with_grads past the op's inputs / outputs --------------------------------


@pytest.mark.parametrize(("name", "values"), [("param", [3, 40]), ("outputs_with_grads", [7]), ("param", [-1])])
def test_verify_refuses_indices_out_of_range(name, values):
    model = lstm_model()
    arg_of(op_of(model.net.Proto()), name).ints[:] = values
    with pytest.raises(BadArgumentError, match=rf"op #1 \(RecurrentNetwork\): argument '{name}' names #"):
        rnn2jax.verify(model.net.Proto(), init_net=model.param_init_net.Proto(), shapes=SHAPES)


# 3. RecurrentNetworkGradient links naming missing blobs -------------------------------------------


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [
        ("link_external", MissingBlobError, "argument 'link_external' names 'missing_blob'"),
        ("backward_link_external", BadArgumentError, "argument 'backward_link_external' names 'missing_blob'"),
    ],
)
def test_gradient_link_to_a_missing_blob(caffe2, name, error, match):
    model = lstm_model()
    train = training_net(model)
    arg_of(op_of(train, "RecurrentNetworkGradient"), name).strings[4] = b"missing_blob"
    feeds = inputs(train=True)
    with pytest.raises(Caffe2Error):
        in_caffe2(caffe2, model, train, feeds, GRADS)
    with pytest.raises(error, match=rf"op #2 \(RecurrentNetworkGradient\): {match}"):
        in_rnn2jax(model, train, feeds, GRADS)


# 4. deeply nested step nets -----------------------------------------------------------------------


def nested_text(depth: int) -> str:
    net = 'op { type: "Relu" input: "a" output: "b" }'
    for _ in range(depth):
        net = f'op {{ type: "RecurrentNetwork" input: "x" output: "y" arg {{ name: "step_net" n {{ {net} }} }} }}'
    return f'name: "deep" {net}'


def test_step_nets_nested_64_deep_load():
    net = rnn2jax.load(nested_text(64))
    assert sum(1 for _ in net.walk()) == 65


@pytest.mark.parametrize("depth", [65, 200, 5000])
def test_step_nets_nested_deeper_than_64_are_refused(depth):
    with pytest.raises(ParseError, match=r"at most 64 deep|more than 64 deep"):
        rnn2jax.load(nested_text(depth))


def test_step_nets_nested_65_deep_as_messages_are_refused():
    message = pb.NetDef(name="deep")
    message.op.add(type="Relu", input=["a"], output=["b"])
    for _ in range(65):
        outer = pb.NetDef(name="deep")
        op = outer.op.add(type="RecurrentNetwork", input=["x"], output=["y"])
        op.arg.add(name="step_net").n.CopyFrom(message)
        message = outer
    with pytest.raises(ParseError, match="step nets nest more than 64 deep"):
        rnn2jax.load(message)


def _broken_names(field: str) -> bytes:
    """An LSTM net whose `field` holds bytes that are not UTF-8 (proto2 lets them through; a few flipped
    bytes in a real file give exactly this)."""
    net = lstm_model().net.Proto()
    target = {"input": net.op[0].input, "output": net.op[0].output, "external_input": net.external_input}
    target[field][0] = "broken__me"  # as long as its broken form, so lengths hold
    return net.SerializeToString().replace(b"broken__me", b"broken\xff\xfeme")


@pytest.mark.parametrize("field", ["input", "output", "external_input"])
def test_names_that_are_not_utf8_are_refused_at_load(field):
    """Found by the fuzzer: such a name reached compile() as bytes and escaped as a TypeError."""
    with pytest.raises(ParseError, match=rf"{field} #0 b'broken\\xff\\xfeme' is not UTF-8 text"):
        rnn2jax.load(_broken_names(field))


# 5, 6. Python values of the wrong type -----------------------------------------------------------


@pytest.mark.parametrize("outputs", [[b"lstm/hidden_state_all"], b"lstm/hidden_state_all", "lstm/hidden_state_all", 7])
def test_outputs_must_be_a_list_of_str(outputs):
    model = lstm_model()
    with pytest.raises(InputTypeError, match=r"net 'contract': outputs= must be"):
        rnn2jax.compile(model.net.Proto(), init_net=model.param_init_net.Proto(), outputs=outputs)


def test_calling_with_a_str_or_a_dict_array():
    model = lstm_model()
    fn = rnn2jax.compile(model.net.Proto(), init_net=model.param_init_net.Proto())
    with pytest.raises(InputTypeError, match=r"inputs must be a mapping of blob name -> array.*got a str"):
        fn("input")
    with pytest.raises(InputTypeError, match="input 'x' must be an array"):
        fn({**inputs(), "x": {"a": 1}})
    with pytest.raises(InputTypeError, match="input 'x' must be an array of numbers"):
        fn({**inputs(), "x": np.array(["a", "b"], dtype=object)})
    with pytest.raises(InputTypeError, match="input names must be blob names"):
        fn({**inputs(), 3: np.zeros(1)})


def test_apply_with_values_of_the_wrong_type():
    """`apply` is the pure function under jax.grad: it checks its arguments at trace time, and tracers pass."""
    model = lstm_model()
    fn = rnn2jax.compile(model.net.Proto(), init_net=model.param_init_net.Proto())
    with pytest.raises(InputTypeError, match=r"net 'contract': apply's params must be a mapping.*got a str"):
        fn.apply("params", inputs())
    with pytest.raises(InputTypeError, match=r"apply's inputs must be a mapping.*got a list"):
        fn.apply(fn.params, [1, 2])
    with pytest.raises(InputTypeError, match="input 'x' must be an array"):
        fn.apply(fn.params, {**inputs(), "x": "abc"})
    with pytest.raises(InputTypeError, match="names in apply's params must be blob names"):
        fn.apply({**fn.params, 3: np.zeros(1)}, inputs())
    with pytest.raises(MissingBlobError, match="reads blob 'x' before anything writes it"):
        fn.apply(fn.params, {k: v for k, v in inputs().items() if k != "x"})
    want = fn(inputs())
    got = jax.jit(fn.apply)(fn.params, inputs())
    assert set(got) == set(want)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)


def test_verify_params_of_the_wrong_type():
    """Found by the fuzzer: a dict (a step workspace) among verify's params escaped as a bare TypeError."""
    model = lstm_model()
    for params, match in (
        ({"h0": {"a": 1}}, "parameter 'h0' must be an array of numbers, got a dict"),
        ({"h0": "abc"}, "parameter 'h0' must be an array of numbers, got a str"),
        ([1, 2], "params= must be a mapping of blob name -> array, got a list"),
    ):
        with pytest.raises(InputTypeError, match=match):
            rnn2jax.verify(model.net.Proto(), init_net=model.param_init_net.Proto(), shapes=SHAPES, params=params)


def test_params_of_the_wrong_type():
    model = lstm_model()
    with pytest.raises(InputTypeError, match=r"params= must be a mapping .* got a int"):
        rnn2jax.compile(model.net.Proto(), params=12345)
    with pytest.raises(InputTypeError, match="parameter 'h0' must be an array"):
        rnn2jax.compile(model.net.Proto(), params={"h0": {"a": 1}})


def test_input_type_error_is_a_type_error_and_an_rnn2jax_error():
    assert issubclass(InputTypeError, TypeError) and issubclass(InputTypeError, Rnn2JaxError)


# 7. verify with a negative shape -----------------------------------------------------------------


@pytest.mark.parametrize("shape", [(T, -2, 4 * H), "2,-2,12", "2,a"])
def test_verify_refuses_a_bad_shape(shape):
    model = lstm_model()
    with pytest.raises(BadArgumentError, match=r"op #1 \(RecurrentNetwork\): input 'lstm/i2h'"):
        rnn2jax.verify(model.net.Proto(), init_net=model.param_init_net.Proto(), shapes={**SHAPES, "lstm/i2h": shape})


# 8. an offset that does not fit in 32 bits --------------------------------------------------------


@pytest.mark.parametrize("link", [3, 4])
def test_link_offset_beyond_int32(caffe2, link):
    """Caffe2 refuses: "Value 1099511627776 of argument link_offset cannot be represented correctly in a
    target type"."""
    model = lstm_model()
    arg_of(op_of(model.net.Proto()), "link_offset").ints[link] = 2**40
    with pytest.raises(Caffe2Error, match="link_offset"):
        in_caffe2(caffe2, model, model.net.Proto(), inputs(), OUTPUTS)
    with pytest.raises(BadArgumentError, match=r"argument 'link_offset' holds 1099511627776"):
        in_rnn2jax(model, model.net.Proto(), inputs(), OUTPUTS)


# 9. silent answers, each checked against Caffe2 ------------------------------------------------------


def test_link_internal_the_step_net_never_writes(caffe2):
    """The cell state's write link names a blob no step op writes: Caffe2 accepts, and the state rows
    past the initial one are never written (uninitialised memory in Caffe2, e.g. 5.6e-45). rnn2jax
    refuses, naming the step op that reads such a row, the link and the state."""
    model = lstm_model()
    arg_of(op_of(model.net.Proto()), "link_internal").strings[3] = b"unused_blob"
    want = in_caffe2(caffe2, model, model.net.Proto(), inputs(), OUTPUTS)
    assert set(want) == set(OUTPUTS)  # Caffe2 answers
    with pytest.raises(UnwrittenStateError, match=r"op #2 \(LSTMUnit\) reads 'lstm/cell_t_prev'.*link_internal.*"
                       r"'lstm/lstm/cell_t_prev_states'.*uninitialised"):  # fmt: skip
        in_rnn2jax(model, model.net.Proto(), inputs(), OUTPUTS)


def test_empty_step_net(caffe2):
    """A step net with no ops: Caffe2 accepts and writes no state row (uninitialised memory there).
    rnn2jax refuses, naming the output that would expose such rows, its alias arguments and the state."""
    model = lstm_model()
    del arg_of(op_of(model.net.Proto()), "step_net").n.op[:]
    want = in_caffe2(caffe2, model, model.net.Proto(), inputs(), OUTPUTS)
    assert set(want) == set(OUTPUTS)  # Caffe2 answers
    with pytest.raises(UnwrittenStateError, match=r"output 'lstm/hidden_state_all' \(argument 'alias_dst'.*"
                       r"'alias_offset' 1\).*no step writes"):  # fmt: skip
        in_rnn2jax(model, model.net.Proto(), inputs(), OUTPUTS)


def test_gradient_op_outputs_with_grads_out_of_range(caffe2):
    """On RecurrentNetworkGradient, an index in outputs_with_grads that matches no output is ignored by
    Caffe2: no output gradient flows in, and every gradient is zero. rnn2jax gives the same."""
    model = lstm_model()
    train = training_net(model)
    arg_of(op_of(train, "RecurrentNetworkGradient"), "outputs_with_grads").ints[:] = [7]
    want = in_caffe2(caffe2, model, train, inputs(train=True), GRADS)
    assert not any(v.any() for v in want.values())
    assert_close(in_rnn2jax(model, train, inputs(train=True), GRADS), want, GRADS)


def test_backward_link_window_is_not_read(caffe2):
    """Caffe2 reads no window for backward links (any `backward_link_window`, 0 included, is ignored):
    the gradients are those of the unmodified net, in Caffe2 and in rnn2jax."""
    model = lstm_model()
    train = training_net(model)
    want = in_caffe2(caffe2, model, train, inputs(train=True), GRADS)
    op_of(train, "RecurrentNetworkGradient").arg.add(name="backward_link_window", ints=[1, 1, 1, 1, 0])
    assert_close(in_caffe2(caffe2, model, train, inputs(train=True), GRADS), want, GRADS)
    assert_close(in_rnn2jax(model, train, inputs(train=True), GRADS), want, GRADS)


@pytest.mark.parametrize("kind", ["RecurrentNetwork", "RecurrentNetworkGradient"])
def test_link_window_of_zero_is_refused(caffe2, kind):
    """A forward link window of 0: Caffe2 accepts it. On the forward op its view of 0 rows is detached,
    so the cell state rows are never written (uninitialised memory comes out); on the gradient op (for
    this net) it computes what window 1 does. rnn2jax refuses it when decoding the op, naming the
    argument, rather than reproduce uninitialised memory."""
    model = lstm_model()
    train = training_net(model)
    op_of(train, kind).arg.add(name="link_window", ints=[1, 1, 1, 0, 1])
    in_caffe2(caffe2, model, train, inputs(train=True), GRADS)  # accepted
    with pytest.raises(BadArgumentError, match=rf"\({kind}\): argument 'link_window' is 0"):
        in_rnn2jax(model, train, inputs(train=True), GRADS)
