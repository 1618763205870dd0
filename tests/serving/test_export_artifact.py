"""`rnn2jax export` writes a standard `jax.export` artifact: a process with nothing but jax and numpy runs
the real breadbread LSTM from it at several (T, N) with symbolic dims, lowered for cpu and cuda, with the
parameters baked in or given per call, and gets what `rnn2jax.compile` gives, by blob name. Also: the
checks of `rnn2jax.serving.load_exported`, files in the format written before, and the errors for nets
that cannot be exported with symbolic dims.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnn2jax
from helpers import BREADBREAD_HIDDEN, BREADBREAD_VOCAB, BREADBREAD_WEIGHTS, REALNETS
from rnn2jax.cli import main
from rnn2jax.serving import LEGACY_MAGIC, load_exported

pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")

BREAD = REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt"
needs_bread = pytest.mark.skipif(not BREAD.is_file(), reason=f"real nets folder {REALNETS} is absent")
VOCAB, HIDDEN = BREADBREAD_VOCAB, BREADBREAD_HIDDEN
WEIGHTS = BREADBREAD_WEIGHTS
SYMBOLIC = [
    f"--input-shape=input_blob=T,N,{VOCAB}",
    "--input-shape=seq_lengths=N",
    f"--input-shape=hidden_init=1,N,{HIDDEN}",
    f"--input-shape=cell_init=1,N,{HIDDEN}",
    "--input-dtype=seq_lengths=int32",
]
CASES = [(1, 1), (6, 3), (3, 5)]  # (T, N): three sizes, one artifact

# The artifact's XLA program is not the one rnn2jax.compile jits (weights are constants, dims symbolic),
# so XLA may order the float32 sums of the 62- and 100-term dot products differently. Measured: at most
# 3.6e-7 absolute on outputs up to 2.3 in magnitude (1.5 ulp there; 0 at T,N = 25,10). 1e-6 absolute
# is 4 ulp at 2.0; the relative part only matters for entries near 0, where reordering dominates.
TOLERANCE = {"rtol": 1e-6, "atol": 1e-6}


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in WEIGHTS.items()}


def _inputs(steps: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_blob": rng.standard_normal((steps, batch, VOCAB)).astype(np.float32),
        "seq_lengths": rng.integers(1, steps + 1, batch).astype(np.int32),
        "hidden_init": rng.standard_normal((1, batch, HIDDEN)).astype(np.float32),
        "cell_init": rng.standard_normal((1, batch, HIDDEN)).astype(np.float32),
    }


def _assert_outputs(got: dict[str, np.ndarray], want: dict[str, jax.Array], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name, value in want.items():
        np.testing.assert_allclose(got[name], np.asarray(value), **TOLERANCE, err_msg=f"{what}: {name}")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The breadbread predict net exported twice with symbolic T and N: parameters baked in (for cpu and
    cuda, every shape given), and parameters as an argument (the default platforms, shapes inferred)."""
    if not BREAD.is_file():
        pytest.skip(f"real nets folder {REALNETS} is absent")
    folder = tmp_path_factory.mktemp("artifacts")
    weights = _weights(0)
    np.savez(folder / "weights.npz", **weights)
    baked, given = folder / "bread.bin", folder / "bread_params.bin"
    base = ["export", str(BREAD), "--params", str(folder / "weights.npz"), *SYMBOLIC]
    assert main([*base, "--platforms", "cpu,cuda", "-o", str(baked)]) == 0
    # --batch/--steps: every input's shape inferred, with the same symbols
    argv = ["export", str(BREAD), "--params", str(folder / "weights.npz"), "--batch", "N", "--steps", "T"]
    assert main([*argv, "--params-as-input", "-o", str(given)]) == 0
    return folder, weights, baked, given


