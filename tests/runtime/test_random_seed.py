"""An op's `device_option.random_seed` seeds its own draws, as Caffe2 seeds the op's generator when it creates
the op: RunNetOnce draws the same values each time, a created net's runs go on down the seed's stream, and
creating the net again starts it over. The pattern of equal and different draws is real Caffe2's."""

from __future__ import annotations

import json
import subprocess

import numpy as np

from rnn2jax.caffe2.python import core, workspace
from tests.conftest import real_caffe2_python

# Run on both sides: which draws are equal (the values themselves come from different generators).
_SCRIPT = """
import json
import numpy as np
from caffe2.python import core, workspace
seeded = core.DeviceOption(0, random_seed=7)
net = core.Net("seeded")
net.XavierFill([], ["w"], shape=[4], device_option=seeded)
net.XavierFill([], ["v"], shape=[4], device_option=seeded)
net.UniformFill([], ["u"], shape=[4])
workspace.RunNetOnce(net)
a, av, au = (workspace.FetchBlob(b) for b in "wvu")
workspace.RunNetOnce(net)
b, bu = workspace.FetchBlob("w"), workspace.FetchBlob("u")
workspace.CreateNet(net)
workspace.RunNet(net.Name())
c = workspace.FetchBlob("w")
workspace.RunNet(net.Name())
d = workspace.FetchBlob("w")
workspace.CreateNet(net, overwrite=True)
workspace.RunNet(net.Name())
e = workspace.FetchBlob("w")
print(json.dumps([bool(np.array_equal(x, y)) for x, y in ((a, av), (a, b), (a, c), (c, d), (c, e), (au, bu))]))
"""


def test_seeded_draws_follow_caffe2s_pattern() -> None:
    command = [str(real_caffe2_python()), "-c", _SCRIPT]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    assert expected == [True, True, True, False, True, False]
    workspace.ResetWorkspace()
    ours = _SCRIPT.replace("from caffe2.python", "from rnn2jax.caffe2.python").replace("print(", "result = (")
    namespace: dict = {}
    exec(compile(ours, "<seeded draws>", "exec"), namespace)
    assert json.loads(namespace["result"]) == expected
    workspace.ResetWorkspace()


def test_the_seed_gives_the_same_values_in_a_fresh_workspace() -> None:
    op = core.CreateOperator("GaussianFill", [], ["g"], shape=[3], device_option=core.DeviceOption(0, random_seed=3))
    values = []
    for _ in range(2):
        ws = workspace.C.Workspace()
        ws.run(op)
        values.append(ws.blobs["g"].fetch())
    np.testing.assert_array_equal(values[0], values[1])


def _compiled_count() -> int:
    """Traces jit holds, over every jitted segment of the API's workspaces."""
    return sum(
        fn._cache_size()
        for _, executor in workspace._cache.executors.values()
        for piece in executor.pieces
        if hasattr(piece, "code")
        for fn in piece.code.fns.values()
    )


def test_without_a_seed_fresh_workspaces_draw_different_values_from_shared_code() -> None:
    """Caffe2 seeds an op without random_seed from the clock (RandomNumberSeed): in fresh workspaces the same
    op draws different values (hypothesis_test.py's test_random_seed_behaviour). The workspace's seed is an
    argument of the compiled code, so the fresh workspaces compile nothing again."""
    op = core.CreateOperator("XavierFill", [], ["y"], shape=[8])
    values, compiled = [], []
    for _ in range(3):
        ws = workspace.C.Workspace()
        ws.run(op)
        values.append(ws.blobs["y"].fetch())
        compiled.append(_compiled_count())
    assert not np.array_equal(values[0], values[1]) and not np.array_equal(values[1], values[2])
    assert compiled[0] == compiled[1] == compiled[2]
