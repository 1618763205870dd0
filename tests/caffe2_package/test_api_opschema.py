"""`workspace.C.OpSchema` (read by Caffe2's serialized_test/coverage.py, imported by every serialized test):
the arity rnn2jax's registry holds equals the schema real Caffe2 registers, and unknown ops have none."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rnn2jax.caffe2.python import core, workspace

CAFFE2_PYTHON = os.environ.get(
    "RNN2JAX_CAFFE2_PYTHON", str(Path(__file__).resolve().parents[2] / ".venv-caffe2" / "bin" / "python")
)
# Not listed, as the schemas differ: Caffe2 1.10's LayerNorm/LayerNormGradient schemas (c10-exported) set
# no arity (0..inf), rnn2jax's registry checks the real one (1..3 and 5..6 inputs); Caffe2's Concat schema
# says exactly 2 outputs, rnn2jax also runs it with one (split_info left out).
OPS = ["GRUUnit", "LSTMUnit", "FC", "PackRNNSequence", "UnpackRNNSequence", "Sum", "Split", "RecurrentNetwork"]
ARITY = ("min_input", "max_input", "min_output", "max_output")

_SCRIPT = """
import json, sys
from caffe2.python import workspace
out = {}
for name in sys.argv[1:]:
    s = workspace.C.OpSchema.get(name)
    out[name] = None if s is None else [s.min_input, s.max_input, s.min_output, s.max_output, s.private,
                                        [s.CalculateOutput(n) for n in range(4)]]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def real_schemas(caffe2) -> dict:
    """The schemas of real Caffe2 (the `caffe2` fixture builds, or skips without, its venv)."""
    done = subprocess.run(
        [CAFFE2_PYTHON, "-c", _SCRIPT, *OPS, "Free", "NoSuchOp"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("op_type", OPS)
def test_arity_matches_real_caffe2(real_schemas: dict, op_type: str) -> None:
    schema = workspace.C.OpSchema.get(op_type)
    assert schema is not None
    calculated = [schema.CalculateOutput(n) for n in range(4)]  # caffe2.python.functional names outputs by it
    assert [*(getattr(schema, a) for a in ARITY), schema.private, calculated] == real_schemas[op_type]
    assert schema.num_inputs_allowed(schema.min_input) and not schema.num_inputs_allowed(schema.min_input - 1)


def test_unknown_op_has_no_schema(real_schemas: dict) -> None:
    assert real_schemas["NoSuchOp"] is None
    assert workspace.C.OpSchema.get("NoSuchOp") is None
    assert "NoSuchOp" not in core._GetRegisteredOperators()
    assert {"GRUUnit", "RecurrentNetwork", "RecurrentNetworkBlobFetcher"} <= core._GetRegisteredOperators()


def test_calculate_output_of_same_number_of_output(real_schemas: dict) -> None:
    """Free's schema says SameNumberOfOutput: its output count is its input count (its arity differs here)."""
    assert [workspace.C.OpSchema.get("Free").CalculateOutput(n) for n in range(4)] == real_schemas["Free"][-1]
