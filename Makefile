# Two commands matter: `make run` and `make test`. Both set up .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.podkit-installed

.PHONY: setup run test lint bench bench-setup clean

setup: $(STAMP)

# Reinstall only when a pin or the package metadata changes.
$(STAMP): requirements.lock requirements-dev.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock -r requirements-dev.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: setup
	$(BIN)/podkit train configs/gpt_small.toml --cpu-devices 8

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check src tests bench examples

bench-setup: setup
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-bench.lock

bench: bench-setup
	$(BIN)/python bench/seed_mlp.py
	$(BIN)/python bench/data_pipeline.py

clean:
	rm -rf $(VENV) runs .pytest_cache