# A fresh interpreter (-I: no PYTHONPATH, no user site, no current directory on sys.path) in which
# importing rnn2jax fails: the artifacts must run on jax and numpy alone.
NO_RNN2JAX = r"""
import importlib.abc
import sys


class NoRnn2jax(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "rnn2jax":
            raise ImportError(f"{name}: serving must not need rnn2jax")


sys.meta_path.insert(0, NoRnn2jax())
"""
SERVE = (
    NO_RNN2JAX
    + r"""
import json

import jax
import numpy as np

baked_path, given_path, data_path, out_path = sys.argv[1:]


def load(path):
    with open(path, "rb") as file:
        return jax.export.deserialize(bytearray(file.read()))


baked, given = load(baked_path), load(given_path)
data = dict(np.load(data_path))
groups = {}
for key, value in data.items():
    group, _, name = key.partition(":")
    groups.setdefault(group, {})[name] = value
outputs = {}
for group, arrays in groups.items():
    if group.startswith("case"):
        result = baked.call(arrays)
    elif group.startswith("params"):
        inputs = {k[len("in/"):]: v for k, v in arrays.items() if k.startswith("in/")}
        result = given.call({k: v for k, v in arrays.items() if not k.startswith("in/")}, inputs)
    else:
        continue
    assert isinstance(result, dict), type(result)
    outputs.update({f"{group}:{name}": np.asarray(value) for name, value in result.items()})
np.savez(out_path, **outputs)
try:
    import rnn2jax  # noqa: F401
except ImportError:
    pass
else:
    raise AssertionError("rnn2jax was importable")
assert not any(m.partition(".")[0] == "rnn2jax" for m in sys.modules), sorted(sys.modules)
print(json.dumps({"baked": list(baked.platforms), "given": list(given.platforms)}))
"""
)


