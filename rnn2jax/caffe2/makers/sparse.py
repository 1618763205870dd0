"""Gradient makers of the sparse ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""
