"""`rnn2jax codegen`: the generated module of every builder cell and of the real breadbread predict net
runs in a fresh Python without rnn2jax (jax and numpy only) and gives `rnn2jax.compile`'s outputs, and
jax.grad of them, by blob name; ruff (the project's config) accepts it as generated.

Outputs must agree to float32 rel 1e-6 and parameter gradients to 1e-5 (`assert_blob_equal`: relative to
each element plus the blob's scale). One subprocess runs every module (one XLA compilation each: outputs
and gradients together) while the parent compiles each net with rnn2jax. Sizes come from a seeded
generator, with T = 0 and T = 1 among them and sequence lengths from 0 to T + 1. The breadbread net joins
when the real nets folder is there (the cells and the name-clash net run regardless).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_builder_cells import CELLS, random_params

import rnn2jax
from differential import assert_blob_equal
from helpers import BREADBREAD_WEIGHTS, REALNETS
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.cli import main
from rnn2jax.errors import BadArgumentError, UnsupportedOpError
from rnn2jax.ops.emit import HELPERS
from rnn2jax.runtime.params import load_params, save_params
from rnn2jax.serving.codegen import generate, write_module
from rnn2jax.serving.codegen.helpers import MODULES, helper_source, with_dependencies

PROJECT = Path(__file__).resolve().parents[2]
PREDICT = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"

# Runs in `python -I -S`: no site processing, so the editable rnn2jax install (a .pth finder) is absent;
# site-packages is put back by hand for jax and numpy.
CHILD = """
import importlib, json, sys
folder, site, names = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[:0] = [folder, site]
try:
    import rnn2jax  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("rnn2jax is importable in the child")
import jax
import jax.numpy as jnp
import numpy as np

def weights(value):
    return jnp.cos(jnp.arange(value.size, dtype=jnp.float32) * 0.7).reshape(value.shape)

modules, inputs = {}, {}
for name in names:
    modules[name] = importlib.import_module(name)
    with np.load(f"{folder}/{name}_inputs.npz") as archive:
        inputs[name] = {key: archive[key] for key in archive.files}

def loss(params, name):
    out = modules[name].apply(params, inputs[name])
    return sum(jnp.sum(v * weights(v)) for v in out.values() if jnp.issubdtype(v.dtype, jnp.floating)), out

for name in names:
    step = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, outputs), grads = step(modules[name].load_params(), name)
    assert set(outputs) == set(modules[name].OUTPUTS), (name, sorted(outputs))
    np.savez(f"{folder}/{name}_outputs.npz", **{k: np.asarray(v) for k, v in outputs.items()})
    np.savez(f"{folder}/{name}_grads.npz", **{k: np.asarray(v) for k, v in grads.items()})
