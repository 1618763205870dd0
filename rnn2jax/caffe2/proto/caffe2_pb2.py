"""`caffe2.proto.caffe2_pb2`: the same module object as `rnn2jax.proto.caffe2_pb2`, so messages from either
path are one type. As Caffe2's `caffe2/proto/__init__.py` did, the device types are also given their
short names (`caffe2_pb2.CPU`, `caffe2_pb2.CUDA`, ...)."""

import sys

from ...proto import caffe2_pb2

for _name in caffe2_pb2.DeviceTypeProto.keys():  # noqa: SIM118 (an enum wrapper, not a dict)
    setattr(caffe2_pb2, _name.removeprefix("PROTO_"), caffe2_pb2.DeviceTypeProto.Value(_name))

sys.modules[__name__] = caffe2_pb2
