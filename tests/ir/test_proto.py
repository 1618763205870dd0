"""The committed caffe2_pb2.py, metanet_pb2.py and hsm_pb2.py are what their .proto files generate, and the schemas
are Caffe2's."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.proto import hsm_pb2, metanet_pb2

ROOT = Path(__file__).resolve().parents[2]
MODULES = {"caffe2_pb2.py": pb, "metanet_pb2.py": metanet_pb2, "hsm_pb2.py": hsm_pb2}


def _gencode_version(source: str) -> str:
    match = re.search(r"# Protobuf Python Version: (\S+)", source)
    return match.group(1) if match else ""


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (protoc) is not installed")
@pytest.mark.parametrize("module", sorted(MODULES))
def test_committed_module_is_generated_from_proto(tmp_path, module):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_proto.py"), str(tmp_path)], check=True)
    fresh = (tmp_path / "rnn2jax" / "proto" / module).read_text()
    committed = (ROOT / "rnn2jax" / "proto" / module).read_text()
    if _gencode_version(fresh) == _gencode_version(committed):
        assert fresh == committed, f"{module} is stale: run `python scripts/generate_proto.py`"
    else:  # another protoc version: the schema it encodes must still be identical
        serialized = re.compile(rb"AddSerializedFile\((b'.*?')\)", re.S)
        fresh_file = descriptor_pb2.FileDescriptorProto.FromString(
            ast.literal_eval(serialized.search(fresh.encode()).group(1).decode())
        )
        committed_file = descriptor_pb2.FileDescriptorProto()
        MODULES[module].DESCRIPTOR.CopyToProto(committed_file)
        assert fresh_file == committed_file


def _fields(message) -> dict[str, tuple[int, int, int, str]]:
    return {
        f.name: (f.number, f.type, 3 if f.is_repeated else (2 if f.is_required else 1), str(f.default_value))
        for f in message.DESCRIPTOR.fields
    }


def test_argument_fields_match_caffe2():
    # (number, type, label) from caffe2.proto: 1 name string, 2 f float, 3 i int64, 4 s bytes, 10 t, 8 n,
    # 5 floats, 6 ints, 7 strings, 11 tensors, 9 nets, 12 qtensors.
    f = {k: v[:3] for k, v in _fields(pb.Argument).items()}
    assert f == {
        "name": (1, 9, 1),
        "f": (2, 2, 1),
        "i": (3, 3, 1),
        "s": (4, 12, 1),
        "t": (10, 11, 1),
        "n": (8, 11, 1),
        "floats": (5, 2, 3),
        "ints": (6, 3, 3),
        "strings": (7, 12, 3),
        "tensors": (11, 11, 3),
        "nets": (9, 11, 3),
        "qtensors": (12, 11, 3),
    }


def test_packed_only_where_caffe2_packs():
    packed = {f.name for f in pb.TensorProto.DESCRIPTOR.fields if f.GetOptions().packed}
    assert packed == {"float_data", "int32_data", "double_data", "int64_data"}
    assert not pb.Argument.DESCRIPTOR.fields_by_name["ints"].GetOptions().packed


def test_data_type_values_and_defaults():
    assert dict(pb.TensorProto.DataType.items()) == {
        "UNDEFINED": 0,
        "FLOAT": 1,
        "INT32": 2,
        "BYTE": 3,
        "STRING": 4,
        "BOOL": 5,
        "UINT8": 6,
        "INT8": 7,
        "UINT16": 8,
        "INT16": 9,
        "INT64": 10,
        "FLOAT16": 12,
        "DOUBLE": 13,
        "ZERO_COLLISION_HASH": 14,
        "REBATCHING_BUFFER": 15,
    }
    assert pb.TensorProto().data_type == pb.TensorProto.FLOAT
    assert pb.QTensorProto().data_type == pb.TensorProto.INT32
    assert pb.OperatorDef().is_gradient_op is False


def test_operator_net_plan_fields():
    assert {k: v[:3] for k, v in _fields(pb.OperatorDef).items()} == {
        "input": (1, 9, 3),
        "output": (2, 9, 3),
        "name": (3, 9, 1),
        "type": (4, 9, 1),
        "arg": (5, 11, 3),
        "device_option": (6, 11, 1),
        "engine": (7, 9, 1),
        "control_input": (8, 9, 3),
        "is_gradient_op": (9, 8, 1),
        "debug_info": (10, 9, 1),
        "domain": (11, 9, 1),
        "op_version": (12, 3, 1),
    }
    assert {k: v[:3] for k, v in _fields(pb.NetDef).items()} == {
        "name": (1, 9, 1),
        "op": (2, 11, 3),
        "type": (3, 9, 1),
        "num_workers": (4, 5, 1),
        "device_option": (5, 11, 1),
        "arg": (6, 11, 3),
        "external_input": (7, 9, 3),
        "external_output": (8, 9, 3),
        "partition_info": (9, 11, 3),
    }
    assert {k: v[:3] for k, v in _fields(pb.PlanDef).items()} == {
        "name": (1, 9, 1),
        "network": (2, 11, 3),
        "execution_step": (3, 11, 3),
    }
    assert {k: v[:3] for k, v in _fields(pb.DeviceOption).items()} == {
        "device_type": (1, 5, 1),
        "device_id": (2, 5, 1),
        "random_seed": (3, 13, 1),
        "node_name": (4, 9, 1),
        "numa_node_id": (5, 5, 1),
        "extra_info": (6, 9, 3),
    }
    steps = {k: v[:2] for k, v in _fields(pb.ExecutionStep).items()}
    assert steps["substep"] == (2, 11) and steps["num_iter"] == (4, 3) and steps["num_concurrent_instances"] == (13, 5)
    blob = {k: v[:2] for k, v in _fields(pb.BlobProto).items()}
    assert blob == {
        "name": (1, 9),
        "type": (2, 9),
        "tensor": (3, 11),
        "content": (4, 12),
        "qtensor": (5, 11),
        "content_num_chunks": (6, 5),
        "content_chunk_id": (7, 5),
    }
    assert {k: v[:2] for k, v in _fields(pb.TensorShape).items()} == {
        "dims": (1, 3),
        "data_type": (2, 14),
        "unknown_dims": (3, 5),
        "unknown_shape": (4, 8),
        "name": (5, 9),
    }


def test_metanet_fields_match_caffe2():
    # (number, type, label, default) from caffe2/proto/metanet.proto (9 string, 11 message; 1 optional,
    # 2 required, 3 repeated).
    assert _fields(metanet_pb2.ModelInfo) == {
        "project": (1, 9, 1, ""),
        "modelClass": (2, 9, 1, ""),
        "version": (3, 9, 1, ""),
        "predictorType": (4, 9, 1, "SINGLE_PREDICTOR"),
        "modelId": (5, 9, 1, ""),
    }
    assert {k: v[:3] for k, v in _fields(metanet_pb2.BlobsMap).items()} == {"key": (1, 9, 2), "value": (2, 9, 3)}
    for cls, value_type in ((metanet_pb2.NetsMap, "NetDef"), (metanet_pb2.PlansMap, "PlanDef")):
        assert {k: v[:3] for k, v in _fields(cls).items()} == {"key": (1, 9, 2), "value": (2, 11, 2)}
        assert cls.DESCRIPTOR.fields_by_name["value"].message_type is getattr(pb, value_type).DESCRIPTOR
    assert {k: v[:3] for k, v in _fields(metanet_pb2.StringMap).items()} == {"key": (1, 9, 2), "value": (2, 9, 2)}
    assert {k: v[:3] for k, v in _fields(metanet_pb2.MetaNetDef).items()} == {
        "blobs": (1, 11, 3),
        "nets": (2, 11, 3),
        "modelInfo": (3, 11, 1),
        "plans": (4, 11, 3),
        "applicationSpecificInfo": (5, 11, 3),
        "blobsOrder": (6, 9, 3),
        "preLoadBlobs": (7, 9, 3),
        "tensorBoundShapes": (8, 11, 1),
        "requestOnlyEmbeddings": (9, 9, 3),
        "aotConfig": (10, 11, 1),
    }
    fields = metanet_pb2.MetaNetDef.DESCRIPTOR.fields_by_name
    assert fields["tensorBoundShapes"].message_type is pb.TensorBoundShapes.DESCRIPTOR
    assert fields["aotConfig"].message_type is pb.AOTConfig.DESCRIPTOR


def test_hsm_fields_match_caffe2():
    # (number, type, label) from caffe2/proto/hsm.proto (5 int32, 9 string, 2 float, 11 message; 1 optional,
    # 3 repeated).
    strip = lambda cls: {k: v[:3] for k, v in _fields(cls).items()}  # noqa: E731
    assert strip(hsm_pb2.NodeProto) == {
        "children": (1, 11, 3),
        "word_ids": (2, 5, 3),
        "offset": (3, 5, 1),
        "name": (4, 9, 1),
        "scores": (5, 2, 3),
    }
    assert strip(hsm_pb2.TreeProto) == {"root_node": (1, 11, 1)}
    assert strip(hsm_pb2.HierarchyProto) == {"size": (1, 5, 1), "paths": (2, 11, 3)}
    assert strip(hsm_pb2.PathProto) == {"word_id": (1, 5, 1), "path_nodes": (2, 11, 3)}
    assert strip(hsm_pb2.PathNodeProto) == {"index": (1, 5, 1), "length": (2, 5, 1), "target": (3, 5, 1)}
