# Two commands matter: `make run` and `make test`. Both set up .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.podkit-installed

.PHONY: setup run test lint bench bench-setup clean browser slurm

setup: $(STAMP)

# Reinstall only when a pin or the package metadata changes.
$(STAMP): requirements.lock requirements-dev.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock -r requirements-dev.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: setup
	$(BIN)/podkit train configs/gpt_small.toml --cpu-devices 8

# Two test processes on the 2-core machines, whole files each (their fixtures start once),
# in the order tests/conftest.py gives them (the longest first): pytest-xdist would otherwise
# hand out the files with the most tests first, which put the longest ones, of few tests
# each, at the end of the run. TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2
test: setup browser slurm
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The run report's test opens report.html in headless Chromium: Debian's package, installed
# here when missing (as root; elsewhere that one test says how to get it and skips).
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
	  >/dev/null) || echo "make: could not install chromium (not root?); the report's browser test will skip"

# tests/test_slurm.py starts a real slurmctld and two slurmd: Debian's SLURM 22.05, installed
# here when missing (as root; elsewhere those tests say how to get it and skip). No munge:
# the test cluster uses auth/none.
SLURM_PKGS := slurmctld=22.05.8-4+deb12u3 slurmd=22.05.8-4+deb12u3 slurm-client=22.05.8-4+deb12u3
slurm:
	@command -v slurmctld >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  --no-install-recommends $(SLURM_PKGS) >/dev/null) || \
	  echo "make: could not install SLURM (not root?); tests/test_slurm.py will skip"

lint: setup
	$(BIN)/ruff check src tests bench examples

bench-setup: setup
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-bench.lock

bench: bench-setup
	$(BIN)/python bench/seed_mlp.py
	$(BIN)/python bench/data_pipeline.py

clean:
	rm -rf $(VENV) runs .pytest_cache
