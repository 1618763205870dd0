# `make demo` and `make test` work on a fresh machine: each creates .venv when missing and installs
# rnn2jax into it (editable, with the test, torch and database extras) before running. `make test` also creates
# .venv-caffe2, real Caffe2 (torch 1.10.2 on Python 3.9), the reference the differential tests ask;
# where no Python 3.9 exists it says so and those tests skip with that reason.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CAFFE2_VENV := .venv-caffe2
CAFFE2_STAMP := $(CAFFE2_VENV)/.installed
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 600

.PHONY: demo test lint fuzz clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,torch,fuzz,lmdb,leveldb,rocksdb,orbax]'
	touch $(STAMP)

# Not fatal: without Python 3.9 the differential tests skip, and the message says why.
$(CAFFE2_STAMP): $(STAMP)
	@if $(BIN)/rnn2jax setup-caffe2 --venv $(CAFFE2_VENV); then touch $(CAFFE2_STAMP); \
	else echo "make: real Caffe2 is unavailable, so the differential tests against it will be skipped"; fi

demo: $(STAMP)
	$(BIN)/rnn2jax demo

test: $(STAMP) $(CAFFE2_STAMP)
	$(BIN)/ruff check rnn2jax tests scripts benchmarks examples
	$(BIN)/python -m pytest -q -n 2 $(PYTEST_ARGS)

# Both fuzzers side by side for FUZZ_SECONDS (`make fuzz FUZZ_SECONDS=1800`): atheris over the corpus in
# tests/fuzz/corpus (grown in place), and the hypothesis mutation fuzzer. Escapes land in tests/fuzz/crashes,
# which the suite replays.
fuzz: $(STAMP)
	mkdir -p tests/fuzz/corpus tests/fuzz/crashes
	$(BIN)/python tests/fuzz/fuzz_mutations.py --seconds $(FUZZ_SECONDS) > fuzz-mutations.log 2>&1 & \
	PATH=$(BIN):$$PATH $(BIN)/python tests/fuzz/fuzz_nets.py -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=20 \
		-rss_limit_mb=8192 -print_final_stats=1 -artifact_prefix=tests/fuzz/crashes/ \
		tests/fuzz/corpus tests/fuzz/seeds > fuzz-atheris.log 2>&1; \
	atheris=$$?; wait $$!; mutations=$$?; \
	tail -6 fuzz-mutations.log; grep -E '^(#[0-9]+ +DONE|stat::|Done|==[0-9]+== ERROR)' fuzz-atheris.log; \
	test $$atheris -eq 0 -a $$mutations -eq 0

lint: $(STAMP)
	$(BIN)/ruff check rnn2jax tests scripts benchmarks examples
	$(BIN)/ruff format --check rnn2jax tests scripts benchmarks examples

clean:
	rm -rf $(VENV) $(CAFFE2_VENV) build *.egg-info
