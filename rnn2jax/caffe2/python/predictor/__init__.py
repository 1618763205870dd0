"""Caffe2's `caffe2.python.predictor`: writing and reading predictor exports (`predictor_exporter`)."""
