"""The native CPU kernels (rnn2jax/native) against the pure lowering and against real Caffe2.

On CPU a recognised LSTM stack (cell_vjp.py) runs each layer's recurrence, forward and backward, as one
native call; every other platform lowers the `lax.scan`. Checked here:
- the kernels load in CI and are what the CPU lowering contains, while CUDA and TPU lowerings contain
  the scan and no native call, and `rnn2jax export` never names a native handler;
- outputs and gradients of the native stack equal the scan's, drawn by hypothesis over sizes, sequence
  lengths (0 and T among them), forget_bias, drop_states, layers, pre-activation outputs and which
  outputs get a gradient;
- FC and FCTransposed as the native GEMM, forward and jax.vjp, equal real Caffe2's FC and FC gradient op;
- the builder's LSTM cells compiled by rnn2jax (the kernels underneath) give real Caffe2's outputs and
  the gradients of Caffe2's training net (its backward step net), drawn by hypothesis;
- where the kernels cannot be used, rnn2jax says why once and runs the scan.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_builder_cells import CELLS, build_cell, random_params, run_caffe2, run_compiled, sizes, training_net

import rnn2jax
from differential import assert_blobs_equal, check_op, make_op
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.ir.loader import load
from rnn2jax.lowering.interpreter import lower
from rnn2jax.native import gemm as native_gemm
from rnn2jax.native import library
from rnn2jax.ops.recurrent.cell_vjp import _lstm
from rnn2jax.proto import caffe2_pb2 as pb


@pytest.fixture(autouse=True, scope="module")
def recurrences_of_every_size_native():
    """rnn2jax runs a recurrence with under library.MIN_STEP_MACS multiply-adds a step on XLA's scan (as
    fast there); these tests' small shapes are to run the kernels all the same."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(library, "MIN_STEP_MACS", 0)
        yield


TARGET = re.compile(r"rnn2jax_(?:lstm|gru|gemm)\w*")


def native_targets(text: str) -> set[str]:
    """The native handlers a lowered module calls, without the library digest."""
    return {name.rsplit("_", 1)[0] for name in TARGET.findall(text)}


def test_kernels_are_in_use():
    """CI builds the kernels (make test installs the package, whose build compiles them): they must load."""
    if not library.expected():
        pytest.skip(f"the native kernels are built for Linux on x86-64 only, not {library.platform.machine()}")
    found = library.status()
    assert found.in_use, found.reason
    assert found.describe().startswith("native CPU kernels: in use")


# -- the stack function, native against scan ---------------------------------------------------------


@st.composite
def stacks(draw):
    depth = draw(st.sampled_from([1, 1, 2, 3]))
    steps, batch = draw(st.integers(1, 7)), draw(st.integers(1, 5))
    lengths = draw(st.none() | st.lists(st.integers(0, steps), min_size=batch, max_size=batch))
    return {
        "steps": steps,
        "batch": batch,
        # widths around the 8-float vector: remainders of the gate loops
        "hidden": draw(st.lists(st.integers(1, 19), min_size=depth, max_size=depth)),
        "lengths": lengths,
        "forget_bias": draw(st.lists(st.sampled_from([0.0, 1.0, -0.5]), min_size=depth, max_size=depth)),
        "drop_states": draw(st.lists(st.booleans(), min_size=depth, max_size=depth)),
        "with_gates": draw(st.lists(st.booleans(), min_size=depth, max_size=depth)),
        # which of (h rows, c rows, h_T, c_T, gates) get a cotangent; the others are symbolic zeros
        "used": draw(st.lists(st.booleans(), min_size=5, max_size=5).filter(lambda used: any(used[:4]))),
        "seed": draw(st.integers(0, 2**16)),
    }


FULL_AND_EMPTY = {
    "steps": 4, "batch": 3, "hidden": [9, 5], "lengths": [0, 4, 2], "forget_bias": [1.0, 0.0],
    "drop_states": [False, True], "with_gates": [True, False], "used": [True, True, True, True, True], "seed": 3,
}  # fmt: skip


