#!/usr/bin/env bash
# The checks one session with a GPU machine runs (docs/performance.md, "GPU"), as one command there, from the
# repository root, with rnn2jax from the working tree (not installed: the machine has its own jax and PyTorch):
#   1. the breadbread real net, exported (`rnn2jax export --platforms cpu,cuda`) and compiled, forward and
#      jax.grad, against the CPU reference that `benchmarks/accelerator_check.py prepare .gpu` wrote on the CPU
#      machine (carried in .gpu/);
#   2. make bench's rows on the GPU: rnn2jax, hand-written JAX and PyTorch (cuDNN) on the same device;
#   3. the test suite's pure-JAX parts on the GPU (Caffe2's oracle is not there, so its tests skip).
# Wheels in .whl/ (the protobuf runtime the committed caffe2_pb2.py needs) are installed first, if any.
# Results land in $OUT (the device tool's folder), or ./accelerator-results.
set -uo pipefail
out=${OUT:-accelerator-results}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
	python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
	export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt"
python3 -c "import jax, torch; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__)" | tee -a "$out/gpu.txt"
timeout "${CHECK_SECONDS:-120}" python3 benchmarks/accelerator_check.py check .gpu --out "$out/accelerator_check.json"
echo "accelerator_check: exit $?"
# The models PyTorch has (lstm, gru) first, each group in its own run so that one running out of time
# leaves the other's table.
for group in "lstm gru" "lstm2 attention"; do
	name=$(echo "$group" | tr ' ' '_')
	timeout "${BENCH_SECONDS:-200}" python3 benchmarks/compare.py --no-caffe2 --no-memory --repeats 5 \
		--max-seconds 1.5 --models $group ${BENCH_ARGS:-} --out "$out/bench_$name.json" 2>&1 | tee "$out/bench_$name.txt"
	echo "compare $group: exit $?"
done
RNN2JAX_HYPOTHESIS_PROFILE=ci timeout "${TEST_SECONDS:-90}" python3 -m pytest -q -p no:cacheprovider ${TEST_PATHS:-tests/recurrent} 2>&1 |
	tail -30 | tee "$out/gpu_tests.txt"
echo "tests: exit $?"
