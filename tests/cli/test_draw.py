"""`rnn2jax draw`: the pictures hold what the net holds. Each SVG is parsed with xml.etree (Graphviz writes
`<g class="node"><title>ID</title>` and `<g class="edge"><title>TAIL->HEAD</title>`), and what must be in it
is read from the op arguments here (link_internal/external/offset, alias_*, recurrent_states,
initial_recurrent_state_ids, backward_link_*), not from the drawing code: every op of the net and of every
step net is a node, every link, alias and initial state an edge between the right blobs, labelled with its
offset. The PNG is checked by its signature and its IHDR header, against the SVG's size.
"""

from __future__ import annotations

import shutil
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_builder_cells import CELLS, sizes, training_net

import rnn2jax
from helpers import REALNETS
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.cli import main
from rnn2jax.ir.netdef import Net, Op
from rnn2jax.proto import caffe2_pb2 as pb

TRAIN_PLAN = REALNETS / "breadbread_lstmdemo_train_plan.pbtxt"
needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None,
    reason="Graphviz's dot is not installed (`make test` installs it where it can, scripts/install_graphviz.sh)",
)
needs_realnets = pytest.mark.skipif(not TRAIN_PLAN.exists(), reason=f"real nets folder {REALNETS} is absent")
SVG = "{http://www.w3.org/2000/svg}"
RECURRENT = ("RecurrentNetwork", "RecurrentNetworkGradient")


def parse_svg(data: bytes) -> tuple[dict[str, str], list[tuple[str, str, str]], set[str]]:
    """Nodes (title -> text), edges (tail, head, label) and cluster titles of a Graphviz SVG."""
    root = ET.fromstring(data)
    nodes, titles, clusters = {}, [], set()
    for group in root.iter(f"{SVG}g"):
        title = group.find(f"{SVG}title")
        text = " ".join(t.text for t in group.iter(f"{SVG}text") if t.text)
        if group.get("class") == "node":
            nodes[title.text] = text
        elif group.get("class") == "edge":
            titles.append((title.text, text))
        elif group.get("class") == "cluster":
            clusters.add(title.text)
    edges = []
    for title, text in titles:  # "TAIL->HEAD", where a name may hold "->" too: split between two nodes
        (split,) = [(t, h) for t, _, h in _partitions(title, "->") if t in nodes and h in nodes]
        edges.append((*split, text))
    return nodes, edges, clusters


def _partitions(text: str, separator: str):
    at = text.find(separator)
    while at >= 0:
        yield text[:at], separator, text[at + len(separator) :]
        at = text.find(separator, at + 1)


def base(node: str, prefix: str) -> str | None:
    """The blob name of a node id in scope `prefix` (net_drawer's version suffix `@K` dropped), else None."""
    if not node.startswith(prefix):
        return None
    name = node[len(prefix) :]
    return name.rsplit("@", 1)[0] if "@" in name and name.rsplit("@", 1)[1].isdigit() else name


def check_net(net: Net, nodes, edges, clusters, prefix: str = "") -> int:
    """Assert the drawing of `net` (its ops under `prefix`); returns how many links/aliases were checked.
    A forward op and its gradient op (joined by the step_workspaces blob) draw the step net and the
    backward step net once between them: the forward op's box the step net, the gradient op's the other."""
    workspaces = {op.outputs[-1] for op in net.ops if op.type == "RecurrentNetwork"}
    workspaces &= {op.inputs[-1] for op in net.ops if op.type == "RecurrentNetworkGradient"}
    checked = 0
    for op in net.ops:
        op_id = f"{prefix}op#{op.index}"
        assert op_id in nodes, f"{op.where} is not drawn"
        assert f"{op.type} (op#{op.index})" in nodes[op_id]
        if op.type in RECURRENT and op.has("step_net"):
            assert f"cluster_{op_id}" in clusters
            paired = (op.outputs if op.type == "RecurrentNetwork" else op.inputs)[-1] in workspaces
            nets = ["step_net", "backward_step_net"] if op.has("backward_step_net") else ["step_net"]
            if paired:
                nets = nets[:1] if op.type == "RecurrentNetwork" else nets[1:]
            checked += check_recurrent(op, op_id, nets, nodes, edges, clusters)
    return checked


