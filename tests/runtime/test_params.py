"""Parameters as .npz files: save/load round trip (names with '/'), params= as a path, and init nets
that read external storage: Load reads its DB under db_root; readers rnn2jax cannot run are named."""

from __future__ import annotations

import numpy as np
import pytest

import rnn2jax
from helpers import REALNETS
from rnn2jax.errors import ParseError, StorageError, UnsupportedOpError
from rnn2jax.ops.registry import find_host
from rnn2jax.runtime.params import EXTERNAL_STORAGE_OPS, load_params, save_params

PREDICT = "rnn2jax/examples/mlp_predict_net.pbtxt"
INIT = "rnn2jax/examples/mlp_init_net.pbtxt"
BREAD_INIT = REALNETS / "breadbread_lstmdemo_lstm_init_net.pbtxt"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch, request):
    monkeypatch.chdir(request.config.rootpath)


def test_round_trip_keeps_names_dtypes_and_values(tmp_path):
    arrays = {
        "LSTM/i2h_w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "a/b/c": np.array([1, 2, 3], dtype=np.int64),
        "file": np.array(2.5, dtype=np.float64),  # would clash with np.savez's own argument
        "allow_pickle": np.zeros((0, 2), dtype=np.int32),
        "x.npy": np.array([True, False]),
    }
    save_params(arrays, tmp_path / "p.npz")
    loaded = rnn2jax.load_params(tmp_path / "p.npz")
    assert list(loaded) == list(arrays)
    for name, value in arrays.items():
        assert loaded[name].dtype == value.dtype and loaded[name].shape == value.shape
        np.testing.assert_array_equal(loaded[name], value)


def test_np_savez_files_load_too(tmp_path):
    np.savez(tmp_path / "p.npz", **{"LSTM/w": np.ones(3, np.float32)})
    np.testing.assert_array_equal(load_params(tmp_path / "p.npz")["LSTM/w"], np.ones(3))


def test_compiled_net_save_params_and_compile_from_path(tmp_path):
    fn = rnn2jax.compile(PREDICT, init_net=INIT)
    fn.save_params(tmp_path / "mlp.npz")
    again = rnn2jax.compile(PREDICT, params=str(tmp_path / "mlp.npz"))
    assert again.input_names == ("data",)
    data = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(again(data=data)["prob"], fn(data=data)["prob"], rtol=1e-6, atol=1e-7)
    again = rnn2jax.compile(PREDICT, params=tmp_path / "mlp.npz")  # a Path works as well
    assert set(again.params) == set(fn.params)


@pytest.mark.parametrize("content, match", [(b"not a zip", "not a readable .npz"), ("npy", "single .npy")])
def test_bad_params_file_is_a_parse_error(tmp_path, content, match):
    path = tmp_path / "p.npz"
    if content == "npy":
        np.save(tmp_path / "p.npy", np.ones(2))
        path = tmp_path / "p.npy"
    else:
        path.write_bytes(content)
    with pytest.raises(ParseError, match=match):
        rnn2jax.compile(PREDICT, params=str(path))


def test_missing_params_file_is_a_storage_error_saying_not_found(tmp_path):
    """A file that is not there is no parse problem: a StorageError that says so, naming the file."""
    missing = tmp_path / "missing.npz"
    with pytest.raises(StorageError, match=rf"cannot read parameter file '{missing}': file not found$"):
        rnn2jax.compile(PREDICT, params=str(missing))
    with pytest.raises(StorageError, match=r"cannot read parameter file .*: Is a directory"):
        load_params(tmp_path)


def test_save_params_to_missing_folder_is_a_parse_error(tmp_path):
    with pytest.raises(ParseError, match="cannot write"):
        save_params({"w": np.ones(2)}, tmp_path / "no" / "p.npz")


@pytest.mark.parametrize("op_type", sorted(t for t in EXTERNAL_STORAGE_OPS if find_host(t) is None))
def test_init_net_with_a_reader_rnn2jax_cannot_run_names_it(op_type):
    init = f"""name: "init"
op {{ output: "w" type: "ConstantFill" arg {{ name: "shape" ints: 2 }} }}
op {{ output: "x" output: "y" type: "{op_type}"
     arg {{ name: "db" s: "params_db" }} arg {{ name: "db_type" s: "lmdb" }} }}
"""
    with pytest.raises(UnsupportedOpError, match=rf"op #1 \({op_type}\)") as info:
        rnn2jax.compile(PREDICT, init_net=init)
    assert info.value.unsupported[0][1] == op_type


def test_init_net_loading_a_missing_db_names_it_and_db_root(tmp_path):
    init = """name: "init"
op { output: "x" output: "y" type: "Load" arg { name: "db" s: "params_db" } arg { name: "db_type" s: "minidb" } }
"""
    with pytest.raises(StorageError, match=r"op #0 \(Load\).*params_db.*does not exist.*db_root") as info:
        rnn2jax.compile(PREDICT, init_net=init, db_root=tmp_path)
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.skipif(not BREAD_INIT.is_file(), reason=f"real nets folder {REALNETS} is absent")
def test_real_init_net_with_load_needs_its_db():
    """The advice is in Python's words here (db_root=), in the command line's where the CLI prints it."""
    missing_db = r"op #\d+ \(Load\): DB '\./LSTM_params' \(lmdb\) does not exist.*db_root=DIR"
    with pytest.raises(StorageError, match=missing_db) as caught:
        rnn2jax.compile(REALNETS / "breadbread_lstmdemo_lstm_predict_net.pbtxt", init_net=BREAD_INIT)
    assert "--db-root" not in str(caught.value)
    assert caught.value.for_command_line().endswith("; pass --db-root DIR")
