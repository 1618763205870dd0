"""Gradient makers of the array ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""