def stack_inputs(case, rng):
    hidden, steps, batch = case["hidden"], case["steps"], case["batch"]

    def randn(*shape, scale=0.5):
        return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)

    x = randn(steps, batch, 4 * hidden[0], scale=1.0)
    h0s = tuple(randn(batch, h) for h in hidden)
    c0s = tuple(randn(batch, h) for h in hidden)
    ws = tuple(randn(4 * h, h) for h in hidden)
    bs = tuple(randn(4 * h) for h in hidden)
    wis = tuple(randn(4 * hidden[k], hidden[k - 1]) for k in range(1, len(hidden)))
    bis = tuple(randn(4 * hidden[k]) for k in range(1, len(hidden)))
    valid = None
    if case["lengths"] is not None:
        lengths = jnp.asarray(case["lengths"], jnp.int32)
        valid = (jnp.arange(steps)[:, None] < lengths[None, :])[..., None]
    return (x, h0s, c0s, ws, bs, wis, bis, valid)


def assert_close(actual, expected, what: str):
    """Within 1e-5 of the value's scale (the harness's float32 tolerance): summation orders differ."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-3)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * scale, err_msg=what)


@settings(max_examples=6, deadline=None)
@given(case=stacks())
@example(case=FULL_AND_EMPTY)
def test_native_stack_equals_scan(case):
    args = stack_inputs(case, np.random.default_rng(case["seed"]))
    flags = (tuple(case["forget_bias"]), tuple(case["drop_states"]), tuple(case["with_gates"]))
    native, scan = _lstm(*flags, native=True), _lstm(*flags, native=False)
    out = native(*args)
    weights = jax.tree.map(lambda a: jnp.asarray(np.random.default_rng(1).standard_normal(a.shape), a.dtype), out)

    def loss(cell):
        def value(x, h0s, c0s, ws, bs, wis, bis):
            outputs = cell(x, h0s, c0s, ws, bs, wis, bis, args[-1])
            return sum(
                jnp.sum(o * w)
                for used, group, group_w in zip(case["used"], outputs, weights, strict=True)
                if used
                for o, w in zip(group, group_w, strict=True)
                if o is not None
            ) + jnp.zeros((), jnp.float32)

        return jax.jit(jax.value_and_grad(value, argnums=tuple(range(7))))

    native_lowered, scan_lowered = loss(native).lower(*args[:-1]), loss(scan).lower(*args[:-1])
    assert native_targets(native_lowered.as_text()) == LSTM_TRAINING
    assert not native_targets(scan_lowered.as_text())
    for group, (got, want) in enumerate(zip(jax.jit(native)(*args), jax.jit(scan)(*args), strict=True)):
        for layer, (g, w) in enumerate(zip(got, want, strict=True)):
            assert (g is None) == (w is None)
            if w is not None:
                assert_close(g, w, f"output {group}, layer {layer}")
    (_, grads), (_, expected) = native_lowered.compile()(*args[:-1]), scan_lowered.compile()(*args[:-1])
    want = dict(jax.tree_util.tree_leaves_with_path(expected))
    for path, got in jax.tree_util.tree_leaves_with_path(grads):
        assert_close(got, want[path], f"gradient {jax.tree_util.keystr(path)}")


# -- against real Caffe2 -----------------------------------------------------------------------------

# each builder cell the kernels cover, with the handlers its training lowering must call
# (rnn2jax_gemm: the weight gradients, one GEMM over all steps each)
LSTM_TRAINING = {"rnn2jax_lstm_forward_train", "rnn2jax_lstm_backward", "rnn2jax_gemm"}
GRU_TRAINING = {"rnn2jax_gru_forward_train", "rnn2jax_gru_backward", "rnn2jax_gemm"}
NATIVE_CELLS = {
    "lstm": LSTM_TRAINING,
    "lstm-forget_bias": LSTM_TRAINING,
    "lstm-drop_states": LSTM_TRAINING,
    "lstm-all_output_grads": LSTM_TRAINING,
    "multi_rnn_cell": LSTM_TRAINING,
    "gru": GRU_TRAINING,
    "gru-linear_before_reset": GRU_TRAINING,
    "gru-drop_states": GRU_TRAINING,
}


def lstm_sizes():
    """Small builder-cell sizes, the initial states as the recognised cells take them (3-D)."""
    return sizes(min_steps=1, max_steps=4, max_input=4, max_hidden=9, forms=["3-D"] * 4, past_the_end=False)


@dataclass(frozen=True)
class Caffe2Training:
    """A builder cell's training net (`get_backward_pass`: the backward step net) and what Caffe2 gave."""

    net: pb.NetDef
    grad_map: dict[str, str]  # blob -> its gradient blob
    output_grads: dict[str, np.ndarray]  # the random gradients of the cell's outputs
    differentiable: dict[str, np.ndarray]  # the float inputs and parameters, whose gradients are fetched
    feeds: dict[str, np.ndarray]  # the inputs and output gradients (the parameters aside)
    fetch: list[str]
    grads: dict[str, np.ndarray]  # Caffe2's values of `fetch`


