# ranknas: one-command set-up, test, demo.
# `make setup` is idempotent: it does nothing once .venv/.setup-done is newer than
# pyproject.toml and this Makefile.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.setup-done

TORCH_VERSION := 2.13.0
TORCHREC_VERSION := 1.8.0
FBGEMM_VERSION := 1.8.0
# torchrec's own needs, installed by hand because torchrec goes in with --no-deps
# (its wheel would pull the CUDA build of fbgemm-gpu and an old torchmetrics pin).
TORCHREC_DEPS := tensordict torchmetrics tqdm pyre-extensions iopath

.PHONY: setup test test-all lint demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q torch==$(TORCH_VERSION)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(PIP) install -q fbgemm-gpu==$(FBGEMM_VERSION); \
	else \
	  $(PIP) install -q fbgemm-gpu-cpu==$(FBGEMM_VERSION); \
	fi
	$(PIP) install -q --no-deps torchrec==$(TORCHREC_VERSION)
	$(PIP) install -q $(TORCHREC_DEPS) torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[dev]' torch==$(TORCH_VERSION)
	$(PY) -c "import torch, torchrec, fbgemm_gpu; print('torch', torch.__version__, 'torchrec', torchrec.__version__)"
	touch $(STAMP)

test: setup
	$(VENV)/bin/pytest -q -m "not slow"

test-all: setup
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The main job end to end, as far as it exists: the engineer presets with their costs, one
# preset in detail, and an architecture sampled from each search space. The study runner
# (search, MLflow, export) extends this target.
demo: setup
	$(VENV)/bin/ranknas presets
	@echo
	$(VENV)/bin/ranknas arch show wukong
	@echo
	$(VENV)/bin/ranknas arch show examples/dlrm.json
	@for space in examples/space_*.yaml; do \
	  echo; echo "== one architecture sampled from $$space"; \
	  $(VENV)/bin/ranknas space sample $$space --seed 1 > /tmp/ranknas-sample.json && \
	  $(VENV)/bin/ranknas arch show /tmp/ranknas-sample.json || exit 1; \
	done
	@echo
	@echo "Specs are plain JSON: 'ranknas arch show NAME --json' prints one to start from."

bench: setup
	$(PY) bench/bench_search_space.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
