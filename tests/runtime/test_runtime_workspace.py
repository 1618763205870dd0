"""The Workspace: blobs, nets run in it (written back like Caffe2's in-place updates, compiled once per
input signature), host ops between jitted segments, and Print in Caffe2's format."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from runtime_helpers import net, op

import rnn2jax
from differential import assert_blobs_equal
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import InputTypeError, MissingBlobError, ShapeError, UnsupportedOpError, WorkspaceError
from rnn2jax.ops import registry
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.runtime.executor import HostStep, PureSegment
from rnn2jax.runtime.workspace import CompileCache


def _workspace(**blobs):
    workspace = rnn2jax.Workspace()
    for name, value in blobs.items():
        workspace.feed(name, value)
    return workspace


def test_feed_fetch_and_blobs():
    workspace = _workspace(
        x=np.arange(6, dtype=np.float32).reshape(2, 3), i=np.array([1, 2], np.int32), s=np.array(["ab", "c"])
    )
    workspace.feed("raw", b"bytes")
    assert workspace.blobs() == ["i", "raw", "s", "x"]
    assert workspace.has_blob("x") and not workspace.has_blob("y")
    np.testing.assert_array_equal(workspace.fetch("x"), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert workspace.fetch("i").dtype == np.int32
    assert workspace.fetch("s").tolist() == [b"ab", b"c"]
    assert workspace.fetch("raw") == b"bytes"
    with pytest.raises(MissingBlobError, match=r"no blob .y..*blobs are: i, raw, s, x"):
        workspace.fetch("y")
    with pytest.raises(InputTypeError):
        workspace.feed(3, np.zeros(1))
    with pytest.raises(InputTypeError, match="object array must hold strings"):
        workspace.feed("o", np.array([object()]))


def test_run_writes_back_every_blob_it_writes(caffe2):
    feeds = {"w": np.full((2,), 3.0, np.float32), "g": np.ones(2, np.float32), "lr": np.array([-0.5], np.float32)}
    feeds["one"] = np.ones(1, np.float32)
    feeds["iter"] = np.array([4], np.int64)
    update = net(
        "update",
        op("Iter", ["iter"], ["iter"]),
        op("WeightedSum", ["w", "one", "g", "lr"], ["w"]),
        op("Add", ["w", "g"], ["tmp"]),
    )
    workspace = _workspace(**feeds)
    workspace.run(update)
    workspace.run(update)
    got = {name: workspace.fetch(name) for name in workspace.blobs()}
    assert_blobs_equal(got, caffe2.run([("net", update), ("net", update)], feeds, None))
    np.testing.assert_array_equal(got["w"], [2.0, 2.0])  # 3 - 0.5 - 0.5
    assert int(got["iter"][0]) == 6


def test_run_compiles_once_per_input_signature(monkeypatch):
    traces = []
    apply = PureSegment._apply
    monkeypatch.setattr(PureSegment, "_apply", lambda self, *a: (traces.append(1), apply(self, *a))[1])
    double = rnn2jax.load(net("double", op("Add", ["x", "x"], ["y"])))
    workspace = _workspace(x=np.ones(3, np.float32))
    for _ in range(3):
        workspace.run(double)
    assert len(traces) == 1
    workspace.feed("x", np.ones(3, np.float32) * 2)  # same signature: no new trace
    workspace.run(double)
    assert len(traces) == 1
    np.testing.assert_array_equal(workspace.fetch("y"), [4, 4, 4])
    workspace.feed("x", np.ones(5, np.float32))  # a new shape: traced again
    workspace.run(double)
    assert len(traces) == 2
    assert workspace.fetch("y").shape == (5,)


def test_create_net_and_run_net_match_caffe2(caffe2):
    counter = net("count", op("Iter", ["iter"], ["iter"]), op("Add", ["c", "one"], ["c"]))
    feeds = {"iter": np.array([0], np.int64), "c": np.zeros(1, np.float32), "one": np.ones(1, np.float32)}
    workspace = _workspace(**feeds)
    assert workspace.create_net(counter) == "count"
    workspace.run_net("count", 5)
    want = caffe2.run([("create_net", counter), ("run_net", ("count", 5))], feeds, None)
    assert_blobs_equal({name: workspace.fetch(name) for name in workspace.blobs()}, want)
    assert workspace.fetch("c")[0] == 5
    assert workspace.nets() == ["count"]
    with pytest.raises(WorkspaceError, match="already has a net 'count'"):
        workspace.create_net(counter)
    workspace.create_net(counter, overwrite=True)
    with pytest.raises(WorkspaceError, match="no net 'nope'; its nets are: count"):
        workspace.run_net("nope")


def test_create_net_needs_the_blobs_it_reads_as_caffe2_does(caffe2):
    reader = net("reader", op("Add", ["c", "missing"], ["d"]))
    feeds = {"c": np.zeros(1, np.float32)}
    from rnn2jax.checking.oracle import Caffe2Error

    with pytest.raises(Caffe2Error, match="non-existing input blob: missing"):
        caffe2.run([("create_net", reader)], feeds, None)
    with pytest.raises(MissingBlobError, match=r"net 'reader', op #0 \(Add\): reads blob 'missing'.*blobs are: c"):
        _workspace(**feeds).create_net(reader)


def test_created_blobs_exist_before_they_hold_a_value():
    workspace = _workspace(c=np.zeros(1, np.float32))
    workspace.create_net(net("make", op("Add", ["c", "c"], ["d"])))
    assert not workspace.has_blob("d")
    with pytest.raises(MissingBlobError, match=r"'d' exists .* nothing has written it yet"):
        workspace.fetch("d")
    workspace.run_net("make")
    assert workspace.has_blob("d")


def test_host_ops_split_a_net_into_jitted_segments(caffe2, capsys):
    mixed = net(
        "mixed",
        op("Add", ["x", "x"], ["y"]),
        op("Mul", ["y", "x"], ["z"]),
        op("Print", ["z"], []),
        op("Add", ["z", "x"], ["w"]),
    )
    feeds = {"x": np.array([1.0, 2.0, 0.5], np.float32)}
    workspace = _workspace(**feeds)
    workspace.create_net(mixed)
    kinds = [type(piece) for piece in workspace._nets["mixed"].pieces]
    assert kinds == [PureSegment, HostStep, PureSegment]
    assert len(workspace._nets["mixed"].pieces[0].lowered.net.ops) == 2
    workspace.run_net("mixed")
    assert capsys.readouterr().out == "Tensor z of type float. Dims: (3,): 2,8,0.5\n"
    assert_blobs_equal(
        {name: workspace.fetch(name) for name in workspace.blobs()}, caffe2.run([("net", mixed)], feeds, None)
    )


# The expected lines are what real Caffe2 (torch 1.10.2) logged for the same blobs.
@pytest.mark.parametrize(
    "value, line",
    [
        (
            np.arange(6, dtype=np.float32).reshape(2, 3) / 3,
            "Tensor b of type float. Dims: (2,3,): 0,0.333333,0.666667,1,1.33333,1.66667",
        ),
        (np.array([1, 2, 3], np.int32), "Tensor b of type int. Dims: (3,): 1,2,3"),
        (np.array([True, False]), "Tensor b of type bool. Dims: (2,): 1,0"),
        (np.array([b"ab", b"cd"], dtype=object), "Tensor b of type std::basic_string<char>. Dims: (2,): ab,cd"),
        (np.zeros((0, 2), np.float32), "Tensor b of type float. Dims: (0,2,): "),
        (np.array(2.5, np.float32), "Tensor b of type float. Dims: (): 2.5"),
    ],
)
def test_print_uses_caffe2s_format(value, line, capsys):
    workspace = _workspace(b=value)
    workspace.run(net("p", op("Print", ["b"], [])))
    assert capsys.readouterr().out == line + "\n"


def test_print_limit_every_n_and_to_file(capsys, tmp_path, monkeypatch):
    workspace = _workspace(big=np.arange(30, dtype=np.int32))
    workspace.run(net("limit", op("Print", ["big"], [], limit=5)))
    assert capsys.readouterr().out == "Tensor big of type int. Dims: (30,): 0,1,2,3,4\n"
    workspace.create_net(net("every", op("Print", ["big"], [], every_n=3, limit=1)))
    workspace.run_net("every", 7)  # Caffe2 prints on runs 1, 4 and 7
    assert capsys.readouterr().out.count("Tensor big") == 3
    monkeypatch.chdir(tmp_path)
    workspace.run(net("file", op("Print", ["big"], [], to_file=1, limit=2)))
    workspace.run(net("file", op("Print", ["big"], [], to_file=1, limit=2)))
    assert (tmp_path / "big.log").read_text() == "Tensor big of type int. Dims: (30,): 0,1\n" * 2
    assert capsys.readouterr().out == ""


def test_print_in_a_nested_net_prints_from_the_compiled_code(capsys, tmp_path, monkeypatch):
    """Inside a loop's body (traced with the While, where no host op runs) Print is lowered: each iteration
    prints in the same format, every_n counting the lowered op's runs, to_file appending; an If's branch too.
    (Caffe2 runs Print there; its serialized golden onnx_while_test.test_onnx_while_fibb has one.)"""
    body = net(
        "body",
        op("Add", ["x", "one"], ["x"]),
        op("Print", ["x"], [], every_n=2),
        op("LT", ["x", "lim"], ["c"]),
    )
    workspace = _workspace(
        x=np.zeros(1, np.float32), one=np.ones(1, np.float32), lim=np.array([5.0], np.float32), c=np.array([True])
    )
    workspace.run(net("loop", op("While", ["c"], [], loop_net=body)))
    jax.effects_barrier()
    np.testing.assert_array_equal(workspace.fetch("x"), [5.0])
    assert capsys.readouterr().out == "".join(f"Tensor x of type float. Dims: (1,): {v}\n" for v in (1, 3, 5))
    monkeypatch.chdir(tmp_path)
    branch = net("then", op("Print", ["x"], [], to_file=1))
    workspace.run(net("if", op("If", ["c"], [], then_net=branch, else_net=branch)))
    jax.effects_barrier()
    assert (tmp_path / "x.log").read_text() == "Tensor x of type float. Dims: (1,): 5\n"
    assert capsys.readouterr().out == ""


def test_unsupported_ops_are_all_listed_and_host_ops_are_not():
    bad = net("bad", op("NoSuchOp", ["x"], ["y"]), op("Print", ["x"], []), op("AlsoMissing", ["y"], ["z"]))
    with pytest.raises(UnsupportedOpError) as info:
        _workspace(x=np.zeros(1, np.float32)).create_net(bad)
    assert [t for _, t in info.value.unsupported] == ["NoSuchOp", "AlsoMissing"]
    assert "op #0 (NoSuchOp)" in str(info.value) and "op #2 (AlsoMissing)" in str(info.value)


def test_a_host_op_is_registered_in_one_line_and_reads_and_writes_blobs(monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))  # the test's op goes with the copy
    seen = []

    def double_on_host(workspace, op, state):
        state["runs"] = state.get("runs", 0) + 1
        seen.append((workspace.db_root, state["runs"]))
        workspace.put(op.outputs[0], np.asarray(workspace.get(op.inputs[0], op)) * 2)

    registry.register_host_op("DoubleOnHost", double_on_host)
    assert registry.kind("DoubleOnHost") == "host"
    workspace = rnn2jax.Workspace(db_root="/data/dbs")
    workspace.feed("x", np.array([1.0, 3.0], np.float32))
    workspace.create_net(net("n", op("DoubleOnHost", ["x"], ["y"]), op("Add", ["y", "x"], ["z"])))
    workspace.run_net("n", 2)
    np.testing.assert_array_equal(workspace.fetch("z"), [3.0, 9.0])
    assert seen == [("/data/dbs", 1), ("/data/dbs", 2)]


def test_random_ops_draw_fresh_values_on_every_run():
    workspace = rnn2jax.Workspace(seed=3)
    fill = rnn2jax.load(net("fill", op("UniformFill", [], ["u"], shape=[4], min=0.0, max=1.0)))
    workspace.run(fill)
    first = workspace.fetch("u")
    workspace.run(fill)
    assert not np.array_equal(first, workspace.fetch("u"))
    assert ((first >= 0) & (first <= 1)).all()


def test_a_child_workspace_writes_its_parents_blobs_and_keeps_its_own():
    parent = _workspace(c=np.zeros(1, np.float32), one=np.ones(1, np.float32))
    child = parent.child()
    child.run(net("n", op("Add", ["c", "one"], ["tmp"]), op("Add", ["tmp", "one"], ["c"])))
    assert parent.fetch("c")[0] == 2
    assert child.has_blob("tmp") and not parent.has_blob("tmp")


def test_a_string_blob_given_to_a_pure_op_is_named():
    workspace = _workspace(s=np.array(["a", "b"]))
    with pytest.raises(InputTypeError, match=r"op #0 \(Add\): blob 's' holds strings"):
        workspace.run(net("n", op("Add", ["s", "s"], ["t"])))


def test_running_the_same_message_again_reuses_its_compiled_form(monkeypatch):
    traces = []
    apply = PureSegment._apply
    monkeypatch.setattr(PureSegment, "_apply", lambda self, *a: (traces.append(1), apply(self, *a))[1])
    workspace = _workspace(x=np.ones(3, np.float32))
    for _ in range(3):
        workspace.run(net("double", op("Add", ["x", "x"], ["x"])))  # a new message each time
    assert len(traces) == 1
    np.testing.assert_array_equal(workspace.fetch("x"), [8, 8, 8])


def test_nets_that_differ_only_in_name_share_compiled_code(monkeypatch):
    """Caffe2's checkers clone a net under a new name for every check (`net.Clone(name + "_copy")`):
    the clones compile once between them, and a new trace still names the net that made it."""
    traces = []
    apply = PureSegment._apply
    monkeypatch.setattr(
        PureSegment, "_apply", lambda self, *a: (traces.append(self.first_reader["x"].where), apply(self, *a))[1]
    )
    cache = CompileCache()
    workspace = rnn2jax.Workspace(cache=cache)
    workspace.feed("x", np.ones(3, np.float32))
    workspace.feed("z", np.full(3, 2, np.float32))
    for name in ("mul", "mul_copy", "mul_copy_1"):
        workspace.run(net(name, op("Mul", ["x", "z"], ["y"])))
        np.testing.assert_array_equal(workspace.fetch("y"), [2, 2, 2])
    assert traces == ["net 'mul', op #0 (Mul)"]
    workspace.run(net("mul_other", op("Mul", ["x", "z"], ["y"], broadcast=1)))  # another argument: not a twin
    assert traces[-1] == "net 'mul_other', op #0 (Mul)"
    other_seed = rnn2jax.Workspace(cache=cache, seed=1)  # the seed is an argument of the code: still a twin
    other_seed.feed("x", np.ones(3, np.float32))
    other_seed.feed("z", np.ones(3, np.float32))
    other_seed.run(net("mul_copy_2", op("Mul", ["x", "z"], ["y"])))
    assert len(traces) == 2
    workspace.feed("z", np.ones(4, np.float32))  # a new signature: traced through the net being run
    with pytest.raises(ShapeError, match=r"net 'mul_copy_3', op #0 \(Mul\)"):
        workspace.run(net("mul_copy_3", op("Mul", ["x", "z"], ["y"])))
    assert len(traces) == 3


def test_db_root_of_the_wrong_type_is_an_input_type_error():
    with pytest.raises(InputTypeError, match=r"Workspace: db_root must be a str or os\.PathLike, got a int"):
        rnn2jax.Workspace(db_root=5)


@pytest.mark.parametrize(
    "ops, feeds, message",
    [
        ([op("EnforceFinite", ["x"], []), op("Relu", ["x"], ["y"])], {"x": [1.0, np.inf]}, r"op #0 \(EnforceFinite\)"),
        ([op("Gather", ["d", "i"], ["y"])], {"d": [1.0, 2.0], "i": np.array([0, 5], np.int64)}, r"op #0 \(Gather\)"),
    ],
)
def test_values_a_segment_checks_fail_the_net_as_in_caffe2(caffe2, ops, feeds, message):
    """Ops that check values only known when the jitted segment runs (non-finite values, indices out of range)
    fail a workspace's net at that op, as real Caffe2 does, instead of answering with their fallbacks."""
    feeds = {name: np.asarray(value, np.float32 if name in "xd" else None) for name, value in feeds.items()}
    checked = net("checked", *ops)
    with pytest.raises(Caffe2Error):  # real Caffe2 refuses the net
        caffe2.run([("net", checked)], feeds, None)
    workspace = _workspace(**feeds)
    with pytest.raises(ShapeError, match=rf"net 'checked', {message}"):
        workspace.run(checked)


