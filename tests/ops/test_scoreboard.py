"""docs/ops.md is current, and every op rnn2jax lowers is checked against real Caffe2.

The scoreboard is regenerated here from the same registries the script reads (real Caffe2's through the oracle,
rnn2jax's, and the differential tests' CASES tables), so a new op, maker or test that is not in the committed file
fails this test: run `.venv/bin/python scripts/ops_scoreboard.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import ops_scoreboard  # noqa: E402

from rnn2jax.errors import UnsupportedOpError  # noqa: E402
from rnn2jax.ir.netdef import decode_net  # noqa: E402
from rnn2jax.ops import registry  # noqa: E402
from rnn2jax.ops.facets import FACETS, UNSTATED, Absent, Roles  # noqa: E402
from rnn2jax.ops.gradient_makers import gradient_maker_types  # noqa: E402
from rnn2jax.ops.registry import REGISTRY, lowered_keys, operator_keys, supported  # noqa: E402
from rnn2jax.ops.unsupported import WHY_UNSUPPORTED  # noqa: E402
from rnn2jax.proto import caffe2_pb2 as pb  # noqa: E402


@pytest.fixture(scope="module")
def registries(caffe2):
    _all_records()  # every op family, and the Caffe2 API's host ops
    return caffe2.catalog(), caffe2.gradient_kinds(), ops_scoreboard.differential_cases()


def test_scoreboard_is_current(registries):
    catalog, kinds, tested = registries
    records = dict(REGISTRY)
    text = ops_scoreboard.render(catalog, kinds, set(lowered_keys()), gradient_maker_types(), tested, records) + "\n"
    committed = ops_scoreboard.OUTPUT.read_text() if ops_scoreboard.OUTPUT.exists() else ""
    assert committed == text, "docs/ops.md is stale: run .venv/bin/python scripts/ops_scoreboard.py"


# Caffe2 ops its source has but the torch 1.10.2 wheel does not register (RedisStoreHandlerCreate is built only
# with USE_REDIS); caffe2/distributed/redis_store_handler_op.h documents its arguments.
NOT_IN_THE_WHEEL = {"RedisStoreHandlerCreate"}


def test_every_lowered_op_is_a_caffe2_op(registries):
    catalog, _, _ = registries
    ours = {key for record in REGISTRY.values() for key in operator_keys(record)} - NOT_IN_THE_WHEEL
    assert ours <= set(catalog.ops), sorted(ours - set(catalog.ops))
    assert not NOT_IN_THE_WHEEL & set(catalog.ops), "the wheel has it after all: drop it from NOT_IN_THE_WHEEL"


# Caffe2's CPU build cannot create these ("Cannot create operator of type 'CopyCPUToGPU' on the device
# 'CPU'"), so their gradient ops (each other) cannot run there; their forward is compared with Caffe2's Copy and their
# builder gradient makers with Caffe2's byte for byte (tests/ops/test_shape.py).
CANNOT_RUN_ON_CAFFE2_CPU = {"CopyCPUToGPU", "CopyGPUToCPU"}


def test_every_lowered_op_has_a_differential_test(registries):
    _, kinds, tested = registries
    untested = sorted(lowered_keys() - tested.forward - set(tested.gradient_ops))
    assert not untested, f"no differential test against real Caffe2 for: {', '.join(untested)}"
    with_gradient = {t for t in lowered_keys() if kinds.get(t) == "gradient"} - CANNOT_RUN_ON_CAFFE2_CPU
    no_gradient_test = sorted(with_gradient - tested.with_gradient)
    assert not no_gradient_test, f"Caffe2 has a gradient but no gradient test: {', '.join(no_gradient_test)}"


def test_every_op_not_run_says_why(registries):
    """docs/ops.md lists the rest, each with its reason: every op type real Caffe2 registers that rnn2jax neither
    lowers nor runs as a host op has one in rnn2jax/ops/unsupported.py, and no reason is kept for one that runs."""
    catalog, _, _ = registries
    records = _all_records()
    runs = {k for r in records.values() if r.build is not None or r.host is not None for k in operator_keys(r)}
    types, _ = ops_scoreboard.op_types(catalog.ops)
    unexplained = sorted(types - runs - set(WHY_UNSUPPORTED))
    assert not unexplained, f"neither run nor explained in rnn2jax/ops/unsupported.py: {', '.join(unexplained)}"
    stale = sorted(set(WHY_UNSUPPORTED) & runs)
    assert not stale, f"rnn2jax runs these now: drop their reasons from rnn2jax/ops/unsupported.py: {stale}"


def test_every_dnnlowp_engine_key_is_run_or_refused(registries):
    """Under a DNNLOWP engine Caffe2 runs a quantized class, not the type's float (or QNNPACK) kernel: each such
    key real Caffe2 registers is lowered (a record, or an engine variant of one) or refused with its reason."""
    catalog, _, _ = registries
    keys = {k for k in catalog.ops if "_ENGINE_DNNLOWP" in k}
    explained = {k for k in keys if k in WHY_UNSUPPORTED or k.split("_ENGINE_")[0] in WHY_UNSUPPORTED}
    unexplained = sorted(keys - lowered_keys() - explained)
    assert not unexplained, f"neither lowered nor refused (rnn2jax/ops/unsupported.py): {', '.join(unexplained)}"
    op = decode_net(pb.NetDef(name="n", op=[pb.OperatorDef(type="Add", engine="DNNLOWP", input=["a", "b"])])).ops[0]
    with pytest.raises(UnsupportedOpError, match=r"'Add' under engine 'DNNLOWP' is not supported: not lowered yet"):
        registry.lookup(op)


def test_unsupported_op_error_gives_the_reason():
    net = pb.NetDef(name="gpu_net")
    net.op.add(type="NCCLAllreduce", input=["x"], output=["x"])
    with pytest.raises(UnsupportedOpError, match=r"CUDA-only in Caffe2") as raised:
        registry.check_supported(decode_net(net))
    assert "NCCLAllreduce" in str(raised.value) and "gpu_net" in str(raised.value)
    op = pb.OperatorDef(type="Recurrent", engine="CUDNN", input=["x"], output=["y"])
    net = pb.NetDef(name="cudnn_net", op=[op])
    with pytest.raises(UnsupportedOpError, match=r"cuDNN's fused RNN .*op #0|op #0.*cuDNN's fused RNN"):
        registry.lookup(decode_net(net).ops[0])


def test_an_engine_only_type_counts_as_its_engine_keys(registries):
    """DNNLOWP's Quantize exists in Caffe2 only as Quantize_ENGINE_DNNLOWP etc., each an op type of the
    scoreboard: rnn2jax's one record of Quantize, which accepts those engines, counts as each of them."""
    catalog, kinds, tested = registries
    record = REGISTRY["Quantize"]
    assert "Quantize" not in catalog.ops and "Quantize" not in lowered_keys()
    assert set(operator_keys(record)) == {k for k in catalog.ops if k.startswith("Quantize_ENGINE_")}
    assert set(operator_keys(record)) <= lowered_keys()
    text = ops_scoreboard.render(catalog, kinds, set(lowered_keys()), gradient_maker_types(), tested, dict(REGISTRY))
    row = next(line for line in text.splitlines() if line.startswith("| Quantize_ENGINE_DNNLOWP |"))
    assert "| yes | `ops/dnnlowp.py` |" in row and row.endswith("| fwd |"), row
    assert "Quantize," not in text.split("also registers", 1)[-1].split("\n", 1)[0]


