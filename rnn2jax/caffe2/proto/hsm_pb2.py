"""`caffe2.proto.hsm_pb2`: the same module object as `rnn2jax.proto.hsm_pb2`."""

import sys

from ...proto import hsm_pb2

sys.modules[__name__] = hsm_pb2