def step_writes(net: Net) -> set[str]:
    return {name for op in net.ops for name in op.outputs}


def check_recurrent(op: Op, here: str, nets: list[str], nodes, edges, clusters) -> int:
    outer_prefix = here.rpartition("op#")[0]
    forward_inputs = op.inputs
    if op.type == "RecurrentNetworkGradient":  # output gradients, forward inputs, forward outputs
        forward_inputs = op.inputs[len(op.ints("outputs_with_grads")) : -(len(op.strings("alias_src", ())) + 1)]
    checked = 0
    for arg in ("step_net", "backward_step_net"):
        if arg not in nets:
            assert f"cluster_{here}:{arg}" not in clusters, f"{arg} of {op.where} is drawn twice"
            continue
        net, what = op.net(arg), "link" if arg == "step_net" else "backward link"
        inner = f"{here}:{arg}/"
        assert f"cluster_{here}:{arg}" in clusters
        checked += check_net(net, nodes, edges, clusters, inner)
        key = "" if arg == "step_net" else "backward_"
        internals, externals = op.strings(f"{key}link_internal"), op.strings(f"{key}link_external")
        offsets = op.ints(f"{key}link_offset")
        assert len(internals) == len(externals) == len(offsets) > 0
        for internal, external, offset in zip(internals, externals, offsets, strict=True):
            # data flows into the step net where it reads the blob, out of it where an op writes it
            written = internal in step_writes(net)
            found = [
                (t, h)
                for t, h, label in edges
                if label.startswith(f"{what} offset {offset}")
                and (base(t, inner) if written else base(h, inner)) == internal
                and external in {base(h if written else t, p) for p in (outer_prefix, f"{here}:")}
            ]
            assert found, f"{what} {internal} <-> {external} (offset {offset}) of {op.where} is not drawn"
            checked += 1
    states = op.strings("recurrent_states", ())
    if "step_net" in nets:
        for state, index in zip(states, op.ints("initial_recurrent_state_ids", ()), strict=True):
            assert (f"{outer_prefix}{forward_inputs[index]}", f"{here}:{state}", "initial") in edges
    if op.type == "RecurrentNetwork":
        for src, dst, offset in zip(
            op.strings("alias_src"), op.strings("alias_dst"), op.ints("alias_offset"), strict=True
        ):
            assert dst in op.outputs
            assert any(
                t == f"{here}:{src}" and base(h, outer_prefix) == dst and label == f"alias offset {offset}"
                for t, h, label in edges
            ), f"alias {src} -> {dst} (offset {offset}) of {op.where} is not drawn"
            checked += 1
    else:  # outputs: the input's gradient, the parameters' (summed over steps), the initial states'
        params = op.strings("param_grads")
        for name, output in zip(params, op.outputs[1:], strict=False):
            assert any(
                base(t, f"{here}:backward_step_net/") == name
                and base(h, outer_prefix) == output
                and label == "param grad"
                for t, h, label in edges
            ), f"{name} -> {output} of {op.where} is not drawn"
        for state, output in zip(states, op.outputs[1 + len(params) :], strict=True):
            assert (f"{here}:{state}_grad", f"{outer_prefix}{output}", "initial") in edges
    return checked


def draw_svg(net_file: Path, out: Path, *extra: str) -> tuple[dict, list, set]:
    assert main(["draw", str(net_file), "-o", str(out), *extra]) == 0
    return parse_svg(out.read_bytes())


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first chunk, right after the 8-byte signature)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


