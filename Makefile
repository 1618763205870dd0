# `make demo` and `make test` work on a fresh machine: each creates .venv when missing and installs
# rnn2jax into it (editable, with the test and torch extras) before running.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,torch]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rnn2jax demo

test: $(STAMP)
	$(BIN)/ruff check rnn2jax tests scripts benchmarks examples
	$(BIN)/python -m pytest -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check rnn2jax tests scripts benchmarks examples
	$(BIN)/ruff format --check rnn2jax tests scripts benchmarks examples

clean:
	rm -rf $(VENV) build *.egg-info