def test_clones_whose_step_nets_were_renamed_share_compiled_code(monkeypatch):
    """`core.Net.Clone` renames the nets an op carries too (`cloned_sub_net` -> `cloned_sub_net_2`), so a
    gradient checker's clones of an RNN net are twins only if those names are left out as well (Caffe2's
    rnn_cell_test::test_multi_lstm ran ten times slower before); a step net with another op is no twin."""
    traces = []
    apply = PureSegment._apply
    monkeypatch.setattr(PureSegment, "_apply", lambda self, *a: (traces.append(1), apply(self, *a))[1])

    def if_net(name: str, branch: str, kind: str = "Mul") -> pb.NetDef:
        then_net = net(f"then_{branch}", op(kind, ["x", "x"], ["y"]))
        else_net = net(f"else_{branch}", op("Sub", ["x", "x"], ["y"]))
        return net(name, op("If", ["cond", "x"], ["y"], then_net=then_net, else_net=else_net))

    workspace = rnn2jax.Workspace(cache=CompileCache())
    workspace.feed("cond", np.array(True))
    workspace.feed("x", np.full(3, 3, np.float32))
    workspace.feed("y", np.zeros(3, np.float32))  # If reads the blob it may leave unset: a run's input
    for name, branch in (("n", "a"), ("n_copy", "b"), ("n_copy_1", "c")):
        workspace.run(if_net(name, branch))
        np.testing.assert_array_equal(workspace.fetch("y"), [9, 9, 9])
    assert len(traces) == 1
    workspace.run(if_net("n_copy_2", "d", kind="Add"))
    np.testing.assert_array_equal(workspace.fetch("y"), [6, 6, 6])
    assert len(traces) == 2
