"""`caffe2.python`: Caffe2's Python front end (`core`, `workspace`, `model_helper`, `brew`, the RNN
builders, `optimizer`, ...) running on rnn2jax. Import the modules by their Caffe2 paths."""

from . import _import_c_extension  # noqa: F401  (it makes `workspace.C`, as Caffe2's workspace imports it)
