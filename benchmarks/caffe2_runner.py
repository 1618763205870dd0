"""Time real Caffe2 running NetDefs: the child side of compare.py, run by the real-Caffe2 venv's Python 3.9.

    .venv-caffe2/bin/python benchmarks/caffe2_runner.py JOB_DIR

JOB_DIR holds `job.json` ({"nets": {label: file}, "fetch": {label: [blobs]}, "repeats": R,
"max_seconds": S, "threads": K}), one serialized NetDef per label and `blobs.npz` (parameters and inputs).
Each net runs in a workspace of its own (a forward-only and a training RecurrentNetwork would otherwise share
`step_workspaces` blobs), fed the same blobs. After one warm-up run per net its fetched blobs go to
`<label>.npz` for the parent's equality check; then the nets are timed interleaved (one run of each per
round) until R rounds or S seconds have passed (at least 3 rounds). The answer is JSON on stdout:
{"times": {label: [seconds...]}, "versions": {...}}.

Only the standard library, NumPy and caffe2 are imported: this file never runs in rnn2jax's interpreter.
"""

import json
import os
import sys
import time


def main(job_dir):
    with open(os.path.join(job_dir, "job.json")) as f:
        job = json.load(f)
    threads = str(job.get("threads", 2))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # whatever Caffe2 prints must not corrupt the JSON answer

    import numpy as np
    import torch
    from caffe2.proto import caffe2_pb2
    from caffe2.python import workspace

    torch.set_num_threads(int(threads))
    workspace.GlobalInit(["caffe2", "--caffe2_log_level=2"])
    blobs = dict(np.load(os.path.join(job_dir, "blobs.npz")))
    labels = list(job["nets"])
    for label in labels:
        net = caffe2_pb2.NetDef()
        with open(os.path.join(job_dir, job["nets"][label]), "rb") as f:
            net.ParseFromString(f.read())
        net.name = label
        workspace.SwitchWorkspace(label, True)
        for name, value in blobs.items():
            workspace.FeedBlob(name, value)
        workspace.CreateNet(net, True)
        workspace.RunNet(label)
        fetched = {name: workspace.FetchBlob(name) for name in job["fetch"][label]}
        np.savez(os.path.join(job_dir, label + ".npz"), **fetched)

    times = {label: [] for label in labels}
    start = time.perf_counter()
    rounds = 0
    while rounds < job["repeats"] and (rounds < 3 or time.perf_counter() - start < job["max_seconds"]):
        for label in labels:
            workspace.SwitchWorkspace(label)
            begin = time.perf_counter()
            workspace.RunNet(label)
            times[label].append(time.perf_counter() - begin)
        rounds += 1
    answer = {"times": times, "versions": {"torch": torch.__version__, "numpy": np.__version__}}
    os.write(real_stdout, json.dumps(answer).encode())


if __name__ == "__main__":
    main(sys.argv[1])
