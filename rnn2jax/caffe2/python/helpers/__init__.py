"""Caffe2's `caffe2.python.helpers`: the functions behind `brew`, importable one module at a time.

Called directly (`helpers.fc.fc(model, ...)`), a helper uses only the keywords it is given, as in
Caffe2; `brew.<helper>` adds the model's `arg_scope` and any `helpers.arg_scope.arg_scope` first.
"""
