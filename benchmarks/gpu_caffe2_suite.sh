#!/usr/bin/env bash
# Caffe2's test suite on rnn2jax on an accelerator machine, selected as `make test-caffe2-suite-ci` selects it (the
# RNN, seq2seq, control-flow and optimizer files whole, at most 3 recorded passing tests of every other scored file,
# one derandomized example each), with that machine's Python, JAX and its accelerator (no real Caffe2 needed there).
#   .venv/bin/python scripts/caffe2_suite.py prepare DIR     # on the development machine
#   bash benchmarks/gpu_caffe2_suite.sh DIR [JOBS]           # on the accelerator machine, from the project's root
# Caffe2's sources import `future`/`past`: install the `future` package there where it is missing.
set -u
DIR=$(cd "$1" && pwd)
ROOT=$(pwd)
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false
export RNN2JAX_CAFFE2_EXAMPLES=1 RNN2JAX_HYPOTHESIS_PROFILE=ci
WHOLE=$(python3 -c "import sys; sys.path[:0] = ['scripts', '.']; import caffe2_suite as c
print(' '.join('--caffe2-suite-whole=' + r for r in c.PRIORITY))")
cd "$DIR/tree" && python3 -m pytest -q -n "${2:-12}" -p no:cacheprovider -c pytest.ini --rootdir=. \
  --import-mode=importlib --timeout=200 -p rnn2jax.caffe2.pytest_plugin --caffe2-source="$DIR/src/caffe2" \
  --caffe2-own-tests=. -p tests.caffe2_suite --caffe2-suite-results="$ROOT/docs/caffe2-suite.json" \
  --caffe2-suite-per-file=3 $WHOLE .