assert not [m for m in sys.modules if m.split(".")[0] == "rnn2jax"]
print("ran", len(names))
"""


def _weights(value: jax.Array) -> jax.Array:
    return jnp.cos(jnp.arange(value.size, dtype=jnp.float32) * 0.7).reshape(value.shape)


def _cell_case(name: str, index: int, rng: np.random.Generator) -> tuple:
    steps = 0 if index == 0 else 1 if index % 3 == 1 else int(rng.integers(2, 5))
    batch = int(rng.integers(1, 4))
    s = {
        "T": steps,
        "N": batch,
        "D": int(rng.integers(1, 4)),
        "H": int(rng.integers(1, 5)),
        "L": int(rng.integers(1, 4)),
        "E": int(rng.integers(1, 4)),
        "forms": [str(f) for f in rng.choice(["1-D", "2-D", "3-D"], size=4)],
        "use_lengths": index % 4 != 3,
        "lengths": [int(v) for v in rng.integers(0, steps + 2, size=batch)],
        "seed": int(rng.integers(2**16)),
    }
    reset_net_names()
    cell_rng = np.random.default_rng(s["seed"])
    built = CELLS[name](s, cell_rng)
    return built.model.net.Proto(), random_params(built.model, cell_rng), built.inputs


def _breadbread_case(rng: np.random.Generator) -> tuple:
    steps, batch = 3, 2
    params = {k: (rng.standard_normal(shape) * 0.3).astype(np.float32) for k, shape in BREADBREAD_WEIGHTS.items()}
    inputs = {
        "input_blob": rng.standard_normal((steps, batch, 62)).astype(np.float32),
        "seq_lengths": np.array([steps, 1], np.int32),
        "hidden_init": (rng.standard_normal((1, batch, 100)) * 0.5).astype(np.float32),
        "cell_init": (rng.standard_normal((1, batch, 100)) * 0.5).astype(np.float32),
    }
    return rnn2jax.load(PREDICT), params, inputs


def _names_case(rng: np.random.Generator) -> tuple:
    """Blob names that sanitise alike ('a/b', 'a_b', 'a.b'), a keyword, a leading digit, builtins, in-place
    ops; and the emitters no cell uses: shapes from input blobs (static values), bools, Sub, Div,
    StopGradient, a fill, legacy broadcasting of a scalar, and ops with fewer outputs than they can write."""
    op = create_operator
    ops = [
        op("Relu", "x", "a/b"),
        op("Sigmoid", "x", "a_b"),
        op("Tanh", "x", "a.b"),
        op("Sum", ["a/b", "a_b", "a.b"], "def"),
        op("Mul", ["def", "bias"], "1x", broadcast=1, axis=1),
        op("Add", ["1x", "x"], "1x"),
        op("Softmax", "1x", "input", axis=2),
        op("Copy", "input", "list"),
        op("ConstantFill", [], "one", shape=[1], value=1.0),
        op("Add", ["a_b", "one"], "den", broadcast=1),
        op("Sub", ["def", "x"], "sub"),
        op("Div", ["sub", "den"], "div"),
        op("LT", ["x", "a_b"], "lt"),
        op("EQ", ["lt", "lt"], "eq"),
        op("Cast", "lt", "ltf", to=1),  # FLOAT
        op("Cast", "x", "nonzero", to=5),  # BOOL
        op("StopGradient", "x", "sg"),
        op("Mul", ["sg", "x"], "sgx"),
        op("ExpandDims", "x", "ex", dims=[0]),
        op("Squeeze", "ex", "sq", dims=[0]),
        op("Split", "sq", ["s1", "s2"], split=[1, 2], axis=1),
        op("Split", ["x", "sizes"], ["t1", "t2"], axis=1),
        op("Reshape", ["x", "newshape"], "rs"),
        op("Slice", ["x", "starts", "ends"], "sl"),
        op("Shape", "x", "dims12", axes=[1, 2]),
        op("Transpose", "sl", "tr"),
        op("LayerNorm", "tr", ["ln", "mean", "std"], axis=-1),
        op("Dropout", "ln", "dr", is_test=1),
    ]
    outputs = [
        "def",
        "1x",
        "list",
        "div",
        "eq",
        "ltf",
        "nonzero",
        "sgx",
        "s1",
        "s2",
        "t1",
        "t2",
        "rs",
        "dims12",
        "dr",
        "std",
    ]
    net = create_net("names", ops, ["x", "bias", "sizes", "newshape", "starts", "ends"], outputs)
    inputs = {
        "x": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "sizes": np.array([2, 1], np.int32),
        "newshape": np.array([0, -1], np.int64),
        "starts": np.array([0, 1, 0], np.int32),
        "ends": np.array([-1, 3, -1], np.int32),
    }
    return net, {"bias": rng.standard_normal(3).astype(np.float32)}, inputs


def _compiled(net, params, inputs, outputs) -> tuple[dict, dict]:
    """rnn2jax.compile's outputs and the gradient of the same scalar w.r.t. the parameters (one XLA
    compilation for both)."""
    fn = rnn2jax.compile(net, params=params, outputs=list(outputs))

    def loss(params):
        out = fn.apply(params, inputs)
        return sum(jnp.sum(v * _weights(v)) for v in out.values() if jnp.issubdtype(v.dtype, jnp.floating)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(dict(fn.params))
    return {k: np.asarray(v) for k, v in out.items()}, {k: np.asarray(v) for k, v in grads.items()}


def test_generated_modules_match_compile_without_rnn2jax(tmp_path):
    rng = np.random.default_rng(14)
    cases = {f"cell_{name.replace('-', '_')}": _cell_case(name, i, rng) for i, name in enumerate(CELLS)}
    cases["names"] = _names_case(rng)
    _check_cases(tmp_path, cases)


@pytest.mark.skipif(not PREDICT.exists(), reason=f"real nets folder {REALNETS} is absent")
def test_breadbread_predict_net_from_the_command_line_matches_compile(tmp_path):
    cases = {"breadbread_predict": _breadbread_case(np.random.default_rng(15))}
    params = cases["breadbread_predict"][1]
    save_params(params, tmp_path / "weights.npz")
    argv = ["codegen", str(PREDICT), "--params", str(tmp_path / "weights.npz"), "-o"]
    assert main([*argv, str(tmp_path / "breadbread_predict.py")]) == 0
    _check_cases(tmp_path, cases)


def _check_cases(tmp_path: Path, cases: dict[str, tuple]) -> None:
    """Generate each case's module (breadbread's was written by the command line), lint them, run them all
    in one child process without rnn2jax, and compare with rnn2jax.compile."""
    modules = {}
    for name, (net, params, inputs) in cases.items():
        if name == "breadbread_predict":
            source, saved = (tmp_path / f"{name}.py").read_text(), load_params(tmp_path / f"{name}.npz")
            assert "def LSTM_step(carry, xs):" in source and "lax.scan(LSTM_step, " in source
            assert "# op 0: FC(input_blob, LSTM/i2h_w, LSTM/i2h_b) -> LSTM/i2h" in source
        else:
            source, saved = generate(net, params)
            write_module(tmp_path / f"{name}.py", source, saved)
        save_params(inputs, tmp_path / f"{name}_inputs.npz")
        namespace: dict = {}
        exec(compile(source, name, "exec"), namespace)  # only to read OUTPUTS; it runs in the child
        modules[name] = (namespace["OUTPUTS"], set(saved))
        assert set(saved) <= set(params)

    site = sysconfig.get_paths()["purelib"]
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", CHILD, str(tmp_path), site, json.dumps(list(cases))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    ruff = [str(Path(sys.executable).parent / "ruff"), "check", "--no-cache", "--config"]
    lint = subprocess.run([*ruff, str(PROJECT / "pyproject.toml"), str(tmp_path)], capture_output=True, text=True)
    if lint.returncode:
        child.kill()
        child.communicate()
    assert lint.returncode == 0, lint.stdout + lint.stderr
    want = {name: _compiled(net, params, inputs, modules[name][0]) for name, (net, params, inputs) in cases.items()}
    _, err = child.communicate(timeout=600)
    assert child.returncode == 0, err[-3000:]

    for name, (outputs, saved) in modules.items():
        got_out = load_params(tmp_path / f"{name}_outputs.npz")
        got_grads = load_params(tmp_path / f"{name}_grads.npz")
        want_out, want_grads = want[name]
        assert list(got_out) and set(got_out) == set(outputs) == set(want_out), name
        for blob in outputs:
            assert_blob_equal(f"{name}: {blob}", got_out[blob], want_out[blob], rtol=1e-6)
        assert set(got_grads) == saved, name
        for blob in saved:
            assert_blob_equal(f"{name}: d/d {blob}", got_grads[blob], want_grads[blob], rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# What codegen refuses, by name


def test_ops_without_code_are_listed_at_once():
    ops = [
        create_operator("Scale", "x", "y", scale=2.0),
        create_operator("Relu", "y", "z"),
        create_operator("Exp", "z", "w"),
        create_operator("Scale", "w", "v", scale=0.5),
    ]
    with pytest.raises(UnsupportedOpError) as error:
        generate(create_net("unknown", ops, ["x"], ["v"]), {})
    message = str(error.value)
    assert message.startswith("net 'unknown': codegen cannot write 3 op(s) of 2 type(s) (Exp, Scale):")
    assert [t for _, t in error.value.unsupported] == ["Scale", "Exp", "Scale"]
    for index, kind in ((0, "Scale"), (2, "Exp"), (3, "Scale")):
        assert f"net 'unknown', op #{index} ({kind}): no emitter for this op type" in message


def _lstm_net(**changes) -> tuple:
    """The builder's LSTM (forward only), with arguments of its RecurrentNetwork op replaced."""
    reset_net_names()
    s = {"T": 2, "N": 1, "D": 2, "H": 2, "L": 1, "E": 1, "forms": ["3-D"] * 4, "use_lengths": False,
         "lengths": [2], "seed": 0}  # fmt: skip
    rng = np.random.default_rng(0)
    built = CELLS["lstm-forward_only"](s, rng)
    net = built.model.net.Proto()
    (op,) = [op for op in net.op if op.type == "RecurrentNetwork"]
    for name, values in changes.items():
        (arg,) = [a for a in op.arg if a.name == name] or [op.arg.add(name=name)]
        del arg.ints[:]
        arg.ints.extend(values)
    return net, random_params(built.model, rng)


