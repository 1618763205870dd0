"""`caffe2.python`: Caffe2's Python front end (`core`, `workspace`, `model_helper`, `brew`, the RNN
builders, `optimizer`, ...) running on rnn2jax. Import the modules by their Caffe2 paths."""
