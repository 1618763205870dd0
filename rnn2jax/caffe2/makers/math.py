"""Gradient makers of the math ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""
