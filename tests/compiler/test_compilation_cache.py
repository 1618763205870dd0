"""JAX's persistent compilation cache (rnn2jax/compiler/cache.py): a second start compiles nothing.

Each start is a fresh process that counts its XLA compilations with JAX's own monitoring events. JAX
reports an executable loaded from the cache both as a backend compile and as a cache hit, so compilations
are the first less the second. The test suite turns the cache off for everything else (conftest.py); these
tests give each run a directory of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest

from helpers import BREADBREAD_PREDICT_NET, REALNETS, write_breadbread_run
from rnn2jax.native import library as native_library

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = files("rnn2jax.examples")
PREDICT, INIT = str(EXAMPLES / "mlp_predict_net.pbtxt"), str(EXAMPLES / "mlp_init_net.pbtxt")

CHILD = """
import json, sys
import jax
compiled, loaded = [], []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, _d, **kw: compiled.append(1) if event == "/jax/core/compile/backend_compile_duration" else None)
jax.monitoring.register_event_listener(
    lambda event, **kw: loaded.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
how, argv = sys.argv[1], json.loads(sys.argv[2])
if how == "cli":
    from rnn2jax.cli import main
    code = main(argv)
elif how == "install":
    import numpy as np
    import rnn2jax.caffe2
    rnn2jax.caffe2.install()
    from caffe2.python import core, workspace
    workspace.FeedBlob("x", np.array([-1.0, 2.0], np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["y"]))
    code = 0 if workspace.FetchBlob("y").tolist() == [0.0, 2.0] else 1
else:
    import numpy as np
    import rnn2jax
    if how == "jax-dir":
        jax.config.update("jax_compilation_cache_dir", argv[1].replace("ours", "theirs"))
    fn = rnn2jax.compile(argv[0], init_net=argv[2], cache_dir=argv[1])
    jax.block_until_ready(fn(data=np.ones((2, 8), np.float32))["prob"])
    code = 0
from rnn2jax.native import status
print(json.dumps({"code": code, "compiled": len(compiled) - len(loaded), "loaded": len(loaded),
                  "dir": jax.config.jax_compilation_cache_dir, "native": status().in_use}))
"""


def start(how: str, argv: list[str], cache: str | None, cwd: Path) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("RNN2JAX_CACHE_DIR", None)
    if cache is not None:
        env["RNN2JAX_CACHE_DIR"] = cache
    env["XDG_CACHE_HOME"] = str(cwd / "xdg-cache")  # where the default directory would be
    command = [sys.executable, "-c", CHILD, how, json.dumps(argv)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    report["stderr"] = done.stderr
    return report


def _run_argv(tmp_path: Path) -> list[str]:
    np.save(tmp_path / "x.npy", np.ones((3, 8), np.float32))
    return ["run", PREDICT, "--init", INIT, "--input", f"data={tmp_path / 'x.npy'}"]


def _entries(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def test_a_second_rnn2jax_run_compiles_nothing(tmp_path):
    """In the default directory (under XDG_CACHE_HOME); then the same with --no-cache or an empty
    RNN2JAX_CACHE_DIR compiles everything again and leaves the cache as it was."""
    argv, cache = _run_argv(tmp_path), tmp_path / "xdg-cache" / "rnn2jax" / "jax"
    first = start("cli", argv, None, tmp_path)
    assert first["code"] == 0 and first["compiled"] >= 2 and first["loaded"] == 0  # the init net's and the net's
    assert first["dir"] == str(cache) and any(name.startswith("jit_rnn2jax_net-") for name in _entries(cache))
    kept = _entries(cache)
    second = start("cli", argv, None, tmp_path)
    assert second["code"] == 0 and second["compiled"] == 0 and second["loaded"] == first["compiled"]
    off = start("cli", [*argv, "--no-cache"], None, tmp_path)
    assert off["code"] == 0 and off["compiled"] == first["compiled"] and off["loaded"] == 0 and off["dir"] is None
    empty = start("cli", ["--no-cache", *argv], "", tmp_path)  # the flag before the command, and the empty variable
    assert empty["compiled"] == first["compiled"] and empty["dir"] is None
    assert _entries(cache) == kept


def test_a_second_run_of_the_breadbread_lstm_compiles_nothing(tmp_path):
    """A real LSTM predict net, whose executable calls the native kernels on CPU: the second process loads
    it from the cache (the kernels' handlers are registered before XLA deserializes it) and runs it."""
    if not BREADBREAD_PREDICT_NET.exists():
        pytest.skip(f"the real nets are not here ({REALNETS})")
    argv = write_breadbread_run(tmp_path, steps=7, batch=3)
    outputs = [tmp_path / "first.npz", tmp_path / "second.npz"]
    first = start("cli", [*argv, "--output", str(outputs[0])], str(tmp_path / "cache"), tmp_path)
    second = start("cli", [*argv, "--output", str(outputs[1])], str(tmp_path / "cache"), tmp_path)
    assert first["code"] == 0 and first["compiled"] >= 1 and first["loaded"] == 0
    assert second["code"] == 0 and second["compiled"] == 0 and second["loaded"] == first["compiled"]
    assert first["native"] == second["native"] == native_library.expected()
    with np.load(outputs[0]) as a, np.load(outputs[1]) as b:
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_compile_with_cache_dir_compiles_nothing_the_second_time(tmp_path):
    cache = tmp_path / "python-cache"
    argv = [PREDICT, str(cache), INIT]
    first = start("python", argv, None, tmp_path)
    assert first["compiled"] >= 2 and first["dir"] == str(cache)
    second = start("python", argv, None, tmp_path)
    assert second["compiled"] == 0 and second["loaded"] == first["compiled"]
    # a directory the user gave JAX is kept, and with it their own settings (JAX's thresholds)
    theirs = start("jax-dir", [PREDICT, str(tmp_path / "ours"), INIT], None, tmp_path)
    assert theirs["dir"] == str(tmp_path / "theirs") and not (tmp_path / "ours").exists()


def test_a_cache_directory_that_cannot_be_made_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    report = start("cli", _run_argv(tmp_path), str(blocker / "cache"), tmp_path)
    assert report["code"] == 2
    assert f"rnn2jax: error: compilation cache: cannot create {blocker / 'cache'}" in report["stderr"]
    assert "RNN2JAX_CACHE_DIR" in report["stderr"]


def test_a_caffe2_script_after_install_compiles_nothing_the_second_time(tmp_path):
    cache = str(tmp_path / "cache")
    first = start("install", [], cache, tmp_path)
    assert first["code"] == 0 and first["compiled"] >= 1 and first["dir"] == cache
    second = start("install", [], cache, tmp_path)
    assert second["code"] == 0 and second["compiled"] == 0 and second["loaded"] == first["compiled"]
