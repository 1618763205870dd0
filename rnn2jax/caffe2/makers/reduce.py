"""Gradient makers of the reduce ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""
