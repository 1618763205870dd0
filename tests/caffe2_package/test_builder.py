"""The Caffe2 RNN builders against the listings of SEMANTICS.md section 3.1 and the real nets.

The listings are parsed out of /work/shared/caffe2/SEMANTICS.md (not copied here); tests skip with a
reason when it is absent. Sum ops emitted at the same forward op come in hash order in real Caffe2, so
runs of consecutive backward Sum ops are compared as multisets.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

import rnn2jax
from helpers import REALNETS
from rnn2jax.caffe2.python.attention import AttentionType
from rnn2jax.caffe2.python.core import BlobReference, reset_net_names
from rnn2jax.caffe2.python.gru_cell import GRU
from rnn2jax.caffe2.python.model_helper import ModelHelper
from rnn2jax.caffe2.python.rnn_cell import LSTM, MILSTM, BasicRNN, LayerNormLSTM, LayerNormMILSTM, LSTMWithAttention
from rnn2jax.caffe2.python.scope import NameScope as name_scope
from rnn2jax.ops.backward_pass import version_checks
from rnn2jax.proto import caffe2_pb2 as pb

SEMANTICS = Path(__file__).resolve().parents[3] / "shared" / "caffe2" / "SEMANTICS.md"


@pytest.fixture(autouse=True)
def _fresh_net_names():
    reset_net_names()


# ------------------------------------------------------------------------------------------------
# Parsing the listings


@dataclass
class Listing:
    title: str
    bullets: dict[str, str] = field(default_factory=dict)
    step_ops: list[tuple] = field(default_factory=list)
    backward_ops: list[tuple] | None = None
    raises: str | None = None
    cpp_adds: str | None = None


_OP_LINE = re.compile(r"^\s*\d+ (\w+)\((.*?)\) -> \((.*?)\)(?:\s+\{(.*)\})?(?:\s+engine=(\w+))?\s*$")


def _value(text: str) -> Any:
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _parse_op(line: str) -> tuple:
    match = _OP_LINE.match(line)
    assert match, f"unparsed op line: {line!r}"
    op_type, inputs, outputs, args, engine = match.groups()
    arg_pairs = re.findall(r"(\w+)=(\[[^\]]*\]|[^,]+)", args or "")
    return (
        op_type,
        tuple(inputs.split(", ")) if inputs else (),
        tuple(outputs.split(", ")),
        tuple((k, _value(v)) for k, v in arg_pairs),
        engine or "",
    )


def _parse_listing(title: str, body: str) -> Listing:
    listing = Listing(title)
    for line in body.splitlines():
        if line.startswith("* "):
            text = line[2:]
            key, _, rest = ("param", "", text) if text.startswith("param =") else text.partition(":")
            listing.bullets[key.strip()] = rest.strip()
    blocks = re.findall(r"(step_net ops|backward_step_net ops)[^\n]*:\n```\n(.*?)```", body, re.S)
    for name, block in blocks:
        ops = [_parse_op(line) for line in block.strip().splitlines()]
        if name == "step_net ops":
            listing.step_ops = ops
        else:
            listing.backward_ops = ops
    raised = re.search(r"Backward construction raises: `RuntimeError: (.*?)`", body)
    listing.raises = raised.group(1) if raised else None
    adds = re.search(r"C\+\+ adds: (.*)", body)
    listing.cpp_adds = adds.group(1) if adds else None
    return listing


def _listings() -> dict[str, Listing]:
    if not SEMANTICS.exists():
        return {}
    text = SEMANTICS.read_text()
    section = text[text.index("### 3.1 Listings") : text.index("### 3.2")]
    parts = re.split(r"^#### (.*)$", section, flags=re.M)[1:]
    return {
        title.strip(): _parse_listing(title.strip(), body)
        for title, body in zip(parts[::2], parts[1::2], strict=True)
    }


LISTINGS = _listings()
NO_SEMANTICS = pytest.mark.skipif(not LISTINGS, reason=f"{SEMANTICS} is absent")


def _names(text: str) -> list[str]:
    return re.findall(r"`([^`]*)`", text)


# ------------------------------------------------------------------------------------------------
# Building each listed configuration

D, H, E = 2, 4, 3


def _lstm(**kw) -> Callable[[ModelHelper], Any]:
    return lambda m: LSTM(m, "input", kw.pop("seq", "seq_lengths"), ["h0", "c0"], D, H, scope="lstm", **kw)


def _attention(attention_type=AttentionType.Regular, e=E, encoder_lengths=None, **kw):
    def build(m: ModelHelper):
        return LSTMWithAttention(
            m, "decoder_inputs", "decoder_input_lengths", "h0", "c0", "awec0", e, "encoder_outputs",
            encoder_lengths, D, H, "att", attention_type=attention_type, **kw,
        )  # fmt: skip

    return build


def _no_checks(build):
    def wrapped(m):
        with version_checks(False):
            return build(m)

    return wrapped


def _cell(fn, scope, states=("h0", "c0"), seq="seq_lengths", **kw):
    return lambda m: fn(m, "input", seq, list(states), D, H, scope=scope, **kw)


BUILDERS: dict[str, Callable[[ModelHelper], Any]] = {
    "LSTMCell (rnn_cell.LSTM, 1 layer, scope `lstm`, seq_lengths given, forward_only=False, "
    "memory_optimization=False)": _lstm(),
    "LSTMCell with memory_optimization=True": _lstm(memory_optimization=True),
    "LSTMCell without seq_lengths (sequence_lengths=0 on LSTMUnit)": _lstm(seq=None),
    "MILSTMCell (scope `milstm`)": _cell(MILSTM, "milstm"),
    "LayerNormLSTMCell (scope `lnlstm`)": _cell(LayerNormLSTM, "lnlstm"),
    "LayerNormMILSTMCell (scope `lnmilstm`)": _cell(LayerNormMILSTM, "lnmilstm"),
    "GRUCell (gru_cell.GRU, scope `gru`, linear_before_reset=False)": _cell(GRU, "gru", ["h0"]),
    "GRUCell linear_before_reset=True": _cell(GRU, "gru", ["h0"], linear_before_reset=True),
    "BasicRNNCell (rnn_cell.BasicRNN, activation='tanh', scope `basic_rnn`, no seq_lengths)": _cell(
        BasicRNN, "basic_rnn", ["h0"], None, activation="tanh"
    ),
    "BasicRNNCell with seq_lengths, forward_only=True, drop_states=False": _cell(
        BasicRNN, "basic_rnn", ["h0"], activation="tanh", forward_only=True, drop_states=False
    ),
    "BasicRNNCell with seq_lengths, NOT forward_only": _cell(
        BasicRNN, "basic_rnn", ["h0"], activation="tanh"
    ),
    "MultiRNNCell of two LSTMCells (rnn_cell.LSTM with dim_out=[4,4], scope `lstm`, "
    "outputs_with_grads=[4])": (
        lambda m: LSTM(m, "input", "seq_lengths", ["h0_0", "c0_0", "h0_1", "c0_1"], D, [4, 4], scope="lstm")
    ),
    "LSTMWithAttention, AttentionType.Regular (scope `att`, E=3, H=4, encoder_lengths=None)": _attention(),
    "LSTMWithAttention, Regular with encoder_lengths and attention_memory_optimization=True": _attention(
        encoder_lengths="encoder_lengths", attention_memory_optimization=True
    ),
    "LSTMWithAttention, AttentionType.Recurrent": _attention(AttentionType.Recurrent),
    "LSTMWithAttention, AttentionType.Dot, E != H (E=3, H=4)": _attention(AttentionType.Dot),
    "LSTMWithAttention, AttentionType.Dot, E == H (4)": _attention(AttentionType.Dot, e=4),
    "LSTMWithAttention, AttentionType.SoftCoverage": _attention(AttentionType.SoftCoverage),
    "LSTMWithAttention, AttentionType.SoftCoverage — listing with core.py's version check "
    "disabled (see 3.3)": (_no_checks(_attention(AttentionType.SoftCoverage))),
}


def _build(title: str) -> ModelHelper:
    model = ModelHelper("model")
    BUILDERS[title](model)
    return model


def _rnn_op(model: ModelHelper) -> pb.OperatorDef:
    ops = [op for op in model.net.Proto().op if op.type == "RecurrentNetwork"]
    assert len(ops) == 1
    return ops[0]


def _args(op: pb.OperatorDef | pb.NetDef) -> dict[str, pb.Argument]:
    return {a.name: a for a in op.arg}


def _decoded(arg: pb.Argument) -> Any:
    for kind in ("i", "f", "s", "n"):
        if arg.HasField(kind):
            value = getattr(arg, kind)
            return value.decode() if kind == "s" else value
    for kind in ("ints", "floats", "strings"):
        if getattr(arg, kind):
            return [v.decode() if kind == "strings" else v for v in getattr(arg, kind)]
    return []


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def _op_key(op: pb.OperatorDef) -> tuple:
    args = tuple((a.name, _decoded(a)) for a in op.arg)
    return (op.type, tuple(op.input), tuple(op.output), args, op.engine)


def _ops_equal(built: Sequence[tuple], listed: Sequence[tuple]) -> bool:
    if len(built) != len(listed):
        return False
    for (t1, i1, o1, a1, e1), (t2, i2, o2, a2, e2) in zip(built, listed, strict=True):
        if (t1, i1, o1, e1) != (t2, i2, o2, e2) or [k for k, _ in a1] != [k for k, _ in a2]:
            return False
        if not all(_same(v1, v2) for (_, v1), (_, v2) in zip(a1, a2, strict=True)):
            return False
    return True


def _sum_runs(ops: Sequence[tuple]) -> list:
    """Ops with consecutive Sums grouped into a sorted block (their order is hash-dependent)."""
    blocks: list = []
    for op in ops:
        if op[0] == "Sum" and blocks and isinstance(blocks[-1], list):
            blocks[-1].append(op)
        else:
            blocks.append([op] if op[0] == "Sum" else op)
    return [tuple(sorted(b, key=repr)) if isinstance(b, list) else b for b in blocks]


def _assert_ops(built: Sequence[tuple], listed: Sequence[tuple], group_sums: bool = False) -> None:
    if group_sums:
        built_blocks, listed_blocks = _sum_runs(built), _sum_runs(listed)
        assert len(built_blocks) == len(listed_blocks), _diff(built, listed)
        for b, l in zip(built_blocks, listed_blocks, strict=True):  # noqa: E741
            b_ops = list(b) if isinstance(b, tuple) and b and isinstance(b[0], tuple) else [b]
            l_ops = list(l) if isinstance(l, tuple) and l and isinstance(l[0], tuple) else [l]
            assert _ops_equal(b_ops, l_ops), _diff(built, listed)
    else:
        assert _ops_equal(built, listed), _diff(built, listed)


def _diff(built: Sequence[tuple], listed: Sequence[tuple]) -> str:
    lines = ["built:"] + [f"  {op}" for op in built] + ["listed:"] + [f"  {op}" for op in listed]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# The listings


@NO_SEMANTICS
def test_every_listing_has_a_builder():
    assert set(LISTINGS) == set(BUILDERS)


# Listings real Caffe2 (torch 1.10.2, the final release; tests/caffe2_package/test_builder_oracle.py builds every
# configuration there) contradicts: SEMANTICS.md describes an older front end. The builder follows real
# Caffe2, so these listing tests are expected to fail (strict: a corrected SEMANTICS.md shows up here).
_LAYER_NORM = (
    "final brew.layer_norm is one `LayerNorm([x, <out>_scale, <out>_bias]) -> (<out>, <out>_mean, <out>_std)` "
    "with elementwise_affine=1, not LayerNorm -> `_stdev` followed by a broadcast Mul and Add"
)
_SOFT_COVERAGE = (
    "final apply_soft_coverage_attention adds into `<scope>/decoder_hidden_encoder_outputs_sum_tmp` and then "
    "`Add([sum_tmp, scaled_coverage_weights]) -> decoder_hidden_encoder_outputs_sum` (not in place): its "
    "backward builds with the version check on (SEMANTICS.md 3.3 is wrong about it)"
)
CONTRADICTED_BY_CAFFE2 = {
    "LayerNormLSTMCell (scope `lnlstm`)": _LAYER_NORM,
    "LayerNormMILSTMCell (scope `lnmilstm`)": _LAYER_NORM,
    "LSTMWithAttention, AttentionType.SoftCoverage": _SOFT_COVERAGE,
    "LSTMWithAttention, AttentionType.SoftCoverage — listing with core.py's version check "
    "disabled (see 3.3)": _SOFT_COVERAGE,
}


def _listed_titles(with_net: bool) -> list:
    titles = [
        pytest.param(t, marks=pytest.mark.xfail(strict=True, reason=CONTRADICTED_BY_CAFFE2[t]))
        if t in CONTRADICTED_BY_CAFFE2
        else t
        for t, listing in LISTINGS.items()
        if (listing.raises is None) == with_net
    ]
    return titles or [pytest.param(None, marks=pytest.mark.skip(reason=f"{SEMANTICS} is absent"))]


@pytest.mark.parametrize("title", _listed_titles(with_net=True))
def test_listing(title):
    listing = LISTINGS[title]
    model = _build(title)
    op = _rnn_op(model)
    args = _args(op)
    bullets = listing.bullets

    assert list(op.input) == _names(bullets["RecurrentNetwork inputs"])
    assert list(op.output) == _names(bullets["outputs"])
    states_text, _, ids_text = bullets["recurrent_states"].partition("; initial_recurrent_state_ids = ")
    states = _names(states_text)
    assert _decoded(args["recurrent_states"]) == states
    assert _decoded(args["initial_recurrent_state_ids"]) == json.loads(ids_text)

    # forward links and aliases follow from the states (section 2.3)
    step = args["step_net"].n
    prev = [s[len(s.split("/")[0]) + 1 : -len("_states")] for s in states]
    state_outputs = [o[: -len("_all")] for o in list(op.output)[:-1:2]]
    internal = [b for p, o in zip(prev, state_outputs, strict=True) for b in (p, o)] + ["input_t"]
    assert _decoded(args["link_internal"]) == internal
    assert _decoded(args["link_external"]) == [s for s in states for _ in (0, 1)] + [op.input[0]]
    assert _decoded(args["link_offset"]) == [0, 1] * len(states) + [0]
    assert _decoded(args["alias_src"]) == [s for s in states for _ in (0, 1)]
    assert _decoded(args["alias_dst"]) == list(op.output)[:-1]
    assert _decoded(args["alias_offset"]) == [1, -1] * len(states)
    assert _decoded(args["timestep"]) == "timestep"
    assert _decoded(args["enable_rnn_executor"]) == 1

    assert list(step.external_input) == _names(bullets["step_net external_input"])
    assert list(step.external_output) == _names(bullets["step_net external_output"])
    assert step.type == "simple"
    _assert_ops([_op_key(o) for o in step.op], listing.step_ops)

    if listing.backward_ops is None:  # forward-only: none of the backward arguments
        assert not {"backward_step_net", "param", "param_grads", "outputs_with_grads"} & set(args)
        return
    param_text, _, grads_text = bullets["param"].removeprefix("param = ").partition("; param_grads = ")
    assert _decoded(args["param"]) == json.loads(param_text)
    assert _decoded(args["param_grads"]) == _names(grads_text)
    links = re.findall(
        r"\(`([^`]*)`, `([^`]*)`, (-?\d+)\)", bullets["backward links (internal, external, offset)"]
    )
    assert _decoded(args["backward_link_internal"]) == [link[0] for link in links]
    assert _decoded(args["backward_link_external"]) == [link[1] for link in links]
    assert _decoded(args["backward_link_offset"]) == [int(link[2]) for link in links]
    assert _decoded(args["recompute_blobs_on_backward"]) == _names(
        bullets.get("recompute_blobs_on_backward", "")
    )

    backward = args["backward_step_net"].n
    assert backward.type == "simple"
    _assert_ops([_op_key(o) for o in backward.op], listing.backward_ops, group_sums=True)
    recompute = set(_decoded(args["recompute_blobs_on_backward"]))
    recomputed = sum(1 for o in step.op if recompute & set(o.output))
    assert [_op_key(o) for o in backward.op[:recomputed]] == [
        _op_key(o) for o in step.op if recompute & set(o.output)
    ]
    for grad_op in list(backward.op)[recomputed:]:
        assert grad_op.is_gradient_op == (grad_op.type != "Sum"), grad_op
    _assert_cpp_additions(listing, args)


def _assert_cpp_additions(listing: Listing, args: dict[str, pb.Argument]) -> None:
    """ "C++ adds: N apply_link ops, K accumulate op(s) for `S_grad`..., then P `Sum(...)`"."""
    match = re.match(
        r"(\d+) apply_link ops.*?, (\d+) accumulate op\(s\) for (.*?), then .*?then (\d+) `Sum",
        listing.cpp_adds,
    )
    assert match, listing.cpp_adds
    links, accumulates, accumulated, sums = match.groups()
    assert len(_decoded(args["link_internal"])) + len(_decoded(args["backward_link_internal"])) == int(links)
    states = _decoded(args["recurrent_states"])
    with_grads = _decoded(args["outputs_with_grads"])
    expected = [s + "_grad" for i, s in enumerate(states) if 2 * i in with_grads]
    assert expected == _names(accumulated) and len(expected) == int(accumulates)
    assert len(_decoded(args["param"])) == int(sums)


@pytest.mark.parametrize("title", _listed_titles(with_net=False))
def test_listing_that_raises(title):
    with pytest.raises(RuntimeError, match=re.escape(LISTINGS[title].raises)):
        _build(title)


# Section 3.3: configurations whose backward core.py cannot build (SoftCoverage, listed there too, builds
# in real Caffe2: see CONTRADICTED_BY_CAFFE2).
RAISING = {"BasicRNNCell with seq_lengths, NOT forward_only"}


@pytest.mark.parametrize("title", list(BUILDERS))
def test_built_nets_load_into_the_ir(title):
    """Every built main net (step nets nested) and init net loads; the 3.3 configurations raise."""
    if title in RAISING:
        with pytest.raises(RuntimeError, match=r"needs (input|output)"):
            _build(title)
        return
    model = _build(title)
    net = rnn2jax.load(model.net.Proto())
    init = rnn2jax.load(model.param_init_net.Proto())
    assert any(op.type == "RecurrentNetwork" for op in net.ops)
    assert {"XavierFill", "ConstantFill"} >= {op.type for op in init.ops}
    nested = {name for op in net.ops for name, _ in op.nested_nets()}
    assert nested == ({"step_net"} if "forward_only=True" in title else {"step_net", "backward_step_net"})


# ------------------------------------------------------------------------------------------------
# Real nets

DPER = REALNETS / "dper_train_net_lstm_pooling.pbtxt"
BREADBREAD = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
NO_REALNETS = pytest.mark.skipif(not REALNETS.exists(), reason=f"{REALNETS} is absent")


def _parse_netdef(path: Path) -> pb.NetDef:
    return text_format.Parse(path.read_text(), pb.NetDef())


def _net_arg(arg: pb.Argument) -> pb.NetDef:
    return arg.n if arg.HasField("n") else text_format.Parse(arg.s.decode(), pb.NetDef())


def _unordered_op(op: pb.OperatorDef) -> tuple:
    """An op with its arguments as a set: the dper net comes from a Python 2 Caffe2 (dict order)."""
    args = sorted((a.name, repr(_decoded(a))) for a in op.arg)
    return (op.type, tuple(op.input), tuple(op.output), tuple(args), op.engine, op.is_gradient_op)


def _assert_same_net(built: pb.NetDef, real: pb.NetDef) -> None:
    assert re.sub(r"_\d+$", "", built.name) == re.sub(r"_\d+$", "", real.name)
    assert [_unordered_op(o) for o in built.op] == [_unordered_op(o) for o in real.op]
    assert list(built.external_input) == list(real.external_input)
    assert list(built.external_output) == list(real.external_output)
    assert built.type == real.type


@NO_REALNETS
@pytest.mark.parametrize("repeat", [0, 1])
def test_lstm_matches_the_dper_net(repeat):
    """Built under the dper net's name scope, our LSTM reproduces its RecurrentNetwork op name for name
    (arguments compared as sets, since that net was written by a Python 2 Caffe2)."""
    real_net = _parse_netdef(DPER)
    prefix = (
        "dot/SPARSE_AD_CROW_TITLE_HASHES_AUTO_FIRST_X_AUTO_UNIGRAM_AUTO_ADD_BIAS/Pool_Option_1/"
        f"Repeat_{repeat}"
    )
    real_rnn = [op for op in real_net.op if op.type == "RecurrentNetwork"][repeat]
    real_i2h = next(op for op in real_net.op if list(op.output) == [f"{prefix}/lstm/i2h"])

    model = ModelHelper("train_net")
    with name_scope(prefix):
        outputs = LSTM(
            model,
            BlobReference(f"{prefix}/AddPadding/rnn_input_pad"),
            BlobReference(f"{prefix}/Copy/seq_lengths_copy"),
            None,
            dim_in=16,
            dim_out=32,
            scope="lstm",
            outputs_with_grads=(1,),
        )
    assert list(outputs) == list(real_rnn.output)[:-1]
    i2h, rnn = model.net.Proto().op
    assert _unordered_op(i2h) == _unordered_op(real_i2h)
    assert (list(rnn.input), list(rnn.output)) == (list(real_rnn.input), list(real_rnn.output))
    built_args, real_args = _args(rnn), _args(real_rnn)
    assert set(built_args) == set(real_args)
    for name in set(real_args) - {"step_net", "backward_step_net"}:
        assert _decoded(built_args[name]) == _decoded(real_args[name]), name
    _assert_same_net(built_args["step_net"].n, real_args["step_net"].n)
    built_backward, real_backward = built_args["backward_step_net"].n, real_args["backward_step_net"].n
    # the one difference: newer core.py tags its accumulation Sums' device option
    assert built_backward.op[-1].device_option.extra_info == ["is_auto_gen_sum_ops:1"]
    for op in built_backward.op:
        op.ClearField("device_option")
    _assert_same_net(built_backward, real_backward)
    init_ops = [(o.type, list(o.output)) for o in model.param_init_net.Proto().op]
    assert init_ops == [
        ("ConstantFill", [f"{prefix}/lstm/initial_hidden_state"]),
        ("ConstantFill", [f"{prefix}/lstm/initial_cell_state"]),
        ("XavierFill", [f"{prefix}/lstm/i2h_w"]),
        ("ConstantFill", [f"{prefix}/lstm/i2h_b"]),
        ("XavierFill", [f"{prefix}/lstm/gates_t_w"]),
        ("ConstantFill", [f"{prefix}/lstm/gates_t_b"]),
    ]


def _wiring(ops: Sequence[pb.OperatorDef], extra: Sequence[str] = ()) -> tuple:
    """Names replaced by their order of first appearance: the structure of a net, not its names."""
    ids: dict[str, int] = {}

    def number(name: str) -> int:
        return ids.setdefault(name, len(ids))

    structure = [
        (op.type, tuple(number(i) for i in op.input), tuple(number(o) for o in op.output)) for op in ops
    ]
    return structure, [number(name) for name in extra]


@NO_REALNETS
def test_lstm_has_the_structure_of_the_handwritten_breadbread_net():
    """The hand-written net names blobs differently (hidden_t, `_split`), so only wiring is compared."""
    real_rnn = next(op for op in _parse_netdef(BREADBREAD).op if op.type == "RecurrentNetwork")
    model = ModelHelper("lstm_predict_net")
    LSTM(model, "input_blob", "seq_lengths", ["hidden_init", "cell_init"], 62, 100, scope="LSTM")
    rnn = _rnn_op(model)
    built_args, real_args = _args(rnn), _args(real_rnn)
    assert list(rnn.input) == list(real_rnn.input)
    assert len(rnn.output) == len(real_rnn.output)
    for name in set(real_args) - {"step_net", "backward_step_net"}:
        built, real = _decoded(built_args[name]), _decoded(real_args[name])
        assert (
            built == real
            if name not in ("link_internal", "alias_dst", "backward_link_internal")
            else (len(built) == len(real))
        ), name
    for net_arg in ("step_net", "backward_step_net"):
        built, real = _net_arg(built_args[net_arg]), _net_arg(real_args[net_arg])
        assert _wiring(built.op, built.external_input) == _wiring(real.op, real.external_input), net_arg
        assert len(built.external_output) == len(real.external_output)


@NO_REALNETS
def test_backward_pass_matches_the_breadbread_training_net():
    """get_backward_pass over its forward ops (FC .. AveragedLoss) gives the gradient ops of its
    training net, RecurrentNetworkGradient included (all forward args copied, in order)."""
    plan = text_format.Parse((REALNETS / "breadbread_lstmdemo_train_plan.pbtxt").read_text(), pb.PlanDef())
    train = next(net for net in plan.network if any(op.type == "RecurrentNetwork" for op in net.op))
    types = [op.type for op in train.op]
    forward = train.op[types.index("FC") : types.index("AveragedLoss") + 1]
    real = train.op[types.index("AveragedLossGradient") : types.index("AtomicIter")]
    grad_ops, mapping = rnn2jax.ops.backward_pass.get_backward_pass(forward, {"loss": "loss_grad"})
    key = lambda op: (*_op_key(op), op.is_gradient_op)  # noqa: E731
    assert [key(op) for op in grad_ops] == [key(op) for op in real]
    assert mapping["hidden_init"] == "hidden_init_grad" and mapping["LSTM/i2h_w"] == "LSTM/i2h_w_grad"


@NO_SEMANTICS
@pytest.mark.parametrize("forward_only", [False, True])
def test_recurrent_network_argument_order(forward_only):
    """Section 2.3, "Arg order in the OperatorDef (kwargs order)"."""
    text = SEMANTICS.read_text()
    start = text.index("Arg order in the OperatorDef (kwargs order):")
    sentence = text[start : text.index("(`link_window`", start)].split(":", 1)[1]
    always, _, backward = sentence.partition("then (if not forward-only)")
    expected = [n.strip() for n in always.split(",") if n.strip()]
    if not forward_only:
        expected += [n.strip(" .\n") for n in backward.split(",")]
    model = ModelHelper("model")
    LSTM(model, "input", "seq_lengths", ["h0", "c0"], D, H, scope="lstm", forward_only=forward_only)
    assert [a.name for a in _rnn_op(model).arg] == expected