@needs_bread
def test_the_artifact_runs_in_plain_jax_at_any_t_and_n_and_matches_compile(artifacts):
    folder, weights, baked, given = artifacts
    other = _weights(1)
    data = {}
    for i, (steps, batch) in enumerate(CASES):
        data.update({f"case{i}:{k}": v for k, v in _inputs(steps, batch, seed=i).items()})
    for i, params in enumerate((weights, other)):  # one artifact, two weight sets
        data.update({f"params{i}:{k}": v for k, v in params.items()})
        data.update({f"params{i}:in/{k}": v for k, v in _inputs(4, 2, seed=10 + i).items()})
    np.savez(folder / "data.npz", **data)
    out = folder / "out.npz"
    ran = subprocess.run(
        [sys.executable, "-I", "-c", SERVE, str(baked), str(given), str(folder / "data.npz"), str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    platforms = json.loads(ran.stdout.strip().splitlines()[-1])
    assert platforms == {"baked": ["cpu", "cuda"], "given": ["cpu", "cuda"]}
    with np.load(out) as saved:
        got = dict(saved)
    fn = rnn2jax.compile(BREAD, params=weights)
    for i, (steps, batch) in enumerate(CASES):
        want = fn(_inputs(steps, batch, seed=i))
        _assert_outputs(
            {k.partition(":")[2]: v for k, v in got.items() if k.startswith(f"case{i}:")}, want, f"T,N={steps},{batch}"
        )
    for i, params in enumerate((weights, other)):
        want = rnn2jax.compile(BREAD, params=params)(_inputs(4, 2, seed=10 + i))
        _assert_outputs(
            {k.partition(":")[2]: v for k, v in got.items() if k.startswith(f"params{i}:")}, want, f"params {i}"
        )
    assert not np.allclose(got["params0:softmax"], got["params1:softmax"])  # the weights did reach the net


@needs_bread
def test_load_exported_calls_by_name_and_names_what_does_not_fit(artifacts):
    _, weights, baked, given = artifacts
    model, per_weights = load_exported(baked), load_exported(given)
    assert model.platforms == ("cpu", "cuda") and model.params is None
    shapes = {n: [str(d) for d in a.shape] for n, a in model.inputs.items()}
    assert shapes == {
        "input_blob": ["T", "N", "62"], "seq_lengths": ["N"], "hidden_init": ["1", "N", "100"],
        "cell_init": ["1", "N", "100"],
    }  # fmt: skip
    assert {n: [str(d) for d in a.shape] for n, a in per_weights.inputs.items()} == shapes  # inferred the same
    assert {n: a.dtype for n, a in per_weights.inputs.items()} == {n: a.dtype for n, a in model.inputs.items()}
    assert {n: a.shape for n, a in per_weights.params.items()} == WEIGHTS
    inputs = _inputs(2, 3, seed=5)
    want = rnn2jax.compile(BREAD, params=weights)(inputs)
    loose = {k: v.astype(np.float64) if k != "seq_lengths" else v.tolist() for k, v in inputs.items()}
    got = model(**loose)  # keyword arguments; float64 and a list holding exactly the values are converted
    _assert_outputs({k: np.asarray(v) for k, v in got.items()}, want, "load_exported")
    _assert_outputs({k: np.asarray(v) for k, v in per_weights(weights, inputs).items()}, want, "params")

    def error(kind, call, *parts):
        with pytest.raises(kind) as raised:
            call()
        assert isinstance(raised.value, rnn2jax.Rnn2JaxError) and "\n" not in str(raised.value)
        for part in ("export '", *parts):  # which file, then what
            assert part in str(raised.value), str(raised.value)

    x = dict(inputs)
    without = {k: v for k, v in x.items() if k != "cell_init"}
    error(rnn2jax.MissingBlobError, lambda: model(without), f"export '{baked}' takes inputs", "missing: cell_init")
    error(rnn2jax.MissingBlobError, lambda: model({**x, "data": x["cell_init"]}), "unknown: data")
    error(
        rnn2jax.ShapeError,
        lambda: model({**x, "input_blob": x["input_blob"][0]}),
        "'input_blob' has shape [3, 62]",
        "[T, N, 62]",
    )
    error(
        rnn2jax.ShapeError,
        lambda: model({**x, "hidden_init": np.zeros((2, 3, 100), np.float32)}),
        "'hidden_init'",
        "[1, N, 100]",
    )
    error(
        rnn2jax.ShapeError,
        lambda: model({**x, "seq_lengths": np.ones(4, np.int32)}),
        "'seq_lengths' has N = 4",
        "has N = 3",
    )
    t0 = {**x, "input_blob": np.zeros((0, 3, 62), np.float32)}
    error(rnn2jax.ShapeError, lambda: model(t0), "'input_blob' has T = 0", "at least 1", "fixed to 0")
    error(
        rnn2jax.InputTypeError,
        lambda: model({**x, "seq_lengths": x["seq_lengths"] + 0.5}),
        "'seq_lengths' must be an array of int32, got float64",
    )
    error(  # converted only when every value survives: never rounded or wrapped on the way in
        rnn2jax.InputTypeError,
        lambda: model({**x, "input_blob": x["input_blob"].astype(np.float64) + 1e-9}),
        "'input_blob' must be an array of float32, got float64",
        "cannot all hold exactly",
    )
    error(
        rnn2jax.InputTypeError,
        lambda: model({**x, "seq_lengths": x["seq_lengths"].astype(np.int64) + 2**32}),
        "'seq_lengths' must be an array of int32, got int64",
        "cannot all hold exactly",
    )
    error(rnn2jax.InputTypeError, lambda: model(list(x.values())), "must be a mapping")
    error(rnn2jax.InputTypeError, lambda: model(x, x), "model(inputs)")
    error(rnn2jax.InputTypeError, lambda: per_weights(**x), "model(params, inputs)")
    error(
        rnn2jax.MissingBlobError,
        lambda: per_weights({k: v for k, v in weights.items() if k != "LSTM/i2h_w"}, x),
        "parameters",
        "missing: LSTM/i2h_w",
    )
    bad = {**weights, "LSTM/i2h_b": weights["LSTM/i2h_b"][:10]}
    error(rnn2jax.ShapeError, lambda: per_weights(bad, x), "parameter 'LSTM/i2h_b' has shape [10]", "[400]")


def _fits(shape: list[int]) -> bool:
    return len(shape) == 3 and shape[0] >= 1 and shape[1:] == [3, VOCAB]


@needs_bread
@settings(deadline=None)
@given(st.lists(st.sampled_from([0, 1, 2, 3, VOCAB - 1, VOCAB]), max_size=4).filter(lambda s: not _fits(s)))
def test_load_exported_refuses_every_misfit_input_blob_before_calling(artifacts, shape):
    """Any shape for input_blob that is not [T >= 1, N, 62] beside N = 3 inputs is refused by name."""
    model = load_exported(artifacts[2])
    inputs = {**_inputs(1, 3, seed=0), "input_blob": np.zeros(shape, np.float32)}
    with pytest.raises(rnn2jax.ShapeError, match="input 'input_blob' has"):
        model(inputs)


@needs_bread
def test_an_export_with_t_fixed_to_0_gives_the_initial_states(artifacts, tmp_path):
    """Symbolic dims are >= 1, so T = 0 takes its own export; the compiled net then returns the initial
    states as the last states and an empty softmax, and so does the export."""
    folder, weights, _, _ = artifacts
    out = tmp_path / "t0.bin"
    argv = ["export", str(BREAD), "--params", str(folder / "weights.npz"), f"--input-shape=input_blob=0,N,{VOCAB}"]
    assert main([*argv, "-o", str(out)]) == 0  # the other inputs' shapes are inferred from N
    inputs = {**_inputs(1, 3, seed=7), "input_blob": np.zeros((0, 3, VOCAB), np.float32)}
    inputs["seq_lengths"][:] = 0
    got = {k: np.asarray(v) for k, v in load_exported(out)(inputs).items()}
    want = rnn2jax.compile(BREAD, params=weights)(inputs)
    _assert_outputs(got, want, "T = 0")
    assert got["softmax"].shape == (0, 3, VOCAB)
    np.testing.assert_array_equal(got["LSTM/hidden_t_last"], inputs["hidden_init"])
    np.testing.assert_array_equal(got["LSTM/cell_t_last"], inputs["cell_init"])


# A classic Caffe2 pattern: flatten [T, N, D] to [T*N, D] for an FC, then restore the leading dims with
# the old shape Reshape wrote. The first Reshape takes symbolic dims, but the second needs the VALUES of
# the first's old shape (T and N, traced under shape polymorphism), so the net cannot take symbolic T and
# N; with sizes it exports fine.
FLATTEN_NET = """
name: "flatten"
op { input: "x" output: "x2d" output: "x_shape" type: "Reshape" arg { name: "shape" ints: -1 ints: 4 } }
op { input: "x2d" input: "w" input: "b" output: "y2d" type: "FC" }
op { input: "y2d" input: "x_shape" output: "y" output: "y2d_shape" type: "Reshape" }
external_input: "x" external_output: "y"
"""

# OneHot's output width is the VALUE of its input `size`: not an argument an export can take.
ONE_HOT_NET = """
name: "one_hot"
op { input: "indices" input: "size" output: "y" type: "OneHot" }
external_output: "y"
"""


def test_nets_that_cannot_take_symbolic_dims_are_refused_naming_the_op_and_blob(tmp_path, capsys):
    rng = np.random.default_rng(0)
    (tmp_path / "flatten.pbtxt").write_text(FLATTEN_NET)
    (tmp_path / "one_hot.pbtxt").write_text(ONE_HOT_NET)
    params = {"w": rng.standard_normal((4, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    np.savez(tmp_path / "p.npz", **params)
    out = tmp_path / "m.bin"
    base = ["export", str(tmp_path / "flatten.pbtxt"), "--params", str(tmp_path / "p.npz"), "-o", str(out)]
    assert main([*base, "--input-shape", "x=T,N,4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists(), err
    for part in ("net 'flatten', op #2 (Reshape)", "input 'x_shape'", "traced"):
        assert part in err, err
    assert main([*base, "--input-shape", "x=3,2,4"]) == 0  # the same net with sizes
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    want = rnn2jax.compile(tmp_path / "flatten.pbtxt", params=params)(x=x)["y"]
    np.testing.assert_allclose(np.asarray(load_exported(out)(x=x)["y"]), np.asarray(want), **TOLERANCE)

    hot = ["export", str(tmp_path / "one_hot.pbtxt"), "--input-shape", "indices=N", "--input-dtype", "indices=int64"]
    assert main([*hot, "--input-shape", "size=1", "--input-dtype", "size=int64", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for part in ("net 'one_hot'", "input(s) size", "op #0 (OneHot)", "--params"):
        assert part in err, err
    np.savez(tmp_path / "size.npz", size=np.array([5], np.int64))  # the remedy: bake the value in
    assert main([*hot, "--params", str(tmp_path / "size.npz"), "--params-as-input", "-o", str(out)]) == 0
    served = load_exported(out)
    assert served.params == {}  # a value that decides a shape stays a constant
    indices = np.array([4, 0, 2], np.int64)
    got = np.asarray(served({}, {"indices": indices})["y"])
    np.testing.assert_array_equal(got, np.eye(5, dtype=np.float32)[indices])


def test_files_in_the_format_written_before_still_load(tmp_path):
    """The container `rnn2jax export` wrote before (a magic line, a JSON header, then an Exported taking
    positional inputs and returning a tuple), written here as that writer did."""
    predict = Path(__file__).resolve().parents[2] / "rnn2jax/examples/mlp_predict_net.pbtxt"
    init = predict.with_name("mlp_init_net.pbtxt")
    fn = rnn2jax.compile(predict, init_net=init)
    params = fn.params

    def serve(data):
        return (fn.apply(params, {"data": data})["prob"],)

    exported = jax.export.export(jax.jit(serve))(jax.ShapeDtypeStruct((4, 8), np.float32))
    header = {
        "inputs": [{"name": "data", "shape": [4, 8], "dtype": "float32"}], "outputs": ["prob"],
        "params": "constants", "platforms": list(exported.platforms), "net": fn.net.name,
    }  # fmt: skip
    path = tmp_path / "old.bin"
    path.write_bytes(LEGACY_MAGIC + json.dumps(header).encode() + b"\n" + bytes(exported.serialize()))
    model = load_exported(path)
    assert model.legacy and model.input_names == ("data",) and model.output_names == ("prob",)
    data = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(model(data=data)["prob"]), np.asarray(fn(data=data)["prob"]), **TOLERANCE)
    with pytest.raises(rnn2jax.ShapeError, match=r"'data' has shape \[3, 8\]; the export expects \[4, 8\]"):
        model(data=data[:3])
    path.write_bytes(LEGACY_MAGIC + b"{not json\n" + bytes(exported.serialize()))
    with pytest.raises(rnn2jax.ParseError, match="header is not JSON"):
        load_exported(path)


# Shape-only ops on symbolic dims: Reshape keeps a symbolic dim (its -1 and 0 too), and what Reshape,
# Shape and Concat write about shapes becomes a traced array of those dims.
SHAPE_OPS_NET = """
name: "shape_ops"
op { input: "x" output: "x2d" output: "x_shape" type: "Reshape" arg { name: "shape" ints: -1 ints: 4 } }
op { input: "x2d" input: "w" input: "b" output: "y2d" type: "FC" }
op { input: "y2d" output: "y" output: "y2d_shape" type: "Reshape"
     arg { name: "shape" ints: 0 ints: -1 ints: 2 ints: 2 } }
op { input: "y" output: "s" type: "Shape" }
op { input: "x" input: "x" output: "cat" output: "split" type: "Concat" arg { name: "axis" i: 0 } }
external_input: "x"
external_output: "y" external_output: "s" external_output: "cat" external_output: "split" external_output: "x_shape"
"""


def test_shape_ops_take_symbolic_dims(tmp_path, capsys):
    rng = np.random.default_rng(1)
    net = tmp_path / "shape_ops.pbtxt"
    net.write_text(SHAPE_OPS_NET)
    params = {"w": rng.standard_normal((4, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    np.savez(tmp_path / "p.npz", **params)
    out = tmp_path / "m.bin"
    base = ["export", str(net), "--params", str(tmp_path / "p.npz"), "-o", str(out)]
    assert main([*base, "--input-shape", "x=T,N,4"]) == 0
    served, compiled = load_exported(out), rnn2jax.compile(net, params=params)
    for steps, batch in ((1, 1), (3, 2), (5, 7)):
        x = rng.standard_normal((steps, batch, 4)).astype(np.float32)
        got, want = served(x=x), compiled(x=x)
        assert np.asarray(got["y"]).shape == (steps * batch, 1, 2, 2)
        assert np.asarray(got["x_shape"]).tolist() == [steps, batch, 4]
        _assert_outputs(got, want, f"T, N = {steps}, {batch}")
    # [T, N, 4] -> [-1, 3] fits only when 3 divides 4*T*N: the export cannot decide it, and says where.
    bad = tmp_path / "bad.pbtxt"
    bad.write_text(SHAPE_OPS_NET.replace("ints: -1 ints: 4 }", "ints: -1 ints: 3 }", 1))
    assert main([*base[:1], str(bad), *base[2:], "--input-shape", "x=T,N,4"]) == 2
    err = capsys.readouterr().err
    for part in ("net 'shape_ops', op #0 (Reshape)", "[-1, 3] does not fit", "[T, N, 4]", "symbolic dims"):
        assert part in err, err
    # Slice's end 2 needs T >= 2, which a symbol (T >= 1) leaves undecided: named, with the blob's shape.
    (tmp_path / "slice.pbtxt").write_text(
        'name: "slice" op { input: "x" output: "y" type: "Slice" arg { name: "starts" ints: 0 ints: 0 } '
        'arg { name: "ends" ints: 2 ints: -1 } } external_input: "x" external_output: "y"'
    )
    assert main(["export", str(tmp_path / "slice.pbtxt"), "-o", str(out), "--input-shape", "x=T,4"]) == 2
    err = capsys.readouterr().err
    for part in ("net 'slice', op #0 (Slice)", "cannot run with symbolic dims", "'x' (float32[T,4])", "'T' < '2'"):
        assert part in err, err


# ------------------------------------------------------------------------------------------------
# Every cell the builders make (tests/recurrent/test_builder_cells.py's CELLS: LSTM and its options, MILSTM, the
# layer-norm cells, GRU in both forms, BasicRNN, stacks, dropout, the attention cells), exported with
# symbolic T and N (and the encoder length L of the attention cells), run in one fresh process without
# rnn2jax at three sizes each, against rnn2jax.compile of the same net at the same inputs.

# The sizes the nets are built at: T, N and L differ from every other dim, so they are found by value.
CELL_SIZES = {"T": 6, "N": 7, "D": 2, "H": 3, "L": 5, "E": 4}
CELL_CASES = ((1, 3, 2), (4, 1, 1), (2, 2, 3))  # (T, N, L): T = 1, N = 1 and L = 1 among them
# One jax.jit per case over every cell's call: three XLA compilations instead of 75 (the test's cost).
SERVE_CELLS = (
    NO_RNN2JAX
    + r"""
import jax
import numpy as np

folder, data_path, out_path = sys.argv[1:]
data = dict(np.load(data_path))
cases = {}
for key, value in data.items():
    case, cell, name = key.split("|")
    cases.setdefault(case, {}).setdefault(cell, {})[name] = value
exported = {}
for cell in {cell for calls in cases.values() for cell in calls}:
    with open(f"{folder}/{cell}.bin", "rb") as file:
        exported[cell] = jax.export.deserialize(bytearray(file.read()))
outputs = {}
for case, calls in cases.items():
    results = jax.jit(lambda calls: {cell: exported[cell].call(inputs) for cell, inputs in calls.items()})(calls)
    for cell, result in results.items():
        assert isinstance(result, dict), type(result)
        outputs.update({f"{case}|{cell}|{name}": np.asarray(value) for name, value in result.items()})
np.savez(out_path, **outputs)
assert not any(m.partition(".")[0] == "rnn2jax" for m in sys.modules), sorted(sys.modules)
"""
)


def _cell_dim(blob: str, axis: int, size: int) -> int | str:
    if blob in ("x", "dec_in") and axis == 0:
        return "T"
    if blob == "enc" and axis == 0:
        return "L"
    return "N" if size == CELL_SIZES["N"] else size


def _cell_inputs(shapes: dict, dtypes: dict, case: tuple[int, int, int], seed: int) -> dict[str, np.ndarray]:
    """Random inputs at (T, N, L) = `case`: sequence lengths from 0 to T + 1 (beyond T counts as T, in
    Caffe2 too), encoder lengths from 1 to L."""
    rng = np.random.default_rng(seed)
    sizes = dict(zip("TNL", case, strict=True))
    inputs = {}
    for name, dims in shapes.items():
        shape = tuple(sizes.get(d, d) for d in dims)
        if dtypes[name].kind == "i":
            low, high = (1, sizes["L"]) if name == "enc_len" else (0, sizes["T"] + 1)
            inputs[name] = rng.integers(low, high + 1, shape).astype(dtypes[name])
        else:
            inputs[name] = (0.5 * rng.standard_normal(shape)).astype(dtypes[name])
    return inputs


def test_every_builder_cell_exports_with_symbolic_t_and_n_and_runs_in_plain_jax(tmp_path):
    from test_builder_cells import CELLS, FORMS, random_params

    from rnn2jax.caffe2.python.core import reset_net_names
    from rnn2jax.serving.exporter import export_net, input_specs

    data, compiled = {}, {}
    for index, cell in enumerate(CELLS):
        forms = [FORMS[(index + k) % len(FORMS)] for k in range(4)]  # initial states 1-D, 2-D and 3-D
        s = {**CELL_SIZES, "forms": forms, "use_lengths": index % 3 != 2, "lengths": [1] * 7, "seed": index}
        reset_net_names()
        rng = np.random.default_rng(index)
        built = CELLS[cell](s, rng)
        params = random_params(built.model, rng)  # every blob the init net fills: no need to run it
        fn = rnn2jax.compile(built.model.net.Proto(), params=params, outputs=built.outputs)
        assert sorted(fn.input_names) == sorted(built.inputs) and not fn.static_params, cell
        shapes = {n: [_cell_dim(n, a, d) for a, d in enumerate(v.shape)] for n, v in built.inputs.items()}
        assert shapes[next(iter(shapes))][:2] == ["T", "N"], shapes  # the sequence input
        dtypes = {n: v.dtype for n, v in built.inputs.items()}
        exported = export_net(fn, input_specs(shapes, dtypes), platforms=("cpu",))
        (tmp_path / f"{cell}.bin").write_bytes(exported.serialize())
        compiled[cell] = fn
        for k, case in enumerate(CELL_CASES):
            data.update({f"{k}|{cell}|{n}": v for n, v in _cell_inputs(shapes, dtypes, case, seed=k).items()})
    np.savez(tmp_path / "data.npz", **data)
    # The plain-JAX process runs while this one computes the references (one jit per case, as there).
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", SERVE_CELLS, str(tmp_path), str(tmp_path / "data.npz"), str(tmp_path / "out.npz")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    want = {}
    for k in range(len(CELL_CASES)):
        calls = {cell: {n: v for n, v in data.items() if n.startswith(f"{k}|{cell}|")} for cell in compiled}
        calls = {cell: {n.split("|")[2]: v for n, v in inputs.items()} for cell, inputs in calls.items()}
        results = jax.jit(lambda calls: {c: compiled[c].apply(compiled[c].params, x) for c, x in calls.items()})(calls)
        want.update({f"{k}|{cell}|{n}": np.asarray(v) for cell, out in results.items() for n, v in out.items()})
    _, stderr = child.communicate(timeout=600)
    assert child.returncode == 0, stderr
    with np.load(tmp_path / "out.npz") as saved:
        got = dict(saved)
    assert sorted(got) == sorted(want) and len({key.split("|")[1] for key in got}) == len(CELLS)
    for key, value in want.items():
        k, cell, name = key.split("|")
        where = f"{cell} {name} at (T, N, L) = {CELL_CASES[int(k)]}"
        assert got[key].shape == value.shape, where
        np.testing.assert_allclose(got[key], value, **TOLERANCE, err_msg=where)


def test_a_broadcast_that_depends_on_a_symbolic_size_is_refused_naming_the_op_and_blobs(tmp_path, capsys):
    """[N, 3] * [2, 3] (numpy broadcasting) fits only when N is 1 or 2: the export cannot decide it."""
    (tmp_path / "mul.pbtxt").write_text(
        'name: "mul" op { input: "x" input: "w" output: "y" type: "Mul" } external_input: "x" external_output: "y"'
    )
    np.savez(tmp_path / "w.npz", w=np.ones((2, 3), np.float32))
    base = ["export", str(tmp_path / "mul.pbtxt"), "--params", str(tmp_path / "w.npz"), "-o", str(tmp_path / "m.bin")]
    assert main([*base, "--input-shape", "x=N,3"]) == 2
    err = capsys.readouterr().err
    for part in ("net 'mul', op #0 (Mul)", "'x' [N, 3] and 'w' [2, 3]", "for every size of their symbolic dims"):
        assert part in err, err
    assert main([*base, "--input-shape", "x=1,3"]) == 0  # with a size it broadcasts
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    np.testing.assert_array_equal(np.asarray(load_exported(tmp_path / "m.bin")(x=x)["y"]), np.broadcast_to(x, (2, 3)))
