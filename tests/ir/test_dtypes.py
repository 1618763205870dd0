"""Caffe2's dtypes, exactly: every dtype keeps its type and every value through the workspace, a net, a minidb,
`compile` and `export`, bit for bit against real Caffe2; rnn2jax's 64-bit scope never upcasts float32 work
(no float64 in the HLO of nets that do not ask for it); and the user's global JAX configuration is untouched."""

from __future__ import annotations

import importlib.util
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_builder_cells import CELLS, random_params, training_net
from test_storage_caffe2 import assert_bit_equal, caffe2_load, string_tensors

import rnn2jax
from rnn2jax.caffe2.opdef import create_net, create_operator
from rnn2jax.caffe2.python import workspace
from rnn2jax.caffe2.python.core import reset_net_names
from rnn2jax.errors import InputTypeError
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.serving import ExportedNet
from rnn2jax.serving.codegen import generate, write_module
from rnn2jax.serving.exporter import export_net, input_specs

NUMERIC = [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.bool_]
CAFFE2_NAMES = dict(
    zip(
        NUMERIC,
        ["FLOAT", "DOUBLE", "FLOAT16", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "BOOL"],
        strict=True,
    )
)
WIDE_VALUES = {  # values the 32-bit types cannot hold: what a silent narrowing would change
    np.dtype(np.int64): np.array([2**40 + 7, -(2**33) - 1, 2**63 - 1, -(2**63)], np.int64),
    np.dtype(np.float64): np.array([1 + 1e-12, 1e300, 5e-324, -0.1], np.float64),
}


def tensors(dtype) -> st.SearchStrategy[np.ndarray]:
    """Arrays of `dtype` with every bit pattern (NaN payloads too for floats), the wide values always among them."""
    dtype = np.dtype(dtype)
    shapes = hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=4)
    if dtype.kind == "f":
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
        drawn = hnp.arrays(bits, shapes).map(lambda a: a.view(dtype))
    else:
        drawn = hnp.arrays(dtype, shapes)
    wide = WIDE_VALUES.get(dtype)
    return drawn if wide is None else drawn.map(lambda a: np.concatenate([a.ravel(), wide]))


def _keep_and_save_net(path, strings: bool) -> tuple[object, list[str]]:
    """`x` -> Copy -> `y`, then Save both to a minidb: one NetDef for real Caffe2 and rnn2jax, and the blobs
    it keeps. Strings are only saved: rnn2jax's pure ops (Copy among them) are JAX code, which has no strings,
    so they refuse a string blob by name (tested below)."""
    kept = ["x"] if strings else ["x", "y"]
    ops = [] if strings else [create_operator("Copy", ["x"], ["y"])]
    ops.append(create_operator("Save", kept, [], db=str(path), db_type="minidb", absolute_path=1))
    return create_net("keep", ops, external_inputs=["x"]), kept


@pytest.mark.parametrize("dtype", [np.dtype(d).name for d in NUMERIC] + ["string"])
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_every_dtype_through_the_workspace_a_net_and_a_minidb_bit_for_bit(caffe2, tmp_path_factory, dtype, data):
    strings = dtype == "string"
    x = data.draw(string_tensors() if strings else tensors(dtype), label="x")
    folder = tmp_path_factory.mktemp("dtype")
    ours, theirs = folder / "rnn2jax.minidb", folder / "caffe2.minidb"

    workspace.ResetWorkspace()
    workspace.FeedBlob("x", x)
    assert_bit_equal(workspace.FetchBlob("x"), x, "fed and fetched")
    net, kept = _keep_and_save_net(ours, strings)
    workspace.RunNetOnce(net)
    for name in kept:
        assert_bit_equal(workspace.FetchBlob(name), x, f"{name} after the net")

    # real Caffe2 runs the same net on the same value; its minidb is read back by rnn2jax
    want = caffe2.run([("net", _keep_and_save_net(theirs, strings)[0])], {"x": x}, kept)
    for name in kept:
        assert_bit_equal(_transported(want[name]), x, f"Caffe2's {name}")
    for name, value in rnn2jax.read_blobs(theirs).items():
        assert_bit_equal(value, x, f"Caffe2's saved {name}, loaded by rnn2jax")
    # ... and rnn2jax's minidb is loaded by real Caffe2 and by rnn2jax's Load op
    for name, value in caffe2_load(caffe2, ours, kept).items():
        assert_bit_equal(_transported(value), x, f"rnn2jax's saved {name}, loaded by Caffe2")
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(create_operator("Load", [], kept, db=str(ours), db_type="minidb", absolute_path=1))
    for name in kept:
        assert_bit_equal(workspace.FetchBlob(name), x, f"{name} loaded by rnn2jax's Load op")


