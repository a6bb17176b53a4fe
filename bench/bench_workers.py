"""`ranknas search --workers N` on this machine: how long until every worker trains, and
the whole command's wall time, medians of repeats.

    .venv/bin/python bench/bench_workers.py --workers 2 --repeats 3

A small study (around DCNv2, no baselines, 12 trials of 20,000 examples on 50,000
synthetic rows, no MLflow) so that start-up is a visible share. "first trial" is the
last worker's first trial start, from the command's start: what a study spends before
all its workers train.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml


def study_config(scratch: Path) -> dict:
    return {
        "name": "workers", "data": {"source": "synthetic", "rows": 50_000, "seed": 0},
        "search_space": {"type": "around", "base": "dcnv2"},
        "searcher": {"type": "tpe", "startup_trials": 4}, "baselines": [],
        "best_baseline": {"seeds": 1},
        "budget": {"trials": 12, "examples_per_trial": 20_000},
        "training": {"batch_size": 512}, "storage": f"sqlite:///{scratch / 'studies.db'}",
        "output_dir": str(scratch / "out"), "mlflow": {"tracking_uri": None},
    }  # fmt: skip


def run_once(workers: int) -> dict:
    from nas.storage import load_study

    scratch = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    config = study_config(scratch)
    path = scratch / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "nas.cli", "search", str(path), "--workers", str(workers)]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.time() - started
    if done.returncode != 0:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
    trials = load_study(config["name"], config["storage"]).get_trials(deepcopy=False)
    first: dict[str, float] = {}
    for trial in sorted(trials, key=lambda t: t.datetime_start):
        first.setdefault(trial.user_attrs.get("worker", "?"), trial.datetime_start.timestamp())
    last_end = max(t.datetime_complete for t in trials if t.datetime_complete).timestamp()
    return {"wall_s": wall, "all_training_s": max(first.values()) - started,
            "last_trial_end_s": last_end - started, "workers_seen": len(first)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = [run_once(args.workers) for _ in range(args.repeats)]
    summary = {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}
    summary |= {"spread": {k: round(max(r[k] for r in runs) - min(r[k] for r in runs), 2)
                           for k in ("wall_s", "all_training_s")},
                "workers": args.workers, "repeats": args.repeats,
                "date": datetime.now().isoformat(timespec="seconds")}  # fmt: skip
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
