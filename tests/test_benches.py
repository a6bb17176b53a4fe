"""The benchmarks still run: each at its smallest settings, so that a change to the code it
times (a moved function, a new argument) breaks here and not in the next session's run.
Their figures are not checked (speed is measured in BENCHMARKS.md, not in tests)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> str:
    run = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.slow  # 39 s; not among the GPU window's scripts; `make test-all` runs it
def test_the_study_benchmark_runs_its_overhead_and_ask_parts():
    out = _bench("bench/bench_study.py", "--parts", "1,2", "--overhead-trials", "2",
                 "--rounds", "1", "--history", "12", "--asks", "1",
                 "--searchers", "random,tpe")  # fmt: skip
    assert "| **overhead = wall - training, median** |" in out
    assert "SQLite on disk (WAL) + MLflow server (as shipped)" in out
    assert "| random |" in out and "| tpe |" in out


@pytest.mark.slow  # about a minute with a first compile (15 s with inductor's cache)
def test_the_gpu_windows_profile_of_the_compiled_step_runs_on_cpu(tmp_path):
    out = _bench("bench/bench_gpu.py", "--suite", "study", "--device", "cpu", "--parts",
                 "profile", "--mlperf-batch", "64", "--rows", "4000",
                 "--out", str(tmp_path / "profile.json"))  # fmt: skip
    assert "### profile: mlperf_dlrm_dcnv2 batch 64, eager + compile" in out  # no graphs on CPU


def test_the_gpu_windows_benchmarks_run_on_cpu(tmp_path):
    """`bench/gpu_window.sh`'s two halves at their smallest, on CPU: a lent GPU's 15 minutes
    are not spent finding that a script no longer runs."""
    study = tmp_path / "study.json"
    out = _bench("bench/bench_gpu.py", "--suite", "study", "--device", "cpu", "--parts",
                 "study", "--rows", "4000", "--workers", "1", "--study-trials", "1",
                 "--out", str(study))  # fmt: skip
    assert '"exit": 0' in out and study.exists()
    side_by_side = _bench("bench/bench_gpu.py", "--suite", "study", "--device", "cpu", "--parts",
                          "concurrent", "--rows", "4000", "--workers", "1", "--steps", "10",
                          "--out", str(tmp_path / "concurrent.json"))  # fmt: skip
    assert 'concurrent, 1 processes: {"processes": 1' in side_by_side
    mfu = _bench("bench/bench_gpu.py", "--suite", "study", "--device", "cpu", "--parts", "steps",
                 "--step-models", "", "--ways", "graph-fp32in", "--mlperf-batch", "64",
                 "--rows", "4000", "--steps", "5", "--repeats", "1",
                 "--out", str(tmp_path / "mfu.json"))  # fmt: skip
    assert "| mlperf_dlrm_dcnv2 | 64 | graph+fp32in |" in mfu
    dense = tmp_path / "dense.json"
    _bench("bench/bench_latency.py", "--config", "bench/codesign.yaml", "--bases", "dlrm",
           "--archs", "5", "--noise-archs", "2", "--splits", "1", "--device", "cpu",
           "--save", str(dense))  # fmt: skip
    assert dense.exists()