def caffe2_training(caffe2, cell: str, s: dict):
    """(the built cell, its random parameters, Caffe2Training): Caffe2 runs the forward net, its outputs
    checked against rnn2jax's, then the training net with random output gradients."""
    built, init, net, params, rng = build_cell(cell, s)
    outputs = run_caffe2(caffe2, init, net, {**built.inputs, **params}, built.outputs)
    assert_blobs_equal(run_compiled(init, net, params, built.inputs, built.outputs), outputs)
    train, grad_map = training_net(net, built.grad_outputs)
    output_grads = {y: (rng.standard_normal(outputs[y].shape)).astype(np.float32) for y in built.grad_outputs}
    differentiable = {n: v for n, v in {**built.inputs, **params}.items() if v.dtype.kind == "f"}
    feeds = {**built.inputs, **{f"{y}_grad": g for y, g in output_grads.items()}}
    fetch = [grad_map[n] for n in differentiable]
    grads = run_caffe2(caffe2, init, train, {**feeds, **params}, fetch)
    return built, params, Caffe2Training(train, grad_map, output_grads, differentiable, feeds, fetch, grads)


@pytest.mark.parametrize("cell", NATIVE_CELLS)
@settings(max_examples=1, deadline=None)
@given(s=lstm_sizes())
@example(s={"T": 3, "N": 3, "D": 2, "H": 9, "L": 1, "E": 1, "forms": ["3-D"] * 4, "use_lengths": True,
            "lengths": [0, 3, 1], "seed": 5})  # fmt: skip
def test_builder_cells_through_kernels_equal_caffe2(caffe2, cell, s):
    """Forward outputs; then jax.vjp of the compiled net, and the compiled training net (its forward writes
    the step blobs the backward step net reads), against Caffe2's training net (the builder's backward
    step net) with the same output gradients: every input and parameter gradient."""
    built, params, training = caffe2_training(caffe2, cell, s)
    init, net = built.model.param_init_net.Proto(), built.model.net.Proto()
    fn = rnn2jax.compile(net, init_net=init, params=params, outputs=built.outputs)
    fixed = {n: v for n, v in built.inputs.items() if n not in training.differentiable}

    def selected(values):
        outputs = fn.apply(
            {n: values[n] for n in params}, {**fixed, **{n: values[n] for n in built.inputs if n in values}}
        )
        return {y: outputs[y] for y in built.grad_outputs}

    vjp = jax.jit(lambda values, cts: jax.vjp(selected, values)[1](cts)[0])
    if library.status().in_use:
        assert native_targets(vjp.lower(training.differentiable, training.output_grads).as_text()) == NATIVE_CELLS[cell]
    grads = vjp(training.differentiable, training.output_grads)
    assert_blobs_equal({training.grad_map[n]: np.asarray(g) for n, g in grads.items()}, training.grads)
    assert_blobs_equal(run_compiled(None, training.net, params, training.feeds, training.fetch), training.grads)


