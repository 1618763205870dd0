"""RecurrentNetwork -> lax.scan: links, windows, initial states, aliases, timestep, scopes, nesting.

The nets here are hand-built (as users and Caffe2's own tests built them) around small step nets whose
meaning is easy to write in NumPy; the cells of Caffe2's front end are tested in test_cells.py.
"""

from __future__ import annotations

import jax
import jax.extend
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from reference import lstm
from rnn2jax.caffe2.opdef import create_net, create_operator

F32 = np.float32


def rnn_op(inputs, outputs, step_ops, *, states, initial_ids, links, aliases, timestep="timestep", **extra):
    """A RecurrentNetwork OperatorDef from (internal, external, offset[, window]) links and
    (src, dst, offset) aliases."""
    step = create_net("step", step_ops)
    windows = [link[3] if len(link) > 3 else 1 for link in links]
    return create_operator(
        "RecurrentNetwork",
        inputs,
        outputs,
        alias_src=[a[0] for a in aliases],
        alias_dst=[a[1] for a in aliases],
        alias_offset=[a[2] for a in aliases],
        recurrent_states=states,
        initial_recurrent_state_ids=initial_ids,
        link_internal=[link[0] for link in links],
        link_external=[link[1] for link in links],
        link_offset=[link[2] for link in links],
        link_window=windows,
        step_net=step,
        timestep=timestep,
        **extra,
    )


def accumulator_net(init_rank_ok=True):
    """h_t = h_{t-1} + x_t: aliases for all rows, the last row, and the whole state tensor."""
    op = rnn_op(
        ["x", "h0"],
        ["h_all", "h_last", "h_full", "workspaces"],
        [create_operator("Sum", ["h_prev", "x_t"], "h")],
        states=["h_states"],
        initial_ids=[1],
        links=[("h_prev", "h_states", 0), ("h", "h_states", 1), ("x_t", "x", 0)],
        aliases=[("h_states", "h_all", 1), ("h_states", "h_last", -1), ("h_states", "h_full", 0)],
    )
    return create_net("acc", [op], ["x", "h0"], ["h_all", "h_last", "h_full"])


@given(
    steps=st.integers(0, 5),
    batch=st.integers(1, 3),
    size=st.integers(1, 4),
    init_shape=st.sampled_from(["D", "ND", "1ND"]),
    seed=st.integers(0, 2**16),
)
def test_accumulator_initial_state_forms(steps, batch, size, init_shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, batch, size)).astype(F32)
    h0 = rng.standard_normal({"D": (size,), "ND": (batch, size), "1ND": (1, batch, size)}[init_shape]).astype(
        F32
    )
    out = rnn2jax.compile(accumulator_net())(x=x, h0=h0)
    first = np.broadcast_to(h0.reshape((-1, size)), (batch, size))
    full = np.concatenate([first[None], first[None] + np.cumsum(x, axis=0)])
    np.testing.assert_allclose(np.asarray(out["h_full"]), full, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["h_all"]), full[1:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["h_last"]), full[-1:], rtol=1e-5, atol=1e-6)
    assert np.asarray(out["h_all"]).shape == (steps, batch, size)


def window_net(window, alias_offsets):
    """A state with L = `window` initial rows; each step reads the last `window` rows (offset 0) and
    writes the next one at offset `window`: h_{t+L} = sum(h[t:t+L]) * 0.5 + x_t."""
    ops = [
        create_operator("ReduceFrontSum", "h_window", "h_sum"),
        create_operator("ExpandDims", "h_sum", "h_sum3", dims=[0]),
        create_operator("Scale", "h_sum3", "h_half", scale=0.5),
        create_operator("Sum", ["h_half", "x_t"], "h_new"),
    ]
    aliases = [("h_states", f"out{i}", off) for i, off in enumerate(alias_offsets)]
    op = rnn_op(
        ["x", "h0"],
        [a[1] for a in aliases] + ["workspaces"],
        ops,
        states=["h_states"],
        initial_ids=[1],
        links=[("h_window", "h_states", 0, window), ("h_new", "h_states", window), ("x_t", "x", 0)],
        aliases=aliases,
    )
    return create_net("win", [op], ["x", "h0"], [a[1] for a in aliases])