def _transported(value: np.ndarray) -> np.ndarray:
    """A string tensor as Caffe2 holds it: the oracle sends strings as fixed-width bytes (no pickles)."""
    return value.astype(object) if value.dtype.kind == "S" else value


def test_a_pure_op_refuses_a_string_blob_by_name():
    workspace.ResetWorkspace()
    workspace.FeedBlob("x", np.array([b"a", b"b"], dtype=object))
    # (Copy moves strings on the host, as Caffe2 does; Relu has no string form in Caffe2 either)
    with pytest.raises(InputTypeError, match=r"net 'keep', op #0 \(Relu\): blob 'x' holds strings"):
        workspace.RunNetOnce(create_net("keep", [create_operator("Relu", ["x"], ["y"])]))


@pytest.mark.parametrize("dtype", [np.dtype(d).name for d in NUMERIC])
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_every_numeric_dtype_through_compile_and_export_bit_for_bit(dtype, data):
    x = data.draw(tensors(dtype), label="x")
    net = create_net(
        "keep", [create_operator("Copy", ["x"], ["y"]), create_operator("Cast", ["x"], ["z"], to=_code(x))]
    )
    fn = rnn2jax.compile(net)
    got = fn({"x": x})
    assert_bit_equal(np.asarray(got["y"]), x, "compile: Copy")
    assert_bit_equal(np.asarray(got["z"]), x, "compile: Cast to its own type")

    exported = ExportedNet(jax.export.deserialize(export_net(fn, input_specs({"x": x.shape}, {"x": x.dtype}),
                                                             platforms=("cpu",)).serialize()), "export")  # fmt: skip
    assert exported.inputs["x"].dtype == x.dtype and exported.exported.out_avals[0].dtype == x.dtype
    assert_bit_equal(np.asarray(exported({"x": x})["y"]), x, "export")


def _code(x: np.ndarray) -> int:
    return {np.dtype(d): pb.TensorProto.DataType.Value(name) for d, name in CAFFE2_NAMES.items()}[x.dtype]


def test_strings_cannot_enter_a_compiled_function_and_say_so():
    fn = rnn2jax.compile(create_net("keep", [create_operator("Copy", ["x"], ["y"])]))
    with pytest.raises(InputTypeError, match=r"net 'keep'.*input 'x'"):
        fn({"x": np.array([b"a", b"b"], dtype=object)})


def test_the_users_jax_configuration_is_untouched():
    before = jax.config.jax_enable_x64
    fn = rnn2jax.compile(create_net("n", [create_operator("Cast", ["x"], ["y"], to=10)]))  # INT64
    out = fn({"x": np.array([2**40 + 7], np.int64)})["y"]
    assert out.dtype == np.int64 and int(out[0]) == 2**40 + 7
    assert jax.config.jax_enable_x64 == before
    assert jnp.zeros(1).dtype == (np.float64 if before else np.float32)  # the user's own JAX, as it was


def test_a_narrowed_64_bit_parameter_under_the_users_jit_is_refused():
    """The user's own jax.jit with x64 off narrows a NumPy int64 argument before rnn2jax sees it: a parameter
    rnn2jax holds as int64 that arrives as int32 is refused, not used with its values wrapped."""
    offset = np.array([2**40], np.int64)
    fn = rnn2jax.compile(create_net("n", [create_operator("Add", ["x", "offset"], ["y"])]), params={"offset": offset})
    x = np.array([1], np.int64)
    assert int(fn({"x": x})["y"][0]) == 2**40 + 1
    if jax.config.jax_enable_x64:
        pytest.skip("the test process runs with jax_enable_x64 on, so JAX narrows nothing")
    with pytest.raises(InputTypeError, match=r"'offset' is int64 but arrived as int32.*jax_enable_x64"):
        jax.jit(fn.apply)({"offset": offset}, {"x": x})
    with jax.enable_x64(True):
        assert int(jax.jit(fn.apply)({"offset": offset}, {"x": x})["y"][0]) == 2**40 + 1


