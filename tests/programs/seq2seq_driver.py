"""Runs Caffe2's own seq2seq train.py or translate.py, unmodified, and records what the test compares.

`python seq2seq_driver.py RECORD.json INIT.npz {dump,load,none} {train,translate} ARGS...` runs under real
Caffe2 (Python 3.9) and `rnn2jax exec seq2seq_driver.py ...` under rnn2jax. It imports the script as
Caffe2's module (`caffe2.python.models.seq2seq.train` / `.translate`) and calls its `main()` with ARGS,
which is what `python train.py ARGS` runs. Three observations are added, none of which changes the
script's arithmetic:
- after the first `workspace.RunNetOnce` (train.py's parameter initialisation) the workspace's blobs are
  dumped to INIT.npz (`dump`) or replaced by those of INIT.npz (`load`): the two Caffe2s draw different
  random fills, and this gives both the same initial parameters;
- every fetched `total_loss_scalar` (one per training or evaluation step) is recorded;
- every `Seq2SeqModelCaffe2EnsembleDecoder.decode` result (tokens, score) is recorded.
For translate, the driver's own `--beam-sizes B1,B2,... --sentences FILE` (first) run `main()` once per beam
size (with `--beam-size B`, stdin read from FILE), in one process; `=== beam B` precedes each run's output.
Python 3.9 compatible: real Caffe2 runs it too.
"""

import importlib
import json
import sys

import numpy as np
from caffe2.python import workspace

record_path, init_path, init_mode, which = sys.argv[1:5]
script_args = sys.argv[5:]
record = {"losses": [], "decoded": {}}

run_net_once = workspace.RunNetOnce
initialised = []


def _run_net_once(net):
    done = run_net_once(net)
    if not initialised and init_mode != "none":
        initialised.append(True)
        if init_mode == "dump":
            blobs = {name: workspace.FetchBlob(name) for name in workspace.Blobs()}
            numeric = {n: v for n, v in blobs.items() if isinstance(v, np.ndarray) and v.dtype.kind in "fiub"}
            np.savez(init_path, **numeric)
        elif init_mode == "load":
            with np.load(init_path) as given:
                for name in given.files:
                    workspace.FeedBlob(name, given[name])
    return done


fetch_blob = workspace.FetchBlob


def _fetch_blob(name):
    value = fetch_blob(name)
    if str(name) == "total_loss_scalar":
        record["losses"].append(float(np.asarray(value).reshape(())))
    return value


workspace.RunNetOnce = _run_net_once
workspace.FetchBlob = _fetch_blob

module = importlib.import_module("caffe2.python.models.seq2seq." + which)
if which == "translate":
    decode = module.Seq2SeqModelCaffe2EnsembleDecoder.decode

    def _decode(self, numberized_input, max_output_seq_len):
        output, attention, score = decode(self, numberized_input, max_output_seq_len)
        record["decoded"].setdefault(str(beam[0]), []).append([[int(t) for t in output], float(score)])
        return output, attention, score

    module.Seq2SeqModelCaffe2EnsembleDecoder.decode = _decode

beam = [None]
try:
    if which == "translate":
        _, beams, _, sentences, *rest = script_args  # --beam-sizes B1,B2,... --sentences FILE, then translate.py's
        for size in beams.split(","):
            beam[0] = size
            print("=== beam " + size, flush=True)
            sys.argv = [module.__file__, *rest, "--beam-size", size]
            with open(sentences) as sys.stdin:
                module.main()
            sys.stdout.flush()
    else:
        sys.argv = [module.__file__, *script_args]
        module.main()
finally:
    with open(record_path, "w") as out:
        json.dump(record, out)
