"""The fuzzers' short budget in the suite: every saved crash input replays without escaping the error
contract, mutated builder cells and real nets keep it (hypothesis), and a short atheris run finds nothing.
`make fuzz` runs both fuzzers for as long as asked (see `tests/fuzz/`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

import rnn2jax
from fuzz.contract import HINT_PREFIX, Hint, SilentAnswer, container, exercise, read_container
from fuzz.mutated import Recorder, mutated_containers, seed_containers
from fuzz.mutations import RandomChooser, mutate_container, nets_of
from rnn2jax.proto import caffe2_pb2 as pb

FUZZ = Path(__file__).resolve().parent / "fuzz"
CRASHES = sorted((FUZZ / "crashes").glob("*"))


@pytest.mark.parametrize("path", CRASHES, ids=[p.name for p in CRASHES])
def test_saved_crash_inputs_keep_the_contract(path):
    exercise(path.read_bytes())


def test_every_builder_cell_has_a_seed():
    names = {name for name, _ in seed_containers()}
    for cell in ("lstm", "gru", "milstm", "multi_rnn_cell", "attention-regular", "attention-soft_coverage"):
        assert cell in names
    assert "lstm-training" in names and "attention-recurrent-training" in names


@pytest.mark.parametrize("name", ["lstm-training", "gru", "attention-dot-training"])
def test_seeds_reach_verify_and_agree_with_compile(name):
    """A seed runs the whole pipeline, and the container feeds exactly what compile would compute."""
    data = dict(seed_containers())[name]
    assert exercise(data) == "verify"
    init, main, hints = read_container(data)
    fn = rnn2jax.compile(rnn2jax.load(main), init_net=rnn2jax.load(init))
    assert set(fn.input_names) == set(hints)


def test_containers_round_trip_their_hints():
    net = pb.NetDef(name="n")
    net.op.add(type="Relu", input=["x"], output=["y"])
    plan = container(pb.NetDef(), net, {"x": Hint((2, 3), "float32")})
    _, main, hints = read_container(plan.SerializeToString())
    assert hints == {"x": Hint((2, 3), "float32")}
    assert [a.name for a in pb.NetDef.FromString(main).arg] == [HINT_PREFIX + "x"]
    assert exercise(plan.SerializeToString()) == "run"  # no recurrent op: nothing to verify


def test_mutations_reach_nested_step_nets():
    """Across seeds, mutations land in step nets too (a fuzzer that never touched them would miss most of
    the RecurrentNetwork decoding)."""
    data = dict(seed_containers())["lstm-training"]
    original = pb.PlanDef.FromString(data)
    nested_changed = 0
    for seed in range(200):
        plan = pb.PlanDef.FromString(data)
        mutate_container(RandomChooser(seed), plan, count=1)
        before, after = nets_of(original.network[1])[1:], nets_of(plan.network[1])[1:]
        nested_changed += [n.SerializeToString() for n in before] != [n.SerializeToString() for n in after]
    assert 20 <= nested_changed < 200


@given(mutated_containers())
def test_mutated_nets_keep_the_error_contract(case):
    """Anything but success or an Rnn2JaxError fails (the description names the seed)."""
    Recorder.check(case[1])


def test_hostile_bytes_keep_the_error_contract():
    rng = np.random.default_rng(0)
    seeds = [data for _, data in seed_containers()[:5]]
    for data in seeds:
        for _ in range(5):
            broken = bytearray(data)
            for position in rng.integers(0, len(broken), size=8):
                broken[position] = rng.integers(0, 256)
            exercise(bytes(broken))
            exercise(bytes(broken[: rng.integers(0, len(broken))]))


def test_a_short_atheris_run_finds_nothing(tmp_path):
    pytest.importorskip("atheris", reason="atheris (the fuzz extra) is not installed: make test installs it")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("basic_rnn-tanh", "lstm-forward_only", "gru"):
        shutil.copy(FUZZ / "seeds" / f"{name}.pb", corpus)
    result = subprocess.run(
        [sys.executable, str(FUZZ / "fuzz_nets.py"), "-runs=15", "-seed=1", "-max_len=65536", "-timeout=20",
         "-rss_limit_mb=8192", f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONHASHSEED": "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Done 15 runs" in result.stderr
    assert not list(tmp_path.glob("crash-*"))


def _unwritten_cell_state(seed: str) -> bytes:
    """A seed whose cell state's write link points at the hidden state instead: no step writes the cell
    state's rows (real Caffe2 returns whatever that memory held; see tests/recurrent/test_recurrent_arguments.py)."""
    plan = pb.PlanDef.FromString(dict(seed_containers())[seed])
    (op,) = [o for o in plan.network[1].op if o.type == "RecurrentNetwork"]
    external = next(a for a in op.arg if a.name == "link_external")
    states = next(a for a in op.arg if a.name == "recurrent_states").strings
    writes = [i for i, s in enumerate(external.strings) if s == states[1]]
    external.strings[writes[-1]] = states[0]
    return plan.SerializeToString()


def test_unwritten_state_rows_are_refused():
    assert exercise(_unwritten_cell_state("lstm-forward_only")) == "refused at run"


def test_the_silent_answer_detector_sees_unwritten_rows(monkeypatch):
    """With the refusal switched off, the contract's poison runs see outputs that depend on the unwritten
    rows, and call them a silent answer."""
    from rnn2jax.ops.recurrent import forward

    monkeypatch.setattr(forward, "check_forward_rows", lambda *args: None)
    with pytest.raises(SilentAnswer, match="never wrote"):
        exercise(_unwritten_cell_state("lstm-forward_only"))
    # valid nets are not, the gradient's poisoned rows included
    assert exercise(dict(seed_containers())["lstm-forward_only"]) in ("run", "refused at verify")
    assert exercise(dict(seed_containers())["lstm-training"]) == "verify"