@given(
    window=st.integers(1, 3),
    steps=st.integers(0, 4),
    batch=st.integers(1, 3),
    offsets=st.lists(st.integers(-4, 4), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_window_links_several_initial_rows_and_any_alias_offset(window, steps, batch, offsets, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, batch, 2)).astype(F32)
    h0 = rng.standard_normal((window, batch, 2)).astype(F32)
    total = steps + window
    offsets = [o for o in offsets if (o if o >= 0 else total + o) in range(total + 1)] or [window]
    out = rnn2jax.compile(window_net(window, offsets))(x=x, h0=h0)
    buffer = np.concatenate([h0, np.zeros((steps, batch, 2), F32)])
    for t in range(steps):
        buffer[t + window] = buffer[t : t + window].sum(0) * 0.5 + x[t]
    for i, off in enumerate(offsets):
        start = off if off >= 0 else total + off
        np.testing.assert_allclose(np.asarray(out[f"out{i}"]), buffer[start:], rtol=1e-5, atol=1e-6)


def test_window_read_sees_row_written_earlier_in_the_step():
    """Caffe2 links are views: a write through one link is visible through a window that covers it."""
    ops = [
        create_operator("Sum", ["h_prev", "x_t"], "h"),  # writes row t+1
        create_operator("ReduceFrontSum", "pair", "pair_sum"),  # rows t, t+1 (t+1 just written)
        create_operator("ExpandDims", "pair_sum", "y", dims=[0]),
    ]
    op = rnn_op(
        ["x", "h0", "y0"],
        ["h_all", "y_all", "workspaces"],
        ops,
        states=["h_states", "y_states"],
        initial_ids=[1, 2],
        links=[
            ("h_prev", "h_states", 0),
            ("h", "h_states", 1),
            ("pair", "h_states", 0, 2),
            ("y", "y_states", 1),
            ("x_t", "x", 0),
        ],
        aliases=[("h_states", "h_all", 1), ("y_states", "y_all", 1)],
    )
    rng = np.random.default_rng(0)
    x, h0 = rng.standard_normal((4, 2, 3)).astype(F32), rng.standard_normal((1, 2, 3)).astype(F32)
    out = rnn2jax.compile(create_net("n", [op], external_outputs=["h_all", "y_all"]))(
        x=x, h0=h0, y0=np.zeros((1, 2, 3), F32)
    )
    h = np.concatenate([h0, h0 + np.cumsum(x, 0)])
    np.testing.assert_allclose(np.asarray(out["y_all"]), h[:-1] + h[1:], rtol=1e-5, atol=1e-6)


def test_timestep_blob_with_scoped_name():
    """h_t = h_{t-1} + t * x_t, the timestep read through a scoped blob name."""
    ops = [
        create_operator("Cast", "scope/timestep", "t_float", to=1),
        create_operator("Mul", ["x_t", "t_float"], "scaled", broadcast=1),
        create_operator("Sum", ["h_prev", "scaled"], "h"),
    ]
    op = rnn_op(
        ["x", "h0"],
        ["h_all", "h_last", "ws"],
        ops,
        states=["h_states"],
        initial_ids=[1],
        links=[("h_prev", "h_states", 0), ("h", "h_states", 1), ("x_t", "x", 0)],
        aliases=[("h_states", "h_all", 1), ("h_states", "h_last", -1)],
        timestep="scope/timestep",
    )
    x = np.random.default_rng(1).standard_normal((5, 2, 3)).astype(F32)
    out = rnn2jax.compile(create_net("n", [op], external_outputs=["h_all"]))(x=x, h0=np.zeros(3, F32))
    expected = np.cumsum(x * np.arange(5, dtype=F32)[:, None, None], axis=0)
    np.testing.assert_allclose(np.asarray(out["h_all"]), expected, rtol=1e-5, atol=1e-6)


def test_references_resolve_by_name_through_enclosing_scopes():
    """The step net reads `w` (an op input) and `bias` (only in the outer net) by name; a nested
    RecurrentNetwork inside the step net reads the outer step's `h_prev` and the top-level `inner_seq`."""
    inner = rnn_op(
        ["inner_seq", "h_prev"],
        ["g_all", "g_last", "inner_ws"],
        [create_operator("Sum", ["g_prev", "s_t"], "g")],
        states=["g_states"],
        initial_ids=[1],
        links=[("g_prev", "g_states", 0), ("g", "g_states", 1), ("s_t", "inner_seq", 0)],
        aliases=[("g_states", "g_all", 1), ("g_states", "g_last", -1)],
    )
    ops = [
        inner,
        create_operator("Mul", ["g_last", "w"], "gw", broadcast=1, axis=2),
        create_operator("Add", ["gw", "bias"], "gwb", broadcast=1, axis=2),
        create_operator("Sum", ["gwb", "x_t"], "h"),
    ]
    outer = rnn_op(
        ["x", "h0", "w"],
        ["h_all", "h_last", "ws"],
        ops,
        states=["h_states"],
        initial_ids=[1],
        links=[("h_prev", "h_states", 0), ("h", "h_states", 1), ("x_t", "x", 0)],
        aliases=[("h_states", "h_all", 1), ("h_states", "h_last", -1)],
    )
    net = create_net("n", [create_operator("Copy", "b_in", "bias"), outer], external_outputs=["h_all"])
    rng = np.random.default_rng(2)
    x, h0 = rng.standard_normal((3, 2, 4)).astype(F32), rng.standard_normal((1, 2, 4)).astype(F32)
    seq, w, b = (
        rng.standard_normal((2, 2, 4)).astype(F32),
        rng.standard_normal(4).astype(F32),
        np.ones(4, F32),
    )
    out = rnn2jax.compile(net)(x=x, h0=h0, w=w, b_in=b, inner_seq=seq)
    h, hs = h0[0], []
    for t in range(3):
        g = h + seq.sum(0)
        h = g * w + b + x[t]
        hs.append(h)
    np.testing.assert_allclose(np.asarray(out["h_all"]), np.stack(hs), rtol=1e-5, atol=1e-5)


def lstm_rnn_op(scope="lstm", *, seq_lengths=True, backward=False, state_prefix="", gates_reader=False):
    """An LSTM RecurrentNetwork op laid out the way recurrent.py laid it out (and the real nets are).
    `gates_reader` adds an op that reads the gates blob, which rules out the fused LSTM step."""
    s = scope
    unit_inputs = [f"{s}/hidden_t_prev", f"{s}/cell_t_prev", f"{s}/gates_t"]
    unit_inputs += ["seq_lengths", "timestep"] if seq_lengths else ["timestep"]
    ops = [
        create_operator(
            "FC", [f"{s}/hidden_t_prev", f"{s}/gates_t_w", f"{s}/gates_t_b"], f"{s}/gates_t", axis=2
        ),
        create_operator("Sum", [f"{s}/gates_t", "input_t"], f"{s}/gates_t"),
        create_operator(
            "LSTMUnit",
            unit_inputs,
            [f"{s}/hidden_state", f"{s}/cell_state"],
            sequence_lengths=int(seq_lengths),
        ),
    ]
    hs, cs = f"{state_prefix}{s}/{s}/hidden_t_prev_states", f"{state_prefix}{s}/{s}/cell_t_prev_states"
    extra = {}
    if backward:
        extra["backward_step_net"] = create_net("bw", [create_operator("Copy", f"{s}/gates_t", "unused")])
    inputs = [f"{s}/i2h", "h0", "c0", f"{s}/gates_t_w", f"{s}/gates_t_b"] + (
        ["seq_lengths"] if seq_lengths else []
    )
    outs = [f"{s}/hidden_state_all", f"{s}/hidden_state_last", f"{s}/cell_state_all", f"{s}/cell_state_last"]
    return rnn_op(
        inputs,
        [*outs, f"{s}/step_workspaces"],
        ops,
        states=[hs, cs],
        initial_ids=[1, 2],
        links=[
            (f"{s}/hidden_t_prev", hs, 0),
            (f"{s}/hidden_state", hs, 1),
            (f"{s}/cell_t_prev", cs, 0),
            (f"{s}/cell_state", cs, 1),
            ("input_t", f"{s}/i2h", 0),
        ],
        aliases=[(hs, outs[0], 1), (hs, outs[1], -1), (cs, outs[2], 1), (cs, outs[3], -1)],
        **extra,
    )


@pytest.mark.parametrize("gates_reader", [False, True], ids=["fused", "literal"])
@pytest.mark.parametrize("seq_lengths", [True, False])
def test_lstm_layout_matches_numpy(seq_lengths, gates_reader, jit):
    op = lstm_rnn_op(seq_lengths=seq_lengths, gates_reader=gates_reader)
    net = create_net("n", [op], external_outputs=list(op.output[:4]))
    rng = np.random.default_rng(3)
    steps, batch, hidden = 4, 3, 5
    args = {
        "lstm/i2h": rng.standard_normal((steps, batch, 4 * hidden)).astype(F32),
        "h0": rng.standard_normal((1, batch, hidden)).astype(F32),
        "c0": rng.standard_normal((batch, hidden)).astype(F32),
        "lstm/gates_t_w": rng.standard_normal((4 * hidden, hidden)).astype(F32) * 0.5,
        "lstm/gates_t_b": rng.standard_normal(4 * hidden).astype(F32),
    }
    lengths = np.array([4, 0, 2], np.int32) if seq_lengths else None
    if seq_lengths:
        args["seq_lengths"] = lengths
    fn = rnn2jax.compile(net, jit=jit)
    out = fn(args)
    h_all, h_last, c_all, c_last = lstm(
        args["lstm/i2h"], args["h0"][0], args["c0"], args["lstm/gates_t_w"], args["lstm/gates_t_b"], lengths
    )
    np.testing.assert_allclose(np.asarray(out["lstm/hidden_state_all"]), h_all, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["lstm/hidden_state_last"])[0], h_last, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["lstm/cell_state_all"]), c_all, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["lstm/cell_state_last"])[0], c_last, rtol=1e-5, atol=1e-6)


