"""Gradient makers of the segment ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""