# ------------------------------------------------------------------------------------------------
# No upcast: float32 nets stay float32 in every program rnn2jax makes of them

F64 = re.compile(r"[<x]f64>")  # StableHLO: tensor<f64>, tensor<3x4xf64>
SIZES = {"T": 3, "N": 2, "D": 3, "H": 4, "L": 2, "E": 3, "forms": ["3-D", "2-D", "1-D", "3-D"], "use_lengths": True,
         "lengths": [3, 1], "seed": 0}  # fmt: skip


def _stablehlo(function, *args) -> str:
    with jax.enable_x64(True):  # the program as rnn2jax traces it, 64-bit types on
        return jax.jit(function).lower(*args).as_text()


def test_the_float64_check_sees_float64():
    _assert_float32_only(_stablehlo(lambda x: x * 2, np.ones(3, np.float32)), "float32")
    with pytest.raises(AssertionError, match="float64 in the program"):
        _assert_float32_only(_stablehlo(lambda x: x * 2, np.ones((2, 3), np.float64)), "float64")
    with pytest.raises(AssertionError, match="float64 in the program"):
        _assert_float32_only(_stablehlo(lambda x: x.sum(dtype=np.float64), np.ones(3, np.float32)), "a sum")


def _assert_float32_only(text: str, what: str) -> None:
    found = F64.search(text)
    assert found is None, f"{what}: float64 in the program: ...{text[max(0, found.start() - 200) : found.end() + 80]}"


@pytest.mark.parametrize("cell", CELLS)
def test_no_float64_in_the_programs_of_a_float32_cell(cell):
    reset_net_names()
    rng = np.random.default_rng(0)
    built = CELLS[cell](dict(SIZES), rng)
    net = built.model.net.Proto()
    params = random_params(built.model, rng)
    fn = rnn2jax.compile(net, params=params, outputs=built.outputs)
    _assert_float32_only(_stablehlo(fn.apply, fn.params, built.inputs), f"{cell} forward")

    def loss(p, inputs):
        return sum(jnp.sum(v) for v in fn.apply(p, inputs).values() if v.dtype == np.float32)

    _assert_float32_only(_stablehlo(jax.grad(loss), fn.params, built.inputs), f"{cell} jax.grad")
    if built.trainable:
        train, _ = training_net(net, built.grad_outputs)
        trained = rnn2jax.compile(train, params=params)
        ones = {f"{y}_grad": np.ones(np.shape(fn(built.inputs)[y]), np.float32) for y in built.grad_outputs}
        _assert_float32_only(
            _stablehlo(trained.apply, trained.params, {**built.inputs, **ones}), f"{cell} backward step net"
        )


def test_codegen_keeps_64_bit_values(tmp_path):
    """The written module runs with 64-bit types on in its own scope: an int64 past 2**32 and a float64 that
    float32 cannot hold come out exact, compared with NumPy."""
    ops = [
        create_operator("Cast", ["ids"], ["wide"], to=pb.TensorProto.INT64),
        create_operator("Add", ["wide", "offset"], ["shifted"]),
        create_operator("Mul", ["d", "d"], ["squared"]),
    ]
    offset = np.array([2**40, -(2**35)], np.int64)
    source, params = generate(create_net("wide", ops), {"offset": offset})
    path = write_module(tmp_path / "wide_net.py", source, params)
    spec = importlib.util.spec_from_file_location("wide_net", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ids, d = np.array([2**33 + 1, 5], np.int64), np.array([1 + 1e-12, 3.0], np.float64)
    out = module.apply(module.load_params(), {"ids": ids, "d": d})
    assert_bit_equal(np.asarray(out["shifted"]), ids + offset, "shifted")
    assert_bit_equal(np.asarray(out["squared"]), d * d, "squared")
