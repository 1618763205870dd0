"""`rnn2jax inspect DB` and `rnn2jax convert-params DB -o params.npz`."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import rnn2jax
from rnn2jax.cli import main

EXAMPLES = Path(rnn2jax.__file__).parent / "examples"


@pytest.mark.parametrize("db_type", ["minidb", "lmdb", "leveldb", "rocksdb"])
def test_inspect_recognises_a_db_by_content(db_type, tmp_path, capsys):
    path = tmp_path / f"params.{db_type}"
    blobs = {"fc/w": np.zeros((4, 3), np.float32), "ids": np.arange(5), "vocab": b"hello"}
    rnn2jax.write_blobs(path, blobs, db_type=db_type, chunk_size=5)
    assert main(["inspect", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{path}: {db_type}, 3 blobs, ")
    rows = {line.split()[0]: line.split()[1:5] for line in lines[3:]}
    assert rows == {
        "fc/w": ["Tensor", "[4,", "3]", "float32"],
        "ids": ["Tensor", "[5]", "int64", "1"],
        "vocab": ["std::string", "-", "-", "1"],
    }
    assert "  3  " in lines[3 + list(rows).index("fc/w")]  # 12 elements in chunks of 5


def test_inspect_with_db_type_and_nets_still_work(tmp_path, capsys):
    path = tmp_path / "p.db"
    rnn2jax.write_blobs(path, {"w": np.ones(2, np.float16)})
    net = EXAMPLES / "mlp_init_net.pbtxt"
    assert main(["inspect", "--db-type", "minidb", str(path)]) == 0
    assert "float16" in capsys.readouterr().out
    assert main(["inspect", str(net), str(path)]) == 0
    out = capsys.readouterr().out
    assert "net 'mlp_init_net'" in out and f"{path}: minidb, 1 blobs" in out


def test_inspect_bad_db_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "p.minidb"
    rnn2jax.write_blobs(path, {"w": np.ones(2)})
    path.write_bytes(path.read_bytes()[:-3])
    assert main(["inspect", "--db-type", "minidb", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truncated" in err and "blob 'w'" in err


def test_convert_params_writes_npz(tmp_path, capsys):
    path = tmp_path / "ckpt.lmdb"
    blobs = {"lstm/w": np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32), "it": np.array([7])}
    rnn2jax.write_blobs(path, {**blobs, "vocab": np.array([b"a"], dtype=object)}, db_type="lmdb", chunk_size=3)
    out = tmp_path / "params.npz"
    assert main(["convert-params", str(path), "--db-type", "lmdb", "-o", str(out)]) == 0
    assert "left out" not in capsys.readouterr().err  # strings are kept, as fixed-width bytes
    params = rnn2jax.load_params(out)
    assert set(params) == {*blobs, "vocab"}
    for name, want in blobs.items():
        assert params[name].dtype == want.dtype and params[name].tobytes() == want.tobytes()
    assert params["vocab"].dtype == object and params["vocab"].tolist() == [b"a"]
    assert main(["convert-params", str(tmp_path / "none"), "-o", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_convert_params_writes_an_orbax_checkpoint(tmp_path, capsys):
    """-o DIR: an Orbax checkpoint that Orbax itself restores to the DB's tensors, dtypes and bytes."""
    ocp = pytest.importorskip("orbax.checkpoint", reason="the orbax extra is not installed: make test installs it")
    path = tmp_path / "ckpt.minidb"
    rng = np.random.default_rng(2)
    blobs = {"LSTM/i2h_w": rng.standard_normal((8, 4)).astype(np.float32), "it": np.array([7], np.int64),
             "half": rng.standard_normal(3).astype(np.float16)}  # fmt: skip
    rnn2jax.write_blobs(path, {**blobs, "vocab": np.array([b"a"], dtype=object)}, chunk_size=5)
    out = tmp_path / "orbax"
    assert main(["convert-params", str(path), "-o", str(out)]) == 0
    assert "left out 1 string blob(s): vocab" in capsys.readouterr().err
    restored = ocp.StandardCheckpointer().restore(out.absolute())
    assert set(restored) == set(blobs)
    for name, want in blobs.items():
        got = np.asarray(restored[name])
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert main(["convert-params", str(path), "-o", str(out)]) == 2  # never over an existing directory
    assert "exists; an Orbax checkpoint is written to a new directory" in capsys.readouterr().err


def test_convert_params_to_orbax_without_the_extra_names_it(tmp_path, capsys, monkeypatch):
    path = tmp_path / "ckpt.minidb"
    rnn2jax.write_blobs(path, {"w": np.ones(2, np.float32)})
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
    monkeypatch.setitem(sys.modules, "orbax", None)
    assert main(["convert-params", str(path), "-o", str(tmp_path / "orbax")]) == 2
    assert "needs the orbax extra: pip install 'rnn2jax[orbax]'" in capsys.readouterr().err
    assert not (tmp_path / "orbax").exists()
