"""`caffe2.proto.metanet_pb2`: the same module object as `rnn2jax.proto.metanet_pb2`."""

import sys

from ...proto import metanet_pb2

sys.modules[__name__] = metanet_pb2
