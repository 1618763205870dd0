"""Caffe2's Python API as its own API/runtime test files (workspace_test.py, core_test.py, scope_test.py, ...)
meet it: each piece of Caffe2 source runs here and in the real-Caffe2 venv, and the answers are compared.
"""

from __future__ import annotations

from test_api_core import real_caffe2, run_here  # noqa: F401  (real_caffe2 is a fixture)

DEVICE_OPTIONS = """
R = {}
pairs = []
for t1, i1, t2, i2 in [(None, 5, None, 0), (0, 5, None, 0), (1, 0, None, 0), (1, 0, 0, 0), (1, 1, 1, 1),
                       (1, 1, 1, 2), (0, 0, 0, 3)]:
    a, b = caffe2_pb2.DeviceOption(), caffe2_pb2.DeviceOption()
    if t1 is not None:
        a.device_type = t1
    if t2 is not None:
        b.device_type = t2
    a.device_id, b.device_id = i1, i2
    pairs.append(core.device_option_equal(a, b))
R["equal"] = pairs
R["engine"] = [core.IsOperatorWithEngine("Relu", "DEFAULT"), core.IsOperatorWithEngine("Relu", "NOEXIST"),
               core.IsOperatorWithEngine("NoSuchOpXyz", "DEFAULT")]
R["registered"] = [name in core._REGISTERED_OPERATORS for name in ("Relu", "FC", "NoSuchOpXyz")]
"""


def test_device_option_equality_and_registered_operators_match_caffe2(real_caffe2):
    assert run_here(DEVICE_OPTIONS) == real_caffe2(DEVICE_OPTIONS)