def test_unsupported_alias_and_link_are_named():
    net, params = _lstm_net(alias_offset=[1, -1, 1, 2])
    with pytest.raises(UnsupportedOpError, match=r"RecurrentNetwork.*alias .*cell_t_prev_states -> .* at offset 2"):
        generate(net, params)
    net, params = _lstm_net(link_window=[1, 2, 1, 1, 1])
    with pytest.raises(UnsupportedOpError, match=r"RecurrentNetwork.*recurrent state .*\(offset 1, window 2\)"):
        generate(net, params)


def test_step_workspaces_are_refused_when_asked_for():
    net, params = _lstm_net()
    (workspaces,) = [op.output[-1] for op in net.op if op.type == "RecurrentNetwork"]
    with pytest.raises(
        UnsupportedOpError, match=rf"op #1 \(RecurrentNetwork\): output '{workspaces}' \(step_workspaces\)"
    ):
        generate(net, params, outputs=[workspaces])


def test_training_dropout_and_bad_output_path(tmp_path):
    net = create_net("train", [create_operator("Dropout", "x", ["y", "mask"], ratio=0.5, is_test=0)], ["x"], ["y"])
    with pytest.raises(UnsupportedOpError, match=r"Dropout in training mode"):
        generate(net, {})
    ok = create_net("ok", [create_operator("Relu", "x", "y")], ["x"], ["y"])
    with pytest.raises(BadArgumentError, match=r"must be a \.py file"):
        write_module(tmp_path / "model.txt", generate(ok, {})[0], {})
    assert not list(tmp_path.iterdir())
    (tmp_path / "ok.pb").write_bytes(ok.SerializeToString())
    assert main(["codegen", str(tmp_path / "ok.pb"), "-o", str(tmp_path / "model.txt")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.pb"]
    assert main(["codegen", str(tmp_path / "ok.pb"), "-o", str(tmp_path / "model.py")]) == 0
    assert "y = jnp.maximum(x, jnp.zeros((), x.dtype))" in (tmp_path / "model.py").read_text()
    assert load_params(tmp_path / "model.npz") == {}


def test_every_helper_defines_with_only_the_generated_modules_imports():
    """A generated module carries the lowering's own functions by source: each `@codegen_helper`, with the
    helpers it calls, must define (annotations and defaults evaluated) among jax, jnp, lax, np and math alone,
    including the helpers no test net uses."""
    assert {"fully_connected", "lstm_unit_step", "normalize_rows", "initial_row"} <= set(HELPERS)
    for name in HELPERS:
        namespace = dict(MODULES)
        for needed in with_dependencies([name]):
            exec(compile(helper_source(needed), needed, "exec"), namespace)
        assert namespace[name].__name__ == name
