"""Gradient makers of the activation ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""
