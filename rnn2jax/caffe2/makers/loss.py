"""Gradient makers of the loss ops (Caffe2's REGISTER_GRADIENT, as OperatorDefs)."""