def _scan_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _scan_eqns(sub)


@pytest.mark.parametrize("backward", [False, True])
def test_forward_keeps_no_per_step_intermediates(backward):
    """The scan of a forward-only LSTM emits per step only the rows of its `_all` outputs (h and c);
    with a backward step net, the per-step blobs it reads are kept in step_workspaces."""
    op = lstm_rnn_op(backward=backward)
    net = rnn2jax.load(create_net("n", [op]))
    fn = rnn2jax.compile(net, outputs=list(op.output))
    steps, batch, hidden = 6, 2, 3
    inputs = {
        "lstm/i2h": np.zeros((steps, batch, 4 * hidden), F32),
        "h0": np.zeros((1, batch, hidden), F32),
        "c0": np.zeros((1, batch, hidden), F32),
        "lstm/gates_t_w": np.zeros((4 * hidden, hidden), F32),
        "lstm/gates_t_b": np.zeros(4 * hidden, F32),
        "seq_lengths": np.full(batch, steps, np.int32),
    }
    jaxpr = jax.make_jaxpr(lambda i: fn.apply({}, i))(inputs)
    (scan,) = list(_scan_eqns(jaxpr.jaxpr))
    num_carry = scan.params["num_carry"]
    # rows as [T, 1, N, D] (the plain scan) or [T, N, D] (the recognised LSTM cell, cell_vjp.py)
    per_step = [tuple(d for d in v.aval.shape if d != 1) for v in scan.outvars[num_carry:]]
    expected = [(steps, batch, hidden)] * 2 + ([(steps, batch, 4 * hidden)] if backward else [])
    assert sorted(per_step) == sorted(expected)
    workspaces = fn(inputs)["lstm/step_workspaces"]
    if backward:
        assert sorted(workspaces["per_step"]) == ["lstm/gates_t"]
        assert {k: v.shape for k, v in workspaces["states"].items()} == {
            "lstm/lstm/hidden_t_prev_states": (steps + 1, batch, hidden),
            "lstm/lstm/cell_t_prev_states": (steps + 1, batch, hidden),
        }
    else:
        assert workspaces == {}


