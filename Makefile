# `make demo` and `make test` work on a fresh machine: each creates .venv when missing and installs
# rnn2jax into it (editable, with the test and torch extras) before running. `make test` also creates
# .venv-caffe2, real Caffe2 (torch 1.10.2 on Python 3.9), the reference the differential tests ask;
# where no Python 3.9 exists it says so and those tests skip with that reason.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CAFFE2_VENV := .venv-caffe2
CAFFE2_STAMP := $(CAFFE2_VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,torch]'
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

lint: $(STAMP)
	$(BIN)/ruff check rnn2jax tests scripts benchmarks examples
	$(BIN)/ruff format --check rnn2jax tests scripts benchmarks examples

clean:
	rm -rf $(VENV) $(CAFFE2_VENV) build *.egg-info