@needs_dot
@needs_realnets
def test_breadbread_train_plan_svg_and_png(tmp_path, capsys):
    plan = rnn2jax.load(TRAIN_PLAN)
    net = plan["char_rnn"]  # the default: the plan's net with a RecurrentNetwork and gradient ops
    nodes, edges, clusters = draw_svg(TRAIN_PLAN, tmp_path / "train.svg")
    assert "net 'char_rnn'" in capsys.readouterr().out
    # the forward op: a step net of 5 links, 4 aliases; the gradient op: a backward step net of 5 links
    assert check_net(net, nodes, edges, clusters) == 5 + 4 + 5
    # the forward op's input sequence feeds the step net's input_t; its hidden state comes back out
    assert ("LSTM/i2h", "op#5:step_net/input_t", "link offset 0") in edges
    assert ("op#5:step_net/LSTM/hidden_t", "op#5:LSTM/LSTM/hidden_t_prev_states", "link offset 1") in edges
    # the gradient op writes the input sequence's gradient (its output #0) through a backward link
    assert any(t.startswith("op#17:backward_step_net/LSTM/gates_t_grad") and h == "LSTM/i2h_grad" for t, h, _ in edges)

    assert main(["draw", str(TRAIN_PLAN), "-o", str(tmp_path / "train.png")]) == 0
    width, height = png_size((tmp_path / "train.png").read_bytes())
    svg = ET.fromstring((tmp_path / "train.svg").read_bytes())
    points = [float(svg.get(k).removesuffix("pt")) for k in ("width", "height")]
    # Graphviz's PNG is 96 dpi, its SVG in points (72 per inch)
    assert abs(width - points[0] * 96 / 72) <= 2 and abs(height - points[1] * 96 / 72) <= 2, (width, height, points)
    assert width > 1000 and height > 500


def cell_net(tmp_path: Path, kind: str, s: dict, train: bool, alone: bool = False) -> tuple[Path, pb.NetDef]:
    """A builder cell's net; `train` adds its gradient ops, `alone` then drops the forward RecurrentNetwork
    (so the gradient op's box draws the step net too)."""
    reset_net_names()
    built = CELLS[kind](s, np.random.default_rng(s["seed"]))
    net = built.model.net.Proto()
    if train and built.trainable:
        net, _ = training_net(net, built.grad_outputs)
        if alone:
            kept = [op for op in net.op if op.type != "RecurrentNetwork"]
            del net.op[:]
            net.op.extend(kept)
    path = tmp_path / f"{kind}.pb"
    path.write_bytes(net.SerializeToString())
    return path, net


@needs_dot
@given(
    kind=st.sampled_from(sorted(CELLS)),
    s=sizes(min_steps=1),
    train=st.booleans(),
    alone=st.booleans(),
)
def test_every_builder_cell_is_drawn(tmp_path_factory, kind, s, train, alone):
    """Every cell the builder makes (attention, multi-layer, dropout, GRU, ...), forward or with its
    gradient ops (with or without the forward op): every op and link in the SVG."""
    tmp_path = tmp_path_factory.mktemp("cell")
    path, proto = cell_net(tmp_path, kind, s, train, alone)
    nodes, edges, clusters = draw_svg(path, tmp_path / "net.svg")
    net = rnn2jax.load(proto)
    assert check_net(net, nodes, edges, clusters) > 0
    assert len(nodes) >= sum(1 for _ in net.walk())


@needs_dot
def test_attention_net_svg_and_png(tmp_path):
    s = {"T": 2, "N": 2, "D": 3, "H": 2, "L": 3, "E": 2, "forms": ["2-D"] * 4, "use_lengths": True,
         "lengths": [1, 2], "seed": 0}  # fmt: skip
    path, proto = cell_net(tmp_path, "attention-regular", s, train=True)
    nodes, edges, clusters = draw_svg(path, tmp_path / "att.svg")
    net = rnn2jax.load(proto)
    (forward,) = [op for op in net.ops if op.type == "RecurrentNetwork"]
    (backward,) = [op for op in net.ops if op.type == "RecurrentNetworkGradient"]
    # the decoder LSTM and the attention ops all sit in the step net's box
    assert {"LSTMUnit", "Softmax", "FC"} <= {op.type for op in forward.net("step_net").ops}
    links = len(forward.strings("link_internal")) + len(forward.strings("alias_src"))
    assert check_net(net, nodes, edges, clusters) == links + len(backward.strings("backward_link_internal"))
    # a PNG of the forward net (its step net and backward step net side by side)
    path, _ = cell_net(tmp_path, "attention-regular", s, train=False)
    assert main(["draw", str(path), "-o", str(tmp_path / "att.png")]) == 0
    assert min(png_size((tmp_path / "att.png").read_bytes())) > 100


