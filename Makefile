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
# (its wheel would pull the CUDA build of fbgemm-gpu and an old torchmetrics pin); pip's
# conflict report about those two pins is expected, so it is not printed.
TORCHREC_DEPS := tensordict torchmetrics tqdm pyre-extensions iopath

.PHONY: setup browser test test-all lint demo screenshots bench clean

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
	$(PIP) install -q --no-deps --no-warn-conflicts torchrec==$(TORCHREC_VERSION)
	$(PIP) install -q --no-warn-conflicts $(TORCHREC_DEPS) torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[dev]' torch==$(TORCH_VERSION)
	$(PY) -c "import torch, torchrec, fbgemm_gpu; print('torch', torch.__version__, 'torchrec', torchrec.__version__)"
	touch $(STAMP)

test: setup
	$(VENV)/bin/pytest -q -m "not slow and not timing"

# The browser check (a slow test, and `make screenshots`) drives Debian's chromium with
# Playwright: installs both where they are missing (apt-get needs root).
browser: setup
	test -x /usr/bin/chromium || apt-get install -y -q chromium
	$(PIP) install -q -e '.[dev,browser]' torch==$(TORCH_VERSION)

test-all: setup browser
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The main job end to end: start MLflow, search around DLRM with every preset trained as a
# baseline, retrain the three best trials and every baseline with fresh seeds (the
# verdict then compares seed means), print the leaderboard, export the winner (registered
# in MLflow's model registry). Running it again resumes: no new training, the same export.
RANKNAS := $(VENV)/bin/ranknas
MLFLOW_URL := http://127.0.0.1:5000
demo: setup
	$(RANKNAS) mlflow up
	$(RANKNAS) search examples/quickstart.yaml
	$(RANKNAS) reevaluate examples/quickstart.yaml --top 3 --seeds 5
	$(RANKNAS) leaderboard quickstart --top 5
	$(RANKNAS) export quickstart --trial best --out ranknas-data/winner \
	  --register ranknas-quickstart --tracking-uri $(MLFLOW_URL)
	@echo
	@echo "MLflow UI:     $(MLFLOW_URL)  (experiment 'quickstart': one parent run, a nested run per trial and baseline;"
	@echo "               the trials and baselines side by side, best first: the 'compare them in MLflow' address above)"
	@echo "Winner:        ranknas-data/winner/ (architecture.json, model.safetensors, ranknas_model.py, model_card.md)"
	@echo "Registry:      models:/ranknas-quickstart@champion"
	@echo "Study storage: sqlite:///ranknas-data/studies.db  ('ranknas status quickstart')"
	@echo "Stop MLflow:   $(RANKNAS) mlflow down"

# Screenshots of the demo's experiment in the MLflow UI (run `make demo` first), for docs/.
screenshots: browser
	$(PY) -m mlflow_server.ui_check --tracking-uri $(MLFLOW_URL) --experiment quickstart --out docs

bench: setup
	$(PY) bench/bench_search_space.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