def test_forward_only_detection():
    from rnn2jax.ops.recurrent.spec import decode_spec

    def spec_of(**extra):
        op = create_operator("RecurrentNetwork", ["x"], ["a", "b"], step_net=create_net("s", []), **extra)
        return decode_spec(rnn2jax.load(create_net("n", [op])).ops[0])

    assert spec_of().forward_only
    assert spec_of(backward_step_net="").forward_only  # an empty string is no net
    assert not spec_of(backward_step_net=create_net("b", [])).forward_only  # an empty NetDef in n is one
    assert not spec_of(backward_step_net='name: "b"').forward_only


def test_bad_initial_state_and_missing_link_blob():
    with pytest.raises(rnn2jax.ShapeError, match=r"initial state 'h0' has shape \[2, 5, 3\].*N = 2"):
        rnn2jax.compile(accumulator_net())(x=np.zeros((3, 2, 3), F32), h0=np.zeros((2, 5, 3), F32))
    op = rnn_op(
        ["x", "h0"],
        ["h_all", "ws"],
        [create_operator("Sum", ["h_prev", "x_t"], "h")],
        states=["h_states"],
        initial_ids=[1],
        links=[("h_prev", "h_states", 0), ("h", "h_states", 1), ("x_t", "nowhere", 0)],
        aliases=[("h_states", "h_all", 1)],
    )
    net = create_net("n", [op])
    with pytest.raises(
        rnn2jax.MissingBlobError, match=r"missing input\(s\) nowhere \('nowhere' is read by net 'n', op #0"
    ):
        rnn2jax.compile(net)(x=np.zeros((3, 2, 3), F32), h0=np.zeros(3, F32))
    with pytest.raises(rnn2jax.MissingBlobError, match="link 'x_t' reads blob 'nowhere'"):
        rnn2jax.lower(rnn2jax.load(net))({"x": np.zeros((3, 2, 3), F32), "h0": np.zeros(3, F32)})