@needs_realnets
def test_dot_needs_no_graphviz_and_plan_net_choice(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)  # `import graphviz` fails
    out = tmp_path / "loop.dot"
    assert main(["draw", str(TRAIN_PLAN), "--net", "char_rnn_loop", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith('digraph "char_rnn_loop" {')
    capsys.readouterr()
    assert main(["draw", str(TRAIN_PLAN), "--net", "char_rnn_loop", "-o", "-"]) == 0
    assert capsys.readouterr().out == text
    # char_rnn_loop: Copy LSTM/hidden_t_last -> hidden_init, Copy LSTM/cell_t_last -> cell_init
    for index, (src, dst) in enumerate([("LSTM/hidden_t_last", "hidden_init"), ("LSTM/cell_t_last", "cell_init")]):
        assert f'"{src}" -> "op#{index}";' in text and f'"op#{index}" -> "{dst}";' in text
    # a .svg without the graphviz package: an error naming the extra, and no file
    assert main(["draw", str(TRAIN_PLAN), "-o", str(tmp_path / "x.svg")]) == 2
    assert "pip install 'rnn2jax[draw]'" in capsys.readouterr().err
    assert not (tmp_path / "x.svg").exists()
    assert main(["draw", str(TRAIN_PLAN), "--net", "nope", "-o", "-"]) == 2
    err = capsys.readouterr().err
    assert "no net 'nope'" in err and "char_rnn_loop" in err
    # the default: the net with a RecurrentNetwork (the test plan's predict net, beside its init and loop nets)
    assert main(["draw", str(REALNETS / "breadbread_lstmdemo_test_plan.pbtxt"), "-o", "-"]) == 0
    assert capsys.readouterr().out.startswith('digraph "lstm_predict_net" {')
    plan = pb.PlanDef(name="two", network=[pb.NetDef(name="a"), pb.NetDef(name="b")])
    (tmp_path / "two.pb").write_bytes(plan.SerializeToString())
    assert main(["draw", str(tmp_path / "two.pb"), "-o", "-"]) == 2
    assert "choose one with --net (a, b)" in capsys.readouterr().err


@needs_realnets
def test_missing_dot_program_says_install_graphviz(tmp_path, capsys, monkeypatch):
    pytest.importorskip("graphviz", reason="the draw extra is not installed")
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` on it
    assert main(["draw", str(TRAIN_PLAN), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "install Graphviz" in err and "`dot`" in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_bad_recurrent_op_is_named(tmp_path, capsys):
    net = pb.NetDef(name="broken")
    op = net.op.add(type="RecurrentNetwork", input=["x"], output=["y", "ws"])
    op.arg.add(name="step_net", n=pb.NetDef(name="step"))
    op.arg.add(name="link_internal", strings=[b"x_t"])  # no link_external, no link_offset
    path = tmp_path / "broken.pb"
    path.write_bytes(net.SerializeToString())
    assert main(["draw", str(path), "-o", str(tmp_path / "b.dot")]) == 2
    err = capsys.readouterr().err
    assert "net 'broken'" in err and "op #0 (RecurrentNetwork)" in err and "link_external" in err
    assert not (tmp_path / "b.dot").exists()


@needs_dot
def test_odd_blob_names_and_the_default_output(tmp_path, capsys, monkeypatch):
    """Quotes, backslashes and DOT's own escapes in names come through as they are."""
    odd = ['a"b', "c\\d", "e\\nf", "{g}", "h -> i"]
    net = pb.NetDef(name='odd "net"')
    net.op.add(type="Relu", input=[odd[0]], output=[odd[1]])
    net.op.add(type="Sum", input=[odd[1], odd[2]], output=[odd[3], odd[4]], name="my op")
    (tmp_path / "odd.pb").write_bytes(net.SerializeToString())
    monkeypatch.chdir(tmp_path)
    assert main(["draw", "odd.pb"]) == 0
    assert "wrote odd.svg" in capsys.readouterr().out
    nodes, edges, _ = parse_svg((tmp_path / "odd.svg").read_bytes())
    ids = [name.replace("\\", "\\\\") for name in odd]  # Graphviz keeps an id's backslashes escaped
    assert {name: nodes[name] for name in ids} == dict(zip(ids, odd, strict=True))  # the labels as they are
    assert nodes["op#1"] == "my op/Sum (op#1)"
    assert sorted(edges) == sorted(
        [(ids[0], "op#0", ""), ("op#0", ids[1], ""), (ids[1], "op#1", ""), (ids[2], "op#1", ""),
         ("op#1", ids[3], ""), ("op#1", ids[4], "")]
    )  # fmt: skip