def _all_records() -> dict:
    """Every record, the Caffe2 API's host ops (Python, RecurrentNetworkBlobFetcher) included."""
    import rnn2jax.caffe2.python.workspace  # noqa: F401  (registers the Caffe2 API's host ops)

    supported("FC")  # loads every op family
    return dict(REGISTRY)


def test_every_op_states_each_facet_or_that_it_has_none():
    unstated = [(t, f) for t, record in _all_records().items() for f in FACETS if getattr(record, f) is UNSTATED]
    assert not unstated, f"facets nobody stated (attach one, or declare it Absent with why): {unstated}"
    for op_type, record in _all_records().items():
        assert record.module, f"{op_type} names no module"
        assert record.build is not None or record.host is not None, f"{op_type} has neither lowering nor host run"
        for name in FACETS:
            value = getattr(record, name)
            assert isinstance(value, Absent | Roles) or callable(value), (op_type, name, value)
            if isinstance(value, Absent):
                assert value.why and value is not UNSTATED, (op_type, name)


# One op per family of facets, across families: every facet each has is in its family module (its own code,
# or a shared shape the family attaches from the ops layer's vocabulary modules, named here).
TEN_OPS = (
    "LSTMUnit",
    "FC",
    "SpatialBN",
    "Gather",
    "SparseLengthsSum",
    "Relu",
    "Reshape",
    "RecurrentNetwork",
    "Load",
    "Adam",
)
SHARED_VOCABULARY = ("rnn2jax.ops.gradient_makers", "rnn2jax.ops.shape_facts")


def _defined_in(value) -> str:
    function = getattr(value, "func", value)  # functools.partial
    return function.__module__


@pytest.mark.parametrize("op_type", TEN_OPS)
def test_every_facet_of_an_op_is_in_its_family_module(op_type):
    record = _all_records()[op_type]
    assert record.module.startswith("rnn2jax.ops."), record.module
    places = {_defined_in(record.build)} if record.build is not None else set()
    places |= {_defined_in(record.host.run)} if record.host is not None else set()
    for name in FACETS:
        value = getattr(record, name)
        if callable(value):
            places.add(_defined_in(value))
        elif isinstance(value, Roles):
            for positions in (value.lengths, value.integers):
                places |= {_defined_in(positions)} if callable(positions) else set()
    assert places - set(SHARED_VOCABULARY) == {record.module}, (op_type, record.module, places)


def test_the_ten_ops_have_the_facets_the_scoreboard_shows():
    """What docs/ops.md's facets column says for the ten ops, from the records (an independent reading of
    what each op is in Caffe2: LSTMUnit reads lengths and has a shape rule, a maker and an emitter; Load is
    a host op; Adam, a parameter update, has no maker)."""
    records = _all_records()
    assert ops_scoreboard.facets(records["LSTMUnit"]) == "lowering, roles, shape rule, maker, emitter"
    assert ops_scoreboard.facets(records["RecurrentNetwork"]) == "lowering, shape rule, maker, emitter"
    assert ops_scoreboard.facets(records["Load"]) == "host"
    assert ops_scoreboard.facets(records["Adam"]) == "lowering"
    assert "roles" in ops_scoreboard.facets(records["SparseLengthsSum"])
    assert ops_scoreboard.module_of(records["SpatialBN"]) == "`ops/norm.py`"
