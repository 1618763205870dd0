"""Gradient makers of the conv ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""