# -- FC as one native GEMM ---------------------------------------------------------------------------


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_fc_as_native_gemm_equals_caffe2(caffe2, data):
    """Every FC size runs natively here (MIN_MACS 0): the output against Caffe2's FC, and jax.vjp of it and
    rnn2jax's FCGradient (FCTransposedGradient) against Caffe2's gradient op with the same output gradient."""
    transposed = data.draw(st.booleans(), label="transposed")
    lead = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="lead")
    k, n = data.draw(st.integers(1, 9), label="K"), data.draw(st.integers(1, 9), label="N")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    inputs = {
        "x": rng.standard_normal((*lead, k)).astype(np.float32),
        "w": rng.standard_normal((k, n) if transposed else (n, k)).astype(np.float32),
        "b": rng.standard_normal(n).astype(np.float32),
    }
    op_type = "FCTransposed" if transposed else "FC"
    op = make_op(op_type, ["x", "w", "b"], ["y"], axis=len(lead))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_gemm, "MIN_MACS", 0)
        check_op(caffe2, op, inputs)
        net = pb.NetDef(name="fc", op=[op], external_input=["x", "w", "b"], external_output=["y"])
        lowered = lower(load(net))
        dy = rng.standard_normal((*lead, n)).astype(np.float32)

        def vjp(values, cotangent):
            _, pullback = jax.vjp(lambda v: lowered(v)["y"], values)
            return pullback(cotangent)[0]

        text = jax.jit(vjp).lower(inputs, dy).as_text()
        grads = jax.jit(vjp)(inputs, dy)
        gradient = make_op(f"{op_type}Gradient", ["x", "w", "dy"], ["dw", "db", "dx"], axis=len(lead))
        want = check_op(caffe2, gradient, {**inputs, "dy": dy})  # the gradient op runs natively too
        grad_net = pb.NetDef(name="fc_grad", op=[gradient], external_input=["x", "w", "dy"])
        grad_text = jax.jit(lower(load(grad_net))).lower({**inputs, "dy": dy}).as_text()
    assert native_targets(text) == native_targets(grad_text) == {"rnn2jax_gemm"}
    got = {"dw": np.asarray(grads["w"]), "db": np.asarray(grads["b"]), "dx": np.asarray(grads["x"])}
    assert_blobs_equal(got, want)


def test_small_fcs_and_plain_lowerings_keep_xla_dots():
    """Below MIN_MACS, and in a plain lowering (verify's reference) at any size, FC is XLA's dot."""
    x = np.ones((64, 128), np.float32)
    w, b = np.ones((256, 128), np.float32), np.zeros(256, np.float32)
    net = pb.NetDef(name="fc", op=[make_op("FC", ["x", "w", "b"], ["y"])], external_input=["x", "w", "b"])
    assert native_gemm.MIN_MACS <= 64 * 128 * 256
    values = {"x": x, "w": w, "b": b}
    if library.status().in_use:
        assert native_targets(jax.jit(lower(load(net))).lower(values).as_text()) == {"rnn2jax_gemm"}
    assert not native_targets(jax.jit(lower(load(net), plain=True)).lower(values).as_text())
    small = {"x": x[:4, :8], "w": w[:8, :8], "b": b[:8]}
    assert not native_targets(jax.jit(lower(load(net))).lower(small).as_text())


# -- platforms, export and fallback ------------------------------------------------------------------


def _lstm_net(s=None):
    reset_net_names()
    s = s or {"T": 3, "N": 2, "D": 3, "H": 4, "L": 1, "E": 1, "forms": ["3-D"] * 4, "use_lengths": True,
              "lengths": [3, 1], "seed": 0}  # fmt: skip
    rng = np.random.default_rng(s["seed"])
    built = CELLS["lstm"](s, rng)
    params = random_params(built.model, rng)
    fn = rnn2jax.compile(built.model.net.Proto(), init_net=built.model.param_init_net.Proto(), params=params)
    return fn, built


def _training_loss(fn, built):
    def loss(params):
        return jnp.sum(fn.apply(params, built.inputs)[built.grad_outputs[0]] ** 2)

    return jax.jit(jax.grad(loss))


def test_kernels_leave_the_callers_openmp_thread_count_as_it_was():
    """OpenMP's thread count is a setting of the calling thread that PyTorch's and NumPy's OpenMP builds in the
    same process read too: a kernel that set it for its call and left it (found when PyTorch, timed after
    rnn2jax in one process, ran on one thread) would change how fast the user's other code runs."""
    if not library.status().in_use:
        pytest.skip(f"the native kernels are not in use here: {library.status().reason}")
    import ctypes

    openmp = ctypes.CDLL("libgomp.so.1")  # the runtime the kernels were linked with, already loaded
    before = openmp.omp_get_max_threads()
    try:
        openmp.omp_set_num_threads(3)  # neither the one nor the XLA pool's count a kernel would choose
        x, w, b = (np.ones(shape, np.float32) for shape in ((64, 128), (256, 128), (256,)))
        net = pb.NetDef(name="fc", op=[make_op("FC", ["x", "w", "b"], ["y"])], external_input=["x", "w", "b"])
        jax.block_until_ready(jax.jit(lower(load(net)))({"x": x, "w": w, "b": b}))
        fn, built = _lstm_net()
        jax.block_until_ready(_training_loss(fn, built)(dict(fn.params)))
        assert openmp.omp_get_max_threads() == 3
    finally:
        openmp.omp_set_num_threads(before)


