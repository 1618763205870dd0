"""Loading: every form a net comes in, every real net, and the IR's decoded values."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

import rnn2jax
from helpers import REALNETS
from rnn2jax.caffe2.opdef import create_net, create_operator, make_argument, make_tensor
from rnn2jax.ir.netdef import Net, Plan
from rnn2jax.proto import caffe2_pb2 as pb

REAL_FILES = sorted(REALNETS.glob("*.pbtxt")) if REALNETS.is_dir() else []
needs_realnets = pytest.mark.skipif(not REAL_FILES, reason=f"real nets folder {REALNETS} is absent")


def _nets(loaded):
    return list(loaded.nets.values()) if isinstance(loaded, Plan) else [loaded]


def _text_message(path):
    """The file parsed by protobuf alone, as a NetDef or PlanDef (independently of rnn2jax's detection)."""
    text = path.read_text(encoding="utf-8")
    kind = pb.PlanDef if "execution_step" in text else pb.NetDef
    return text_format.Parse(text, kind())


@needs_realnets
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_real_net_loads_and_binary_round_trip_is_equal(path):
    from_text = rnn2jax.load(path)
    from_bytes = rnn2jax.load(_text_message(path).SerializeToString())
    assert type(from_text) is type(from_bytes)
    assert from_text == from_bytes
    assert rnn2jax.load(str(path)) == from_text
    assert rnn2jax.load(path.read_text(encoding="utf-8")) == from_text


@needs_realnets
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_real_net_ops_match_protobuf(path):
    """Op by op, the IR holds what protobuf parsed: types, inputs, outputs and argument names."""
    message = _text_message(path)
    protos = list(message.network) if isinstance(message, pb.PlanDef) else [message]
    for proto, net in zip(protos, _nets(rnn2jax.load(path)), strict=True):
        assert net.name == proto.name
        assert [op.type for op in net.ops] == [op.type for op in proto.op]
        assert [op.inputs for op in net.ops] == [tuple(op.input) for op in proto.op]
        assert [op.outputs for op in net.ops] == [tuple(op.output) for op in proto.op]
        assert [list(op.args) for op in net.ops] == [[a.name for a in op.arg] for op in proto.op]


@needs_realnets
def test_step_nets_in_s_are_parsed():
    """breadbread keeps its step nets as text-format strings in `arg.s`."""
    net = rnn2jax.load(REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt")
    (rnn,) = [op for op in net.ops if op.type == "RecurrentNetwork"]
    step, backward = rnn.net("step_net"), rnn.net("backward_step_net")
    assert isinstance(step, Net) and isinstance(backward, Net)
    assert [op.type for op in step.ops] == ["FC", "Sum", "LSTMUnit"]
    assert "LSTMUnitGradient" in [op.type for op in backward.ops]
    assert rnn.args["step_net"].kind == "n"


@needs_realnets
def test_step_nets_in_n_are_parsed():
    """dper embeds its step nets as messages in `arg.n`; both RecurrentNetwork ops carry two nets."""
    net = rnn2jax.load(REALNETS / "dper_train_net_lstm_pooling.pbtxt")
    rnns = [op for op in net.ops if op.type == "RecurrentNetwork"]
    assert len(rnns) == 2
    for op in rnns:
        assert [op.type for op in op.net("step_net").ops] == ["FC", "Sum", "LSTMUnit"]
        assert op.net("backward_step_net").ops[0].type == "LSTMUnitGradient"
        assert op.int("enable_rnn_executor") == 1
        assert op.ints("outputs_with_grads") == (1,)


@needs_realnets
def test_plan_nets_by_name():
    plan = rnn2jax.load(REALNETS / "breadbread_lstmdemo_train_plan.pbtxt")
    assert isinstance(plan, Plan)
    assert list(plan.nets) == ["char_rnn_init", "char_rnn_loop", "char_rnn", "char_rnn_save"]
    assert plan["char_rnn"].name == "char_rnn"
    assert plan.steps[0].substeps[0].networks == ("char_rnn_init",)
    with pytest.raises(rnn2jax.ParseError, match=r"no net 'nope'.*char_rnn_init"):
        plan["nope"]


def test_binary_file_with_text_suffix_and_text_in_bytes(tmp_path):
    """The format is decided by content: binary bytes in a .pbtxt file still load."""
    proto = create_net("n", [create_operator("Relu", "x", "y")], ["x"], ["y"])
    path = tmp_path / "net.pbtxt"
    path.write_bytes(proto.SerializeToString())
    text_path = tmp_path / "net.pb"
    text_path.write_text(text_format.MessageToString(proto))
    assert rnn2jax.load(path) == rnn2jax.load(text_path) == rnn2jax.load(proto)
    assert rnn2jax.load(text_format.MessageToString(proto).encode()) == rnn2jax.load(proto)


def test_binary_plan_is_told_from_net():
    net = create_net("inner", [create_operator("Relu", "x", "y")])
    plan = pb.PlanDef(name="p", network=[net])
    plan.execution_step.add(name="s", network=["inner"], num_iter=3)
    loaded = rnn2jax.load(plan.SerializeToString())
    assert isinstance(loaded, Plan)
    assert loaded["inner"].ops[0].type == "Relu"
    assert loaded.steps[0].num_iter == 3


def test_text_with_comments_tabs_and_utf8():
    text = '# 注释 comment\nname:\t"n"\nop {\n\t# 输入\n\tinput: "x"\n\toutput: "y"\n\ttype: "Relu"\n}\n'
    net = rnn2jax.load(text)
    assert net.name == "n" and net.ops[0].type == "Relu"


def test_old_cuda_gpu_id_spelling():
    net = rnn2jax.load(
        'op { type: "Relu" input: "x" output: "y" device_option { device_type: 1 cuda_gpu_id: 2 } }'
    )
    assert net.ops[0].device.device_type == 1 and net.ops[0].device.device_id == 2


def test_foreign_message_is_reread_from_bytes():
    """Any protobuf message named NetDef with SerializeToString works (e.g. an old caffe2_pb2.NetDef)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="foreign.proto", package="caffe2", syntax="proto2")
    op = file.message_type.add(name="OperatorDef")
    op.field.add(name="input", number=1, type=9, label=3)
    op.field.add(name="output", number=2, type=9, label=3)
    op.field.add(name="type", number=4, type=9, label=1)
    net = file.message_type.add(name="NetDef")
    net.field.add(name="name", number=1, type=9, label=1)
    net.field.add(name="op", number=2, type=11, label=3, type_name=".caffe2.OperatorDef")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    NetDef = message_factory.GetMessageClass(pool.FindMessageTypeByName("caffe2.NetDef"))
    foreign = NetDef(name="old")
    foreign.op.add(input=["a"], output=["b"], type="Tanh")
    loaded = rnn2jax.load(foreign)
    assert loaded.name == "old" and loaded.ops[0].type == "Tanh" and loaded.ops[0].inputs == ("a",)


def test_arguments_decode_to_python_values():
    inner = create_net("inner", [create_operator("Relu", "a", "b")])
    tensor = np.arange(6, dtype=np.int64).reshape(2, 3)
    op = create_operator(
        "X",
        [],
        [],
        f=1.5,
        i=3,
        s="text",
        floats=[1.0, 2.5],
        ints=[1, 2],
        strings=["a", "b"],
        n=inner,
        empty=[],
        nets=[inner, inner],
        t=make_tensor(tensor, "tt"),
    )
    op.arg.append(make_argument("step_net", text_format.MessageToString(inner)))
    (decoded,) = rnn2jax.load(create_net("n", [op])).ops
    assert decoded.float("f") == 1.5 and decoded.int("i") == 3 and decoded.str("s") == "text"
    assert decoded.floats("floats") == (1.0, 2.5) and decoded.ints("ints") == (1, 2)
    assert decoded.strings("strings") == ("a", "b")
    assert decoded.args["empty"].kind == "empty" and decoded.ints("empty") == ()
    assert decoded.net("n") == decoded.net("step_net") == rnn2jax.load(inner)
    assert [n.name for n in decoded.args["nets"].value] == ["inner", "inner"]
    np.testing.assert_array_equal(decoded.tensor("t").array, tensor)
    assert decoded.tensor("t").name == "tt" and not decoded.tensor("t").array.flags.writeable
    assert [label for label, _ in decoded.nested_nets()] == ["n", "nets[0]", "nets[1]", "step_net"]


@pytest.mark.parametrize(
    "dtype",
    [
        np.float32,
        np.float64,
        np.int32,
        np.int64,
        np.int16,
        np.int8,
        np.uint8,
        np.uint16,
        np.bool_,
        np.float16,
    ],
)
def test_tensor_round_trip(dtype):
    values = (np.arange(-3, 9) % 7).astype(dtype).reshape(3, 4)
    op = create_operator("X", [], [], t=make_tensor(values))
    decoded = rnn2jax.load(create_net("n", [op])).ops[0].tensor("t").array
    assert decoded.dtype == values.dtype
    np.testing.assert_array_equal(decoded, values)


def test_raw_data_tensor():
    values = np.linspace(-1, 1, 6, dtype=np.float32)
    proto = pb.TensorProto(dims=[2, 3], data_type=pb.TensorProto.FLOAT, raw_data=values.tobytes())
    op = pb.OperatorDef(type="X", arg=[pb.Argument(name="t", t=proto)])
    decoded = rnn2jax.load(pb.NetDef(op=[op])).ops[0].tensor("t").array
    np.testing.assert_array_equal(decoded, values.reshape(2, 3))


def test_engine_device_and_gradient_flag_are_kept():
    op = create_operator(
        "FC",
        ["x", "w", "b"],
        "y",
        engine="CUDNN",
        is_gradient_op=True,
        axis=2,
        use_cudnn=1,
        device_option=pb.DeviceOption(device_type=1, device_id=3),
    )
    (decoded,) = rnn2jax.load(create_net("n", [op])).ops
    assert decoded.engine == "CUDNN" and decoded.is_gradient_op and decoded.device.device_id == 3
    assert decoded.int("use_cudnn") == 1


def test_ir_is_immutable():
    net = rnn2jax.load(create_net("n", [create_operator("Relu", "x", "y", alpha=1.0)]))
    with pytest.raises(AttributeError):
        net.name = "m"
    with pytest.raises(TypeError):
        net.ops[0].args["alpha"] = None
