"""The Caffe2-style process computes what a user's process computes, bit for bit.

Caffe2's own test files run in this pytest process beside these (`make test-caffe2-api`), and some compare two
nets at 1e-7 (rnn_cell_test's test_unroll_lstm: the RecurrentNetwork LSTM against its unrolled twin, whose
randomly filled weights and float32 results differ in the last bit between XLA's -O2 and -O0). So the numbers a
net gives here must not depend on which of the project's files were collected with them: tests/conftest.py
compiles the main test run at -O0, and must leave this process at the level users' programs compile at.

The reference is the same Caffe2 script run by a fresh Python process, as a user would run it (its own XLA
backend, at XLA's default level).

Run under the plugin: `pytest -p rnn2jax.caffe2.pytest_plugin --caffe2-source $C2 tests/caffe2_style`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

# A small training net as a Caffe2 script writes it: seeded random fills (XavierFill's U[-s, s) is a multiply-add per
# value, the op whose last bit first showed the difference), a one-layer LSTM over a sequence with lengths
# (rnn_cell.LSTM: a RecurrentNetwork), and its gradient net (from ones over the hidden states).
SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from caffe2.proto import caffe2_pb2
    from caffe2.python import core, rnn_cell, workspace
    from caffe2.python.model_helper import ModelHelper

    def run_nets():
        workspace.ResetWorkspace()
        rng = np.random.RandomState(0)
        t, n, d, h = 4, 3, 5, 6
        model = ModelHelper(name="numerics")
        workspace.FeedBlob("x", rng.standard_normal((t, n, d)).astype(np.float32))
        workspace.FeedBlob("lengths", np.array([4, 2, 3], dtype=np.int32))
        workspace.FeedBlob("h0", rng.standard_normal((1, n, h)).astype(np.float32))
        workspace.FeedBlob("c0", rng.standard_normal((1, n, h)).astype(np.float32))
        # seeded, as a user makes fills repeatable (an unseeded op draws from the workspace's clock-seeded
        # generator, as in Caffe2, so two processes would draw differently)
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0, random_seed=7)):
            model.param_init_net.XavierFill([], "filled", shape=[64, 48])
            hidden_all, _, _, _ = rnn_cell.LSTM(
                model, "x", "lengths", ("h0", "c0"), dim_in=d, dim_out=h, scope="lstm", forget_bias=1.0
            )
        model.AddGradientOperators([hidden_all])
        workspace.RunNetOnce(model.param_init_net)
        workspace.RunNetOnce(model.net)
        names = ["filled"] + [str(p) for p in model.params]
        names += [str(model.param_to_grad[p]) for p in model.params] + ["x_grad", "h0_grad", "c0_grad"]
        return {"hidden_all": workspace.FetchBlob(hidden_all), **{name: workspace.FetchBlob(name) for name in names}}
    """
)


def test_nets_compute_what_a_users_process_computes(tmp_path):
    here: dict = {}
    exec(compile(SCRIPT, "numerics_script", "exec"), here)
    mine = here["run_nets"]()

    saved = tmp_path / "user.npz"
    user_script = SCRIPT + textwrap.dedent(
        f"""
        np.savez({str(saved)!r}, **run_nets())
        """
    )
    header = "import rnn2jax.caffe2\nrnn2jax.caffe2.install()\n"
    done = subprocess.run(
        [sys.executable, "-c", header + user_script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(saved) as user:
        assert sorted(user.files) == sorted(mine)
        for name, value in mine.items():
            assert value.dtype == user[name].dtype, name
            # bit for bit: the same net and inputs, so the same float32 values, whatever this process ran before
            np.testing.assert_array_equal(value.view(np.uint32), user[name].view(np.uint32), err_msg=name)
    # and they are the net's values: the fill inside its bounds, the LSTM's hidden states inside (-1, 1)
    bound = np.sqrt(np.float32(3) / np.float32(48))
    assert np.all(np.abs(mine["filled"]) <= bound) and np.unique(mine["filled"]).size > 3000
    assert mine["hidden_all"].shape == (4, 3, 6) and np.all(np.abs(mine["hidden_all"]) < 1)
