"""Caffe2's EnforceInplace schemas (rnn2jax/caffe2/python/_inplace.py): the table says what real Caffe2's
`OpSchema.inplace_enforced` says, and memonger's schema check refuses an op that breaks it, as Caffe2's
`run_schema_check` does (memonger_test.py's test_forward_optim_tree_enforce_inplace_op_invalid)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rnn2jax.caffe2.proto import caffe2_pb2
from rnn2jax.caffe2.python import caffe2_pybind11_state as C
from rnn2jax.caffe2.python import workspace
from rnn2jax.caffe2.python._inplace import inplace_enforced

ROOT = Path(__file__).resolve().parents[2]
TYPES = ("IndexFreeze", "Append", "AtomicIter", "SparseAdagrad", "EnqueueBlobs", "SpatialBN", "Relu", "Sum", "Free")


def test_the_table_is_caffe2s():
    python = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python"))
    if not python.exists():
        pytest.skip(f"real Caffe2 unavailable: no interpreter at {python}")
    code = (
        "import json; from caffe2.python import workspace; S = workspace.C.OpSchema.get; "
        "grid = lambda t: [[S(t).inplace_enforced(i, o) for o in range(4)] for i in range(6)]; "
        f"print(json.dumps({{t: grid(t) for t in {TYPES!r}}}))"
    )
    real = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
    assert real.returncode == 0, real.stderr[-2000:]
    want = json.loads(real.stdout.splitlines()[-1])
    assert {t: [[inplace_enforced(t, i, o) for o in range(4)] for i in range(6)] for t in TYPES} == want
    assert workspace.C.OpSchema.get("IndexFreeze").inplace_enforced(0, 0)


def _net(*ops: tuple[str, list[str], list[str]]) -> bytes:
    net = caffe2_pb2.NetDef(name="n")
    for op_type, inputs, outputs in ops:
        net.op.add(type=op_type, input=inputs, output=outputs)
    return net.SerializeToString()


def test_memonger_refuses_an_op_that_breaks_its_in_place_schema():
    ops = [("IndexFreeze", ["A"], ["B"]), ("Sum", ["B", "B"], ["C"]), ("Relu", ["C"], ["D"])]
    with pytest.raises(RuntimeError, match=r"Input index 0 \(A\) and output idx 0 \(B\) are not in-place"):
        C.memonger_compute_blob_recycling_for_dag(_net(*ops), ["A"], [0, 1, 2], {"B", "C", "D"}, "", set(), {})
    ops[0] = ("IndexFreeze", ["A"], ["A"])
    C.memonger_compute_blob_recycling_for_dag(_net(*ops), ["A"], [0, 1, 2], {"C", "D"}, "", set(), {})
