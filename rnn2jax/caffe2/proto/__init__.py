"""`caffe2.proto`: rnn2jax's wire-compatible copies of Caffe2's schemas (`caffe2_pb2`, `metanet_pb2`, `hsm_pb2`)."""