THREADS_STARTED = """
import os
import jax, jax.numpy as jnp, numpy as np
from rnn2jax.native import gemm, library
assert library.status().in_use, library.status().reason
a, b = jnp.ones((512, 512), np.float32), jnp.ones((512, 512), np.float32)
jax.jit(lambda a, b: a @ b)(a, b).block_until_ready()  # XLA's own threads exist now
before = len(os.listdir("/proc/self/task"))
jax.jit(lambda a, b: gemm.gemm(a, b, trans_a=False, trans_b=True))(a, b).block_until_ready()
print(len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.parametrize("limit", [1, 2])
def test_kernels_keep_to_openmps_thread_limit(limit):
    """OMP_NUM_THREADS=1 keeps the kernels on one thread (a single-thread benchmark or a user sharing the cores
    with PyTorch); with two allowed, a GEMM of 2^27 multiply-adds starts OpenMP's second thread. Counted as
    the process's threads before and after the first kernel call, in a fresh process."""
    if not library.status().in_use:
        pytest.skip(f"the native kernels are not in use here: {library.status().reason}")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: XLA's pool has one thread, so no kernel ever starts a second")
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": str(limit), "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=true"}
    ran = subprocess.run([sys.executable, "-c", THREADS_STARTED], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    started = int(ran.stdout.split()[-1])
    assert started == (0 if limit == 1 else 1), (limit, started)


def test_other_platforms_lower_to_the_scan():
    if not library.status().in_use:
        pytest.skip(f"the native kernels are not in use here: {library.status().reason}")
    fn, built = _lstm_net()
    grad = _training_loss(fn, built)
    params = dict(fn.params)
    assert native_targets(grad.lower(params).as_text()) == LSTM_TRAINING
    for platform in ("cuda", "tpu"):
        module = jax.export.export(grad, platforms=(platform,))(params).mlir_module()
        assert not native_targets(module), platform
        assert module.count("stablehlo.while") == 2, platform  # the forward scan and the reverse one
    both = jax.export.export(grad, platforms=("cuda", "tpu"))(params).mlir_module()
    assert not native_targets(both)


def test_export_names_no_native_handler():
    """`rnn2jax export` serializes the pure lowering, even for CPU: the file runs without this library."""
    from rnn2jax.serving.exporter import export_net

    fn, built = _lstm_net()
    specs = {n: jax.ShapeDtypeStruct(v.shape, v.dtype) for n, v in built.inputs.items()}
    exported = export_net(fn, specs, platforms=("cpu",))
    assert not native_targets(exported.mlir_module())
    assert "stablehlo.while" in exported.mlir_module()
    ran = exported.call({n: jnp.asarray(v) for n, v in built.inputs.items()})
    expected = fn(built.inputs)
    for name in built.outputs:
        assert_close(ran[name], expected[name], name)


def test_unusable_kernels_fall_back_and_say_why_once(monkeypatch):
    """A library that cannot be used: the scan runs, with the reason given once per process."""
    monkeypatch.setattr(library, "_status", library.NativeStatus(False, "libdnnl.so.3: cannot open (a test)"))
    monkeypatch.setattr(library, "_warned", False)
    monkeypatch.setattr(library, "expected", lambda: True)
    fn, built = _lstm_net()
    with pytest.warns(RuntimeWarning, match=r"pure lax\.scan lowering on CPU: libdnnl\.so\.3: cannot open"):
        text = _training_loss(fn, built).lower(dict(fn.params)).as_text()
    assert not native_targets(text) and "stablehlo.while" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _training_loss(*_lstm_net()).lower(dict(fn.params))
