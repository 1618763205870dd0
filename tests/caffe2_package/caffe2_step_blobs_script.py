"""Build RNNs, run them, save every blob RecurrentNetworkBlobFetcher copies out (real Caffe2 and rnn2jax run it).

Usage: caffe2_step_blobs_script.py OUT.npz T,N,D [T,N,D ...]
"""

import sys

import numpy as np
from caffe2.python import recurrent, rnn_cell, workspace
from caffe2.python.model_helper import ModelHelper


def mul_rnn(rng, T, n, d):
    model = ModelHelper(name="external")
    input_blob, initial = model.net.AddExternalInputs("input", "initial_input")
    step = ModelHelper(name="step", param_model=model)
    input_t, prev = step.net.AddExternalInput("input_t", "output_t_prev")
    output_t = step.net.Mul([input_t, prev])
    step.net.AddExternalOutput(output_t)
    recurrent.recurrent_net(
        net=model.net,
        cell_net=step.net,
        inputs=[(input_t, input_blob)],
        initial_cell_inputs=[(prev, initial)],
        links={prev: output_t},
        scope="mul",
    )
    workspace.FeedBlob("input", rng.randn(T, n, d).astype(np.float32))
    workspace.FeedBlob("initial_input", rng.randn(1, n, d).astype(np.float32))
    return model


def lstm(rng, T, n, d):
    model = ModelHelper(name="lstm_model")
    rnn_cell.LSTM(model, "x", "lengths", ["h0", "c0"], d, 2 * d, scope="lstm")
    workspace.FeedBlob("x", rng.randn(T, n, d).astype(np.float32))
    workspace.FeedBlob("lengths", rng.randint(1, T + 1, size=n).astype(np.int32))
    workspace.FeedBlob("h0", rng.randn(1, n, 2 * d).astype(np.float32))
    workspace.FeedBlob("c0", rng.randn(1, n, 2 * d).astype(np.float32))
    return model


saved = {}
for shape in sys.argv[2:]:
    T, n, d = map(int, shape.split(","))
    rng = np.random.RandomState(T * 100 + n * 10 + d)
    for label, build in [("mul", mul_rnn), ("lstm", lstm)]:
        label = f"{shape}:{label}"
        workspace.ResetWorkspace()
        model = build(rng, T, n, d)
        workspace.RunNetOnce(model.param_init_net)
        for param in model.params:  # the same parameters in both backends (not their random fills)
            workspace.FeedBlob(param, rng.randn(*workspace.FetchBlob(param).shape).astype(np.float32) * 0.5)
        workspace.CreateNet(model.net)
        workspace.RunNet(model.net.Proto().name, 2)
        names = recurrent.retrieve_step_blobs(model.net, "got")
        saved[f"{label}:__names__"] = np.array([x.decode() for x in names])
        for name in names:
            saved[f"{label}:{name.decode()}"] = workspace.FetchBlob(name)
np.savez(sys.argv[1], **saved)
