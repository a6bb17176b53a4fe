#!/usr/bin/env bash
# The wheels that `bench/bench_gpu.py` needs on a lent GPU machine whose image has torch
# 2.11 (cp312) but not torchrec, optuna or pydantic: written to .whl/ (ignored by git),
# to carry there and install with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
# torchrec 1.6.1 and fbgemm-gpu-cpu 1.6.0 are the releases built for torch 2.11; the rest
# are the versions this project's CI installs. Run from the repository root.
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
grep -qxF "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
mkdir -p .whl
packages=(
    torchrec==1.6.1 fbgemm-gpu-cpu==1.6.0 tensordict==0.11.0 "pyvers<0.3" orjson
    importlib-metadata pyre-extensions typing-inspect iopath portalocker
    optuna==5.0.0 optuna-dashboard==0.21.0 bottle alembic sqlalchemy greenlet mako colorlog
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection
    typing-extensions==4.16.0
)
for package in "${packages[@]}"; do
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .whl "$package" 2>&1 \
        | { grep -v "^WARNING: Location" || true; }
done
du -sh .whl
