"""docs/ops.md is current, and every op rnn2jax lowers is checked against real Caffe2.

The scoreboard is regenerated here from the same registries the script reads (real Caffe2's through the
oracle, rnn2jax's, and the differential tests' CASES tables), so a new op, maker or test that is not in
the committed file fails this test: run `.venv/bin/python scripts/ops_scoreboard.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import ops_scoreboard  # noqa: E402

from rnn2jax.ops.gradient_makers import gradient_maker_types  # noqa: E402
from rnn2jax.ops.registry import REGISTRY, lowered_types, supported  # noqa: E402


@pytest.fixture(scope="module")
def registries(caffe2):
    supported("FC")  # loads every op family
    return caffe2.catalog(), caffe2.gradient_kinds(), ops_scoreboard.differential_cases()


def test_scoreboard_is_current(registries):
    catalog, kinds, tested = registries
    text = ops_scoreboard.render(catalog, kinds, set(lowered_types()), gradient_maker_types(), tested) + "\n"
    committed = ops_scoreboard.OUTPUT.read_text() if ops_scoreboard.OUTPUT.exists() else ""
    assert committed == text, "docs/ops.md is stale: run .venv/bin/python scripts/ops_scoreboard.py"


def test_every_lowered_op_is_a_caffe2_op(registries):
    catalog, _, _ = registries
    assert set(REGISTRY) <= set(catalog.ops), sorted(set(REGISTRY) - set(catalog.ops))


# Caffe2's CPU build cannot create these ("Cannot create operator of type 'CopyCPUToGPU' on the device
# 'CPU'"), so their gradient ops (each other) cannot run there; their forward is compared with Caffe2's Copy and their
# builder gradient makers with Caffe2's byte for byte (tests/test_caffe2_ops_shape.py).
CANNOT_RUN_ON_CAFFE2_CPU = {"CopyCPUToGPU", "CopyGPUToCPU"}


def test_every_lowered_op_has_a_differential_test(registries):
    _, kinds, tested = registries
    untested = sorted(lowered_types() - tested.forward - set(tested.gradient_ops))
    assert not untested, f"no differential test against real Caffe2 for: {', '.join(untested)}"
    with_gradient = {t for t in lowered_types() if kinds.get(t) == "gradient"} - CANNOT_RUN_ON_CAFFE2_CPU
    no_gradient_test = sorted(with_gradient - tested.with_gradient)
    assert not no_gradient_test, f"Caffe2 has a gradient but no gradient test: {', '.join(no_gradient_test)}"