def test_argument_errors_are_reported_before_tracing():
    op = create_operator("RecurrentNetwork", ["x", "h0"], ["a", "b"], recurrent_states=["s"])
    with pytest.raises(rnn2jax.BadArgumentError, match="missing required argument 'step_net'"):
        rnn2jax.compile(create_net("n", [op]))
    op = create_operator(
        "RecurrentNetwork",
        ["x", "h0"],
        ["a", "b"],
        step_net=create_net("s", []),
        recurrent_states=["s1", "s2"],
        initial_recurrent_state_ids=[1],
    )
    with pytest.raises(
        rnn2jax.BadArgumentError, match=r"recurrent_states \(2\), initial_recurrent_state_ids \(1\)"
    ):
        rnn2jax.compile(create_net("n", [op]))


def test_lstm_step_rounds_as_caffe2s_step_net():
    """The recognised LSTM's scan body computes the step's FC as Caffe2's step net does: one [N, 4H] product plus
    the bias, then the Sum with x_t, then the gates split once (the rounding Caffe2's own RecurrentNetwork and an
    unrolled net share, which rnn_cell_test's test_unroll_lstm compares at 1e-7). Per-gate weight blocks, or the
    bias folded into x_t before the loop, would round differently."""
    op = lstm_rnn_op()
    fn = rnn2jax.compile(create_net("n", [op], external_outputs=[op.output[0]]))
    hidden = 8
    inputs = {
        "lstm/i2h": np.zeros((5, 2, 4 * hidden), F32),
        "h0": np.zeros((1, 2, hidden), F32),
        "c0": np.zeros((1, 2, hidden), F32),
        "lstm/gates_t_w": np.zeros((4 * hidden, hidden), F32),
        "lstm/gates_t_b": np.zeros(4 * hidden, F32),
        "seq_lengths": np.full(2, 5, np.int32),
    }
    (scan,) = list(_scan_eqns(jax.make_jaxpr(lambda i: fn.apply({}, i))(inputs).jaxpr))
    body = scan.params["jaxpr"].jaxpr
    dots = [e for e in body.eqns if e.primitive.name == "dot_general"]
    assert [e.outvars[0].aval.shape for e in dots] == [(2, 4 * hidden)]
    splits = [
        e
        for e in body.eqns
        if e.primitive.name in ("slice", "split") and e.invars[0].aval.shape[-1] == 4 * hidden
    ]
    assert len(splits) == 1 and [v.aval.shape for v in splits[0].outvars] == [(2, hidden)] * 4
