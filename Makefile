# `make demo` and `make test` work on a fresh machine: each creates .venv when missing and installs
# rnn2jax into it (editable, with the test, torch and database extras; the install compiles the native CPU
# kernels with the machine's g++ against oneDNN's PyPI wheel) before running. `make test` also creates
# .venv-caffe2, real Caffe2 (torch 1.10.2 on Python 3.9), the reference the differential tests ask;
# where no Python 3.9 exists it says so and those tests skip with that reason. It installs Graphviz (`dot`,
# for the `rnn2jax draw` tests) where it is missing and it can (root, apt-get); else those tests skip, saying so.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CAFFE2_VENV := .venv-caffe2
CAFFE2_STAMP := $(CAFFE2_VENV)/.installed
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 600

.PHONY: demo test test-explore test-caffe2-api test-caffe2-suite test-caffe2-suite-ci lint fuzz clean bench
BENCH_ARGS ?=
SINGLE_THREAD_BENCH_ARGS ?=

# The install also builds the native CPU kernels (setup.py, rnn2jax/native/src): a change there reinstalls.
$(STAMP): pyproject.toml setup.py $(wildcard rnn2jax/native/src/*)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,torch,fuzz,lmdb,leveldb,rocksdb,orbax,draw,tensorboard]'
	touch $(STAMP)

# Not fatal: without Python 3.9 the differential tests skip, and the message says why.
$(CAFFE2_STAMP): $(STAMP)
	@if $(BIN)/rnn2jax setup-caffe2 --venv $(CAFFE2_VENV); then touch $(CAFFE2_STAMP); \
	else echo "make: real Caffe2 is unavailable, so the differential tests against it will be skipped"; fi

demo: $(STAMP)
	$(BIN)/rnn2jax demo

# `make test` draws the same hypothesis examples on every run, as CI does: the derandomized `ci` profile of
# tests/conftest.py (and of rnn2jax.caffe2.pytest_plugin), 5 examples per test and 5 per Caffe2-style test;
# a second run of the same commit gives the same answer. Each of the three may be set to explore instead
# (RNN2JAX_HYPOTHESIS_PROFILE=thorough make test draws 200 fresh examples per test).
test test-caffe2-api: export RNN2JAX_HYPOTHESIS_PROFILE ?= ci
test test-caffe2-api: export RNN2JAX_EXAMPLES ?= 5
test test-caffe2-api: export RNN2JAX_CAFFE2_EXAMPLES ?= 5

test: $(STAMP) $(CAFFE2_STAMP)
	@sh scripts/install_graphviz.sh
	$(BIN)/ruff check rnn2jax tests scripts benchmarks examples
	$(BIN)/python -m pytest -q -n 2 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-caffe2-api
	$(MAKE) --no-print-directory test-caffe2-suite-ci

# `make test-explore [EXPLORE=tests/ops] [EXPLORE_EXAMPLES=50]`: fresh hypothesis draws, EXPLORE_EXAMPLES per test,
# over EXPLORE (default: the whole suite but the Caffe2-style tests). Each failing example hypothesis keeps is
# pinned in tests/regressions/hypothesis/ (tests/pinned_examples.py): commit it, and `make test` replays it on
# every run.
EXPLORE ?= tests
EXPLORE_EXAMPLES ?= 50
test-explore: $(STAMP) $(CAFFE2_STAMP)
	RNN2JAX_HYPOTHESIS_PROFILE=explore RNN2JAX_EXAMPLES=$(EXPLORE_EXAMPLES) \
		$(BIN)/python -m pytest -q -n 2 -p no:cacheprovider $(EXPLORE)

# The project's own Caffe2-style tests (tests/caffe2_style) on rnn2jax's `caffe2`, through the pytest plugin
# rnn2jax.caffe2.pytest_plugin, which loads Caffe2's test utilities from the real-Caffe2 venv. Caffe2's own test
# files, the RNN and seq2seq ones among them, run in `make test-caffe2-suite-ci` (below).
test-caffe2-api: $(STAMP) $(CAFFE2_STAMP)
	@src=$$(ls -d $(CAFFE2_VENV)/lib/python3.9/site-packages/caffe2 2>/dev/null); \
	if [ -z "$$src" ]; then echo "make: real Caffe2 is unavailable, so the Caffe2-style tests are not run"; exit 0; fi; \
	$(BIN)/python -m pytest -q -n 2 --rootdir=. -c pyproject.toml -p rnn2jax.caffe2.pytest_plugin \
		--caffe2-source "$$src" tests/caffe2_style

# Caffe2's whole Python test suite (every *_test.py of the torch 1.10.2 wheel), unmodified, on real Caffe2 (cached
# per file in .cache/caffe2-suite) and on rnn2jax, one pytest process per file and side, SUITE_EXAMPLES hypothesis
# examples per test: writes docs/caffe2-suite.json and the scoreboard docs/caffe2-suite.md (`SUITE_ONLY='python/*'`
# reruns some files and keeps the other files' results, when they were run with as many examples). `make test-caffe2-suite-ci` (part of `make test`)
# collects every file the page scores and runs, at one derandomized example each, the tests it records as passing:
# all of the RNN, seq2seq, control-flow and optimizer files', at most three of every other file's.
SUITE_EXAMPLES ?= 10
SUITE_JOBS ?= 2
test-caffe2-suite: $(STAMP) $(CAFFE2_STAMP)
	$(BIN)/python scripts/caffe2_suite.py run --examples $(SUITE_EXAMPLES) --jobs $(SUITE_JOBS) \
		$(if $(SUITE_ONLY),--merge --only $(SUITE_ONLY))

test-caffe2-suite-ci: $(STAMP) $(CAFFE2_STAMP)
	@if ! ls -d $(CAFFE2_VENV)/lib/python3.9/site-packages/caffe2 >/dev/null 2>&1; then \
		echo "make: real Caffe2 is unavailable, so Caffe2's test suite is not run"; exit 0; fi; \
	$(BIN)/python scripts/caffe2_suite.py ci

# Both fuzzers side by side for FUZZ_SECONDS (`make fuzz FUZZ_SECONDS=1800 FUZZ_SEED=7`): atheris over the
# corpus in tests/fuzz/corpus (grown in place), and the hypothesis mutation fuzzer, both seeded with FUZZ_SEED
# (random when unset; each log prints the seed). Escapes and silent answers land in tests/fuzz/crashes, which
# the suite replays; the last lines give executions, escapes, silent answers, crashes and hangs.
FUZZ_SEED ?= $(shell python3 -c 'import random; print(random.randrange(2**31))')
fuzz: $(STAMP)
	mkdir -p tests/fuzz/corpus tests/fuzz/crashes
	$(BIN)/python tests/fuzz/fuzz_mutations.py --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED) > fuzz-mutations.log 2>&1 & \
	PATH=$(BIN):$$PATH $(BIN)/python tests/fuzz/fuzz_nets.py -seed=$(FUZZ_SEED) -max_total_time=$(FUZZ_SECONDS) \
		-max_len=65536 -timeout=20 -rss_limit_mb=8192 -print_final_stats=1 -artifact_prefix=tests/fuzz/crashes/ \
		tests/fuzz/corpus tests/fuzz/seeds > fuzz-atheris.log 2>&1; \
	atheris=$$?; wait $$!; mutations=$$?; \
	tail -20 fuzz-mutations.log | sed -n '/executions in/,$$p'; \
	grep -E '^(#[0-9]+ +DONE|stat::|Done|==[0-9]+== ERROR)' fuzz-atheris.log; \
	echo "fuzz_nets (seed $(FUZZ_SEED)): $$(grep -cE 'saved to .*/escape-' fuzz-atheris.log) escapes," \
		"$$(grep -cE 'saved to .*/silent-' fuzz-atheris.log) silent answers," \
		"$$(grep -cE 'deadly signal|ERROR: libFuzzer: (out-of-memory|fuzz target exited)' fuzz-atheris.log) crashes," \
		"$$(grep -c 'ERROR: libFuzzer: timeout' fuzz-atheris.log) hangs"; \
	test $$atheris -eq 0 -a $$mutations -eq 0 && ! grep -qE 'saved to .*/(escape|silent)-' fuzz-atheris.log

# `make bench`: rnn2jax's compiled Caffe2 RNN nets against PyTorch, hand-written JAX and real Caffe2, checked
# equal and then timed; writes benchmarks/results/latest.json and prints it as Markdown for the README. Then
# Caffe2's seq2seq beam-search decoding (translate.py's code) on real Caffe2 and on rnn2jax, in sentences per
# second (benchmarks/results/nmt_decode.json). The second compare.py run times the LSTM and the GRU on one thread as
# CPU time (what a loaded machine does not change), against PyTorch on one thread; bench_table.py shows both.
bench: $(STAMP) $(CAFFE2_STAMP)
	$(BIN)/python benchmarks/compare.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/compare.py --threads 1 --cpu-time --models lstm gru --no-caffe2 --no-memory \
		--out benchmarks/results/single_thread.json $(SINGLE_THREAD_BENCH_ARGS)
	$(BIN)/python scripts/bench_table.py
	$(BIN)/python benchmarks/nmt_decode.py

lint: $(STAMP)
	$(BIN)/ruff check rnn2jax tests scripts benchmarks examples
	$(BIN)/ruff format --check rnn2jax tests scripts benchmarks examples

clean:
	rm -rf $(VENV) $(CAFFE2_VENV) build *.egg-info
