"""Building Caffe2 nets in Python the way Caffe2's own front end did, for users with no Caffe2 left.

The functions here emit rnn2jax's wire-compatible protobuf messages (`rnn2jax.proto.caffe2_pb2`).
"""

from .core import create_net, create_operator, make_argument, make_tensor

__all__ = ["create_net", "create_operator", "make_argument", "make_tensor"]
